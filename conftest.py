"""Root conftest: the environment every test and every nbval kernel runs in.

Set here, before any kernel starts (nbval kernels inherit this process's environment):

* ``TFM_PROFILE=smoke`` unless already set: the notebooks run in seconds under the tests;
* ``MPLBACKEND=Agg`` unless already set: figures render off-screen, no GUI is needed;
* the repository root at the front of ``PYTHONPATH`` (and ``sys.path``), so a kernel imports this
  checkout's ``tfmlib`` even where the package is not installed;
* ``tools/`` on ``sys.path``, so tests can ``import booksync`` and ``import book``;
* under pytest-xdist, ``TFM_THREADS`` (unless already set) to this worker's share of the cores
  (:func:`share_of_cores`: cores // workers, at least 1, no more than ``OMP_NUM_THREADS`` when
  that is set), so that the workers, and the nbval kernels each of them starts (``setup()`` applies
  ``TFM_THREADS``), share the cores instead of each taking all of them. xdist sets
  ``PYTEST_XDIST_WORKER_COUNT`` in a worker's environment before this file is imported. When
  ``TFM_THREADS`` is set, :func:`pytest_configure` applies it to the test process itself too.

nbval uses the interpreter running pytest (``--nbval-current-env`` in pyproject.toml).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

os.environ.setdefault("TFM_PROFILE", "smoke")
os.environ.setdefault("MPLBACKEND", "Agg")
# The kernel's interpreter is sys.executable; put its folder first on PATH so that anything a
# notebook starts by name (python, torchrun) comes from the same environment.
_bin = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = os.pathsep.join([_bin, os.environ.get("PATH", "")])
_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(ROOT) not in _pythonpath:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *_pythonpath])

for _p in (ROOT, ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def share_of_cores(cores: int, workers: int, omp_threads: str | None = None) -> int:
    """Threads for one of ``workers`` processes sharing ``cores``: ``cores // workers``, at least 1,
    and no more than ``omp_threads`` (the ``OMP_NUM_THREADS`` a user set) when that is a number."""
    if workers < 1 or cores < 1:
        raise ValueError(f"share_of_cores: cores and workers must be >= 1, got {cores}, {workers}")
    share = max(1, cores // workers)
    if omp_threads and omp_threads.strip().isdigit() and int(omp_threads) >= 1:
        share = min(share, int(omp_threads))
    return share


_workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").strip()
if _workers.isdigit() and int(_workers) >= 1 and not os.environ.get("TFM_THREADS"):
    os.environ["TFM_THREADS"] = str(share_of_cores(available_cores(), int(_workers),
                                                   os.environ.get("OMP_NUM_THREADS")))


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    """Give this test process the ``TFM_THREADS`` its kernels get (only when it is set)."""
    if os.environ.get("TFM_THREADS"):
        from tfmlib.config import apply_threads

        apply_threads()

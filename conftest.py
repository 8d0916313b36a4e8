"""Root conftest: the environment every test and every nbval kernel runs in.

Set here, before any kernel starts (nbval kernels inherit this process's environment):

* ``TFM_PROFILE=smoke`` unless already set: the notebooks run in seconds under the tests;
* ``MPLBACKEND=Agg`` unless already set: figures render off-screen, no GUI is needed;
* the repository root at the front of ``PYTHONPATH`` (and ``sys.path``), so a kernel imports this
  checkout's ``tfmlib`` even where the package is not installed;
* ``tools/`` on ``sys.path``, so tests can ``import booksync`` and ``import book``.

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

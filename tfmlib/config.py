"""Profiles, device and seeds: the first cell of every notebook.

Introduced in chapter 00 (preface).

A *profile* picks the sizes of a run: ``smoke`` (what the tests run: tiny, seconds), ``cpu`` (what
a reader without a GPU gets: a few minutes a chapter, results that teach) and ``gpu`` (bigger
models and data). ``TFM_PROFILE`` chooses it; without it, ``gpu`` when CUDA is available, else
``cpu``. Each notebook states its own sizes for all three profiles in one visible call::

    run = setup(seed=0,
                smoke=dict(epochs=1, hidden=16),
                cpu=dict(epochs=5, hidden=128),
                gpu=dict(epochs=20, hidden=512))
    run.epochs, run.hidden, run.device, run.profile

``TFM_THREADS`` (when set) is the number of CPU threads torch may use: when several notebooks or
test workers run at once, each takes its share of the cores instead of all of them (the root
``conftest.py`` sets it under pytest-xdist). ``TFM_DEVICE`` forces a device (``TFM_DEVICE=cpu``).
``TFM_TIME_SCALE`` (when set; :func:`tfmlib.timing.time_scale_from_env`) multiplies every time
guard (:func:`tfmlib.train.fit`'s ``time_budget_s``): ``0.01`` makes the machine look 100 times
slower to the guards, so a test can check that a notebook whose guard fires says so and skips
what a shorter run cannot show.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

INTRODUCED_IN = 0

PROFILES = ("smoke", "cpu", "gpu")


def active_profile() -> str:
    """The profile named by ``TFM_PROFILE``, or ``gpu``/``cpu`` by hardware when it is unset."""
    name = os.environ.get("TFM_PROFILE", "").strip().lower()
    if not name:
        return "gpu" if torch.cuda.is_available() else "cpu"
    if name not in PROFILES:
        raise ValueError(f"TFM_PROFILE={name!r} is not a profile; choose one of {PROFILES}")
    return name


def pick_device(preferred: str | None = None) -> torch.device:
    """CUDA if available, then Apple's MPS, then the CPU.

    ``preferred`` (or the ``TFM_DEVICE`` environment variable) forces a device such as ``"cpu"``;
    asking for one that is not available raises ``RuntimeError``.
    """
    preferred = preferred or os.environ.get("TFM_DEVICE") or None
    if preferred:
        dev = torch.device(preferred)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {preferred!r} requested but CUDA is not available")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError(f"device {preferred!r} requested but MPS is not available")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (all devices), so reruns give the same numbers on one device."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA and MPS generators


def threads_from_env() -> int | None:
    """The thread count named by ``TFM_THREADS`` (an int >= 1), or ``None`` when it is unset/empty."""
    raw = os.environ.get("TFM_THREADS", "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"TFM_THREADS={raw!r} is not a thread count; set it to an int >= 1 or unset it")
    return n


def apply_threads(threads: int | None = None) -> int:
    """Let torch use ``threads`` CPU threads (default: ``TFM_THREADS``; neither: leave torch's
    choice alone) and return the count in use.

    Sets the intra-op threads (``torch.set_num_threads``) and, where still allowed, the inter-op
    threads too: torch accepts ``set_num_interop_threads`` only once per process and only before
    any inter-op work has started, so a later call keeps the inter-op count it has.
    """
    if threads is None:
        threads = threads_from_env()
    elif not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"apply_threads: threads must be an int >= 1 or None, got {threads!r}")
    if threads is not None:
        torch.set_num_threads(threads)
        if torch.get_num_interop_threads() != threads:
            try:
                torch.set_num_interop_threads(threads)
            except RuntimeError:  # already set, or inter-op work already started: keep it
                pass
    return torch.get_num_threads()


MPS_HINT = ("MPS chosen: if a chapter misbehaves on it (some ops are incomplete or slow there), "
            "rerun it on the CPU with TFM_DEVICE=cpu")


@dataclass
class Run:
    """What :func:`setup` returns: the profile, device, seed and this notebook's sizes.

    Sizes are read as attributes (``run.epochs``) or with ``run["epochs"]``.
    """

    profile: str
    device: torch.device
    seed: int
    sizes: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # torch's CPU threads in this process, as setup() left them
    tf32: bool | None = None  # on CUDA: may float32 work use TF32 (setup() turns it off); None elsewhere

    def __getattr__(self, name: str) -> Any:
        sizes = self.__dict__.get("sizes", {})
        if name in sizes:
            return sizes[name]
        raise AttributeError(
            f"this notebook's profile has no size {name!r}; it has {sorted(sizes)}"
        )

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        threads = "" if self.threads is None else f", threads={self.threads}"
        tf32 = "" if self.tf32 is None else f", tf32={'on' if self.tf32 else 'off'}"
        sizes = f", {sizes}" if sizes else ""
        return (f"Run(profile={self.profile!r}, device={str(self.device)!r}{threads}{tf32}, "
                f"seed={self.seed}{sizes})")


RUN_FIELDS = frozenset({"profile", "device", "seed", "sizes", "threads", "tf32"})


def setup(seed: int = 0, *, device: str | None = None, verbose: bool = True,
          **profiles: dict[str, Any]) -> Run:
    """Choose the profile, pick the device, set the CPU threads, seed everything, set the book's
    figure theme (:func:`tfmlib.plot.book_theme`), and return this notebook's sizes.

    Pass one dict of sizes per profile (``smoke=..., cpu=..., gpu=...``), all with the same keys,
    so a reader sees every setting in one place. With no dicts, only the profile, device and seed
    are set. ``TFM_THREADS`` (see :func:`apply_threads`) sets torch's CPU threads; the one-line
    summary printed with ``verbose`` shows the count in use, and, when MPS is the device, a second
    line says how to fall back to the CPU. On CUDA, TF32 is turned off for float32 matrix products
    and cuDNN (:func:`tfmlib.precision.set_tf32`; cuDNN's is on by default), so that float32 means
    float32 and the book's exact comparisons stay exact; the summary says ``tf32=off``.
    """
    unknown = set(profiles) - set(PROFILES)
    if unknown:
        raise ValueError(f"setup: unknown profile(s) {sorted(unknown)}; profiles are {PROFILES}")
    bad = {name: type(d).__name__ for name, d in profiles.items() if not isinstance(d, dict)}
    if bad:
        raise TypeError(f"setup: each profile's sizes must be a dict, got {bad}")
    if profiles:
        missing = set(PROFILES) - set(profiles)
        if missing:
            raise ValueError(f"setup: sizes missing for profile(s) {sorted(missing)}")
        keys = {name: set(d) for name, d in profiles.items()}
        if len({frozenset(k) for k in keys.values()}) != 1:
            raise ValueError(f"setup: the profiles must name the same sizes, got {keys}")
        shadowed = sorted(set().union(*keys.values()) & RUN_FIELDS)
        if shadowed:
            raise ValueError(f"setup: size name(s) {shadowed} would be hidden by Run's own fields "
                             f"{sorted(RUN_FIELDS)}; rename them")
    profile = active_profile()
    seed_everything(seed)  # validates the seed before anything is printed
    from tfmlib.plot import book_theme  # seaborn loads only where a run is set up

    book_theme()  # one look for every figure of the book
    dev = pick_device(device)
    threads = apply_threads()
    from tfmlib.timing import time_scale_from_env

    scale = time_scale_from_env()  # a bad TFM_TIME_SCALE is refused here, before any training
    tf32 = None
    if dev.type == "cuda":
        from tfmlib.precision import cudnn_is_tf32, fp32_matmul_is_tf32, set_tf32

        set_tf32(False)
        tf32 = fp32_matmul_is_tf32() or cudnn_is_tf32()
    run = Run(profile, dev, seed, dict(profiles.get(profile, {})), threads=threads, tf32=tf32)
    if verbose:
        print(run)
        if scale != 1.0:
            print(f"TFM_TIME_SCALE={scale:g}: every time guard (fit's time_budget_s) is multiplied by "
                  f"{scale:g}, as on a device {1 / scale:.3g} times slower")
        if dev.type == "mps":
            print(MPS_HINT)
    return run

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


@dataclass
class Run:
    """What :func:`setup` returns: the profile, device, seed and this notebook's sizes.

    Sizes are read as attributes (``run.epochs``) or with ``run["epochs"]``.
    """

    profile: str
    device: torch.device
    seed: int
    sizes: dict[str, Any] = field(default_factory=dict)

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
        return f"Run(profile={self.profile!r}, device={str(self.device)!r}, seed={self.seed}, {sizes})"


def setup(seed: int = 0, *, device: str | None = None, verbose: bool = True,
          **profiles: dict[str, Any]) -> Run:
    """Choose the profile, pick the device, seed everything, and return this notebook's sizes.

    Pass one dict of sizes per profile (``smoke=..., cpu=..., gpu=...``), all with the same keys,
    so a reader sees every setting in one place. With no dicts, only the profile, device and seed
    are set.
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
    profile = active_profile()
    seed_everything(seed)  # validates the seed before anything is printed
    run = Run(profile, pick_device(device), seed, dict(profiles.get(profile, {})))
    if verbose:
        print(run)
    return run

"""The states of the random number generators a training step draws from: captured as tensors and
plain data, and put back.

Introduced in chapter 10 (scaling up): :mod:`tfmlib.resume` saves them in a training state so that a
killed run resumes with the random numbers it would have drawn, and
:func:`tfmlib.compiling.compile_or_fallback` puts them back after its trial step, so that the run
that follows draws what an eager run from the same seed would.

The generators: Python's ``random``, NumPy's global generator, torch's CPU generator (dropout on the
CPU, ``torch.randperm``...), the generator of every CUDA device (dropout on a GPU) when CUDA has been
used, and MPS's. Everything is stored as tensors and plain data, which
``torch.load(weights_only=True)`` reads back (NumPy's state as an int64 tensor and numbers).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from tfmlib.checkpoint import CheckpointError

INTRODUCED_IN = 10

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The states of the random number generators a training step may draw from, as tensors and
    plain data (what ``torch.load(weights_only=True)`` reads back).

    Keys: ``python`` (``random``'s Mersenne Twister: version, 625 words, the cached Gaussian),
    ``numpy`` (the legacy global generator: name, 624 words as an int64 tensor, position, cached
    Gaussian), ``torch`` (the CPU generator's byte tensor), ``cuda`` (a list with one byte tensor
    per CUDA device, only when CUDA has been initialised in this process: a generator that was
    never used is still in the state its seed put it in), ``mps`` (when MPS is available).
    """
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    if torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put the generators back in the states :func:`capture_rng_state` returned.

    CUDA states are restored device by device; when the number of CUDA devices differs from the
    saved run's, the devices both have are restored and a warning says the rest are not.
    Raises :class:`CheckpointError` when ``state`` lacks one of the CPU generators or holds
    malformed values.
    """
    try:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(int(w) for w in py["internal"]), py["gauss_next"]))
        npy = state["numpy"]
        keys = np.asarray(torch.as_tensor(npy["keys"]).tolist(), dtype=np.uint32)
        np.random.set_state((npy["kind"], keys, int(npy["pos"]), int(npy["has_gauss"]),
                             float(npy["cached_gaussian"])))
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"restore_rng_state: not a generator state ({type(e).__name__}: {e})") from e
    cuda_states = state.get("cuda")
    if cuda_states:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count != len(cuda_states):
            warnings.warn(f"restore_rng_state: the state holds {len(cuda_states)} CUDA generators and this "
                          f"process sees {count} devices: restoring {min(count, len(cuda_states))}",
                          stacklevel=2)
        for i, s in enumerate(cuda_states[:count]):
            torch.cuda.set_rng_state(torch.as_tensor(s, dtype=torch.uint8).cpu(), i)
    if state.get("mps") is not None and torch.backends.mps.is_available():
        torch.mps.set_rng_state(torch.as_tensor(state["mps"], dtype=torch.uint8).cpu())

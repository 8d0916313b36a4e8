"""Two choices of a fast training step that are settings, not code: the fused AdamW where the device
has it, and a micro-batch sized to the memory that is free.

Introduced in chapter 10 (scaling up).

**Fused AdamW.** ``torch.optim.AdamW`` has three implementations of the same update: the
single-tensor loop (one small kernel per operation and parameter), ``foreach`` (one kernel per
operation over a list of parameters) and ``fused`` (one kernel per group of parameters that reads
each weight, gradient and moment once and writes them once). On a GPU the update of a model of
``N`` parameters moves about ``7 x 4 N`` bytes (read weight, gradient and two moments, write three
of them), so fusing mostly saves the repeated passes over memory of the other two, and the
launches. ``fused=True`` also keeps a ``GradScaler`` step on the device: the scaler hands its
``found_inf`` tensor to the fused kernel, which skips the update itself, where otherwise
``GradScaler.step`` reads it back (``.item()``: a host sync) every step. PyTorch has the fused
kernels on CUDA, the CPU (checked with torch 2.13), MPS and XPU, for floating-point parameters
(:data:`FUSED_ADAMW_DEVICES`); the constructor accepts ``fused=True`` anywhere and the first
``step()`` raises on another device or dtype, so :func:`make_adamw` checks the parameters first
(:func:`fused_adamw_supported`) and falls back.

**A micro-batch sized to the memory.** A GPU is used best by the largest micro-batch that fits:
the fixed costs of a step (the optimizer's pass over the weights, the launches, the gradient
all-reduce) are shared by more tokens. :func:`micro_batch_for_memory` measures the peak memory of a
training step at two micro-batch sizes, fits ``fixed + per_row * rows`` (activations grow with
the rows; weights, gradients and optimizer state do not) and takes the largest size whose
prediction fits in a fraction of the free memory (``torch.cuda.mem_get_info``). On the CPU (and
MPS) it returns the size it was given: a CPU run is limited by time long before a model of this
book fills the host's memory, and neither device reports a per-process peak the way CUDA does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from tfmlib.timing import synchronize

INTRODUCED_IN = 10

__all__ = ["FUSED_ADAMW_DEVICES", "MicroBatchChoice", "free_memory", "fused_adamw_supported",
           "largest_batch_that_fits", "make_adamw", "micro_batch_for_memory", "peak_step_memory"]


# the device types with fused Adam/AdamW kernels in torch 2.13 (its private
# torch.optim.optimizer._get_fused_kernels_supported_devices lists these and a few accelerators' plug-ins)
FUSED_ADAMW_DEVICES = ("cuda", "cpu", "mps", "xpu")


def fused_adamw_supported(params: Iterable[torch.Tensor]) -> bool:
    """Whether ``torch.optim.AdamW(params, fused=True)`` can step: every parameter a floating-point
    tensor (not complex, not integer) on a device of :data:`FUSED_ADAMW_DEVICES`; ``False`` for no
    parameters."""
    params = list(params)
    return bool(params) and all(
        isinstance(p, torch.Tensor) and p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICES
        for p in params)


def make_adamw(params: Iterable[nn.Parameter], *, lr: float, weight_decay: float = 0.0,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               fused: bool | None = None) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params`` (tensors), fused where the parameters' device has it.

    ``fused=None`` (the default) builds the fused implementation when :func:`fused_adamw_supported`,
    else the default one (``foreach`` on CUDA, the single-tensor loop elsewhere). ``fused=True``
    insists (the first ``step()`` raises where it cannot run), ``fused=False`` never fuses. Which
    one was built is ``optimizer.defaults["fused"]`` (``True``, or ``None``/``False``).
    ``ValueError`` for no parameters, ``TypeError`` for a ``fused`` that is not a bool or None.
    """
    params = list(params)
    if not params:
        raise ValueError("make_adamw: params is empty")
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"make_adamw: fused must be True, False or None, got {fused!r}")
    if fused is None:
        fused = fused_adamw_supported(params) or None
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, fused=fused)


def free_memory(device: torch.device | str) -> int | None:
    """Free bytes on ``device``: ``torch.cuda.mem_get_info(device)[0]`` on CUDA, ``None`` elsewhere
    (the CPU's memory is the host's, shared with everything else; MPS reports no free figure)."""
    device = torch.device(device) if isinstance(device, str) else device
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return None


def peak_step_memory(step: Callable[[], object], device: torch.device | str) -> int | None:
    """The bytes one call of ``step`` allocated at its peak beyond what was allocated before it
    (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``), on CUDA; ``None``
    elsewhere (no per-process peak counter)."""
    device = torch.device(device) if isinstance(device, str) else device
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def largest_batch_that_fits(fixed_bytes: float, per_row_bytes: float, free_bytes: float, *,
                            fraction: float = 0.8, maximum: int = 1024, multiple_of: int = 1) -> int:
    """The largest ``rows`` (a multiple of ``multiple_of``, at most ``maximum``) with
    ``fixed_bytes + per_row_bytes * rows <= fraction * free_bytes``; 0 when not even
    ``multiple_of`` rows fit. ``ValueError`` for a non-positive ``per_row_bytes`` or ``free_bytes``,
    a ``fraction`` outside (0, 1], or ``maximum``/``multiple_of`` < 1."""
    if not per_row_bytes > 0 or not free_bytes > 0:
        raise ValueError(f"largest_batch_that_fits: per_row_bytes and free_bytes must be > 0, got "
                         f"{per_row_bytes!r} and {free_bytes!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"largest_batch_that_fits: fraction must be in (0, 1], got {fraction!r}")
    if maximum < 1 or multiple_of < 1:
        raise ValueError(f"largest_batch_that_fits: maximum and multiple_of must be >= 1, got {maximum}, "
                         f"{multiple_of}")
    rows = int((fraction * free_bytes - max(fixed_bytes, 0.0)) // per_row_bytes)
    rows = min(rows, maximum)
    return max(rows - rows % multiple_of, 0)


@dataclass(frozen=True)
class MicroBatchChoice:
    """What :func:`micro_batch_for_memory` chose: ``rows``, and how: ``reason`` (one line),
    ``per_row_bytes``/``fixed_bytes``/``free_bytes`` (``None`` where nothing was measured)."""

    rows: int
    reason: str
    per_row_bytes: float | None = None
    fixed_bytes: float | None = None
    free_bytes: int | None = None


def micro_batch_for_memory(step_at: Callable[[int], Callable[[], object]], device: torch.device | str, *,
                           default: int, probe: tuple[int, int] = (2, 4), fraction: float = 0.8,
                           maximum: int = 256, multiple_of: int = 1,
                           measure: Callable[[Callable[[], object], torch.device], int | None]
                           = peak_step_memory,
                           free: Callable[[torch.device], int | None] = free_memory) -> MicroBatchChoice:
    """The largest micro-batch (rows per step) whose training step fits in ``fraction`` of the free memory.

    ``step_at(rows)`` returns a function that runs one training step on ``rows`` rows. The peak
    memory of a step is measured at the two sizes of ``probe`` (each step run twice, the first to
    allocate the optimizer's state), a line ``fixed + per_row * rows`` is drawn through them, and
    :func:`largest_batch_that_fits` reads off the rows. Where the device reports no peak or no free
    memory (the CPU, MPS) the result is ``default`` and ``reason`` says so. ``measure`` and
    ``free`` are for tests. ``ValueError`` for a ``probe`` that is not two increasing sizes >= 1,
    or a ``default`` < 1.
    """
    device = torch.device(device) if isinstance(device, str) else device
    if not isinstance(default, int) or default < 1:
        raise ValueError(f"micro_batch_for_memory: default must be an int >= 1, got {default!r}")
    if len(probe) != 2 or not 1 <= probe[0] < probe[1]:
        raise ValueError(f"micro_batch_for_memory: probe must be two increasing sizes >= 1, got {probe!r}")
    free_bytes = free(device)
    if free_bytes is None:
        return MicroBatchChoice(default, f"{device.type}: no free-memory figure to size by; the given "
                                f"{default} rows")
    peaks = []
    for rows in probe:
        step = step_at(rows)
        step()                                    # the optimizer's state is allocated by the first step
        peaks.append(measure(step, device))
    if peaks[0] is None or peaks[1] is None:
        return MicroBatchChoice(default, f"{device.type}: no peak-memory counter; the given {default} rows")
    per_row = max((peaks[1] - peaks[0]) / (probe[1] - probe[0]), 1.0)
    fixed = peaks[0] - per_row * probe[0]
    rows = largest_batch_that_fits(fixed, per_row, free_bytes, fraction=fraction, maximum=maximum,
                                   multiple_of=multiple_of)
    if rows < 1:
        fallback = min(default, probe[0])
        return MicroBatchChoice(fallback, f"not even {multiple_of} row(s) fit in {fraction:.0%} of "
                                f"{free_bytes / 2**30:.1f} GiB free; {fallback} rows",
                                per_row, fixed, free_bytes)
    return MicroBatchChoice(rows, f"{rows} rows: {per_row / 2**20:,.0f} MiB per row + "
                            f"{fixed / 2**20:,.0f} MiB measured, {fraction:.0%} of "
                            f"{free_bytes / 2**30:.1f} GiB free"
                            + (f" (capped at {maximum})" if rows == maximum else ""),
                            per_row, fixed, free_bytes)

"""``torch.compile`` with a fallback: train compiled where the platform can, eagerly where it cannot.

Introduced in chapter 10 (scaling up: fused attention, mixed precision, ``torch.compile``,
several processes with ``torchrun``).

``torch.compile`` traces a module's Python into a graph (TorchDynamo) and generates fused kernels
for it (TorchInductor: C++/OpenMP on the CPU, which needs a C++ compiler at run time; Triton on
CUDA GPUs). Compiling is lazy: ``torch.compile(model)`` returns at once and the work happens at the
first call, which takes seconds to minutes; later calls with the same shapes reuse the code. So the
cost that matters is the *first call*, and a platform that cannot compile (no C++ compiler, an
unsupported Python, an operator Inductor cannot lower) fails there, not at ``torch.compile``.

:func:`compile_or_fallback` therefore runs one trial step through the compiled module, timing it,
and returns the eager module with a note saying why whenever anything fails, so a chapter or a
benchmark runs everywhere and says in its output which it trained.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tfmlib.rng import capture_rng_state, restore_rng_state
from tfmlib.timing import synchronize

INTRODUCED_IN = 10

__all__ = ["CompileReport", "compile_or_fallback", "default_compiler"]


@dataclass(frozen=True)
class CompileReport:
    """What :func:`compile_or_fallback` did: ``compiled`` (whether the returned module is the
    compiled one), ``seconds`` (wall time of compiling plus the trial step: the first call) and
    ``error`` (``"Type: first line"`` of the failure, ``None`` when it compiled). ``str(report)``
    and :attr:`note` read ``"compiled (first call 12.3 s)"`` or
    ``"eager (compile failed: RuntimeError: ...)"``, the line a notebook prints.
    """

    compiled: bool
    seconds: float
    error: str | None = None

    @property
    def note(self) -> str:
        """One line: ``"compiled (first call N s)"`` or ``"eager (compile failed: <error>)"``."""
        return (f"compiled (first call {self.seconds:.1f} s)" if self.compiled
                else f"eager (compile failed: {self.error})")

    def __str__(self) -> str:
        return self.note

    def as_dict(self) -> dict[str, object]:
        """``{"compiled", "seconds", "error", "note"}`` for a JSON record."""
        return {"compiled": self.compiled, "seconds": round(self.seconds, 3), "error": self.error,
                "note": self.note}


def default_compiler(model: nn.Module) -> nn.Module:
    """``torch.compile(model)`` with its defaults: specialised to the first shapes it sees (packed
    blocks keep one shape, so one compile); a new shape recompiles, with dynamic sizes. For batches
    whose shape changes at every step pass ``lambda m: torch.compile(m, dynamic=True)``."""
    return torch.compile(model)


def compile_or_fallback(model: nn.Module, trial: Callable[[nn.Module], object],
                        compiler: Callable[[nn.Module], nn.Module] | None = None, *,
                        device: torch.device | str | None = None) -> tuple[nn.Module, CompileReport]:
    """``compiler(model)`` (default :func:`default_compiler`) if it compiles and runs ``trial``
    (e.g. one training step's forward and backward on a real batch), else ``model`` itself.

    Returns ``(module, note)``: the module to train (the compiled module shares ``model``'s
    parameters) and a :class:`CompileReport` with ``compiled``, ``seconds`` and ``error``, which
    prints as ``"compiled (first call N s)"`` or ``"eager (compile failed: <Type>: <first line of
    the error>)"``. ``report.seconds`` is the
    wall time of ``compiler(model)`` and the trial, which is where the compiling happens
    (``device``, when given, is synchronised before the clock stops). Any exception from the
    compiler or the trial means "train eagerly". The trial leaves no trace on the training run:
    its gradients are cleared either way, it steps no optimiser, and the random number generators
    (Python's, NumPy's, torch's CPU and CUDA/MPS ones, :func:`tfmlib.rng.capture_rng_state`)
    are put back as they were before it, so that the dropout masks of the run that follows are
    those an eager run from the same seed would draw (buffers a trial updates, such as a batch
    norm's running statistics, are not restored: pass a trial that leaves them alone).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compile_or_fallback: model must be an nn.Module, got {type(model).__name__}")
    if not callable(trial):
        raise TypeError(f"compile_or_fallback: trial must be callable, got {type(trial).__name__}")
    compiler = compiler or default_compiler
    rng = capture_rng_state()
    start = time.perf_counter()
    try:
        compiled = compiler(model)
        trial(compiled)
        if device is not None:
            synchronize(device)
    except Exception as e:  # noqa: BLE001  (any failure to compile means: train eagerly)
        seconds = time.perf_counter() - start
        restore_rng_state(rng)
        for p in model.parameters():
            p.grad = None
        lines = str(e).strip().splitlines()
        error = f"{type(e).__name__}: {lines[0][:200] if lines else '(no message)'}"
        return model, CompileReport(compiled=False, seconds=seconds, error=error)
    seconds = time.perf_counter() - start
    restore_rng_state(rng)
    for p in model.parameters():
        p.grad = None
    return compiled, CompileReport(compiled=True, seconds=seconds)

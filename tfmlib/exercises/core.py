"""The machinery behind the exercise checkers: registration, :func:`check`, :func:`hint`.

Introduced in chapter 00 (preface). The checkers themselves live one module per chapter
(``tfmlib.exercises.ch01`` ...); ``tfmlib.exercises`` imports them all.

In a chapter, a reader fills in a stub and calls :func:`check`::

    def gates_for_weights(w):
        raise NotImplementedError  # your code here

    exercises.check("01.gates_for_weights", gates_for_weights)

``check`` prints "not solved yet" and a hint while the stub raises ``NotImplementedError``, says
what is wrong for a wrong answer, and never stops the notebook. The solutions notebook passes
``must_pass=True``, which raises :class:`ExerciseFailed` instead, so the tests catch a broken
solution or a broken checker. A checker is a function ``answer -> None`` that raises
:class:`Wrong` with a reason; it is registered with :func:`checker`.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

INTRODUCED_IN = 0


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says how."""


class ExerciseFailed(AssertionError):
    """Raised by ``check(..., must_pass=True)`` when an answer is not accepted."""


@dataclass(frozen=True)
class Exercise:
    name: str
    hint: str
    run: Callable[[Any], None]


_REGISTRY: dict[str, Exercise] = {}


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` returns: true when the answer was accepted.

    Use it as a bool (``if check(...)``, ``assert check(...)``). In a notebook it displays
    nothing, because :func:`check` has already printed the verdict.
    """

    name: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:  # the printed message is the display
        pass


def checker(name: str, hint: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register ``fn(answer)`` as the checker of exercise ``name`` (``"NN.short_name"``)."""
    if not re.fullmatch(r"\d\d\.\w+", name):
        raise ValueError(f"exercise name {name!r} must look like 'NN.short_name' (NN: the chapter)")

    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if name in _REGISTRY:
            raise ValueError(f"exercise {name!r} is registered twice")
        _REGISTRY[name] = Exercise(name, hint, fn)
        return fn
    return register


def names(chapter: int | None = None) -> list[str]:
    """The registered exercise names, optionally only chapter ``chapter``'s."""
    return sorted(n for n in _REGISTRY if chapter is None or n.startswith(f"{chapter:02d}."))


def hint(name: str) -> str:
    return _get(name).hint


def _get(name: str) -> Exercise:
    if name not in _REGISTRY:
        raise KeyError(f"no exercise named {name!r}; known: {names()}")
    return _REGISTRY[name]


def check(name: str, answer: Any, must_pass: bool = False) -> Verdict:
    """Check ``answer`` for exercise ``name``; print the verdict and return it (true if accepted).

    With ``must_pass=True`` (solutions), anything but an accepted answer raises
    :class:`ExerciseFailed`.
    """
    exercise = _get(name)
    recorder = _CallRecorder(answer) if inspect.isfunction(answer) or inspect.ismethod(answer) else None
    try:
        exercise.run(recorder if recorder is not None else answer)
    except NotImplementedError:
        verdict = f"[{name}] not solved yet. Hint: {exercise.hint}"
    except Wrong as e:
        verdict = f"[{name}] not correct yet: {e}"
    except Exception as e:  # the reader's code crashed: show where and on what, don't stop the notebook
        verdict = f"[{name}] your code raised {type(e).__name__}: {e}"
        where = _failing_line(e)
        if where:
            verdict += f"\n    at {where}"
        if recorder is not None and recorder.last_call:
            verdict += f"\n    called with {recorder.last_call}"
    else:
        print(f"[{name}] correct!")
        return Verdict(name, True, f"[{name}] correct!")
    if must_pass:
        raise ExerciseFailed(verdict)
    print(verdict)
    return Verdict(name, False, verdict)


class _CallRecorder:
    """Calls the reader's function and remembers the arguments of the latest call, described by
    shape and dtype, so that a crash can be reported with what the function was given."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.last_call = ""
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs).arguments.items()
        except (TypeError, ValueError):  # a wrong signature: the call below raises the real error
            bound = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        self.last_call = ", ".join(f"{k}: {describe(v)}" for k, v in bound)
        return self.fn(*args, **kwargs)


def describe(value: Any) -> str:
    """A short description of a value: tensors by shape and dtype, containers by length."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def _failing_line(error: BaseException) -> str:
    """'line N of fn: source' for the innermost frame of the reader's own code (not torch's, not ours)."""
    found = ""
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        filename = str(Path(frame.f_code.co_filename).resolve())
        if filename.startswith((_PACKAGE_DIR, _TORCH_DIR)):
            continue
        source = linecache.getline(frame.f_code.co_filename, lineno).strip()
        found = f"line {lineno} of {frame.f_code.co_name}" + (f": {source}" if source else "")
    return found


def format_mask(mask: torch.Tensor, on: str = "■", off: str = "·") -> str:
    """A boolean mask as a grid (rows: queries, columns: keys), ``on`` where True.

    Masks of more than two dimensions show their first matrix and say so.
    """
    mask = torch.as_tensor(mask).detach().cpu()
    note = ""
    if mask.dim() > 2:
        note = f" (first of shape {tuple(mask.shape)})"
        while mask.dim() > 2:
            mask = mask[0]
    rows = mask.reshape(1, -1) if mask.dim() < 2 else mask
    lines = [" ".join(on if bool(v) else off for v in row) for row in rows]
    return note.strip() + ("\n" if note else "") + "\n".join("    " + line for line in lines)


def mask_mismatch(got: torch.Tensor, want: torch.Tensor, what: str) -> str:
    """``what`` expected and received, as grids side by side (for a checker's message)."""
    left, right = format_mask(want).splitlines(), format_mask(got).splitlines()
    width = max(len(line) for line in left)
    rows = [f"{a.ljust(width)}    {b}" for a, b in zip(left, right, strict=False)]
    return f"{what}: expected (left) and yours (right), ■ = True\n" + "\n".join(rows)


# ----------------------------------------------------------------------------- helpers


def expect_close(got: Any, want: torch.Tensor, what: str, atol: float = 1e-5,
                 rtol: float = 1e-4) -> None:
    """Raise :class:`Wrong` unless ``got`` is a tensor of ``want``'s shape and values."""
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise Wrong(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol):
        err = (got.double() - want.double()).abs().max().item()
        raise Wrong(f"{what} has the right shape but wrong values (max abs error {err:.3g})")

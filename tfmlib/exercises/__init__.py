"""Checkers for the coding exercises at the end of every chapter.

Introduced in chapter 00 (preface), which shows how exercises work. Each chapter's checkers live
in a module of their own (``tfmlib.exercises.ch05`` holds chapter 05's); importing this package
registers them all, so a reader only ever types::

    from tfmlib import exercises

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

from . import ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11  # noqa: F401  (registers the checkers)
from .core import (
    Exercise,
    ExerciseFailed,
    Verdict,
    Wrong,
    check,
    checker,
    describe,
    expect_close,
    format_mask,
    hint,
    mask_mismatch,
    names,
)

INTRODUCED_IN = 0

__all__ = ["Exercise", "ExerciseFailed", "Verdict", "Wrong", "check", "checker", "describe", "expect_close",
           "format_mask", "hint", "mask_mismatch", "names"]

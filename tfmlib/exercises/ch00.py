"""Checkers for chapter 00 (preface).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("00.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker


@checker("00.padding_mask", hint="compare torch.arange(max_len) with the lengths, broadcasting "
         "a (1, max_len) row against a (batch, 1) column")
def _check_padding_mask(padding_mask: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    for lengths, max_len in [([3, 1, 2], 3), ([1], 4), ([5, 5], 5), ([2, 4, 1, 3], 6)]:
        got = padding_mask(torch.tensor(lengths), max_len)
        want = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise Wrong(f"the mask should be a bool tensor, got dtype {got.dtype}")
        if got.shape != want.shape:
            raise Wrong(f"for lengths {lengths} and max_len {max_len} the mask should have shape "
                        f"{tuple(want.shape)}, got {tuple(got.shape)}")
        if not torch.equal(got, want):
            raise Wrong(f"for lengths {lengths}, max_len {max_len}: expected {want.int().tolist()} "
                        f"(True at real tokens), got {got.int().tolist()}")


@checker("00.padding_fraction", hint="padding = (cells of the padded grid) - (real tokens); "
         "the grid of one batch is len(batch) * max(lengths in batch)")
def _check_padding_fraction(fraction: Callable[[list[list[int]], list[int]], float]) -> None:
    cases = [([[0, 1], [2]], [3, 1, 2], 1 - 6 / 8), ([[0], [1], [2]], [3, 1, 2], 0.0),
             ([[0, 1, 2]], [4, 4, 1], 1 - 9 / 12)]
    for batches, lengths, want in cases:
        got = fraction(batches, lengths)
        if not isinstance(got, (float, int)) or isinstance(got, bool):
            raise Wrong(f"return a number, got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            raise Wrong(f"for batches {batches} and lengths {lengths}: expected {want:.4f}, got {got:.4f}")

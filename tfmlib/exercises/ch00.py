"""Checkers for chapter 00 (preface).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("00.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, mask_mismatch


@checker(
    "00.padding_mask",
    hint=("the section 'From text to tensors' builds this mask for a batch: compare every position index "
          "with every sentence's length, and let broadcasting make the grid (one axis from the positions, "
          "one from the lengths)"),
)
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
            raise Wrong(mask_mismatch(got, want, f"for lengths {lengths} and max_len {max_len} "
                                                 "(True at real tokens)"))


@checker(
    "00.padding_fraction",
    hint=("padding is every slot of a batch's padded grid that holds no token: count each batch's grid "
          "(its size times its longest sentence) and its real tokens, over all batches; the section "
          "'Bucketing' prints the number to compare with"),
)
def _check_padding_fraction(fraction: Callable[[list[list[int]], list[int]], float]) -> None:
    cases = [([[0, 1], [2]], [3, 1, 2], 1 - 6 / 8), ([[0], [1], [2]], [3, 1, 2], 0.0),
             ([[0, 1, 2]], [4, 4, 1], 1 - 9 / 12)]
    for batches, lengths, want in cases:
        got = fraction(batches, lengths)
        if not isinstance(got, (float, int)) or isinstance(got, bool):
            raise Wrong(f"return a number, got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            raise Wrong(f"for batches {batches} and lengths {lengths}: expected {want:.4f}, got {got:.4f}")

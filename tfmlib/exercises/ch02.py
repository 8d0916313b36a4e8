"""Checkers for chapter 02 (seq2seq).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("02.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close, mask_mismatch


def _random_logits_and_targets(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, T, V = (int(v) for v in torch.randint(2, 7, (3,), generator=g))
    logits = torch.randn(B, T, V, generator=g) * 2
    targets = torch.randint(1, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # one full row, the others padded
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # PAD_ID
    return logits, targets


@checker(
    "02.masked_token_loss",
    hint=("section 4 says why padded positions must not count: build the keep-mask from PAD_ID, take the "
          "log-probability each position gives its own target (a log-softmax over the vocabulary, then "
          "pick the target's entry), and average over the kept positions only, not over all B*T"),
)
def _check_masked_token_loss(masked_token_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    for seed in range(5):
        logits, targets = _random_logits_and_targets(seed)
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0)
        got = masked_token_loss(logits.clone(), targets.clone())
        if isinstance(got, torch.Tensor) and got.dim() == 0 and (targets == 0).any():
            everything = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            if torch.allclose(got.double(), everything.double(), atol=1e-5):
                raise Wrong("your loss counts the padded positions too: average over the real "
                            "tokens only (targets != 0)")
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            raise Wrong(f"return a scalar (0-d) tensor, got shape {tuple(got.shape)}")
        expect_close(got, want,
                     f"masked_token_loss(logits {tuple(logits.shape)}, targets {tuple(targets.shape)})")


@checker(
    "02.cut_at_eos",
    hint=("section 7's greedy decoder stops each row at EOS_ID; work row by row on plain Python lists, and "
          "remember that a row may never produce EOS_ID at all"),
)
def _check_cut_at_eos(cut_at_eos: Callable[[torch.Tensor], list[list[int]]]) -> None:
    cases = [
        torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0], [4, 4, 4, 4]]),
        torch.tensor([[2, 5, 2]]),
        torch.tensor([[9, 2, 9, 9], [8, 8, 2, 0]]),
    ]
    for tokens in cases:
        want = [row[: row.index(2)] if 2 in row else row for row in tokens.tolist()]
        got = cut_at_eos(tokens.clone())
        if isinstance(got, torch.Tensor):
            raise Wrong("return a list of lists of ints (rows have different lengths), not a tensor")
        if not isinstance(got, list) or any(not isinstance(r, list) for r in got):
            raise Wrong(f"return a list of lists, got {type(got).__name__}")
        if got != want:
            raise Wrong(f"for tokens {tokens.tolist()} expected {want}, got {got}")


def _reverse_source_reference(src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
    out = src.clone()
    for i, n in enumerate(src_mask.sum(dim=1).tolist()):
        out[i, : n - 1] = src[i, : n - 1].flip(0)  # the words; EOS stays at n - 1
    return out


@checker(
    "02.reverse_source",
    hint=("section 1 shows the layout of a source row (words, then EOS_ID, then padding); the mask gives "
          "each row's length, and only the words before EOS_ID change places"),
)
def _check_reverse_source(reverse_source: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    from tfmlib.data import EOS_ID, pad_sequences

    cases = [[[5, 6, 7], [8], [9, 10]], [[4, 5, 6, 7, 8]], [[11, 12], [13, 14, 15, 16]]]
    for rows in cases:
        src, mask = pad_sequences([r + [EOS_ID] for r in rows])
        want = _reverse_source_reference(src, mask)
        got = reverse_source(src.clone(), mask.clone())
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a tensor like src, got {type(got).__name__}")
        if got.shape != src.shape:
            raise Wrong(f"the result should keep src's shape {tuple(src.shape)}, got {tuple(got.shape)}")
        if torch.equal(got, src.flip(1)):
            raise Wrong("you flipped whole rows: the padding and EOS moved to the front; reverse "
                        "only each row's words")
        if not torch.equal(got, want):
            raise Wrong(f"for sources {src.tolist()} expected {want.tolist()}, got {got.tolist()}")


@checker(
    "02.brevity_penalty",
    hint=("section 8 and Papineni et al. (2002, section 2.2.2): the penalty is 1 when the hypothesis is "
          "longer than the reference, and otherwise decays exponentially in the ratio of reference to "
          "hypothesis length"),
)
def _check_brevity_penalty(brevity_penalty: Callable[[int, int], float]) -> None:
    import math

    for h, r in [(10, 10), (12, 10), (5, 10), (9, 10), (1, 7), (100, 3)]:
        want = 1.0 if h > r else math.exp(1 - r / h)
        got = brevity_penalty(h, r)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise Wrong(f"return a float, got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            raise Wrong(f"for h={h}, r={r} expected {want:.6f}, got {got:.6f}"
                        + (" (too-long output is not penalised)" if h > r else ""))


@checker(
    "02.padding_mask",
    hint=("section 1 builds this mask for every batch (`src_mask`): compare every position index "
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
    "02.padding_fraction",
    hint=("padding is every slot of a batch's padded grid that holds no token: count each batch's grid "
          "(its size times its longest sentence) and its real tokens, over all batches; section 1 "
          "prints the number to compare with"),
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

"""Checkers for chapter 05 (scaled dot-product and multi-head attention).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("05.name", answer)``.
The three exercises ask for what the chapter does not write out: merging two blocks of keys of a
softmax exactly (the step FlashAttention repeats, question 7), finding a causal layer's leaks when
section 4's Jacobian test is not available (black-box layers, leaks that show for some inputs only),
and the mask and positions of a left-padded causal batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .core import Wrong, checker, expect_close

# ----------------------------------------------------------------------------- 05.merge_blocks


def _ch05_block(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(m, l, o)`` of one block: row maxima ``(R,)``, ``sum exp(e - m)`` ``(R,)`` and the block's own
    softmax-weighted values ``(R, d_v)``; a row whose scores are all ``-inf`` gets ``(-inf, 0, 0)``."""
    m = scores.max(dim=-1).values
    safe_m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - safe_m[:, None])                                 # exp(-inf) = 0 for hidden keys
    total = p.sum(-1)
    o = (p @ values) / total.clamp_min(torch.finfo(total.dtype).tiny)[:, None]
    return m, total, o


def _ch05_merge_case(seed: int) -> tuple[Tensor, Tensor, int]:
    """Scores ``(R, S)`` with a wide spread, values ``(S, d_v)`` and the split point between the blocks.

    Row 0 has its two blocks 1000 apart (exp of the difference overflows even float64), row 1 has its
    first block hidden (all ``-inf``), row 3 both (a query that may see nothing: the merged triple
    must be ``(-inf, 0, 0)``, not NaN), the rest are ordinary."""
    g = torch.Generator().manual_seed(seed)
    R, S, d_v = 6, 7 + seed % 4, 3 + seed % 2
    split = 2 + seed % 3
    scores = 4 * torch.randn(R, S, generator=g)
    scores[0, split:] += 1000.0
    scores[1, :split] = -math.inf
    scores[2] -= 200.0
    scores[3] = -math.inf
    return scores, torch.randn(S, d_v, generator=g), split


@checker("05.merge_blocks", hint="Question 7 and section 3's masked softmax: the two sums are measured "
         "against different maxima, and each block's output is already normalised by its own sum. Think "
         "of a row whose blocks are 1000 apart in float32, a row hidden in one block, and a row hidden in "
         "both (a query that may see nothing).")
def _check_merge_blocks(merge: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    for seed in range(5):
        scores, values, split = _ch05_merge_case(seed)
        b1 = _ch05_block(scores[:, :split], values[:split])
        b2 = _ch05_block(scores[:, split:], values[split:])
        want_m, want_l, want_o = _ch05_block(scores, values)
        got = merge(*(t.clone() for t in (*b1, *b2)))
        if not isinstance(got, tuple) or len(got) != 3:
            raise Wrong("return the merged triple (m, l, o)")
        m, total, o = got
        for what, x in (("m", m), ("l", total), ("o", o)):
            if isinstance(x, Tensor) and x.dtype != values.dtype:
                raise Wrong(f"{what} is {x.dtype}, the blocks are {values.dtype}: return the blocks' dtype "
                            "(a kernel keeps its running triple in the dtype it was given)")
        seen = torch.arange(want_o.shape[0]) != 3          # row 3 is hidden in both blocks: checked last
        shaped = all(isinstance(x, Tensor) and x.shape == y.shape
                     for x, y in zip(got, (want_m, want_l, want_o), strict=True))
        if shaped and not torch.isfinite(o[seen]).all():
            raise Wrong("inf or NaN in o: exp of a difference of maxima overflowed (row 0's blocks are 1000 "
                        "apart, beyond float64's range too, so computing in a wider type only postpones it), "
                        "or a hidden block (m = -inf) gave -inf - (-inf); subtract the larger maximum, so "
                        "every exponent is <= 0")
        if shaped:
            if torch.allclose(o[seen], ((b1[2] + b2[2]) / 2)[seen], atol=1e-4):
                raise Wrong("o is the plain average of the two blocks' outputs: each block must count in "
                            "proportion to its share of the softmax's denominator")
            naive_l = b1[1] + b2[1]
            unrescaled = (b1[1][:, None] * b1[2] + b2[1][:, None] * b2[2]) / naive_l[:, None]
            if torch.allclose(o[seen], unrescaled[seen], atol=1e-4):
                raise Wrong("l1 and l2 are sums of exp(e - m1) and exp(e - m2), measured against different "
                            "maxima: rescale each to the common maximum before weighting and adding")
            expect_close(m[seen], want_m[seen], "m, the running maximum of each row (R,)", atol=0, rtol=0)
            expect_close(total[seen], want_l[seen], "l = sum over both blocks of exp(e - m) (R,)", rtol=1e-4)
            expect_close(o[seen], want_o[seen], f"o, the softmax-weighted values {tuple(want_o.shape)}",
                          atol=1e-5)
            if not (torch.isfinite(o[3]).all() and torch.isfinite(total[3])):
                raise Wrong("NaN for row 3, whose keys are hidden in both blocks (m1 = m2 = -inf, l1 = l2 = "
                            "0): -inf - (-inf) is NaN. A query that may see nothing must come out as "
                            "(-inf, 0, 0), as section 3's masked softmax gives zeros, not NaN")
        expect_close(m, want_m, "m, the running maximum of each row (R,)", atol=0, rtol=0)
        expect_close(total, want_l, "l = sum over both blocks of exp(e - m) (R,)", rtol=1e-4)
        expect_close(o, want_o, f"o, the softmax-weighted values of both blocks {tuple(want_o.shape)}",
                     atol=1e-5)


# ----------------------------------------------------------------------------- 05.find_the_leak


class _Ch05Layer:
    """A small single-head causal attention layer in float64 with one planted bug (or none), run as a
    black box: without gradients, as a deployed model runs.

    ``bug``: ``None`` (correct), ``"offset"`` (the mask lets query t see key t + 1), ``"values"`` (correct
    weights, but each value is made from its own input and the next one: zero weights above the
    diagonal, and still a leak), ``"transposed"`` (the mask is the upper triangle), ``"centre"`` (the
    inputs are centred on their mean over all positions first: every output reads every input),
    ``"data"`` (query t also sees key t + 1, but only when that input's projection on a fixed direction
    ``(1, -1, 1, -1, ...)`` exceeds 1: a leak that shows for some inputs only, about 3 in 10 random ones,
    and never for a constant input), ``"tiny"`` (each value carries 1e-9 times the input two
    positions on)."""

    def __init__(self, d: int, bug: str | None, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.W = [torch.randn(d, d, generator=g, dtype=torch.double) / math.sqrt(d) for _ in range(4)]
        self.bug = bug

    def forward(self, x: Tensor, trigger_always: bool = False) -> Tensor:
        """The layer, differentiable; ``trigger_always`` opens the data-dependent leak for every input
        (what the checker's ground truth uses)."""
        T = x.shape[1]
        if self.bug == "centre":
            x = x - x.mean(dim=1, keepdim=True)
        q, k, v = x @ self.W[0], x @ self.W[1], x @ self.W[2]
        if self.bug in ("values", "tiny"):
            step, size = (1, 1.0) if self.bug == "values" else (2, 1e-9)
            ahead = torch.cat([x[:, step:], torch.zeros_like(x[:, :step])], dim=1)   # the input `step` on
            v = v + size * (ahead @ self.W[3])
        keep = torch.ones(T, T, dtype=torch.bool).tril(diagonal=1 if self.bug == "offset" else 0)
        if self.bug == "transposed":
            keep = keep.T
        if self.bug == "data":       # a fixed direction of zero sum: no constant input opens it
            direction = torch.tensor([1.0, -1.0] * (x.shape[-1] // 2), dtype=x.dtype)
            opens = torch.ones(T, dtype=torch.bool) if trigger_always else x[0] @ direction > 1.0
            keep = keep | (torch.ones(T, T, dtype=torch.bool).tril(1).triu(1) & opens[None, :])
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
        return torch.softmax(scores, dim=-1) @ v

    def __call__(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[0] != 1:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"the layer takes one sequence (1, T, d), got {got}")
        with torch.no_grad():
            return self.forward(x.detach().double())


def _ch05_black_box(layer: _Ch05Layer) -> Callable[[Tensor], Tensor]:
    """What the reader gets: a plain function, so neither the differentiable ``forward`` nor the bug's
    name is within reach of a tab completion."""
    def black_box(x: Tensor) -> Tensor:
        return layer(x)
    return black_box


def _ch05_true_leaks(layer: _Ch05Layer, T: int, d: int) -> Tensor:
    """``(T, T)``: True where output t depends on a later input s for SOME input (the ground truth)."""
    x = torch.randn(1, T, d, dtype=torch.double, generator=torch.Generator().manual_seed(99))
    J = torch.autograd.functional.jacobian(lambda inp: layer.forward(inp, trigger_always=True), x)
    depends = J[0, :, :, 0].abs().sum(dim=(1, 3)) > 0                       # (T, T): out_t on x_s
    return depends & torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)


_CH05_BUGS = (None, "offset", "values", "transposed", "centre", "data", "tiny")


@checker("05.find_the_leak", hint="Section 4's question, asked without its tool: these layers run without "
         "gradients, as a deployed model does. Chapter 04's step 6 tested causality by giving a layer a "
         "different future. Some planted leaks show only for some inputs, and one is very small.")
def _check_find_the_leak(future_leaks: Callable[[Callable[[Tensor], Tensor], int, int], Tensor]) -> None:
    for i, bug in enumerate(_CH05_BUGS):
        T, d = 5 + i % 2, 4
        layer = _Ch05Layer(d, bug, seed=i)
        want = _ch05_true_leaks(layer, T, d)
        got = future_leaks(_ch05_black_box(layer), T, d)
        if not isinstance(got, Tensor):
            raise Wrong(f"return a (T, T) bool tensor, got {type(got).__name__}")
        if got.shape != (T, T):
            raise Wrong(f"return a (T, T) = {(T, T)} tensor (rows: outputs t, columns: inputs s), got "
                        f"{tuple(got.shape)}")
        got = got.bool()
        what = "a correct causal layer" if bug is None else f"planted bug {i}"
        if torch.equal(got, want):
            continue
        if want.any() and torch.equal(got, want.T):
            raise Wrong("your matrix is transposed: row t, column s must say whether output t depends on "
                        "input s")
        if got.tril().any():
            raise Wrong(f"{what}: you marked entries with s <= t; only a dependence on a LATER input (s > t) "
                        "is a leak, a causal layer must depend on the inputs up to its own position")
        if (got & ~want).any():
            t, s = (int(v) for v in (got & ~want).nonzero()[0])
            raise Wrong(f"{what}: you marked {int((got & ~want).sum())} pair(s) that do not leak, e.g. "
                        f"output {t} and input {s}. Change one input at a time: changing every input from s "
                        "on cannot tell which of them the output read")
        missed = want & ~got
        if bug == "data":
            raise Wrong(f"{what} leaks only for some inputs: you found {int(got.sum())} of its "
                        f"{int(want.sum())} leaking pairs. One input, or one change, can miss it: try "
                        "several fresh random inputs and several changes for every s")
        if bug == "tiny":
            raise Wrong(f"{what} leaks by about 1e-9 of the output: you found {int(got.sum())} of its "
                        f"{int(want.sum())} leaking pairs. A correct causal layer gives bit-for-bit the same "
                        "output when a later input changes, so count any difference at all, in float64, "
                        "not a difference above a tolerance")
        if not got.any():
            raise Wrong(f"{what} leaks at {int(want.sum())} (t, s) pairs and you found none. These layers "
                        "give no gradients (a Jacobian of them is zero), and their attention weights are not "
                        "shown: test what the output does when a later input changes")
        far = missed & torch.ones(T, T, dtype=torch.bool).triu(2)
        if far.any():
            raise Wrong(f"{what}: you found {int(got.sum())} of its {int(want.sum())} leaking (t, s) pairs "
                        "and missed some with s > t + 1: check every later input s, not only the next one")
        raise Wrong(f"{what}: you found {int(got.sum())} of its {int(want.sum())} leaking (t, s) pairs")


# ----------------------------------------------------------------------------- 05.left_padded_causal


def _ch05_left_padded(lengths: list[int], T: int) -> Tensor:
    return torch.arange(T)[None, :] >= (T - torch.tensor(lengths))[:, None]   # (B, T): False, then True


def _ch05_left_padded_reference(token_mask: Tensor) -> tuple[Tensor, Tensor]:
    T = token_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = token_mask[:, None, None, :] & token_mask[:, None, :, None] & causal
    positions = (token_mask.long().cumsum(-1) - 1).clamp_min(0)
    return mask, positions


@checker("05.left_padded_causal", hint="Section 3's masks, with the padding on the left: which of a "
         "query's keys may it see, and what may a padded query see? For the positions, ask which position "
         "each sentence's first real token has when the sentence is alone, unpadded.")
def _check_left_padded_causal(left_padded_causal: Callable[[Tensor], tuple[Tensor, Tensor]]) -> None:
    for lengths, T in [([4, 2, 1], 4), ([5, 3], 6), ([1, 6, 2, 4], 6), ([3], 3)]:
        token_mask = _ch05_left_padded(lengths, T)
        want_mask, want_pos = _ch05_left_padded_reference(token_mask)
        got = left_padded_causal(token_mask.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (mask, positions)")
        mask, positions = got
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise Wrong("mask must be a bool tensor, True where a query may attend to a key")
        B = len(lengths)
        if mask.shape != (B, 1, T, T):
            raise Wrong(f"mask must have shape (B, 1, T, T) = {(B, 1, T, T)} (one per sentence, shared by "
                        f"the heads), got {tuple(mask.shape)}")
        if torch.equal(mask, ~want_mask):
            raise Wrong("your mask is True where attention is NOT allowed; the book's masks are True where a "
                        "query may attend")
        real_q = token_mask[:, None, :, None].expand_as(mask)
        pad_k = ~token_mask[:, None, None, :].expand_as(mask)
        later = torch.ones(T, T, dtype=torch.bool).triu(1).expand_as(mask)
        if (mask & real_q & pad_k).any():
            raise Wrong("a real query may attend to a pad (a key where token_mask is False): hide the "
                        "padded keys")
        if (mask & real_q & later).any():
            raise Wrong("a real query may attend to a later key: the mask must also be causal")
        if (mask & ~real_q).any():
            raise Wrong("a padded query must see nothing (its row all False): nothing reads its output, and "
                        "in a left-padded batch no real key comes before it")
        if not torch.equal(mask, want_mask):
            raise Wrong(f"for lengths {lengths}, T = {T}: a real query must see every real key up to itself; "
                        f"expected {want_mask[:, 0].int().tolist()}, got {mask[:, 0].int().tolist()}")
        if not isinstance(positions, Tensor) or positions.dtype not in (torch.int64, torch.int32):
            raise Wrong("positions must be an integer tensor (B, T), usable as indices into a position table")
        if positions.shape != (B, T):
            raise Wrong(f"positions must have shape (B, T) = {(B, T)}, got {tuple(positions.shape)}")
        columns = torch.arange(T).expand(B, T)
        if not torch.equal(positions.long(), want_pos) and torch.equal(positions.long(), columns):
            raise Wrong("positions = 0 .. T-1 for every row gives a sentence's first real token the position "
                        "T - length, which depends on how much padding the batch needed: the same sentence "
                        "would be encoded differently in another batch. Number the real tokens from 0")
        if (positions[~token_mask] != 0).any():
            raise Wrong("give the pads position 0 (a valid row of a position table; -1 would index its "
                        "last row, and nothing reads the pads' outputs anyway)")
        expect_close(positions.long(), want_pos, f"positions for lengths {lengths}, T = {T}", atol=0, rtol=0)

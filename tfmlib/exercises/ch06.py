"""Checkers for chapter 06 (positional encoding).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("06.name", answer)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .core import Wrong, checker, expect_close


def _ch06_frequencies(d: int) -> torch.Tensor:
    """``omega_i = 10000^(-2i/d)``, one per pair of columns (float64)."""
    return 10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _ch06_table(length: int, d: int, omega: torch.Tensor | None = None, first=torch.sin,
                second=torch.cos, interleave: bool = True) -> torch.Tensor:
    """The sinusoidal table (float64), or a variant of it made with a typical mistake."""
    omega = _ch06_frequencies(d) if omega is None else omega
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None, :]
    if not interleave:  # all sines, then all cosines
        return torch.cat([first(angles), second(angles)], dim=1)[:, :d]
    table = torch.empty(length, d, dtype=torch.float64)
    table[:, 0::2] = first(angles)
    table[:, 1::2] = second(angles[:, : d // 2])
    return table


def _same(got: Any, want: torch.Tensor, atol: float = 1e-5) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape and got.is_floating_point()
            and torch.allclose(got.double(), want, atol=atol, rtol=0))


@checker("06.direction_matrix", hint="question 3 of the chapter. Section 3 showed two facts: a fixed "
         "offset is one orthogonal map of the table (M_j moves every PE_p to PE_(p+j), and its transpose "
         "moves it back), and the dot product of two rows of the table depends on their offset only and "
         "is largest when the offset is 0. Choose W so that it moves PE_(p+k) to a row whose offset from "
         "PE_p is zero exactly when k is the offset asked for")
def _check_direction_matrix(direction_matrix: Callable[[int, int], torch.Tensor]) -> None:
    span = 40                                                  # the offsets k = -span .. span compared
    for offset, d in [(3, 16), (-5, 16), (12, 64), (1, 32)]:
        W = direction_matrix(offset, d)
        if not isinstance(W, torch.Tensor) or not W.is_floating_point():
            got = W.dtype if isinstance(W, torch.Tensor) else type(W).__name__
            raise Wrong(f"return a floating torch.Tensor, got {got}")
        if W.shape != (d, d):
            raise Wrong(f"direction_matrix({offset}, {d}) should be ({d}, {d}), got {tuple(W.shape)}")
        table = _ch06_table(200 + 2 * span, d)
        ks = torch.arange(-span, span + 1)
        p = torch.arange(span, span + 200)
        # score[k, p] = PE_p^T W PE_(p+k)
        score = torch.stack([((table[p] @ W.double()) * table[p + k]).sum(-1) for k in ks.tolist()])
        if not torch.isfinite(score).all():
            raise Wrong("the scores PE_p^T W PE_(p+k) are not all finite")
        vary = (score.max(1).values - score.min(1).values).max().item()
        if vary > 1e-4 * max(1.0, score.abs().max().item()):
            raise Wrong(f"with your W the score PE_p^T W PE_(p+k) changes with the position p (by up to "
                        f"{vary:.3g} for one k): it should depend on the offset k only, as the dot product "
                        "of two table rows does")
        by_k = score.mean(1)
        plus, minus = by_k[span + offset].item(), by_k[span - offset].item()
        if abs(plus - minus) < 1e-6 * max(1.0, abs(plus)):
            raise Wrong(f"your score is the same for k = {offset} and k = {-offset}: it cannot tell after "
                        "from before (a symmetric W, such as the identity, never can)")
        best = int(ks[by_k.argmax()])
        if best == -offset:
            raise Wrong(f"your score is largest at k = {-offset}, not {offset}: the direction is reversed "
                        f"(your W favours the key {abs(offset)} positions on the other side)")
        if best != offset:
            raise Wrong(f"for offset {offset}, d_model {d}: your score PE_p^T W PE_(p+k) is largest at "
                        f"k = {best}, over k = -{span}..{span}; it should be largest at k = {offset}")


@checker("06.copy_bias", hint="ALiBi's bias (section 5) is largest on the diagonal and falls with the "
         "distance on both sides; this task needs one that is largest at the offset s - t of the key b "
         "positions back and low everywhere else, by a margin that content scores of size 4 cannot "
         "overturn. Build it from the matrix of offsets s - t, as alibi_bias does, and make sure every row "
         "still has a finite entry")
def _check_copy_bias(copy_bias: Callable[[int, int], torch.Tensor]) -> None:
    for length, back in [(12, 3), (40, 3), (64, 5), (9, 1)]:
        bias = copy_bias(length, back)
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            got = bias.dtype if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise Wrong(f"return a floating torch.Tensor (an additive mask), got {got}")
        if bias.shape != (length, length):
            raise Wrong(f"copy_bias({length}, {back}) should be (L, L) = {(length, length)}, got "
                        f"{tuple(bias.shape)}")
        bias = bias.double()
        if torch.isnan(bias).any() or (bias == math.inf).any():
            raise Wrong("the bias holds NaN or +inf; use large finite values or -inf")
        if not torch.isfinite(bias).any(-1).all():
            row = int((~torch.isfinite(bias).any(-1)).nonzero()[0])
            raise Wrong(f"row {row} of the bias is -inf everywhere: query {row} would see no key, and a "
                        "softmax over nothing is NaN; give the first rows (with no key b back) something "
                        "to see")
        inner, shifted = bias[:-1, :-1], bias[1:, 1:]
        if not torch.equal(inner.nan_to_num(neginf=-1e300), shifted.nan_to_num(neginf=-1e300)) \
                and not torch.allclose(inner.nan_to_num(neginf=-1e300), shifted.nan_to_num(neginf=-1e300),
                                       atol=1e-6, rtol=1e-9):
            raise Wrong("the bias must depend on the offset s - t only (entry [t, s] equal to "
                        "[t + 1, s + 1]), like ALiBi's: yours depends on where the pair sits")
        t = torch.arange(back, length)
        # the worst case for the right key: its content score -4, every other key's +4
        scores = torch.full((length, length), 4.0, dtype=torch.float64)
        scores[t, t - back] = -4.0
        on_target = torch.softmax(scores + bias, dim=-1)[t, t - back]
        if on_target.min() < 0.9:
            t_bad = int(t[on_target.argmin()])
            favourite = int(bias[t_bad].argmax()) - t_bad
            share = f"{on_target.min().item():.1%}"
            if favourite == back:
                raise Wrong(f"your bias favours the key {back} positions *ahead* (offset s - t = +{back}); "
                            f"the key {back} back is at offset -{back}")
            if favourite == 0:
                raise Wrong(f"your bias favours the query's own position (offset 0), like ALiBi's: query "
                            f"{t_bad} puts only {share} of its weight on the key {back} back")
            raise Wrong(f"with content scores in [-4, 4] working against it, query {t_bad} puts only {share} "
                        f"of its weight on the key {back} back (at least 90% needed): the bonus of that "
                        "offset over the others is too small")


def _ch06_rotate(x: torch.Tensor, positions: torch.Tensor, sign: int = 1,
                 layout: str = "pairs") -> torch.Tensor:
    d = x.shape[-1]
    angles = sign * positions.double()[:, None] * _ch06_frequencies(d)[None, :]      # (L, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    x = x.double()
    a, b = (x[..., 0::2], x[..., 1::2]) if layout == "pairs" else (x[..., : d // 2], x[..., d // 2:])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if layout == "halves":
        return torch.cat([ra, rb], dim=-1)
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = ra, rb
    return out


@checker("06.rotate_pairs", hint="section 5's RotaryEmbedding.rotate does the same with the pairs "
         "(i, i + d/2); here a pair is two neighbouring features, 2i and 2i + 1. The frequencies are those "
         "of section 3's table, one per pair, and each pair turns by the 2x2 rotation written above; put "
         "the rotated first and second coordinates back into the even and the odd features")
def _check_rotate_pairs(rotate_pairs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    cases = [((5, 4), [0, 1, 2, 3, 4]), ((2, 3, 6, 8), [7, 0, 3, 12, 5, 40]), ((1, 2, 4, 16), [2, 9, 1, 30])]
    for seed, (shape, positions) in enumerate(cases):
        g = torch.Generator().manual_seed(seed)
        x, pos = torch.randn(shape, generator=g), torch.tensor(positions)
        want = _ch06_rotate(x, pos)
        got = rotate_pairs(x.clone(), pos.clone())
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.shape != x.shape:
            raise Wrong(f"the result should keep x's shape {tuple(x.shape)}, got {tuple(got.shape)}")
        if _same(got, _ch06_rotate(x, pos, layout="halves")):
            raise Wrong("you paired feature i with feature i + d/2 (the package's layout); this exercise "
                        "pairs neighbours, (2i, 2i + 1), as Su et al. write it")
        if _same(got, _ch06_rotate(x, pos, sign=-1)):
            raise Wrong("you rotated by -p * theta_i: x'_2i = x_2i cos - x_2i+1 sin and "
                        "x'_2i+1 = x_2i sin + x_2i+1 cos")
        if pos.tolist() != list(range(len(pos))) and _same(got, _ch06_rotate(x, torch.arange(len(pos)))):
            raise Wrong("use the positions you are given, not 0, 1, ..., L - 1")
        if isinstance(got, torch.Tensor) and got.is_floating_point() and not torch.allclose(
                got.double().norm(dim=-1), x.double().norm(dim=-1), atol=1e-4):
            raise Wrong("a rotation keeps the length of every vector, yours changes it: each pair must be "
                        "rotated by [[cos, -sin], [sin, cos]]")
        expect_close(got, want, f"rotate_pairs(x {tuple(x.shape)}, positions {positions})", atol=1e-5, rtol=0)



"""Checkers for chapter 06 (positional encoding).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("06.name", answer)``.
"""

from __future__ import annotations

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


@checker("06.sinusoidal_table", hint="omega = 10000 ** (-torch.arange(0, d_model, 2) / d_model) (one "
         "frequency per pair of columns); angles = positions[:, None] * omega[None, :]; "
         "table[:, 0::2] = sin(angles), table[:, 1::2] = cos(angles) (with an odd d_model there is one "
         "cosine column fewer)")
def _check_sinusoidal_table(sinusoidal_table: Callable[[int, int], torch.Tensor]) -> None:
    for length, d in [(10, 8), (50, 16), (7, 6), (30, 5), (120, 64)]:
        want = _ch06_table(length, d)
        got = sinusoidal_table(length, d)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if not got.is_floating_point():
            raise Wrong(f"the table should be float32 (or float64), got dtype {got.dtype}")
        if got.shape == (d, length) != want.shape:
            raise Wrong(f"sinusoidal_table({length}, {d}) should be (length, d_model) = {(length, d)}, "
                        f"got it transposed, {tuple(got.shape)}")
        if _same(got, _ch06_table(length, d, first=torch.cos, second=torch.sin)):
            raise Wrong("sine and cosine are swapped: the even columns 2i hold sin(p * omega_i), the odd "
                        "ones cos")
        if _same(got, _ch06_table(length, d, interleave=False)):
            raise Wrong("you put all the sines first and then all the cosines: the two columns of a pair "
                        "are neighbours, 2i (sin) and 2i + 1 (cos)")
        pair_index = 10_000.0 ** (-torch.arange(0, (d + 1) // 2, dtype=torch.float64) / d)
        if _same(got, _ch06_table(length, d, omega=pair_index)):
            raise Wrong("the exponent of pair i is 2i / d_model (2i is the index of the pair's first "
                        "column), not i / d_model")
        column_index = torch.empty(length, d, dtype=torch.float64)
        for j in range(d):  # the column index j in the exponent, for sin and cos alike
            w = 10_000.0 ** (-j / d)
            column_index[:, j] = (torch.sin if j % 2 == 0 else torch.cos)(torch.arange(length) * w)
        if _same(got, column_index):
            raise Wrong("a cosine column 2i + 1 uses the same frequency as its sine column 2i: "
                        "10000^(-2i/d_model), not 10000^(-(2i+1)/d_model)")
        expect_close(got, want, f"sinusoidal_table({length}, {d})", atol=1e-5, rtol=0)


def _ch06_offset_matrix(offset: int, d: int, sign: int = 1, scale_by_omega: bool = True) -> torch.Tensor:
    M = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(_ch06_frequencies(d).tolist()):
        a = offset * w if scale_by_omega else float(offset)
        angle = torch.tensor(a, dtype=torch.float64)
        c, s = torch.cos(angle), torch.sin(angle)
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1] = c, sign * s
        M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = -sign * s, c
    return M


@checker("06.offset_matrix", hint="block diagonal: for each pair i, with a = offset * omega_i, the 2x2 block "
         "at rows and columns (2i, 2i+1) is [[cos a, sin a], [-sin a, cos a]], because "
         "sin(x + a) = cos a sin x + sin a cos x and cos(x + a) = -sin a sin x + cos a cos x")
def _check_offset_matrix(offset_matrix: Callable[[int, int], torch.Tensor]) -> None:
    for offset, d in [(1, 4), (3, 8), (-5, 8), (17, 16), (0, 6), (100, 32)]:
        want = _ch06_offset_matrix(offset, d)
        got = offset_matrix(offset, d)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.shape != (d, d):
            raise Wrong(f"offset_matrix({offset}, {d}) should be ({d}, {d}), got {tuple(got.shape)}")
        if offset != 0 and _same(got, _ch06_offset_matrix(offset, d, sign=-1), atol=1e-5):
            raise Wrong(f"your matrix moves positions the wrong way, PE[p] -> PE[p - ({offset})]: the "
                        "block is [[cos a, sin a], [-sin a, cos a]] for rows (sin, cos)")
        if offset != 0 and _same(got, _ch06_offset_matrix(offset, d, scale_by_omega=False), atol=1e-5):
            raise Wrong("pair i turns by offset * omega_i, not by the offset itself: every pair has its "
                        "own frequency")
        table, lo = _ch06_table(50 + abs(offset), d), max(0, -offset)
        moved = table[lo: lo + 50] @ got.double().T if got.is_floating_point() else None
        if moved is not None and not torch.allclose(moved, table[lo + offset: lo + offset + 50], atol=1e-5):
            err = (moved - table[lo + offset: lo + offset + 50]).abs().max().item()
            raise Wrong(f"for offset {offset}, d_model {d}: M @ PE[p] should equal PE[p + {offset}] for "
                        f"every p, but they differ by up to {err:.3g}")
        expect_close(got, want, f"offset_matrix({offset}, {d})", atol=1e-5, rtol=0)


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


@checker("06.rotate_pairs", hint="theta = 10000 ** (-torch.arange(0, d, 2) / d); angles = "
         "positions[:, None] * theta[None, :] is (L, d/2); with a = x[..., 0::2] and b = x[..., 1::2], "
         "the result has a * cos - b * sin in the even features and a * sin + b * cos in the odd ones")
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



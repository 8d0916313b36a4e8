"""Checkers for chapter 06 (positional encoding).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("06.name", answer)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .core import Wrong, checker


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


def _ch06_rotation_blocks(offset: int, d: int) -> torch.Tensor:
    """Section 3's ``M_offset`` for the base-10,000 table (float64): ``PE[p + offset] = M @ PE[p]``."""
    M = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(_ch06_frequencies(d).tolist()):
        c, s = math.cos(offset * w), math.sin(offset * w)
        M[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return M


def _ch06_back_pattern(n: int, back: int) -> torch.Tensor:
    """``(n, n)`` float64: 1 at ``[t, t - back]``, 0 elsewhere (``back`` may be negative: ahead)."""
    t = torch.arange(n)
    return (t[None, :] == t[:, None] - back).double()


def _ch06_best_residual(table: torch.Tensor, target: torch.Tensor) -> float:
    """The smallest ``||P W P^T - B||^2`` over all ``W``: ``B`` projected on both sides onto P's columns."""
    project = table @ torch.linalg.pinv(table)
    return ((project @ target @ project - target) ** 2).sum().item()


@checker("06.offset_weights", hint="section 2's expanded score: its position-position term, written for "
         "every pair of rows at once, is a product of three matrices of which W is the middle one. Solve for "
         "it as a least-squares problem (with fewer rows than columns the fit can be exact). Section 3's M_k "
         "is no help: it moves the rows of the sinusoidal table, and a learned table has no such structure")
def _check_offset_weights(offset_weights: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    # (rows n, width d, back): n <= d has an exact answer, n > d only a least-squares one
    for seed, (n, d, back) in enumerate([(12, 32, 3), (16, 16, 1), (20, 48, 4), (40, 24, 5), (30, 20, 2)]):
        g = torch.Generator().manual_seed(seed)
        table = torch.randn(n, d, generator=g, dtype=torch.float64) * 2 ** -0.5    # a learned table's init
        target = _ch06_back_pattern(n, back)
        W = offset_weights(table.clone(), back)
        what = f"offset_weights(table ({n}, {d}), back={back})"
        if not isinstance(W, torch.Tensor) or not W.is_floating_point():
            got = W.dtype if isinstance(W, torch.Tensor) else type(W).__name__
            raise Wrong(f"{what}: return a floating torch.Tensor, got {got}")
        if W.shape != (d, d):
            raise Wrong(f"{what} should be (d, d) = {(d, d)}: it sits between two rows of the table; got "
                        f"{tuple(W.shape)}")
        W = W.detach().double()
        if not torch.isfinite(W).all():
            raise Wrong(f"{what} holds NaN or inf")
        scores = table @ W @ table.T
        residual = ((scores - target) ** 2).sum().item()
        best = _ch06_best_residual(table, target)
        size = target.sum().item()                                   # ||B||^2: the residual of W = 0
        if residual <= best + 1e-6 * size:
            continue
        exact = "exactly (it has fewer rows than columns)" if n <= d else "as well as least squares can"
        if torch.allclose(W, table.T @ target @ table, rtol=1e-6, atol=1e-9):
            raise Wrong(f"{what}: you put the table where its (pseudo-)inverse belongs. Multiplying by the "
                        "table does not undo multiplying by it: the rows are not orthonormal")
        for name, sign in (("M_(-back)", -1), ("M_back", 1)):
            M = _ch06_rotation_blocks(sign * back, d)
            c = (W * M).sum() / (M * M).sum()
            if c.abs() > 1e-9 and torch.allclose(W, c * M, rtol=1e-6, atol=1e-9):
                raise Wrong(f"{what}: that is section 3's {name}, up to a factor. It moves the rows of the "
                            "sinusoidal table; the rows of this learned table are not related by any "
                            "rotation, so it scores them at random. Fit W to this table")
        ahead = ((scores - _ch06_back_pattern(n, -back)) ** 2).sum().item()
        if ahead <= _ch06_best_residual(table, _ch06_back_pattern(n, -back)) + 1e-6 * size:
            raise Wrong(f"{what}: your scores pick the key {back} positions *ahead* (s = t + {back}), "
                        f"not {back} back (s = t - {back}): the pattern is transposed")
        for other in (back - 1, back + 1):
            pattern = _ch06_back_pattern(n, other)
            if ((scores - pattern) ** 2).sum().item() <= _ch06_best_residual(table, pattern) + 1e-6 * size:
                raise Wrong(f"{what}: your scores pick the key {other} back, not {back} back: an off-by-one "
                            "in the target pattern")
        fitted = table @ torch.linalg.pinv(table) @ target @ (table @ torch.linalg.pinv(table))
        scale = ((scores * fitted).sum() / (fitted * fitted).sum()).item()
        if abs(scale) > 1e-6 and abs(scale - 1) > 1e-3 and \
                torch.allclose(scores, scale * fitted, rtol=1e-5, atol=1e-8):
            raise Wrong(f"{what}: the right pattern at {scale:.3g} times the right size: the score should "
                        f"be 1 at the key {back} back, not a multiple of 1")
        if residual >= size * (1 - 1e-9):
            raise Wrong(f"{what}: the squared error of the scores, {residual:.3g}, is no better than W = 0 "
                        f"({size:.3g}); the best W reaches {best:.3g}")
        raise Wrong(f"{what}: the scores of the table's rows under your W miss the pattern (1 at the key "
                    f"{back} back, 0 elsewhere) by a squared error of {residual:.4g}; the best W fits it "
                    f"{exact}, with {best:.3g}")


@checker("06.copy_bias", hint="ALiBi's bias (section 5) is largest on the diagonal and falls with the "
         "distance on both sides; this task needs one that is largest at the offset s - t of the key b "
         "positions back and low everywhere else, by a margin that content scores of size 4 cannot "
         "overturn. Build it from the matrix of offsets s - t, as alibi_bias does, and make sure every row "
         "still has a finite entry")
def _check_copy_bias(copy_bias: Callable[[int, int], torch.Tensor]) -> None:
    for length, back in [(12, 3), (40, 3), (64, 5), (9, 1), (1024, 7)]:
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
            if length >= 1000:
                others = bias[t_bad].clone()
                others[t_bad - back] = -math.inf
                margin = (bias[t_bad, t_bad - back] - others.max()).item()
                raise Wrong(f"with L = {length} keys, query {t_bad} puts only {share} of its weight on "
                            f"the key {back} back (at least 90% needed), although shorter sequences passed. "
                            "The margin a softmax over L keys needs grows like ln L (L - 1 keys share what "
                            f"the right one does not get): your bias's margin is {margin:.3g}, fixed, and "
                            f"L = {length} needs about {8 + math.log(9 * (length - 1)):.3g}")
            raise Wrong(f"with content scores in [-4, 4] working against it, query {t_bad} puts only {share} "
                        f"of its weight on the key {back} back (at least 90% needed): the bonus of that "
                        "offset over the others is too small")


def _ch06_black_box(d: int, pairs: list[tuple[int, int]], omega: list[float]
                    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A rotary function, seen from outside: feature ``a`` of pair ``(a, b)`` turns with feature ``b``
    by ``p * omega`` at position ``p``; features in no pair are left alone."""

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or x.shape[-1] != d:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"rotate: x must be a floating (..., L, {d}) tensor, got {got}")
        integer = isinstance(positions, torch.Tensor) and not positions.is_floating_point() \
            and positions.dtype != torch.bool
        if not integer or tuple(positions.shape) != (x.shape[-2],):
            got = (f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, torch.Tensor)
                   else type(positions).__name__)
            raise ValueError(f"rotate: positions must be an integer ({x.shape[-2]},) tensor, got {got}")
        angles = positions.double()[:, None] * torch.tensor(omega, dtype=torch.float64)[None, :]  # (L, n)
        cos, sin = torch.cos(angles), torch.sin(angles)
        a, b = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
        xd, out = x.double(), x.double().clone()
        out[..., a] = xd[..., a] * cos - xd[..., b] * sin
        out[..., b] = xd[..., a] * sin + xd[..., b] * cos
        return out.to(x.dtype)

    return rotate


def _ch06_probe_cases() -> list[tuple[str, int, list[tuple[int, int]], list[float]]]:
    """(description, d, pairs, frequencies): the layouts and bases the checker hides in its black boxes."""
    def geometric(n: int, width: int, base: float) -> list[float]:
        return [base ** (-2 * i / width) for i in range(n)]
    cases = [("the package's layout, base 10,000", 8, [(i, i + 4) for i in range(4)], geometric(4, 8, 1e4)),
             ("the paper's layout, base 10,000", 16, [(2 * i, 2 * i + 1) for i in range(8)],
              geometric(8, 16, 1e4)),
             ("the paper's layout, base 500,000 (Llama 3)", 32, [(2 * i, 2 * i + 1) for i in range(16)],
              geometric(16, 32, 5e5)),
             ("partial rotary: features 0-7 rotated in the package's layout, 8-15 left alone", 16,
              [(i, i + 4) for i in range(4)], geometric(4, 8, 1e4)),
             ("position interpolation (Chen et al. 2023): base 10,000 with every frequency divided by 4", 16,
              [(2 * i, 2 * i + 1) for i in range(8)], [w / 4 for w in geometric(8, 16, 1e4)]),
             ("Llama 3.1's rope scaling: base 500,000, the slow frequencies divided by 8 and a smooth ramp "
              "between", 32, [(i, i + 16) for i in range(16)], _ch06_llama31(geometric(16, 32, 5e5)))]
    return cases


def _ch06_llama31(omega: list[float], factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                  context: float = 8192.0) -> list[float]:
    """Llama 3.1's rescaled rotary frequencies: wavelengths shorter than ``context / high`` kept, longer
    than ``context / low`` divided by ``factor``, linear in ``context / wavelength`` between."""
    out = []
    for w in omega:
        wavelength = 2 * math.pi / w
        if wavelength < context / high:
            out.append(w)
        elif wavelength > context / low:
            out.append(w / factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            out.append((1 - smooth) * w / factor + smooth * w)
    return out


def _ch06_geometric_from_one(omega: torch.Tensor) -> float | None:
    """The log-step of ``omega`` (one frequency per pair, in pair order) when it is the geometric law
    ``base^(-2i/d)`` (first frequency 1, constant ratio); ``None`` otherwise."""
    if len(omega) < 3 or not bool((omega > 0).all()) or abs(omega[0].item() - 1) > 1e-3:
        return None
    steps = omega[1:].log() - omega[:-1].log()
    if not torch.allclose(steps, steps[0].expand_as(steps), rtol=1e-3, atol=1e-9):
        return None
    return steps[0].item()


def _ch06_truth(d: int, pairs: list[tuple[int, int]],
                omega: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    partner, freq = torch.arange(d), torch.zeros(d, dtype=torch.float64)
    for (a, b), w in zip(pairs, omega, strict=True):
        partner[a], partner[b] = b, a
        freq[a] = freq[b] = w
    return partner, freq


@checker("06.rotary_probe", hint="section 5 read the package's R_p off the module by rotating the basis "
         "vectors. Do the same with the black box, at a position where no pair can turn by more than half "
         "a turn, and read two things per feature: which other feature its unit vector moves into, and by "
         "what angle. For a tiny angle the cosine part is 1 to machine precision; the sine part is not")
def _check_rotary_probe(probe_rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for description, d, pairs, omega in _ch06_probe_cases():
        partner_true, omega_true = _ch06_truth(d, pairs, omega)
        got = probe_rotary(_ch06_black_box(d, pairs, omega), d)
        where = f"for {description} (d = {d})"
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (partner, omega)")
        partner, freq = got
        if not isinstance(partner, torch.Tensor) or partner.is_floating_point() \
                or tuple(partner.shape) != (d,):
            desc = (f"{partner.dtype} {tuple(partner.shape)}" if isinstance(partner, torch.Tensor)
                    else type(partner).__name__)
            raise Wrong(f"partner should be an integer tensor of shape ({d},), got {desc}")
        if not isinstance(freq, torch.Tensor) or not freq.is_floating_point() or tuple(freq.shape) != (d,):
            desc = (f"{freq.dtype} {tuple(freq.shape)}" if isinstance(freq, torch.Tensor)
                    else type(freq).__name__)
            raise Wrong(f"omega should be a floating tensor of shape ({d},), got {desc}")
        partner, freq = partner.long().cpu(), freq.detach().double().cpu()
        rotated = partner_true != torch.arange(d)
        if torch.equal(partner, torch.arange(d)) and not bool(freq.abs().gt(0).any()):
            raise Wrong(f"{where}: you found no feature that turns. At position 0 nothing turns: probe at a "
                        "position other than 0")
        if not torch.equal(partner, partner_true):
            j = int((partner != partner_true).nonzero()[0])
            halves = (torch.arange(d) + d // 2) % d
            if bool((partner[rotated] == torch.arange(d)[rotated]).any()):
                j = int((rotated & (partner == torch.arange(d))).nonzero()[0])
                raise Wrong(f"{where}: partner[{j}] = {j}, but feature {j} turns (with feature "
                            f"{int(partner_true[j])}). A slow pair's unit vector stays nearly where it was: "
                            "its largest entry is its own; look for the largest entry elsewhere")
            if torch.equal(partner, halves):
                raise Wrong(f"{where}: you assumed that feature i turns with feature i + d/2, the package's "
                            "layout; this black box pairs its features otherwise. Measure the pairing")
            if bool((partner[~rotated] != torch.arange(d)[~rotated]).any()):
                j = int((~rotated & (partner != torch.arange(d))).nonzero()[0])
                raise Wrong(f"{where}: feature {j} is not rotated at all (its unit vector comes back "
                            f"unchanged), so partner[{j}] should be {j}, not {int(partner[j])}")
            raise Wrong(f"{where}: feature {j} turns with feature {int(partner_true[j])}, not "
                        f"{int(partner[j])}")
        if not torch.isfinite(freq).all():
            raise Wrong(f"{where}: omega holds NaN or inf")
        if torch.equal(freq, torch.zeros(d, dtype=torch.float64)):
            raise Wrong(f"{where}: every frequency is 0. At position 0 nothing turns: probe at a position "
                        "other than 0")
        if not torch.allclose(freq, freq[partner]):
            raise Wrong(f"{where}: the two features of a pair turn together: omega[j] must equal "
                        "omega[partner[j]]")
        close = torch.isclose(freq, omega_true, rtol=1e-3, atol=1e-12)
        if bool(close.all()):
            continue
        bad = ~close
        ratio = (freq[bad & rotated] / omega_true[bad & rotated])
        if len(ratio) and torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-3) and \
                abs(ratio[0].item() - round(ratio[0].item())) < 1e-3 and round(ratio[0].item()) > 1:
            raise Wrong(f"{where}: your frequencies are {round(ratio[0].item())} times too large: an angle "
                        "measured at position p is p times the frequency")
        base_10k = torch.zeros(d, dtype=torch.float64)
        for i, (a, b) in enumerate(pairs):
            base_10k[a] = base_10k[b] = 1e4 ** (-2 * i / (2 * len(pairs)))
        if torch.allclose(freq, base_10k, rtol=1e-3, atol=1e-12):
            raise Wrong(f"{where}: these are the frequencies of base 10,000, but this black box uses another "
                        "base: measure the frequencies rather than assume them")
        firsts = [a for a, _ in pairs]
        step = _ch06_geometric_from_one(freq[firsts])
        if step is not None and _ch06_geometric_from_one(omega_true[firsts]) is None:
            raise Wrong(f"{where}: your frequencies follow the law base^(-2i/d) for a base of "
                        f"{math.exp(-step * len(firsts)):.4g}: you inferred them from a formula. This black "
                        "box rescales its frequencies, as long-context models do: measure every pair")
        if bool((bad & rotated & (omega_true < 5e-3)).any()) and not bool((bad & (omega_true > 5e-2)).any()):
            j = int((bad & rotated).nonzero()[0])
            raise Wrong(f"{where}: the slow pairs are wrong (feature {j}: omega {freq[j].item():.3g}, "
                        f"should be {omega_true[j].item():.3g}) while the fast ones are right: a tiny angle "
                        "read from its cosine is lost to rounding (the cosine is 1 to machine precision); "
                        "read it from the sine part (and probe in float64: in float16 or bfloat16 a tiny "
                        "sine is itself rounded)")
        slowest = rotated & (omega_true == omega_true[rotated].min())
        if bool((bad & (omega_true > 0.3)).any()) and not bool((bad & slowest).any()):
            j = int((bad & (omega_true > 0.3)).nonzero()[0])
            for p in range(2, 65):
                turn = p * omega_true[rotated]
                folded = torch.atan2(turn.sin().abs(), turn.cos()) / p      # what both parts give at p
                arcsin = turn.sin().abs().asin() / p                        # what the sine alone gives
                if torch.allclose(freq[rotated], arcsin, rtol=1e-3, atol=1e-12) and \
                        not torch.allclose(freq[rotated], folded, rtol=1e-3, atol=1e-12):
                    raise Wrong(f"{where}: the fast pairs are wrong (feature {j}: omega "
                                f"{freq[j].item():.3g}, should be {omega_true[j].item():.3g}) while the slow "
                                f"ones are right: at position {p} the fast pairs turned by more than a "
                                "quarter turn, and arcsin of the sine alone cannot tell an angle from its "
                                "supplement. Use both parts, the sine and the cosine")
            raise Wrong(f"{where}: the fast pairs are wrong (feature {j}: omega {freq[j].item():.3g}, "
                        f"should be {omega_true[j].item():.3g}) while the slow ones are right: at the "
                        "position you probed, the fast pairs turned by more than half a turn, and an angle "
                        "is only known up to whole turns")
        j = int(bad.nonzero()[0])
        raise Wrong(f"{where}: omega[{j}] = {freq[j].item():.4g}, but feature {j} turns by "
                    f"{omega_true[j].item():.4g} radians per position")

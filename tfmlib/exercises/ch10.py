"""Checkers for chapter 10 (scaling up: fused attention, mixed precision, compile, data parallel, profiling).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("10.name", answer)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tfmlib.profiling import count_host_reads

from .core import Wrong, checker, expect_close

# ----------------------------------------------------------------------------- 10.merge_softmax_states


Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _softmax_state(scores: torch.Tensor, values: torch.Tensor) -> Triple:
    """(m, l, o) of attention over one block of keys: the row max, the sum of exp(s - m), and the
    block's own (normalised) attention output. A row whose scores are all -inf: m = -inf, l = 0, o = 0."""
    m = scores.amax(-1)                                             # (..., T)
    safe_m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - safe_m[..., None])                       # -inf scores give 0
    total = e.sum(-1)
    o = (e @ values) / total.clamp_min(torch.finfo(total.dtype).tiny)[..., None]
    return m, total, o


def _as_triple(out: Any) -> Triple:
    if not isinstance(out, tuple) or len(out) != 3 or not all(isinstance(t, torch.Tensor) for t in out):
        raise Wrong("return a tuple of three tensors (m, l, o): the merged running max, running sum and "
                    "output")
    return out


def _as_same_dtype(out: Any, dtype: torch.dtype) -> Triple:
    """The answer's triple, checked to be in the states' dtype before anything compares it."""
    triple = _as_triple(out)
    if any(t.dtype != dtype for t in triple):
        raise Wrong(f"return m, l and o in the states' dtype ({dtype}), got "
                    f"{', '.join(str(t.dtype) for t in triple)}: compute in the dtype you were given")
    return triple


def _rescaled(state: Triple, to: torch.Tensor) -> torch.Tensor:
    """A side's sum l moved to the max ``to``: l e^(m_k - to) (0 for a side with no key)."""
    return torch.where(state[1] > 0, state[1] * torch.exp(state[0] - to), torch.zeros_like(state[1]))


def _diagnose_merged_sum(where: str, state1: Triple, state2: Triple, total: torch.Tensor,
                         m: torch.Tensor) -> None:
    """Name the usual slips in the merged sum l (finite states only)."""
    if torch.allclose(total, state1[1] + state2[1]):
        raise Wrong(f"{where}: your l is l1 + l2, but l1 and l2 are sums relative to different maxes: "
                    "rescale each to the merged max before adding")
    one_side = [_rescaled(state1, m) + state2[1], state1[1] + _rescaled(state2, m)]
    if any(torch.allclose(total, w) for w in one_side):
        raise Wrong(f"{where}: only one side of l was rescaled to the merged max: both sides were summed "
                    "relative to their own max, so both need the factor")
    inverse = state1[1] * torch.exp(m - state1[0]) + state2[1] * torch.exp(m - state2[0])
    if torch.allclose(total, inverse):
        raise Wrong(f"{where}: your factor is upside down: the factor that moves a sum to a larger max is "
                    "e^(m_k - m), at most 1, not its inverse")
    smaller = torch.minimum(state1[0], state2[0])
    if torch.allclose(total, _rescaled(state1, smaller) + _rescaled(state2, smaller)):
        raise Wrong(f"{where}: you rescaled both sums to the smaller of the two maxes: rescale to the larger "
                    "one (the merged m), so that every factor is at most 1; a factor above 1 can overflow")


def _diagnose_merged_output(where: str, state1: Triple, state2: Triple, o: torch.Tensor, m: torch.Tensor,
                            total: torch.Tensor, o_want: torch.Tensor) -> None:
    """Name the usual slips in the merged output o (finite states only)."""
    o1, o2 = state1[2], state2[2]
    if torch.allclose(o, (o1 + o2) / 2):
        raise Wrong(f"{where}: you averaged the two outputs; each side must count in proportion to its share "
                    "of the softmax mass (its rescaled l over the merged l)")
    unscaled = (state1[1][..., None] * o1 + state2[1][..., None] * o2) / (state1[1] + state2[1])[..., None]
    if torch.allclose(o, unscaled):
        raise Wrong(f"{where}: your output weights the sides by l1 and l2 as they are; they are relative to "
                    "different maxes, so rescale them first")
    if torch.allclose(o, o_want * total[..., None]):
        raise Wrong(f"{where}: your o is not normalised: the states hold normalised outputs (each side's own "
                    "attention output), so divide by the merged l")
    e1, e2 = torch.exp(state1[0] - m), torch.exp(state2[0] - m)
    if torch.allclose(o, (e1[..., None] * o1 + e2[..., None] * o2) / (e1 + e2)[..., None]):
        raise Wrong(f"{where}: your output weights the sides by the factors e^(m_k - m) alone: each side "
                    "counts by its rescaled mass l_k e^(m_k - m), not by the factor alone")
    a1, a2 = _rescaled(state1, m), _rescaled(state2, m)
    if torch.allclose(o, (a2[..., None] * o1 + a1[..., None] * o2) / total[..., None]):
        raise Wrong(f"{where}: the weights are swapped: side 1's output goes with side 1's mass, "
                    "l1 e^(m1 - m), and side 2's with side 2's")


@checker("10.merge_softmax_states", hint="section 2: each side's sum l and output were computed relative to "
         "its own max, so they cannot simply be added; the online softmax's update shows how a sum moves "
         "to a larger max, and the output of both blocks is a weighted mean of the two sides' outputs "
         "(ask what each side's weight must be); try a block whose keys are all masked for a row, and a row "
         "that no key of either block may see: section 2's helpers say what such a row must give")
def _check_merge_softmax_states(merge: Callable[..., Triple]) -> None:
    g = torch.Generator().manual_seed(10)
    cases = [(1, 3, 4, 5, 2, 1.0), (2, 5, 7, 3, 4, 4.0), (3, 4, 6, 6, 3, 12.0), (1, 2, 1, 1, 5, 30.0)]
    for batch, T, S1, S2, d_v, spread in cases:
        s = torch.randn(batch, T, S1 + S2, generator=g, dtype=torch.double) * spread
        s[:, 0::2, :S1] += 2.0 * spread     # even rows: the first block holds the max, odd rows: the second
        s[:, 1::2, S1:] += 2.0 * spread
        v = torch.randn(batch, S1 + S2, d_v, generator=g, dtype=torch.double)
        state1 = _softmax_state(s[..., :S1], v[:, :S1])
        state2 = _softmax_state(s[..., S1:], v[:, S1:])
        m_want, l_want, o_want = _softmax_state(s, v)
        where = f"(batch={batch}, T={T}, blocks of {S1} and {S2} keys, scores spread {spread})"
        m, total, o = _as_same_dtype(merge(*state1, *state2), s.dtype)
        expect_close(m, m_want, f"the merged max m {where}", atol=1e-9)
        if total.shape == l_want.shape and not torch.allclose(total, l_want):
            _diagnose_merged_sum(where, state1, state2, total, m_want)
        expect_close(total, l_want, f"the merged sum l {where}", atol=1e-9, rtol=1e-9)
        if o.shape == o_want.shape and not torch.allclose(o, o_want):
            _diagnose_merged_output(where, state1, state2, o, m_want, l_want, o_want)
        expect_close(o, o_want, f"the merged output o {where}", atol=1e-9, rtol=1e-7)
        # merging is associative: three blocks, merged one after the other, give attention over all keys
        if S1 > 1:
            cut = S1 // 2
            first = merge(*_softmax_state(s[..., :cut], v[:, :cut]),
                          *_softmax_state(s[..., cut:S1], v[:, cut:S1]))
            _, _, o3 = _as_same_dtype(merge(*_as_same_dtype(first, s.dtype), *state2), s.dtype)
            expect_close(o3, o_want, f"the output of three blocks merged one after the other {where}",
                         atol=1e-9, rtol=1e-7)
    # a block whose keys are all masked for some rows (m = -inf, l = 0, o = 0) must change nothing
    s = torch.randn(2, 3, 6, generator=g, dtype=torch.double)
    v = torch.randn(2, 6, 4, generator=g, dtype=torch.double)
    s[0, 1, 3:] = -math.inf
    state1, state2 = _softmax_state(s[..., :3], v[:, :3]), _softmax_state(s[..., 3:], v[:, 3:])
    m, total, o = _as_same_dtype(merge(*state1, *state2), s.dtype)
    if not bool(torch.isfinite(o).all()):
        raise Wrong("a block whose keys are all masked for a row (m = -inf, l = 0, o = 0) gave NaN or inf: "
                    "e to the power of -inf minus a finite max is 0, so that side must simply drop out")
    expect_close(o, _softmax_state(s, v)[2], "the merged output when one block is fully masked for a row",
                 atol=1e-9)
    # a row masked in BOTH blocks (a padded query, a query whose document lies in other blocks) is the
    # state of no key at all: m = -inf, l = 0, o = 0, as the chapter's online_softmax and tiled_attention give
    s[1, 2, :] = -math.inf
    state1, state2 = _softmax_state(s[..., :3], v[:, :3]), _softmax_state(s[..., 3:], v[:, 3:])
    m_want, l_want, o_want = _softmax_state(s, v)
    m, total, o = _as_same_dtype(merge(*state1, *state2), s.dtype)
    if not (isinstance(m, torch.Tensor) and isinstance(total, torch.Tensor) and isinstance(o, torch.Tensor)) \
            or m.shape != m_want.shape or total.shape != l_want.shape or o.shape != o_want.shape:
        raise Wrong("with a row masked in both blocks, m, l and o must keep their shapes")
    if not bool(torch.isfinite(o).all()) or bool(torch.isnan(total).any()) or bool(torch.isnan(m).any()):
        raise Wrong("a row that no key of either block may see (m1 = m2 = -inf, l1 = l2 = 0) gave NaN: "
                    "-inf - (-inf) is NaN, and so is 0 / 0; such a row must come out as the state of no "
                    "key at all, m = -inf, l = 0, o = 0 (shift by a finite number where the merged max is "
                    "-inf, and divide only where l > 0), as the chapter's online softmax and tiled attention "
                    "do")
    if bool((total[1, 2] != 0).any()) or bool((o[1, 2] != 0).any()) or bool(m[1, 2] != -math.inf):
        raise Wrong(f"a row masked in both blocks gave m = {m[1, 2].item()}, l = {total[1, 2].item()}, "
                    f"o = {o[1, 2].tolist()}: it is the state of no key at all, m = -inf, l = 0, o = 0")
    expect_close(m, m_want, "the merged max when a row is masked in both blocks", atol=1e-9)
    expect_close(total, l_want, "the merged sum when a row is masked in both blocks", atol=1e-9)
    expect_close(o, o_want, "the merged output when a row is masked in both blocks", atol=1e-9)
    # float32 with scores around 100, as logits can be: e^100 overflows float32 (its largest number is
    # about e^88.7), which is why the state carries m and every factor is e^(m_k - m) <= 1
    s = torch.randn(2, 4, 16, generator=g) * 3 + 100
    s[:, 1::2, 8:] += 5.0
    v = torch.randn(2, 16, 8, generator=g)
    state1, state2 = _softmax_state(s[..., :8], v[:, :8]), _softmax_state(s[..., 8:], v[:, 8:])
    m_want, l_want, o_want = _softmax_state(s.double(), v.double())
    m, total, o = _as_same_dtype(merge(*state1, *state2), torch.float32)
    where = "in float32 with scores around 100"
    if not all(bool(torch.isfinite(t).all()) for t in (m, total, o)):
        raise Wrong(f"{where}, your merge gave NaN or inf: e to the power of a raw max overflows float32 "
                    "(e^89 is already past its largest number); never exponentiate a max itself: rescale "
                    "each side by e^(m_k - m), which is at most 1")
    expect_close(m, m_want, f"the merged max m {where}", atol=1e-4, rtol=1e-5)
    expect_close(total, l_want, f"the merged sum l {where}", atol=1e-5, rtol=1e-4)
    expect_close(o, o_want, f"the merged output o {where}", atol=1e-5, rtol=1e-4)




# ----------------------------------------------------------------------------- 10.document_tiles


def _tiles_of(need: torch.Tensor, block_q: int, block_k: int) -> torch.Tensor:
    """A (T, S) bool matrix of the (query, key) pairs to compute -> the (ceil(T / block_q),
    ceil(S / block_k)) map of the tiles holding at least one of them."""
    T, S = need.shape
    nq, nk = -(-T // block_q), -(-S // block_k)
    padded = torch.zeros(nq * block_q, nk * block_k, dtype=torch.bool)
    padded[:T, :S] = need
    return padded.reshape(nq, block_q, nk, block_k).any(3).any(1)


def _document_tile_variants(doc: torch.Tensor, block_q: int, block_k: int) -> dict[str, torch.Tensor]:
    """The right map ("right") and the maps of the typical mistakes, for one packed sequence."""
    T = doc.numel()
    same = doc[:, None] == doc[None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    nq, nk = -(-T // block_q), -(-T // block_k)
    i0 = torch.arange(nq)[:, None] * block_q
    j0 = torch.arange(nk)[None, :] * block_k
    i_last = (i0 + block_q).clamp_max(T) - 1
    j_last = (j0 + block_k).clamp_max(T) - 1
    overlap = (doc[i0] <= doc[j_last]) & (doc[j0] <= doc[i_last])     # the tiles' document ranges meet
    whole = torch.zeros(nq, nk, dtype=torch.bool)                     # every pair of the tile attends
    for a in range(nq):
        for b in range(nk):
            tile = (same & causal)[a * block_q:(a + 1) * block_q, b * block_k:(b + 1) * block_k]
            whole[a, b] = bool(tile.all())
    return {
        "right": _tiles_of(same & causal, block_q, block_k),
        "causal only": _tiles_of(causal, block_q, block_k),
        "documents only": _tiles_of(same, block_q, block_k),
        "first corner": (doc[i0] == doc[j0]) & (j0 <= i_last),
        "causal from the first query": overlap & (j0 <= i0),
        "causal one past the last query": overlap & (j0 <= i_last + 1),
        "whole tile": whole,
    }


_DOCUMENT_TILE_DIAGNOSES = {
    "causal only": "you kept every tile on or below the diagonal: the tiles in which no query shares a "
                   "document with any key are all masked, so they can be skipped",
    "documents only": "you kept tiles above the diagonal: a query may not see a later key even in its own "
                      "document",
    "first corner": "you compared the documents of the tile's first query and first key only: a tile is "
                    "needed when ANY of its queries shares a document with one of its keys at or before it",
    "causal from the first query": "you skipped tiles that cross the diagonal (their first key comes after "
                                   "their first query, but not after their last): some of their pairs attend",
    "causal one past the last query": "off by one: you kept a tile whose first key comes right after the "
                                      "block's last query; every pair of it lies above the diagonal",
    "whole tile": "you kept only the tiles in which every pair attends: a tile that mixes documents, or "
                  "crosses the diagonal, still holds pairs that attend (masked inside the tile, as the "
                  "chapter's tile keep-mask does)",
}


def _packed(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])


@checker("10.document_tiles", hint="section 2's tiled loops: a tile of queries and keys is computed when "
         "at least one of its (query, key) pairs may attend; with documents packed in one sequence a pair "
         "attends when the key is not after the query and both belong to the same document; since the "
         "documents are contiguous, the ranges of document ids of the tile's queries and of its keys tell "
         "you; mind the last, shorter block")
def _check_document_tiles(tiles_fn: Callable[..., Any]) -> None:
    cases = [([10, 6, 12, 4], 4, 4), ([10, 6, 12, 4], 8, 4), ([5, 5, 5, 5, 5, 5, 2], 6, 4),
             ([1, 1, 1, 1, 1, 1, 1, 1, 1], 2, 3), ([24], 8, 8), ([3, 17, 2, 9, 1, 30], 8, 16),
             ([7, 7, 7, 7], 7, 7), ([2, 40, 3, 3, 20], 16, 8)]
    for lengths, block_q, block_k in cases:
        doc = _packed(lengths)
        T = doc.numel()
        variants = _document_tile_variants(doc, block_q, block_k)
        want = variants["right"]
        where = f"documents of lengths {lengths} (T={T}), block_q={block_q}, block_k={block_k}"
        got = tiles_fn(doc.clone(), block_q, block_k)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"{where}: return a bool tensor of shape {tuple(want.shape)} (query blocks x key "
                        f"blocks), got {type(got).__name__}")
        if got.shape != want.shape:
            if got.shape == want.shape[::-1] and want.shape[0] != want.shape[1]:
                raise Wrong(f"{where}: your map has shape {tuple(got.shape)}: its rows must be the query "
                            f"blocks and its columns the key blocks, {tuple(want.shape)}")
            floor = (T // block_q, T // block_k)
            if tuple(got.shape) == floor:
                raise Wrong(f"{where}: your map has shape {tuple(got.shape)}, expected {tuple(want.shape)}: "
                            "the last, shorter block of queries or keys is a block too")
            raise Wrong(f"{where}: your map has shape {tuple(got.shape)}, expected {tuple(want.shape)} "
                        "(one row per block of block_q queries, one column per block of block_k keys)")
        got = got.bool()
        if torch.equal(got, want):
            continue
        for name, why in _DOCUMENT_TILE_DIAGNOSES.items():
            if torch.equal(got, variants[name]):
                raise Wrong(f"{where}: {why}")
        if torch.equal(got, want.T):
            raise Wrong(f"{where}: your map is transposed: its rows must be the query blocks and its columns "
                        "the key blocks")
        missing = (want & ~got).nonzero().tolist()
        extra = (got & ~want).nonzero().tolist()
        a, b = (missing or extra)[0]
        tile = f"the tile of queries {a * block_q}..{min((a + 1) * block_q, T) - 1} and keys " \
               f"{b * block_k}..{min((b + 1) * block_k, T) - 1}"
        if missing:
            raise Wrong(f"{where}: you skip {tile}, but some of its queries may see some of its keys (same "
                        "document, key not after the query): skipping it changes the attention")
        raise Wrong(f"{where}: you compute {tile}, in which no pair may attend: it can be skipped")


# ----------------------------------------------------------------------------- 10.compensated_sum


Pair = tuple[torch.Tensor, torch.Tensor]


def _fold(add: Callable[..., Any], values: torch.Tensor) -> Pair:
    state: Any = tuple(torch.zeros(values.shape[1], dtype=torch.half) for _ in range(2))
    for x in values:
        with _Float16Only() as mode:
            state = add(state[0], state[1], x.clone())
        if mode.wider:
            wider = ", ".join(sorted(str(d) for d in mode.wider))
            raise Wrong(f"your step computes in {wider}: the exercise "
                        "is float16 arithmetic, every operation rounded to float16 (a wider type inside the "
                        "step is what keeps the small terms then, not the compensation)")
        if not isinstance(state, tuple) or len(state) != 2 or \
                not all(isinstance(t, torch.Tensor) for t in state):
            raise Wrong("return a pair of tensors (total, compensation) from every call")
        if any(t.dtype != torch.float16 for t in state):
            raise Wrong(f"your state holds {state[0].dtype} and {state[1].dtype}: the exercise keeps every "
                        "accumulator in float16 (what an fp16 gradient buffer has); a wider type solves "
                        "another problem")
        if any(t.shape != values.shape[1:] for t in state):
            raise Wrong(f"the total and the compensation must keep the shape {tuple(values.shape[1:])} of "
                        f"one value, got {tuple(state[0].shape)} and {tuple(state[1].shape)}")
    return state


def _plain(total: torch.Tensor, comp: torch.Tensor, x: torch.Tensor) -> Pair:
    return total + x, comp


def _kahan(total: torch.Tensor, comp: torch.Tensor, x: torch.Tensor) -> Pair:
    y = x - comp
    t = total + y
    return t, (t - total) - y


def _kahan_unused(total: torch.Tensor, comp: torch.Tensor, x: torch.Tensor) -> Pair:
    t = total + x
    return t, (t - total) - x


def _kahan_added(total: torch.Tensor, comp: torch.Tensor, x: torch.Tensor) -> Pair:
    y = x + comp
    t = total + y
    return t, (t - total) - y


def _kahan_reversed(total: torch.Tensor, comp: torch.Tensor, x: torch.Tensor) -> Pair:
    y = x - comp
    t = total + y
    return t, y - (t - total)


def _sum_cases() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(16)
    one_then_small = torch.full((1200, 4), 1e-4)
    one_then_small[0] = 1.0
    return [
        ("1.0 followed by 1199 values of 1e-4", one_then_small.half()),
        ("800 gradient-like values (mean 2e-4, spread 1e-3)",
         (torch.randn(800, 8, generator=g) * 1e-3 + 2e-4).half()),
        ("1000 uniform values in [0, 0.01)", (torch.rand(1000, 8, generator=g) * 0.01).half()),
        ("400 values of scales 1e-4 to 1 with both signs",
         (torch.randn(400, 8, generator=g) * torch.logspace(-4, 0, 8)).half()),
        ("300 values of 0.1 (not exact in binary)", torch.full((300, 3), 0.1).half()),
    ]


def _ulps(got: torch.Tensor, values: torch.Tensor) -> float:
    """The largest error of ``got`` against the exact sum of ``values`` (n, D), in units of
    eps * sum|x_i| (float16's epsilon times the sum of the magnitudes): the bound of a compensated sum
    (Higham 2002, section 4.3). Where nothing cancels this is eps * |sum|, about one float16 rounding of
    the total; where values cancel, no float16 algorithm that rounds each step can promise better."""
    eps = torch.finfo(torch.float16).eps
    exact = values.double().sum(0)
    return float(((got.double() - exact).abs() / (eps * values.double().abs().sum(0).clamp_min(1e-4))).max())


class _Float16Only(torch.overrides.TorchFunctionMode):
    """Records the wider floating dtypes that any torch call inside it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.wider: set[torch.dtype] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float64):
                self.wider.add(t.dtype)
        return out


@checker("10.compensated_sum", hint="section 3 keeps the weights in float32 so that small updates "
         "added to them are not lost; in float16 they would be rounded away; look up compensated summation "
         "(Higham, Accuracy and Stability of Numerical Algorithms, 2002, section 4.3); ask what an addition "
         "of a small number to a large one loses, and how you could compute that loss in float16 itself")
def _check_compensated_sum(add: Callable[..., Any]) -> None:
    cases = _sum_cases()
    states = [_fold(add, values) for _, values in cases]
    errors = [_ulps(state[0], values) for state, (_, values) in zip(states, cases, strict=True)]
    if max(errors) > 1.5:
        k = max(range(len(cases)), key=errors.__getitem__)
        where = f"{cases[k][0]}: your total is {errors[k]:.1f} units of eps * sum|x| (float16's epsilon " \
                "times the sum of the magnitudes) away from the exact sum"

        def same(variant: Callable[..., Pair]) -> bool:
            """The answer's states are the variant's on every case."""
            return all(torch.equal(state[0], want[0]) and torch.equal(state[1], want[1])
                       for state, want in zip(states, (_fold(variant, v) for _, v in cases), strict=True))

        apart = max(_ulps(state[0].double() + state[1].double(), values)
                    for state, (_, values) in zip(states, cases, strict=True))
        if apart < max(errors) / 4:
            raise Wrong(f"{where}: your compensation collects what the additions lost but is kept apart: "
                        f"total + compensation is off by {apart:.1f} units at worst; the total the exercise "
                        "asks for is the compensated one, so fold the compensation into the total the step "
                        "returns (a compensation that only grows is itself a plain float16 sum of the lost "
                        "parts)")
        if same(_kahan_added) or same(_kahan_reversed):
            raise Wrong(f"{where}: the compensation has the wrong sign: it holds what the rounded addition "
                        "added too much, so it is subtracted from the next value (or computed the other way "
                        "round and added, not both)")
        if same(_kahan_unused):
            raise Wrong(f"{where}, the same as the plain float16 running sum: your compensation is "
                        "computed but never used; subtract it from the next value before adding")
        if torch.equal(states[k][0], _fold(_plain, cases[k][1])[0]):
            raise Wrong(f"{where}: that is the plain float16 running sum, whose small values are rounded "
                        "away once the total is large; keep the lost low part in the second number and feed "
                        "it back")
        raise Wrong(where)
    # the state is all there is: two sums carried on side by side, a call for one then a call for the
    # other, must each come out as when carried on alone (a running sum kept elsewhere, in a Python float or
    # a global tensor, mixes them up)
    (_, first), (_, second) = _sum_cases()[:2]
    second = second[:, :first.shape[1]]
    alone = [_fold(add, first)[0], _fold(add, second)[0]]
    states: list[Any] = [tuple(torch.zeros(v.shape[1], dtype=torch.half) for _ in range(2))
                         for v in (first, second)]
    for i in range(max(len(first), len(second))):
        for k, values in enumerate((first, second)):
            if i < len(values):
                states[k] = add(states[k][0], states[k][1], values[i].clone())
    if not all(torch.equal(states[k][0], alone[k]) for k in range(2)):
        raise Wrong("two sums carried on side by side (one call for each in turn) did not give what each "
                    "gives alone: your function keeps something besides (total, compensation), e.g. a "
                    "running sum in a wider type; everything it remembers must be in the two float16 "
                    "tensors it returns")


# ----------------------------------------------------------------------------- 10.skip_nonfinite_step


def _params(g: torch.Generator) -> list[torch.Tensor]:
    ps = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g), torch.randn(2, 2, 2, generator=g),
          torch.randn(4, generator=g)]
    params = [p.requires_grad_() for p in ps]
    for p in params[:3]:
        p.grad = torch.randn(p.shape, generator=g)
    return params                                   # the last parameter has no gradient (unused this step)


@checker("10.skip_nonfinite_step", hint="section 3 on how the gradient scaler skips a step whose "
         "gradients overflowed, and section 10 on host reads: every Python if on a tensor's value waits for "
         "the device; compute one flag for the whole step on the device, and let it choose between the "
         "update and no update, tensor by tensor, without multiplying anything by it (think of what "
         "infinity times zero is); a step is all or nothing")
def _check_skip_nonfinite_step(step: Callable[..., Any]) -> None:
    g = torch.Generator().manual_seed(31)
    lr = 0.1
    cases: list[tuple[str, Callable[[list[torch.Tensor]], None]]] = [
        ("finite gradients", lambda ps: None),
        ("one entry of the second gradient is inf", lambda ps: ps[1].grad.__setitem__(2, math.inf)),
        ("one entry of the first gradient is NaN", lambda ps: ps[0].grad.__setitem__((1, 2), math.nan)),
        ("one entry of the third gradient is -inf", lambda ps: ps[2].grad.__setitem__((0, 1, 1), -math.inf)),
        ("the second gradient is all NaN", lambda ps: ps[1].grad.fill_(math.nan)),
        ("finite gradients again", lambda ps: None),
    ]
    for what, spoil in cases:
        params = _params(g)
        spoil(params)
        before = [p.detach().clone() for p in params]
        grads = [None if p.grad is None else p.grad.clone() for p in params]
        finite = all(gr is None or bool(torch.isfinite(gr).all()) for gr in grads)
        with count_host_reads() as reads:
            applied = step(params, lr)
        if reads.total:
            raise Wrong(f"{what}: your step read values back to the host ({reads}): on a GPU each read waits "
                        "for every queued kernel; decide on the device instead")
        after = [p.detach() for p in params]
        if not isinstance(applied, torch.Tensor) or applied.dim() != 0 or applied.dtype != torch.bool:
            raise Wrong(f"{what}: return a 0-d bool tensor, true when the step was applied (a Python bool "
                        f"would need a host read), got {type(applied).__name__}"
                        + (f" of shape {tuple(applied.shape)} and dtype {applied.dtype}"
                           if isinstance(applied, torch.Tensor) else ""))
        if finite:
            want = [b if gr is None else b - lr * gr for b, gr in zip(before, grads, strict=True)]
            if all(torch.equal(a, b) for a, b in zip(after, before, strict=True)):
                raise Wrong(f"{what}: the parameters did not change; update them in place (p - lr * grad)")
            if any(gr is not None and torch.allclose(a, b + lr * gr)
                   for a, b, gr in zip(after, before, grads, strict=True)):
                raise Wrong(f"{what}: you stepped up the gradient; SGD steps against it")
            if not torch.equal(after[3], before[3]):
                raise Wrong(f"{what}: the last parameter has no gradient (grad is None): leave it as it is")
            for i, (a, w) in enumerate(zip(after, want, strict=True)):
                if not torch.allclose(a, w, atol=1e-6):
                    raise Wrong(f"{what}: parameter {i} is not p - lr * grad (max error "
                                f"{(a - w).abs().max().item():.3g})")
            if not bool(applied):
                raise Wrong(f"{what}: your flag says the step was skipped, but it was applied")
            continue
        changed = [not torch.equal(a, b) for a, b in zip(after, before, strict=True)]
        bad = next(i for i, gr in enumerate(grads)
                   if gr is not None and not bool(torch.isfinite(gr).all()))
        others_changed = any(changed[i] for i, gr in enumerate(grads) if gr is not None and i != bad)
        nan_after = any(bool(torch.isnan(a).any()) for a in after)
        kept = torch.isfinite(grads[bad])
        if others_changed and not changed[bad]:
            raise Wrong(f"{what}: you skipped only the parameter whose gradient is not finite and updated "
                        "the others: the step is all or nothing (GradScaler skips the whole step), or the "
                        "parameters would drift apart")
        if others_changed and torch.equal(after[bad][~kept], before[bad][~kept]):
            raise Wrong(f"{what}: you skipped only the non-finite entries: the whole step must be skipped")
        if not others_changed and nan_after:
            raise Wrong(f"{what}: a parameter became NaN: multiplying the update by a 0/1 flag does not "
                        "remove inf or NaN (inf times 0 is NaN); select between the updated and the old "
                        "value instead")
        if others_changed and nan_after:
            raise Wrong(f"{what}: the step went ahead and a parameter is NaN: NaN is not finite either "
                        "(test for finiteness, which catches inf, -inf and NaN)")
        if others_changed and any(bool(torch.isinf(a).any()) for a in after):
            raise Wrong(f"{what}: the step went ahead and a parameter is infinite: inf and -inf are not "
                        "finite either (test for finiteness, which catches inf, -inf and NaN)")
        if others_changed:
            raise Wrong(f"{what}: the step went ahead with the non-finite values replaced by finite ones: a "
                        "step whose gradients overflowed is skipped, not repaired")
        if any(changed):
            raise Wrong(f"{what}: the parameters changed although the step must be skipped")
        if bool(applied):
            raise Wrong(f"{what}: the parameters were left alone, but your flag says the step was applied")
    # torch.equal, torch.is_nonzero, torch.allclose and the like hand a value to Python from C++ without
    # the Tensor methods that count_host_reads counts; on the meta device tensors have shapes and no
    # values, so every read of a value (and every shape that depends on one, as nonzero's) raises there
    params = [torch.randn(*p.shape, device="meta").requires_grad_() for p in _params(g)]
    for p in params[:3]:
        p.grad = torch.randn(p.shape, device="meta")
    try:
        step(params, lr)
    except Exception as exc:        # noqa: BLE001 - any failure on value-less tensors is the diagnosis
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        if "expected device" in str(exc) or "same device" in str(exc):
            raise Wrong(f"with parameters on another device than the CPU (here 'meta', which holds shapes "
                        f"but no values) your step failed ({text}): create any new tensor on the "
                        "parameters' device") from None
        raise Wrong(f"your step read a value back to the host (or made a shape depend on one): with "
                    f"parameters on the 'meta' device, which holds shapes but no values, it failed ({text}); "
                    "torch.equal, torch.is_nonzero, torch.allclose and an if on a tensor all wait for the "
                    "device to finish and send the value; decide on the device instead") from None

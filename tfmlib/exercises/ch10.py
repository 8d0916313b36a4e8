"""Checkers for chapter 10 (scaling up: fused attention, mixed precision, compile, data parallel).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("10.name", answer)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data.distributed import DistributedSampler

from tfmlib.data import PAD_ID

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


@checker("10.merge_softmax_states", hint="section 2: each side's sum l and output were computed relative to "
         "its own max, so they cannot simply be added; the online softmax's update shows how a sum moves "
         "to a larger max, and the output of both blocks is a weighted mean of the two sides' outputs "
         "(ask what each side's weight must be); try a block whose keys are all masked")
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
        m, total, o = _as_triple(merge(*state1, *state2))
        expect_close(m, m_want, f"the merged max m {where}", atol=1e-9)
        if isinstance(total, torch.Tensor) and total.shape == l_want.shape:
            if torch.allclose(total, state1[1] + state2[1]) and not torch.allclose(total, l_want):
                raise Wrong(f"{where}: your l is l1 + l2, but l1 and l2 are sums relative to different "
                            "maxes: rescale each to the merged max before adding")
            one_side = [state1[1] * torch.exp(state1[0] - m_want) + state2[1],
                        state1[1] + state2[1] * torch.exp(state2[0] - m_want)]
            if any(torch.allclose(total, w) for w in one_side) and not torch.allclose(total, l_want):
                raise Wrong(f"{where}: only one side of l was rescaled to the merged max: both sides were "
                            "summed relative to their own max, so both need the factor")
        expect_close(total, l_want, f"the merged sum l {where}", atol=1e-9, rtol=1e-9)
        if isinstance(o, torch.Tensor) and o.shape == o_want.shape and not torch.allclose(o, o_want):
            if torch.allclose(o, (state1[2] + state2[2]) / 2):
                raise Wrong(f"{where}: you averaged the two outputs; each side must count in proportion to "
                            "its share of the softmax mass (its rescaled l over the merged l)")
            unscaled = (state1[1][..., None] * state1[2] + state2[1][..., None] * state2[2]) / \
                (state1[1] + state2[1])[..., None]
            if torch.allclose(o, unscaled):
                raise Wrong(f"{where}: your output weights the sides by l1 and l2 as they are; they are "
                            "relative to different maxes, so rescale them first")
            if torch.allclose(o, o_want * l_want[..., None]):
                raise Wrong(f"{where}: your o is not normalised: the states hold normalised outputs "
                            "(each side's own attention output), so divide by the merged l")
        expect_close(o, o_want, f"the merged output o {where}", atol=1e-9, rtol=1e-7)
        # merging is associative: three blocks, merged one after the other, give attention over all keys
        if S1 > 1:
            cut = S1 // 2
            first = merge(*_softmax_state(s[..., :cut], v[:, :cut]),
                          *_softmax_state(s[..., cut:S1], v[:, cut:S1]))
            _, _, o3 = _as_triple(merge(*_as_triple(first), *state2))
            expect_close(o3, o_want, f"the output of three blocks merged one after the other {where}",
                         atol=1e-9, rtol=1e-7)
    # a block whose keys are all masked for some rows (m = -inf, l = 0, o = 0) must change nothing
    s = torch.randn(2, 3, 6, generator=g, dtype=torch.double)
    v = torch.randn(2, 6, 4, generator=g, dtype=torch.double)
    s[0, 1, 3:] = -math.inf
    state1, state2 = _softmax_state(s[..., :3], v[:, :3]), _softmax_state(s[..., 3:], v[:, 3:])
    m, total, o = _as_triple(merge(*state1, *state2))
    if not bool(torch.isfinite(o).all()):
        raise Wrong("a block whose keys are all masked for a row (m = -inf, l = 0, o = 0) gave NaN or inf: "
                    "e to the power of -inf minus a finite max is 0, so that side must simply drop out")
    expect_close(o, _softmax_state(s, v)[2], "the merged output when one block is fully masked for a row",
                 atol=1e-9)


# ----------------------------------------------------------------------------- 10.accumulation_weights


def _targets(g: torch.Generator, rows: int, length: int, real_lengths: Sequence[int]) -> torch.Tensor:
    t = torch.randint(4, 50, (rows, length), generator=g)
    for i, n in enumerate(real_lengths):
        t[i, n:] = PAD_ID
    return t


@checker("10.accumulation_weights", hint="section 8: write the big batch's loss out as a mean over what it "
         "averages, then write each micro-batch's mean loss the same way, and compare; mind what the "
         "padding contributes")
def _check_accumulation_weights(weights_fn: Callable[[list[torch.Tensor]], Any]) -> None:
    g = torch.Generator().manual_seed(3)
    groups = [
        [_targets(g, 2, 6, [6, 2]), _targets(g, 2, 6, [6, 6]), _targets(g, 2, 3, [1, 1])],
        [_targets(g, 3, 8, [8, 3, 2]), _targets(g, 1, 5, [5])],
        [_targets(g, 2, 4, [4, 4]), _targets(g, 2, 4, [4, 4])],
        [_targets(g, 4, 10, [10, 9, 1, 1])],
    ]
    for group in groups:
        real = torch.tensor([float((t != PAD_ID).sum()) for t in group], dtype=torch.double)
        slots = torch.tensor([float(t.numel()) for t in group], dtype=torch.double)
        want = real / real.sum()
        got = weights_fn([t.clone() for t in group])
        try:
            got = torch.as_tensor(got, dtype=torch.double).flatten()
        except (TypeError, ValueError, RuntimeError):
            raise Wrong("return one weight per micro-batch (a list or a 1-d tensor), "
                        f"got {type(got).__name__}") from None
        counts = ", ".join(str(int(n)) for n in real)
        if got.numel() != len(group):
            raise Wrong(f"{len(group)} micro-batches need {len(group)} weights, got {got.numel()}")
        if torch.allclose(got, want):
            continue
        if torch.allclose(got, torch.full_like(want, 1 / len(group))):
            raise Wrong(f"micro-batches with {counts} real tokens each got the same weight 1/N: that is the "
                        "mean of the micro-batch means, not the mean over all tokens; bigger micro-batches "
                        "must count more")
        if torch.allclose(got, slots / slots.sum()):
            raise Wrong(f"your weights count the padded slots too (micro-batches of {counts} real tokens): "
                        "the loss ignores padding targets, so count only the real ones")
        if torch.allclose(got, real):
            raise Wrong("those are the token counts themselves: the weights of one mean must add up to 1")
        if torch.allclose(got, (1 / real) / (1 / real).sum()):
            raise Wrong("your weights are largest for the smallest micro-batches: it is the other way round")
        raise Wrong(f"micro-batches with {counts} real tokens: expected weights "
                    f"{[round(float(w), 4) for w in want]}, got {[round(float(w), 4) for w in got]}")


# ----------------------------------------------------------------------------- 10.mfu


def _flops_per_token(vocab: int, d_model: int, layers: int, d_ff: int, context: int) -> float:
    n = layers * (4 * d_model * d_model + 2 * d_model * d_ff) + d_model * vocab
    return 6.0 * n + 12.0 * layers * d_model * context


@checker("10.mfu", hint="section 6: each weight costs a multiply and an add per token in the forward "
         "pass and twice that in the backward pass; the embedding is a lookup, the output layer is a real "
         "product; attention's scores and weighted sum add a term that grows with the context; divide the "
         "model FLOP/s by the peak and give a fraction")
def _check_mfu(mfu_fn: Callable[..., Any]) -> None:
    cases = [dict(vocab=50304, d_model=768, layers=12, d_ff=3072, context=1024, tokens_per_s=3.0e5,
                  peak=989e12),
             dict(vocab=1000, d_model=128, layers=2, d_ff=512, context=64, tokens_per_s=2.5e4, peak=1.0e12),
             dict(vocab=32000, d_model=4096, layers=32, d_ff=11008, context=4096, tokens_per_s=3.0e3,
                  peak=312e12)]
    for c in cases:
        sizes = {k: c[k] for k in ("vocab", "d_model", "layers", "d_ff", "context")}
        want_f = _flops_per_token(**sizes)
        want_u = c["tokens_per_s"] * want_f / c["peak"]
        out = mfu_fn(**c)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Wrong("return a pair (training FLOPs per token, MFU as a fraction)")
        f, u = (float(x.item()) if isinstance(x, torch.Tensor) else x for x in out)
        if not isinstance(f, (int, float)) or not isinstance(u, (int, float)):
            raise Wrong("return two numbers: (training FLOPs per token, MFU as a fraction)")
        where = ", ".join(f"{k}={v}" for k, v in sizes.items())
        d, L, V, T = c["d_model"], c["layers"], c["vocab"], c["context"]
        n_layers = L * (4 * d * d + 2 * d * c["d_ff"])
        if not math.isclose(f, want_f, rel_tol=1e-6):
            diagnoses = [
                (want_f / 3, "that is the forward pass only: a training step also runs the backward "
                             "pass, which costs twice the forward"),
                (2.0 * (n_layers + d * V) + 12.0 * L * d * T,
                 "the weights are counted for the forward pass only (2 per weight): the backward adds 4"),
                (want_f + 6.0 * V * d, "you counted the embedding table as a matrix product: it is a "
                                       "lookup (no FLOPs); only the output layer multiplies"),
                (want_f - 6.0 * V * d, "the output layer (d_model x vocab) is missing: it is a real matrix "
                                       "product for every token"),
                (6.0 * (n_layers + d * V), "attention's score and weighted-sum products are missing (they "
                                           "have no weights but cost FLOPs that grow with the context)"),
                (want_f - 6.0 * L * d * T, "the attention term is half of the convention's: count the full "
                                           "T x T scores forward and backward (12 per layer, d_model and "
                                           "context token)"),
                (want_f / 2, "count 2 FLOPs per multiply-add (a multiply and an add)"),
            ]
            for value, why in diagnoses:
                if math.isclose(f, value, rel_tol=1e-6):
                    raise Wrong(f"{where}: {why}")
            raise Wrong(f"{where}: expected {want_f:.6g} training FLOPs per token, got {f:.6g}")
        if math.isclose(u, 100 * want_u, rel_tol=1e-6):
            raise Wrong("MFU should be a fraction (0.4 for 40%), not a percentage")
        if math.isclose(u, want_u / 3, rel_tol=1e-6):
            raise Wrong("your FLOPs per token are right but the MFU uses a third of them")
        if not math.isclose(u, want_u, rel_tol=1e-6):
            raise Wrong(f"{where}, {c['tokens_per_s']:g} tokens/s, peak {c['peak']:g} FLOP/s: expected MFU "
                        f"{want_u:.4g}, got {u:.4g}")


# ----------------------------------------------------------------------------- 10.rank_indices


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def _sampler_indices(n: int, world_size: int, rank: int, epoch: int, seed: int) -> list[int]:
    sampler = DistributedSampler(_Sized(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@checker("10.rank_indices", hint="section 7: all ranks draw the same permutation (from the seed and "
         "the epoch), pad it by wrapping around until it divides by the world size, and each rank then "
         "takes every world_size-th index starting at its rank; DistributedSampler's documentation and "
         "source say how")
def _check_rank_indices(rank_indices: Callable[..., Any]) -> None:
    cases = [(10, 2, 0, 0, 0), (10, 2, 1, 0, 0), (10, 2, 1, 3, 0), (11, 2, 1, 0, 0), (7, 3, 2, 1, 5),
             (2, 4, 3, 0, 1), (13, 4, 0, 2, 42)]
    for n, world, rank, epoch, seed in cases:
        want = _sampler_indices(n, world, rank, epoch, seed)
        where = f"n={n}, world_size={world}, rank={rank}, epoch={epoch}, seed={seed}"
        got = rank_indices(n=n, world_size=world, rank=rank, epoch=epoch, seed=seed)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        try:
            got = [int(i) for i in got]
        except (TypeError, ValueError):
            raise Wrong(f"return a list of dataset indices, got {type(got).__name__}") from None
        if got == want:
            continue
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        per_rank = math.ceil(n / world)
        padded = (perm * math.ceil(world * per_rank / n))[:world * per_rank]
        if len(got) != len(want):
            if len(got) == len(perm[rank::world]):
                raise Wrong(f"{where}: rank {rank} gets {len(got)} indices, expected {len(want)}: every rank "
                            "must get the same number (DDP steps in lockstep), so the permutation is padded "
                            "by repeating its start until it divides by the world size")
            raise Wrong(f"{where}: expected {len(want)} indices, got {len(got)}")
        if got == padded[rank * per_rank:(rank + 1) * per_rank]:
            raise Wrong(f"{where}: you gave each rank a contiguous chunk; DistributedSampler interleaves: "
                        "rank r takes positions r, r + world_size, r + 2 world_size, ...")
        if epoch != 0:
            same_every_epoch = _sampler_indices(n, world, rank, 0, seed)
            if got == same_every_epoch:
                raise Wrong(f"{where}: your order ignores the epoch; set_epoch(epoch) reseeds the "
                            "permutation with seed + epoch, so every epoch is shuffled differently")
        if sorted(got) == sorted(want):
            raise Wrong(f"{where}: the right indices in the wrong order: the rank reads them in the "
                        "order of the permutation")
        raise Wrong(f"{where}: expected {want}, got {got}")

"""Chapter 10 exercise checkers accept the reference solutions and reject typical wrong answers,
each with the message that names the mistake."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub
from torch.utils.data.distributed import DistributedSampler

from tfmlib import exercises
from tfmlib.data import PAD_ID

NAMES = ["10.accumulation_weights", "10.merge_softmax_states", "10.mfu", "10.rank_indices"]


def _rejects_with(name, fn, *fragments):
    """The checker rejects ``fn`` and its message contains every fragment (the specific diagnosis)."""
    _rejects(name, fn)
    verdict = exercises.check(name, fn)
    for fragment in fragments:
        assert fragment in verdict.message, f"{name}: expected {fragment!r} in {verdict.message!r}"


def test_chapter_10_exercises_are_registered_and_never_raise(capsys):
    assert exercises.names(10) == NAMES

    def keyword_stub(**kwargs):
        raise NotImplementedError

    for name in NAMES:
        stub = keyword_stub if name in ("10.mfu", "10.rank_indices") else _stub
        assert not exercises.check(name, stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        with pytest.raises(exercises.ExerciseFailed, match="not solved yet"):
            exercises.check(name, stub, must_pass=True)


@pytest.mark.parametrize("name", NAMES)
def test_10_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("torch.", "exp(", "maximum", "max(", "sum(", "6 *", "12 *", "* 6", "/ peak",
                               "randperm", "manual_seed", "[rank", "::", "return ", "!=", "==", "numel",
                               "set_epoch(", "lambda", "def "))


# ----------------------------------------------------------------------------- 10.merge_softmax_states


def merge_ref(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    total = a1 + a2
    return m, total, (a1[..., None] * o1 + a2[..., None] * o2) / total[..., None]


def merge_no_rescale(m1, l1, o1, m2, l2, o2):
    total = l1 + l2
    return torch.maximum(m1, m2), total, (l1[..., None] * o1 + l2[..., None] * o2) / total[..., None]


def merge_one_side(m1, l1, o1, m2, l2, o2):      # uses the new max for the second side only
    m = torch.maximum(m1, m2)
    a1, a2 = l1, l2 * torch.exp(m2 - m)
    total = a1 + a2
    return m, total, (a1[..., None] * o1 + a2[..., None] * o2) / total[..., None]


def merge_average(m1, l1, o1, m2, l2, o2):
    m, total, _ = merge_ref(m1, l1, o1, m2, l2, o2)
    return m, total, (o1 + o2) / 2


def merge_unnormalised(m1, l1, o1, m2, l2, o2):
    m, total, o = merge_ref(m1, l1, o1, m2, l2, o2)
    return m, total, o * total[..., None]


def test_merge_accepts_the_solution():
    _accepts("10.merge_softmax_states", merge_ref)


def test_merge_rejects_wrong_answers_with_specific_messages():
    _rejects_with("10.merge_softmax_states", merge_no_rescale, "l1 + l2", "rescale")
    _rejects_with("10.merge_softmax_states", merge_one_side, "only one side")
    _rejects_with("10.merge_softmax_states", merge_average, "averaged the two outputs")
    _rejects_with("10.merge_softmax_states", merge_unnormalised, "not normalised")
    _rejects("10.merge_softmax_states", lambda m1, l1, o1, m2, l2, o2: (m1, l1, o1))   # ignores the 2nd
    _rejects("10.merge_softmax_states", lambda *a: merge_ref(*a)[2])                    # not a triple


def test_merge_checks_a_fully_masked_block():
    """A merge that is right on finite states but turns a row whose block is fully masked (m = -inf,
    l = 0) into NaN is rejected for that reason."""
    def merge_nan_on_masked(m1, l1, o1, m2, l2, o2):
        m, total, o = merge_ref(m1, l1, o1, m2, l2, o2)
        masked = (l1 == 0) | (l2 == 0)
        return m, total, torch.where(masked[..., None], torch.nan, o)

    _rejects_with("10.merge_softmax_states", merge_nan_on_masked, "all masked for a row", "NaN")


# ----------------------------------------------------------------------------- 10.accumulation_weights


def weights_ref(targets):
    counts = torch.tensor([float((t != PAD_ID).sum()) for t in targets])
    return counts / counts.sum()


def test_accumulation_weights_accept_the_solution():
    _accepts("10.accumulation_weights", weights_ref)
    _accepts("10.accumulation_weights", lambda ts: weights_ref(ts).tolist())


def test_accumulation_weights_give_the_big_batch_gradient():
    """The solution's weights really do what the exercise says: the weighted micro-batch gradients equal
    the gradient of one batch made of them (and 1/N does not)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20, 5).double()
    head = torch.nn.Linear(5, 20).double()
    params = list(emb.parameters()) + list(head.parameters())
    micro = [torch.tensor([[5, 6, 7, 8], [9, PAD_ID, PAD_ID, PAD_ID]]),
             torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]])]

    def loss_of(t):
        logits = head(emb(t.clamp_min(1)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=PAD_ID)

    def grads(loss):
        return torch.autograd.grad(loss, params)

    big = grads(loss_of(torch.cat(micro)))
    for weights, should_match in ((weights_ref(micro), True), (torch.full((2,), 0.5), False)):
        acc = [sum(w * g for w, g in zip(weights, gs, strict=True))
               for gs in zip(*(grads(loss_of(t)) for t in micro), strict=True)]
        same = all(torch.allclose(a, b) for a, b in zip(acc, big, strict=True))
        assert same == should_match, f"weights {weights.tolist()}: match={same}, expected {should_match}"


def test_accumulation_weights_reject_wrong_answers_with_specific_messages():
    _rejects_with("10.accumulation_weights", lambda ts: [1 / len(ts)] * len(ts), "1/N")
    _rejects_with("10.accumulation_weights",
                  lambda ts: torch.tensor([float(t.numel()) for t in ts]) / sum(t.numel() for t in ts),
                  "padded slots")
    _rejects_with("10.accumulation_weights", lambda ts: [float((t != PAD_ID).sum()) for t in ts],
                  "add up to 1")
    _rejects_with("10.accumulation_weights", lambda ts: (1 / weights_ref(ts)) / (1 / weights_ref(ts)).sum(),
                  "other way round")
    _rejects_with("10.accumulation_weights", lambda ts: weights_ref(ts)[:1], "need")
    _rejects("10.accumulation_weights", lambda ts: "half")


# ----------------------------------------------------------------------------- 10.mfu


def mfu_ref(*, vocab, d_model, layers, d_ff, context, tokens_per_s, peak):
    n = layers * (4 * d_model ** 2 + 2 * d_model * d_ff) + d_model * vocab
    flops = 6 * n + 12 * layers * d_model * context
    return flops, tokens_per_s * flops / peak


def _mfu_variant(flops_fn):
    def fn(*, vocab, d_model, layers, d_ff, context, tokens_per_s, peak):
        f = flops_fn(vocab, d_model, layers, d_ff, context)
        return f, tokens_per_s * f / peak
    return fn


def _weights(V, d, L, ff):
    return L * (4 * d * d + 2 * d * ff)


def test_mfu_accepts_the_solution():
    _accepts("10.mfu", mfu_ref)


def test_mfu_rejects_wrong_answers_with_specific_messages():
    _rejects_with("10.mfu", _mfu_variant(lambda V, d, L, ff, T: 2 * (_weights(V, d, L, ff) + d * V)
                                         + 4 * L * d * T),
                  "forward pass only")
    _rejects_with("10.mfu", _mfu_variant(lambda V, d, L, ff, T: 2 * (_weights(V, d, L, ff) + d * V)
                                         + 12 * L * d * T), "backward adds 4")
    _rejects_with("10.mfu", _mfu_variant(lambda V, d, L, ff, T: 6 * (_weights(V, d, L, ff) + 2 * d * V)
                                         + 12 * L * d * T), "embedding")
    _rejects_with("10.mfu", _mfu_variant(lambda V, d, L, ff, T: 6 * _weights(V, d, L, ff) + 12 * L * d * T),
                  "output layer")
    _rejects_with("10.mfu", _mfu_variant(lambda V, d, L, ff, T: 6 * (_weights(V, d, L, ff) + d * V)),
                  "attention's score")
    _rejects_with("10.mfu", _mfu_variant(lambda V, d, L, ff, T: 6 * (_weights(V, d, L, ff) + d * V)
                                         + 6 * L * d * T), "half")
    _rejects_with("10.mfu", lambda **c: (mfu_ref(**c)[0], 100 * mfu_ref(**c)[1]), "fraction")
    _rejects_with("10.mfu", lambda **c: mfu_ref(**c)[1], "pair")


# ----------------------------------------------------------------------------- 10.rank_indices


def rank_indices_ref(*, n, world_size, rank, epoch, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = math.ceil(n / world_size) * world_size
    order = (order * math.ceil(total / n))[:total]
    return order[rank:total:world_size]


def test_rank_indices_accept_the_solution_and_match_torch():
    _accepts("10.rank_indices", rank_indices_ref)
    sampler = DistributedSampler(range(9), num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(4)
    assert list(sampler) == rank_indices_ref(n=9, world_size=2, rank=1, epoch=4, seed=3)


def _contiguous(*, n, world_size, rank, epoch, seed):
    order = rank_indices_ref(n=n, world_size=1, rank=0, epoch=epoch, seed=seed)
    per = math.ceil(n / world_size)
    order = (order * math.ceil(per * world_size / n))[:per * world_size]
    return order[rank * per:(rank + 1) * per]


def _no_padding(*, n, world_size, rank, epoch, seed):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()[rank::world_size]


def test_rank_indices_reject_wrong_answers_with_specific_messages():
    _rejects_with("10.rank_indices", _contiguous, "contiguous chunk")
    _rejects_with("10.rank_indices", lambda **a: rank_indices_ref(**{**a, "epoch": 0}), "ignores the epoch")
    _rejects_with("10.rank_indices", _no_padding, "same number")
    _rejects_with("10.rank_indices", lambda **a: sorted(rank_indices_ref(**a)), "wrong order")
    _rejects("10.rank_indices", lambda **a: list(range(a["rank"], a["n"], a["world_size"])))   # no shuffle

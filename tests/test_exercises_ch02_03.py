"""Chapter 02 and 03 exercise checkers accept the reference solutions and reject typical wrong answers."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_exercises import _accepts, _rejects, _stub  # the helpers of chapter 01's checker tests

from tfmlib import exercises
from tfmlib.data import padding_fraction


@pytest.mark.parametrize("chapter", [2, 3])
def test_check_api_never_raises_without_must_pass(chapter, capsys):
    assert exercises.names(chapter), f"chapter {chapter} registers no exercises"
    for name in exercises.names(chapter):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


# ----------------------------------------------------------------------------- chapter 02


def masked_token_loss_ref(logits, targets):
    mask = targets != 0
    nll = -F.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    return nll[mask].sum() / mask.sum()


@pytest.mark.parametrize("wrong", [
    lambda lg, t: F.cross_entropy(lg.flatten(0, 1), t.flatten()),                      # counts padding
    lambda lg, t: (-F.log_softmax(lg, -1).gather(-1, t[..., None]).squeeze(-1)
                   * (t != 0)).sum() / t.numel(),                                      # wrong denominator
    lambda lg, t: F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=0,
                                  reduction="none"),                                   # not a scalar
    lambda lg, t: -F.log_softmax(lg, -1).max(-1).values[t != 0].mean(),                # best class
], ids=["counts-padding", "denominator", "not-reduced", "argmax-not-target"])
def test_02_masked_token_loss(wrong):
    _accepts("02.masked_token_loss", masked_token_loss_ref)
    _rejects("02.masked_token_loss", wrong)


def cut_at_eos_ref(tokens):
    return [r[: r.index(2)] if 2 in r else r for r in tokens.tolist()]


@pytest.mark.parametrize("wrong", [
    lambda t: [r[: r.index(2) + 1] if 2 in r else r for r in t.tolist()],             # keeps EOS
    lambda t: [[i for i in r if i not in (0, 2)] for r in t.tolist()],                 # no stop at EOS
    lambda t: [r[: r.index(2)] for r in t.tolist() if 2 in r],                         # drops rows
    lambda t: t,                                                                       # a tensor
], ids=["keeps-eos", "no-stop", "drops-rows", "tensor"])
def test_02_cut_at_eos(wrong):
    _accepts("02.cut_at_eos", cut_at_eos_ref)
    _rejects("02.cut_at_eos", wrong)


def reverse_source_ref(src, mask):
    out = src.clone()
    for i, n in enumerate(mask.sum(1).tolist()):
        out[i, : n - 1] = src[i, : n - 1].flip(0)
    return out


def _reverse_with_eos(src, mask):
    out = src.clone()
    for i, n in enumerate(mask.sum(1).tolist()):
        out[i, :n] = src[i, :n].flip(0)
    return out


@pytest.mark.parametrize("wrong", [
    lambda s, m: s.flip(1),           # whole rows, padding moves to the front
    _reverse_with_eos,                # EOS moves to the front
    lambda s, m: s,                   # unchanged
], ids=["whole-row", "moves-eos", "unchanged"])
def test_02_reverse_source(wrong):
    _accepts("02.reverse_source", reverse_source_ref)
    _rejects("02.reverse_source", wrong)


@pytest.mark.parametrize("wrong", [
    lambda h, r: math.exp(1 - h / r) if h < r else 1.0,     # inverted ratio
    lambda h, r: min(1.0, h / r),                            # linear
    lambda h, r: math.exp(1 - r / h),                        # rewards long output
], ids=["inverted", "linear", "no-cap"])
def test_02_brevity_penalty(wrong):
    _accepts("02.brevity_penalty", lambda h, r: 1.0 if h > r else math.exp(1 - r / h))
    _rejects("02.brevity_penalty", wrong)


def right_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


@pytest.mark.parametrize("wrong", [
    lambda l, m: torch.arange(m)[None, :] <= l[:, None],           # off by one
    lambda l, m: torch.arange(m)[None, :] >= l[:, None],           # True at padding
    lambda l, m: (torch.arange(m)[None, :] < l[:, None]).long(),   # not bool
    lambda l, m: torch.arange(m)[:, None] < l[None, :],            # transposed
    lambda l, m: [[True] * m for _ in l],                          # not a tensor
])
def test_02_padding_mask_rejects_wrong_answers(wrong, capsys):
    assert exercises.check("02.padding_mask", right_mask)
    assert not exercises.check("02.padding_mask", wrong)
    assert "not correct yet" in capsys.readouterr().out
    with pytest.raises(exercises.ExerciseFailed):
        exercises.check("02.padding_mask", wrong, must_pass=True)


@pytest.mark.parametrize("wrong", [
    lambda b, l: 1 - padding_fraction(b, l),                                    # real fraction
    lambda b, l: sum(max(l[i] for i in x) * len(x) - sum(l[i] for i in x) for x in b),  # a count
    lambda b, l: 1 - sum(l) / (max(l) * len(l)),                                # ignores batches
])
def test_02_padding_fraction_rejects_wrong_answers(wrong):
    assert exercises.check("02.padding_fraction", padding_fraction)
    assert not exercises.check("02.padding_fraction", wrong)


def test_chapter_02_exercises_are_registered():
    assert exercises.names(2) == ["02.brevity_penalty", "02.cut_at_eos", "02.masked_token_loss",
                                  "02.padding_fraction", "02.padding_mask", "02.reverse_source"]


# ----------------------------------------------------------------------------- chapter 03


def additive_ref(query, annotations, mask, W, U, v):
    e = torch.tanh((query @ W.T)[:, None, :] + annotations @ U.T) @ v
    w = torch.softmax(e.masked_fill(~mask, float("-inf")), -1)
    return torch.bmm(w[:, None], annotations).squeeze(1), w


def _additive_unmasked(query, annotations, mask, W, U, v):
    w = torch.softmax(torch.tanh((query @ W.T)[:, None, :] + annotations @ U.T) @ v, -1)
    return torch.bmm(w[:, None], annotations).squeeze(1), w


def _additive_wrong_axis(query, annotations, mask, W, U, v):
    e = torch.tanh((query @ W.T)[:, None, :] + annotations @ U.T) @ v
    w = torch.softmax(e.masked_fill(~mask, float("-inf")), 0).nan_to_num(0.0)
    return torch.bmm(w[:, None], annotations).squeeze(1), w


def _additive_no_tanh(query, annotations, mask, W, U, v):
    e = ((query @ W.T)[:, None, :] + annotations @ U.T) @ v
    w = torch.softmax(e.masked_fill(~mask, float("-inf")), -1)
    return torch.bmm(w[:, None], annotations).squeeze(1), w


def _additive_weights_only(query, annotations, mask, W, U, v):
    return additive_ref(query, annotations, mask, W, U, v)[1]


@pytest.mark.parametrize("wrong", [_additive_unmasked, _additive_wrong_axis, _additive_no_tanh,
                                   _additive_weights_only],
                         ids=["unmasked", "softmax-over-batch", "no-tanh", "no-context"])
def test_03_additive_attention(wrong):
    _accepts("03.additive_attention", additive_ref)
    _rejects("03.additive_attention", wrong)


def test_03_additive_attention_names_the_masking_mistake(capsys):
    exercises.check("03.additive_attention", _additive_unmasked)
    assert "padded source positions got a non-zero weight" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [
    lambda q, k, W: torch.einsum("bq,kq,bsk->bs", q, W.T, k) * 2,     # scaled
    lambda q, k, W: torch.einsum("bq,bsq->bs", q, k[..., : q.shape[1]]),  # plain dot, ignores W_a
    lambda q, k, W: torch.einsum("bq,qk,bsk->bs", q, W, k).T,          # transposed result
], ids=["scaled", "no-W", "transposed"])
def test_03_general_score(wrong):
    _accepts("03.general_score", lambda q, k, W: torch.einsum("bq,qk,bsk->bs", q, W, k))
    _rejects("03.general_score", wrong)


def penalty_ref(A):
    return ((A @ A.transpose(1, 2) - torch.eye(A.shape[1])) ** 2).sum(dim=(1, 2)).mean()


@pytest.mark.parametrize("wrong", [
    lambda A: ((A.transpose(1, 2) @ A - torch.eye(A.shape[2])) ** 2).sum(dim=(1, 2)).mean(),  # A^T A
    lambda A: (A @ A.transpose(1, 2) - torch.eye(A.shape[1])).abs().sum(dim=(1, 2)).mean(),  # not squared
    lambda A: ((A @ A.transpose(1, 2) - torch.eye(A.shape[1])) ** 2).sum(),                  # summed batch
    lambda A: ((A @ A.transpose(1, 2) - torch.eye(A.shape[1])) ** 2).sum(dim=(1, 2)),        # not reduced
], ids=["ATA", "not-squared", "batch-sum", "per-example"])
def test_03_attention_penalty(wrong):
    _accepts("03.attention_penalty", penalty_ref)
    _rejects("03.attention_penalty", wrong)


def test_chapter_03_exercises_are_registered():
    assert exercises.names(3) == ["03.additive_attention", "03.attention_penalty", "03.general_score"]

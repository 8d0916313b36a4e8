"""Chapter 05 exercise checkers accept the reference solutions (and the package's own functions) and
reject typical wrong answers."""

import pytest
import torch
from test_exercises import _accepts, _rejects, _stub  # the helpers of chapter 01's checker tests

from tfmlib import exercises
from tfmlib.attention import causal_mask, scaled_dot_product_attention, split_heads


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(5) == ["05.attention", "05.causal_mask", "05.split_heads"]
    for name in exercises.names(5):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 05.attention


def attention_ref(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(filled, dim=-1) * mask
    return weights @ v, weights


def _scores(q, k, scale):
    return q @ k.transpose(-2, -1) * scale


def _masked(scores, mask):
    return (torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), -1) * mask)


def _unscaled(q, k, v, mask):
    w = _masked(_scores(q, k, 1.0), mask)
    return w @ v, w


def _scaled_by_d(q, k, v, mask):
    w = _masked(_scores(q, k, 1.0 / q.shape[-1]), mask)
    return w @ v, w


def _naive_inf(q, k, v, mask):
    w = torch.softmax(_scores(q, k, q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf")), -1)
    return w @ v, w


def _ignores_mask(q, k, v, mask):
    w = torch.softmax(_scores(q, k, q.shape[-1] ** -0.5), -1)
    return w @ v, w


def _mask_after_softmax(q, k, v, mask):
    w = torch.softmax(_scores(q, k, q.shape[-1] ** -0.5), -1) * mask
    return w @ v, w


def _softmax_over_queries(q, k, v, mask):
    s = _scores(q, k, q.shape[-1] ** -0.5).masked_fill(~mask, torch.finfo(q.dtype).min)
    w = torch.softmax(s, -2) * mask
    return w @ v, w


def _out_only(q, k, v, mask):
    return attention_ref(q, k, v, mask)[0]


@pytest.mark.parametrize("wrong", [_unscaled, _scaled_by_d, _naive_inf, _ignores_mask, _mask_after_softmax,
                                   _softmax_over_queries, _out_only],
                         ids=["unscaled", "scaled-by-d", "nan-row", "no-mask", "mask-after-softmax",
                              "softmax-over-queries", "out-only"])
def test_05_attention(wrong):
    _accepts("05.attention", attention_ref)
    _rejects("05.attention", wrong)


def test_05_attention_accepts_the_package_and_names_the_mistakes(capsys):
    _accepts("05.attention", scaled_dot_product_attention)
    for wrong, message in [(_unscaled, "did not scale"), (_scaled_by_d, "not by d_k"), (_naive_inf, "NaN"),
                           (_ignores_mask, "hidden key")]:
        exercises.check("05.attention", wrong)
        assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 05.split_heads


def split_ref(x, heads):
    B, L, D = x.shape
    return x.view(B, L, heads, D // heads).transpose(1, 2)


@pytest.mark.parametrize("wrong", [
    lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h),                      # no transpose
    lambda x, h: x.view(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2),     # interleaved
    lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h),                         # heads after L
    lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h).transpose(1, 2).flip(1),  # heads reversed
], ids=["reshape-no-transpose", "interleaved", "no-transpose", "reversed"])
def test_05_split_heads(wrong):
    _accepts("05.split_heads", split_ref)
    _accepts("05.split_heads", split_heads)
    _rejects("05.split_heads", wrong)


def test_05_split_heads_names_the_reshape_mistake(capsys):
    exercises.check("05.split_heads", lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h))
    assert "mix positions" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 05.causal_mask


@pytest.mark.parametrize("wrong", [
    lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(),                                  # no offset
    lambda T, S: ~torch.ones(T, S, dtype=torch.bool).tril(S - T),                            # PyTorch's way
    lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T - 1),                         # not itself
    lambda T, S: torch.ones(T, S).tril(S - T),                                               # float
    lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T),                             # upper
    lambda T, S: torch.ones(S, T, dtype=torch.bool).tril(),                                  # transposed
], ids=["no-offset", "inverted", "no-diagonal", "float", "upper", "transposed"])
def test_05_causal_mask(wrong):
    _accepts("05.causal_mask", lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T))
    _accepts("05.causal_mask", causal_mask)
    _rejects("05.causal_mask", wrong)


def test_05_causal_mask_explains_the_offset_and_the_convention(capsys):
    exercises.check("05.causal_mask", lambda T, S: torch.ones(T, S, dtype=torch.bool).tril())
    assert "LAST T positions" in capsys.readouterr().out
    exercises.check("05.causal_mask", lambda T, S: ~torch.ones(T, S, dtype=torch.bool).tril(S - T))
    assert "NOT allowed" in capsys.readouterr().out

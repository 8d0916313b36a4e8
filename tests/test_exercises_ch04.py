"""Chapter 04 exercise checkers accept the reference solutions and reject typical wrong answers."""

import pytest
import torch
from test_exercises import _accepts, _rejects, _stub  # the helpers of chapter 01's checker tests

from tfmlib import exercises


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(4), "chapter 04 registers no exercises"
    for name in exercises.names(4):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out
        with pytest.raises(exercises.ExerciseFailed, match="not solved yet"):
            exercises.check(name, _stub, must_pass=True)


def test_chapter_04_exercises_are_registered():
    assert exercises.names(4) == ["04.attention_with_positions", "04.causal_attention",
                                  "04.multi_head_self_attention"]


# ----------------------------------------------------------------------------- 04.causal_attention


def _future(T):
    return ~torch.ones(T, T, dtype=torch.bool).tril()


def causal_ref(q, k, v):
    w = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(_future(q.shape[1]), float("-inf")), -1)
    return w @ v, w


def _unmasked(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1), -1)
    return w @ v, w


def _masked_after_softmax(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1), -1).masked_fill(_future(q.shape[1]), 0.0)
    return w @ v, w


def _scaled(q, k, v):
    s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(_future(q.shape[1]), float("-inf"))
    w = torch.softmax(s, -1)
    return w @ v, w


def _value_of_the_query(q, k, v):
    _, w = causal_ref(q, k, v)
    return w.sum(-1, keepdim=True) * v, w            # sum_i alpha_{t,i} v_t = v_t


def _transposed_weights(q, k, v):
    _, w = causal_ref(q, k, v)
    return w.transpose(1, 2) @ v, w.transpose(1, 2)


def _upper_triangle(q, k, v):
    s = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(),
                                              float("-inf"))
    w = torch.softmax(s, -1)
    return w @ v, w


def _out_only(q, k, v):
    return causal_ref(q, k, v)[0]


@pytest.mark.parametrize("wrong", [_unmasked, _masked_after_softmax, _scaled, _value_of_the_query,
                                   _transposed_weights, _upper_triangle, _out_only],
                         ids=["unmasked", "masked-after-softmax", "scaled", "v_t", "transposed",
                              "upper-triangle", "no-weights"])
def test_04_causal_attention(wrong):
    _accepts("04.causal_attention", causal_ref)
    _rejects("04.causal_attention", wrong)


@pytest.mark.parametrize(("wrong", "message"), [
    (_unmasked, "later position"),
    (_masked_after_softmax, "sum to 1"),
    (_scaled, "sqrt(d)"),
    (_value_of_the_query, "values' index"),
])
def test_04_causal_attention_names_the_mistake(wrong, message, capsys):
    exercises.check("04.causal_attention", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 04.multi_head_self_attention


def multi_head_ref(x, W_Q, W_K, W_V, W_O, heads):
    B, T, d = x.shape
    q, k, v = ((x @ W.T).view(B, T, heads, d // heads).transpose(1, 2) for W in (W_Q, W_K, W_V))
    h = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
    return h.transpose(1, 2).reshape(B, T, d) @ W_O.T


def _no_transpose(x, W_Q, W_K, W_V, W_O, heads):
    B, T, d = x.shape
    q, k, v = ((x @ W.T).reshape(B, heads, T, d // heads) for W in (W_Q, W_K, W_V))
    h = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
    return h.reshape(B, T, d) @ W_O.T


def _one_head(x, W_Q, W_K, W_V, W_O, heads):
    return multi_head_ref(x, W_Q, W_K, W_V, W_O, 1)


def _no_output_map(x, W_Q, W_K, W_V, W_O, heads):
    return multi_head_ref(x, W_Q, W_K, W_V, torch.eye(x.shape[-1]), heads)


def _causal(x, W_Q, W_K, W_V, W_O, heads):
    B, T, d = x.shape
    q, k, v = ((x @ W.T).view(B, T, heads, d // heads).transpose(1, 2) for W in (W_Q, W_K, W_V))
    h = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(_future(T), float("-inf")), -1) @ v
    return h.transpose(1, 2).reshape(B, T, d) @ W_O.T


def _softmax_over_queries(x, W_Q, W_K, W_V, W_O, heads):
    B, T, d = x.shape
    q, k, v = ((x @ W.T).view(B, T, heads, d // heads).transpose(1, 2) for W in (W_Q, W_K, W_V))
    h = torch.softmax(q @ k.transpose(-2, -1), -2) @ v
    return h.transpose(1, 2).reshape(B, T, d) @ W_O.T


@pytest.mark.parametrize("wrong", [_no_transpose, _one_head, _no_output_map, _causal, _softmax_over_queries],
                         ids=["no-transpose", "one-head", "no-W_O", "causal", "softmax-over-queries"])
def test_04_multi_head_self_attention(wrong):
    _accepts("04.multi_head_self_attention", multi_head_ref)
    _rejects("04.multi_head_self_attention", wrong)


@pytest.mark.parametrize(("wrong", "message"), [
    (_no_transpose, "mix positions"), (_one_head, "one head"), (_no_output_map, "W_O is missing")])
def test_04_multi_head_names_the_mistake(wrong, message, capsys):
    exercises.check("04.multi_head_self_attention", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 04.attention_with_positions


def positions_ref(x, P, W_Q, W_K, W_V):
    xp = x + P
    return torch.softmax((xp @ W_Q.T) @ (xp @ W_K.T).transpose(-2, -1), -1) @ (xp @ W_V.T)


def _keys_position_in_query(x, P, W_Q, W_K, W_V):
    T = x.shape[1]
    k, v = (x + P) @ W_K.T, (x + P) @ W_V.T
    scores = torch.stack([torch.stack([((x[:, t] + P[i]) @ W_Q.T * k[:, i]).sum(-1) for i in range(T)], -1)
                          for t in range(T)], 1)         # q_{t,i} = W_Q(x_t + p(i)), pair by pair
    return torch.softmax(scores, -1) @ v


def _no_positions(x, P, W_Q, W_K, W_V):
    return positions_ref(x, 0 * P, W_Q, W_K, W_V)


def _positions_in_query_only(x, P, W_Q, W_K, W_V):
    return torch.softmax(((x + P) @ W_Q.T) @ (x @ W_K.T).transpose(-2, -1), -1) @ (x @ W_V.T)


def _positions_not_in_values(x, P, W_Q, W_K, W_V):
    xp = x + P
    return torch.softmax((xp @ W_Q.T) @ (xp @ W_K.T).transpose(-2, -1), -1) @ (x @ W_V.T)


def _reversed_positions(x, P, W_Q, W_K, W_V):
    return positions_ref(x, P.flip(0), W_Q, W_K, W_V)


@pytest.mark.parametrize("wrong", [_keys_position_in_query, _no_positions, _positions_in_query_only,
                                   _positions_not_in_values, _reversed_positions],
                         ids=["key's-position", "no-positions", "query-only", "not-in-values", "reversed"])
def test_04_attention_with_positions(wrong):
    _accepts("04.attention_with_positions", positions_ref)
    _rejects("04.attention_with_positions", wrong)


@pytest.mark.parametrize(("wrong", "message"), [
    (_keys_position_in_query, "key's position"), (_no_positions, "does not depend on P"),
    (_positions_in_query_only, "keys and values need positions")])
def test_04_attention_with_positions_names_the_mistake(wrong, message, capsys):
    exercises.check("04.attention_with_positions", wrong)
    assert message in capsys.readouterr().out

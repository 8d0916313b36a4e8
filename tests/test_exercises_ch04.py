"""Chapter 04 exercise checkers accept the reference solutions and reject typical wrong answers, each
with a message that names the mistake; their hints say where to look without giving the code."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub  # chapter 01's checker-test helpers

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
    assert exercises.names(4) == ["04.linear_attention_recurrence", "04.order_from_the_mask",
                                  "04.xor_two_heads"]


def _message(name, answer, capsys):
    capsys.readouterr()
    assert not exercises.check(name, answer)
    return capsys.readouterr().out


def _check_rejects(name, reference, wrong, message, capsys):
    _accepts(name, reference)
    _rejects(name, wrong)
    out = _message(name, wrong, capsys)
    assert message in out, out


# ----------------------------------------------------------------------------- 04.xor_two_heads
# tokens: 0, 1 unmarked bits; 2, 3 the marked bits 0 and 1; 4 the question


def _xor_weights(beta, keys=((3,), (2,)), heads=2):
    W_Q, W_K, W_V = torch.zeros(heads, 1, 5), torch.zeros(heads, 1, 5), torch.zeros(heads, 1, 5)
    W_Q[:, 0, 4] = beta                                  # the question asks
    for h in range(heads):
        for token in keys[h]:
            W_K[h, 0, token] = W_V[h, 0, token] = 1.0    # head h finds (and reads) these tokens
    return W_Q, W_K, W_V


def xor_ref(T_max):
    """Head 1 finds a marked 1 (OR), head 2 a marked 0 (NAND); XOR = OR + NAND - 1."""
    W_Q, W_K, W_V = _xor_weights(math.log(T_max) + 3)    # the found position keeps > 3/4 of the weight
    return W_Q, W_K, W_V, torch.tensor([1.0, 1.0]), -1.5


def _or(T_max):                                          # two heads, both looking for a marked 1
    W_Q, W_K, W_V = _xor_weights(math.log(T_max) + 3, keys=((3,), (3,)))
    return W_Q, W_K, W_V, torch.tensor([1.0, 1.0]), -1.0


def _xnor(T_max):
    W_Q, W_K, W_V, w, b = xor_ref(T_max)
    return W_Q, W_K, W_V, -w, -b


def _blunt(T_max):                                       # a fixed scale: fine for short sequences only
    W_Q, W_K, W_V = _xor_weights(4.0)
    return W_Q, W_K, W_V, torch.tensor([1.0, 1.0]), -1.5


def _reads_unmarked(T_max):                              # head 1 finds any 1, head 2 any 0
    W_Q, W_K, W_V = _xor_weights(math.log(T_max) + 3, keys=((1, 3), (0, 2)))
    return W_Q, W_K, W_V, torch.tensor([1.0, 1.0]), -1.5


def _one_head(T_max):                                    # what section 8 proves impossible
    W_Q, W_K, W_V = _xor_weights(math.log(T_max) + 3, heads=1)
    return W_Q, W_K, W_V, torch.tensor([1.0]), -0.5


def _uniform(T_max):                                     # no query: each head averages, and b is off
    W_Q, W_K, W_V = _xor_weights(0.0)
    return W_Q, W_K, W_V, torch.tensor([1.0, 1.0]), -0.1


@pytest.mark.parametrize(("wrong", "message"), [
    (_or, "that is OR"), (_xnor, "inverted"), (_blunt, "grow with T_max"),
    (_reads_unmarked, "depends on more than the two marked bits"), (_one_head, "asks for two heads"),
    (_uniform, "same answer for every input"),
], ids=["or", "xnor", "blunt", "reads-unmarked", "one-head", "uniform"])
def test_04_xor_two_heads(wrong, message, capsys):
    _check_rejects("04.xor_two_heads", xor_ref, wrong, message, capsys)


def test_04_xor_shapes_are_named(capsys):
    def no_tuple(T_max):
        return torch.zeros(2, 1, 5)

    def wide_readout(T_max):
        W_Q, W_K, W_V, w, b = xor_ref(T_max)
        return W_Q, W_K, W_V, torch.ones(3), b

    assert "tuple of 5" in _message("04.xor_two_heads", no_tuple, capsys)
    assert "w must be (2,)" in _message("04.xor_two_heads", wide_readout, capsys)


# ----------------------------------------------------------------------------- 04.linear_attention_recurrence


def linear_ref(S, z, phi_q, phi_k, v):
    S = S + phi_k[:, :, None] * v[:, None, :]            # S_t = S_{t-1} + phi(k_t) v_t^T
    z = z + phi_k
    return S, z, (phi_q[:, None, :] @ S)[:, 0] / (phi_q * z).sum(-1, keepdim=True)


def _read_before_write(S, z, phi_q, phi_k, v):           # the strictly causal mask, as a recurrence
    out = (phi_q[:, None, :] @ S)[:, 0] / (phi_q * z).sum(-1, keepdim=True)
    return S + phi_k[:, :, None] * v[:, None, :], z + phi_k, out


def _unnormalised(S, z, phi_q, phi_k, v):
    S, z, _ = linear_ref(S, z, phi_q, phi_k, v)
    return S, z, (phi_q[:, None, :] @ S)[:, 0]


def _forgets(S, z, phi_q, phi_k, v):                     # the state is this position's terms only
    return linear_ref(torch.zeros_like(S), torch.zeros_like(z), phi_q, phi_k, v)


def _query_features(S, z, phi_q, phi_k, v):
    S = S + phi_q[:, :, None] * v[:, None, :]
    z = z + phi_q
    return S, z, (phi_q[:, None, :] @ S)[:, 0] / (phi_q * z).sum(-1, keepdim=True)


def _growing_state(S, z, phi_q, phi_k, v):               # keeps every key: attention, not a recurrence
    _, _, out = linear_ref(S, z, phi_q, phi_k, v)
    return torch.cat([S, phi_k[:, :, None] * v[:, None, :]], dim=1), torch.cat([z, phi_k], dim=1), out


def _transposed_state(S, z, phi_q, phi_k, v):
    S, z, out = linear_ref(S, z, phi_q, phi_k, v)
    return S.transpose(1, 2), z, out


def _read_with_keys(S, z, phi_q, phi_k, v):             # the key's features read the state
    S, z, _ = linear_ref(S, z, phi_q, phi_k, v)
    return S, z, (phi_k[:, None, :] @ S)[:, 0] / (phi_k * z).sum(-1, keepdim=True)


def _keys_normaliser(S, z, phi_q, phi_k, v):             # divides by phi(k_t) . z_t
    S, z, _ = linear_ref(S, z, phi_q, phi_k, v)
    return S, z, (phi_q[:, None, :] @ S)[:, 0] / (phi_k * z).sum(-1, keepdim=True)


@pytest.mark.parametrize(("wrong", "message"), [
    (_read_before_write, "may attend to itself"), (_unnormalised, "not normalised"),
    (_forgets, "forgot the earlier positions"), (_query_features, "queries' features"),
    (_growing_state, "fixed size"), (_transposed_state, "fixed size"), (_keys_normaliser, "wrong values"),
    (_read_with_keys, "read with phi(k_t)"),
], ids=["strict", "unnormalised", "forgets", "query-features", "growing", "transposed", "keys-normaliser",
        "read-with-keys"])
def test_04_linear_attention_recurrence(wrong, message, capsys):
    _check_rejects("04.linear_attention_recurrence", linear_ref, wrong, message, capsys)


def test_04_linear_recurrence_equals_masked_linear_attention():
    """The checker's claim: run over a sequence, the step gives the masked quadratic form."""
    g = torch.Generator().manual_seed(0)
    phi_q, phi_k = torch.rand(2, 7, 3, generator=g) + 0.1, torch.rand(2, 7, 3, generator=g) + 0.1
    v = torch.randn(2, 7, 4, generator=g)
    S, z, outs = torch.zeros(2, 3, 4), torch.zeros(2, 3), []
    for t in range(7):
        S, z, out = linear_ref(S, z, phi_q[:, t], phi_k[:, t], v[:, t])
        outs.append(out)
    A = (phi_q @ phi_k.transpose(1, 2)).tril()
    assert torch.allclose(torch.stack(outs, 1), A @ v / A.sum(-1, keepdim=True), atol=1e-6)


# ----------------------------------------------------------------------------- 04.order_from_the_mask
# tokens: 0 filler, 1 = A, 2 = B, 3 the question; layer 2 reads [x_t; h1_t]


def _order_weights(beta, ask=2, find=1, write=1, layer2_key=2, w=1.0, b=-0.5):
    W_Q1, W_K1, W_V1 = torch.zeros(1, 4), torch.zeros(1, 4), torch.zeros(1, 4)
    W_Q1[0, ask], W_K1[0, find], W_V1[0, write] = beta, 1.0, 1.0     # at `ask`, is `find` visible?
    W_Q2, W_K2, W_V2 = torch.zeros(1, 5), torch.zeros(1, 5), torch.zeros(1, 5)
    W_Q2[0, 3], W_K2[0, layer2_key], W_V2[0, 4] = beta, 1.0, 1.0     # the question finds it and reads h1
    return W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, torch.tensor([w]), b


def order_ref(T_max):
    """Layer 1 at B: is A visible (before B)? Layer 2 at the question reads that record at B."""
    return _order_weights(math.log(T_max) + 4)


def _layer_2_only(T_max):                                # layer 1 writes nothing: order-blind
    W_Q1, W_K1, W_V1, *rest = order_ref(T_max)
    return (W_Q1, W_K1, 0 * W_V1, *rest)


def _inverted_order(T_max):
    return _order_weights(math.log(T_max) + 4, w=-1.0, b=0.5)


def _blunt_order(T_max):
    return _order_weights(4.0)


def _records_at_the_wrong_token(T_max):                  # layer 1 asks at A for B, layer 2 reads at B
    return _order_weights(math.log(T_max) + 4, ask=1, find=2, write=2)


def _no_record_in_layer_2(T_max):                        # layer 2 reads the token only, not h1
    W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b = order_ref(T_max)
    return W_Q1, W_K1, W_V1, W_Q2[:, :4], W_K2[:, :4], W_V2[:, :4], w, b


@pytest.mark.parametrize(("wrong", "message"), [
    (_layer_2_only, "does not change when A and B swap"), (_inverted_order, "inverted"),
    (_blunt_order, "grow with T_max"), (_records_at_the_wrong_token, "for example"),
    (_no_record_in_layer_2, "layer 2 reads [x_t; h1_t]"),
], ids=["layer-2-only", "inverted", "blunt", "wrong-token", "no-record"])
def test_04_order_from_the_mask(wrong, message, capsys):
    _check_rejects("04.order_from_the_mask", order_ref, wrong, message, capsys)


def test_04_one_causal_layer_is_order_blind():
    """Section 7's claim, which the exercise relies on: with layer 1 writing nothing, no layer 2 tells
    the order, whatever its weights."""
    from tfmlib.exercises.ch04 import _order_answers, _order_sequences, _swapped
    g = torch.Generator().manual_seed(1)
    ids, _ = _order_sequences(8, 32, g)
    for _ in range(5):
        W = [torch.randn(2, 4, generator=g, dtype=torch.double) for _ in range(2)] + \
            [torch.zeros(1, 4, dtype=torch.double)] + \
            [torch.randn(2, 5, generator=g, dtype=torch.double) for _ in range(3)]
        weights = (*W, torch.randn(2, generator=g, dtype=torch.double), torch.tensor(0.1, dtype=torch.double))
        assert torch.equal(_order_answers(weights, ids), _order_answers(weights, _swapped(ids)))


# ----------------------------------------------------------------------------- hints


def test_04_hints_give_no_code():
    _hint_gives_no_code("04.xor_two_heads", ["log(", "torch.", "beta =", "W_Q[", "- 1.5", "zeros"])
    _hint_gives_no_code("04.linear_attention_recurrence", ["S +", "z +", "torch.", "[:, :, None", "@"])
    _hint_gives_no_code("04.order_from_the_mask", ["log(", "torch.", "W_Q1[", "zeros", "= 1"])
    for name in exercises.names(4):
        hint = exercises.hint(name)
        assert len(hint) > 80 and "section" in hint.lower(), f"{name}'s hint should say where to look"
        assert not any(c in hint for c in ("()", "==", "[:,")), f"{name}'s hint reads like code"

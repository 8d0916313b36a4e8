"""Exercise checkers accept the reference solutions and reject typical wrong answers.

One section per chapter; chapter 00's tests live in ``test_exercises_ch00.py``.
"""

import pytest
import torch

from tfmlib import exercises

# ----------------------------------------------------------------------------- the check() API


def _stub(*args):
    raise NotImplementedError


def test_check_api_never_raises_without_must_pass(capsys):
    for name in exercises.names(1):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out
        with pytest.raises(exercises.ExerciseFailed, match="not solved yet"):
            exercises.check(name, _stub, must_pass=True)


def test_unknown_exercise_is_a_key_error():
    with pytest.raises(KeyError, match="no exercise named"):
        exercises.check("01.no_such_exercise", _stub)


def test_chapter_01_exercises_are_registered():
    assert exercises.names(1) == ["01.gates_for_weights", "01.gru_step_reset_before",
                                  "01.reset_before_as_nn_gru"]


def _accepts(name, fn):
    assert exercises.check(name, fn, must_pass=True)


def _rejects(name, fn):
    assert not exercises.check(name, fn)
    with pytest.raises(exercises.ExerciseFailed):
        exercises.check(name, fn, must_pass=True)


def _hint_gives_no_code(name, code_fragments):
    """A hint says where to look; it does not hand over the solution's code."""
    hint = exercises.hint(name)
    for code in code_fragments:
        assert code not in hint, f"{name}'s hint gives away code: {code!r} in {hint!r}"


# ----------------------------------------------------------------------------- 01.gru_step_reset_before


def _gru_parts(x, h, W_ih, W_hh, b_ih, b_hh):
    W_ir, W_iz, W_in = W_ih.chunk(3)
    W_hr, W_hz, W_hn = W_hh.chunk(3)
    b_ir, b_iz, b_in = b_ih.chunk(3)
    b_hr, b_hz, b_hn = b_hh.chunk(3)
    r = torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
    z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
    return r, z, x @ W_in.T + b_in, W_hn, b_hn


def reset_before_ref(x, h, *w):
    """Cho et al. (2014, eq. 8): the reset gate multiplies h before the product with W_hn."""
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return (1 - z) * torch.tanh(xn + (r * h) @ W_hn.T + b_hn) + z * h


def reset_after(x, h, *w):
    """What nn.GRU computes."""
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return (1 - z) * torch.tanh(xn + r * (h @ W_hn.T + b_hn)) + z * h


def reset_before_flipped_z(x, h, *w):
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return z * torch.tanh(xn + (r * h) @ W_hn.T + b_hn) + (1 - z) * h


def reset_before_gates_bias(x, h, *w):
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return (1 - z) * torch.tanh(xn + (r * h) @ W_hn.T + r * b_hn) + z * h


def reset_before_no_reset(x, h, *w):
    _, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return (1 - z) * torch.tanh(xn + h @ W_hn.T + b_hn) + z * h


def reset_before_swapped_gate_order(x, h, W_ih, W_hh, b_ih, b_hh):
    def swap(t):
        a, b, c = t.chunk(3)
        return torch.cat([b, a, c])
    return reset_before_ref(x, h, swap(W_ih), swap(W_hh), swap(b_ih), swap(b_hh))


def reset_before_untransposed(x, h, *w):
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return (1 - z) * torch.tanh(xn + (r * h) @ W_hn + b_hn) + z * h


@pytest.mark.parametrize("wrong", [reset_after, reset_before_flipped_z, reset_before_gates_bias,
                                   reset_before_no_reset, reset_before_swapped_gate_order,
                                   reset_before_untransposed, lambda *a: reset_before_ref(*a)[0],
                                   lambda *a: reset_before_ref(*a).tolist()])
def test_01_gru_step_reset_before(wrong):
    _accepts("01.gru_step_reset_before", reset_before_ref)
    _rejects("01.gru_step_reset_before", wrong)


@pytest.mark.parametrize(("wrong", "says"), [
    (reset_after, "reset-after form"),
    (reset_after, "linear_before_reset"),
    (reset_before_flipped_z, "swapped the roles of z"),
    (reset_before_gates_bias, "multiplies b_hn too"),
])
def test_01_gru_step_reset_before_names_the_mistake(capsys, wrong, says):
    exercises.check("01.gru_step_reset_before", wrong)
    assert says in capsys.readouterr().out


def test_01_reset_before_differs_from_nn_gru():
    """The two placements are different functions: nn.GRUCell with the same weights is rejected."""
    def nn_gru_cell(x, h, W_ih, W_hh, b_ih, b_hh):
        cell = torch.nn.GRUCell(x.shape[1], h.shape[1])
        with torch.no_grad():
            for p, t in zip((cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh),
                            (W_ih, W_hh, b_ih, b_hh), strict=True):
                p.copy_(t)
            return cell(x, h)
    _rejects("01.gru_step_reset_before", nn_gru_cell)



def test_01_reset_before_step_is_cho_et_al():
    """Chapter 01 shows reset-before vs nn.GRU with the checkers' reference: it must be Cho et al.'s form,
    and differ from nn.GRUCell with the same weights unless W_hn is zero."""
    from tfmlib.exercises.ch01 import reset_before_step

    g = torch.Generator().manual_seed(3)
    x, h = torch.randn(4, 5, generator=g), torch.randn(4, 6, generator=g)
    w = (torch.randn(18, 5, generator=g), torch.randn(18, 6, generator=g),
         torch.randn(18, generator=g), torch.randn(18, generator=g))
    assert torch.allclose(reset_before_step(x, h, w), reset_before_ref(x, h, *w), atol=1e-6), \
        "reset_before_step should compute W_hn (r * h) + b_hn"
    cell = torch.nn.GRUCell(5, 6)
    with torch.no_grad():
        for p, t in zip((cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh), w, strict=True):
            p.copy_(t)
        assert (cell(x, h) - reset_before_step(x, h, w)).abs().max() > 1e-2, \
            "nn.GRUCell (reset-after) should differ from the reset-before reference"
        w_no_hn = (w[0], torch.cat([w[1][:12], torch.zeros(6, 6)]), w[2], w[3].clone())
        w_no_hn[3][12:] = 0  # no W_hn and no b_hn: nothing for the reset gate to act on
        cell.weight_hh.copy_(w_no_hn[1])
        cell.bias_hh.copy_(w_no_hn[3])
        assert torch.allclose(cell(x, h), reset_before_step(x, h, w_no_hn), atol=1e-6), \
            "with W_hn = 0 and b_hn = 0 the two placements should agree"


# ----------------------------------------------------------------------------- 01.reset_before_as_nn_gru


def _is_diagonal(m):
    return torch.equal(m, torch.diag(torch.diagonal(m)))


def convert_ref(W_ih, W_hh, b_ih, b_hh):
    H = W_hh.shape[1]
    if not _is_diagonal(W_hh[2 * H:]):
        raise ValueError("W_hn has off-diagonal entries: no nn.GRU weights compute this cell")
    b_ih, b_hh = b_ih.clone(), b_hh.clone()
    b_ih[2 * H:] += b_hh[2 * H:]  # b_hn moves out of the reset gate's reach
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


def convert_unchanged(W_ih, W_hh, b_ih, b_hh):
    if not _is_diagonal(W_hh[2 * W_hh.shape[1]:]):
        raise ValueError("not diagonal")
    return W_ih, W_hh, b_ih, b_hh  # forgets that r would gate b_hn


def convert_never_raises(W_ih, W_hh, b_ih, b_hh):
    H = W_hh.shape[1]
    b_ih, b_hh = b_ih.clone(), b_hh.clone()
    b_ih[2 * H:] += b_hh[2 * H:]
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


def convert_always_raises(*w):
    raise ValueError("nn.GRU cannot do it")


def convert_drops_b_hn(W_ih, W_hh, b_ih, b_hh):
    H = W_hh.shape[1]
    if not _is_diagonal(W_hh[2 * H:]):
        raise ValueError("not diagonal")
    b_hh = b_hh.clone()
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


def convert_bias_to_wrong_block(W_ih, W_hh, b_ih, b_hh):
    H = W_hh.shape[1]
    if not _is_diagonal(W_hh[2 * H:]):
        raise ValueError("not diagonal")
    b_ih, b_hh = b_ih.clone(), b_hh.clone()
    b_ih[:H] += b_hh[2 * H:]  # into the reset gate's block
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


@pytest.mark.parametrize("wrong", [convert_unchanged, convert_never_raises, convert_always_raises,
                                   convert_drops_b_hn, convert_bias_to_wrong_block,
                                   lambda *w: convert_ref(*w)[:3], lambda *w: list(convert_ref(*w)[::-1])])
def test_01_reset_before_as_nn_gru(wrong):
    _accepts("01.reset_before_as_nn_gru", convert_ref)
    _rejects("01.reset_before_as_nn_gru", wrong)


@pytest.mark.parametrize(("wrong", "says"), [
    (convert_never_raises, "off-diagonal"),
    (convert_always_raises, "exact nn.GRU equivalent"),
    (convert_unchanged, "wrong values"),
])
def test_01_reset_before_as_nn_gru_messages(capsys, wrong, says):
    exercises.check("01.reset_before_as_nn_gru", wrong)
    assert says in capsys.readouterr().out


# ----------------------------------------------------------------------------- 01.gates_for_weights


def gates_ref(w):
    P = w.cumsum(0)  # P[i] = w_0 + ... + w_i = the product of the gates after step i
    return torch.where(P[1:] > 0, P[:-1] / P[1:].clamp_min(1e-300), torch.ones_like(P[1:]))


def gates_nan_at_zero(w):
    P = w.cumsum(0)
    return P[:-1] / P[1:]


def gates_are_the_weights(w):
    return w[1:]


def gates_one_minus_weights(w):
    return 1 - w[1:]


def gates_suffix_sums(w):
    """Uses the weights after i instead of up to i."""
    P = w.flip(0).cumsum(0).flip(0)
    return torch.where(P[:-1] > 0, P[1:] / P[:-1].clamp_min(1e-300), torch.ones_like(P[1:]))


def gates_are_the_products(w):
    """Returns P_{i-1} itself, the product of the gates, instead of the gate."""
    return w.cumsum(0)[:-1]


@pytest.mark.parametrize("wrong", [gates_nan_at_zero, gates_are_the_weights, gates_one_minus_weights,
                                   gates_suffix_sums, gates_are_the_products, lambda w: gates_ref(w).T,
                                   lambda w: gates_ref(w) * 2 - 0.5])
def test_01_gates_for_weights(wrong):
    _accepts("01.gates_for_weights", gates_ref)
    _rejects("01.gates_for_weights", wrong)


def test_01_gates_for_weights_reproduce_with_the_package_formula():
    from tfmlib.rnn import unrolled_gru_weights
    w = torch.distributions.Dirichlet(torch.ones(9)).sample((4,)).T.double()
    assert torch.allclose(unrolled_gru_weights(gates_ref(w)), w, atol=1e-12)


def test_01_gates_for_weights_names_nan(capsys):
    exercises.check("01.gates_for_weights", gates_nan_at_zero)
    assert "0 / 0" in capsys.readouterr().out


def test_01_hints_give_no_code():
    for name in exercises.names(1):
        _hint_gives_no_code(name, ["chunk", "sigmoid(", "tanh(", "cumsum", "cumprod", "@", ".T", "r * h",
                                   "torch.", "diag(", "P[", "z_i =", "/ P"])

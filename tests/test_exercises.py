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
    assert exercises.names(1) == ["01.gru_step", "01.rnn_step", "01.unrolled_weights"]


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


# ----------------------------------------------------------------------------- 01.rnn_step


def rnn_step_ref(x, h, W_xh, W_hh, b):
    return torch.tanh(x @ W_xh.T + h @ W_hh.T + b)


@pytest.mark.parametrize("wrong", [
    lambda x, h, W_xh, W_hh, b: x @ W_xh.T + h @ W_hh.T + b,                  # no tanh
    lambda x, h, W_xh, W_hh, b: torch.tanh(x @ W_xh.T + h @ W_hh + b),        # W_hh not transposed
    lambda x, h, W_xh, W_hh, b: torch.tanh(x @ W_xh.T + b),                   # forgets h
    lambda x, h, W_xh, W_hh, b: torch.sigmoid(x @ W_xh.T + h @ W_hh.T + b),   # wrong non-linearity
    lambda x, h, W_xh, W_hh, b: torch.tanh(x @ W_xh.T + h @ W_hh.T + b)[0],   # wrong shape
    lambda x, h, W_xh, W_hh, b: torch.tanh(x @ W_xh.T + h @ W_hh.T + b).tolist(),  # not a tensor
], ids=["no-tanh", "untransposed", "no-h", "sigmoid", "shape", "list"])
def test_01_rnn_step(wrong):
    _accepts("01.rnn_step", rnn_step_ref)
    _rejects("01.rnn_step", wrong)


# ----------------------------------------------------------------------------- 01.gru_step


def _gru_parts(x, h, W_ih, W_hh, b_ih, b_hh):
    W_ir, W_iz, W_in = W_ih.chunk(3)
    W_hr, W_hz, W_hn = W_hh.chunk(3)
    b_ir, b_iz, b_in = b_ih.chunk(3)
    b_hr, b_hz, b_hn = b_hh.chunk(3)
    r = torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
    z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
    n = torch.tanh(x @ W_in.T + b_in + r * (h @ W_hn.T + b_hn))
    return r, z, n, (W_in, W_hn, b_in, b_hn)


def gru_step_ref(x, h, W_ih, W_hh, b_ih, b_hh):
    _, z, n, _ = _gru_parts(x, h, W_ih, W_hh, b_ih, b_hh)
    return (1 - z) * n + z * h


def gru_flipped(x, h, *w):
    _, z, n, _ = _gru_parts(x, h, *w)
    return z * n + (1 - z) * h


def gru_no_reset(x, h, *w):
    _, z, _, (W_in, W_hn, b_in, b_hn) = _gru_parts(x, h, *w)
    n = torch.tanh(x @ W_in.T + b_in + h @ W_hn.T + b_hn)
    return (1 - z) * n + z * h


def gru_reset_before_matmul(x, h, *w):
    """Cho et al.'s original placement: r * h inside the product (not what nn.GRU computes)."""
    r, z, _, (W_in, W_hn, b_in, b_hn) = _gru_parts(x, h, *w)
    n = torch.tanh(x @ W_in.T + b_in + (r * h) @ W_hn.T + b_hn)
    return (1 - z) * n + z * h


def gru_swapped_gate_order(x, h, W_ih, W_hh, b_ih, b_hh):
    def swap(t):
        a, b, c = t.chunk(3)
        return torch.cat([b, a, c])
    return gru_step_ref(x, h, swap(W_ih), swap(W_hh), swap(b_ih), swap(b_hh))


def gru_returns_candidate(x, h, *w):
    return _gru_parts(x, h, *w)[2]


def gru_returns_stack(x, h, *w):
    return torch.stack([gru_step_ref(x, h, *w)])


@pytest.mark.parametrize("wrong", [gru_flipped, gru_no_reset, gru_reset_before_matmul,
                                   gru_swapped_gate_order, gru_returns_candidate, gru_returns_stack])
def test_01_gru_step(wrong):
    _accepts("01.gru_step", gru_step_ref)
    _rejects("01.gru_step", wrong)


def test_01_gru_step_explains_the_flipped_convention(capsys):
    exercises.check("01.gru_step", gru_flipped)
    assert "swapped the roles of z" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 01.unrolled_weights


def unrolled_ref(z):
    T, H = z.shape
    w = torch.empty(T + 1, H)
    w[0] = z.prod(dim=0)
    for i in range(1, T + 1):
        w[i] = (1 - z[i - 1]) * z[i:].prod(dim=0)
    return w


def unrolled_off_by_one(z):
    """Includes z_i in its own product: prod_{j>=i} instead of prod_{j>i}."""
    w = unrolled_ref(z)
    w[1:] = (1 - z) * z.flip(0).cumprod(0).flip(0)
    return w


def unrolled_prefix_products(z):
    """Multiplies the gates *before* i (the indexing some write-ups use) instead of after."""
    w = unrolled_ref(z)
    for i in range(1, z.shape[0] + 1):
        w[i] = (1 - z[i - 1]) * z[: i - 1].prod(dim=0)
    return w


def unrolled_without_h0(z):
    return unrolled_ref(z)[1:]


def unrolled_flipped_gate(z):
    return unrolled_ref(1 - z)


def unrolled_normalised_softmax(z):
    return torch.softmax(unrolled_ref(z), dim=0)


@pytest.mark.parametrize("wrong", [unrolled_off_by_one, unrolled_prefix_products, unrolled_without_h0,
                                   unrolled_flipped_gate, unrolled_normalised_softmax,
                                   lambda z: unrolled_ref(z).T])
def test_01_unrolled_weights(wrong):
    _accepts("01.unrolled_weights", unrolled_ref)
    _rejects("01.unrolled_weights", wrong)


def test_01_unrolled_weights_package_version_is_accepted():
    from tfmlib.rnn import unrolled_gru_weights
    _accepts("01.unrolled_weights", unrolled_gru_weights)

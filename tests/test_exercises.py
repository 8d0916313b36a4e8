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
                                  "01.lstm_memory_weights", "01.reset_before_as_nn_gru"]


def _accepts(name, fn):
    assert exercises.check(name, fn, must_pass=True)


def _rejects(name, fn, says=None):
    """The checker rejects ``fn``; with ``says``, its message must contain that diagnosis."""
    verdict = exercises.check(name, fn)
    assert not verdict
    if says is not None:
        assert "not correct yet" in verdict.message and says in verdict.message, verdict.message
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


def reset_before_halfway(x, h, *w):
    """r multiplies the product W_hn h, with b_hn outside: neither form (review 2026-11-27, finding 6)."""
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return (1 - z) * torch.tanh(xn + r * (h @ W_hn.T) + b_hn) + z * h


def reset_before_returns_candidate(x, h, *w):
    r, z, xn, W_hn, b_hn = _gru_parts(x, h, *w)
    return torch.tanh(xn + (r * h) @ W_hn.T + b_hn)


def test_01_gru_step_reset_before_accepts_cho_et_al():
    _accepts("01.gru_step_reset_before", reset_before_ref)


@pytest.mark.parametrize(("wrong", "says"), [
    (reset_after, "reset-after form"),
    (reset_after, "linear_before_reset"),
    (reset_before_flipped_z, "swapped the roles of z"),
    (reset_before_gates_bias, "multiplies b_hn too"),
    (reset_before_no_reset, "reset gate is missing"),
    (reset_before_swapped_gate_order, "reset, update, candidate"),
    (reset_before_untransposed, "untransposed"),
    (reset_before_returns_candidate, "returned the candidate"),
    (reset_before_halfway, "halfway between the two"),
    (lambda *a: reset_before_ref(*a)[0], "has shape"),
    (lambda *a: reset_before_ref(*a).tolist(), "should be a torch.Tensor"),
], ids=["reset-after", "reset-after-names", "flipped-z", "reset-on-bias", "no-reset", "gate-order",
        "untransposed", "candidate", "halfway", "one-row", "list"])
def test_01_gru_step_reset_before_names_the_mistake(wrong, says):
    _rejects("01.gru_step_reset_before", wrong, says)


def test_01_reset_before_differs_from_nn_gru():
    """The two placements are different functions: nn.GRUCell with the same weights is rejected."""
    def nn_gru_cell(x, h, W_ih, W_hh, b_ih, b_hh):
        cell = torch.nn.GRUCell(x.shape[1], h.shape[1])
        with torch.no_grad():
            for p, t in zip((cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh),
                            (W_ih, W_hh, b_ih, b_hh), strict=True):
                p.copy_(t)
            return cell(x, h)
    _rejects("01.gru_step_reset_before", nn_gru_cell, "reset-after form")

def test_01_reset_before_step_is_cho_et_al():
    """The checkers' reference must be Cho et al.'s form, and differ from nn.GRUCell with the same weights
    unless W_hn is zero. It is private: no chapter may import it (it would answer exercise 1)."""
    from tfmlib.exercises import ch01
    reset_before_step = ch01._reset_before_step
    assert not hasattr(ch01, "reset_before_step")

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
    """Possible exactly when each row of W_hn has at most one nonzero entry: unit k of the reset-before
    cell then reads one gate, r_j, which nn.GRUCell's unit k computes if its reset row is unit j's."""
    H = W_hh.shape[1]
    nonzero = W_hh[2 * H:] != 0
    if (nonzero.sum(1) > 1).any():
        raise ValueError("a row of W_hn has two nonzero entries: no nn.GRU weights compute this cell")
    src = nonzero.int().argmax(1)  # row k's nonzero column (0 for an empty row: any gate will do)
    W_ih, W_hh, b_ih, b_hh = (t.clone() for t in (W_ih, W_hh, b_ih, b_hh))
    for t in (W_ih, W_hh, b_ih, b_hh):
        t[:H] = t[:H][src]  # unit k's reset gate becomes unit src[k]'s
    b_ih[2 * H:] += b_hh[2 * H:]  # b_hn moves out of the reset gate's reach
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


def convert_diagonal_only(W_ih, W_hh, b_ih, b_hh):
    """Right for a diagonal W_hn, but raises for one nonzero per row off the diagonal, which converts."""
    H = W_hh.shape[1]
    if not _is_diagonal(W_hh[2 * H:]):
        raise ValueError("W_hn has off-diagonal entries")
    return convert_ref(W_ih, W_hh, b_ih, b_hh)


def convert_bias_only_one_per_row(W_ih, W_hh, b_ih, b_hh):
    """Accepts one nonzero per row but only moves the bias: unit k stays gated by its own r_k."""
    H = W_hh.shape[1]
    if ((W_hh[2 * H:] != 0).sum(1) > 1).any():
        raise ValueError("two nonzero entries in a row")
    return convert_never_raises(W_ih, W_hh, b_ih, b_hh)


def convert_gates_by_column(W_ih, W_hh, b_ih, b_hh):
    """Re-indexes the reset gates the wrong way round: row k gets the gate of the unit whose row points
    at k (the inverse, which a swap hides but a repeated unit does not)."""
    H = W_hh.shape[1]
    nonzero = W_hh[2 * H:] != 0
    if (nonzero.sum(1) > 1).any():
        raise ValueError("two nonzero entries in a row")
    src = nonzero.int().argmax(0)
    W_ih, W_hh, b_ih, b_hh = (t.clone() for t in (W_ih, W_hh, b_ih, b_hh))
    for t in (W_ih, W_hh, b_ih, b_hh):
        t[:H] = t[:H][src]
    b_ih[2 * H:] += b_hh[2 * H:]
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


def _convert_if(test):
    """The bias move, guarded by a wrong test of whether a conversion exists (review 2026-11-27,
    finding 2)."""
    def convert(W_ih, W_hh, b_ih, b_hh):
        if not test(W_hh[2 * W_hh.shape[1]:]):
            raise ValueError("no conversion")
        return convert_ref(W_ih, W_hh, b_ih, b_hh) if _is_diagonal(W_hh[2 * W_hh.shape[1]:]) \
            else convert_never_raises(W_ih, W_hh, b_ih, b_hh)
    return convert


convert_if_symmetric = _convert_if(lambda M: torch.allclose(M, M.T))
convert_if_triangular = _convert_if(lambda M: torch.equal(M, M.triu()))
convert_if_some_zero = _convert_if(lambda M: bool((M == 0).any()))
convert_if_nearly_diagonal = _convert_if(lambda M: torch.allclose(M, torch.diag(M.diagonal()), atol=0.05))


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


def convert_counts_b_hn_twice(W_ih, W_hh, b_ih, b_hh):
    H = W_hh.shape[1]
    if not _is_diagonal(W_hh[2 * H:]):
        raise ValueError("not diagonal")
    b_ih = b_ih.clone()
    b_ih[2 * H:] += b_hh[2 * H:]  # moved, but also left where it was
    return W_ih, W_hh, b_ih, b_hh


def convert_returns_none_when_impossible(W_ih, W_hh, b_ih, b_hh):
    H = W_hh.shape[1]
    return convert_ref(W_ih, W_hh, b_ih, b_hh) if _is_diagonal(W_hh[2 * H:]) else None


def test_01_reset_before_as_nn_gru_accepts_the_bias_move():
    _accepts("01.reset_before_as_nn_gru", convert_ref)


def test_01_reset_before_as_nn_gru_one_per_row_converts_exactly():
    """The checker's one-nonzero-per-row case is a real conversion: nn.GRUCell with the converted weights
    computes the reset-before step to rounding, and with the bias moved alone it does not."""
    from tfmlib.exercises import ch01
    g = torch.Generator().manual_seed(0)
    W_hn, src = ch01._one_per_row(6, g)
    w = list(ch01._gru_weights(3, 6, g))
    w[1][12:] = W_hn
    x, h = torch.randn(5, 3, generator=g), torch.randn(5, 6, generator=g)

    def gru_cell(weights):
        cell = torch.nn.GRUCell(3, 6)
        with torch.no_grad():
            params = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
            for p, t in zip(params, weights, strict=True):
                p.copy_(t)
            return cell(x, h)
    want = reset_before_ref(x, h, *w)
    assert not torch.equal(src, torch.arange(6))
    assert torch.allclose(gru_cell(convert_ref(*w)), want, atol=1e-6)
    assert (gru_cell(convert_never_raises(*w)) - want).abs().max() > 1e-2


@pytest.mark.parametrize(("wrong", "says"), [
    (convert_unchanged, "weights unchanged"),
    (convert_drops_b_hn, "b_hn disappeared"),
    (convert_counts_b_hn_twice, "counted twice"),
    (convert_bias_to_wrong_block, "reset gate's block"),
    (convert_never_raises, "off-diagonal"),
    (convert_returns_none_when_impossible, "raise ValueError"),
    (convert_always_raises, "exact nn.GRU equivalent"),
    (convert_diagonal_only, "could nn.GRUCell's unit k compute that gate"),
    (convert_bias_only_one_per_row, "which weights compute that row"),
    (convert_gates_by_column, "reset-before cell with a W_hn with one nonzero entry per row"),
    (convert_if_symmetric, "symmetric W_hn"),
    (convert_if_triangular, "upper triangular"),
    (convert_if_some_zero, "upper triangular"),
    (convert_if_nearly_diagonal, "however small"),
    (lambda *w: convert_ref(*w)[:3], "tuple of four tensors"),
    (lambda *w: list(convert_ref(*w)[::-1]), "has shape"),
], ids=["unchanged", "dropped", "twice", "wrong-block", "never-raises", "none", "always-raises",
        "diagonal-only", "bias-only-one-per-row", "gates-by-column", "symmetric", "triangular", "some-zero",
        "nearly-diagonal", "three", "reversed"])
def test_01_reset_before_as_nn_gru_names_the_mistake(wrong, says):
    _rejects("01.reset_before_as_nn_gru", wrong, says)


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


def test_01_gates_for_weights_accepts_the_ratios():
    _accepts("01.gates_for_weights", gates_ref)


@pytest.mark.parametrize(("wrong", "says"), [
    (gates_nan_at_zero, "0 / 0"),
    (gates_are_the_weights, "weights w_1 ... w_T themselves"),
    (gates_one_minus_weights, "1 - w_i is not the gate"),
    (gates_suffix_sums, "wrong way in time"),
    (gates_are_the_products, "products of the gates"),
    (lambda w: gates_ref(w).T, "has shape"),
    (lambda w: gates_ref(w) * 2 - 0.5, "outside [0, 1]"),
    (lambda w: gates_ref(w).tolist(), "should return a torch.Tensor"),
], ids=["nan", "weights", "one-minus", "suffix", "products", "transposed", "scaled", "list"])
def test_01_gates_for_weights_names_the_mistake(wrong, says):
    _rejects("01.gates_for_weights", wrong, says)


def test_01_gates_for_weights_reproduce_with_the_package_formula():
    from tfmlib.rnn import unrolled_gru_weights
    w = torch.distributions.Dirichlet(torch.ones(9)).sample((4,)).T.double()
    assert torch.allclose(unrolled_gru_weights(gates_ref(w)), w, atol=1e-12)


# ----------------------------------------------------------------------------- 01.lstm_memory_weights


def lstm_weights_ref(f, i):
    """w_0 = f_1 ... f_T and w_k = i_k f_(k+1) ... f_T, by the recurrence run backwards."""
    T, H = f.shape
    rows, survive = [], torch.ones(H, dtype=f.dtype)
    for k in range(T, 0, -1):
        rows.append(i[k - 1] * survive)
        survive = survive * f[k - 1]
    return torch.stack([survive] + rows[::-1])


def lstm_as_gru(f, i):
    from tfmlib.rnn import unrolled_gru_weights
    return unrolled_gru_weights(f[None])[0]  # the GRU's weights with z = f: new content weighs 1 - f


def lstm_own_gate_included(f, i):
    T, H = f.shape
    return torch.stack([f.prod(0)] + [i[k - 1] * f[k - 1:].prod(0) for k in range(1, T + 1)])


def lstm_earlier_gates(f, i):
    T, H = f.shape
    return torch.stack([f.prod(0)] + [i[k - 1] * f[: k - 1].prod(0) for k in range(1, T + 1)])


def lstm_normalised(f, i):
    w = lstm_weights_ref(f, i)
    return w / w.sum(0)


def lstm_no_initial_memory(f, i):
    return lstm_weights_ref(f, i)[1:]


def lstm_initial_weight_zero(f, i):
    w = lstm_weights_ref(f, i)
    w[0] = 0
    return w


def lstm_weights_float32_loop(f, i):
    """Right, computed in float32 in place (review 2026-11-27, finding 3a)."""
    T, H = f.shape
    w = torch.zeros(T + 1, H)
    w[0] = 1.0
    for t in range(T):
        w[: t + 1] *= f[t].float()
        w[t + 1] = i[t].float()
    return w


def lstm_divide_products(f, i):
    """Total product over prefix product: NaN (0 / 0) where a forget gate is 0 (finding 3b)."""
    total, prefix = f.prod(0), f.cumprod(0)
    return torch.cat([total[None], i * total / prefix])


@pytest.mark.parametrize("right", [lstm_weights_ref, lambda f, i: lstm_weights_ref(f.float(), i.float()),
                                   lstm_weights_float32_loop], ids=["float64", "float32", "float32-loop"])
def test_01_lstm_memory_weights_accepts_the_products_of_later_forget_gates(right):
    _accepts("01.lstm_memory_weights", right)


@pytest.mark.parametrize(("wrong", "says"), [
    (lstm_as_gru, "GRU's weights with z = f"),
    (lstm_own_gate_included, "forget gate of step k itself"),
    (lstm_earlier_gates, "steps before k"),
    (lstm_normalised, "normalised"),
    (lstm_no_initial_memory, "row 0"),
    (lstm_initial_weight_zero, "initial memory c_0"),
    (lstm_divide_products, "0 / 0"),
    (lambda f, i: lstm_weights_ref(f, i).T, "has shape"),
    (lambda f, i: lstm_weights_ref(f, i).tolist(), "should be a torch.Tensor"),
], ids=["gru", "own-gate", "earlier-gates", "normalised", "no-c0-row", "c0-zero", "divide", "transposed",
        "list"])
def test_01_lstm_memory_weights_names_the_mistake(wrong, says):
    _rejects("01.lstm_memory_weights", wrong, says)


def test_01_lstm_memory_weights_reproduce_an_lstm_cell():
    """The reference weights rebuild c_T of a real nn.LSTMCell run from its gates and candidates."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(3, 4).double()
    xs, h, c0 = torch.randn(6, 1, 3, dtype=torch.double), torch.zeros(1, 4, dtype=torch.double), \
        torch.randn(1, 4, dtype=torch.double)
    c, fs, is_, gs = c0, [], [], []
    with torch.no_grad():
        for x in xs:
            pre = x @ cell.weight_ih.T + cell.bias_ih + h @ cell.weight_hh.T + cell.bias_hh
            i, f, g, _ = pre.chunk(4, 1)  # nn.LSTMCell's order: input, forget, candidate, output
            fs.append(torch.sigmoid(f)[0])
            is_.append(torch.sigmoid(i)[0])
            gs.append(torch.tanh(g)[0])
            h, c = cell(x, (h, c))
    w = lstm_weights_ref(torch.stack(fs), torch.stack(is_))
    rebuilt = w[0] * c0[0] + (w[1:] * torch.stack(gs)).sum(0)
    assert torch.allclose(rebuilt, c[0], atol=1e-12)


def test_01_hints_give_no_code():
    for name in exercises.names(1):
        _hint_gives_no_code(name, ["chunk", "sigmoid(", "tanh(", "cumsum", "cumprod", "@", ".T", "r * h",
                                   "torch.", "diag(", "P[", "z_i =", "/ P", "flip", "prod(", "f_j", "i_k *",
                                   "w_k =", "w_0 =", "ratio", "cumulative", "as a sum"])

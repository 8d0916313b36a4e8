"""Chapter 10 exercise checkers accept the reference solutions and reject typical wrong answers,
each with the message that names the mistake."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub

from tfmlib import exercises

NAMES = ["10.compensated_sum", "10.document_tiles", "10.merge_softmax_states", "10.skip_nonfinite_step"]


def _rejects_with(name, fn, *fragments):
    """The checker rejects ``fn`` and its message contains every fragment (the specific diagnosis)."""
    _rejects(name, fn)
    verdict = exercises.check(name, fn)
    for fragment in fragments:
        assert fragment in verdict.message, f"{name}: expected {fragment!r} in {verdict.message!r}"


def test_chapter_10_exercises_are_registered_and_never_raise(capsys):
    assert exercises.names(10) == NAMES

    for name in NAMES:
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        with pytest.raises(exercises.ExerciseFailed, match="not solved yet"):
            exercises.check(name, _stub, must_pass=True)
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "raised ZeroDivisionError" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_10_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("torch.", "exp(", "maximum", "max(", "sum(", "return ", "!=", "==", "<=", ">=",
                               "lambda", "def ", "where(", "isfinite", "any(", "all(", "- comp", "+ comp",
                               "(t -", "// ", "ceil", "[i", "[:", "no_grad", "sub_", "* flag", ".item"))


# ----------------------------------------------------------------------------- 10.merge_softmax_states


def merge_ref(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    shift = torch.where(m == -math.inf, torch.zeros_like(m), m)      # a row no key may see: no NaN
    a1, a2 = l1 * torch.exp(m1 - shift), l2 * torch.exp(m2 - shift)
    total = a1 + a2
    o = (a1[..., None] * o1 + a2[..., None] * o2) / torch.where(total > 0, total, 1.0)[..., None]
    return m, total, o


def merge_textbook(m1, l1, o1, m2, l2, o2):
    """Right wherever some key may be seen, NaN for a row masked in both blocks (the readers' answer
    that passed the old checker, and the old solution)."""
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


def _shift_of(m1, m2):
    m = torch.maximum(m1, m2)
    return m, torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _safe(total):
    return torch.where(total > 0, total, torch.ones_like(total))[..., None]


def merge_unshifted(m1, l1, o1, m2, l2, o2):
    """Exponentiates the maxes themselves: fine in float64 with scores up to 150, inf/NaN in float32
    with scores around 100 (review 2026-11-27-exercises-06-09-10, finding 12)."""
    m = torch.maximum(m1, m2)
    A1, A2 = l1 * torch.exp(m1), l2 * torch.exp(m2)
    A = A1 + A2
    total = torch.where(A > 0, A / torch.exp(m), torch.zeros_like(A))
    o = torch.where((A > 0)[..., None], (A1[..., None] * o1 + A2[..., None] * o2) / _safe(A),
                    torch.zeros_like(o1))
    return m, total, o


def merge_factor_only(m1, l1, o1, m2, l2, o2):         # o weighted by e^(m_k - m) without l_k
    m, shift = _shift_of(m1, m2)
    e1, e2 = torch.exp(m1 - shift), torch.exp(m2 - shift)
    return m, l1 * e1 + l2 * e2, (e1[..., None] * o1 + e2[..., None] * o2) / _safe(e1 + e2)


def merge_swapped(m1, l1, o1, m2, l2, o2):             # side 1's output with side 2's mass
    m, shift = _shift_of(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - shift), l2 * torch.exp(m2 - shift)
    return m, a1 + a2, (a2[..., None] * o1 + a1[..., None] * o2) / _safe(a1 + a2)


def merge_inverse_factor(m1, l1, o1, m2, l2, o2):      # e^(m - m_k) instead of e^(m_k - m)
    m, shift = _shift_of(m1, m2)
    e1 = torch.where(l1 > 0, torch.exp(shift - m1), torch.zeros_like(l1))
    e2 = torch.where(l2 > 0, torch.exp(shift - m2), torch.zeros_like(l2))
    a1, a2 = l1 * e1, l2 * e2
    return m, a1 + a2, (a1[..., None] * o1 + a2[..., None] * o2) / _safe(a1 + a2)


def merge_to_smaller_max(m1, l1, o1, m2, l2, o2):      # both sides moved to the smaller max
    m, _ = _shift_of(m1, m2)
    low = torch.minimum(m1, m2)
    low = torch.where(torch.isfinite(low), low, torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    a1, a2 = l1 * torch.exp(m1 - low), l2 * torch.exp(m2 - low)
    return m, a1 + a2, (a1[..., None] * o1 + a2[..., None] * o2) / _safe(a1 + a2)


def merge_float32_result(m1, l1, o1, m2, l2, o2):      # right values, returned in float32
    return tuple(t.float() for t in merge_ref(m1, l1, o1, m2, l2, o2))


def merge_logaddexp(m1, l1, o1, m2, l2, o2):
    """Right another way: log-sum-exp of each side, merged with logaddexp."""
    lse1, lse2 = m1 + torch.log(l1), m2 + torch.log(l2)
    lse = torch.logaddexp(lse1, lse2)
    m, shift = _shift_of(m1, m2)
    w1, w2 = torch.exp(lse1 - lse).nan_to_num(0.0), torch.exp(lse2 - lse).nan_to_num(0.0)
    return m, torch.exp(lse - shift), w1[..., None] * o1 + w2[..., None] * o2


def test_merge_accepts_a_logaddexp_merge():
    _accepts("10.merge_softmax_states", merge_logaddexp)


@pytest.mark.parametrize("answer, fragments", [
    (merge_unshifted, ("float32 with scores around 100", "overflows")),
    (merge_factor_only, ("factors e^(m_k - m) alone", "rescaled mass")),
    (merge_swapped, ("weights are swapped",)),
    (merge_inverse_factor, ("upside down",)),
    (merge_to_smaller_max, ("smaller of the two maxes",)),
    (merge_float32_result, ("states' dtype (torch.float64)", "torch.float32")),
])
def test_merge_names_the_second_readers_slips(answer, fragments):
    """Review 2026-11-27-exercises-06-09-10, findings 12, 16 and 24."""
    _rejects_with("10.merge_softmax_states", answer, *fragments)


def test_merge_checks_a_fully_masked_block():
    """A merge that is right on finite states but turns a row whose block is fully masked (m = -inf,
    l = 0) into NaN is rejected for that reason."""
    def merge_nan_on_masked(m1, l1, o1, m2, l2, o2):
        m, total, o = merge_ref(m1, l1, o1, m2, l2, o2)
        masked = (l1 == 0) | (l2 == 0)
        return m, total, torch.where(masked[..., None], torch.nan, o)

    _rejects_with("10.merge_softmax_states", merge_nan_on_masked, "all masked for a row", "NaN")


def test_merge_checks_a_row_masked_in_both_blocks():
    _rejects_with("10.merge_softmax_states", merge_textbook, "no key of either block", "NaN")

    def merge_zero_max(m1, l1, o1, m2, l2, o2):      # no NaN, but the empty row's max is made 0
        m, total, o = merge_ref(m1, l1, o1, m2, l2, o2)
        return torch.where(m == -math.inf, torch.zeros_like(m), m), total, o

    _rejects_with("10.merge_softmax_states", merge_zero_max, "masked in both blocks", "m = -inf")




# ----------------------------------------------------------------------------- 10.document_tiles


def _pairs(doc_ids):
    T = doc_ids.numel()
    return (doc_ids[:, None] == doc_ids[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()


def _any_per_tile(need, block_q, block_k):
    nq, nk = math.ceil(need.shape[0] / block_q), math.ceil(need.shape[1] / block_k)
    return torch.tensor([[bool(need[a * block_q:(a + 1) * block_q, b * block_k:(b + 1) * block_k].any())
                          for b in range(nk)] for a in range(nq)])


def document_tiles_ref(doc_ids, block_q, block_k):
    return _any_per_tile(_pairs(doc_ids), block_q, block_k)


def document_tiles_by_ranges(doc_ids, block_q, block_k):
    """The solution's way: contiguous documents, so compare the tiles' ranges of document ids."""
    T = doc_ids.numel()
    q0 = torch.arange(0, T, block_q)
    k0 = torch.arange(0, T, block_k)
    q_last, k_last = (q0 + block_q).clamp_max(T) - 1, (k0 + block_k).clamp_max(T) - 1
    meet = (doc_ids[q0][:, None] <= doc_ids[k_last][None, :]) \
        & (doc_ids[k0][None, :] <= doc_ids[q_last][:, None])
    return meet & (k0[None, :] <= q_last[:, None])


def _tiles_from_corners(doc_ids, block_q, block_k, causal):
    T = doc_ids.numel()
    q0, k0 = torch.arange(0, T, block_q), torch.arange(0, T, block_k)
    q_last = (q0 + block_q).clamp_max(T) - 1
    return (doc_ids[q0][:, None] == doc_ids[k0][None, :]) & causal(q0[:, None], q_last[:, None], k0[None, :])


def test_document_tiles_accept_the_solutions():
    _accepts("10.document_tiles", document_tiles_ref)
    _accepts("10.document_tiles", document_tiles_by_ranges)


def test_document_tiles_skip_tiles_that_change_nothing():
    """What the exercise claims: attention computed only on the needed tiles equals attention with the
    document-and-causal mask, and a causal-only kernel computes strictly more tiles on packed documents."""
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate([9, 14, 3, 6])])
    T, bq, bk = doc.numel(), 4, 8
    tiles = document_tiles_ref(doc, bq, bk)
    allowed = tiles.repeat_interleave(bq, 0)[:T].repeat_interleave(bk, 1)[:, :T]
    assert bool((_pairs(doc) <= allowed).all()), "every pair that attends lies in a computed tile"
    causal_tiles = _any_per_tile(torch.ones(T, T, dtype=torch.bool).tril(), bq, bk)
    assert int(tiles.sum()) < int(causal_tiles.sum())


@pytest.mark.parametrize("answer, fragments", [
    (lambda d, bq, bk: _any_per_tile(torch.ones(d.numel(), d.numel(), dtype=torch.bool).tril(), bq, bk),
     ("every tile on or below the diagonal",)),
    (lambda d, bq, bk: _any_per_tile(d[:, None] == d[None, :], bq, bk), ("above the diagonal",)),
    (lambda d, bq, bk: _tiles_from_corners(d, bq, bk, lambda i0, i_last, j0: j0 <= i_last),
     ("first query and first key only",)),
    (lambda d, bq, bk: document_tiles_by_ranges(d, bq, bk)
     & (torch.arange(0, d.numel(), bk)[None, :] <= torch.arange(0, d.numel(), bq)[:, None]),
     ("cross the diagonal",)),
    (lambda d, bq, bk: _any_per_tile(_pairs(d), bq, bk).T, ("rows must be the query blocks",)),
    (lambda d, bq, bk: _any_per_tile(_pairs(d), bq, bk)[: d.numel() // bq, : d.numel() // bk],
     ("last, shorter block",)),
    (lambda d, bq, bk: torch.tensor([[bool(_pairs(d)[a * bq:(a + 1) * bq, b * bk:(b + 1) * bk].all())
                                      for b in range(math.ceil(d.numel() / bk))]
                                     for a in range(math.ceil(d.numel() / bq))]),
     ("every pair attends",)),
    (lambda d, bq, bk: _pairs(d).tolist(), ("return a bool tensor",)),
])
def test_document_tiles_reject_wrong_answers_with_specific_messages(answer, fragments):
    _rejects_with("10.document_tiles", answer, *fragments)


def test_document_tiles_name_an_off_by_one_tile():
    """A tile whose first key comes right after the block's last query holds no attending pair."""
    def one_past(d, bq, bk):
        T = d.numel()
        q0, k0 = torch.arange(0, T, bq), torch.arange(0, T, bk)
        q_last = (q0 + bq).clamp_max(T) - 1
        return document_tiles_by_ranges(d, bq, bk) | (
            (k0[None, :] == q_last[:, None] + 1) & (d[k0][None, :] == d[q_last][:, None]))

    _rejects_with("10.document_tiles", one_past, "off by one", "above the diagonal")


# ----------------------------------------------------------------------------- 10.compensated_sum


def kahan_add(total, comp, x):
    y = x - comp                  # the value, corrected by what the last addition lost
    t = total + y                 # rounded: the low part of y may be lost
    return t, (t - total) - y     # what was added too much (exactly, in float16)


def neumaier_add(total, comp, x):
    """Neumaier's variant: the compensation is accumulated and added at the end; here the state's
    total is kept as the compensated one, so it is also accepted."""
    t = total + x
    lost = torch.where(total.abs() >= x.abs(), (total - t) + x, (x - t) + total)
    c = comp + lost
    s = t + c
    return s, c - (s - t)


def plain_add(total, comp, x):
    return total + x, comp


def kahan_unused(total, comp, x):
    t = total + x
    return t, (t - total) - x


def kahan_plus(total, comp, x):
    y = x + comp
    t = total + y
    return t, (t - total) - y


def kahan_flipped(total, comp, x):
    y = x - comp
    t = total + y
    return t, y - (t - total)


def float32_state(total, comp, x):
    return total.float() + x.float(), comp


_hidden = {"sum": None, "last": None}


def hidden_python_sum(total, comp, x):
    """Keeps the real sum in Python floats outside the state, and returns it rounded: exact, and
    forbidden. A call on a state it did not return starts a new sum."""
    if total is not _hidden["last"]:
        _hidden["sum"] = [0.0] * x.numel()
    _hidden["sum"] = [a + b for a, b in zip(_hidden["sum"], x.tolist(), strict=True)]
    _hidden["last"] = torch.tensor(_hidden["sum"], dtype=torch.half)
    return _hidden["last"], torch.zeros_like(comp)


def float32_inside(total, comp, x):
    """The state stays float16, the step computes in float32 (review finding 15): not float16
    arithmetic, which the exercise is about."""
    s32 = total.float() + x.float() + comp.float()
    s = s32.half()
    return s, (s32 - s.float()).half()


def neumaier_apart(total, comp, x):
    """Neumaier's algorithm as usually written: the total is the plain running sum and the
    compensation is added only at the end (review finding 14)."""
    s = total + x
    big = torch.where(total.abs() >= x.abs(), total, x)
    small = torch.where(total.abs() >= x.abs(), x, total)
    return s, comp + ((big - s) + small)


def twosum_add(total, comp, x):
    """Knuth's TwoSum for the rounding error, fed back as in Kahan's: right."""
    y = x - comp
    s = total + y
    b = s - total
    return s, -((total - (s - b)) + (y - b))


def test_compensated_sum_measures_against_the_magnitudes():
    """Kahan's bound is eps * sum|x_i| (Higham 4.3), not eps * |sum x_i|: on 20 seeds of the
    checker's signed case the reference stays within 0.2 of those units (against |sum| it was off by
    up to 64 units on 8 of them: review finding 13), and the plain sum stays far off where nothing
    cancels."""
    from tfmlib.exercises.ch10 import _ulps
    worst = []
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        values = (torch.randn(400, 8, generator=g) * torch.logspace(-4, 0, 8)).half()
        state = (torch.zeros(8, dtype=torch.half), torch.zeros(8, dtype=torch.half))
        for x in values:
            state = kahan_add(*state, x)
        worst.append(_ulps(state[0], values))
    assert max(worst) < 0.2, worst
    ones = torch.full((1200, 2), 1e-4).half()
    ones[0] = 1.0
    plain = ones.sum(0, dtype=torch.half) * 0
    for x in ones:
        plain = plain + x
    assert _ulps(plain, ones) > 50


def test_compensated_sum_accepts_kahan_and_neumaier():
    _accepts("10.compensated_sum", kahan_add)
    _accepts("10.compensated_sum", neumaier_add)
    _accepts("10.compensated_sum", twosum_add)


def test_kahan_in_float16_beats_the_plain_sum():
    values = torch.full((3000,), 1e-4).half()
    values[0] = 1.0
    plain = torch.zeros((), dtype=torch.half)
    state = (torch.zeros((), dtype=torch.half), torch.zeros((), dtype=torch.half))
    for x in values:
        plain = plain + x
        state = kahan_add(*state, x)
    exact = values.double().sum()
    assert plain.item() == 1.0, "every 1e-4 is rounded away from 1.0 in float16"
    assert abs(state[0].double() - exact) < 1e-3 < abs(plain.double() - exact)


@pytest.mark.parametrize("answer, fragments", [
    (plain_add, ("plain float16 running sum",)),
    (kahan_unused, ("never used",)),
    (kahan_plus, ("wrong sign",)),
    (kahan_flipped, ("wrong sign",)),
    (float32_state, ("float32", "float16")),
    (hidden_python_sum, ("side by side", "besides (total, compensation)")),
    (float32_inside, ("computes in torch.float32", "float16 arithmetic")),
    (lambda total, comp, x: ((total.double() + x.double()).half(), comp), ("computes in torch.float64",)),
    (neumaier_apart, ("kept apart", "fold the compensation into the total")),
    (lambda total, comp, x: (total + x, comp, x), ("pair of tensors",)),
    (lambda total, comp, x: (total[:1] + x[:1], comp[:1]), ("keep the shape",)),
])
def test_compensated_sum_rejects_wrong_answers_with_specific_messages(answer, fragments):
    _rejects_with("10.compensated_sum", answer, *fragments)


# ----------------------------------------------------------------------------- 10.skip_nonfinite_step


def _finite_flag(params):
    return torch.stack([torch.isfinite(p.grad).all() for p in params if p.grad is not None]).all()


def sgd_step_unless_nonfinite(params, lr):
    finite = _finite_flag(params)
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.copy_(torch.where(finite, p - lr * p.grad, p))
    return finite


def _any_grad(params, test):
    return torch.stack([test(p.grad).any() for p in params if p.grad is not None]).any()


def _step_variant(update, flag=_finite_flag):
    def step(params, lr):
        ok = flag(params)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.copy_(update(p, p.grad, lr, ok))
        return ok
    return step


def step_with_if(params, lr):
    finite = _finite_flag(params)
    if finite:                              # a host read: on a GPU the host waits here
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= lr * p.grad
    return finite


def test_skip_nonfinite_step_accepts_the_solution():
    _accepts("10.skip_nonfinite_step", sgd_step_unless_nonfinite)


def step_via_equal(params, lr):
    """Decides in Python through torch.equal, which count_host_reads does not see (review finding 11)."""
    grads = [p.grad for p in params if p.grad is not None]
    ok = all(torch.equal(torch.isfinite(g), torch.ones_like(g, dtype=torch.bool)) for g in grads)
    with torch.no_grad():
        if ok:
            for p in params:
                if p.grad is not None:
                    p.sub_(lr * p.grad)
    return torch.tensor(ok)


def step_via_is_nonzero(params, lr):
    finite = _finite_flag(params)
    with torch.no_grad():
        if torch.is_nonzero(finite):        # a host read through C++, no Tensor method
            for p in params:
                if p.grad is not None:
                    p.sub_(lr * p.grad)
    return finite


def step_with_cpu_flag(params, lr):
    """Right on the CPU, but its flag starts as a 1-element CPU tensor, which a GPU (or meta)
    parameter cannot be combined with."""
    ok = torch.ones(1, dtype=torch.bool)
    for p in params:
        if p.grad is not None:
            ok = ok & torch.isfinite(p.grad).all()
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.copy_(torch.where(ok, p - lr * p.grad, p))
    return ok[0]


def test_skip_nonfinite_step_accepts_the_fused_flag_and_a_0d_start():
    def fused_flag(params, lr):
        grads = [p.grad.clone() for p in params if p.grad is not None]
        found = torch.zeros(1, device=grads[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.ones(1, device=found.device))
        ok = (found == 0).squeeze()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.copy_(torch.where(ok, p - lr * p.grad, p))
        return ok

    def flag_from_a_0d_true(params, lr):        # a 0-d CPU tensor combines with any device's tensors
        ok = torch.tensor(True)
        for p in params:
            if p.grad is not None:
                ok = ok & torch.isfinite(p.grad).all()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.copy_(torch.where(ok, p - lr * p.grad, p))
        return ok

    _accepts("10.skip_nonfinite_step", fused_flag)
    _accepts("10.skip_nonfinite_step", flag_from_a_0d_true)


@pytest.mark.parametrize("answer, fragments", [
    (step_with_if, ("read values back to the host", "__bool__")),
    (step_via_equal, ("read a value back to the host", "meta", "torch.equal")),
    (step_via_is_nonzero, ("read a value back to the host", "meta", "item()")),
    (step_with_cpu_flag, ("create any new tensor on the parameters' device",)),
    (_step_variant(lambda p, g, lr, ok: p - lr * g * ok), ("became NaN", "inf times 0")),
    (_step_variant(lambda p, g, lr, ok: torch.where(torch.isfinite(g).all(), p - lr * g, p)),
     ("only the parameter whose gradient",)),
    (_step_variant(lambda p, g, lr, ok: torch.where(torch.isfinite(g), p - lr * g, p)),
     ("only the non-finite entries",)),
    (_step_variant(lambda p, g, lr, ok: torch.where(ok, p - lr * g, p),
                   flag=lambda ps: ~_any_grad(ps, torch.isnan)),
     ("infinite", "inf and -inf are not finite")),
    (_step_variant(lambda p, g, lr, ok: torch.where(ok, p - lr * g, p),
                   flag=lambda ps: ~_any_grad(ps, torch.isinf)),
     ("NaN is not finite either",)),
    (_step_variant(lambda p, g, lr, ok: p - lr * torch.nan_to_num(g)), ("replaced by finite ones",)),
    (_step_variant(lambda p, g, lr, ok: torch.where(ok, p + lr * g, p)), ("stepped up the gradient",)),
    (lambda params, lr: (sgd_step_unless_nonfinite(params, lr), True)[1], ("0-d bool tensor",)),
    (lambda params, lr: ~sgd_step_unless_nonfinite(params, lr), ("your flag says the step was skipped",)),
    (lambda params, lr: sgd_step_unless_nonfinite(params, lr)[None], ("0-d bool tensor",)),
])
def test_skip_nonfinite_step_rejects_wrong_answers_with_specific_messages(answer, fragments):
    _rejects_with("10.skip_nonfinite_step", answer, *fragments)

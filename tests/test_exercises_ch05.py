"""Chapter 05 exercise checkers accept the reference solutions and reject typical wrong answers, each
with a message that names the mistake; their hints say where to look without giving the code."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub  # chapter 01's checker-test helpers

from tfmlib import exercises


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(5) == ["05.find_the_leak", "05.left_padded_causal", "05.merge_blocks"]
    for name in exercises.names(5):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


def _message(name, answer, capsys):
    assert not exercises.check(name, answer)
    return capsys.readouterr().out


# ----------------------------------------------------------------------------- 05.merge_blocks


def merge_ref(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    finite = torch.where(torch.isinf(m), torch.zeros_like(m), m)   # a row hidden in both blocks: m = -inf
    a1, a2 = l1 * torch.exp(m1 - finite), l2 * torch.exp(m2 - finite)
    l = a1 + a2
    return m, l, (a1[:, None] * o1 + a2[:, None] * o2) / l.clamp_min(torch.finfo(l.dtype).tiny)[:, None]


def _nan_when_both_hidden(m1, l1, o1, m2, l2, o2):  # right everywhere else; -inf - (-inf) = NaN
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    return m, a1 + a2, (a1[:, None] * o1 + a2[:, None] * o2) / (a1 + a2)[:, None]


def _float64_unshifted(m1, l1, o1, m2, l2, o2):   # no max shift, in a wider type: postpones the overflow
    w1, w2 = l1.double() * torch.exp(m1.double()), l2.double() * torch.exp(m2.double())
    o = (w1[:, None] * o1.double() + w2[:, None] * o2.double()) / (w1 + w2).clamp_min(1e-300)[:, None]
    m = torch.maximum(m1, m2)
    l = torch.where(torch.isinf(m), 0.0, (w1 + w2) / torch.exp(m.double()).clamp_min(1e-300))
    return m, l.float(), o.float()


def _float64_result(m1, l1, o1, m2, l2, o2):      # right values, the wrong dtype
    return tuple(t.double() for t in merge_ref(m1, l1, o1, m2, l2, o2))


def _average(m1, l1, o1, m2, l2, o2):
    m, l, _ = merge_ref(m1, l1, o1, m2, l2, o2)
    return m, l, (o1 + o2) / 2


def _no_rescale(m1, l1, o1, m2, l2, o2):
    m, _, _ = merge_ref(m1, l1, o1, m2, l2, o2)
    return m, l1 + l2, (l1[:, None] * o1 + l2[:, None] * o2) / (l1 + l2)[:, None]


def _first_max(m1, l1, o1, m2, l2, o2):           # exact in real numbers, overflows in float32
    a2 = l2 * torch.exp(m2 - m1)
    l = l1 + a2
    return m1, l, (l1[:, None] * o1 + a2[:, None] * o2) / l[:, None]


def _raw_exp(m1, l1, o1, m2, l2, o2):             # exp(m) itself: over- and underflows
    a1, a2 = l1 * torch.exp(m1), l2 * torch.exp(m2)
    return torch.maximum(m1, m2), a1 + a2, (a1[:, None] * o1 + a2[:, None] * o2) / (a1 + a2)[:, None]


def _unnormalised(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    return m, a1 + a2, a1[:, None] * o1 + a2[:, None] * o2


@pytest.mark.parametrize("wrong, message", [
    (_average, "plain average"), (_no_rescale, "different maxima"), (_first_max, "overflow"),
    (_raw_exp, "overflow"), (_unnormalised, "wrong values"), (_nan_when_both_hidden, "hidden in both blocks"),
    (_float64_unshifted, "only postpones"), (_float64_result, "return the blocks' dtype"),
], ids=["average", "no-rescale", "first-max", "raw-exp", "unnormalised", "nan-both-hidden",
        "float64-unshifted", "float64-result"])
def test_05_merge_blocks(wrong, message, capsys):
    _accepts("05.merge_blocks", merge_ref)
    _rejects("05.merge_blocks", wrong)
    assert message in _message("05.merge_blocks", wrong, capsys)


def test_05_merge_blocks_equals_attention_over_many_blocks():
    """The merge, folded over blocks of keys, is softmax attention over all of them (the checker's claim)."""
    g = torch.Generator().manual_seed(0)
    scores, values = 5 * torch.randn(4, 12, generator=g), torch.randn(12, 3, generator=g)
    m, l, o = None, None, None
    for block in range(0, 12, 3):
        e, v = scores[:, block:block + 3], values[block:block + 3]
        mb = e.max(-1).values
        p = torch.exp(e - mb[:, None])
        lb, ob = p.sum(-1), (p @ v) / p.sum(-1)[:, None]
        m, l, o = (mb, lb, ob) if m is None else merge_ref(m, l, o, mb, lb, ob)
    assert torch.allclose(o, torch.softmax(scores, -1) @ values, atol=1e-6)


# ----------------------------------------------------------------------------- 05.find_the_leak


def _changes(layer, T, d, trials, g, exact=True, one_at_a_time=True):
    """(T, T): True where changing input s (or every input from s on) changed output t < s."""
    found = torch.zeros(T, T, dtype=torch.bool)
    for s in range(1, T):
        for _ in range(trials):
            x = torch.randn(1, T, d, dtype=torch.double, generator=g)
            changed = x.clone()
            rows = slice(s, s + 1) if one_at_a_time else slice(s, T)
            changed[:, rows] = torch.randn(changed[:, rows].shape, dtype=torch.double, generator=g)
            before, after = layer(x)[0], layer(changed)[0]
            moved = (before != after).any(-1) if exact else ~torch.isclose(before, after).all(-1)
            found[:s, s] |= moved[:s]
    return found


def leaks_ref(layer, T, d):
    return _changes(layer, T, d, trials=20, g=torch.Generator().manual_seed(0))


def _jacobian(layer, T, d):                       # section 4's test: the layers give no gradients
    x = torch.randn(1, T, d, dtype=torch.double, requires_grad=True)
    J = torch.autograd.functional.jacobian(layer, x)[0, :, :, 0]
    return (J.abs().sum(dim=(1, 3)) > 0) & torch.ones(T, T, dtype=torch.bool).triu(1)


def _once(layer, T, d):                           # one change per input: misses the data-dependent leak
    return _changes(layer, T, d, trials=1, g=torch.Generator().manual_seed(0))


def _tolerance(layer, T, d):                      # "changed" above a tolerance: misses the tiny leak
    return _changes(layer, T, d, trials=20, g=torch.Generator().manual_seed(0), exact=False)


def _from_s_on(layer, T, d):                      # changes every input from s on at once
    return _changes(layer, T, d, trials=20, g=torch.Generator().manual_seed(0), one_at_a_time=False)


def _constant_probe(layer, T, d):                 # one hand-made input: ones, each input raised by 1
    x = torch.ones(1, T, d, dtype=torch.double)
    found = torch.zeros(T, T, dtype=torch.bool)
    for s in range(1, T):
        changed = x.clone()
        changed[0, s] += 1.0
        found[:s, s] = (layer(x)[0] != layer(changed)[0]).any(-1)[:s]
    return found


def _reaches_inside(layer, T, d):                 # tab completion on the layer: nothing to find
    forward = getattr(layer, "forward", None)
    if forward is None:
        raise AttributeError("the layer is a plain function")
    x = torch.randn(1, T, d, dtype=torch.double)
    J = torch.autograd.functional.jacobian(lambda i: forward(i, trigger_always=True), x)[0, :, :, 0]
    return (J.abs().sum(dim=(1, 3)) > 0) & torch.ones(T, T, dtype=torch.bool).triu(1)


def _transposed(layer, T, d):
    return leaks_ref(layer, T, d).T


def _next_only(layer, T, d):                      # looks only one step ahead
    return leaks_ref(layer, T, d) & torch.ones(T, T, dtype=torch.bool).triu(1).tril(1)


def _with_the_past(layer, T, d):                  # marks every dependence, earlier inputs included
    g, T_all = torch.Generator().manual_seed(0), torch.zeros(T, T, dtype=torch.bool)
    for s in range(T):
        x = torch.randn(1, T, d, dtype=torch.double, generator=g)
        changed = x.clone()
        changed[:, s] += 1.0
        T_all[:, s] = (layer(x)[0] != layer(changed)[0]).any(-1)
    return T_all


@pytest.mark.parametrize("wrong, message", [
    (_jacobian, "found none"), (_once, "only for some inputs"),
    (_tolerance, "not a difference above a tolerance"), (_from_s_on, "Change one input at a time"),
    (_transposed, "transposed"), (_next_only, "every later input"),
    (_with_the_past, "LATER input"), (_constant_probe, "only for some inputs"),
    (_reaches_inside, "AttributeError"),
], ids=["jacobian", "once", "tolerance", "from-s-on", "transposed", "next-only", "with-the-past", "constant",
        "reaches-inside"])
def test_05_find_the_leak(wrong, message, capsys):
    _accepts("05.find_the_leak", leaks_ref)
    _rejects("05.find_the_leak", wrong)
    assert message in _message("05.find_the_leak", wrong, capsys)


def test_05_find_the_leak_layers_are_what_they_claim():
    """Every planted bug leaks, the correct layer does not, the value bug has zero weights above the
    diagonal (question 4's bug), the layers give no gradients, and the data bug leaks for some inputs
    only."""
    from tfmlib.exercises.ch05 import _CH05_BUGS, _ch05_true_leaks, _Ch05Layer
    for i, bug in enumerate(_CH05_BUGS):
        leaks = _ch05_true_leaks(_Ch05Layer(4, bug, seed=i), 6, 4)
        assert leaks.any() == (bug is not None), bug
    assert _ch05_true_leaks(_Ch05Layer(4, "values", seed=0), 6, 4).sum() == 5     # out_t reads x_(t+1)
    layer = _Ch05Layer(4, "data", seed=0)
    x = torch.randn(1, 6, 4, dtype=torch.double, requires_grad=True)
    assert not layer(x).requires_grad
    x = x.detach()
    x[0] = 1.0                                        # a constant input: the trigger stays closed
    changed = x.clone()
    changed[0, 3:] = 2.0
    assert torch.equal(layer(x)[0, :3], layer(changed)[0, :3])
    with pytest.raises(ValueError, match=r"\(1, T, d\)"):
        layer(torch.randn(2, 3, 4))


# ----------------------------------------------------------------------------- 05.left_padded_causal


def left_padded_ref(token_mask):
    T = token_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = token_mask[:, None, None, :] & token_mask[:, None, :, None] & causal
    return mask, (token_mask.long().cumsum(-1) - 1).clamp_min(0)


def _arange_positions(token_mask):
    mask, _ = left_padded_ref(token_mask)
    return mask, torch.arange(token_mask.shape[1]).expand(token_mask.shape)


def _negative_pads(token_mask):
    mask, _ = left_padded_ref(token_mask)
    return mask, token_mask.long().cumsum(-1) - 1


def _no_padding_mask(token_mask):
    T = token_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(token_mask.shape[0], 1, T, T)
    return causal, left_padded_ref(token_mask)[1]


def _not_causal(token_mask):
    mask = token_mask[:, None, None, :] & token_mask[:, None, :, None]
    return mask, left_padded_ref(token_mask)[1]


def _inverted(token_mask):
    mask, positions = left_padded_ref(token_mask)
    return ~mask, positions


def _pad_queries_see(token_mask):                 # pad keys hidden, but every query also sees itself
    T = token_mask.shape[1]
    mask = token_mask[:, None, None, :] | torch.eye(T, dtype=torch.bool)
    return mask & torch.ones(T, T, dtype=torch.bool).tril(), left_padded_ref(token_mask)[1]


def _sees_nothing(token_mask):                    # hides everything: no leak, and no attention either
    mask, positions = left_padded_ref(token_mask)
    return torch.zeros_like(mask), positions


@pytest.mark.parametrize("wrong, message", [
    (_arange_positions, "Number the real tokens from 0"), (_negative_pads, "position 0"),
    (_no_padding_mask, "attend to a pad"), (_not_causal, "later key"), (_inverted, "NOT allowed"),
    (_pad_queries_see, "padded query must see nothing"), (_sees_nothing, "every real key"),
], ids=["arange", "negative-pads", "no-padding", "not-causal", "inverted", "pad-queries", "empty"])
def test_05_left_padded_causal(wrong, message, capsys):
    _accepts("05.left_padded_causal", left_padded_ref)
    _rejects("05.left_padded_causal", wrong)
    assert message in _message("05.left_padded_causal", wrong, capsys)


def test_05_left_padded_batch_equals_the_unpadded_sentences():
    """With the reference mask and positions, attention over a left-padded batch gives each sentence the
    output it gets alone: what the exercise's answer is for."""
    from tfmlib.attention import MultiHeadAttention
    torch.manual_seed(0)
    d, T = 8, 5
    table, layer = torch.randn(T, d), MultiHeadAttention(d, 2)
    sentences = [torch.randn(n, d) for n in (5, 3, 1)]
    token_mask = torch.arange(T)[None, :] >= (T - torch.tensor([5, 3, 1]))[:, None]
    x = torch.zeros(3, T, d)
    for b, s in enumerate(sentences):
        x[b, T - len(s):] = s
    mask, positions = left_padded_ref(token_mask)
    out, _ = layer(x + table[positions], mask=mask)
    for b, s in enumerate(sentences):
        alone, _ = layer((s + table[: len(s)])[None], causal=True)
        assert torch.allclose(out[b, T - len(s):], alone[0], atol=1e-6)
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------- hints


def test_05_hints_give_no_code():
    _hint_gives_no_code("05.merge_blocks",
                        ["torch.maximum", "torch.exp(", "exp(m1 - m)", "max(m1, m2)", "l1 *"])
    _hint_gives_no_code("05.find_the_leak",
                        ["jacobian", "autograd", ".triu(", "torch.", "randn", "!=", "clone"])
    _hint_gives_no_code("05.left_padded_causal", ["cumsum", "clamp", ".tril(", "torch.", "[:, None"])
    for name in exercises.names(5):
        assert len(exercises.hint(name)) > 80, f"{name}'s hint should say where to look"
        assert not any(c in exercises.hint(name) for c in ("()", "==", "[:,")), \
            f"{name}'s hint reads like code"


def test_05_merge_of_hidden_block_is_the_other_block():
    """A fully hidden block (m = -inf, l = 0) leaves the other block's result unchanged, and two hidden
    blocks give (-inf, 0, 0)."""
    m2, l2, o2 = torch.tensor([1.5]), torch.tensor([2.0]), torch.tensor([[0.3, -0.2]])
    hidden = torch.tensor([-math.inf]), torch.tensor([0.0]), torch.zeros(1, 2)
    m, l, o = merge_ref(*hidden, m2, l2, o2)
    assert torch.equal(m, m2) and torch.equal(l, l2) and torch.allclose(o, o2)
    m, l, o = merge_ref(*hidden, *hidden)
    assert m.item() == -math.inf and l.item() == 0 and torch.equal(o, torch.zeros(1, 2))

"""Chapter 07 exercise checkers accept the reference solutions and reject typical wrong answers."""

import pytest
import torch
from test_exercises import (  # the helpers of chapter 01's checker tests
    _accepts,
    _hint_gives_no_code,
    _rejects,
    _stub,
)

from tfmlib import exercises


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(7) == ["07.decoder_masks", "07.find_bug", "07.norm_placement", "07.rms_norm"]
    for name in exercises.names(7):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["07.decoder_masks", "07.find_bug", "07.norm_placement", "07.rms_norm"])
def test_07_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("keepdim", "torch.", "sqrt(", "x.mean", "x + sublayer", "norm(x", "[:, None",
                               "tril", "return ", "allclose", "layer(", "clone", "randn", "== "))


# ----------------------------------------------------------------------------- 07.rms_norm


def rms_norm_ref(x, gamma, eps):
    return gamma * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)


def _centred(x):
    return x - x.mean(-1, keepdim=True)


def _rms_norm_module(x, gamma, eps):
    norm = torch.nn.RMSNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(gamma)
    return norm(x)


def test_07_rms_norm_restores_the_library_function():
    """The checker hides F.rms_norm while the answer runs, and puts it back afterwards."""
    before = (torch.nn.functional.rms_norm, torch.rms_norm)
    exercises.check("07.rms_norm", _rms_norm_module)
    exercises.check("07.rms_norm", lambda x, g, e: 1 / 0)
    assert (torch.nn.functional.rms_norm, torch.rms_norm) == before


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda x, g, e: g * _centred(x) / torch.sqrt((_centred(x) ** 2).mean(-1, keepdim=True) + e),
     "does not subtract the mean"),
    (lambda x, g, e: g * x / ((x ** 2).mean(-1, keepdim=True).sqrt() + e), "inside the square root"),
    (lambda x, g, e: g * x / torch.sqrt((x ** 2).sum(-1, keepdim=True) + e), "not their sum"),
    (lambda x, g, e: g * x / torch.sqrt((x ** 2).mean(0, keepdim=True) + e), "not over the batch"),
    (lambda x, g, e: g * x / ((x ** 2).mean(-1, keepdim=True) + e), "not by the mean square itself"),
    (lambda x, g, e: x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + e), "wrong values"),      # no gain
    (lambda x, g, e: rms_norm_ref(x, g, e) + g, "wrong values"),                   # a bias made of gamma
    (lambda x, g, e: torch.nn.functional.rms_norm(x, (x.shape[-1],), g, e), "yourself"),       # forbidden
    (_rms_norm_module, "yourself"),
], ids=["centred", "eps-outside", "sum", "batch-axis", "no-root", "no-gain", "extra-bias", "F.rms_norm",
        "nn.RMSNorm"])
def test_07_rms_norm(wrong, message, capsys):
    _accepts("07.rms_norm", rms_norm_ref)
    capsys.readouterr()
    _rejects("07.rms_norm", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 07.norm_placement


def placement_ref(layer, d):
    """Pre-LN: out(x) - x is what the sublayers add, computed from normalised inputs: for a large input
    it no longer depends on the input's scale. Post-LN: out(x) is bounded, so out(x) - x is about -x."""
    x = torch.randn(2, 5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3 + 1
    added = [layer(c * x) - c * x for c in (1e6, 1e8)]
    return "pre" if torch.allclose(added[0], added[1], rtol=1e-2, atol=1e-2) else "post"


def _placement_bounded(layer, d):  # post-LN: the output stays bounded however large the input
    x = torch.randn(2, 5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return "post" if layer(1000 * x).abs().max() < 100 else "pre"


def _unit_input(d):
    return torch.randn(2, 5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


def _placement_mean_zero(layer, d):
    return "post" if layer(_unit_input(d)).mean(-1).abs().max() < 1e-3 else "pre"


def _placement_unit_spread(layer, d):
    return "post" if ((layer(_unit_input(d)).std(-1, unbiased=False) - 1).abs() < 0.05).all() else "pre"


def _placement_near_input(layer, d):  # "the residual keeps the input": true if the sublayers add little
    x = _unit_input(d)
    return "pre" if (layer(x) - x).norm() < 0.5 * x.norm() else "post"


@pytest.mark.parametrize(("wrong", "message"), [
    (_placement_mean_zero, "biases' mean"),
    (_placement_unit_spread, "gains' spread"),
    (_placement_near_input, "not whether the output stays near the input"),
    (lambda layer, d: "post", "you answered 'post' for every layer"),
    (lambda layer, d: "pre" if placement_ref(layer, d) == "post" else "post", "opposite"),
    (lambda layer, d: placement_ref(layer, d) == "pre", "the string 'post' or 'pre'"),
    (lambda layer, d: "post" if torch.equal(layer(_unit_input(d)) - _unit_input(d),
                                            layer(2 * _unit_input(d)) - 2 * _unit_input(d)) else "pre",
     "you answered 'pre' for every layer"),                        # exact equality: eps and rounding
], ids=["mean-zero", "unit-spread", "near-input", "always-post", "swapped", "bool", "exact-equality"])
def test_07_norm_placement(wrong, message, capsys):
    _accepts("07.norm_placement", placement_ref)
    _accepts("07.norm_placement", _placement_bounded)
    capsys.readouterr()
    _rejects("07.norm_placement", wrong)
    assert message in capsys.readouterr().out


def test_07_norm_placement_boxes_are_the_package_layers():
    from tfmlib.exercises.ch07 import _ch07_encoder_box
    from tfmlib.transformer import EncoderLayer

    for norm_first in (False, True):
        torch.manual_seed(5)
        layer = EncoderLayer(16, 2, 32, dropout=0.0, norm_first=norm_first).double().eval()
        x = torch.randn(3, 4, 16, dtype=torch.float64)
        with torch.no_grad():
            assert torch.equal(_ch07_encoder_box(16, norm_first, 5)(x), layer(x)[0])


# ----------------------------------------------------------------------------- 07.find_bug


def _decoder_inputs(d):
    g = torch.Generator().manual_seed(0)
    y, memory = torch.randn(2, 5, d, generator=g), torch.randn(2, 6, d, generator=g)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 4:] = False                                      # the second source has two padded positions
    return y, memory, keep


def _changed(layer, y, memory, keep, out, rows=slice(None), cols=slice(None)):
    return not torch.allclose(layer(y, memory, keep)[rows, cols], out[rows, cols], atol=1e-6)


def find_bug_ref(layer, d, future=True, padding=True, cross=True, first_token=False, real_padding=False,
                 padded_far=False, constant_shift=False):
    y, memory, keep = _decoder_inputs(d)
    out = layer(y, memory, keep)
    g = torch.Generator().manual_seed(9)
    change = torch.full((d,), 1.0) if constant_shift else torch.randn(d, generator=g)
    if future:
        later = y.clone()
        if first_token:                             # wrong: changes the first token, watches the rest
            later[:, 0] += change
            if _changed(layer, later, memory, keep, out, cols=slice(1, None)):
                return "future"
        else:
            later[:, -1] += change                  # a later token: the outputs before it must not move
            if _changed(layer, later, memory, keep, out, cols=slice(None, -1)):
                return "future"
    if padding:
        garbage = memory.clone()
        if real_padding:                                     # wrong: changes a real source token
            garbage[:, 0] += 100.0
        else:
            garbage[~keep] = 100.0 * torch.randn(int((~keep).sum()), d)
        if _changed(layer, y, garbage, keep, out):
            return "padding"
    if cross:
        far = memory.clone()
        row = 1 if padded_far else 0                         # wrong: row 1's last source position is padding
        far[row, -1] += change
        if not _changed(layer, y, far, keep, out, rows=row, cols=0):
            return "cross-causal"
    return "ok"


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda layer, d: find_bug_ref(layer, d, first_token=True), "later outputs always depend on earlier"),
    (lambda layer, d: find_bug_ref(layer, d, real_padding=True), "changing a real source token"),
    (lambda layer, d: find_bug_ref(layer, d, cross=False), "its cross-attention is causal"),
    (lambda layer, d: find_bug_ref(layer, d, padding=False, cross=False), "reads the padded source"),
    (lambda layer, d: find_bug_ref(layer, d, padded_far=True), "is a real one"),
    (lambda layer, d: find_bug_ref(layer, d, future=False), "a leak from the future"),
    (lambda layer, d: find_bug_ref(layer, d, constant_shift=True), "vanishes in the centring"),
    (lambda layer, d: "ok", "you answered 'ok' for every layer"),
    (lambda layer, d: "leak", "return one of"),
], ids=["first-token", "real-padding", "no-cross-check", "future-only", "padded-far-token", "no-future-check",
        "constant-shift", "always-ok", "unknown-label"])
def test_07_find_bug(wrong, message, capsys):
    _accepts("07.find_bug", find_bug_ref)
    capsys.readouterr()
    _rejects("07.find_bug", wrong)
    assert message in capsys.readouterr().out


def test_07_find_bug_correct_box_is_the_decoder_layer():
    """The checker's bug-free layer is the package's DecoderLayer with padding_mask(src_keep)."""
    from tfmlib.attention import padding_mask
    from tfmlib.exercises.ch07 import _ch07_decoder_box
    from tfmlib.transformer import DecoderLayer

    y, memory, keep = (t.double() if t.is_floating_point() else t for t in _decoder_inputs(16))
    for norm_first in (False, True):
        torch.manual_seed(3)
        layer = DecoderLayer(16, 2, 32, dropout=0.0, norm_first=norm_first).double().eval()
        with torch.no_grad():
            want = layer(y, memory, padding_mask(keep), need_weights=True)[0]
        assert torch.equal(_ch07_decoder_box(16, "ok", norm_first, 3)(y, memory, keep), want)


# ----------------------------------------------------------------------------- 07.decoder_masks


def decoder_masks_ref(src_mask, tgt_mask):
    T = tgt_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return causal & tgt_mask[:, None, None, :], src_mask[:, None, None, :]


def _masks_3d(src_mask, tgt_mask):  # (B, T, T) and (B, T, S): also a valid form
    T = tgt_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return causal[None] & tgt_mask[:, None, :], src_mask[:, None, :].expand(-1, T, -1)


def _inverted(src_mask, tgt_mask):
    s, c = decoder_masks_ref(src_mask, tgt_mask)
    return ~s, ~c


def _causal_only(src_mask, tgt_mask):
    T = tgt_mask.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril(), src_mask[:, None, None, :]


def _no_causal(src_mask, tgt_mask):
    return tgt_mask[:, None, None, :], src_mask[:, None, None, :]


def _padding_on_queries(src_mask, tgt_mask):
    T = tgt_mask.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril() & tgt_mask[:, None, :, None], src_mask[:, None, None, :]


def _padding_on_queries_and_keys(src_mask, tgt_mask):
    s, c = decoder_masks_ref(src_mask, tgt_mask)
    return s & tgt_mask[:, None, :, None], c


def _causal_cross(src_mask, tgt_mask):
    T, S = tgt_mask.shape[1], src_mask.shape[1]
    s, _ = decoder_masks_ref(src_mask, tgt_mask)
    return s, src_mask[:, None, None, :] & torch.ones(T, S, dtype=torch.bool).tril()


def _float_masks(src_mask, tgt_mask):
    s, c = decoder_masks_ref(src_mask, tgt_mask)
    return s.float(), c.float()


@pytest.mark.parametrize(("wrong", "message"), [
    (_inverted, "inverted"),
    (_causal_only, "padded keys"),
    (_no_causal, "must be causal"),
    (_padding_on_queries, "masks the keys"),
    (_causal_cross, "not causal"),
    (_float_masks, "bool"),
    (lambda s, t: decoder_masks_ref(s, t)[0], "pair"),
    (_padding_on_queries_and_keys, "padded *queries*"),
], ids=["inverted", "causal-only", "no-causal", "padding-on-queries", "causal-cross", "float", "one-mask",
        "queries-and-keys"])
def test_07_decoder_masks(wrong, message, capsys):
    _accepts("07.decoder_masks", decoder_masks_ref)
    _accepts("07.decoder_masks", _masks_3d)
    capsys.readouterr()
    _rejects("07.decoder_masks", wrong)
    assert message in capsys.readouterr().out


def test_07_decoder_masks_reference_matches_the_decoder_layer():
    """The reference masks are what DecoderLayer applies (causal inside, target padding as self_mask)."""
    from tfmlib.attention import padding_mask
    from tfmlib.transformer import DecoderLayer

    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
    src_mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    tgt_mask = torch.tensor([[True] * 4, [True, True, True, False]])
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 5, 16)
    self_mask, cross_mask = decoder_masks_ref(src_mask, tgt_mask)
    _, self_w, cross_w = layer(x, memory, padding_mask(src_mask), padding_mask(tgt_mask), need_weights=True)
    assert torch.equal(self_w > 0, self_mask.expand_as(self_w))
    assert torch.equal(cross_w > 0, cross_mask.expand_as(cross_w))


def test_07_checkers_leave_the_readers_random_state_alone():
    """The checkers build their layers from seeds of their own; a check must not reseed the notebook."""
    torch.manual_seed(123)
    state = torch.get_rng_state()
    exercises.check("07.norm_placement", lambda layer, d: "post")
    exercises.check("07.find_bug", lambda layer, d: "ok")
    assert torch.equal(torch.get_rng_state(), state)

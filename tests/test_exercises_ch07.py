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
    assert exercises.names(7) == ["07.find_bug", "07.norm_placement", "07.packed_masks", "07.rms_norm"]
    for name in exercises.names(7):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["07.find_bug", "07.norm_placement", "07.packed_masks", "07.rms_norm"])
def test_07_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("keepdim", "torch.", "sqrt(", "x.mean", "x + sublayer", "norm(x", "[:, None",
                               "tril", "return ", "allclose", "layer(", "clone", "randn", "== ", "_seg",
                               "[:, :, None"))


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
    """The checker blocks the library's RMSNorm only while the answer runs."""
    before = (torch.nn.functional.rms_norm, torch.rms_norm)
    exercises.check("07.rms_norm", _rms_norm_module)
    exercises.check("07.rms_norm", lambda x, g, e: 1 / 0)
    assert (torch.nn.functional.rms_norm, torch.rms_norm) == before
    x, g = torch.randn(2, 4, dtype=torch.double), torch.ones(4, dtype=torch.double)
    torch.testing.assert_close(torch.nn.functional.rms_norm(x, (4,), g, 1e-6), rms_norm_ref(x, g, 1e-6))


def _rms_norm_float32(x, g, e):  # review 2026-11-27-exercises-04-05-07-08-11, finding 2
    x32 = x.float()
    return g * x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + e)


def _rms_norm_rsqrt(x, g, e):  # another correct form
    return g * x * torch.rsqrt((x * x).mean(-1, keepdim=True) + e)


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
    (lambda x, g, e: torch.ops.aten.rms_norm(x, [x.shape[-1]], g, e), "yourself"),     # finding 2b
    (lambda x, g, e: torch.rms_norm(x, [x.shape[-1]], g, e), "yourself"),
    (_rms_norm_float32, "float32's precision"),
    (lambda x, g, e: rms_norm_ref(x, g, e).float(), "return x's dtype"),
], ids=["centred", "eps-outside", "sum", "batch-axis", "no-root", "no-gain", "extra-bias", "F.rms_norm",
        "nn.RMSNorm", "aten-op", "torch.rms_norm", "float32-inside", "float32-result"])
def test_07_rms_norm(wrong, message, capsys):
    _accepts("07.rms_norm", rms_norm_ref)
    _accepts("07.rms_norm", _rms_norm_rsqrt)
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


# ----------------------------------------------------------------------------- 07.packed_masks


def packed_masks_ref(src_seg, tgt_seg):
    T = tgt_seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    self_mask = causal & (tgt_seg[:, :, None] == tgt_seg[:, None, :]) & (tgt_seg != 0)[:, None, :]
    cross_mask = (tgt_seg[:, :, None] == src_seg[:, None, :]) & (src_seg != 0)[:, None, :]
    return self_mask[:, None], cross_mask[:, None]


def _packed_3d_no_key_padding(src_seg, tgt_seg):  # (B, T, T), (B, T, S); padding differs in segment anyway
    T = tgt_seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return causal & (tgt_seg[:, :, None] == tgt_seg[:, None, :]), tgt_seg[:, :, None] == src_seg[:, None, :]


def _packed_padded_queries_blank(src_seg, tgt_seg):  # rows of padded queries all False: never used, accepted
    s, c = packed_masks_ref(src_seg, tgt_seg)
    real = (tgt_seg != 0)[:, None, :, None]
    return s & real, c & real


def _inverted(src_seg, tgt_seg):
    s, c = packed_masks_ref(src_seg, tgt_seg)
    return ~s, ~c


def _unpacked(src_seg, tgt_seg):  # chapter 05's causal & padding masks: the sentences see each other
    T = tgt_seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return causal & (tgt_seg != 0)[:, None, None, :], (src_seg != 0)[:, None, None, :]


def _segments_not_causal(src_seg, tgt_seg):
    _, c = packed_masks_ref(src_seg, tgt_seg)
    return ((tgt_seg[:, :, None] == tgt_seg[:, None, :]) & (tgt_seg != 0)[:, None, :])[:, None], c


def _cross_whole_row(src_seg, tgt_seg):
    s, _ = packed_masks_ref(src_seg, tgt_seg)
    return s, (src_seg != 0)[:, None, None, :]


def _cross_causal(src_seg, tgt_seg):
    s, c = packed_masks_ref(src_seg, tgt_seg)
    T, S = tgt_seg.shape[1], src_seg.shape[1]
    return s, c & torch.ones(T, S, dtype=torch.bool).tril()


def _cross_previous_too(src_seg, tgt_seg):  # an off-by-one in the segment comparison
    s, c = packed_masks_ref(src_seg, tgt_seg)
    return s, c | (((tgt_seg[:, :, None] - 1) == src_seg[:, None, :]) & (src_seg != 0)[:, None, :])[:, None]


def _cross_token_mask_2d(src_seg, tgt_seg):  # review finding 3: a (B, S) mask read as (T, S)
    s, _ = packed_masks_ref(src_seg, tgt_seg)
    return s, src_seg != 0


def _float_masks(src_seg, tgt_seg):
    s, c = packed_masks_ref(src_seg, tgt_seg)
    return s.float(), c.float()


@pytest.mark.parametrize(("wrong", "message"), [
    (_inverted, "inverted"),
    (_unpacked, "the sentence packed before it"),
    (_segments_not_causal, "not causal: position t"),
    (_cross_whole_row, "every real source token of its row"),
    (_cross_causal, "cross-attention is not causal"),
    (_cross_previous_too, "packed before its own too"),
    (_cross_token_mask_2d, "a 2-D mask is read as (queries, keys)"),
    (lambda s, t: (packed_masks_ref(s, t)[0].transpose(-1, -2), packed_masks_ref(s, t)[1]),
     "self_mask is wrong"),
    (_float_masks, "bool"),
    (lambda s, t: packed_masks_ref(s, t)[0], "pair"),
], ids=["inverted", "unpacked", "not-causal", "cross-whole-row", "cross-causal", "cross-previous", "cross-2d",
        "self-transposed", "float", "one-mask"])
def test_07_packed_masks(wrong, message, capsys):
    _accepts("07.packed_masks", packed_masks_ref)
    _accepts("07.packed_masks", _packed_3d_no_key_padding)
    _accepts("07.packed_masks", _packed_padded_queries_blank)
    capsys.readouterr()
    _rejects("07.packed_masks", wrong)
    assert message in capsys.readouterr().out


def test_07_packed_masks_named_mistakes_differ_in_every_case():
    """Each named mistake differs from the right masks on real query rows in every case (review finding 4)."""
    from tfmlib.exercises.ch07 import _CH07_PACKED_CASES, _ch07_packed_mistakes, _ch07_segments

    for case in _CH07_PACKED_CASES:
        S, T = max(sum(src) for src, _ in case) + 1, max(sum(tgt) for _, tgt in case) + 2
        assert len({len(case), S, T}) == 3, "B, S and T differ, so a transposed or 2-D mask cannot broadcast"
        src_seg, tgt_seg = _ch07_segments([s for s, _ in case], S), _ch07_segments([t for _, t in case], T)
        want_self, want_cross = packed_masks_ref(src_seg, tgt_seg)
        rows = (tgt_seg != 0)[:, None, :, None]
        self_wrong, cross_wrong = _ch07_packed_mistakes(src_seg, tgt_seg)
        for wrong in self_wrong.values():
            assert not torch.equal(wrong & rows, want_self & rows)
        for wrong in cross_wrong.values():
            assert not torch.equal(wrong & rows, want_cross & rows)


def test_07_packed_masks_make_each_pair_behave_as_if_alone():
    """With the reference masks, a DecoderLayer on a packed row gives each sentence pair the output it gets
    alone (the layer has no positions of its own); with chapter 05's masks it does not."""
    from tfmlib.transformer import DecoderLayer

    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32, dropout=0.0).double().eval()
    src_len, tgt_len = [3, 2, 4], [2, 4, 1]
    src_seg = torch.repeat_interleave(torch.arange(1, 4), torch.tensor(src_len))[None]
    tgt_seg = torch.repeat_interleave(torch.arange(1, 4), torch.tensor(tgt_len))[None]
    y, memory = torch.randn(1, sum(tgt_len), 16, dtype=torch.double), torch.randn(1, sum(src_len), 16,
                                                                                  dtype=torch.double)
    alone = torch.cat([layer(yk, mk)[0] for yk, mk in zip(y.split(tgt_len, 1), memory.split(src_len, 1),
                                                          strict=True)], dim=1)
    self_mask, cross_mask = packed_masks_ref(src_seg, tgt_seg)
    packed = layer(y, memory, cross_mask, self_mask)[0]
    torch.testing.assert_close(packed, alone)
    self_05, cross_05 = _unpacked(src_seg, tgt_seg)
    assert (layer(y, memory, cross_05, self_05)[0] - alone).abs().max() > 1e-3


def test_07_checkers_leave_the_readers_random_state_alone():
    """The checkers build their layers from seeds of their own; a check must not reseed the notebook."""
    torch.manual_seed(123)
    state = torch.get_rng_state()
    exercises.check("07.norm_placement", lambda layer, d: "post")
    exercises.check("07.find_bug", lambda layer, d: "ok")
    assert torch.equal(torch.get_rng_state(), state)

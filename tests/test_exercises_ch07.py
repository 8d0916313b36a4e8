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
    assert exercises.names(7) == ["07.decoder_masks", "07.rms_norm", "07.sublayer"]
    for name in exercises.names(7):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["07.decoder_masks", "07.rms_norm", "07.sublayer"])
def test_07_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("keepdim", "torch.", "sqrt(", "x.mean", "x + sublayer", "norm(x", "[:, None",
                               "tril", "return "))


# ----------------------------------------------------------------------------- 07.rms_norm


def rms_norm_ref(x, gamma, eps):
    return gamma * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)


def _centred(x):
    return x - x.mean(-1, keepdim=True)


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda x, g, e: g * _centred(x) / torch.sqrt((_centred(x) ** 2).mean(-1, keepdim=True) + e),
     "does not subtract the mean"),
    (lambda x, g, e: g * x / ((x ** 2).mean(-1, keepdim=True).sqrt() + e), "inside the square root"),
    (lambda x, g, e: g * x / torch.sqrt((x ** 2).sum(-1, keepdim=True) + e), "not their sum"),
    (lambda x, g, e: g * x / torch.sqrt((x ** 2).mean(0, keepdim=True) + e), "not over the batch"),
    (lambda x, g, e: g * x / ((x ** 2).mean(-1, keepdim=True) + e), "not by the mean square itself"),
    (lambda x, g, e: x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + e), "wrong values"),      # no gain
    (lambda x, g, e: rms_norm_ref(x, g, e) + g, "wrong values"),                   # a bias made of gamma
], ids=["centred", "eps-outside", "sum", "batch-axis", "no-root", "no-gain", "extra-bias"])
def test_07_rms_norm(wrong, message, capsys):
    _accepts("07.rms_norm", rms_norm_ref)
    _accepts("07.rms_norm", lambda x, g, e: torch.nn.functional.rms_norm(x, (x.shape[-1],), g, e))
    capsys.readouterr()
    _rejects("07.rms_norm", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 07.sublayer


def sublayer_ref(x, sublayer, norm, norm_first):
    return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda x, f, n, nf: sublayer_ref(x, f, n, not nf), "that is"),                      # the two swapped
    (lambda x, f, n, nf: n(x + f(x)), "that is post-LN"),                               # always post-LN
    (lambda x, f, n, nf: x + f(n(x)), "that is pre-LN"),                                # always pre-LN
    (lambda x, f, n, nf: f(n(x)) if nf else n(f(x)), "residual connection is missing"),
    (lambda x, f, n, nf: n(x + f(n(x))) if nf else n(x + f(x)), "leaves the residual sum alone"),
], ids=["swapped", "always-post", "always-pre", "no-residual", "pre-normalises-sum"])
def test_07_sublayer(wrong, message, capsys):
    _accepts("07.sublayer", sublayer_ref)
    capsys.readouterr()
    _rejects("07.sublayer", wrong)
    assert message in capsys.readouterr().out


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
], ids=["inverted", "causal-only", "no-causal", "padding-on-queries", "causal-cross", "float", "one-mask"])
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

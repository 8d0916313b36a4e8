"""Checkers for chapter 07 (the Transformer architecture).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("07.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .core import Wrong, checker, expect_close, mask_mismatch


def _rms_norm_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    g = torch.Generator().manual_seed(seed)
    shape = [(3, 8), (2, 5, 6), (4, 3, 2, 10), (1, 16)][seed % 4]
    x = torch.randn(*shape, generator=g, dtype=torch.double) * (1 + 3 * seed) + 2 * seed   # mean far from 0
    x[..., 0, :] = 1e-3 * torch.randn(shape[-1], generator=g, dtype=torch.double)           # nearly zero
    gamma = torch.randn(shape[-1], generator=g, dtype=torch.double)
    return x, gamma, [1e-5, 1e-3, 0.1, 1e-2][seed % 4]


def _rms_norm_mistakes(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    """What typical wrong versions of RMS normalisation return (for helpful messages)."""
    ms = (x ** 2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {
        "that is LayerNorm without its bias: RMSNorm does not subtract the mean, it divides x itself by "
        "its root mean square": gamma * centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + eps),
        "epsilon must go inside the square root: sqrt(mean square + eps), not sqrt(mean square) + eps":
            gamma * x / (ms.sqrt() + eps),
        "the statistic is the mean of the squares over the features, not their sum":
            gamma * x / torch.sqrt((x ** 2).sum(-1, keepdim=True) + eps),
        "the mean square is over the last axis (the features of one position), not over the batch":
            gamma * x / torch.sqrt((x ** 2).mean(0, keepdim=True) + eps),
        "divide by the root of the mean square, not by the mean square itself": gamma * x / (ms + eps),
    }


def _forbidden_rms_norm(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise Wrong("the exercise asks you to write RMSNorm yourself, without F.rms_norm or nn.RMSNorm (which "
                "calls it); the solutions compare yours with them")


@checker("07.rms_norm", hint="section 3's LayerNorm with two things left out, the centring and the "
         "bias: one statistic per vector instead of two. Ask over which axis it is taken, and where "
         "section 3 put eps")
def _check_rms_norm(rms_norm: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        x, gamma, eps = _rms_norm_case(seed)
        want = torch.nn.functional.rms_norm(x, (x.shape[-1],), gamma, eps)
        saved = torch.nn.functional.rms_norm, torch.rms_norm
        torch.nn.functional.rms_norm = torch.rms_norm = _forbidden_rms_norm
        try:
            got = rms_norm(x.clone(), gamma.clone(), eps)
        finally:
            torch.nn.functional.rms_norm, torch.rms_norm = saved
        if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                not torch.allclose(got.double(), want, atol=1e-6, rtol=1e-5):
            for reason, wrong in _rms_norm_mistakes(x, gamma, eps).items():
                if wrong.shape == want.shape and torch.allclose(got.double(), wrong, atol=1e-6, rtol=1e-5):
                    raise Wrong(reason)
        expect_close(got, want, f"rms_norm(x of shape {tuple(x.shape)}, eps={eps})", atol=1e-6, rtol=1e-5)


def _ch07_encoder_box(d: int, norm_first: bool, seed: int, *, affine: bool = False,
                      sublayer_scale: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """One :class:`~tfmlib.transformer.EncoderLayer` (float64, eval, no dropout) seen only as a function.

    ``affine``: LayerNorm gains and biases far from 1 and 0, as after training; ``sublayer_scale``
    multiplies the last weights of both sublayers (tiny or large sublayer outputs)."""
    from tfmlib.transformer import EncoderLayer  # imported here: tfmlib.transformer is chapter 07's

    with torch.random.fork_rng(devices=[]):         # the reader's random state stays as it was
        torch.manual_seed(seed)
        layer = EncoderLayer(d, 2, 2 * d, dropout=0.0, norm_first=norm_first).double().eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed + 1000)
        if affine:
            for norm in (layer.norm1, layer.norm2):
                norm.weight.uniform_(0.3, 3.0)
                norm.bias.normal_(0.0, 2.0)
        for linear in (layer.self_attn.out_proj, layer.ff.linear2):
            linear.weight.mul_(sublayer_scale)
            linear.bias.mul_(sublayer_scale)

    def encoder_layer(x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3 or x.shape[-1] != d \
                or 0 in x.shape:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"layer: x must be a non-empty floating (batch, length, {d}) tensor, got {got}")
        with torch.no_grad():
            return layer(x.detach().double())[0].to(x.dtype)

    return encoder_layer


# (norm_first, d, description, box options): what each hides, and what a shallow test would take it for
_CH07_PLACEMENT_CASES = [
    (False, 16, "post-LN with gain 1 and bias 0 (as initialised): fed inputs that are already "
     "normalised, its output looks much like its input. Use inputs that a LayerNorm would change: "
     "large ones, or off-centre", dict()),
    (True, 16, "pre-LN as initialised: its output is its input plus what the two sublayers add, and "
     "nothing normalises that sum", dict()),
    (False, 16, "post-LN whose LayerNorms have gains far from 1 and biases far from 0 (as after "
     "training): its output has the biases' mean and the gains' spread, not mean 0 and spread 1. Test "
     "something that holds whatever the gain and bias are", dict(affine=True)),
    (True, 16, "pre-LN whose sublayers add little (their last weights scaled by 1e-3): its output is "
     "nearly its input, and inputs of spread 1 make it look normalised. Use inputs that a LayerNorm "
     "would change", dict(sublayer_scale=1e-3)),
    (True, 16, "pre-LN whose sublayers add a lot (their last weights scaled by 30): its output is far "
     "from its input although nothing normalises it. Test what LayerNorm guarantees (its output "
     "does not grow with its input), not whether the output stays near the input",
     dict(sublayer_scale=30.0, affine=True)),
    (False, 32, "post-LN whose LayerNorms have gains far from 1 and biases far from 0 (as after "
     "training), width 32", dict(affine=True)),
]


@checker("07.norm_placement", hint="section 4's two formulas, read from the outside: in one of them every "
         "path to the output ends in a LayerNorm, in the other the input reaches the output through a plain "
         "sum. Section 3 says what a LayerNorm's output does not depend on; choose inputs that make that "
         "visible, and a test that holds whatever the gains and biases are")
def _check_norm_placement(norm_placement: Callable[[Callable[..., torch.Tensor], int], str]) -> None:
    answers, truths = [], []
    for seed, (norm_first, d, _, options) in enumerate(_CH07_PLACEMENT_CASES):
        answer = norm_placement(_ch07_encoder_box(d, norm_first, seed, **options), d)
        if answer not in ("post", "pre"):
            raise Wrong(f"return the string 'post' or 'pre', got {answer!r}")
        answers.append(answer)
        truths.append("pre" if norm_first else "post")
    if answers == truths:
        return
    if all(a != t for a, t in zip(answers, truths, strict=True)):
        raise Wrong("every answer is the opposite of the truth: your test is right and its two outcomes are "
                    "swapped ('post' when the input reaches the output through a plain sum, which is pre-LN)")
    i = next(i for i, (a, t) in enumerate(zip(answers, truths, strict=True)) if a != t)
    note = (f" (and you answered '{answers[0]}' for every layer)" if len(set(answers)) == 1 else "")
    raise Wrong(f"layer {i + 1} of {len(truths)} is {truths[i]}-LN, you said '{answers[i]}'{note}. It is "
                f"{_CH07_PLACEMENT_CASES[i][2]}")


def _as_attention_mask(mask: Any, B: int, T: int, S: int, what: str) -> torch.Tensor:
    """``mask`` broadcast to ``(B, 1, T, S)`` the way :func:`tfmlib.attention.check_mask` reads it."""
    if not isinstance(mask, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise Wrong(f"{what} should be a bool tensor (True = may attend), got {mask.dtype}")
    if mask.dim() == 3:
        mask = mask[:, None]
    if mask.dim() not in (2, 4):
        raise Wrong(f"{what} should have 2, 3 or 4 dimensions, got shape {tuple(mask.shape)}")
    try:
        return torch.broadcast_to(mask, (B, 1, T, S))
    except RuntimeError:
        raise Wrong(f"{what} of shape {tuple(mask.shape)} does not broadcast to (batch, heads, queries, "
                    f"keys) = {(B, 'h', T, S)}") from None


@checker("07.decoder_masks", hint="section 5 lists what each of the decoder's two attentions may see; "
         "chapter 05's masks say True where a query may attend, and their last axis is the keys. "
         "Self-attention combines two conditions, one on (query, key) positions and one on which keys are "
         "real; place each on the axes it depends on so that they broadcast. Ask which of the two "
         "cross-attention needs")
def _check_decoder_masks(decoder_masks: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, S, T = 2 + seed % 2, 3 + seed, 2 + 2 * seed
        src_len = torch.randint(1, S + 1, (B,), generator=g)
        tgt_len = torch.randint(1, T + 1, (B,), generator=g)
        src_len[0], tgt_len[-1] = S, max(1, T - 1)
        src_mask = torch.arange(S)[None, :] < src_len[:, None]
        tgt_mask = torch.arange(T)[None, :] < tgt_len[:, None]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        want_self = (causal[None] & tgt_mask[:, None, :])[:, None]                  # (B, 1, T, T)
        want_cross = src_mask[:, None, None, :].expand(B, 1, T, S)
        got = decoder_masks(src_mask.clone(), tgt_mask.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (self_mask, cross_mask)")
        self_mask = _as_attention_mask(got[0], B, T, T, "self_mask")
        cross_mask = _as_attention_mask(got[1], B, T, S, "cross_mask")
        if torch.equal(self_mask, ~want_self) or torch.equal(cross_mask, ~want_cross):
            raise Wrong("the masks are inverted: in this book True means 'may attend' (PyTorch's "
                        "nn.MultiheadAttention reads True as 'may not')")
        if not torch.equal(self_mask, want_self):
            if torch.equal(self_mask, causal[None, None].expand(B, 1, T, T)):
                raise Wrong("self_mask must also hide the target's padded keys (tgt_mask), not only the "
                            "future")
            if torch.equal(self_mask, tgt_mask[:, None, None, :].expand(B, 1, T, T)):
                raise Wrong("self_mask must be causal: position t may attend to positions 0..t only")
            if torch.equal(self_mask, (causal[None] & tgt_mask[:, :, None])[:, None]):
                raise Wrong("your self_mask hides whole rows, the padded *queries* (whether or not it also "
                            "hides the padded keys: with padding at the end the two masks are the same). A "
                            "padded query then has no key to attend to, NaN in a plain softmax. Padding "
                            "masks the keys (the last axis) only; a padded query's output is never used")
            raise Wrong("self_mask is wrong: position t may attend to u when u <= t and u is a real token\n"
                        + mask_mismatch(self_mask[0, 0], want_self[0, 0], "the first example's self_mask"))
        if not torch.equal(cross_mask, want_cross):
            lower = [torch.ones(T, S, dtype=torch.bool).tril(k) for k in (0, S - T)]
            if any(torch.equal(cross_mask, want_cross & tri) for tri in lower):
                raise Wrong("cross-attention is not causal: every target position may read the whole source")
            raise Wrong("cross_mask is wrong: every target position may attend to every real source token "
                        "(src_mask on the keys), and to no padding\n"
                        + mask_mismatch(cross_mask[0, 0], want_cross[0, 0], "the first example's cross_mask"))




_CH07_BUGS = ("ok", "future", "padding", "cross-causal")


def _ch07_decoder_box(d: int, bug: str, norm_first: bool, seed: int) -> Callable[..., torch.Tensor]:
    """A decoder layer (float64, eval, no dropout) with one planted ``bug`` (or none), as a function
    ``layer(y (B, T, d), memory (B, S, d), src_keep (B, S) bool) -> (B, T, d)``."""
    from tfmlib.transformer import DecoderLayer  # imported here: tfmlib.transformer is chapter 07's

    with torch.random.fork_rng(devices=[]):         # the reader's random state stays as it was
        torch.manual_seed(seed)
        layer = DecoderLayer(d, 2, 2 * d, dropout=0.0, norm_first=norm_first).double().eval()

    def decoder_layer(y: torch.Tensor, memory: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        for name, t in (("y", y), ("memory", memory)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 3 \
                    or t.shape[-1] != d or 0 in t.shape:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"layer: {name} must be a non-empty floating (batch, length, {d}) tensor, "
                                 f"got {got}")
        B, T, S = y.shape[0], y.shape[1], memory.shape[1]
        if not isinstance(src_keep, torch.Tensor) or src_keep.dtype != torch.bool \
                or tuple(src_keep.shape) != (B, S) or memory.shape[0] != B:
            got = (f"{src_keep.dtype} {tuple(src_keep.shape)}" if isinstance(src_keep, torch.Tensor)
                   else type(src_keep).__name__)
            raise ValueError(f"layer: src_keep must be a bool (batch, S) = ({B}, {S}) tensor (True at real "
                             f"source tokens) and memory must have {B} rows; got src_keep {got}, memory "
                             f"{tuple(memory.shape)}")
        cross = None if bug == "padding" else src_keep[:, None, None, :]
        if bug == "cross-causal":                                   # target t reads source 0..t only
            cross = cross & torch.ones(T, S, dtype=torch.bool).tril()
        x, mem = y.detach().double(), memory.detach().double()
        causal = bug != "future"
        with torch.no_grad():       # need_weights=True: the explicit path, where a masked key adds exactly 0
            if norm_first:
                x = x + layer.self_attn(layer.norm1(x), causal=causal, need_weights=True)[0]
                x = x + layer.cross_attn(layer.norm2(x), mem, mask=cross, need_weights=True)[0]
                x = x + layer.ff(layer.norm3(x))
            else:
                x = layer.norm1(x + layer.self_attn(x, causal=causal, need_weights=True)[0])
                x = layer.norm2(x + layer.cross_attn(x, mem, mask=cross, need_weights=True)[0])
                x = layer.norm3(x + layer.ff(x))
        return x.to(y.dtype)

    return decoder_layer


_CH07_BUG_MESSAGES = {
    ("ok", "future"): "it is a correct layer: later outputs always depend on earlier inputs, that is what "
    "attention over the prefix is. A leak from the future is the other way round: an output that changes "
    "when only a LATER target token changes",
    ("ok", "padding"): "it is a correct layer: changing a real source token changes the output, as it must. "
    "A padding leak is a change when only PADDED source positions (src_keep False) change",
    ("ok", "cross-causal"): "it is a correct layer: its first target position does read the last source "
    "token. Make sure the source token you changed is a real one (src_keep True) and compare the right "
    "target position",
    "future": "its self-attention sees later target positions, a leak from the future (section 5's first "
    "check): change only a later target token and look at the outputs before it. Change it by something a "
    "LayerNorm does not remove: a constant added to every feature of a vector vanishes in the centring, "
    "so a pre-LN layer never sees it",
    "padding": "its cross-attention reads the padded source positions (section 5's second check): give "
    "some source positions src_keep False, put garbage there, and look at the output",
    "cross-causal": "its cross-attention is causal: target position t reads source positions 0..t only. "
    "Every target position must read the whole source; check that the FIRST target position depends on "
    "the LAST real source token",
}


@checker("07.find_bug", hint="section 5 checked a decoder layer for two things, with a change that must "
         "not matter and a look at what moves; here there is one more thing that can be wrong, the opposite "
         "kind: a dependence that must exist and is missing. For each of the three, ask which input to "
         "change (a later target token, a padded source position, a far source token) and which outputs "
         "to watch")
def _check_find_bug(find_bug: Callable[[Callable[..., torch.Tensor], int], str]) -> None:
    cases = [(bug, norm_first) for norm_first in (False, True) for bug in _CH07_BUGS]
    answers = []
    for seed, (bug, norm_first) in enumerate(cases):
        answer = find_bug(_ch07_decoder_box(16, bug, norm_first, seed), 16)
        if answer not in _CH07_BUGS:
            raise Wrong(f"return one of {', '.join(repr(b) for b in _CH07_BUGS)}, got {answer!r}")
        answers.append(answer)
    truths = [bug for bug, _ in cases]
    if answers == truths:
        return
    i = next(i for i, (a, t) in enumerate(zip(answers, truths, strict=True)) if a != t)
    truth, answer = truths[i], answers[i]
    why = _CH07_BUG_MESSAGES[(truth, answer)] if truth == "ok" else _CH07_BUG_MESSAGES[truth]
    note = f" (and you answered '{answers[0]}' for every layer)" if len(set(answers)) == 1 else ""
    layout = "pre-LN" if cases[i][1] else "post-LN"
    raise Wrong(f"layer {i + 1} of {len(cases)} ({layout}): you said '{answer}'{note}, but {why}")

"""Checkers for chapter 07 (the Transformer architecture).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("07.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

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


class _NoLibraryRmsNorm(TorchFunctionMode):
    """Inside it, every route to the library's RMSNorm raises :class:`Wrong`: ``F.rms_norm``,
    ``torch.rms_norm``, ``torch.ops.aten.rms_norm`` and ``nn.RMSNorm`` (which calls them)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if "rms_norm" in getattr(func, "__name__", str(func)):
            raise Wrong("the exercise asks you to write RMSNorm yourself, without F.rms_norm, "
                        "torch.rms_norm, nn.RMSNorm or the aten op behind them; the solutions compare yours "
                        "with them")
        return func(*args, **(kwargs or {}))


@checker("07.rms_norm", hint="section 3's LayerNorm with two things left out, the centring and the "
         "bias: one statistic per vector instead of two. Ask over which axis it is taken, and where "
         "section 3 put eps")
def _check_rms_norm(rms_norm: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        x, gamma, eps = _rms_norm_case(seed)
        want = torch.nn.functional.rms_norm(x, (x.shape[-1],), gamma, eps)
        with _NoLibraryRmsNorm():
            got = rms_norm(x.clone(), gamma.clone(), eps)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                not torch.allclose(got.double(), want, atol=1e-6, rtol=1e-5):
            for reason, wrong in _rms_norm_mistakes(x, gamma, eps).items():
                if wrong.shape == want.shape and torch.allclose(got.double(), wrong, atol=1e-6, rtol=1e-5):
                    raise Wrong(reason)
        if isinstance(got, torch.Tensor) and got.dtype != x.dtype:
            raise Wrong(f"rms_norm(x of dtype {x.dtype}) returned {got.dtype}: return x's dtype. A norm that "
                        "changes the dtype of what flows through it breaks the model around it (in mixed "
                        "precision, a float32 result where bfloat16 was expected)")
        expect_close(got, want, f"rms_norm(x of shape {tuple(x.shape)}, eps={eps})", atol=1e-6, rtol=1e-5)
        if not torch.allclose(got, want, atol=1e-10, rtol=1e-9):
            err = (got - want).abs().max().item()
            raise Wrong(f"rms_norm(x of dtype {x.dtype}) is right only to about float32's precision (max abs "
                        f"error {err:.2g}): compute in x's dtype. A norm that quietly drops to a lower "
                        "precision loses what the caller chose float64 for")


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
    if mask.dim() == 2 and mask.shape[0] == B and B not in (1, T):
        raise Wrong(f"{what} has shape {tuple(mask.shape)}: a 2-D mask is read as (queries, keys), the "
                    "same for every example. Yours has one row per example: put the batch first and add "
                    "the query axis (and the head axis, or let it broadcast)")
    if mask.dim() == 3:
        mask = mask[:, None]
    if mask.dim() not in (2, 4):
        raise Wrong(f"{what} should have 2, 3 or 4 dimensions, got shape {tuple(mask.shape)}")
    try:
        return torch.broadcast_to(mask, (B, 1, T, S))
    except RuntimeError:
        raise Wrong(f"{what} of shape {tuple(mask.shape)} does not broadcast to (batch, heads, queries, "
                    f"keys) = {(B, 'h', T, S)}") from None


# (source lengths, target lengths) of the sentence pairs packed into each row, per case; B, T and S differ
_CH07_PACKED_CASES = [
    [([3, 2], [2, 4]), ([4], [5]), ([1, 2, 1], [1, 3, 1])],
    [([2, 3, 1], [3, 1, 2]), ([5, 1], [2, 3])],
    [([1, 4], [3, 2]), ([2, 2], [1, 1]), ([3], [2]), ([2, 1, 2], [2, 2, 3])],
    [([6, 2], [4, 4]), ([3, 3, 1], [2, 1, 4])],
]


def _ch07_segments(lengths: list[list[int]], width: int) -> torch.Tensor:
    """``(B, width)`` int64 segment ids: 1, 2, ... for the sentences packed in each row, 0 for padding."""
    seg = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, parts in enumerate(lengths):
        seg[row, :sum(parts)] = torch.repeat_interleave(torch.arange(1, len(parts) + 1), torch.tensor(parts))
    return seg


def _ch07_packed_mistakes(src_seg: torch.Tensor, tgt_seg: torch.Tensor
                          ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What typical wrong versions of the two masks are, ``(B, 1, T, ·)``, with their diagnoses."""
    T, S = tgt_seg.shape[1], src_seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    real_t, real_s = tgt_seg != 0, src_seg != 0
    same_t = tgt_seg[:, :, None] == tgt_seg[:, None, :]
    same_s = (tgt_seg[:, :, None] == src_seg[:, None, :]) & real_s[:, None, :]
    self_wrong = {
        "self_mask lets a target token see the sentence packed before it in the same row: causal and "
        "padding masks are not enough once several sentences share a row. A token may attend only to "
        "earlier tokens of its own sentence (the same segment id)": causal & real_t[:, None, :],
        "self_mask lets a target token see every target token of the row, ahead of it too; it must be "
        "causal and stay inside the token's own sentence": real_t[:, None, :].expand(-1, T, -1),
        "self_mask keeps each sentence to itself but is not causal: position t may attend to earlier "
        "positions of its sentence only": same_t & real_t[:, None, :],
    }
    cross_wrong = {
        "cross_mask lets a target sentence read every real source token of its row, the other sentences "
        "packed there included: each target token may read only the source sentence it was packed with "
        "(the same segment id)": real_s[:, None, :].expand(-1, T, -1),
        "cross-attention is not causal: every target token may read the whole of its own source "
        "sentence": same_s & torch.ones(T, S, dtype=torch.bool).tril(),
        "cross_mask lets a target token read the source sentence packed before its own too": same_s
        | ((tgt_seg[:, :, None] - 1 == src_seg[:, None, :]) & real_s[:, None, :]),
    }
    return ({k: v[:, None] for k, v in self_wrong.items()}, {k: v[:, None] for k, v in cross_wrong.items()})


@checker("07.packed_masks", hint="section 5 lists what each of the decoder's two attentions may see when a "
         "row holds one sentence pair; here a row holds several, each with its own segment id, and every "
         "pair must behave as if it were alone in a batch of its own. For each target token ask which "
         "target keys and which source tokens it would have seen then, and express both through the "
         "segment ids, placed on the axes (queries or keys) that they describe")
def _check_packed_masks(packed_masks: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for case in _CH07_PACKED_CASES:
        B = len(case)
        S, T = max(sum(src) for src, _ in case) + 1, max(sum(tgt) for _, tgt in case) + 2
        src_seg = _ch07_segments([src for src, _ in case], S)
        tgt_seg = _ch07_segments([tgt for _, tgt in case], T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        same = tgt_seg[:, :, None] == tgt_seg[:, None, :]
        want_self = (causal & same & (tgt_seg != 0)[:, None, :])[:, None]
        want_cross = ((tgt_seg[:, :, None] == src_seg[:, None, :]) & (src_seg != 0)[:, None, :])[:, None]
        got = packed_masks(src_seg.clone(), tgt_seg.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (self_mask, cross_mask)")
        self_mask = _as_attention_mask(got[0], B, T, T, "self_mask")
        cross_mask = _as_attention_mask(got[1], B, T, S, "cross_mask")
        rows = (tgt_seg != 0)[:, None, :, None]          # a padded query's row is never used: not checked
        self_ok = torch.equal(self_mask & rows, want_self & rows)
        cross_ok = torch.equal(cross_mask & rows, want_cross & rows)
        if self_ok and cross_ok:
            continue
        if torch.equal(~self_mask & rows, want_self & rows) or \
                torch.equal(~cross_mask & rows, want_cross & rows):
            raise Wrong("the masks are inverted: in this book True means 'may attend' (PyTorch's "
                        "nn.MultiheadAttention reads True as 'may not')")
        self_wrong, cross_wrong = _ch07_packed_mistakes(src_seg, tgt_seg)
        b = int(((self_mask != want_self) & rows).flatten(1).any(1).nonzero()[0]) if not self_ok else \
            int(((cross_mask != want_cross) & rows).flatten(1).any(1).nonzero()[0])
        segments = (f"row {b}: target segments {tgt_seg[b].tolist()}, source segments {src_seg[b].tolist()} "
                    "(0 = padding; padded query rows are not compared)")
        if not self_ok:
            for reason, wrong in self_wrong.items():
                if torch.equal(self_mask & rows, wrong & rows):
                    raise Wrong(reason)
            raise Wrong("self_mask is wrong: target position t may attend to u when u <= t and u belongs to "
                        f"t's sentence. {segments}\n"
                        + mask_mismatch(self_mask[b, 0] & rows[b, 0], want_self[b, 0] & rows[b, 0],
                                        f"row {b}'s self_mask"))
        for reason, wrong in cross_wrong.items():
            if torch.equal(cross_mask & rows, wrong & rows):
                raise Wrong(reason)
        raise Wrong("cross_mask is wrong: target position t may attend to every token of the source sentence "
                    f"packed with t's, and to nothing else. {segments}\n"
                    + mask_mismatch(cross_mask[b, 0] & rows[b, 0], want_cross[b, 0] & rows[b, 0],
                                    f"row {b}'s cross_mask"))


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

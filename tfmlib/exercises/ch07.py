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


@checker("07.rms_norm", hint="like section 3's LayerNorm with the centring and the bias left out: one "
         "statistic, the mean of the squared features over the last axis only, kept as an axis of size 1 "
         "so that it broadcasts back; eps goes where section 3 put it; gamma acts after normalising")
def _check_rms_norm(rms_norm: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        x, gamma, eps = _rms_norm_case(seed)
        want = torch.nn.functional.rms_norm(x, (x.shape[-1],), gamma, eps)
        got = rms_norm(x.clone(), gamma.clone(), eps)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                not torch.allclose(got.double(), want, atol=1e-6, rtol=1e-5):
            for reason, wrong in _rms_norm_mistakes(x, gamma, eps).items():
                if wrong.shape == want.shape and torch.allclose(got.double(), wrong, atol=1e-6, rtol=1e-5):
                    raise Wrong(reason)
        expect_close(got, want, f"rms_norm(x of shape {tuple(x.shape)}, eps={eps})", atol=1e-6, rtol=1e-5)


@checker("07.sublayer", hint="read section 4's two formulas: ask for each what the LayerNorm is applied to, "
         "the residual sum or only the sublayer's input, and whether x itself is ever normalised")
def _check_sublayer(sublayer_connection: Callable[..., torch.Tensor]) -> None:
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        d = 4 + 2 * seed
        x = torch.randn(2, 3 + seed, d, generator=g) * 2 + 1
        sublayer = torch.nn.Linear(d, d)
        norm = torch.nn.LayerNorm(d)
        with torch.no_grad():
            for p in [*sublayer.parameters(), *norm.parameters()]:
                p.copy_(torch.randn(p.shape, generator=g))
        with torch.no_grad():
            want = {False: norm(x + sublayer(x)), True: x + sublayer(norm(x))}
            wrong = {False: {"that is pre-LN, x + sublayer(norm(x)); post-LN normalises the sum": want[True],
                             "the residual connection is missing: add x before normalising":
                                 norm(sublayer(x))},
                     True: {"that is post-LN, norm(x + sublayer(x)); pre-LN normalises the sublayer's input":
                                want[False],
                            "the residual connection is missing: the sublayer's output must be added to x":
                                sublayer(norm(x)),
                            "pre-LN leaves the residual sum alone: do not normalise x + sublayer(norm(x))":
                                norm(x + sublayer(norm(x)))}}
            for norm_first in (False, True):
                got = sublayer_connection(x.clone(), sublayer, norm, norm_first)
                if isinstance(got, torch.Tensor) and got.shape == x.shape:
                    for reason, w in wrong[norm_first].items():
                        distinct = not torch.allclose(w, want[norm_first], atol=1e-5)
                        if distinct and torch.allclose(got, w, atol=1e-5):
                            raise Wrong(f"norm_first={norm_first}: {reason}")
                expect_close(got, want[norm_first], f"sublayer_connection(..., norm_first={norm_first})")


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


@checker("07.decoder_masks", hint="True = may attend; the last axis of a mask is the keys. Self-attention "
         "combines two conditions, one on (query, key) positions and one on which keys are real; place "
         "each on the axes it depends on so that they broadcast. Ask which of the two cross-attention needs")
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
                raise Wrong("padding masks the keys (the last axis): use tgt_mask[:, None, None, :]")
            raise Wrong("self_mask is wrong: position t may attend to u when u <= t and u is a real token\n"
                        + mask_mismatch(self_mask[0, 0], want_self[0, 0], "the first example's self_mask"))
        if not torch.equal(cross_mask, want_cross):
            lower = [torch.ones(T, S, dtype=torch.bool).tril(k) for k in (0, S - T)]
            if any(torch.equal(cross_mask, want_cross & tri) for tri in lower):
                raise Wrong("cross-attention is not causal: every target position may read the whole source")
            raise Wrong("cross_mask is wrong: every target position may attend to every real source token "
                        "(src_mask on the keys), and to no padding\n"
                        + mask_mismatch(cross_mask[0, 0], want_cross[0, 0], "the first example's cross_mask"))



"""Choosing the next token: greedy, temperature, top-k and top-p (nucleus) sampling.

Introduced in chapter 09 (a decoder-only language model), which plots what each one does to the
next-token distribution of the same prompt.

A language model gives logits ``z`` ``(..., V)`` for the next token; ``softmax(z)`` is its
distribution. The functions here reshape that distribution before a token is drawn:

* :func:`apply_temperature`: ``z / tau``; ``tau < 1`` sharpens (towards greedy), ``tau > 1``
  flattens (towards uniform);
* :func:`top_k_filter`: keep the ``k`` largest logits, set the others to ``-inf``;
* :func:`top_p_filter` (Holtzman et al. 2020, section 3.1): keep the smallest set of most
  probable tokens whose probabilities sum to at least ``p`` (the *nucleus*), ``-inf`` elsewhere;
* :func:`next_token_probs` applies them in that order (temperature, then top-k, then top-p) and
  returns the probabilities; :func:`sample_next` draws from them with an explicit
  ``torch.Generator`` (same seed, same tokens); :func:`greedy_next` takes the argmax.

Shapes: ``V`` vocabulary; any leading batch axes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

INTRODUCED_IN = 9

__all__ = ["apply_temperature", "greedy_next", "next_token_probs", "sample_next", "top_k_filter",
           "top_p_filter"]


def _check_logits(logits: Tensor, who: str) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"{who}: logits must be a floating (..., V) tensor, got {got}")
    if logits.shape[-1] == 0:
        raise ValueError(f"{who}: logits have an empty vocabulary axis, shape {tuple(logits.shape)}")


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature`` ``(..., V)``; ``temperature`` must be a finite number > 0 (for the
    limit ``temperature -> 0``, greedy decoding, use :func:`greedy_next`)."""
    _check_logits(logits, "apply_temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"apply_temperature: temperature must be a finite number > 0, got {temperature!r} "
                         "(for temperature -> 0 use greedy_next)")
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row ``(..., V)`` and set the others to ``-inf``.

    ``k >= V`` keeps everything. Ties at the ``k``-th value are all kept (so a row may keep more
    than ``k`` tokens when several share that logit). ``k`` must be a positive int.
    """
    _check_logits(logits, "top_k_filter")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top_k_filter: k must be a positive int, got {k!r}")
    if k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]                        # (..., 1)
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of most probable tokens whose probabilities sum to
    at least ``p``; the others' logits become ``-inf``. ``logits`` ``(..., V)``; ``p`` in ``(0, 1]``.

    Tokens are sorted by probability; a token is kept when the probability of the tokens *before*
    it is below ``p``, so the most probable token is always kept. ``p = 1`` returns ``logits``
    unchanged (in float32 the running sum reaches 1.0 before the last tokens of a long tail, so
    the rule alone would drop some of them). Ties: of several tokens with the same probability at
    the boundary, the sort order decides which are kept (``top_k_filter`` keeps them all).
    """
    _check_logits(logits, "top_p_filter")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"top_p_filter: top_p must be in (0, 1], got {p!r}")
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    before = probs.cumsum(dim=-1) - probs                                 # mass of the tokens before
    drop_sorted = before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def next_token_probs(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> Tensor:
    """The distribution ``(..., V)`` a token is drawn from: temperature, then top-k, then top-p
    applied to ``logits``, then a softmax (in float32 or wider)."""
    z = apply_temperature(logits, temperature)
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    return torch.softmax(z.float() if z.dtype in (torch.float16, torch.bfloat16) else z, dim=-1)


def greedy_next(logits: Tensor) -> Tensor:
    """The most probable token of each row: ``(..., V) -> (...)`` ids (the first one on ties)."""
    _check_logits(logits, "greedy_next")
    return logits.argmax(dim=-1)


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row from :func:`next_token_probs`: ``(..., V) -> (...)`` ids.

    Pass a seeded ``generator`` (on the logits' device) for reproducible text: the same seed, the
    same logits and the same settings draw the same tokens (on the same device).
    """
    probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])

"""Relative positions inside attention: Shaw et al.'s relation-aware attention and ALiBi's linear biases.

Introduced in chapter 06 (positional encoding), beside the absolute and rotary schemes of
:mod:`tfmlib.positional`. Both schemes here put the *offset* ``s - t`` between a query at position
``t`` and a key at position ``s`` into attention itself, instead of labelling each token with where
it is.

* :class:`ShawSelfAttention` (Shaw, Uszkoreit, Vaswani 2018, section 3): learned vectors for the
  clipped offsets ``clip(s - t) = max(-K, min(K, s - t))``, added to the keys in the score and to
  the values in the weighted sum. Only ``2K + 1`` offsets exist, so any length is nothing new to it.
* :func:`alibi_slopes` and :func:`alibi_bias` (Press, Smith, Lewis 2022, "Train short, test long",
  section 3): no parameters at all; each head ``j`` adds the fixed bias ``-m_j * |t - s|`` (or, in
  the causal form of the paper, ``-m_j * (t - s)`` for ``s <= t`` and ``-inf`` above the diagonal)
  to its scores, with slopes ``m_j`` a geometric sequence. The bias is a float additive mask: pass
  it as ``mask=`` to :class:`tfmlib.attention.MultiHeadAttention`.

Shapes: ``B`` batch, ``L`` sequence length, ``T`` queries, ``S`` keys, ``d_model`` model width,
``h`` heads, ``d_k = d_model / h`` head width, ``K`` the clipping distance.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tfmlib.attention import check_mask, merge_heads, split_heads
from tfmlib.positional import check_positive_int
from tfmlib.rnn_attention import masked_softmax

INTRODUCED_IN = 6

__all__ = ["ShawSelfAttention", "alibi_bias", "alibi_slopes", "clipped_offsets"]


def clipped_offsets(length: int, max_distance: int, device: torch.device | str | None = None) -> Tensor:
    """``(L, L)`` int64: entry ``[t, s]`` is ``clip(s - t) = max(-K, min(K, s - t))``, with ``K`` the
    ``max_distance``."""
    check_positive_int("clipped_offsets", "length", length)
    check_positive_int("clipped_offsets", "max_distance", max_distance)
    pos = torch.arange(length, device=device)
    return (pos[None, :] - pos[:, None]).clamp(-max_distance, max_distance)


class ShawSelfAttention(nn.Module):
    """Self-attention with relative position representations (Shaw, Uszkoreit, Vaswani 2018, section 3).

    ``e_ts = q_t . (k_s + aK[clip(s - t)]) / sqrt(d_k)`` and ``z_t = sum_s alpha_ts (v_s + aV[clip(s - t)])``,
    ``clip(o) = max(-K, min(K, o))``; the ``2K + 1`` vectors ``aK``, ``aV`` (width ``d_k``) are shared by
    the heads. ``forward(x (B, L, d_model), mask=None, need_weights=False) -> (out (B, L, d_model),
    weights (B, h, L, L) or None)``, ``mask`` as in :class:`~tfmlib.attention.MultiHeadAttention`
    (bool, ``True`` = may attend; or floating, added to the scores). Like the paper (section 3.3),
    one ``(L, L, d_k)`` tensor of offset vectors is gathered and contracted with the queries and
    with the weights.
    """

    def __init__(self, d_model: int, heads: int, max_distance: int):
        super().__init__()
        check_positive_int("ShawSelfAttention", "d_model", d_model)
        check_positive_int("ShawSelfAttention", "heads", heads)
        check_positive_int("ShawSelfAttention", "max_distance", max_distance)
        if d_model % heads:
            raise ValueError(f"ShawSelfAttention: d_model={d_model} is not divisible by heads={heads}")
        self.d_model, self.heads, self.d_k, self.max_distance = d_model, heads, d_model // heads, max_distance
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))
        self.rel_k = nn.Embedding(2 * max_distance + 1, self.d_k)   # a^K for offsets -K .. K
        self.rel_v = nn.Embedding(2 * max_distance + 1, self.d_k)   # a^V

    def offset_ids(self, length: int, device: torch.device | str | None = None) -> Tensor:
        """``(L, L)``: entry ``[t, s]`` is ``clip(s - t) + K``, the row of ``rel_k``/``rel_v`` to use."""
        return clipped_offsets(length, self.max_distance, device) + self.max_distance

    def forward(self, x: Tensor, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model or 0 in x.shape:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"ShawSelfAttention: x must be a non-empty (batch, length, "
                             f"d_model={self.d_model}) tensor, got {got}")
        B, L, _ = x.shape
        q, k, v = (split_heads(proj(x), self.heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
        ids = self.offset_ids(L, x.device)
        a_k, a_v = self.rel_k(ids), self.rel_v(ids)                            # (L, L, d_k) each
        scores = (q @ k.transpose(-2, -1) + torch.einsum("bhtd,tsd->bhts", q, a_k)) / math.sqrt(self.d_k)
        mask = check_mask(mask, tuple(scores.shape), "ShawSelfAttention")
        if mask is not None and mask.is_floating_point():  # additive: add it, then mask the -inf keys
            scores = scores + mask.to(scores.dtype)
            mask = mask != -math.inf
        weights = torch.softmax(scores, dim=-1) if mask is None else masked_softmax(scores, mask)
        out = weights @ v + torch.einsum("bhts,tsd->bhtd", weights, a_v)       # sum over the keys s
        return self.out_proj(merge_heads(out)), (weights if need_weights else None)


def alibi_slopes(heads: int) -> Tensor:
    """``(heads,)`` float32: ALiBi's fixed slope ``m_j`` of each head (Press et al. 2022, section 3).

    For ``h`` a power of two, the geometric sequence that starts at ``2^(-8/h)`` with that ratio:
    ``2^(-8/h), 2^(-16/h), ..., 2^(-8)`` (8 heads: ``1/2, 1/4, ..., 1/256``). Otherwise, as in the
    authors' code: the slopes of the largest power of two ``n < h``, then every other slope of ``2n``
    heads (``2^(-4/n), 2^(-12/n), ...``) until there are ``h``.
    """
    check_positive_int("alibi_slopes", "heads", heads)

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (j + 1) for j in range(n)]

    n = 2 ** int(math.floor(math.log2(heads)))
    slopes = geometric(n) + geometric(2 * n)[0::2][: heads - n]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(T: int, S: int | None = None, heads: int = 1, *, causal: bool = False,
               slopes: Tensor | None = None, device: torch.device | str | None = None) -> Tensor:
    """``(1, h, T, S)`` float32 additive mask: ALiBi's bias ``-m_j * distance`` for every head ``j``.

    Query ``t`` sits at key position ``t + S - T`` (the last ``T`` of the keys, as in
    :func:`~tfmlib.attention.causal_mask`), so with ``distance = |t + S - T - s|`` the bias is
    ``-m_j * distance`` (bidirectional); with ``causal=True`` it is that for ``s <= t + S - T`` and
    ``-inf`` for the keys after the query, the form Press et al. (2022) use in a causal language model.
    ``slopes`` ``(h,)`` overrides :func:`alibi_slopes` (``heads`` is then read from it). Add it to
    the scores ``Q K^T / sqrt(d_k)`` before the softmax, e.g. ``MultiHeadAttention(x, mask=bias)``.
    """
    check_positive_int("alibi_bias", "T", T)
    S = T if S is None else S
    check_positive_int("alibi_bias", "S", S)
    if S < T:
        raise ValueError(f"alibi_bias: {T} queries but only {S} keys; the queries are the last T of "
                         "the keys' positions")
    if slopes is None:
        slopes = alibi_slopes(heads)
    elif not isinstance(slopes, Tensor) or slopes.dim() != 1 or len(slopes) == 0 \
            or not slopes.is_floating_point():
        got = tuple(slopes.shape) if isinstance(slopes, Tensor) else type(slopes).__name__
        raise ValueError(f"alibi_bias: slopes must be a non-empty 1-D float tensor (heads,), got {got}")
    slopes = slopes.to(device=device, dtype=torch.float32)
    query_pos = torch.arange(S - T, S, device=device)
    key_pos = torch.arange(S, device=device)
    distance = query_pos[:, None] - key_pos[None, :]                          # (T, S): t - s
    bias = -slopes[:, None, None] * distance.abs().float()[None]              # (h, T, S)
    if causal:
        bias = bias.masked_fill(distance[None] < 0, float("-inf"))
    return bias[None]

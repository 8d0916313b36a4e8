"""Scaled dot-product attention and multi-head attention: the Transformer's core operation.

Introduced in chapter 05 (scaled dot-product and multi-head attention). Chapter 04 derives
self-attention from the GRU; chapter 03's :func:`~tfmlib.rnn_attention.masked_softmax` is reused
here; chapters 06-08 build on :class:`MultiHeadAttention`.

* :func:`scaled_dot_product_attention` is the teaching version: explicit scores
  ``Q K^T / sqrt(d_k)``, a masked softmax, the weighted sum of the values; it returns the
  attention weights for plots.
* :func:`fast_attention` computes the same output with ``F.scaled_dot_product_attention``
  (fused kernels where PyTorch has them) and is what the models use; the tests check the two agree,
  forward and backward, with masks.
* :class:`MultiHeadAttention` projects queries, keys and values, splits ``d_model`` into heads as
  a batch axis (a reshape and a transpose, no loop over heads), attends, and projects back. Its
  ``cache=`` and ``kv=`` arguments are chapter 09's key-value cache (:mod:`tfmlib.kv_cache`, whose
  types it names in hints only), its ``kernel`` attribute chapter 10's choice of attention code.
  :func:`copy_from_torch_mha` copies ``nn.MultiheadAttention``'s weights into it.

**Masks** come in two kinds, as in ``F.scaled_dot_product_attention``'s ``attn_mask``:

* a ``bool`` *keep-mask*, ``True`` where a query *may* attend to a key, the book's convention
  since chapter 00 (``True`` = a real token). PyTorch's ``nn.MultiheadAttention`` reads a bool
  mask the other way round (``True`` = *not* allowed); ``F.scaled_dot_product_attention`` reads it
  as we do;
* a floating *additive* mask (a bias), added to the scores ``Q K^T / sqrt(d_k)`` before the
  softmax: ``0`` where a query may attend, ``-inf`` where it may not, or any real value (ALiBi's
  distance penalties, T5's learned relative biases). A bool mask ``m`` and the float mask
  ``0`` where ``m``, ``-inf`` elsewhere give the same result.

A mask broadcasts against the scores ``(B, h, T, S)``: build one with :func:`padding_mask`
(``(B, 1, 1, S)``, from a ``(B, S)`` token mask), :func:`causal_mask` (``(T, S)``) or both with
``&``. A query that may attend to nothing (a fully masked row: all ``False``, or all ``-inf``)
gets a zero output and zero gradients, never NaN.

**Causal alignment.** With fewer queries than keys (``T < S``) the package's ``causal=True`` and
:func:`causal_mask` align the queries with the *last* ``T`` keys (bottom-right: query ``t`` sees
keys ``0 .. t + S - T``), which is what a decoder reading a cache of earlier keys needs. PyTorch's
``is_causal=True`` aligns them with the *first* ``T`` keys (top-left: ``torch.ones(T, S).tril()``).
The two agree when ``T == S``. To port code that relies on PyTorch's alignment, pass
``mask=causal_mask(T, S, align="top_left")``; ``torch.nn.attention.bias.causal_lower_right`` is
PyTorch's name for ours.

**Differences from PyTorch** (``nn.MultiheadAttention``, ``F.scaled_dot_product_attention``); each
is refused with an error that names it rather than computed differently:

* ``batch_first`` only: inputs are ``(B, L, d_model)``; there is no ``batch_first=False`` and no
  unbatched ``(L, d_model)`` input (a 2-D input is a ``ValueError``);
* one width for queries, keys and values: no ``kdim``/``vdim`` (:func:`copy_from_torch_mha`
  refuses such a module);
* no ``add_bias_kv`` and no ``add_zero_attn`` (:func:`copy_from_torch_mha` refuses them);
* masks are keep-masks (see above) and a 3-D mask is ``(B, T, S)``, one per sentence, shared by
  the heads (``nn.MultiheadAttention``'s 3-D mask is ``(B * h, T, S)``; there is no
  ``key_padding_mask`` argument: combine :func:`padding_mask` with ``&``);
* ``causal=True`` aligns bottom-right when ``T < S`` (see above);
* the weights returned with ``need_weights=True`` are per head, ``(B, h, T, S)``, never averaged.

Shapes: ``B`` batch, ``h`` heads, ``T`` queries, ``S`` keys and values, ``d_model`` model width,
``d_k = d_model / h`` the width of one head (keys and queries), ``d_v`` the width of a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfmlib.rnn_attention import masked_softmax

if TYPE_CHECKING:  # for a type hint only: the cache is chapter 09's, and that module imports nothing of ours
    from tfmlib.kv_cache import KVCache

INTRODUCED_IN = 5

__all__ = [
    "AttentionKernel",
    "MultiHeadAttention",
    "causal_mask",
    "check_mask",
    "check_qkv",
    "copy_from_torch_mha",
    "fast_attention",
    "merge_heads",
    "padding_mask",
    "scaled_dot_product_attention",
    "split_heads",
]


# --------------------------------------------------------------------------- masks


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None, *,
                align: str = "bottom_right") -> Tensor:
    """``(T, S)`` bool mask, ``True`` where query ``t`` may attend to key ``s``.

    With ``S == T`` (the default) this is the lower triangle: position ``t`` sees positions
    ``0..t``. With ``S > T`` the default ``align="bottom_right"`` makes the ``T`` queries the
    *last* ``T`` of ``S`` positions (``s <= t + S - T``: a decoder that has cached the keys of
    earlier steps), so the last query sees every key; this is what ``causal=True`` means
    everywhere in the package. ``align="top_left"`` makes them the *first* ``T`` positions
    (``s <= t``), which is what PyTorch's ``is_causal=True`` computes: use it to port code that
    relies on that.
    """
    S = T if S is None else S
    for name, v in (("T", T), ("S", S)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"causal_mask: {name} must be a positive int, got {v!r}")
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"causal_mask: align must be 'bottom_right' or 'top_left', got {align!r}")
    if S < T:
        raise ValueError(f"causal_mask: S={S} keys for T={T} queries; a causal mask needs S >= T")
    diagonal = S - T if align == "bottom_right" else 0
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=diagonal)


def padding_mask(token_mask: Tensor) -> Tensor:
    """``(B, S)`` token mask (``True`` at real tokens) -> ``(B, 1, 1, S)`` attention mask: every
    query (and every head) may attend to the real keys only."""
    if not isinstance(token_mask, Tensor) or token_mask.dtype != torch.bool or token_mask.dim() != 2:
        got = (f"{token_mask.dtype} tensor of shape {tuple(token_mask.shape)}"
               if isinstance(token_mask, Tensor) else type(token_mask).__name__)
        raise ValueError(f"padding_mask: token_mask must be a (batch, length) bool tensor, got {got}")
    return token_mask[:, None, None, :]


def check_mask(mask: Tensor | None, scores_shape: tuple[int, ...], who: str) -> Tensor | None:
    """Return ``mask`` as a tensor that broadcasts to ``scores_shape`` ``(B, h, T, S)``.

    ``mask`` is ``bool`` (``True`` = may attend) or floating (added to the scores: ``0`` /
    ``-inf``, or real-valued biases). Accepts ``(T, S)`` (or any 2-D shape that broadcasts to it,
    such as ``(1, S)``), ``(B, T, S)`` (made ``(B, 1, T, S)``) and 4-D masks such as
    :func:`padding_mask`'s ``(B, 1, 1, S)``; raises ``TypeError`` for a mask that is neither bool
    nor floating and ``ValueError``, naming both shapes, for one that does not broadcast.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{who}: mask must be a bool tensor (True = may attend) or a floating tensor "
                        f"added to the scores (0 = may attend, -inf = may not), got {got}")
    B, h, T, S = scores_shape
    if mask.dim() == 2:
        try:
            fits = torch.broadcast_shapes(mask.shape, (T, S)) == torch.Size((T, S))
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"{who}: a 2-D mask must be (queries, keys) = {(T, S)}, got "
                             f"{tuple(mask.shape)}; "
                             "for a (batch, keys) token mask use padding_mask()")
    elif mask.dim() == 3:
        mask = mask[:, None]
    elif mask.dim() != 4:
        raise ValueError(f"{who}: mask must have 2, 3 or 4 dimensions, got shape {tuple(mask.shape)}")
    try:
        if torch.broadcast_shapes(mask.shape, scores_shape) != torch.Size(scores_shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"{who}: mask {tuple(mask.shape)} does not broadcast to the attention scores "
                         f"(batch, heads, queries, keys) = {tuple(scores_shape)}") from None
    return mask


# --------------------------------------------------------------------------- attention

# (q, k, v, mask, causal, dropout_p) -> out: fast_attention's arguments, in its order; a
# MultiHeadAttention's ``kernel`` (chapter 10 swaps in other implementations of attention)
AttentionKernel = Callable[[Tensor, Tensor, Tensor, "Tensor | None", bool, float], Tensor]


def check_qkv(q: Tensor, k: Tensor, v: Tensor, who: str) -> None:
    """Refuse queries, keys and values that attention cannot take, naming ``who`` (the caller).

    ``q`` ``(B, h, T, d_k)``, ``k`` ``(B, h, S, d_k)``, ``v`` ``(B, h, S, d_v)``, all floating:
    ``TypeError`` for a non-tensor or an integer tensor, ``ValueError`` for a shape that is not
    4-d or does not agree (``d_k`` of q and k; ``(B, h, S)`` of k and v; ``(B, h)`` of q and k).
    Every attention of the package checks with it (chapter 10's tiled attention too)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{who}: {name} must be a floating tensor, got {got}")
        if x.dim() != 4:
            raise ValueError(f"{who}: {name} must be (batch, heads, length, width), got shape "
                             f"{tuple(x.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{who}: queries and keys must have the same width d_k, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{who}: keys and values must agree in (batch, heads, length), got "
                         f"k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"{who}: q and k must agree in (batch, heads), got q {tuple(q.shape)} and "
                         f"k {tuple(k.shape)}")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 dropout_p: float = 0.0, *, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Attention written out: ``softmax(Q K^T / sqrt(d_k) + bias) V``, with the weights returned.

    ``q`` ``(B, h, T, d_k)``, ``k`` ``(B, h, S, d_k)``, ``v`` ``(B, h, S, d_v)``; ``mask``
    broadcasting to ``(B, h, T, S)``: bool (``True`` = may attend) or floating (added to the
    scores; ``-inf`` = may not attend). ``causal=True`` adds :func:`causal_mask` (bottom-right
    aligned when ``T < S``). Returns ``(out (B, h, T, d_v), weights (B, h, T, S))``; each row of
    ``weights`` sums to 1 over the keys a query may see, and is all zeros for a query that may
    see none. ``dropout_p`` drops weights (training only; the returned weights are those before
    dropout).

    ``q`` is scaled *before* the product: ``(Q / sqrt(d_k)) K^T`` is the same number as
    ``Q K^T / sqrt(d_k)``, but its intermediate is ``sqrt(d_k)`` times smaller, so float16 (whose
    largest number is 65504) does not overflow to ``inf`` where the scaled score is finite.
    """
    check_qkv(q, k, v, "scaled_dot_product_attention")
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)          # (B, h, T, S)
    mask = check_mask(mask, tuple(scores.shape), "scaled_dot_product_attention")
    if causal:
        keep = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        mask = keep if mask is None else (mask & keep if mask.dtype == torch.bool
                                          else torch.where(keep, mask, -math.inf))
    if mask is not None and mask.is_floating_point():  # additive: add it, then mask the -inf keys
        scores = scores + mask.to(scores.dtype)
        mask = mask != -math.inf
    weights = torch.softmax(scores, dim=-1) if mask is None else masked_softmax(scores, mask)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


def fast_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
                   dropout_p: float = 0.0) -> Tensor:
    """The output of :func:`scaled_dot_product_attention`, computed by ``F.scaled_dot_product_attention``.

    Same shapes and masks (bool keep-mask, or floating mask added to the scores). ``causal=True``
    adds :func:`causal_mask`, and lets PyTorch use its causal kernels when there is no other mask
    and ``T == S``. With ``T < S`` it aligns the queries with the *last* ``T`` keys
    (bottom-right), unlike PyTorch's ``is_causal=True`` (top-left: the first ``T``); pass
    ``mask=causal_mask(T, S, align="top_left")`` for PyTorch's behaviour. A fully masked query row
    gives zeros (PyTorch's own result for such a row depends on its version and backend, so it is
    set here).
    """
    check_qkv(q, k, v, "fast_attention")
    T, S = q.shape[-2], k.shape[-2]
    mask = check_mask(mask, (q.shape[0], q.shape[1], T, S), "fast_attention")
    if mask is None:
        if causal and T == S:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        if not causal:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        mask = causal_mask(T, S, device=q.device)
    elif causal:
        keep = causal_mask(T, S, device=q.device)
        mask = mask & keep if mask.dtype == torch.bool else torch.where(keep, mask, -math.inf)
    # A row that may attend to nothing is let attend to everything (finite, no NaN in either pass),
    # and its output is then zeroed, which also zeroes every gradient through it.
    if mask.dtype == torch.bool:
        sees_something = mask.any(dim=-1, keepdim=True)                   # (..., T, 1)
        attn_mask = mask | ~sees_something
    else:
        sees_something = (mask != -math.inf).any(dim=-1, keepdim=True)
        attn_mask = mask.to(q.dtype).masked_fill(~sees_something, 0.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return out.masked_fill(~sees_something, 0.0)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """``(B, L, heads * d)`` -> ``(B, heads, L, d)``: the heads become a batch axis."""
    B, L, D = x.shape
    return x.view(B, L, heads, D // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, heads, L, d)`` -> ``(B, L, heads * d)``: the inverse of :func:`split_heads`."""
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, section 3.2.2)::

        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V),  MultiHead(Q, K, V) = [head_1; ...; head_h] W^O

    The ``h`` projections of each kind are one ``nn.Linear(d_model, d_model)`` whose output is cut
    into ``h`` slices of ``d_k = d_model / h``, so every head is computed at once.

    ``forward(query (B, T, d_model), key (B, S, d_model) = query, value (B, S, d_model) = key, *,
    mask=None, causal=False, need_weights=False, q_positions=None, k_positions=None) -> (out (B, T,
    d_model), weights (B, h, T, S) or None)``. ``mask`` is a bool keep-mask or a floating mask added
    to the scores (see the module docstring), broadcasting to ``(B, h, T, S)``. With
    ``need_weights`` the explicit :func:`scaled_dot_product_attention` runs and its weights are
    returned; otherwise :func:`fast_attention`.

    ``rotary`` (chapter 06) is a module ``(q, k) -> (q, k)`` applied to the split heads before the
    scores, for rotary position embeddings (:class:`~tfmlib.positional.RotaryEmbedding`).
    ``q_positions`` and ``k_positions`` (``(T,)`` and ``(S,)``, or ``(B, T)`` and ``(B, S)``,
    integer) are the positions it rotates by, passed on as
    ``rotary(q, k, q_positions=..., k_positions=...)``: needed when the queries are not the keys'
    positions ``0 .. S - 1`` (a decoder step after ``S - T`` cached keys, left padding, packed
    sequences). Without them ``RotaryEmbedding`` refuses ``T != S`` rather than guess.

    The key-value cache (chapter 09): with ``cache`` (a :class:`~tfmlib.kv_cache.KVCache` holding
    the keys and values of ``t`` earlier positions) the keys and values computed here are
    appended to it (the cache is extended in place) and the queries attend over all ``t + S``;
    the rotary positions default to ``t .. t + S - 1``, and ``causal=True`` aligns the queries with
    the last keys. With ``kv`` (keys and values ``(B, h, S, d_k)`` from :meth:`keys_values`,
    computed once) ``key`` and ``value`` are not projected again: a decoder's cross-attention
    reads the same encoder output at every step.

    ``kernel`` (chapter 10) is the function that attends, with :func:`fast_attention`'s arguments
    ``(q, k, v, mask, causal, dropout_p) -> out`` (:data:`AttentionKernel`); ``None`` is
    :func:`fast_attention`. It is an attribute: set it to switch, the weights do not change.
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rotary: Callable[..., tuple[Tensor, Tensor]] | None = None,
                 kernel: AttentionKernel | None = None):
        super().__init__()
        for name, v in (("d_model", d_model), ("heads", heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"MultiHeadAttention: {name} must be a positive int, got {v!r}")
        if d_model % heads:
            raise ValueError(f"MultiHeadAttention: d_model={d_model} is not divisible by heads={heads} "
                             f"(each head gets d_model / heads features)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        self.d_model, self.heads, self.d_k, self.dropout = d_model, heads, d_model // heads, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.kernel = kernel

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"MultiHeadAttention: {name} must be (batch, length, "
                                 f"d_model={self.d_model}), "
                                 f"got {got} (batch first; no unbatched input)")
        if query.shape[0] == 0 or query.shape[1] == 0 or key.shape[1] == 0:
            raise ValueError(f"MultiHeadAttention: empty input (query {tuple(query.shape)}, "
                             f"key {tuple(key.shape)})")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"MultiHeadAttention: query, key and value must have the same batch size, got "
                             f"{query.shape[0]}, {key.shape[0]}, {value.shape[0]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"MultiHeadAttention: key and value must have the same length, got "
                             f"{key.shape[1]} and {value.shape[1]}")

    def keys_values(self, key: Tensor, value: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The keys and values of ``key`` and ``value`` ``(B, S, d_model)``, projected and split
        into heads: ``(B, h, S, d_k)`` each (before any rotation)."""
        value = key if value is None else value
        return split_heads(self.k_proj(key), self.heads), split_heads(self.v_proj(value), self.heads)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None, *,
                mask: Tensor | None = None, causal: bool = False, need_weights: bool = False,
                q_positions: Tensor | None = None, k_positions: Tensor | None = None,
                cache: KVCache | None = None,
                kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        q = split_heads(self.q_proj(query), self.heads)                   # (B, h, T, d_k)
        if kv is not None:                                                # projected once, earlier
            if self.rotary is not None or cache is not None:
                raise ValueError("MultiHeadAttention: kv= (keys and values projected earlier) cannot be "
                                 "combined with a rotary embedding or a cache")
            k, v = kv
        else:
            k, v = self.keys_values(key, value)                           # (B, h, S, d_k) each
        if self.rotary is not None:
            if cache is not None and q_positions is None and k_positions is None:  # after the cached ones
                q_positions = k_positions = torch.arange(cache.length, cache.length + k.shape[2],
                                                         device=k.device)
            if q_positions is None and k_positions is None:
                q, k = self.rotary(q, k)
            else:
                q, k = self.rotary(q, k, q_positions=q_positions, k_positions=k_positions)
        elif q_positions is not None or k_positions is not None:
            raise ValueError("MultiHeadAttention: q_positions/k_positions are the positions a rotary "
                             "embedding rotates by, but this module has no rotary=")
        if cache is not None:
            k, v = cache.append(k, v)                                     # (B, h, t + S, d_k): all so far
        causal = causal and q.shape[2] > 1  # one query, aligned with the last key, sees every key
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p, causal=causal)
        else:
            kernel = fast_attention if self.kernel is None else self.kernel
            out, weights = kernel(q, k, v, mask, causal, dropout_p), None
        return self.out_proj(merge_heads(out)), weights


def copy_from_torch_mha(src: nn.MultiheadAttention, dst: MultiHeadAttention) -> MultiHeadAttention:
    """Copy an ``nn.MultiheadAttention``'s weights into ``dst`` (same ``d_model``, heads, bias and
    dropout).

    PyTorch packs the three input projections into ``in_proj_weight`` ``(3 d_model, d_model)`` in
    the order query, key, value; each block is one of ``dst``'s ``q_proj``/``k_proj``/``v_proj``.
    A module that computes something ``dst`` cannot (separate ``kdim``/``vdim``, ``add_bias_kv``,
    ``add_zero_attn``) is refused, so that a copy always computes what ``src`` does.
    ``batch_first`` does not matter here (it only changes how ``src`` is called).
    """
    if not isinstance(src, nn.MultiheadAttention):
        raise TypeError(f"copy_from_torch_mha: src must be nn.MultiheadAttention, got {type(src).__name__}")
    if (src.embed_dim, src.num_heads) != (dst.d_model, dst.heads):
        raise ValueError(f"copy_from_torch_mha: src has (d_model, heads)={(src.embed_dim, src.num_heads)}, "
                         f"dst has {(dst.d_model, dst.heads)}")
    if src.in_proj_weight is None:
        raise ValueError("copy_from_torch_mha: src has separate key/value sizes (kdim/vdim); not supported")
    if src.bias_k is not None or src.bias_v is not None:
        raise ValueError("copy_from_torch_mha: src has add_bias_kv=True (a learned extra key and value); "
                         "MultiHeadAttention has no such parameters")
    if src.add_zero_attn:
        raise ValueError("copy_from_torch_mha: src has add_zero_attn=True (an extra all-zero key and value); "
                         "MultiHeadAttention does not add one")
    if (src.in_proj_bias is None) != (dst.q_proj.bias is None):
        raise ValueError("copy_from_torch_mha: src and dst must both have biases or both not")
    if src.dropout != dst.dropout:
        raise ValueError(f"copy_from_torch_mha: src has dropout={src.dropout}, dst has dropout={dst.dropout}")
    with torch.no_grad():
        for i, proj in enumerate((dst.q_proj, dst.k_proj, dst.v_proj)):
            proj.weight.copy_(src.in_proj_weight.chunk(3)[i])
            if proj.bias is not None:
                proj.bias.copy_(src.in_proj_bias.chunk(3)[i])
        dst.out_proj.weight.copy_(src.out_proj.weight)
        if dst.out_proj.bias is not None:
            dst.out_proj.bias.copy_(src.out_proj.bias)
    return dst

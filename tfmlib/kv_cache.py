"""The key-value cache: decode one token at a time without re-reading the prefix.

Introduced in chapter 09 (a decoder-only language model, sampling and the KV cache); it also
speeds up chapter 08's decoding of the encoder-decoder :class:`~tfmlib.transformer.Transformer`,
whose ``decode_step`` keeps a :class:`DecoderCache` as its state.

A causal decoder that has read ``t`` tokens and is asked for token ``t + 1`` computes, in every
layer, a query for the new token only; the keys and values of the first ``t`` tokens are the
ones it computed at earlier steps (each position sees only itself and earlier ones, so nothing
about them changes). Re-running the prefix costs ``O(t)`` work per layer at step ``t`` (``O(n^2)``
per generated sequence, more with the attention scores); keeping the keys and values costs
``O(1)`` projections per step and ``2 * layers * d_model`` numbers of memory per token.

* :class:`KVCache` holds one layer's keys and values ``(B, h, capacity, d_k)``, written in place
  into buffers allocated once (``preallocate=True``) or concatenated at every step
  (``preallocate=False``, for comparison: it copies the whole cache each time);
* :func:`cached_self_attention` runs a :class:`~tfmlib.attention.MultiHeadAttention` for the new
  tokens only, with causal attention aligned bottom-right (the new queries are the *last* of the
  keys) and rotary positions counted from the cache's length;
* :func:`cross_attention_kv` and :func:`cached_cross_attention` project the encoder's output into
  cross-attention keys and values once per source sentence instead of once per step;
* :func:`encoder_layer_step` (a pre-LN or post-LN :class:`~tfmlib.transformer.EncoderLayer` used
  as a causal block, what :mod:`tfmlib.lm` stacks) and :func:`decoder_layer_step` (a
  :class:`~tfmlib.transformer.DecoderLayer`) compute what the layers compute, with the cache;
* :class:`DecoderCache` is the state of a whole stack (one :class:`KVCache` per layer, plus the
  cross-attention keys and values of an encoder-decoder); ``select(rows)`` keeps some batch rows
  (a sentence that finished, a beam that was reordered), which is what :mod:`tfmlib.decoding` calls.

Shapes: ``B`` batch, ``h`` heads, ``d_k`` head width, ``T`` new tokens, ``t`` cached tokens,
``S`` source length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from tfmlib.attention import MultiHeadAttention, fast_attention, merge_heads, split_heads

if TYPE_CHECKING:  # tfmlib.transformer imports this module for its decode_step
    from tfmlib.transformer import DecoderLayer, EncoderLayer

INTRODUCED_IN = 9

# (q, k, v, mask, causal, dropout_p) -> out: fast_attention's arguments, in its order
AttentionKernel = Callable[[Tensor, Tensor, Tensor, "Tensor | None", bool, float], Tensor]

__all__ = ["DecoderCache", "KVCache", "cached_cross_attention", "cached_self_attention", "cross_attention_kv",
           "decoder_layer_step", "encoder_layer_step", "kv_bytes_per_token"]


class KVCache:
    """One layer's cached keys and values, ``(B, h, length, d_k)`` each.

    ``append(k (B, h, T, d_k), v (B, h, T, d_k)) -> (keys, values)`` adds ``T`` new positions and
    returns every cached position's keys and values ``(B, h, length + T, d_k)``. With
    ``preallocate=True`` they are written in place into buffers allocated ahead (the returned
    tensors are views of them): ``initial`` positions on the first call (default: all of
    ``capacity``), doubled (one copy) whenever they are full, so a step copies nothing in the
    common case. With ``preallocate=False`` the new ones are concatenated to the old, which
    copies the whole cache at every step (for comparison). Writing more than ``capacity``
    positions is a ``ValueError``. ``select(rows)`` returns a cache holding only the given batch
    rows (in that order), copying only the positions written so far.
    """

    def __init__(self, capacity: int, *, preallocate: bool = True, initial: int | None = None):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"KVCache: capacity must be a positive int, got {capacity!r}")
        initial = capacity if initial is None else initial
        if not isinstance(initial, int) or isinstance(initial, bool) or initial < 1:
            raise ValueError(f"KVCache: initial must be a positive int, got {initial!r}")
        self.capacity, self.preallocate, self.initial = capacity, preallocate, min(initial, capacity)
        self.length = 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"KVCache.append: k and v must be (batch, heads, new, d_k) of one shape, got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        T = k.shape[2]
        if self.length + T > self.capacity:
            raise ValueError(f"KVCache.append: {self.length} cached + {T} new positions exceed the "
                             f"capacity of {self.capacity}")
        if self.k is not None and (k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]):
            raise ValueError(f"KVCache.append: new keys {tuple(k.shape)} do not match the cache's "
                             f"(batch, heads, ., d_k) = {tuple(self.k.shape)}")
        if not self.preallocate:
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
            self.length += T
            return self.k, self.v
        if self.k is None:
            B, h, _, d = k.shape
            size = max(self.initial, T)
            self.k, self.v = k.new_empty((B, h, size, d)), v.new_empty((B, h, size, d))
        elif self.length + T > self.k.shape[2]:                          # full: double the buffers
            size = min(self.capacity, max(2 * self.k.shape[2], self.length + T))
            k_old, v_old = self.k[:, :, :self.length], self.v[:, :, :self.length]
            self.k = k_old.new_empty((*k_old.shape[:2], size, k_old.shape[3]))
            self.v = v_old.new_empty((*v_old.shape[:2], size, v_old.shape[3]))
            self.k[:, :, :self.length], self.v[:, :, :self.length] = k_old, v_old
        self.k[:, :, self.length:self.length + T] = k
        self.v[:, :, self.length:self.length + T] = v
        self.length += T
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def select(self, rows: Tensor) -> KVCache:
        out = KVCache(self.capacity, preallocate=self.preallocate, initial=self.initial)
        out.length = n = self.length
        if self.k is not None:
            k, v = self.k[:, :, :n].index_select(0, rows), self.v[:, :, :n].index_select(0, rows)
            if self.preallocate:
                out.k = self.k.new_empty((len(rows), *self.k.shape[1:]))
                out.v = self.v.new_empty((len(rows), *self.v.shape[1:]))
                out.k[:, :, :n], out.v[:, :, :n] = k, v
            else:
                out.k, out.v = k, v
        return out

    @property
    def nbytes(self) -> int:
        """The bytes the cache's buffers occupy (allocated capacity when preallocated)."""
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def kv_bytes_per_token(layers: int, d_model: int, dtype: torch.dtype = torch.float32) -> int:
    """The cache's memory per token of one sequence: a key and a value of ``d_model`` numbers
    (``h`` heads of ``d_k``) in every layer: ``2 * layers * d_model * bytes per number``."""
    for name, v in (("layers", layers), ("d_model", d_model)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"kv_bytes_per_token: {name} must be a positive int, got {v!r}")
    return 2 * layers * d_model * torch.empty((), dtype=dtype).element_size()


def cached_self_attention(attn: MultiHeadAttention, x: Tensor, cache: KVCache | None, *,
                          mask: Tensor | None = None, kernel: AttentionKernel | None = None) -> Tensor:
    """Causal self-attention of ``T`` new tokens ``x`` ``(B, T, d_model)`` over the ``t`` cached
    ones and themselves: ``(B, T, d_model)``, what ``attn(prefix_and_x, causal=True)[0][:, -T:]``
    gives, with the new keys and values appended to ``cache``.

    The causal mask is aligned bottom-right (new query ``i`` sees keys ``0 .. t + i``); a rotary
    ``attn.rotary`` rotates the new queries and keys by their positions ``t .. t + T - 1`` (the
    cached keys were rotated when they were written). ``mask`` (bool keep-mask or float bias)
    broadcasts to ``(B, h, T, t + T)``. ``cache=None`` is plain causal self-attention over ``x``
    (``t = 0``, nothing kept: what training runs). ``kernel(q, k, v, mask, causal, dropout_p) ->
    out`` computes the attention (default :func:`~tfmlib.attention.fast_attention`; chapter 10
    swaps in others).
    """
    t = 0 if cache is None else cache.length
    T = x.shape[1]
    q = split_heads(attn.q_proj(x), attn.heads)                           # (B, h, T, d_k)
    k = split_heads(attn.k_proj(x), attn.heads)
    v = split_heads(attn.v_proj(x), attn.heads)
    if attn.rotary is not None:
        positions = torch.arange(t, t + T, device=x.device)
        if hasattr(attn.rotary, "rotate"):  # RotaryEmbedding: queries and keys in one call
            q, k = attn.rotary.rotate(torch.cat([q, k], dim=1), positions).split(attn.heads, dim=1)
        else:
            q, k = attn.rotary(q, k, q_positions=positions, k_positions=positions)
    keys, values = (k, v) if cache is None else cache.append(k, v)      # (B, h, t + T, d_k)
    dropout_p = attn.dropout if attn.training else 0.0
    kernel = fast_attention if kernel is None else kernel
    out = kernel(q, keys, values, mask, T > 1, dropout_p)                 # causal; T = 1 sees every key
    return attn.out_proj(merge_heads(out))


def cross_attention_kv(attn: MultiHeadAttention, memory: Tensor) -> tuple[Tensor, Tensor]:
    """The cross-attention keys and values of the encoder output ``memory`` ``(B, S, d_model)``:
    ``(B, h, S, d_k)`` each, computed once per sentence instead of once per decoding step."""
    return split_heads(attn.k_proj(memory), attn.heads), split_heads(attn.v_proj(memory), attn.heads)


def cached_cross_attention(attn: MultiHeadAttention, x: Tensor, k: Tensor, v: Tensor,
                           mask: Tensor | None = None) -> Tensor:
    """Cross-attention of ``x`` ``(B, T, d_model)`` over precomputed keys and values ``(B, h, S, d_k)``
    (:func:`cross_attention_kv`): what ``attn(x, memory, mask=mask)[0]`` gives."""
    if attn.rotary is not None:
        raise ValueError("cached_cross_attention: a rotary cross-attention has no single key position; "
                         "not supported")
    q = split_heads(attn.q_proj(x), attn.heads)
    dropout_p = attn.dropout if attn.training else 0.0
    return attn.out_proj(merge_heads(fast_attention(q, k, v, mask, dropout_p=dropout_p)))


def encoder_layer_step(layer: EncoderLayer, x: Tensor, cache: KVCache | None, *,
                       kernel: AttentionKernel | None = None) -> Tensor:
    """An :class:`~tfmlib.transformer.EncoderLayer` run as a *causal* block on ``T`` new tokens
    ``x`` ``(B, T, d)`` after the cached ones: what ``layer(prefix_and_x, causal_mask(...))`` gives
    at the last ``T`` positions (pre-LN or post-LN, as the layer is built). ``cache=None`` and
    ``kernel`` as in :func:`cached_self_attention`."""
    if layer.norm_first:
        x = x + layer.dropout1(cached_self_attention(layer.self_attn, layer.norm1(x), cache, kernel=kernel))
        return x + layer.dropout2(layer.ff(layer.norm2(x)))
    x = layer.norm1(x + layer.dropout1(cached_self_attention(layer.self_attn, x, cache, kernel=kernel)))
    return layer.norm2(x + layer.dropout2(layer.ff(x)))


def decoder_layer_step(layer: DecoderLayer, x: Tensor, cache: KVCache, cross_k: Tensor, cross_v: Tensor,
                       memory_mask: Tensor | None = None) -> Tensor:
    """A :class:`~tfmlib.transformer.DecoderLayer` on ``T`` new target tokens ``x`` ``(B, T, d)``
    after the cached ones: what ``layer(prefix_and_x, memory, memory_mask)`` gives at the last ``T``
    positions, with the cross-attention keys and values ``(B, h, S, d_k)`` precomputed."""
    if layer.norm_first:
        x = x + layer.dropout1(cached_self_attention(layer.self_attn, layer.norm1(x), cache))
        x = x + layer.dropout2(cached_cross_attention(layer.cross_attn, layer.norm2(x), cross_k, cross_v,
                                                      memory_mask))
        return x + layer.dropout3(layer.ff(layer.norm3(x)))
    x = layer.norm1(x + layer.dropout1(cached_self_attention(layer.self_attn, x, cache)))
    x = layer.norm2(x + layer.dropout2(cached_cross_attention(layer.cross_attn, x, cross_k, cross_v,
                                                              memory_mask)))
    return layer.norm3(x + layer.dropout3(layer.ff(x)))


@dataclass
class DecoderCache:
    """The decoding state of a stack: one :class:`KVCache` per layer and, for an encoder-decoder,
    each layer's cross-attention keys and values ``(B, h, S, d_k)`` and the source mask ``(B, S)``.

    ``length`` is the number of tokens read so far (the position of the next one). ``select(rows)``
    keeps the given batch rows of everything (what :mod:`tfmlib.decoding` calls when sentences
    finish or beams are reordered); ``nbytes`` is the self-attention caches' memory.
    """

    layers: list[KVCache]
    cross: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    memory_mask: Tensor | None = None

    @classmethod
    def empty(cls, num_layers: int, capacity: int, *, preallocate: bool = True, initial: int | None = None,
              cross: list[tuple[Tensor, Tensor]] | None = None,
              memory_mask: Tensor | None = None) -> DecoderCache:
        """A cache with nothing read yet, for ``num_layers`` layers (see :class:`KVCache`)."""
        return cls([KVCache(capacity, preallocate=preallocate, initial=initial) for _ in range(num_layers)],
                   list(cross or []), memory_mask)

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def select(self, rows: Tensor) -> DecoderCache:
        return DecoderCache([c.select(rows) for c in self.layers],
                            [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross],
                            None if self.memory_mask is None else self.memory_mask.index_select(0, rows))

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)

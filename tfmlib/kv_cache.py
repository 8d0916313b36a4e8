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

This module holds the cache's *types* only, and imports nothing from the package:

* :class:`KVCache` holds one layer's keys and values ``(B, h, length, d_k)``, written into buffers
  allocated once (``preallocate=True``) or concatenated at every step (``preallocate=False``, for
  comparison: it copies the whole cache each time);
* :class:`DecoderCache` is the state of a whole stack (one :class:`KVCache` per layer, plus the
  cross-attention keys and values of an encoder-decoder); ``select(rows)`` keeps some batch rows
  (a sentence that finished, a beam that was reordered), which is what :mod:`tfmlib.decoding` calls;
* :func:`kv_bytes_per_token` is the memory the cache costs.

The layers use the cache themselves: :class:`~tfmlib.attention.MultiHeadAttention` takes
``cache=`` (append this call's keys and values, attend over all of them) and ``kv=`` (keys and
values projected once, for cross-attention), and :class:`~tfmlib.transformer.EncoderLayer`,
:class:`~tfmlib.transformer.DecoderLayer` and :class:`~tfmlib.transformer.Decoder` pass them on, so
training and cached decoding run the same code. Those modules name the types from here in their
type hints, and :meth:`tfmlib.transformer.Decoder.new_cache` builds one (this module depends on
nothing in the package, so there is no import circle; chapter 07's reader meets the cache only as
optional arguments and in :func:`tfmlib.transformer.cached_decode_step`).

**A step does not change its input state.** ``Transformer.decode_step`` and ``DecoderLM.step``
:meth:`~DecoderCache.fork` the state they are given and return the extended fork, so the same step
twice from one state gives the same logits, and two continuations of one state (beam search, a
sampler trying alternatives) do not see each other's tokens. A fork copies nothing: the forks share
the pre-allocated buffers, and :meth:`KVCache.append` writes in place while nobody has written past
its length (the linear path of generation: no copy per step); a cache whose next positions another
fork has already written copies its own positions to new buffers first (copy on write).

Shapes: ``B`` batch, ``h`` heads, ``d_k`` head width, ``T`` new tokens, ``t`` cached tokens,
``S`` source length.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor

INTRODUCED_IN = 9

__all__ = ["DecoderCache", "KVCache", "kv_bytes_per_token"]


class KVCache:
    """One layer's cached keys and values, ``(B, h, length, d_k)`` each.

    ``append(k (B, h, T, d_k), v (B, h, T, d_k)) -> (keys, values)`` adds ``T`` new positions and
    returns every cached position's keys and values ``(B, h, length + T, d_k)``. With
    ``preallocate=True`` they are written into buffers ``k`` and ``v`` allocated ahead (the returned
    tensors are views of them): ``initial`` positions on the first call (default: all of
    ``capacity``), doubled (one copy) whenever they are full, so a step copies nothing in the
    common case. With ``preallocate=False`` the new ones are concatenated to the old, which
    copies the whole cache at every step (for comparison). Writing more than ``capacity``
    positions is a ``ValueError``.

    ``fork()`` returns a cache with the same positions that shares the buffers (nothing copied);
    appending to one of the two never changes what the other holds: a cache whose next positions
    were already written by another cache on the same buffers copies its ``length`` positions to
    new buffers before it writes (copy on write). ``select(rows)`` returns a cache holding only
    the given batch rows (in that order), copying only the positions written so far.
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
        # pre-allocated: how many positions of the buffers k and v have been written, by this cache
        # or by any fork of it (a one-element list, shared by the caches on the same buffers)
        self._written: list[int] = [0]

    def _new_buffers(self, size: int) -> None:
        """Move this cache's ``length`` positions into new buffers of ``size`` positions."""
        n, k_old, v_old = self.length, self.k, self.v
        self.k = k_old.new_empty((*k_old.shape[:2], size, k_old.shape[3]))
        self.v = v_old.new_empty((*v_old.shape[:2], size, v_old.shape[3]))
        self.k[:, :, :n], self.v[:, :, :n] = k_old[:, :, :n], v_old[:, :, :n]
        self._written = [n]

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
            self._written = [0]
        elif self.length + T > self.k.shape[2]:                          # full: double the buffers
            self._new_buffers(min(self.capacity, max(2 * self.k.shape[2], self.length + T)))
        elif self._written[0] != self.length:  # a fork wrote our next positions: copy ours, then write
            self._new_buffers(self.k.shape[2])
        self.k[:, :, self.length:self.length + T] = k
        self.v[:, :, self.length:self.length + T] = v
        self.length += T
        self._written[0] = self.length
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def fork(self) -> KVCache:
        """The same positions, sharing the buffers (nothing is copied; see the class docstring)."""
        return copy.copy(self)  # shares k, v and the written-positions counter

    def select(self, rows: Tensor) -> KVCache:
        out = KVCache(self.capacity, preallocate=self.preallocate, initial=self.initial)
        out.length = n = self.length
        if self.k is not None:
            k, v = self.k[:, :, :n].index_select(0, rows), self.v[:, :, :n].index_select(0, rows)
            if self.preallocate:
                out.k = self.k.new_empty((len(rows), *self.k.shape[1:]))
                out.v = self.v.new_empty((len(rows), *self.v.shape[1:]))
                out.k[:, :, :n], out.v[:, :, :n] = k, v
                out._written = [n]
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


@dataclass
class DecoderCache:
    """The decoding state of a stack: one :class:`KVCache` per layer and, for an encoder-decoder,
    each layer's cross-attention keys and values ``(B, h, S, d_k)`` (projected once per sentence;
    the source mask stays with the encoder's output).

    ``length`` is the number of tokens read so far (the position of the next one). ``fork()`` is
    the same state sharing every buffer (what a step extends, leaving its input alone);
    ``select(rows)`` keeps the given batch rows of everything (what :mod:`tfmlib.decoding` calls
    when sentences finish); ``select_beams(rows)`` reorders beams within sentences and leaves the
    cross-attention keys and values alone; ``nbytes`` is the self-attention caches' memory.
    """

    layers: list[KVCache]
    cross: list[tuple[Tensor, Tensor]] = field(default_factory=list)

    @classmethod
    def empty(cls, num_layers: int, capacity: int, *, preallocate: bool = True, initial: int | None = None,
              cross: list[tuple[Tensor, Tensor]] | None = None) -> DecoderCache:
        """A cache with nothing read yet, for ``num_layers`` layers (see :class:`KVCache`)."""
        return cls([KVCache(capacity, preallocate=preallocate, initial=initial) for _ in range(num_layers)],
                   list(cross or []))

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def fork(self) -> DecoderCache:
        return DecoderCache([c.fork() for c in self.layers], list(self.cross))

    def select(self, rows: Tensor) -> DecoderCache:
        return DecoderCache([c.select(rows) for c in self.layers],
                            [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross])

    def select_beams(self, rows: Tensor) -> DecoderCache:
        """:meth:`select` for ``rows`` that only reorder the beams *within* each sentence (row ``r``
        of the result comes from a row of the same sentence): the self-attention caches are
        selected, and the cross-attention keys and values, the same for every beam of a sentence,
        are kept as they are, not copied (beam search reorders beams at every step)."""
        return DecoderCache([c.select(rows) for c in self.layers], list(self.cross))

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)

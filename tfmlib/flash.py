"""FlashAttention's algorithm written out in plain PyTorch: the online softmax and tiled attention.

Introduced in chapter 10 (scaling up). The fused kernels behind ``F.scaled_dot_product_attention``
(FlashAttention, the memory-efficient kernel) compute exactly what chapter 05's explicit
:func:`tfmlib.attention.scaled_dot_product_attention` computes, but never store the ``(T, S)``
matrix of scores. This module spells out how, so that a reader can check every line:

* :func:`online_softmax` is a softmax computed by reading its row in blocks, keeping only a
  running maximum ``m`` and a running sum ``ell`` (Milakov and Gimelshein 2018, "Online normalizer
  calculation for softmax"). When a block ``b`` arrives::

      m_new = max(m, max(b))
      ell   = ell * exp(m - m_new) + sum(exp(b - m_new))      # old terms rescaled to the new max
      m     = m_new

  and at the end ``softmax(x) = exp(x - m) / ell`` (the papers' script l).
  Subtracting the running maximum keeps every ``exp`` at most 1, so it never overflows where a
  naive ``exp(x) / sum(exp(x))`` does.
* :func:`tiled_attention` is FlashAttention's forward pass (Dao et al. 2022, Algorithm 1; Dao
  2023, "FlashAttention-2", Algorithm 1): for each block of ``block_q`` queries it loops over the
  keys in blocks of ``block_k``, computes one ``(block_q, block_k)`` tile of scores, and keeps
  per query a running max, a running sum and an *un-normalised* output, rescaled by
  ``exp(m_old - m_new)`` when a block raises the maximum; the output is divided by the sum once,
  at the end. Only tiles are ever materialised. With ``causal=True`` the key blocks that lie
  entirely above the diagonal are skipped without computing anything: that is where a causal
  kernel's speed-up (about half the work for ``T == S``) comes from.

  The backward pass recomputes instead of storing (FlashAttention-2's backward): the forward saves
  ``q, k, v``, the output ``O`` and one number per query, the log-sum-exp ``L = m + log(ell)``
  (``(B, h, T)``: O(T) memory, no ``T x S`` tensor). The backward rebuilds each tile's
  probabilities ``P = exp(S - L)``, and with ``D = rowsum(dO * O)`` (which equals
  ``rowsum(P * dP)``) the softmax's gradient is ``dS = P * (dP - D)``; ``dq``, ``dk``, ``dv`` are
  accumulated tile by tile.
* :func:`saved_tensor_bytes` measures what autograd keeps for the backward pass while a function
  runs, with ``torch.autograd.graph.saved_tensors_hooks``: the explicit attention saves
  ``(B, h, T, S)`` tensors, :func:`tiled_attention` only tensors of ``T`` or ``S`` rows.

**This is slow where it counts**: the loops over tiles run in Python, one small matrix product
per tile, so with small tiles the cost is Python's and the kernel launches', not the arithmetic.
On a GPU that is thousands of small kernels where a fused kernel runs one, with the tiles in
on-chip memory; on a CPU, with blocks of 64 and a causal mask (half the tiles skipped) it is in
the range of the explicit attention, and with small blocks it is many times slower than both
(``benchmarks/attention_backends.py`` measures it next to the explicit attention and PyTorch's
kernels). It is here to be read and tested (``tests/test_flash.py`` checks it against
``F.scaled_dot_product_attention``, forward and backward), not to train with.

Conventions are the book's (see :mod:`tfmlib.attention`): ``q`` is scaled by ``1 / sqrt(d)``
before the product; ``key_padding_mask`` is ``True`` at real keys (may attend); ``causal=True``
aligns the ``T`` queries with the *last* ``T`` keys when ``T < S`` (bottom-right, like
:func:`tfmlib.attention.causal_mask`; PyTorch's ``is_causal=True`` is the same when ``T == S``);
a query that may see no key gets a zero output and zero gradients.

Shapes: ``B`` batch, ``h`` heads, ``T`` queries, ``S`` keys and values, ``d`` the width of
queries and keys, ``d_v`` the width of values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, overload

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tfmlib.attention import check_qkv
from tfmlib.positional import check_positive_int

INTRODUCED_IN = 10

__all__ = ["online_softmax", "saved_tensor_bytes", "tiled_attention"]


def _safe_max(m: Tensor) -> Tensor:
    """``m`` with ``-inf`` replaced by 0: the shift used in ``exp(x - shift)``. A row whose maximum
    is still ``-inf`` has seen only masked entries; shifting by 0 keeps ``exp(-inf - 0) = 0``
    instead of ``exp(-inf - (-inf)) = nan``."""
    return torch.where(m == -math.inf, torch.zeros_like(m), m)


# --------------------------------------------------------------------------- online softmax


@overload
def online_softmax(x: Tensor, block_size: int) -> Tensor: ...
@overload
def online_softmax(x: Tensor, block_size: int, *, return_trace: bool) -> Any: ...


def online_softmax(x: Tensor, block_size: int, *, return_trace: bool = False) -> Any:
    """Softmax over the last dimension of ``x``, reading that dimension in blocks of ``block_size``.

    ``x`` ``(..., n)`` floating. One pass over the blocks keeps, for every row, the running
    maximum ``m`` and the running sum ``ell = sum(exp(x_seen - m))``; a block ``b`` updates them as
    ``m_new = max(m, max(b))``, ``ell = ell * exp(m - m_new) + sum(exp(b - m_new))``. A second pass
    returns ``exp(x - m) / ell``. Equal to ``torch.softmax(x, -1)``, except that a row that is all
    ``-inf`` gives zeros (``torch.softmax`` gives NaN there), the book's rule for a query that may
    see nothing. The last block may be shorter than ``block_size``.

    With ``return_trace=True`` returns ``(probabilities, trace)``, ``trace`` a list with one
    ``(m, ell)`` pair (each ``(...)``, the row's shape) per block: the running values after that
    block, for printing a worked example.
    """
    who = "online_softmax"
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{who}: x must be a floating tensor, got {got}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{who}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    check_positive_int(who, "block_size", block_size)
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)   # running max
    ell = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)           # running sum
    trace: list[tuple[Tensor, Tensor]] = []
    for start in range(0, n, block_size):
        block = x[..., start:start + block_size]                              # (..., <= block_size)
        m_new = torch.maximum(m, block.amax(dim=-1))
        shift = _safe_max(m_new)
        ell = ell * torch.exp(m - shift) + torch.exp(block - shift[..., None]).sum(dim=-1)
        m = m_new
        if return_trace:
            trace.append((m.clone(), ell.clone()))
    probs = torch.exp(x - _safe_max(m)[..., None]) / ell[..., None]
    probs = torch.where((ell == 0)[..., None], torch.zeros_like(probs), probs)  # all -inf -> zeros
    return (probs, trace) if return_trace else probs


# --------------------------------------------------------------------------- tiled attention


def _tile_keep(i0: int, i1: int, j0: int, j1: int, offset: int, causal: bool,
               key_keep: Tensor | None, device: torch.device) -> Tensor | None:
    """The keep-mask of the tile (queries ``i0:i1``, keys ``j0:j1``), broadcasting to
    ``(B, h, i1 - i0, j1 - j0)``, or ``None`` when every entry of the tile may be attended."""
    keep = None if key_keep is None else key_keep[:, None, None, j0:j1]       # (B, 1, 1, bk)
    if causal and j1 - 1 > i0 + offset:            # the tile crosses the diagonal: mask part of it
        rows = torch.arange(i0, i1, device=device)[:, None]
        cols = torch.arange(j0, j1, device=device)[None, :]
        tri = cols <= rows + offset                                           # (bq, bk)
        keep = tri if keep is None else keep & tri
    return keep


def _forward(q: Tensor, k: Tensor, v: Tensor, key_keep: Tensor | None, causal: bool, block_q: int,
             block_k: int) -> tuple[Tensor, Tensor]:
    """FlashAttention's forward loop. Returns ``(out (B, h, T, d_v), L (B, h, T))`` in the
    working dtype (at least float32), ``L`` the log-sum-exp of each query's scores (``+inf`` for
    a query that may see no key)."""
    B, h, T, d = q.shape
    S, d_v = k.shape[-2], v.shape[-1]
    offset = S - T                                 # bottom-right: query i sees keys 0 .. i + offset
    qs = q / math.sqrt(d)                          # scale q first, as tfmlib.attention does
    out = q.new_empty(B, h, T, d_v)
    lse = q.new_empty(B, h, T)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        qi = qs[:, :, i0:i1]                                                  # (B, h, bq, d)
        m = q.new_full((B, h, i1 - i0), -math.inf)                            # running max
        ell = q.new_zeros(B, h, i1 - i0)                                      # running sum
        acc = q.new_zeros(B, h, i1 - i0, d_v)                                 # un-normalised output
        for j0 in range(0, S, block_k):
            if causal and j0 > i1 - 1 + offset:
                break              # this key block and all later ones lie above the diagonal: skipped
            j1 = min(j0 + block_k, S)
            s = qi @ k[:, :, j0:j1].transpose(-2, -1)                         # (B, h, bq, bk) tile
            keep = _tile_keep(i0, i1, j0, j1, offset, causal, key_keep, q.device)
            if keep is not None:
                s = s.masked_fill(~keep, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1))
            shift = _safe_max(m_new)
            p = torch.exp(s - shift[..., None])                               # (B, h, bq, bk)
            alpha = torch.exp(m - shift)                  # rescales what was summed under the old max
            ell = alpha * ell + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, j0:j1]
            m = m_new
        empty = ell == 0                                                        # saw no key at all
        out[:, :, i0:i1] = torch.where(empty[..., None], torch.zeros_like(acc),
                                       acc / torch.where(empty, torch.ones_like(ell), ell)[..., None])
        lse[:, :, i0:i1] = torch.where(empty, torch.full_like(ell, math.inf),
                                       m + torch.log(torch.where(empty, torch.ones_like(ell), ell)))
    return out, lse


def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              key_keep: Tensor | None, causal: bool, block_q: int,
              block_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2's backward by recomputation: outer loop over key blocks, inner loop over
    query blocks; each tile's probabilities are rebuilt from the saved log-sum-exp."""
    T, d = q.shape[-2], q.shape[-1]
    S = k.shape[-2]
    offset = S - T
    scale = 1.0 / math.sqrt(d)
    qs = q * scale
    D = (dout * out).sum(dim=-1)                   # (B, h, T): rowsum(dO * O) = rowsum(P * dP)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j0 in range(0, S, block_k):
        j1 = min(j0 + block_k, S)
        kj, vj = k[:, :, j0:j1], v[:, :, j0:j1]
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            if causal and j0 > i1 - 1 + offset:
                continue                                  # tile above the diagonal: P is zero there
            s = qs[:, :, i0:i1] @ kj.transpose(-2, -1)                        # (B, h, bq, bk)
            keep = _tile_keep(i0, i1, j0, j1, offset, causal, key_keep, q.device)
            if keep is not None:
                s = s.masked_fill(~keep, -math.inf)
            p = torch.exp(s - lse[:, :, i0:i1, None])                         # the forward's P
            do = dout[:, :, i0:i1]                                            # (B, h, bq, d_v)
            dv[:, :, j0:j1] += p.transpose(-2, -1) @ do
            dp = do @ vj.transpose(-2, -1)                                    # (B, h, bq, bk)
            ds = p * (dp - D[:, :, i0:i1, None])                              # softmax's backward
            dq[:, :, i0:i1] += (ds @ kj) * scale          # s = (q * scale) k^T
            dk[:, :, j0:j1] += ds.transpose(-2, -1) @ qs[:, :, i0:i1]
    return dq, dk, dv


class _TiledAttention(torch.autograd.Function):
    """``tiled_attention`` as an autograd function: saves ``q, k, v, out``, the log-sum-exp and the
    key mask only (all through ``save_for_backward``, so autograd checks them for in-place changes
    and saved-tensor hooks see them), and recomputes the tiles in the backward pass."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, key_keep: Tensor | None, causal: bool,
                block_q: int, block_k: int) -> Tensor:
        work = torch.promote_types(q.dtype, torch.float32)   # accumulate half / bf16 in float32
        qw, kw, vw = q.to(work), k.to(work), v.to(work)
        out, lse = _forward(qw, kw, vw, key_keep, causal, block_q, block_k)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, key_keep)    # key_keep may be None
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, key_keep = ctx.saved_tensors
        work = lse.dtype
        dq, dk, dv = _backward(dout.to(work), q.to(work), k.to(work), v.to(work), out.to(work), lse,
                               key_keep, ctx.causal, ctx.block_q, ctx.block_k)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                    key_padding_mask: Tensor | None = None, block_q: int = 64,
                    block_k: int = 64) -> Tensor:
    """Attention computed tile by tile, as FlashAttention does; never builds the ``(T, S)`` matrix.

    ``q`` ``(B, h, T, d)``, ``k`` ``(B, h, S, d)``, ``v`` ``(B, h, S, d_v)``, one floating dtype
    and one device; ``key_padding_mask`` ``(B, S)`` bool, ``True`` at real keys (the book's
    convention: may attend). ``causal=True`` lets query ``i`` see keys ``0 .. i + S - T``
    (bottom-right, as :func:`tfmlib.attention.causal_mask`; needs ``S >= T``); key blocks wholly
    above the diagonal are skipped. Returns ``out`` ``(B, h, T, d_v)`` in ``q``'s dtype, equal to
    ``tfmlib.attention.scaled_dot_product_attention(q, k, v, padding_mask(key_padding_mask),
    causal=causal)[0]``; a query that may see no key gets zeros. float16 and bfloat16 inputs are
    accumulated in float32, as the fused kernels do.

    Differentiable: the backward pass recomputes each ``(block_q, block_k)`` tile from the saved
    per-query log-sum-exp (see the module docstring), so autograd keeps O(T + S) numbers per head,
    not O(T S). Python loops over tiles: for reading and testing, not for training (see the module
    docstring for how slow).
    """
    who = "tiled_attention"
    check_qkv(q, k, v, who)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{who}: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{who}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, h, T, d = q.shape
    S = k.shape[-2]
    if min(T, S, d, v.shape[-1], B, h) == 0:
        raise ValueError(f"{who}: empty input (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    check_positive_int(who, "block_q", block_q)
    check_positive_int(who, "block_k", block_k)
    if not isinstance(causal, bool):
        raise TypeError(f"{who}: causal must be a bool, got {type(causal).__name__}")
    if causal and S < T:
        raise ValueError(f"{who}: causal=True needs at least as many keys as queries (S >= T), got "
                         f"T={T}, S={S}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            got = (key_padding_mask.dtype if isinstance(key_padding_mask, Tensor)
                   else type(key_padding_mask).__name__)
            raise TypeError(f"{who}: key_padding_mask must be a bool tensor (True = a real key), got {got}")
        if tuple(key_padding_mask.shape) != (B, S):
            raise ValueError(f"{who}: key_padding_mask must be (batch, keys) = {(B, S)}, got "
                             f"{tuple(key_padding_mask.shape)}")
        if key_padding_mask.device != q.device:
            raise ValueError(f"{who}: key_padding_mask is on {key_padding_mask.device}, q on {q.device}")
    return _TiledAttention.apply(q, k, v, key_padding_mask, causal, block_q, block_k)


# --------------------------------------------------------------------------- memory


def saved_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Bytes autograd saves for the backward pass while ``fn()`` runs (its result is dropped).

    Every tensor an operation saves for backward passes through a
    ``torch.autograd.graph.saved_tensors_hooks`` pack hook; the bytes of each distinct storage are
    counted once (an input saved by several operations, or a view of a saved tensor, is not
    counted twice). This includes saved inputs and parameters, not only intermediates: it is the
    memory a backward pass needs kept alive, which for attention is dominated by the ``(B, h, T,
    S)`` weights of the explicit path and absent from :func:`tiled_attention` and the fused
    kernels. ``fn`` must run with grad enabled and take inputs that require grad, or nothing is
    saved (the result is then 0).
    """
    storages: dict[tuple[str, int], int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        storages[(str(t.device), storage.data_ptr())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())

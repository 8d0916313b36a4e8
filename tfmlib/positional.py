"""Positions for attention: sinusoidal encodings, learned embeddings and rotary embeddings.

Introduced in chapter 06 (positional encoding). Self-attention is permutation equivariant: it
treats its input as a set. These modules give it the order of the sequence back.

* :func:`sinusoidal_encoding` is the table of Vaswani et al. (2017, section 3.5),
  ``PE[p, 2i] = sin(p / base^(2i/d))`` and ``PE[p, 2i+1] = cos(p / base^(2i/d))``;
  :class:`SinusoidalPositionalEncoding` adds it to a batch of embeddings, for any length.
* :class:`LearnedPositionalEmbedding` adds one trained vector per position, for positions below
  its ``max_len`` only (a longer sequence is a clear error: there is no vector to add).
* :class:`RotaryEmbedding` (Su et al. 2021, "RoFormer") rotates queries and keys by an angle
  proportional to their position, so that their dot product depends on the *relative* offset
  only. It plugs into :class:`tfmlib.attention.MultiHeadAttention` as ``rotary=``.
* :func:`sinusoidal_offset_matrix` is the linear map that moves a sinusoidal encoding ``k``
  positions on: ``PE[p + k] = PE[p] @ M_k^T`` for every ``p``, the property the paper gives as its
  reason for choosing sinusoids.

Shapes: ``B`` batch, ``L`` sequence length, ``d`` model width, ``h`` heads, ``d_k`` head width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

INTRODUCED_IN = 6

__all__ = [
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "check_embeddings",
    "check_positive_int",
    "sinusoidal_encoding",
    "sinusoidal_offset_matrix",
]


def check_positive_int(who: str, name: str, value: object) -> None:
    """Raise ``ValueError`` naming ``who`` and ``name`` unless ``value`` is an int >= 1 (not a bool)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{who}: {name} must be a positive int, got {value!r}")


def _frequencies(d: int, base: float) -> Tensor:
    """``omega_i = base^(-2i/d)`` for ``i = 0 .. ceil(d/2) - 1`` (float64)."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def sinusoidal_encoding(length: int, d_model: int, base: float = 10_000.0, offset: int = 0) -> Tensor:
    """``(length, d_model)`` float32 table: row ``p`` encodes position ``offset + p``.

    Even columns ``2i`` hold ``sin(p * omega_i)`` and odd columns ``2i + 1`` hold
    ``cos(p * omega_i)``, with ``omega_i = base^(-2i / d_model)``: wavelengths from ``2 pi`` to
    ``2 pi * base``. Computed in float64, then rounded.
    """
    check_positive_int("sinusoidal_encoding", "length", length)
    check_positive_int("sinusoidal_encoding", "d_model", d_model)
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"sinusoidal_encoding: offset must be an int >= 0, got {offset!r}")
    if not base > 1:
        raise ValueError(f"sinusoidal_encoding: base must be > 1, got {base!r}")
    pos = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]
    angles = pos * _frequencies(d_model, base)[None, :]                  # (L, ceil(d/2))
    table = torch.empty(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.float()


def sinusoidal_offset_matrix(offset: int, d_model: int, base: float = 10_000.0) -> Tensor:
    """``(d_model, d_model)`` matrix ``M`` with ``PE[p + offset] = M @ PE[p]`` for every ``p``.

    Block diagonal: each (sin, cos) pair of frequency ``omega_i`` is rotated by the angle
    ``offset * omega_i`` (the angle-addition formulas). It depends on the offset, not on ``p``:
    the linear relation between positions that Vaswani et al. (2017, section 3.5) point to.
    ``d_model`` must be even.
    """
    check_positive_int("sinusoidal_offset_matrix", "d_model", d_model)
    if d_model % 2:
        raise ValueError(f"sinusoidal_offset_matrix: d_model must be even, got {d_model}")
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(_frequencies(d_model, base).tolist()):
        angle = torch.tensor(offset * w, dtype=torch.float64)
        c, s = torch.cos(angle), torch.sin(angle)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
        M[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.stack([torch.stack([c, s]), torch.stack([-s, c])])
    return M


def check_embeddings(who: str, x: Tensor, d_model: int) -> None:
    """Raise ``ValueError`` naming ``who`` unless ``x`` is a ``(batch, length, d_model)`` tensor."""
    if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != d_model:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{who}: x must be (batch, length, d_model={d_model}) embeddings, got {got}")


class SinusoidalPositionalEncoding(nn.Module):
    """``x + PE[offset : offset + L]`` (then dropout), for a batch of embeddings ``x`` ``(B, L, d)``.

    The table has no parameters and no limit: it is computed for the longest sequence seen so far
    and extended when a longer one comes. ``offset`` shifts the positions (for a decoder that
    feeds one token at a time).
    """

    def __init__(self, d_model: int, dropout: float = 0.0, base: float = 10_000.0, max_len: int = 512):
        super().__init__()
        check_positive_int("SinusoidalPositionalEncoding", "d_model", d_model)
        self.d_model, self.base = d_model, base
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("table", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_embeddings("SinusoidalPositionalEncoding", x, self.d_model)
        end = offset + x.shape[1]
        if end > self.table.shape[0]:  # a longer sequence than any before: extend the table
            self.table = sinusoidal_encoding(max(end, 2 * self.table.shape[0]), self.d_model,
                                             self.base).to(self.table.device)
        return self.dropout(x + self.table[offset:end].to(x.dtype))


class LearnedPositionalEmbedding(nn.Module):
    """``x + P[offset : offset + L]`` (then dropout) with ``P`` a trained ``(max_len, d)`` table.

    Positions at or beyond ``max_len`` have no embedding: asking for one raises ``ValueError``.
    Initialised like token embeddings (normal, std ``d ** -0.5`` here, to match the scale of
    the sinusoids' entries).
    """

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.0):
        super().__init__()
        check_positive_int("LearnedPositionalEmbedding", "max_len", max_len)
        check_positive_int("LearnedPositionalEmbedding", "d_model", d_model)
        self.max_len, self.d_model = max_len, d_model
        self.table = nn.Parameter(torch.randn(max_len, d_model) * d_model ** -0.5)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_embeddings("LearnedPositionalEmbedding", x, self.d_model)
        end = offset + x.shape[1]
        if end > self.max_len:
            raise ValueError(f"LearnedPositionalEmbedding: positions up to {end - 1} asked for, but the "
                             "table "
                             f"was trained for positions 0..{self.max_len - 1} (max_len={self.max_len}); a "
                             "learned table has nothing to add beyond it")
        return self.dropout(x + self.table[offset:end].to(x.dtype))


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021): rotate queries and keys by their positions.

    Feature ``i`` and feature ``i + d_k/2`` of a head form a 2-D pair that, at position ``p``, is
    rotated by the angle ``p * omega_i`` with ``omega_i = base^(-2i / d_k)``. Rotations compose, so
    ``<R_p q, R_s k> = <q, R_{s-p} k>``: the score of a query and a key depends on their content and
    on the offset ``s - p``, not on ``p`` itself. (Pairing ``i`` with ``i + d_k/2`` rather than
    neighbours is a fixed permutation of the features; the maths is the same and it is cheaper.)

    ``forward(q (B, h, T, d_k), k (B, h, S, d_k)) -> (q, k)`` rotated, queries at positions
    ``S - T .. S - 1`` (the last ``T`` of the keys' positions ``0 .. S - 1``). ``d_k`` must be even.
    """

    def __init__(self, d_k: int, base: float = 10_000.0):
        super().__init__()
        check_positive_int("RotaryEmbedding", "d_k", d_k)
        if d_k % 2:
            raise ValueError(f"RotaryEmbedding: the head width d_k must be even, got {d_k}")
        self.d_k = d_k
        self.register_buffer("omega", _frequencies(d_k, base).float(), persistent=False)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x`` ``(..., L, d_k)`` by ``positions`` ``(L,)``."""
        if x.shape[-1] != self.d_k:
            raise ValueError(f"RotaryEmbedding: expected head width d_k={self.d_k}, got shape "
                             f"{tuple(x.shape)}")
        angles = positions.to(self.omega.dtype)[:, None] * self.omega[None, :]   # (L, d_k/2)
        cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
        x1, x2 = x[..., : self.d_k // 2], x[..., self.d_k // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        T, S = q.shape[-2], k.shape[-2]
        if S < T:
            raise ValueError(f"RotaryEmbedding: {T} queries but only {S} keys; the queries must be the "
                             "last positions of the keys' sequence (self-attention)")
        positions = torch.arange(S, device=q.device)
        return self.rotate(q, positions[S - T:]), self.rotate(k, positions)

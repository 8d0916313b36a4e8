"""Positions for attention: sinusoidal encodings, learned embeddings and rotary embeddings.

Introduced in chapter 06 (positional encoding). Self-attention is permutation equivariant: it
treats its input as a set. These modules give it the order of the sequence back.

* :func:`sinusoidal_encoding` is the table of Vaswani et al. (2017, section 3.5),
  ``PE[p, 2i] = sin(p / base^(2i/d))`` and ``PE[p, 2i+1] = cos(p / base^(2i/d))``;
  :class:`SinusoidalPositionalEncoding` adds it to a batch of embeddings, for positions below
  its ``max_len`` (the table is computed once, in ``__init__``).
* :class:`LearnedPositionalEmbedding` adds one trained vector per position, for positions below
  its ``max_len`` only (a longer sequence is a clear error: there is no vector to add).
* :class:`RotaryEmbedding` (Su et al. 2021, "RoFormer") rotates queries and keys by an angle
  proportional to their position, so that their dot product depends on the *relative* offset
  only. It plugs into :class:`tfmlib.attention.MultiHeadAttention` as ``rotary=``, with
  explicit query and key positions where they are not ``0 .. L - 1`` (a KV cache, left padding).
* :func:`sinusoidal_offset_matrix` is the linear map that moves a sinusoidal encoding ``k``
  positions on: ``PE[p + k] = PE[p] @ M_k^T`` for every ``p``, the property the paper gives as its
  reason for choosing sinusoids.

Bad input gets a ``ValueError`` naming the argument: a negative ``offset``, a ``base`` that is
not a number above 1 (it would give frequencies that grow, or NaN), positions past ``max_len``,
positions that are not an integer tensor of the right length. :func:`check_positive_int` and
:func:`check_embeddings` are the argument checks the classes share (chapter 06 and
:mod:`tfmlib.relative_position` use them too).

Shapes: ``B`` batch, ``L`` sequence length, ``d`` model width, ``h`` heads, ``d_k`` head width.
"""

from __future__ import annotations

import math

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


def check_embeddings(who: str, x: Tensor, d_model: int) -> None:
    """Raise ``ValueError`` naming ``who`` unless ``x`` is a ``(batch, length, d_model)`` tensor."""
    if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != d_model:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{who}: x must be (batch, length, d_model={d_model}) embeddings, got {got}")


def _check_offset(who: str, offset: object) -> None:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"{who}: offset must be an int >= 0 (the position of the first row), got {offset!r}")


def _check_base(who: str, base: object) -> None:
    # base <= 1 gives frequencies base^(-2i/d) that do not fall (1: all equal, < 1: growing), and a
    # negative base gives NaN for every fractional power
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"{who}: base must be a finite number > 1 (the frequencies are base^(-2i/d)), "
                         f"got {base!r}")


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
    _check_offset("sinusoidal_encoding", offset)
    _check_base("sinusoidal_encoding", base)
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
    ``offset`` may be negative (a shift back); ``d_model`` must be even. (This is a property of
    the sinusoidal table, not one of the relative position schemes of
    :mod:`tfmlib.relative_position`.)
    """
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueError(f"sinusoidal_offset_matrix: offset must be an int, got {offset!r}")
    check_positive_int("sinusoidal_offset_matrix", "d_model", d_model)
    if d_model % 2:
        raise ValueError(f"sinusoidal_offset_matrix: d_model must be even, got {d_model}")
    _check_base("sinusoidal_offset_matrix", base)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(_frequencies(d_model, base).tolist()):
        angle = torch.tensor(offset * w, dtype=torch.float64)
        c, s = torch.cos(angle), torch.sin(angle)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
        M[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.stack([torch.stack([c, s]), torch.stack([-s, c])])
    return M


class SinusoidalPositionalEncoding(nn.Module):
    """``x + PE[offset : offset + L]`` (then dropout), for a batch of embeddings ``x`` ``(B, L, d)``.

    The table has no parameters. It is computed once, in ``__init__``, for positions
    ``0 .. max_len - 1``, and ``forward`` only reads it (no side effect: the module behaves the
    same under ``torch.compile`` and in replicas); a position at or past ``max_len`` is a
    ``ValueError`` that says to build the module with a larger ``max_len``. ``offset`` shifts the
    positions (for a decoder that feeds one token at a time).
    """

    def __init__(self, d_model: int, dropout: float = 0.0, base: float = 10_000.0, max_len: int = 512):
        super().__init__()
        check_positive_int("SinusoidalPositionalEncoding", "d_model", d_model)
        check_positive_int("SinusoidalPositionalEncoding", "max_len", max_len)
        _check_base("SinusoidalPositionalEncoding", base)
        self.d_model, self.base, self.max_len = d_model, base, max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("table", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_embeddings("SinusoidalPositionalEncoding", x, self.d_model)
        _check_offset("SinusoidalPositionalEncoding", offset)
        end = offset + x.shape[1]
        if end > self.max_len:
            raise ValueError(f"SinusoidalPositionalEncoding: positions up to {end - 1} asked for, but the "
                             f"table holds positions 0..{self.max_len - 1} (max_len={self.max_len}); "
                             "build the module with a larger max_len")
        return self.dropout(x + self.table[offset:end].to(x.dtype))


class LearnedPositionalEmbedding(nn.Module):
    """``x + P[offset : offset + L]`` (then dropout) with ``P`` a trained ``(max_len, d)`` table.

    Positions at or beyond ``max_len`` have no embedding: asking for one raises ``ValueError``.

    Initialised normal with std ``INIT_STD = 2 ** -0.5``, the root mean square of the sinusoidal
    table's entries (each (sin, cos) pair has squared norm 1, so the mean square is 1/2) at every
    width: a learned table starts as loud as the sinusoids it replaces, against token embeddings
    that :class:`~tfmlib.transformer.Transformer` scales to entries of variance 1. (A std of
    ``d ** -0.5`` would start it ``sqrt(d / 2)`` times weaker: 16 times at ``d = 512``.)
    ``benchmarks/learned_position_init.py`` measures the effect of the choice.
    """

    INIT_STD = 2 ** -0.5

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.0):
        super().__init__()
        check_positive_int("LearnedPositionalEmbedding", "max_len", max_len)
        check_positive_int("LearnedPositionalEmbedding", "d_model", d_model)
        self.max_len, self.d_model = max_len, d_model
        self.table = nn.Parameter(torch.empty(max_len, d_model))
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table again from ``N(0, INIT_STD^2)``."""
        nn.init.normal_(self.table, 0.0, self.INIT_STD)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_embeddings("LearnedPositionalEmbedding", x, self.d_model)
        _check_offset("LearnedPositionalEmbedding", offset)
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
    on the offset ``s - p``, not on ``p`` itself. Pairing ``i`` with ``i + d_k/2`` ("halves") rather
    than the paper's neighbours ``(2i, 2i + 1)`` is GPT-NeoX's and Hugging Face's convention: a fixed
    permutation of the features, the same maths, but checkpoints of the two layouts are not
    interchangeable without permuting the rows of ``W_Q`` and ``W_K``. It is a convention, not a
    speed-up: chapter 06's solutions time this implementation against the paper's layout written
    two ways. The angles are computed in float64 and then rounded to the input's dtype (in float32,
    ``p * omega`` loses about ``1e-3`` radians by position ``1e5``).

    ``forward(q (B, h, T, d_k), k (B, h, S, d_k), q_positions=None, k_positions=None) -> (q, k)``
    rotated. Without positions, queries and keys are at ``0 .. L - 1`` and must have the same
    length (self-attention); for anything else (queries after ``S - T`` cached keys,
    cross-attention, left padding, packed sequences) pass the positions: integer tensors ``(T,)``
    and ``(S,)``, or ``(B, T)`` and ``(B, S)`` for one row of positions per sequence (one given
    without the other defaults to ``0 .. L - 1``). ``d_k`` must be even.
    """

    def __init__(self, d_k: int, base: float = 10_000.0):
        super().__init__()
        check_positive_int("RotaryEmbedding", "d_k", d_k)
        if d_k % 2:
            raise ValueError(f"RotaryEmbedding: the head width d_k must be even, got {d_k}")
        _check_base("RotaryEmbedding", base)
        self.d_k, self.base = d_k, float(base)

    def _check_positions(self, x: Tensor, positions: object, name: str) -> Tensor:
        L = x.shape[-2]
        if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex() \
                or positions.dtype == torch.bool:
            got = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
            raise ValueError(f"RotaryEmbedding: {name} must be an integer tensor, got {got}")
        if positions.dim() == 1 and positions.shape[0] == L:
            return positions
        if positions.dim() == 2 and x.dim() == 4 and tuple(positions.shape) == (x.shape[0], L):
            return positions[:, None, :]                                  # (B, 1, L): every head
        raise ValueError(f"RotaryEmbedding: {name} must be ({L},) or (batch, {L}) for an input of shape "
                         f"{tuple(x.shape)}, got shape {tuple(positions.shape)}")

    def rotate(self, x: Tensor, positions: Tensor, name: str = "positions") -> Tensor:
        """Rotate ``x`` ``(..., L, d_k)`` by ``positions``: ``(L,)``, or ``(B, L)`` when ``x`` is
        ``(B, h, L, d_k)`` (integers; negative positions rotate backwards)."""
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 2 or x.shape[-1] != self.d_k:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"RotaryEmbedding: expected a floating (..., length, d_k={self.d_k}) tensor, "
                             f"got {got}")
        positions = self._check_positions(x, positions, name)
        dtype = torch.float32 if x.device.type == "mps" else torch.float64   # MPS has no float64
        omega = self.base ** (-torch.arange(0, self.d_k, 2, dtype=dtype, device=x.device) / self.d_k)
        angles = positions.to(device=x.device, dtype=dtype)[..., None] * omega   # (..., L, d_k/2)
        cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
        x1, x2 = x[..., : self.d_k // 2], x[..., self.d_k // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, q: Tensor, k: Tensor, q_positions: Tensor | None = None,
                k_positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        T, S = q.shape[-2], k.shape[-2]
        if q_positions is None and k_positions is None and T != S:
            raise ValueError(f"RotaryEmbedding: {T} queries and {S} keys; with different lengths (queries "
                             "after cached keys, cross-attention) the positions are not 0..L-1 for both: "
                             "pass q_positions and k_positions")
        if q_positions is None:
            q_positions = torch.arange(T, device=q.device)
        if k_positions is None:
            k_positions = torch.arange(S, device=k.device)
        return self.rotate(q, q_positions, "q_positions"), self.rotate(k, k_positions, "k_positions")

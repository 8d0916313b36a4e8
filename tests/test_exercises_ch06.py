"""Chapter 06 exercise checkers accept the reference solutions and reject typical wrong answers."""

import math

import pytest
import torch
from test_exercises import _accepts, _rejects, _stub  # the helpers of chapter 01's checker tests

from tfmlib import exercises
from tfmlib.positional import RotaryEmbedding, relative_offset_matrix, sinusoidal_encoding


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(6), "chapter 06 registers no exercises"
    for name in exercises.names(6):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


def test_chapter_06_exercises_are_registered():
    assert exercises.names(6) == ["06.offset_matrix", "06.rotate_pairs", "06.sinusoidal_table"]


# ----------------------------------------------------------------------------- 06.sinusoidal_table


def _omega(d, exponent=lambda i, d: 2 * i / d):
    return torch.tensor([10_000.0 ** -exponent(i, d) for i in range((d + 1) // 2)], dtype=torch.float64)


def table_ref(length, d):
    angles = torch.arange(length, dtype=torch.float64)[:, None] * _omega(d)[None, :]
    table = torch.empty(length, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d // 2])
    return table.float()


def _table_swapped(length, d):
    angles = torch.arange(length, dtype=torch.float64)[:, None] * _omega(d)[None, :]
    table = torch.empty(length, d, dtype=torch.float64)
    table[:, 0::2] = torch.cos(angles)
    table[:, 1::2] = torch.sin(angles[:, : d // 2])
    return table.float()


def _table_halves(length, d):
    angles = torch.arange(length, dtype=torch.float64)[:, None] * _omega(d)[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)[:, :d].float()


def _table_pair_index(length, d):  # 10000^(-i/d) with i the pair index
    angles = torch.arange(length, dtype=torch.float64)[:, None] * _omega(d, lambda i, d: i / d)[None, :]
    table = torch.empty(length, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d // 2])
    return table.float()


def _table_column_index(length, d):  # 10000^(-j/d) with j the column index, odd columns too
    pos = torch.arange(length, dtype=torch.float64)
    columns = [(torch.sin if j % 2 == 0 else torch.cos)(pos * 10_000.0 ** (-j / d)) for j in range(d)]
    return torch.stack(columns, dim=1).float()


def _table_even_only(length, d):  # crashes on an odd width
    angles = torch.arange(length, dtype=torch.float64)[:, None] * _omega(d)[None, :]
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1).float()


@pytest.mark.parametrize("wrong", [
    _table_swapped, _table_halves, _table_pair_index, _table_column_index, _table_even_only,
    lambda L, d: table_ref(L, d).T,                                                    # transposed
    lambda L, d: table_ref(L + 1, d)[1:],                                              # positions from 1
], ids=["sin-cos-swapped", "halves", "pair-index-exponent", "column-index-exponent", "odd-width-crash",
        "transposed", "from-1"])
def test_06_sinusoidal_table(wrong):
    _accepts("06.sinusoidal_table", table_ref)
    _accepts("06.sinusoidal_table", sinusoidal_encoding)
    _rejects("06.sinusoidal_table", wrong)


@pytest.mark.parametrize("wrong, message", [
    (_table_swapped, "swapped"), (_table_halves, "all the sines first"), (_table_pair_index, "2i / d_model"),
    (_table_column_index, "same frequency as its sine"),
])
def test_06_sinusoidal_table_names_the_mistake(wrong, message, capsys):
    exercises.check("06.sinusoidal_table", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 06.offset_matrix


def _rotation(a, dtype=torch.float64):
    return torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=dtype)


def offset_ref(offset, d):
    return torch.block_diag(*[_rotation(offset * w) for w in _omega(d).tolist()])


def _offset_float32(offset, d):  # entries in float32: accepted, the error is ~1e-7
    return torch.block_diag(*[_rotation(offset * w, torch.float32) for w in _omega(d).tolist()])


@pytest.mark.parametrize("wrong", [
    lambda k, d: offset_ref(k, d).T,                                                   # moves the wrong way
    lambda k, d: offset_ref(-k, d),                                                    # the same, written so
    lambda k, d: torch.block_diag(*[_rotation(k)] * (d // 2)),                 # one angle for all pairs
    lambda k, d: offset_ref(abs(k), d),                                                # ignores the sign
    lambda k, d: torch.eye(d, dtype=torch.float64),                                    # identity
    lambda k, d: offset_ref(k, d)[: d // 2],                                           # wrong shape
], ids=["transposed", "negated-offset", "no-omega", "abs-offset", "identity", "shape"])
def test_06_offset_matrix(wrong):
    _accepts("06.offset_matrix", offset_ref)
    _accepts("06.offset_matrix", relative_offset_matrix)
    _accepts("06.offset_matrix", _offset_float32)
    _rejects("06.offset_matrix", wrong)


def test_06_offset_matrix_names_the_direction_mistake(capsys):
    exercises.check("06.offset_matrix", lambda k, d: offset_ref(k, d).T)
    assert "wrong way" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 06.rotate_pairs


def rotate_ref(x, positions):
    d = x.shape[-1]
    angles = positions.double()[:, None] * _omega(d)[None, :]
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rotate_halves(x, positions):  # the package's layout
    return RotaryEmbedding(x.shape[-1]).rotate(x, positions)


def _rotate_backwards(x, positions):
    return rotate_ref(x, -positions)


def _rotate_ignores_positions(x, positions):
    return rotate_ref(x, torch.arange(x.shape[-2]))


def _rotate_no_mixing(x, positions):  # scales each feature by cos: not a rotation
    d = x.shape[-1]
    angles = positions.double()[:, None] * _omega(d)[None, :]
    return x * torch.cos(angles).repeat_interleave(2, dim=-1).to(x.dtype)


@pytest.mark.parametrize("wrong", [_rotate_halves, _rotate_backwards, _rotate_ignores_positions,
                                   _rotate_no_mixing, lambda x, p: x],
                         ids=["halves-layout", "backwards", "ignores-positions", "no-mixing", "identity"])
def test_06_rotate_pairs(wrong):
    _accepts("06.rotate_pairs", rotate_ref)
    _rejects("06.rotate_pairs", wrong)


@pytest.mark.parametrize("wrong, message", [
    (_rotate_halves, "package's layout"), (_rotate_backwards, "-p * theta_i"),
    (_rotate_ignores_positions, "positions you are given"), (_rotate_no_mixing, "keeps the length"),
])
def test_06_rotate_pairs_names_the_mistake(wrong, message, capsys):
    exercises.check("06.rotate_pairs", wrong)
    assert message in capsys.readouterr().out


def test_06_rotate_pairs_reference_is_the_package_up_to_a_feature_permutation():
    torch.manual_seed(0)
    d = 8
    x, pos = torch.randn(2, 5, d, dtype=torch.double), torch.tensor([0, 3, 1, 7, 20])
    halves = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)        # pairs (i, i + d/2) = (2i, 2i+1)
    rotated = RotaryEmbedding(d).double().rotate(halves, pos)
    back = torch.stack([rotated[..., : d // 2], rotated[..., d // 2:]], dim=-1).flatten(-2)
    torch.testing.assert_close(back, rotate_ref(x, pos))

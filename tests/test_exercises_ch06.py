"""Chapter 06 exercise checkers accept the reference solutions and reject typical wrong answers."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub  # chapter 01's checker helpers

from tfmlib import exercises
from tfmlib.positional import RotaryEmbedding, sinusoidal_offset_matrix


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(6), "chapter 06 registers no exercises"
    for name in exercises.names(6):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


def test_chapter_06_exercises_are_registered():
    assert exercises.names(6) == ["06.copy_bias", "06.direction_matrix", "06.rotate_pairs"]


def test_chapter_06_hints_give_no_code():
    _hint_gives_no_code("06.direction_matrix", ["sinusoidal_offset_matrix(", ".T", "offset_matrix(-",
                                               "M_(-offset)", "M_{-"])
    _hint_gives_no_code("06.copy_bias", ["arange", "torch.", "== -back", "-inf)", "masked_fill", "abs("])
    _hint_gives_no_code("06.rotate_pairs", ["0::2", "1::2", "arange", "torch.", "a * cos", "stack("])


# ----------------------------------------------------------------------------- 06.direction_matrix


def _omega(d):
    return torch.tensor([10_000.0 ** (-2 * i / d) for i in range((d + 1) // 2)], dtype=torch.float64)


def _rotation(a):
    return torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=torch.float64)


def offset_ref(offset, d):
    """M_offset: PE[p + offset] = M_offset @ PE[p]."""
    return torch.block_diag(*[_rotation(offset * w) for w in _omega(d).tolist()])


def direction_ref(offset, d):
    # PE_p^T M_(-offset) PE_(p+k) = PE_(p+offset) . PE_(p+k) = sum_i cos((k - offset) w_i),
    # largest at k = offset
    return sinusoidal_offset_matrix(-offset, d)


def _direction_scaled(offset, d):  # a positive multiple is as good
    return 3.0 * offset_ref(offset, d).T.float()


@pytest.mark.parametrize("wrong, message", [
    (lambda k, d: offset_ref(k, d), "direction is reversed"),                             # M_k: peaks at -k
    (lambda k, d: torch.eye(d, dtype=torch.float64), "cannot tell after from before"),   # symmetric
    (lambda k, d: offset_ref(k, d) + offset_ref(k, d).T, "cannot tell after from before"),
    (lambda k, d: torch.randn(d, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
     "changes with the position p"),
    (lambda k, d: offset_ref(2 * k, d).T, "largest at k = "),                             # wrong offset
    (lambda k, d: offset_ref(k, d)[: d // 2], "should be"),                               # wrong shape
    (lambda k, d: torch.eye(d, dtype=torch.long), "floating torch.Tensor"),
], ids=["M_k", "identity", "symmetric", "random", "twice-the-offset", "shape", "integer"])
def test_06_direction_matrix(wrong, message, capsys):
    _accepts("06.direction_matrix", direction_ref)
    _accepts("06.direction_matrix", _direction_scaled)
    _rejects("06.direction_matrix", wrong)
    exercises.check("06.direction_matrix", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 06.copy_bias


def _offsets(length):
    return (torch.arange(length)[None, :] - torch.arange(length)[:, None]).float()    # [t, s] = s - t


def copy_bias_ref(length, back):
    """-30 per position away from the offset -back: a fixed bias peaked at the key `back` back."""
    return -30.0 * (_offsets(length) + back).abs()


def _copy_bias_step(length, back):  # 0 at offset -back, a large finite penalty elsewhere
    return torch.full((length, length), -1e4).masked_fill(_offsets(length) == -back, 0.0)


@pytest.mark.parametrize("wrong, message", [
    (lambda L, b: -(_offsets(L).abs()), "favours the query's own position"),               # ALiBi
    (lambda L, b: -30.0 * (_offsets(L) - b).abs(), "ahead"),                                 # sign
    (lambda L, b: -1.0 * (_offsets(L) + b).abs(), "too small"),                              # too weak
    (lambda L, b: torch.full((L, L), -math.inf).masked_fill(_offsets(L) == -b, 0.0), "-inf everywhere"),
    (lambda L, b: copy_bias_ref(L, b) + torch.arange(L).float()[:, None] * torch.arange(L)[None, :],
     "depends on where the pair sits"),
    (lambda L, b: copy_bias_ref(L, b)[:-1], "should be (L, L)"),
    (lambda L, b: (_offsets(L) == -b).long(), "floating torch.Tensor"),
], ids=["alibi", "ahead", "too-weak", "empty-rows", "absolute", "shape", "integer"])
def test_06_copy_bias(wrong, message, capsys):
    _accepts("06.copy_bias", copy_bias_ref)
    _accepts("06.copy_bias", _copy_bias_step)
    _rejects("06.copy_bias", wrong)
    exercises.check("06.copy_bias", wrong)
    assert message in capsys.readouterr().out


def test_06_copy_bias_reference_lets_attention_copy():
    """The accepted kind of bias does what the exercise says: a layer with it copies the token `back` back."""
    torch.manual_seed(0)
    L, back, d = 20, 3, 16
    tokens = torch.randint(16, (4, L))
    v = torch.nn.functional.one_hot(tokens, 16).float()
    scores = torch.randn(4, L, L).clamp(-4, 4)
    out = torch.softmax(scores + copy_bias_ref(L, back), -1) @ v
    assert torch.equal(out[:, back:].argmax(-1), tokens[:, :-back])
    # ALiBi's bias, however steep, copies the query's own token instead
    alibi = torch.softmax(scores - 30.0 * _offsets(L).abs(), -1) @ v
    assert torch.equal(alibi.argmax(-1), tokens)
    del d


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

"""Chapter 06 exercise checkers accept the reference solutions and reject typical wrong answers."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub  # chapter 01's checker helpers

from tfmlib import exercises
from tfmlib.positional import RotaryEmbedding, sinusoidal_offset_matrix
from tfmlib.relative_position import alibi_bias


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(6), "chapter 06 registers no exercises"
    for name in exercises.names(6):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


def test_chapter_06_exercises_are_registered():
    assert exercises.names(6) == ["06.copy_bias", "06.offset_weights", "06.rotary_probe"]


def test_chapter_06_hints_give_no_code():
    _hint_gives_no_code("06.offset_weights", ["pinv", "linalg", "lstsq", "torch.", "@", ".T", "(table"])
    _hint_gives_no_code("06.copy_bias", ["arange", "torch.", "== -back", "-inf)", "masked_fill", "abs("])
    _hint_gives_no_code("06.rotary_probe", ["eye(", "atan2", "argmax", "torch.", "diagonal", "positions=",
                                            "ones("])


# ----------------------------------------------------------------------------- 06.offset_weights


def _pattern(n, back):
    t = torch.arange(n)
    return (t[None, :] == t[:, None] - back).to(torch.float64)


def offset_weights_ref(table, back):
    """The least-squares W: P^+ B (P^+)^T, exact when the table has no more rows than columns."""
    inverse = torch.linalg.pinv(table)
    return inverse @ _pattern(table.shape[0], back) @ inverse.T


def _offset_weights_lstsq(table, back):  # the same W from two least-squares solves
    right = torch.linalg.lstsq(table, _pattern(table.shape[0], back)).solution          # (d, n): P X = B
    return torch.linalg.lstsq(table, right.T).solution.T                                 # W P^T = X


@pytest.mark.parametrize("wrong, message", [
    (lambda P, b: P.T @ _pattern(P.shape[0], b) @ P, "(pseudo-)inverse belongs"),
    (lambda P, b: offset_weights_ref(P, -b), "*ahead*"),
    (lambda P, b: offset_weights_ref(P, b + 1), "off-by-one"),
    (lambda P, b: 2.0 * offset_weights_ref(P, b), "times the right size"),
    (lambda P, b: torch.zeros(P.shape[1], P.shape[1], dtype=torch.float64), "no better than W = 0"),
    (lambda P, b: sinusoidal_offset_matrix(-b, P.shape[1]), "section 3's M_(-back)"),
    (lambda P, b: torch.linalg.pinv(P) @ _pattern(P.shape[0], b) @ P, "no better than W = 0"),  # one side
    (lambda P, b: _pattern(P.shape[0], b), "should be (d, d)"),
    (lambda P, b: torch.eye(P.shape[1], dtype=torch.long), "floating torch.Tensor"),
], ids=["table-not-inverse", "ahead", "off-by-one", "twice", "zero", "sinusoidal-M", "one-side", "shape",
        "integer"])
def test_06_offset_weights(wrong, message, capsys):
    _accepts("06.offset_weights", offset_weights_ref)
    _accepts("06.offset_weights", _offset_weights_lstsq)
    capsys.readouterr()
    _rejects("06.offset_weights", wrong)
    assert message in capsys.readouterr().out


def test_06_offset_weights_reference_fits_trained_rows_only():
    """What the exercise teaches: the fitted W makes 'three back' exact on the rows it was fitted to,
    and says nothing about rows it never saw, unlike section 3's M_k on the sinusoidal table."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(64, 64, generator=g, dtype=torch.float64) * 2 ** -0.5
    W = offset_weights_ref(table[:32], 3)
    seen = table[:32] @ W @ table[:32].T
    assert torch.allclose(seen, _pattern(32, 3), atol=1e-9)
    unseen = table[32:] @ W @ table[32:].T
    hits = (unseen[3:].argmax(-1) == torch.arange(32)[3:] - 3).float().mean()
    assert hits < 0.3


# ----------------------------------------------------------------------------- 06.rotary_probe


def probe_ref(rotate, d):
    turned = rotate(torch.eye(d, dtype=torch.float64), torch.ones(d, dtype=torch.long))   # row j: R_1 e_j
    cos = turned.diagonal()
    off = turned - torch.diag(cos)
    sin, partner = off.abs().max(-1)
    partner = torch.where(sin > 0, partner, torch.arange(d))
    return partner, torch.atan2(sin, cos)


def _probe_at(position, dtype=torch.float64, divide=True):
    def probe(rotate, d):
        turned = rotate(torch.eye(d, dtype=dtype), torch.full((d,), position))
        cos = turned.diagonal().double()
        off = (turned - torch.diag(turned.diagonal())).double()
        sin, partner = off.abs().max(-1)
        partner = torch.where(sin > 0, partner, torch.arange(d))
        angle = torch.atan2(sin, cos)
        return partner, angle / position if divide and position else angle
    return probe


def _probe_halves(rotate, d):  # assumes the package's layout
    partner, omega = probe_ref(rotate, d)
    return (torch.arange(d) + d // 2) % d, omega


def _probe_largest_entry(rotate, d):  # the largest entry of R e_j: j itself for a slow pair
    turned = rotate(torch.eye(d, dtype=torch.float64), torch.ones(d, dtype=torch.long))
    return turned.abs().argmax(-1), probe_ref(rotate, d)[1]


def _probe_acos_float32(rotate, d):  # the angle from the cosine, in float32
    partner, _ = probe_ref(rotate, d)
    turned = rotate(torch.eye(d), torch.ones(d, dtype=torch.long))
    return partner, torch.acos(turned.diagonal().clamp(-1, 1)).double()


def _probe_first_of_pair(rotate, d):  # omega only on the first feature of each pair
    partner, omega = probe_ref(rotate, d)
    return partner, torch.where(torch.arange(d) < partner, omega, torch.zeros_like(omega))


def _probe_base_10k(rotate, d):  # the pairing measured, the frequencies assumed
    partner, omega = probe_ref(rotate, d)
    rotated = partner != torch.arange(d)
    first = torch.arange(d)[rotated & (torch.arange(d) < partner)]
    n = len(first)
    assumed = torch.zeros(d, dtype=torch.float64)
    for i, a in enumerate(first.tolist()):
        assumed[a] = assumed[partner[a]] = 1e4 ** (-2 * i / (2 * n))
    return partner, assumed


def _probe_asin(position):  # the angle from the sine alone: right only up to a quarter turn
    def probe(rotate, d):
        partner, _ = probe_ref(rotate, d)
        turned = rotate(torch.eye(d, dtype=torch.float64), torch.full((d,), position))
        sin = (turned - torch.diag(turned.diagonal())).abs().max(-1).values
        return partner, sin.clamp(max=1).asin() / position
    return probe


def _probe_fit_base(rotate, d):  # one pair read, the law assumed (review 2026-11-27-exercises-06-09-10, 22)
    partner, omega = probe_ref(rotate, d)
    first = torch.arange(d)[(partner != torch.arange(d)) & (torch.arange(d) < partner)]
    width = 2 * len(first)
    base = float(omega[first[1]]) ** (-width / 2)
    out = torch.zeros(d, dtype=torch.float64)
    for i, a in enumerate(first.tolist()):
        out[a] = out[partner[a]] = base ** (-2 * i / width)
    return partner, out


@pytest.mark.parametrize("wrong, message", [
    (_probe_halves, "the package's layout"),
    (_probe_asin(2), "arcsin of the sine alone"),
    (_probe_at(1000), "turned by more than half a turn"),
    (_probe_at(1, dtype=torch.float16), "in float16 or bfloat16"),
    (_probe_fit_base, "you inferred them from a formula"),
    (_probe_largest_entry, "A slow pair's unit vector stays nearly where it was"),
    (_probe_at(10), "turned by more than half a turn"),
    (_probe_at(2, divide=False), "2 times too large"),
    (_probe_acos_float32, "read it from the sine part"),
    (_probe_at(0), "At position 0 nothing turns"),
    (_probe_first_of_pair, "turn together"),
    (_probe_base_10k, "frequencies of base 10,000"),
    (lambda rotate, d: probe_ref(rotate, d)[0], "return a pair"),
    (lambda rotate, d: (probe_ref(rotate, d)[0].float(), probe_ref(rotate, d)[1]), "integer tensor"),
], ids=["halves", "asin-at-2", "wrapped-at-1000", "float16-eye", "fitted-base", "largest-entry", "wrapped",
        "not-divided", "acos-float32", "position-0", "first-of-pair", "base-10k", "one-output",
        "float-partner"])
def test_06_rotary_probe(wrong, message, capsys):
    _accepts("06.rotary_probe", probe_ref)
    capsys.readouterr()
    _rejects("06.rotary_probe", wrong)
    assert message in capsys.readouterr().out


def test_06_rotary_probe_reads_the_package():
    """The accepted probe recovers RotaryEmbedding's pairing (i with i + d/2) and frequencies."""
    d = 16
    partner, omega = probe_ref(RotaryEmbedding(d).rotate, d)
    assert torch.equal(partner, (torch.arange(d) + d // 2) % d)
    want = 1e4 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(omega, torch.cat([want, want]))


def test_06_no_alibi_answer_for_copy_bias():
    """The package's ALiBi bias is the thing exercise 2 improves on: it must not pass."""
    _rejects("06.copy_bias", lambda L, b: alibi_bias(L, heads=1)[0, 0])


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
    (lambda L, b: torch.where(_offsets(L) == -b, 0.0, -15.0).double(), "grows like ln L"),   # fixed margin
    (lambda L, b: torch.full((L, L), -math.inf).masked_fill(_offsets(L) == -b, 0.0), "-inf everywhere"),
    (lambda L, b: copy_bias_ref(L, b) + torch.arange(L).float()[:, None] * torch.arange(L)[None, :],
     "depends on where the pair sits"),
    (lambda L, b: copy_bias_ref(L, b)[:-1], "should be (L, L)"),
    (lambda L, b: (_offsets(L) == -b).long(), "floating torch.Tensor"),
], ids=["alibi", "ahead", "too-weak", "margin-15", "empty-rows", "absolute", "shape", "integer"])
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

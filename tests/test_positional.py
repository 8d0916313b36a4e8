"""tfmlib.positional: the sinusoidal table is the paper's formula with its offset property, the learned
table refuses positions it has no row for, and rotary embeddings make attention scores depend on
relative offsets only."""

import math

import pytest
import torch

from tfmlib.attention import MultiHeadAttention, padding_mask
from tfmlib.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
    sinusoidal_offset_matrix,
)


def test_sinusoidal_table_is_the_formula():
    table = sinusoidal_encoding(50, 12)
    assert table.shape == (50, 12) and table.dtype == torch.float32
    for p in (0, 1, 7, 49):
        for i in range(6):
            w = 10_000 ** (-2 * i / 12)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-6)
    torch.testing.assert_close(sinusoidal_encoding(5, 12, offset=45), table[45:])
    assert sinusoidal_encoding(3, 7).shape == (3, 7)  # an odd width ends with a sine column


@pytest.mark.parametrize("offset", [1, 5, 37])
def test_a_fixed_offset_is_one_linear_map_for_every_position(offset):
    d = 16
    table = sinusoidal_encoding(100 + offset, d).double()
    M = sinusoidal_offset_matrix(offset, d)
    torch.testing.assert_close(table[:100] @ M.T, table[offset:offset + 100], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_offset_matrix(2, 7)


def test_sinusoidal_module_adds_the_table_and_refuses_positions_past_max_len():
    pe = SinusoidalPositionalEncoding(8, max_len=10)
    x = torch.randn(2, 10, 8)
    torch.testing.assert_close(pe(x), x + sinusoidal_encoding(10, 8))
    torch.testing.assert_close(pe(x[:, :3], offset=6), x[:, :3] + sinusoidal_encoding(9, 8)[6:])
    assert "table" not in pe.state_dict(), "the table is computed, not a parameter"
    with pytest.raises(ValueError, match=r"\(batch, length, d_model=8\)"):
        pe(torch.randn(2, 3, 5))


def test_sinusoidal_forward_has_no_side_effect_and_names_max_len():
    """Issue 14: the table grew inside forward (a side effect that breaks torch.compile and replicas);
    it is now computed once and a position past max_len is an error naming max_len."""
    pe = SinusoidalPositionalEncoding(8, max_len=4)
    table = pe.table
    with pytest.raises(ValueError, match=r"up to 9 .* positions 0\.\.3 \(max_len=4\).* larger max_len"):
        pe(torch.randn(1, 10, 8))
    with pytest.raises(ValueError, match=r"positions up to 4 .*max_len=4"):
        pe(torch.randn(1, 2, 8), offset=3)
    assert pe.table is table and pe.table.shape == (4, 8), "forward must not replace the table"
    with pytest.raises(ValueError, match="SinusoidalPositionalEncoding: max_len must be a positive int"):
        SinusoidalPositionalEncoding(8, max_len=0)


@pytest.mark.parametrize("make", [lambda: SinusoidalPositionalEncoding(4, max_len=32),
                                  lambda: LearnedPositionalEmbedding(32, 4)], ids=["sinusoidal", "learned"])
@pytest.mark.parametrize("offset", [-5, -1, 1.5, True])
def test_modules_refuse_a_negative_or_non_int_offset(make, offset):
    """Issue 14: offset -5 with 3 positions returned rows 27-29 of a 32-row learned table (negative
    slicing wraps); the sinusoidal one depended on how far its table had grown."""
    with pytest.raises(ValueError, match=r"offset must be an int >= 0"):
        make()(torch.zeros(1, 3, 4), offset=offset)


@pytest.mark.parametrize("base", [-1, 0, 0.5, 1, float("nan"), float("inf"), "10000"])
def test_every_scheme_refuses_a_base_that_is_not_above_one(base):
    """Issue 14: RotaryEmbedding(base=-1) gave frequencies [1, nan, nan, nan] and base=0.5 growing ones,
    silently; the offset matrix did not check base at all."""
    for make in (lambda: RotaryEmbedding(8, base=base),
                 lambda: sinusoidal_offset_matrix(3, 8, base=base),
                 lambda: sinusoidal_encoding(4, 8, base=base),
                 lambda: SinusoidalPositionalEncoding(8, base=base)):
        with pytest.raises(ValueError, match="base must be a finite number > 1"):
            make()


def test_learned_table_adds_its_rows_and_refuses_longer_sequences():
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(6, 4)
    x = torch.zeros(1, 6, 4)
    torch.testing.assert_close(pe(x)[0], pe.table.detach())
    torch.testing.assert_close(pe(x[:, :2], offset=3)[0], pe.table.detach()[3:5])
    with pytest.raises(ValueError, match=r"positions up to 6 .* positions 0\.\.5 \(max_len=6\)"):
        pe(torch.zeros(1, 7, 4))
    with pytest.raises(ValueError, match="positive int"):
        LearnedPositionalEmbedding(0, 4)


def test_rotary_is_a_rotation_and_scores_depend_on_the_offset_only():
    torch.manual_seed(0)
    rot = RotaryEmbedding(8)
    x = torch.randn(1, 1, 20, 8, dtype=torch.double)
    same = x[:, :, :1].expand(1, 1, 20, 8)                     # one vector at every position
    r = rot.rotate(same, torch.arange(20))
    torch.testing.assert_close(r.norm(dim=-1), same.norm(dim=-1))   # rotations keep lengths
    torch.testing.assert_close(r[..., 0, :], same[..., 0, :])      # position 0 is not rotated
    q, k = torch.randn(8, dtype=torch.double), torch.randn(8, dtype=torch.double)
    Q = rot.rotate(q.expand(1, 1, 20, 8), torch.arange(20))[0, 0]
    K = rot.rotate(k.expand(1, 1, 20, 8), torch.arange(20))[0, 0]
    scores = Q @ K.T                                               # (20, 20): query p, key s
    for delta in (-3, 0, 2, 7):
        diag = torch.diagonal(scores, offset=delta)
        torch.testing.assert_close(diag, diag[0].expand_as(diag))  # constant along s - p = delta
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 2)[0])


def test_rotary_in_attention_scores_by_offset_and_checks_shapes():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, rotary=RotaryEmbedding(4)).double()
    same = torch.randn(1, 1, 8, dtype=torch.double).expand(1, 6, 8)   # one token, six times
    _, w = mha(same, need_weights=True, causal=True)
    for t in range(1, 6):  # identical content: query t's weights depend only on the offsets s - t
        # query 5's weights on its last t + 1 keys, renormalised
        expected = torch.softmax(torch.log(w[0, :, 5, 5 - t:]), dim=-1)
        torch.testing.assert_close(w[0, :, t, : t + 1], expected)
    x = torch.randn(1, 6, 8, dtype=torch.double)
    _, w = mha(x, need_weights=True)
    plain = MultiHeadAttention(8, 2).double()
    plain.load_state_dict(mha.state_dict())
    _, w_plain = plain(x, need_weights=True)
    assert not torch.allclose(w, w_plain), "rotary must change the scores"
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match="d_k=4"):
        RotaryEmbedding(4).rotate(torch.randn(1, 1, 3, 6), torch.arange(3))
    with pytest.raises(ValueError, match="3 queries and 2 keys.*pass q_positions and k_positions"):
        RotaryEmbedding(4)(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 2, 4))


def test_rotate_validates_positions():
    """Issue 14: a list gave AttributeError, a wrong length a broadcasting error."""
    rot, x = RotaryEmbedding(4), torch.randn(2, 1, 3, 4)
    with pytest.raises(ValueError, match="positions must be an integer tensor, got list"):
        rot.rotate(x, [0, 1, 2])
    with pytest.raises(ValueError, match="positions must be an integer tensor, got torch.float32"):
        rot.rotate(x, torch.arange(3.0))
    with pytest.raises(ValueError, match=r"positions must be \(3,\) or \(batch, 3\) .* got shape \(4,\)"):
        rot.rotate(x, torch.arange(4))
    with pytest.raises(ValueError, match=r"got shape \(3, 3\)"):
        rot.rotate(x, torch.zeros(3, 3, dtype=torch.long))          # batch 2, not 3
    # (B, L): one row of positions per sequence
    pos = torch.tensor([[0, 1, 2], [5, 6, 7]])
    both = rot.rotate(x, pos)
    torch.testing.assert_close(both[1:], rot.rotate(x[1:], torch.tensor([5, 6, 7])))


@pytest.mark.parametrize("position, old_error", [(10 ** 5, 1.4e-3), (10 ** 6, 2.7e-2)])
def test_rotary_angles_are_computed_in_float64(position, old_error):
    """Issue 14: float32 angles p * omega were off by ~1.4e-3 at p = 1e5 and 2.7e-2 at 1e6 (the
    issue's numbers); computed in float64 and rounded, the float32 result is within float32 rounding of
    the float64 one."""
    d = 64
    x = torch.randn(1, 1, 1, d, generator=torch.Generator().manual_seed(0), dtype=torch.double)
    # the rotation written out in float64, independently of the module
    angles = position * 10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.double) / d)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    exact = torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)
    torch.testing.assert_close(RotaryEmbedding(d).rotate(x, torch.tensor([position])), exact)
    got = RotaryEmbedding(d).rotate(x.float(), torch.tensor([position]))
    err = (got.double() - exact).abs().max().item()
    assert err < 1e-5, f"float32 rotation at {position} off by {err:.1e} (float32 angles: ~{old_error})"


def test_rotary_with_explicit_positions_is_a_kv_cache_step():
    """The last query alone, at position L - 1 against all L keys, gives the last row of full causal
    self-attention: what chapter 09's KV cache needs (q_positions offset by the cache length)."""
    torch.manual_seed(0)
    L, d, h = 6, 16, 2
    mha = MultiHeadAttention(d, h, rotary=RotaryEmbedding(d // h)).double()
    x = torch.randn(2, L, d, dtype=torch.double)
    full, _ = mha(x, causal=True)
    for need_weights in (False, True):
        step, _ = mha(x[:, -2:], x, causal=True, need_weights=need_weights,
                      q_positions=torch.arange(L - 2, L))
        torch.testing.assert_close(step, full[:, -2:])
    # without positions, different lengths are refused instead of guessed
    with pytest.raises(ValueError, match="pass q_positions and k_positions"):
        mha(x[:, -1:], x)
    # left padding: positions per row, counted from each row's first real token
    pad = 2
    padded = torch.cat([torch.zeros(2, pad, d, dtype=torch.double), x], dim=1)
    keep = torch.arange(L + pad)[None, :] >= pad
    positions = (torch.arange(L + pad) - pad).clamp(min=0).expand(2, -1)
    out, _ = mha(padded, mask=padding_mask(keep.expand(2, -1)), causal=True,
                 q_positions=positions, k_positions=positions)
    torch.testing.assert_close(out[:, pad:], full)


def test_learned_table_starts_at_the_scale_of_the_sinusoids():
    """Issue 14: std d^-1/2 started learned positions sqrt(d/2) times weaker than the sinusoids (16x at
    d=512); the table now starts at the sinusoids' root mean square, 2^-1/2, at every width."""
    for d in (64, 512):
        torch.manual_seed(0)
        learned = LearnedPositionalEmbedding(256, d).table.detach()
        sinusoids = sinusoidal_encoding(256, d)
        ratio = learned.square().mean().sqrt() / sinusoids.square().mean().sqrt()
        assert abs(ratio - 1) < 0.02, f"d={d}: learned/sinusoidal RMS = {ratio:.3f}, expected 1"
    pe = LearnedPositionalEmbedding(4, 8)
    before = pe.table.detach().clone()
    pe.reset_parameters()
    assert not torch.equal(before, pe.table), "reset_parameters draws the table again"

"""tfmlib.positional: the sinusoidal table is the paper's formula with its offset property, the learned
table refuses positions it has no row for, and rotary embeddings make attention scores depend on
relative offsets only."""

import math

import pytest
import torch

from tfmlib.attention import MultiHeadAttention
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


def test_sinusoidal_module_adds_the_table_and_extends_it():
    pe = SinusoidalPositionalEncoding(8, max_len=4)
    x = torch.randn(2, 10, 8)
    torch.testing.assert_close(pe(x), x + sinusoidal_encoding(10, 8))
    torch.testing.assert_close(pe(x[:, :3], offset=6), x[:, :3] + sinusoidal_encoding(9, 8)[6:])
    assert "table" not in pe.state_dict(), "the table is computed, not a parameter"
    with pytest.raises(ValueError, match=r"\(batch, length, d_model=8\)"):
        pe(torch.randn(2, 3, 5))


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
    with pytest.raises(ValueError, match="only 2 keys"):
        RotaryEmbedding(4)(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 2, 4))

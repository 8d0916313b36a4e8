"""tfmlib.relative_position: Shaw et al.'s relation-aware attention equals a straightforward loop over
query-key pairs and clips offsets at K; ALiBi's slopes are the paper's, and its bias through the float
additive mask of MultiHeadAttention equals adding it to explicit scores."""

import math

import pytest
import torch

from tfmlib.attention import MultiHeadAttention, causal_mask
from tfmlib.relative_position import ShawSelfAttention, alibi_bias, alibi_slopes, clipped_offsets


def _shaw_loops(layer: ShawSelfAttention, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Shaw et al. (2018), equations (3)-(4), one query, one key and one head at a time."""
    B, L, d = x.shape
    h, dk, K = layer.heads, layer.d_k, layer.max_distance
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    out = torch.zeros(B, L, d, dtype=x.dtype)
    for b in range(B):
        for head in range(h):
            cols = slice(head * dk, (head + 1) * dk)
            for t in range(L):
                scores, vectors = [], []
                for s in range(L):
                    offset = max(-K, min(K, s - t))
                    a_k, a_v = layer.rel_k.weight[offset + K], layer.rel_v.weight[offset + K]
                    allowed = True if mask is None else bool(mask[t, s])
                    scores.append(q[b, t, cols] @ (k[b, s, cols] + a_k) / math.sqrt(dk) if allowed
                                  else torch.tensor(-math.inf, dtype=x.dtype))
                    vectors.append(v[b, s, cols] + a_v)
                alpha = torch.softmax(torch.stack(scores), 0)
                out[b, t, cols] = sum(alpha[s] * vectors[s] for s in range(L))
    return layer.out_proj(out)


@pytest.mark.parametrize("heads, K, L", [(1, 2, 6), (2, 3, 9), (4, 1, 5)])
def test_shaw_equals_the_loop_over_pairs(heads, K, L):
    torch.manual_seed(heads * 10 + K)
    layer = ShawSelfAttention(8, heads, K).double()
    x = torch.randn(2, L, 8, dtype=torch.double)
    with torch.no_grad():
        torch.testing.assert_close(layer(x)[0], _shaw_loops(layer, x))
        keep = causal_mask(L, L)
        torch.testing.assert_close(layer(x, mask=keep)[0], _shaw_loops(layer, x, keep))
        additive = torch.zeros(L, L, dtype=torch.double).masked_fill(~keep, -math.inf)
        torch.testing.assert_close(layer(x, mask=additive)[0], layer(x, mask=keep)[0])


def test_clipping_at_K():
    ids = clipped_offsets(7, 2)
    assert ids[0].tolist() == [0, 1, 2, 2, 2, 2, 2]
    assert ids[6].tolist() == [-2, -2, -2, -2, -2, -1, 0]
    assert torch.equal(ids, -ids.T), "clip(s - t) = -clip(t - s)"
    # changing a^K / a^V for an offset beyond K changes nothing but the vectors at +-K
    torch.manual_seed(0)
    layer = ShawSelfAttention(8, 2, max_distance=2)
    x = torch.randn(1, 10, 8)
    with torch.no_grad():
        before = layer(x)[0]
        layer.rel_k.weight[1] += 1.0        # offset -1: used only where s - t = -1
        after = layer(x)[0]
    assert not torch.allclose(before[0, 1:], after[0, 1:]), "every query t >= 1 has a key at offset -1"
    torch.testing.assert_close(before[0, 0], after[0, 0])  # query 0 has no key at offset -1
    # keys 3 and 9 positions away share one vector: a long sequence has no new offsets
    assert layer.offset_ids(40).unique().tolist() == list(range(5))


def test_shaw_with_zero_offset_vectors_is_multi_head_attention():
    torch.manual_seed(1)
    shaw = ShawSelfAttention(16, 4, 3)
    plain = MultiHeadAttention(16, 4)
    plain.load_state_dict({n: v for n, v in shaw.state_dict().items() if "rel_" not in n})
    with torch.no_grad():
        shaw.rel_k.weight.zero_()
        shaw.rel_v.weight.zero_()
        x = torch.randn(3, 9, 16)
        torch.testing.assert_close(shaw(x)[0], plain(x)[0], atol=1e-6, rtol=1e-5)


def test_shaw_is_shift_invariant():
    """The weights among a sequence's tokens do not change when tokens are put in front (renormalised)."""
    torch.manual_seed(2)
    layer = ShawSelfAttention(8, 2, 3).double()
    x, prefix = torch.randn(1, 6, 8, dtype=torch.double), torch.randn(1, 4, 8, dtype=torch.double)
    with torch.no_grad():
        alone = layer(x, need_weights=True)[1]
        shifted = layer(torch.cat([prefix, x], 1), need_weights=True)[1][..., 4:, 4:]
    torch.testing.assert_close(shifted / shifted.sum(-1, keepdim=True), alone)


def test_alibi_slopes_are_the_papers():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(16)[1::2], alibi_slopes(8))
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2.0 ** -8]))
    # 12 heads, not a power of two: the 8 slopes of 8 heads, then slopes 1, 3, 5, 7 of 16 heads
    twelve = alibi_slopes(12)
    torch.testing.assert_close(twelve[:8], alibi_slopes(8))
    torch.testing.assert_close(twelve[8:], torch.tensor([2.0 ** -(0.5 + i) for i in range(4)]))
    assert len(alibi_slopes(6)) == 6 and len(set(alibi_slopes(6).tolist())) == 6, "six distinct slopes"


def test_alibi_bias_values():
    bias = alibi_bias(4, heads=2)
    assert bias.shape == (1, 2, 4, 4) and bias.dtype == torch.float32
    m = alibi_slopes(2)
    expect = -m[:, None, None] * torch.tensor([[abs(t - s) for s in range(4)] for t in range(4)])
    torch.testing.assert_close(bias[0], expect)
    causal = alibi_bias(4, heads=2, causal=True)
    assert torch.isinf(causal[0, :, 0, 1:]).all() and torch.equal(causal[0, :, 3], bias[0, :, 3])
    # fewer queries than keys: the queries are the last positions (a cache of earlier keys)
    torch.testing.assert_close(alibi_bias(2, 5, heads=2), alibi_bias(5, heads=2)[..., 3:, :])
    torch.testing.assert_close(alibi_bias(3, slopes=torch.tensor([0.5, 1.0]))[0, 1, 0],
                               torch.tensor([0.0, -1.0, -2.0]))


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_through_the_float_mask_equals_explicit_scores(causal):
    torch.manual_seed(3)
    d, h, L = 16, 4, 7
    mha = MultiHeadAttention(d, h).eval()
    x = torch.randn(2, L, d)
    bias = alibi_bias(L, heads=h, causal=causal)
    with torch.no_grad():
        q, k, v = (p(x).view(2, L, h, d // h).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        slope = alibi_slopes(h)[None, :, None, None]
        distance = (torch.arange(L)[:, None] - torch.arange(L)[None, :])
        scores = scores - slope * distance.abs()
        if causal:
            scores = scores.masked_fill(distance < 0, -math.inf)
        want = torch.softmax(scores, -1)
        expected = mha.out_proj((want @ v).transpose(1, 2).reshape(2, L, d))
        fast, _ = mha(x, mask=bias)
        explicit, weights = mha(x, mask=bias, need_weights=True)
    torch.testing.assert_close(weights, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(explicit, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-4)
    if causal:  # the causal form equals the bidirectional bias plus the package's causal mask
        torch.testing.assert_close(mha(x, mask=alibi_bias(L, heads=h), causal=True)[0], fast, atol=1e-6,
                                   rtol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="ShawSelfAttention: d_model=10 is not divisible by heads=3"):
        ShawSelfAttention(10, 3, 2)
    with pytest.raises(ValueError, match="max_distance must be a positive int, got 0"):
        ShawSelfAttention(8, 2, 0)
    with pytest.raises(ValueError, match=r"non-empty \(batch, length, d_model=8\) tensor, got \(2, 5, 6\)"):
        ShawSelfAttention(8, 2, 2)(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"a 2-D mask must be \(queries, keys\) = \(5, 5\), got \(4, 4\)"):
        ShawSelfAttention(8, 2, 2)(torch.randn(2, 5, 8), mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="alibi_slopes: heads must be a positive int, got 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="alibi_bias: 5 queries but only 3 keys"):
        alibi_bias(5, 3)
    with pytest.raises(ValueError, match="alibi_bias: T must be a positive int"):
        alibi_bias(2.5)
    with pytest.raises(ValueError, match=r"slopes must be a non-empty 1-D float tensor .*, got \(2, 2\)"):
        alibi_bias(3, slopes=torch.ones(2, 2))
    with pytest.raises(ValueError, match="does not broadcast"):
        MultiHeadAttention(8, 2)(torch.randn(1, 4, 8), mask=alibi_bias(4, heads=4))

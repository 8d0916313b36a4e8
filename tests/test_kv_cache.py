"""tfmlib.kv_cache: the cache's buffers (pre-allocated, grown, concatenated, selected), cached
attention equal to re-reading the prefix, and the encoder-decoder's greedy and beam search equal
with and without the cache, token for token and score for score."""

import pytest
import torch
from test_seq2seq import SRC_V, TGT_V, random_batch

from tfmlib.attention import MultiHeadAttention
from tfmlib.data import EOS_ID
from tfmlib.decoding import beam_search, greedy_decode, sequence_log_probs
from tfmlib.kv_cache import (
    DecoderCache,
    KVCache,
    cached_cross_attention,
    cached_self_attention,
    cross_attention_kv,
    kv_bytes_per_token,
)
from tfmlib.positional import RotaryEmbedding
from tfmlib.transformer import Transformer


@pytest.mark.parametrize("preallocate", [True, False])
def test_kv_cache_appends_and_returns_every_position(preallocate):
    cache = KVCache(10, preallocate=preallocate, initial=2)
    ks, vs = [], []
    for T in (1, 3, 2, 1):
        k, v = torch.randn(2, 3, T, 4), torch.randn(2, 3, T, 4)
        ks.append(k)
        vs.append(v)
        keys, values = cache.append(k, v)
        torch.testing.assert_close(keys, torch.cat(ks, 2), rtol=0, atol=0)
        torch.testing.assert_close(values, torch.cat(vs, 2), rtol=0, atol=0)
    assert cache.length == 7
    if preallocate:
        assert cache.k.shape[2] == 8, "2 -> 4 -> 8 positions: doubled when full"
    with pytest.raises(ValueError, match="capacity"):
        cache.append(torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match="do not match"):
        cache.append(torch.randn(5, 3, 1, 4), torch.randn(5, 3, 1, 4))
    picked = cache.select(torch.tensor([1, 1, 0]))
    assert picked.length == 7
    want = torch.cat(ks, 2)[[1, 1, 0]]
    got, _ = picked.append(torch.zeros(3, 3, 1, 4), torch.zeros(3, 3, 1, 4))
    torch.testing.assert_close(got[:, :, :7], want, rtol=0, atol=0)


def test_preallocated_cache_writes_in_place():
    cache = KVCache(8)
    cache.append(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    buffer = cache.k.data_ptr()
    for _ in range(7):
        cache.append(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    assert cache.k.data_ptr() == buffer, "a pre-allocated cache must not reallocate before it is full"
    assert cache.nbytes == 2 * 8 * 2 * 4


def test_bad_capacity_and_bytes_per_token():
    with pytest.raises(ValueError, match="capacity"):
        KVCache(0)
    assert kv_bytes_per_token(4, 256) == 2 * 4 * 256 * 4
    assert kv_bytes_per_token(4, 256, torch.bfloat16) == 2 * 4 * 256 * 2
    with pytest.raises(ValueError, match="layers"):
        kv_bytes_per_token(0, 256)


@pytest.mark.parametrize("rotary", [False, True])
def test_cached_self_attention_equals_the_whole_prefix(rotary):
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4) if rotary else None).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.double)
    full, _ = attn(x, causal=True)
    cache = KVCache(9)
    outs = [cached_self_attention(attn, x[:, :3], cache)]          # a prompt of 3, then one at a time
    outs += [cached_self_attention(attn, x[:, t:t + 1], cache) for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(outs, 1), full)


def test_cached_cross_attention_equals_the_module():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4).double().eval()
    x, memory = torch.randn(3, 2, 16, dtype=torch.double), torch.randn(3, 5, 16, dtype=torch.double)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] + [False] * 4])[:, None, None, :]
    k, v = cross_attention_kv(attn, memory)
    torch.testing.assert_close(cached_cross_attention(attn, x, k, v, keep), attn(x, memory, mask=keep)[0])


def translator(seed: int, norm_first: bool) -> Transformer:
    """An untrained translator whose sentences end at different steps: an untied output layer drawn
    at scale 1, the EOS row at scale 3 (the seeds below were picked so that lengths vary)."""
    torch.manual_seed(seed)
    model = Transformer(SRC_V, TGT_V, d_model=16, heads=2, encoder_layers=2, decoder_layers=2, d_ff=32,
                        dropout=0.0, norm_first=norm_first, max_len=40, tie_output=False)
    with torch.no_grad():
        torch.nn.init.normal_(model.generator.weight, 0.0, 1.0)
        model.generator.weight[EOS_ID] *= 3
    return model


def both(model: Transformer, fn):
    model.kv_cache = True
    cached = fn()
    model.kv_cache = False
    plain = fn()
    model.kv_cache = True
    return cached, plain


CASES = [(False, 3), (False, 5), (False, 6), (False, 7), (True, 0), (True, 3), (True, 6), (True, 10)]


@pytest.mark.parametrize(("norm_first", "seed"), CASES)
def test_greedy_decode_is_the_same_with_and_without_the_cache(norm_first, seed):
    model = translator(seed, norm_first)
    _, b = random_batch(seed, batch=6)
    cached, plain = both(model, lambda: greedy_decode(model, b.src, b.src_mask, max_len=25))
    assert torch.equal(cached.tokens, plain.tokens), "cached greedy decoding changed a token"
    assert torch.equal(cached.lengths, plain.lengths)
    assert len(set(plain.lengths.tolist())) > 1, "the test needs rows that stop at different steps"


@pytest.mark.parametrize(("norm_first", "seed"), CASES)
@pytest.mark.parametrize("beam_size", [2, 3])
def test_beam_search_is_the_same_with_and_without_the_cache(norm_first, seed, beam_size):
    model = translator(seed, norm_first)
    _, b = random_batch(seed, batch=6)
    cached, plain = both(model, lambda: beam_search(model, b.src, b.src_mask, beam_size, max_len=20))
    assert torch.equal(cached.tokens, plain.tokens), "cached beam search changed a token"
    assert torch.equal(cached.lengths, plain.lengths)
    torch.testing.assert_close(cached.scores, plain.scores, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached.normalized, plain.normalized, rtol=1e-5, atol=1e-5)
    rescored = sequence_log_probs(model, b.src, b.src_mask, cached.tokens, cached.lengths)
    torch.testing.assert_close(cached.scores, rescored, rtol=1e-4, atol=1e-4)


def test_a_decoder_cache_selects_every_part():
    cache = DecoderCache.empty(2, 6, cross=[(torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5))] * 2)
    for layer in cache.layers:
        layer.append(torch.randn(3, 2, 2, 5), torch.randn(3, 2, 2, 5))
    rows = torch.tensor([2, 0])
    picked = cache.select(rows)
    assert picked.length == 2 and picked.cross[0][0].shape[0] == 2
    torch.testing.assert_close(picked.layers[1].k[:, :, :2], cache.layers[1].k[rows, :, :2], rtol=0, atol=0)
    torch.testing.assert_close(picked.cross[1][1], cache.cross[1][1][rows], rtol=0, atol=0)
    assert cache.nbytes == 2 * 2 * (3 * 2 * 6 * 5 * 4)

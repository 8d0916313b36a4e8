"""tfmlib.kv_cache: the cache's buffers (pre-allocated, grown, concatenated, selected, forked with
copy on write), the layers run with the cache equal to re-reading the prefix (post-LN and pre-LN),
a step that leaves its input state alone (the same step twice, two branches from one state), the
encoder-decoder's greedy and beam search equal with and without the cache, token for token and
score for score, and no import circle between the cache and the layers."""

import ast
from pathlib import Path

import pytest
import torch
from test_seq2seq import SRC_V, TGT_V, random_batch

from tfmlib.attention import MultiHeadAttention, causal_mask, padding_mask
from tfmlib.data import EOS_ID
from tfmlib.decoding import beam_search, greedy_decode, sequence_log_probs
from tfmlib.kv_cache import DecoderCache, KVCache, kv_bytes_per_token
from tfmlib.lm import DecoderLM
from tfmlib.positional import RotaryEmbedding
from tfmlib.transformer import DecoderLayer, EncoderLayer, Transformer

PACKAGE = Path(__file__).resolve().parents[1] / "tfmlib"


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


def test_a_fork_shares_the_buffers_and_copies_on_write():
    cache = KVCache(8, initial=8)
    first = torch.randn(1, 2, 3, 4)
    cache.append(first, first + 1)
    buffer = cache.k.data_ptr()
    a, b = cache.fork(), cache.fork()
    assert a.k.data_ptr() == buffer, "a fork copies nothing"
    ka, _ = a.append(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert a.k.data_ptr() == buffer, "the first cache to write after a position writes in place"
    kb, _ = b.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    assert b.k.data_ptr() != buffer, "a cache whose next position was written by a fork copies first"
    assert cache.length == 3, "forks and appends leave the original's length alone"
    torch.testing.assert_close(ka[:, :, 3], torch.ones(1, 2, 4), rtol=0, atol=0)
    torch.testing.assert_close(kb[:, :, 3], torch.zeros(1, 2, 4), rtol=0, atol=0)
    torch.testing.assert_close(ka[:, :, :3], first, rtol=0, atol=0)
    torch.testing.assert_close(kb[:, :, :3], first, rtol=0, atol=0)
    # the original, appended to again, must not see either fork's position 3
    again, _ = cache.append(torch.full((1, 2, 1, 4), 7.0), torch.full((1, 2, 1, 4), 7.0))
    torch.testing.assert_close(again[:, :, 3], torch.full((1, 2, 4), 7.0), rtol=0, atol=0)
    torch.testing.assert_close(a.k[:, :, 3], torch.ones(1, 2, 4), rtol=0, atol=0)
    # a linear run of forks (what generation does) never copies
    linear = KVCache(8)
    linear.append(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    buffer = linear.k.data_ptr()
    for _ in range(7):
        linear = linear.fork()
        linear.append(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    assert linear.k.data_ptr() == buffer


@pytest.mark.parametrize("rotary", [False, True])
def test_attention_with_a_cache_equals_the_whole_prefix(rotary):
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4) if rotary else None).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.double)
    full, _ = attn(x, causal=True)
    cache = KVCache(9)
    outs = [attn(x[:, :3], causal=True, cache=cache)[0]]          # a prompt of 3, then one at a time
    outs += [attn(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(3, 9)]
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(outs, 1), full)


def test_projected_keys_and_values_equal_the_module():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4).double().eval()
    x, memory = torch.randn(3, 2, 16, dtype=torch.double), torch.randn(3, 5, 16, dtype=torch.double)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] + [False] * 4])[:, None, None, :]
    kv = attn.keys_values(memory)
    torch.testing.assert_close(attn(x, memory, mask=keep, kv=kv)[0], attn(x, memory, mask=keep)[0],
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="rotary"):
        MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4))(x.float(), kv=kv)


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_with_a_cache_equal_the_layers_on_the_whole_prefix(norm_first):
    """EncoderLayer run causally (chapter 09's block) and DecoderLayer, post-LN and pre-LN: a prompt
    of 3 and then one token at a time through the cache give the full pass's outputs."""
    torch.manual_seed(1)
    enc = EncoderLayer(16, 4, 32, 0.0, norm_first=norm_first).double().eval()
    dec = DecoderLayer(16, 4, 32, 0.0, norm_first=norm_first).double().eval()
    x, memory = torch.randn(2, 8, 16, dtype=torch.double), torch.randn(2, 5, 16, dtype=torch.double)
    memory_mask = padding_mask(torch.tensor([[True] * 5, [True] * 2 + [False] * 3]))
    want_enc, _ = enc(x, causal_mask(8))
    want_dec, _, _ = dec(x, memory, memory_mask)
    enc_cache, dec_cache, memory_kv = KVCache(8), KVCache(8), dec.cross_attn.keys_values(memory)
    got_enc, got_dec = [], []
    for lo, hi in [(0, 3)] + [(t, t + 1) for t in range(3, 8)]:
        got_enc.append(enc(x[:, lo:hi], causal=True, cache=enc_cache)[0])
        got_dec.append(dec(x[:, lo:hi], memory, memory_mask, cache=dec_cache, memory_kv=memory_kv)[0])
    torch.testing.assert_close(torch.cat(got_enc, 1), want_enc)
    torch.testing.assert_close(torch.cat(got_dec, 1), want_dec)


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_decode_step_leaves_its_state_unchanged(norm_first):
    """The same step twice from one state gives the same logits, and two branches from one state
    each equal decoding without the cache (the prefix re-read)."""
    model = translator(3, norm_first).eval()
    _, b = random_batch(3, batch=4)
    enc = model.encode(b.src, b.src_mask)
    state = enc.state
    prefix = b.tgt_in[:, :3]
    for t in range(3):
        state = model.decode_step(prefix[:, t], state, enc).state
    once = model.decode_step(b.tgt_in[:, 3], state, enc)
    twice = model.decode_step(b.tgt_in[:, 3], state, enc)
    torch.testing.assert_close(twice.logits, once.logits, rtol=0, atol=0)
    assert state.length == 3, "a step must not extend the state it was given"
    for branch_token in (torch.full((4,), 5), torch.full((4,), 6)):  # a state decides its own kind of step
        branch = model.decode_step(branch_token, state, enc)
        branch = model.decode_step(b.tgt_in[:, 4], branch.state, enc)
        plain_prefix = torch.cat([prefix, branch_token[:, None]], 1)    # kv_cache=False's state: the prefix
        want = model.decode_step(b.tgt_in[:, 4], plain_prefix, enc)
        torch.testing.assert_close(branch.logits, want.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preallocate", [True, False])
def test_a_language_model_step_leaves_its_cache_unchanged(preallocate):
    torch.manual_seed(0)
    model = DecoderLM(30, d_model=16, heads=2, layers=2, context=20).double().eval()
    ids = torch.randint(4, 30, (2, 8))
    _, cache = model.step(ids[:, :5], model.new_cache(preallocate=preallocate))
    first, _ = model.step(ids[:, 5:6], cache)
    second, _ = model.step(ids[:, 5:6], cache)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    assert cache.length == 5
    for token in (7, 9):                      # two continuations of one cache, each two tokens long
        branch = torch.cat([ids[:, :5], torch.full((2, 1), token), ids[:, 7:8]], dim=1)
        _, c = model.step(branch[:, 5:6], cache)
        logits, c = model.step(branch[:, 6:7], c)
        assert c.length == 7
        torch.testing.assert_close(logits[:, -1], model(branch)[:, -1])


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


def test_beam_steps_reorder_beams_without_copying_the_cross_attention(monkeypatch):
    """Reordering beams keeps each sentence's rows within it, so the cross-attention keys and values
    (the same for every beam) are shared, not copied, at every step; they are selected only when a
    sentence leaves the batch (review 2026-11-26-ch09, finding 9)."""
    model = translator(3, False)
    _, b = random_batch(3, batch=4)
    cross_copies, beam_selects = [], []
    select, select_beams = DecoderCache.select, DecoderCache.select_beams

    def counting_select(self, rows):
        cross_copies.append(len(rows))
        return select(self, rows)

    def counting_select_beams(self, rows):
        out = select_beams(self, rows)
        assert all(k1 is k2 and v1 is v2 for (k1, v1), (k2, v2) in zip(out.cross, self.cross, strict=True))
        beam_selects.append(len(rows))
        return out

    monkeypatch.setattr(DecoderCache, "select", counting_select)
    monkeypatch.setattr(DecoderCache, "select_beams", counting_select_beams)
    beam_search(model, b.src, b.src_mask, 3, max_len=20)
    assert len(beam_selects) > 5, "every step reorders the beams"
    assert len(cross_copies) < len(beam_selects), "a full select happens only when sentences finish"


def _imports(path: Path) -> set[str]:
    """The tfmlib modules a file imports anywhere: at the top, in functions, under TYPE_CHECKING."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfmlib."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "tfmlib":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[1] for a in node.names if a.name.startswith("tfmlib."))
    return names


def test_the_cache_module_imports_nothing_from_the_package_and_no_circle_runs_through_it():
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
    assert graph["kv_cache"] == set(), graph["kv_cache"]

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    for module in ("kv_cache", "transformer", "attention", "lm", "decoding", "sampling"):
        assert not reaches(module, module), f"tfmlib.{module} is on an import circle"


def test_a_decoder_cache_selects_every_part():
    cache = DecoderCache.empty(2, 6, cross=[(torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5))] * 2)
    for layer in cache.layers:
        layer.append(torch.randn(3, 2, 2, 5), torch.randn(3, 2, 2, 5))
    fork = cache.fork()
    assert fork.length == 2 and fork.layers[0] is not cache.layers[0] and fork.cross[1] is cache.cross[1]
    rows = torch.tensor([2, 0])
    picked = cache.select(rows)
    assert picked.length == 2 and picked.cross[0][0].shape[0] == 2
    torch.testing.assert_close(picked.layers[1].k[:, :, :2], cache.layers[1].k[rows, :, :2], rtol=0, atol=0)
    torch.testing.assert_close(picked.cross[1][1], cache.cross[1][1][rows], rtol=0, atol=0)
    assert cache.nbytes == 2 * 2 * (3 * 2 * 6 * 5 * 4)

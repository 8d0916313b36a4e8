"""tfmlib.lm: the decoder-only LM is causal, its forward pass equals chapter 07's layers run with a
causal mask, tied weights, and generation with the cache equals generation without it, token for
token and logit for logit (rotary and learned positions, pre-allocated or concatenated)."""

import pytest
import torch

from tfmlib.attention import causal_mask
from tfmlib.data import PAD_ID
from tfmlib.lm import DecoderLM, generate
from tfmlib.rnn import collate_lm, lm_loss

V = 40


def small_lm(positional: str = "rotary", seed: int = 0, **kw) -> DecoderLM:
    torch.manual_seed(seed)
    model = DecoderLM(V, d_model=32, heads=4, layers=2, context=48, positional=positional, **kw)
    return model.double().eval()


@pytest.mark.parametrize("positional", ["rotary", "learned"])
def test_forward_equals_the_layers_with_a_causal_mask(positional):
    model = small_lm(positional)
    ids = torch.randint(4, V, (3, 11))
    x = model.embed(ids)
    if model.pos is not None:
        x = model.pos(x)
    for block in model.blocks:
        x, _ = block(x, causal_mask(11))
    torch.testing.assert_close(model(ids), model.head(model.norm(x)))


def test_the_model_is_causal_and_tied():
    model = small_lm()
    ids = torch.randint(4, V, (2, 10))
    later = ids.clone()
    later[:, 6:] = 5
    torch.testing.assert_close(model(ids)[:, :6], model(later)[:, :6])
    assert not torch.allclose(model(ids)[:, 6:], model(later)[:, 6:])
    assert model.head.weight is model.embed.weight
    loss, n = lm_loss(model, collate_lm([[5, 6, 7], [8, 9]]))
    assert n == 7 and torch.isfinite(loss)


@pytest.mark.parametrize("positional", ["rotary", "learned"])
@pytest.mark.parametrize("preallocate", [True, False])
def test_cached_generation_equals_recomputation(positional, preallocate):
    model = small_lm(positional, seed=1)
    prompt = torch.randint(4, V, (3, 5))
    cached, cached_logits = generate(model, prompt, 30, preallocate=preallocate, return_logits=True)
    plain, plain_logits = generate(model, prompt, 30, use_cache=False, return_logits=True)
    assert torch.equal(cached, plain), "the cache changed a generated token"
    torch.testing.assert_close(cached_logits, plain_logits, rtol=1e-10, atol=1e-10)
    assert torch.equal(cached[:, :5], prompt)
    sampled = [generate(model, prompt, 20, use_cache=c, top_p=0.9, temperature=1.3,
                        generator=torch.Generator().manual_seed(7)) for c in (True, False)]
    assert torch.equal(*sampled), "a seeded draw must give the same text with and without the cache"


def test_generate_rejects_bad_input():
    model = small_lm()
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="context"):
        generate(model, torch.full((1, 40), 5), 9)
    with pytest.raises(ValueError, match="context"):
        model(torch.full((1, 49), 5))
    with pytest.raises(ValueError, match="temperature"):
        generate(model, torch.full((1, 3), 5), 3, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, torch.full((1, 3), 5), 3, top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, torch.full((1, 3), 5), 0)
    left_padded = torch.tensor([[5, 6, 7, 8], [PAD_ID, PAD_ID, 6, 7]])
    with pytest.raises(ValueError, match=r"row 1 holds PAD_ID \(0\) at position 0.*one length"):
        generate(model, left_padded, 3)
    with pytest.raises(ValueError, match="divisible"):
        DecoderLM(V, d_model=30, heads=4)


@pytest.mark.parametrize("positional", ["rotary", "learned"])
def test_attention_kernels_give_the_same_model(positional):
    """"explicit" (chapter 05's written-out softmax) and "fused" (SDPA) compute the same logits and
    gradients; a callable kernel is called with fast_attention's arguments, by forward and by step."""
    torch.manual_seed(0)
    model = DecoderLM(23, d_model=16, heads=2, layers=2, context=12, positional=positional).double()
    ids = torch.randint(4, 23, (3, 10))
    results = {}
    for name in ("fused", "explicit"):
        model.attention = name
        model.zero_grad()
        logits = model(ids)
        logits.square().mean().backward()
        results[name] = (logits.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(results["fused"][0], results["explicit"][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(results["fused"][1], results["explicit"][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    calls = []

    def recording_kernel(q, k, v, mask, causal, dropout_p):
        calls.append((tuple(q.shape), tuple(k.shape), causal))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    model.attention = recording_kernel
    torch.testing.assert_close(model(ids), results["fused"][0], rtol=1e-10, atol=1e-12)
    assert calls == [((3, 2, 10, 8), (3, 2, 10, 8), True)] * 2, calls
    calls.clear()
    _, cache = model.step(ids[:, :4], model.new_cache())
    model.step(ids[:, 4:5], cache)
    assert calls[-1] == ((3, 2, 1, 8), (3, 2, 5, 8), False), calls  # one new query sees every cached key


def test_attention_kernel_is_checked():
    with pytest.raises(ValueError, match="attention must be one of"):
        DecoderLM(10, d_model=8, heads=2, layers=1, attention="flash")
    model = DecoderLM(10, d_model=8, heads=2, layers=1)
    with pytest.raises(TypeError, match="a name or a callable"):
        model.attention = 3
    with pytest.raises(ValueError, match="more than the model's context"):
        model(torch.ones(1, 200, dtype=torch.long))

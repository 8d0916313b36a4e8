"""tfmlib.attention: the explicit and the fast attention agree (forward and backward, with masks), both
equal nn.MultiheadAttention with copied weights, masks mean what they say (no leakage from the
future, no NaN for a fully masked row), and bad input gets a clear error."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tfmlib.attention import (
    MultiHeadAttention,
    causal_mask,
    check_mask,
    copy_from_torch_mha,
    fast_attention,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)


def qkv(seed: int, B=2, h=3, T=4, S=5, d=6, dv=7, dtype=torch.double):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()
                 for shape in ((B, h, T, d), (B, h, S, d), (B, h, S, dv)))


def token_mask(lengths, S):
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


# ----------------------------------------------------------------------------- masks


def test_causal_mask_is_the_lower_triangle_and_aligns_extra_keys_to_the_end():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # two queries that are the last two of four positions
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="S >= T"):
        causal_mask(4, 2)
    with pytest.raises(ValueError, match="positive int"):
        causal_mask(0)


def test_padding_mask_shape_and_errors():
    m = padding_mask(token_mask([3, 1], 4))
    assert m.shape == (2, 1, 1, 4) and m[1, 0, 0].tolist() == [True, False, False, False]
    with pytest.raises(ValueError, match=r"\(batch, length\) bool"):
        padding_mask(torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\(batch, length\) bool"):
        padding_mask(torch.ones(2, 1, 4, dtype=torch.bool))


def test_check_mask_accepts_the_usual_shapes_and_names_bad_ones():
    shape = (2, 3, 4, 5)
    assert check_mask(torch.ones(4, 5, dtype=torch.bool), shape, "t").shape == (4, 5)
    assert check_mask(torch.ones(2, 4, 5, dtype=torch.bool), shape, "t").shape == (2, 1, 4, 5)
    assert check_mask(torch.ones(2, 1, 1, 5, dtype=torch.bool), shape, "t").shape == (2, 1, 1, 5)
    with pytest.raises(TypeError, match="bool"):
        check_mask(torch.ones(4, 5), shape, "t")
    with pytest.raises(ValueError, match=r"padding_mask\(\)"):
        check_mask(torch.ones(2, 5, dtype=torch.bool), shape, "t")  # a token mask passed as is
    with pytest.raises(ValueError, match=r"mask \(3, 1, 1, 5\) does not broadcast .* \(2, 3, 4, 5\)"):
        check_mask(torch.ones(3, 1, 1, 5, dtype=torch.bool), shape, "t")
    with pytest.raises(ValueError, match="2, 3 or 4 dimensions"):
        check_mask(torch.ones(5, dtype=torch.bool), shape, "t")


# ----------------------------------------------------------------------------- the two attentions


def test_explicit_attention_is_the_formula():
    q, k, v = qkv(0)
    out, w = scaled_dot_product_attention(q, k, v)
    for b in range(2):
        for head in range(3):
            for t in range(4):
                e = torch.stack([q[b, head, t] @ k[b, head, s] for s in range(5)]) / math.sqrt(6)
                a = torch.softmax(e, 0)
                torch.testing.assert_close(w[b, head, t], a)
                torch.testing.assert_close(out[b, head, t], (a[:, None] * v[b, head]).sum(0))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.booleans(),
       st.integers(0, 10_000))
def test_fast_equals_explicit_forward_and_backward(B, h, T, S, causal, seed):
    if causal and S < T:
        S = T
    q, k, v = qkv(seed, B, h, T, S, 4, 3)
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = padding_mask(torch.arange(S)[None] < lengths[:, None])
    explicit_mask = mask & causal_mask(T, S) if causal else mask
    out_e, _ = scaled_dot_product_attention(q, k, v, explicit_mask)
    out_f = fast_attention(q, k, v, mask, causal=causal)
    torch.testing.assert_close(out_f, out_e)
    grad = torch.randn(out_e.shape, generator=g, dtype=out_e.dtype)
    ge = torch.autograd.grad(out_e, (q, k, v), grad)
    gf = torch.autograd.grad(out_f, (q, k, v), grad)
    for a, b in zip(ge, gf, strict=True):
        torch.testing.assert_close(a, b)


def test_masked_keys_get_zero_weight_and_a_fully_masked_row_gives_zeros_not_nan():
    q, k, v = qkv(3, B=2, h=1, T=3, S=4)
    mask = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, :, 2:] = False       # keys 2, 3 of sentence 0 are padding
    mask[1, 0, 1] = False           # query 1 of sentence 1 may attend to nothing
    out_e, w = scaled_dot_product_attention(q, k, v, mask)
    out_f = fast_attention(q, k, v, mask)
    assert torch.all(w[0, 0, :, 2:] == 0)
    assert torch.all(w[1, 0, 1] == 0) and torch.all(out_e[1, 0, 1] == 0) and torch.all(out_f[1, 0, 1] == 0)
    (out_f.sum() + out_e.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.all(q.grad[1, 0, 1] == 0), "a query that sees nothing gets no gradient"


def test_no_leakage_from_the_future():
    """The output at position t has zero gradient with respect to every input after t."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).double()
    x = torch.randn(1, 6, 8, dtype=torch.double, requires_grad=True)
    for need_weights in (False, True):
        out, _ = mha(x, causal=True, need_weights=need_weights)
        for t in range(6):
            (grad,) = torch.autograd.grad(out[0, t].sum(), x, retain_graph=True)
            assert torch.all(grad[0, t + 1:] == 0), f"position {t} depends on later positions"
            assert grad[0, : t + 1].abs().sum(-1).min() > 0, f"position {t} should see positions 0..{t}"


def test_attention_input_errors():
    q, k, v = qkv(0)
    with pytest.raises(ValueError, match="same width d_k"):
        scaled_dot_product_attention(q, k[..., :5], v)
    with pytest.raises(ValueError, match="keys and values must agree"):
        fast_attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match=r"\(batch, heads, length, width\)"):
        fast_attention(q[0], k, v)
    with pytest.raises(TypeError, match="floating"):
        scaled_dot_product_attention(q.long(), k, v)


# ----------------------------------------------------------------------------- multi-head


def test_split_and_merge_heads_are_inverse_and_slice_the_features():
    x = torch.arange(2 * 3 * 8, dtype=torch.float).view(2, 3, 8)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 2)
    torch.testing.assert_close(heads[:, 1], x[:, :, 2:4])   # head 1 holds features 2..3
    torch.testing.assert_close(merge_heads(heads), x)


def test_heads_as_a_batch_axis_equal_a_loop_over_heads():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.double)
    out, w = mha(x, need_weights=True)
    d = 4
    heads = []
    for i in range(3):
        sl = slice(i * d, (i + 1) * d)
        q = x @ mha.q_proj.weight[sl].T + mha.q_proj.bias[sl]
        k = x @ mha.k_proj.weight[sl].T + mha.k_proj.bias[sl]
        v = x @ mha.v_proj.weight[sl].T + mha.v_proj.bias[sl]
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), -1)
        torch.testing.assert_close(w[:, i], a)
        heads.append(a @ v)
    torch.testing.assert_close(out, mha.out_proj(torch.cat(heads, -1)))


@pytest.mark.parametrize("case", ["self", "self+padding", "causal", "causal+padding", "cross+padding"])
def test_equal_to_nn_multiheadattention_forward_backward_and_weights(case):
    torch.manual_seed(0)
    B, T, S, d, h = 3, 5, 6, 16, 4
    ref = nn.MultiheadAttention(d, h, batch_first=True).double()
    mine = copy_from_torch_mha(ref, MultiHeadAttention(d, h).double())
    x = torch.randn(B, T, d, dtype=torch.double, requires_grad=True)
    mem = torch.randn(B, S, d, dtype=torch.double, requires_grad=True) if case.startswith("cross") else x
    L = mem.shape[1]
    keep = token_mask([L, L - 2, 1], L)
    kwargs_ref, mask, causal = {}, None, case.startswith("causal")
    if "padding" in case:
        kwargs_ref["key_padding_mask"] = ~keep          # PyTorch: True = do NOT attend
        mask = padding_mask(keep)
    if causal:
        kwargs_ref["attn_mask"] = ~causal_mask(T)
    want, want_w = ref(x, mem, mem, need_weights=True, average_attn_weights=False, **kwargs_ref)
    extra = [mem] if mem is not x else []
    grads_ref = torch.autograd.grad(want.square().sum(), [x, *ref.parameters()] + extra)
    for need_weights in (False, True):
        got, got_w = mine(x, mem, mask=mask, causal=causal, need_weights=need_weights)
        torch.testing.assert_close(got, want)
        if need_weights:
            torch.testing.assert_close(got_w, want_w)
        params = [mine.q_proj, mine.k_proj, mine.v_proj]
        grads = torch.autograd.grad(got.square().sum(), [x] + [mem] * (mem is not x)
                                    + [p.weight for p in params] + [p.bias for p in params]
                                    + [mine.out_proj.weight, mine.out_proj.bias])
        torch.testing.assert_close(grads[0], grads_ref[0])
        if mem is not x:
            torch.testing.assert_close(grads[1], grads_ref[-1])
        rest = grads[1 + (mem is not x):]
        torch.testing.assert_close(torch.cat(rest[:3]), grads_ref[1])       # in_proj_weight
        torch.testing.assert_close(torch.cat(rest[3:6]), grads_ref[2])      # in_proj_bias
        torch.testing.assert_close(rest[6], grads_ref[3])                   # out_proj.weight
        torch.testing.assert_close(rest[7], grads_ref[4])                   # out_proj.bias


def test_multihead_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 4, 8)
    mha.eval()
    a, _ = mha(x)
    b, _ = mha(x)
    torch.testing.assert_close(a, b)
    mha.train()
    c, _ = mha(x)
    assert not torch.allclose(a, c)


def test_multihead_errors_name_the_problem():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="positive int"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(8, 2, dropout=1.0)
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query must be \(batch, length, d_model=8\), got \(2, 3, 6\)"):
        mha(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="same batch size"):
        mha(torch.randn(2, 3, 8), torch.randn(3, 3, 8))
    with pytest.raises(ValueError, match="empty input"):
        mha(torch.randn(2, 0, 8))
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(torch.randn(2, 3, 8), mask=torch.ones(3, 1, 1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"d_model, heads\)=\(8, 4\)"):
        copy_from_torch_mha(nn.MultiheadAttention(8, 4), mha)

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
    # a floating mask is additive (added to the scores) and keeps its dtype
    assert check_mask(torch.zeros(4, 5, dtype=torch.double), shape, "t").dtype == torch.double
    assert check_mask(torch.zeros(1, 5), shape, "t").shape == (1, 5)      # broadcasts to (T, S)
    with pytest.raises(TypeError, match="bool tensor .* or a floating tensor"):
        check_mask(torch.ones(4, 5, dtype=torch.long), shape, "t")
    with pytest.raises(TypeError, match="got list"):
        check_mask([[True]], shape, "t")
    with pytest.raises(ValueError, match=r"padding_mask\(\)"):
        check_mask(torch.ones(2, 5, dtype=torch.bool), shape, "t")  # a token mask passed as is
    with pytest.raises(ValueError, match=r"padding_mask\(\)"):
        check_mask(torch.zeros(2, 5), shape, "t")
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


# ----------------------------------------------------------------------------- float (additive) masks


def additive(keep: torch.Tensor, dtype=torch.double) -> torch.Tensor:
    """The 0 / -inf image of a bool keep-mask."""
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, -math.inf)


# Mask shapes of F.scaled_dot_product_attention's docstring ("broadcastable to (N, ..., L, S)") and of
# test_transformers.py's test_scaled_dot_product_attention_math_with_negative_inf_attn_mask /
# mask-shape cases: (T, S), (1, S), (B, 1, 1, S), (B, 1, T, S), (1, h, T, S), (B, h, T, S).
FLOAT_MASK_SHAPES = [(4, 5), (1, 5), (2, 1, 1, 5), (2, 1, 4, 5), (1, 3, 4, 5), (2, 3, 4, 5)]


@pytest.mark.parametrize("shape", FLOAT_MASK_SHAPES)
@pytest.mark.parametrize("with_neg_inf", [False, True])
def test_float_mask_equals_torch_sdpa_forward_and_backward(shape, with_neg_inf):
    """A real-valued bias (ALiBi-like, with or without -inf entries) in every broadcast shape: both
    attentions equal F.scaled_dot_product_attention with the same attn_mask, output and gradients of
    q, k, v and of the bias itself."""
    q, k, v = qkv(11)
    g = torch.Generator().manual_seed(12)
    bias = torch.randn(shape, generator=g, dtype=torch.double)
    if with_neg_inf:  # knock out some keys, but leave every row at least one (key 0)
        drop = torch.rand(shape, generator=g) < 0.4
        drop[..., 0] = False
        bias = bias.masked_fill(drop, -math.inf)
    bias.requires_grad_()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    grad = torch.randn(want.shape, generator=g, dtype=want.dtype)
    want_grads = torch.autograd.grad(want, (q, k, v, bias), grad)
    for name, fn in (("explicit", lambda: scaled_dot_product_attention(q, k, v, bias)[0]),
                     ("fast", lambda: fast_attention(q, k, v, bias))):
        got = fn()
        torch.testing.assert_close(got, want, msg=f"{name} attention with a float mask {shape}")
        got_grads = torch.autograd.grad(got, (q, k, v, bias), grad)
        for what, a, b in zip("qkv" + "m", got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, msg=f"{name}: gradient of {what} with a float mask {shape}")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.booleans(),
       st.integers(0, 10_000))
def test_float_zero_neginf_mask_equals_the_bool_mask_including_fully_masked_rows(B, h, T, S, causal, seed):
    """The 0/-inf image of a random bool mask (some rows fully masked) gives what the bool mask gives, in
    both attentions, with and without causal=True: zeros, not NaN, for a row that sees nothing."""
    if causal and S < T:
        S = T
    q, k, v = qkv(seed, B, h, T, S, 4, 3)
    g = torch.Generator().manual_seed(seed + 1)
    keep = torch.rand(B, 1, T, S, generator=g) < 0.6
    bias = additive(keep)
    ref_e, ref_w = scaled_dot_product_attention(q, k, v, keep, causal=causal)
    got_e, got_w = scaled_dot_product_attention(q, k, v, bias, causal=causal)
    ref_f, got_f = fast_attention(q, k, v, keep, causal=causal), fast_attention(q, k, v, bias, causal=causal)
    for name, a, b in (("weights", got_w, ref_w), ("explicit", got_e, ref_e), ("fast", got_f, ref_f)):
        assert torch.isfinite(a).all(), f"{name}: NaN or inf with a float mask"
        torch.testing.assert_close(a, b, msg=f"{name}: float 0/-inf mask differs from the bool mask")
    grad = torch.randn(ref_e.shape, generator=g, dtype=ref_e.dtype)
    for got, ref in ((got_e, ref_e), (got_f, ref_f)):
        for a, b in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad),
                        strict=True):
            assert torch.isfinite(a).all(), "a NaN gradient through a fully masked row"
            torch.testing.assert_close(a, b)


def test_float_mask_in_multihead_attention_equals_nn_multiheadattention():
    # mirrors test_multihead_attention.py's test_multihead_attn_3d_attn_mask / float attn_mask cases:
    # nn.MultiheadAttention adds a float attn_mask to the scores, as ours does
    torch.manual_seed(0)
    B, T, S, d, h = 2, 4, 6, 16, 4
    ref = nn.MultiheadAttention(d, h, batch_first=True).double()
    mine = copy_from_torch_mha(ref, MultiHeadAttention(d, h).double())
    x, mem = torch.randn(B, T, d, dtype=torch.double), torch.randn(B, S, d, dtype=torch.double)
    bias = torch.randn(T, S, dtype=torch.double)
    bias[1, 2:] = -math.inf
    want, want_w = ref(x, mem, mem, attn_mask=bias, need_weights=True, average_attn_weights=False)
    for need_weights in (False, True):
        got, got_w = mine(x, mem, mask=bias, need_weights=need_weights)
        torch.testing.assert_close(got, want)
        if need_weights:
            torch.testing.assert_close(got_w, want_w)
    # a float mask combined with causal=True: the causal part becomes -inf
    square = torch.randn(T, T, dtype=torch.double)
    want, _ = ref(x, x, x, attn_mask=square.masked_fill(~causal_mask(T), -math.inf))
    for need_weights in (False, True):
        got, _ = mine(x, mask=square, causal=True, need_weights=need_weights)
        torch.testing.assert_close(got, want)


# ----------------------------------------------------------------------------- float16 (bug 3)


def test_explicit_attention_does_not_overflow_in_float16():
    """Issue 14, bug 3: q @ k^T = 40 * 40 * 64 = 102400 > 65504 overflowed to inf before the division by
    sqrt(d) and gave NaN; scaling q first keeps every intermediate finite (fails on the old code)."""
    x = torch.full((1, 1, 2, 64), 40.0, dtype=torch.float16)
    out, weights = scaled_dot_product_attention(x, x, x)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all(), f"float16 overflow: {out}"
    torch.testing.assert_close(out, x, msg="equal keys and values: the output is the value")
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(x, x, x))


def test_need_weights_in_float16_is_finite_and_close_to_float32():
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 1)
    with torch.no_grad():
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj):
            proj.weight.copy_(torch.eye(64))
            proj.bias.zero_()
    x = 40 + torch.rand(1, 3, 64)                                   # dot products ~1e5: above 65504
    want, want_w = mha(x, need_weights=True)
    half = mha.half()
    for need_weights in (True, False):
        got, got_w = half(x.half(), need_weights=need_weights)
        assert torch.isfinite(got).all(), f"need_weights={need_weights}: NaN/inf in float16"
        torch.testing.assert_close(got.float(), want, atol=0.1, rtol=1e-2)
        if need_weights:
            torch.testing.assert_close(got_w.float(), want_w, atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- causal alignment


def test_causal_alignment_bottom_right_versus_pytorch_is_causal_top_left():
    """With T < S, causal=True aligns the queries with the last T keys (a decoder after a cache);
    PyTorch's is_causal=True with the first T. align="top_left" reproduces PyTorch, and PyTorch's own
    causal_lower_right bias reproduces ours."""
    from torch.nn.attention.bias import causal_lower_right

    T, S = 2, 5
    assert causal_mask(T, S).tolist() == [[True, True, True, True, False], [True] * 5]
    assert causal_mask(T, S, align="top_left").tolist() == [[True, False, False, False, False],
                                                           [True, True, False, False, False]]
    q, k, v = qkv(5, T=T, S=S)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ours = fast_attention(q, k, v, causal=True)
    torch.testing.assert_close(ours, sdpa(q, k, v, attn_mask=causal_lower_right(T, S)))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, causal=True)[0], ours)
    theirs = sdpa(q, k, v, is_causal=True)
    assert (ours - theirs).abs().max() > 1e-3, "the two alignments must differ for T < S"
    torch.testing.assert_close(fast_attention(q, k, v, causal_mask(T, S, align="top_left")), theirs)
    # equal lengths: one lower triangle, the alignments agree
    q, k, v = qkv(6, T=4, S=4)
    torch.testing.assert_close(fast_attention(q, k, v, causal=True), sdpa(q, k, v, is_causal=True))
    with pytest.raises(ValueError, match="align must be"):
        causal_mask(2, 3, align="top-left")


# ----------------------------------------------------------------------------- copies (bug 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(add_bias_kv=True), "add_bias_kv"),
    (dict(add_zero_attn=True), "add_zero_attn"),
    (dict(kdim=4, vdim=4), "kdim/vdim"),
    (dict(dropout=0.1), "dropout"),
])
def test_copy_from_torch_mha_refuses_modules_it_cannot_represent(kwargs, match):
    """Issue 14, bug 1: add_bias_kv / add_zero_attn modules were copied silently and the copy computed
    something else (outputs 0.12 apart); now refused. The parameters come from
    test_multihead_attention.py's test_multihead_attn_add_bias_kv / test_multihead_attn_add_zero_attn."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=True, **kwargs).eval()
    if "dropout" not in kwargs and "kdim" not in kwargs:   # show what a silent copy would compute
        mine = MultiHeadAttention(8, 2)
        with torch.no_grad():
            for i, proj in enumerate((mine.q_proj, mine.k_proj, mine.v_proj)):
                proj.weight.copy_(ref.in_proj_weight.chunk(3)[i])
                proj.bias.copy_(ref.in_proj_bias.chunk(3)[i])
            mine.out_proj.load_state_dict(ref.out_proj.state_dict())
        x = torch.randn(2, 4, 8)
        assert (mine(x)[0] - ref(x, x, x)[0]).abs().max() > 1e-3, "the weights alone do not give its output"
    with pytest.raises(ValueError, match=match):
        copy_from_torch_mha(ref, MultiHeadAttention(8, 2))


def test_multihead_refuses_what_it_does_not_offer():
    """The "differences from PyTorch" of the module docstring each fail with a clear error."""
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"batch first; no unbatched input"):
        mha(torch.randn(3, 8))                                  # unbatched (L, d_model), as PyTorch allows
    with pytest.raises(ValueError, match=r"key must be \(batch, length, d_model=8\)"):
        mha(torch.randn(2, 3, 8), torch.randn(2, 5, 4))          # kdim != d_model
    with pytest.raises(ValueError, match="no rotary="):
        mha(torch.randn(2, 3, 8), q_positions=torch.arange(3))


# ----------------------------------------------------------------------------- cases from PyTorch's tests


@pytest.mark.parametrize("seed", range(5))
def test_one_query_with_a_float_mask_and_key_padding_equals_nn_multiheadattention(seed):
    """Mirrors test_multihead_attention.py's test_multihead_attention helper
    (test_multihead_attn_key_padding_mask): one decoder query against S encoder states, random sizes,
    a (1, S) float 0/-inf attn_mask combined with a key padding mask; outputs and per-head weights.
    Ours takes the two as one float mask: the attn_mask plus -inf at the padded keys."""
    g = torch.Generator().manual_seed(seed)
    B, S = (int(v) for v in torch.randint(2, 11, (2,), generator=g))
    heads = 2 * int(torch.randint(1, 3, (1,), generator=g))
    d_head = int(torch.randint(3, 11, (1,), generator=g))
    d = heads * d_head
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d, heads, batch_first=True).double()
    mine = copy_from_torch_mha(ref, MultiHeadAttention(d, heads).double())
    query = torch.rand(B, 1, d, generator=g, dtype=torch.double)
    memory = torch.rand(B, S, d, generator=g, dtype=torch.double)
    attn_mask = additive(torch.rand(1, S, generator=g) < 0.7)
    attn_mask[0, 0] = 0.0                                      # key 0 is always visible: no empty row
    key_padding = torch.rand(1, S, generator=g).expand(B, S) < 0.3
    key_padding = key_padding & (torch.arange(S) > 0)           # (True = padding, PyTorch's convention)
    want, want_w = ref(query, memory, memory, attn_mask=attn_mask, key_padding_mask=additive(~key_padding),
                       average_attn_weights=False)
    ours_mask = attn_mask + additive(padding_mask(~key_padding))            # (B, 1, 1, S)
    for need_weights in (False, True):
        got, got_w = mine(query, memory, mask=ours_mask, need_weights=need_weights)
        torch.testing.assert_close(got, want)
        if need_weights:
            torch.testing.assert_close(got_w, want_w)


def test_a_3d_mask_is_one_mask_per_sentence():
    """Mirrors test_multihead_attention.py's test_multihead_attn_3d_attn_mask: a (B, T, S) float mask
    gives, for each sentence, what its (T, S) slice gives alone. (PyTorch's 3-D mask is (B * h, T, S),
    repeated per head; ours is (B, T, S), shared by the heads.)"""
    torch.manual_seed(0)
    B, h, T, S, d = 8, 4, 2, 3, 8
    ref = nn.MultiheadAttention(d, h, batch_first=True)
    mine = copy_from_torch_mha(ref, MultiHeadAttention(d, h))
    query, key = torch.rand(B, T, d), torch.rand(B, S, d)
    mask = additive(torch.rand(B, T, S) < 0.6, torch.float)
    got, _ = mine(query, key, mask=mask)
    want, _ = ref(query, key, key, attn_mask=mask.repeat_interleave(h, dim=0))
    sees = (mask > -math.inf).any(-1)                               # (B, T): rows PyTorch leaves finite
    torch.testing.assert_close(got[sees], want[sees])
    assert torch.all(got[~sees] == mine.out_proj.bias), "a query that sees nothing: zero attention output"
    for i in range(B):
        alone, _ = mine(query[i:i + 1], key[i:i + 1], mask=mask[i])
        torch.testing.assert_close(got[i:i + 1], alone)


def test_attn_mask_and_key_padding_mask_together():
    """Mirrors test_multihead_attention.py's test_multihead_self_attn_two_masks_fast_path: a (T, T) bool
    attn_mask and a (B, T) key padding mask together, PyTorch's fast path (eval, no_grad) and ours on
    the rows that can see some key; ours gives zeros (then the output bias) on the others."""
    torch.manual_seed(0)
    B, h, L, d = 8, 7, 5, 14
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    mine = copy_from_torch_mha(ref, MultiHeadAttention(d, h)).eval()
    x = torch.rand(B, L, d)
    attn_mask = torch.randint(0, 2, (L, L)).bool()                  # PyTorch: True = do not attend
    key_padding = torch.randint(0, 2, (B, L)).bool()
    keep = ~attn_mask & padding_mask(~key_padding)                  # ours: True = may attend
    with torch.no_grad():
        want, _ = ref(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding, need_weights=False)
        got, _ = mine(x, mask=keep)
    sees = keep.any(-1)[:, 0]                                       # (B, L)
    assert sees.any() and (~sees).any(), "the random masks should give both kinds of rows"
    torch.testing.assert_close(got[sees], want[sees])
    assert torch.equal(got[~sees], mine.out_proj.bias.expand_as(got[~sees]))


@pytest.mark.parametrize("T, S", [(1, 7), (3, 10), (10, 3), (5, 5)])
def test_cross_attention_with_different_lengths_equals_nn_multiheadattention(T, S):
    """Cross-attention lengths, as test_multihead_attention.py varies them (tgt_len != src_len), with
    source padding; outputs, weights and input gradients."""
    torch.manual_seed(T * 100 + S)
    ref = nn.MultiheadAttention(12, 3, batch_first=True).double()
    mine = copy_from_torch_mha(ref, MultiHeadAttention(12, 3).double())
    x = torch.randn(2, T, 12, dtype=torch.double, requires_grad=True)
    mem = torch.randn(2, S, 12, dtype=torch.double, requires_grad=True)
    keep = token_mask([S, max(1, S - 2)], S)
    want, want_w = ref(x, mem, mem, key_padding_mask=~keep, average_attn_weights=False)
    want_grads = torch.autograd.grad(want.sum(), (x, mem))
    for need_weights in (False, True):
        got, got_w = mine(x, mem, mask=padding_mask(keep), need_weights=need_weights)
        torch.testing.assert_close(got, want)
        if need_weights:
            torch.testing.assert_close(got_w, want_w)
        for a, b in zip(torch.autograd.grad(got.sum(), (x, mem)), want_grads, strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shape", FLOAT_MASK_SHAPES)
def test_bool_masks_in_every_broadcast_shape_equal_torch_sdpa(shape):
    """F.scaled_dot_product_attention's bool attn_mask (True = take part in attention, our convention) in
    every broadcast shape; rows that see at least one key."""
    q, k, v = qkv(21)
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(22)) < 0.6
    keep[..., 0] = True
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(fast_attention(q, k, v, keep), want)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, keep)[0], want)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_float16_inputs_agree_with_float32(mask_kind):
    """Mirrors test_transformers.py's low-precision SDPA checks (float16 against a higher-precision
    reference): both attentions in float16 are within float16 tolerance of the float32 result."""
    q, k, v = (t.detach().float() for t in qkv(31, B=2, h=2, T=6, S=6, d=16, dv=16))
    keep = causal_mask(6)
    mask = {"none": None, "bool": keep, "float": additive(keep, torch.float)}[mask_kind]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    half_mask = mask.half() if mask is not None and mask.is_floating_point() else mask
    for name, got in (("explicit", scaled_dot_product_attention(q.half(), k.half(), v.half(), half_mask)[0]),
                      ("fast", fast_attention(q.half(), k.half(), v.half(), half_mask))):
        assert got.dtype == torch.float16, f"{name}: float16 in, float16 out"
        torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3, msg=f"{name} in float16")


def test_a_1d_mask_is_refused_like_pytorch_does():
    """test_multihead_attention.py's test_multihead_attn_invalid_shape: a 1-D attn_mask is an error."""
    mha = MultiHeadAttention(4, 4)
    with pytest.raises(ValueError, match="2, 3 or 4 dimensions"):
        mha(torch.randn(4, 4, 4), mask=torch.tensor([False, False, True, True]))

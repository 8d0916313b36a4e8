"""Tests for tfmlib.flash: the online softmax equals torch.softmax, tiled (FlashAttention-style)
attention equals F.scaled_dot_product_attention forward and backward, and it saves O(T) memory.

Several cases follow PyTorch's own tests in ``test/test_transformers.py`` (named in each test's
docstring); they are re-written here for the book's conventions (bool keep-masks, bottom-right causal
alignment, zeros for a query that sees nothing), not copied.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfmlib.attention import causal_mask, padding_mask, scaled_dot_product_attention
from tfmlib.flash import online_softmax, saved_tensor_bytes, tiled_attention

TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def qkv(B: int, h: int, T: int, S: int, d: int, d_v: int | None = None, dtype: torch.dtype = torch.float64,
        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d_v = d if d_v is None else d_v
    q = torch.randn(B, h, T, d, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, h, S, d, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, h, S, d_v, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def out_and_grads(fn, q, k, v, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """``fn(q, k, v)`` and the gradients of q, k, v for one fixed random upstream gradient."""
    out = fn(q, k, v)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), g))


def assert_all_close(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], tol: float,
                     what: str) -> None:
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == b.shape, f"{what}: {name} shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.isfinite(a).all(), f"{what}: {name} has non-finite entries"
        err = (a - b).abs().max().item()
        assert err <= tol, f"{what}: {name} differs by {err:.3e} (tolerance {tol:.0e})"


# --------------------------------------------------------------------------- online softmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [1, 3, 7, 16, 100])
def test_online_softmax_equals_softmax(dtype: torch.dtype, block: int) -> None:
    x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(block), dtype=dtype) * 3
    got = online_softmax(x, block)
    want = torch.softmax(x, dim=-1)
    err = (got - want).abs().max().item()
    assert err <= TOL[dtype], f"block {block}, {dtype}: differs from torch.softmax by {err:.2e}"


def test_online_softmax_infinities_and_huge_values() -> None:
    x = torch.randn(4, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[0, [2, 5, 6]] = -math.inf                     # some masked entries
    x[1] = -math.inf                                # a fully masked row
    x[2, :4] = -math.inf                            # the whole first block masked (block 4)
    x[3] = x[3] * 1e3 + 1e4                         # exp overflows float64 without the max
    assert not torch.isfinite(torch.exp(x[3])).all(), "the test's huge row should overflow a naive exp"
    for block in (1, 4, 5, 11):
        got = online_softmax(x, block)
        assert torch.isfinite(got).all(), f"block {block}: non-finite probabilities {got}"
        keep = [0, 2, 3]
        err = (got[keep] - torch.softmax(x[keep], -1)).abs().max().item()
        assert err <= 1e-12, f"block {block}: differs from torch.softmax by {err:.2e}"
        assert torch.equal(got[1], torch.zeros(11, dtype=x.dtype)), f"block {block}: an all -inf row {got[1]}"
        assert torch.all(got[0, [2, 5, 6]] == 0), "masked entries must get probability 0"


def test_online_softmax_trace_is_the_running_max_and_sum() -> None:
    x = torch.tensor([[1.0, 3.0, 2.0, 5.0, 4.0]], dtype=torch.float64)
    probs, trace = online_softmax(x, 2, return_trace=True)
    assert len(trace) == 3, f"5 entries in blocks of 2 give 3 blocks, got {len(trace)}"
    for i, (m, l) in enumerate(trace):
        seen = x[:, :2 * (i + 1)]
        assert torch.equal(m, seen.amax(-1)), f"block {i}: running max {m} != {seen.amax(-1)}"
        want_l = torch.exp(seen - seen.amax(-1, keepdim=True)).sum(-1)
        assert torch.allclose(l, want_l, rtol=1e-14, atol=0), f"block {i}: running sum {l} != {want_l}"
    assert torch.allclose(probs, torch.softmax(x, -1), rtol=1e-14, atol=0), "probabilities after the trace"


def test_online_softmax_bad_input() -> None:
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        online_softmax(torch.ones(3, dtype=torch.long), 2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            online_softmax(torch.ones(3), bad)
    with pytest.raises(ValueError, match="non-empty last dimension"):
        online_softmax(torch.ones(2, 0), 2)


# --------------------------------------------------------------------------- tiled attention vs SDPA


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(1, 1), (7, 7), (64, 64), (3, 5), (100, 100)])
def test_tiled_equals_sdpa_self_attention(dtype: torch.dtype, causal: bool, blocks: tuple[int, int]) -> None:
    """Follows ``TestTransformers.test_scaled_dot_product_attention`` (SDPA against a math reference
    over shapes and ``is_causal``), with forward and backward compared as in
    ``TestSDPA.test_mem_efficient_attention_vs_math_ref_grads``. T == S == 19 (no block size
    divides it), ``d_v != d``."""
    q, k, v = qkv(2, 3, 19, 19, 8, 5, dtype=dtype)
    bq, bk = blocks
    got = out_and_grads(lambda a, b, c: tiled_attention(a, b, c, causal=causal, block_q=bq, block_k=bk),
                        q, k, v)
    want = out_and_grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v)
    assert_all_close(got, want, TOL[dtype], f"{dtype}, causal={causal}, blocks {blocks}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T, S", [(5, 23), (23, 5), (1, 17), (17, 1)])
def test_tiled_equals_sdpa_cross_attention(dtype: torch.dtype, T: int, S: int) -> None:
    """T != S without a causal mask, as in ``TestSDPA``'s tests over ``(seq_len_q, seq_len_k)``
    pairs (e.g. ``test_mem_efficient_attention_vs_math_ref_grads``)."""
    q, k, v = qkv(2, 2, T, S, 6, 4, dtype=dtype, seed=T * 31 + S)
    got = out_and_grads(lambda a, b, c: tiled_attention(a, b, c, block_q=4, block_k=6), q, k, v)
    want = out_and_grads(F.scaled_dot_product_attention, q, k, v)
    assert_all_close(got, want, TOL[dtype], f"{dtype}, T={T}, S={S}")


@pytest.mark.parametrize("shape", [(1, 1, 23, 56, 15), (2, 2, 16, 32, 8), (1, 2, 7, 7, 4)])
def test_tiled_causal_is_lower_right(shape: tuple[int, ...]) -> None:
    """Follows ``TestAttnBias.test_causal_variants`` (``CausalVariant.LOWER_RIGHT``, including its
    shape ``(1, 1, 23, 56, 15)``): with T < S the queries are the last T positions, which is the
    book's ``causal=True`` and PyTorch's ``causal_lower_right``, compared with the explicit
    attention and with SDPA given that mask."""
    B, h, T, S, d = shape
    q, k, v = qkv(B, h, T, S, d, seed=S)
    for bq, bk in ((4, 8), (64, 64), (1, 3)):
        got = out_and_grads(lambda a, b, c, bq=bq, bk=bk: tiled_attention(a, b, c, causal=True, block_q=bq,
                                                                          block_k=bk), q, k, v)
        explicit = out_and_grads(lambda a, b, c: scaled_dot_product_attention(a, b, c, causal=True)[0],
                                 q, k, v)
        assert_all_close(got, explicit, 1e-10, f"{shape}, blocks {(bq, bk)} vs the explicit attention")
    sdpa = out_and_grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=causal_mask(T, S)),
                         q, k, v)
    assert_all_close(got, sdpa, 1e-10, f"{shape} vs SDPA with the lower-right mask")
    if T < S:   # PyTorch's is_causal=True is top-left: a different answer, so the alignment matters
        top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert (top_left - got[0]).abs().max() > 1e-3, "bottom-right and top-left should differ when T < S"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_key_padding_and_a_fully_masked_row(dtype: torch.dtype, causal: bool) -> None:
    """Follows ``TestSDPA.test_fully_masked_out_rows`` (no NaN, and zero gradients through rows
    that see nothing; the book sets those rows to zero where PyTorch's result depends on the
    backend). Sentence 1 has no real key at all; sentence 0 has padding inside blocks and a
    whole padded block."""
    B, h, T, S = 3, 2, 13, 13
    q, k, v = qkv(B, h, T, S, 8, 6, dtype=dtype, seed=5)
    keep = torch.ones(B, S, dtype=torch.bool)
    keep[0, 4:9] = False                          # block_k=4: key block 4:8 wholly padded
    keep[0, 11] = False
    keep[1] = False                               # every query of sentence 1 sees nothing
    keep[2, 0] = False                            # with causal=True, query 0 of sentence 2 sees nothing
    got = out_and_grads(lambda a, b, c: tiled_attention(a, b, c, causal=causal, key_padding_mask=keep,
                                                        block_q=5, block_k=4), q, k, v)
    want = out_and_grads(lambda a, b, c: scaled_dot_product_attention(a, b, c, padding_mask(keep),
                                                                      causal=causal)[0], q, k, v)
    assert_all_close(got, want, TOL[dtype], f"{dtype}, causal={causal}, key padding")
    out, dq, dk, dv = got
    assert torch.equal(out[1], torch.zeros_like(out[1])), "a sentence with no real key must give zeros"
    assert torch.equal(dq[1], torch.zeros_like(dq[1])), "no gradient through queries that see nothing"
    assert torch.equal(dk[1], torch.zeros_like(dk[1])) and torch.equal(dv[1], torch.zeros_like(dv[1])), \
        "no gradient into keys and values nobody attends to"
    assert torch.all(dk[0, :, 4:9] == 0) and torch.all(dv[0, :, 4:9] == 0), "padded keys get no gradient"
    if causal:
        assert torch.equal(out[2, :, 0], torch.zeros_like(out[2, :, 0])), "causal + padding: no key"
    # sentence 0 (every query sees a key): F.scaled_dot_product_attention itself agrees
    mask0 = padding_mask(keep[:1]) & (causal_mask(T, S) if causal else True)
    sdpa = out_and_grads(lambda a, b, c: F.scaled_dot_product_attention(a[:1], b[:1], c[:1], attn_mask=mask0),
                         q, k, v)
    mine = out_and_grads(lambda a, b, c: tiled_attention(a[:1], b[:1], c[:1], causal=causal,
                                                         key_padding_mask=keep[:1], block_q=5, block_k=4),
                         q, k, v)
    assert_all_close(mine, sdpa, TOL[dtype], f"{dtype}, causal={causal}, key padding vs SDPA")


def test_tiled_attention_gradcheck() -> None:
    """``torch.autograd.gradcheck`` on a tiny float64 case (as ``TestSDPA`` gradchecks the math
    backend): the recomputing backward is the derivative of the forward, with causal masking,
    key padding, and blocks that do not divide the lengths."""
    q, k, v = qkv(1, 2, 5, 7, 3, 2, seed=3)
    keep = torch.tensor([[True, True, False, True, True, True, False]])

    def fn(a, b, c):
        return tiled_attention(a, b, c, causal=True, key_padding_mask=keep, block_q=2, block_k=3)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8), "gradcheck failed"
    assert torch.autograd.gradcheck(lambda a, b, c: tiled_attention(a, b, c, block_q=4, block_k=2),
                                    (q, k, v), eps=1e-6, atol=1e-8), "gradcheck failed (no mask)"


def test_tiled_attention_half_precision_inputs_keep_dtype() -> None:
    """bfloat16 inputs are accumulated in float32 and returned as bfloat16 (the fused kernels'
    behaviour); the result is as close to the float64 answer as rounding to bfloat16 allows."""
    q, k, v = qkv(1, 2, 9, 9, 8)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    qb, kb, vb = (x.detach().to(torch.bfloat16).requires_grad_() for x in (q, k, v))
    out = tiled_attention(qb, kb, vb, causal=True, block_q=4, block_k=4)
    assert out.dtype == torch.bfloat16, f"output dtype {out.dtype}"
    err = (out.double() - ref).abs().max().item()
    assert err < 0.05, f"bfloat16 tiled attention is {err:.3f} from the float64 answer"
    out.sum().backward()
    assert qb.grad is not None and qb.grad.dtype == torch.bfloat16, "gradients come back in the input dtype"


def test_tiled_attention_bad_input() -> None:
    """Follows ``TestSDPAFailureModes`` (``test_invalid_inputs_dim_3``,
    ``test_invalid_inputs_different_datatypes``, mismatched head dimensions): each bad input is
    refused with an error naming it."""
    q, k, v = qkv(1, 1, 4, 6, 3)
    with pytest.raises(ValueError, match="must be \\(batch, heads, length, width\\)"):
        tiled_attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="one dtype"):
        tiled_attention(q, k.float(), v)
    with pytest.raises(TypeError, match="floating"):
        tiled_attention(q, k.long(), v)
    with pytest.raises(ValueError, match="same width d_k"):
        tiled_attention(q, k[..., :2], v)
    with pytest.raises(ValueError, match="keys and values must agree"):
        tiled_attention(q, k, v[:, :, :5])
    for name in ("block_q", "block_k"):
        for bad in (0, -2, 1.5, True):
            with pytest.raises(ValueError, match=f"{name} must be a positive int"):
                tiled_attention(q, k, v, **{name: bad})
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(batch, keys\) = \(1, 6\)"):
        tiled_attention(q, k, v, key_padding_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        tiled_attention(q, k, v, key_padding_mask=torch.ones(1, 6))
    with pytest.raises(ValueError, match="S >= T"):
        tiled_attention(k, q, q[..., :2], causal=True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        tiled_attention(q, k, v, causal=1)


# --------------------------------------------------------------------------- memory


def test_saved_tensor_bytes_counts_each_storage_once() -> None:
    x = torch.randn(100, dtype=torch.float64, requires_grad=True)
    assert saved_tensor_bytes(lambda: x * 2) == 0, "multiplying by a constant saves nothing"
    # x * x saves x twice (one storage); exp saves its output: 2 storages of 800 bytes
    assert saved_tensor_bytes(lambda: (x * x).sum() + x.exp().sum()) == 1600, "each storage once"
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: x * x) == 0, "nothing is saved without grad"


def test_tiled_attention_saves_linear_memory_explicit_quadratic() -> None:
    """The point of the algorithm: autograd keeps O(T) bytes for tiled attention (q, k, v, out
    and the log-sum-exp) and O(T^2) for the explicit one (the (B, h, T, T) weights)."""
    B, h, d = 1, 2, 8

    def saved(n: int, fn) -> int:
        q, k, v = qkv(B, h, n, n, d, dtype=torch.float32)
        return saved_tensor_bytes(lambda: fn(q, k, v))

    def tiled(q, k, v):
        return tiled_attention(q, k, v, causal=True, block_q=32, block_k=32)

    def explicit(q, k, v):
        return scaled_dot_product_attention(q, k, v, causal=True)[0]

    n = 64
    t1, t2 = saved(n, tiled), saved(2 * n, tiled)
    e1, e2 = saved(n, explicit), saved(2 * n, explicit)
    scores = B * h * n * n * 4
    assert e1 >= scores, f"explicit attention should save at least one (B, h, T, T) tensor: {e1} < {scores}"
    assert t1 < scores, f"tiled attention saved {t1} bytes, as much as a (B, h, T, T) tensor ({scores})"
    linear = 4 * (4 * B * h * n * d + B * h * n)       # float32 q, k, v, out (B, h, T, d) and L (B, h, T)
    assert t1 == linear, f"tiled attention should save q, k, v, out and L: {linear} bytes, got {t1}"
    assert 1.9 <= t2 / t1 <= 2.1, f"doubling T should double the tiled attention's bytes: {t1} -> {t2}"
    assert e2 / e1 >= 3.0, f"doubling T should about quadruple the explicit attention's bytes: {e1} -> {e2}"


def test_the_key_mask_is_saved_for_backward_like_the_other_tensors():
    """The mask goes through save_for_backward: saved-tensor hooks count it, and changing it in
    place between the forward and the backward pass is an error, not a silently wrong gradient."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1, 5, 4, requires_grad=True) for _ in range(3))
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[0, 3:] = False
    with_mask = saved_tensor_bytes(
        lambda: tiled_attention(q, k, v, key_padding_mask=keep, block_q=2, block_k=2))
    without = saved_tensor_bytes(lambda: tiled_attention(q, k, v, block_q=2, block_k=2))
    assert with_mask - without == keep.numel() * keep.element_size(), (with_mask, without)
    out = tiled_attention(q, k, v, key_padding_mask=keep, block_q=2, block_k=2)
    keep[1, 0] = False                                            # an in-place change after the forward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()

"""Checkers for chapter 05 (scaled dot-product and multi-head attention).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("05.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _ch05_attention_case(seed: int) -> tuple[torch.Tensor, ...]:
    """Random ``q, k, v`` and a ``(B, 1, T, S)`` mask: padded keys, and (in most cases) one query
    row that may attend to nothing. ``T != S`` and ``d_k != d_v``, so transposes do not fit."""
    g = torch.Generator().manual_seed(seed)
    B, h = 2 + seed % 2, 1 + seed % 3
    T, S = 3 + seed % 3, 5 + seed % 2
    d_k, d_v = 4 + seed % 2, 3
    q, k = torch.randn(B, h, T, d_k, generator=g), torch.randn(B, h, S, d_k, generator=g)
    v = torch.randn(B, h, S, d_v, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    mask = (torch.arange(S)[None, :] < lengths[:, None])[:, None, None, :].expand(B, 1, T, S).clone()
    if seed % 4 != 3:
        mask[-1, 0, T - 1] = False  # the last query of the last sentence may see nothing
    return q * 2, k * 2, v, mask  # scores with a spread large enough for scale mistakes to show


def _ch05_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf gives NaN: make it zeros
    return weights @ v, weights


@checker("05.attention", hint="scores = q @ k.transpose(-2, -1) / d_k ** 0.5, (B, h, T, S); fill the hidden "
         "scores (mask False) with a very negative finite number, softmax over the keys (dim=-1), multiply "
         "the weights by the mask (a row that sees nothing becomes all zeros), then out = weights @ v")
def _check_attention(attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(6):
        q, k, v, mask = _ch05_attention_case(seed)
        want_out, want_weights = _ch05_attention_reference(q, k, v, mask)
        got = attention(q.clone(), k.clone(), v.clone(), mask.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (out, weights)")
        out, weights = got
        if not isinstance(weights, torch.Tensor) or not isinstance(out, torch.Tensor):
            raise Wrong("return two tensors (out, weights)")
        if weights.shape == want_weights.shape:
            if torch.isnan(weights).any() or torch.isnan(out).any():
                raise Wrong("NaN in your result: a query that may attend to nothing gives a row of -inf "
                            "scores, and softmax of that row is 0/0; fill with a large finite negative "
                            "number instead of -inf, and multiply the weights by the mask")
            if (weights.masked_select(~mask.expand_as(weights)).abs() > 1e-6).any():
                raise Wrong("a hidden key (mask False) got a non-zero weight: apply the mask to the scores "
                            "before the softmax, and zero the rows that may see nothing")
            for wrong_scale, what in ((1.0, "you did not scale the scores: divide them by sqrt(d_k)"),
                                      (1.0 / q.shape[-1], "divide the scores by sqrt(d_k), not by d_k")):
                _, unscaled = _ch05_attention_reference(q, k, v, mask, scale=wrong_scale)
                if torch.allclose(weights.double(), unscaled.double(), atol=1e-5):
                    raise Wrong(what)
            visible = mask.expand_as(weights).any(-1)
            if not torch.allclose(weights.sum(-1)[visible], torch.ones(int(visible.sum())), atol=1e-5):
                raise Wrong("each query's weights should sum to 1 over the keys: take the softmax over the "
                            "last axis (the keys), not over the queries")
        expect_close(weights, want_weights,
                     f"weights (B, h, T, S) for q {tuple(q.shape)}, k {tuple(k.shape)}")
        expect_close(out, want_out, f"out (B, h, T, d_v) for v {tuple(v.shape)}")


@checker("05.split_heads", hint="x.view(B, L, heads, D // heads) keeps each position's features together and "
         "cuts them into heads; then .transpose(1, 2) puts the heads before the positions")
def _check_split_heads(split_heads: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    for B, L, heads, d in [(2, 5, 3, 4), (1, 3, 4, 2), (3, 7, 2, 5), (2, 4, 6, 1)]:
        x = torch.randn(B, L, heads * d, generator=torch.Generator().manual_seed(B * L + heads))
        want = x.view(B, L, heads, d).transpose(1, 2)
        got = split_heads(x.clone(), heads)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a tensor, got {type(got).__name__}")
        if got.shape == want.shape and not torch.equal(got, want):
            if torch.equal(got, x.reshape(B, heads, L, d)):
                raise Wrong("you reshaped straight to (B, heads, L, d): that cuts the memory of (L, heads*d) "
                            "into pieces that mix positions; reshape to (B, L, heads, d) first, then swap "
                            "axes 1 and 2")
            if torch.equal(got, x.view(B, L, d, heads).permute(0, 3, 1, 2)):
                raise Wrong(f"head i must hold the contiguous features i*d .. (i+1)*d - 1 (here d = {d}); "
                            "yours takes every heads-th feature")
        if got.shape == (B, L, heads, d):
            raise Wrong(f"the heads must come before the positions: shape (B, heads, L, d) = "
                        f"{(B, heads, L, d)}, got {tuple(got.shape)} (transpose axes 1 and 2)")
        expect_close(got, want, f"split_heads(x of shape {tuple(x.shape)}, heads={heads})", atol=0, rtol=0)


@checker("05.causal_mask", hint="torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T): query t (one of "
         "the last T positions) may see keys 0 .. t + S - T")
def _check_causal_mask(causal_mask: Callable[[int, int], torch.Tensor]) -> None:
    for T, S in [(1, 1), (4, 4), (3, 5), (2, 6), (5, 5), (1, 4)]:
        want = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
        got = causal_mask(T, S)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise Wrong(f"return a bool tensor (True = may attend), got dtype {got.dtype}")
        if got.shape != want.shape:
            raise Wrong(f"for T={T}, S={S} the mask should have shape {(T, S)} (queries, keys), "
                        f"got {tuple(got.shape)}")
        if torch.equal(got, ~want):
            raise Wrong("your mask is True where attention is NOT allowed (PyTorch's nn.MultiheadAttention "
                        "convention); the book's masks are True where a query may attend")
        own = torch.zeros(T, S, dtype=torch.bool)
        own[torch.arange(T), torch.arange(T) + S - T] = True  # query t is position t + S - T
        if torch.equal(got, want & ~own):
            raise Wrong("a position may attend to itself: the entries (t, t + S - T) must be True")
        if not torch.equal(got, want):
            hint = (" With S > T keys the T queries are the LAST T positions: query t sees keys "
                    "0 .. t + S - T (the diagonal argument of torch.tril)." if S > T else "")
            raise Wrong(f"for T={T}, S={S} expected {want.int().tolist()}, got {got.int().tolist()}.{hint}")

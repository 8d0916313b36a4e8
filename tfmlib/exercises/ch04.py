"""Checkers for chapter 04 (from GRU to self-attention).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("04.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _ch04_case(seed: int) -> tuple[int, int, int, torch.Generator]:
    g = torch.Generator().manual_seed(400 + seed)
    batch, length, width = (int(v) for v in torch.randint(2, 6, (3,), generator=g))
    return batch, length + 1, width, g  # length >= 3, so a position has a past and a future


def _ch04_causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    T = q.shape[-2]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@checker(
    "04.causal_attention",
    hint=("sections 2 and 3 build causal weights: score every (query t, key i) pair, hide the keys after t "
          "before the softmax with a triangular mask, then mix the values with the weights"),
)
def _check_causal_attention(causal_attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(5):
        B, T, d, g = _ch04_case(seed)
        d_v = d + 1 + seed % 2
        q, k = torch.randn(B, T, d, generator=g), torch.randn(B, T, d, generator=g)
        v = torch.randn(B, T, d_v, generator=g)
        want_out, want_w = _ch04_causal_reference(q, k, v)
        got = causal_attention(q.clone(), k.clone(), v.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (out, weights)")
        out, weights = got
        if isinstance(weights, torch.Tensor) and weights.shape == want_w.shape:
            future = ~torch.ones(T, T, dtype=torch.bool).tril()
            if (weights[:, future].abs() > 1e-6).any():
                raise Wrong("position t gave weight to a later position i > t: set the scores above the "
                            "diagonal to -inf before the softmax")
            if not torch.allclose(weights.sum(-1).double(), torch.ones(B, T, dtype=torch.double), atol=1e-5):
                raise Wrong("each row of weights should sum to 1 over i <= t: mask the scores before the "
                            "softmax, not the weights after it")
            scaled = _ch04_causal_reference(q, k, v, scale=d ** -0.5)[1]
            if torch.allclose(weights.double(), scaled.double(), atol=1e-5):
                raise Wrong("you divided the scores by sqrt(d): this chapter's score is the plain q_t . k_i "
                            "(chapter 05 adds the scale)")
        if isinstance(out, torch.Tensor) and out.shape == v.shape and torch.allclose(out.double(), v.double(),
                                                                                      atol=1e-5):
            raise Wrong("out equals v: you weighted each query's own value v_t. The sum runs over the "
                        "values' index: out_t = sum_i alpha_{t,i} v_i")
        expect_close(weights, want_w, f"weights (B, T, T) for q {tuple(q.shape)}")
        expect_close(out, want_out, f"out (B, T, d_v) for v {tuple(v.shape)}")


def _ch04_multi_head_reference(x: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor,
                               W_O: torch.Tensor, heads: int, transpose: bool = True) -> torch.Tensor:
    """Non-causal multi-head self-attention by a loop over heads (``transpose=False``: the common
    mistake of reshaping ``(B, T, d)`` straight to ``(B, heads, T, d_k)``)."""
    B, T, d = x.shape
    d_k = d // heads
    if not transpose:
        q, k, v = ((x @ W.T).reshape(B, heads, T, d_k) for W in (W_Q, W_K, W_V))
        out = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return out.reshape(B, T, d) @ W_O.T
    outs = []
    for g in range(heads):
        rows = slice(g * d_k, (g + 1) * d_k)
        q, k, v = x @ W_Q[rows].T, x @ W_K[rows].T, x @ W_V[rows].T
        outs.append(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)
    return torch.cat(outs, dim=-1) @ W_O.T


@checker(
    "04.multi_head_self_attention",
    hint=("section 5 ('Several heads'): project once with the full matrices, split the feature axis so "
          "each head gets its own block of columns, attend per head (the heads can be a batch axis), then "
          "put the heads back side by side in order and mix them with W_O"),
)
def _check_multi_head_self_attention(fn: Callable[..., torch.Tensor]) -> None:
    for seed, heads in enumerate((2, 3, 4, 2, 1)):
        B, T, d_k, g = _ch04_case(seed)
        d = heads * d_k
        x = torch.randn(B, T, d, generator=g)
        W_Q, W_K, W_V, W_O = (torch.randn(d, d, generator=g) / d ** 0.5 for _ in range(4))
        want = _ch04_multi_head_reference(x, W_Q, W_K, W_V, W_O, heads)
        got = fn(x.clone(), W_Q.clone(), W_K.clone(), W_V.clone(), W_O.clone(), heads)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and heads > 1:
            checks = [
                (_ch04_multi_head_reference(x, W_Q, W_K, W_V, W_O, heads, transpose=False),
                 "your heads mix positions: reshape (B, T, d) to (B, T, heads, d_k) first, then transpose to "
                 "(B, heads, T, d_k); a reshape straight to (B, heads, T, d_k) cuts across positions"),
                (_ch04_multi_head_reference(x, W_Q, W_K, W_V, W_O, 1),
                 "this is one head of width d: split the projections into `heads` heads of d / heads"),
                (_ch04_multi_head_reference(x, W_Q, W_K, W_V, torch.eye(d), heads),
                 "the heads are right but W_O is missing: multiply the concatenated heads by W_O.T"),
            ]
            for wrong, message in checks:
                if torch.allclose(got.double(), wrong.double(), atol=1e-5) and not torch.allclose(
                        wrong.double(), want.double(), atol=1e-5):
                    raise Wrong(message)
        expect_close(got, want, f"multi-head output for x {tuple(x.shape)}, heads={heads}")


def _ch04_positions_reference(x: torch.Tensor, P: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor,
                              W_V: torch.Tensor, form: str = "own") -> torch.Tensor:
    xp = x + P
    k, v = xp @ W_K.T, xp @ W_V.T
    if form == "own":
        scores = (xp @ W_Q.T) @ k.transpose(-2, -1)
    elif form == "key's":  # q_{t,i} = W_Q(x_t + p(i)): the key's position in the query
        scores = (x @ W_Q.T) @ k.transpose(-2, -1) + ((P @ W_Q.T) * k).sum(-1)[:, None, :]
    else:  # "query only": the position added to the query and not to the key and value
        scores = (xp @ W_Q.T) @ (x @ W_K.T).transpose(-2, -1)
        return torch.softmax(scores, dim=-1) @ (x @ W_V.T)
    return torch.softmax(scores, dim=-1) @ v


@checker(
    "04.attention_with_positions",
    hint=("section 7 adds a position vector to each input before anything else; after that it is step 4's "
          "one-head attention over all positions (no mask, no scaling)"),
)
def _check_attention_with_positions(fn: Callable[..., torch.Tensor]) -> None:
    for seed in range(5):
        B, T, d, g = _ch04_case(seed)
        d_k, d_v = d + 1, d + 2
        x, P = torch.randn(B, T, d, generator=g), torch.randn(T, d, generator=g)
        W_Q, W_K = torch.randn(d_k, d, generator=g), torch.randn(d_k, d, generator=g)
        W_V = torch.randn(d_v, d, generator=g)
        want = _ch04_positions_reference(x, P, W_Q, W_K, W_V)
        got = fn(x.clone(), P.clone(), W_Q.clone(), W_K.clone(), W_V.clone())
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            checks = [
                (_ch04_positions_reference(x, P, W_Q, W_K, W_V, "key's"),
                 "your query for key i uses p(i), the key's position: q_t must be W_Q(x_t + p(t)), "
                 "with the query's own position"),
                (_ch04_positions_reference(x, 0 * P, W_Q, W_K, W_V),
                 "the output does not depend on P: add the positions to the inputs"),
                (_ch04_positions_reference(x, P, W_Q, W_K, W_V, "query only"),
                 "the keys and values need positions too: k_i = W_K(x_i + p(i)), v_i = W_V(x_i + p(i))"),
            ]
            for wrong, message in checks:
                if torch.allclose(got.double(), wrong.double(), atol=1e-5):
                    raise Wrong(message)
        expect_close(got, want, f"output for x {tuple(x.shape)}, P {tuple(P.shape)}")



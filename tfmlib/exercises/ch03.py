"""Checkers for chapter 03 (Bahdanau attention).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("03.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _attention_case(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, S, H, A, D = (int(v) for v in torch.randint(2, 7, (5,), generator=g))
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    lengths[-1] = 1 if S > 1 else S  # a row that is mostly padding
    return dict(query=torch.randn(B, H, generator=g), annotations=torch.randn(B, S, A, generator=g),
                mask=torch.arange(S)[None, :] < lengths[:, None], W=torch.randn(D, H, generator=g),
                U=torch.randn(D, A, generator=g), v=torch.randn(D, generator=g))


def _additive_reference(c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.tanh((c["query"] @ c["W"].T)[:, None, :] + c["annotations"] @ c["U"].T) @ c["v"]  # (B, S)
    weights = torch.softmax(e.masked_fill(~c["mask"], float("-inf")), dim=-1)
    return torch.bmm(weights[:, None, :], c["annotations"]).squeeze(1), weights


@checker(
    "03.additive_attention",
    hint=("section 1 writes the alignment model out: project the query and the annotations to the same "
          "size D, add them (the query broadcast over source positions), squash, score with v; hide padded "
          "positions before the softmax over source positions so they get exactly zero weight; the context "
          "is the weighted sum of the annotations"),
)
def _check_additive_attention(additive_attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(5):
        c = _attention_case(seed)
        want_context, want_weights = _additive_reference(c)
        got = additive_attention(*(c[k].clone() for k in ("query", "annotations", "mask", "W", "U", "v")))
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (context, weights)")
        context, weights = got
        if isinstance(weights, torch.Tensor) and weights.shape == want_weights.shape:
            if (weights.masked_select(~c["mask"]).abs() > 1e-6).any():
                raise Wrong("padded source positions got a non-zero weight: mask the scores before "
                            "the softmax (a padded position must get exactly 0)")
            if not torch.allclose(weights.sum(-1), torch.ones(weights.shape[0]), atol=1e-5):
                raise Wrong("each row of weights should sum to 1 over the source positions: "
                            "take the softmax over the last axis")
        expect_close(weights, want_weights, "weights (B, S)")
        expect_close(context, want_context, "context (B, A)")


@checker(
    "03.general_score",
    hint=("section 5 lists Luong's scores: 'general' puts a matrix between query and key; one batched "
          "product over the shared axes gives all S scores at once"),
)
def _check_general_score(general_score: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, S, Q = (int(v) for v in torch.randint(2, 6, (3,), generator=g))
        K = Q + 1 + seed % 2  # Q != K, so a transposed W_a cannot fit by accident
        query, keys = torch.randn(B, Q, generator=g), torch.randn(B, S, K, generator=g)
        W_a = torch.randn(Q, K, generator=g)
        want = torch.einsum("bq,qk,bsk->bs", query, W_a, keys)
        got = general_score(query.clone(), keys.clone(), W_a.clone())
        expect_close(got, want, f"general_score(query {tuple(query.shape)}, keys {tuple(keys.shape)}, "
                     f"W_a {tuple(W_a.shape)})")


@checker(
    "03.attention_penalty",
    hint=("section 6 gives Lin et al.'s penalty: per example, A times its own transpose minus the "
          "identity, its squared Frobenius norm, then the mean over the batch"),
)
def _check_attention_penalty(attention_penalty: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, r, S = 2 + seed, 2 + seed % 2, 4 + seed
        A = torch.softmax(torch.randn(B, r, S, generator=g) * 3, dim=-1)
        want = ((A @ A.transpose(1, 2) - torch.eye(r)) ** 2).sum(dim=(1, 2)).mean()
        got = attention_penalty(A.clone())
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            raise Wrong(f"return a scalar (0-d) tensor, averaged over the batch; got shape "
                        f"{tuple(got.shape)}")
        expect_close(got, want, f"attention_penalty(A of shape {tuple(A.shape)})")

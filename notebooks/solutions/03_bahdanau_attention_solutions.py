# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Solutions: attention
#
# Worked solutions to the coding exercises of chapter 03, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is also compared with the package's implementation, which the chapter trained.
# Try the exercises in the chapter first.

# %%
import torch
from torch import Tensor

from tfmlib import exercises
from tfmlib.rnn_attention import AdditiveScore, GeneralScore, attention_penalty, masked_softmax

# %% [markdown]
# ## Coding exercises
#
# **1. Additive attention.** Project the query once, `(B, D)`, and every annotation,
# `(B, S, D)`; broadcasting adds the query to every position. Masking must happen *before* the
# softmax: zeroing weights afterwards leaves rows that no longer sum to one.

# %%
def additive_attention(query: Tensor, annotations: Tensor, mask: Tensor, W: Tensor, U: Tensor,
                       v: Tensor) -> tuple[Tensor, Tensor]:
    e = torch.tanh((query @ W.T)[:, None, :] + annotations @ U.T) @ v      # (B, S)
    weights = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)    # over the source axis
    context = torch.bmm(weights[:, None, :], annotations).squeeze(1)        # (B, A)
    return context, weights


exercises.check("03.additive_attention", additive_attention, must_pass=True)

# %% [markdown]
# The same computation with the package's `AdditiveScore` (its `U` has a bias, so we zero it)
# and `masked_softmax`:

# %%
torch.manual_seed(0)
B, S, H, A, D = 3, 6, 4, 5, 7
score = AdditiveScore(H, A, D)
with torch.no_grad():
    score.U.bias.zero_()
query, annotations = torch.randn(B, H), torch.randn(B, S, A)
mask = torch.arange(S)[None, :] < torch.tensor([6, 3, 1])[:, None]
with torch.no_grad():
    package_weights = masked_softmax(score(query, score.prepare(annotations)), mask)
    _, mine = additive_attention(query, annotations, mask, score.W.weight, score.U.weight, score.v.weight[0])
print(f"max |package - solution| = {(package_weights - mine).abs().max().item():.1e}")
assert torch.allclose(package_weights, mine, atol=1e-6), "the solution must match tfmlib's attention"

# %% [markdown]
# **2. Luong's general score.** `einsum` names every axis, which makes the formula
# $q^\top W_a k_j$ readable; `(keys @ W_a.T) @ q` is the same product in matrix form.

# %%
def general_score(query: Tensor, keys: Tensor, W_a: Tensor) -> Tensor:
    return torch.einsum("bq,qk,bsk->bs", query, W_a, keys)


exercises.check("03.general_score", general_score, must_pass=True)

general = GeneralScore(H, A)
with torch.no_grad():
    assert torch.allclose(general(query, general.prepare(annotations)),
                          general_score(query, annotations, general.W_a.weight), atol=1e-6), \
        "the solution must match tfmlib's GeneralScore"
print("matches tfmlib.rnn_attention.GeneralScore (whose W_a maps keys to the query size)")

# %% [markdown]
# **3. Lin et al.'s penalty.** $A A^\top$ is `(B, r, r)`: entry $(k, l)$ is the overlap of hop
# $k$ with hop $l$. The diagonal is pushed to 1 (each hop concentrated) and the rest to 0 (hops
# disjoint).

# %%
def attention_penalty_exercise(A: Tensor) -> Tensor:
    gram = A @ A.transpose(1, 2)
    eye = torch.eye(A.shape[1], dtype=A.dtype, device=A.device)
    return ((gram - eye) ** 2).sum(dim=(1, 2)).mean()


exercises.check("03.attention_penalty", attention_penalty_exercise, must_pass=True)
A_random = torch.softmax(torch.randn(4, 3, 9), dim=-1)
assert torch.allclose(attention_penalty(A_random), attention_penalty_exercise(A_random)), \
    "the solution must match tfmlib's attention_penalty"
print(f"penalty of random hops: {attention_penalty_exercise(A_random).item():.3f}; of one-hot distinct hops: "
      f"{attention_penalty_exercise(torch.eye(3, 9)[None]).item():.1f}")

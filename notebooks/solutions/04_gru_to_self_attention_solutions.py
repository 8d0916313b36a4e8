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
# # 04 · Solutions: from the GRU to self-attention
#
# Worked solutions to the coding exercises of chapter 04, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is then compared with an independent computation: a loop over positions, a loop over
# heads, or the formula written pair by pair. Try the exercises in the chapter first.

# %%
import torch
from torch import Tensor

from tfmlib import exercises
from tfmlib.rnn_attention import masked_softmax

# %% [markdown]
# ## Coding exercises
#
# **1. Causal attention.** The scores of every pair are one matrix product, `(B, T, T)`. The
# causal mask is the lower triangle; setting the scores above it to $-\infty$ *before* the
# softmax gives those positions weight exactly 0 and keeps each row summing to one. The output
# multiplies the weights by the values: row $t$ of `weights @ v` is $\sum_i \alpha_{t,i} v_i$, the
# sum over the values' index.

# %%
def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    T = q.shape[-2]
    future = ~torch.ones(T, T, dtype=torch.bool, device=q.device).tril()   # True where i > t
    scores = (q @ k.transpose(-2, -1)).masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


exercises.check("04.causal_attention", causal_attention, must_pass=True)

# %% [markdown]
# The same, one query at a time, the way a GRU would produce its outputs (and with chapter 03's
# `masked_softmax`, which uses the most negative float instead of $-\infty$, so that a row with
# nothing to attend to gives zeros instead of NaN):

# %%
torch.manual_seed(0)
q, k, v = torch.randn(2, 6, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 3)
out, weights = causal_attention(q, k, v)
loop = torch.stack([torch.softmax(torch.einsum("bd,bid->bi", q[:, t], k[:, : t + 1]), -1)[:, :, None]
                    .mul(v[:, : t + 1]).sum(1) for t in range(6)], dim=1)
allowed = torch.ones(6, 6, dtype=torch.bool).tril()
print(f"vs a loop over positions: {(out - loop).abs().max().item():.1e}; vs masked_softmax: "
      f"{(weights - masked_softmax(q @ k.transpose(-2, -1), allowed)).abs().max().item():.1e}")
assert torch.allclose(out, loop, atol=1e-6)
assert torch.allclose(weights, masked_softmax(q @ k.transpose(-2, -1), allowed), atol=1e-6)

# %% [markdown]
# **2. Multi-head self-attention.** The projections are full $d \times d$ matrices; the heads are
# slices of their outputs. Reshape the last axis `d` into `(heads, d_k)`, *then* move the head
# axis next to the batch axis: reshaping `(B, T, d)` straight to `(B, heads, T, d_k)` would cut
# the memory layout across positions and mix them. After attention, undo the two moves and
# mix the concatenated heads with $W_O$.

# %%
def multi_head_self_attention(x: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor,
                              heads: int) -> Tensor:
    B, T, d = x.shape

    def split(y: Tensor) -> Tensor:                      # (B, T, d) -> (B, heads, T, d_k)
        return y.view(B, T, heads, d // heads).transpose(1, 2)

    q, k, v = split(x @ W_Q.T), split(x @ W_K.T), split(x @ W_V.T)
    h = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v                # (B, heads, T, d_k)
    return h.transpose(1, 2).reshape(B, T, d) @ W_O.T


exercises.check("04.multi_head_self_attention", multi_head_self_attention, must_pass=True)

# %% [markdown]
# Against a loop over heads, each head with its own rows of the projection matrices, and
# against PyTorch's `nn.MultiheadAttention` (which scales the scores by $1/\sqrt{d_k}$: we undo
# that by multiplying our $W_Q$ by $\sqrt{d_k}$, and give it no biases):

# %%
torch.manual_seed(0)
d, heads = 12, 3
d_k = d // heads
x = torch.randn(2, 5, d)
W_Q, W_K, W_V, W_O = (torch.randn(d, d) / d**0.5 for _ in range(4))
mine = multi_head_self_attention(x, W_Q, W_K, W_V, W_O, heads)
per_head = []
for g in range(heads):
    rows = slice(g * d_k, (g + 1) * d_k)
    per_head.append(torch.softmax((x @ W_Q[rows].T) @ (x @ W_K[rows].T).transpose(-2, -1), -1) @ (x @ W_V[rows].T))
loop = torch.cat(per_head, dim=-1) @ W_O.T
mha = torch.nn.MultiheadAttention(d, heads, bias=False, batch_first=True)
with torch.no_grad():
    mha.in_proj_weight.copy_(torch.cat([W_Q * d_k**0.5, W_K, W_V]))
    mha.out_proj.weight.copy_(W_O)
    theirs, _ = mha(x, x, x, need_weights=False)
print(f"vs a loop over heads: {(mine - loop).abs().max().item():.1e}; "
      f"vs nn.MultiheadAttention: {(mine - theirs).abs().max().item():.1e}")
assert torch.allclose(mine, loop, atol=1e-5) and torch.allclose(mine, theirs, atol=1e-5)

# %% [markdown]
# **3. Positions, each vector its own.** Adding $P$ to the inputs once gives every query, key and
# value the position of the vector it is computed from: row $t$ of `(x + P) @ W_Q.T` is
# $W_Q(x_t + p(t))$, row $i$ of `(x + P) @ W_K.T` is $W_K(x_i + p(i))$.

# %%
def attention_with_positions(x: Tensor, P: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor) -> Tensor:
    xp = x + P                                            # (B, T, d) + (T, d): each row its own position
    q, k, v = xp @ W_Q.T, xp @ W_K.T, xp @ W_V.T
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


exercises.check("04.attention_with_positions", attention_with_positions, must_pass=True)

# %% [markdown]
# The formula written pair by pair, for comparison, and the write-up's form with the key's
# position in the query, $q_{t,i} = W_Q(x_t + p(i))$. On a sequence in which one token occurs
# twice, the correct form gives the two occurrences different outputs (each knows where it
# is); the other form cannot tell them apart.

# %%
torch.manual_seed(0)
T, d = 6, 8
x, P = torch.randn(1, T, d), torch.randn(T, d)
x[0, 4] = x[0, 1]                                         # the same token at positions 1 and 4
W_Q, W_K, W_V = torch.randn(d, d), torch.randn(d, d), torch.randn(d, d)
k = [W_K @ (x[0, i] + P[i]) for i in range(T)]
v = [W_V @ (x[0, i] + P[i]) for i in range(T)]


def pairwise(query_position: str) -> Tensor:
    rows = []
    for t in range(T):
        p = [P[t] if query_position == "own" else P[i] for i in range(T)]
        alpha = torch.softmax(torch.stack([(W_Q @ (x[0, t] + p[i])) @ k[i] for i in range(T)]), 0)
        rows.append(sum(alpha[i] * v[i] for i in range(T)))
    return torch.stack(rows)


own, keys_position = pairwise("own"), pairwise("key's")
print(f"solution vs the formula pair by pair: {(attention_with_positions(x, P, W_Q, W_K, W_V)[0] - own).abs().max():.1e}")
print(f"outputs of the two equal tokens: own positions differ by {(own[1] - own[4]).abs().max():.3f}, "
      f"key's position in the query by {(keys_position[1] - keys_position[4]).abs().max():.1e}")
assert torch.allclose(attention_with_positions(x, P, W_Q, W_K, W_V)[0], own, atol=1e-4)
assert torch.allclose(keys_position[1], keys_position[4], atol=1e-5)

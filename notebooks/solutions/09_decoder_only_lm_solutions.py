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
# # 09 · Solutions: a decoder-only language model, sampling, and the KV cache
#
# Worked solutions to the coding exercises of chapter 09, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks, and each
# compared with what the package computes. Then an answer to every question. Try the exercises
# in the chapter first.

# %%
import math

import torch

from tfmlib import exercises
from tfmlib.attention import MultiHeadAttention
from tfmlib.config import setup
from tfmlib.kv_cache import KVCache, kv_bytes_per_token
from tfmlib.sampling import top_p_filter

run = setup(seed=0, smoke=dict(), cpu=dict(), gpu=dict())

# %% [markdown]
# ## Coding exercises
#
# **09.top_p.** Sort the probabilities, and keep a token while the mass of the tokens ranked
# *before* it is below $p$ (so the first token is always kept); scatter the pattern back to the
# original order.

# %%
def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


exercises.check("09.top_p", top_p, must_pass=True)
z = torch.randn(4, 30) * 2
assert torch.equal(top_p(z, 0.8), top_p_filter(z, 0.8)), "the solution should agree with tfmlib.sampling"

# %% [markdown]
# **09.cached_step.** Write the new key and value in place at position `length`, attend with the
# one query over the first `length + 1` positions only.

# %%
def cached_step(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    keys, values = K[:, :, :length + 1], V[:, :, :length + 1]
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ values, length + 1


exercises.check("09.cached_step", cached_step, must_pass=True)

# the same step through the package: one head's projections set to the identity
attn = MultiHeadAttention(8, 1, bias=False).double().eval()
for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
    torch.nn.init.eye_(proj.weight)
xs = torch.randn(1, 6, 8, dtype=torch.double)
cache, K, V, n = KVCache(6), torch.zeros(1, 1, 6, 8, dtype=torch.double), torch.zeros(1, 1, 6, 8,
                                                                                      dtype=torch.double), 0
for t in range(6):
    x = xs[:, t:t + 1]
    mine, n = cached_step(x[:, None], x[:, None], x[:, None], K, V, n)
    theirs, _ = attn(x, causal=True, cache=cache)  # the package's step: the new token's attention
    assert torch.allclose(mine[:, 0], theirs), "the exercise's step is the package's, with identity projections"
print("cached_step agrees with MultiHeadAttention(x, causal=True, cache=KVCache(6)) over 6 steps")

# %% [markdown]
# **09.cache_bytes.** Keys and values, in every layer, $d$ numbers each, for every token of every
# sequence.

# %%
def cache_bytes(*, layers: int, d_model: int, tokens: int, batch: int, dtype: torch.dtype) -> int:
    return 2 * layers * d_model * tokens * batch * torch.empty((), dtype=dtype).element_size()


exercises.check("09.cache_bytes", cache_bytes, must_pass=True)
assert cache_bytes(layers=4, d_model=256, tokens=1, batch=1, dtype=torch.float32) == kv_bytes_per_token(4, 256)
for name, (L, d) in {"GPT-2 small": (12, 768), "a 7B model (32 layers, d = 4096)": (32, 4096)}.items():
    gib = cache_bytes(layers=L, d_model=d, tokens=4096, batch=1, dtype=torch.float16) / 2 ** 30
    print(f"{name}: {gib:.2f} GiB for 4096 tokens in float16")

# %% [markdown]
# ## Questions
#
# **1. Why a causal model can cache and a bidirectional encoder cannot.** In a causal model,
# position $t$'s representation in every layer depends only on tokens $1 \dots t$; appending token
# $t + 1$ changes none of them, so their keys and values can be kept. In a bidirectional encoder
# every position attends to every other, so a new token changes every position's output in the
# first layer, hence every key and value in the layers above: there is nothing left to reuse.
#
# **2. Which model is closer to the floor, and with more training?** The chapter's table answers
# the first part for its runs: the "above floor" column (the median over the seeds) and the
# per-seed gaps beside it, with the count of seeds at which the GRU ends closer (all three in the
# committed run). The margin is a few hundredths of a bit, about as large as the spread between
# seeds, so one run alone would not settle it, and three seeds at one budget say nothing yet
# about a ten times longer run. With ten times the training the order
# need not hold: the GRU's fixed state must compress the whole prefix, while attention reads it
# back, which matters most for long-distance agreement (a verb agreeing with a subject across a
# relative clause); the decoder-only model has more capacity to use with more data, but also more
# to fit. To find out one would train both for several budgets and seeds, plot the gap to the
# floor against the number of training tokens, and split the validation loss by the distance to
# the word that decides each token (e.g. verbs after relative clauses).
#
# **3. Grouped-query attention.** The cache stores one key and one value per *key-value* head:
# with 32 query heads sharing 8 key-value heads, it holds 8 instead of 32 heads' keys and values,
# 4 times less memory per token (the queries are not cached at all).

# %%
print("GQA 32 query heads, 8 kv heads: cache shrinks by", 32 // 8)

# %% [markdown]
# **4. Top-p on a sure and an unsure model.** Measured below with the package's filter: with one
# token at 0.95 the nucleus is that token alone. With a flat distribution over 50 tokens (0.02
# each), a token is kept while the mass ranked before it is below 0.9: in exact arithmetic that is
# 45 tokens, since the 46th has exactly 0.9 before it and is dropped. In float32 that 46th token
# sits on the edge (its running sum may round to a hair below 0.9 and keep it), so the cell also
# asks for p = 0.85, where the answer, 43, is far from any edge. That is the point of top-p: the
# number of candidates follows the model's uncertainty, where top-k keeps the same $k$ in both
# cases (too many when the model is sure, too few when it is not).

# %%
sure = torch.tensor([0.95] + [0.05 / 49] * 49).log()
flat = torch.full((50,), 1 / 50).log()
n_sure = int(torch.isfinite(top_p_filter(sure, 0.9)).sum())
n_flat = int(torch.isfinite(top_p_filter(flat, 0.9)).sum())
n_flat_085 = int(torch.isfinite(top_p_filter(flat, 0.85)).sum())
print(f"top-p 0.9 keeps {n_sure} token(s) of the sure distribution and {n_flat} of the flat one "
      f"(45 exactly, 46 if round-off keeps the edge token); top-p 0.85 keeps {n_flat_085} of the flat one")
assert n_sure == 1 and n_flat in (45, 46) and n_flat_085 == 43

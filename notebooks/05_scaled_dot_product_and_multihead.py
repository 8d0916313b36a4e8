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
# # 05 · Scaled dot-product and multi-head attention
#
# Chapter 04 derived self-attention from the GRU: free the GRU's gates so that every position
# may weigh every other, compute the weights from a query and a key, read a value. This
# chapter turns that layer into the exact operation of the Transformer (Vaswani et al. 2017,
# §3.2): **scaled dot-product attention**, computed for all positions at once as three matrix
# products, run as several **heads** side by side, with the **masks** that let it skip padding
# and keep a decoder from reading the future. Then it checks that our code computes what
# PyTorch's own modules compute, and measures two claims of the Transformer paper: that the
# scale $1/\sqrt{d_k}$ is needed, and that attention removes the recurrent network's sequential
# bottleneck (at a price in arithmetic and, for the explicit version, memory, both measured).
#
# **This chapter builds**
#
# 1. self-attention in matrix form: $Q$, $K$ and $V$ from one sequence,
#    $\operatorname{softmax}(QK^\top/\sqrt{d_k})\,V$, checked against a loop over positions;
# 2. why the scale: the variance of $q \cdot k$ as $d_k$ grows, the softmax saturating, and the
#    gradient that reaches the scores and the queries, measured with and without the scale, and
#    at the initialisation of a real layer;
# 3. masks (padding, causal, both), and why a query that may see nothing must give zeros, not
#    NaN; the explicit attention that returns its weights, and the fast one on
#    `F.scaled_dot_product_attention`, equal to it forward and backward, with the backends
#    PyTorch can choose for it;
# 4. multi-head attention with the heads as a batch axis (a reshape, no loop), the output
#    projection, and a gradient test that no position reads the future;
# 5. the layer checked against `nn.MultiheadAttention` with copied weights, forward and
#    backward, with masks (PyTorch's opposite bool convention, and additive float masks);
# 6. the parallelism claim measured: a GRU layer against an attention layer as the sequence
#    grows, in time and in the memory each keeps for the backward pass, read against Vaswani et
#    al.'s Table 1;
# 7. attention heads on sentences: a model that must find the subject of a sentence, and one
#    that must decide what *it* refers to (*the cat did not cross the street because it was
#    too tired / too congested*), trained several times to see which parts of the famous
#    picture every run shares; and the same model with 1, 2, 4 and 8 heads.
#
# **It assumes** chapter 03 (the dot score, the masked softmax), chapter 04 (self-attention
# derived from the GRU), chapter 01 (the GRU), and that the variance of a sum of independent
# variables is the sum of their variances. The code it finishes is `tfmlib.attention`, which
# chapters 06 to 10 import.

# %%
from __future__ import annotations  # lets the classes below name themselves in type hints

import math
import random
import warnings
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.data import PAD_ID, Vocab, pad_sequences, tokenize
from tfmlib.plot import plot_curves, plot_heatmap, plot_over_seeds
from tfmlib.rnn_attention import masked_softmax
from tfmlib.seeds import SeedResults
from tfmlib.synthetic import NOUNS, Noun, load_bundled

if TYPE_CHECKING:  # type hints of MultiHeadAttention's later arguments: chapter 09's cache, chapter 10's kernels
    from tfmlib.attention import AttentionKernel
    from tfmlib.kv_cache import KVCache
from tfmlib.timing import interleaved_medians
from tfmlib.train import fit

run = setup(
    seed=0,
    smoke=dict(var_samples=2_000, dims=[2, 16, 128], keys=32, softmax_queries=100,
               timing=dict(batch=2, d_model=32, heads=2, lengths=[8, 16, 32], repeats=1, explicit_max=32),
               gender=dict(pairs=800, test=200, epochs=1, d_model=32, heads=2, layers=2),
               coref=dict(train=600, test=200, epochs=1, d_model=32, heads=2, layers=2, runs=2, head_runs=2)),
    cpu=dict(var_samples=20_000, dims=[2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], keys=32, softmax_queries=500,
             timing=dict(batch=16, d_model=128, heads=4, lengths=[16, 32, 64, 128, 256, 512, 1024], repeats=5,
                         explicit_max=512),
             gender=dict(pairs=12_000, test=1_500, epochs=2, d_model=64, heads=2, layers=2),
             coref=dict(train=6_000, test=2_000, epochs=4, d_model=64, heads=2, layers=2, runs=3, head_runs=6)),
    # gpu: section 2 runs on the CPU whatever the device, so it keeps the cpu sizes (the old 100k x 4096
    # draws needed 7-8 GB of host RAM). The attention timings of section 6 grow to longer sequences
    # (their subject is how time grows with length); explicit_max is the upper limit, and the free
    # device memory bounds it too. The trained models keep the cpu sizes with more seeds (5 coref runs,
    # 8 per head count), stopping by epochs alone. Cost from the first H100 run (2026-11-26, alone):
    # about 6.5 ms per training step, so 375 gender steps + 32 coref runs x 375 steps = 12,375 steps
    # ~ 80 s, and about 95 s for the timings and the rest: about 175 s; not yet measured at these sizes.
    gpu=dict(var_samples=20_000, dims=[2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], keys=32, softmax_queries=500,
             timing=dict(batch=32, d_model=256, heads=8, lengths=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                         repeats=10, explicit_max=2048),
             gender=dict(pairs=12_000, test=1_500, epochs=2, d_model=64, heads=2, layers=2),
             coref=dict(train=6_000, test=2_000, epochs=4, d_model=64, heads=2, layers=2, runs=5, head_runs=8)),
)

# %% [markdown]
# ## 1. Self-attention in matrix form
#
# A sentence of $T$ tokens arrives as a matrix $X \in \mathbb{R}^{T \times d_{\text{model}}}$, one
# row per position. Self-attention makes three new matrices from it with three learned
# projections,
#
# $$Q = X W^Q, \qquad K = X W^K, \qquad V = X W^V, \qquad
#   W^Q, W^K \in \mathbb{R}^{d_{\text{model}} \times d_k},\ W^V \in \mathbb{R}^{d_{\text{model}} \times d_v},$$
#
# so that row $t$ of each is what position $t$ *asks* (its query $q_t$), what it *offers to be
# found by* (its key $k_t$) and what it *gives* when found (its value $v_t$). In chapter 03 the
# query came from a decoder and the keys from an encoder; here all three come from the same
# sequence, which is what makes it *self*-attention. Position $t$ scores every position $s$
# with a scaled dot product, turns the scores into weights with a softmax over $s$, and
# returns the weighted sum of the values:
#
# $$e_{ts} = \frac{q_t \cdot k_s}{\sqrt{d_k}}, \qquad
#   \alpha_{ts} = \frac{\exp(e_{ts})}{\sum_{s'=1}^{T} \exp(e_{ts'})}, \qquad
#   z_t = \sum_{s=1}^{T} \alpha_{ts}\, v_s .$$
#
# The sum runs over the key index $s$, and $\alpha_{ts}$ weighs $v_s$, the value at the position
# being looked at (a write-up that puts $v_t$ inside this sum has every position return its own
# value). Stacked over all positions, the three formulas are three matrix products:
#
# $$Z = \operatorname{softmax}\!\Big(\frac{Q K^\top}{\sqrt{d_k}}\Big)\, V
#   \in \mathbb{R}^{T \times d_v},$$
#
# ![Q, K and V from one sequence X through W^Q, W^K, W^V; then MatMul Q K^T, scale by 1/sqrt(d_k), optional mask, softmax along rows, MatMul with V, giving Z](figures/05_scaled_dot_product.svg)
#
# *The whole layer is five operations on three projections of the same $X$: the scores $e_{ts}$ and weights $\alpha_{ts}$ are $T \times T$; the mask (section 3) and the scale (section 2) act on the scores before the softmax.*
#
# The softmax is taken along each row of the $T \times T$ score matrix. No step depends on
# another position's result, so all $T$ outputs are computed at once: that is the parallelism
# that section 6 measures. First, the matrix form against the per-position formulas. The
# projections are drawn with entries of variance $1/d_{\text{model}}$, so that $Q$ and $K$ have
# entries of variance about 1 for inputs of variance 1 (with unit-variance weights the entries
# would have variance $d_{\text{model}}$, and the softmax would already be close to one-hot:
# section 2 is about exactly that):

# %%
torch.manual_seed(run.seed)
T, d_model, d_k, d_v = 5, 8, 4, 6
X = torch.randn(T, d_model)
W_q, W_k, W_v = (torch.randn(d_model, width) / math.sqrt(d_model) for width in (d_k, d_k, d_v))

Q, K, V = X @ W_q, X @ W_k, X @ W_v                     # (T, d_k), (T, d_k), (T, d_v)
A = torch.softmax(Q @ K.T / math.sqrt(d_k), dim=-1)     # (T, T): row t says where position t looks
Z = A @ V                                               # (T, d_v)

Z_loop = torch.zeros(T, d_v)
for t in range(T):
    e = torch.stack([Q[t] @ K[s] / math.sqrt(d_k) for s in range(T)])
    alpha = torch.exp(e) / torch.exp(e).sum()
    Z_loop[t] = sum(alpha[s] * V[s] for s in range(T))
print("attention weights (rows sum to 1):\n", A.numpy().round(3))
print(f"variance of the entries of Q: {Q.var().item():.2f}; largest weight in any row: {A.max().item():.2f}")
print(f"max |matrix form - loop| = {(Z - Z_loop).abs().max().item():.1e}")
assert torch.allclose(Z, Z_loop, atol=1e-5), "the matrix form must equal the per-position formulas"
assert torch.allclose(A.sum(-1), torch.ones(T)), "each row of weights is a distribution over positions"

# %% [markdown]
# ## 2. Why divide by $\sqrt{d_k}$
#
# Chapter 03's dot score $q \cdot k$ had no scale. Vaswani et al. (2017, §3.2.1) divide by
# $\sqrt{d_k}$ and explain why in their footnote 4: suppose the $d_k$ entries of $q$ and $k$
# are independent with mean 0 and variance 1. Each product $q_i k_i$ has mean 0 and variance
# $\mathbb{E}[q_i^2]\,\mathbb{E}[k_i^2] = 1$, and a sum of $d_k$ independent terms has the sum of
# their variances:
#
# $$\mathbb{E}[q \cdot k] = 0, \qquad \operatorname{Var}(q \cdot k) = \sum_{i=1}^{d_k}
#   \operatorname{Var}(q_i k_i) = d_k, \qquad
#   \operatorname{Var}\Big(\frac{q \cdot k}{\sqrt{d_k}}\Big) = 1.$$
#
# Why does the size of the scores matter? The softmax does not care about a constant added to
# all scores, but it does care about their spread: $\operatorname{softmax}(c\,e)$ tends to the
# uniform distribution as $c \to 0$ and to a one-hot vector on the largest score as
# $c \to \infty$. And its Jacobian,
#
# $$\frac{\partial \alpha_s}{\partial e_{s'}} = \alpha_s(\delta_{ss'} - \alpha_{s'}),
#   \qquad J = \operatorname{diag}(\alpha) - \alpha\alpha^\top,$$
#
# is zero at a one-hot $\alpha$: a saturated softmax passes no gradient back to the scores.
# That is not yet the gradient that reaches the *query*: the score $e_s = q \cdot k_s / c$ (with
# $c = 1$ unscaled, $c = \sqrt{d_k}$ scaled) has $\partial e_s / \partial q = k_s / c$, so
#
# $$\frac{\partial L}{\partial q} = \frac{1}{c} \sum_s \frac{\partial L}{\partial e_s}\, k_s ,$$
#
# and without the scale this factor is $\sqrt{d_k}$ times larger, which works against the
# flatter gradient of the softmax. Which effect wins is a measurement. Four measurements, for
# $d_k$ from 2 to about a thousand, each with and without the scale: the variance of $q \cdot k$;
# how peaked the weights of one query over a fixed number of random keys become (the largest
# weight, and the entropy, whose maximum is $\ln S$ for $S$ keys); the size of the softmax's
# Jacobian $\lVert J \rVert_F$, the factor by which gradients reach the scores; and the gradient
# that reaches the query itself, $\lVert \partial L / \partial q \rVert$, for random values and a
# random upstream gradient $\partial L / \partial z$ (the same draws with and without the scale;
# the table gives the median over queries of the ratio unscaled / scaled).

# %%


def softmax_jacobian_norm(weights: Tensor) -> Tensor:
    """``||diag(a) - a a^T||_F`` for each row ``a`` of ``weights`` ``(..., S)``."""
    J = torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]     # (..., S, S)
    return J.flatten(-2).norm(dim=-1)


g = torch.Generator().manual_seed(run.seed)
scaling: dict[str, list[float]] = {}
for d in run.dims:
    q, k = torch.randn(run.var_samples, d, generator=g), torch.randn(run.var_samples, d, generator=g)
    dots = (q * k).sum(-1)
    scaling.setdefault("variance", []).append(dots.var().item())
    scaling.setdefault("variance_scaled", []).append((dots / math.sqrt(d)).var().item())
    # one query against S random keys, many times over; in float64, because near a one-hot softmax the
    # Jacobian's entries are far below float32's resolution next to 1
    queries = torch.randn(run.softmax_queries, 1, d, generator=g, dtype=torch.double)
    keys = torch.randn(run.softmax_queries, run.keys, d, generator=g, dtype=torch.double)
    values = torch.randn(run.softmax_queries, run.keys, d, generator=g, dtype=torch.double)
    upstream = torch.randn(run.softmax_queries, 1, d, generator=g, dtype=torch.double)   # dL/dz, one per query
    queries.requires_grad_()
    scores = (queries * keys).sum(-1)                                    # (n, S)
    grad_q = {}
    for suffix, s in (("", scores), ("_scaled", scores / math.sqrt(d))):
        w = torch.softmax(s, dim=-1)
        J = softmax_jacobian_norm(w.detach())
        (dq,) = torch.autograd.grad(w[:, None] @ values, queries, upstream, retain_graph=True)
        grad_q[suffix] = dq.flatten(1).norm(dim=-1)                      # ||dL/dq|| per query
        w = w.detach()
        for key, value in (("max_weight", w.max(-1).values.mean()), ("saturated", (w.max(-1).values > 0.99).double().mean()),
                           ("entropy", -(w * torch.log(w.clamp_min(1e-300))).sum(-1).mean()),
                           ("jacobian_median", J.median()), ("jacobian_mean", J.mean())):
            scaling.setdefault(key + suffix, []).append(value.item())
    scaling.setdefault("grad_q_ratio", []).append((grad_q[""] / grad_q["_scaled"]).median().item())

print(f"{'':>5} {'Var(q.k)':>17} | {'largest weight':>14} | {'weight > 0.99':>14} | {'entropy':>12} | "
      f"{'median ||J||':>18} | {'mean ||J||':>12} | {'||dL/dq||':>10}")
print(f"{'d_k':>5} {'unscaled':>8} {'scaled':>8} | " + " | ".join(
    [f"{'unscaled':>8} {'scaled':>5}"] * 2 + [f"{'unscaled':>8} {'sc.':>3}"] + [f"{'unscaled':>9} {'scaled':>8}"]
    + [f"{'unscaled':>8} {'sc.':>3}"] + [f"{'uns./sc.':>10}"]))
for i, d in enumerate(run.dims):
    v = {key: values[i] for key, values in scaling.items()}
    print(f"{d:>5} {v['variance']:>8.1f} {v['variance_scaled']:>8.2f} | {v['max_weight']:>8.3f} "
          f"{v['max_weight_scaled']:>5.3f} | {v['saturated']:>8.0%} {v['saturated_scaled']:>5.0%} | "
          f"{v['entropy']:>8.2f} {v['entropy_scaled']:>3.1f} | {v['jacobian_median']:>9.1e} "
          f"{v['jacobian_median_scaled']:>8.3f} | {v['jacobian_mean']:>8.3f} {v['jacobian_mean_scaled']:>3.2f} | "
          f"{v['grad_q_ratio']:>10.3g}")
print(f"(S = {run.keys} keys: uniform weights would have largest weight {1 / run.keys:.3f}, entropy "
      f"ln S = {math.log(run.keys):.2f} and ||J|| = {math.sqrt(1 / run.keys - 1 / run.keys**2):.3f}; a one-hot "
      "softmax has entropy 0 and ||J|| = 0)")

fig, axes = plt.subplots(1, 3, figsize=(16, 4))
plot_curves({"d_k (theory)": run.dims, "q·k": scaling["variance"], "q·k / sqrt(d_k)": scaling["variance_scaled"]},
            x=run.dims, ax=axes[0], title="The variance of a dot product grows like d_k",
            xlabel="d_k (width of queries and keys)", ylabel="variance over random q, k", logy=True)
axes[0].lines[0].set(linestyle="--", marker="", color="gray")         # the theory under the measured points
axes[0].legend()
axes[0].set_xscale("log", base=2)
plot_curves({"largest weight, unscaled": scaling["max_weight"], "largest weight, scaled": scaling["max_weight_scaled"],
             "entropy / ln S, unscaled": np.array(scaling["entropy"]) / math.log(run.keys),
             "entropy / ln S, scaled": np.array(scaling["entropy_scaled"]) / math.log(run.keys)},
            x=run.dims, ax=axes[1], title=f"Without the scale the softmax saturates ({run.keys} keys)",
            xlabel="d_k", ylabel="mean weight, or entropy / its maximum")
axes[1].set_xscale("log", base=2)
plot_curves({"||J||, median, unscaled": np.maximum(scaling["jacobian_median"], 1e-20),
             "||J||, mean, unscaled": scaling["jacobian_mean"], "||J||, median, scaled": scaling["jacobian_median_scaled"],
             "||dL/dq|| unscaled / scaled (median)": scaling["grad_q_ratio"]},
            x=run.dims, ax=axes[2], title="Gradient to the scores, and to the query", xlabel="d_k",
            ylabel="||diag(a) - a a^T||_F, or a ratio", logy=True)
axes[2].axhline(1, color="gray", linewidth=0.8, linestyle=":")
axes[2].set_xscale("log", base=2)
fig.tight_layout()
plt.show()

if run.profile != "smoke":
    ratios = np.array(scaling["variance"]) / np.array(run.dims)
    assert np.all(np.abs(ratios - 1) < 0.1), f"Var(q.k) should be d_k, got ratios {ratios.round(3)}"
    assert np.all(np.abs(np.array(scaling["variance_scaled"]) - 1) < 0.1), "scaled scores should have variance 1"
    assert scaling["max_weight"][-1] > 0.9 and scaling["saturated"][-1] > 0.5, \
        "unscaled, most queries should put more than 99% of their weight on one key at the largest d_k"
    assert max(scaling["saturated_scaled"]) == 0 and max(scaling["max_weight_scaled"]) < 0.3, \
        "scaled, no query should saturate"
    assert scaling["jacobian_median"][-1] < 1e-3 * scaling["jacobian_median_scaled"][-1], \
        "unscaled, the typical query's softmax should pass at least 1000x less gradient at the largest d_k"
    assert scaling["grad_q_ratio"][-1] < 0.1, \
        "unscaled, the typical query should get at least 10x less gradient at the largest d_k"
    assert scaling["grad_q_ratio"][run.dims.index(64)] > 1, \
        "at d_k = 64 the unscaled query gets MORE gradient (the sqrt(d_k) larger dq = k outweighs the flatter softmax)"
    assert scaling["jacobian_mean"][-1] < 0.5 * scaling["jacobian_mean_scaled"][-1], \
        "unscaled, even the mean Jacobian should shrink"
    assert max(scaling["max_weight_scaled"]) - min(scaling["max_weight_scaled"]) < 0.05, \
        "with the scale, the weights should look the same at every d_k"
orders = math.log10(scaling["jacobian_median_scaled"][-1] / scaling["jacobian_median"][-1])
print(f"at d_k = {run.dims[-1]}: the median ||J|| falls {orders:.1f} orders of magnitude without the scale, the "
      f"median ||dL/dq|| {math.log10(1 / scaling['grad_q_ratio'][-1]):.1f}")


def grad_q_ratio(d: int, generator: torch.Generator) -> float:
    """Median over queries of ||dL/dq|| unscaled / scaled, for one fresh draw (as in the table)."""
    shape = (run.softmax_queries, run.keys, d)
    q = torch.randn(run.softmax_queries, 1, d, generator=generator, dtype=torch.double, requires_grad=True)
    k, v = (torch.randn(*shape, generator=generator, dtype=torch.double) for _ in range(2))
    upstream = torch.randn(run.softmax_queries, 1, d, generator=generator, dtype=torch.double)
    scores = (q * k).sum(-1)
    norms = [torch.autograd.grad(torch.softmax(s, -1)[:, None] @ v, q, upstream, retain_graph=True)[0]
             .flatten(1).norm(dim=-1) for s in (scores, scores / math.sqrt(d))]
    return (norms[0] / norms[1]).median().item()


# the last column again, on five more independent draws (generators seeded seed + 1 ... seed + 5; the
# table's draw came from the generator seeded seed): how much of it is the draw?
draws = [torch.Generator().manual_seed(run.seed + 1 + i) for i in range(5)]
ratio_draws = np.array([[grad_q_ratio(d, g) for d in run.dims] for g in draws])       # (draws, dims)
six_draws = SeedResults([run.seed + i for i in range(6)],
                        {f"d_k {d}": [scaling["grad_q_ratio"][j], *ratio_draws[:, j]] for j, d in enumerate(run.dims)})
print("||dL/dq|| unscaled / scaled (median over queries), over six draws, the table's and five more: "
      "median [min, max]\n  " + ", ".join(f"{name}: {six_draws.summary(name)}" for name in six_draws.names))
if run.profile != "smoke":
    i64 = run.dims.index(64)
    print(f"at d_k = 64 (the Transformer's heads), unscaled: largest weight {scaling['max_weight'][i64]:.2f} on "
          f"average, {scaling['saturated'][i64]:.0%} of the queries put more than 99% on one key (the table's draw); "
          f"the query's gradient is {six_draws.summary('d_k 64', '.2f')} times the scaled one over the six draws")
    # each held in every one of the six draws
    assert six_draws.range("d_k 64")[0] > 1, "at d_k = 64 the unscaled query gets more gradient in every draw"
    assert six_draws.range("d_k 128")[0] > 1 > six_draws.range("d_k 256")[1], \
        "the ratio crosses 1 between d_k = 128 and 256 in every draw"
    assert six_draws.range(f"d_k {run.dims[-1]}")[1] < 0.1, \
        "at the largest d_k the unscaled query gets far less gradient in every draw"

# %% [markdown]
# The table and the figure. The variance of $q \cdot k$ is $d_k$ (left, on the line), and after
# dividing by $\sqrt{d_k}$ it is 1 at every width. Without the scale, a query over random keys
# goes from spread-out weights at $d_k = 2$ to a nearly one-hot choice at $d_k$ in the hundreds
# (middle): the largest weight climbs towards 1, the entropy falls towards 0, and a growing share
# of the queries puts more than 99% of its weight on a single key (the table). With the scale,
# the weights look the same at every width. The gradient that reaches the scores (right, a log
# scale) collapses for a typical query (the median, by the number of orders of magnitude printed
# under the figure), while the *mean* falls only a few times, carried by the minority of queries
# whose two best keys happen to score almost the same. (At moderate widths the unscaled Jacobian
# is even a little larger than the scaled one: a softmax torn between two keys is more sensitive
# than a nearly uniform one.)
#
# **But the gradient that reaches the query tells a different story at moderate widths** (the
# last column, and the ratio curve on the right). Unscaled, $\partial e_s/\partial q = k_s$ is
# $\sqrt{d_k}$ times larger than scaled, and at $d_k = 64$ this wins: the unscaled query gets
# *more* gradient than the scaled one, not less: the factor is printed under the figure as
# median [min, max] over six draws of the same size (the table's and five more), from 2.4 to 3.7
# times. The table's draw happens to be the largest of the six at $d_k = 64$ (and at 128), so
# read the range, not the table's single number. Only from a few hundred dimensions does the
# saturation win, and then quickly. Across the six draws the ratio moves by a few percent at
# small widths, by tens of percent around 64 to 256, and by several times at the largest, where a
# median over a few hundred nearly one-hot queries is a noisy number; "more gradient at 64", the
# crossing between 128 and 256, and the collapse at the largest width hold in each of these six
# draws (asserted for all six). Where exactly the ratio crosses 1 is itself a draw: near 128 it
# is close to 1, so another draw can cross between 64 and 128; "more gradient at 64" and the
# collapse at the largest widths are the robust part. So "without the scale the queries stop learning" is true only for wide
# heads. What goes wrong at the Transformer's $d_k = 64$ is
# different: the scores have a spread that grows like $\sqrt{d_k}$, so the softmax's
# *temperature* depends on the width. Unscaled, a freshly initialised head is already sharp, at
# random (a fifth of the queries above put more than 99% on one key), and a change of $d_k$
# changes how sharp every head starts. The scale makes the starting point the same at every
# width: spread-out weights and a useful gradient to every key.
#
# All of this assumes unit-variance entries of $q$ and $k$. Whether a real layer has them depends
# on its initialisation. `nn.Linear`, which section 4's `MultiHeadAttention` uses, draws its
# weights from $U(-1/\sqrt{d}, 1/\sqrt{d})$, of variance $1/(3d)$: on inputs of variance 1
# (after a LayerNorm) the query entries have variance about $1/3$, and $\operatorname{Var}(q
# \cdot k) \approx d_k/9$. Xavier (Glorot) initialisation draws a matrix with variance
# $2/(\text{fan\_in} + \text{fan\_out})$. Chapter 07's Transformer applies it to this layer's
# separate $d \times d$ query and key projections: variance $2/(d + d) = 1/d$, query entries of
# variance 1, the unit variance assumed above. `nn.MultiheadAttention`, and so `nn.Transformer`,
# applies the same Xavier call to its *packed* $(3d, d)$ matrix `in_proj_weight` (queries, keys
# and values stacked), whose fan-out counts all three: variance $2/(d + 3d) = 1/(2d)$, query
# entries of variance about $1/2$, and $\operatorname{Var}(q \cdot k) \approx d_k/4$. So
# PyTorch's layer starts at half the variance of the book's. Both `nn.Linear`'s default and
# Xavier on square matrices, measured on one layer of width 512 with 8 heads ($d_k = 64$):

# %%
torch.manual_seed(run.seed)
width, n_heads, S_ = 512, 8, run.keys
x_ln = F.layer_norm(torch.randn(64, S_, width), (width,))             # LayerNorm'd inputs, variance 1
init_rows = {}
for init in ("nn.Linear default", "Xavier uniform", "nn.MultiheadAttention"):
    q_lin, k_lin = nn.Linear(width, width), nn.Linear(width, width)
    if init == "Xavier uniform":                    # the book's Transformer: Xavier on each square projection
        for lin in (q_lin, k_lin):
            nn.init.xavier_uniform_(lin.weight)
    with torch.no_grad():
        if init == "nn.MultiheadAttention":         # PyTorch's: Xavier on the packed (3d, d) in_proj_weight
            packed = nn.MultiheadAttention(width, n_heads)
            for i, lin in enumerate((q_lin, k_lin)):
                lin.weight.copy_(packed.in_proj_weight[i * width:(i + 1) * width])
                lin.bias.copy_(packed.in_proj_bias[i * width:(i + 1) * width])
        q_heads = q_lin(x_ln).view(64, S_, n_heads, -1).transpose(1, 2)   # (B, h, S, d_k)
        k_heads = k_lin(x_ln).view(64, S_, n_heads, -1).transpose(1, 2)
        for scale in (1.0, 1 / math.sqrt(width // n_heads)):
            w = torch.softmax(q_heads @ k_heads.transpose(-2, -1) * scale, dim=-1)
            top = w.max(-1).values
            init_rows[(init, scale == 1.0)] = (q_heads.var().item(), top.mean().item(), (top > 0.99).float().mean().item())
print(f"d_model {width}, {n_heads} heads (d_k = {width // n_heads}), {S_} keys; at initialisation:")
print(f"{'init':>21} {'Var(q entries)':>15} {'scale':>9} {'largest weight':>15} {'weight > 0.99':>14}")
for (init, unscaled), (var_q, top, sat) in init_rows.items():
    print(f"{init:>21} {var_q:>15.2f} {'none' if unscaled else '1/sqrt(d_k)':>11} {top:>13.3f} {sat:>14.1%}")
if run.profile != "smoke":
    assert abs(init_rows[("nn.Linear default", True)][0] - 1 / 3) < 0.05, "nn.Linear's default init gives Var(q) ~ 1/3"
    assert abs(init_rows[("Xavier uniform", True)][0] - 1) < 0.1, "Xavier init gives Var(q) ~ 1"
    assert abs(init_rows[("nn.MultiheadAttention", True)][0] - 1 / 2) < 0.05, \
        "Xavier on the packed (3d, d) matrix gives Var(q) ~ 1/2"
    assert init_rows[("Xavier uniform", True)][2] > 10 * init_rows[("nn.Linear default", True)][2], \
        "unscaled, Xavier-initialised heads saturate far more often than default-initialised ones"

# %% [markdown]
# With `nn.Linear`'s default, unscaled heads start much less sharp than the unit-variance
# table promised (compare the unscaled rows with the $d_k = 64$ row above); with Xavier on the
# square projections, the table's numbers come back; PyTorch's packed Xavier lies in between,
# at half the variance. Either way the scaled heads start spread out. The scale fixes the
# dependence on $d_k$, not every constant; the rest is the initialisation's job.
#
# Two remarks. The scale is not a new ability: dividing $W^Q$ by $\sqrt{d_k}$ gives the same
# set of functions. It is a better starting point. Luong's unscaled dot score still trained well
# in chapter 03, at a width of 128 and with a network that can learn to shrink its vectors; the
# trouble grows with the width. Britz et al. (2017, §4.5) found unscaled multiplicative attention
# falling behind additive attention as the width grew, which is the observation Vaswani et al.
# cite for their scale.
#
# ## 3. Masks
#
# Two things must stay hidden from a query. **Padding**: in a batch, short sentences are padded
# to the longest, and no real position may attend to a padded one. **The future**: a decoder
# that writes the next word must not read it, so position $t$ may attend to positions $s \le t$
# only (the *causal* mask). The book's masks are `bool` tensors, `True` where a query **may**
# attend to a key (the convention of chapter 00: `True` = a real token); section 5 adds the
# floating kind that PyTorch also accepts, a number added to the scores. A mask broadcasts
# against the scores, which have shape `(batch, heads, queries, keys)`: a padding mask is
# `(B, 1, 1, S)` (the same keys are hidden from every head and every query), a causal mask is
# `(T, S)` (the same for every sentence), and the two combine with `&`.

# %%
# tfmlib-source: tfmlib.attention.padding_mask
def padding_mask(token_mask: Tensor) -> Tensor:
    """``(B, S)`` token mask (``True`` at real tokens) -> ``(B, 1, 1, S)`` attention mask: every
    query (and every head) may attend to the real keys only."""
    if not isinstance(token_mask, Tensor) or token_mask.dtype != torch.bool or token_mask.dim() != 2:
        got = (f"{token_mask.dtype} tensor of shape {tuple(token_mask.shape)}"
               if isinstance(token_mask, Tensor) else type(token_mask).__name__)
        raise ValueError(f"padding_mask: token_mask must be a (batch, length) bool tensor, got {got}")
    return token_mask[:, None, None, :]


# %%
# tfmlib-source: tfmlib.attention.causal_mask
def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None, *,
                align: str = "bottom_right") -> Tensor:
    """``(T, S)`` bool mask, ``True`` where query ``t`` may attend to key ``s``.

    With ``S == T`` (the default) this is the lower triangle: position ``t`` sees positions
    ``0..t``. With ``S > T`` the default ``align="bottom_right"`` makes the ``T`` queries the
    *last* ``T`` of ``S`` positions (``s <= t + S - T``: a decoder that has cached the keys of
    earlier steps), so the last query sees every key; this is what ``causal=True`` means
    everywhere in the package. ``align="top_left"`` makes them the *first* ``T`` positions
    (``s <= t``), which is what PyTorch's ``is_causal=True`` computes: use it to port code that
    relies on that.
    """
    S = T if S is None else S
    for name, v in (("T", T), ("S", S)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"causal_mask: {name} must be a positive int, got {v!r}")
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"causal_mask: align must be 'bottom_right' or 'top_left', got {align!r}")
    if S < T:
        raise ValueError(f"causal_mask: S={S} keys for T={T} queries; a causal mask needs S >= T")
    diagonal = S - T if align == "bottom_right" else 0
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=diagonal)


# %% [markdown]
# The three masks of one sentence of four tokens padded to six, as the scores see them (white:
# may attend). With both masks, the padded *queries* (rows 5 and 6) still see the real keys;
# their outputs are ignored later by whatever reads only the real positions.

# %%
keep = torch.tensor([[True, True, True, True, False, False]])           # one sentence, 4 tokens + 2 pads
words = ["the", "cat", "sleeps", "<eos>", "<pad>", "<pad>"]
masks = {"padding: (1, 1, 1, S)": padding_mask(keep).expand(1, 1, 6, 6)[0, 0],
         "causal: (T, S)": causal_mask(6),
         "padding & causal": (padding_mask(keep) & causal_mask(6))[0, 0]}
fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for ax, (name, m) in zip(axes, masks.items(), strict=True):
    plot_heatmap(m.float(), ax=ax, x_labels=words, y_labels=words, title=name, xlabel="key (attended to)",
                 ylabel="query (attending)", cmap="gray", vmin=0, vmax=1, colorbar=False)
fig.tight_layout()
plt.show()
print("broadcast shape of padding & causal:", tuple((padding_mask(keep) & causal_mask(6)).shape))

# %% [markdown]
# **The NaN trap.** The usual way to apply a mask is to set the hidden scores to $-\infty$
# before the softmax, so that $\exp(-\infty) = 0$. That works as long as each query may see at
# least one key. A query that may see *none* gets a row of $-\infty$, and its softmax is
# $0/0$ = NaN. Such rows are not exotic: a batch masked on the query side as well (a padded
# query sees nothing), a left-padded batch under a causal mask (the first, padded position sees
# only itself, which is hidden), or a cross-attention over an empty memory. Worse, the NaN does
# not stay in its row. Below, a sentence of three tokens and one pad passes through two
# attention layers whose mask hides the pad from every query and hides every key from the pad's
# own query. In the first layer the pad's output is NaN. In the second layer the pad is a hidden
# key and gets a weight of exactly 0, but its value is NaN and $0 \times \text{NaN} =
# \text{NaN}$: every real position's output becomes NaN, so does the loss (which reads only the
# real positions), and so does every gradient.

# %%
torch.manual_seed(run.seed)
x = torch.randn(1, 4, 8)                                           # 3 tokens and 1 pad
keep = torch.tensor([True, True, True, False])
layer_mask = keep[None, None, :] & keep[None, :, None]             # (1, T, T): no pad key; the pad query sees nothing


def naive_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def attention_layer(h: Tensor, W: Tensor, softmax: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    p = h @ W                                                      # queries = keys = values, to keep it short
    return softmax(p @ p.transpose(1, 2) / math.sqrt(p.shape[-1]), layer_mask) @ p


for name, softmax in (("-inf, then softmax", naive_softmax), ("masked_softmax (chapter 03)", masked_softmax)):
    g = torch.Generator().manual_seed(1)
    W1, W2 = (torch.randn(8, 8, generator=g).div(8**0.5).requires_grad_() for _ in range(2))
    h1 = attention_layer(x, W1, softmax)
    h2 = attention_layer(h1, W2, softmax)
    loss = h2[0, :3].square().sum()                                # only the real positions
    loss.backward()
    print(f"{name}:\n  layer 1, output at the pad: {h1[0, 3, :3].detach().numpy().round(3)}...\n"
          f"  layer 2, NaN outputs at real positions: {int(h2[0, :3].isnan().sum())} of {h2[0, :3].numel()}; "
          f"loss {loss.item():.3f}; NaN entries in the gradients of W1, W2: "
          f"{int(W1.grad.isnan().sum())}, {int(W2.grad.isnan().sum())} of {W1.numel()} each")
assert torch.isfinite(loss) and torch.isfinite(W1.grad).all() and torch.all(h1[0, 3] == 0), \
    "masked_softmax must give zeros for a query that may see nothing, and no NaN anywhere"

# %% [markdown]
# Chapter 03's `masked_softmax` avoids the trap twice over: it fills hidden scores with the most
# negative *finite* float, so a fully hidden row has a finite (uniform) softmax, and then
# multiplies by the mask, which zeroes that row and every gradient through it. A query that may
# see nothing returns the zero vector. (In a Transformer the residual connection then passes
# the position's own input on, chapter 07.)
#
# A mask can come in several shapes. One function checks it once, in one place, and says what is
# wrong in terms of the shapes the reader passed:

# %%
# tfmlib-source: tfmlib.attention.check_mask
def check_mask(mask: Tensor | None, scores_shape: tuple[int, ...], who: str) -> Tensor | None:
    """Return ``mask`` as a tensor that broadcasts to ``scores_shape`` ``(B, h, T, S)``.

    ``mask`` is ``bool`` (``True`` = may attend) or floating (added to the scores: ``0`` /
    ``-inf``, or real-valued biases). Accepts ``(T, S)`` (or any 2-D shape that broadcasts to it,
    such as ``(1, S)``), ``(B, T, S)`` (made ``(B, 1, T, S)``) and 4-D masks such as
    :func:`padding_mask`'s ``(B, 1, 1, S)``; raises ``TypeError`` for a mask that is neither bool
    nor floating and ``ValueError``, naming both shapes, for one that does not broadcast.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{who}: mask must be a bool tensor (True = may attend) or a floating tensor "
                        f"added to the scores (0 = may attend, -inf = may not), got {got}")
    B, h, T, S = scores_shape
    if mask.dim() == 2:
        try:
            fits = torch.broadcast_shapes(mask.shape, (T, S)) == torch.Size((T, S))
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"{who}: a 2-D mask must be (queries, keys) = {(T, S)}, got "
                             f"{tuple(mask.shape)}; "
                             "for a (batch, keys) token mask use padding_mask()")
    elif mask.dim() == 3:
        mask = mask[:, None]
    elif mask.dim() != 4:
        raise ValueError(f"{who}: mask must have 2, 3 or 4 dimensions, got shape {tuple(mask.shape)}")
    try:
        if torch.broadcast_shapes(mask.shape, scores_shape) != torch.Size(scores_shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"{who}: mask {tuple(mask.shape)} does not broadcast to the attention scores "
                         f"(batch, heads, queries, keys) = {tuple(scores_shape)}") from None
    return mask


# %% [markdown]
# Now the package's explicit attention. It works on tensors with a batch and a heads axis in
# front, `(B, h, T, d_k)` (section 4 explains the heads), checks its inputs, and returns the
# weights with the output, which is what the heatmaps of section 7 need. `dropout_p` drops
# attention weights during training (Vaswani et al. §5.4 apply dropout to sub-layer outputs;
# dropping weights is what PyTorch's attention does, and chapter 07 uses it).

# %%
# tfmlib-source: tfmlib.attention.check_qkv
def check_qkv(q: Tensor, k: Tensor, v: Tensor, who: str) -> None:
    """Refuse queries, keys and values that attention cannot take, naming ``who`` (the caller).

    ``q`` ``(B, h, T, d_k)``, ``k`` ``(B, h, S, d_k)``, ``v`` ``(B, h, S, d_v)``, all floating:
    ``TypeError`` for a non-tensor or an integer tensor, ``ValueError`` for a shape that is not
    4-d or does not agree (``d_k`` of q and k; ``(B, h, S)`` of k and v; ``(B, h)`` of q and k).
    Every attention of the package checks with it (chapter 10's tiled attention too)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{who}: {name} must be a floating tensor, got {got}")
        if x.dim() != 4:
            raise ValueError(f"{who}: {name} must be (batch, heads, length, width), got shape "
                             f"{tuple(x.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{who}: queries and keys must have the same width d_k, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{who}: keys and values must agree in (batch, heads, length), got "
                         f"k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"{who}: q and k must agree in (batch, heads), got q {tuple(q.shape)} and "
                         f"k {tuple(k.shape)}")


# %%
# tfmlib-source: tfmlib.attention.scaled_dot_product_attention
def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 dropout_p: float = 0.0, *, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Attention written out: ``softmax(Q K^T / sqrt(d_k) + bias) V``, with the weights returned.

    ``q`` ``(B, h, T, d_k)``, ``k`` ``(B, h, S, d_k)``, ``v`` ``(B, h, S, d_v)``; ``mask``
    broadcasting to ``(B, h, T, S)``: bool (``True`` = may attend) or floating (added to the
    scores; ``-inf`` = may not attend). ``causal=True`` adds :func:`causal_mask` (bottom-right
    aligned when ``T < S``). Returns ``(out (B, h, T, d_v), weights (B, h, T, S))``; each row of
    ``weights`` sums to 1 over the keys a query may see, and is all zeros for a query that may
    see none. ``dropout_p`` drops weights (training only; the returned weights are those before
    dropout).

    ``q`` is scaled *before* the product: ``(Q / sqrt(d_k)) K^T`` is the same number as
    ``Q K^T / sqrt(d_k)``, but its intermediate is ``sqrt(d_k)`` times smaller, so float16 (whose
    largest number is 65504) does not overflow to ``inf`` where the scaled score is finite.
    """
    check_qkv(q, k, v, "scaled_dot_product_attention")
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)          # (B, h, T, S)
    mask = check_mask(mask, tuple(scores.shape), "scaled_dot_product_attention")
    if causal:
        keep = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        mask = keep if mask is None else (mask & keep if mask.dtype == torch.bool
                                          else torch.where(keep, mask, -math.inf))
    if mask is not None and mask.is_floating_point():  # additive: add it, then mask the -inf keys
        scores = scores + mask.to(scores.dtype)
        mask = mask != -math.inf
    weights = torch.softmax(scores, dim=-1) if mask is None else masked_softmax(scores, mask)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


# %% [markdown]
# Checked against section 1's matrices (one sentence, one head), and on a padded batch with a
# causal mask and a row that may see nothing:

# %%
out, weights = scaled_dot_product_attention(Q[None, None], K[None, None], V[None, None])
assert torch.allclose(out[0, 0], Z, atol=1e-6) and torch.allclose(weights[0, 0], A, atol=1e-6), \
    "the package's attention must give section 1's output and weights"

torch.manual_seed(run.seed)
B, h, L, d = 3, 2, 5, 4
q, k, v = (torch.randn(B, h, L, d, requires_grad=True) for _ in range(3))
token_mask = torch.arange(L)[None, :] < torch.tensor([5, 3, 1])[:, None]
both = padding_mask(token_mask) & causal_mask(L)
both = both & token_mask[:, None, :, None]                # also hide the padded queries: rows of all False
out, weights = scaled_dot_product_attention(q, k, v, both)
out.sum().backward()
hidden = ~both.expand_as(weights)
fully_masked_rows = (~both.any(-1)).expand(B, h, L)
print(f"{int(fully_masked_rows.sum())} query rows may see nothing; their outputs are "
      f"{out[fully_masked_rows].abs().max().item():.1f} and their weights "
      f"{weights[fully_masked_rows].abs().max().item():.1f}")
print(f"largest weight on a hidden key: {weights[hidden].max().item():.1f}; "
      f"gradients finite: {all(torch.isfinite(t.grad).all().item() for t in (q, k, v))}")
assert torch.all(weights[hidden] == 0), "a hidden key must get exactly zero weight"
assert torch.all(out[fully_masked_rows] == 0), "a query that may see nothing must output zeros"
assert all(torch.isfinite(t.grad).all() for t in (q, k, v)), "no NaN in the backward pass"
visible_rows = ~fully_masked_rows
assert torch.allclose(weights.sum(-1)[visible_rows], torch.ones(int(visible_rows.sum()))), \
    "every other row must still be a distribution"

# %% [markdown]
# **The fast attention.** The explicit attention materialises the score matrix, `(B, h, T, S)`
# numbers, and then the weights, another tensor of the same size, and keeps the weights for the
# backward pass (section 6 measures what it keeps). The models of later chapters need no
# weights, only the output, and PyTorch's `F.scaled_dot_product_attention` computes the same
# output with one of several *backends* (`torch.nn.attention.SDPBackend`): `MATH`, the formula
# written out (any device, dtype and mask); `FLASH_ATTENTION`, Dao et al.'s (2022) tiling, which
# never stores the $T \times S$ matrix but walks over blocks of keys with a running maximum and a
# running sum of the softmax (question 7: the online softmax of Milakov & Gimelshein, 2018,
# applied to attention's keys by Rabe & Staats, 2021, and by Dao et al.), and recomputes the
# blocks in the backward pass;
# `EFFICIENT_ATTENTION`, the memory-efficient kernel of the same idea from xFormers; and
# `CUDNN_ATTENTION`, NVIDIA's. PyTorch takes the first backend whose input constraints the call
# meets (the documentation of `F.scaled_dot_product_attention`: "each of the fused kernels has
# specific input limitations"), and `torch.nn.attention.sdpa_kernel` restricts the choice, which
# is how one finds out what runs. It reads a `bool` mask the way we do (`True` = may take part),
# and also accepts a floating mask that it adds to the scores (section 5). Its answer for a query
# that may see nothing has changed between versions and backends, so the package sets that row
# to zero itself, with the same trick as `masked_softmax`: let such a row attend to everything,
# which is finite, and zero its output, which zeroes every gradient through it.
#
# One more detail of the code below: it passes `is_causal=True` only when $T = S$. PyTorch's
# `is_causal` aligns the causal triangle with the top-left corner (query $t$ sees keys
# $0 \dots t$), the book's `causal_mask` with the bottom-right one (query $t$ sees keys
# $0 \dots t + S - T$: the $T$ queries are the *last* $T$ positions, which is what a decoder
# reading a cache of earlier keys needs, chapter 09). The two agree only when $T = S$; the cell
# after the next one measures the difference.

# %%
# tfmlib-source: tfmlib.attention.fast_attention
def fast_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
                   dropout_p: float = 0.0) -> Tensor:
    """The output of :func:`scaled_dot_product_attention`, computed by ``F.scaled_dot_product_attention``.

    Same shapes and masks (bool keep-mask, or floating mask added to the scores). ``causal=True``
    adds :func:`causal_mask`, and lets PyTorch use its causal kernels when there is no other mask
    and ``T == S``. With ``T < S`` it aligns the queries with the *last* ``T`` keys
    (bottom-right), unlike PyTorch's ``is_causal=True`` (top-left: the first ``T``); pass
    ``mask=causal_mask(T, S, align="top_left")`` for PyTorch's behaviour. A fully masked query row
    gives zeros (PyTorch's own result for such a row depends on its version and backend, so it is
    set here).
    """
    check_qkv(q, k, v, "fast_attention")
    T, S = q.shape[-2], k.shape[-2]
    mask = check_mask(mask, (q.shape[0], q.shape[1], T, S), "fast_attention")
    if mask is None:
        if causal and T == S:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        if not causal:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        mask = causal_mask(T, S, device=q.device)
    elif causal:
        keep = causal_mask(T, S, device=q.device)
        mask = mask & keep if mask.dtype == torch.bool else torch.where(keep, mask, -math.inf)
    # A row that may attend to nothing is let attend to everything (finite, no NaN in either pass),
    # and its output is then zeroed, which also zeroes every gradient through it.
    if mask.dtype == torch.bool:
        sees_something = mask.any(dim=-1, keepdim=True)                   # (..., T, 1)
        attn_mask = mask | ~sees_something
    else:
        sees_something = (mask != -math.inf).any(dim=-1, keepdim=True)
        attn_mask = mask.to(q.dtype).masked_fill(~sees_something, 0.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return out.masked_fill(~sees_something, 0.0)


# %% [markdown]
# The two must agree, forward and backward, under every kind of mask. The table compares the
# outputs and the gradients with respect to $q$, $k$ and $v$ (float32, random inputs, a batch of
# sentences of different lengths; the last case also hides the padded queries, so some rows see
# nothing).

# %%
torch.manual_seed(run.seed)
B, h, T, d = 4, 3, 7, 8
lengths = torch.tensor([7, 5, 2, 1])
token_mask = torch.arange(T)[None, :] < lengths[:, None]
cases = {"no mask": (None, False), "padding": (padding_mask(token_mask), False), "causal": (None, True),
         "padding + causal": (padding_mask(token_mask), True),
         "padding, queries too": (padding_mask(token_mask) & token_mask[:, None, :, None], False)}
print(f"{'case':>22} {'max |out diff|':>15} {'max |grad diff|':>16}")
for name, (mask, causal) in cases.items():
    q, k, v = (torch.randn(B, h, T, d, requires_grad=True) for _ in range(3))
    explicit_mask = mask & causal_mask(T) if (causal and mask is not None) else (causal_mask(T) if causal else mask)
    out_e, _ = scaled_dot_product_attention(q, k, v, explicit_mask)
    out_f = fast_attention(q, k, v, mask, causal=causal)
    upstream = torch.randn_like(out_e)
    grads_e = torch.autograd.grad(out_e, (q, k, v), upstream)
    grads_f = torch.autograd.grad(out_f, (q, k, v), upstream)
    out_diff = (out_e - out_f).abs().max().item()
    grad_diff = max((a - b).abs().max().item() for a, b in zip(grads_e, grads_f, strict=True))
    print(f"{name:>22} {out_diff:>15.1e} {grad_diff:>16.1e}")
    assert out_diff < 1e-5 and grad_diff < 1e-5, f"explicit and fast attention disagree ({name})"
    assert all(torch.isfinite(t).all() for t in (*grads_f, out_f)), f"NaN in the fast attention ({name})"

# %% [markdown]
# Which backends run here? Each call below is tried with one backend allowed at a time
# (`sdpa_kernel`); a backend that cannot take the call is refused with an error. Then the two
# causal alignments, with 2 queries and 5 keys:

# %%
q, k, v = (torch.randn(2, 4, 16, 32, device=run.device) for _ in range(3))
keep16 = causal_mask(16, device=run.device)
calls = {"no mask": {}, "bool mask": dict(attn_mask=keep16), "is_causal=True": dict(is_causal=True),
         "float mask": dict(attn_mask=torch.zeros(16, 16, device=run.device).masked_fill(~keep16, -math.inf)),
         "dropout 0.1": dict(dropout_p=0.1)}
backends = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
runs_on = {}
for backend in backends:
    for call, kwargs in calls.items():
        try:
            with sdpa_kernel(backend), warnings.catch_warnings():
                warnings.simplefilter("ignore")              # PyTorch warns about why a kernel refused
                F.scaled_dot_product_attention(q, k, v, **kwargs)
            runs_on[backend.name, call] = "runs"
        except RuntimeError:
            runs_on[backend.name, call] = "refused"
print(f"float32 on {run.device.type} (torch {torch.__version__}):")
print(f"{'backend':>20} " + " ".join(f"{call:>15}" for call in calls))
for backend in backends:
    print(f"{backend.name:>20} " + " ".join(f"{runs_on[backend.name, call]:>15}" for call in calls))

q2, k2, v2 = (torch.randn(1, 1, n, 4) for n in (2, 5, 5))  # cpu: PyTorch's is_causal, checked on the CPU
torch_causal = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
for align in ("top_left", "bottom_right"):
    book = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=causal_mask(2, 5, align=align))
    print(f"is_causal=True vs causal_mask(2, 5, align={align!r}) {causal_mask(2, 5, align=align).int().tolist()}: "
          f"max |difference| {(torch_causal - book).abs().max().item():.2g}")
assert torch.allclose(torch_causal, F.scaled_dot_product_attention(q2, k2, v2, attn_mask=causal_mask(2, 5, align="top_left"))), \
    "PyTorch's is_causal aligns top-left"
assert runs_on["MATH", "bool mask"] == "runs", "the math backend takes every call"

# %% [markdown]
# The math backend takes every call. On a CPU the flash backend is a blocked kernel written for
# the CPU, and it took float32 and both kinds of mask here, but not dropout (in the version
# printed); the efficient and cuDNN backends exist only for CUDA. On CUDA the picture is
# different, and it matters for this book: there the flash kernel takes only float16 and
# bfloat16 and no `attn_mask` (`is_causal=True` is fine), while the memory-efficient kernel also
# takes float32 and a mask. Every call in this chapter is float32, and `fast_attention` passes a
# mask whenever it has one, so on a GPU it runs the memory-efficient kernel (or the math one),
# not FlashAttention; to get flash on CUDA, use half precision and `is_causal` (or no mask). (These
# rules are the checks in PyTorch's `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`, tried
# in the order flash, memory-efficient, math, with cuDNN put first on recent data-centre GPUs;
# they change between versions, so `sdpa_kernel` on the machine itself has the last word.) The
# table is what one checks on a new machine: run this cell there. And the alignment check shows
# why `fast_attention` hands `is_causal=True` to PyTorch only when $T = S$: with 2 queries and 5
# keys, PyTorch's result is the top-left triangle, not the book's.

# %% [markdown]
# ## 4. Multi-head attention
#
# One softmax gives each query one distribution over the positions: one place to look, or a
# blur of several. Vaswani et al. (§3.2.2) run $h$ attentions in parallel instead, each in its
# own smaller space, and concatenate what they return:
#
# $$\text{head}_i = \operatorname{Attention}(X W_i^Q,\ X W_i^K,\ X W_i^V), \qquad
#   \operatorname{MultiHead}(X) = [\text{head}_1; \dots; \text{head}_h]\, W^O,$$
#
# with $W_i^Q, W_i^K, W_i^V \in \mathbb{R}^{d_{\text{model}} \times d_k}$,
# $d_k = d_v = d_{\text{model}}/h$, and the output projection
# $W^O \in \mathbb{R}^{h d_v \times d_{\text{model}}}$, which mixes what the heads found. Because
# $d_k = d_{\text{model}}/h$, the $h$ heads together cost the same parameters as one head of full
# width, and the same multiply-adds for the projections, for $QK^\top$ and for the weighted sum
# ($h \cdot n^2 \cdot d_{\text{model}}/h = n^2 d_{\text{model}}$). What grows with $h$ is the
# score and weight tensors, $B \cdot h \cdot T \cdot S$ numbers each, and the softmax over
# them: $h$ times those of one head. What the heads add is $h$ distributions per query instead
# of one; section 7 measures whether that helps.
#
# Nothing here needs a loop over heads. Put the $h$ matrices $W_i^Q$ side by side and they form
# one $d_{\text{model}} \times d_{\text{model}}$ matrix: one `nn.Linear` computes all heads'
# queries, and head $i$'s are features $i d_k$ to $(i+1) d_k - 1$ of its output. A reshape
# `(B, T, h, d_k)` and a transpose to `(B, h, T, d_k)` make the heads a **batch axis**, and the
# attention of section 3, which already accepts a heads axis, runs on all of them in one call.
#
# ![A (B, T, d_model) projection with its columns in h slices of width d_k, viewed as (B, T, h, d_k) and transposed to (B, h, T, d_k): h matrices of T x d_k side by side, which attention treats as a batch](figures/05_heads_as_batch.svg)
#
# *Head $i$ is columns $i d_k$ to $(i+1) d_k - 1$ of one projection; after `view` and `transpose(1, 2)` the head axis sits next to the batch axis, so one attention call serves every head.*

# %%
# tfmlib-source: tfmlib.attention.split_heads
def split_heads(x: Tensor, heads: int) -> Tensor:
    """``(B, L, heads * d)`` -> ``(B, heads, L, d)``: the heads become a batch axis."""
    B, L, D = x.shape
    return x.view(B, L, heads, D // heads).transpose(1, 2)


# %%
# tfmlib-source: tfmlib.attention.merge_heads
def merge_heads(x: Tensor) -> Tensor:
    """``(B, heads, L, d)`` -> ``(B, L, heads * d)``: the inverse of :func:`split_heads`."""
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


# %% [markdown]
# The order of the reshape matters, and the common bug is to skip the transpose and reshape
# straight to `(B, h, L, d)`. The tensor below holds `100 * position + feature`, so every entry
# says where it came from. Head 1 must hold features 2 and 3 of every position; the wrong
# reshape gives it the features of other positions.

# %%
x = (100 * torch.arange(3)[:, None] + torch.arange(8)[None, :]).float()[None]      # (1, L=3, D=8)
right, wrong = split_heads(x, heads=4), x.view(1, 4, 3, 2)
print("head 1, split_heads (position*100 + feature):\n", right[0, 1].int().tolist())
print("head 1, x.view(B, h, L, d):\n", wrong[0, 1].int().tolist())
assert torch.equal(right[0, 1], x[0, :, 2:4]) and not torch.equal(wrong[0, 1], x[0, :, 2:4]), \
    "head 1 must hold features 2 and 3 of every position, and the plain view must not"
assert torch.equal(merge_heads(right), x), "merge_heads must undo split_heads"

# %% [markdown]
# The layer, in full. `forward` takes a query sequence and, for cross-attention (chapter 07), a
# key/value sequence; for self-attention the three are the same tensor. With
# `need_weights=True` it runs the explicit attention and returns the weights; otherwise it runs
# the fast one of section 3. `rotary` is a hook for chapter 06's rotary position embeddings.

# %%
# tfmlib-source: tfmlib.attention.MultiHeadAttention
class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, section 3.2.2)::

        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V),  MultiHead(Q, K, V) = [head_1; ...; head_h] W^O

    The ``h`` projections of each kind are one ``nn.Linear(d_model, d_model)`` whose output is cut
    into ``h`` slices of ``d_k = d_model / h``, so every head is computed at once.

    ``forward(query (B, T, d_model), key (B, S, d_model) = query, value (B, S, d_model) = key, *,
    mask=None, causal=False, need_weights=False, q_positions=None, k_positions=None) -> (out (B, T,
    d_model), weights (B, h, T, S) or None)``. ``mask`` is a bool keep-mask or a floating mask added
    to the scores (see the module docstring), broadcasting to ``(B, h, T, S)``. With
    ``need_weights`` the explicit :func:`scaled_dot_product_attention` runs and its weights are
    returned; otherwise :func:`fast_attention`.

    ``rotary`` (chapter 06) is a module ``(q, k) -> (q, k)`` applied to the split heads before the
    scores, for rotary position embeddings (:class:`~tfmlib.positional.RotaryEmbedding`).
    ``q_positions`` and ``k_positions`` (``(T,)`` and ``(S,)``, or ``(B, T)`` and ``(B, S)``,
    integer) are the positions it rotates by, passed on as
    ``rotary(q, k, q_positions=..., k_positions=...)``: needed when the queries are not the keys'
    positions ``0 .. S - 1`` (a decoder step after ``S - T`` cached keys, left padding, packed
    sequences). Without them ``RotaryEmbedding`` refuses ``T != S`` rather than guess.

    The key-value cache (chapter 09): with ``cache`` (a :class:`~tfmlib.kv_cache.KVCache` holding
    the keys and values of ``t`` earlier positions) the keys and values computed here are
    appended to it (the cache is extended in place) and the queries attend over all ``t + S``;
    the rotary positions default to ``t .. t + S - 1``, and ``causal=True`` aligns the queries with
    the last keys. With ``kv`` (keys and values ``(B, h, S, d_k)`` from :meth:`keys_values`,
    computed once) ``key`` and ``value`` are not projected again: a decoder's cross-attention
    reads the same encoder output at every step.

    ``kernel`` (chapter 10) is the function that attends, with :func:`fast_attention`'s arguments
    ``(q, k, v, mask, causal, dropout_p) -> out`` (:data:`AttentionKernel`); ``None`` is
    :func:`fast_attention`. It is an attribute: set it to switch, the weights do not change.
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rotary: Callable[..., tuple[Tensor, Tensor]] | None = None,
                 kernel: AttentionKernel | None = None):
        super().__init__()
        for name, v in (("d_model", d_model), ("heads", heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"MultiHeadAttention: {name} must be a positive int, got {v!r}")
        if d_model % heads:
            raise ValueError(f"MultiHeadAttention: d_model={d_model} is not divisible by heads={heads} "
                             f"(each head gets d_model / heads features)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        self.d_model, self.heads, self.d_k, self.dropout = d_model, heads, d_model // heads, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.kernel = kernel

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"MultiHeadAttention: {name} must be (batch, length, "
                                 f"d_model={self.d_model}), "
                                 f"got {got} (batch first; no unbatched input)")
        if query.shape[0] == 0 or query.shape[1] == 0 or key.shape[1] == 0:
            raise ValueError(f"MultiHeadAttention: empty input (query {tuple(query.shape)}, "
                             f"key {tuple(key.shape)})")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"MultiHeadAttention: query, key and value must have the same batch size, got "
                             f"{query.shape[0]}, {key.shape[0]}, {value.shape[0]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"MultiHeadAttention: key and value must have the same length, got "
                             f"{key.shape[1]} and {value.shape[1]}")

    def keys_values(self, key: Tensor, value: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The keys and values of ``key`` and ``value`` ``(B, S, d_model)``, projected and split
        into heads: ``(B, h, S, d_k)`` each (before any rotation)."""
        value = key if value is None else value
        return split_heads(self.k_proj(key), self.heads), split_heads(self.v_proj(value), self.heads)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None, *,
                mask: Tensor | None = None, causal: bool = False, need_weights: bool = False,
                q_positions: Tensor | None = None, k_positions: Tensor | None = None,
                cache: KVCache | None = None,
                kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        q = split_heads(self.q_proj(query), self.heads)                   # (B, h, T, d_k)
        if kv is not None:                                                # projected once, earlier
            if self.rotary is not None or cache is not None:
                raise ValueError("MultiHeadAttention: kv= (keys and values projected earlier) cannot be "
                                 "combined with a rotary embedding or a cache")
            k, v = kv
        else:
            k, v = self.keys_values(key, value)                           # (B, h, S, d_k) each
        if self.rotary is not None:
            if cache is not None and q_positions is None and k_positions is None:  # after the cached ones
                q_positions = k_positions = torch.arange(cache.length, cache.length + k.shape[2],
                                                         device=k.device)
            if q_positions is None and k_positions is None:
                q, k = self.rotary(q, k)
            else:
                q, k = self.rotary(q, k, q_positions=q_positions, k_positions=k_positions)
        elif q_positions is not None or k_positions is not None:
            raise ValueError("MultiHeadAttention: q_positions/k_positions are the positions a rotary "
                             "embedding rotates by, but this module has no rotary=")
        if cache is not None:
            k, v = cache.append(k, v)                                     # (B, h, t + S, d_k): all so far
        causal = causal and q.shape[2] > 1  # one query, aligned with the last key, sees every key
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p, causal=causal)
        else:
            kernel = fast_attention if self.kernel is None else self.kernel
            out, weights = kernel(q, k, v, mask, causal, dropout_p), None
        return self.out_proj(merge_heads(out)), weights


# %% [markdown]
# Three checks. The batched heads equal a loop that runs each head separately with its own slice
# of the projection matrices and concatenates the results. The parameter count,
# $4(d_{\text{model}}^2 + d_{\text{model}})$, does not depend on $h$. And the two are timed (with
# 8 heads, on a batch of 32 sentences of 32 tokens): the loop does the same arithmetic in $h$
# times as many, smaller, matrix products. Timings on a shared machine jump about, so here and
# in section 6 the functions being compared take turns, many times over, after untimed warm-up
# calls, and the median is kept: `tfmlib.timing.interleaved_medians`, which also waits for a GPU
# to finish its queued work before it reads the clock, and labels the result with the device.
# The timing runs on the notebook's device; the comparison is asserted only on a CPU, where it
# was measured for this text (elsewhere it is printed, for you to read):

# %%


torch.manual_seed(run.seed)
mha = MultiHeadAttention(16, 4).eval()
x = torch.randn(8, 12, 16)  # cpu: the layer stays on the CPU too (a check of arithmetic)


def heads_by_loop(layer: MultiHeadAttention, x: Tensor) -> Tensor:
    """Each head on its own, with its slice of W^Q, W^K, W^V; concatenated, then W^O."""
    d, outputs = layer.d_k, []
    for i in range(layer.heads):
        rows = slice(i * d, (i + 1) * d)
        q = x @ layer.q_proj.weight[rows].T + layer.q_proj.bias[rows]
        k = x @ layer.k_proj.weight[rows].T + layer.k_proj.bias[rows]
        v = x @ layer.v_proj.weight[rows].T + layer.v_proj.bias[rows]
        outputs.append(torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1) @ v)
    return layer.out_proj(torch.cat(outputs, dim=-1))


with torch.no_grad():
    batched, _ = mha(x, need_weights=True)
    looped = heads_by_loop(mha, x)
    print(f"max |batched heads - loop over heads| = {(batched - looped).abs().max().item():.1e}")
    assert torch.allclose(batched, looped, atol=1e-5), "heads as a batch axis must equal a loop over heads"
    for heads in (1, 2, 4, 8):
        n = sum(p.numel() for p in MultiHeadAttention(64, heads).parameters())
        print(f"d_model = 64, {heads} head(s): {n:,} parameters (4 * (64**2 + 64) = {4 * (64**2 + 64):,})")
    wide = MultiHeadAttention(64, 8).to(run.device).eval()
    x_wide = torch.randn(32, 32, 64, device=run.device)
    heads_times = interleaved_medians({"batched heads": lambda: wide(x_wide, need_weights=True),
                                       "loop over heads": lambda: heads_by_loop(wide, x_wide)},
                                      repeats=20, device=run.device)
print(heads_times)
print(f"loop / batched: {heads_times.ratio('loop over heads', 'batched heads'):.2f}x")
if run.profile != "smoke" and run.device.type == "cpu":
    assert heads_times["batched heads"] < heads_times["loop over heads"], "the batch axis should beat the loop"

# %% [markdown]
# **No leakage from the future.** A causal mask is easy to get subtly wrong (a mask transposed,
# an offset missing, a broadcast over the wrong axis), and a wrong one does not crash: the model
# trains, and it trains *better*, because it can read the word it is asked to predict. Zero
# weights above the diagonal are not proof either (question 4 asks for a bug they miss). The
# test that catches every such bug is the gradient: the output at position $t$ must not change when
# any input after $t$ changes, so $\partial z_t / \partial x_s = 0$ for every $s > t$. We compute
# the full Jacobian of the layer and plot $\lVert \partial z_t/\partial x_s \rVert$ (in double
# precision, so "zero" means exactly zero), with the causal mask and, to show that the test can
# fail, without.

# %%


def dependence(layer: nn.Module, x: Tensor, **kwargs) -> Tensor:
    """``G[t, s] = ||d out_t / d x_s||`` for one sequence ``x`` ``(1, T, d)``: how much the output at t
    depends on the input at s, from the full Jacobian."""
    J = torch.autograd.functional.jacobian(lambda inp: layer(inp, **kwargs)[0], x)   # (1, T, d, 1, T, d)
    return J[0, :, :, 0].pow(2).sum(dim=(1, 3)).sqrt()                               # (T, T)


torch.manual_seed(run.seed)
layer = MultiHeadAttention(16, 4).double()
x = torch.randn(1, 8, 16, dtype=torch.double)
G = {"causal=True": dependence(layer, x, causal=True), "no mask": dependence(layer, x),
     "causal=True, explicit": dependence(layer, x, causal=True, need_weights=True)}
future = torch.ones(8, 8, dtype=torch.bool).triu(diagonal=1)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
top = max(G["causal=True"].max().item(), G["no mask"].max().item())      # one colour scale for both panels
for ax, name in zip(axes, ("causal=True", "no mask"), strict=True):
    plot_heatmap(G[name], ax=ax, title=f"||d out_t / d x_s||, {name}", xlabel="input position s",
                 ylabel="output position t", x_labels=[str(i) for i in range(8)],
                 y_labels=[str(i) for i in range(8)], vmin=0, vmax=top)
fig.tight_layout()
plt.show()
for name, g in G.items():
    print(f"{name:>22}: largest dependence on a later input {g[future].max().item():.3g}, "
          f"smallest on an earlier or equal one {g[~future].min().item():.3g}")
assert torch.all(G["causal=True"][future] == 0) and torch.all(G["causal=True, explicit"][future] == 0), \
    "an output must not depend on any later input"
assert torch.all(G["causal=True"][~future] > 0), "an output must depend on every input up to its own position"
assert G["no mask"][future].min() > 0, "without the mask every output depends on every input (the test can fail)"

# %% [markdown]
# (The two panels share one colour scale, so their colours compare.) Both paths (the fast one
# used in training and the explicit one used for plots) have exactly zero dependence above the
# diagonal, and a non-zero one on and below it. The same test, with a
# padding mask, shows that padding cannot leak into real positions: the outputs at the real
# positions of a padded sentence do not depend on the padded inputs at all.

# %%
keep = torch.tensor([[True] * 5 + [False] * 3])
G_pad = dependence(layer, x, mask=padding_mask(keep))
print(f"largest dependence of a real position on a padded input: {G_pad[:5, 5:].max().item():.3g}; "
      f"smallest on a real input: {G_pad[:5, :5].min().item():.3g}")
assert torch.all(G_pad[:5, 5:] == 0), "no real position may depend on a padded input"
assert torch.all(G_pad[:5, :5] > 0), "every real position depends on every real input"

# %% [markdown]
# ## 5. Equal to PyTorch's `nn.MultiheadAttention`
#
# PyTorch's own layer packs the three input projections into
# one `in_proj_weight` of shape `(3 d_model, d_model)`, in the order query, key, value. Copying its
# blocks into our three `nn.Linear`s must give the same layer:

# %%
# tfmlib-source: tfmlib.attention.copy_from_torch_mha
def copy_from_torch_mha(src: nn.MultiheadAttention, dst: MultiHeadAttention) -> MultiHeadAttention:
    """Copy an ``nn.MultiheadAttention``'s weights into ``dst`` (same ``d_model``, heads, bias and
    dropout).

    PyTorch packs the three input projections into ``in_proj_weight`` ``(3 d_model, d_model)`` in
    the order query, key, value; each block is one of ``dst``'s ``q_proj``/``k_proj``/``v_proj``.
    A module that computes something ``dst`` cannot (separate ``kdim``/``vdim``, ``add_bias_kv``,
    ``add_zero_attn``) is refused, so that a copy always computes what ``src`` does.
    ``batch_first`` does not matter here (it only changes how ``src`` is called).
    """
    if not isinstance(src, nn.MultiheadAttention):
        raise TypeError(f"copy_from_torch_mha: src must be nn.MultiheadAttention, got {type(src).__name__}")
    if (src.embed_dim, src.num_heads) != (dst.d_model, dst.heads):
        raise ValueError(f"copy_from_torch_mha: src has (d_model, heads)={(src.embed_dim, src.num_heads)}, "
                         f"dst has {(dst.d_model, dst.heads)}")
    if src.in_proj_weight is None:
        raise ValueError("copy_from_torch_mha: src has separate key/value sizes (kdim/vdim); not supported")
    if src.bias_k is not None or src.bias_v is not None:
        raise ValueError("copy_from_torch_mha: src has add_bias_kv=True (a learned extra key and value); "
                         "MultiHeadAttention has no such parameters")
    if src.add_zero_attn:
        raise ValueError("copy_from_torch_mha: src has add_zero_attn=True (an extra all-zero key and value); "
                         "MultiHeadAttention does not add one")
    if (src.in_proj_bias is None) != (dst.q_proj.bias is None):
        raise ValueError("copy_from_torch_mha: src and dst must both have biases or both not")
    if src.dropout != dst.dropout:
        raise ValueError(f"copy_from_torch_mha: src has dropout={src.dropout}, dst has dropout={dst.dropout}")
    with torch.no_grad():
        for i, proj in enumerate((dst.q_proj, dst.k_proj, dst.v_proj)):
            proj.weight.copy_(src.in_proj_weight.chunk(3)[i])
            if proj.bias is not None:
                proj.bias.copy_(src.in_proj_bias.chunk(3)[i])
        dst.out_proj.weight.copy_(src.out_proj.weight)
        if dst.out_proj.bias is not None:
            dst.out_proj.bias.copy_(src.out_proj.bias)
    return dst


# %% [markdown]
# One trap remains: **`nn.MultiheadAttention` reads a `bool` mask the other way round.** Its
# `key_padding_mask` and `attn_mask` are `True` where a position may **not** be attended to,
# the opposite of the book's masks and of `F.scaled_dot_product_attention`'s. So its causal
# mask is `~causal_mask(T)` and its padding mask is `~token_mask`. The comparison covers
# self-attention, padding, causal, both, and cross-attention to a padded memory; for each, the
# output, the per-head weights, the gradient with respect to the inputs, and the gradients of
# all weights (PyTorch's packed `in_proj_weight` against our three matrices stacked).

# %%
torch.manual_seed(run.seed)
B, T, S, D, H = 3, 6, 7, 16, 4
reference = nn.MultiheadAttention(D, H, batch_first=True)
with torch.no_grad():                      # PyTorch starts the biases at zero: make them visible to the comparison
    reference.in_proj_bias.normal_(std=0.1)
    reference.out_proj.bias.normal_(std=0.1)
ours = copy_from_torch_mha(reference, MultiHeadAttention(D, H))
comparison = {}
for case in ("self", "self + padding", "causal", "causal + padding", "cross + padding"):
    x = torch.randn(B, T, D, requires_grad=True)
    memory = torch.randn(B, S, D, requires_grad=True) if case.startswith("cross") else x
    L = memory.shape[1]
    keep = torch.arange(L)[None, :] < torch.tensor([L, L - 2, 2])[:, None]
    causal = case.startswith("causal")
    torch_kwargs = {"key_padding_mask": ~keep} if "padding" in case else {}    # PyTorch: True = hidden
    if causal:
        torch_kwargs["attn_mask"] = ~causal_mask(T)
    our_mask = padding_mask(keep) if "padding" in case else None
    want, want_w = reference(x, memory, memory, need_weights=True, average_attn_weights=False, **torch_kwargs)
    inputs = [x] if memory is x else [x, memory]
    want_grads = torch.autograd.grad(want.square().sum(), inputs + list(reference.parameters()))
    diffs = []
    for need_weights in (False, True):
        got, got_w = ours(x, memory, mask=our_mask, causal=causal, need_weights=need_weights)
        grads = torch.autograd.grad(got.square().sum(), inputs + list(ours.parameters()))
        n_in = len(inputs)
        ours_g = dict(zip([n for n, _ in ours.named_parameters()], grads[n_in:], strict=True))
        packed_w = torch.cat([ours_g[f"{p}_proj.weight"] for p in "qkv"])
        packed_b = torch.cat([ours_g[f"{p}_proj.bias"] for p in "qkv"])
        ref_g = dict(zip([n for n, _ in reference.named_parameters()], want_grads[n_in:], strict=True))
        diffs.append(max([(got - want).abs().max().item()]
                         + [(a - b).abs().max().item() for a, b in zip(grads[:n_in], want_grads[:n_in], strict=True)]
                         + [(packed_w - ref_g["in_proj_weight"]).abs().max().item(),
                            (packed_b - ref_g["in_proj_bias"]).abs().max().item(),
                            (ours_g["out_proj.weight"] - ref_g["out_proj.weight"]).abs().max().item(),
                            (ours_g["out_proj.bias"] - ref_g["out_proj.bias"]).abs().max().item()]))
        if need_weights:
            diffs.append((got_w - want_w).abs().max().item())
    comparison[case] = diffs
print(f"{'case':>18} {'fast: out & grads':>18} {'explicit: out & grads':>22} {'weights':>8}")
for case, (fast_diff, explicit_diff, weight_diff) in comparison.items():
    print(f"{case:>18} {fast_diff:>18.1e} {explicit_diff:>22.1e} {weight_diff:>8.1e}")
assert max(max(d) for d in comparison.values()) < 1e-5, "our layer must equal nn.MultiheadAttention"

# %% [markdown]
# Every difference is at the level of float32 rounding. Now the same padded batch with the book's
# mask handed to PyTorch unchanged, the mistake the opposite convention invites, and a query that
# may see nothing, in each layer:

# %%
x = torch.randn(B, T, D)
keep = torch.arange(T)[None, :] < torch.tensor([T, 4, 2])[:, None]
with torch.no_grad():
    right, _ = ours(x, mask=padding_mask(keep))
    mistaken, _ = reference(x, x, x, key_padding_mask=keep)        # the book's mask, PyTorch's convention
    print(f"book's mask passed to nn.MultiheadAttention as is: max |difference| = "
          f"{(mistaken - right).abs().nan_to_num(float('inf')).max().item():.3g}, "
          f"NaN entries: {int(mistaken.isnan().sum())} of {mistaken.numel()}")
    sees = torch.ones(T, T, dtype=torch.bool)
    sees[0] = False                                                # query 0 may see no key at all
    ours_out, _ = ours(x, mask=sees)
    torch_out, _ = reference(x, x, x, attn_mask=~sees)             # the same mask, PyTorch's convention
print(f"a query that may see nothing: ours gives {ours_out[0, 0, :3].numpy().round(3)}... (the output "
      f"projection's bias), nn.MultiheadAttention (torch {torch.__version__}) gives "
      f"{torch_out[0, 0, :3].numpy().round(3)}...")
assert torch.isfinite(ours_out).all(), "our layer gives no NaN for a query that may see nothing"
assert torch.allclose(ours_out[:, 0], ours.out_proj.bias.detach().expand(B, D)), \
    "its attention output is zero, so the layer returns the output projection's bias"

# %% [markdown]
# With the convention flipped, each query attends *only* to padding, and a full-length sentence
# has no padding to attend to, so PyTorch returns NaN for it (the printed count). With a query
# that may see nothing, our layer returns zeros from the attention (so the layer outputs just
# the bias of $W^O$), while `nn.MultiheadAttention` in the version printed returns NaN. That
# difference is deliberate: the book's layer never produces NaN.
#
# **A third convention: additive float masks.** `F.scaled_dot_product_attention`,
# `nn.MultiheadAttention` and `nn.Transformer.generate_square_subsequent_mask` also take a
# *floating* mask, which is not a yes/no but a number *added* to the scores before the softmax:
# $0$ where a query may attend and $-\infty$ where it may not, since
# $\exp(e + (-\infty)) = 0$. A bool keep-mask $m$ and the float mask "$0$ where $m$, $-\infty$
# elsewhere" must give the same attention; and because the float mask is added, it can carry any
# real bias, not only $0$ and $-\infty$ (chapter 06's ALiBi adds $-m\,|t - s|$). The package's
# attention takes both kinds. Three checks, then the trap of the usual finite fill value:

# %%
T = 5
float_causal = nn.Transformer.generate_square_subsequent_mask(T)            # PyTorch's own causal mask
print("nn.Transformer.generate_square_subsequent_mask(5):\n", float_causal)
as_float = torch.zeros(T, T).masked_fill(~causal_mask(T), -math.inf)        # the book's bool mask, made additive
assert torch.equal(float_causal, as_float), "PyTorch's float causal mask is 0 on and below the diagonal, -inf above"
x = torch.randn(B, T, D)
with torch.no_grad():
    book_bool, _ = ours(x, mask=causal_mask(T))
    book_float, _ = ours(x, mask=float_causal)
    torch_float, _ = reference(x, x, x, attn_mask=float_causal)             # a float mask means the same to both
    bias = torch.randn(T, T)                                                # any real bias, e.g. a distance penalty
    ours_bias, _ = ours(x, mask=bias)
    torch_bias, _ = reference(x, x, x, attn_mask=bias)
float_diffs = {"ours: bool vs float mask": (book_bool - book_float).abs().max().item(),
               "ours vs nn.MultiheadAttention, float mask": (book_float - torch_float).abs().max().item(),
               "ours vs nn.MultiheadAttention, random bias": (ours_bias - torch_bias).abs().max().item()}
for name, diff in float_diffs.items():
    print(f"{name:>44}: max |difference| {diff:.1e}")
assert max(float_diffs.values()) < 1e-5, "a float mask must mean the same in our layer and PyTorch's"

fill = -1e9                                                        # a common finite fill in tutorials' code
scores16 = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.float16)
hide16 = torch.tensor([[False, True, True], [True, True, True]])   # row 2: a query that may see nothing
print(f"\nfloat16: largest finite number {torch.finfo(torch.float16).max:,.0f}; -1e9 becomes "
      f"{torch.tensor(fill).half().item()}")
try:
    scores16.masked_fill(hide16, fill)
    print("masked_fill(-1e9) on float16 scores: accepted")
except RuntimeError as error:
    print(f"masked_fill(-1e9) on float16 scores: RuntimeError: {error}")
added = torch.softmax(scores16 + torch.zeros(2, 3).masked_fill(hide16, fill).half(), dim=-1)
print(f"softmax(scores + (-1e9 mask).half()): {added.tolist()}")
print(f"masked_softmax (fill finfo.min = {torch.finfo(torch.float16).min:,.0f}, then x mask): "
      f"{masked_softmax(scores16, ~hide16).tolist()}")
assert torch.isnan(added[1]).all() and not torch.isnan(masked_softmax(scores16, ~hide16)).any(), \
    "in float16 a -1e9 fill is -inf (NaN for a row that sees nothing); masked_softmax gives no NaN"

# %% [markdown]
# All three differences are float32 rounding: PyTorch's float causal mask is exactly the book's
# bool mask made additive, and a real-valued bias means the same to both layers. The last lines
# are the trap. Code written for float32 often fills hidden scores with $-10^9$ instead of
# $-\infty$, to keep a fully hidden row finite. In float16, whose largest number is 65,504,
# $-10^9$ *is* $-\infty$: `masked_fill` refuses it outright, and a float mask cast to half turns
# it into $-\infty$, so a query that may see nothing gets NaN again, exactly the trap of section
# 3. The safe fill is the dtype's own most negative number, `torch.finfo(dtype).min`, which is
# what chapter 03's `masked_softmax` uses, followed by the multiplication by the mask.
#
# ## 6. Why attention won: the parallelism, measured
#
# Vaswani et al. (2017, §4 and Table 1) compare a self-attention layer with a recurrent and a
# convolutional layer on three counts, for a sequence of length $n$ and width $d$ (kernel width
# $k$; $r$ the size of the neighbourhood of a *restricted* self-attention, which looks only at
# the $r$ positions around each query):
#
# | layer | operations per layer | sequential operations | longest path between two positions |
# |---|---|---|---|
# | self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(\log_k n)$ (dilated), $O(n/k)$ (contiguous) |
# | self-attention, restricted | $O(r \cdot n \cdot d)$ | $O(1)$ | $O(n/r)$ |
#
# This section measures the first two rows.
#
# The recurrent layer must take its $n$ steps one after the other, because $h_t$ needs
# $h_{t-1}$; the attention layer does all its work in a handful of large matrix products, with
# no dependence between positions. In arithmetic, attention pays $n^2 d$ for the scores and the
# weighted sums where the recurrent layer pays $n d^2$ for its matrix-vector products. With the
# constants of our two layers: a GRU does $6\,n d^2$ multiply-adds per sequence (three gates,
# each with an input and a recurrent $d \times d$ matrix), that is $12\,n d^2$ floating-point
# operations (FLOPs), and multi-head attention $4\,n d^2 + 2\,n^2 d$ multiply-adds (four
# projections, then $QK^\top$ and the weighted sum), $8\,n d^2 + 4\,n^2 d$ FLOPs. Their ratio,
# $(4d + 2n)/(6d)$, passes 1 at $n = d$: attention does *more* arithmetic once $n$ exceeds $d$.
# Vaswani et al. argue that sentences usually have $n < d$, and that the sequential steps are
# what limits a GPU. Which effect wins on a given machine is a measurement: below, one `nn.GRU`
# layer against one `MultiHeadAttention` layer (the fast path, and the explicit one for shorter
# lengths), same batch and width, for growing $n$, forward alone and forward plus backward,
# timed with section 4's `interleaved_medians`.

# %%


def forward(layer: Callable[[Tensor], tuple], x: Tensor) -> Callable[[], object]:
    def call() -> object:
        with torch.no_grad():
            return layer(x)
    return call


def forward_backward(layer: Callable[[Tensor], tuple], x: Tensor) -> Callable[[], object]:
    return lambda: layer(x)[0].sum().backward()


cfg = run.timing


def explicit_limit(cfg: dict) -> int:
    """The longest length at which the explicit attention runs: ``cfg["explicit_max"]``, and on a GPU no
    more than fits six score-sized float32 tensors ``(B, h, n, n)`` (scores, weights, a causal mask's
    copies, the backward pass's temporaries) in half of the device's free memory."""
    limit = cfg["explicit_max"]
    free = None
    if run.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(run.device)
    elif run.device.type == "mps":
        free = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
    if free is not None:
        fits = [n for n in cfg["lengths"] if 6 * cfg["batch"] * cfg["heads"] * n * n * 4 <= free / 2]
        limit = min(limit, max(fits, default=cfg["lengths"][0]))
    return limit


explicit_max = explicit_limit(cfg)
torch.manual_seed(run.seed)
gru = nn.GRU(cfg["d_model"], cfg["d_model"], batch_first=True).to(run.device)
attention = MultiHeadAttention(cfg["d_model"], cfg["heads"]).to(run.device)
timings: dict[str, list[float]] = {}
quartiles: dict[str, list[tuple[float, float]]] = {}
for T in tqdm(cfg["lengths"], desc="sequence lengths"):
    x = torch.randn(cfg["batch"], T, cfg["d_model"], device=run.device)
    x_grad = x.clone().requires_grad_()
    fns = {"GRU forward": forward(gru, x), "attention forward": forward(attention, x),
           "GRU forward+backward": forward_backward(gru, x_grad),
           "attention forward+backward": forward_backward(attention, x_grad)}
    if T <= explicit_max:
        fns["explicit attention forward"] = forward(lambda inp: attention(inp, need_weights=True), x)
    # short runs are cheap and the most easily upset by a burst of load elsewhere: time them more often
    rounds = max(cfg["repeats"], min(50, cfg["repeats"] * 256 // T))
    measured = interleaved_medians(fns, rounds, warmup=1, device=run.device)
    for name in measured:
        timings.setdefault(name, []).append(measured[name])
        quartiles.setdefault(name, []).append(measured.detail[name].quartiles)

lengths = np.array(cfg["lengths"])
print(f"batch {cfg['batch']}, d_model {cfg['d_model']}, {cfg['heads']} heads, device {run.device}, "
      f"{torch.get_num_threads()} CPU thread(s), median of {cfg['repeats']} to 50 interleaved rounds (more for short "
      f"n); explicit attention up to n = {explicit_max}; milliseconds")
print(f"{'n':>6} " + " ".join(f"{name:>27}" for name in timings) + f" {'FLOPs attention/GRU':>20}")
for i, n in enumerate(lengths):
    flop_ratio = (8 * n * cfg["d_model"] ** 2 + 4 * n**2 * cfg["d_model"]) / (12 * n * cfg["d_model"] ** 2)
    cells = [f"{1e3 * t[i]:>27.2f}" if i < len(t) else f"{'-':>27}" for t in timings.values()]
    print(f"{n:>6} " + " ".join(cells) + f" {flop_ratio:>20.2f}")

# %% [markdown]
# The memory side of the same trade. For the backward pass, every layer keeps some of the
# tensors of its forward pass. How many bytes is a measurement too:
# `torch.autograd.graph.saved_tensors_hooks` sees every tensor that autograd saves, on any
# device, and we add up their sizes (each storage counted once, the layer's own parameters left
# out). For the explicit attention we also count, at its longest length, the saved tensors of
# shape `(..., n, n)`, in units of $B h n^2$ floats: how many score-sized tensors it keeps,
# without and with a causal mask.

# %%


def saved_for_backward(fn: Callable[[], object], params: list[Tensor], n: int) -> tuple[int, int]:
    """Bytes autograd saves while ``fn()`` runs (each storage once, ``params`` left out), and the bytes
    of the saved tensors whose last two dimensions are ``(n, n)``."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}
    square = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal square
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip and storage.data_ptr() not in storages:
            storages[storage.data_ptr()] = storage.nbytes()
            if tuple(t.shape[-2:]) == (n, n):
                square += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values()), square


B_, h_, d_ = cfg["batch"], cfg["heads"], cfg["d_model"]
memory: dict[str, list[float]] = {}
score_tensors: dict[str, float] = {}
for n in (int(n) for n in lengths):
    x = torch.randn(B_, n, d_, device=run.device, requires_grad=True)
    layers = {"GRU": (gru, {}), "attention (fast)": (attention, {})}
    if n <= explicit_max:
        layers["attention (explicit)"] = (attention, dict(need_weights=True))
        layers["explicit, causal"] = (attention, dict(causal=True, need_weights=True))
    for name, (layer, kwargs) in layers.items():
        total, square = saved_for_backward(partial(layer, x, **kwargs), list(layer.parameters()), n)
        memory.setdefault(name, []).append(total / 2**20)
        score_tensors[name] = square / (B_ * h_ * n**2 * 4)     # kept from the longest length each layer ran

print(f"saved for the backward pass, MiB (batch {B_}, width {d_}, {h_} heads, float32):")
print(f"{'n':>6} " + " ".join(f"{name:>21}" for name in memory) + f" {'B*h*n^2 floats':>15}")
for i, n in enumerate(lengths):
    cells = [f"{memory[name][i]:>21.2f}" if i < len(memory[name]) else f"{'-':>21}" for name in memory]
    print(f"{n:>6} " + " ".join(cells) + f" {B_ * h_ * int(n) ** 2 * 4 / 2**20:>15.2f}")
n_long = min(explicit_max, int(lengths[-1]))
print(f"(n, n) tensors saved at n = {n_long}, in units of B*h*n^2 floats (a bool tensor counts 1/4): "
      + ", ".join(f"{name} {score_tensors[name]:.2f}" for name in ("attention (explicit)", "explicit, causal"))
      + f"; at n = {lengths[-1]}: attention (fast) {score_tensors['attention (fast)']:.2f}")
per_unit = {name: memory[name][-1] * 2**20 / (4 * B_ * int(lengths[-1]) * d_) for name in ("GRU", "attention (fast)")}
crossover = (per_unit["GRU"] - per_unit["attention (fast)"]) * d_ / h_
print(f"floats kept per position and unit (B*n*d): GRU {per_unit['GRU']:.2f}, attention (fast) "
      f"{per_unit['attention (fast)']:.2f}; so the explicit attention's B*h*n^2 weights should make it pass the GRU "
      f"near n = (difference) * d/h = {crossover:.0f}")

fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
plot_curves({name: 1e3 * np.array(t) for name, t in timings.items()}, x=lengths, ax=axes[0], logy=True,
            title=f"One layer, batch {B_}, width {d_}, on {run.device.type}", xlabel="sequence length n",
            ylabel="milliseconds (median)")
axes[0].set_xscale("log", base=2)
plot_curves({name: values + [np.nan] * (len(lengths) - len(values)) for name, values in memory.items()},
            x=lengths, ax=axes[1], logy=True, title="Memory saved for the backward pass (measured)",
            xlabel="sequence length n", ylabel="MiB")
axes[1].set_xscale("log", base=2)
fig.tight_layout()
plt.show()


def slope(name: str, last: int = 3) -> float:
    """The exponent p in time ~ n^p, fitted on the last ``last`` lengths."""
    t = np.array(timings[name])
    return float(np.polyfit(np.log(lengths[-last:]), np.log(t[-last:]), 1)[0])


ratio = np.array(timings["attention forward"]) / np.array(timings["GRU forward"])
slower = [int(n) for n, r in zip(lengths, ratio, strict=True) if r > 1]
print(f"forward, attention time / GRU time: {dict(zip(lengths.tolist(), ratio.round(2).tolist(), strict=True))}")
for name in ("GRU forward", "attention forward"):
    per_position = 1e3 * np.array(timings[name]) / lengths
    print(f"{name}, milliseconds per position: "
          f"{dict(zip(lengths.tolist(), per_position.round(3).tolist(), strict=True))}")
print(f"growth on the longest lengths, time ~ n^p: GRU p = {slope('GRU forward'):.2f}, "
      f"attention p = {slope('attention forward'):.2f}")
ratio_fb = np.array(timings["attention forward+backward"]) / np.array(timings["GRU forward+backward"])
print(f"forward+backward, attention time / GRU time: "
      f"{dict(zip(lengths.tolist(), ratio_fb.round(2).tolist(), strict=True))}")
print(f"forward+backward, time ~ n^p: GRU p = {slope('GRU forward+backward'):.2f}, "
      f"attention p = {slope('attention forward+backward'):.2f}")
memory_slope = {name: float(np.polyfit(np.log(lengths[len(v) - 3:len(v)]), np.log(v[-3:]), 1)[0])
                for name, v in memory.items()}
print("saved memory ~ n^p on each layer's three longest lengths: "
      + ", ".join(f"{name} p = {p:.2f}" for name, p in memory_slope.items()))
first_over = next((int(n) for n, e, g in zip(lengths, memory["attention (explicit)"], memory["GRU"], strict=False)
                   if e > g), None)
print("saved memory, explicit attention above the GRU from n = "
      + (f"{first_over} (the length before it: {lengths[list(lengths).index(first_over) - 1]}); "
         f"predicted crossover n = {crossover:.0f}"
         if first_over else f"none of the lengths measured (predicted crossover n = {crossover:.0f})"))
spread_last = {name: (q[-1][1] - q[-1][0]) / timings[name][-1] for name, q in quartiles.items()
               if name in ("GRU forward", "attention forward")}
noise_last = max(spread_last.values())
verdict_last = ("within the timing noise" if abs(ratio[-1] - 1) <= noise_last
                else "larger than the timing noise")
print("forward: attention/GRU above 1 at n = " + (", ".join(map(str, slower)) if slower else "none")
      + f" (the longest n has {cfg['repeats']} rounds; there the interquartile range of the rounds is "
      + ", ".join(f"{100 * v:.0f}% of the median for {name}" for name, v in spread_last.items())
      + f": the ratio {ratio[-1]:.2f} at n = {int(lengths[-1])} is {verdict_last})")
if run.profile != "smoke":
    if run.device.type == "cpu":                      # wall-clock claims: asserted on the CPU, printed everywhere
        gru_growth = timings["GRU forward"][-1] / timings["GRU forward"][0]
        assert gru_growth > 0.25 * lengths[-1] / lengths[0], \
            f"the GRU's n sequential steps should make its time grow about linearly in n (grew {gru_growth:.1f}x)"
        assert ratio[0] < 1, "at the shortest length, attention (a few big products) should beat n GRU steps"
        explicit = timings["explicit attention forward"]
        assert explicit[-1] > 1.5 * timings["attention forward"][len(explicit) - 1], \
            "at its longest length the explicit attention, which stores the weights, should be far slower than the fast one"
        att_growth = timings["attention forward"][-1] / timings["attention forward"][0]
        assert att_growth > gru_growth and ratio[-1] > ratio[0], \
            "on a CPU, attention's time should grow faster than the GRU's, so its advantage shrinks with n"
        assert slope("attention forward") > slope("GRU forward") + 0.2, \
            "on a CPU, attention's fitted time exponent should exceed the GRU's"
        assert ratio_fb[-1] > ratio_fb[0], "forward+backward too, attention's advantage should shrink with n"
    assert memory_slope["attention (explicit)"] > 1.6 and memory_slope["GRU"] < 1.3, \
        "saved memory: quadratic for the explicit attention, linear for the GRU"
    assert first_over is not None, "the explicit attention's saved memory should pass the GRU's"
    assert first_over / 2 < crossover <= first_over, \
        f"the predicted crossover {crossover:.0f} should fall in the measured interval ({first_over // 2}, {first_over}]"
    assert 0.9 < score_tensors["attention (explicit)"] < 1.1 and score_tensors["explicit, causal"] > 1.9, \
        "the explicit attention keeps one score-sized tensor unmasked, two or more with a mask"
    if run.device.type in ("cpu", "cuda"):   # where F.scaled_dot_product_attention has a fused kernel for this call
        assert score_tensors["attention (fast)"] == 0 and memory_slope["attention (fast)"] < 1.3, \
            "the fast path keeps no (n, n) tensor: its saved memory is linear in n"

# %% [markdown]
# What the run shows (read the tables for your machine):
#
# * **The GRU's time grows with $n$, step by step**: its fitted exponent is near 1 and well below
#   attention's, and on a quiet machine its time per position (printed) is nearly the same at
#   every length, because it takes $n$ small steps, one after the other (on a busy machine both
#   jump about; the exponents are the robust part). That is Table 1's $O(n)$ sequential operations, which no
#   hardware can shorten.
# * **At short lengths attention is faster** (the ratio below 1): a few large matrix products
#   instead of $n$ small steps, so the sequential overhead disappears. This is the regime of
#   sentences, where Vaswani et al. argued ($n < d$).
# * **As $n$ grows, attention's advantage shrinks.** On a CPU its time grows faster than the
#   GRU's: compare the fitted exponents, where the GRU's is close to 1 and attention's clearly
#   above, because its $n^2 d$ term takes over (the FLOP column shows it doing more arithmetic
#   than the GRU once $n$ is past $d$, and a CPU, running here on the number of threads printed
#   above the table, has little parallel hardware to absorb the extra work). Whether it overtakes the GRU within the lengths measured depends on the machine,
#   the batch and the width, and a ratio near 1, measured over a few rounds on a shared machine,
#   does not settle it either way; the growth exponents are the robust part of the measurement.
#   On a GPU, whose thousands of cores sit mostly idle during each small GRU step, attention
#   should stay ahead to much longer sequences: run this notebook in the `gpu` profile to
#   measure it.
# * **Forward plus backward**: attention's advantage shrinks in the same way (its ratio rises
#   with $n$, its fitted exponent is the larger; the GRU's backward pass is again a loop over $n$
#   steps). Where, if anywhere, the ratio passes 1 is again a matter of the machine and of the
#   load on it: read the printed ratios of your run, and trust the exponents more than a single
#   ratio near 1.
# * **Memory, measured.** The explicit attention keeps one score-sized tensor for the backward
#   pass, the weights, $B h n^2$ floats (the softmax saves its output; the scores themselves are
#   freed), and with a causal mask two of them plus a boolean copy of the expanded mask (the
#   printed counts). Its saved memory grows quadratically (the fitted exponent), and it overtakes
#   the GRU's between the two lengths printed under the figure (the table, and the right panel).
#   Why there:
#   the GRU keeps a fixed number of floats per position and unit, $c\,B n d$, and the attention's
#   linear part, which is what its fast path keeps, is $c'\,B n d$ (both printed); the weights'
#   $B h n^2$ make up the difference at $n = (c - c')\,d/h$, the printed prediction. The
#   crossover is a multiple of $d/h$, the width of one head. The fast path keeps no score-sized
#   tensor at all (checked on the CPU; the same assert runs on CUDA, where
#   `F.scaled_dot_product_attention` also has a fused kernel for this call, but no committed run
#   has executed it there): only its inputs, its output and one number per query (the
#   softmax's log-normaliser), so its saved memory grows linearly, like the GRU's. At the lengths
#   measured here, time, not memory, is what grows faster than linearly for the attention the models use;
#   memory becomes the limit for the explicit version, which is why the models of the following
#   chapters train with the fast path and keep the explicit one for pictures.
#
# Table 1's third column is the one that matters for learning: in attention, any two positions
# are one step apart, so a gradient between them passes through one softmax, not through $n$
# Jacobians of a recurrence (chapter 01's vanishing gradients).
#
# ## 7. What the heads look at
#
# Attention weights can be read, and the next two experiments read them, on tasks where we know
# which word a head *should* find. The model is as small as this chapter allows: token
# embeddings plus a learned table of position vectors (self-attention alone cannot tell
# positions apart; chapter 06 treats positions properly), then two layers of multi-head
# self-attention, each added to its input (a *residual* connection, with a LayerNorm before the
# attention: chapter 07 explains both), and a linear classifier that reads the final vector at
# one position. No feed-forward layers: what the model computes between words, it computes
# with attention.

# %%


class AttentionClassifier(nn.Module):
    """Embeddings + learned positions, ``layers`` residual self-attention layers ``x <- x + MHA(LN(x))``,
    a final LayerNorm, and a linear classifier read at position ``where`` of each sentence.

    ``forward(src (B, L), token_mask (B, L), where (B,), need_weights) -> (logits (B, classes),
    [weights (B, h, L, L) or None per layer])``.
    """

    def __init__(self, vocab_size: int, classes: int, *, d_model: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.positions = nn.Embedding(max_len, d_model)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.attention = nn.ModuleList(MultiHeadAttention(d_model, heads) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.classify = nn.Linear(d_model, classes)

    def forward(self, src: Tensor, token_mask: Tensor, where: Tensor,
                need_weights: bool = False) -> tuple[Tensor, list[Tensor | None]]:
        x = self.embed(src) + self.positions(torch.arange(src.shape[1], device=src.device))
        mask, weights = padding_mask(token_mask), []
        for norm, attend in zip(self.norms, self.attention, strict=True):
            out, w = attend(norm(x), mask=mask, need_weights=need_weights)
            x = x + out
            weights.append(w)
        read = self.final_norm(x)[torch.arange(src.shape[0], device=src.device), where]
        return self.classify(read), weights


def batches(examples: list[dict], batch_size: int, shuffle: bool, seed: int = 0):
    """Padded batches ``(src, token_mask, where, label)`` of examples ``{"ids", "where", "label", ...}``."""
    order = list(range(len(examples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start:start + batch_size]]
        src, token_mask = pad_sequences([e["ids"] for e in chunk])
        yield (src, token_mask, torch.tensor([e["where"] for e in chunk]),
               torch.tensor([e["label"] for e in chunk]))


def train_classifier(vocab_size: int, train: list[dict], sizes: dict, max_len: int,
                     seed: int = run.seed) -> AttentionClassifier:
    """Adam on the cross-entropy; ``seed`` sets the initial weights and the order of the batches."""
    torch.manual_seed(seed)
    model = AttentionClassifier(vocab_size, 2, d_model=sizes["d_model"], heads=sizes["heads"],
                                layers=sizes["layers"], max_len=max_len)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loss_fn(m: nn.Module, batch) -> tuple[Tensor, int]:
        src, token_mask, where, label = batch
        logits, _ = m(src, token_mask, where)                  # the fast path: no weights while training
        return F.cross_entropy(logits, label), len(label)

    loader = [b for epoch in range(sizes["epochs"]) for b in batches(train, 64, True, seed=1000 * seed + epoch)]
    history = fit(model, loader, loss_fn, optimizer, epochs=1, device=run.device, verbose=False)
    steps = len(history.step_loss)
    assert steps == len(loader), "every run takes the same steps, in every profile"
    print(f"seed {seed}: trained {steps} of {len(loader)} steps ({sizes['epochs']} epoch(s)) in "
          f"{history.epochs[0]['seconds']:.0f} s on {run.device.type}")
    return model.eval()


@torch.no_grad()
def weights_and_predictions(model: AttentionClassifier, examples: list[dict]):
    """Per example: the predicted class and each layer's weights ``(h, L, L)`` (explicit path)."""
    out = []
    for src, token_mask, where, _ in batches(examples, 256, False):
        logits, weights = model(src.to(run.device), token_mask.to(run.device), where.to(run.device),
                                need_weights=True)
        for b in range(src.shape[0]):
            n = int(token_mask[b].sum())
            out.append((int(logits[b].argmax()), [w[b, :, :n, :n].cpu() for w in weights]))
    return out


# %% [markdown]
# ### 7a. Finding the subject
#
# Chapter 03's task: from an English sentence of the bundled corpus, predict the grammatical
# gender of the French subject (read off the French translation's first word: `le`, `un`, `ce`,
# `il` are masculine, `la`, `une`, `cette`, `elle` feminine). The answer is decided by one word,
# the subject's head noun (*the old **queen** that the dog sees ... → la*), which can stand
# anywhere among the first few words and is followed by up to fifty others, many of them nouns
# of the other gender. We prepend `<bos>` to every sentence and read the classifier at that
# position, as BERT does with its `[CLS]` token: the `<bos>` query has to go and find the
# subject.

# %%
MASCULINE, FEMININE = {"le", "un", "ce", "cet", "il"}, {"la", "une", "cette", "elle"}
english_nouns = {n.en for n in NOUNS} | {n.en_plural for n in NOUNS}
bundled_train, bundled_test = load_bundled("train"), load_bundled("test")
gender_vocab = Vocab.build(tokenize(en) for en, _ in bundled_train[: run.gender["pairs"]])


def gender_examples(pairs: list[tuple[str, str]]) -> list[dict]:
    out = []
    for en, fr in pairs:
        first, words = tokenize(fr)[0], tokenize(en)
        if first in MASCULINE or first in FEMININE:
            subject = 0 if words[0] in ("he", "she") else next(i for i, w in enumerate(words) if w in english_nouns)
            out.append(dict(ids=gender_vocab.encode(words, bos=True, eos=True), where=0,
                            label=int(first in FEMININE), words=["<bos>", *words, "<eos>"], subject=subject + 1))
    return out


gender_train = gender_examples(bundled_train[: run.gender["pairs"]])
gender_test = gender_examples(bundled_test[: run.gender["test"]])
gender_max_len = max(len(e["ids"]) for e in gender_train + gender_test)
print(f"{len(gender_train):,} training and {len(gender_test):,} test sentences, up to {gender_max_len} tokens; "
      f"{np.mean([e['label'] for e in gender_train]):.0%} feminine")
gender_model = train_classifier(len(gender_vocab), gender_train, run.gender, gender_max_len)

# %% [markdown]
# For each test sentence with a noun subject (not `he` or `she`, which sit at the first word),
# how much weight does the `<bos>` query of each head put on the subject's noun, and where does
# each head's largest weight fall?

# %%
gender_results = weights_and_predictions(gender_model, gender_test)
accuracy = np.mean([pred == e["label"] for (pred, _), e in zip(gender_results, gender_test, strict=True)])
layers_, heads_ = run.gender["layers"], run.gender["heads"]
on_subject = np.zeros((layers_, heads_))
peaks = [[Counter() for _ in range(heads_)] for _ in range(layers_)]
noun_subjects = 0
for (_, weights), e in zip(gender_results, gender_test, strict=True):
    if e["subject"] == 1 and e["words"][1] in ("he", "she"):
        continue
    noun_subjects += 1
    last = len(e["words"]) - 1
    for layer, w in enumerate(weights):
        on_subject[layer] += w[:, 0, e["subject"]].numpy()
        for head, top in enumerate(w[:, 0].argmax(-1).tolist()):
            where = {e["subject"] - 1: "the word before it", e["subject"] + 1: "the word after it",
                     e["subject"]: "subject", 0: "<bos>", last: "<eos>"}.get(top, "another word")
            peaks[layer][head][where] += 1
on_subject /= noun_subjects
uniform = np.mean([1 / len(e["words"]) for e in gender_test if e["words"][1] not in ("he", "she")])
print(f"test accuracy {accuracy:.1%} ({len(gender_test)} sentences); average sentence length "
      f"{np.mean([len(e['words']) for e in gender_test]):.1f} tokens, so uniform weights would put {uniform:.2f} "
      "on the subject")
for layer in range(layers_):
    for head in range(heads_):
        top = ", ".join(f"{k} {c / noun_subjects:.0%}" for k, c in peaks[layer][head].most_common(4))
        print(f"layer {layer + 1} head {head + 1}: weight of <bos> on the subject {on_subject[layer, head]:.2f}; "
              f"largest weight on: {top}")
top_on_subject = np.array([[peaks[layer][head]["subject"] / noun_subjects for head in range(heads_)]
                           for layer in range(layers_)])
if run.profile != "smoke":
    assert accuracy > 0.9, f"the classifier should find the subject's gender (accuracy {accuracy:.1%})"
    assert on_subject.max() > max(0.4, 5 * uniform), \
        "the best head's <bos> should put far more weight on the subject than uniform weights would"
    assert top_on_subject.max() > 0.4, "for the best head, the subject should often be the largest weight"

# %% [markdown]
# Two test sentences, each with a noun of the other gender after the subject (a distraction that
# a model reading "the last noun" or "any noun" would fall for): the weights of the `<bos>` query
# of every head.

# %%
noun_is_feminine = {n.en: n.feminine for n in NOUNS} | {n.en_plural: n.feminine for n in NOUNS}


def distracted_example(label: int) -> int:
    """A test sentence with a noun subject of gender ``label`` and a later noun of the other gender."""
    return next(i for i, e in enumerate(gender_test)
                if e["label"] == label and e["words"][1] not in ("he", "she") and 10 <= len(e["words"]) <= 16
                and any(noun_is_feminine.get(w) == (label == 0) for w in e["words"][e["subject"] + 1:]))


fig, axes = plt.subplots(1, 2, figsize=(16, 3.6))
for ax, index in zip(axes, (distracted_example(1), distracted_example(0)), strict=True):
    example, (prediction, example_weights) = gender_test[index], gender_results[index]
    rows = torch.stack([w[head, 0] for w in example_weights for head in range(heads_)])
    plot_heatmap(rows, ax=ax, x_labels=example["words"], vmin=0, vmax=1, colorbar=False,
                 y_labels=[f"layer {layer + 1} head {head + 1}" for layer in range(layers_) for head in range(heads_)],
                 title=f"subject '{example['words'][example['subject']]}', predicted "
                       f"{['masculine', 'feminine'][prediction]}", xlabel="English sentence", ylabel="head (query <bos>)")
fig.tight_layout()
plt.show()
for side, index in zip(("left", "right"), (distracted_example(1), distracted_example(0)), strict=True):
    example, (_, example_weights) = gender_test[index], gender_results[index]
    tops = [f"layer {layer + 1} head {head + 1} on '{example['words'][int(w[head, 0].argmax())]}' "
            f"({w[head, 0].max().item():.2f})" for layer, w in enumerate(example_weights) for head in range(heads_)]
    print(f"{side} panel (subject '{example['words'][example['subject']]}'), largest weight of each head: "
          + ", ".join(tops))

# %% [markdown]
# The printed statistics are the result, the pictures two instances of it. The model solves the
# task (the accuracy), and its heads do it the way we hoped: the `<bos>` query of the best head
# puts, on average, many times more weight on the subject's noun than uniform weights would (the
# printed level), and that noun is the head's single largest weight in a large share of the
# sentences (the printed shares), although the subject sits at a different position in each
# sentence and nouns of both genders follow it. Where a head's largest weight is not on the
# subject, read the shares: it falls mostly on a neighbour of the noun, and in this run the heads
# that miss the subject most often land more often on the word *after* it (usually the verb, or
# the *that* of a relative clause) than on the word before it; which neighbour, and how often, is
# a property of the training run, not of the task (section 7b trains several runs and shows how
# much such details vary). The two pictures are single sentences and need not look like the
# averages: the line printed under them names each head's largest weight, which is not always
# the subject or its neighbour (an adjective before the noun, or the article of a later noun).
# Does reading a neighbour help? Not in the first layer: there every key and value is
# its word's embedding plus its position and nothing else, so the vector of the word after the
# noun carries nothing of the noun itself (at most a statistical hint, if some words tend to
# follow nouns of one gender), and a first-layer head that reads it does not read the noun's
# gender there. In the second layer, a position's vector is its word *plus* what the first layer
# wrote into it, so a neighbour may by then carry the noun's gender; the shares cannot say
# whether it does. That is a first reason to read the heatmaps of deeper layers with care: a
# position's vector is no longer just its word. How the work is shared between the heads can
# change from one training run to another (section 7b trains several); that the best head finds
# the subject is what the asserts check.
#
# ### 7b. What does *it* refer to?
#
# The best-known picture of self-attention comes from the blog post that announced the
# Transformer (Uszkoreit 2017), and many tutorials retell it: in *"The animal didn't cross the
# street because it was too tired"* a head links *it* to *animal*, and to *street* when the
# sentence ends in *"too wide"* (or *"congested"*). (The paper's own pictures, Vaswani et al.
# 2017, Figures 3 to 5, show a long-distance dependency and the anaphora *its* → *Law*.) Whether
# *it* means the animal or the street is decided by the last word, and a translator needs the
# answer: French says *il* for *le chat* and *elle* for *la rue*, the example of that blog post
# too. We build that task from the bundled lexicon: an animal, a place, a template in either
# order (*the cat did not cross the street ...* or *the street was not crossed by the cat ...*),
# and an adjective that fits only one of the two nouns: one of the corpus's adjectives of animals
# (*tired*, *lazy*, *sad*, ...) or an adjective of places (*wide*, *busy*, *congested*, ...). The
# words the corpus lacks (printed below) are added, among them two places, *street* (*rue*) and
# *road* (*route*). The label is the French pronoun of the noun that *it* refers to. Optional
# adjectives before the nouns (*the old cat*) are distractors. Every gender combination occurs,
# so the model cannot answer from the sentence's genders alone: it must work out the referent.
# The two sentences of the picture are kept out of training.
#
# One training run gives one set of heads, and nothing in the loss asks two runs to agree on
# where they look, only on the answer. So we train the same model several times, from different
# random initial weights and batch orders (`run.coref["runs"]` seeds), and read all of them.

# %%
animals = [n for n in NOUNS if n.kind == "animal"]
places = [n for n in NOUNS if n.en in ("river", "bridge", "forest", "garden", "city", "village", "island", "market")]
places += [Noun("street", "streets", "rue", "rues", True, "place"), Noun("road", "roads", "route", "routes", True, "place")]
ANIMAL_ADJECTIVES = ["tired", "lazy", "sad", "angry", "young", "happy"]   # in the corpus: they describe animals
PLACE_ADJECTIVES = ["wide", "long", "busy", "crowded", "congested", "deep"]
DISTRACTORS = ["old", "small", "big", "black", "grey"]
HELD_OUT = ("the cat did not cross the street because it was too tired .",
            "the cat did not cross the street because it was too congested .")


def coreference_sentence(rng: random.Random) -> dict:
    animal, place = rng.choice(animals), rng.choice(places)
    refers_to_animal = rng.random() < 0.5
    adjective = rng.choice(ANIMAL_ADJECTIVES if refers_to_animal else PLACE_ADJECTIVES)
    a = ["the", *([rng.choice(DISTRACTORS)] if rng.random() < 0.3 else []), animal.en]
    p = ["the", *([rng.choice(DISTRACTORS)] if rng.random() < 0.3 else []), place.en]
    words = a + ["did", "not", "cross"] + p if rng.random() < 0.5 else p + ["was", "not", "crossed", "by"] + a
    words += ["because", "it", "was", *(["too"] if rng.random() < 0.7 else []), adjective, "."]
    referent = animal if refers_to_animal else place
    return dict(words=words, label=int(referent.feminine), where=words.index("it"), to_animal=refers_to_animal,
                animal=words.index(animal.en), place=words.index(place.en), adjective=words.index(adjective),
                same_gender=animal.feminine == place.feminine)


rng, seen = random.Random(run.seed), {}
while len(seen) < run.coref["train"] + run.coref["test"]:
    example = coreference_sentence(rng)
    key = " ".join(example["words"])
    if key not in HELD_OUT:
        seen.setdefault(key, example)
coref_data = list(seen.values())
coref_vocab = Vocab.build(e["words"] for e in coref_data)
for e in coref_data:
    e["ids"] = coref_vocab.encode(e["words"])
coref_train, coref_test = coref_data[: run.coref["train"]], coref_data[run.coref["train"]:]
new_words = sorted(set(coref_vocab.itos[4:]) - set(gender_vocab.itos))
print(f"{len(coref_train):,} training and {len(coref_test):,} test sentences; {len(coref_vocab) - 4} words, "
      f"of which not in the corpus: {', '.join(new_words)}")
print("for example:", " ".join(coref_train[0]["words"]), "->", ["il", "elle"][coref_train[0]["label"]])
coref_seeds = [run.seed + i for i in range(run.coref["runs"])]
coref_models = {seed: train_classifier(len(coref_vocab), coref_train, run.coref, max_len=20, seed=seed)
                for seed in coref_seeds}

# %% [markdown]
# Where does *it* look? For each run, layer and head: the average weight of the query at *it* on
# the animal, on the place, on the adjective that decides, and on the final period, separately
# for the sentences where *it* is the animal and those where it is the place; and, over all test
# sentences, the weight on the noun that is meant minus the weight on the other noun. We say a
# head *points at* the animal (or the place) when it puts more than 0.4 of its weight on it, on
# average, where it is meant, and less than 0.2 where it is not. Above each table, the accuracy
# on all test sentences and on those whose two nouns differ in gender (where the wrong noun gives
# the wrong pronoun).

# %%
TARGETS = ("animal", "place", "adjective", "'.'")
KINDS = ("animal", "place")                                 # what 'it' refers to; also TARGETS[0], TARGETS[1]
different = np.array([not e["same_gender"] for e in coref_test])
layers_, heads_ = run.coref["layers"], run.coref["heads"]
head_names = [f"layer {layer + 1} head {head + 1}" for layer in range(layers_) for head in range(heads_)]


def read_coreference(model: AttentionClassifier) -> dict:
    """The accuracies, and the mean weights ``(layers, heads, TARGETS)`` of the query at 'it', over the test
    sentences where 'it' is the animal and over those where it is the place."""
    results = weights_and_predictions(model, coref_test)
    correct = np.array([pred == e["label"] for (pred, _), e in zip(results, coref_test, strict=True)])
    looks = {kind: np.zeros((layers_, heads_, len(TARGETS))) for kind in KINDS}
    count = Counter()
    for (_, weights), e in zip(results, coref_test, strict=True):
        kind = "animal" if e["to_animal"] else "place"
        count[kind] += 1
        positions = [e["animal"], e["place"], e["adjective"], len(e["words"]) - 1]
        for layer, w in enumerate(weights):
            looks[kind][layer] += w[:, e["where"], positions].numpy()
    looks = {kind: v / count[kind] for kind, v in looks.items()}
    meant_minus_other = sum(count[kind] * (looks[kind][..., i] - looks[kind][..., 1 - i])
                            for i, kind in enumerate(KINDS)) / len(coref_test)             # (layers, heads)
    pointers: dict[str, list[str]] = {}       # head -> the nouns it points at: read when meant, not otherwise
    for i, kind in enumerate(KINDS):
        points = (looks[kind][..., i] > 0.4) & (looks[KINDS[1 - i]][..., i] < 0.2)
        for layer, head in zip(*np.nonzero(points), strict=True):
            pointers.setdefault(head_names[layer * heads_ + head], []).append(kind)
    pointers = dict(sorted(pointers.items()))
    return dict(accuracy=correct.mean(), accuracy_different=correct[different].mean(), count=count,
                looks=looks, meant_minus_other=meant_minus_other, pointers=pointers)


readings = {seed: read_coreference(model) for seed, model in coref_models.items()}
for seed, r in readings.items():
    print(f"seed {seed}: accuracy {r['accuracy']:.1%} on all {len(coref_test):,} test sentences, "
          f"{r['accuracy_different']:.1%} on the {different.sum():,} whose nouns differ in gender")
    cases = [f"when it = the {kind} ({r['count'][kind]:,})" for kind in KINDS]
    print(f"{'':>16} " + " | ".join(f"{case:^35}" for case in cases) + " |")
    print(f"{'query at it on:':>16} " + " | ".join(" ".join(f"{t:>8}" for t in TARGETS) for _ in KINDS)
          + " | meant - other")
    for layer in range(layers_):
        for head in range(heads_):
            print(f"{head_names[layer * heads_ + head]:>16} " + " | ".join(
                " ".join(f"{x:>8.2f}" for x in r["looks"][kind][layer, head]) for kind in KINDS)
                + f" | {r['meant_minus_other'][layer, head]:>+13.2f}")
    pointing = ", ".join(f"{name} ({' and '.join(kinds)})" for name, kinds in r["pointers"].items())
    print(f"{'':>16} heads that point at the noun meant, and only then: {pointing or 'none'}\n")
preference = {seed: r["meant_minus_other"].mean() for seed, r in readings.items()}
print("meant - other, averaged over all layers and heads: "
      + ", ".join(f"seed {seed} {p:+.3f}" for seed, p in preference.items())
      + f"; over the runs {np.mean(list(preference.values())):+.3f}")
if run.profile != "smoke":
    for seed, r in readings.items():
        assert r["accuracy_different"] > 0.9, f"seed {seed}: the model should resolve 'it' when the genders differ"
    assert np.mean(list(preference.values())) > 0.02, \
        "taken together, the heads at 'it' should look more at the noun meant than at the other"

# %% [markdown]
# Now the two sentences of the famous picture, which no run has seen. Each row of panels is one
# run; each panel shows, for every layer and head, the weights of the query at *it*.

# %%
iconic = [dict(words=s.split(), where=s.split().index("it"), label=0) for s in HELD_OUT]
for e in iconic:
    e["ids"] = coref_vocab.encode(e["words"])
fig, axes = plt.subplots(len(coref_models), 2, figsize=(16, (0.35 * layers_ * heads_ + 2.2) * len(coref_models)),
                         squeeze=False)
iconic_predictions = {}
for row, (seed, model) in zip(axes, coref_models.items(), strict=True):
    results = weights_and_predictions(model, iconic)
    iconic_predictions[seed] = [["il", "elle"][prediction] for prediction, _ in results]
    for ax, e, (prediction, weights) in zip(row, iconic, results, strict=True):
        rows = torch.stack([w[head, e["where"]] for w in weights for head in range(heads_)])
        plot_heatmap(rows, ax=ax, x_labels=e["words"], y_labels=head_names, vmin=0, vmax=1, colorbar=False,
                     title=f"seed {seed}: ... too {e['words'][-2]}: 'it' -> {['il', 'elle'][prediction]}",
                     xlabel="English sentence", ylabel="head (query at 'it')")
fig.tight_layout()
plt.show()
print("predicted pronoun for (too tired, too congested): "
      + ", ".join(f"seed {seed} {tuple(p)}" for seed, p in iconic_predictions.items()))
if run.profile != "smoke":
    assert all(p == ["il", "elle"] for p in iconic_predictions.values()), \
        "every run: tired cat -> il, congested street -> elle"

# %% [markdown]
# One more fact the reading below needs: where *it* stands. Its position depends on the template
# (the animal first, *... did not cross ...*, or the place first, *... was not crossed by ...*)
# and on the optional adjectives, so the test sentences put it at a few different positions:

# %%
it_positions = Counter((e["where"], "animal first" if e["animal"] < e["place"] else "place first") for e in coref_test)
print(f"{'position of it':>15} {'animal first':>13} {'place first':>12} {'share':>7}")
for where in sorted({w for w, _ in it_positions}):
    a, p = it_positions[(where, "animal first")], it_positions[(where, "place first")]
    print(f"{where:>15} {a:>13,} {p:>12,} {(a + p) / len(coref_test):>7.0%}")
only_one = [w for w in sorted({w for w, _ in it_positions})
            if 0 in (it_positions[(w, "animal first")], it_positions[(w, "place first")])]
print(f"positions that occur in one template only: {only_one}")
assert len({w for w, _ in it_positions}) > 1, "'it' stands at more than one position"

# %% [markdown]
# What the runs show. The asserts check the first two points on any machine; the rest is for
# you to read in the tables and the figure, and may look different in your run:
#
# * **Every run resolves *it***, on new sentences and whatever the genders (the accuracies), and
#   on the two sentences of the picture: *il* for the tired cat, *elle* for the congested street.
# * **Taken together, the heads at *it* look more at the noun that is meant than at the other**
#   (the last line: the difference averaged over all layers and heads, and over the runs, is
#   positive). In that sense the famous picture is right: the weights at *it* carry the referent.
#   How much varies from run to run (the per-run values, and section 7c's three more runs):
#   nothing in the loss asks for it, so it need not be large.
# * **Where, and how sharply, is each run's own.** Compare the runs' tables, their lists of
#   pointing heads and their rows of panels. A run may have a head that points at both nouns,
#   each when it is meant: the blog post's picture. It may have heads that point at one of the
#   nouns only, and look somewhere that adds little (the period, say) when the other is meant,
#   because another head has already read that one: a default and an override. Or no single head
#   may point clearly, the lookup being spread over several heads, or done in the first layer.
# * **Even the first layer can choose.** Its query at *it* is made from the word *it* and its
#   position only. That is not one query for every sentence: *it* stands at several positions
#   (the table above), and some of them occur in one template only, so the position alone tells
#   the first layer something about the word order (for example, whether the animal came first).
#   Still, the query does not see the adjective that decides. Its weights change with the
#   sentence because the keys do: a query that matches the keys of place adjectives strongly, and
#   those of animals less, reads the adjective when it is a place's and the animal otherwise: the
#   softmax makes the positions compete, and that competition is already a conditional lookup.
#   The second layer's query at *it* can hold the adjective itself and choose directly. The
#   column `meant - other` shows, run by run, which layer did the choosing.
# * **So a heatmap shows where one layer of one run read, not how the model decided.** The two
#   sentences get the same answer from every run, with pictures that need not agree. Jain and
#   Wallace (2019) showed that different weights can give the same prediction, and Michel et al.
#   (2019) that many heads of a trained Transformer can be removed at test time with little loss.
#   And heads find whatever the training data make useful, which need not be the referent:
#   this data set mixes all gender combinations, and the accuracy is reported separately on the
#   sentences whose nouns differ in gender, for a reason question 8 asks you to work out.
#
# ### 7c. How many heads?
#
# Section 4 claimed that heads give each query several distributions at the price of one wide
# head's parameters. Does that buy anything on this task? Vaswani et al. (2017, Table 3, rows A)
# varied the number of heads at a fixed model width (English-German, development set): one head
# was 0.9 BLEU worse than eight, 16 heads matched eight, and 32 fell back by 0.4 ("quality also
# drops off with too many heads"). Here is the same experiment, small: the model of section 7b
# trained with 1, 2, 4 and 8 heads at the same width (so each head is narrower as $h$ grows), the
# same data and steps, each from `run.coref["head_runs"]` random initialisations (more than section
# 7b's runs, which are reused: on a task this easy the differences between head counts are of
# the size of the differences between runs, so a single run per setting would decide nothing),
# scored by the accuracy and the cross-entropy on the test sentences. Then the price: one
# training step of each model, timed.

# %%


@torch.no_grad()
def test_loss_and_accuracy(model: AttentionClassifier, examples: list[dict]) -> tuple[float, float]:
    """Mean cross-entropy and accuracy on ``examples``."""
    loss, correct = 0.0, 0
    for src, token_mask, where, label in batches(examples, 256, False):
        logits, _ = model(src.to(run.device), token_mask.to(run.device), where.to(run.device))
        loss += F.cross_entropy(logits, label.to(run.device), reduction="sum").item()
        correct += int((logits.argmax(-1).cpu() == label).sum())
    return loss / len(examples), correct / len(examples)


head_counts = [h for h in (1, 2, 4, 8) if run.coref["d_model"] % h == 0]
head_seeds = [run.seed + i for i in range(run.coref["head_runs"])]       # section 7b's seeds come first
by_heads: dict[int, list[tuple[float, float]]] = {}
more_models: dict[int, AttentionClassifier] = {}
for h in head_counts:
    for seed in head_seeds:
        reuse = h == run.coref["heads"] and seed in coref_models
        model = coref_models[seed] if reuse else train_classifier(
            len(coref_vocab), coref_train, dict(run.coref, heads=h), max_len=20, seed=seed)
        by_heads.setdefault(h, []).append(test_loss_and_accuracy(model, coref_test))
        if h == run.coref["heads"] and not reuse:
            more_models[seed] = model                      # section 7b's model, from more seeds
print(f"d_model {run.coref['d_model']}, {run.coref['layers']} layers, {run.coref['epochs']} epochs, "
      f"seeds {head_seeds}; per head count: every run's test accuracy and test loss")
print(f"{'heads':>5} {'d_k':>4} {'accuracy (each run)':>50} {'test loss (each run)':>44} {'median loss':>12}")
for h, rows in by_heads.items():
    accs = " ".join(f"{a:.2%}" for _, a in rows)
    losses = " ".join(f"{loss:.4f}" for loss, _ in rows)
    print(f"{h:>5} {run.coref['d_model'] // h:>4} {accs:>50} {losses:>44} {np.median([r[0] for r in rows]):>12.4f}")
median_loss = {h: float(np.median([r[0] for r in rows])) for h, rows in by_heads.items()}
worst = {h: max(r[0] for r in rows) for h, rows in by_heads.items()}
below_100 = {h: sum(a < 1 for _, a in rows) for h, rows in by_heads.items()}
print("runs below 100% test accuracy: " + ", ".join(f"{h} head(s) {n} of {len(head_seeds)}" for h, n in below_100.items()))
print(f"lowest median test loss: {min(median_loss, key=median_loss.get)} head(s); highest median: "
      f"{max(median_loss, key=median_loss.get)} head(s); highest single run: {max(worst, key=worst.get)} head(s)")
# the same runs as median [min, max] over the seeds, and each head count against one head, paired by seed
head_loss = SeedResults(head_seeds, {f"{h} head(s)": [r[0] for r in rows] for h, rows in by_heads.items()})
head_acc = SeedResults(head_seeds, {f"{h} head(s)": [r[1] for r in rows] for h, rows in by_heads.items()})
for name in head_loss.names:
    print(f"  {name:10s} test loss {head_loss.summary(name, '.4f'):28s} accuracy {head_acc.summary(name, '.2%')}")
for name in head_loss.names[1:]:
    print(f"  {head_loss.verdict(name, head_loss.names[0], better='lower', fmt='.4f')}")
# section 7b's reading of the query at 'it', on every run with its number of heads
all_readings = readings | {seed: read_coreference(m) for seed, m in more_models.items()}
print(f"section 7b's model ({run.coref['heads']} heads), every run: meant - other averaged over all layers and heads, "
      "and the heads that point at the noun meant:")
for seed, r in all_readings.items():
    pointing = ", ".join(f"{name} ({' and '.join(kinds)})" for name, kinds in r["pointers"].items())
    print(f"  seed {seed}: accuracy {r['accuracy_different']:.1%} (nouns differ), meant - other "
          f"{r['meant_minus_other'].mean():+.3f}; pointing: {pointing or 'none'}")
if run.profile != "smoke":
    assert all(r["meant_minus_other"].mean() > 0 for r in all_readings.values()), \
        "in every run, the heads at 'it' together look more at the noun meant than at the other"

# what grows with h: the (B, h, L, L) weights and their softmax. One training step (forward, backward,
# Adam) of a fresh model per head count, on one batch of 64 sentences, timed in turns on the device
step_batch = [t.to(run.device) for t in next(batches(coref_train, 64, False))]


def training_step(model: AttentionClassifier, optimizer: torch.optim.Optimizer) -> Callable[[], object]:
    def step() -> None:
        src, token_mask, where, label = step_batch
        optimizer.zero_grad()
        F.cross_entropy(model(src, token_mask, where)[0], label).backward()
        optimizer.step()
    return step


torch.manual_seed(run.seed)
step_models = {h: AttentionClassifier(len(coref_vocab), 2, d_model=run.coref["d_model"], heads=h,
                                      layers=run.coref["layers"], max_len=20).to(run.device) for h in head_counts}
step_times = interleaved_medians({f"{h} head(s)": training_step(m, torch.optim.Adam(m.parameters(), lr=3e-3))
                                  for h, m in step_models.items()}, repeats=30, device=run.device)
print("one training step, batch 64 (weights per sentence of 20 tokens: "
      + ", ".join(f"{h} head(s) {run.coref['layers'] * h * 20 * 20:,}" for h in head_counts) + ")")
print(step_times)
fastest = {name: step_times.detail[name].min for name in step_times}   # the least disturbed round of each
print("fastest round, relative to one head: " + ", ".join(
    f"{name} {fastest[name] / fastest['1 head(s)']:.2f}x" for name in fastest)
      + f" (weights tensor: up to {max(head_counts)}x)")
if run.profile != "smoke":
    assert all(a > 0.95 for rows in by_heads.values() for _, a in rows), \
        "every run, whatever its number of heads, should resolve 'it' on nearly every test sentence"

fig, ax = plt.subplots(figsize=(7, 4))
plot_over_seeds({"test loss": {h: [r[0] for r in rows] for h, rows in by_heads.items()}}, ax=ax, logy=True,
                title="What 'it' refers to: test loss by number of heads (median, range, every run)",
                xlabel="heads (same d_model)", ylabel="test cross-entropy")
ax.set_xscale("log", base=2)
ax.set_xticks(head_counts, [str(h) for h in head_counts])
ax.minorticks_off()
plt.show()

# %% [markdown]
# Read the table and the figure, run by run. With one head the losses spread over more than
# two orders of magnitude: some runs do as well as any, others much worse, so one head has the
# highest median loss, the worst single run and the lowest accuracies (the printed counts of runs
# below 100% and the accuracy ranges say how many and how far). With two heads or more the
# losses stay within a much narrower band and every run is within a fraction of a percent of
# 100%.
# Paired by seed (the verdict lines under the medians), more heads usually end with a lower loss
# than one head from the same seed, but not always: in the `cpu` run two and eight heads do for
# every seed and four heads for five of six, and where one head solves the task the paired
# differences are tiny (the medians of the differences are about a thousandth). So "more heads
# are better" is not asserted; what is asserted, for every run of every head count, is that
# the task is solved (above 95% test accuracy).
# What one head lacks here is reliability, not ability: a one-head run *can* solve the task as
# well as any, but within the same number of steps it often does not. More heads than two do not
# improve further (the medians beyond two differ by less than the runs do): the task needs a
# query at *it* to find a couple of words, and two heads per layer already give it two
# distributions. Six runs per setting (eight in the `gpu` profile) are what make this readable: three seeds could land on
# one head's good runs or on its bad ones. Read the differences between head counts against the
# spread between runs, not as single numbers. (A seed fixes the weights, the data and the order
# of the batches, not every rounding: a rerun on another machine, or with another number of
# threads, can move these runs' last digits and, where a run is near a threshold, a count.)
#
# The extra runs with section 7b's number of heads also test 7b's reading on more seeds (the
# lines printed after the table). Every run resolves *it*, and in every run the heads at *it*,
# taken together, look more at the noun meant than at the other (the sign of `meant - other`,
# asserted), by amounts that differ severalfold between runs. Which heads point, and whether any
# does by the rule of section 7b, is each run's own: one of the new runs has no pointing head at
# all, and another has one of its pointers in the first layer.
#
# The price of more heads is the weights tensor (the printed counts per sentence of 20 tokens,
# both layers) and its softmax. The step times show what that costs on your machine. Read the
# fastest rounds (the `min ms` column, and the line under the table): on a shared machine the
# rounds of one step can fall into two groups, a quiet one and one slowed by other work, and
# the median can land in either, so the medians may measure the load more than the step. At 20 tokens the
# projections, the same for every $h$, are a large part of the work, so the fastest step grows
# far more slowly than the number of weights (the printed ratios against one head, and the
# weights' up to eightfold growth; section 6's memory table shows where the weights start to
# count). That is the shape of
# Vaswani et al.'s Table 3(A) on a much smaller scale: too few heads hurt (here, by making a run
# less reliable), and beyond some number more heads do not help. (Question 8 asks how to find
# which heads a trained model actually uses.)
#
# ## Summary
#
# * Self-attention computes, for every position at once,
#   $Z = \operatorname{softmax}(QK^\top/\sqrt{d_k})\,V$ with $Q$, $K$, $V$ three projections of the
#   same sequence: $z_t = \sum_s \alpha_{ts} v_s$, a weighted sum over the key index $s$
#   (checked against a loop).
# * **The scale**: for unit-variance entries $\operatorname{Var}(q \cdot k) = d_k$ (measured);
#   unscaled scores saturate the softmax (largest weight towards 1, entropy towards 0), and the
#   gradient reaching the scores collapses as $d_k$ grows. The gradient reaching the *queries*
#   falls only for wide heads: at $d_k = 64$ the unscaled query gets more gradient, because
#   $\partial e/\partial q = k$ is $\sqrt{d_k}$ times larger. What the scale fixes at that width
#   is the temperature: without it a fresh head starts sharp, at random, and how sharp depends on
#   $d_k$ (at $d_k = 64$ the unscaled query's gradient is 2.4 to 3.7 times the scaled one over
#   six random draws, printed as median [min, max]). How sharp a real layer starts also depends
#   on its initialisation (`nn.Linear`'s default gives query entries of variance about 1/3,
#   Xavier on the book's square projections about 1, measured; PyTorch's packed $(3d, d)$
#   projection about 1/2).
# * **Masks** are `bool`, `True` = may attend, broadcast against `(B, h, T, S)`: padding
#   `(B, 1, 1, S)`, causal `(T, S)`, combined with `&`; or floating, added to the scores
#   ($0$ / $-\infty$, or any bias), the third convention, which PyTorch's functions share.
#   Filling with $-\infty$ turns a query that may see nothing into NaN, which spreads to every
#   output and every gradient, and in float16 the popular $-10^9$ fill *is* $-\infty$; the
#   package's masked softmax returns zeros. The causal mask was verified by the Jacobian: exactly
#   zero dependence on later inputs, and on padded ones.
# * **Multi-head** attention is one projection per kind, cut into $h$ slices and made a batch
#   axis by a reshape and a transpose: equal to a loop over heads, faster, and with
#   $4(d^2_{\text{model}} + d_{\text{model}})$ parameters whatever $h$; the weights tensor and its
#   softmax grow with $h$. On the *it* task (section 7c, six runs per setting in the `cpu` run, every run printed),
#   one head made the runs unreliable (losses spread over two orders of magnitude and the lowest
#   accuracies, though some runs were as good as any), two or more heads solved it more evenly,
#   with no clear gain beyond two: differences of the size of the run-to-run spread.
# * The **fast** attention (`F.scaled_dot_product_attention`) equals the explicit one, and our
#   layer equals `nn.MultiheadAttention` with copied weights, forward and backward, under every
#   mask, to float32 rounding; PyTorch's layer reads `bool` masks the opposite way (`True` =
#   hidden), and returns NaN where ours returns zeros. Which kernel runs is PyTorch's choice
#   among its backends (`sdpa_kernel` shows it): on CUDA, FlashAttention needs half precision and
#   no mask, so this book's float32 calls would run the memory-efficient kernel there.
# * **GRU against attention** (section 6's tables): the GRU's time grows about linearly with
#   $n$, its $n$ sequential steps; attention is faster on short sequences, and on a CPU its
#   advantage shrinks as $n$ grows (its time exponent is the larger), because of its $n^2 d$
#   arithmetic. Memory, measured with `saved_tensors_hooks`: the explicit attention keeps
#   $B h n^2$ floats for the backward pass (twice that and a bool copy with a mask), quadratic in
#   $n$; the fast path and the GRU keep memory linear in $n$.
# * **Heads on sentences**: the `<bos>` heads found the subject whose gender decides a French
#   article. For *it*, every run resolved the referent, and the heads at *it*, taken together,
#   looked more at the noun meant than at the other (every run); which head does it, in which
#   layer, how sharply, and whether any single head does, is left to each run (compare the
#   runs). Attention maps show where a layer read, not the whole of how a model decided.
#
# ## Exercises
#
# ### Questions
#
# 1. Suppose the entries of $q$ have variance $\sigma_q^2$ and those of $k$ variance $\sigma_k^2$
#    (still independent, mean 0). What is $\operatorname{Var}(q \cdot k)$, and which scale makes it
#    1? With `nn.Linear`'s default initialisation section 2 found $\sigma_q^2 \approx 1/3$: why
#    does the layer still divide by $\sqrt{d_k}$ alone, and not by $\sigma_q \sigma_k \sqrt{d_k}$?
#    Why is $\sqrt{d_k}$ the right *dependence* on the width?
# 2. The scale could be learned (a "temperature" per head), or folded into $W^Q$. Why do both give
#    the same set of functions as the fixed scale, and why does the fixed scale still help?
# 3. $h$ heads of width $d_{\text{model}}/h$ have the same parameters as one head of width
#    $d_{\text{model}}$. Name something $h$ heads can compute that one head cannot (think of one
#    query that needs two words), and something one wide head can do that narrow heads cannot
#    (the rank of $W_i^Q {W_i^K}^\top$).
# 4. Why test causality with gradients rather than by checking that the weights above the
#    diagonal are zero? Give a bug that zero weights would miss.
# 5. A query that may see nothing returns a zero vector. Is that a sensible output? What does the
#    residual connection $x + \operatorname{MHA}(x)$ of section 7 make of it?
# 6. Section 6 has three crossover lengths: in arithmetic (the FLOP ratio passes 1 at $n = d$),
#    in time (where the measured attention / GRU ratio passes 1) and in saved memory
#    ($n = (c - c')\,d/h$). Predict how the FLOP crossover moves if you double
#    $d_{\text{model}}$, and whether the time ratio at a fixed $n$ should follow it. Then measure
#    the time ratio at two or three widths (change `run.timing`), and say what a GPU would change.
# 7. FlashAttention computes the softmax over a row of keys one block at a time. Show that
#    keeping a running maximum $m$ and a running sum $\ell = \sum \exp(e - m)$ lets you combine
#    two blocks exactly. What does the explicit version give you that the fused one cannot?
# 8. Train section 7b's model only on sentences whose two nouns differ in gender. Which shortcut
#    could a last-layer head take (hint: look at the *other* noun), why would the accuracy not
#    reveal it, and which test sentences would? How would you measure, in the style of Michel et
#    al. (2019), which heads the classifier actually needs (remove one head's output at test
#    time and measure the accuracy)?
#
# ### Coding exercises
#
# Fill in each function and run the cell: the checker says "correct!", tells you what is wrong,
# or, while the stub still raises `NotImplementedError`, gives a hint. Solutions are in
# `notebooks/solutions/05_scaled_dot_product_and_multihead_solutions.ipynb`.
#
# **1. Two blocks of keys, merged exactly (question 7 as code).** A kernel that never stores the
# whole row of scores processes the keys one block at a time. For one block and each query row
# it keeps three things: `m`, the largest score in the block, `(R,)`; `l`, the sum of
# $\exp(e_s - m)$ over the block's keys, `(R,)`; and `o`, the block's own attention output
# $\sum_s \exp(e_s - m)\, v_s / l$, `(R, d_v)`. A block whose keys are all hidden from a row has
# `m = -inf`, `l = 0` and `o = 0` there. Given the triples of two blocks, return the triple of
# the two blocks together, so that its `o` is exactly softmax attention over all their keys.
# It must work in float32 when the two blocks' scores are a thousand apart, and give
# `(-inf, 0, 0)`, not NaN, for a row hidden in both blocks.

# %%
def merge_blocks(m1: Tensor, l1: Tensor, o1: Tensor,
                 m2: Tensor, l2: Tensor, o2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Blocks 1 and 2: ``m`` ``(R,)``, ``l`` ``(R,)``, ``o`` ``(R, d_v)`` each. Return the triple
    ``(m, l, o)`` of both blocks together (a row hidden in both: ``(-inf, 0, 0)``)."""
    raise NotImplementedError  # your code here


exercises.check("05.merge_blocks", merge_blocks)

# %% [markdown]
# **2. Find the leak in a black box.** `future_leaks(layer, T, d)` gets a layer that maps one
# sequence `(1, T, d)` to `(1, T, d)` and is meant to be causal. Return a `bool` tensor `(T, T)`
# that is `True` at `(t, s)` exactly where the output at position `t` depends on the input at a
# *later* position `s > t` (for some input). The layers run as a deployed model does, without
# gradients, so section 4's Jacobian sees nothing. The checker hands you a correct layer and
# several with planted bugs: some have attention weights that are exactly zero above the
# diagonal, one leaks only for some inputs, and one leaks by about $10^{-9}$.

# %%
def future_leaks(layer: Callable[[Tensor], Tensor], T: int, d: int) -> Tensor:
    """``layer``: ``(1, T, d)`` -> ``(1, T, d)``, float64, no gradients. Return ``(T, T)`` bool, True at
    ``(t, s)`` where output ``t`` depends on input ``s > t``; False on and below the diagonal."""
    raise NotImplementedError  # your code here


exercises.check("05.find_the_leak", future_leaks)

# %% [markdown]
# **3. A left-padded causal batch.** Decoders often pad a batch on the *left*, so that every
# sentence ends in the last column and the next word of all of them is written in the same
# place. `token_mask` is `(B, T)`, `False` at the pads (on the left) and `True` at the real
# tokens. Return `(mask, positions)`: `mask`, a `bool` tensor `(B, 1, T, T)`, `True` where a
# query may attend to a key (a real query sees the real keys up to itself; a padded query sees
# nothing); and `positions`, an integer tensor `(B, T)` of position indices for a table of
# learned positions, chosen so that every sentence gets the same outputs as it would alone,
# unpadded (pads get 0).

# %%
def left_padded_causal(token_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``token_mask`` ``(B, T)`` bool, pads on the left. Return ``(mask (B, 1, T, T) bool,
    positions (B, T) int64)``."""
    raise NotImplementedError  # your code here


exercises.check("05.left_padded_causal", left_padded_causal)

# %% [markdown]
# ## References
#
# * A. Vaswani, N. Shazeer, N. Parmar, J. Uszkoreit, L. Jones, A. N. Gomez, Ł. Kaiser,
#   I. Polosukhin (2017). *Attention is all you need.* NeurIPS. Scaled dot-product attention
#   (§3.2.1, with footnote 4 on the variance of $q \cdot k$), multi-head attention (§3.2.2), the
#   masks of the decoder (§3.2.3), why self-attention (§4 and Table 1), varying the number of
#   heads (§6.2, Table 3 rows A), attention pictures (Figures 3 to 5).
# * J. Uszkoreit (2017). *Transformer: a novel neural network architecture for language
#   understanding.* Google Research blog, 31 August 2017. The *animal / street / it* picture and
#   why a translation into French needs it.
# * M.-T. Luong, H. Pham, C. D. Manning (2015). *Effective approaches to attention-based neural
#   machine translation.* EMNLP. The dot and general scores (§3.1).
# * D. Britz, A. Goldie, M.-T. Luong, Q. Le (2017). *Massive exploration of neural machine
#   translation architectures.* EMNLP. Additive against multiplicative attention at several
#   widths (§4.5).
# * M. Milakov, N. Gimelshein (2018). *Online normalizer calculation for softmax.* arXiv:1805.02867.
#   The running maximum and running sum that compute a softmax's normaliser in one pass over
#   its inputs (§3, Algorithm 3); FlashAttention cites it for its running softmax (exercise 1,
#   question 7).
# * M. N. Rabe, C. Staats (2021). *Self-attention does not need $O(n^2)$ memory.* arXiv:2112.05682.
#   Attention over chunks of keys with a running maximum (§2, §3); the idea behind the
#   memory-efficient kernels.
# * PyTorch documentation: `torch.nn.functional.scaled_dot_product_attention` (the backends and
#   their input limitations, and the reference code whose `is_causal` is the top-left triangle),
#   `torch.nn.attention.sdpa_kernel` and `SDPBackend`, `torch.nn.attention.bias.causal_lower_right`
#   (the bottom-right alignment), `torch.autograd.graph.saved_tensors_hooks` (what section 6 uses
#   to measure memory); and PyTorch's source,
#   `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`, for which CUDA backend takes which
#   call (flash: float16 or bfloat16 and no `attn_mask`).
# * T. Dao, D. Y. Fu, S. Ermon, A. Rudra, C. Ré (2022). *FlashAttention: fast and memory-efficient
#   exact attention with IO-awareness.* NeurIPS. Tiling and recomputation with a running softmax
#   (§3.1, Algorithm 1), its memory traffic (§3.2).
# * P. Michel, O. Levy, G. Neubig (2019). *Are sixteen heads really better than one?* NeurIPS.
#   Removing one head at test time (§3.1), all heads of a layer but one (§3.2), pruning by head
#   importance (§4).
# * E. Voita, D. Talbot, F. Moiseev, R. Sennrich, I. Titov (2019). *Analyzing multi-head
#   self-attention: specialized heads do the heavy lifting, the rest can be pruned.* ACL. Which
#   heads matter (§4), positional, syntactic and rare-word heads (§5), pruning heads (§6).
# * K. Clark, U. Khandelwal, O. Levy, C. D. Manning (2019). *What does BERT look at? An analysis
#   of BERT's attention.* BlackboxNLP. Heads that attend to `[CLS]`, `[SEP]` and punctuation
#   (§3), heads that track syntax and coreference (§4).
# * S. Jain, B. C. Wallace (2019). *Attention is not explanation.* NAACL. Different weights,
#   same predictions (§4.2).

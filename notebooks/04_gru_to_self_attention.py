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
# # 04 · From the GRU to self-attention
#
# Chapter 01 ended with a formula: the state of a GRU is a weighted sum of every candidate
# vector it has proposed, $h_t = \sum_{i \le t} w_{t,i} \odot \tilde h_i$, with weights that sum
# to $1 - \prod_j z_j$ rather than to one (the rest belongs to the initial state). Chapter 03 showed a
# decoder that computes its weights over a sentence afresh at every step, and a sentence that
# attends over its own GRU states. This chapter connects the two ends. It starts from the GRU and
# changes one thing at a time until what is left is the self-attention layer of the
# Transformer:
#
# | step | change | what it buys | what it costs |
# |---|---|---|---|
# | 1 | the GRU, unrolled | (nothing: the same function, written as a weighted sum) | |
# | 2 | free the weights: a softmax over positions instead of products of gates | weights chosen when they are needed, by content | one weight per position instead of one per unit; every candidate kept, $O(T^2 d)$ work against the GRU's $O(T d^2)$ |
# | 3 | free the candidates: $\tilde h_i$ from $x_i$ alone | every position computed at once; any position reaches any other in one step | the candidate no longer sees the past |
# | 4 | separate queries, keys and values | "found by" and "delivers" become different vectors | three maps to learn instead of one |
# | 5 | several heads, concatenated, and an output projection | several weightings at once (the GRU had one per unit) | each head is narrower, $d_{\text{model}} / h$ |
# | 6 | drop causality | every position sees the whole sequence | no use as a left-to-right predictor |
# | 7 | add positions, each vector its own | order | a learned table ends at its last position (chapter 06) |
# | 8 | a position-wise feed-forward network after attention | a non-linear function of what was retrieved | parameters and work at every position |
#
# ![Eight small panels, one per step of the table: the GRU's candidates chained and weighted by products of gates; softmax weights; candidates from x_i alone; separate keys and values; two heads; no causal mask; positions added to the inputs; an FFN after attention](figures/04_derivation_steps.svg)
#
# *Each panel draws the output $h_t$ of position $t = 3$ and what it reads: watch the chain between candidates disappear (step 3), keys and values split (step 4), the masked future position join (step 6), and positions (step 7) and the FFN (step 8) arrive.*
#
# Every step is a cell you can run, with a check. Where two forms must compute the same
# function (the GRU and its weighted sum; a loop over positions and its parallel version; heads
# computed by a reshape and by a loop), the cell checks that they agree to rounding error.
# These checks use tiny tensors in float64 and run on the CPU whatever the device, so that
# "agree" can mean 1e-12; the timing of step 3 and the training runs at the end use the
# device `setup()` chose.
# Where a step changes the function, a cell measures what changed. At the end the whole layer is
# written out in one class and trained side by side with a GRU on small synthetic tasks chosen
# to show what each step buys and what it loses.
#
# **It assumes** chapter 01 (the GRU, its gates, the unrolled form and `tfmlib.rnn`) and
# chapter 03 (attention weights from a softmax over scores, the masked softmax, Luong's dot and
# general scores, Lin et al.'s self-attentive embedding). The code of this chapter stays in the
# notebook on purpose: it is written for reading, one equation per line. Chapter 05 turns it
# into the fast, scaled, tested operation that the package `tfmlib.attention` holds.
#
# Notation: $x_t$ is the input at position $t$, $z_t$ the GRU's update gate (in PyTorch's
# convention, $z$ near 1 *keeps* the old state), $\tilde h_t$ its candidate (chapter 01 called it
# $n_t$, `gates.n`). Positions run $1 \dots T$ in the formulas and $0 \dots T-1$ in the code.

# %%
from __future__ import annotations  # lets the classes below name themselves in type hints

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.plot import plot_curves, plot_heatmap, plot_over_seeds
from tfmlib.rnn import GRUCellScratch, GRUScratch, unrolled_gru_state, unrolled_gru_weights
from tfmlib.rnn_attention import GeneralScore, masked_softmax
from tfmlib.seeds import over_seeds
from tfmlib.timing import interleaved_medians
from tfmlib.train import fit

run = setup(
    seed=0,
    smoke=dict(timing_lengths=[8, 32], timing_repeats=1, d_model=16, heads=4, d_ff=32,
               steps=dict(recall=20, order=20, tagging=10, xor=20, band=20, parity=20),
               batch_size=16, lr=3e-3, test_size=200, seeds=2),
    cpu=dict(timing_lengths=[16, 64, 256, 1024], timing_repeats=9, d_model=32, heads=4, d_ff=64,
             steps=dict(recall=600, order=400, tagging=200, xor=400, band=400, parity=400),
             batch_size=64, lr=3e-3, test_size=2_000, seeds=3),
    # The experiments compare models at one small budget; more training would change what they
    # measure, so the gpu profile keeps the cpu profile's sizes and spends the device on seeds
    # (5 instead of 3), on longer timing sequences and on larger test sets. Every run stops by its
    # step count (no time cap). Measured on one H100 on 2026-11-26, five notebooks sharing it, at
    # the older sizes (600 steps per run, one seed): 1.1-2.5 s per training run, 55.8 s for the
    # whole notebook, about 30 s of it outside the 14 runs. Here: 5 seeds x (2 x 600 + 9 x 400 +
    # 3 x 200) steps = 27,000 steps at 1.8-4.2 ms = 50-115 s, plus about 30 s: 80-145 s alone.
    gpu=dict(timing_lengths=[16, 64, 256, 1024, 4096], timing_repeats=10, d_model=32, heads=4, d_ff=64,
             steps=dict(recall=600, order=400, tagging=200, xor=400, band=400, parity=400),
             batch_size=64, lr=3e-3, test_size=10_000, seeds=5),
)


def causal_mask(T: int, device: torch.device | str | None = None) -> Tensor:
    """``(T, T)`` bool, True where position ``t`` (row) may look at position ``i`` (column): ``i <= t``."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


# %% [markdown]
# ## 1. The GRU, unrolled at every step
#
# Chapter 01 substituted the GRU's last line, $h_t = (1 - z_t) \odot \tilde h_t + z_t \odot
# h_{t-1}$, into itself until only the candidates were left:
#
# $$h_t = w_{t,0} \odot h_0 + \sum_{i=1}^{t} w_{t,i} \odot \tilde h_i, \qquad
#   w_{t,i} = (1 - z_i) \odot \prod_{j=i+1}^{t} z_j, \qquad w_{t,0} = \prod_{j=1}^{t} z_j .$$
#
# Chapter 01 checked this for the last state. Here we need it for **every** $t$, because a
# sequence model outputs a state at every position: the weights form a $T \times T$ table per
# hidden unit, with $w_{t,i} = 0$ for $i > t$ (a state cannot contain a candidate that has not
# been proposed yet). We start, as usual, from $h_0 = 0$, so the $h_0$ term vanishes and the
# weights of the candidates sum to $1 - w_{t,0} = 1 - \prod_{j \le t} z_j$.
#
# We reuse chapter 01's `GRUScratch` (which returns the gates $z_t$ and candidates $\tilde h_t$
# of a run) and `unrolled_gru_weights` (the weights of the last state of a run), applied to
# every prefix $x_1, \dots, x_t$ of the sequence.

# %%
torch.manual_seed(run.seed)
I, H, B, T = 8, 16, 4, 12
gru = GRUScratch(I, H).double()
x = torch.randn(B, T, I, dtype=torch.double)
with torch.no_grad():
    states, _, gates = gru(x, return_gates=True)      # h_0 = 0; states[:, t] is the state after x_t
z, candidates = gates.z, gates.n                        # (B, T, H) each


def gru_weight_matrix(z: Tensor) -> Tensor:
    """Update gates ``(B, T, H)`` -> ``(B, T, T, H)``: entry ``[b, t, i, u]`` is the weight of candidate
    ``i`` in unit ``u`` of state ``t`` (zero for ``i > t``). ``h_0 = 0``, so its weight is dropped."""
    B, T, H = z.shape
    W = z.new_zeros(B, T, T, H)
    for t in range(T):
        W[:, t, : t + 1] = unrolled_gru_weights(z[:, : t + 1])[:, 1:]    # row 0 weighs h_0
    return W


W_gru = gru_weight_matrix(z)
h_weighted = torch.einsum("btih,bih->bth", W_gru, candidates)           # sum_i w_{t,i} * h~_i, per unit
err_sum = (h_weighted - states).abs().max().item()
err_package = max((unrolled_gru_state(z[:, : t + 1], candidates[:, : t + 1], torch.zeros_like(states[:, 0]))
                   - states[:, t]).abs().max().item() for t in range(T))
err_mass = (W_gru.sum(dim=2) - (1 - z.cumprod(dim=1))).abs().max().item()
print(f"every state as a weighted sum of candidates: max |error| = {err_sum:.1e}")
print(f"the same with chapter 01's unrolled_gru_state:  max |error| = {err_package:.1e}")
print(f"weights of the candidates sum to 1 - prod z:    max |error| = {err_mass:.1e}")
assert err_sum < 1e-12 and err_package < 1e-12, "the unrolled GRU must reproduce every state"
assert err_mass < 1e-12, "the candidates' weights sum to 1 - prod_j z_j when h_0 = 0"
assert torch.all(W_gru.permute(0, 3, 1, 2).triu(diagonal=1) == 0), "no state may weigh a future candidate"

# %% [markdown]
# The table of weights of one hidden unit looks like an attention matrix already: row $t$ says
# how much state $t$ draws from each candidate $i$, and everything above the diagonal is zero.

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
spread = W_gru[0, -1].std(dim=0)                        # the units least uniform over positions
for ax, u in zip(axes[:2], spread.argsort(descending=True)[:2].tolist(), strict=True):
    plot_heatmap(W_gru[0, :, :, u], ax=ax, vmin=0, vmax=1, title=f"GRU weights w[t, i], unit {u}",
                 xlabel="candidate i", ylabel="state t")
plot_heatmap(W_gru[0].mean(dim=-1), ax=axes[2], vmin=0, vmax=1, title="GRU weights, mean over units",
             xlabel="candidate i", ylabel="state t")
fig.tight_layout()
plt.show()

# %% [markdown]
# Two things distinguish these tables from attention, and steps 2 and 3 remove them one at a
# time. The **weights** come from products of gates, written down as the sequence is read.
# And the **candidates** $\tilde h_i = \tanh(W x_i + b + r_i \odot (U h_{i-1} + b'))$ read the
# previous state, so they can only be computed one after another.
#
# ## 2. Free the weights
#
# Write the weighted sum as its own function, taking any weights: one number per pair
# $(t, i)$, or one per pair and hidden unit as in the GRU. Whatever it is given above the
# diagonal, it uses only $i \le t$:
#
# $$h_t = \sum_{i \le t} a_{t,i} \odot v_i .$$
#
# **The check that must hold.** Given the GRU's own weights and its own candidates, this
# function must reproduce the GRU's states exactly: the causal weighted-sum form checked against
# the GRU it came from.

# %%
def causal_weighted_sum(weights: Tensor, values: Tensor) -> Tensor:
    """``h_t = sum_{i <= t} weights[t, i] * values[i]``.

    ``weights`` is ``(B, T, T)`` (one number per pair ``(t, i)``) or ``(B, T, T, H)`` (one per hidden
    unit); ``values`` is ``(B, T, H)``. Entries above the diagonal (``i > t``) are ignored.
    """
    T = values.shape[1]
    if weights.dim() == 3:
        weights = weights[..., None]                     # the same weight for every unit
    weights = weights * causal_mask(T, values.device)[None, :, :, None]
    return (weights * values[:, None, :, :]).sum(dim=2)


garbage_above = W_gru + torch.rand(B, T, T, 1, dtype=torch.double).triu(diagonal=1)  # junk where i > t
err_must_agree = (causal_weighted_sum(W_gru, candidates) - states).abs().max().item()
err_junk = (causal_weighted_sum(garbage_above, candidates) - states).abs().max().item()
print(f"weighted-sum form with the GRU's weights and candidates vs the GRU: max |error| = {err_must_agree:.1e}")
print(f"... with junk written above the diagonal:                          max |error| = {err_junk:.1e}")
assert err_must_agree < 1e-12 and err_junk < 1e-12, "the causal form must reproduce the GRU it came from"

# %% [markdown]
# **Why free them.** Look at how the GRU's weights change from one step to the next. Going
# from $h_t$ to $h_{t+1}$ multiplies every old weight by the same gate,
# $w_{t+1,i} = z_{t+1} \odot w_{t,i}$ for all $i \le t$. So the *proportions* among past
# candidates are frozen the moment they are written: if the GRU gave candidate 2 twice the
# weight of candidate 5 in some unit at step 5, it does so at step 6, 7 and forever. Whether an
# old word matters more than another can never be revised by what comes later; the GRU must
# decide what to keep *before it knows the question*. The next cell checks this numerically.
#
# The step that frees the weights replaces the products of gates by a **softmax over positions**
# of a learned score, computed when the state is needed:
#
# $$\alpha_{t,i} = \frac{\exp(s_{t,i})}{\sum_{j \le t} \exp(s_{t,j})}, \qquad
#   s_{t,i} = q_t^\top \tilde h_i,\ \ q_t = W_q x_t, \qquad h_t = \sum_{i \le t} \alpha_{t,i}\, \tilde h_i .$$
#
# The score is a dot product, as in chapter 03, between a query computed from the current input
# and each stored candidate. The candidates are still the GRU's, each computed from $x_i$ and the
# previous state $h_{i-1}$, which is now the attention-weighted state. This model keeps every
# candidate it has made and re-weighs all of them at every step; Cheng, Dong and Lapata (2016)
# built a reader of this kind on an LSTM (the LSTMN).

# %%
class FreeWeights(nn.Module):
    """Step 2: GRU candidates, weighted by a softmax over positions instead of by gates.

    ``h~_t`` is the GRU candidate from ``(x_t, h_{t-1})`` (the cell's update gate is computed and not
    used); ``alpha_{t,i} = softmax_{i<=t}(q_t . h~_i)`` with ``q_t = W_q x_t``; ``h_t = sum_{i<=t} alpha_{t,i} h~_i``.
    ``forward(x (B, T, I)) -> (states (B, T, H), candidates (B, T, H), alpha (B, T, T))``.
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = GRUCellScratch(input_size, hidden_size)    # for its candidate
        self.W_q = nn.Linear(input_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x.shape
        h = x.new_zeros(B, self.cell.hidden_size)
        cands, states, rows = [], [], []
        for t in range(T):                                     # still a loop: h~_t needs h_{t-1}
            _, step = self.cell.step(x[:, t], h)
            cands.append(step.n)
            C = torch.stack(cands, dim=1)                      # (B, t+1, H): every candidate so far
            alpha = torch.softmax(torch.einsum("bh,bih->bi", self.W_q(x[:, t]), C), dim=-1)
            h = torch.einsum("bi,bih->bh", alpha, C)
            states.append(h)
            rows.append(F.pad(alpha, (0, T - t - 1)))          # zeros for the future
        return torch.stack(states, 1), torch.stack(cands, 1), torch.stack(rows, 1)


torch.manual_seed(run.seed)
free = FreeWeights(I, H).double()
with torch.no_grad():
    free_states, free_cands, alpha = free(x)

# the GRU: every old weight is scaled by the same gate, w[t+1, i] = z[t+1] * w[t, i] for all i <= t
lower = causal_mask(T - 1)[None, :, :, None].expand(B, T - 1, T - 1, H)
ratio_gru = W_gru[:, 1:, :-1] / W_gru[:, :-1, :-1].clamp_min(1e-300)
frozen_gru = (ratio_gru - z[:, 1:, None, :])[lower].abs().max().item()
# the softmax: alpha[t+1, i] / alpha[t, i] for i <= t, and how much it varies over i
ratio_free = (alpha[:, 1:, :-1] / alpha[:, :-1, :-1].clamp_min(1e-300))
row_spread = [ratio_free[b, t, : t + 1].std().item() for b in range(B) for t in range(1, T - 1)]
print(f"GRU:           max |w[t+1, i] / w[t, i] - z[t+1]| over all i <= t = {frozen_gru:.1e}  (proportions frozen)")
print(f"free weights:  alpha[t+1, i] / alpha[t, i] varies over i: mean std {np.mean(row_spread):.2f}"
      "  (proportions revised at every step)")
err_free = (causal_weighted_sum(alpha, free_cands) - free_states).abs().max().item()
print(f"free weights: each row sums to 1 (max |sum - 1| = {(alpha.sum(-1) - 1).abs().max().item():.1e}); "
      f"states = causal_weighted_sum(alpha, candidates) (max |error| = {err_free:.1e})")
assert frozen_gru < 1e-9, "in a GRU, step t+1 rescales every old weight by the same gate"
assert np.mean(row_spread) > 0.05, "softmax weights re-rank the past at every step"
assert torch.allclose(alpha.sum(-1), torch.ones(B, T, dtype=torch.double)) and err_free < 1e-12, \
    "softmax rows sum to 1, and the states are their weighted sums of the candidates"

# %% [markdown]
# **What is gained.** The proportions are no longer frozen (the ratio test above): at every
# step the score $q_t^\top \tilde h_i$ decides afresh, from the current input and the stored
# candidates, which of them to read. A candidate far back needs no chain of gates held open
# to survive; its weight is one softmax entry. And the weights of the candidates sum to exactly
# 1 (the GRU's summed to $1 - \prod z$, the rest belonging to $h_0$). There is no recurrence in
# the weights any more, only in the candidates.
#
# **What is lost.** The GRU had one weighting per **hidden unit**; the softmax has one per
# **position**, shared by all units. In the GRU above, the units of the last state spread their
# weight over the positions in different ways (we measure how different by the total variation
# distance between the weights of two units, normalised to sum to one); under a single softmax
# row every unit gets the same weights:

# %%
last = W_gru[:, -1] / W_gru[:, -1].sum(dim=1, keepdim=True)       # (B, T, H): each unit's weights, as a distribution
tv = 0.5 * (last[:, :, :, None] - last[:, :, None, :]).abs().sum(dim=1)  # (B, H, H): between units u and u'
tv_mean = (tv.sum(dim=(1, 2)) / (H * (H - 1))).mean().item()
print(f"last GRU state: two of its units weigh the positions differently by {tv_mean:.2f} on average "
      f"(total variation distance, 0 = identical, 1 = disjoint); two units under one softmax row: 0")
assert tv_mean > 0.05, "a GRU's units weigh the positions differently"

# %% [markdown]
# Step 5 gets part of this back with several *heads*, each with its own weights. The price of
# freedom is also paid in memory and time: the model keeps every candidate and, at step $t$,
# scores all $t$ of them and sums them, $O(t\,d)$ work for candidates of width $d$. A sequence
# then costs $O(T^2 d)$ for the weights and sums, where the GRU's cost is its matrix products
# with $d \times d$ weights at each of $T$ steps, $O(T d^2)$. Which is larger depends on whether
# the length $T$ exceeds the width $d$: this is the per-layer comparison of Vaswani et al. (2017,
# Table 1), and at the widths and lengths of most sentences attention is the cheaper one. The
# memory grows the same way: every candidate is kept, $O(T d)$, against the GRU's one state of
# $d$ numbers. And it is still a loop: $\tilde h_t$ needs $h_{t-1}$.
#
# ## 3. Free the candidates
#
# The candidate $\tilde h_i$ reads $h_{i-1}$, so position $i$ cannot be computed before
# position $i-1$. Make it a function of $x_i$ alone. The GRU's own candidate already contains
# one: with its reset gate closed ($r_i = 0$), $\tilde h_i = \tanh(W x_i + b)$. With that
# candidate, nothing in the layer depends on a previous step, and the whole sequence is four
# matrix products and a softmax:
#
# $$\tilde H = \tanh(X W^\top + b), \quad Q = X W_q^\top, \quad S = Q \tilde H^\top \ (S_{t,i} = q_t^\top \tilde h_i), \quad
#   A = \operatorname{softmax}_{\text{rows}}(S \text{ masked to } i \le t), \quad H = A \tilde H ,$$
#
# where row $t$ of $X$ is $x_t^\top$ (and likewise for $\tilde H$, $Q$ and $H$).
#
# The mask is chapter 03's `masked_softmax` with the lower triangle as the mask. A check that
# must hold: computed position by position, the way step 2 ran, the layer gives the same states.

# %%
class FreeCandidates(nn.Module):
    """Step 3: candidates from ``x_i`` alone, ``h~_i = tanh(W x_i + b)`` (a GRU candidate with its reset
    gate at 0), weighted by ``softmax_{i<=t}(q_t . h~_i)``. ``forward`` does all positions at once;
    ``loop`` does one position at a time. Both return ``(states (B, T, H), alpha (B, T, T))``."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.candidate = nn.Linear(input_size, hidden_size)
        self.W_q = nn.Linear(input_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        C = torch.tanh(self.candidate(x))                     # (B, T, H): every candidate at once
        scores = self.W_q(x) @ C.transpose(1, 2)              # (B, T, T): scores[b, t, i] = q_t . h~_i
        alpha = masked_softmax(scores, causal_mask(x.shape[1], x.device))
        return alpha @ C, alpha

    def loop(self, x: Tensor) -> tuple[Tensor, Tensor]:
        T = x.shape[1]
        states, rows = [], []
        for t in range(T):
            C = torch.tanh(self.candidate(x[:, : t + 1]))    # the candidates up to t
            alpha = torch.softmax(torch.einsum("bh,bih->bi", self.W_q(x[:, t]), C), dim=-1)
            states.append(torch.einsum("bi,bih->bh", alpha, C))
            rows.append(F.pad(alpha, (0, T - t - 1)))
        return torch.stack(states, 1), torch.stack(rows, 1)


torch.manual_seed(run.seed)
fc = FreeCandidates(I, H).double()
with torch.no_grad():
    par_states, par_alpha = fc(x)
    loop_states, loop_alpha = fc.loop(x)
err_parallel = max((par_states - loop_states).abs().max().item(), (par_alpha - loop_alpha).abs().max().item())
print(f"all positions at once vs one position at a time: max |error| = {err_parallel:.1e}")
assert err_parallel < 1e-12, "the parallel form must compute what the loop computes"

# %% [markdown]
# **What it buys: no sequential dependency, and short paths.** A GRU must run $T$ steps one
# after another; the parallel form runs one batch of matrix products whose size grows with $T$.
# And any position reaches any other in one step: the longest path a signal travels between
# two positions is $O(1)$ operations, against the GRU's $O(T)$, where whatever position 1 wrote
# must survive $T$ gated updates to reach position $T$. Vaswani et al. (2017, §4 and Table 1)
# give this path length, beside the total work per layer and the number of sequential
# operations, as a reason to prefer self-attention for long-range dependencies; chapter 05
# shows their whole table.
#
# What it costs in arithmetic, counted for this chapter's layers with inputs and states of
# width $d$: `nn.GRU` does about $6\,T d^2$ multiply-adds per sequence (three gates, each with an
# input and a recurrent $d \times d$ matrix), `FreeCandidates` about $2\,T d^2$ for the candidates
# and queries plus $2\,T^2 d$ for the scores and the weighted sum. The ratio is $(T + d) / 3d$,
# below 1 while $T < 2d$. We time a forward pass of the two at width $d = 64$ on sequences of
# growing length, so the break-even of the arithmetic falls at $T = 128$, inside the range
# timed; beside them, chapter 01's `GRUScratch`, the same GRU as a Python loop, shows how much of
# a loop's cost on this device is the interpreter rather than arithmetic. The package's
# `interleaved_medians` times them (`tfmlib.timing`, introduced in chapter 01): it waits for the
# device before and after every call, warms up, lets the three take turns so that a busy
# machine disturbs them more alike, and keeps the median of the rounds; the cell prints each median
# with its first and third quartiles, so that a row disturbed in some of its rounds shows as a
# wide bracket (a machine slowed throughout does not show in the brackets at all). (Chapter 05
# measures this properly, with backward passes and memory; here it is a first look.) On a GPU,
# the longest lengths are kept only if the $T \times T$ scores fit comfortably in the device's
# free memory.

# %%
torch.manual_seed(run.seed)
D, timing_batch = 64, 8
loop_gru, fused_gru = GRUScratch(D, D).to(run.device), nn.GRU(D, D, batch_first=True).to(run.device)
parallel = FreeCandidates(D, D).to(run.device)
timing_lengths = list(run.timing_lengths)
if run.device.type == "cuda":          # scores, weights and their products: a few (B, T, T) fp32 tensors
    free_bytes, _ = torch.cuda.mem_get_info(run.device)
    timing_lengths = [T_len for T_len in timing_lengths if 8 * timing_batch * T_len**2 * 4 < free_bytes / 4]
timings = {"nn.GRU (fused loop)": [], "free candidates (parallel)": [], "GRU, Python loop": []}
quartiles = {name: [] for name in timings}                 # (q1, q3) in ms: the spread over the rounds
with torch.no_grad():
    for T_len in tqdm(timing_lengths, desc="lengths"):
        xs = torch.randn(timing_batch, T_len, D, device=run.device)
        t = interleaved_medians({name: (lambda layer_=layer_, xs=xs: layer_(xs))
                                 for name, layer_ in zip(timings, (fused_gru, parallel, loop_gru), strict=True)},
                                repeats=run.timing_repeats, warmup=1, device=run.device)
        for name in timings:
            timings[name].append(t.ms(name))
            quartiles[name].append(tuple(1e3 * q for q in t.detail[name].quartiles))
print(f"median [first quartile, third quartile] of {t.repeats} interleaved rounds on {t.device}, "
      f"{run.threads} thread(s), in ms")
arithmetic = {T_len: (2 * T_len * D**2 + 2 * T_len**2 * D) / (6 * T_len * D**2) for T_len in timing_lengths}
print(f"{'length T':>9s} " + " ".join(f"{name:>28s}" for name in timings)
      + "   parallel / nn.GRU: time, multiply-adds")
for k, T_len in enumerate(timing_lengths):
    print(f"{T_len:>9d} " + " ".join(f"{timings[name][k]:>9.2f} [{quartiles[name][k][0]:7.2f}, "
                                     f"{quartiles[name][k][1]:7.2f}]" for name in timings)
          + f"   {timings['free candidates (parallel)'][k] / timings['nn.GRU (fused loop)'][k]:>8.2f}x"
          + f" {arithmetic[T_len]:>8.2f}x")
print(f"sequential steps per sequence: nn.GRU and the Python loop T, the parallel form 1; "
      f"the arithmetic breaks even at T = 2d = {2 * D}")
ax = plot_curves(timings, x=timing_lengths, logy=True,
                 title=f"Forward pass, batch {timing_batch}, width {D}, on {run.device.type}",
                 xlabel="sequence length T (log scale)", ylabel="time (ms, log scale)")
for line, name in zip(ax.get_lines(), timings, strict=True):   # the quartile brackets the table prints
    medians, (q1s, q3s) = np.array(timings[name]), np.array(quartiles[name]).T
    ax.errorbar(timing_lengths, medians, yerr=[medians - q1s, q3s - medians], fmt="none",
                ecolor=line.get_color(), capsize=3, lw=1)
ax.set_xscale("log")
ax.set_xticks(timing_lengths, [str(T_len) for T_len in timing_lengths])   # the lengths timed
ax.xaxis.set_minor_locator(plt.NullLocator())
plt.show()
lengths_ratio = timing_lengths[-1] / timing_lengths[0]
loop_growth = {name: timings[name][-1] / timings[name][0] for name in ("nn.GRU (fused loop)", "GRU, Python loop")}
last_step = {name: t_[-1] / t_[-2] for name, t_ in timings.items()}
beats_fused = [T_len for par, fused, T_len in zip(timings["free candidates (parallel)"],
                                                  timings["nn.GRU (fused loop)"], timing_lengths, strict=True)
               if par < fused]
print(f"length x{lengths_ratio:.0f}: time x{loop_growth['nn.GRU (fused loop)']:.0f} for nn.GRU, "
      f"x{loop_growth['GRU, Python loop']:.0f} for the Python loop")
print(f"the parallel form is faster than nn.GRU at T = {beats_fused}")
par_q, gru_q = quartiles["free candidates (parallel)"], quartiles["nn.GRU (fused loop)"]
print(f"beyond the spread (one's third quartile below the other's first): the parallel form faster at T = "
      f"{[T_len for T_len, p, g in zip(timing_lengths, par_q, gru_q, strict=True) if p[1] < g[0]]}, "
      f"slower at T = {[T_len for T_len, p, g in zip(timing_lengths, par_q, gru_q, strict=True) if p[0] > g[1]]}")
print(f"last row / the row before (length x{timing_lengths[-1] / timing_lengths[-2]:.0f}): "
      + ", ".join(f"{name} x{g:.1f}" for name, g in last_step.items()))
if run.device.type == "cpu" and run.profile != "smoke":   # what the text below claims, on a CPU
    assert loop_growth["GRU, Python loop"] > lengths_ratio / 4, "a loop over positions takes time proportional to T"
    assert timings["free candidates (parallel)"][-1] > timings["nn.GRU (fused loop)"][-1], \
        "on a CPU, at the longest length (several times the GRU's arithmetic), the parallel form should be slower"
    assert last_step["free candidates (parallel)"] > last_step["nn.GRU (fused loop)"], \
        "on a CPU, the parallel form's T^2 work should grow faster than the GRU's T steps"

# %% [markdown]
# Read the last two columns together, and the brackets beside each median. Against the fused
# `nn.GRU`, the parallel form is not faster in general: it does less arithmetic while $T < 2d$
# and more beyond. The times need not cross where the arithmetic does, at $T = 2d = 128$. In
# the `cpu` run printed here, beyond the spread (the line "beyond the spread", a rule of thumb:
# one's quartile bracket entirely below the other's, not a statistical test), the parallel
# form was faster at $T = 16$ and slower at 1024. At $T = 64$ its median was lower (time ratio
# 0.39x), but the brackets overlap (its third quartile, 6.25 ms, is above the first quartile of
# `nn.GRU`, 4.91 ms); at $T = 256$, where it does 1.67 times the GRU's arithmetic, its median
# was 13% higher (1.13x) and the brackets overlap again. So in this run the medians cross
# between 64 and 256, where the arithmetic does, but the rows at 64 and 256 are ties within
# their spread: this run does not place the crossing more precisely than between 16 and 1024.
# The chapter's previous `cpu` run (its committed outputs before this one) printed 0.78x at 64
# and 0.97x at 256: it agrees at 64 and puts 256 on the other side, so on this CPU the times
# cross near 256, above the arithmetic's 128 as far as the rows at 64 and 256 can tell (128
# itself was not timed). From $T = 64$ on, the time ratio sits below the arithmetic ratio (0.39x against
# 0.67x, 1.13x against 1.67x, 3.56x against 5.67x). At $T = 16$ it is 0.57x against 0.42x in
# this run, and 0.44x in the previous `cpu` run: near the arithmetic ratio, on either side. A likely reason for the ratio below the
# arithmetic's, not measured here: the parallel form's multiply-adds sit in a few large matrix
# products, which a CPU runs at a higher rate than the GRU's recurrent half, $T$ small products
# of a batch of 8 one after another (`nn.GRU` computes its input half for all positions in one
# product).
#
# The brackets also show how a shared, busy machine disturbs some calls. At $T = 64$ the three
# third quartiles sit 4 to 28 ms above their medians (`nn.GRU` 5.07 ms with a third quartile of
# 9.70 ms, the parallel form 2.00 and 6.25 ms, the Python loop 25.89 and 54.13 ms), and at
# $T = 1024$ the third quartiles of `nn.GRU` and the Python loop are about twice their first
# (`nn.GRU` 67.89 to 144.82 ms, the Python loop 411.59 to 803.45 ms; the parallel form x1.8,
# 312.16 to 555.78 ms): for those two, the three slowest of the nine rounds took at least about
# twice as long as the three fastest, doing the same work, presumably because other processes
# shared the machine (waiting for a core, or sharing its caches). Through that noise the median
# of `nn.GRU` grew about in proportion to its length: x72 for a length x64 (the line "time
# x72"), x4.3 from $T = 256$ to 1024 (a length x4). The Python loop's did not (x1.3 from $T = 16$ to 64, x6.1 from 256 to 1024), which we read as the same
# load, here through a whole row: its 16 row is 1.2 ms a position, against 0.4-0.7 ms at the
# other lengths, with a narrow bracket. A machine slowed throughout a row leaves its bracket
# narrow like that, so the brackets cannot show it. Read every row's absolute times as this
# run's, on a busy machine; the ratios within a row are usually steadier, since the three take
# turns in every round (not when one of the three alone is disturbed). Where exactly the times cross depends on the device and on how
# busy it is. The figure draws each median with its quartile bracket as an
# error bar, at the lengths timed.
#
# At the longest length timed, $T = 16 d = 1024$ in the `cpu` profile, the parallel form does
# 5.7 times the GRU's arithmetic, and on a CPU it is slower there (3.56x in this run, with
# the quartile brackets far apart: its first quartile, 312.16 ms, is more than twice the third
# of `nn.GRU`, 144.82 ms; checked, on a CPU). From the row before to the last its time grows
# about as its arithmetic does: $2Td^2 + 2T^2d$ at $d = 64$ grows x13.6 from $T = 256$ to
# 1024, and the last printed line says x13.4, while the GRU's $6Td^2$ grows x4.0 (printed: x4.3;
# the faster growth is checked, on a CPU). Attention trades sequential steps for total work. On a GPU the same lines can read
# differently, since thousands of cores absorb the $T^2$ scores while every step of a
# recurrence waits for the one before; the printed numbers say which. The Python loop's line
# shows the rest: the gap between it and `nn.GRU`, which computes the same function, is the
# interpreter's cost per position, not arithmetic. What does not
# change with the machine is the sequential count: the GRU needs $T$ steps one after another,
# the parallel form one, and its path from any position to any other is one step long.
# Chapter 05 measures both on the device, with gradients and memory.
#
# **What it costs.** The candidate no longer knows anything about the past: $\tilde h_i$ is a
# function of the single input $x_i$. In the GRU the candidate summarised the past; now only
# the weighted sum can combine positions. That is why the next steps make the weighted sum
# richer.
#
# ## 4. Separate queries, keys and values
#
# In step 3 the candidate $\tilde h_i$ plays two roles. It is *compared* with the query (the
# score $q_t^\top \tilde h_i$ decides whether position $i$ is read) and it is *delivered* (it is
# what the weighted sum returns). Give each role its own linear map of the input, and the query
# its own as well (Vaswani et al. 2017, §3.2.1). The split is older than the Transformer: the
# end-to-end memory networks of Sukhbaatar et al. (2015) embed every memory twice, once to be
# matched and once to be read; Miller et al. (2016) named the two parts keys and values; and
# Daniluk et al. (2017) split a recurrent language model's output vector into a key, a value and
# a part that predicts, which is this step taken inside a recurrent model.
#
# $$q_t = W_Q x_t, \quad k_i = W_K x_i, \quad v_i = W_V x_i, \qquad
#   \alpha_{t,i} = \operatorname{softmax}_{i \le t}\big(q_t^\top k_i\big), \qquad
#   h_t = \sum_{i \le t} \alpha_{t,i}\, v_i .$$
#
# The sum runs over the index of the **values**: $\alpha_{t,i}$ weighs $v_i$. (A common slip
# writes $v_t$ inside the sum; since the weights sum to one, that returns $v_t$ itself and
# nothing has been attended to.) The maps are linear, as in the Transformer: the $\tanh$ of the
# GRU's candidate is gone, and non-linearity returns in step 8. (Vaswani et al. also divide the
# score by $\sqrt{d_k}$; chapter 05 measures why.)
#
# The score $q_t^\top k_i = x_t^\top W_Q^\top W_K\, x_i$ is exactly Luong's *general* score of
# chapter 03, $x_t^\top W_a x_i$, with $W_a = W_Q^\top W_K$ factored through $d_k$ dimensions
# (so its rank is at most $d_k$). We check that with chapter 03's `GeneralScore`:

# %%
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True) -> tuple[Tensor, Tensor]:
    """``alpha_{t,i} = softmax_i(q_t . k_i)`` over ``i <= t`` (every ``i`` when not ``causal``) and
    ``h_t = sum_i alpha_{t,i} v_i``. ``q``, ``k``: ``(..., T, d_k)``; ``v``: ``(..., T, d_v)``.
    Returns ``(h (..., T, d_v), alpha (..., T, T))``."""
    T = q.shape[-2]
    mask = causal_mask(T, q.device) if causal else torch.ones(T, T, dtype=torch.bool, device=q.device)
    alpha = masked_softmax(q @ k.transpose(-2, -1), mask)
    return alpha @ v, alpha


torch.manual_seed(run.seed)
d, d_k = 8, 3
W_Q, W_K = torch.randn(d_k, d, dtype=torch.double), torch.randn(d_k, d, dtype=torch.double)
xs = torch.randn(2, 6, d, dtype=torch.double)
_, alpha_qk = attention(xs @ W_Q.T, xs @ W_K.T, xs, causal=False)
general = GeneralScore(d, d).double()
with torch.no_grad():
    general.W_a.weight.copy_(W_Q.T @ W_K)                         # W_a = W_Q^T W_K, (d, d)
    luong = torch.stack([torch.softmax(general(xs[:, t], general.prepare(xs)), dim=-1) for t in range(6)], 1)
print(f"q.k attention vs Luong's general score with W_a = W_Q^T W_K: max |error| = "
      f"{(alpha_qk - luong).abs().max().item():.1e}; rank of W_a = {torch.linalg.matrix_rank(W_Q.T @ W_K).item()}"
      f" (d = {d}, d_k = {d_k})")
assert torch.allclose(alpha_qk, luong, atol=1e-12), "q.k attention is Luong's general score with W_a = W_Q^T W_K"

# %% [markdown]
# **What separate roles buy: find by one thing, deliver another.** With keys and values apart,
# attention is a soft dictionary lookup. A small example with weights set by hand makes it
# concrete. Each input carries a key (one-hot, first block), a value (one-hot, second block) or,
# at the last position, a question "which value has key $k$?" (one-hot, third block).
# $W_K$ reads the key block, $W_V$ the value block, $W_Q$ the question block, scaled by
# $\beta = 20$ so that the softmax is sharp. The layer returns the value stored under the
# asked key, wherever it is, though the key and the value of a fact sit in different
# coordinates of the same input vector:

# %%
def selector(rows: int, start: int, width: int) -> Tensor:
    """A ``(rows, width)`` matrix that reads coordinates ``start .. start + rows - 1`` of a vector."""
    M = torch.zeros(rows, width, dtype=torch.double)
    M[:, start:start + rows] = torch.eye(rows, dtype=torch.double)
    return M


n_keys, n_values, beta = 6, 5, 20.0
gen = torch.Generator().manual_seed(run.seed)
keys = torch.randperm(n_keys, generator=gen)                       # six facts, each key once
values = torch.randint(0, n_values, (n_keys,), generator=gen)
asked = int(keys[1])                                              # ask for the key of the second fact
width = 2 * n_keys + n_values                                     # [key | value | question]
facts = torch.cat([F.one_hot(keys, n_keys), F.one_hot(values, n_values), torch.zeros(n_keys, n_keys)], 1)
question = torch.zeros(1, width)
question[0, n_keys + n_values + asked] = 1.0
X_dict = torch.cat([facts, question]).double()[None]              # (1, 7, width)
W_K_dict = selector(n_keys, 0, width)                             # reads the key block
W_V_dict = selector(n_values, n_keys, width)                      # reads the value block
W_Q_dict = beta * selector(n_keys, n_keys + n_values, width)      # reads the question block
h_dict, a_dict = attention(X_dict @ W_Q_dict.T, X_dict @ W_K_dict.T, X_dict @ W_V_dict.T)
answer = h_dict[0, -1]
print(f"facts (key -> value): {dict(zip(keys.tolist(), values.tolist(), strict=True))}; asked for key {asked}")
print(f"output of the last position: {answer.numpy().round(4)} -> value {int(answer.argmax())}; "
      f"weight on the right fact {a_dict[0, -1, 1].item():.6f}")
assert int(answer.argmax()) == int(values[1]) and (answer - F.one_hot(values[1], n_values)).abs().max() < 1e-6, \
    "the lookup must return the value stored under the asked key"

# %% [markdown]
# In step 3 the vector that matched the question was the vector delivered; here the key block
# decides *where* to read and the value block is *what* is read. The experiments below train the
# same kind of layer on a recall task built like this dictionary, and then look at its weights:
# it learns to answer, but not with one sharp head like this one (measured there).
#
# ## 5. Several heads
#
# One softmax row is one distribution over positions: a position can read several places only
# by averaging them. Step 2 measured what that loses against the GRU, whose every hidden unit had
# its own weights. The Transformer's answer (Vaswani et al. 2017, §3.2.2) is to run $h$
# attentions side by side, each on its own projections of width $d_k = d_{\text{model}} / h$,
# concatenate their outputs, and mix them with one more linear map:
#
# $$\text{head}_g(t) = \sum_{i} \alpha^{(g)}_{t,i}\, W_V^{(g)} x_i, \quad
#   \alpha^{(g)}_{t,i} = \operatorname{softmax}_i\big((W_Q^{(g)} x_t)^\top W_K^{(g)} x_i\big), \qquad
#   h_t = W_O \big[\text{head}_1(t); \dots; \text{head}_h(t)\big] .$$
#
# In code the heads are one reshape: project with the full $d_{\text{model}} \times
# d_{\text{model}}$ matrices, cut the last axis into $h$ slices of $d_k$, and move the head axis
# next to the batch axis, where every operation treats it as one more batch dimension. The check
# that must hold: this equals a loop over heads, each with its own slices of the weight matrices.
# (The GRU, seen this way, has $H$ weightings of width 1, one per hidden unit, as the must-agree
# check of step 2 computed. They are not softmax heads: the weights are products of gates and sum
# to $1 - \prod_j z_j$, not to one. In logarithms, though, they have the shape of a score:
# $\log w_{t,i} = \log(1 - z_i) - L_i + L_t$ with $L_t = \sum_{j \le t} \log z_j$, a term of
# the position read plus a term of the position reading, unnormalised. Question 5 takes this
# up; question 7 meets the same shape coming from attention's side.)

# %%
def split_heads(x: Tensor, heads: int) -> Tensor:
    """``(B, T, heads * d_k)`` -> ``(B, heads, T, d_k)``."""
    B, T, d = x.shape
    return x.view(B, T, heads, d // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, heads, T, d_k)`` -> ``(B, T, heads * d_k)``: the heads side by side."""
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)


def multi_head_attention(x: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor, heads: int,
                         causal: bool = True) -> tuple[Tensor, Tensor]:
    """Self-attention with ``heads`` heads. ``x`` is ``(B, T, d)``, every ``W`` is ``(d, d)``.
    Returns ``(out (B, T, d), alpha (B, heads, T, T))``."""
    q, k, v = (split_heads(x @ W.T, heads) for W in (W_Q, W_K, W_V))
    h, alpha = attention(q, k, v, causal)
    return merge_heads(h) @ W_O.T, alpha


torch.manual_seed(run.seed)
d_model, n_heads = 12, 3
Ws = [torch.randn(d_model, d_model, dtype=torch.double) / d_model**0.5 for _ in range(4)]
xs = torch.randn(2, 7, d_model, dtype=torch.double)
out_reshape, _ = multi_head_attention(xs, *Ws, heads=n_heads)
d_head = d_model // n_heads
per_head = [attention(xs @ Ws[0][g * d_head:(g + 1) * d_head].T, xs @ Ws[1][g * d_head:(g + 1) * d_head].T,
                      xs @ Ws[2][g * d_head:(g + 1) * d_head].T)[0] for g in range(n_heads)]
out_loop = torch.cat(per_head, dim=-1) @ Ws[3].T
print(f"heads by reshape vs a loop over heads: max |error| = {(out_reshape - out_loop).abs().max().item():.1e}")
assert torch.allclose(out_reshape, out_loop, atol=1e-12), "heads by a reshape must equal a loop over heads"

# %% [markdown]
# **What heads buy, on the dictionary.** Ask two questions at once: "the value of key $a$"
# and "the value of key $b$". One head, whose query reads both question blocks, can only
# average the two facts it finds; two heads, each reading its own question block, return both
# values, side by side:

# %%
a_key, b_key = int(keys[1]), int(keys[4])
width2 = 3 * n_keys + n_values                                    # [key | value | question 1 | question 2]
facts2 = torch.cat([facts[:, : n_keys + n_values], torch.zeros(n_keys, 2 * n_keys)], 1)
questions = torch.zeros(1, width2)
questions[0, n_keys + n_values + a_key] = questions[0, 2 * n_keys + n_values + b_key] = 1.0
X2 = torch.cat([facts2, questions]).double()[None]
read_key, read_value = selector(n_keys, 0, width2), selector(n_values, n_keys, width2)
read_q1, read_q2 = selector(n_keys, n_keys + n_values, width2), selector(n_keys, 2 * n_keys + n_values, width2)
# one head: its query reads both questions at once
one_head, _ = attention(X2 @ (beta * (read_q1 + read_q2)).T, X2 @ read_key.T, X2 @ read_value.T)
# two heads: head 1 reads question 1, head 2 question 2; both read the same keys and values
two_heads = torch.cat([attention(X2 @ (beta * rq).T, X2 @ read_key.T, X2 @ read_value.T)[0]
                       for rq in (read_q1, read_q2)], dim=-1)
print(f"asked for keys {a_key} and {b_key}: values {int(values[1])} and {int(values[4])}")
print(f"one head : {one_head[0, -1].numpy().round(3)}  (an average of the two facts)")
print(f"two heads: {two_heads[0, -1].numpy().round(3)}  (head 1 | head 2)")
value_a, value_b = F.one_hot(values[1], n_values).double(), F.one_hot(values[4], n_values).double()
assert torch.allclose(one_head[0, -1], (value_a + value_b) / 2, atol=1e-6), "one head averages the two facts"
assert torch.allclose(two_heads[0, -1], torch.cat([value_a, value_b]), atol=1e-6), "two heads return both values"

# %% [markdown]
# With one head, the output says "these two values, half each", but not which belongs to which
# question; the two heads keep them apart. This is the per-unit freedom of the GRU,
# regained at the granularity of a head rather than a unit: $h$ distributions instead of $H$.
#
# ## 6. Drop causality
#
# The GRU reads left to right, so everything so far has been causal: position $t$ attends to
# $i \le t$. Nothing in steps 3 to 5 needs that any more: the mask is the only thing that keeps
# $t$ from reading the future. A model that predicts the next token must keep it (the
# Transformer's decoder, chapter 07, and the language model of chapter 09); a model that
# *encodes* a given sentence can drop it, and let every position read the whole sentence, left
# and right (the encoder, chapter 07):
#
# $$\alpha_{t,i} = \operatorname{softmax}_{i \in \{1..T\}}\big(q_t^\top k_i\big), \qquad h_t = \sum_{i=1}^{T} \alpha_{t,i}\, v_i .$$
#
# The two weight matrices of the same layer on the same input, and a check of what the mask
# guarantees: with it, changing the inputs after position $s$ cannot change any output up to
# $s$; without it, it changes all of them.

# %%
torch.manual_seed(run.seed)
T6 = 10
xs = torch.randn(1, T6, d_model, dtype=torch.double)
_, alpha_causal = multi_head_attention(xs, *Ws, heads=n_heads, causal=True)
_, alpha_full = multi_head_attention(xs, *Ws, heads=n_heads, causal=False)
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
plot_heatmap(causal_mask(T6).double(), ax=axes[0], vmin=0, vmax=1, colorbar=False,
             title="The causal mask (1 = may attend)", xlabel="key position i", ylabel="query position t")
plot_heatmap(alpha_causal[0, 0], ax=axes[1], vmin=0, vmax=1, title="Head 1, causal",
             xlabel="key position i", ylabel="query position t")
plot_heatmap(alpha_full[0, 0], ax=axes[2], vmin=0, vmax=1, title="Head 1, mask removed",
             xlabel="key position i", ylabel="query position t")
fig.tight_layout()
plt.show()

s = 4
changed = xs.clone()
changed[:, s + 1:] = torch.randn(1, T6 - s - 1, d_model, dtype=torch.double)    # a different future
diffs = {}
for causal in (True, False):
    before, _ = multi_head_attention(xs, *Ws, heads=n_heads, causal=causal)
    after, _ = multi_head_attention(changed, *Ws, heads=n_heads, causal=causal)
    diffs[causal] = (before[:, : s + 1] - after[:, : s + 1]).abs().max().item()
print(f"outputs at positions 0..{s} after changing the inputs after {s}: "
      f"causal max |change| = {diffs[True]:.1e}, non-causal = {diffs[False]:.2f}")
assert diffs[True] < 1e-12, "with the causal mask, the future cannot change the past's outputs"
assert diffs[False] > 1e-3, "without the mask, every output reads the future"

# %% [markdown]
# ## 7. Order: permutation equivariance, and positions
#
# Something was lost on the way that the GRU had for free. The GRU reads $x_1$ before $x_2$;
# its state *is* an ordered summary. The non-causal layer of step 6 compares every query with
# every key by content alone, and sums over positions, and a sum does not care about order. So
# permuting the input rows permutes the output rows the same way, and nothing else happens: the
# layer is **permutation equivariant**, $f(PX) = P f(X)$ for every permutation matrix $P$. To
# it, a sentence is a bag of words. Checked on a random permutation:

# %%
torch.manual_seed(run.seed)
xs = torch.randn(2, T6, d_model, dtype=torch.double)
perm = torch.randperm(T6)
out_full, _ = multi_head_attention(xs, *Ws, heads=n_heads, causal=False)
out_full_perm, _ = multi_head_attention(xs[:, perm], *Ws, heads=n_heads, causal=False)
err_equivariant = (out_full_perm - out_full[:, perm]).abs().max().item()
prefix_perm = torch.cat([torch.randperm(T6 - 1), torch.tensor([T6 - 1])])           # keeps the last in place
out_causal, _ = multi_head_attention(xs, *Ws, heads=n_heads, causal=True)
out_causal_perm, _ = multi_head_attention(xs[:, prefix_perm], *Ws, heads=n_heads, causal=True)
err_last = (out_causal_perm[:, -1] - out_causal[:, -1]).abs().max().item()
print(f"non-causal: f(x[perm]) vs f(x)[perm]: max |error| = {err_equivariant:.1e}  (equivariant)")
print(f"causal: last output after shuffling the positions before it: max |change| = {err_last:.1e}")
assert err_equivariant < 1e-12, "without positions, the non-causal layer is permutation equivariant"
assert err_last < 1e-12, "without positions, a causal layer's last output ignores the order of its prefix"

# %% [markdown]
# The causal layer is not equivariant (the mask depends on position), but its **last** output
# sees the multiset $\{x_1, \dots, x_T\}$ (which vectors occur, and how often: a softmax
# weighs a repeated one more) and its own $x_T$, and nothing else: shuffle the positions
# before it, and it does not change (the second check). A one-layer causal model that reads its
# answer at the end is blind to order. The experiments below measure what that costs.
#
# **Adding positions, correctly.** Give every vector the position it comes from: add a vector
# $p(t)$ that depends only on the position to the input at $t$, before the projections. It can
# be learned, a table with one row per position, as in the "temporal encoding" of Sukhbaatar et
# al. (2015) and the convolutional translator of Gehring et al. (2017), or fixed, as the
# sinusoids of chapter 06. The query of position $t$ then carries $p(t)$; the key
# and the value of position $i$ carry $p(i)$; and the weighted sum still runs over the values'
# index $i$:
#
# $$q_t = W_Q\big(x_t + p(t)\big), \quad k_i = W_K\big(x_i + p(i)\big), \quad v_i = W_V\big(x_i + p(i)\big),
#   \qquad h_t = \sum_i \alpha_{t,i}\, v_i .$$
#
# A tempting slip gives the query the *key's* position,
# $\alpha_{t,i} \propto \exp\big(q_{t,i}^\top k_i\big)$ with $q_{t,i} = W_Q(x_t + p(i))$. That is
# wrong, and not only in notation. Expand the score: $W_Q x_t \cdot k_i + W_Q p(i) \cdot k_i$.
# The first term compares contents; the second depends on $i$ alone (and the key's content),
# the same for every query. The query's position appears nowhere, so the score cannot depend on
# where the query stands relative to the key, and "the word two to my left" cannot be expressed.
# (The query is not even one vector per position any more: it changes with every key. In a
# causal layer the mask lets a little relative position back in; question 3 shows how.) A check
# on a sequence whose tokens are all the same: with the correct form the rows of the weight
# matrix differ, because each query knows where it is; with the key's position in the query,
# every row is the same distribution.

# %%
def position_scores(x: Tensor, P: Tensor, W_Q: Tensor, W_K: Tensor, query_position: str) -> Tensor:
    """One head's scores ``(T, T)`` for inputs ``x`` ``(T, d)`` and positions ``P`` ``(T, d)``.
    ``query_position="own"``: ``q_t = W_Q(x_t + p(t))``; ``"key's"``: ``q_{t,i} = W_Q(x_t + p(i))``."""
    T = x.shape[0]
    k = (x + P) @ W_K.T                                         # k_i = W_K(x_i + p(i))
    if query_position == "own":
        return ((x + P) @ W_Q.T) @ k.T
    return torch.stack([torch.stack([W_Q @ (x[t] + P[i]) @ k[i] for i in range(T)]) for t in range(T)])


torch.manual_seed(run.seed)
P = torch.randn(T6, d_model, dtype=torch.double)
same_token = torch.randn(d_model, dtype=torch.double).expand(T6, d_model)
rows = {form: torch.softmax(position_scores(same_token, P, Ws[0], Ws[1], form), dim=-1) for form in ("own", "key's")}
for form, a in rows.items():
    print(f"query with {form:5s} position: rows of the weight matrix differ by up to "
          f"{(a - a[0]).abs().max().item():.3f}")
out_pos, _ = multi_head_attention(xs + P, *Ws, heads=n_heads, causal=False)
out_pos_perm, _ = multi_head_attention(xs[:, perm] + P, *Ws, heads=n_heads, causal=False)
print(f"with positions, f(x[perm] + P) vs f(x + P)[perm]: max |difference| = "
      f"{(out_pos_perm - out_pos[:, perm]).abs().max().item():.2f}  (order now matters)")
assert (rows["key's"] - rows["key's"][0]).abs().max() < 1e-12, "with p(i) in the query, rows cannot depend on t"
assert (rows["own"] - rows["own"][0]).abs().max() > 1e-2, "with its own position, each query weighs differently"

# %% [markdown]
# Chapter 06 treats positions in full (sinusoids, learned tables, relative schemes, lengths
# never seen in training). The experiments below train both forms: with learned positions in
# the correct form, and with the key's position in the query.
#
# ## 8. A non-linearity after attention
#
# Look at what a head computes once its weights are fixed: $h_t = \sum_i \alpha_{t,i} W_V x_i$,
# with $\alpha_{t,i} \ge 0$ and $\sum_i \alpha_{t,i} = 1$. Given the weights, the output is a
# **linear** function of the inputs, and a **convex combination** of the value vectors: every
# coordinate of $h_t$ lies between the smallest and the largest value of that coordinate. And,
# *for one input and the weights it produced*, two attention layers with nothing in between mix
# like one: weights $A^{(2)} A^{(1)}$ (again rows that sum to one) and value map
# $W_V^{(2)} W_V^{(1)}$. All three, checked below.
#
# That last identity is not a statement about what a stack can compute. $A^{(2)}$ is a softmax
# of scores computed from $h^{(1)}$, the output of layer 1, so *where* layer 2 looks depends on
# what layer 1 read, and no single layer on $x$ need produce the weights $A^{(2)} A^{(1)}$. Such
# composition is what lets two attention layers in a Transformer (with residual connections and
# positions) form the "induction heads" of Elhage et al. (2021) and Olsson et al. (2022), which
# one layer cannot. What stacking does not add is a non-linear map of *what* is read: given the
# weights, every output is still a convex mixing of linearly mapped values.

# %%
torch.manual_seed(run.seed)
xs = torch.randn(2, T6, d_model, dtype=torch.double)
ys = torch.randn(2, T6, d_model, dtype=torch.double)
W_V1, W_V2 = torch.randn(d_model, d_model, dtype=torch.double), torch.randn(d_model, d_model, dtype=torch.double)
h1, A1 = attention(xs @ Ws[0].T, xs @ Ws[1].T, xs @ W_V1.T, causal=False)
# 1. linear in the inputs, the weights held fixed
lin_err = ((A1 @ ((2 * xs - 3 * ys) @ W_V1.T)) - (2 * (A1 @ (xs @ W_V1.T)) - 3 * (A1 @ (ys @ W_V1.T)))).abs().max()
# 2. a convex combination: each output coordinate between the min and max of the values' coordinate
v1 = xs @ W_V1.T
inside = bool((h1 >= v1.min(dim=1, keepdim=True).values - 1e-12).all()
              and (h1 <= v1.max(dim=1, keepdim=True).values + 1e-12).all())
# 3. for this input and these weights, two attention layers in a row mix like one
h2, A2 = attention(h1 @ Ws[2].T, h1 @ Ws[3].T, h1 @ W_V2.T, causal=False)
one_layer = (A2 @ A1) @ (xs @ (W_V2 @ W_V1).T)
print(f"linear given the weights: max |error| = {lin_err.item():.1e}; outputs inside the values' range: {inside}")
print(f"two stacked layers mix like one with weights A2 A1 (this input): max |error| = "
      f"{(h2 - one_layer).abs().max().item():.1e}; "
      f"rows of A2 A1 sum to 1 (max |sum - 1| = {((A2 @ A1).sum(-1) - 1).abs().max().item():.1e})")
assert lin_err < 1e-10 and inside, "given its weights, attention is a linear, convex combination of the values"
assert torch.allclose(h2, one_layer, atol=1e-10), "given their weights, two attention layers mix like one"

# %% [markdown]
# So where is the non-linearity? Only in the **weights**: $\alpha$ is a softmax of scores that
# are bilinear in the inputs. That is real, and the experiments show it doing real work, but it
# acts on *where* a position looks, not on *what it does with what it found*. For one head it is
# also weak, as a short argument shows. Take a linear read-out that decides between two classes
# by the sign of $w^\top h_t + b$, and write $u_i = w^\top v_i + b$. Since the weights sum to
# one, $w^\top h_t + b = \sum_i e^{s_i} u_i \big/ \sum_i e^{s_i}$; the denominator is positive, so
# the decision is the sign of $\sum_i e^{s_i} u_i$. With the query fixed, each term depends on one
# position's input only. **One head with a linear read-out decides by a sum of per-position
# terms**: on bits, a linear threshold function.
#
# > A consequence: one head cannot compute the XOR of two bits at two marked positions. Fix the
# > rest of the sequence: the marked positions contribute $F(a)$ and $G(b)$, the rest a constant
# > $R$. XOR needs $F(0) + G(0) + R < 0$, $F(1) + G(1) + R < 0$, $F(0) + G(1) + R > 0$ and
# > $F(1) + G(0) + R > 0$, but the first two add up to the same number as the last two. At least
# > one of the four cases is wrong: accuracy at most 75%.
#
# With several heads the argument fails (the heads' denominators differ), and the experiments
# will show several heads doing what one cannot. But building a non-linear function of what was
# retrieved out of softmax weights is roundabout.
#
# The Transformer's remedy (Vaswani et al. 2017, §3.3) is a small two-layer network applied to
# every position separately, after attention:
#
# $$\operatorname{FFN}(h_t) = W_2 \max(0,\ W_1 h_t + b_1) + b_2,$$
#
# the same weights at every position, with a hidden layer $d_{\text{ff}}$ wider than the model
# (Vaswani et al. use $d_{\text{ff}} = 4 d_{\text{model}}$; we use twice). Position-wise means it
# mixes nothing across positions (attention's job) and keeps permutation equivariance, checked:

# %%
torch.manual_seed(run.seed)
ffn = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.ReLU(), nn.Linear(2 * d_model, d_model)).double()
with torch.no_grad():
    whole = ffn(xs)
    one_by_one = torch.stack([ffn(xs[:, t]) for t in range(T6)], dim=1)
    perm_err = (ffn(xs[:, perm]) - whole[:, perm]).abs().max().item()
print(f"FFN on the whole sequence vs one position at a time: max |error| = "
      f"{(whole - one_by_one).abs().max().item():.1e}; permutation: {perm_err:.1e}")
assert torch.allclose(whole, one_by_one, atol=1e-12) and perm_err < 1e-12, "the FFN acts on each position alone"

# %% [markdown]
# The experiments measure the bound (one head, no FFN, on XOR), what several heads do without an
# FFN, and what the FFN adds on a task that asks for a non-linear function of an average.
#
# ## The self-attention layer, written out
#
# Everything above, in one module: positions added to the input (each vector its own), queries,
# keys and values from three maps, $h$ heads and an output map, the causal mask or none, and the
# position-wise FFN. The options switch off one step at a time for the experiments: `positions=
# "none"`, `positions="key's"` (the key's position in the query, the form we called wrong),
# `ffn=False`.

# %%
class SelfAttentionLayer(nn.Module):
    """The layer derived in this chapter (one head of the Transformer's attention, times ``heads``,
    plus its feed-forward network; no scaling, residuals or normalisation: chapters 05 and 07).

    ``forward(x (B, T, d_model)) -> (out (B, T, d_model), alpha (B, heads, T, T))``::

        q_t = W_Q (x_t + p(t)),  k_i = W_K (x_i + p(i)),  v_i = W_V (x_i + p(i))     per head
        alpha_{t,i} = softmax_i(q_t . k_i)    over i <= t when causal, over all i otherwise
        out_t = FFN(W_O [head_1(t); ...; head_h(t)]),  head(t) = sum_i alpha_{t,i} v_i

    ``positions``: ``"own"`` (above; a learned table ``p``), ``"none"``, or ``"key's"`` (the
    query for key ``i`` is ``W_Q (x_t + p(i))``). ``ffn=False`` drops the FFN.
    """

    def __init__(self, d_model: int, heads: int, d_ff: int, max_len: int, causal: bool = True,
                 positions: str = "own", ffn: bool = True):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"SelfAttentionLayer: d_model={d_model} is not divisible by heads={heads}")
        if positions not in ("own", "none", "key's"):
            raise ValueError(f"SelfAttentionLayer: positions must be 'own', 'none' or \"key's\", got {positions!r}")
        self.heads, self.causal, self.positions, self.max_len = heads, causal, positions, max_len
        self.p = nn.Embedding(max_len, d_model) if positions != "none" else None
        self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model)) if ffn else None

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = x.shape
        if T > self.max_len:
            raise ValueError(f"SelfAttentionLayer: sequence of length {T} > max_len={self.max_len}")
        p = self.p(torch.arange(T, device=x.device)) if self.p is not None else torch.zeros_like(x[0])
        q = split_heads(self.W_Q(x + p if self.positions == "own" else x), self.heads)
        k, v = split_heads(self.W_K(x + p), self.heads), split_heads(self.W_V(x + p), self.heads)
        scores = q @ k.transpose(-2, -1)                           # (B, heads, T, T): q_t . k_i
        if self.positions == "key's":                               # + W_Q p(i) . k_i, the same for every t
            scores = scores + (split_heads(self.W_Q(p).expand(B, T, -1), self.heads) * k).sum(-1)[:, :, None, :]
        mask = causal_mask(T, x.device) if self.causal else torch.ones(T, T, dtype=torch.bool, device=x.device)
        alpha = masked_softmax(scores, mask)
        out = self.W_O(merge_heads(alpha @ v))
        return (self.ffn(out) if self.ffn is not None else out), alpha


# %% [markdown]
# Two checks that must hold: the module computes the pieces of steps 5 to 8 put together, and
# its `"key's"` option computes the score exactly as the formula with $q_{t,i} = W_Q(x_t + p(i))$
# writes it, one pair $(t, i)$ at a time.

# %%
torch.manual_seed(run.seed)
layer = SelfAttentionLayer(d_model, n_heads, 2 * d_model, max_len=T6, causal=True).double()
wrong = SelfAttentionLayer(d_model, 1, 2 * d_model, max_len=T6, causal=False, positions="key's").double()
with torch.no_grad():
    out_layer, _ = layer(xs)
    p_table = layer.p.weight
    pieces, _ = multi_head_attention(xs + p_table, layer.W_Q.weight, layer.W_K.weight, layer.W_V.weight,
                                     layer.W_O.weight, heads=n_heads, causal=True)
    err_layer = (out_layer - layer.ffn(pieces)).abs().max().item()
    _, alpha_wrong = wrong(xs[:1])
    by_formula = torch.softmax(position_scores(xs[0], wrong.p.weight, wrong.W_Q.weight, wrong.W_K.weight, "key's"), -1)
    err_wrong = (alpha_wrong[0, 0] - by_formula).abs().max().item()
print(f"SelfAttentionLayer vs steps 5-8 composed: max |error| = {err_layer:.1e}")
print(f"its \"key's\" option vs q_(t,i) = W_Q(x_t + p(i)) pair by pair: max |error| = {err_wrong:.1e}")
assert err_layer < 1e-12, "SelfAttentionLayer must compute steps 5-8 composed"
assert err_wrong < 1e-12, "the \"key's\" option must compute q_(t,i) = W_Q(x_t + p(i)) as written"

# %% [markdown]
# ## What each step buys, measured
#
# Now we train. Every model reads a sequence of token ids through an embedding of width
# $d_{\text{model}}$ and predicts a class with a linear read-out, at the last position of the
# sequence (or, for one task, at every position). The body is either a GRU (`nn.GRU` of width
# $d_{\text{model}}$) or one `SelfAttentionLayer`, causal unless stated. All models of a task see
# the same batches, freshly generated (so there is no overfitting to speak of), with the same
# optimiser and budget, and are tested on the same held-out sequences. The tasks, each chosen
# to isolate one step:
#
# | task | input → answer | isolates |
# |---|---|---|
# | **recall** | $n$ facts (key, value) with distinct keys, $1 \le n \le 12$, then a key → its value | retrieval by content from a growing memory (steps 2-4) |
# | **order** | random tokens, length 6-24 → the token two places before the last | order: positions (step 7) |
# | **tagging** | non-causal: at every position → the token two places to its left | the correct position form against the key's position in the query (step 7) |
# | **xor** | 11 bits, two of them marked, then a question token → the XOR of the two marked bits | the one-head bound of step 8 |
# | **band** | 12 bits → is the number of ones 5, 6 or 7? | a non-linear function of an average: the FFN (step 8) |
# | **parity** | 2-12 bits → the parity of the number of ones | counting, where a recurrence is natural |
#
# Each sequence of the recall task is a list of facts followed by a question: a fact is one token
# encoding a (key, value) pair, a question one token encoding a key. Sequences of different
# lengths are padded at the end; the causal models never look at the padding, and the read-out
# takes the last real position.

# %%
@dataclass
class Task:
    """A synthetic task: ``sample(n, generator) -> (ids (n, T), lengths (n,), target, info (n,))``.

    ``target`` is ``(n,)`` (one class per sequence) or ``(n, T)`` with ``-100`` where nothing is
    asked (``per_position``). ``info`` is what accuracy is broken down by (a load, a length).
    """

    name: str
    vocab_size: int
    num_classes: int
    sample: Callable[[int, torch.Generator], tuple[Tensor, ...]]
    info_name: str
    chance: float
    per_position: bool = False


def recall_sample(n: int, g: torch.Generator, n_keys: int = 12, n_values: int = 8) -> tuple[Tensor, ...]:
    n_facts = torch.randint(1, n_keys + 1, (n,), generator=g)
    keys = torch.argsort(torch.rand(n, n_keys, generator=g), dim=1)               # distinct keys per row
    vals = torch.randint(0, n_values, (n, n_keys), generator=g)
    asked = (torch.rand(n, generator=g) * n_facts).long()                           # which fact is asked
    pad = n_keys * n_values + n_keys
    ids = torch.full((n, n_keys + 1), pad)
    ids[:, :n_keys] = keys * n_values + vals                                        # fact tokens
    rows = torch.arange(n)
    ids[rows, n_facts] = n_keys * n_values + keys[rows, asked]                      # the question token
    ids[torch.arange(n_keys + 1)[None] > n_facts[:, None]] = pad
    return ids, n_facts + 1, vals[rows, asked], n_facts


def order_sample(n: int, g: torch.Generator, vocab: int = 8, lo: int = 6, hi: int = 24, back: int = 2):
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    ids = torch.randint(0, vocab, (n, hi), generator=g)
    ids[torch.arange(hi)[None] >= lengths[:, None]] = vocab                        # padding
    return ids, lengths, ids[torch.arange(n), lengths - 1 - back], lengths


def tagging_sample(n: int, g: torch.Generator, vocab: int = 8, T: int = 16, back: int = 2):
    ids = torch.randint(0, vocab, (n, T), generator=g)
    target = ids.roll(back, dims=1)
    target[:, :back] = -100                                                         # nothing to the left
    return ids, torch.full((n,), T), target, torch.full((n,), T)


def xor_sample(n: int, g: torch.Generator, T: int = 12) -> tuple[Tensor, ...]:
    ids = torch.randint(0, 2, (n, T), generator=g)
    marked = torch.argsort(torch.rand(n, T - 1, generator=g), dim=1)[:, :2]          # two positions
    rows = torch.arange(n)
    a, b = ids[rows, marked[:, 0]], ids[rows, marked[:, 1]]
    ids[rows, marked[:, 0]] += 2                                                    # marked bits: 2, 3
    ids[rows, marked[:, 1]] += 2
    ids[:, -1] = 4                                                                  # the question
    return ids, torch.full((n,), T), a ^ b, torch.full((n,), T)


def band_sample(n: int, g: torch.Generator, T: int = 12) -> tuple[Tensor, ...]:
    ids = torch.randint(0, 2, (n, T + 1), generator=g)
    ids[:, -1] = 2                                                                  # the question
    ones = (ids[:, :-1] == 1).sum(dim=1)
    return ids, torch.full((n,), T + 1), ((ones >= 5) & (ones <= 7)).long(), ones


def parity_sample(n: int, g: torch.Generator, lo: int = 2, hi: int = 12) -> tuple[Tensor, ...]:
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    ids = torch.randint(0, 2, (n, hi), generator=g)
    ids[torch.arange(hi)[None] >= lengths[:, None]] = 2
    return ids, lengths, (ids == 1).sum(dim=1) % 2, lengths


TASKS = {
    "recall": Task("recall", 12 * 8 + 13, 8, recall_sample, "facts stored", 1 / 8),
    "order": Task("order", 9, 8, order_sample, "length", 1 / 8),
    "tagging": Task("tagging", 8, 8, tagging_sample, "length", 1 / 8, per_position=True),
    "xor": Task("xor", 5, 2, xor_sample, "length", 1 / 2),
    "band": Task("band", 3, 2, band_sample, "ones", 0.612),
    "parity": Task("parity", 3, 2, parity_sample, "length", 1 / 2),
}
ids, lengths, target, info = TASKS["recall"].sample(2, torch.Generator().manual_seed(1))
print("two recall sequences (fact token = 8 * key + value; question token = 96 + key; padding = 108):")
print(ids.tolist(), "lengths", lengths.tolist(), "answers", target.tolist())

# %%
class SequenceModel(nn.Module):
    """Token ids -> embedding -> a GRU or a :class:`SelfAttentionLayer` -> a linear read-out, at the last
    real position (``lengths - 1``) or, with ``per_position``, at every position."""

    def __init__(self, task: Task, body: str, d_model: int, heads: int, d_ff: int, max_len: int = 32,
                 **layer_options):
        super().__init__()
        self.per_position = task.per_position
        self.embed = nn.Embedding(task.vocab_size, d_model)
        if body == "gru":
            self.body = nn.GRU(d_model, d_model, batch_first=True)
        else:
            self.body = SelfAttentionLayer(d_model, heads, d_ff, max_len, **layer_options)
        self.readout = nn.Linear(d_model, task.num_classes)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        states, _ = self.body(self.embed(ids))
        if self.per_position:
            return self.readout(states)                                            # (B, T, classes)
        return self.readout(states[torch.arange(ids.shape[0]), lengths - 1])      # (B, classes)


def task_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> tuple[Tensor, int]:
    ids, lengths, target, _ = batch
    logits = model(ids, lengths)
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=-100), int((target != -100).sum())


def train_and_test(task: Task, steps: int, seed: int, body: str = "attention", **options) -> dict:
    """Train a fresh model on ``steps`` fresh batches, then measure accuracy on held-out sequences."""
    torch.manual_seed(seed)
    heads = options.pop("heads", run.heads)
    model = SequenceModel(task, body, d_model=run.d_model, heads=heads, d_ff=run.d_ff, **options)
    g = torch.Generator().manual_seed(seed + 1)                # the same batches for every model of a task
    batches = [task.sample(run.batch_size, g) for _ in range(steps)]
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr)
    history = fit(model, batches, task_loss, optimizer, epochs=1, device=run.device, verbose=False)
    assert len(history.step_loss) == steps, "every run stops by its step count, in every profile"
    ids, lengths, target, info = task.sample(run.test_size, torch.Generator().manual_seed(10_000 + seed))
    model.eval()
    with torch.no_grad():
        correct = (model(ids.to(run.device), lengths.to(run.device)).argmax(-1).cpu() == target).float()
    if task.per_position:
        correct = correct[:, 2:]                               # positions with an answer
    return dict(model=model, history=history, accuracy=correct.mean().item(), correct=correct, info=info,
                ids=ids, lengths=lengths, params=sum(p.numel() for p in model.parameters()))


# %% [markdown]
# The runs. Attention models have the profile's width, heads and FFN; the variants change one
# thing each. Causal everywhere except the tagging task. Every run is repeated from
# `run.seeds` seeds (three in the `cpu` profile, five in `gpu`): the seed sets the initial
# weights, the training batches and the test sequences, so each seed is a separate draw of the
# whole experiment. `over_seeds` (`tfmlib.seeds`, first used in chapter 02) calls the function
# once per seed and collects the named numbers it returns, here each run's test accuracy; the
# table prints the median and the range, [min, max], over the seeds.

# %%
RUNS = [  # (task, label, steps, options)
    ("recall", "GRU", run.steps["recall"], dict(body="gru")),
    ("recall", "attention", run.steps["recall"], {}),
    ("order", "GRU", run.steps["order"], dict(body="gru")),
    ("order", "attention", run.steps["order"], {}),
    ("order", "attention, no positions", run.steps["order"], dict(positions="none")),
    ("tagging", "attention (own positions)", run.steps["tagging"], dict(causal=False)),
    ("tagging", "attention (key's position in the query)", run.steps["tagging"], dict(causal=False, positions="key's")),
    ("tagging", "attention, no positions", run.steps["tagging"], dict(causal=False, positions="none")),
    ("xor", "attention, 1 head, no FFN", run.steps["xor"], dict(heads=1, ffn=False)),
    ("xor", "attention, no FFN", run.steps["xor"], dict(ffn=False)),
    ("band", "attention", run.steps["band"], {}),
    ("band", "attention, no FFN", run.steps["band"], dict(ffn=False)),
    ("parity", "GRU", run.steps["parity"], dict(body="gru")),
    ("parity", "attention", run.steps["parity"], {}),
]
seeds = list(range(run.seed, run.seed + run.seeds))
trained = {}                                                  # (seed, task, label) -> train_and_test's dict


def run_all(seed: int) -> dict[str, float]:
    """The 14 runs from one seed; returns each run's test accuracy, named "task: model"."""
    for task_name, label, steps, options in tqdm(RUNS, desc=f"seed {seed}", leave=False):
        trained[seed, task_name, label] = train_and_test(TASKS[task_name], steps, seed, **dict(options))
    return {f"{task_name}: {label}": trained[seed, task_name, label]["accuracy"] for task_name, label, _, _ in RUNS}


accuracy = over_seeds(run_all, seeds)
results = {(t, label): trained[run.seed, t, label] for t, label, _, _ in RUNS}   # the first seed's, for examples

print(f"on {run.device}; batch {run.batch_size}, width {run.d_model}, {run.heads} heads; test sets of "
      f"{run.test_size:,} sequences; {len(seeds)} seeds ({', '.join(map(str, seeds))})")
print(f"{'run':>3s} {'task':8s} {'model':42s} {'params':>7s} {'steps':>6s} {'accuracy: median [min, max]':>28s} "
      f"{'chance':>7s} {'seconds':>8s}")
for number, (task_name, label, steps, _) in enumerate(RUNS, start=1):
    runs_ = [trained[s, task_name, label] for s in seeds]
    print(f"{number:>3d} {task_name:8s} {label:42s} {runs_[0]['params']:>7,} {steps:>6,} "
          f"{accuracy.summary(f'{task_name}: {label}', '.1%'):>28s} {TASKS[task_name].chance:>7.1%} "
          f"{np.median([r['history'].seconds for r in runs_]):>8.1f}")
print("(seconds: a run's training time, the median over the seeds)")

# %% [markdown]
# The training curves, task by task (loss per step, smoothed; the line is the median over the
# seeds, the band their range):

# %%
fig, axes = plt.subplots(2, 3, figsize=(16, 7.5))
for ax, task_name in zip(axes.flat, TASKS, strict=True):
    curves = {label: np.array([trained[s, t, label]["history"].step_loss for s in seeds])
              for t, label, _, _ in RUNS if t == task_name}
    plot_over_seeds(curves, ax=ax, smooth=max(1, run.steps[task_name] // 30), title=task_name,
                    xlabel="optimisation step", ylabel="training loss (nats)")
fig.suptitle(f"Training loss, the same batches for every model of a task; median and range of {len(seeds)} seed(s)")
fig.tight_layout()
plt.show()

# %% [markdown]
# And the accuracies broken down by what makes each task harder: the number of facts to hold
# (recall), the length (order, parity), the number of ones (band) and, for tagging, the position
# in the sequence (median and range over the seeds again); the last panel shows every run against
# chance. For the two order tasks we also compute the best any **order-blind** predictor can do:
# a model that knows the multiset of tokens (which tokens occur, and how often) and its own
# token, but not where they stand, can do no better than
# guessing the most frequent of the other tokens, which is right with probability
# $\max_a \operatorname{count}(a) / (\text{number of other tokens})$, computed on each seed's
# test sequences.

# %%
def by_info(r: dict) -> dict[int, float]:
    """Accuracy of one run for each value of its task's ``info`` (facts stored, length, ones)."""
    return {k: r["correct"][r["info"] == k].mean().item() for k in sorted(set(r["info"].tolist()))}


def over_the_seeds(task_name: str, label: str) -> dict[int, list[float]]:
    """``{info value: [accuracy per seed]}`` for the values every seed's test set contains."""
    per_seed = [by_info(trained[s, task_name, label]) for s in seeds]
    common = sorted(set.intersection(*(set(p) for p in per_seed)))
    return {k: [p[k] for p in per_seed] for k in common}


def order_blind_ceiling(ids: Tensor, lengths: Tensor, per_position: bool) -> Tensor:
    """Per sequence (or per position), the best accuracy of a guess that sees the multiset of the other tokens."""
    if per_position:                                        # at t: any of the other T - 1 tokens
        T = ids.shape[1]
        vocab = TASKS["tagging"].vocab_size
        counts = F.one_hot(ids, vocab).sum(dim=1)           # (n, vocab)
        others = counts[:, None, :] - F.one_hot(ids, vocab)  # (n, T, vocab): without the token at t
        return (others.max(dim=-1).values / (T - 1)).float()[:, 2:]
    ceil = []
    for row, n in zip(ids.tolist(), lengths.tolist(), strict=True):
        prefix = row[: n - 1]                               # every token but the last (the query)
        ceil.append(max(prefix.count(a) for a in set(prefix)) / len(prefix))
    return torch.tensor(ceil)


def labels_of(task_name: str) -> list[str]:
    return [label for t, label, _, _ in RUNS if t == task_name]


ceilings = {}                                               # seed -> {"order": per sequence, "tagging": per position}
for s in seeds:
    ref, tag = trained[s, "order", "attention"], trained[s, "tagging", "attention, no positions"]
    ceilings[s] = {"order": order_blind_ceiling(ref["ids"], ref["lengths"], per_position=False),
                   "tagging": order_blind_ceiling(tag["ids"], None, per_position=True)}

fig, axes = plt.subplots(2, 3, figsize=(16, 8))
axes = axes.flat
panels = [("recall", "recall: accuracy vs facts stored", "number of facts before the question"),
          ("order", "order: the token two before the last", "sequence length"),
          None,
          ("band", "band: are 5, 6 or 7 of the 12 bits ones?", "number of ones"),
          ("parity", "parity of the number of ones", "sequence length")]
for ax, panel in zip(axes[:5], panels, strict=True):
    if panel is None:
        continue
    task_name, title, xlabel = panel
    plot_over_seeds({label: over_the_seeds(task_name, label) for label in labels_of(task_name)}, ax=ax,
                    title=title, xlabel=xlabel, ylabel="accuracy")
order_info = trained[run.seed, "order", "attention"]["info"]
ks = sorted(set(order_info.tolist()))
axes[1].plot(ks, [np.median([ceilings[s]["order"][trained[s, "order", "attention"]["info"] == k].mean().item()
                             for s in seeds]) for k in ks], "k--", label="order-blind ceiling")
plot_over_seeds({label: {t + 2: [trained[s, "tagging", label]["correct"].mean(0)[t].item() for s in seeds]
                         for t in range(trained[run.seed, "tagging", label]["correct"].shape[1])}
                 for label in labels_of("tagging")}, ax=axes[2],
                title="tagging (non-causal): two to the left", xlabel="position t", ylabel="accuracy")
axes[2].axhline(np.median([ceilings[s]["tagging"].mean().item() for s in seeds]), color="k", ls="--",
                label="order-blind ceiling")
axes[3].axvspan(4.5, 7.5, color="gray", alpha=0.15, label="answer: yes")
names = [f"{t}: {label}" for t, label, _, _ in RUNS]
lows, highs = zip(*(accuracy.range(n) for n in names), strict=True)
medians = [accuracy.median(n) for n in names]
axes[5].barh(range(len(names)), medians, color="tab:blue", label="accuracy (median)",
             xerr=[np.subtract(medians, lows), np.subtract(highs, medians)], capsize=3)
axes[5].scatter([TASKS[t].chance for t, _, _, _ in RUNS], range(len(names)), color="k", marker="|", s=200,
                zorder=3, label="chance (majority class)")
axes[5].set_yticks(range(len(names)), [str(k + 1) for k in range(len(names))])
axes[5].invert_yaxis()
axes[5].set(title="every run (numbered as in the table above), range over the seeds", xlabel="test accuracy",
            ylabel="run", xlim=(0, 1.05))
for ax in axes:
    ax.legend(fontsize=7)
for ax in axes[:5]:
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
fig.tight_layout()
plt.show()

# %% [markdown]
# Beside the accuracies, the quantities the conclusions below rest on, one column per seed:
# the order-blind ceilings, recall with one fact and with the most facts, the worst number of
# facts for attention, and parity at the longest length. And, for the recall task, *how* the
# trained layer answers (step 4's question): at the question's position, for each head, the
# share of test questions whose weights peak on the fact with the asked key and the mean weight
# that head puts there, and then the share of questions for which at least one head peaks on
# it (the heads together). The hand-set dictionary of step 4 did it with one head and a weight of
# 1.0.

# %%
def lookup_by_head(r: dict) -> tuple[Tensor, Tensor, Tensor]:
    """For a trained recall model: per head, the share of test questions whose weights at the question
    peak on the fact with the asked key, and the mean weight on that fact (both ``(heads,)``); and the
    share of questions for which at least one head peaks there (a scalar: the heads together)."""
    ids, lengths, model = r["ids"], r["lengths"], r["model"]
    n_facts = lengths - 1                                           # the question stands at n_facts
    with torch.no_grad():
        _, alpha = model.body(model.embed(ids.to(run.device)))
    rows = torch.arange(len(ids))                                   # cpu: ids and alpha.cpu() are on the CPU
    at_question = alpha.cpu()[rows, :, n_facts]                       # (n, heads, T)
    asked = ids[rows, n_facts] - 12 * 8                               # the question token is 96 + key
    is_fact = (ids // 8 == asked[:, None]) & (torch.arange(ids.shape[1])[None] < n_facts[:, None])  # cpu: as ids
    where = is_fact.float().argmax(dim=1)                             # the position of the asked fact
    peaks_there = at_question.argmax(-1) == where[:, None]                # (n, heads)
    return peaks_there.float().mean(0), at_question[rows, :, where].mean(0), peaks_there.any(1).float().mean()


def details(seed: int) -> dict[str, float]:
    recall_gru, recall_att = (by_info(trained[seed, "recall", m]) for m in ("GRU", "attention"))
    peaks, weight, some_head = lookup_by_head(trained[seed, "recall", "attention"])
    return {"order-blind ceiling, order": ceilings[seed]["order"].mean().item(),
            "order-blind ceiling, tagging": ceilings[seed]["tagging"].mean().item(),
            "recall GRU, 1 fact": recall_gru[1], "recall GRU, most facts": recall_gru[max(recall_gru)],
            "recall attention, most facts": recall_att[max(recall_att)],
            "recall attention, worst number of facts": min(recall_att.values()),
            "parity attention, longest": list(by_info(trained[seed, "parity", "attention"]).values())[-1],
            **{f"recall head {g + 1}: peaks on the asked fact": p.item() for g, p in enumerate(peaks)},
            **{f"recall head {g + 1}: mean weight there": w.item() for g, w in enumerate(weight)},
            "recall: best head's peak share": peaks.max().item(),
            "recall: some head peaks on the asked fact": some_head.item()}


measured = over_seeds(details, seeds)
print(measured.table(fmt=".3f"))
xor_bound = 0.75 + 3 * (0.75 * 0.25 / run.test_size) ** 0.5   # the bound plus 3 standard errors of the test set
print(f"xor, one head without FFN: {accuracy.summary('xor: attention, 1 head, no FFN', '.1%')} on "
      f"{run.test_size:,} test sequences (the bound: 75%, {xor_bound:.1%} with three standard errors)")
for a, b in [("recall: attention", "recall: GRU"), ("order: attention", "order: attention, no positions"),
             ("tagging: attention (own positions)", "tagging: attention (key's position in the query)"),
             ("xor: attention, no FFN", "xor: attention, 1 head, no FFN"), ("band: attention", "band: attention, no FFN"),
             ("parity: GRU", "parity: attention")]:
    print(accuracy.verdict(a, b, fmt=".3f"))

# %%
if run.profile != "smoke":                                      # each holds for every seed, or it is not asserted
    def low(name: str) -> float:
        return accuracy.range(name)[0]

    def high(name: str) -> float:
        return accuracy.range(name)[1]

    assert low("recall: attention") > 0.9 and min(accuracy.differences("recall: attention", "recall: GRU")) > 0.2, \
        "attention should retrieve by content where the GRU runs out of memory, for every seed"
    assert min(measured.differences("recall GRU, 1 fact", "recall GRU, most facts")) > 0.3, \
        "the GRU's recall should fall with the number of facts, for every seed"
    assert measured.range("recall attention, worst number of facts")[0] > 0.85, \
        "attention should recall well at every number of facts, for every seed"
    assert low("order: GRU") > 0.95 and low("order: attention") > 0.95, "with positions, order is learned"
    assert all(a < c + 0.05 for a, c in zip(accuracy.values["order: attention, no positions"],
                                             measured.values["order-blind ceiling, order"], strict=True)), \
        "without positions: at most order-blind, for every seed"
    assert low("tagging: attention (own positions)") > 0.95, "with each vector's own position, tagging is learned"
    assert all(a < c + 0.1 for a, c in zip(accuracy.values["tagging: attention (key's position in the query)"],
                                            measured.values["order-blind ceiling, tagging"], strict=True)), \
        "the key's position in the query should be little better than no positions, for every seed"
    assert high("xor: attention, 1 head, no FFN") < xor_bound, \
        "one head without FFN: at most 75% on XOR, plus three standard errors of the test set, for every seed"
    assert low("xor: attention, no FFN") > 0.9, "several heads can compute XOR without an FFN, for every seed"
    assert low("band: attention") > 0.95 and min(accuracy.differences("band: attention", "band: attention, no FFN")) > 0.05, \
        "the FFN should help on a non-monotone function of an average, for every seed"
    assert low("parity: GRU") > 0.95 and high("parity: attention") < 0.85, "parity: recurrence wins, for every seed"
    assert measured.range("parity attention, longest")[1] < 0.65, \
        "one attention layer: parity at chance on long inputs, for every seed"

# %% [markdown]
# What the runs show (the table and figures above hold this run's numbers; every conclusion
# below is asserted, just above, for each of the seeds, unless it says otherwise):
#
# * **Recall: attention's strength.** The attention layer answers nearly every question,
#   however many facts came before (in the `cpu` run, 98.7-99.6% over the three seeds); the GRU
#   of the same width answers every question when there is one fact and falls steeply as their
#   number grows (about half right overall, about a third with 12 facts: 31.2-33.9% over the
#   `cpu` run's three seeds; another seed may land a few points either side). The GRU must decide,
#   fact by fact, what to keep in a fixed state before it knows the question (the frozen
#   proportions of step 2), and with this width and budget it does not manage to keep many. The attention layer
#   keeps every fact and looks the asked key up when the question comes. It does not do so as
#   the hand-set dictionary of step 4 did, with one head whose weight of 1.0 sits on the right
#   fact: in the table of measurements above, each head's weights peak on the asked fact for
#   only part of the questions (in the `cpu` run, 40-66% per head and seed) and put a mean weight
#   of about 0.36-0.62 there; the best head of each seed peaks on it for 59-66% of them. No single
#   head does the lookup alone, but between them they nearly always find it: for 98.2-99.8% of
#   the questions at least one head peaks on the asked fact (the row "some head peaks on the
#   asked fact"). The row does not say whether the heads split the questions or find the same
#   fact together (a reader's check with two more seeds found mostly the latter, two or more
#   heads on the same fact), and a peak is a coarse reading: weights spread over the fact can
#   deliver its value too. Printed, not asserted: how the work is split among the heads is a
#   draw. The
#   price is the one named in step 2 and timed in step 3: a state per position, and work that
#   grows with the square of the length.
# * **Order: positions are needed.** The GRU has order built in; the attention layer learns
#   "two before the last" as well once it has positions. Without them it does no better than
#   the order-blind ceiling (the dashed line), up to the noise of a finite test set (the `cpu`
#   run's seeds land within a few points of their ceilings of about 29%, on either side): the
#   one-layer causal model's last output cannot depend on the order of what precedes it (step
#   7's check), so all it can learn is to guess from the tokens it saw.
# * **Tagging: each vector its own position.** With the query's own position, "the token two to
#   my left" is learned at every position. With the key's position in the query, the slip that
#   step 7 called wrong, the layer does barely better than with no positions at all:
#   its scores can prefer some absolute positions, the same ones for every query, but never one
#   relative to the query.
# * **XOR and band: the FFN.** One head without an FFN stays within the 75% bound of step 8 on
#   XOR (up to the noise of the test set), whether training finds a three-out-of-four solution
#   or stays near chance: in the `cpu` run one seed finds the three-out-of-four solution and two
#   stay at chance, which is why the median is near 50% and the range reaches 75%. Several heads without an FFN solve XOR
#   anyway, because the softmax weights are a non-linear function of the input. One way: a head
#   that seeks the marked ones finds one unless both marked bits are 0 (an OR), a head that
#   seeks the marked zeros finds none only when both are 1 (an AND), and XOR = OR − AND is
#   linear in the two. So attention alone is not a linear map, but its non-linearity is a
#   roundabout one. On the band task, whose answer is a non-monotone function of the fraction
#   of ones (which a head computes by attending evenly), the layer with an FFN is right nearly
#   every time and the layer without one falls well short; the figure shows where, by number of
#   ones. The FFN computes new features from what attention gathered; attention's own
#   non-linearity decides where to look.
# * **Parity: what attention loses.** Counting ones modulo 2 is a two-state recurrence, which
#   the GRU learns perfectly. One attention layer can average (so it can tell *how many* ones
#   there are in short sequences) but the answer flips with every single bit, and its accuracy
#   falls to chance as sequences grow. Hahn (2020) proves that in a soft-attention Transformer of
#   fixed size, flipping one of $n$ input bits moves the output by only $O(1/n)$, so it cannot
#   predict parity confidently as inputs grow. Recurrence is not obsolete: it is a different bias.
#
# The layer is not yet a Transformer layer. Chapter 05 scales the scores by $1/\sqrt{d_k}$
# (and measures why), makes the heads a batch axis in a fused kernel, and checks the result
# against PyTorch's own modules; chapter 06 gives positions their full treatment; chapter 07 adds
# the residual connections and layer normalisation around attention and the FFN, stacks layers,
# and assembles the encoder-decoder.
#
# ## Summary
#
# * **Step 1.** The GRU's state at every position is a per-unit weighted sum of its candidates,
#   $h_t = \sum_{i \le t} w_{t,i} \odot \tilde h_i$ with $w_{t,i} = (1 - z_i) \prod_{j=i+1}^t z_j$
#   (checked for every $t$, reusing chapter 01's functions).
# * **Step 2.** A causal weighted sum given the GRU's own weights and candidates reproduces the
#   GRU exactly. In the GRU, each step rescales all old weights by the same gate, so the
#   proportions of the past are frozen (checked); a softmax over positions of a learned score
#   $q_t^\top \tilde h_i$ re-weighs the past at every step, sums to one, and has no recurrence in
#   its weights, but shares one weighting across all units (the GRU's units weigh the positions
#   differently, measured).
# * **Step 3.** Candidates from $x_i$ alone (the GRU's candidate with the reset gate closed) make
#   the layer a few matrix products, equal to the position-by-position loop. The parallel form
#   has one sequential step instead of $T$, and a path of one step between any two positions
#   instead of $T$; its arithmetic is $O(T^2 d)$ against the GRU's $O(T d^2)$, so it does less
#   work than `nn.GRU` only while $T < 2d$ here, and on a CPU it is slower than `nn.GRU` at the
#   longest length timed, $16 d$ (measured).
# * **Step 4.** Queries, keys and values from three linear maps: the score is Luong's general
#   score with $W_a = W_Q^\top W_K$ (checked), and a position can be found by one part of its
#   vector and deliver another (a dictionary lookup, checked by hand-set weights; trained on the
#   recall task, the layer answers with several heads that between them find the asked fact,
#   rather than with one sharp head (measured)).
# * **Step 5.** Heads: $h$ attentions on slices of the projections, concatenated and mixed by
#   $W_O$; a reshape equals a loop over heads. Two heads answer two questions where one head
#   averages.
# * **Step 6.** Without the causal mask every position reads the whole sequence; with it, outputs
#   cannot change when the future does (checked).
# * **Step 7.** Without positions the non-causal layer is permutation equivariant, and a causal
#   layer's last output ignores the order of its prefix (checked). Positions go to each vector's
#   own index: $q_t$ from $x_t + p(t)$, $k_i$ and $v_i$ from $x_i + p(i)$, and
#   $h_t = \sum_i \alpha_{t,i} v_i$. Giving the query the key's position $p(i)$ makes every
#   query's positional preference the same (checked, and measured: little better than no
#   positions on a relative-position task).
# * **Step 8.** Given its weights, attention is linear and convex; given their weights, two
#   attention layers with nothing in between mix like one (checked), and layer 2's weights
#   depend on what layer 1 read. One head with no FFN and a linear read-out cannot compute XOR of
#   two marked bits (proved, and measured); several heads can (XOR measured), but a position-wise
#   FFN is what makes a non-linear function of what was gathered easy (measured on the band task).
# * Measured side by side and asserted for every seed (three of three in the `cpu` run printed
#   here; the `gpu` profile runs five): attention beats the GRU at content retrieval from many
#   facts; the GRU needs no positions and wins at parity.
#
# ## Exercises
#
# ### Questions
#
# 1. In step 2 the GRU's weights satisfy $w_{t+1,i} = z_{t+1} \odot w_{t,i}$. Give an example
#    sentence in which a word late in the sentence should change which of two earlier words
#    matters more for the next prediction. How could a GRU still cope (think of what the
#    candidates can contain)?
# 2. `FreeWeights` (step 2) keeps every candidate. How do its work and memory per sequence grow
#    with $T$, compared with the GRU's? And those of the parallel layer of step 3?
# 3. With the key's position in the query, the score is $W_Q x_t \cdot k_i + b_i$ where $b_i$
#    does not depend on $t$. In a **causal** layer, show that $b_i = c \cdot i$ gives weights
#    that decay geometrically with $t - i$ for every query: the mask's cut-off at $i = t$ and the
#    softmax's indifference to adding a constant let a position-blind score express recency.
#    Why does that not work without the mask, and what does it mean for the claim "a causal
#    model needs no positions"? (Haviv et al. 2022 study this for language models.)
# 4. Prove the claim of step 7: the last output of a one-layer causal attention without
#    positions does not change when the positions $1 \dots T-1$ are permuted. Does the claim
#    hold for the output at position $T$ of a *two*-layer model?
# 5. Step 5 compares the GRU with $H$ weightings of width 1, one per hidden unit, and writes
#    $\log w_{t,i} = \log(1 - z_i) - L_i + L_t$. Which term plays the key, which the query? Why
#    is this not a softmax, what do its weights sum to, and why can those "heads" not be
#    computed in parallel?
# 6. Step 8 bounds one head at 75% on XOR. Construct, with two heads and no FFN, weights that
#    solve it (hint: OR − AND), and explain why the bound's argument fails for two heads.
# 7. Replace $\exp(q_t^\top k_i)$ by $\phi(q_t)^\top \phi(k_i)$ for a feature map $\phi$ with
#    positive values (Katharopoulos et al. 2020). Show that causal attention can then be computed
#    with a recurrence whose state is the matrix $S_t = \sum_{i \le t} \phi(k_i) v_i^\top$ and the
#    vector $z_t = \sum_{i \le t} \phi(k_i)$. What has come back from the GRU, and what has not?
#
# ### Coding exercises
#
# Fill in each function and run the cell: the checker says "correct!", tells you what is wrong,
# or, while the stub still raises `NotImplementedError`, gives a hint. Solutions are in
# `notebooks/solutions/04_gru_to_self_attention_solutions.ipynb`. The three exercises turn
# questions 6, 7 and 4 into code; the checkers run your weights or your step function in their
# own code, on sequences you do not see.
#
# **1. XOR with two heads, set by hand (question 6).** The xor task of the experiments: tokens
# 0 and 1 are unmarked bits, 2 and 3 the marked bits 0 and 1, and 4 the question, always last.
# Exactly two bits are marked. Build a causal attention layer with **two heads, no FFN and no
# positions** that answers the XOR of the two marked bits at the question, for every sequence of
# up to `T_max` tokens. The layer reads one-hot tokens $x_i \in \{0,1\}^5$; head $g$ computes
# $\text{head}_g = \sum_i \operatorname{softmax}_i\big((W_Q^{(g)} x_T)^\top W_K^{(g)} x_i\big)\, W_V^{(g)} x_i$
# at the last position $T$ (no scaling), and the answer is 1 when
# $w^\top [\text{head}_1; \text{head}_2] + b > 0$. Section 8 proved that one head cannot do this;
# the experiments' closing notes say how two heads can, but not how sharp they must be.

# %%
def xor_heads(T_max: int) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    """Return ``(W_Q, W_K, W_V, w, b)``: ``W_Q`` and ``W_K`` ``(2, d_k, 5)``, ``W_V`` ``(2, d_v, 5)`` (one
    slice per head, applied to one-hot tokens of width 5), ``w`` ``(2 * d_v,)`` reading the two heads
    side by side, and ``b`` a number. Right on every sequence of length 3 to ``T_max``."""
    raise NotImplementedError  # your code here


exercises.check("04.xor_two_heads", xor_heads)

# %% [markdown]
# **2. Linear attention as a recurrence (question 7).** Replace $\exp(q_t^\top k_i)$ by
# $\phi(q_t)^\top \phi(k_i)$ for positive features $\phi$. Write **one step** of causal linear
# attention with a state of fixed size: given the state after positions $< t$, the matrix
# $S = \sum_{i<t} \phi(k_i) v_i^\top$ and the vector $z = \sum_{i<t} \phi(k_i)$ (both zero before
# the first position), and the features of position $t$, return the state after position $t$ and
# the output $\text{out}_t = \sum_{i \le t} \phi(q_t)^\top \phi(k_i)\, v_i \big/ \sum_{i \le t}
# \phi(q_t)^\top \phi(k_i)$. The checker feeds you one position at a time, so the future is out of
# reach, and compares every output with masked linear attention computed as a $T \times T$
# matrix. The step costs the same at every position, whatever $t$: the GRU's constant cost per
# token is back.

# %%
def linear_attention_step(S: Tensor, z: Tensor, phi_q: Tensor, phi_k: Tensor,
                          v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``S`` ``(B, m, d_v)`` and ``z`` ``(B, m)``: the state after positions ``< t``; ``phi_q``, ``phi_k``
    ``(B, m)``: the positive features of ``q_t`` and ``k_t``; ``v`` ``(B, d_v)``: ``v_t``.
    Return ``(S, z, out)``: the state after position ``t`` (same shapes) and ``out_t`` ``(B, d_v)``."""
    raise NotImplementedError  # your code here


exercises.check("04.linear_attention_recurrence", linear_attention_step)

# %% [markdown]
# **3. Order from the causal mask (questions 3 and 4).** Section 7 checked that the last output of
# one causal layer without positions ignores the order of its prefix. Two layers need not. Tokens:
# 0 a filler, 1 = A, 2 = B, 3 the question, always last; each sequence holds one A and one B.
# Build two causal one-head layers **without positions** whose answer at the question is 1 exactly
# when A comes before B, for every sequence of up to `T_max` tokens. Layer 1 reads the one-hot
# tokens $x_t \in \{0,1\}^4$ and computes $h^{(1)}_t = \sum_{i \le t}
# \operatorname{softmax}_{i \le t}\big((W_{Q1} x_t)^\top W_{K1} x_i\big)\, W_{V1} x_i$ at every
# position; layer 2 reads $u_t = [x_t; h^{(1)}_t]$ (the token and layer 1's output side by side, a
# residual stream by concatenation) and is read at the last position, as in exercise 1:
# $h^{(2)} = \sum_i \operatorname{softmax}_i\big((W_{Q2} u_T)^\top W_{K2} u_i\big)\, W_{V2} u_i$; the
# answer is 1 when $w^\top h^{(2)} + b > 0$. No scaling.

# %%
def order_layers(T_max: int) -> tuple[Tensor, ...]:
    """Return ``(W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b)``: ``W_Q1``, ``W_K1`` ``(d_k, 4)``, ``W_V1``
    ``(d_1, 4)``; ``W_Q2``, ``W_K2`` ``(d_k2, 4 + d_1)``, ``W_V2`` ``(d_2, 4 + d_1)``; ``w`` ``(d_2,)``;
    ``b`` a number. Right on every sequence of length 3 to ``T_max``."""
    raise NotImplementedError  # your code here


exercises.check("04.order_from_the_mask", order_layers)

# %% [markdown]
# ## References
#
# * K. Cho, B. van Merriënboer, C. Gulcehre, D. Bahdanau, F. Bougares, H. Schwenk, Y. Bengio
#   (2014). *Learning phrase representations using RNN encoder–decoder for statistical machine
#   translation.* EMNLP. The GRU (§2.3, "Hidden unit that adaptively remembers and forgets"),
#   the starting point of step 1.
# * D. Bahdanau, K. Cho, Y. Bengio (2014). *Neural machine translation by jointly learning to
#   align and translate.* arXiv:1409.0473 (ICLR 2015). Weights over positions from a learned
#   score and a softmax (§3.1): the idea of step 2, there across two sequences.
# * M.-T. Luong, H. Pham, C. D. Manning (2015). *Effective approaches to attention-based neural
#   machine translation.* EMNLP. The dot and general scores (§3.1); step 4's $q_t^\top k_i$ is the
#   general score with a factored matrix.
# * S. Sukhbaatar, A. Szlam, J. Weston, R. Fergus (2015). *End-to-end memory networks.* NeurIPS.
#   Each memory embedded twice, once to be matched with the question and once to be read (§2.1),
#   several hops, and a learned "temporal encoding" added to the memories (§4.1): step 4's keys
#   and values, and step 7's learned positions, before the Transformer.
# * A. Miller, A. Fisch, J. Dodge, A.-H. Karimi, A. Bordes, J. Weston (2016). *Key-value memory
#   networks for directly reading documents.* EMNLP. Memories stored as (key, value) pairs: the
#   key is matched, the value is read (step 4).
# * M. Daniluk, T. Rocktäschel, J. Welbl, S. Riedel (2017). *Frustratingly short attention spans
#   in neural language modeling.* ICLR. An LSTM language model whose output is split into key,
#   value and predict vectors, attending over its own past: step 4 inside a recurrent model.
# * J. Gehring, M. Auli, D. Grangier, D. Yarats, Y. N. Dauphin (2017). *Convolutional sequence to
#   sequence learning.* ICML. Learned absolute position embeddings added to the input embeddings
#   (§3.1), the form of step 7.
# * J. Cheng, L. Dong, M. Lapata (2016). *Long short-term memory-networks for machine reading.*
#   EMNLP. An LSTM that keeps all its past states and attends over them at every step
#   ("intra-attention"): step 2 as a model.
# * Z. Lin, M. Feng, C. N. dos Santos, M. Yu, B. Xiang, B. Zhou, Y. Bengio (2017). *A structured
#   self-attentive sentence embedding.* ICLR. Several attention distributions over one
#   sentence's own states (§2); chapter 03 trained it.
# * A. Vaswani, N. Shazeer, N. Parmar, J. Uszkoreit, L. Jones, A. N. Gomez, Ł. Kaiser, I.
#   Polosukhin (2017). *Attention is all you need.* NeurIPS. Scaled dot-product attention
#   (§3.2.1), multi-head attention (§3.2.2), its three uses and the decoder's causal mask
#   (§3.2.3), the position-wise feed-forward network (§3.3), positional encoding (§3.5), and
#   why self-attention, sequential operations and path lengths against recurrence (§4, Table 1).
# * A. Katharopoulos, A. Vyas, N. Pappas, F. Fleuret (2020). *Transformers are RNNs: fast
#   autoregressive transformers with linear attention.* ICML. Attention with a kernel feature map
#   (§3.2), causal masking as a running sum (§3.3), and the resulting recurrence (§3.4): the road
#   of this chapter travelled backwards (question 7).
# * N. Elhage, N. Nanda, C. Olsson et al. (2021). *A mathematical framework for transformer
#   circuits.* Transformer Circuits Thread. Attention-only models read as paths; two layers
#   compose (K- and Q-composition) into induction heads, which one layer cannot form. C. Olsson
#   et al. (2022), *In-context learning and induction heads*, same thread, trace them in trained
#   models.
# * M. Hahn (2020). *Theoretical limitations of self-attention in neural sequence models.*
#   TACL 8, 156–171. Limits of fixed-size hard (§5) and soft (§6) attention on parity and on
#   hierarchical structure; for soft attention, one flipped input moves the output by $O(1/n)$ (§6).
# * A. Haviv, O. Ram, O. Press, P. Izsak, O. Levy (2022). *Transformer language models without
#   positional encodings still learn positional information.* Findings of EMNLP. The causal mask
#   as a source of position (question 3).
# * J. Ba, G. Hinton, V. Mnih, J. Z. Leibo, C. Ionescu (2016). *Using fast weights to attend to
#   the recent past.* NeurIPS. An associative retrieval task like our recall task, on which
#   recurrent networks with a fixed state struggle.

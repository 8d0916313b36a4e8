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
# # 01 · Solutions: recurrent networks and the GRU
#
# Worked solutions to the exercises of chapter 01. Each coding solution is followed by its
# checker with `must_pass=True`, so this notebook fails loudly if a solution (or a checker)
# breaks. Try the exercises in the chapter before reading on.

# %%
import torch
from torch import Tensor

from tfmlib import exercises

# %% [markdown]
# ## Coding exercises
#
# **1. One vanilla RNN step.** With `x` of shape `(B, I)` and `W_xh` of shape `(H, I)`,
# `x @ W_xh.T` is `(B, H)`: the batch version of $W_{xh} x$. The bias broadcasts over the batch.

# %%
def rnn_step(x: Tensor, h: Tensor, W_xh: Tensor, W_hh: Tensor, b: Tensor) -> Tensor:
    return torch.tanh(x @ W_xh.T + h @ W_hh.T + b)


exercises.check("01.rnn_step", rnn_step, must_pass=True)

# %% [markdown]
# **2. One GRU step from PyTorch's stacked weights.** Cut each stacked tensor into its three
# gates in the order reset, update, candidate. The reset gate multiplies the *whole* hidden-side
# term of the candidate, bias included, and the update gate keeps the old state.

# %%
def gru_step(x: Tensor, h: Tensor, W_ih: Tensor, W_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> Tensor:
    W_ir, W_iz, W_in = W_ih.chunk(3)
    W_hr, W_hz, W_hn = W_hh.chunk(3)
    b_ir, b_iz, b_in = b_ih.chunk(3)
    b_hr, b_hz, b_hn = b_hh.chunk(3)
    r = torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
    z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
    n = torch.tanh(x @ W_in.T + b_in + r * (h @ W_hn.T + b_hn))
    return (1 - z) * n + z * h


exercises.check("01.gru_step", gru_step, must_pass=True)

# %% [markdown]
# **3. The unrolled weights.** Row 0 is the product of all gates; row $i$ (1-based step $i$,
# which is `z[i - 1]` in 0-based indexing) is $(1 - z_i)$ times the product of the gates of the
# steps *after* it, `z[i:]` (an empty product is 1, which `prod` gives for an empty slice).

# %%
def unrolled_weights(z: Tensor) -> Tensor:
    T, H = z.shape
    w = z.new_empty(T + 1, H)  # same dtype and device as z
    w[0] = z.prod(dim=0)
    for i in range(1, T + 1):
        w[i] = (1 - z[i - 1]) * z[i:].prod(dim=0)
    return w


exercises.check("01.unrolled_weights", unrolled_weights, must_pass=True)

# %% [markdown]
# A loop-free version uses a reversed cumulative product, `keep[i] = prod_{j >= i} z_j`, which
# is how `tfmlib.rnn.unrolled_gru_weights` does it:

# %%
def unrolled_weights_vectorised(z: Tensor) -> Tensor:
    keep = z.flip(0).cumprod(0).flip(0)                        # keep[i] = z_i * ... * z_T
    after = torch.cat([keep[1:], torch.ones_like(z[:1])])      # prod over j > i
    return torch.cat([keep[:1], (1 - z) * after])


exercises.check("01.unrolled_weights", unrolled_weights_vectorised, must_pass=True)
z = torch.rand(7, 3, generator=torch.Generator().manual_seed(0))
assert torch.allclose(unrolled_weights(z).sum(0), torch.ones(3)), "the weights should sum to one"
assert torch.allclose(unrolled_weights(z), unrolled_weights_vectorised(z)), "loop and cumprod should agree"

# %% [markdown]
# ## Questions
#
# **1. A bound above one, yet decay.** $\lVert W_{hh}\rVert_2$ bounds how much *one* step can
# stretch a vector; the bound $\lVert W_{hh}\rVert^{T-t}$ is only an upper bound, and it is loose
# when the direction stretched most by one step is not the one stretched most by the next (for a
# non-symmetric matrix it usually is not). Over many steps the powers of a fixed matrix behave
# like $\rho(W)^{k}$, where $\rho$ is the spectral radius (Gelfand's formula:
# $\lVert W^k \rVert^{1/k} \to \rho(W)$), and $\rho \le \lVert W \rVert_2$ always. The chapter
# printed $\rho$ below one and $\lVert W_{hh}\rVert_2$ above one for the default RNN, and the
# $\tanh'$ factors (at most 1) shrink the product further, which is why the measured factor per
# step was below even $\rho$. So the measured decay does not contradict the bound: the bound
# just says nothing useful when $\lVert W_{hh} \rVert_2 > 1$, and the decay over many steps is
# governed by the spectral radius (times the typical $\tanh'$), not by the norm.
#
# **2. A GRU that always keeps.** With $z_t \approx 0.98$, each new candidate enters the state
# with weight $1 - z_t \approx 0.02$: the network barely listens to its input, and its state
# moves slowly. The same factor scales learning: differentiating
# $h_t = (1 - z_t) \odot n_t + z_t \odot h_{t-1}$ with respect to the input,
#
# $$ \frac{\partial h_t}{\partial x_t} = \operatorname{diag}(1 - z_t)\,\frac{\partial n_t}{\partial x_t}
#    + \operatorname{diag}(h_{t-1} - n_t)\,\operatorname{diag}\big(z_t (1 - z_t)\big)\, W_{iz}, $$
#
# and both terms carry a factor $1 - z_t \approx 0.02$. The gradients that would teach the
# input-side weights are about 25 times smaller than in a GRU with $z \approx 0.5$. Gradients reach far back, but
# what they reach is a state that hardly depends on any one word. A language model initialised
# that way starts as a slow, smooth integrator of its inputs and predicts poorly at first; it
# can learn (the biases are trainable), but it must first learn to *lower* $z$ for the units
# that should react to the current word. A moderate positive bias on the update gate (the GRU
# analogue of the LSTM "forget-gate bias of 1", Jozefowicz, Zaremba & Sutskever, 2015) is
# a common compromise.
#
# **3. A constant gate.** With $z_t = z$, $\prod_{j=i+1}^{T} z_j = z^{T-i}$, so
# $w_i = (1 - z)\, z^{T-i}$ and $w_0 = z^T$: an exponential moving average of the candidates.
# A candidate's weight halves after $k$ steps when $z^k = 1/2$, i.e. $k = \ln 2 / (-\ln z)$;
# for $z = 0.9$ that is about 6.6 steps.
#
# **4. Every weighting is reachable.** Work backwards from $P_T = 1$. Since
# $w_i = P_i - P_{i-1}$ (section 4), $P_{i-1} = P_i - w_i$, so
# $P_i = 1 - \sum_{k > i} w_k = \sum_{k \le i} w_k$, a non-decreasing sequence in $[0, 1]$
# with $P_0 = w_0$. Choose $z_i = P_{i-1} / P_i$ (and $z_i = 0$ where $P_i = 0$); then
# $0 \le z_i \le 1$, the product $\prod_{j > i} z_j$ telescopes to $P_i / P_T = P_i$, and
# $(1 - z_i) P_i = P_i - P_{i-1} = w_i$. (Where $P_i = 0$, all weights up to $i$ are zero, and
# the first later $z_j = 0$ makes the product zero, as it should be.) So a GRU unit could in
# principle put, say, all its weight on the third word of the sentence: write at step 3
# ($z_3 = 0$), then keep ($z_j = 1$) at every later step. The limitation is *when and from
# what* the weights are chosen: $z_i$ must be decided at step $i$ from $x_i$ and $h_{i-1}$
# alone, before the network knows which later prediction will need the word, and the choice is
# then fixed for every later use.
#
# **5. What attention can do that these weights cannot.** (a) Depend on a *query* chosen at read
# time (the decoder's current state, another word of the sentence): different queries get
# different weights over the same positions. The GRU commits to one weighting per unit while
# it reads (question 4). (b) Keep every value vector and retrieve any one of them later: the
# GRU stores only the blend, $H$ numbers, and once two candidates have been averaged into a
# unit no later question can separate them again. Attention's memory grows with the length
# of the input; the GRU's is fixed. Also: attention weights are computed in parallel for all
# positions, and the values they average do not depend on each other, while each GRU
# candidate $n_i$ depends on the previous state. (One thing goes the other way: the GRU has a
# separate weighting for every hidden unit, while one attention head uses the same weight for
# all features of a value vector; multi-head attention, chapter 05, recovers some of that.)
#
# **6. Parameters at equal width.** An `nn.RNN` layer has $W_{ih}$ ($H \times E$), $W_{hh}$
# ($H \times H$) and two biases: $HE + H^2 + 2H$ parameters. An `nn.GRU` layer has three of
# each, one per block ($r$, $z$, $n$): $3(HE + H^2 + 2H)$. The embedding and the read-out are
# the same, so the GRU model has $2(HE + H^2 + 2H)$ more parameters; with $E = 64$, $H = 128$
# that is $2(8192 + 16384 + 256) = 49{,}664$, the difference of the two printed counts. For a
# comparison at equal parameter count, widen the RNN to $H'$ such that its total matches:
# $H'^2 + H'(E + 2 + V) + V(E + 1) = N_{\text{GRU}}$, where the $H' V$ term is the wider
# read-out. With the `cpu` profile's sizes ($V = 292$) that is $H' \approx 200$. Then compare
# at equal training time as well: the GRU is slower per step, and a fair comparison gives
# both the same budget.
#
# **7. Padding in the loss.** Padding positions are not words of the sentence: their "targets"
# are `PAD`, which the model would learn to predict trivially after `EOS`. Counting them would
# add many near-zero losses to the average and report a perplexity that is better than the
# model really is (and that changes with how batches are padded). `ignore_index=PAD_ID` drops
# them, and `lm_loss` returns the number of real targets so that epoch averages weight each
# batch by its real tokens.
#
# ## References
#
# * R. Jozefowicz, W. Zaremba, I. Sutskever (2015). *An empirical exploration of recurrent
#   network architectures.* ICML. Among other findings, that a forget-gate bias of 1 closes
#   most of the gap between the LSTM and the GRU.
# * The chapter's references, in particular Pascanu, Mikolov & Bengio (2013, §2) for the
#   spectral radius and the norm of $W_{hh}$.

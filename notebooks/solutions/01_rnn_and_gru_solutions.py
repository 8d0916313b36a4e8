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
# **1. One vanilla RNN step.** With `x` of shape `(B, D)` and `W_xh` of shape `(H, D)`,
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
    w = torch.empty(T + 1, H, dtype=z.dtype)
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
z = torch.rand(7, 3)
assert torch.allclose(unrolled_weights(z).sum(0), torch.ones(3)), "the weights should sum to one"

# %% [markdown]
# ## Questions
#
# **1. A bound above one, yet decay.** $\lVert W_{hh}\rVert_2$ bounds how much *one* step can
# stretch a vector; the bound $\lVert W_{hh}\rVert^{T-t}$ is only an upper bound and is loose
# when the stretched direction is not the one that gets stretched again. Over many steps the
# product of the same matrix behaves like $\rho(W_{hh})^{T-t}$, where $\rho$ is the spectral
# radius (Gelfand's formula: $\lVert W^k \rVert^{1/k} \to \rho(W)$). The chapter printed
# $\rho < 1 < \lVert W_{hh}\rVert_2$ for the default RNN, and the $\tanh'$ factors (at most 1)
# shrink the product further. So the measured decay is consistent with the bound; it is just
# governed by the spectral radius, not the norm.
#
# **2. A GRU that always keeps.** With $z_t \approx 0.98$, each new candidate enters the state
# with weight $1 - z_t \approx 0.02$: the network barely listens to its input, and its state
# moves slowly. Gradients reach far back, but what they reach is a state that hardly depends on
# the recent words. A language model initialised that way starts as a very smooth, slow
# integrator; it can learn (the biases are trainable), but it must first learn to *lower* $z$
# for the units that should react to the current word. A moderate positive bias on the update
# gate (the GRU analogue of the LSTM "forget-gate bias of 1", Jozefowicz et al., 2015) is a
# common compromise.
#
# **3. A constant gate.** With $z_t = z$, $\prod_{j=i+1}^{T} z_j = z^{T-i}$, so
# $w_i = (1 - z)\, z^{T-i}$ and $w_0 = z^T$: an exponential moving average of the candidates.
# A candidate's weight halves after $k$ steps when $z^k = 1/2$, i.e. $k = \ln 2 / (-\ln z)$;
# for $z = 0.9$ that is about 6.6 steps.
#
# **4. What attention weights can do that these cannot.** (a) Be large for a far-away position
# and small for the positions in between: the GRU's weight of $n_i$ is a product over every
# later step, so it can only stay large if every later gate keeps it. (b) Depend on a *query*
# chosen at read time (the decoder's current state, another word): the GRU fixes the weights
# while it reads, before it knows what will be asked. Also: attention weights are computed in
# parallel for all positions, and the values they average do not depend on each other, while
# the GRU's candidates $n_i$ depend on the previous states.
#
# **5. Padding in the loss.** Padding positions are not words of the sentence: their "targets"
# are `PAD`, which the model would learn to predict trivially after `EOS`. Counting them would
# add many near-zero losses to the average and report a perplexity that is better than the
# model really is (and that changes with how batches are padded). `ignore_index=PAD_ID` drops
# them, and `lm_loss` returns the number of real targets so that epoch averages weight each
# batch by its real tokens.

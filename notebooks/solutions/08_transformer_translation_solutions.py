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
# # 08 · Solutions: training the Transformer to translate
#
# Worked solutions to the coding exercises of chapter 08, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is also compared with what the package (or PyTorch) computes. Try the exercises in
# the chapter first.

# %%
import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib import exercises
from tfmlib.data import PAD_ID
from tfmlib.train import transformer_peak_lr, warmup_inverse_sqrt

# %% [markdown]
# ## Coding exercises
#
# **1. A label-smoothed loss that ignores padding.** Expand $-\sum_k q_k \log p_k$ with
# $q = (1 - \varepsilon)\,\text{one-hot} + \varepsilon / V$: it is $(1 - \varepsilon)$ times the
# plain negative log-likelihood plus $\varepsilon$ times the mean of $-\log p_k$ over the $V$
# tokens. No $(B, T, V)$ target tensor is needed. The average runs over the real tokens only:
# select them with the mask *before* averaging (multiplying the loss by the mask and dividing by
# the number of all positions would shrink it).

# %%
def smoothed_loss(logits: Tensor, targets: Tensor, eps: float) -> Tensor:
    log_p = F.log_softmax(logits, dim=-1)                            # (B, T, V)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)           # (B, T): -log p(reference)
    uniform = -log_p.mean(dim=-1)                                     # (B, T): cross-entropy with 1/V
    per_token = (1 - eps) * nll + eps * uniform
    return per_token[targets != PAD_ID].mean()


exercises.check("08.smoothed_loss", smoothed_loss, must_pass=True)

# %% [markdown]
# It is what `tfmlib.seq2seq.translation_loss` computes, through `F.cross_entropy`'s
# `label_smoothing` and `ignore_index`:

# %%
torch.manual_seed(0)
logits, targets = torch.randn(4, 6, 30), torch.randint(1, 30, (4, 6))
targets[2, 4:] = PAD_ID
for eps in (0.0, 0.1, 0.3):
    mine = smoothed_loss(logits, targets, eps)
    pytorch = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_ID, label_smoothing=eps)
    print(f"eps = {eps}: solution {mine.item():.6f}, F.cross_entropy {pytorch.item():.6f}")
    assert torch.allclose(mine, pytorch, atol=1e-6), "the solution must match PyTorch's label smoothing"

# %% [markdown]
# **2. The paper's learning rate.** Eq. (3) as written: the smaller of the rising branch
# $s \cdot w^{-1.5}$ and the falling branch $s^{-0.5}$, times $d_{\text{model}}^{-0.5}$. The two
# branches meet at $s = w$.

# %%
def transformer_lr(step: int, d_model: int, warmup: int) -> float:
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


exercises.check("08.transformer_lr", transformer_lr, must_pass=True)

# %% [markdown]
# The package writes the same schedule as a peak times a shape that peaks at 1; the shape is
# called with the number of steps already taken, so step $s$ is `factor(s - 1)`:

# %%
for d_model, warmup in [(512, 4000), (128, 100)]:
    factor, peak = warmup_inverse_sqrt(warmup), transformer_peak_lr(d_model, warmup)
    for s in (1, warmup // 2, warmup, 10 * warmup):
        assert abs(peak * factor(s - 1) - transformer_lr(s, d_model, warmup)) < 1e-15
    print(f"d_model={d_model}, warmup={warmup}: peak {transformer_lr(warmup, d_model, warmup):.3e} at step "
          f"{warmup}, equal to tfmlib's peak {peak:.3e}")

# %% [markdown]
# **3. One step of beam search.** Add each prefix's score to its $V$ extensions, flatten the
# $K \cdot V$ candidates of a sentence into one row, and take the top $K$. A flat index $j$
# came from prefix $j \,/\!/\, V$ and adds token $j \bmod V$. Taking the best token of each
# prefix instead would be wrong: the $K$ best extensions may all come from one prefix.

# %%
def beam_step(beam_scores: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    B, K, V = log_probs.shape
    candidates = (beam_scores[:, :, None] + log_probs).reshape(B, K * V)
    scores, index = candidates.topk(K, dim=1)                        # sorted, best first
    return scores, index // V, index % V


exercises.check("08.beam_step", beam_step, must_pass=True)

# %% [markdown]
# At the first step of a search only one prefix per sentence is live (the others are at
# $-\infty$), so all $K$ extensions come from it, as they should:

# %%
torch.manual_seed(1)
log_probs = torch.log_softmax(torch.randn(2, 3, 6), dim=-1)
beam_scores = torch.tensor([[0.0, float("-inf"), float("-inf")]] * 2)
scores, beams, tokens = beam_step(beam_scores, log_probs)
print("prefixes extended:", beams.tolist(), "\ntokens added:     ", tokens.tolist())
assert (beams == 0).all() and torch.equal(tokens, log_probs[:, 0].topk(3).indices)

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
# # 05 · Solutions: scaled dot-product and multi-head attention
#
# Worked solutions to the coding exercises of chapter 05, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is also compared with the package's implementation in `tfmlib.attention`, which the
# chapter showed and tested against PyTorch. Try the exercises in the chapter first.

# %%
import torch
from torch import Tensor

from tfmlib import exercises
from tfmlib.attention import causal_mask, fast_attention, scaled_dot_product_attention, split_heads

# %% [markdown]
# ## Coding exercises
#
# **1. Scaled dot-product attention with a mask.** Three details make it right. The scale is
# $1/\sqrt{d_k}$ with $d_k$ the width of the queries and keys (`q.shape[-1]`). The softmax runs
# over the keys, the last axis. And the mask is applied twice: before the softmax, as a very
# negative but *finite* score (with $-\infty$ a row that may see nothing is $0/0$ = NaN), and
# after it, as a multiplication that turns such a row into zeros and leaves the others as they
# are (their hidden entries are already exactly 0).

# %%
def attention_exercise(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5                  # (B, h, T, S)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)      # hidden keys: as low as possible
    weights = torch.softmax(scores, dim=-1) * mask                         # a row that sees nothing -> zeros
    return weights @ v, weights


exercises.check("05.attention", attention_exercise, must_pass=True)

# %% [markdown]
# The same computation as the package's explicit and fast attentions, on a padded batch with a
# causal mask in which the padded queries see nothing:

# %%
torch.manual_seed(0)
B, h, T, d = 3, 2, 6, 4
q, k, v = (torch.randn(B, h, T, d) for _ in range(3))
keep = torch.arange(T)[None, :] < torch.tensor([6, 4, 1])[:, None]
mask = keep[:, None, None, :] & causal_mask(T) & keep[:, None, :, None]   # (B, 1, T, T)
mine, my_weights = attention_exercise(q, k, v, mask)
package, package_weights = scaled_dot_product_attention(q, k, v, mask)
fast = fast_attention(q, k, v, mask)
print(f"max |solution - package explicit| = {(mine - package).abs().max().item():.1e}, "
      f"|solution - package fast| = {(mine - fast).abs().max().item():.1e}")
assert torch.allclose(mine, package, atol=1e-6) and torch.allclose(my_weights, package_weights, atol=1e-6)
assert torch.allclose(mine, fast, atol=1e-5), "the solution must match tfmlib's fast attention"

# %% [markdown]
# **2. Heads as a batch axis.** `view(B, L, heads, d)` keeps the features of one position
# together and cuts them into `heads` slices of `d`; `transpose(1, 2)` then moves the heads in
# front of the positions. The result is a view with unusual strides (no copy); the matrix
# products that follow accept it as it is.

# %%
def split_heads_exercise(x: Tensor, heads: int) -> Tensor:
    B, L, D = x.shape
    return x.view(B, L, heads, D // heads).transpose(1, 2)


exercises.check("05.split_heads", split_heads_exercise, must_pass=True)
x = torch.randn(2, 5, 12)
assert torch.equal(split_heads_exercise(x, 3), split_heads(x, 3)), "the solution must match tfmlib's split_heads"
print("matches tfmlib.attention.split_heads; contiguous:", split_heads_exercise(x, 3).is_contiguous())

# %% [markdown]
# **3. A causal mask for cached keys.** Query $t$ is position $t + S - T$ of the whole sequence,
# so it may see keys $0, \dots, t + S - T$: the lower triangle shifted right by $S - T$, which
# is `tril`'s `diagonal` argument. With $S = T$ it is the usual lower triangle.

# %%
def causal_mask_exercise(T: int, S: int) -> Tensor:
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)


exercises.check("05.causal_mask", causal_mask_exercise, must_pass=True)
for T, S in [(3, 3), (2, 5)]:
    assert torch.equal(causal_mask_exercise(T, S), causal_mask(T, S)), "the solution must match tfmlib's"
print(causal_mask_exercise(2, 5).int())

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
# # 07 · Solutions: the Transformer architecture
#
# Worked solutions to the coding exercises of chapter 07, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is also compared with the package's modules, which the chapter checked against
# PyTorch. Try the exercises in the chapter first.

# %%
import torch
from torch import Tensor, nn

from tfmlib import exercises
from tfmlib.attention import padding_mask
from tfmlib.transformer import DecoderLayer, EncoderLayer, LayerNormScratch

# %% [markdown]
# ## Coding exercises
#
# **1. Layer normalisation from the formula.** Both statistics are means over the last axis
# (the features of one position), the variance is the biased one, and $\epsilon$ goes inside the
# square root. `x.var(-1)` would divide by $d - 1$: write the mean of the squared deviations
# out, or pass `unbiased=False`.

# %%
def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return gamma * (x - mu) / torch.sqrt(var + eps) + beta


exercises.check("07.layer_norm", layer_norm, must_pass=True)

torch.manual_seed(0)
scratch = LayerNormScratch(12)
with torch.no_grad():
    scratch.gamma.normal_()
    scratch.beta.normal_()
x = torch.randn(3, 5, 12) * 4 + 1
with torch.no_grad():
    mine, package = layer_norm(x, scratch.gamma, scratch.beta, scratch.eps), scratch(x)
print(f"max |solution - tfmlib.transformer.LayerNormScratch| = {(mine - package).abs().max().item():.1e}; "
      f"bit for bit equal (the same operations in the same order): {torch.equal(mine, package)}")
assert torch.equal(mine, package), "the solution must match the package's LayerNormScratch"

# %% [markdown]
# **2. A sublayer, post-LN or pre-LN.** Post-LN normalises the residual sum; pre-LN normalises
# only what goes into the sublayer and leaves the sum alone.

# %%
def sublayer_connection(x: Tensor, sublayer, norm: nn.Module, norm_first: bool) -> Tensor:
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


exercises.check("07.sublayer", sublayer_connection, must_pass=True)

# %% [markdown]
# Two such connections, around the self-attention and around the feed-forward network, are an
# encoder layer. With the package's `EncoderLayer`'s own sublayers and norms (dropout off):

# %%
for norm_first in (False, True):
    torch.manual_seed(0)
    layer = EncoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        h = sublayer_connection(x, lambda z, lyr=layer: lyr.self_attn(z)[0], layer.norm1, norm_first)
        h = sublayer_connection(h, layer.ff, layer.norm2, norm_first)
        whole = layer(x)[0]                                      # the same attention code path as above
    print(f"norm_first={norm_first}: two sublayer connections vs EncoderLayer, max difference "
          f"{(h - whole).abs().max().item():.1e}, bit for bit equal: {torch.equal(h, whole)}")
    assert torch.equal(h, whole), "two sublayer connections must make an encoder layer"

# %% [markdown]
# **3. The decoder's masks.** Self-attention: position $t$ may attend to $u$ when $u \le t$
# (causal) and $u$ is a real target token (padding on the *keys*, the last axis).
# Cross-attention: every target position may attend to every real source token and is not
# causal: the whole source is known before decoding starts.

# %%
def decoder_masks(src_mask: Tensor, tgt_mask: Tensor) -> tuple[Tensor, Tensor]:
    T = tgt_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt_mask.device).tril()   # (T, T)
    self_mask = causal & tgt_mask[:, None, None, :]                               # (B, 1, T, T)
    cross_mask = src_mask[:, None, None, :]                                       # (B, 1, 1, S)
    return self_mask, cross_mask


exercises.check("07.decoder_masks", decoder_masks, must_pass=True)

# %% [markdown]
# The package's `DecoderLayer` adds the causal mask itself, and takes the padding masks from
# `padding_mask`. Giving it the two masks above instead changes nothing, and its weights are
# non-zero exactly where the masks allow:

# %%
torch.manual_seed(0)
layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
src_mask = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
tgt_mask = torch.tensor([[True] * 5, [True, True, True, True, False]])
y, memory = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
self_mask, cross_mask = decoder_masks(src_mask, tgt_mask)
with torch.no_grad():
    out_a, self_w, cross_w = layer(y, memory, padding_mask(src_mask), padding_mask(tgt_mask), need_weights=True)
    out_b, _, _ = layer(y, memory, cross_mask, self_mask, need_weights=True)
print(f"package masks vs the solution's: max output difference {(out_a - out_b).abs().max().item():.1e}, "
      f"bit for bit equal: {torch.equal(out_a, out_b)}")
assert torch.equal(out_a, out_b), "the solution's masks must act as the package's"
assert torch.equal(self_w > 0, self_mask.expand_as(self_w)) and torch.equal(cross_w > 0, cross_mask.expand_as(cross_w))

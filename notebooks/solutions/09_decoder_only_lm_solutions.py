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
# Worked solutions to the coding exercises of chapter 09, each with the reasoning behind it and the
# wrong answers its checker names, followed by the checker with `must_pass=True`, so this notebook
# fails loudly if a solution (or a checker) breaks; each is then checked against a computation the
# chapter already trusts. Then an answer to every question. Try the exercises in the chapter first.

# %%
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib import exercises
from tfmlib.attention import causal_mask
from tfmlib.config import setup
from tfmlib.data import PAD_ID
from tfmlib.lm import DecoderLM, generate
from tfmlib.sampling import top_p_filter

run = setup(seed=0, smoke=dict(), cpu=dict(), gpu=dict())

# %% [markdown]
# ## Coding exercises
#
# **1. A grouped-query cache step.** The cache is the point of grouped-query attention: only the
# $G$ key-value heads are stored, so the new key and value are written into the small
# `(B, G, capacity, d)` buffers, in place. Only for the attention itself is each key-value head
# widened to the $H/G$ query heads of its group, with `repeat_interleave` (head 0, 0, 1, 1, ...),
# not `repeat` (head 0, 1, 0, 1, ...): the second pairs query head $h$ with key-value head
# $h \bmod G$, which a model trained with consecutive groups never did. The one new query is the
# newest position and may see every cached key, so no causal mask is passed: `is_causal=True`
# aligns its mask top-left and would let the query see key 0 only (section 5's pitfall). More
# wrong answers the checker names: widening the cache first and writing into that copy (the
# write is lost when the step returns); attending over the whole buffer, whose tail holds
# positions not written yet; attending before the write (the query then reads the garbage at
# position `length`) or over the `length` cached keys only (the new token is part of what its own
# query sees); dividing the scores by $d$ instead of $\sqrt{d}$; a softmax over the heads instead
# of the keys; and a result cast to float32 (the step computes in the inputs' dtype; the checker
# passes float64).

# %%
def gqa_step(q: Tensor, k: Tensor, v: Tensor, K: Tensor, V: Tensor, length: int) -> tuple[Tensor, int]:
    K[:, :, length] = k[:, :, 0]                                    # write into the small cache
    V[:, :, length] = v[:, :, 0]
    group = q.shape[1] // K.shape[1]                                # query heads per key-value head
    keys = K[:, :, :length + 1].repeat_interleave(group, dim=1)     # (B, H, length + 1, d)
    values = V[:, :, :length + 1].repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, keys, values), length + 1   # no causal mask: see above


exercises.check("09.gqa_step", gqa_step, must_pass=True)

# %% [markdown]
# Run step by step over a sequence, the cached steps must give what one causal pass over the
# whole sequence gives, with the key-value heads widened once; and the cache is $H/G$ times
# smaller than a full multi-head cache of the same model:

# %%
B, H, G, d, T = 2, 8, 2, 16, 10
qs, ks, vs = torch.randn(B, H, T, d), torch.randn(B, G, T, d), torch.randn(B, G, T, d)
K, V, n = torch.zeros(B, G, T, d), torch.zeros(B, G, T, d), 0
steps = []
for t in range(T):
    out, n = gqa_step(qs[:, :, t:t + 1], ks[:, :, t:t + 1], vs[:, :, t:t + 1], K, V, n)
    steps.append(out)
full = F.scaled_dot_product_attention(qs, ks.repeat_interleave(H // G, 1), vs.repeat_interleave(H // G, 1),
                                      is_causal=True)   # T queries, T keys: top-left is right here
gap = (torch.cat(steps, 2) - full).abs().max().item()
print(f"{T} cached GQA steps vs one causal pass: max |diff| = {gap:.1e}")
assert gap < 1e-5, "the cached steps must reproduce the full causal pass"
mha_bytes = 2 * B * H * T * d * K.element_size()
gqa_bytes = K.nbytes + V.nbytes
print(f"cache for {T} tokens: {gqa_bytes:,} bytes with G = {G} key-value heads, {mha_bytes:,} with "
      f"H = {H}: {mha_bytes // gqa_bytes} times smaller")
assert mha_bytes == (H // G) * gqa_bytes

# %% [markdown]
# **2. A sliding-window cache in a ring buffer.** Token `pos` goes into slot `pos % W`: that slot
# held token `pos - W`, the one that has just left the window, so the buffer always holds the
# last $\min(\text{pos} + 1, W)$ tokens. Attention is a weighted sum over a *set* of keys (their
# rotary positions are already inside them), so their order in the buffer does not matter: before
# the buffer has filled, the real tokens are slots $0 \dots \text{pos}$; afterwards, all $W$ slots.
# Write first, then attend: attending first would let the query see the evicted token and not
# itself. The wrong answers the checker names: writing at `pos` (it runs off the buffer),
# overwriting the wrong slot, reading unwritten slots before the buffer fills, reading only slots
# $0 \dots \text{pos} \bmod W$ once it has wrapped (treating the ring as a line), a window of
# $W - 1$ (the oldest token dropped, or the new one: the window includes the token itself), the
# top-left causal mask, unscaled scores, and a result in another dtype than the inputs'.

# %%
def window_step(q: Tensor, k: Tensor, v: Tensor, K: Tensor, V: Tensor, pos: int) -> Tensor:
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]                                   # evict the token that left the window
    V[:, :, pos % W] = v[:, :, 0]
    filled = min(pos + 1, W)                                        # slots that hold real tokens
    return F.scaled_dot_product_attention(q, K[:, :, :filled], V[:, :, :filled])


exercises.check("09.window_step", window_step, must_pass=True)

# %% [markdown]
# Checked against attention over the whole sequence with a *banded* causal mask (query $i$ sees
# keys $i - W + 1 \dots i$), built from chapter 05's causal mask: the ring buffer of $W$ slots
# gives the same outputs as a cache that keeps everything and masks all but the window:

# %%
B, h, d, T, W = 1, 2, 8, 13, 4
qs, ks, vs = (torch.randn(B, h, T, d) for _ in range(3))
far_past = torch.ones(T, T, dtype=torch.bool).tril(-W)             # keys W or more positions back
band = causal_mask(T) & ~far_past
full = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=band)
K, V = torch.randn(B, h, W, d), torch.randn(B, h, W, d)            # garbage before the first writes
ring = torch.cat([window_step(qs[:, :, t:t + 1], ks[:, :, t:t + 1], vs[:, :, t:t + 1], K, V, t)
                  for t in range(T)], dim=2)
gap = (ring - full).abs().max().item()
print(f"ring buffer of {W} slots vs banded mask over {T} tokens: max |diff| = {gap:.1e}; the cache "
      f"holds {W} tokens however long the text")
assert gap < 1e-5

# %% [markdown]
# **3. Batched generation from prompts of different lengths.** Three things make a left-padded
# batch equal to each prompt alone. (a) *Left* padding: each step predicts from the last column,
# so every row's newest token must be there; right padding would ask the short rows to continue
# from `<pad>`. (b) Per-row positions: a real token's position is the number of real tokens
# before it, the running count of the keep-mask minus one (padding gets 0, any valid index will
# do); giving every row `0 .. T-1` would shift a short prompt's positions by its padding.
# (c) A mask that is causal *and* hides padded keys. A padded query may see nothing at all; the
# checker's model turns such a fully masked row into zeros. A softmax written out, over scores
# filled with $-\infty$, returns NaN for it, which then leaks into every row of the next layer
# (zero weight times NaN is NaN). What PyTorch's fused kernel returns for it is not a promise of
# its documentation and may depend on the version and the backend: the cell after the solution
# prints what the installed one does. Each step appends one column: the new tokens, one more
# position per row, and a mask row and column. A generated token is a real token whatever its id, even 0: the keep-mask grows by a
# column of True, and is not re-derived from `ids != PAD_ID` (the checker's last model can
# generate id 0, and then that shortcut hides a real token).

# %%
def left_padded_generate(model, prompts: list[list[int]], steps: int) -> Tensor:
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_ID] * (P - len(p)) + list(p) for p in prompts])     # (B, P), left-padded
    keep = ids != PAD_ID                                                           # real tokens
    positions = (keep.long().cumsum(dim=1) - 1).clamp(min=0)                        # 0 at each row's first
    new = []
    for _ in range(steps):
        T = ids.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None] & keep[:, None, :]  # causal, no pad keys
        token = model(ids, positions, mask)[:, -1].argmax(dim=-1)                  # (B,)
        new.append(token)
        ids = torch.cat([ids, token[:, None]], dim=1)
        keep = torch.cat([keep, torch.ones_like(keep[:, :1])], dim=1)
        positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
    return torch.stack(new, dim=1)


exercises.check("09.left_padded_generate", left_padded_generate, must_pass=True)

# a query that may see no key at all: the written-out softmax and the installed fused kernel
scores_q = torch.randn(1, 1, 3, 4, dtype=torch.double)
sees = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
written_out = torch.softmax((scores_q @ scores_q.transpose(-2, -1)).masked_fill(~sees, -math.inf), -1)
fused_row = F.scaled_dot_product_attention(scores_q, scores_q, scores_q, attn_mask=sees)[0, 0, 1]
print(f"torch {torch.__version__}: a fully masked row gives {written_out[0, 0, 1].tolist()} from the "
      f"written-out softmax and {fused_row.tolist()} from F.scaled_dot_product_attention")

# %% [markdown]
# The same function drives the chapter's `DecoderLM`. Its positions are rotary: a query-key
# score depends only on the *offset* between their positions, and left padding shifts all of a
# row's real tokens by the same amount, so `DecoderLM`'s `0 .. T-1` positions do no harm and the
# `positions` argument can be ignored (with a learned position table, like the checker's model,
# it could not). What the model lacks is the mask; its `attention` attribute takes a kernel
# `(q, k, v, mask, causal, dropout_p)`, so an adapter can hand it ours. An untrained model
# (seeded) is enough to compare tokens: left-padded batch against each prompt alone through the
# package's `generate`, and against the batch with the padding *unmasked*:

# %%
class MaskedLM:
    """`model(ids, positions, mask)` for a DecoderLM: the mask reaches every block's attention."""

    def __init__(self, lm: DecoderLM, mask_padding: bool = True):
        self.lm, self.mask_padding = lm, mask_padding

    def __call__(self, ids: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        allowed = mask if self.mask_padding else torch.ones_like(mask).tril()
        # a padded query sees itself, so that nothing depends on what the kernel does with a row that
        # sees nothing (the cell above prints what this PyTorch does)
        allowed = allowed | torch.eye(ids.shape[1], dtype=torch.bool)

        def kernel(q, k, v, _mask, _causal, dropout_p):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], dropout_p=dropout_p)
        self.lm.attention = kernel
        try:
            with torch.no_grad():
                return self.lm(ids)
        finally:
            self.lm.attention = "fused"


torch.manual_seed(0)
lm = DecoderLM(40, d_model=32, heads=2, layers=2, context=32).eval()
prompts = [[5, 17, 9, 22, 31, 8], [12, 4], [7, 7, 19]]
alone = torch.stack([generate(lm, torch.tensor([p]), 8)[0, len(p):] for p in prompts])
batched = left_padded_generate(MaskedLM(lm), prompts, 8)
unmasked = left_padded_generate(MaskedLM(lm, mask_padding=False), prompts, 8)
for p, a, b, u in zip(prompts, alone.tolist(), batched.tolist(), unmasked.tolist(), strict=True):
    print(f"prompt {str(p):22s} alone {a}\n{'':29s}batched {b}\n{'':29s}padding unmasked {u}")
changed = [p for p, a, u in zip(prompts, alone.tolist(), unmasked.tolist(), strict=True) if a != u]
print(f"prompts whose continuation changes when the padding is unmasked: {changed}")
assert torch.equal(batched, alone), "the left-padded batch must generate what each prompt alone does"
assert not torch.equal(unmasked, alone), "attending to <pad> changes the short prompts' continuations"
assert prompts[0] not in changed, "the longest prompt has no padding, so nothing can change it"

# %% [markdown]
# The batch reproduces every prompt alone, token for token. With the padding unmasked, the
# continuation of at least one padded prompt changes (the cell asserts it and prints which). A
# padded prompt can also keep its tokens by chance, since this untrained model often repeats one
# token; which prompts change depends on the random weights. That is the silent error that the
# package's `generate` avoids by refusing `<pad>` in a prompt. The longest prompt has no padding
# and is never affected (asserted too).

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
# per-seed gaps beside it, with the count of seeds at which the GRU ends closer (the printed
# count). The margin is a few hundredths of a bit, about as large as the spread between
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

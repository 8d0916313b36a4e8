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
# # 10 · Solutions: scaling up
#
# Worked solutions to the coding exercises of chapter 10, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks, and each
# compared with what PyTorch or the package computes. Then an answer to every question, measured
# where the answer can be measured. Try the exercises in the chapter first.

# %%
import math

import torch
import torch.nn.functional as F

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.data import tokenize
from tfmlib.lm import DecoderLM
from tfmlib.profiling import count_host_reads
from tfmlib.rnn import lm_loss
from tfmlib.synthetic import load_bundled
from tfmlib.throughput import count_parameters
from tfmlib.timing import interleaved_medians

run = setup(seed=0, smoke=dict(repeats=3, batch=8, length=32),
            cpu=dict(repeats=15, batch=16, length=64),
            gpu=dict(repeats=15, batch=16, length=64))

# %% [markdown]
# ## Coding exercises
#
# **10.merge_softmax_states.** Both states hold sums relative to their own maximum. Bring them to
# the common maximum $m = \max(m_1, m_2)$: side $k$'s sum becomes $a_k = \ell_k e^{m_k - m}$, and
# the merged sum is $\ell = a_1 + a_2$. Each side's normalised output counts in proportion to its
# share of the mass, $o = (a_1 o_1 + a_2 o_2) / \ell$. A side whose keys are all masked has
# $m_k = -\infty$, $\ell_k = 0$: its factor $e^{-\infty} = 0$ makes it drop out, with no special
# case. A row masked in *both* blocks needs one: there $m = -\infty$, so $m_k - m$ is
# $-\infty - (-\infty)$, NaN, and $\ell = 0$ makes the division $0/0$, NaN again. The textbook
# formula is right everywhere else, which is why it looks finished; but such rows are common
# (a padded query, or with a document mask a query whose document lies in other key blocks: see
# the next exercise), and a NaN in one row of a forward pass becomes NaN gradients for every
# weight. The fix is the chapter's own `_safe_max`: shift by 0 where the merged max is $-\infty$
# (then $e^{-\infty - 0} = 0$), and divide only where $\ell > 0$. The state of such a row is the
# state of no key at all, $(-\infty, 0, 0)$, which merges with any later block correctly.
# Rescaling to the *larger* max is what keeps every factor $e^{m_k - m}$ at most 1. A merge that
# exponentiates the maxes themselves, $\ell_k e^{m_k}$, is the same algebra and passes in float64,
# but float32 overflows past $e^{88.7}$ and logits can be that large: the checker's float32 case,
# with scores near 100, turns it into inf and NaN.
#
# ![FlashAttention's tiling: one tile of scores at a time, the running max, sum and output kept per query row](../figures/10_flash_tiling.svg)
#
# The figure's running update is this merge, applied with the new tile as the second state.

# %%
def merge_softmax_states(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    shift = torch.where(m == -math.inf, torch.zeros_like(m), m)      # finite, so no -inf - (-inf)
    a1, a2 = l1 * torch.exp(m1 - shift), l2 * torch.exp(m2 - shift)
    total = a1 + a2
    o = (a1[..., None] * o1 + a2[..., None] * o2) / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    return m, total, o


exercises.check("10.merge_softmax_states", merge_softmax_states, must_pass=True)


def block_state(q, k, v, keep=None):
    """(m, l, o) of attention of q over one block of keys (scaled scores; keep: (T, S) bool or None)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    m = s.amax(-1)
    e = torch.exp(s - torch.where(m == -math.inf, torch.zeros_like(m), m)[..., None])
    total = e.sum(-1)
    return m, total, (e @ v) / torch.where(total > 0, total, torch.ones_like(total))[..., None]


# attention over 100 keys, read in blocks of 16 and merged one block at a time, is SDPA's answer
torch.manual_seed(0)
q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 100, 8), torch.randn(2, 4, 100, 8)
state = block_state(q, k[:, :, :16], v[:, :, :16])
for start in range(16, 100, 16):
    state = merge_softmax_states(*state, *block_state(q, k[:, :, start:start + 16], v[:, :, start:start + 16]))
want = F.scaled_dot_product_attention(q, k, v)
err = (state[2] - want).abs().max().item()
print(f"7 blocks merged one after the other vs F.scaled_dot_product_attention: max abs difference {err:.2e}")
assert err < 1e-5, "merging block states must give attention over all the keys"

# a query that may see no key in the first two blocks (masked there) keeps the empty state, then
# takes its whole attention from the third block: no NaN on the way
keep = torch.ones(10, 48, dtype=torch.bool)
keep[0, :32] = False
states = [block_state(q, k[:, :, j:j + 16], v[:, :, j:j + 16], keep[:, j:j + 16]) for j in (0, 16, 32)]
first_two = merge_softmax_states(*states[0], *states[1])
print(f"query 0 after two fully masked blocks: m = {first_two[0][0, 0, 0].item()}, l = "
      f"{first_two[1][0, 0, 0].item()}, o all zero: {bool((first_two[2][0, 0, 0] == 0).all())}")
merged = merge_softmax_states(*first_two, *states[2])
want = F.scaled_dot_product_attention(q, k[:, :, :48], v[:, :, :48], attn_mask=keep)
assert torch.isfinite(merged[2]).all() and (merged[2] - want).abs().max() < 1e-5, "no NaN, and the right answer"

# %% [markdown]
# **10.document_tiles.** A pair (query $t$, key $s$) may attend when $s \le t$ and both lie in
# the same document. The brute-force answer builds that $T \times T$ mask and asks, tile by tile,
# whether any entry is true; correct, but it builds exactly the matrix a tiled kernel exists to
# avoid. Because documents are contiguous, each tile only needs its corners: the queries of block
# $a$ span the documents $[d(i_0), d(i_1 - 1)]$, the keys of block $b$ span $[d(j_0), d(j_1 - 1)]$,
# and the tile holds an attending pair exactly when these two ranges meet *and* the first key is
# not after the last query, $j_0 \le i_1 - 1$. (Why that suffices: if document $e$ is in both
# ranges and $j_0 \le i_1 - 1$, the document's positions form one interval, and either the key
# block contains a position of $e$ at or before a query of $e$, or the two blocks overlap on a
# position of $e$, which is then both a query and a key.) The typical mistakes each break one
# part: comparing only the first query's and first key's documents misses a tile where a document
# starts inside the block; testing causality with the first query ($j_0 \le i_0$) skips the tiles
# that cross the diagonal, whose lower part attends; keeping only tiles in which *every* pair
# attends loses every tile that the kernel would compute with a mask inside it. Each skipped tile
# that holds a pair is a wrong answer, not a slower one.

# %%
def document_tiles(doc_ids: torch.Tensor, block_q: int, block_k: int) -> torch.Tensor:
    T = doc_ids.numel()
    q0, k0 = torch.arange(0, T, block_q), torch.arange(0, T, block_k)       # first position of each block
    q_last, k_last = (q0 + block_q).clamp_max(T) - 1, (k0 + block_k).clamp_max(T) - 1
    meet = (doc_ids[q0][:, None] <= doc_ids[k_last][None, :]) & (doc_ids[k0][None, :] <= doc_ids[q_last][:, None])
    return meet & (k0[None, :] <= q_last[:, None])


exercises.check("10.document_tiles", document_tiles, must_pass=True)

# %% [markdown]
# How much work does it save on the chapter's data? The packed blocks join the bundled corpus's
# sentences, each followed by its end token. Below, the sentences are packed into streams of
# 1024 tokens (the `gpu` profile's block length) and of 64 (the `cpu` one), and the tiles a causal
# kernel computes are compared with those the document mask needs. The check at the end computes
# attention on the needed tiles only, block by block with the merge above, and compares it with
# SDPA under the full document-and-causal mask.

# %%
lengths = [len(tokenize(en)) + 1 for en, _ in load_bundled("train")[:4000]]     # + 1: the end token
stream_doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
print(f"{len(lengths)} sentences, {stream_doc.numel()} tokens, {stream_doc.numel() / len(lengths):.1f} tokens "
      "per sentence on average")
for block_len, tile in ((1024, 64), (1024, 128), (64, 16)):
    blocks = stream_doc[: stream_doc.numel() // block_len * block_len].reshape(-1, block_len)
    need = sum(int(document_tiles(b - b[0], tile, tile).sum()) for b in blocks)
    n = block_len // tile
    causal = len(blocks) * n * (n + 1) // 2
    print(f"blocks of {block_len} tokens, tiles of {tile} x {tile}: a causal kernel computes {causal} tiles, "
          f"the document mask needs {need} ({need / causal:.0%}), a saving of {1 - need / causal:.0%}")

# attention on the needed tiles only equals SDPA with the document-and-causal mask
doc = stream_doc[:96] - stream_doc[0]
T, tile = doc.numel(), 16
mask = (doc[:, None] == doc[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
tiles = document_tiles(doc, tile, tile)
q, k, v = torch.randn(1, 2, T, 8), torch.randn(1, 2, T, 8), torch.randn(1, 2, T, 8)
out = torch.empty_like(q)
for a in range(tiles.shape[0]):
    rows = slice(a * tile, (a + 1) * tile)
    state = None
    for b in tiles[a].nonzero().flatten().tolist():
        cols = slice(b * tile, (b + 1) * tile)
        part = block_state(q[:, :, rows], k[:, :, cols], v[:, :, cols], mask[rows, cols])
        state = part if state is None else merge_softmax_states(*state, *part)
    out[:, :, rows] = state[2]
want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
print(f"{int(tiles.sum())} of {tiles.numel()} tiles computed; max |tiled with skipping - SDPA| = "
      f"{(out - want).abs().max().item():.1e}")
assert (out - want).abs().max() < 1e-5, "skipping the tiles that hold no attending pair changes nothing"

# %% [markdown]
# The saving depends on the ratio of sentence length to tile size and block length. These
# sentences are much shorter than the 64- and 128-token tiles (the average is printed above), so in
# a 1024-token block most of the causal triangle lies between documents and most of its tiles are
# skipped; bigger tiles save less, since a bigger tile is more likely to hold some pair from one
# sentence. With 16-token tiles the average sentence is about as long as a tile, and in a 64-token
# block the diagonal tiles, which always hold pairs, are a large share of the triangle, so the least
# is saved. Real
# pretraining documents are hundreds or thousands of tokens, and the saving there is smaller
# again: a document mask matters most when many short documents share a long block.
#
# **10.compensated_sum.** Float16 has 10 fraction bits: near 1, consecutive numbers are $2^{-10}
# \approx 0.001$ apart, so adding $10^{-4}$ to 1 rounds back to 1, every time. Kahan's
# compensated summation (Higham 2002, section 4.3) keeps, next to the total, the part of the last
# addition that rounding lost. With $y = x - c$ (the new value corrected by what was lost before)
# and $t = \mathrm{total} + y$ (rounded), the difference $(t - \mathrm{total}) - y$ is *exactly*
# the rounding error of that addition, computed in float16 without error of its own (the two
# subtractions are exact when the total is larger than $y$, by Sterbenz's lemma and the
# properties of round-to-nearest). That error becomes the new $c$, subtracted from the next value.
# The order of the operations is the algorithm: written $y - (t - \mathrm{total})$ the sign
# flips and the error is added twice; a compensation computed but not subtracted from the next
# value leaves the plain sum. The total stays a float16 number: what the compensation buys is that
# the *sum of all the values* is exact to about one rounding, not that each total is wider. "One
# rounding" is Higham's bound, $\epsilon \sum_i |x_i|$ with $\epsilon$ float16's epsilon: where the
# values do not cancel, $\sum_i |x_i| = |\sum_i x_i|$ and that is one rounding of the total itself;
# where they cancel, the total can be small next to the values, and no float16 algorithm that rounds
# after every operation promises one rounding of *it* (the checker measures in units of
# $\epsilon \sum_i |x_i|$). Every operation of the step is float16: computing $t + x + c$ in float32
# and rounding once would also keep the small terms, but then the wider type does the work, not the
# compensation, and the checker rejects it.

# %%
def compensated_add(total: torch.Tensor, compensation: torch.Tensor,
                    x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x - compensation                 # the new value, less what the previous addition added too much
    t = total + y                        # rounded to float16: the low part of y may be lost
    return t, (t - total) - y            # exactly what this addition added too much


exercises.check("10.compensated_sum", compensated_add, must_pass=True)

# %% [markdown]
# The gradient-accumulation case: 256 micro-batch gradients of a few thousand entries, each small
# next to the sum, summed into a float16 buffer three ways, against the exact float64 sum. The
# errors are in units of float16's epsilon times $\sum_i |x_i|$, the scale that rounding errors of a
# sum are measured against (Higham 2002, sections 4.2 and 4.3): the worst case of a plain running
# sum of $n$ values grows like $n/2$ of these units, that of the compensated sum stays about 1.

# %%
g = torch.Generator().manual_seed(0)
micro_grads = (torch.randn(256, 4096, generator=g) * 1e-3 + 1e-4).half()
exact = micro_grads.double().sum(0)
plain = torch.zeros(4096, dtype=torch.half)
state = (torch.zeros(4096, dtype=torch.half), torch.zeros(4096, dtype=torch.half))
for grad_i in micro_grads:
    plain = plain + grad_i
    state = compensated_add(*state, grad_i)
eps = torch.finfo(torch.half).eps


def rel_err(total: torch.Tensor) -> torch.Tensor:
    return (total.double() - exact).abs() / (eps * micro_grads.double().abs().sum(0))


for name, total in (("plain float16 sum", plain), ("compensated float16 sum", state[0]),
                    ("float32 sum, rounded to float16", micro_grads.float().sum(0).half())):
    e = rel_err(total)
    print(f"{name:32s} median error {e.median().item():6.2f}, worst {e.max().item():8.2f} (float16 epsilons)")
assert rel_err(state[0]).max() < 0.5 < rel_err(plain).max(), "compensation removes the drift"
assert rel_err(state[0]).median() < rel_err(plain).median() / 3, "on a typical entry too"

# %% [markdown]
# The plain float16 sum drifts: each of the 256 additions rounds, and its errors add up (the
# median and worst entries above). The compensated one ends close to a float32 accumulator
# rounded once at the end, the best a float16 result can be. Two float16 numbers do the work of one float32:
# that is the trade of fp32 master weights (section 3) made the other way, memory for two extra
# subtractions per addition. Neumaier's variant, which also handles a value larger than the
# running total, passes the checker too when the compensation is added into the total at every step
# (the exercise's total must be the sum). As usually written it keeps the plain running sum and adds
# the compensation only at the end; the checker says so ("kept apart"), and in float16 that end
# result is worse as well: a compensation that only grows is itself a plain float16 sum of the lost
# parts.
#
# **10.skip_nonfinite_step.** A GPU step should never wait for the device, so the decision to
# skip cannot be a Python `if`: `if finite:` calls `bool()` on a tensor, a host read (the
# checker's `count_host_reads` sees it; on a GPU it is a sync). Instead the flag stays a 0-d
# tensor on the device, and `torch.where(flag, p - lr * grad, p)` picks, entry by entry, the
# updated or the old value; both are computed, which costs one extra elementwise pass and no
# wait. Three details decide whether it works:
#
# * *One flag for the step*, from every gradient: a step skipped for one tensor and applied to
#   the others leaves parameters that never existed together (and with Adam, moments that drift).
# * *Select, do not multiply.* `p - lr * grad * flag` looks equivalent, but when the gradient
#   holds an inf, $\infty \times 0$ is NaN and the parameter is destroyed precisely in the case
#   the flag was meant to protect; `torch.where` takes the other branch and never touches the NaN.
# * *Finite, not "not NaN".* inf, -inf and NaN all mean the step overflowed; a test for NaN only
#   lets an inf gradient turn a weight into -inf.
#
# PyTorch's `GradScaler` computes one flag for the whole step (`found_inf`, a tensor per device);
# with an optimizer that is not fused it then reads the flag back to decide in Python whether to
# call `optimizer.step()` at all, while fused optimizers take `found_inf` as a tensor argument and
# skip on the device, as here.
#
# `count_host_reads` counts the Tensor methods that hand a value to Python (`item`, `bool`, ...);
# `torch.equal`, `torch.is_nonzero` and `torch.allclose` hand one over from C++ without them. So the
# checker also runs the step on the `meta` device, whose tensors have shapes and no values: every
# value read fails there, while `isfinite`, `stack`, `all`, `where` and `copy_` work.

# %%
def sgd_step_unless_nonfinite(params: list[torch.Tensor], lr: float) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    finite = torch.stack([torch.isfinite(gr).all() for gr in grads]).all()     # 0-d bool, on the device
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.copy_(torch.where(finite, p - lr * p.grad, p))
    return finite


exercises.check("10.skip_nonfinite_step", sgd_step_unless_nonfinite, must_pass=True)

# %% [markdown]
# Measured with the chapter's counter: the same skipping decided with a Python `if` reads a value
# back for every parameter tensor it tests (`all` calls `bool()` on each), at every step, the
# version above none; and the multiplied flag turns a parameter into NaN on an overflowing step.

# %%
def step_with_if(params: list[torch.Tensor], lr: float) -> bool:
    if all(torch.isfinite(p.grad).all() for p in params if p.grad is not None):   # bool(): a host read
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
        return True
    return False


def step_multiplied(params: list[torch.Tensor], lr: float) -> torch.Tensor:
    finite = torch.stack([torch.isfinite(p.grad).all() for p in params]).all()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad * finite
    return finite


def fresh_params(overflow: bool) -> list[torch.Tensor]:
    ps = [torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    for p in ps:
        p.grad = torch.randn(p.shape)
    if overflow:
        ps[1].grad[0] = math.inf
    return ps


for name, fn in (("Python if", step_with_if), ("torch.where (solution)", sgd_step_unless_nonfinite),
                 ("multiplied by the flag", step_multiplied)):
    reads_total, nan_after = 0, False
    for overflow in (False, True, False):
        ps = fresh_params(overflow)
        with count_host_reads() as reads:
            fn(ps, 0.1)
        reads_total += reads.total
        nan_after |= any(bool(torch.isnan(p).any()) for p in ps)
    print(f"{name:24s} host reads over 3 steps: {reads_total}   a parameter became NaN: {nan_after}")
    if fn is sgd_step_unless_nonfinite:
        assert reads_total == 0 and not nan_after

# %% [markdown]
# ## Questions
#
# **1. Why bf16 needs no loss scaling and fp16 does.** Both have 16 bits, split differently:
# bf16 keeps fp32's 8 exponent bits (and 7 mantissa bits), fp16 has 5 exponent bits (and 10
# mantissa bits). So bf16 covers fp32's *range* with less precision, and fp16 has more precision
# in a narrow range: its smallest positive number is about $6 \times 10^{-8}$, and gradients of
# a loss averaged over many tokens are often smaller than that, so they flush to zero. The
# gradient scaler multiplies the loss by a large factor (e.g. $2^{16}$) before the backward pass,
# which lifts the gradients into fp16's range, and divides them back in fp32 before the optimiser
# step (skipping a step whose scaled gradients overflowed). bf16's range is fp32's, so nothing
# underflows that fp32 would keep; what it loses is precision (a relative step of $2^{-8}$), which
# autocast answers by keeping weights, reductions and the loss in fp32. Measured:

# %%
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    fi = torch.finfo(dtype)
    print(f"{str(dtype):15s} smallest normal {fi.tiny:.2e}  largest {fi.max:.2e}  eps {fi.eps:.2e}")
grads = torch.tensor([1e-4, 1e-6, 1e-8, 1e-10])
print("gradients in fp32:          ", [f"{g:.0e}" for g in grads.tolist()])
print("cast to fp16:               ", [f"{g:.0e}" for g in grads.half().float().tolist()])
print("cast to bf16:               ", [f"{g:.0e}" for g in grads.bfloat16().float().tolist()])
scale = 2.0 ** 16
print("fp16 after scaling by 2^16, unscaled in fp32:",
      [f"{g:.0e}" for g in ((grads * scale).half().float() / scale).tolist()])
assert grads[2:].half().eq(0).all() and grads.bfloat16().ne(0).all(), "fp16 flushes 1e-8 and 1e-10, bf16 not"
assert ((grads * scale).half() != 0).all(), "scaled, every one survives in fp16"

# %% [markdown]
# **2. When `torch.compile` does not pay off.** Compiling costs seconds once (tracing, graph
# optimisation, code generation), and then saves some time per step; it pays off after
# compile seconds / (eager step - compiled step) steps, section 4's break-even count. It does
# not pay off for a short run (a notebook cell, a quick experiment), for a model whose steps are
# dominated by a few big matmuls that eager PyTorch already runs at the library's speed (there
# is little to fuse), and when shapes keep changing: each new input shape can trigger a new
# compilation. Padded sentence batches (chapter 09) change their length at every batch; the
# packed blocks of this chapter never do. Measured below with a backend that only counts
# compilations (no code generation, so it is quick): by default, a second shape makes PyTorch
# recompile with that dimension marked dynamic, after which new lengths reuse the graph; with
# `dynamic=False` every new length compiles again.

# %%
def count_compilations(dynamic):
    compiled = []

    def counting_backend(gm, example_inputs):
        compiled.append(tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)))
        return gm.forward

    torch.compiler.reset()
    layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    fn = torch.compile(layer, backend=counting_backend, dynamic=dynamic)
    for length in (12, 17, 9, 23, 17, 30):          # padded batches: the length changes every time
        fn(torch.randn(4, length, 16))
    for _ in range(4):                               # packed blocks: always the same shape
        fn(torch.randn(4, 32, 16))
    return len(compiled)


default_count, static_count = count_compilations(None), count_compilations(False)
print(f"compilations for 6 batches of 5 distinct lengths, then 4 fixed-length blocks: "
      f"{default_count} (default: dynamic after the first recompile), {static_count} (dynamic=False)")
assert static_count == 6, "every new static shape compiles: 5 lengths + the block length"
assert default_count < static_count, "automatic dynamic shapes recompile less"

# %% [markdown]
# **3. Two processes on two cores.** Each process computes the forward and backward of half the
# global batch, then the two exchange their gradients (an all-reduce of every parameter's
# gradient, over gloo on the CPU) and apply the same step. So the 2-process run does the same
# arithmetic as one process with the full batch, split in two, plus the all-reduce and the cost
# of a second Python process. One process with two threads splits each operation over both
# cores instead, which pays for big matmuls and not for small ones (the threads meet at every
# operation). So the 2-process run can be faster only if half a batch on one core takes clearly
# less than the whole batch (on one or two threads), with the all-reduce small next to a step,
# and only if the two cores are free: two processes on a machine that is busy with other work
# fight for the same cores. The cell below times, in this process, one rank's share of the work
# (half the batch, one thread) against the whole batch on one and on two threads, and counts the
# bytes the all-reduce moves, and says from its printed ratios which way it went on this run (the
# times depend on this machine and on what else runs on it); chapter 10's table has the real
# 2-process run. When two threads come out *slower* than one, the second core was busy with other
# work or the operations are too small to split: the threads meet at every small operation, and a
# thread that waits for a core stalls the other.
#
# ![Data parallelism: two processes, each a model replica with its slice of the global batch, gradients all-reduced, identical optimiser steps](../figures/10_data_parallel.svg)

# %%
torch.manual_seed(0)
lm_small = DecoderLM(200, d_model=64, heads=4, layers=2, context=run.length)
opt = torch.optim.SGD(lm_small.parameters(), lr=0.01)
x = torch.randint(4, 200, (run.batch, run.length))  # cpu: lm_small stays on the CPU (its threads are the subject)
y = torch.randint(4, 200, (run.batch, run.length))  # cpu: as x


def step(rows, threads):
    def fn():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            opt.zero_grad()
            lm_loss(lm_small, (x[:rows], y[:rows]))[0].backward()
            opt.step()
        finally:
            torch.set_num_threads(before)
    return fn


times = interleaved_medians({"full batch, 1 thread": step(run.batch, 1),
                             "full batch, 2 threads": step(run.batch, 2),
                             "half batch, 1 thread (one rank's work)": step(run.batch // 2, 1)},
                            repeats=run.repeats, device=run.device)
for name, seconds in times.items():
    print(f"{name:40s} {1000 * seconds:7.1f} ms per step")
one, two = times["full batch, 1 thread"], times["full batch, 2 threads"]
half = times["half batch, 1 thread (one rank's work)"]
print("two threads on the full batch: " + (f"{one / two:.2f} times as fast as one" if two < one else
      f"{two / one:.2f} times as slow as one: the threads cost more than they split"))
print(f"one rank's half batch takes {half / one:.0%} of the full batch on one thread, "
      f"{half / min(one, two):.0%} of the better full-batch time: "
      + ("two free cores would gain from two processes, before the all-reduce"
         if half < 0.75 * min(one, two) else "two processes could hardly gain here"))
grad_bytes = sum(p.numel() * p.element_size() for p in lm_small.parameters())
print(f"gradient bytes all-reduced per step: {grad_bytes / 1e6:.2f} MB ({count_parameters(lm_small, False):,} "
      "parameters in fp32)")

# %% [markdown]
# **4. What FSDP shards, and when a model stops fitting.** Data parallelism with DDP keeps on
# every device the whole model's parameters (fp32 under autocast), their gradients, and Adam's
# two moments: about $4 + 4 + 8 = 16$ bytes per parameter, before any activation. Fully
# sharded data parallelism (FSDP; Zhao et al. 2023) splits all three across the $W$ devices,
# each holding $1/W$ of every flattened layer: before a layer's forward (and again in its
# backward) the devices all-gather that layer's full parameters, use them, and free them; the
# gradients are reduce-scattered so each device keeps only its shard, and each updates only its
# shard of the optimiser state. The memory per device drops from $16P$ to about $16P/W$ plus one
# layer's full parameters, for more communication. With 16 bytes per parameter, one 80 GB GPU
# holds at most 5 billion parameters, less the activations:

# %%
bytes_per_param = 4 + 4 + 8          # fp32 weights, fp32 gradients, Adam's m and v
gpu = 80e9
print(f"DDP limit on one 80 GB GPU: {gpu / bytes_per_param / 1e9:.1f} billion parameters (no activations)")
for name, params in (("GPT-2 small", 124e6), ("a 7B model", 7e9), ("a 70B model", 70e9)):
    per_gpu = {w: params * bytes_per_param / w / 1e9 for w in (1, 8, 64)}
    print(f"{name:12s} " + "  ".join(f"{w:2d} GPUs: {gb:8.1f} GB each" for w, gb in per_gpu.items()))

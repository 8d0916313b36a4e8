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
from torch.utils.data.distributed import DistributedSampler

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.data import PAD_ID
from tfmlib.lm import DecoderLM
from tfmlib.rnn import lm_loss
from tfmlib.throughput import count_parameters, lm_flops_per_token
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
# case (only when *both* sides are empty would $-\infty - (-\infty)$ give NaN).
#
# ![FlashAttention's tiling: one tile of scores at a time, the running max, sum and output kept per query row](../figures/10_flash_tiling.svg)
#
# The figure's running update is this merge, applied with the new tile as the second state.

# %%
def merge_softmax_states(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    total = a1 + a2
    o = (a1[..., None] * o1 + a2[..., None] * o2) / total[..., None]
    return m, total, o


exercises.check("10.merge_softmax_states", merge_softmax_states, must_pass=True)


def block_state(q, k, v):
    """(m, l, o) of attention of q over one block of keys (scaled scores, no mask)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    m = s.amax(-1)
    e = torch.exp(s - m[..., None])
    return m, e.sum(-1), (e @ v) / e.sum(-1)[..., None]


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

# %% [markdown]
# **10.accumulation_weights.** The big batch's loss is the mean over all its real target tokens,
# $L = \sum_i n_i L_i / \sum_i n_i$ where $L_i$ is micro-batch $i$'s mean over its $n_i$ real
# tokens; so $w_i = n_i / \sum_j n_j$, with $n_i$ counted without the padding. Below, a small
# language model shows it: the weighted micro-batch gradients equal the gradient of the one
# concatenated batch, and equal weights $1/N$ do not (unless every micro-batch has the same
# number of real tokens).

# %%
def accumulation_weights(targets: list[torch.Tensor]) -> torch.Tensor:
    counts = torch.tensor([float((t != PAD_ID).sum()) for t in targets], dtype=torch.float64)
    return counts / counts.sum()


exercises.check("10.accumulation_weights", accumulation_weights, must_pass=True)

torch.manual_seed(1)
model = DecoderLM(40, d_model=32, heads=2, layers=1, context=16).double()
inputs = torch.randint(4, 40, (6, 12))
targets = torch.randint(4, 40, (6, 12))
targets[0, 3:] = PAD_ID                              # micro-batch 1 has short sentences
targets[1, 5:] = PAD_ID
micro = [(inputs[:2], targets[:2]), (inputs[2:], targets[2:])]


def gradient(weights):
    model.zero_grad()
    for w, batch in zip(weights, micro, strict=True):
        (w * lm_loss(model, batch)[0]).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


model.zero_grad()
lm_loss(model, (inputs, targets))[0].backward()
big = torch.cat([p.grad.flatten() for p in model.parameters()])
w = accumulation_weights([t for _, t in micro])
print("real tokens per micro-batch:", [int((t != PAD_ID).sum()) for _, t in micro], " weights:",
      [round(float(x), 4) for x in w])
for name, weights in (("token-weighted", w), ("1/N each", [0.5, 0.5])):
    diff = (gradient(weights) - big).abs().max().item()
    print(f"{name:15s} max |grad - big-batch grad| = {diff:.2e}")
assert (gradient(w) - big).abs().max() < 1e-12, "token weights give the big batch's gradient"
assert (gradient([0.5, 0.5]) - big).abs().max() > 1e-6, "1/N does not, with unequal token counts"

# %% [markdown]
# **10.mfu.** Each of the $N = L(4d^2 + 2 d\, d_{ff}) + d V$ weights costs 2 FLOPs per token
# forward and 4 backward; attention's scores and weighted sum add $2 \cdot 2 d T$ per layer
# forward, times 3 with the backward: $6N + 12 L d T$. MFU divides the FLOP/s the model needs by
# the peak. The package's `lm_flops_per_token` counts the same, plus the biases and norms of a
# real `DecoderLM` (a fraction of a percent more, printed below).

# %%
def flops_and_mfu(*, vocab: int, d_model: int, layers: int, d_ff: int, context: int, tokens_per_s: float,
                  peak: float) -> tuple[float, float]:
    n = layers * (4 * d_model * d_model + 2 * d_model * d_ff) + d_model * vocab
    flops_per_token = 6 * n + 12 * layers * d_model * context
    return flops_per_token, tokens_per_s * flops_per_token / peak


exercises.check("10.mfu", flops_and_mfu, must_pass=True)

gpt2 = dict(vocab=50304, d_model=768, layers=12, d_ff=3072, context=1024)
mine, _ = flops_and_mfu(**gpt2, tokens_per_s=1.0, peak=1.0)
with torch.device("meta"):
    lm = DecoderLM(gpt2["vocab"], d_model=768, heads=12, layers=12, d_ff=3072, context=1024)
package = lm_flops_per_token(lm, 1024)
print(f"GPT-2 small: {mine / 1e9:.3f} GFLOP per training token (exercise), {package / 1e9:.3f} (package, "
      f"with biases and norms: {100 * (package / mine - 1):+.2f}%)")
print(f"non-embedding parameters of that DecoderLM: {count_parameters(lm) / 1e6:.1f} M")
h100 = 989e12
print(f"35% MFU on an H100 (989 TFLOP/s bf16) needs {0.35 * h100 / mine:,.0f} tokens/s")
assert abs(package / mine - 1) < 0.01, "the two counts differ only by biases and norms"

# %% [markdown]
# **10.rank_indices.** Every rank draws the *same* permutation from `seed + epoch` (that is what
# `set_epoch` is for: without it every epoch repeats the same order), pads it by repeating its
# start until its length divides by the world size (so every rank runs the same number of steps;
# DDP's all-reduce needs all ranks at every step), and rank $r$ takes positions
# $r, r + W, r + 2W, \dots$

# %%
def rank_indices(*, n: int, world_size: int, rank: int, epoch: int, seed: int) -> list[int]:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = math.ceil(n / world_size) * world_size
    order = (order * math.ceil(total / n))[:total]
    return order[rank:total:world_size]


exercises.check("10.rank_indices", rank_indices, must_pass=True)

n, world = 11, 2
for epoch in (0, 1):
    per_rank = [rank_indices(n=n, world_size=world, rank=r, epoch=epoch, seed=0) for r in range(world)]
    for r, idx in enumerate(per_rank):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        assert idx == list(sampler), "the solution must read what DistributedSampler reads"
    print(f"epoch {epoch}: rank 0 reads {per_rank[0]}, rank 1 reads {per_rank[1]}")
    assert sorted(set(per_rank[0]) | set(per_rank[1])) == list(range(n)), "together the ranks cover the data"
print("11 examples over 2 ranks: 12 slots, one example read twice per epoch (the padding)")

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
# bytes the all-reduce moves; compare the printed times (they depend on this machine and on what
# else runs on it), and chapter 10's table for the real 2-process run.
#
# ![Data parallelism: two processes, each a model replica with its slice of the global batch, gradients all-reduced, identical optimiser steps](../figures/10_data_parallel.svg)

# %%
torch.manual_seed(0)
lm_small = DecoderLM(200, d_model=64, heads=4, layers=2, context=run.length)
opt = torch.optim.SGD(lm_small.parameters(), lr=0.01)
x = torch.randint(4, 200, (run.batch, run.length))
y = torch.randint(4, 200, (run.batch, run.length))


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

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
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks, and then
# tried on the package's modules or on PyTorch's; answers to the questions follow. Try the
# exercises in the chapter first.

# %%
import torch
from torch import Tensor, nn

from tfmlib import exercises
from tfmlib.attention import causal_mask, padding_mask
from tfmlib.config import setup
from tfmlib.transformer import DecoderLayer, EncoderLayer, LayerNormScratch

run = setup(seed=0, smoke=dict(parity_steps=40), cpu=dict(parity_steps=250), gpu=dict(parity_steps=250))

# %% [markdown]
# ## Coding exercises
#
# **1. RMSNorm.** Section 3's LayerNorm computes two statistics per vector, a mean and a
# variance about it; RMSNorm keeps one, the mean of the squared features, taken like
# LayerNorm's over the last axis only (the features of one position) and kept as an axis of
# size 1 so that it divides every feature of its vector. $\epsilon$ goes inside the square root,
# as in section 3, so that a nearly zero vector is amplified at most $1/\sqrt{\epsilon}$ times;
# the gain comes after normalising, and there is no bias. The checker names the usual slips:
# centring anyway (that is LayerNorm), the sum instead of the mean, $\epsilon$ outside the root,
# the statistic over the batch axis, and dividing by the mean square without its root. It also
# rejects a result in another dtype than `x`'s, or computed in float32 for a float64 `x`: a norm
# is called on whatever flows through the model, and must not change its precision. And it runs
# the answer with every route to the library's RMSNorm blocked (`F.rms_norm`, `nn.RMSNorm`, the
# aten op behind them), not only the two names.

# %%
def rms_norm(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    return gamma * x / torch.sqrt((x ** 2).mean(dim=-1, keepdim=True) + eps)


exercises.check("07.rms_norm", rms_norm, must_pass=True)

# %% [markdown]
# Against PyTorch's `nn.RMSNorm`, and against section 3's LayerNorm with $\beta = 0$. The two
# normalisations agree exactly when the vector's mean is zero: then its mean square *is* its
# variance. For a vector whose mean is large compared with its spread they part ways: LayerNorm
# removes the mean and blows the small spread up to unit size; RMSNorm keeps the mean, and the
# spread stays small next to it.

# %%
torch.manual_seed(0)
gamma = torch.randn(12, dtype=torch.double)
reference = nn.RMSNorm(12, eps=1e-5).double()
with torch.no_grad():
    reference.weight.copy_(gamma)
scratch = LayerNormScratch(12).double()
with torch.no_grad():
    scratch.gamma.copy_(gamma)                                                  # beta stays 0
x = torch.randn(3, 5, 12, dtype=torch.double) * 4 + 1
centred = x - x.mean(-1, keepdim=True)
offset = 10.0 + 0.1 * torch.randn(12, dtype=torch.double)                      # mean 10, spread 0.1
with torch.no_grad():
    vs_torch = (rms_norm(x, gamma, 1e-5) - reference(x)).abs().max().item()
    zero_mean = (rms_norm(centred, gamma, 1e-5) - scratch(centred)).abs().max().item()
    ln_offset, rms_offset = scratch(offset) / gamma, rms_norm(offset, gamma, 1e-5) / gamma   # without the gain
print(f"max |solution - nn.RMSNorm| = {vs_torch:.1e}; on zero-mean vectors, max |RMSNorm - LayerNorm| = "
      f"{zero_mean:.1e}")
print(f"a vector of mean 10 and spread 0.1, normalised (gain removed): LayerNorm gives mean "
      f"{ln_offset.mean().item():.2f} and spread {ln_offset.std(unbiased=False).item():.2f}; RMSNorm gives mean "
      f"{rms_offset.mean().item():.2f} and spread {rms_offset.std(unbiased=False).item():.3f}")
assert vs_torch < 1e-12 and zero_mean < 1e-12, "RMSNorm must match nn.RMSNorm, and LayerNorm on zero-mean vectors"
assert abs(ln_offset.mean().item()) < 1e-6 and rms_offset.std().item() < 0.05, "the two treat a mean differently"

# %% [markdown]
# **2. Post-LN or pre-LN, from the outside.** What a LayerNorm guarantees, whatever its gain and
# bias: its output does not grow with its input (each vector is centred and scaled to unit
# spread, then multiplied by $\gamma$ and shifted by $\beta$, so every output is bounded by
# $|\beta| + |\gamma|\sqrt{d}$). In a post-LN layer every path to the output ends in a
# LayerNorm, so the output stays bounded however large the input is. In a pre-LN layer the
# input reaches the output through a plain sum, $x + F(\mathrm{LN}(x))$: multiply the input by
# $c$ and the output grows like $c$, while what the sublayers add, output minus input, stops
# depending on $c$ once $c$ is large (their inputs are normalised). So: feed the same input at
# two large scales, 100 times apart, and see whether the output grows with it (a test of growth
# needs no threshold on the output's size, which the gains would set). The shallow tests fail on the checker's harder layers: "the
# output has mean 0 and spread 1" reads a post-LN layer's $\beta$ and $\gamma$, which training
# moves away from 0 and 1; "the output stays near the input" fails for a pre-LN layer whose
# sublayers add a lot, and for a post-LN layer fed inputs that are already normalised.

# %%
def norm_placement(layer, d_model: int) -> str:
    x = torch.randn(2, 5, d_model, dtype=torch.float64)
    growth = layer(1e4 * x).norm() / layer(1e2 * x).norm()         # ~1 post-LN, ~100 pre-LN
    return "post" if growth < 10 else "pre"                        # a LayerNorm ends every path: post-LN


exercises.check("07.norm_placement", norm_placement, must_pass=True)

# %% [markdown]
# Tried on the package's `EncoderLayer` and on PyTorch's `nn.TransformerEncoderLayer`, both ways,
# with LayerNorm gains and biases drawn away from 1 and 0. For each we also print what the
# shallow tests look at: the output's mean and spread per position, for an ordinary input
# ($d = 32$).

# %%
def with_trained_looking_norms(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for norm in (m for m in module.modules() if isinstance(m, nn.LayerNorm)):
            norm.weight.uniform_(0.3, 3.0)
            norm.bias.normal_(0.0, 2.0)
    return module.double().eval()


torch.manual_seed(run.seed)
layers = {}
for norm_first in (False, True):
    name = "pre-LN" if norm_first else "post-LN"
    ours = with_trained_looking_norms(EncoderLayer(32, 4, 64, dropout=0.0, norm_first=norm_first))
    theirs = with_trained_looking_norms(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                                                   norm_first=norm_first))
    layers[f"EncoderLayer, {name}"] = (lambda x, m=ours: m(x)[0], name)
    layers[f"nn.TransformerEncoderLayer, {name}"] = (lambda x, m=theirs: m(x), name)
x = torch.randn(4, 7, 32, dtype=torch.float64)
with torch.no_grad():
    for name, (layer, truth) in layers.items():
        out = layer(x)
        found = norm_placement(layer, 32)
        mean, spread = out.mean(-1).abs().mean().item(), out.std(-1, unbiased=False).mean().item()
        print(f"{name:>36s}: says {found!r:7s} | output mean per position {mean:.2f} (|avg|), "
              f"spread {spread:.2f}")
        assert found == truth.split("-")[0], f"{name}: the probe must find the placement"
        assert mean > 0.05 and abs(spread - 1) > 0.05, "no layer here looks normalised to mean 0, spread 1"

# %% [markdown]
# The probe finds the placement in all four. The printed means and spreads show why the shallow
# tests cannot: with these gains and biases no layer, post-LN or pre-LN, gives mean 0 and
# spread 1, so a test for those two numbers calls all four "pre". What the numbers are depends
# on the gains and biases drawn; that the output stays bounded depends only on where the
# LayerNorm sits.
#
# **3. Several sentence pairs in one row.** Ask what each target token saw when its pair was
# alone. In self-attention, the earlier tokens of its own target sentence: the causal condition
# $u \le t$ (on the query and key axes, as in chapter 05) and the same segment id, a comparison
# of the query's id (rows) with the key's id (columns). No separate padding condition is needed
# for a real query: a padded key's id, 0, differs from every real sentence's, so "same segment"
# already hides it (the solution keeps the padding condition anyway, so that it also reads
# right for the padded rows nobody uses). In cross-attention, every token of the source
# sentence packed with its own: the target token's id on the rows against the source token's id
# on the columns, and not causal, since the whole source is known before decoding starts. The
# mistakes the checker names: chapter 05's causal and padding masks unchanged (each target
# sentence then sees the sentences packed before it), a cross mask with every real source token
# of the row, a causal cross mask, a segment comparison off by one, and a `(B, S)` mask returned
# as it is, which attention reads as `(queries, keys)`.

# %%
def packed_masks(src_seg: Tensor, tgt_seg: Tensor) -> tuple[Tensor, Tensor]:
    T = tgt_seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt_seg.device).tril()        # (T, T)
    same_target = tgt_seg[:, :, None] == tgt_seg[:, None, :]                          # (B, T, T)
    self_mask = causal & same_target & (tgt_seg != 0)[:, None, :]                     # (B, T, T)
    same_source = (tgt_seg[:, :, None] == src_seg[:, None, :]) & (src_seg != 0)[:, None, :]   # (B, T, S)
    return self_mask[:, None], same_source[:, None]                                   # (B, 1, T, ·)


exercises.check("07.packed_masks", packed_masks, must_pass=True)

# %% [markdown]
# What the masks buy, on the package's `DecoderLayer` (float64, no dropout): three sentence
# pairs packed into one row give, with these masks, the outputs each pair gets alone; with
# chapter 05's causal and padding masks they do not. And what packing saves: the same three
# pairs padded to the longest, one pair per row, against one packed row.

# %%
torch.manual_seed(0)
layer = DecoderLayer(16, 4, 32, dropout=0.0).double().eval()
src_len, tgt_len = [5, 2, 4], [4, 3, 2]
src_seg = torch.repeat_interleave(torch.arange(1, 4), torch.tensor(src_len))[None]     # (1, 11)
tgt_seg = torch.repeat_interleave(torch.arange(1, 4), torch.tensor(tgt_len))[None]     # (1, 9)
y = torch.randn(1, sum(tgt_len), 16, dtype=torch.double)
memory = torch.randn(1, sum(src_len), 16, dtype=torch.double)
with torch.no_grad():
    alone = torch.cat([layer(y_k, m_k)[0] for y_k, m_k in
                       zip(y.split(tgt_len, 1), memory.split(src_len, 1), strict=True)], dim=1)
    self_mask, cross_mask = packed_masks(src_seg, tgt_seg)
    packed = layer(y, memory, cross_mask, self_mask)[0]
    unpacked = layer(y, memory, padding_mask(src_seg != 0), padding_mask(tgt_seg != 0))[0]
gap_packed, gap_05 = (packed - alone).abs().max().item(), (unpacked - alone).abs().max().item()
print(f"max |packed row - each pair alone|: {gap_packed:.1e} with the packed masks, {gap_05:.2f} with "
      "chapter 05's causal and padding masks")
per_row = 3 * (max(src_len) + max(tgt_len))
print(f"token slots: {per_row} padded (one pair per row), {sum(src_len) + sum(tgt_len)} packed")
assert gap_packed < 1e-12 < 0.1 < gap_05, "the packed masks must isolate the pairs, chapter 05's must not"

# %% [markdown]
# With the packed masks the row computes what the three separate runs compute, to rounding
# (the first number); with chapter 05's masks, the second and third pairs read the first, and
# their outputs move by the printed amount, as large as the outputs themselves. The second line
# counts what the padded batch would have spent on padding for the same three pairs. The
# attention itself still costs $T^2$ per row, so packing pays where sentences are short next to
# the row and the rest of the layer, which is per token, dominates.
#
# **4. Find the planted bug.** Each of the three properties is tested with one change to the
# input and one look at the output:
#
# * *no leak from the future*: change only the **last** target token and look at the outputs
#   **before** it; they must not move. (The other way round, changing the first token and
#   watching the later outputs, always sees a change: that is the prefix being read, not a
#   leak.) Change it by a random vector, not by a constant added to every feature: a pre-LN
#   layer normalises its input first, and the centring removes a constant shift exactly.
# * *no padding leak*: put garbage at the **padded** source positions only (`src_keep` False
#   there) and check that no output moves. Changing a real source token must change the
#   output, so that test proves nothing.
# * *every target position reads the whole source*: change the **last real** source token and
#   check that the output at the **first** target position moves. This is a dependence that must
#   exist; the two checks of section 5 look only for dependences that must not.
#
# We compare with a tolerance rather than bit for bit, since a layer need not take the same
# code path for two inputs.

# %%
def find_bug(layer, d_model: int) -> str:
    g = torch.Generator().manual_seed(0)
    y, memory = torch.randn(2, 5, d_model, generator=g), torch.randn(2, 6, d_model, generator=g)
    src_keep = torch.ones(2, 6, dtype=torch.bool)
    src_keep[1, 4:] = False                                          # two padded positions in the second
    out = layer(y, memory, src_keep)

    def moved(new: Tensor, old: Tensor) -> bool:
        return not torch.allclose(new, old, atol=1e-6)

    later = y.clone()
    later[:, -1] += torch.randn(d_model, generator=g)                # the last target token only
    if moved(layer(later, memory, src_keep)[:, :-1], out[:, :-1]):
        return "future"
    garbage = memory.clone()
    garbage[~src_keep] = 100 * torch.randn(int((~src_keep).sum()), d_model, generator=g)
    if moved(layer(y, garbage, src_keep), out):
        return "padding"
    far = memory.clone()
    far[0, -1] += torch.randn(d_model, generator=g)                  # the last source token, a real one
    if not moved(layer(y, far, src_keep)[0, 0], out[0, 0]):
        return "cross-causal"
    return "ok"


exercises.check("07.find_bug", find_bug, must_pass=True)

# %% [markdown]
# The same probe on real layers: the package's `DecoderLayer`, and PyTorch's
# `nn.TransformerDecoderLayer`, which applies only the masks it is given. Forget its causal
# `tgt_mask`, or its `memory_key_padding_mask` (where, unlike in this book, `True` means *may
# not* attend), and the probe names the bug:

# %%
torch.manual_seed(run.seed)
ours = DecoderLayer(16, 4, 32, dropout=0.0).eval()
theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()


def torch_layer(tgt_mask: bool, memory_padding: bool):
    def layer(y: Tensor, memory: Tensor, src_keep: Tensor) -> Tensor:
        T = y.shape[1]
        return theirs(y, memory, tgt_mask=~causal_mask(T) if tgt_mask else None,
                      memory_key_padding_mask=~src_keep if memory_padding else None)
    return layer


real_layers = {
    "DecoderLayer, padding_mask(src_keep)": lambda y, m, k: ours(y, m, padding_mask(k))[0],
    "DecoderLayer, no memory mask": lambda y, m, k: ours(y, m)[0],
    "nn.TransformerDecoderLayer, both masks": torch_layer(True, True),
    "nn.TransformerDecoderLayer, no tgt_mask": torch_layer(False, True),
    "nn.TransformerDecoderLayer, no memory_key_padding_mask": torch_layer(True, False),
}
expected = ["ok", "padding", "ok", "future", "padding"]
with torch.no_grad():
    for (name, layer), want in zip(real_layers.items(), expected, strict=True):
        found = find_bug(layer, 16)
        print(f"{name:>56s}: {found}")
        assert found == want, f"{name}: expected {want!r}"

# %% [markdown]
# Both correct setups pass, and each forgotten mask is named. The `DecoderLayer` without a
# memory mask reads the padding because it was *told* nothing about it: the layer is correct,
# the call is not, which is why the chapter passes `padding_mask(src_mask)` at every call. No
# setup of these layers gives `"cross-causal"`: neither ever masks cross-attention causally, and
# the probe does not invent it.
#
# ## Questions
#
# **1. Deeper attention-only stacks.** The chapter's one-layer argument needs the query to be
# the same for every input: at `<cls>` in layer 1 it is the embedding of `<cls>`, so a head's
# scores take only two values over the bits and its output is a ratio of degree-one polynomials
# in the count $n$. In layer 2 the query at `<cls>` is layer 1's output, which already depends on
# $n$, and so do the keys and values; the scores $s(n)$ are then non-linear in $n$, the softmax
# weights $e^{s(n)}$ are exponentials of them, and the degree bound is gone. Measured with the
# chapter's recipe (residual + LayerNorm around each attention sublayer, no feed-forward network,
# $d = 32$, 2 heads, Adam at $10^{-3}$, clipping at 1, full batch), with `run.parity_steps` steps
# (250 in the `cpu` profile) instead of 500:

# %%
import itertools  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from tfmlib.attention import MultiHeadAttention  # noqa: E402


class AttentionOnlyParity(nn.Module):
    """The chapter's ParityClassifier with `layers` attention-only sublayers (residual + post-LN)."""

    def __init__(self, layers: int, d_model: int = 32, heads: int = 2):
        super().__init__()
        self.embed = nn.Embedding(3, d_model)                   # ids: 0 and 1 are bits, 2 is <cls>
        self.attn = nn.ModuleList(MultiHeadAttention(d_model, heads) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.readout = nn.Linear(d_model, 2)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        for attn, norm in zip(self.attn, self.norms, strict=True):
            x = norm(x + attn(x)[0])
        return self.readout(x[:, 0])


parity_bits = torch.tensor(list(itertools.product([0, 1], repeat=5)))                 # all 32 inputs
parity_tokens = torch.cat([torch.full((len(parity_bits), 1), 2), parity_bits], dim=1)  # <cls> first
parity = parity_bits.sum(1) % 2
deep_parity = {}
for layers, seed in itertools.product((2, 4), range(3)):
    torch.manual_seed(seed)
    model = AttentionOnlyParity(layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    solved_at = None
    for step in range(run.parity_steps):
        logits = model(parity_tokens)
        if solved_at is None and bool((logits.argmax(-1) == parity).all()):
            solved_at = step
        loss = F.cross_entropy(logits, parity)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(parity_tokens).argmax(-1) == parity).float().mean().item()
    deep_parity[layers, seed] = (accuracy, solved_at)
    print(f"{layers} attention-only layers, seed {seed}: {accuracy:.1%} of the 32 inputs after {run.parity_steps} steps "
          f"(first at 100%: step {solved_at})")
assert run.profile == "smoke" or all(acc == 1.0 for acc, _ in deep_parity.values()), \
    "two or more attention-only layers should learn 5-bit parity from every seed here"

# %% [markdown]
# Every run learns parity, with two layers as with four, while one layer stayed at 65.6% for every
# seed in the chapter (and cannot pass 96.9%). So attention-only stacks are not weak because
# they lack a non-linearity: the softmax *is* one, of the input through the scores, and once
# the queries depend on the input (from layer 2 on) it composes like any other. What the
# feed-forward network adds is a non-linearity per position that needs no second layer; and
# Dong et al. (2021, §2) show that without the residual connections a pure attention stack
# loses rank with depth (chapter 07's section 2 measured the spread collapse), so the skips
# here matter as much as the depth.
#
# **2. Heads and parameters.** Counted with the package's `EncoderLayer`:

# %%
layer_params = {h: sum(p.numel() for p in EncoderLayer(512, h, 2048).parameters()) for h in (1, 8, 64)}
for h, n in layer_params.items():
    print(f"h = {h:2d} (d_k = {512 // h:3d}): {n:,} parameters; score entries for one sentence of 50 "
          f"tokens: h * T^2 = {h * 50 * 50:,}")
assert len(set(layer_params.values())) == 1, "the number of heads must not change the parameter count"

# %% [markdown]
# The same 3,152,384 for every $h$, the chapter's formula for the encoder layer. $W^Q$, $W^K$,
# $W^V$ are each one $d \times d$ matrix whatever $h$: splitting into heads only *reshapes*
# their output, $(B, T, d) \to (B, h, T, d/h)$, and $W^O$ stays $d \times d$. What changes:
# the score tensor is $(B, h, T, T)$, so its memory grows with $h$ (the $h \cdot T^2$ column
# above); the arithmetic of $QK^\top$ and of weights times values is $h \cdot T^2 \cdot d/h =
# T^2 d$ multiply-adds, the same for every $h$ (the projections, $4Td^2$, too), but the softmax
# and the masking run over $h$ times more entries, and many small matrix products are slower in
# practice than few large ones. What one head can represent shrinks: it mixes values with
# *one* distribution per query, and its scores are dot products in $d/h$ dimensions, so at
# $h = 64$ a head compares 8-dimensional projections (a score matrix of rank at most 8); at
# $h = 1$ the layer can attend to only one mixture per position. Vaswani et al. (2017, Table 3,
# rows (A)) found 1 head 0.9 BLEU worse than 8, and 32 heads worse too.
#
# **3. Causal mask plus padding.** When padding comes after the real tokens, a real query
# position $t$ has every padded key at $u > t$, which the causal mask already hides; the padding
# part removes nothing more from real rows, so their weights are the same. It changes only the
# rows of *padded* queries (which without it could attend to earlier padded keys), and those
# rows' outputs are never scored: the loss ignores the positions whose target is padding
# (chapter 02's masked loss), and nothing at a real position reads a padded position's output,
# because later layers apply the same masks. Checked on a `DecoderLayer`:

# %%
torch.manual_seed(0)
layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
tgt_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])     # the second target ends in 2 pads
src_mask = torch.ones(2, 7, dtype=torch.bool)
y, memory = torch.randn(2, 6, 16), torch.randn(2, 7, 16)
with torch.no_grad():
    causal_only, _, _ = layer(y, memory, padding_mask(src_mask), None)
    causal_and_padding, _, _ = layer(y, memory, padding_mask(src_mask), padding_mask(tgt_mask))
real_gap = (causal_only - causal_and_padding)[tgt_mask].abs().max().item()
padded_gap = (causal_only - causal_and_padding)[~tgt_mask].abs().max().item()
print(f"causal only vs causal + padding: real positions differ by {real_gap:.1e} "
      f"(bit for bit equal: {torch.equal(causal_only[tgt_mask], causal_and_padding[tgt_mask])}); "
      f"padded positions by {padded_gap:.2f}")
assert torch.equal(causal_only[tgt_mask], causal_and_padding[tgt_mask]), "real positions must not change"
assert padded_gap > 0, "the padding part should change the padded positions"

# %% [markdown]
# **4. Pre-LN's growing residual stream.** In pre-LN, $x_{l+1} = x_l + F_l(\mathrm{LN}(x_l))$:
# each sublayer reads a normalised input, so its output has a size that does not depend on
# $l$, and the stream adds them up. If the additions are roughly uncorrelated with $x_l$,
# $\|x_l\|^2 \approx \|x_0\|^2 + c\, l$, a norm growing like $\sqrt{l}$ (Xiong et al. 2020,
# §3.3, use this growth in their pre-LN analysis). A 24-layer pre-LN stack ($d = 64$) at
# initialisation, from inputs of variance 1 (norm about $\sqrt{64} = 8$ per position):

# %%
torch.manual_seed(0)
stack = nn.ModuleList(EncoderLayer(64, 4, 256, dropout=0.0, norm_first=True) for _ in range(24)).eval()
x = torch.randn(16, 20, 64)
stream_norms = [x.norm(dim=-1).mean().item()]
with torch.no_grad():
    for encoder_layer in stack:
        x, _ = encoder_layer(x)
        stream_norms.append(x.norm(dim=-1).mean().item())
    final_norm = nn.LayerNorm(64)(x).norm(dim=-1).mean().item()
gain = {l: (stream_norms[l] ** 2 - stream_norms[0] ** 2) / l for l in (4, 8, 16, 24)}
print("mean norm of x_l at l = 0, 4, 8, 16, 24:", ", ".join(f"{stream_norms[l]:.1f}" for l in (0, 4, 8, 16, 24)))
print("(|x_l|^2 - |x_0|^2) / l:", ", ".join(f"{g:.1f} (l = {l})" for l, g in gain.items()),
      f"; after a final LayerNorm: {final_norm:.1f}")
assert stream_norms[24] > 1.5 * stream_norms[0], "the pre-LN stream should grow with depth"
assert max(gain.values()) < 2 * min(gain.values()), "the squared norm should grow about linearly in l"

# %% [markdown]
# The squared norm grows about linearly (the gain per layer stays within a small range), so the
# norm grows like $\sqrt{l}$. Without a final LayerNorm the output layer would see vectors whose
# size depends on the depth $L$ (and keeps drifting in training as the sublayers' outputs grow),
# so the logits' scale, and the softmax's sharpness, would depend on $L$; with the tied output
# layer of section 6, the logits $E\,x_L$ would be about $\|x_L\|/\|x_0\|$ times larger than
# for a normalised vector. The final LayerNorm brings every position back to norm $\sqrt{d}$
# (printed above). Post-LN needs none: its stream leaves every sublayer through a LayerNorm.
#
# **5. $\sqrt{d}$ without tying.** The scale exists because the tied matrix must serve as an
# output layer: initialised with small entries (norm about 1 per row, as chapter 07 printed:
# 1.00, and logits of standard deviation 1.07 at initialisation), the embedding vectors are much
# smaller than the sinusoidal encoding (norm 16.0), and $\sqrt{512}$ brings them to 22.6.
# Without tying, nothing forces the embedding's scale: initialise it with entries of variance
# 1 (PyTorch's `nn.Embedding` default, norm $\sqrt{d}$), and the scale is unnecessary.
# Other ways to give tokens and positions a similar scale: scale
# the positional encoding *down* instead; use learned positional embeddings initialised like
# the token embeddings; apply a LayerNorm to the sum (as BERT does); or put positions inside the
# attention scores (rotary or relative positions, chapter 06), so no sum of two scales exists.
#
# **6. BatchNorm in a decoder.** BatchNorm normalises each feature with a mean and variance
# over the batch (and positions). At inference a decoder sees one sentence, one new token at a
# time: the batch statistics are those of one vector, or have to be replaced by running
# averages from training, which were computed over whole padded batches of all positions and
# need not match the statistics of one prefix; during training, the statistics would mix
# positions, so position $t$'s normalisation would depend on later tokens (a leak through the
# causal mask) and on padding and on the other sentences of the batch. LayerNorm (Ba et al.
# 2016, §3) computes its statistics over the $d$ features of one position of one example: the
# same in training and at inference, for any batch size, and causal by construction.
#
# **7. Adam's early steps.** Adam's update is $\hat m / (\sqrt{\hat v} + \epsilon)$, with $\hat v$
# an exponential average of $g^2$ corrected for its start at zero. In the first steps $\hat v$
# is an average over only a few gradients, so it has a large variance (at step 1, $\hat v = g_1^2$
# and the update is $\pm$ the learning rate in every coordinate, whatever the gradient's size);
# where $\hat v$ happens to be small, the step is large. Liu et al. (2020, §3) show the variance
# of the adaptive rate is unbounded for the first few steps and shrinks as the average fills. A
# warm-up keeps the learning rate small while $\hat v$ is unreliable, and lets it grow once the
# estimate covers many steps. Post-LN suffers more because its gradients at initialisation are
# largest near the output and uneven across layers (Xiong et al. 2020, §3.3; chapter 07's section
# 9 measured the spread of the $W_2$ gradient norms over the 12 layers, largest over smallest:
# post-LN's is more than twice pre-LN's for every initialisation, in its printed table), so
# large early updates land where they do most damage. In chapter 07's stability run post-LN
# without warm-up stalled near the loss of predicting word frequencies, more than a nat above
# the same model with warm-up and above pre-LN with or without it, in every seed (its verdict
# lines), while pre-LN ended within a few hundredths of a nat of its warmed-up twin.
#
# **8. Cross-attention once per sentence.** The encoder's output does not change while the
# decoder writes, so in each decoder layer the cross-attention keys $K = \text{memory}\, W^K$ and
# values $V = \text{memory}\, W^V$, both $(B, h, S, d_k)$, can be computed once per sentence and
# reused at every step (and the source padding mask too). At each step only the new position's
# query, $W^Q$ of one vector, and its $S$ scores are computed. That saves two $S \times d$ by
# $d \times d$ products per layer per step; the decoder's own keys and values grow by one
# position per step, and caching those is chapter 09's KV cache.

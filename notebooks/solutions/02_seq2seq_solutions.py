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
# # 02 · Solutions: sequence to sequence
#
# Worked solutions to the coding exercises of chapter 02, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Then the
# two classic fixes of the bottleneck, reversing the source and reading it in both directions,
# trained and measured against the plain model. Try the exercises in the chapter first.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.data import EOS_ID, TranslationDataset, build_vocabs
from tfmlib.decoding import evaluate_translator
from tfmlib.plot import plot_bleu_by_length
from tfmlib.seq2seq import EncoderOutput, Seq2Seq, count_parameters, train_translator
from tfmlib.synthetic import load_bundled

# %% [markdown]
# ## Coding exercises
#
# **1. The masked loss.** Gather the log-probability of each target id, keep the real
# positions, and average over them. Dividing by the number of *all* positions (or taking
# `.mean()` over everything) is the classic mistake: it counts padding as free, perfect
# predictions.

# %%
def masked_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    mask = targets != 0                                               # PAD_ID is 0
    log_probs = F.log_softmax(logits, dim=-1)                         # (B, T, V)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)    # (B, T)
    return nll[mask].sum() / mask.sum()


exercises.check("02.masked_token_loss", masked_token_loss, must_pass=True)

# %% [markdown]
# **2. Cut at the end token.** Rows have different lengths after cutting, so the result is a
# list of lists, not a tensor.

# %%
def cut_at_eos(tokens: Tensor) -> list[list[int]]:
    out = []
    for row in tokens.tolist():
        out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
    return out


exercises.check("02.cut_at_eos", cut_at_eos, must_pass=True)

# %% [markdown]
# **3. Reverse the source.** A row of length $n$ (EOS included) has its words at positions
# $0..n-2$ and EOS at $n-1$. Flipping the whole row would move the padding to the front.

# %%
def reverse_source(src: Tensor, src_mask: Tensor) -> Tensor:
    out = src.clone()
    for i, n in enumerate(src_mask.sum(dim=1).tolist()):
        out[i, : n - 1] = src[i, : n - 1].flip(0)
    return out


exercises.check("02.reverse_source", reverse_source, must_pass=True)

# %% [markdown]
# **4. The brevity penalty.** Output longer than the reference is not rewarded by the
# penalty, it is already punished by lower precision; output shorter is penalised
# exponentially in the ratio.

# %%
def brevity_penalty(h: int, r: int) -> float:
    return 1.0 if h > r else math.exp(1 - r / h)


exercises.check("02.brevity_penalty", brevity_penalty, must_pass=True)

# %% [markdown]
# **5. `padding_mask`.** Position $j$ of sentence $b$ is real exactly when $j < \text{length}_b$.
# Broadcasting a `(1, max_len)` row of positions against a `(batch, 1)` column of lengths compares
# every pair at once.

# %%
def padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]


exercises.check("02.padding_mask", padding_mask, must_pass=True)
print(padding_mask(torch.tensor([3, 1, 2]), 4).int())

# %% [markdown]
# **6. `padding_fraction`.** Each batch is padded to its longest sentence, so it occupies
# `len(batch) * max(lengths)` slots, of which `sum(lengths)` are real.

# %%
def my_padding_fraction(batches: list[list[int]], lengths: list[int]) -> float:
    real = slots = 0
    for batch in batches:
        batch_lengths = [lengths[i] for i in batch]
        real += sum(batch_lengths)
        slots += len(batch) * max(batch_lengths)
    return 1 - real / slots


exercises.check("02.padding_fraction", my_padding_fraction, must_pass=True)

# %% [markdown]
# ## Question 8: pools, not a full sort
#
# A full sort makes every epoch present the batches in nearly the same composition: each batch
# holds the same neighbouring lengths every epoch, and if the batches are not shuffled, training
# walks from short to long sentences, a curriculum you did not choose. Shrinking the pool gives
# more randomness but more padding; at a pool of one batch the sampler is random batching again.
# Measured on the bundled training split, in batches of 64, as the pool shrinks:

# %%
from tfmlib.data import BucketBatchSampler, tokenize  # noqa: E402

pool_lengths = [len(tokenize(en)) + 1 for en, _ in load_bundled("train")]  # + EOS, as the batches hold
pool_padding = {factor: my_padding_fraction(list(BucketBatchSampler(pool_lengths, 64, pool_factor=factor,
                                                                     seed=0)), pool_lengths)
                for factor in (1, 2, 5, 10, 50, 500)}
for factor, fraction in pool_padding.items():
    print(f"pool of {factor:3d} batches ({64 * factor:6,} sentences): {fraction:6.1%} of the grid is padding")
assert pool_padding[1] > pool_padding[10] > pool_padding[50] >= pool_padding[500] - 0.005, \
    "padding should shrink as the pool grows"

# %% [markdown]
# A pool of one batch pads about as much as random batches (section 1 of the chapter prints
# both); the padding falls quickly as the pool grows, and the book's default of 50 batches
# already leaves only a few percent, so a full sort would buy little more padding at the cost of
# the same neighbours in every batch.

# %% [markdown]
# ## Measured: reversing the source, and a bidirectional encoder
#
# Sutskever et al. (2014, §3.3) reversed the source sentence, "a b c" → "c b a", and saw large
# gains: the first source words, which the decoder needs first, are now read last, close to
# the summary. A bidirectional encoder (Schuster and Paliwal 1997) runs a second GRU from the
# right and joins both final states, so the summary holds the start and the end of the
# sentence near its surface. Both are one line on top of the package's `Seq2Seq`: the reversed
# model reverses its input with the solution above before encoding it.

# %%
class ReversedSeq2Seq(Seq2Seq):
    """Seq2Seq that reads the source words in reverse order (EOS stays last)."""

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        return super().encode(reverse_source(src, src_mask), src_mask)


run = setup(
    seed=0,
    smoke=dict(train_pairs=2_000, test_pairs=300, embed=32, hidden=64, epochs=1, batch_size=32, lr=2e-3,
               budget_s=None),
    cpu=dict(train_pairs=50_000, test_pairs=2_500, embed=64, hidden=128, epochs=1, batch_size=64, lr=3e-3,
             budget_s=None),
    # On one H100 (issue 13's step costs: a cuDNN GRU seq2seq step 4-10 ms): 5 epochs x 391 steps
    # = 1,955 steps per variant, 8-20 s; three variants 24-60 s. Each is capped at 25 s, so a slower
    # GPU stops on time with fewer steps (the cap can then cut the variants at different steps:
    # the printed step counts say so). The sizes are the cpu profile's or larger.
    gpu=dict(train_pairs=50_000, test_pairs=2_500, embed=128, hidden=256, epochs=5, batch_size=128, lr=2e-3,
             budget_s=25),
)
train_pairs, test_pairs = load_bundled("train")[: run.train_pairs], load_bundled("test")[: run.test_pairs]
src_vocab, tgt_vocab = build_vocabs(train_pairs)
train_data = TranslationDataset(train_pairs, src_vocab, tgt_vocab)

variants = {
    "plain": lambda: Seq2Seq(len(src_vocab), len(tgt_vocab), embed=run.embed, hidden=run.hidden),
    "reversed source": lambda: ReversedSeq2Seq(len(src_vocab), len(tgt_vocab), embed=run.embed,
                                               hidden=run.hidden),
    "bidirectional": lambda: Seq2Seq(len(src_vocab), len(tgt_vocab), embed=run.embed, hidden=run.hidden,
                                     bidirectional=True),
}
reports = {}
for name, make in variants.items():
    torch.manual_seed(run.seed)
    model = make()
    history, _ = train_translator(model, train_data, epochs=run.epochs, batch_size=run.batch_size, lr=run.lr,
                                  device=run.device, seed=run.seed, time_budget_s=run.budget_s, desc=name,
                                  verbose=False)
    reports[name] = evaluate_translator(model, test_pairs, src_vocab, tgt_vocab)
    by_bucket = "  ".join(f"{r['bucket']}: {r['bleu']:5.1f}" for r in reports[name].by_length)
    print(f"{name:16s} {count_parameters(model):>9,} params, {len(history.step_loss):,} steps, {history.seconds:5.1f} s, "
          f"BLEU {reports[name].bleu.score:5.1f} | {by_bucket}")

plot_bleu_by_length({name: r.by_length for name, r in reports.items()},
                    title="Fixes for the fixed-length summary (same steps, same batches)")
plt.show()

# %% [markdown]
# Read the table with the budget in mind: the same number of steps on the same batches, at the
# sizes printed by `setup`. In the committed run, reversing the source changed little: at most a
# few points of BLEU on short and medium sentences, where the first French words depend on English
# words now read last, and nothing (or a small loss) on the longest. Sutskever et al. (§3.3)
# expected the gain early in the target and found, to their surprise, that reversal helped long
# sentences too; their deep LSTMs met the summary only once, at the decoder's first step. Our
# decoder reads $c$ at every step, which already shortens the path from the source to every
# output word.
# The bidirectional encoder helped clearly (about 8 BLEU overall), with more parameters and a
# summary built from both ends. But neither changed the pattern of the bars: every variant still
# loses most of its BLEU on the longest sentences, because every variant still pushes the
# sentence through one vector. Small effects like the reversal's can change sign with the budget
# and the seed; to trust one, rerun with larger `run.epochs` and several seeds.

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
# # 03 · Solutions: attention
#
# Worked solutions to the coding exercises of chapter 03, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks, and worked
# answers to the chapter's questions. Each solution says why it is written the way it is, and
# which wrong turns the checker catches. The third is then used on a small trained model, to see
# whether attention coverage finds the sentences the model gets wrong. Try the exercises in the
# chapter first.

# %%
import torch
from torch import Tensor, nn

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.data import TranslationDataset, build_vocabs, pad_sequences, tokenize
from tfmlib.decoding import encode_sources, greedy_decode
from tfmlib.rnn_attention import AttentionSeq2Seq, masked_softmax
from tfmlib.seeds import over_seeds
from tfmlib.seq2seq import train_translator
from tfmlib.synthetic import load_bundled

run = setup(
    seed=0,
    smoke=dict(train_pairs=2_000, test_pairs=100, steps=8, batch_size=32, seeds=(0, 1)),
    cpu=dict(train_pairs=20_000, test_pairs=1_000, steps=250, batch_size=64, seeds=(0, 1, 2)),
    # The cpu sizes with 5 seeds; no time cap. An RNNsearch step measured 32-44 ms on one H100
    # (2026-11-26, five notebooks sharing it, at chapter 03's old gpu sizes; these models are
    # smaller): 5 x 250 steps, 40-55 s, plus greedy decoding of 1,000 sentences per seed.
    gpu=dict(train_pairs=20_000, test_pairs=1_000, steps=250, batch_size=64, seeds=(0, 1, 2, 3, 4)),
)

# %% [markdown]
# ## Coding exercises
#
# **1. Luong's decoder step, with input feeding.** The order of the three operations is the
# whole exercise. RNNsearch asks "where should I look?" with $s_{i-1}$, *before* it has read
# the previous word; Luong's decoder first runs the GRU on the previous word, so the query $s_t$
# already knows it, and attends afterwards. The price is that the recurrent step never sees a
# context: without input feeding the decoder would choose each alignment without knowing where
# it looked before. Feeding $\tilde h_{t-1}$ back (it is built from $c_{t-1}$) restores that
# memory, the role $c_i$ plays inside RNNsearch's GRU. The common slips, each named by the
# checker: attending with $s_{t-1}$ (that is RNNsearch again), feeding the state instead of
# $\tilde h_{t-1}$, joining $[s_t; c_t]$ where $W_c$ expects $[c_t; s_t]$ (the shapes fit, so only
# the values tell), forgetting the $\tanh$, and returning the context as the attentional vector.

# %%
def input_feeding_step(prev_embedded: Tensor, attentional: Tensor, state: Tensor, annotations: Tensor,
                       mask: Tensor, cell: nn.GRUCell, W_a: Tensor, W_c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    new_state = cell(torch.cat([prev_embedded, attentional], dim=-1), state)   # the step first: s_t
    scores = torch.einsum("bh,ha,bsa->bs", new_state, W_a, annotations)       # then attend with s_t
    weights = masked_softmax(scores, mask)                                     # padding gets exactly 0
    context = torch.bmm(weights[:, None, :], annotations).squeeze(1)          # (B, A)
    new_attentional = torch.tanh(torch.cat([context, new_state], dim=-1) @ W_c.T)  # (B, H), fed to t + 1
    return new_state, new_attentional, weights


exercises.check("03.input_feeding_step", input_feeding_step, must_pass=True)

# %% [markdown]
# A decoder built from this step starts from $\tilde h_0 = 0$ and, at every step, predicts the
# word from $\tilde h_t$ (Luong et al.'s eq. 6, $\operatorname{softmax}(W_s \tilde h_t)$). Run
# for a few steps on random inputs, the attentional vector changes what the next step attends
# to, which is the point of feeding it:

# %%
torch.manual_seed(0)
B, S, E, H, A = 2, 6, 4, 5, 8
cell, W_a, W_c = nn.GRUCell(E + H, H), torch.randn(H, A), torch.randn(H, A + H) / 3
annotations, mask = torch.randn(B, S, A), torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
words = torch.randn(3, B, E)
with torch.no_grad():
    for name, feed in (("with input feeding", True), ("feeding zeros", False)):
        state, attentional = torch.zeros(B, H), torch.zeros(B, H)
        for t in range(3):
            fed = attentional if feed else torch.zeros(B, H)
            state, attentional, weights = input_feeding_step(words[t], fed, state, annotations, mask, cell, W_a, W_c)
        print(f"{name:20s}: weights of sentence 1 at step 3 {weights[0].numpy().round(2)}")

# %% [markdown]
# The two runs read the same words; only what was fed back differs, and the third step's
# weights differ with it, a little here, with random weights. (In a trained model the fed-back
# vector tells the step which source words have been translated.)
#
# **2. Local-p attention.** Three details decide the result, and each is a wrong answer the
# checker names. The centre is the sigmoid times the sentence's *own* length: with the padded
# width, short sentences in a long batch would put their centre in the padding. The alignment is
# normalised over the window only: a softmax over the whole sentence, cut to the window
# afterwards, leaves weights that depend on scores outside the window. And the Gaussian
# multiplies *after* the softmax (Luong et al. eq. 10): adding its logarithm to the scores would
# renormalise it away, and the rows would sum to 1, where a local row sums to less, on purpose,
# since the Gaussian discounts positions far from the predicted centre. $\sigma = D/2$ puts the
# window's edge at two standard deviations.

# %%
def local_attention(scores: Tensor, mask: Tensor, query: Tensor, W_p: Tensor, v_p: Tensor,
                    D: int) -> tuple[Tensor, Tensor]:
    lengths = mask.sum(dim=1).to(scores.dtype)                                # real tokens per row
    center = lengths * torch.sigmoid(torch.tanh(query @ W_p.T) @ v_p)        # (B,), in [0, L]
    positions = torch.arange(scores.shape[1], dtype=scores.dtype, device=scores.device)
    distance = positions[None, :] - center[:, None]                          # (B, S), real-valued
    window = mask & (distance.abs() <= D)
    align = masked_softmax(scores, window)                                   # normalised inside the window
    sigma = D / 2
    return align * torch.exp(-distance ** 2 / (2 * sigma ** 2)), center


exercises.check("03.local_attention", local_attention, must_pass=True)

g = torch.Generator().manual_seed(1)
demo_mask = torch.tensor([[True] * 10 + [False] * 2])
weights, center = local_attention(torch.randn(1, 12, generator=g), demo_mask, torch.randn(1, 5, generator=g),
                                  torch.randn(6, 5, generator=g), torch.randn(6, generator=g), D=2)
print(f"centre {center.item():.2f}; weights {weights[0].numpy().round(3)}; row sum {weights.sum().item():.3f}")

# %% [markdown]
# At most $2D + 1$ positions get weight. That saves work only if only the window is scored: the
# cost per step then no longer grows with the source length. Here the scores come in for all $S$
# positions, so this function's cost still does; it shows the weights, not the saving. Luong et al. (2015, Table 1) found local-p with the general score their best single
# model on English–German.
#
# **3. Coverage.** A column of the attention matrix, summed over the real target steps, is how
# much of the translation's attention a source position received. The sum must skip the padded
# target steps: the teacher-forced weights of a padded step are a real distribution over the
# source (the model ran on `<pad>` there), so including them adds phantom attention to every
# sentence shorter than its batch. It must be a sum, not a mean, so that "translated once" means
# about 1. And the counts must skip positions that are no words: padding has coverage 0 and
# would count as "skipped", and the end token collects the attention of the final step (and of
# words the model writes without a source word, such as French articles that English lacks).
# Tell the words from the padding with `src_mask` (each row's length), not with "coverage > 0":
# a word no step attended to has coverage 0 as well (float32 softmax underflows to exactly 0,
# and a windowed attention such as exercise 2's gives exact zeros by design), and it is the
# clearest skip of all. The end token sits at each row's own length $- 1$, not in the last
# column of the padded grid.

# %%
def coverage(weights: Tensor, tgt_mask: Tensor, src_mask: Tensor, low: float,
             high: float) -> tuple[Tensor, Tensor, Tensor]:
    total = (weights * tgt_mask[:, :, None]).sum(dim=1)                          # (B, S)
    lengths = src_mask.sum(dim=1)
    is_word = torch.arange(src_mask.shape[1], device=src_mask.device)[None, :] < (lengths - 1)[:, None]
    return total, ((total < low) & is_word).sum(dim=1), ((total > high) & is_word).sum(dim=1)


exercises.check("03.coverage", coverage, must_pass=True)

# %% [markdown]
# ### Measured: does coverage find the mistranslations?
#
# The chapter's model translates almost every test sentence correctly, which leaves little to
# diagnose. So we train a smaller RNNsearch briefly (Luong's dot score at the sizes of the
# chapter's section 5, for the steps below), translate the test sentences greedily with their
# attention, and split the sentences by whether coverage flags a source word as skipped (below
# 0.5) or repeated (above 1.5). If coverage detects over- and under-translation, the flagged
# sentences should be the wrong ones more often. One trained model is one draw, so we train it
# from `run.seeds` (3 in the `cpu` profile; each seed changes the initial weights and the order
# of the batches) and print every seed's lines, then the spread.

# %%
train_pairs, test_pairs = load_bundled("train")[: run.train_pairs], load_bundled("test")[: run.test_pairs]
src_vocab, tgt_vocab = build_vocabs(train_pairs)
train_data = TranslationDataset(train_pairs, src_vocab, tgt_vocab)
BUCKETS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01))


def coverage_against_errors(seed: int) -> dict[str, float]:
    """Train the small model from ``seed`` (weights and batch order), translate the test split, and
    relate the share of each sentence's words that coverage flags to whether it is exact."""
    torch.manual_seed(seed)
    small = AttentionSeq2Seq(len(src_vocab), len(tgt_vocab), embed=64, enc_hidden=64, hidden=128,
                             attn_size=128, score="dot")
    history, _ = train_translator(small, train_data, epochs=1, max_steps=run.steps, batch_size=run.batch_size,
                                  lr=2e-3, device=run.device, seed=seed, desc="small RNNsearch", verbose=False)
    shares, rights = [], []          # per test sentence: the share of its words flagged, translated exactly?
    skipped_total = repeated_total = 0
    for start in range(0, len(test_pairs), 128):
        chunk = test_pairs[start:start + 128]
        src, src_mask = pad_sequences(encode_sources([en for en, _ in chunk], src_vocab))
        out = greedy_decode(small, src.to(run.device), src_mask.to(run.device), return_attention=True)
        steps = torch.arange(out.tokens.shape[1])[None, :]  # cpu: compared with lengths.cpu()
        tgt_mask = steps <= out.lengths.cpu()[:, None]            # the words and the <eos> step
        _, skipped, repeated = coverage(out.attention.cpu(), tgt_mask, src_mask, low=0.5, high=1.5)
        words = src_mask.sum(1) - 1                               # source words, without <eos>
        for b, (_, reference) in enumerate(chunk):
            output = [tgt_vocab.itos[i] for i in out.tokens[b, : int(out.lengths[b])].tolist()]
            rights.append(output == tokenize(reference))
            shares.append(float(skipped[b] + repeated[b]) / float(words[b]))
        skipped_total, repeated_total = skipped_total + int(skipped.sum()), repeated_total + int(repeated.sum())
    shares_t, rights_t = torch.tensor(shares), torch.tensor(rights)  # cpu: statistics, for printing
    print(f"seed {seed}: {len(history.step_loss)} steps in {history.seconds:.0f} s on {run.device}, last loss "
          f"{history.step_loss[-1]:.3f}; {int(rights_t.sum())} of {len(test_pairs)} translated exactly; "
          f"flagged source words: {skipped_total} skipped, {repeated_total} repeated")
    groups = {"exact": rights_t, "wrong": ~rights_t}
    # 0 for an empty group (a model this briefly trained in the smoke profile translates none exactly)
    mean_share = {name: shares_t[chosen].mean().item() if chosen.any() else 0.0 for name, chosen in groups.items()}
    print("    mean share of a sentence's words flagged: " + ", ".join(
        f"{name} translations {mean_share[name]:.1%}" if chosen.any() else f"{name} translations: none"
        for name, chosen in groups.items()))
    for low, high in BUCKETS:
        chosen = (shares_t >= low) & (shares_t < high)
        n = int(chosen.sum())
        rate = f"{rights_t[chosen].float().mean():6.1%} translated exactly" if n else ""
        print(f"    {low:4.0%}-{min(high, 1.0):4.0%} of the words flagged: {n:5d} sentences {rate}")
    return {"exact": float(rights_t.float().mean()) * 100,
            "flagged, exact ones": 100 * mean_share["exact"], "flagged, wrong ones": 100 * mean_share["wrong"]}


flags = over_seeds(coverage_against_errors, run.seeds)
print(f"\npercentages, median [min, max] over seeds {list(run.seeds)}:")
print(flags.table(fmt=".1f"))
print(flags.verdict("flagged, wrong ones", "flagged, exact ones", better="higher", fmt=".1f"))

# %% [markdown]
# Read the printed lines together. After so short a training the model makes many mistakes, and
# its attention is still loose: most sentences have some word flagged. What separates the exact
# translations from the wrong ones is *how much* is flagged. In the committed `cpu` run, for each
# of the 3 seeds, the share of a sentence's words with coverage far from 1 is larger, on average,
# among the wrong translations (by 7.7 to 12.9 points, the verdict line), and the sentences with
# the fewest flagged words (under a quarter) are the ones translated exactly most often. A share,
# not a count, so that long sentences, which have more words and more errors, do not make the
# relation for us. The relation is loose (the buckets do not fall steadily: at every seed the
# small last bucket is translated exactly more often than the one before it, and a small
# bucket's rate is noisy): coverage is a cheap detector, computed from weights the decoder
# produces anyway, not a proof of error. That is how it has been used: Tu et al. (2016) fed it
# back into the attention, and Wu et al. (2016, GNMT §7) added a coverage penalty to beam search
# scores. Function words the target needs and the source lacks (French articles, `ne`) draw
# attention onto the end token or a neighbour, so a correct translation can leave a word under
# the threshold.

# %% [markdown]
# ## Questions
#
# **1. $s_{i-1}$ or the state after the step.** Bahdanau's decoder chooses where to look from
# $s_{i-1}$: it knows everything written up to $y_{i-2}$ plus the context history, but not yet
# the word $y_{i-1}$ it is about to read; the word enters the GRU together with the fresh
# context. Luong's decoder runs the step on $y_{i-1}$ first, so its query knows the previous
# word as well, a more informed question; but then the recurrent state no longer receives the
# context, and without input feeding (exercise 1) the next query does not know where the last
# one looked. Each version has one piece of information the other lacks at the moment of
# choosing; in practice both work, and the choice is an engineering one.
#
# **2. Why attention is slower per step, and how it grows.** Three costs: scoring every source
# position at every target step ($O(S)$ work per step, $O(S \cdot T)$ per sentence, against
# $O(T)$ for chapter 02's decoder, which reads one fixed vector); the loop: $c_i$ depends on
# $s_{i-1}$, so the decoder cannot run as one fused GRU call over the target, and runs $T$
# small steps from Python; and the memory for the $T \times S$ weights and the stored contexts
# for the backward pass. The additive score adds a $\tanh$ layer of size $d_a$ (the attention
# size, `attn_size`) over all $S$ positions per step ($O(S \cdot T \cdot d_a)$) that the bilinear
# scores do not need. How much that shows in a whole training step is a measurement: the chapter
# times one step of each score in turn (section 5, `interleaved_medians`), and the GRU cell and
# the output layer into the vocabulary, which every score shares, are most of a step's work, so
# the score is a modest part of it: compare the ratios printed there with section 3's timing of
# the whole Python loop against chapter 02's fused decoder.
#
# **3. Monotone alignments without positions.** The score itself has no notion of order, but
# the annotations do: $h_j$ comes from GRUs that read the sentence in both directions, so it
# encodes the word together with its context and, implicitly, its place (what came before and
# after). The query $s_{i-1}$ also carries the translation's progress: what has been written.
# Together, "the next word to translate after the ones already done" is a pattern the score can
# match against the annotations, and since most French words follow the English order, the
# learned alignment is mostly monotone, bending only where the languages reorder (adjectives,
# object pronouns), as section 4's heatmaps show.
#
# **4. A quantity that detects repeats and skips.** The coverage of source word $j$,
# $\sum_i \alpha_{ij}$ over the steps of the translation: close to 1 for a word translated once,
# near 0 for a skipped word, well above 1 for a word translated twice. Exercise 3 computes it
# and flags both cases; the measurement above relates the flags to the model's errors. Tu et al.
# (2016) keep a running coverage vector in the decoder and give it to the alignment model, so
# that attention can avoid what is already covered.
#
# **5. The dot score and scales.** The dot score $s^\top h_j$ grows with the norms of the two
# vectors and with their dimension: if the decoder state and the annotations live at very
# different scales, the scores are either all near zero (uniform attention, a blurred context,
# small gradients for the alignment) or very large (a softmax that saturates into a one-hot
# choice, whose gradient almost vanishes for the positions not chosen). Training must then move
# the scales of both networks just to make attention usable. Chapter 05 divides the dot product
# by $\sqrt{d_k}$, which keeps the variance of the scores about 1 when the entries of query and
# key have unit variance, and the Transformer's layer normalisation keeps those scales in hand.
#
# **6. Heatmaps as explanations.** If very different distributions lead to the same prediction,
# then the one the model happened to produce is not *the* reason for the prediction: a heatmap
# shows where the model read, not which inputs were necessary. To explain with attention one
# must test it: change or remove the attended words and see whether the output changes, or
# compare with gradient-based attributions. Wiegreffe and Pinter (2019) answer that attention
# can still be informative when the model is trained with it and the alternatives are
# constrained; section 4's measurement is of that kind, a regularity over thousands of cases
# (nouns attend to their English noun) rather than one picture, and still says "where", not
# "why". Section 6 shows the gap directly: with the penalty most hops left the subject, often for
# the first word or `<eos>`, whose bidirectional states presumably summarise the sentence, and
# the classifiers were as accurate.
#
# **7. One hop, no penalty, two facts.** A single distribution that must serve two words far
# apart either concentrates on one of them (the other fact is lost) or splits its weight, and
# the embedding $M = A H$ is then one average of two annotations, from which the classifier must
# untangle both facts. With a bidirectional GRU underneath, the annotations already mix context,
# so the model can sometimes succeed by attending to a position whose state summarises both (as
# some penalised hops of section 6 seem to, peaking on the first word or `<eos>`); but for facts
# far apart,
# one hop is a bottleneck of the kind attention was invented to remove, which is why Lin et al.
# use several hops and the penalty that keeps them apart.

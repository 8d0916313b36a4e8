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
# # 00 · Preface: how to use this book
#
# This book takes you from a recurrent network to the Transformer in runnable chapters: nine of
# them so far, 00 to 08 (chapters 09 and 10, listed below, are not written yet).
# Each chapter builds one component in front of you, in PyTorch, checks it against the real
# thing, measures what it claims, and then moves the finished code into a small package,
# **`tfmlib`**, which later chapters import instead of retyping it.
#
# **This chapter builds** the ground the others stand on: how a run is sized (profiles), where it
# runs (device), how it is made repeatable (seeds); the corpus the translation chapters learn
# from; how sentences become padded tensors with masks; and why we batch sentences of similar
# length together, measured. It ends with the map of `tfmlib` and the way exercises work.
#
# **It assumes** Python, a little PyTorch (tensors, `nn.Module`, an optimiser step) and no
# knowledge of attention at all.
#
# ## The path
#
# | # | chapter | the question it answers |
# |---|---|---|
# | 00 | preface | how do I run, read and reuse this book? |
# | 01 | RNN and GRU | how does a network carry a sentence in one vector, and why do gates help gradients? |
# | 02 | seq2seq | can one fixed vector carry a whole sentence into another language? (it cannot, for long ones) |
# | 03 | Bahdanau attention | what if the decoder looks back at every source word? |
# | 04 | from GRU to self-attention | which parts of a GRU can we free, one by one, until it becomes self-attention? |
# | 05 | scaled dot-product and multi-head attention | why the $\sqrt{d_k}$, the masks, the heads? |
# | 06 | positional encoding | attention ignores order: how do we give it back? |
# | 07 | the Transformer | feed-forward layers, residuals, LayerNorm, encoder and decoder |
# | 08 | Transformer translation | training it well, decoding it well, and the comparison with chapters 02–03 |
# | 09 | decoder-only language model | a small GPT, sampling, and the KV cache (not written yet) |
# | 10 | scaling up | fused kernels, mixed precision, compilation, several processes (not written yet) |
#
# ## How to use it
#
# 1. **Read** a chapter as it is: every notebook is committed with the outputs of a run on a
#    laptop CPU, so numbers and figures are there before you run anything.
# 2. **Run** it: `bash run.sh lab` opens JupyterLab on `notebooks/`; `bash run.sh book` executes
#    every chapter (on copies, never your files) and writes an HTML book to `build/html/`.
# 3. **Do the exercises** at the end of each chapter: questions to think about, and coding tasks
#    with a checker that tells you whether your answer is right. Worked solutions live in
#    `notebooks/solutions/`.
# 4. **Reuse** `tfmlib` in your own code: `pip install -e .` and `from tfmlib.data import Vocab`.

# %% [markdown]
# ## Profiles, device and seeds
#
# How big should a run be? On a 2-core laptop we want each chapter to finish in a few minutes and
# still show something real; on a GPU we want the best model; and the automated tests want every
# notebook to run in seconds. One environment variable, `TFM_PROFILE`, picks among three
# *profiles*, and each notebook states its sizes for all three in one visible cell, always the
# first code cell, like this one:

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from tfmlib.config import PROFILES, active_profile, seed_everything, setup

run = setup(
    seed=0,
    smoke=dict(timing_batches=4, timing_hidden=32, timing_repeats=1),
    cpu=dict(timing_batches=60, timing_hidden=256, timing_repeats=3),
    gpu=dict(timing_batches=200, timing_hidden=512, timing_repeats=3),
)

# %% [markdown]
# `setup` read `TFM_PROFILE` (unset means `gpu` when CUDA is available and `cpu` otherwise),
# picked the device (CUDA, then Apple's MPS, then the CPU; `TFM_DEVICE=cpu` forces one), seeded
# Python, NumPy and PyTorch, and returned the sizes of the active profile as attributes:
# `run.timing_batches` is the number of batches timed further down. To run the whole book at
# another size, set the variable before starting Jupyter or the build:
#
# ```bash
# TFM_PROFILE=smoke bash run.sh book     # seconds per chapter: what the tests run
# TFM_PROFILE=cpu   bash run.sh lab      # the default without a GPU
# ```

# %%
print("profiles:", PROFILES, "| active:", active_profile(), "| device:", run.device)
print("PyTorch", torch.__version__, "| CPU threads:", torch.get_num_threads())

# %% [markdown]
# **Seeds.** On the CPU, a seeded run repeats exactly on the same machine and PyTorch version;
# on another machine the last digits may differ (floating-point sums are not associative, and
# different hardware adds in different orders). On a GPU some kernels (embedding gradients,
# cuDNN's recurrent layers) are nondeterministic unless `torch.use_deterministic_algorithms(True)`
# is set, so GPU reruns agree closely but not always to the last digit. Here is the guarantee,
# checked:

# %%
seed_everything(0)
first = torch.randn(3), np.random.rand(2)
seed_everything(0)
again = torch.randn(3), np.random.rand(2)
assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]), "seeding must repeat draws"
print("same seed, same numbers:", first[0].tolist())

# %% [markdown]
# ## The bundled corpus
#
# Translation is the task that motivated attention, so the first half of the book translates.
# Real corpora need a download and hours of training before a model says anything sensible on a
# CPU. The book therefore ships its own corpus: an English→French-like language pair written by a
# small *synchronous grammar* (`tfmlib.synthetic`), which produces each English sentence together
# with its translation. It is not French, but it has the features that make translation hard for
# a model that reads left to right:
#
# * **gender and number agreement**: *the white cats* → *les chats blancs*, *the white car* →
#   *la voiture blanche*;
# * **word order that changes**: most adjectives move after the noun, a few stay before it, so
#   alignments cross: *the small black cat* → *le petit chat noir*;
# * **negation in two parts**: *does not see* → *ne voit pas*, one word becoming two around the
#   verb;
# * **relative clauses and coordination**, which make sentences long: from 3 to 60 tokens.
#
# It is generated from a fixed seed, so everyone has the same files (a test regenerates them and
# compares), and the data card in `data/README.md` says how it was made.

# %%
# NBVAL_CHECK_OUTPUT
from tfmlib.synthetic import load_bundled

splits = {name: load_bundled(name) for name in ("train", "valid", "test")}
for name, pairs in splits.items():
    print(f"{name:5s}: {len(pairs):6d} pairs")

# %%
from tfmlib.data import tokenize

train = splits["train"]
src_len = np.array([len(tokenize(en)) for en, _ in train])
tgt_len = np.array([len(tokenize(fr)) for _, fr in train])
rng = np.random.default_rng(0)
for lo, hi in [(3, 8), (12, 20), (30, 200)]:
    i = rng.choice(np.flatnonzero((src_len >= lo) & (src_len < hi)))
    print(f"[{src_len[i]} tokens] {train[i][0]}\n{'':{len(str(src_len[i])) + 3}s}{train[i][1]}\n")

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
bins = np.arange(1, max(src_len.max(), tgt_len.max()) + 2)
ax.hist(src_len, bins=bins, histtype="step", linewidth=1.5, label="English (source)")
ax.hist(tgt_len, bins=bins, histtype="step", linewidth=1.5, label="French (target)")
ax.set(title="Sentence lengths in the bundled training split", xlabel="length (tokens)",
       ylabel="number of sentences", yscale="log")
ax.legend()
plt.show()
print(f"source length: median {np.median(src_len):.0f}, 90th percentile {np.percentile(src_len, 90):.0f}, "
      f"max {src_len.max()}; {np.mean(src_len >= 25):.1%} of sentences have 25 tokens or more")
print(f"mean length: English {src_len.mean():.2f}, French {tgt_len.mean():.2f} tokens; "
      f"the two differ by more than 3 tokens in {np.mean(abs(tgt_len - src_len) > 3):.1%} of pairs")

# %% [markdown]
# On a log scale the long tail stays visible: short sentences dominate, as in real corpora, but
# thousands have 25 tokens or more (English stops at 60 because the generator redraws longer
# sentences). Chapters 02 and 03 need both: short sentences to learn the words, long ones to show
# where a fixed-size summary vector breaks down.
#
# Each phenomenon above occurs in the data. A few searches count the pairs that show it and print
# the shortest example of each:

# %%
# NBVAL_CHECK_OUTPUT
import re

phenomena = {
    "adjective after the noun": lambda en, fr: " black " in en and " noir" in fr,
    "feminine and plural agreement": lambda en, fr: " black " in en and " noires" in fr,
    "adjective before and after": lambda en, fr: "small black" in en,
    "ne ... pas around the verb": lambda en, fr: re.search(r"\bne \w+ pas\b", fr),
    "n' before a vowel": lambda en, fr: " n'" in fr,
    "relative clause: qui": lambda en, fr: " qui " in fr,
    "relative clause: que/qu'": lambda en, fr: re.search(r"(?<!parce) qu(e |')", fr),
    "contraction de + le = du": lambda en, fr: " du " in fr,
    "contraction à + le = au": lambda en, fr: " au " in fr,
}
for name, test in phenomena.items():
    found = [(en, fr) for en, fr in train if test(en, fr)]
    en, fr = min(found, key=lambda p: len(p[0]))  # the shortest example reads best
    print(f"{name} ({len(found)} pairs)\n    {en}\n    {fr}")

# %% [markdown]
# ## From text to tensors
#
# A network reads numbers, so each sentence goes through three steps, all in `tfmlib.data`:
#
# 1. **tokenize**: split into words and punctuation; French elisions keep their apostrophe
#    (`l'oiseau` → `l'`, `oiseau`);
# 2. **look up ids** in a vocabulary built from the training split, with four special tokens:
#    `<pad>` (0) fills short sentences up to the batch's length, `<bos>` (1) and `<eos>` (2)
#    mark the beginning and end, and `<unk>` (3) stands for any word the vocabulary lacks;
# 3. **pad** a batch of id lists into one rectangle and remember, in a boolean **mask**, which
#    cells are real tokens.
#
# The vocabulary is built from the training split only. A word first seen at test time becomes
# `<unk>`, just as it would for a deployed model:

# %%
# NBVAL_CHECK_OUTPUT
from tfmlib.data import Vocab

src_vocab = Vocab.build(tokenize(en) for en, _ in train)
tgt_vocab = Vocab.build(tokenize(fr) for _, fr in train)
print(f"vocabulary sizes: English {len(src_vocab)}, French {len(tgt_vocab)} (4 special tokens each)")

sentence = "the small black cat does not see the zebra."
ids = src_vocab.encode(tokenize(sentence), eos=True)
print(ids)
print(src_vocab.decode(ids))
assert "<unk>" in src_vocab.decode(ids), "'zebra' is not in the corpus, so it must map to <unk>"

test_tokens = [t for _, fr in splits["test"] for t in tokenize(fr)]
oov = sum(t not in tgt_vocab for t in test_tokens) / len(test_tokens)
print(f"French test tokens missing from the training vocabulary: {oov:.3%}")

# %% [markdown]
# The generated language has a closed vocabulary, so no test word is unknown; real corpora are
# different (question 5 below asks what that changes). Notice also that French needs about a
# hundred more token types than English for sentences of the same length: agreement gives one
# English adjective up to five French forms (*beau, bel, belle, beaux, belles*), and a French verb
# has three forms (*voit, voient*, and the infinitive *voir* after *peut*) where English has two
# (*sees, see*). A translation model has to learn which form the context demands.

# %% [markdown]
# A translation batch needs three views of the target. The decoder *reads* the target shifted
# right, starting with `<bos>` (`tgt_in`), and must *predict* the target itself, ending with
# `<eos>` (`tgt_out`): at step $t$ it sees $y_{<t}$ and is scored on $y_t$ (this is *teacher
# forcing*, chapter 02). `make_batch` builds them, with masks:

# %%
from tfmlib.data import TranslationDataset, make_batch

dataset = TranslationDataset(train, src_vocab, tgt_vocab)
# three short pairs of different lengths, so the padding is visible but the printout stays short
examples = [next(i for i, (en, _) in enumerate(train) if len(tokenize(en)) == n) for n in (5, 7, 10)]
batch = make_batch([dataset[i] for i in examples])
for name in ("src", "src_mask", "tgt_in", "tgt_out", "tgt_mask"):
    print(f"{name:8s} {tuple(getattr(batch, name).shape)}")
print("\nfirst pair:", train[examples[0]])
print("tgt_in :", tgt_vocab.decode(batch.tgt_in[0], strip_special=False))
print("tgt_out:", tgt_vocab.decode(batch.tgt_out[0], strip_special=False))

# %%
from tfmlib.plot import plot_heatmap

labels = [" ".join(t for t in src_vocab.decode(batch.src[i], strip_special=False) if t != "<pad>")
          for i in range(3)]
ax = plot_heatmap(batch.src_mask.int(), title="Source mask: black = real token (<eos> included), white = padding",
                  xlabel="position in the padded batch", ylabel="sentence", y_labels=labels,
                  cmap="Greys", vmin=0, vmax=1, colorbar=False)
ax.figure.set_size_inches(8, 2.4)
plt.show()

# %% [markdown]
# Every later chapter uses this mask: to leave padding out of the loss (a model should not be
# rewarded for predicting `<pad>`), and, from chapter 03 on, to forbid attention to padded
# positions.
#
# ## Bucketing: don't pay for padding
#
# Padding is wasted work: a recurrent network runs every step of the padded rectangle, and an
# attention layer even compares every padded position with every other. With random batches one
# long sentence stretches the whole batch. A *bucketing* sampler (`BucketBatchSampler`) instead
# shuffles the data, sorts it by length within large pools, cuts the pools into batches and
# shuffles the batches: the batches stay random from epoch to epoch, but each holds sentences of
# similar length. How much padding does it save on this corpus?

# %%
# NBVAL_CHECK_OUTPUT
from tfmlib.data import BucketBatchSampler, padding_fraction

lengths = dataset.lengths()
batch_size = 64
order = np.random.default_rng(0).permutation(len(lengths)).tolist()
random_batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
bucketed_batches = list(BucketBatchSampler(lengths, batch_size, shuffle=True, seed=0))
waste = {"random batches": padding_fraction(random_batches, lengths),
         "bucketed batches": padding_fraction(bucketed_batches, lengths)}
for name, w in waste.items():
    print(f"{name:16s}: {w:6.1%} of the padded grid is padding")
assert waste["bucketed batches"] < waste["random batches"] / 4, "bucketing should cut padding sharply"

# %% [markdown]
# Less padding should mean less time. The next cell times a GRU (the model of chapter 01) running
# forward and backward over the same number of batches drawn both ways. The sizes come from the
# profile, and the measured ratio depends on your machine:

# %%
from tfmlib.data import pad_sequences


def time_gru(batches, hidden, repeats):
    """Seconds for a GRU forward+backward pass over the given batches (best of `repeats`)."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(len(src_vocab), 64).to(run.device)
    gru = torch.nn.GRU(64, hidden, batch_first=True).to(run.device)
    padded = [pad_sequences([dataset[i][0] for i in b])[0].to(run.device) for b in batches]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for ids in padded:
            out, _ = gru(embed(ids))
            out.sum().backward()
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


n = run.timing_batches
seconds = {name: time_gru(b[:n], run.timing_hidden, run.timing_repeats)
           for name, b in [("random", random_batches), ("bucketed", bucketed_batches)]}
tokens = {name: sum(len(b) * max(lengths[i] for i in b) for b in bb[:n])
          for name, bb in [("random", random_batches), ("bucketed", bucketed_batches)]}
for name in seconds:
    print(f"{name:8s}: {seconds[name]:6.2f} s for {n} batches ({tokens[name]:,} padded token slots)")
print(f"speed-up from bucketing: {seconds['random'] / seconds['bucketed']:.2f}x")

# %% [markdown]
# The speed-up follows the padded-slot count: a recurrent network's cost grows with the longest
# sentence in each batch, so removing padding removes time. The book's long training runs batch
# this way: translation models train through `make_loader`, which draws bucketed batches of
# pairs (chapter 02 calls it directly; `train_translator`, used by chapters 03, 07 and 08, calls
# it for you), and chapter 01's language models use the same `BucketBatchSampler` over single
# sentences. The short runs of chapters 04–07 (synthetic tasks whose sequences have one length,
# and chapter 07's small language-model comparison) use plain batches.
#
# ## Real corpora
#
# The same models run on real sentences. `tfmlib.corpora` reads two standard datasets from a
# folder you download them to: the Tatoeba/Anki English–French pairs (167k pairs, short
# everyday sentences) and Multi30k (29k image captions in English, German and French;
# `TFM_CORPUS=multi30k` translates German→English, the usual benchmark direction, and
# `multi30k-en-fr` keeps the English→French direction of the bundled corpus). Their
# loaders check the files' SHA-256 digests, and split Tatoeba *by distinct English sentence*:
# many English sentences have several French translations, and a split by line would leak test
# sentences into training. The translation chapters read their data through one switch,
# `TFM_CORPUS`:

# %%
from tfmlib.corpora import CORPORA, corpus_dir

for name, description in CORPORA.items():
    print(f"TFM_CORPUS={name:16s} {description}")

# %%
from tfmlib.corpora import DOWNLOAD_INSTRUCTIONS

for folder in ("tatoeba-fra-eng", "multi30k"):
    try:
        print(f"{folder}: found in {corpus_dir(folder)}\n")
    except FileNotFoundError:
        print(f"{folder}: not downloaded. To get it:\n{DOWNLOAD_INSTRUCTIONS[folder]}\n")

# %% [markdown]
# The instructions above (also in the docstrings of `tfmlib.corpora`) say where to download each
# corpus and where to put it: `data/external/` (which git ignores), or any folder named by
# `TFM_CORPORA_DIR`; `tfmlib.corpora.verify` checks the downloaded files against their SHA-256. Nothing in the book needs it: every chapter runs on the bundled corpus by
# default.
#
# ## The map of `tfmlib`
#
# Each module of the package holds what one chapter builds and records that chapter in the
# constant `INTRODUCED_IN`. A notebook imports only modules from its own or earlier chapters (a
# test checks this), so you can read the book in order without meeting code it has not explained.
# The table below is read from the package's files, not typed by hand:

# %%
import ast
import importlib.util
from pathlib import Path

package_dir = Path(importlib.util.find_spec("tfmlib").origin).parent
rows = []
for path in sorted(package_dir.glob("*.py")):
    if path.name == "__init__.py":
        continue
    tree = ast.parse(path.read_text())
    chapter = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", None) == "INTRODUCED_IN")
    rows.append((chapter, path.stem, ast.get_docstring(tree).splitlines()[0]))
for chapter, name, summary in sorted(rows):
    print(f"chapter {chapter:02d}  tfmlib.{name:10s} {summary}")

# %% [markdown]
# Where a chapter teaches a component that lives in the package, it shows the package's real
# source in a cell marked `# tfmlib-source: tfmlib.<module>.<name>`, and a test fails if the two
# ever differ: what you read is what you import.
#
# ## Summary
#
# * One variable, `TFM_PROFILE` (`smoke`, `cpu`, `gpu`), sizes every chapter through its first
#   cell; `setup` also picks the device and seeds the run, and seeded CPU runs repeat exactly on
#   one machine.
# * The bundled corpus is a generated English→French-like language with agreement, reordering,
#   two-part negation and long sentences: enough structure to make attention necessary, small
#   enough to train on a CPU.
# * Text becomes tensors in three steps (tokenize, look up ids with `<pad>`/`<bos>`/`<eos>`/`<unk>`,
#   pad with a mask). The mask keeps padding out of losses and, later, out of attention.
# * Batching sentences of similar length cut the padding of the training split from most of each
#   batch to a few percent, and the GRU's time in proportion (both measured above).
# * Real corpora load through `tfmlib.corpora` and the `TFM_CORPUS` switch.
#
# ## Exercises
#
# ### Questions
#
# 1. Why is the vocabulary built from the training split only? What would go wrong, and what
#    would merely look better, if it included the test split?
# 2. The bucketing sampler sorts within pools of `batch_size × 50` sentences, not over the whole
#    dataset. What would a full sort do to training? What happens to padding as the pool shrinks?
# 3. Splitting Tatoeba by line puts some English sentences in both training and test (with
#    different French translations). Which number in a results table would that inflate?
# 4. The cell above names two reasons why French needs about a hundred more token types than
#    English on this corpus. Account for the whole difference: which word classes add French
#    types, which *remove* some (English words with no French counterpart, or two English words
#    with one translation), and how many does each contribute?
# 5. On a real corpus some test words are not in the training vocabulary. What does the model
#    read in their place, and what can it write in the translation? How would you reduce the
#    number of unknown words without making the vocabulary huge?
#
# ### Coding exercises
#
# Each task is a function to fill in. The checker below it prints *not solved yet* and a hint
# until you write it, and tells you what is wrong if the answer is wrong; it never stops the
# notebook. Solutions: `notebooks/solutions/00_preface_solutions.ipynb`.
#
# **1.** Write `padding_mask(lengths, max_len)`: given a `(batch,)` tensor of sentence lengths,
# return the `(batch, max_len)` boolean mask that is `True` at real tokens. No Python loop.

# %%
from tfmlib import exercises


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    raise NotImplementedError  # your code here


exercises.check("00.padding_mask", padding_mask)

# %% [markdown]
# **2.** Write `my_padding_fraction(batches, lengths)` (named so it does not shadow
# `tfmlib.data.padding_fraction`, imported above): the fraction of all padded token slots (over
# all batches, each padded to its own longest sentence) that is padding. Then run
# `my_padding_fraction(random_batches, lengths)` and compare it with the fraction printed in the
# bucketing section.

# %%
def my_padding_fraction(batches: list[list[int]], lengths: list[int]) -> float:
    raise NotImplementedError  # your code here


exercises.check("00.padding_fraction", my_padding_fraction)

# %% [markdown]
# ## References
#
# * A. Vaswani et al., *Attention Is All You Need*, NeurIPS 2017: the destination of this book
#   (§3 the architecture, chapters 05–07; §5 training, chapter 08).
# * D. Bahdanau, K. Cho, Y. Bengio, *Neural Machine Translation by Jointly Learning to Align and
#   Translate*, ICLR 2015 (arXiv:1409.0473), §5 and Figure 2: the length experiment that chapters
#   02–03 repeat, which is why the bundled corpus has long sentences.
# * V. Khomenko et al., *Accelerating Recurrent Neural Network Training using Sequence Bucketing
#   and Multi-GPU Data Parallelization*, 2016: bucketing by length.
# * D. Elliott, S. Frank, K. Sima'an, L. Specia, *Multi30K: Multilingual English-German Image
#   Descriptions*, Workshop on Vision and Language 2016: the Multi30k corpus.
# * Tatoeba (tatoeba.org) and the ManyThings Anki exports (manythings.org/anki), CC-BY 2.0: the
#   English–French pairs.
# * K. Papineni et al., *BLEU: a Method for Automatic Evaluation of Machine Translation*, ACL 2002;
#   M. Post, *A Call for Clarity in Reporting BLEU Scores*, WMT 2018: how chapters 02–08 score
#   translations.

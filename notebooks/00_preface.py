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
# This book takes you from a recurrent network to the Transformer in twelve runnable chapters,
# 00 to 11; the last one leaves the bundled corpus for real text.
# Each chapter builds one component in front of you, in PyTorch, checks it against the real
# thing, measures what it claims, and then moves the finished code into a small package,
# **`tfmlib`**, which later chapters import instead of retyping it. This preface shows how a run
# is sized and seeded, the corpus the translation chapters learn from, and how a sentence becomes
# ids. It assumes Python and a little PyTorch (tensors, `nn.Module`, an optimiser step), and no
# knowledge of attention.
#
# | # | chapter | the question it answers |
# |---|---|---|
# | 00 | preface | how do I run, read and reuse this book? |
# | 01 | RNN and GRU | how does a network carry a sentence in one vector, and why do gates help gradients? |
# | 02 | seq2seq | can one fixed vector carry a whole sentence into another language? (not for long sentences, in a small model) |
# | 03 | Bahdanau attention | what if the decoder looks back at every source word? |
# | 04 | from GRU to self-attention | which parts of a GRU can we free, one by one, until it becomes self-attention? |
# | 05 | scaled dot-product and multi-head attention | why the $\sqrt{d_k}$, the masks, the heads? |
# | 06 | positional encoding | attention ignores order: how do we give it back? |
# | 07 | the Transformer | feed-forward layers, residuals, LayerNorm, encoder and decoder |
# | 08 | Transformer translation | training it well, decoding it well, and the comparison with chapters 02–03 |
# | 09 | decoder-only language model | a small GPT, sampling, and the KV cache |
# | 10 | scaling up | fused kernels, mixed precision, compilation, several processes |
# | 11 | real text | words fail on real corpora: byte-pair encoding, one shared vocabulary, the Transformer on Multi30k |
#
# **Read** a chapter as it is: every notebook is committed with the outputs of a run in the `cpu`
# profile. **Run** it: `bash run.sh lab` opens JupyterLab on `notebooks/`; `bash run.sh book`
# executes every chapter (on copies, never your files) into an HTML book in `build/html/`.
# **Do the exercises** at the end of each chapter: questions, and coding tasks with a checker
# (worked solutions in `notebooks/solutions/`). **Reuse** `tfmlib` in your own code
# (`pip install -e .`). Real corpora (Tatoeba, Multi30k) and the map of the package's modules
# are in the [README](../README.md#the-data) ([the package](../README.md#the-package-tfmlib)).
#
# ## Profiles, device and seeds
#
# One environment variable, `TFM_PROFILE`, sizes every run: `smoke` (seconds per chapter: what
# the tests run), `cpu` (from under a minute to about an hour per chapter on two CPU cores: the
# longest recorded, chapter 08, took 3,976 s with one thread on a machine busy with other runs;
# the [README](../README.md#measured-notebook-times) lists each one's measured time) or `gpu`
# (more seeds, and in some chapters larger models: each notebook's first cell lists its sizes). Each
# notebook's first code cell states its sizes for all three and calls `setup`, which also picks
# the device (CUDA, then Apple's MPS, then the CPU; `TFM_DEVICE=cpu` forces the CPU), sets the
# CPU threads (`TFM_THREADS`) and seeds Python, NumPy and PyTorch. The preface trains nothing,
# so its `setup` has no sizes:

# %%
import re

import numpy as np
import torch

from tfmlib.config import PROFILES, seed_everything, setup

run = setup(seed=0)

# %%
print(f"profiles: {PROFILES} | active: {run.profile} | device: {run.device} | "
      f"CPU threads: {torch.get_num_threads()} | PyTorch {torch.__version__}")

# %% [markdown]
# To run the whole book at another size, set the variable before starting Jupyter or the build
# (`TFM_PROFILE=smoke bash run.sh book`; unset, it means `gpu` when CUDA is available and `cpu`
# otherwise).
#
# **Seeds.** On the CPU a seeded run repeats exactly on the same machine, with the same PyTorch
# version and the same number of threads (`TFM_THREADS`): a sum split over more threads adds in
# another order, and its last bits change. On a GPU it repeats closely, not bit for bit: cuDNN's
# recurrent layers, embedding gradients and other atomic additions do not add in a fixed order
# (`torch.use_deterministic_algorithms(True)` makes PyTorch use deterministic kernels or raise
# where it has none, at some cost in speed). The draws themselves repeat on any one device,
# though CUDA's generator draws other numbers than the CPU's for the same seed:

# %%
seed_everything(0)
first = torch.randn(3, device=run.device).cpu(), np.random.rand(2)
seed_everything(0)
again = torch.randn(3, device=run.device).cpu(), np.random.rand(2)
assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]), "seeding must repeat draws"
print(f"same seed, same draws on {run.device}:", first[0].tolist())

# %% [markdown]
# ## The bundled corpus
#
# Translation is the task that motivated attention, so the first half of the book translates.
# Real corpora need a download and hours of training before a model says anything sensible on a
# CPU, so the book ships its own: an English→French-like language pair written by a small
# *synchronous grammar* (`tfmlib.synthetic`), which produces each English sentence together with
# its translation, from a fixed seed (a test regenerates the files and compares; `data/README.md`
# is its data card). It is not French, but it has what makes translation hard for a model that
# reads left to right: agreement in gender and number, adjectives that move after the noun (so
# alignments cross), negation in two parts around the verb, and relative clauses that make
# sentences long. Three examples, each the shortest pair that shows its feature, and how many
# training pairs match the example's filter (the first filter is narrow on purpose: *small
# black* before a feminine plural noun, *noires*; agreement itself is in most pairs):

# %%
# NBVAL_CHECK_OUTPUT
from tfmlib.data import tokenize
from tfmlib.synthetic import load_bundled

splits = {name: load_bundled(name) for name in ("train", "valid", "test")}
train = splits["train"]
print(" | ".join(f"{name}: {len(pairs):,} pairs" for name, pairs in splits.items()))
examples = {
    "agreement, and adjectives before and after the noun": lambda en, fr: "small black" in en and " noires" in fr,
    "negation in two parts": lambda en, fr: re.search(r"\bne \w+ pas\b", fr),
    "a relative clause, in a long sentence": lambda en, fr: " qui " in fr and len(tokenize(en)) >= 25,
}
for name, test in examples.items():
    found = [(en, fr) for en, fr in train if test(en, fr)]
    en, fr = min(found, key=lambda p: len(p[0]))
    print(f"\n{name} ({len(found):,} pairs), {len(tokenize(en))} tokens:\n    {en}\n    {fr}")
lengths = np.array([len(tokenize(en)) for en, _ in train])
print(f"\nEnglish lengths: {lengths.min()} to {lengths.max()} tokens, median {np.median(lengths):.0f}; "
      f"{np.mean(lengths >= 25):.1%} of the pairs have 25 tokens or more")

# %% [markdown]
# Half the sentences are short (the median is printed above), as in real corpora, but the tail
# of long ones is large (the share of 25 tokens or more, printed last): chapters 02 and 03 need
# both, short ones to learn the words and long ones to show where a fixed-size summary vector
# breaks down.
#
# ## From text to ids
#
# A network reads numbers. `tfmlib.data` turns a sentence into ids in two steps:
#
# 1. **tokenize**: split into words and punctuation; French elisions keep their apostrophe
#    (`l'oiseau` → `l'`, `oiseau`);
# 2. **look up ids** in a vocabulary built from the training split, with four special tokens:
#    `<pad>` (0) fills short sentences up to a batch's length (chapter 02), `<bos>` (1) and
#    `<eos>` (2) mark the beginning and end, and `<unk>` (3) stands for any word the vocabulary
#    lacks.
#
# The vocabulary is built from the training split only, so a word first seen at test time
# becomes `<unk>`, as it would for a deployed model:

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
# different (question 4 below asks what that changes). French needs more token types than
# English for sentences of the same length (the counts above): agreement gives one English
# adjective up to five French forms (*beau, bel, belle, beaux, belles*), and a French verb has
# three forms (*voit, voient*, and the infinitive *voir* after *peut*) where English has two
# (*sees, see*). A translation model has to learn which form the context demands. Chapter 02
# starts from these id lists: it pads them into batches with masks, and measures why sentences
# of similar length should share a batch.
#
# ## Summary
#
# * One variable, `TFM_PROFILE` (`smoke`, `cpu`, `gpu`), sizes every chapter through its first
#   cell; `setup` also picks the device, sets the threads and seeds the run. Seeded runs repeat
#   exactly on the CPU (same machine, PyTorch version and thread count), and closely, not bit for
#   bit, on a GPU.
# * The bundled corpus is a generated English→French-like language with agreement, reordering,
#   two-part negation and long sentences: enough structure to make attention necessary, small
#   enough to train on a CPU.
# * Text becomes ids by tokenizing and looking tokens up in a vocabulary of the training split,
#   with `<pad>`, `<bos>`, `<eos>` and `<unk>`.
#
# ## Exercises
#
# ### Questions
#
# 1. Why is the vocabulary built from the training split only? What would go wrong, and what
#    would merely look better, if it included the test split?
# 2. Many English sentences of Tatoeba have several French translations, so `tfmlib.corpora`
#    splits it *by distinct English sentence*. Splitting it by line puts some English sentences
#    in both training and test (with different French translations). Which number in a results
#    table would that inflate?
# 3. The text above names two reasons why French needs more token types than English on this
#    corpus. Account for the whole difference: which word classes add French types, which
#    *remove* some (English words with no French counterpart, or two English words with one
#    translation), and how many does each contribute?
# 4. On a real corpus some test words are not in the training vocabulary. What does the model
#    read in their place, and what can it write in the translation? How would you reduce the
#    number of unknown words without making the vocabulary huge?
#
# ### Coding exercise
#
# The function below is yours to fill in. The checker under it prints *not solved yet* and a hint
# until you write it, and tells you what is wrong if the answer is wrong; it never stops the
# notebook. Solutions: `notebooks/solutions/00_preface_solutions.ipynb`.
#
# **1. How much training text does a vocabulary need?** The section *From text to ids* measured
# one number: the share of French test tokens that a vocabulary of the *whole* training split
# lacks. Measure the curve instead. Write `unknown_rate_curve(train, test, sizes)`: for each `n` in `sizes`, build a
# vocabulary from the first `n` training sentences, and return the share of the tokens of the
# test sentences that it lacks (the ones the model would read as `<unk>`). Then run it on the
# French side of the bundled corpus for sizes from 10 sentences to the whole split, and find the
# smallest size at which no test token is unknown. Would the curve of a real corpus reach zero?
# The checker's sentences are capitalised, as real text is.

# %%
from tfmlib import exercises


def unknown_rate_curve(train: list[str], test: list[str], sizes: list[int]) -> list[float]:
    """The unknown-token rate of ``test`` against the size of the training text.

    ``train`` and ``test`` are sentences (strings, tokenized as the book tokenizes them); for each
    ``n`` in ``sizes`` (in that order) the vocabulary is built from ``train[:n]`` (``n = 0``: an empty
    one). Returns a list of ``len(sizes)`` floats in [0, 1]: the fraction of all test tokens, every
    occurrence counted (of a repeated test sentence too), that the vocabulary does not contain.
    """
    raise NotImplementedError  # your code here


exercises.check("00.unknown_rate_curve", unknown_rate_curve)

# %% [markdown]
# ## References
#
# * A. Vaswani et al., *Attention Is All You Need*, NeurIPS 2017: the destination of this book
#   (§3 the architecture, chapters 05–07; §5 training, chapter 08).
# * D. Bahdanau, K. Cho, Y. Bengio, *Neural Machine Translation by Jointly Learning to Align and
#   Translate*, ICLR 2015 (arXiv:1409.0473), §5 and Figure 2: the length experiment that chapters
#   02–03 repeat, which is why the bundled corpus has long sentences.
# * Tatoeba (tatoeba.org) and the ManyThings Anki exports (manythings.org/anki), CC-BY 2.0; D.
#   Elliott, S. Frank, K. Sima'an, L. Specia, *Multi30K: Multilingual English-German Image
#   Descriptions*, 2016: the real corpora the README describes.
# * K. Papineni et al., *BLEU: a Method for Automatic Evaluation of Machine Translation*, ACL 2002;
#   M. Post, *A Call for Clarity in Reporting BLEU Scores*, WMT 2018: how chapters 02–08 score
#   translations.

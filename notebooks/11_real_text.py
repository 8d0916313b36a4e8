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
# # 11 · Real text: byte-pair encoding and the Transformer on Multi30k
#
# Every model so far read whole words, and on the book's bundled corpus nothing went wrong: its
# grammar has a closed list of words, so a test sentence holds no word the training sentences
# lacked. Real text is not like that. Compounds, rare inflections, names and numbers keep
# arriving, and a word vocabulary can only map each of them to `<unk>`. The second sentence of
# Multi30k's test set, "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen
# Zaun", holds "saftig" ("lush"), which the 29,000 German training sentences use once (section 1
# prints the counts): a vocabulary of the 10,000 most frequent German words reads it as `<unk>`,
# and a model trained on it cannot translate it, however long it trains. Vaswani et al. (2017, §5.1) did not train on words: they encoded
# sentences "using byte-pair encoding, which has a shared source-target vocabulary of about
# 37000 tokens", and every large model since reads text as pieces of words.
#
# **This chapter builds**
#
# 1. the measurement that motivates it: how many words of a real test set a word vocabulary
#    does not know, at each vocabulary size;
# 2. byte-pair encoding (BPE) as Sennrich, Haddow and Birch (2016) wrote it: merges learned
#    from word counts, applied in the order learned, an end-of-word symbol; the package's
#    version (`tfmlib.bpe`) checked against the paper's slow algorithm and against Hugging Face
#    `tokenizers`, a library that large systems use, merge for merge on the same corpus;
# 3. the trade-off a vocabulary size makes, measured: sentence length in tokens against the
#    unknown rate, for words and for subwords;
# 4. one vocabulary for both languages and the three-way tied embedding of Vaswani et al. §3.4
#    (Press and Wolf 2017): one matrix for the source embedding, the target embedding and the
#    output layer;
# 5. the book's Transformer trained on Multi30k read as subwords: BLEU with sacreBLEU's
#    signature, BLEU by sentence length, translations next to their references, one
#    attention map over pieces of words, and the errors that remain, sorted by rules on 50
#    sentences.
#
# **It assumes** chapters 07 and 08 (the Transformer and its training recipe). Multi30k
# (Elliott et al. 2016; 29,000 image descriptions in German with English translations) is read
# from disk: `python -m tfmlib.corpora download multi30k` fetches it once and checks its
# SHA-256 sums. Without it the chapter runs on the bundled corpus, where words do not fail, and
# says so. The code it finishes is in `tfmlib.bpe`; `tfmlib.data.WordTokenizer` and
# `tfmlib.bpe.SubwordTokenizer` are the two text pipelines that `TranslationDataset`,
# `translate` and `evaluate_translator` accept.

# %%
from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from tokenizers import pre_tokenizers

from tfmlib import exercises
from tfmlib.bpe import (  # the listings in section 2 call two small helpers
    BPE,
    END_OF_WORD,
    Merge,
    SubwordTokenizer,
    initial_symbols,
    learn_merges,
    learn_merges_tokenizers,
    split_word,
    word_counts,
)
from tfmlib.config import setup
from tfmlib.corpora import load_corpus
from tfmlib.data import TranslationDataset, Vocab, WordTokenizer, make_batch, tokenize
from tfmlib.decoding import evaluate_translator
from tfmlib.plot import plot_bleu_by_length, plot_heatmap
from tfmlib.seq2seq import count_parameters, train_translator
from tfmlib.transformer import Transformer

run = setup(
    seed=0,
    smoke=dict(train_pairs=2_000, test_pairs=100, merges=300, sweep_merges=[0, 100, 300], sweep_words=[200, 500],
               check_pairs=300, check_merges=50, batch_size=32, steps=30, warmup=10, peak_lr=2e-3,
               transformer=dict(d_model=32, heads=2, encoder_layers=1, decoder_layers=1, d_ff=64, dropout=0.1),
               error_sentences=20),
    # cpu: 700 steps of 128 sentences, about three passes over Multi30k's 29,000 pairs: 0.8-1.1 s a
    # step on an AVX2 CPU that does about 74 GFLOP/s on 2 cores (556 s of training on one thread,
    # 741 s on two beside other work)
    cpu=dict(train_pairs=None, test_pairs=None, merges=4_000, sweep_merges=[0, 500, 1_000, 2_000, 4_000, 8_000, 16_000],
             sweep_words=[1_000, 2_000, 5_000, 10_000, 20_000], check_pairs=3_000, check_merges=300,
             batch_size=128, steps=700, warmup=200, peak_lr=2e-3,
             transformer=dict(d_model=128, heads=4, encoder_layers=2, decoder_layers=2, d_ff=512, dropout=0.1),
             error_sentences=50),
    # gpu: estimated, not yet measured on a GPU: chapter 08's 3 + 3-layer model cost 25-35 ms a
    # step on one H100 at 128 sentences; 4,000 steps is some 2-2.5 minutes and about 18 passes
    gpu=dict(train_pairs=None, test_pairs=None, merges=8_000, sweep_merges=[0, 500, 1_000, 2_000, 4_000, 8_000, 16_000],
             sweep_words=[1_000, 2_000, 5_000, 10_000, 20_000], check_pairs=3_000, check_merges=300,
             batch_size=128, steps=4_000, warmup=1_000, peak_lr=1e-3,
             transformer=dict(d_model=256, heads=4, encoder_layers=3, decoder_layers=3, d_ff=1024, dropout=0.1),
             error_sentences=50),
)

# %% [markdown]
# ## 1. Words on real text
#
# The corpus: Multi30k German to English when it is on disk (`tfmlib.corpora.load_corpus`
# finds it in `data/external/multi30k` or under `$TFM_CORPORA_DIR`), the bundled corpus
# otherwise. The first line printed says which one this run read.

# %%
try:
    corpus, corpus_name = load_corpus("multi30k"), "multi30k (de -> en)"
except FileNotFoundError:
    corpus, corpus_name = load_corpus("synthetic"), "the bundled corpus (en -> fr)"
real_text = corpus_name.startswith("multi30k")
train_pairs = corpus["train"][: run.train_pairs] if run.train_pairs else corpus["train"]
test_pairs = corpus["test"][: run.test_pairs] if run.test_pairs else corpus["test"]
print(f"corpus: {corpus_name}; {len(train_pairs):,} training pairs, {len(test_pairs):,} test pairs")
for source, target in test_pairs[:3]:
    print(f"  {source}\n  {target}\n")

# %% [markdown]
# A word vocabulary keeps the $N$ most frequent training words; every other word becomes
# `<unk>`. The *unknown rate* is the share of test-set word tokens (punctuation included) that
# the vocabulary maps to `<unk>`. We count both sides, since a translator must read the source
# and write the target.

# %%
word_tokenizer = WordTokenizer()
train_words = {side: [word_tokenizer.tokens(pair[side]) for pair in train_pairs] for side in (0, 1)}
test_words = {side: [word_tokenizer.tokens(pair[side]) for pair in test_pairs] for side in (0, 1)}
language = {0: "source", 1: "target"}


def unknown_share(sentences: Sequence[Sequence[str]], known: set[str]) -> float:
    """The fraction of tokens in ``sentences`` that are not in ``known``."""
    tokens = [t for s in sentences for t in s]
    return sum(t not in known for t in tokens) / len(tokens)


word_rows = []
for side in (0, 1):
    counts = word_counts(train_words[side])
    for size in [*run.sweep_words, len(counts)]:
        if size > len(counts):
            continue
        known = {w for w, _ in counts.most_common(size)}
        word_rows.append(dict(side=language[side], vocab=size,
                              unknown=unknown_share(test_words[side], known),
                              per_sentence=statistics.mean(map(len, test_words[side]))))
print(f"{'side':>7} {'words kept':>10} {'unknown rate':>13}")
for row in word_rows:
    print(f"{row['side']:>7} {row['vocab']:>10,} {100 * row['unknown']:>12.2f}%")

all_words_rows = {row["side"]: row for row in word_rows}  # the last row of each side: every training word
seen_source_words = set(word_counts(train_words[0]))
unseen = Counter(w for s in test_words[0] for w in s if w not in seen_source_words)
print(f"\nsource words in the test set never seen in training: {sum(unseen.values())} tokens, "
      f"{len(unseen)} distinct; the most frequent: {', '.join(w for w, _ in unseen.most_common(12))}")
source_counts = word_counts(train_words[0])
top_10k = {w for w, _ in source_counts.most_common(10_000)}
if len(test_pairs) > 1:
    print(f"test sentence 2, {test_pairs[1][0]!r}: training counts of its words outside the 10,000 most "
          f"frequent: {[(w, source_counts[w]) for w in test_words[0][1] if w not in top_10k]}")
if real_text:
    assert all_words_rows["source"]["unknown"] > 0.005, \
        "on real text even a vocabulary of every training word misses some test words"


# %% [markdown]
# Even a vocabulary of *every* training word (the last row of each side) leaves test words
# unknown on real text, and the words it misses are ones a translation needs to get right: in
# the list printed above, mostly German compounds (German writes them as one word) and rare
# inflections of known stems. On
# the bundled corpus the rate is zero at full size: its lexicon is closed, which is why
# chapters 02 to 10 could ignore the problem. The printed words above show what kind of
# word goes missing in this run.
#
# Two ways out are older than BPE: keep a large vocabulary and back off to a dictionary for
# the unknown words (Jean et al. 2015; Luong et al. 2015), or read characters (long sequences,
# slow attention). Sennrich et al. (2016) proposed a third: a vocabulary of *pieces* of words,
# chosen by frequency, in which every word can be written.
#
# ## 2. Byte-pair encoding
#
# ![Byte-pair encoding on the paper's toy counts: merges learned from word counts, then applied in order to a new word; and one embedding matrix used three times](figures/11_bpe.svg)
#
# *(a) The four words of Sennrich et al.'s example with their counts; each merge glues the most
# frequent adjacent pair of symbols into one (ties go to the pair whose symbols came first).
# (b) A new word is encoded by replaying the merges in the order they were learned. (c) With one
# vocabulary for both languages, one matrix $E$ embeds source tokens, embeds target tokens and
# (transposed) computes the output logits.*
#
# **Learning.** Start from words as sequences of characters, each word ending in an
# end-of-word symbol `</w>`, weighted by how often the word occurs. Let $c(a, b)$ be the number
# of times symbol $a$ is followed by symbol $b$ over all words, each word counted as often as it
# occurs. Repeat $M$ times:
#
# $$(a^\ast, b^\ast) = \arg\max_{(a, b)} c(a, b), \qquad \text{replace every adjacent } a^\ast\, b^\ast \text{ by the new symbol } a^\ast b^\ast .$$
#
# The $M$ pairs, in order, are the *merge table*; the vocabulary is the characters plus one
# new symbol per merge. **Encoding** a word replays the table: split it into characters and
# `</w>`, then apply merge 1 wherever it fits, then merge 2, and so on. A frequent word ends up
# as one symbol; a rare one as a few pieces that were frequent; a word of known characters can
# always be written. The end-of-word symbol keeps "est" in "estate" apart from "est</w>"
# ending "widest", and tells the decoder where words end, so that pieces go back to text
# without ambiguity.
#
# Ties need a rule, since two pairs often have the same count. `tfmlib.bpe` takes the pair
# whose symbols entered the vocabulary first (characters in code-point order, then `</w>`, then
# merged symbols in the order made): Hugging Face `tokenizers`' rule, so that the two can be
# compared merge for merge. The paper's own code takes the pair its dictionary happens to yield
# first.
#
# Here is the package's code, as the paper writes the algorithm: count every pair, merge the
# best, count again.

# %%
# tfmlib-source: tfmlib.bpe.merge_pair
def merge_pair(symbols: Sequence[str], pair: Merge) -> list[str]:
    """``symbols`` with every occurrence of ``pair`` glued into one symbol, left to right.

    ``["a", "a", "a"]`` with ``("a", "a")`` -> ``["aa", "a"]`` (occurrences do not overlap).
    """
    a, b = pair
    out: list[str] = []
    i, last = 0, len(symbols) - 1
    while i <= last:
        if i < last and symbols[i] == a and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


# %%
# tfmlib-source: tfmlib.bpe.learn_merges_slowly
def learn_merges_slowly(counts: Mapping[str, int], num_merges: int, min_frequency: int = 2) -> list[Merge]:
    """Sennrich et al.'s Algorithm 1 as written: ``num_merges`` times, count every pair of adjacent
    symbols over all words (times the word's count), merge the most frequent pair everywhere.

    ``counts`` maps words to how often they occur (:func:`word_counts`). Stops early when no pair
    occurs ``min_frequency`` times. Ties go to the pair whose symbols entered the vocabulary first
    (see the module docstring). Returns the merges in the order learned. Each step reads every
    word: use :func:`learn_merges` (same result) on a real corpus.
    """
    _check_counts(counts, "learn_merges_slowly")
    _check_learning(num_merges, min_frequency, "learn_merges_slowly")
    order = {s: i for i, s in enumerate(initial_symbols(counts))}
    words = {tuple(split_word(w)): c for w, c in counts.items()}
    merges: list[Merge] = []
    while len(merges) < num_merges:
        pairs: Counter[Merge] = Counter()
        for symbols, count in words.items():
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], order[p[0]], order[p[1]]))
        if pairs[best] < min_frequency:
            break
        merges.append(best)
        order.setdefault(best[0] + best[1], len(order))
        words = {tuple(merge_pair(symbols, best)): count for symbols, count in words.items()}
    return merges


# %%
# tfmlib-source: tfmlib.bpe.apply_merges
def apply_merges(word: str, merges: Sequence[Merge]) -> list[str]:
    """Encode one word by the definition: start from its characters and ``"</w>"``, then apply
    every merge in the order learned, each to all its occurrences. ``O(len(merges))`` per word:
    :meth:`BPE.encode_word` is the fast equivalent."""
    _check_word(word, "apply_merges")
    symbols = split_word(word)
    for pair in merges:
        if len(symbols) == 1:
            break
        symbols = merge_pair(symbols, pair)
    return symbols


# %% [markdown]
# The listings check their arguments first, so that a bad input gets a message that names it:

# %%
# tfmlib-source: tfmlib.bpe._check_counts
def _check_counts(counts: Mapping[str, int], who: str) -> None:
    if not isinstance(counts, Mapping):
        raise TypeError(f"{who}: counts must be a mapping word -> count, got {type(counts).__name__}")
    for word, count in counts.items():
        _check_word(word, who)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"{who}: the count of {word!r} must be an int >= 1, got {count!r}")


# %%
# tfmlib-source: tfmlib.bpe._check_word
def _check_word(word: str, who: str) -> None:
    if not isinstance(word, str):
        raise TypeError(f"{who}: words must be str, got {type(word).__name__}")
    if not word or any(c.isspace() for c in word):
        raise ValueError(f"{who}: a word must be non-empty and hold no space, got {word!r}")
    if END_OF_WORD in word:
        raise ValueError(f"{who}: the word {word!r} contains the end-of-word symbol {END_OF_WORD!r}")


# %%
# tfmlib-source: tfmlib.bpe._check_learning
def _check_learning(num_merges: int, min_frequency: int, who: str) -> None:
    for name, value, low in (("num_merges", num_merges, 0), ("min_frequency", min_frequency, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{who}: {name} must be an int >= {low}, got {value!r}")


# %% [markdown]
# The paper's example: four words and their counts.

# %%
toy_counts = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
toy_merges = learn_merges_slowly(toy_counts, 8, min_frequency=1)
for k, (a, b) in enumerate(toy_merges, 1):
    print(f"merge {k}: {a!r:8} + {b!r:8} -> {a + b!r}")
for word in ("lowest", "newer", "wider", "low"):
    print(f"{word:>7} -> {apply_merges(word, toy_merges)}")

# %% [markdown]
# The paper prints (e, s), (es, t), (est, </w>), (l, o), (lo, w) for the same words: merges 2 and
# 3 above are a tie (three pairs occur 9 times) broken the other way, by this module's rule;
# subword-nmt takes yet another pair among equals. Both orders end with the same pieces here.
#
# "lowest" never occurred, yet it is written in two known pieces, `low` and `est</w>`: the
# pieces carry meaning a model can learn ("-est" as a superlative) where a word vocabulary has
# only `<unk>`.
#
# Counting every pair again after each merge costs a pass over all distinct words per merge.
# `learn_merges`, the version the package uses, keeps the pair counts and, after a merge,
# updates only the words that contained the merged pair (a heap gives the next best pair). It
# must give exactly the same merges, ties included; we check it on a slice of the corpus, and
# time both:

# %%
check_counts = word_counts(s for pair in train_pairs[: run.check_pairs] for s in (tokenize(pair[0]), tokenize(pair[1])))
start = time.perf_counter()
slow = learn_merges_slowly(check_counts, run.check_merges)
slow_s = time.perf_counter() - start
start = time.perf_counter()
fast = learn_merges(check_counts, run.check_merges)
fast_s = time.perf_counter() - start
print(f"{run.check_merges} merges from {len(check_counts):,} distinct words: "
      f"the paper's algorithm {slow_s:.2f} s, incremental counts {fast_s:.3f} s; same merges: {slow == fast}")
assert slow == fast, "the incremental learner must reproduce the paper's algorithm merge for merge"

# %% [markdown]
# ## 3. Merges learned on the corpus
#
# Now the whole training set, both languages together (section 5 says why together). The
# largest table the vocabulary sweep below needs is learned once: BPE is greedy, so the first
# $m$ merges of a longer run are exactly what a run of $m$ merges learns, and every smaller
# vocabulary is a prefix of this table.

# %%
corpus_counts = word_counts(s for side in (0, 1) for s in train_words[side])
start = time.perf_counter()
all_merges = learn_merges(corpus_counts, max(run.sweep_merges), min_frequency=2)
print(f"{len(all_merges):,} merges learned from {len(corpus_counts):,} distinct words "
      f"({sum(corpus_counts.values()):,} tokens) in {time.perf_counter() - start:.1f} s")
print("first 12:", ", ".join(a + "+" + b for a, b in all_merges[:12]))
print(f"merges {run.merges - 5} to {run.merges}:",
      ", ".join(a + "+" + b for a, b in all_merges[run.merges - 6: run.merges]))
bpe = BPE(all_merges[: run.merges])
for word, _ in unseen.most_common(8):
    print(f"  unseen {word!r:>18} -> {bpe.encode_word(word)}")

# %% [markdown]
# The first merges glue the most frequent endings and letter pairs (`n</w>`, `e</w>`, `in`,
# `er`: the end-of-word symbol makes an ending a pair like any other); by the 4,000th merge
# they complete whole, less frequent words (`schwimm` + `brille</w>`). The words the word
# vocabulary could not read are now sequences of known pieces (the lines above).
#
# ### The same merges as a well-kept library
#
# Hugging Face `tokenizers` implements BPE training in Rust. Given the same words (our
# pre-tokenization, split on spaces) with the end-of-word symbol written as one extra character
# that sorts after every letter, its trainer learns the table below; we compare it to ours, merge
# for merge, at the size the model will use.

# %%
start = time.perf_counter()
library_merges = learn_merges_tokenizers(corpus_counts, run.merges)
library_s = time.perf_counter() - start
same = sum(a == b for a, b in zip(library_merges, all_merges[: run.merges], strict=True))
print(f"tokenizers: {len(library_merges):,} merges in {library_s:.2f} s; equal to tfmlib.bpe at "
      f"{same:,} of {run.merges:,} positions")
assert library_merges == all_merges[: run.merges], "tfmlib.bpe must learn the library's merges, in its order"

# %% [markdown]
# The tables are equal, position for position. Where the conventions differ, equality takes
# some care, and the tests (`tests/test_bpe.py`) pin each difference:
#
# * **Pre-tokenization.** Merges never cross the boundaries of the words they are learned from,
#   so the splitter decides what a word is. `tokenizers`' default `Whitespace` splitter and
#   ours split "t-shirt" and "3.50" differently (ours writes the hyphen as a marked token
#   `@-@` so that the text comes back exactly); the comparison gives the library our words.
# * **Tie-breaking.** The library's own `end_of_word_suffix` option glues the suffix to the last
#   character and numbers those symbols in hash-map order, so its merges of equal counts come
#   out in an order that changes from one training to the next. Writing `</w>` as one extra
#   character makes its order, and its merges, deterministic and equal to ours.
# * **Characters never seen in training.** Ours keeps such a character as a piece of its own,
#   which the vocabulary then maps to `<unk>`; the library's BPE without an unknown token drops
#   it; with `byte_fallback` it writes the character's UTF-8 bytes as pieces `<0xNN>`, so that
#   nothing is ever unknown (the first exercise builds it).

# %%
probe = "straße 3.50€ t-shirt"
library_tokenizer_words = tokenize(probe)
print("our words:      ", library_tokenizer_words)
print("our pieces:     ", bpe.encode(library_tokenizer_words))
print("Whitespace split:", [w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(probe)])

# %% [markdown]
# ## 4. Vocabulary size against length and unknown rate
#
# A vocabulary size is a trade: more entries make sentences shorter (fewer steps for the
# decoder, less attention to compute) but leave each entry fewer training examples, and for
# words, any size leaves some test words unknown. For subwords, the vocabulary is every piece
# the encoded training set uses, and a test piece outside it is unknown (below: which pieces
# those are). The sweep measures both sides of the trade for words (the $N$ most frequent) and
# for BPE with $M$ merges ($M = 0$: characters).

# %%
def subword_row(merges: int) -> dict:
    """Vocabulary size, test pieces per sentence and unknown rate with the first ``merges`` merges."""
    piecewise = BPE(all_merges[:merges])
    vocabulary = {p for side in (0, 1) for s in train_words[side] for p in piecewise.encode(s)}
    pieces = [piecewise.encode(s) for side in (0, 1) for s in test_words[side]]
    return dict(merges=merges, vocab=len(vocabulary), unknown=unknown_share(pieces, vocabulary),
                per_sentence=statistics.mean(map(len, pieces)))


subword_rows = [subword_row(m) for m in run.sweep_merges]
words_both = []
both_counts = Counter(t for side in (0, 1) for s in train_words[side] for t in s)
for size in [*run.sweep_words, len(both_counts)]:
    known = {w for w, _ in both_counts.most_common(size)}
    words_both.append(dict(vocab=min(size, len(both_counts)),
                           unknown=unknown_share([s for side in (0, 1) for s in test_words[side]], known),
                           per_sentence=statistics.mean(len(s) for side in (0, 1) for s in test_words[side])))
print(f"{'BPE merges':>10} {'vocabulary':>10} {'tokens/sentence':>15} {'unknown':>8}")
for row in subword_rows:
    print(f"{row['merges']:>10,} {row['vocab']:>10,} {row['per_sentence']:>15.1f} {100 * row['unknown']:>7.3f}%")
print(f"{'words':>10} {'vocabulary':>10} {'tokens/sentence':>15} {'unknown':>8}")
for row in words_both:
    print(f"{'':>10} {row['vocab']:>10,} {row['per_sentence']:>15.1f} {100 * row['unknown']:>7.3f}%")

fig, (ax_len, ax_unk) = plt.subplots(1, 2, figsize=(11, 4))
for rows, label, marker in ((subword_rows, "BPE (shared, both languages)", "o"),
                            (words_both, "words (most frequent kept)", "s")):
    vocab = [r["vocab"] for r in rows]
    ax_len.plot(vocab, [r["per_sentence"] for r in rows], marker=marker, label=label)
    ax_unk.plot(vocab, [100 * r["unknown"] for r in rows], marker=marker, label=label)
for ax, ylabel, title in ((ax_len, "tokens per test sentence", "Shorter sentences with more entries"),
                          (ax_unk, "unknown test tokens (%)", "Unknown tokens")):
    ax.set_xscale("log")
    ax.set_xlabel("vocabulary size (entries)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
fig.suptitle(f"Vocabulary size against length and unknown rate ({corpus_name}, test set)")
fig.tight_layout()
plt.show()

at_model = next(r for r in subword_rows if r["merges"] == max(m for m in run.sweep_merges if m <= run.merges))
largest_words = words_both[-1]
if real_text:
    assert at_model["unknown"] < largest_words["unknown"] / 5, \
        "BPE at the model's size should leave far fewer unknown tokens than every training word"

# %% [markdown]
# Read the two panels together. Characters ($M = 0$) never fail but make sentences several
# times longer. Each doubling of the merges shortens the sentences less than the one before,
# and past a few thousand merges BPE's sentences are within a few tokens of the word
# sentences (at the model's 4,000 merges, 15.0 pieces against 12.7 words per sentence in the
# committed run). The words' unknown rate falls as the vocabulary grows but never reaches zero
# on real text; BPE's stays near zero at every size, at a vocabulary several times smaller than
# the full word list. What BPE leaves unknown could be of two kinds: characters absent from the
# training set (none in Multi30k's test set: the rate is zero at $M = 0$), and pieces that the
# training set only ever uses inside longer pieces (a merge
# made early, say `schne`, can be absorbed by later merges into `schnee</w>` everywhere in
# training, so it is not in the vocabulary of used pieces, while a test word still needs it).
# That second kind grows with the number of merges, which is why the rate creeps up at the
# largest sizes; subword-nmt's `--vocabulary-threshold` undoes such merges at encoding time. The
# model below uses the size printed in its configuration (`merges`); the next cell prints how
# often its pieces occur in the training pairs, which is what the size trades against length.
#
# ## 5. One vocabulary, one embedding matrix
#
# German and English share an alphabet, names, numbers and many stems ("restaurant", "baby",
# "t-shirt"), so one BPE learned on both sides gives pieces that mean the same on both sides.
# With one vocabulary, Vaswani et al. share "the same weight matrix between the two embedding
# layers and the pre-softmax linear transformation" (§3.4), after Press and Wolf (2017): with
# $E \in \mathbb{R}^{|V| \times d}$,
#
# $$x_i = \sqrt{d}\, E[\text{src}_i] + p_i, \qquad y_t = \sqrt{d}\, E[\text{tgt}_t] + p_t, \qquad
# \text{logits}_t = h_t E^\top + b .$$
#
# The output layer then scores a piece by how well the decoder's state matches that piece's
# embedding, and every gradient the output layer receives also trains the input embeddings:
# rare pieces, seldom seen as inputs, learn from every step in which they were a wrong
# prediction. `Transformer(..., share_embeddings=True)` (with `tie_output=True`, the default)
# builds it. `tfmlib.bpe.learn_shared` learns the BPE and the vocabulary in one call; here each
# step is written out.

# %%
tokenizer = SubwordTokenizer(bpe)
vocab = Vocab.build(bpe.encode(s) for side in (0, 1) for s in train_words[side])
source_pieces = {p for s in train_words[0] for p in bpe.encode(s)}
target_pieces = {p for s in train_words[1] for p in bpe.encode(s)}
print(f"shared vocabulary: {len(vocab):,} pieces; {len(source_pieces):,} used by the source side, "
      f"{len(target_pieces):,} by the target side, {len(source_pieces & target_pieces):,} by both")
piece_counts = Counter(p for side in (0, 1) for s in train_words[side] for p in bpe.encode(s))
rare_pieces = sum(c < 10 for c in piece_counts.values())
print(f"occurrences of a piece in the training pairs: median {statistics.median(piece_counts.values()):.0f}; "
      f"{rare_pieces:,} of {len(piece_counts):,} pieces ({100 * rare_pieces / len(piece_counts):.1f}%) "
      f"occur fewer than 10 times")
sample = test_pairs[0][0]
print(f"\n{sample}\n-> {tokenizer.tokens(sample)}\n-> {tokenizer.text(tokenizer.tokens(sample))!r}")
assert all(tokenizer.text(tokenizer.tokens(s)) == " ".join(s.lower().split()) for pair in test_pairs for s in pair), \
    "the subword pipeline must give every test sentence back"

config = dict(run.transformer)
max_len = 2 + max(max(len(tokenizer.tokens(s)) for s in pair) for pair in train_pairs + test_pairs)
torch.manual_seed(run.seed)
model = Transformer(len(vocab), len(vocab), max_len=max_len, share_embeddings=True, **config).to(run.device)
untied = Transformer(len(vocab), len(vocab), max_len=max_len, share_embeddings=False, tie_output=False, **config)
assert model.src_embed.weight is model.tgt_embed.weight is model.generator.weight
print(f"\nparameters: {count_parameters(model):,} tied three ways, {count_parameters(untied):,} untied "
      f"({len(vocab):,} x {config['d_model']} = {len(vocab) * config['d_model']:,} per copy of the matrix)")
del untied

# %% [markdown]
# Every test sentence comes back from its pieces exactly (lowercased), which the assert above
# checks: `tokenize` marks the spacing of punctuation, and `</w>` marks the end of every word,
# so BLEU below scores the model's words, not artefacts of the pipeline. Tying removes two of
# the three copies of the matrix; in a model this small they are a large share of all the
# parameters (the two counts printed above).
#
# ## 6. The Transformer on subwords
#
# Chapter 08's recipe, unchanged: Adam with $\beta_2 = 0.98$, warm-up then inverse square root,
# label smoothing 0.1, length-bucketed batches, gradient clipping; training stops after the
# profile's number of steps. Only the text pipeline is new.

# %%
train_data = TranslationDataset(train_pairs, vocab, vocab, tokenizer=tokenizer)
history, _ = train_translator(model, train_data, epochs=10_000, max_steps=run.steps, batch_size=run.batch_size,
                              lr=run.peak_lr, warmup_steps=run.warmup, betas=(0.9, 0.98), adam_eps=1e-9,
                              label_smoothing=0.1, device=run.device, seed=run.seed, desc="transformer")
passes = len(history.step_loss) * run.batch_size / len(train_data)
last = slice(-100, None)
recent_loss = sum(loss * n for loss, n in zip(history.step_loss[last], history.step_tokens[last], strict=True)) \
    / sum(history.step_tokens[last])
print(f"{len(history.step_loss)} steps ({passes:.1f} passes over the training pairs) in {history.seconds:.0f} s; "
      f"training loss over the last 100 steps {recent_loss:.3f} (token-weighted)")

# %%
report = evaluate_translator(model, test_pairs, vocab, vocab, lowercase_bleu=True, tokenizer=tokenizer)
print(f"greedy decoding, {len(test_pairs):,} test sentences: {report.bleu}")
print(f"signature: {report.bleu.signature}")
print(f"exact matches: {100 * report.exact:.1f}%; {report.seconds:.1f} s to translate")
for bucket in report.by_length:
    print(f"  source length {bucket['bucket']:>6}: {bucket['n']:>4} sentences, BLEU {bucket['bleu']:5.1f}")
plot_bleu_by_length({"Transformer on subwords": report.by_length},
                    title=f"BLEU by source length ({corpus_name}, test set)")
plt.show()
print(report.examples(range(0, 6), source_label="src"))

# %% [markdown]
# BLEU by source length (the bars) falls as sentences grow, as it did for every model of
# chapters 02 to 08; the last bucket holds few sentences (its count is printed with the
# report), so its bar is the least certain. The signature says how BLEU was computed (sacreBLEU's defaults: the `13a` tokenizer,
# exponential smoothing, one reference, lowercased here since the vocabulary is lowercase), so
# the number can be compared with other papers' only where their signature matches. This is a
# small model trained for a few minutes (its size is in the configuration above); the benchmark
# `benchmarks/multi30k_transformer.py --bpe-merges N` trains the same pipeline for longer and
# writes its result under `benchmarks/results/`.
#
# ### One sentence, read as pieces
#
# The cross-attention of the last decoder layer, averaged over heads, on one test sentence:
# among the sentences of at most 12 words whose translation shares at least 80% of its words
# with the reference (both ways), the one with the most pieces per word. Rows are the English
# pieces of the reference, which the decoder reads (teacher forcing) and predicts; columns are
# the German pieces it attends to.

# %%
def pieces_per_word(sentence: str) -> float:
    return len(tokenizer.tokens(sentence)) / len(tokenize(sentence))


def shared_words(hypothesis: str, reference: str) -> float:
    """The smaller of the two shares: hypothesis words found in the reference, and vice versa."""
    hyp, ref = tokenize(hypothesis), tokenize(reference)
    return min(sum(w in set(ref) for w in hyp) / max(len(hyp), 1), sum(w in set(hyp) for w in ref) / max(len(ref), 1))


readable = [i for i, (s, h, r) in enumerate(zip(report.sources, report.hypotheses, report.references, strict=True))
            if len(tokenize(s)) <= 12 and shared_words(h, r) >= 0.8] or list(range(len(test_pairs)))
shown = max(readable, key=lambda i: pieces_per_word(report.sources[i]))
shown_source, shown_target = test_pairs[shown]
batch = make_batch(TranslationDataset([(shown_source, shown_target)], vocab, vocab, tokenizer=tokenizer).examples)
maps = model.attention_maps(batch.src.to(run.device), batch.src_mask.to(run.device), batch.tgt_in.to(run.device))
print(f"de : {shown_source}\nref: {shown_target}\nout: {report.hypotheses[shown]}")
source_labels = [p.replace(END_OF_WORD, "_") for p in tokenizer.tokens(shown_source)] + ["<eos>"]
target_labels = [p.replace(END_OF_WORD, "_") for p in tokenizer.tokens(shown_target)] + ["<eos>"]
fig, ax = plt.subplots(figsize=(0.45 * len(source_labels) + 2.5, 0.4 * len(target_labels) + 2))
plot_heatmap(maps.cross[-1][0].mean(0).cpu(), ax=ax, vmin=0, vmax=1, x_labels=source_labels, y_labels=target_labels,
             title="Last decoder layer's cross-attention (mean of heads)", xlabel="German source pieces (_ = end of word)",
             ylabel="English reference piece (read, then predicted)")
plt.show()

# %% [markdown]
# A piece that ends a word carries `_` (for `</w>`); a piece without it continues into the next.
# For each German word written in several pieces, the cell below adds up the attention that all
# English rows give to each of its pieces: whether the model reads a split word through one of
# its pieces (and which) or through all of them is a question about this trained model, and the
# printed shares answer it for this sentence.

# %%
weights = maps.cross[-1][0].mean(0).cpu()       # (target pieces, source pieces), rows sum to 1
source_pieces_shown = tokenizer.tokens(shown_source)
start = 0
for word in tokenize(shown_source):
    n = len(tokenizer.bpe.encode_word(word))
    if n > 1:
        mass = weights[:, start:start + n].sum(0)
        shares = ", ".join(f"{p}: {100 * m / mass.sum():.0f}%" for p, m in zip(source_pieces_shown[start:start + n],
                                                                              mass.tolist(), strict=True))
        print(f"{word!r} in {n} pieces, {mass.sum():.2f} of the {len(target_labels)} rows' attention; within it: {shares}")
    start += n


# %% [markdown]
# ### The errors that remain
#
# BLEU is one number; what kind of mistake a model makes says more. Below, the first 50
# test translations that are not exact are sorted into categories by simple rules, applied in
# this order (the first that matches wins), over lowercased words:
#
# * **invented word**: the translation holds a word that occurs nowhere in the training targets,
#   a string of pieces that is no English word seen (the failure only a subword model can make);
# * **rare word missed**: the reference holds a word seen fewer than 5 times in the training
#   targets, and the translation does not;
# * **omission**: the translation has fewer than 75% of the reference's words;
# * **repetition**: a word or a pair of words appears twice in a row in the translation and
#   not in the reference;
# * **close**: at least 60% of the translation's words are in the reference and vice versa
#   (a paraphrase or a one-word slip);
# * **wrong content**: anything else.
#
# Rules are cruder than a person reading, and the counts are for this model and this run; the
# examples printed under each category let you judge the rules as well as the model. The second
# category says as much about the test set as about the model: which references hold a rare
# word does not depend on the model, and a fair paraphrase of a rare word (a "flip" for a
# "somersault") lands there too.

# %%
target_word_counts = word_counts(train_words[1])


def error_category(hypothesis: str, reference: str) -> str:
    hyp, ref = tokenize(hypothesis), tokenize(reference)
    if any(target_word_counts[w] == 0 for w in hyp):
        return "invented word"
    rare = {w for w in ref if target_word_counts[w] < 5 and any(c.isalpha() for c in w)}
    if rare - set(hyp):
        return "rare word missed"
    if len(hyp) < 0.75 * len(ref):
        return "omission"

    def doubled(ws: list[str]) -> bool:
        return any(a == b for a, b in zip(ws, ws[1:], strict=False)) or \
            any(ws[i:i + 2] == ws[i + 2:i + 4] for i in range(len(ws) - 3))

    if doubled(hyp) and not doubled(ref):
        return "repetition"
    overlap_h = sum(w in set(ref) for w in hyp) / max(len(hyp), 1)
    overlap_r = sum(w in set(hyp) for w in ref) / max(len(ref), 1)
    return "close" if min(overlap_h, overlap_r) >= 0.6 else "wrong content"


wrong = [i for i, (h, r) in enumerate(zip(report.hypotheses, report.references, strict=True))
         if h.strip().lower() != r.strip().lower()][: run.error_sentences]
categories = {i: error_category(report.hypotheses[i], report.references[i]) for i in wrong}
tally = Counter(categories.values())
print(f"{len(wrong)} translations that are not exact, by category:")
for name, n in tally.most_common():
    print(f"  {name:<17} {n:>3}  ({100 * n / len(wrong):.0f}%)")
for name, _ in tally.most_common():
    for i in [i for i in wrong if categories[i] == name][:2]:
        print(f"\n[{name}]\n  src: {report.sources[i]}\n  ref: {report.references[i]}\n  out: {report.hypotheses[i]}")

# %% [markdown]
# The table above is this run's answer to "what is left"; read its largest categories against
# their examples (two of each are printed). Subwords let the model *write* a rare word, but a
# piece sequence seen a handful of times in training gives it little to learn the word's
# translation from: in the committed `cpu` run the Boston terrier became "a most"; a rare word
# can also be dropped, or written as a piece sequence that is no word at all (the *invented
# word* category), and how often each happens changes with the seed (run it with another). Which
# categories shrink with more training is a question for the benchmark's longer runs; this
# chapter does not measure it.
#
# ## Summary
#
# * A word vocabulary cannot read real text: even every training word leaves test words
#   unknown (section 1's table), mostly compounds and rare inflections that a translation must
#   carry over.
# * Byte-pair encoding learns a merge table from word counts (the most frequent adjacent pair,
#   again and again) and encodes a word by replaying it in order; the end-of-word symbol makes
#   the pieces decode back to text exactly. `tfmlib.bpe` learns the same table as the paper's
#   algorithm and as Hugging Face `tokenizers`, merge for merge, once the conventions
#   (pre-tokenization, ties, unseen characters) are made the same.
# * The number of merges trades sentence length against how often each piece occurs in the
#   training data; the unknown rate stays near zero at every size.
# * One vocabulary for both languages allows one embedding matrix for the source, the target
#   and the output layer, two fewer copies of the largest matrix of a small translation model.
# * The book's Transformer trains on Multi30k through the same code as on the bundled corpus;
#   only the tokenizer changed, and `translate` and `evaluate_translator` take it as an argument.


# %% [markdown]
# ## Exercises
#
# **Questions**
#
# 1. Byte fallback (the first coding exercise) means no word is ever `<unk>`. What does it cost?
#    Count the pieces of `"Straße"`, `"€"`, `"東京"` and an emoji, and think about what a model
#    must learn before it can emit a character as a sequence of byte pieces.
# 2. BPE-dropout (Provilkov et al. 2020) is applied to the training data only, and inference uses
#    the plain segmentation. Why not at test time too? What does a dropout rate $p$ do to the
#    length of the training sequences, and so to the cost of a training step?
# 3. WordPiece's score $\mathrm{count}(ab) / (\mathrm{count}(a)\,\mathrm{count}(b))$ is largest for
#    a pair of symbols that occur only together. Which pairs of a real corpus score highest when
#    every pair is a candidate, and why does learning need a minimum pair count?
#
# **Coding exercises**
#
# *Byte fallback.* A piece the vocabulary lacks becomes `<unk>`, and the word is lost. Write a
# pair of functions. `encode_with_bytes(bpe, vocab, word)` returns the pieces of
# `bpe.encode_word(word)`, except that each piece not in `vocab` (a `tfmlib.data.Vocab`) is
# replaced by the UTF-8 bytes of its text, one piece per byte written `<0xNN>` (two uppercase
# hex digits, as sentencepiece and `tokenizers` write them: `"ß"` -> `["<0xC3>", "<0x9F>"]`).
# The end-of-word marker `"</w>"` is not text: a piece `x</w>` that is not in `vocab` becomes the
# bytes of `x` followed by the piece `"</w>"` (and a lone `"</w>"` stays `"</w>"`).
# `decode_with_bytes(pieces)` returns the list of words (as `BPE.decode` does: a word ends with the
# piece that ends with `"</w>"`), with the byte pieces turned back into characters; bytes that are
# no valid UTF-8 (a model can emit them) become U+FFFD `�`. Every word, `"straße"`, `"€"`,
# `"東京"` or `"😀"`, must come back exactly. Check them as a pair:
# `exercises.check("11.byte_fallback", (encode_with_bytes, decode_with_bytes))`.

# %%
def encode_with_bytes(bpe: BPE, vocab: Vocab, word: str) -> list[str]:
    """The pieces of ``word``, those not in ``vocab`` written as UTF-8 byte pieces <0xNN>."""
    raise NotImplementedError  # your code here


def decode_with_bytes(pieces: list[str]) -> list[str]:
    """Pieces (byte pieces included) back to words."""
    raise NotImplementedError  # your code here


exercises.check("11.byte_fallback", (encode_with_bytes, decode_with_bytes))

# %% [markdown]
# *BPE-dropout.* Provilkov, Emelianenko and Voita (2020) segment each training word differently
# each time it is read. Write `dropout_encode(bpe, word, p, rng)` that starts from
# `split_word(word)` (the characters and `"</w>"`) and repeats: list the distinct adjacent pairs
# that are merges of `bpe` (the candidates of this step); drop each candidate, independently,
# with probability $p$, drawing from `rng` (a `random.Random`: `rng.random() < p` drops it);
# if no candidate is left, stop; otherwise apply the best one left (the one learned earliest,
# `bpe.ranks`) to all its occurrences, as `BPE.encode_word` does. Return the pieces (a list of
# str). At $p = 0$ this is `bpe.encode_word(word)`; at $p = 1$ the word stays in characters. The
# checker compares how often each segmentation appears with the probabilities the algorithm
# implies.

# %%
def dropout_encode(bpe: BPE, word: str, p: float, rng: random.Random) -> list[str]:
    """One random segmentation of ``word``: BPE with each candidate merge dropped with probability p."""
    raise NotImplementedError  # your code here


exercises.check("11.bpe_dropout", dropout_encode)

# %% [markdown]
# *WordPiece's merges.* WordPiece (Schuster and Nakajima 2012; Wu et al. 2016) chooses the pair to
# merge by likelihood rather than frequency: the pair with the largest score
# $$\mathrm{score}(a, b) = \frac{\mathrm{count}(ab)}{\mathrm{count}(a)\,\mathrm{count}(b)},$$
# where $\mathrm{count}(ab)$ is how often $b$ follows $a$ and $\mathrm{count}(a)$ how often the
# symbol $a$ occurs, both over the current segmentation of every word, weighted by the word's
# count, and counted again after every merge. Write `learn_merges_wordpiece(counts, num_merges,
# min_frequency=2)` with `learn_merges`' conventions otherwise: words start as their characters
# and `"</w>"`; only pairs occurring at least `min_frequency` times are candidates, and learning
# stops when there is none (or after `num_merges` merges); ties in the score (compare scores
# exactly, e.g. with `fractions.Fraction`) go to the pair whose left symbol entered the vocabulary
# first, then the right one (characters in code-point order, then `"</w>"`, then merged symbols in
# the order made). Return the merges, a list of pairs of str. Compare the first merges with
# `learn_merges`' on the chapter's corpus.

# %%
def learn_merges_wordpiece(counts: Mapping[str, int], num_merges: int,
                           min_frequency: int = 2) -> list[tuple[str, str]]:
    """Merges chosen by count(ab) / (count(a) count(b)) instead of count(ab)."""
    raise NotImplementedError  # your code here


exercises.check("11.wordpiece_merges", learn_merges_wordpiece)


# %% [markdown]
# ## References
#
# * Sennrich, R., Haddow, B. and Birch, A. (2016). Neural machine translation of rare words with
#   subword units. ACL. §3.2 (the algorithm, its Algorithm 1 and the toy example), §3.1 on
#   the unknown-word problem, §5 on joint BPE for both languages.
# * Vaswani, A. et al. (2017). Attention is all you need. NeurIPS. §3.4 (shared embeddings and
#   pre-softmax weights, the $\sqrt{d}$ scale), §5.1 (shared BPE vocabulary of about 37,000).
# * Press, O. and Wolf, L. (2017). Using the output embedding to improve language models. EACL.
# * Gage, P. (1994). A new algorithm for data compression. C Users Journal 12(2): the
#   byte-pair compression that BPE adapts.
# * Elliott, D., Frank, S., Sima'an, K. and Specia, L. (2016). Multi30K: multilingual
#   English-German image descriptions. Workshop on Vision and Language.
# * Post, M. (2018). A call for clarity in reporting BLEU scores. WMT: sacreBLEU and its
#   signature.
# * Kudo, T. and Richardson, J. (2018). SentencePiece. EMNLP (demo): subwords from raw text,
#   byte fallback. Provilkov, I., Emelianenko, D. and Voita, E. (2020). BPE-dropout. ACL.
# * Jean, S., Cho, K., Memisevic, R. and Bengio, Y. (2015). On using very large target
#   vocabulary for neural machine translation. ACL. Luong, M.-T. et al. (2015). Addressing the
#   rare word problem in neural machine translation. ACL.

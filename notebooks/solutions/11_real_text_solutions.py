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
# # 11 · Solutions: real text
#
# Worked solutions to the coding exercises of chapter 11, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks, and each
# tried on the chapter's corpus (Multi30k when it is on disk, the bundled corpus otherwise; the
# first line printed says which). Then an answer to every question, measured where the answer can
# be measured. Try the exercises in the chapter first.

# %%
import random
import statistics
from collections import Counter
from fractions import Fraction

from tfmlib import exercises
from tfmlib.bpe import BPE, END_OF_WORD, initial_symbols, learn_merges, merge_pair, split_word, word_counts
from tfmlib.config import setup
from tfmlib.corpora import load_corpus
from tfmlib.data import UNK, Vocab, tokenize

run = setup(seed=0, smoke=dict(pairs=300, merges=300), cpu=dict(pairs=3000, merges=1000),
            gpu=dict(pairs=3000, merges=1000))

try:
    corpus_name, corpus = "multi30k (de -> en)", load_corpus("multi30k")
except FileNotFoundError:
    corpus_name, corpus = "the bundled corpus (en -> fr)", load_corpus("synthetic")
pairs = corpus["train"][: run.pairs]
sentences = [tokenize(text) for pair in pairs for text in pair]
counts = word_counts(sentences)
bpe = BPE(learn_merges(counts, run.merges))
vocab = Vocab.build(bpe.encode(s) for s in sentences)
print(f"{corpus_name}: {len(pairs)} training pairs, {len(counts)} distinct words, {len(bpe)} merges, {len(vocab)} pieces "
      "in the vocabulary")

# %% [markdown]
# ## Coding exercises
#
# **11.byte_fallback.** A piece the vocabulary lacks would become `<unk>`. Its text is written
# instead as its UTF-8 bytes, one piece `<0xNN>` per byte; 256 such pieces (plus `</w>`) cover
# every string, so nothing is ever unknown. The end-of-word marker is not text: a piece `x</w>`
# falls back to the bytes of `x` followed by the piece `</w>`, which keeps the rule that a word
# ends with the piece that ends with `</w>`. Decoding collects a word's bytes (those of byte
# pieces and those of ordinary pieces alike) and decodes them once the word ends: a character
# outside ASCII is two to four bytes, so decoding byte by byte would give `Ã\x9f` for `ß`.
# `errors="replace"` turns bytes that are no valid UTF-8 (a model can emit them) into `�`.
# The checker's wrong answers are the slips this invites: writing a character's code point instead
# of its bytes (`ß` is the one number U+00DF but the two bytes C3 9F, and a code point above 255
# has no byte piece at all), writing `</w>` as five more bytes or dropping it (then no piece ends
# the word, and decoding glues the next word on), falling back for the whole word when only one
# piece is missing (longer sequences for nothing), and a strict decoder, which a single stray byte
# from a model crashes.

# %%
def _bytes_of(text: str) -> list[str]:
    return [f"<0x{b:02X}>" for b in text.encode("utf-8")]


def encode_with_bytes(bpe: BPE, vocab: Vocab, word: str) -> list[str]:
    out = []
    for piece in bpe.encode_word(word):
        if piece in vocab:
            out.append(piece)
        elif piece.endswith(END_OF_WORD):
            out += _bytes_of(piece[: -len(END_OF_WORD)]) + [END_OF_WORD]
        else:
            out += _bytes_of(piece)
    return out


def decode_with_bytes(pieces: list[str]) -> list[str]:
    words, current = [], b""
    for piece in pieces:
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            current += bytes([int(piece[3:5], 16)])
            continue
        ends = piece.endswith(END_OF_WORD)
        current += (piece[: -len(END_OF_WORD)] if ends else piece).encode("utf-8")
        if ends:
            words.append(current.decode("utf-8", errors="replace"))
            current = b""
    if current:
        words.append(current.decode("utf-8", errors="replace"))
    return words


exercises.check("11.byte_fallback", (encode_with_bytes, decode_with_bytes), must_pass=True)

words = tokenize("Straße, 5 € und 東京 😀")
plain = bpe.encode(words)
fallback = [p for w in words for p in encode_with_bytes(bpe, vocab, w)]
print("words:            ", words)
print("BPE pieces:       ", plain, f"-> {vocab.encode(plain).count(vocab[UNK])} <unk> in the vocabulary")
print("with byte pieces: ", fallback)
print("decoded:          ", decode_with_bytes(fallback))
assert decode_with_bytes(fallback) == words, "byte fallback must be lossless"

# %% [markdown]
# **11.bpe_dropout.** Provilkov et al.'s Algorithm 1: at each step, each merge that could apply
# now is dropped with probability $p$, and the best one left (the one learned earliest) is
# applied to all its occurrences; when all of a step's candidates are dropped, the word is done.
# At $p = 0$ nothing is dropped, and this is `BPE.encode_word`; at $p = 1$ every word stays in
# characters. A merge dropped at one step is a candidate again at the next, so a word can still
# reach its full segmentation by another order of merges; what changes is how often. The two
# tempting shortcuts change that distribution, which is why the checker compares frequencies and
# not single outputs: stopping as soon as the *best* merge is dropped only ever cuts the merge
# sequence short (every segmentation is a stage on the way to the full one), and deciding the drops
# once per word, for the whole table, never lets a dropped merge come back. Drawing from `rng`
# only, not from the `random` module, is what makes a run repeatable from a seed.

# %%
def dropout_encode(bpe: BPE, word: str, p: float, rng: random.Random) -> list[str]:
    symbols = split_word(word)
    while True:
        present = {pair for pair in zip(symbols, symbols[1:], strict=False) if pair in bpe.ranks}
        kept = [pair for pair in sorted(present, key=bpe.ranks.__getitem__) if rng.random() >= p]
        if not kept:
            return symbols
        symbols = merge_pair(symbols, kept[0])


exercises.check("11.bpe_dropout", dropout_encode, must_pass=True)

rng = random.Random(0)
word = max((w for w in counts if w.isalpha() and len(bpe.encode_word(w)) == 1), key=len)
segmentations = Counter(" ".join(dropout_encode(bpe, word, 0.1, rng)) for _ in range(1000))
print(f"{word!r} at p=0.1, 1000 encodings, its {min(5, len(segmentations))} most frequent segmentations "
      f"of {len(segmentations)}:")
for seg, n in segmentations.most_common(5):
    print(f"  {n:4d}  {seg}")
lengths = {p: statistics.mean(len(dropout_encode(bpe, w, p, rng)) for s in sentences[:200] for w in s)
           for p in (0.0, 0.1, 0.3)}
print("mean pieces per word:", {p: round(v, 3) for p, v in lengths.items()})
assert lengths[0.0] < lengths[0.1] < lengths[0.3], "dropping merges makes words longer"

# %% [markdown]
# **11.wordpiece_merges.** The loop of `learn_merges_slowly`, with the score
# $\mathrm{count}(ab) / (\mathrm{count}(a)\,\mathrm{count}(b))$ in place of $\mathrm{count}(ab)$,
# all counts taken over the current segmentation of every word, weighted by the word's count,
# and taken again after each merge. The scores are compared exactly (`Fraction`): written as
# probabilities, $P(ab) / (P(a) P(b))$ is the same score times the total number of symbols (the
# same for every pair of a step), so it picks the same pair, but in floating point its rounding
# can break a tie that is exact in the counts, and the tie rule then no longer decides. Two other
# mistakes change the merges themselves: counting each distinct word once (the score is about
# running text, so a word seen 10 times weighs 10), and keeping the symbol counts of the first
# step (a merge of $a$ and $b$ takes occurrences away from both, so their later pairs score
# differently).

# %%
def learn_merges_wordpiece(counts, num_merges, min_frequency=2):
    order = {s: i for i, s in enumerate(initial_symbols(counts))}
    words = {tuple(split_word(w)): c for w, c in counts.items()}
    merges = []
    while len(merges) < num_merges:
        pair_count, symbol_count = Counter(), Counter()
        for symbols, c in words.items():
            for s in symbols:
                symbol_count[s] += c
            for pair in zip(symbols, symbols[1:], strict=False):
                pair_count[pair] += c
        candidates = [pair for pair, c in pair_count.items() if c >= min_frequency]
        if not candidates:
            break
        best = min(candidates, key=lambda ab: (-Fraction(pair_count[ab], symbol_count[ab[0]] * symbol_count[ab[1]]),
                                               order[ab[0]], order[ab[1]]))
        merges.append(best)
        order.setdefault(best[0] + best[1], len(order))
        words = {tuple(merge_pair(symbols, best)): c for symbols, c in words.items()}
    return merges


exercises.check("11.wordpiece_merges", learn_merges_wordpiece, must_pass=True)

# %% [markdown]
# The experiment: the same number of merges learned both ways from the chapter's word counts
# (the most frequent words, to keep the slow loop quick), then the corpus's words encoded with
# each. Frequency merges what is common; the likelihood score merges pairs whose symbols rarely
# occur apart, rare or not.

# %%
top = dict(counts.most_common(1500))
n_merges = 150
by_frequency = learn_merges(top, n_merges)
by_likelihood = learn_merges_wordpiece(top, n_merges)
print("first 8 merges by frequency: ", by_frequency[:8])
print("first 8 merges by likelihood:", by_likelihood[:8])
shared = len(set(by_frequency) & set(by_likelihood))
print(f"merges in common: {shared} of {n_merges}")
per_word = {}
for name, merges in (("frequency", by_frequency), ("likelihood", by_likelihood)):
    coder = BPE(merges)
    per_word[name] = sum(len(coder.encode_word(w)) * c for w, c in counts.items()) / sum(counts.values())
    print(f"{name:10s}: {per_word[name]:.3f} pieces per running word of the corpus")
print(f"the likelihood's merges leave {per_word['likelihood'] / per_word['frequency']:.2f} times as many pieces "
      "per running word")
assert by_frequency != by_likelihood, "the two scores learn different merges"
assert per_word["likelihood"] > per_word["frequency"], "frequency merges shorten running text more"

# %% [markdown]
# The two scores share few merges (the printed count), and the same number of likelihood merges
# leaves the running text in more pieces, about twice as many on Multi30k (the printed ratio):
# frequency spends its merges on what running text repeats (`n</w>`, `e</w>`, `ei`), likelihood on
# pairs whose symbols rarely occur apart, however rare the pair. On Multi30k its first merges are
# not pieces of words at all but the markers `tokenize` writes where it splits a hyphen or a quote
# off a word (`@-@`, `@“`, `„@`, in the style of Moses's `@-@`): their symbols never occur apart,
# so they score high whatever their count. They are artefacts of the tokenisation, and a reader of
# a merge list should recognise them before reading anything into it.

# %% [markdown]
# ## Questions
#
# **1. What byte fallback costs.** Nothing is unknown any more, but a character the vocabulary
# lacks costs one piece per UTF-8 byte: one for ASCII, two for `ß` or `é`, three for `€` or a
# CJK character, four for an emoji. A model must learn to produce valid byte sequences (it can
# emit `<0xE6>` alone, which decodes to `�`), and the 256 byte pieces take embedding rows that
# are rarely trained on a corpus whose characters are all seen. Measured with the chapter's BPE:

# %%
for text in ("Straße", "€", "東京", "😀"):
    print(f"{text!r}: {len(text)} characters, {len(text.encode('utf-8'))} UTF-8 bytes, "
          f"{len(encode_with_bytes(bpe, vocab, text))} pieces with byte fallback")

# %% [markdown]
# **2. Why BPE-dropout is for training only.** Dropout shows the model many segmentations of
# the same word, so that it learns how pieces compose (and rare pieces get trained through the
# words that contain them); Provilkov et al. find it helps most on small corpora and on
# misspelled input. At test time the model should see the one segmentation it saw most, the
# full one, and translate deterministically: the paper uses $p = 0$ at inference. The cost in
# training is longer sequences (measured above: more pieces per word as $p$ grows), so more
# compute per sentence.
#
# **3. Why WordPiece's score needs a frequency threshold.** A pair seen once, made of two
# symbols seen once each, scores $1/(1 \cdot 1) = 1$, the highest score possible: without a
# minimum count the likelihood score merges such a pair before any other, and in general it
# favours the characters of rare words (names, numbers, typos), pieces that help little
# elsewhere. `min_frequency` keeps those pairs out. Measured on the same words with five words
# added once each: `ωψ`, whose two letters occur nowhere else, and four whose letters are rare
# here but do occur elsewhere (`zürich`, `kafka`, `qwerty`, `jazz`):

# %%
mixed = {**top, "ωψ": 1, "zürich": 1, "kafka": 1, "qwerty": 1, "jazz": 1}
for minimum in (1, 2):
    merges = learn_merges_wordpiece(mixed, 20, minimum)
    rare = [(rank + 1, a + b) for rank, (a, b) in enumerate(merges)
            if sum(c for w, c in mixed.items() if a + b in w) < 2]
    print(f"min_frequency={minimum}: first merges {merges[:4]}; {len(rare)} of 20 make a string found in "
          f"only one running word (merge number, string): {rare}")
    assert (len(rare) > 0) == (minimum == 1), "only without a threshold are pairs of one word merged"
    if minimum == 1:
        assert rare[0] == (1, "ωψ"), "a pair of two symbols seen once each scores 1 and is merged first"

# %% [markdown]
# Without a threshold the pair of `ωψ` is the very first merge, ahead of every pair of the
# corpus; the four words whose letters also occur elsewhere score lower, and on Multi30k only one
# of their pairs makes the first 20 (`qw`, at the printed merge number). With a threshold of 2
# neither is merged, and the first merges are the same pairs as without it.

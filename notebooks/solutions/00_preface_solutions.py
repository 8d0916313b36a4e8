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
# # 00 · Preface: solutions
#
# Worked answers to the exercises of chapter 00. The coding answer is checked with
# `must_pass=True`, which raises if the checker does not accept it (the tests run this notebook).

# %%
from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.data import Vocab, tokenize
from tfmlib.synthetic import load_bundled

run = setup(seed=0)  # before anything else: the threads, the device and the seeds

# %% [markdown]
# ## Coding exercise
#
# **1. `unknown_rate_curve`.** Three decisions make the answer, and each has a tempting wrong
# version that the checker names:
#
# * **Read both sides as the vocabulary reads them.** The book's `tokenize` lowercases and splits
#   elisions and punctuation off (`L'ours dort.` is `l'`, `ours`, `dort`, `.`). Splitting on
#   spaces makes `l'ours` and `dort.` unknown words of their own; keeping the capitals makes
#   `Le` a different word from `le`. The bundled corpus is lowercase, so neither mistake shows on
#   it; on real, capitalised text both inflate the rate (the checker's sentences are capitalised
#   for that reason).
# * **Count tokens, not words.** The model reads `<unk>` at every occurrence of an unknown word,
#   so an unknown word that occurs twice counts twice, and so does a test sentence that occurs
#   twice (the bundled test split has none, but a split of sentence *pairs* repeats a sentence
#   once per translation it has; the checker's second case has one). All test tokens are pooled before
#   dividing: a mean of per-sentence rates lets a two-word sentence weigh as much as a long one.
#   The `<eos>` that `encode` can append is not a token of the text, and counting it lowers the rate.
# * **The first `n` sentences, for each `n`.** A fresh vocabulary per size, from exactly
#   `train[:n]`; the vocabulary never sees the test sentences.
#
# Tokenizing every prefix again costs a pass over the training text per size; tokenizing once
# and building each vocabulary from a prefix of the token lists gives the same numbers.

# %%
def unknown_rate_curve(train: list[str], test: list[str], sizes: list[int]) -> list[float]:
    train_tokens = [tokenize(s) for s in train[: max(sizes, default=0)]]  # tokenized once
    test_tokens = [t for s in test for t in tokenize(s)]                 # pooled, every occurrence
    rates = []
    for n in sizes:
        vocab = Vocab.build(train_tokens[:n])
        rates.append(sum(t not in vocab for t in test_tokens) / len(test_tokens))
    return rates


exercises.check("00.unknown_rate_curve", unknown_rate_curve, must_pass=True)

# %% [markdown]
# On the bundled corpus (French side), from ten training sentences to all of them:

# %%
train, test = load_bundled("train"), load_bundled("test")
train_fr, test_fr = [fr for _, fr in train], [fr for _, fr in test]
sizes = [10, 30, 100, 300, 1_000, 3_000, 10_000, len(train_fr)]
curve = unknown_rate_curve(train_fr, test_fr, sizes)
for n, rate in zip(sizes, curve, strict=True):
    print(f"first {n:6,} training sentences: {rate:8.3%} of the French test tokens unknown")

# the smallest n with no unknown test token: the latest first appearance, in the training list,
# of a word the test sentences use
first_seen: dict[str, int] = {}
for i, sentence in enumerate(train_fr):
    for token in tokenize(sentence):
        first_seen.setdefault(token, i)
test_types = {t for s in test_fr for t in tokenize(s)}
assert test_types <= first_seen.keys(), "every French test word should occur in the training split"
enough = max(first_seen[t] for t in test_types) + 1
before, at = unknown_rate_curve(train_fr, test_fr, [enough - 1, enough])
print(f"\nsmallest training size with no unknown test token: {enough:,} sentences "
      f"(with {enough - 1:,}: {before:.4%}); the training split has {len(train_fr):,}")
assert at == 0 < before and curve[-1] == 0, "the curve should reach zero, and first at that size"

# %% [markdown]
# The rate falls fast and then *reaches zero*, some two thousand sentences into a split of fifty
# thousand (the printed size): the generated language has a closed vocabulary (a fixed lexicon
# of a few hundred French forms, printed in the preface), and once every form has occurred, more
# text adds no new word. The last test word to be covered is a rare one, which is why the tail
# of the curve is long compared with its start.
#
# Real text has no such end. Word frequencies follow Zipf's law (the $r$-th most frequent word
# has a frequency roughly proportional to $1/r$), so a large share of the types are rare, and
# the number of types keeps growing with the amount of text (Heaps' law). Every new slice of
# training text still brings words the vocabulary lacks, and so does every test set: the curve
# flattens but stays above zero. The cell below runs the same function on Tatoeba's French when
# the corpus is on disk (the README says how to download it; if it is not there, the cell says
# so). Chapter 11 measures the remedy: subword units, with which
# every word is a sequence of known pieces.

# %%
from tfmlib.corpora import load_corpus

try:
    tatoeba = load_corpus("tatoeba")
except FileNotFoundError:
    print("Tatoeba is not on disk: set TFM_CORPORA_DIR or follow the README to download it")
else:
    real_train = [fr for _, fr in tatoeba["train"]]
    real_sizes = [1_000, 10_000, 100_000, len(real_train)]
    real_curve = unknown_rate_curve(real_train, [fr for _, fr in tatoeba["test"]], real_sizes)
    for n, rate in zip(real_sizes, real_curve, strict=True):
        print(f"Tatoeba, first {n:7,} training sentences: {rate:.3%} of the French test tokens unknown")

# %% [markdown]
# ## Questions
#
# 1. **Vocabulary from training only.** Built on the test split too, the vocabulary would give
#    ids to test-only words. Their embeddings would never be trained, so the model would not
#    translate them any better. But `<unk>` would appear less often in the test data, and the
#    unknown-word rate (and, on real corpora, some scores) would look better than a deployed model
#    could achieve. Building it from training data only keeps the evaluation honest.
# 2. **Leaky Tatoeba splits.** Test BLEU would be inflated: the model has seen the test English
#    sentence in training, with a French translation that often shares most words with the
#    reference.
# 3. **The whole difference in token types.** Sort every token type of the training split into
#    the grammar's word classes (from its lexicon: nouns, adjectives, verbs) and the rest
#    (articles, prepositions, pronouns, negation, conjunctions, adverbs), in both languages, and
#    subtract. The cell below does it; a type claimed by two classes (French *porte* is a door
#    and "carries") counts once, in the first. Adjectives give most of the difference: one
#    English form against up to five agreeing French forms (*beau, bel, belle, beaux, belles*).
#    Verbs come second: a French verb has a singular, a plural and an infinitive (after *peut*),
#    an English one two forms (*sees, see*), and the two-word English verbs (*looks for*) add
#    only their first word to the verb class (*porte*, "carries", is also the noun "door" and is
#    counted there). Nouns *remove* two types: both languages have a singular and a plural, but
#    two French nouns have one form for both (*souris*, *ours*). The remaining function
#    words add a few: French articles split by gender, number and elision (*le, la, l', les*,
#    contracted *du, au, aux*; *ce, cet, cette, ces*; *mon, ma, mes*) where English has *the, a,
#    an, some, any, this, these, my*, while English spends types on words French does not need as
#    separate words (*does, do, not, can, cannot*) or splits one French word into two (*far from*:
#    *loin de*; *in front of*: *devant*).

# %%
from tfmlib.synthetic import ADJECTIVES, NOUNS, VERBS

english_types = {t for en, _ in train for t in tokenize(en)}
french_types = {t for _, fr in train for t in tokenize(fr)}
word_classes = {  # class -> (English forms, French forms) from the grammar's lexicon
    "nouns": ({w for n in NOUNS for w in (n.en, n.en_plural)}, {w for n in NOUNS for w in (n.fr, n.fr_plural)}),
    "adjectives": ({a.en for a in ADJECTIVES},
                   {w for a in ADJECTIVES for w in (a.fr_ms, a.fr_fs, a.fr_mp, a.fr_fp, a.fr_ms_vowel) if w}),
    "verbs": ({f.split()[0] for v in VERBS for f in (v.en_sg, v.en_base)},
              {w for v in VERBS for w in (v.fr_sg, v.fr_pl, v.fr_inf)}),
}


def count_by_class(types: set[str], side: int) -> dict[str, int]:
    """Types of one language per word class; a type goes to the first class that has it."""
    counts, claimed = {}, set()
    for name, forms in word_classes.items():
        mine = (types & forms[side]) - claimed
        counts[name], claimed = len(mine), claimed | mine
    counts["function words and the rest"] = len(types - claimed)
    return counts


en_counts, fr_counts = count_by_class(english_types, 0), count_by_class(french_types, 1)
print(f"{'class':30s}{'English':>9s}{'French':>8s}{'difference':>12s}")
for name in en_counts:
    print(f"{name:30s}{en_counts[name]:9d}{fr_counts[name]:8d}{fr_counts[name] - en_counts[name]:+12d}")
print(f"{'all token types':30s}{len(english_types):9d}{len(french_types):8d}"
      f"{len(french_types) - len(english_types):+12d}")
assert sum(en_counts.values()) == len(english_types) and sum(fr_counts.values()) == len(french_types)
assert max(fr_counts[n] - en_counts[n] for n in en_counts) == fr_counts["adjectives"] - en_counts["adjectives"], \
    "adjective agreement should be the largest source of extra French types"

# %% [markdown]
# 4. **Unknown words.** The model reads `<unk>` in place of every unknown source word, so all of
#    them look alike; it can only write words of its target vocabulary, so a name or a rare word
#    comes out as `<unk>` or as a wrong guess. Two standard remedies: copy the source word when
#    the model emits `<unk>` (using attention to find which source word to copy, Luong et al.
#    2015), or split words into subword units (byte-pair encoding, Sennrich et al. 2016), so
#    that every word is a sequence of known pieces and the vocabulary stays small.

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
from tfmlib.data import Vocab, tokenize
from tfmlib.synthetic import load_bundled

# %% [markdown]
# ## Coding exercise
#
# **1. `unknown_rate`.** Tokenize every sentence with the book's `tokenize` (so `l'oiseau` and
# the final `.` are tokens of their own, as the vocabulary saw them), then count the tokens the
# vocabulary does not contain: every occurrence, since the model reads `<unk>` at each one.

# %%
def unknown_rate(sentences: list[str], vocab: Vocab) -> float:
    tokens = [token for sentence in sentences for token in tokenize(sentence)]
    return sum(token not in vocab for token in tokens) / len(tokens)


exercises.check("00.unknown_rate", unknown_rate, must_pass=True)
train, test = load_bundled("train"), load_bundled("test")
tgt_vocab = Vocab.build(tokenize(fr) for _, fr in train)
print(f"French test tokens missing from the training vocabulary: {unknown_rate([fr for _, fr in test], tgt_vocab):.3%}")
print(f"with a vocabulary of the first 1,000 training pairs only: "
      f"{unknown_rate([fr for _, fr in test], Vocab.build(tokenize(fr) for _, fr in train[:1000])):.3%}")

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

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
# Worked answers to the exercises of chapter 00. Each coding answer is checked with
# `must_pass=True`, which raises if the checker does not accept it (the tests run this notebook).

# %%
import torch

from tfmlib import exercises

# %% [markdown]
# ## Coding exercises
#
# **1. `padding_mask`.** Position $j$ of sentence $b$ is real exactly when $j < \text{length}_b$.
# Broadcasting a `(1, max_len)` row of positions against a `(batch, 1)` column of lengths compares
# every pair at once.

# %%
def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]


exercises.check("00.padding_mask", padding_mask, must_pass=True)
print(padding_mask(torch.tensor([3, 1, 2]), 4).int())

# %% [markdown]
# **2. `padding_fraction`.** Each batch is padded to its longest sentence, so it occupies
# `len(batch) * max(lengths)` slots, of which `sum(lengths)` are real.

# %%
def my_padding_fraction(batches: list[list[int]], lengths: list[int]) -> float:
    real = slots = 0
    for batch in batches:
        batch_lengths = [lengths[i] for i in batch]
        real += sum(batch_lengths)
        slots += len(batch) * max(batch_lengths)
    return 1 - real / slots


exercises.check("00.padding_fraction", my_padding_fraction, must_pass=True)

# %% [markdown]
# ## Questions
#
# 1. **Vocabulary from training only.** Built on the test split too, the vocabulary would give
#    ids to test-only words. Their embeddings would never be trained, so the model would not
#    translate them any better. But `<unk>` would appear less often in the test data, and the
#    unknown-word rate (and, on real corpora, some scores) would look better than a deployed model
#    could achieve. Building it from training data only keeps the evaluation honest.
# 2. **Pools, not a full sort.** A full sort makes every epoch present the batches in nearly the
#    same composition: each batch holds the same neighbouring lengths every epoch, and if the
#    batches are not shuffled, training walks from short to long sentences, a curriculum you did
#    not choose. Shrinking the pool gives more randomness but more padding; at a pool of one batch
#    the sampler is random batching again.
# 3. **Leaky Tatoeba splits.** Test BLEU would be inflated: the model has seen the test English
#    sentence in training, with a French translation that often shares most words with the
#    reference.
# 4. **More French token types.** Agreement: an English adjective has one form, its French
#    translation up to five (masculine/feminine × singular/plural, and *bel, vieil, nouvel*
#    before a vowel); a French verb has a singular, a plural and an infinitive (after *peut*),
#    where English has two forms; articles split by gender and elision (*le, la, l', les*). The
#    cell below counts, for each English adjective of the corpus, how many French forms it takes.

# %%
from tfmlib.data import tokenize
from tfmlib.synthetic import ADJECTIVES, load_bundled

french_types = {t for _, fr in load_bundled("train") for t in tokenize(fr)}
english_types = {t for en, _ in load_bundled("train") for t in tokenize(en)}


def french_forms(adjective) -> set[str]:
    """The forms of an adjective that occur in the French side of the corpus."""
    forms = {adjective.fr_ms, adjective.fr_fs, adjective.fr_mp, adjective.fr_fp, adjective.fr_ms_vowel}
    return (forms - {None}) & french_types


for adjective in ADJECTIVES[:8]:
    forms = french_forms(adjective)
    print(f"{adjective.en:9s} -> {len(forms)} French forms: {sorted(forms)}")
total_forms = sum(len(french_forms(a)) for a in ADJECTIVES)
print(f"{len(ADJECTIVES)} English adjectives, {total_forms} French adjective forms in the corpus; "
      f"{len(english_types)} English vs {len(french_types)} French token types overall")

# %% [markdown]
# 5. **Unknown words.** The model reads `<unk>` in place of every unknown source word, so all of
#    them look alike; it can only write words of its target vocabulary, so a name or a rare word
#    comes out as `<unk>` or as a wrong guess. Two standard remedies: copy the source word when
#    the model emits `<unk>` (using attention to find which source word to copy, Luong et al.
#    2015), or split words into subword units (byte-pair encoding, Sennrich et al. 2016), so
#    that every word is a sequence of known pieces and the vocabulary stays small.

"""Checkers for chapter 00 (preface).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("00.name", answer)``.
(The padding exercises that lived here moved to chapter 02 with the section on batches.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .core import Wrong, checker

Tokenizer = Callable[[str], list[str]]


def _rates(train: Sequence[str], test: Sequence[str], sizes: Sequence[int], *, split: Tokenizer | None = None,
           first: Callable[[int], int] = lambda n: n, distinct: bool = False, per_sentence: bool = False,
           eos: bool = False, with_test: bool = False, dedupe: bool = False) -> list[float]:
    """The unknown rate of ``test`` for vocabularies of the first ``n`` training sentences, one per size.

    The keyword arguments make the usual mistakes, so that the checker can name them: another
    tokenizer, another number of sentences, distinct words, a mean of per-sentence rates, ``<eos>``
    counted as a token, test sentences in the vocabulary, repeated test sentences counted once.
    """
    from tfmlib.data import Vocab, tokenize

    split = split or tokenize
    if dedupe:
        test = list(dict.fromkeys(test))
    test_tokens = [split(s) for s in test]
    out = []
    for n in sizes:
        kept = [split(s) for s in train[: max(first(n), 0)]]
        vocab = Vocab.build(kept + (test_tokens if with_test else []))
        unknown = [[t for t in sentence if t not in vocab] for sentence in test_tokens]
        if per_sentence:
            out.append(sum(len(u) / len(s) for u, s in zip(unknown, test_tokens, strict=True)) / len(test))
        elif distinct:
            out.append(len({t for u in unknown for t in u}) / sum(len(s) for s in test_tokens))
        else:
            out.append(sum(map(len, unknown)) / (sum(map(len, test_tokens)) + (len(test) if eos else 0)))
    return out


def _unknown_rate_cases() -> list[tuple[list[str], list[str], list[int]]]:
    # capitals (the tokenizer lowercases), elisions and punctuation (tokens of their own), unknown
    # words that occur twice, sentences of different lengths, sizes out of order and n = 0, and a
    # test sentence that occurs twice (real test splits repeat sentences)
    train = ["Le chat voit l'oiseau.", "Les chats dorment.", "Un chien voit le chat !", "L'ours dort.",
             "les oiseaux voient un ours ."]
    test = ["le chien voit l'ours.", "Les chats voient le chien et le zèbre !", "Un oiseau dort."]
    return [(train, test, [0, 1, 2, 3, 4, 5]), (train, test[::-1] + test[:1], [4, 2, 5, 1])]


def _mistakes() -> list[tuple[str, dict]]:
    """(what the answer got wrong, the keyword arguments of :func:`_rates` that make that mistake)."""
    from tfmlib.data import tokenize

    return [
        ("you counted each distinct unknown word once; count every occurrence of an unknown token, since "
         "the model reads <unk> at each one", dict(distinct=True)),
        ("this is the mean of per-sentence rates; pool the tokens of all test sentences and divide once "
         "(a short sentence should not weigh as much as a long one)", dict(per_sentence=True)),
        ("the <eos> marks (one per test sentence) are in your denominator; they are not tokens of the text",
         dict(eos=True)),
        ("capitals: the book's tokenize lowercases, so 'Le' and 'le' are one token; tokenize both the "
         "training and the test sentences the way the vocabulary was meant to be read",
         dict(split=lambda s: tokenize(s, lowercase=False))),
        ("split the sentences with the book's tokenize, which lowercases and makes elisions and "
         "punctuation tokens of their own (l'ours is two tokens), not on spaces", dict(split=str.split)),
        ("split the sentences with the book's tokenize, which makes elisions and punctuation tokens of "
         "their own (l'ours is two tokens), not on spaces", dict(split=lambda s: s.lower().split())),
        ("off by one: the vocabulary for size n comes from exactly the first n training sentences",
         dict(first=lambda n: n + 1)),
        ("off by one: the vocabulary for size n comes from exactly the first n training sentences",
         dict(first=lambda n: n - 1)),
        ("your vocabulary does not depend on n: build a fresh one from the first n training sentences "
         "for each size", dict(first=lambda n: 10**9)),
        ("your vocabulary has seen the test sentences: build it from training sentences only",
         dict(with_test=True)),
        ("a test sentence that occurs twice counts twice: count every test sentence, repeated ones too "
         "(the model reads each occurrence)", dict(dedupe=True)),
    ]


@checker(
    "00.unknown_rate_curve",
    hint=("the section 'From text to ids' measures one point of this curve, with the whole training "
          "split. For each size build a fresh vocabulary from that many sentences at the start of the "
          "training list; read both sides with the book's tokenizer (it lowercases and splits off "
          "punctuation and elisions); count every test token, not every distinct word, and keep the "
          "order of the sizes you were given"),
)
def _check_unknown_rate_curve(curve: Callable[[list[str], list[str], list[int]], Sequence[float]]) -> None:
    for train, test, sizes in _unknown_rate_cases():
        got = curve(list(train), list(test), list(sizes))
        if not isinstance(got, (list, tuple)) or len(got) != len(sizes):
            what = type(got).__name__
            if isinstance(got, (list, tuple)):
                what += f" of length {len(got)}"
            raise Wrong(f"return one rate per size, a list of {len(sizes)} numbers for sizes {sizes}; "
                        f"got a {what}")
        if not all(isinstance(r, (float, int)) and not isinstance(r, bool) and math.isfinite(r)
                   for r in got):
            raise Wrong(f"every rate should be a finite number (a fraction between 0 and 1), got {list(got)}")

        def same(rates: Sequence[float], got: Sequence[float] = got) -> bool:
            return all(abs(a - b) < 1e-9 for a, b in zip(rates, got, strict=True))

        want = _rates(train, test, sizes)
        if same(want):
            continue
        if same([1 - r for r in want]):
            raise Wrong("these are the fractions of test tokens the vocabulary knows; the exercise asks for "
                        "the fractions it lacks")
        if same([want[i] for i in sorted(range(len(sizes)), key=lambda i: sizes[i])]):
            raise Wrong(f"the rates are in increasing order of size; return them in the order of sizes "
                        f"{sizes}")
        for message, mistake in _mistakes():
            if not same(_rates(train, test, sizes, **mistake)):
                continue
            raise Wrong(message)
        shown = ", ".join(f"n={n}: {w:.4f} (yours {g:.4f})" for n, w, g in zip(sizes, want, got, strict=True))
        raise Wrong(f"for {len(test)} test sentences and training sizes {sizes}, expected {shown}")

"""Checkers for chapter 00 (preface).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("00.name", answer)``.
(The padding exercises that lived here moved to chapter 02 with the section on batches.)
"""

from __future__ import annotations

from collections.abc import Callable

from .core import Wrong, checker


def _unknown_rate_cases() -> list[tuple[list[str], object, float]]:
    from tfmlib.data import Vocab, tokenize

    vocab = Vocab.build([tokenize("le chat voit l'oiseau ."), tokenize("les chats dorment .")])
    # (sentences, vocab, expected fraction of tokens missing from vocab); "l'oiseau" is two tokens,
    # "." a token of its own, and repeated unknown words count every time they occur
    return [
        (["le chat voit l'oiseau ."], vocab, 0.0),
        (["le chien voit l'ours ."], vocab, 2 / 6),
        (["le chien voit le chien ."], vocab, 2 / 6),
        (["un zèbre", "les chats dorment ."], vocab, 2 / 6),
    ]


@checker(
    "00.unknown_rate",
    hint=("the section 'From text to ids' computes this rate for the French test split: tokenize each "
          "sentence as the book does (punctuation and elisions are tokens of their own), count every "
          "token, not every distinct word, and ask the vocabulary whether it contains each one"),
)
def _check_unknown_rate(unknown_rate: Callable[[list[str], object], float]) -> None:
    for sentences, vocab, want in _unknown_rate_cases():
        got = unknown_rate(list(sentences), vocab)
        if not isinstance(got, (float, int)) or isinstance(got, bool):
            raise Wrong(f"return a number (a fraction between 0 and 1), got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            extra = ""
            if sentences[0].startswith("le chien voit le chien") and abs(got - 1 / 6) < 1e-9:
                extra = " (count every occurrence of an unknown word, not each distinct word once)"
            elif sentences[0].endswith("l'oiseau .") and got > 0:
                extra = (" (split the sentences with the book's tokenize, which separates elisions and "
                         "punctuation)")
            raise Wrong(f"for sentences {sentences}: expected {want:.4f}, got {got:.4f}{extra}")

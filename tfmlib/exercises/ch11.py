"""Checkers for chapter 11 (real text: byte-pair encoding and the Transformer on Multi30k).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("11.name", answer)``.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from tfmlib.bpe import BPE, END_OF_WORD, initial_symbols, merge_pair, split_word
from tfmlib.data import Vocab, tokenize

from .core import Wrong, checker

# A small corpus of real-text words: merges are learned from it, and the words below are encoded with them.
_SENTENCES = [
    "Two young men are playing football in the park.",
    "A man in a blue shirt is standing on a ladder.",
    "Zwei junge Männer spielen Fußball im Park.",
    "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    "The lowest and the newest tower is the tallest.",
    "Die Frau trägt eine rote Jacke und läuft über die Straße.",
    "Children are playing with a ball near the water.",
    "Kinder spielen mit einem Ball in der Nähe des Wassers.",
    "A woman is walking her dog on the beach.",
    "Eine Frau geht mit ihrem Hund am Strand spazieren.",
]
_TOKENS = [tokenize(s) for s in _SENTENCES] * 2     # every word seen at least twice


@lru_cache(maxsize=1)
def _bpe() -> BPE:
    return BPE.learn(_TOKENS, 120, min_frequency=2)


# ----------------------------------------------------------------------------- 11.byte_fallback


_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")


def _split_end(piece: str) -> tuple[str, bool]:
    """``("ab", True)`` for ``"ab</w>"``, ``("ab", False)`` for ``"ab"``."""
    if piece.endswith(END_OF_WORD):
        return piece[: -len(END_OF_WORD)], True
    return piece, False


def _fallback(bpe: BPE, vocab: Vocab, word: str, byte: Callable[[int], str] = "<0x{:02X}>".format,
              text_bytes: Callable[[str], list[int]] = lambda t: list(t.encode("utf-8")),
              end: str = "own", whole_word: bool = False) -> list[str]:
    """The reference encoding with byte fallback, and (through its options) the typical mistakes."""
    pieces = bpe.encode_word(word)
    if whole_word and any(p not in vocab for p in pieces):
        return [byte(b) for c in word for b in text_bytes(c)] + [END_OF_WORD]
    out: list[str] = []
    for piece in pieces:
        if piece in vocab:
            out.append(piece)
            continue
        text, ends = _split_end(piece)
        if end == "bytes":
            text, ends = piece, False
        out += [byte(b) for b in text_bytes(text)]
        if ends and end == "own":
            out.append(END_OF_WORD)
        elif ends and end == "glued":
            out[-1] += END_OF_WORD
    return out


def _decode_bytes(pieces: Sequence[str]) -> list[str]:
    """The reference decoding: a word's pieces as UTF-8 bytes, decoded once the word ends."""
    words: list[str] = []
    current = bytearray()
    for piece in pieces:
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            current.append(int(m.group(1), 16))
            continue
        text, ends = _split_end(piece)
        current += text.encode("utf-8")
        if ends:
            words.append(current.decode("utf-8", errors="replace"))
            current = bytearray()
    if current:
        words.append(current.decode("utf-8", errors="replace"))
    return words


def _as_pieces(got: Any, what: str) -> list[str]:
    if not isinstance(got, (list, tuple)) or not all(isinstance(p, str) for p in got):
        raise Wrong(f"{what} should return a list of str, got {type(got).__name__}")
    return list(got)


def _pair_of_functions(answer: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(callable(f) for f in answer):
        raise Wrong("pass a pair of functions: (encode_with_bytes, decode_with_bytes)")
    return answer[0], answer[1]


_UNSEEN = ["straße", "maß", "€", "5€", "😀", "東京", "café", "naïve", "x\x01y", "~", "Ωmega", "ß"]


@checker("11.byte_fallback", hint="section 3's note on characters never seen in training, and "
         "tfmlib.bpe's docstring: a piece the vocabulary lacks is written as the bytes of its text in "
         "UTF-8 (not its code points), each byte as two uppercase hex digits; the end-of-word marker is no "
         "text, so it is not turned into bytes and must survive; decoding must collect all of a word's "
         "bytes before turning them back into characters, since one character can take up to four bytes, "
         "and bytes that are no valid UTF-8 must not crash it")
def _check_byte_fallback(answer: Any) -> None:
    encode, decode = _pair_of_functions(answer)
    bpe = _bpe()
    full = Vocab.build(bpe.encode(t) for t in _TOKENS)
    small = Vocab.build((bpe.encode(t) for t in _TOKENS), max_size=40)
    seen = sorted({w for t in _TOKENS for w in t})
    for vocab, label in ((full, "the full vocabulary"), (small, "a vocabulary cut to 40 pieces")):
        for word in seen + _UNSEEN:
            want = _fallback(bpe, vocab, word)
            got = _as_pieces(encode(bpe, vocab, word), "encode_with_bytes")
            if got == want:
                continue
            where = f"{word!r} with {label} (BPE pieces {bpe.encode_word(word)})"
            missing = [p for p in bpe.encode_word(word) if p not in vocab]
            diagnoses = [
                (bpe.encode_word(word), f"the pieces {missing} are not in the vocabulary and were left as "
                                        "they are: a Vocab maps them to <unk>; write them as bytes"),
                (_fallback(bpe, vocab, word, byte="<0x{:02x}>".format),
                 "write each byte in uppercase hex, as sentencepiece and tokenizers do: <0xC3>, not <0xc3>"),
                (_fallback(bpe, vocab, word, byte="<0x{:X}>".format),
                 "write each byte with two hex digits: <0x01>, not <0x1>"),
                (_fallback(bpe, vocab, word, text_bytes=lambda t: [ord(c) for c in t]),
                 "you wrote the characters' code points; byte fallback writes their UTF-8 bytes (a "
                 "character outside ASCII takes two to four of them)"),
                (_fallback(bpe, vocab, word, end="bytes"),
                 f"you wrote the end-of-word marker's own characters as bytes; {END_OF_WORD!r} is no text: "
                 "keep it as a piece of its own after the bytes"),
                (_fallback(bpe, vocab, word, end="dropped"),
                 f"the end-of-word marker is lost when the last piece falls back to bytes: decoding would "
                 f"glue the next word on; put {END_OF_WORD!r} as a piece of its own after the bytes"),
                (_fallback(bpe, vocab, word, end="glued"),
                 f"you glued {END_OF_WORD!r} to the last byte piece; the exercise keeps the 256 byte "
                 f"pieces as they are and puts {END_OF_WORD!r} as a piece of its own after them"),
                (_fallback(bpe, vocab, word, whole_word=True),
                 "you wrote the whole word as bytes; only the pieces the vocabulary lacks fall back, the "
                 "others stay as BPE made them"),
            ]
            for value, why in diagnoses:
                if got == value:
                    raise Wrong(f"{where}: {why}")
            if "".join(got) == "".join(want).lower():
                raise Wrong(f"{where}: write each byte in uppercase hex (<0xC3>)")
            if any(p not in vocab and not _BYTE_PIECE.fullmatch(_split_end(p)[0]) and p != END_OF_WORD
                   for p in got):
                raise Wrong(f"{where}: expected {want}, got {got}: a piece of yours is neither in the "
                            "vocabulary nor a byte piece, so it would still be read as <unk>")
            raise Wrong(f"{where}: expected {want}, got {got}. This exercise falls back per *piece*: a "
                        "piece the vocabulary lacks becomes the bytes of its whole text, and every other "
                        "piece stays as BPE made it (sentencepiece and tokenizers fall back per character "
                        "instead, a different rule)")
    # decoding: the reference's pieces of whole sentences, then your own, back to the words
    sentences = [tokenize(s) for s in _SENTENCES[:4]] + [_UNSEEN, ["die", "straße", "kostet", "5€", "😀"]]
    for vocab in (full, small):
        for words in sentences:
            pieces = [p for w in words for p in _fallback(bpe, vocab, w)]
            try:
                got = decode(list(pieces))
            except UnicodeDecodeError as e:
                raise Wrong(f"decoding {pieces} raised UnicodeDecodeError ({e}): the bytes of one character "
                            "must be decoded together, once all of them are gathered") from None
            got = _as_pieces(got, "decode_with_bytes")
            if got == words:
                continue
            if len(got) != len(words):
                raise Wrong(f"decoding {pieces}: expected {len(words)} words {words}, got {len(got)}: {got}; "
                            f"a word ends with the piece that ends with {END_OF_WORD!r}")
            bad = [(w, g) for w, g in zip(words, got, strict=True) if w != g]
            w, g = bad[0]
            if "<0x" in g:
                raise Wrong(f"decoding gave {g!r} for {w!r}: the byte pieces must become bytes again")
            if "\ufffd" in g or g == w.encode("utf-8").decode("latin-1"):
                raise Wrong(f"decoding gave {g!r} for {w!r}: you decoded each byte on its own; gather all of "
                            "a word's bytes and decode them together (a character can take up to 4 bytes)")
            raise Wrong(f"decoding {pieces}: expected {words}, got {got}")
        round_trip = [p for w in seen + _UNSEEN
                      for p in _as_pieces(encode(bpe, vocab, w), "encode_with_bytes")]
        if decode(round_trip) != seen + _UNSEEN:
            raise Wrong("decode_with_bytes(encoded words) does not give the words back")
    # a model can emit bytes that are no UTF-8: decoding must not crash on them
    for pieces, want in ((["<0xC3>", END_OF_WORD], ["\ufffd"]),
                         (["a", "<0xFF>", "b" + END_OF_WORD], ["a\ufffdb"]),
                         (["<0xE2>", "<0x82>", "<0xAC>", "<0x35>"], ["€5"])):
        try:
            got = _as_pieces(decode(list(pieces)), "decode_with_bytes")
        except UnicodeDecodeError:
            raise Wrong(f"decoding {pieces} raised UnicodeDecodeError: bytes that are no valid UTF-8 "
                        "(a model can emit them) must become the replacement character U+FFFD, as "
                        "bytes.decode(..., errors='replace') does") from None
        if got != want:
            raise Wrong(f"decoding {pieces}: expected {want}, got {got}")


# ----------------------------------------------------------------------------- 11.bpe_dropout


def _candidates(bpe: BPE, symbols: Sequence[str]) -> list[tuple[str, str]]:
    """The distinct adjacent pairs of ``symbols`` that are merges, best (learned earliest) first."""
    present = {p for p in zip(symbols, symbols[1:], strict=False) if p in bpe.ranks}
    return sorted(present, key=bpe.ranks.__getitem__)


def _dropout_distribution(bpe: BPE, word: str, p: float) -> dict[tuple[str, ...], float]:
    """The exact probability of each segmentation of ``word`` under BPE-dropout: at each step every
    candidate merge is dropped with probability p, the best one left is applied, and the word is done
    when every candidate was dropped (or none is left)."""
    memo: dict[tuple[str, ...], dict[tuple[str, ...], float]] = {}

    def dist(symbols: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        if symbols in memo:
            return memo[symbols]
        out: Counter = Counter()
        stay = 1.0
        for pair in _candidates(bpe, symbols):
            for seg, q in dist(tuple(merge_pair(symbols, pair))).items():
                out[seg] += stay * (1 - p) * q
            stay *= p
        out[symbols] += stay
        memo[symbols] = dict(out)
        return memo[symbols]

    return dist(tuple(split_word(word)))


def _dropout_once_per_word(bpe: BPE, word: str, p: float, rng: random.Random) -> list[str]:
    """A typical mistake: drop merges from the table once per word, not again at every step."""
    dropped: dict[tuple[str, str], bool] = {}
    symbols = split_word(word)
    while True:
        for pair in _candidates(bpe, symbols):
            if pair not in dropped:
                dropped[pair] = rng.random() < p
        kept = [c for c in _candidates(bpe, symbols) if not dropped[c]]
        if not kept:
            return symbols
        symbols = merge_pair(symbols, kept[0])


# "banana" and "ananas" repeat a pair that is a merge ("a" + "n"): a merge applies to every occurrence
# at once, so dropping occurrences one by one makes segmentations the algorithm never makes
_DROPOUT_WORDS = ["playing", "standing", "football", "tallest", "newest", "spielen", "einer",
                  "banana", "ananas"]


@checker("11.bpe_dropout", hint="section 2's listing that applies merges to a new word, and Provilkov et "
         "al. 2020, Algorithm 1: at each step list the merges that could apply now, drop each of them with "
         "probability p using the generator you are given, apply the best one left; a word is done when "
         "every candidate of a step was dropped; a merge dropped at one step can still apply at a later one")
def _check_bpe_dropout(dropout_encode: Callable[..., Any]) -> None:
    bpe = _bpe()
    words = sorted({w for t in _TOKENS for w in t}) + ["straße", "lowest", "towers"]

    def run(word: str, p: float, rng: random.Random) -> list[str]:
        got = _as_pieces(dropout_encode(bpe, word, p, rng), "your function")
        if "".join(got) != word + END_OF_WORD:
            raise Wrong(f"p={p}: {word!r} came out as {got}, which does not spell {word!r} followed by "
                        f"{END_OF_WORD!r}: dropout changes how a word is cut, never its characters")
        return got

    rng = random.Random(11)
    for word in words:
        got, want = run(word, 0.0, rng), bpe.encode_word(word)
        if got != want:
            if got == split_word(word):
                raise Wrong(f"at p=0 {word!r} came out as single characters: you keep a merge with "
                            "probability p; drop it with probability p (p=0 drops nothing)")
            raise Wrong(f"at p=0 nothing is dropped, so {word!r} must be BPE.encode_word's {want}, got {got}")
    # the same generator state must give the same segmentations: the randomness comes from rng only
    first = [run(w, 0.1, random.Random(5)) for w in words for _ in range(3)]
    again = [run(w, 0.1, random.Random(5)) for w in words for _ in range(3)]
    if first != again:
        raise Wrong("two runs with generators seeded alike gave different segmentations: draw every random "
                    "number from the generator passed in (rng.random()), not from the random module or torch")
    n = 2000
    for p in (0.1, 0.3):
        for word in _DROPOUT_WORDS:
            exact = _dropout_distribution(bpe, word, p)
            full = tuple(bpe.encode_word(word))
            rng = random.Random(2020)
            seen = Counter(tuple(run(word, p, rng)) for _ in range(n))
            if len(seen) == 1:
                only = next(iter(seen))
                if only == full:
                    raise Wrong(f"p={p}: all {n} segmentations of {word!r} were the full one {list(full)}: "
                                "either p is ignored or a dropped merge only delays it; a step at which "
                                "every candidate is dropped must end the word")
                raise Wrong(f"p={p}: all {n} segmentations of {word!r} were {list(only)}: dropout must vary")
            unexpected = [s for s in seen if s not in exact]
            if unexpected:
                raise Wrong(f"p={p}: {word!r} came out as {list(unexpected[0])}, a segmentation the "
                            "algorithm never makes (merges apply best first, each to all its occurrences)")
            # the most likely segmentations must appear at their rates (5 standard errors: no flakes)
            for seg in sorted(exact, key=exact.__getitem__, reverse=True)[:3]:
                q, rate = exact[seg], seen[seg] / n
                if abs(rate - q) <= 5 * math.sqrt(q * (1 - q) / n) + 1e-12:
                    continue
                what = f"p={p}: {word!r} came out as {list(seg)} in {rate:.1%} of {n} encodings, expected " \
                       f"{q:.1%}"
                if seg == full:
                    path = [tuple(split_word(word))]
                    while cands := _candidates(bpe, path[-1]):
                        path.append(tuple(merge_pair(path[-1], cands[0])))
                    if set(seen) <= set(path):
                        raise Wrong(f"{what} (the full merge), and every other segmentation was a stage "
                                    "on the way to it: you stop merging when the best merge is dropped; the "
                                    "best merge left after the drops must apply")
                    vrng = random.Random(7)
                    v_rate = sum(tuple(_dropout_once_per_word(bpe, word, p, vrng)) == full
                                 for _ in range(4 * n)) / (4 * n)
                    if abs(rate - v_rate) <= 5 * math.sqrt(max(v_rate * (1 - v_rate), 1e-4) / n):
                        raise Wrong(f"{what} (the full merge): you drop merges once per word; each step "
                                    "draws afresh, so a merge dropped at one step can still apply at a later "
                                    "one")
                raise Wrong(what)
    for word in words:    # last: an answer that retries dropped merges never ends at p=1
        got = run(word, 1.0, rng)
        if got != split_word(word):
            raise Wrong(f"at p=1 every merge is dropped, so {word!r} must be {split_word(word)}, got {got}")


# ----------------------------------------------------------------------------- 11.wordpiece_merges


def _wordpiece(counts: Mapping[str, int], num_merges: int, min_frequency: int, *, weighted: bool = True,
               stale: bool = False) -> list[tuple[str, str]]:
    """The reference: merge the pair of largest count(ab) / (count(a) count(b)), ties to the pair whose
    symbols entered the vocabulary first; ``weighted=False`` and ``stale=True`` are typical mistakes
    (each word counted once; symbol counts of the initial words, never updated)."""
    order = {s: i for i, s in enumerate(initial_symbols(counts))}
    words = {tuple(split_word(w)): (c if weighted else 1) for w, c in counts.items()}
    first_symbols = _symbol_counts(words)
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs = _pair_counts(words)
        symbols = first_symbols if stale else _symbol_counts(words)
        candidates = [pr for pr, c in pairs.items() if c >= min_frequency]
        if not candidates:
            break
        best = min(candidates, key=lambda pr: (-_score(pairs, symbols, pr), order[pr[0]], order[pr[1]]))
        merges.append(best)
        new = best[0] + best[1]
        order.setdefault(new, len(order))
        if stale:
            first_symbols.setdefault(new, pairs[best])
        words = {tuple(merge_pair(s, best)): c for s, c in words.items()}
    return merges


def _pair_counts(words: Mapping[tuple[str, ...], int]) -> Counter:
    pairs: Counter = Counter()
    for s, c in words.items():
        for pr in zip(s, s[1:], strict=False):
            pairs[pr] += c
    return pairs


def _symbol_counts(words: Mapping[tuple[str, ...], int]) -> Counter:
    symbols: Counter = Counter()
    for s, c in words.items():
        for x in s:
            symbols[x] += c
    return symbols


def _score(pairs: Mapping, symbols: Mapping, pr: tuple[str, str]) -> Fraction:
    return Fraction(pairs[pr], symbols[pr[0]] * symbols[pr[1]])


_WORDPIECE_CORPORA: list[tuple[dict[str, int], int, int]] = [
    ({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 10, 1),
    ({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 10, 2),
    ({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 12, 2),
    ({"aa": 3, "ab": 3, "ba": 3, "bb": 3, "abab": 1}, 6, 1),
    ({"zz": 1, "yx": 2, "xy": 2, "the": 9, "then": 4, "there": 3}, 10, 2),
    ({"xq": 1, "ab": 3, "abc": 2, "bc": 4}, 4, 1),
    (dict(Counter(w for t in _TOKENS for w in t)), 40, 2),
]


@checker("11.wordpiece_merges", hint="section 2's learning loop, learn_merges_slowly, with another rule "
         "for the best pair: a pair's count relative to how often each of its two symbols occurs, both "
         "counted over the current segmentation of every word, weighted by the word's count, and counted "
         "again after every merge; keep that function's rules for ties and for min_frequency")
def _check_wordpiece_merges(learn: Callable[..., Any]) -> None:
    for counts, num_merges, min_frequency in _WORDPIECE_CORPORA:
        want = _wordpiece(counts, num_merges, min_frequency)
        got = learn(dict(counts), num_merges, min_frequency)
        if not isinstance(got, (list, tuple)) or not all(isinstance(m, (list, tuple)) and len(m) == 2
                                                         and all(isinstance(s, str) for s in m) for m in got):
            raise Wrong("return the merges as a list of pairs of str, e.g. [('u', 'g'), ('h', 'ug')]")
        got = [tuple(m) for m in got]
        if got == want:
            continue
        shown = dict(counts) if len(counts) <= 6 else f"the checker's {len(counts)} words"
        where = f"counts {shown}, num_merges={num_merges}, min_frequency={min_frequency}"
        if got == _wordpiece(counts, num_merges, min_frequency, weighted=False):
            raise Wrong(f"{where}: you counted each word once; weight every pair and symbol by the word's "
                        "count")
        if got == _wordpiece(counts, num_merges, min_frequency, stale=True):
            raise Wrong(f"{where}: your symbol counts are those before any merge: count the symbols again "
                        "after every merge (a merge takes occurrences away from both of its symbols)")
        k = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                 min(len(got), len(want)))
        if k == len(want):
            raise Wrong(f"{where}: expected {len(want)} merges {want}, got {len(got)}: stop when no pair "
                        "occurs min_frequency times (and after num_merges merges)")
        if k == len(got):
            raise Wrong(f"{where}: you stopped after {len(got)} merges, expected {len(want)}: {want}")
        order = {s: i for i, s in enumerate(initial_symbols(counts))}
        words = {tuple(split_word(w)): c for w, c in counts.items()}
        for m in want[:k]:
            order.setdefault(m[0] + m[1], len(order))
            words = {tuple(merge_pair(s, m)): c for s, c in words.items()}
        pairs, symbols = _pair_counts(words), _symbol_counts(words)
        mine, right = got[k], want[k]
        step = f"{where}: merge {k + 1} (after {want[:k]})"
        if pairs[mine] == 0:
            raise Wrong(f"{step}: {mine} is no adjacent pair of the words at this point")
        if pairs[mine] < min_frequency:
            raise Wrong(f"{step}: {mine} occurs {pairs[mine]} times, fewer than "
                        f"min_frequency={min_frequency}")
        s_mine, s_right = _score(pairs, symbols, mine), _score(pairs, symbols, right)
        if s_mine == s_right:
            parts = [f"count({a}{b}) = {pairs[(a, b)]}, count({a}) = {symbols[a]}, count({b}) = {symbols[b]}"
                     for a, b in (mine, right)]
            raise Wrong(f"{step}: {mine} and {right} tie with score {s_mine} ({parts[0]}; {parts[1]}), "
                        "and ties go to the pair whose left symbol entered the vocabulary first, then the "
                        f"right one (characters in code-point order, then {END_OF_WORD!r}, then merged "
                        "symbols in the order made), as in learn_merges. If "
                        "your tie rule is that one, your scores for these two differ: compare them exactly "
                        "(fractions.Fraction; floats can round equal scores apart) and count each symbol "
                        "over the current segmentation of every word")
        frequent = max(pairs[pr] for pr in pairs if pairs[pr] >= min_frequency)
        if pairs[mine] == frequent and pairs[right] < frequent:
            raise Wrong(f"{step}: you took {mine}, the most frequent pair ({pairs[mine]} times), which is "
                        f"BPE's rule; the score count(ab) / (count(a) count(b)) prefers {right} "
                        f"({s_right} against {s_mine})")
        raise Wrong(f"{step}: expected {right} (score {s_right}), got {mine} (score {s_mine}); full list "
                    f"expected {want}")

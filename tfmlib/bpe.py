"""Byte-pair encoding (Sennrich, Haddow and Birch 2016): words as sequences of subword pieces.

Introduced in chapter 11 (real text).

A word vocabulary has no entry for a word it never saw: on real text every rare name, number and
compound becomes ``<unk>``. Byte-pair encoding starts from the characters instead and learns,
from word counts, which adjacent pieces to glue together: repeatedly, the pair of adjacent
symbols seen most often in the training words becomes one new symbol (a *merge*). Frequent words
end up as one piece, rare words as a few, and any word made of known characters can be written.

Conventions (those of the paper's Algorithm 1):

* A word is its characters followed by the end-of-word symbol :data:`END_OF_WORD` (``"</w>"``),
  so that ``"st"`` inside ``"stop"`` and ``"st</w>"`` ending ``"best"`` are different symbols:
  ``"lowest"`` -> ``["low", "est</w>"]``. Pieces are plain strings; the last piece of a word ends
  with ``"</w>"`` (or is ``"</w>"`` itself), which is how :meth:`BPE.decode` finds word ends.
* Words come from :func:`tfmlib.data.tokenize` (the *pre-tokenization*): merges never cross a
  space or a punctuation token, and the tokenizer's marks (``"@-@"``) are words like any other.
* Merges are learned from *word counts* (:func:`word_counts`): a word seen 100 times counts its
  pairs 100 times. :func:`learn_merges_slowly` is the algorithm as the paper writes it (count
  every pair again after each merge); :func:`learn_merges` gives the same merges, updating the
  counts of the words a merge touches only (fast enough for Multi30k in seconds).
* **Ties.** Among pairs with the same count, the pair whose symbols entered the vocabulary first
  wins: compare the left symbols, then the right ones, where the order of symbols is the
  characters in code-point order, then ``"</w>"``, then each merged symbol in the order it was
  made. This is Hugging Face ``tokenizers``' rule (its ``BpeTrainer`` prefers the pair of
  smaller token ids, and gives ids in that order), so the two learn the same merges
  (``tests/test_bpe.py``). The paper's reference code takes the first pair its dictionary
  yields, an order that depends on the input; subword-nmt and sentencepiece break ties in yet
  other ways, so merges of equal counts can come out in another order there.
* **Encoding** a word applies the merges in the order they were learned (:func:`apply_merges`,
  the definition); :meth:`BPE.encode_word` gets the same result faster by merging, each time,
  the present pair learned earliest, as ``tokenizers`` and subword-nmt do.
* A character never seen in training stays a piece of its own (``"ß"`` -> ``["ß", ...]``), which
  a :class:`tfmlib.data.Vocab` then maps to ``<unk>``: nothing is dropped silently. (``tokenizers``'
  BPE without an unknown token drops such a character; with ``byte_fallback`` it writes its UTF-8
  bytes as ``<0xNN>`` pieces, which an exercise builds.)

How ``tokenizers`` is made to learn the same thing: it is given the same words (our tokenizer's,
split on spaces only) with the end-of-word symbol written as one extra character,
:data:`TOKENIZERS_END_OF_WORD`, a private-use code point above every character of real text, so
that it too sorts after all characters (``tokenizers``' own ``end_of_word_suffix`` glues the
suffix to the last character and numbers those symbols in hash-map order, random in each
training, so its tie-breaking, and with it its merges, changes from run to run: six trainings on
the test fixture gave six merge lists). See :func:`learn_merges_tokenizers`.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from tfmlib.data import SPECIAL_TOKENS, Vocab, detokenize, tokenize

INTRODUCED_IN = 11

#: The symbol that ends every word (Sennrich et al. 2016, Algorithm 1).
END_OF_WORD = "</w>"
#: The one character that stands for :data:`END_OF_WORD` in words given to ``tokenizers``.
TOKENIZERS_END_OF_WORD = "\U0010fffd"

Merge = tuple[str, str]


# --------------------------------------------------------------------------- inputs


def word_counts(sentences: Iterable[Sequence[str]]) -> Counter[str]:
    """How often each word occurs in ``sentences`` (lists of tokens, e.g. from ``tokenize``)."""
    counts: Counter[str] = Counter()
    for i, tokens in enumerate(sentences):
        if isinstance(tokens, str):
            raise TypeError(f"word_counts: sentence {i} is a str; give lists of tokens (tokenize first)")
        counts.update(tokens)
    return counts


def _check_counts(counts: Mapping[str, int], who: str) -> None:
    if not isinstance(counts, Mapping):
        raise TypeError(f"{who}: counts must be a mapping word -> count, got {type(counts).__name__}")
    for word, count in counts.items():
        _check_word(word, who)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"{who}: the count of {word!r} must be an int >= 1, got {count!r}")


def _check_word(word: str, who: str) -> None:
    if not isinstance(word, str):
        raise TypeError(f"{who}: words must be str, got {type(word).__name__}")
    if not word or any(c.isspace() for c in word):
        raise ValueError(f"{who}: a word must be non-empty and hold no space, got {word!r}")
    if END_OF_WORD in word:
        raise ValueError(f"{who}: the word {word!r} contains the end-of-word symbol {END_OF_WORD!r}")


def _check_learning(num_merges: int, min_frequency: int, who: str) -> None:
    for name, value, low in (("num_merges", num_merges, 0), ("min_frequency", min_frequency, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{who}: {name} must be an int >= {low}, got {value!r}")


def initial_symbols(counts: Mapping[str, int]) -> list[str]:
    """The symbols before any merge, in tie-breaking order: the characters of the words in
    code-point order, then :data:`END_OF_WORD`."""
    return sorted({c for word in counts for c in word}) + [END_OF_WORD]


def split_word(word: str) -> list[str]:
    """A word as BPE starts from it: ``"low"`` -> ``["l", "o", "w", "</w>"]``."""
    return [*word, END_OF_WORD]


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


# --------------------------------------------------------------------------- learning


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


def learn_merges(counts: Mapping[str, int], num_merges: int, min_frequency: int = 2) -> list[Merge]:
    """The merges of :func:`learn_merges_slowly`, learned without recounting every pair each time.

    Pair counts are kept from one merge to the next, with the words each pair occurs in; a merge
    rewrites only those words, taking their old pairs out of the counts and putting their new
    pairs in. The most frequent pair comes from a heap of ``(-count, order of left symbol, order
    of right symbol)``; an entry whose count has since fallen is put back with the current count
    when it comes up (counts only fall, except for pairs with the new symbol, which are pushed
    anew), so the pair taken is always the one :func:`learn_merges_slowly` takes.
    """
    _check_counts(counts, "learn_merges")
    _check_learning(num_merges, min_frequency, "learn_merges")
    order = {s: i for i, s in enumerate(initial_symbols(counts))}
    words = [split_word(w) for w in counts]
    freq = list(counts.values())
    pair_counts: Counter[Merge] = Counter()
    where: defaultdict[Merge, set[int]] = defaultdict(set)
    for i, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:], strict=False):
            pair_counts[pair] += freq[i]
            where[pair].add(i)
    heap = [(-c, order[a], order[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[Merge] = []
    while len(merges) < num_merges and heap:
        neg, _, _, a, b = heapq.heappop(heap)
        count = pair_counts[(a, b)]
        if count != -neg:  # a stale entry: its pair lost occurrences since it was pushed
            if count > 0:
                heapq.heappush(heap, (-count, order[a], order[b], a, b))
            continue
        if count < min_frequency:
            break
        merges.append((a, b))
        new = a + b
        order.setdefault(new, len(order))
        grown: set[Merge] = set()
        for i in where.pop((a, b)):
            old = words[i]
            merged = merge_pair(old, (a, b))
            if len(merged) == len(old):
                continue  # the pair left this word in an earlier merge
            f = freq[i]
            for pair in zip(old, old[1:], strict=False):
                pair_counts[pair] -= f
            for pair in zip(merged, merged[1:], strict=False):
                pair_counts[pair] += f
                if new in pair:  # the word's other pairs were in it before: `where` has them
                    where[pair].add(i)
                    grown.add(pair)
            words[i] = merged
        for pair in grown:
            heapq.heappush(heap, (-pair_counts[pair], order[pair[0]], order[pair[1]], *pair))
    return merges


def learn_merges_tokenizers(counts: Mapping[str, int], num_merges: int,
                            min_frequency: int = 2) -> list[Merge]:
    """The merges Hugging Face ``tokenizers``' ``BpeTrainer`` learns from the same word counts.

    The library does the work (in Rust, in well under a second on Multi30k); the words are given
    to it split on spaces only, each with :data:`TOKENIZERS_END_OF_WORD` appended, and no special
    tokens, so that its initial vocabulary is :func:`initial_symbols` in the same order and its
    ``vocab_size`` of ``len(initial) + num_merges`` asks for ``num_merges`` merges. Its merges are
    returned with that character written back as :data:`END_OF_WORD`: equal to
    :func:`learn_merges` (``tests/test_bpe.py``). Raises ``ImportError`` when ``tokenizers`` is
    not installed (``pip install tokenizers``).
    """
    _check_counts(counts, "learn_merges_tokenizers")
    _check_learning(num_merges, min_frequency, "learn_merges_tokenizers")
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError as err:
        raise ImportError("learn_merges_tokenizers needs Hugging Face tokenizers: pip install tokenizers") \
            from err
    symbols = initial_symbols(counts)
    if any(c >= TOKENIZERS_END_OF_WORD for c in symbols[:-1]):
        raise ValueError("learn_merges_tokenizers: a word holds a character at or above U+10FFFD, the "
                         "stand-in for the end-of-word symbol")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=len(symbols) + num_merges, min_frequency=min_frequency,
                                  show_progress=False, special_tokens=[])
    lines = (" ".join([word + TOKENIZERS_END_OF_WORD] * count) for word, count in counts.items())
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(counts))
    learned = json.loads(tokenizer.to_str())["model"]["merges"]
    pairs = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned]
    back = {TOKENIZERS_END_OF_WORD: END_OF_WORD}
    return [("".join(back.get(c, c) for c in a), "".join(back.get(c, c) for c in b))
            for a, b in pairs[:num_merges]]


# --------------------------------------------------------------------------- encoding


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


class BPE:
    """A learned list of merges that encodes words into pieces and decodes pieces into words.

    ``BPE.learn(sentences, num_merges)`` learns from token lists (:func:`learn_merges`);
    ``BPE(merges)`` wraps merges learned elsewhere (e.g. :func:`learn_merges_tokenizers`).
    :meth:`encode` maps a token list to a piece list, :meth:`decode` maps it back::

        bpe.encode(["the", "lowest"])          -> ["the</w>", "low", "est</w>"]
        bpe.decode(["the</w>", "low", "est</w>"]) -> ["the", "lowest"]
    """

    def __init__(self, merges: Sequence[Merge]):
        merges = [tuple(m) for m in merges]
        for k, m in enumerate(merges):
            if len(m) != 2 or not all(isinstance(s, str) and s for s in m):
                raise ValueError(f"BPE: merge {k} must be a pair of non-empty str, got {m!r}")
        ranks: dict[Merge, int] = {}
        for k, m in enumerate(merges):
            ranks.setdefault(m, k)  # a pair learned twice (it can come back, rarely) keeps its first rank
        self.merges: list[Merge] = merges
        self.ranks = ranks
        self._cache: dict[str, list[str]] = {}

    @classmethod
    def learn(cls, sentences: Iterable[Sequence[str]], num_merges: int, min_frequency: int = 2) -> BPE:
        """Learn ``num_merges`` merges from ``sentences`` (lists of tokens) with :func:`learn_merges`."""
        return cls(learn_merges(word_counts(sentences), num_merges, min_frequency))

    def __len__(self) -> int:
        return len(self.merges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPE) and self.merges == other.merges

    def __repr__(self) -> str:
        return f"BPE({len(self.merges)} merges, first {self.merges[:3]})"

    def encode_word(self, word: str) -> list[str]:
        """The pieces of one word, equal to :func:`apply_merges` with these merges.

        Repeatedly merges the adjacent pair learned earliest among those present (all its
        occurrences, left to right). Results are cached per word.
        """
        cached = self._cache.get(word)
        if cached is not None:
            return list(cached)
        _check_word(word, "BPE.encode_word")
        symbols = split_word(word)
        while len(symbols) > 1:
            never = len(self.ranks)  # the rank of a pair that is not a merge
            rank, pair = min((self.ranks.get(p, never), p) for p in zip(symbols, symbols[1:], strict=False))
            if rank == never:
                break
            symbols = merge_pair(symbols, pair)
        self._cache[word] = symbols
        return list(symbols)

    def encode(self, tokens: Sequence[str]) -> list[str]:
        """The pieces of a token list (e.g. ``tokenize(text)``), word after word."""
        if isinstance(tokens, str):
            raise TypeError("BPE.encode: expected a list of tokens, got a str (tokenize first)")
        return [piece for word in tokens for piece in self.encode_word(word)]

    @staticmethod
    def decode(pieces: Iterable[str]) -> list[str]:
        """Join pieces back into words: a word ends with the piece that ends with ``"</w>"``.

        Pieces after the last ``"</w>"`` (an unfinished word, as a model may output) form a last
        word. Special tokens such as ``<unk>`` count as whole words.
        """
        words: list[str] = []
        current = ""
        for piece in pieces:
            if piece in SPECIAL_TOKENS:
                if current:  # a special token ends an unfinished word
                    words.append(current)
                    current = ""
                words.append(piece)
            elif piece.endswith(END_OF_WORD):
                words.append(current + piece[: -len(END_OF_WORD)])
                current = ""
            else:
                current += piece
        if current:
            words.append(current)
        return words

    def to_dict(self) -> dict:
        """``{"merges": [[left, right], ...]}``: safe to store in a checkpoint or JSON."""
        return {"merges": [list(m) for m in self.merges]}

    @classmethod
    def from_dict(cls, d: dict) -> BPE:
        if not isinstance(d, dict) or "merges" not in d:
            raise ValueError("BPE.from_dict: expected a dict with a 'merges' list")
        return cls([tuple(m) for m in d["merges"]])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BPE:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- a text pipeline


class SubwordTokenizer:
    """Text <-> subword pieces: :func:`tfmlib.data.tokenize`, then :meth:`BPE.encode`; back with
    :meth:`BPE.decode`, then :func:`tfmlib.data.detokenize`.

    A drop-in for :class:`tfmlib.data.WordTokenizer` wherever the book takes a ``tokenizer``
    (:class:`~tfmlib.data.TranslationDataset`, :func:`tfmlib.decoding.translate`,
    :func:`tfmlib.decoding.evaluate_translator`). ``text(tokens(s))`` is ``s`` (lowercased), since
    both steps are lossless::

        tok = SubwordTokenizer(BPE.learn(sentences, 8000))
        tok.tokens("A t-shirt.")  -> ["a</w>", "t</w>", "@-@</w>", "sh", "irt</w>", ".</w>"]  (say)
        tok.text(tok.tokens("A t-shirt."))  -> "a t-shirt."
    """

    def __init__(self, bpe: BPE, lowercase: bool = True):
        if not isinstance(bpe, BPE):
            raise TypeError(f"SubwordTokenizer: expected a BPE, got {type(bpe).__name__}")
        self.bpe = bpe
        self.lowercase = lowercase

    def tokens(self, text: str) -> list[str]:
        """The pieces of ``text``."""
        return self.bpe.encode(tokenize(text, self.lowercase))

    def text(self, tokens: Sequence[str]) -> str:
        """Pieces back to text (an unfinished last word is kept as it is)."""
        return detokenize(self.bpe.decode(tokens))

    def __repr__(self) -> str:
        return f"SubwordTokenizer({self.bpe!r}, lowercase={self.lowercase})"


def learn_shared(pairs: Sequence[tuple[str, str]], num_merges: int, min_frequency: int = 2,
                 lowercase: bool = True,
                 learn: Callable[[Mapping[str, int], int, int], list[Merge]] = learn_merges,
                 ) -> tuple[SubwordTokenizer, Vocab]:
    """One BPE and one vocabulary for both sides of translation ``pairs`` (Vaswani et al. 2017,
    section 5.1: "a shared source-target vocabulary").

    Merges are learned by ``learn(counts, num_merges, min_frequency)`` (:func:`learn_merges`, or
    :func:`learn_merges_tokenizers` to let the library do it: the same merges) from the words of
    sources and targets together; the vocabulary holds every piece the encoded training pairs use
    (most frequent first, as :meth:`Vocab.build` orders). Returns ``(tokenizer, vocab)``; pass
    ``vocab`` as both ``src_vocab`` and ``tgt_vocab``.
    """
    if len(pairs) == 0:
        raise ValueError("learn_shared: no pairs")
    sentences = [tokenize(text, lowercase) for pair in pairs for text in pair]
    bpe = BPE(learn(word_counts(sentences), num_merges, min_frequency))
    vocab = Vocab.build(bpe.encode(s) for s in sentences)
    return SubwordTokenizer(bpe, lowercase), vocab

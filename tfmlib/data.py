"""Text to tensors: tokenizer, vocabulary, padding with masks, and bucket-by-length batching
(a fixed number of sentences per batch, or about a fixed number of tokens).

Introduced in chapter 00 (preface); used by every chapter that trains on text.

Conventions used throughout the book:

* A *pair* is ``(source_text, target_text)``, two plain strings.
* Token ids: ``PAD=0``, ``BOS=1`` (start), ``EOS=2`` (end), ``UNK=3`` (unknown) in every vocabulary.
* A *mask* is a ``bool`` tensor that is ``True`` at real tokens and ``False`` at padding.
* ``detokenize(tokenize(s))`` gives ``s`` back (lowercased; a run of spaces as one): punctuation spaced
  otherwise than the defaults carries a mark (``"t-shirt"`` -> ``"t", "@-@", "shirt"``), so BLEU
  scores translations against references the pipeline has not changed.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

INTRODUCED_IN = 0

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

Pair = tuple[str, str]

# Words (keeping an elided French article or pronoun with its apostrophe, "l'", "n'", "qu'", when a
# letter follows it), numbers, and single punctuation marks.
_TOKEN_RE = re.compile(r"[^\W\d_]+['\u2019](?=[^\W\d_])|\w+|[^\w\s]", re.UNICODE)
_ELISION_RE = re.compile(r"[^\W\d_]+['\u2019]", re.UNICODE)
_WORD_CHAR_RE = re.compile(r"\w", re.UNICODE)
_ODD_SPACES = str.maketrans({"\u202f": " ", "\u00a0": " ", "\u2009": " "})

#: The two marks :func:`tokenize` writes on a punctuation token whose spacing is not the default:
#: ``JOIN`` on a side that touches its neighbour (``"t-shirt"`` -> ``"t", "@-@", "shirt"``, as
#: the Moses tokenizer writes hyphens) and ``SPACE`` on a side with a space where
#: :func:`detokenize` would put none (French ``"qui ?"`` -> ``"qui", "▁?"``).
JOIN, SPACE = "@", "\u2581"
_MARKS = (JOIN, SPACE)
# By default detokenize puts a space between two tokens, except before these ...
_NO_SPACE_BEFORE = frozenset(".,!?;:)]}\u2026")
# ... after these, and after an elision ("l'", "qu'", "it'" of "it's").
_NO_SPACE_AFTER = frozenset("([{")
_APOSTROPHES = ("'", "\u2019")


def _default_spaced(prev: str, tok: str) -> bool:
    """Whether :func:`detokenize` puts a space between unmarked tokens ``prev`` and ``tok``."""
    return not (tok in _NO_SPACE_BEFORE or prev in _NO_SPACE_AFTER
                or (prev[-1:] in _APOSTROPHES and _ELISION_RE.fullmatch(prev) is not None))


def _is_punctuation(token: str) -> bool:
    """One character that is neither a word character nor a space (what ``[^\\w\\s]`` matches)."""
    return len(token) == 1 and not token.isspace() and _WORD_CHAR_RE.match(token) is None


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """Split ``text`` into word and punctuation tokens that :func:`detokenize` joins back exactly.

    ``"L'homme ne voit pas le chat."`` -> ``["l'", "homme", "ne", "voit", "pas", "le", "chat", "."]``.
    Words are runs of letters and digits; an elided article or pronoun keeps its apostrophe when a
    letter follows (``"l'"``, ``"qu'"``, and ``"it'"`` of ``"it's"``); every other character is a
    token of its own. Narrow and non-breaking spaces (common before French punctuation) count as
    spaces; the typographic apostrophe ``’`` stays as it is (``"l’"`` and ``"l'"`` are different
    tokens), so that the text comes back unchanged.

    **The round trip loses nothing**: ``detokenize(tokenize(s)) == s.lower()`` (``s`` itself with
    ``lowercase=False``) for any ``s`` whose spaces are single plain spaces, with no space at
    either end. :func:`detokenize` puts a space between two tokens except before ``. , ! ? ; : ) ] }
    …``, after ``( [ {`` and after an elision; where the text is spaced otherwise, the punctuation
    token at that place carries a mark on that side: :data:`JOIN` (``"@"``) where it touches its
    neighbour, :data:`SPACE` (``"▁"``) where a space separates them::

        "a t-shirt costs 3.50."  -> ["a", "t", "@-@", "shirt", "costs", "3", ".@", "50", "."]
        'she said "hi."'         -> ["she", "said", '"@', "hi", ".", '@"']
        "qui ?"                  -> ["qui", "▁?"]

    Why marks and not bigger tokens (``"t-shirt"``, ``"3.50"`` kept whole): the parts stay the
    words a vocabulary already has (``"blond @-@ haired"`` shares ``blond`` and ``haired``), one
    rule covers every case (hyphens, decimals, times, quotes, brackets, French spacing, typing
    errors such as ``"longue ."``) without a list of patterns to keep up to date, and text spaced
    as the defaults say (the bundled corpus: words, elisions, a final period) gets no mark at all,
    so its tokens are those of the plain word tokenizer. Moses' tokenizer writes hyphens inside
    words the same way (``@-@``, its ``-a`` option). A mark goes on the token after the place when
    that token is punctuation, otherwise on the token before it (which then is: two words are
    always separated by a space or by an elision's apostrophe). A token that is itself ``"@"`` or
    ``"▁"`` gets both sides marked when it gets one, so a two-character token never reads two
    ways.
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize: text must be a str, got {type(text).__name__}")
    text = text.translate(_ODD_SPACES)
    if lowercase:
        text = text.lower()
    found = list(_TOKEN_RE.finditer(text))
    bases = [m.group() for m in found]
    spaced = [False] + [found[i].start() > found[i - 1].end() for i in range(1, len(found))]
    marks: dict[int, list[str]] = {}  # token index -> [left mark, right mark], for the few marked
    for i in range(1, len(bases)):
        if spaced[i] == _default_spaced(bases[i - 1], bases[i]):
            continue
        mark = SPACE if spaced[i] else JOIN
        if _is_punctuation(bases[i]):
            marks.setdefault(i, ["", ""])[0] = mark
        else:  # a word after the place: the token before it is punctuation (see the docstring)
            marks.setdefault(i - 1, ["", ""])[1] = mark
    tokens = bases
    for i, (left, right) in marks.items():
        if bases[i] in _MARKS:  # "@" or "▁" itself: mark both sides
            left = left or (SPACE if spaced[i] else JOIN)
            right = right or (SPACE if i + 1 < len(bases) and spaced[i + 1] else JOIN)
        tokens[i] = left + bases[i] + right
    return tokens


def split_marks(token: str) -> tuple[str, str, str]:
    """``(left_mark, token_without_marks, right_mark)`` of a token written by :func:`tokenize`.

    ``"@-@"`` -> ``("@", "-", "@")``, ``"▁?"`` -> ``("▁", "?", "")``, ``"chat"`` ->
    ``("", "chat", "")``. A mark is :data:`JOIN` or :data:`SPACE`; only tokens of two or three
    characters around one punctuation character carry marks (words never contain ``@`` or ``▁``).
    """
    if len(token) == 3 and token[0] in _MARKS and token[2] in _MARKS:
        return token[0], token[1], token[2]
    if len(token) == 2 and token[0] in _MARKS:
        return token[0], token[1], ""
    if len(token) == 2 and token[1] in _MARKS:
        return "", token[0], token[1]
    return "", token, ""


def detokenize(tokens: Iterable[str]) -> str:
    """Join tokens back into text, the inverse of :func:`tokenize`.

    A space goes between two tokens except before ``. , ! ? ; : ) ] } …``, after ``( [ {`` and
    after an elision (``"l'"``), unless a mark says otherwise: :data:`JOIN` (``"@"``) on the
    facing side of either token joins them, :data:`SPACE` (``"▁"``) separates them (the mark on
    the later token wins if both carry one). Marks themselves are dropped:
    ``["a", "t", "@-@", "shirt", "."]`` -> ``"a t-shirt."``.
    """
    out: list[str] = []
    prev, prev_right = "", ""
    for i, tok in enumerate(tokens):
        left, base, right = split_marks(tok)
        if i > 0:
            mark = left or prev_right
            if (mark == SPACE) if mark else _default_spaced(prev, base):
                out.append(" ")
        out.append(base)
        prev, prev_right = base, right
    return "".join(out)


class Tokenizer(Protocol):
    """A text pipeline, both ways: what :class:`TranslationDataset` and
    :func:`tfmlib.decoding.translate` need of one (:func:`check_tokenizer` checks it at run time)."""

    def tokens(self, text: str) -> list[str]:
        """``text`` as a list of tokens."""
        ...

    def text(self, tokens: Sequence[str]) -> str:
        """A list of tokens as text; ``text(tokens(s))`` gives ``s`` back (lowercased)."""
        ...


class WordTokenizer:
    """Text <-> tokens as the book does it from chapter 00: :func:`tokenize` and :func:`detokenize`.

    The default text pipeline of :class:`TranslationDataset` and :func:`tfmlib.decoding.translate`.
    Another pipeline (e.g. :class:`tfmlib.bpe.SubwordTokenizer`, subword pieces) is any object
    with the same two methods, ``tokens(text) -> list[str]`` and ``text(tokens) -> str``, such that
    ``text(tokens(s))`` gives ``s`` back (lowercased).
    """

    def __init__(self, lowercase: bool = True):
        self.lowercase = lowercase

    def tokens(self, text: str) -> list[str]:
        """``text`` as a list of tokens (:func:`tokenize`)."""
        return tokenize(text, self.lowercase)

    def text(self, tokens: Sequence[str]) -> str:
        """A list of tokens as text (:func:`detokenize`)."""
        return detokenize(tokens)

    def __repr__(self) -> str:
        return f"WordTokenizer(lowercase={self.lowercase})"


def check_tokenizer(tokenizer: object, who: str) -> None:
    """Raise ``TypeError`` unless ``tokenizer`` has callable ``tokens`` and ``text`` methods."""
    for name in ("tokens", "text"):
        if not callable(getattr(tokenizer, name, None)):
            raise TypeError(f"{who}: tokenizer must have methods tokens(text) and text(tokens) "
                            f"(like tfmlib.data.WordTokenizer); {type(tokenizer).__name__} has no {name}()")


class Vocab:
    """A token <-> id mapping with the four special tokens at ids 0..3.

    Unknown tokens map to ``UNK_ID`` on lookup. Build one with :meth:`Vocab.build`, save it with
    :meth:`save` (JSON) and read it back with :meth:`Vocab.load`.
    """

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        if tokens[: len(SPECIAL_TOKENS)] != list(SPECIAL_TOKENS):
            raise ValueError(
                f"Vocab: the first tokens must be {list(SPECIAL_TOKENS)}, got {tokens[:4]}"
            )
        if len(set(tokens)) != len(tokens):
            dupes = [t for t, c in Counter(tokens).items() if c > 1][:5]
            raise ValueError(f"Vocab: duplicate tokens {dupes}")
        self.itos: list[str] = tokens
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(tokens)}

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        min_freq: int = 1,
        max_size: int | None = None,
    ) -> Vocab:
        """Count tokens and keep those seen at least ``min_freq`` times (most frequent first).

        ``max_size`` caps the total size, special tokens included. Ties are broken alphabetically
        so the same data always gives the same ids.
        """
        if min_freq < 1:
            raise ValueError(f"Vocab.build: min_freq must be >= 1, got {min_freq}")
        counts: Counter[str] = Counter()
        for toks in token_lists:
            if isinstance(toks, str):
                raise TypeError("Vocab.build: expected lists of tokens, got a str (tokenize first)")
            counts.update(toks)
        words = sorted(
            (w for w, c in counts.items() if c >= min_freq and w not in SPECIAL_TOKENS),
            key=lambda w: (-counts[w], w),
        )
        if max_size is not None:
            if max_size < len(SPECIAL_TOKENS):
                raise ValueError(f"Vocab.build: max_size must be >= 4, got {max_size}")
            words = words[: max_size - len(SPECIAL_TOKENS)]
        return cls(list(SPECIAL_TOKENS) + words)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __iter__(self) -> Iterator[str]:
        """The tokens in id order. (Without it, Python would iterate by calling ``vocab[0]``,
        ``vocab[1]``, ... which look up *tokens* and return ``UNK_ID`` forever.)"""
        return iter(self.itos)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, UNK_ID)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, first={self.itos[4:9]})"

    def encode(self, tokens: Sequence[str], bos: bool = False, eos: bool = False) -> list[int]:
        """Token list -> id list (unknown tokens -> ``UNK_ID``), optionally wrapped in BOS/EOS."""
        if isinstance(tokens, str):
            raise TypeError("Vocab.encode: expected a list of tokens, got a str (tokenize first)")
        ids = [self.stoi.get(t, UNK_ID) for t in tokens]
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

    def decode(self, ids: Iterable[int] | torch.Tensor, strip_special: bool = True) -> list[str]:
        """Id list -> token list. With ``strip_special``, stops at EOS and drops PAD/BOS."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"Vocab.decode: expected a 1-D tensor, got shape {tuple(ids.shape)}")
            if ids.is_floating_point() or ids.dtype == torch.bool:
                raise TypeError(f"Vocab.decode: token ids must be integers, got dtype {ids.dtype}")
            ids = ids.tolist()
        out = []
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool):
                raise TypeError(f"Vocab.decode: token ids must be ints, got {i!r} ({type(i).__name__})")
            if not 0 <= i < len(self.itos):
                raise IndexError(f"Vocab.decode: id {i} outside the vocabulary (size {len(self)})")
            if strip_special:
                if i == EOS_ID:
                    break
                if i in (PAD_ID, BOS_ID):
                    continue
            out.append(self.itos[i])
        return out

    def to_dict(self) -> dict:
        """A plain ``{"tokens": [...]}`` dict: safe to store in a checkpoint or JSON."""
        return {"tokens": list(self.itos)}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        if not isinstance(d, dict) or "tokens" not in d:
            raise ValueError("Vocab.from_dict: expected a dict with a 'tokens' list")
        return cls(d["tokens"])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def build_vocabs(pairs: Sequence[Pair], min_freq: int = 1, lowercase: bool = True) -> tuple[Vocab, Vocab]:
    """Source and target vocabularies of translation ``pairs`` (``min_freq`` as in :meth:`Vocab.build`)."""
    if len(pairs) == 0:
        raise ValueError("build_vocabs: no pairs")
    src = Vocab.build((tokenize(s, lowercase) for s, _ in pairs), min_freq=min_freq)
    tgt = Vocab.build((tokenize(t, lowercase) for _, t in pairs), min_freq=min_freq)
    return src, tgt


# --------------------------------------------------------------------------- files of pairs


def read_pairs_tsv(path: str | Path) -> list[Pair]:
    """Read ``source<TAB>target`` lines (plain or ``.gz``). Extra columns are ignored.

    Raises ``ValueError`` naming the file and line for a line without a tab.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    pairs = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line:
                continue
            cols = line.split("\t")
            if len(cols) < 2:
                raise ValueError(f"{path}:{lineno}: expected 'source<TAB>target', got {line[:60]!r}")
            pairs.append((cols[0], cols[1]))
    return pairs


def write_pairs_tsv(path: str | Path, pairs: Iterable[Pair]) -> None:
    """Write pairs as ``source<TAB>target`` lines; ``.gz`` paths are gzipped reproducibly (mtime 0)."""
    path = Path(path)
    pairs = list(pairs)
    for i, (s, t) in enumerate(pairs):
        if "\t" in s + t or "\n" in s + t:
            raise ValueError(f"write_pairs_tsv: pair {i} contains a tab or newline ({path})")
    data = "".join(f"{s}\t{t}\n" for s, t in pairs).encode("utf-8")
    if path.suffix == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(data)
        data = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# --------------------------------------------------------------------------- batches


def as_id_list(seq: Sequence[int] | torch.Tensor, who: str, what: str) -> list[int]:
    """``seq`` (a 1-D integer tensor or a sequence of ints) as a list of ints.

    Raises ``TypeError`` for non-integer ids and ``ValueError`` for a tensor that is not 1-D,
    naming ``who`` (the function) and ``what`` (e.g. ``"sequence 2"``).
    """
    if isinstance(seq, torch.Tensor):
        if seq.dim() != 1:
            raise ValueError(f"{who}: {what} must be a 1-D tensor of token ids, got shape "
                             f"{tuple(seq.shape)}")
        if seq.is_floating_point() or seq.is_complex() or seq.dtype == torch.bool:
            raise TypeError(f"{who}: {what} holds non-integer token ids (dtype {seq.dtype})")
        return seq.tolist()
    if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
        raise TypeError(f"{who}: {what} must be a list of token ids, got {type(seq).__name__}")
    if any(not isinstance(t, int) or isinstance(t, bool) for t in seq):
        raise TypeError(f"{who}: {what} holds non-integer token ids")
    return list(seq)


def pad_sequences(
    seqs: Sequence[Sequence[int] | torch.Tensor], pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad ``batch`` id lists (or 1-D integer tensors) of lengths ``L_i`` to ``max_len = max L_i``.

    Returns ``ids`` of shape ``(batch, max_len)`` (``long``) and ``mask`` of the same shape
    (``bool``, ``True`` at real tokens). Raises ``ValueError`` for an empty batch, an empty
    sequence or a tensor that is not 1-D, and ``TypeError`` for non-integer ids.
    """
    if len(seqs) == 0:
        raise ValueError("pad_sequences: empty batch (no sequences)")
    lists = [as_id_list(s, "pad_sequences", f"sequence {i}") for i, s in enumerate(seqs)]
    lengths = [len(s) for s in lists]
    if min(lengths) == 0:
        raise ValueError(f"pad_sequences: sequence {lengths.index(0)} is empty")
    ids = torch.full((len(lists), max(lengths)), pad_id, dtype=torch.long)
    for i, s in enumerate(lists):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    mask = torch.arange(ids.shape[1])[None, :] < torch.as_tensor(lengths)[:, None]
    return ids, mask


@dataclass(frozen=True)
class HostFacts:
    """What :func:`make_batch` learned about a batch's values while it was still on the CPU.

    Reading a value back from a GPU makes the host wait for the device; a batch's token count, its
    source lengths and its id range are known for free while the batch is being made from lists
    of ints, so they travel with the :class:`Batch` instead of being read back at every step.

    * ``shapes``: the shapes of ``src`` and ``tgt_in`` these facts describe (checked before use);
    * ``src_lengths``: each source's length (EOS included), the row sums of ``src_mask``;
    * ``num_target_tokens``: the real tokens of ``tgt_out`` (the sum of ``tgt_mask``);
    * ``src_ids``, ``tgt_ids``: the smallest and largest id in ``src`` and in ``tgt_in``.
    """

    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    src_lengths: tuple[int, ...]
    num_target_tokens: int
    src_ids: tuple[int, int]
    tgt_ids: tuple[int, int]

    def describe(self, batch: Batch) -> bool:
        """Whether these facts are about ``batch``'s tensors (their shapes match)."""
        return self.shapes == (tuple(batch.src.shape), tuple(batch.tgt_in.shape))


@dataclass
class Batch:
    """A padded batch of translation pairs.

    * ``src``: ``(B, S)`` source ids, ``src_mask``: ``(B, S)`` bool, ``src_lengths``: ``(B,)``.
    * ``tgt_in``: ``(B, T)`` target ids starting with BOS (what the decoder reads),
      ``tgt_out``: ``(B, T)`` the same shifted left, ending with EOS (what it must predict),
      ``tgt_mask``: ``(B, T)`` bool, ``True`` where ``tgt_out`` is a real token.
    * ``host``: :class:`HostFacts` counted on the CPU by :func:`make_batch` (``None`` for a batch
      built by hand); :meth:`to` keeps them, so a batch on a GPU answers
      :attr:`num_target_tokens` without waiting for the device.
    """

    src: torch.Tensor
    src_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_mask: torch.Tensor
    host: HostFacts | None = field(default=None, repr=False, compare=False)

    @property
    def src_lengths(self) -> torch.Tensor:
        return self.src_mask.sum(dim=1)

    @property
    def host_facts(self) -> HostFacts | None:
        """:attr:`host` when it describes this batch's tensors (``None`` otherwise)."""
        return self.host if self.host is not None and self.host.describe(self) else None

    @property
    def num_target_tokens(self) -> int:
        facts = self.host_facts
        return facts.num_target_tokens if facts is not None else int(self.tgt_mask.sum())

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(getattr(self, f).to(device) for f in
                       ("src", "src_mask", "tgt_in", "tgt_out", "tgt_mask")), host=self.host)


def make_batch(examples: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Batch:
    """Collate ``(source_ids, target_ids)`` examples (without BOS/EOS) into a :class:`Batch`.

    Use it as a ``DataLoader``'s ``collate_fn``. The source gets EOS appended; the target is
    split into ``tgt_in = [BOS] + y`` and ``tgt_out = y + [EOS]``. With ``B`` examples the
    batch holds ``src``/``src_mask`` ``(B, S)`` with ``S = 1 + longest source`` and
    ``tgt_in``/``tgt_out``/``tgt_mask`` ``(B, T)`` with ``T = 1 + longest target``. Ids may be
    lists of ints or 1-D integer tensors. The batch carries :class:`HostFacts` (lengths, token
    count, id ranges) counted here, on the CPU.
    """
    if len(examples) == 0:
        raise ValueError("make_batch: empty batch")
    srcs, tgts = [], []
    for i, example in enumerate(examples):
        if not isinstance(example, (tuple, list)) or len(example) != 2:
            raise TypeError(f"make_batch: example {i} must be a (source_ids, target_ids) pair, "
                            f"got {type(example).__name__}")
        srcs.append(as_id_list(example[0], "make_batch", f"source of example {i}"))
        tgts.append(as_id_list(example[1], "make_batch", f"target of example {i}"))
    src, src_mask = pad_sequences([s + [EOS_ID] for s in srcs])
    tgt_in, _ = pad_sequences([[BOS_ID] + t for t in tgts])
    tgt_out, tgt_mask = pad_sequences([t + [EOS_ID] for t in tgts])
    src_lengths = tuple(len(s) + 1 for s in srcs)
    padded_src = min(src_lengths) < src.shape[1]
    padded_tgt = min(len(t) for t in tgts) + 1 < tgt_in.shape[1]
    src_ids = [i for s in srcs for i in s] + [EOS_ID] + ([PAD_ID] if padded_src else [])
    tgt_ids = [i for t in tgts for i in t] + [BOS_ID] + ([PAD_ID] if padded_tgt else [])
    facts = HostFacts(shapes=(tuple(src.shape), tuple(tgt_in.shape)), src_lengths=src_lengths,
                      num_target_tokens=sum(len(t) + 1 for t in tgts),
                      src_ids=(min(src_ids), max(src_ids)), tgt_ids=(min(tgt_ids), max(tgt_ids)))
    return Batch(src, src_mask, tgt_in, tgt_out, tgt_mask, host=facts)


class TranslationDataset(torch.utils.data.Dataset):
    """Pairs of texts, tokenized and encoded once: item ``i`` is ``(source_ids, target_ids)``.

    ``tokenizer`` turns a text into tokens (default :class:`WordTokenizer` with ``lowercase``;
    :class:`tfmlib.bpe.SubwordTokenizer` for subword pieces).
    """

    def __init__(self, pairs: Sequence[Pair], src_vocab: Vocab, tgt_vocab: Vocab,
                 lowercase: bool = True, tokenizer: Tokenizer | None = None):
        if len(pairs) == 0:
            raise ValueError("TranslationDataset: no pairs")
        if tokenizer is None:
            tokenizer = WordTokenizer(lowercase)
        check_tokenizer(tokenizer, "TranslationDataset")
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.examples = [
            (src_vocab.encode(tokenizer.tokens(s)), tgt_vocab.encode(tokenizer.tokens(t)))
            for s, t in pairs
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.examples[i]

    def lengths(self) -> list[int]:
        """Length of each example (the longer of source and target), for bucketing."""
        return [max(len(s), len(t)) for s, t in self.examples]


def _check_epoch(epoch: int, who: str) -> int:
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"{who}.set_epoch: epoch must be an int >= 0, got {epoch!r}")
    return epoch


class BucketBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields batches of indices whose sequences have similar lengths.

    Shuffle the indices, cut them into pools of ``batch_size * pool_factor``, sort each pool by
    length, cut it into batches, then shuffle the batches. Batches are nearly homogeneous in
    length (little padding) and still random from epoch to epoch. With ``shuffle=False`` the
    order is the sorted order, which is what evaluation wants.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, shuffle: bool = True,
                 pool_factor: int = 50, drop_last: bool = False, seed: int = 0):
        for name, value in (("batch_size", batch_size), ("pool_factor", pool_factor)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BucketBatchSampler: {name} must be an int >= 1, got {value!r}")
        if len(lengths) == 0:
            raise ValueError("BucketBatchSampler: no lengths (empty dataset)")
        self.lengths = list(lengths)
        self.batch_size, self.shuffle = batch_size, shuffle
        self.pool_factor, self.drop_last, self.seed = pool_factor, drop_last, seed
        self.epoch = 0

    def _batches(self) -> list[list[int]]:
        idx = list(range(len(self.lengths)))
        if not self.shuffle:
            idx.sort(key=lambda i: self.lengths[i])
            chunks = [idx[i:i + self.batch_size] for i in range(0, len(idx), self.batch_size)]
        else:
            rng = random.Random(self.seed + self.epoch)
            rng.shuffle(idx)
            pool = self.batch_size * self.pool_factor
            chunks = []
            for p in range(0, len(idx), pool):
                part = sorted(idx[p:p + pool], key=lambda i: self.lengths[i])
                chunks += [part[i:i + self.batch_size] for i in range(0, len(part), self.batch_size)]
            rng.shuffle(chunks)
        if self.drop_last:
            chunks = [c for c in chunks if len(c) == self.batch_size]
        return chunks

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches()
        self.epoch += 1  # a new order next epoch, reproducible from the seed
        return iter(batches)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration yield the order of ``epoch`` (the order depends only on
        ``seed`` and ``epoch``; each iteration still advances ``epoch`` by one). A resumed run
        uses it to replay an epoch's order, as with torch's ``DistributedSampler.set_epoch``."""
        self.epoch = _check_epoch(epoch, "BucketBatchSampler")

    def __len__(self) -> int:
        n = len(self.lengths)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)


class TokenBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields batches of indices holding about ``max_tokens`` padded tokens each.

    The batch size follows the sentence length: many short sentences or a few long ones, so
    that every step does about the same work (what Vaswani et al. 2017 do, section 5.1: "each
    training batch contained a set of sentence pairs containing approximately 25000 source tokens
    and 25000 target tokens"). As in :class:`BucketBatchSampler`: shuffle the indices, cut them
    into pools of ``pool_size``, sort each pool by length and cut it, here greedily, into batches
    whose padded size ``len(batch) * (1 + longest length)`` (BOS/EOS included) stays within
    ``max_tokens``; then shuffle the batches. ``shuffle=False`` gives the sorted order.

    Raises ``ValueError`` for an example that alone exceeds ``max_tokens`` (name its index).
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int, shuffle: bool = True,
                 pool_size: int = 4096, seed: int = 0):
        for name, value in (("max_tokens", max_tokens), ("pool_size", pool_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TokenBatchSampler: {name} must be an int >= 1, got {value!r}")
        if len(lengths) == 0:
            raise ValueError("TokenBatchSampler: no lengths (empty dataset)")
        self.lengths = list(lengths)
        too_long = [i for i, n in enumerate(self.lengths) if n + 1 > max_tokens]
        if too_long:
            i = too_long[0]
            raise ValueError(f"TokenBatchSampler: example {i} has {self.lengths[i] + 1} tokens with BOS/EOS, "
                             f"more than max_tokens={max_tokens}")
        self.max_tokens, self.shuffle, self.pool_size, self.seed = max_tokens, shuffle, pool_size, seed
        self.epoch = 0

    def _cut(self, ordered: list[int]) -> list[list[int]]:
        batches, batch, longest = [], [], 0
        for i in ordered:
            n = self.lengths[i] + 1
            if batch and (len(batch) + 1) * max(longest, n) > self.max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, n)
        if batch:
            batches.append(batch)
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of ``epoch`` (the same for the same seed and epoch)."""
        idx = list(range(len(self.lengths)))
        if not self.shuffle:
            idx.sort(key=lambda i: self.lengths[i])
            return self._cut(idx)
        rng = random.Random(self.seed + epoch)
        rng.shuffle(idx)
        chunks = []
        for p in range(0, len(idx), self.pool_size):
            chunks += self._cut(sorted(idx[p:p + self.pool_size], key=lambda i: self.lengths[i]))
        rng.shuffle(chunks)
        return chunks

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self.epoch)
        self.epoch += 1
        return iter(batches)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration yield ``batches(epoch)`` (each iteration still advances
        ``epoch`` by one); see :meth:`BucketBatchSampler.set_epoch`."""
        self.epoch = _check_epoch(epoch, "TokenBatchSampler")

    def __len__(self) -> int:
        return len(self.batches(self.epoch))


def make_token_loader(dataset: TranslationDataset, max_tokens: int, shuffle: bool = True,
                      seed: int = 0) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` of :class:`Batch` objects of about ``max_tokens`` padded tokens each
    (:class:`TokenBatchSampler`), bucketed by length."""
    sampler = TokenBatchSampler(dataset.lengths(), max_tokens, shuffle=shuffle, seed=seed)
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=make_batch)


def padding_fraction(batches: Iterable[Sequence[int]], lengths: Sequence[int]) -> float:
    """Fraction of the padded ``(batch, max_len)`` grids that is padding, over all batches.

    ``batches`` holds lists of indices into ``lengths`` (what :class:`BucketBatchSampler` yields).
    Raises ``ValueError`` for no batches or an empty batch.
    """
    real = total = 0
    for k, b in enumerate(batches):
        if len(b) == 0:
            raise ValueError(f"padding_fraction: batch {k} is empty")
        lens = [lengths[i] for i in b]
        real += sum(lens)
        total += max(lens) * len(lens)
    if total == 0:
        raise ValueError("padding_fraction: no batches")
    return 1 - real / total


def make_loader(dataset: TranslationDataset, batch_size: int, shuffle: bool = True,
                seed: int = 0) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` of :class:`Batch` objects, bucketed by length."""
    sampler = BucketBatchSampler(dataset.lengths(), batch_size, shuffle=shuffle, seed=seed)
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=make_batch)

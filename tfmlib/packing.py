"""Packed language-model batches: fixed-length blocks cut from one stream of sentences, no padding.

Introduced in chapter 10 (scaling up: fused attention, mixed precision, ``torch.compile``,
several processes with ``torchrun``).

Chapter 09 trained its language model on padded batches of sentences (``tfmlib.rnn.collate_lm``):
every slot past a sentence's end is a ``PAD`` that the loss ignores but the model still computes.
GPT-2 and nanoGPT train differently: the sentences are joined, each followed by ``EOS``, into one
long stream of token ids, and the stream is cut into rows of ``block_len + 1`` tokens. Row ``i``
gives ``inputs = row[:-1]`` and ``targets = row[1:]`` (``block_len`` tokens each, the targets
shifted by one), so every position of every batch is a real next-token prediction: no padding,
every batch the same shape (which ``torch.compile`` and the GPU like), and tokens per step known
in advance (``batch * block_len``), which throughput accounting needs.

Two consequences, both accepted by the usual recipe: a block may start in the middle of a
sentence and span the end of one sentence and the start of the next (the model attends across
the ``EOS``; it learns that what follows ``EOS`` is a new sentence); and the tail of the stream
that does not fill a whole row is dropped (fewer than ``block_len + 1`` tokens; counted in
:attr:`PackedBlocks.dropped`).

Shapes: ``N`` blocks, ``L`` = ``block_len``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from tfmlib.data import EOS_ID, PAD_ID, Vocab, tokenize
from tfmlib.synthetic import load_bundled

INTRODUCED_IN = 10

__all__ = ["PackedBlocks", "bundled_english_blocks", "pack_sequences", "packed_stream"]


def packed_stream(seqs: Sequence[Sequence[int]], *, eos_id: int = EOS_ID) -> list[int]:
    """The sentences joined into one list of ids, ``eos_id`` after each one.

    ``ValueError`` for no sentences, an empty sentence, or a ``PAD`` id inside a sentence (a packed
    target that is ``PAD`` would silently drop out of :func:`tfmlib.rnn.lm_loss`).
    """
    return _stream(seqs, eos_id, "packed_stream")


def _stream(seqs: Sequence[Sequence[int]], eos_id: int, who: str) -> list[int]:
    """:func:`packed_stream`, its errors naming ``who`` (the public function called)."""
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Sequence):
        raise TypeError(f"{who}: seqs must be a sequence of id sequences, got {type(seqs).__name__}")
    if len(seqs) == 0:
        raise ValueError(f"{who}: seqs is empty (nothing to pack)")
    stream: list[int] = []
    for i, seq in enumerate(seqs):
        ids = seq.tolist() if isinstance(seq, Tensor) else list(seq)
        if not ids:
            raise ValueError(f"{who}: seqs[{i}] is empty")
        if PAD_ID in ids:
            raise ValueError(f"{who}: seqs[{i}] contains the PAD id {PAD_ID}; packed blocks have "
                             "no padding and lm_loss would ignore those targets")
        stream.extend(ids)
        stream.append(eos_id)
    return stream


def pack_sequences(seqs: Sequence[Sequence[int]], block_len: int, *, eos_id: int = EOS_ID) -> Tensor:
    """Join ``seqs`` (lists of token ids) with ``eos_id`` after each, and cut the stream into rows.

    Returns a ``(N, block_len + 1)`` long tensor, ``N = len(stream) // (block_len + 1)``: row ``i``
    is ``stream[i * (block_len + 1) : (i + 1) * (block_len + 1)]``, to be read as inputs
    ``row[:-1]`` and targets ``row[1:]``. The last ``len(stream) % (block_len + 1)`` tokens, too few
    for a row, are dropped. (Rows do not overlap, so the target of a row's last position is the
    row's own last token; the first token of each row is never a target: ``1 / (block_len + 1)`` of
    the stream is read only as an input, as in nanoGPT's random-offset blocks on average.)

    ``ValueError`` for ``block_len < 1``, empty input, and a stream shorter than one row.
    """
    if not isinstance(block_len, int) or isinstance(block_len, bool) or block_len < 1:
        raise ValueError(f"pack_sequences: block_len must be an int >= 1, got {block_len!r}")
    stream = _stream(seqs, eos_id, "pack_sequences")
    row = block_len + 1
    n_blocks = len(stream) // row
    if n_blocks == 0:
        raise ValueError(f"pack_sequences: block_len={block_len} needs {row} tokens per block, but the "
                         f"{len(seqs)} sentence(s) give only {len(stream)} tokens with EOS")
    return torch.tensor(stream[: n_blocks * row], dtype=torch.long).view(n_blocks, row)


class PackedBlocks(Dataset):
    """A map-style dataset of packed blocks: item ``i`` is ``(inputs (L,), targets (L,))``.

    ``torch.utils.data.default_collate`` (a ``DataLoader``'s default) stacks a batch into
    ``(B, L)`` inputs and targets, ready for :func:`tfmlib.rnn.lm_loss`; since no target is
    ``PAD``, every one of the ``B * L`` positions counts. ``dropped`` is how many tokens of the
    stream's tail did not fill a block; ``stream_tokens`` the length of the stream.
    """

    def __init__(self, seqs: Sequence[Sequence[int]], block_len: int, *, eos_id: int = EOS_ID) -> None:
        self.rows = pack_sequences(seqs, block_len, eos_id=eos_id)       # (N, L + 1)
        self.block_len = block_len
        self.stream_tokens = len(seqs) + sum(len(s) for s in seqs)
        self.dropped = self.stream_tokens - self.rows.numel()

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        row = self.rows[i]
        return row[:-1], row[1:]

    @property
    def tokens_per_block(self) -> int:
        """Targets per block: ``block_len`` (all of them count in the loss)."""
        return self.block_len

    def __repr__(self) -> str:
        return (f"PackedBlocks({len(self)} blocks of {self.block_len} tokens from a stream of "
                f"{self.stream_tokens} tokens, {self.dropped} dropped)")


def bundled_english_blocks(sentences: int, block_len: int) -> tuple[PackedBlocks, Vocab]:
    """Packed blocks of the first ``sentences`` English sentences of the bundled training split
    (:func:`tfmlib.synthetic.load_bundled`), and the word vocabulary built on them: chapter 09's
    language-model data, packed as chapter 10 trains it (``torchrun`` in
    :mod:`tfmlib.ddp_train`, and ``benchmarks/scaling_steps.py``, which must build the same data).

    Returns ``(blocks, vocab)``: ``blocks[i]`` is ``(inputs (L,), targets (L,))`` with
    ``L = block_len``. Raises ``ValueError`` for ``sentences < 1``, more sentences than the split
    holds, or a ``block_len`` the stream cannot fill once.
    """
    if not isinstance(sentences, int) or isinstance(sentences, bool) or sentences < 1:
        raise ValueError(f"bundled_english_blocks: sentences must be an int >= 1, got {sentences!r}")
    pairs = load_bundled("train")
    if sentences > len(pairs):
        raise ValueError(f"bundled_english_blocks: sentences={sentences} but the bundled training split "
                         f"holds {len(pairs)}")
    english = [tokenize(en) for en, _ in pairs[:sentences]]
    vocab = Vocab.build(english)
    return PackedBlocks([vocab.encode(s) for s in english], block_len), vocab

"""Decoding: turning a trained translation model into translations.

Introduced in chapter 02 (sequence to sequence); chapter 03 uses the same functions for the
attention model, whose attention weights :func:`greedy_decode` also returns.

* :func:`greedy_decode` runs any :class:`~tfmlib.seq2seq.EncoderDecoder` on a padded batch,
  one step at a time, always taking the most probable token; a sentence stops at its end token
  and the batch stops when every sentence has.
* :func:`translate` goes from texts to texts: tokenize, map unknown words to ``<unk>``, batch,
  decode, detokenize.

Shapes: ``B`` batch, ``S`` source length, ``L`` decoded length.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from tfmlib.data import EOS_ID, PAD_ID, Pair, Vocab, detokenize, pad_sequences, tokenize
from tfmlib.metrics import DEFAULT_LENGTH_EDGES, BleuScore, bleu, bleu_by_length, exact_match
from tfmlib.seq2seq import EncoderDecoder, check_source, first_token_batch

INTRODUCED_IN = 2

__all__ = ["Decoded", "TranslationReport", "default_max_len", "encode_sources", "evaluate_translator",
           "greedy_decode", "translate"]


class Decoded(NamedTuple):
    """What :func:`greedy_decode` returns.

    * ``tokens``: ``(B, L)`` ids; each row ends with its EOS (if it produced one) and then ``PAD_ID``;
    * ``lengths``: ``(B,)`` the number of tokens of each row before its EOS;
    * ``attention``: ``(B, L, S)`` the weights over the source at each step, or ``None`` when the
      model has no attention or they were not asked for.
    """

    tokens: Tensor
    lengths: Tensor
    attention: Tensor | None = None


def default_max_len(src_mask: Tensor) -> int:
    """How long a translation may grow: twice the longest source, plus 10."""
    return 2 * int(src_mask.sum(dim=1).max()) + 10


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | None = None,
                  return_attention: bool = False) -> Decoded:
    """Translate a batch greedily: at each step feed back the argmax token.

    ``src`` and ``src_mask`` are ``(B, S)`` as in a :class:`~tfmlib.data.Batch`. A row stops at
    its first EOS; after it the row holds ``PAD_ID``. Decoding stops when every row has stopped
    or after ``max_len`` steps (default :func:`default_max_len`). The model is put in eval mode
    (and restored afterwards).
    """
    check_source(src, src_mask, "greedy_decode", getattr(model, "max_source_len", None),
                 getattr(model, "src_vocab_size", None))
    if max_len is None:
        max_len = default_max_len(src_mask)
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"greedy_decode: max_len must be a positive int, got {max_len!r}")
    was_training = model.training
    model.eval()
    try:
        enc = model.encode(src, src_mask)
        B = src.shape[0]
        prev, state = first_token_batch(B, src.device), enc.state
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)
        tokens, weights = [], []
        for _ in range(max_len):
            step = model.decode_step(prev, state, enc)
            state = step.state
            prev = step.logits.argmax(dim=-1)
            tokens.append(torch.where(finished, torch.full_like(prev, PAD_ID), prev))
            if return_attention and step.weights is not None:
                weights.append(step.weights * (~finished)[:, None])
            finished = finished | (prev == EOS_ID)
            if bool(finished.all()):
                break
    finally:
        model.train(was_training)
    out = torch.stack(tokens, dim=1)
    is_eos = out == EOS_ID
    # index of the first EOS, or the full length when a row never produced one
    lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1),
                          torch.full_like(out[:, 0], out.shape[1]))
    attention = torch.stack(weights, dim=1) if weights else None
    return Decoded(out, lengths, attention)


def encode_sources(sentences: Sequence[str], src_vocab: Vocab, who: str = "translate",
                   lowercase: bool = True) -> list[list[int]]:
    """Tokenize and encode source sentences (unknown words -> ``<unk>``), EOS appended.

    Raises ``TypeError`` for a non-string and ``ValueError`` for an empty (or blank) sentence.
    """
    if isinstance(sentences, str):
        raise TypeError(f"{who}: expected a list of sentences, got a single str (wrap it in a list)")
    ids = []
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"{who}: sentence {i} is a {type(s).__name__}, not a str")
        tokens = tokenize(s, lowercase)
        if not tokens:
            raise ValueError(f"{who}: sentence {i} is empty ({s!r})")
        ids.append(src_vocab.encode(tokens, eos=True))
    return ids


def translate(model: EncoderDecoder, sentences: Sequence[str], src_vocab: Vocab, tgt_vocab: Vocab, *,
              batch_size: int = 128, max_len: int | None = None, device: torch.device | str | None = None,
              lowercase: bool = True) -> list[str]:
    """Translate texts with greedy decoding; returns one detokenized string per sentence.

    Words missing from ``src_vocab`` become ``<unk>``. An empty sentence, or one longer than the
    model's ``max_source_len`` tokens (EOS included), raises ``ValueError`` naming it.
    """
    ids = encode_sources(sentences, src_vocab, "translate", lowercase)
    limit = getattr(model, "max_source_len", None)
    for i, s in enumerate(ids):
        if limit is not None and len(s) > limit:
            raise ValueError(f"translate: sentence {i} has {len(s)} tokens (EOS included), more than "
                             f"the model's max_source_len={limit}")
    if device is None:
        device = next(model.parameters()).device
    out: list[str] = []
    for start in range(0, len(ids), batch_size):
        src, src_mask = pad_sequences(ids[start:start + batch_size])
        decoded = greedy_decode(model, src.to(device), src_mask.to(device), max_len)
        for row, n in zip(decoded.tokens.tolist(), decoded.lengths.tolist(), strict=False):
            out.append(detokenize(tgt_vocab.decode(row[:n])))
    return out


@dataclass
class TranslationReport:
    """What :func:`evaluate_translator` measures on a test set."""

    sources: list[str]
    references: list[str]
    hypotheses: list[str]
    bleu: BleuScore
    exact: float
    by_length: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def examples(self, indices: Sequence[int]) -> str:
        """Source, reference and model output of some sentences, as readable text."""
        lines = []
        for i in indices:
            mark = "==" if self.hypotheses[i].strip() == self.references[i].strip() else "!="
            lines += [f"[{i}] en : {self.sources[i]}", f"     ref: {self.references[i]}",
                      f"  {mark} out: {self.hypotheses[i]}", ""]
        return "\n".join(lines)


def evaluate_translator(model: EncoderDecoder, pairs: Sequence[Pair], src_vocab: Vocab, tgt_vocab: Vocab, *,
                        edges: Sequence[int] = DEFAULT_LENGTH_EDGES, lowercase_bleu: bool = False,
                        batch_size: int = 128) -> TranslationReport:
    """Translate the sources of ``pairs`` greedily and score them against the references: corpus
    BLEU, exact matches, and both by source length (tokens, as :func:`~tfmlib.data.tokenize`
    counts them, punctuation included). ``lowercase_bleu`` for corpora with cased references,
    since the book's vocabularies are lowercase."""

    if len(pairs) == 0:
        raise ValueError("evaluate_translator: no pairs to evaluate")
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    start = time.perf_counter()
    hypotheses = translate(model, sources, src_vocab, tgt_vocab, batch_size=batch_size)
    seconds = time.perf_counter() - start
    lengths = [len(tokenize(s)) for s in sources]
    if lowercase_bleu:
        exact = exact_match([h.lower() for h in hypotheses], [r.lower() for r in references])
    else:
        exact = exact_match(hypotheses, references)
    return TranslationReport(
        sources, references, hypotheses,
        bleu(hypotheses, references, lowercase=lowercase_bleu),
        exact,
        bleu_by_length(lengths, hypotheses, references, edges, lowercase=lowercase_bleu),
        seconds,
    )

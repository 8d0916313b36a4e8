"""Decoding: turning a trained translation model into translations.

Introduced in chapter 02 (sequence to sequence); chapter 03 uses the same functions for the
attention model, whose attention weights :func:`greedy_decode` also returns, and chapter 08 adds
beam search for the Transformer (it works for every model of the book).

* :func:`greedy_decode` runs any :class:`~tfmlib.seq2seq.EncoderDecoder` on a padded batch,
  one step at a time, always taking the most probable token; a sentence stops at its end token
  and the batch stops when every sentence has.
* :func:`beam_search` keeps the ``beam_size`` most probable prefixes of every sentence at each
  step, in one batch of ``B * beam_size`` rows, and ranks finished hypotheses by their
  log-probability divided by a length penalty (Wu et al. 2016); :func:`sequence_log_probs` scores
  any output under a model, so the two searches can be compared.
* :func:`translate` goes from texts to texts: tokenize, map unknown words to ``<unk>``, batch,
  decode (greedy or beam search), detokenize.

Shapes: ``B`` batch, ``S`` source length, ``L`` decoded length.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Pair,
    Tokenizer,
    Vocab,
    WordTokenizer,
    check_tokenizer,
    pad_sequences,
    tokenize,
)
from tfmlib.metrics import DEFAULT_LENGTH_EDGES, BleuScore, bleu, bleu_by_length, exact_match
from tfmlib.seq2seq import EncoderDecoder, EncoderOutput, check_source, first_token_batch

INTRODUCED_IN = 2

__all__ = ["BeamDecoded", "Decoded", "TranslationReport", "beam_search", "decode_length", "default_max_len",
           "encode_sources", "evaluate_translator", "greedy_decode", "length_penalty", "sequence_log_probs",
           "translate"]


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


def default_max_len(src_mask: Tensor, limit: int | None = None) -> int:
    """How long a translation may grow: twice the longest source, plus 10, and at most ``limit``
    (a model's ``max_target_len``, when it has one: a Transformer has positions for that many
    target tokens only)."""
    n = 2 * int(src_mask.sum(dim=1).max()) + 10
    return n if limit is None else min(n, limit)


def decode_length(model: EncoderDecoder, src_mask: Tensor, max_len: int | None, who: str = "decode") -> int:
    """Check that ``model`` can decode at all and return the number of steps to run: ``max_len``, or
    :func:`default_max_len` clamped to the model's ``max_target_len``. An explicit ``max_len``
    above that limit is refused here, before any decoding, not part-way through."""
    vocab = getattr(model, "tgt_vocab_size", None)
    if vocab is not None and vocab <= max(BOS_ID, EOS_ID, PAD_ID):
        raise ValueError(f"{who}: the model's tgt_vocab_size={vocab} has no room for the special tokens "
                         f"(PAD={PAD_ID}, BOS={BOS_ID}, EOS={EOS_ID}) that decoding reads and writes")
    limit = getattr(model, "max_target_len", None)
    if max_len is None:
        return default_max_len(src_mask, limit)
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"{who}: max_len must be a positive int, got {max_len!r}")
    if limit is not None and max_len > limit:
        raise ValueError(f"{who}: max_len={max_len} is more than this model's max_target_len={limit} (it has "
                         f"positions for {limit} target tokens); pass max_len <= {limit}, or None for "
                         "the default, which is clamped to it")
    return max_len


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | None = None,
                  return_attention: bool = False) -> Decoded:
    """Translate a batch greedily: at each step feed back the argmax token.

    ``src`` and ``src_mask`` are ``(B, S)`` as in a :class:`~tfmlib.data.Batch`. A row stops at
    its first EOS; after it the row holds ``PAD_ID``. A row that has stopped leaves the batch the
    model runs on, so the rows still decoding do not pay for it. Decoding stops when every row has
    stopped or after ``max_len`` steps (default :func:`default_max_len`, clamped to the model's
    ``max_target_len`` when it has one; an explicit ``max_len`` above that is a ``ValueError``).
    The model is put in eval mode (and restored afterwards).
    """
    check_source(src, src_mask, "greedy_decode", getattr(model, "max_source_len", None),
                 getattr(model, "src_vocab_size", None))
    max_len = decode_length(model, src_mask, max_len, "greedy_decode")
    was_training = model.training
    model.eval()
    try:
        enc = model.encode(src, src_mask)
        B = src.shape[0]
        prev, state = first_token_batch(B, src.device), enc.state
        enc = enc._replace(state=None)  # the state lives on in `state` only
        running = torch.arange(B, device=src.device)  # the rows of the batch still decoding
        tokens, weights = [], []
        for _ in range(max_len):
            step = model.decode_step(prev, state, enc)
            prev = step.logits.argmax(dim=-1)                         # (rows still running,)
            tokens.append(prev.new_full((B,), PAD_ID).index_copy(0, running, prev))
            if return_attention and step.weights is not None:
                weights.append(step.weights.new_zeros((B, *step.weights.shape[1:]))
                               .index_copy(0, running, step.weights))
            ended = (prev == EOS_ID).tolist()                           # the step's one device read
            if all(ended):
                break
            if any(ended):  # the rows that ended leave the batch: keep the others' inputs and state
                keep = torch.tensor([i for i, e in enumerate(ended) if not e], device=src.device)
                running, prev = running[keep], prev[keep]
                state, enc = _select_state(step.state, keep), _select_rows(enc, keep)
            else:
                state = step.state
    finally:
        model.train(was_training)
    out = torch.stack(tokens, dim=1)
    is_eos = out == EOS_ID
    # index of the first EOS, or the full length when a row never produced one
    lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1),
                          torch.full_like(out[:, 0], out.shape[1]))
    attention = torch.stack(weights, dim=1) if weights else None
    return Decoded(out, lengths, attention)


def _select_rows(enc: EncoderOutput, rows: Tensor) -> EncoderOutput:
    """Every tensor of ``enc`` at the given batch rows: ``(B, ...) -> (len(rows), ...)``."""
    return EncoderOutput(*(None if x is None else x.index_select(0, rows) for x in enc))


def _select_state(state: object, rows: Tensor, beams_only: bool = False) -> object:
    """A decoder ``state`` (a tensor, a tuple/list of them, batch first, or an object with a
    ``select(rows)`` method such as chapter 09's :class:`~tfmlib.kv_cache.DecoderCache`) at the
    given rows. ``beams_only``: the rows only reorder beams within sentences, so a state with a
    ``select_beams`` method may keep what is the same for every beam (the cross-attention keys and
    values) instead of copying it."""
    if isinstance(state, Tensor):
        return state.index_select(0, rows)
    if beams_only and callable(getattr(state, "select_beams", None)):
        return state.select_beams(rows)
    if hasattr(state, "select") and callable(state.select):
        return state.select(rows)
    if isinstance(state, (tuple, list)):
        return type(state)(_select_state(s, rows, beams_only) for s in state)
    raise TypeError(f"decoding: a decoder state must be a tensor or a tuple of tensors, got "
                    f"{type(state).__name__}")


class BeamDecoded(NamedTuple):
    """What :func:`beam_search` returns: the best hypothesis of each sentence.

    * ``tokens``: ``(B, L)`` ids; a row ends with its EOS (if it produced one), then ``PAD_ID``;
    * ``lengths``: ``(B,)`` the number of tokens before the EOS;
    * ``scores``: ``(B,)`` the model score, the sum of the log-probabilities of the tokens,
      EOS included (what :func:`sequence_log_probs` computes);
    * ``normalized``: ``(B,)`` ``scores`` divided by :func:`length_penalty`: what the search ranks.
    """

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    normalized: Tensor


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """``((5 + length) / 6) ** alpha``, the length normalisation of Wu et al. (2016, section 7).

    Log-probabilities only fall as a hypothesis grows, so ranking by them favours short outputs;
    dividing by this penalty (which grows with ``length`` when ``alpha > 0``) offsets that.
    ``alpha = 0`` gives 1 (no normalisation); ``length`` counts the output tokens, EOS included.
    """
    if alpha < 0:
        raise ValueError(f"length_penalty: alpha must be >= 0, got {alpha}")
    return ((5 + length) / 6) ** alpha


def _repeat_rows(enc: EncoderOutput, k: int) -> EncoderOutput:
    """Every tensor of ``enc`` with each batch row repeated ``k`` times: ``(B, ...) -> (B * k, ...)``."""
    return EncoderOutput(*(None if x is None else x.repeat_interleave(k, dim=0) for x in enc))


@torch.no_grad()
def beam_search(model: EncoderDecoder, src: Tensor, src_mask: Tensor, beam_size: int = 4,
                max_len: int | None = None, alpha: float = 0.6) -> BeamDecoded:
    """Translate a batch with beam search; returns the best finished hypothesis of each sentence.

    Every sentence keeps ``beam_size`` live prefixes; all ``B * beam_size`` of them advance in one
    call of ``model.decode_step``. At each step the ``2 * beam_size`` best one-token extensions of a
    sentence's prefixes (by summed log-probability) are ranked: one that ends with EOS and ranks
    within the first ``beam_size`` becomes a finished hypothesis, scored by its log-probability
    divided by ``length_penalty(length, alpha)``; the best ``beam_size`` others become the new
    prefixes. A sentence is done when its best finished hypothesis beats anything a live prefix
    could still reach (their log-probabilities only fall, and the penalty is largest at
    ``max_len``), and the search ends when every sentence is done or after ``max_len`` steps
    (then a sentence with no finished hypothesis returns its best prefix, without EOS).

    ``beam_size=1`` with ``alpha=0`` is greedy decoding. Beam search is a heuristic: a larger beam
    usually, not always, finds a more probable output (chapter 08 measures how often). Shapes,
    errors and the default ``max_len`` (clamped to the model's ``max_target_len``) as in
    :func:`greedy_decode`; the model is put in eval mode and restored afterwards.
    """
    check_source(src, src_mask, "beam_search", getattr(model, "max_source_len", None),
                 getattr(model, "src_vocab_size", None))
    if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
        raise ValueError(f"beam_search: beam_size must be a positive int, got {beam_size!r}")
    max_len = decode_length(model, src_mask, max_len, "beam_search")
    length_penalty(1, alpha)  # validates alpha
    B, K, device = src.shape[0], beam_size, src.device
    was_training = model.training
    model.eval()
    try:
        enc = model.encode(src, src_mask)
        state = _select_state(enc.state, torch.arange(B, device=device).repeat_interleave(K))
        enc = _repeat_rows(enc._replace(state=None), K)  # the state lives on in `state` only
        prev = first_token_batch(B * K, device)
        # The sentences still searching (their ids in the batch); a sentence that is done leaves
        # the rows the model runs on. Below, n = len(sentence_of) and every tensor has n * K rows.
        sentence_of = list(range(B))
        prefixes: list[list[int]] = [[] for _ in range(B * K)]  # on the host: read once per step
        # Only the first of a sentence's K identical start prefixes is live, so that the first step
        # gives K different extensions instead of K copies of the best one.
        beam_scores = torch.full((B, K), -math.inf, device=device)
        beam_scores[:, 0] = 0.0
        host_scores = beam_scores.tolist()
        # per sentence, its finished hypotheses as (normalized score, raw score, token ids)
        finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(B)]
        best_finished = [-math.inf] * B
        best_bound_penalty = length_penalty(max_len, alpha)
        for step in range(1, max_len + 1):
            n = len(sentence_of)
            out = model.decode_step(prev, state, enc)
            log_probs = F.log_softmax(out.logits.float(), dim=-1)             # (n*K, V)
            V = log_probs.shape[-1]
            candidates = (beam_scores.view(-1, 1) + log_probs).view(n, K * V)
            n_best = min(2 * K, K * V)
            top_scores, top_index = candidates.topk(n_best, dim=1)            # (n, n_best), best first
            top_beam, top_token = top_index // V, top_index % V
            is_eos = top_token == EOS_ID
            # finished hypotheses: EOS among the first K candidates
            rank = torch.arange(n_best, device=device)[None, :]
            new_finished = is_eos & (rank < K) & torch.isfinite(top_scores)
            # live prefixes: the first K candidates that do not end with EOS (there are at least K:
            # each of the K prefixes contributes at most one EOS candidate)
            order = (is_eos.long() * n_best + rank).argsort(dim=1)[:, :K]    # non-EOS first, by rank
            beam_scores = top_scores.gather(1, order)
            chosen_beam = top_beam.gather(1, order)                           # (n, K)
            keep_rows = (torch.arange(n, device=device)[:, None] * K + chosen_beam).view(-1)
            prev = top_token.gather(1, order).view(-1)
            state = _select_state(out.state, keep_rows, beams_only=True)  # cross K/V stay shared
            bound = beam_scores.max(dim=1).values / best_bound_penalty       # (n,)
            # The one read from the device in this step: everything the host-side bookkeeping needs.
            host = torch.cat([top_scores.double(), top_index.double(), new_finished.double(),
                              chosen_beam.double(), prev.view(n, K).double(), beam_scores.double(),
                              bound[:, None].double()], dim=1).tolist()
            still = []
            new_prefixes = []
            for i, row in enumerate(host):
                b = sentence_of[i]
                scores_i, index_i = row[:n_best], row[n_best:2 * n_best]
                flags = row[2 * n_best:3 * n_best]
                beams_i, tokens_i = row[3 * n_best:3 * n_best + K], row[3 * n_best + K:3 * n_best + 2 * K]
                for j in range(n_best):
                    if flags[j]:
                        raw = scores_i[j]
                        ids = prefixes[i * K + int(index_i[j]) // V] + [EOS_ID]
                        finished[b].append((raw / length_penalty(step, alpha), raw, ids))
                        best_finished[b] = max(best_finished[b], finished[b][-1][0])
                new_prefixes.extend(prefixes[i * K + int(beam)] + [int(token)]
                                    for beam, token in zip(beams_i, tokens_i, strict=True))
                # a sentence is done when no live prefix can beat its best finished hypothesis
                if not finished[b] or best_finished[b] < row[-1]:
                    still.append(i)
            prefixes = new_prefixes
            host_scores = [row[3 * n_best + 2 * K:3 * n_best + 3 * K] for row in host]
            if not still:
                break
            if len(still) < n:  # the sentences that are done leave the batch
                keep = torch.tensor(still, device=device)
                rows_list = [i * K + j for i in still for j in range(K)]
                rows = torch.tensor(rows_list, device=device)
                sentence_of = [sentence_of[i] for i in still]
                host_scores = [host_scores[i] for i in still]
                prefixes = [prefixes[r] for r in rows_list]
                beam_scores, prev = beam_scores[keep], prev[rows]
                state, enc = _select_state(state, rows), _select_rows(enc, rows)
    finally:
        model.train(was_training)
    results = []
    row_of = {b: i for i, b in enumerate(sentence_of)}
    for b in range(B):
        if finished[b]:
            results.append(max(finished[b], key=lambda f: f[0]))
        else:  # max_len reached without an EOS: the best live prefix
            i = row_of[b]
            j = max(range(K), key=lambda j: (host_scores[i][j], -j))  # the first of the best, as argmax
            raw = host_scores[i][j]
            normalized = raw / length_penalty(len(prefixes[i * K + j]), alpha)
            results.append((normalized, raw, prefixes[i * K + j]))
    width = max(len(ids) for _, _, ids in results)
    rows_out = [ids + [PAD_ID] * (width - len(ids)) for _, _, ids in results]
    tokens = torch.tensor(rows_out, dtype=torch.long, device=device)
    lengths = torch.tensor([len(ids) - 1 if ids[-1] == EOS_ID else len(ids) for _, _, ids in results],
                           dtype=torch.long, device=device)
    scores = torch.tensor([r[1] for r in results], device=device)
    normalized = torch.tensor([r[0] for r in results], device=device)
    return BeamDecoded(tokens, lengths, scores, normalized)


@torch.no_grad()
def sequence_log_probs(model: EncoderDecoder, src: Tensor, src_mask: Tensor, tokens: Tensor,
                       lengths: Tensor) -> Tensor:
    """The model score ``(B,)`` of given outputs: ``sum_t log p(y_t | y_<t, x)`` over each row's
    ``lengths[b]`` tokens and, when the row holds one after them, its EOS.

    ``tokens`` ``(B, L)`` and ``lengths`` ``(B,)`` are what :func:`greedy_decode` or
    :func:`beam_search` return. Runs in eval mode (restored afterwards).
    """
    if tokens.dim() != 2 or tokens.shape[0] != src.shape[0] or lengths.shape != (src.shape[0],):
        raise ValueError(f"sequence_log_probs: tokens must be (batch={src.shape[0]}, L) and lengths "
                         f"(batch,), got {tuple(tokens.shape)} and {tuple(lengths.shape)}")
    B, L = tokens.shape
    positions = torch.arange(L, device=tokens.device)[None, :]
    has_eos = (lengths < L) & (tokens.gather(1, lengths.clamp(max=L - 1)[:, None])[:, 0] == EOS_ID)
    counted = positions < (lengths + has_eos.long())[:, None]                # the tokens that are scored
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID, dtype=torch.long, device=tokens.device),
                        tokens[:, :-1].masked_fill(~counted[:, :-1], PAD_ID)], dim=1)
    was_training = model.training
    model.eval()
    try:
        log_probs = F.log_softmax(model(src, src_mask, tgt_in).float(), dim=-1)  # (B, L, V)
    finally:
        model.train(was_training)
    picked = log_probs.gather(2, tokens.clamp(min=0)[:, :, None])[:, :, 0]
    return (picked * counted).sum(dim=1)


def encode_sources(sentences: Sequence[str], src_vocab: Vocab, who: str = "translate",
                   lowercase: bool = True, tokenizer: Tokenizer | None = None) -> list[list[int]]:
    """Tokenize and encode source sentences (unknown tokens -> ``<unk>``), EOS appended.

    ``tokenizer``: the text pipeline (default :class:`~tfmlib.data.WordTokenizer` with ``lowercase``).

    Raises ``TypeError`` for a non-string and ``ValueError`` for an empty (or blank) sentence.
    """
    if isinstance(sentences, str):
        raise TypeError(f"{who}: expected a list of sentences, got a single str (wrap it in a list)")
    if tokenizer is None:
        tokenizer = WordTokenizer(lowercase)
    check_tokenizer(tokenizer, who)
    ids = []
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"{who}: sentence {i} is a {type(s).__name__}, not a str")
        tokens = tokenizer.tokens(s)
        if not tokens:
            raise ValueError(f"{who}: sentence {i} is empty ({s!r})")
        ids.append(src_vocab.encode(tokens, eos=True))
    return ids


def translate(model: EncoderDecoder, sentences: Sequence[str], src_vocab: Vocab, tgt_vocab: Vocab, *,
              batch_size: int = 128, max_len: int | None = None, device: torch.device | str | None = None,
              lowercase: bool = True, beam_size: int = 1, alpha: float = 0.6,
              tokenizer: Tokenizer | None = None) -> list[str]:
    """Translate texts with greedy decoding (``beam_size=1``) or :func:`beam_search` (with length
    penalty ``alpha``); returns one detokenized string per sentence.

    Sentences are decoded in batches of ``batch_size`` sentences of similar length (sorted by
    length: less padding, and a batch does not wait for one long sentence), and returned in the
    order given. With ``max_len=None`` each batch may grow to :func:`default_max_len` of its
    sources (at most the model's ``max_target_len``). Words missing from ``src_vocab`` become
    ``<unk>``. Checked before anything is decoded, each a ``ValueError``: an empty sentence, or
    one longer than the model's ``max_source_len`` tokens (EOS included), naming it; vocabularies
    that do not fit the model (``src_vocab`` larger than its ``src_vocab_size``: ids it has no
    embedding for; ``tgt_vocab`` smaller than its ``tgt_vocab_size``: ids it could output and
    the vocabulary could not read); a ``max_len`` above the model's ``max_target_len``.

    ``tokenizer`` is the text pipeline both ways: ``tokenizer.tokens`` reads the sources,
    ``tokenizer.text`` writes the outputs (default :class:`~tfmlib.data.WordTokenizer` with
    ``lowercase``; :class:`tfmlib.bpe.SubwordTokenizer` for a model trained on subword pieces).
    """
    model_src, model_tgt = getattr(model, "src_vocab_size", None), getattr(model, "tgt_vocab_size", None)
    if model_src is not None and len(src_vocab) > model_src:
        raise ValueError(f"translate: src_vocab has {len(src_vocab)} tokens but the model embeds "
                         f"src_vocab_size={model_src}: is it the vocabulary the model was trained with?")
    if model_tgt is not None and len(tgt_vocab) < model_tgt:
        raise ValueError(f"translate: tgt_vocab has {len(tgt_vocab)} tokens but the model outputs "
                         f"tgt_vocab_size={model_tgt}: is it the vocabulary the model was trained with?")
    if tokenizer is None:
        tokenizer = WordTokenizer(lowercase)
    ids = encode_sources(sentences, src_vocab, "translate", tokenizer=tokenizer)
    target_limit = getattr(model, "max_target_len", None)
    if max_len is not None and target_limit is not None and max_len > target_limit:
        raise ValueError(f"translate: max_len={max_len} is more than this model's "
                         f"max_target_len={target_limit}")
    limit = getattr(model, "max_source_len", None)
    for i, s in enumerate(ids):
        if limit is not None and len(s) > limit:
            raise ValueError(f"translate: sentence {i} has {len(s)} tokens (EOS included), more than "
                             f"the model's max_source_len={limit}")
    if device is None:
        device = next(model.parameters()).device
    by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    for start in range(0, len(ids), batch_size):
        chunk = by_length[start:start + batch_size]
        src, src_mask = pad_sequences([ids[i] for i in chunk])
        if beam_size == 1:
            decoded = greedy_decode(model, src.to(device), src_mask.to(device), max_len)
        else:
            decoded = beam_search(model, src.to(device), src_mask.to(device), beam_size, max_len, alpha)
        for i, row, n in zip(chunk, decoded.tokens.tolist(), decoded.lengths.tolist(), strict=True):
            out[i] = tokenizer.text(tgt_vocab.decode(row[:n]))
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

    def examples(self, indices: Sequence[int], source_label: str = "en") -> str:
        """Source, reference and model output of some sentences, as readable text; the source
        line is labelled ``source_label`` (at most three characters, e.g. the language)."""
        lines = []
        for i in indices:
            mark = "==" if self.hypotheses[i].strip() == self.references[i].strip() else "!="
            lines += [f"[{i}] {source_label:<3}: {self.sources[i]}", f"     ref: {self.references[i]}",
                      f"  {mark} out: {self.hypotheses[i]}", ""]
        return "\n".join(lines)


def evaluate_translator(model: EncoderDecoder, pairs: Sequence[Pair], src_vocab: Vocab, tgt_vocab: Vocab, *,
                        edges: Sequence[int] = DEFAULT_LENGTH_EDGES, lowercase_bleu: bool = False,
                        batch_size: int = 128, beam_size: int = 1, alpha: float = 0.6,
                        tokenizer: Tokenizer | None = None) -> TranslationReport:
    """Translate the sources of ``pairs`` (greedily, or with beam search when ``beam_size > 1``;
    see :func:`translate`) and score them against the references: corpus
    BLEU, exact matches, and both by source length (tokens, as :func:`~tfmlib.data.tokenize`
    counts them, punctuation included). ``lowercase_bleu`` for corpora with cased references,
    since the book's vocabularies are lowercase. ``tokenizer``: the model's text pipeline, as in
    :func:`translate` (lengths are counted in words all the same)."""

    if len(pairs) == 0:
        raise ValueError("evaluate_translator: no pairs to evaluate")
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    start = time.perf_counter()
    hypotheses = translate(model, sources, src_vocab, tgt_vocab, batch_size=batch_size, beam_size=beam_size,
                           alpha=alpha, tokenizer=tokenizer)
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

"""Attention for recurrent networks: Bahdanau's alignment model, Luong's scores, and the
self-attentive sentence embedding.

Introduced in chapter 03 (Bahdanau attention). Chapter 05 builds the Transformer's
scaled dot-product attention in :mod:`tfmlib.attention`; this module is its recurrent ancestor.

* :func:`masked_softmax` turns scores into weights over the real source positions: a padded
  position gets weight exactly 0, and a row with no real position gets all zeros (never NaN).
* :class:`AdditiveScore` is ``e_ij = v^T tanh(W s_{i-1} + U h_j)`` (Bahdanau et al. 2014, A.1.2);
  :class:`DotScore` and :class:`GeneralScore` are Luong et al.'s (2015) ``s^T h`` and ``s^T W h``.
* :class:`AttentionSeq2Seq` is the RNNsearch model: a bidirectional GRU encoder whose states
  ("annotations") the decoder re-weighs at every step into a context vector ``c_i``.
* :class:`SelfAttentiveEncoder` is Lin et al.'s (2017) ``A = softmax(W_s2 tanh(W_s1 H^T))``:
  ``r`` attention distributions over one sentence's own states, no decoder at all, and
  :func:`attention_penalty` their ``||A A^T - I||_F^2``.

Shapes: ``B`` batch, ``S`` source length, ``A`` annotation size (``2 * enc_hidden``), ``H``
decoder hidden units, ``Q`` query size, ``K`` key size, ``r`` attention hops (heads).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tfmlib.data import PAD_ID
from tfmlib.seq2seq import (
    DeepOutput,
    EncoderDecoder,
    EncoderOutput,
    GRUEncoder,
    StepOutput,
    check_ids,
    check_source,
)

INTRODUCED_IN = 3

__all__ = [
    "AdditiveScore",
    "AttentionSeq2Seq",
    "DotScore",
    "GeneralScore",
    "SCORES",
    "SelfAttentiveClassifier",
    "SelfAttentiveEncoder",
    "attention_penalty",
    "masked_softmax",
]


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis of ``scores`` ``(..., S)``, only where ``mask`` ``(..., S)`` is True.

    Masked positions get weight exactly 0. A row whose mask is all False gets all zeros (no NaN,
    in the forward or the backward pass). ``mask`` must broadcast to ``scores``.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"masked_softmax: mask must be bool (True = attend), got {mask.dtype}")
    try:
        mask = mask.expand_as(scores)
    except RuntimeError as e:
        raise ValueError(f"masked_softmax: mask {tuple(mask.shape)} does not broadcast to scores "
                         f"{tuple(scores.shape)}") from e
    # The most negative finite number, not -inf: a fully masked row then gives a finite uniform
    # softmax (which the final multiplication zeroes) instead of 0/0 = NaN.
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask


class AdditiveScore(nn.Module):
    """Bahdanau's alignment model ``e_j = v^T tanh(W q + U k_j)``.

    ``prepare(memory (B, S, K)) -> (B, S, D)`` computes ``U k_j`` once per sentence;
    ``forward(query (B, Q), prepared (B, S, D)) -> scores (B, S)``.
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int):
        super().__init__()
        self.W = nn.Linear(query_size, attn_size, bias=False)
        self.U = nn.Linear(key_size, attn_size)
        self.v = nn.Linear(attn_size, 1, bias=False)

    def prepare(self, memory: Tensor) -> Tensor:
        return self.U(memory)

    def forward(self, query: Tensor, prepared: Tensor) -> Tensor:
        return self.v(torch.tanh(prepared + self.W(query)[:, None, :])).squeeze(-1)


class DotScore(nn.Module):
    """Luong's dot score ``e_j = q^T k_j``; needs ``query_size == key_size``. No parameters."""

    def __init__(self, query_size: int, key_size: int, attn_size: int | None = None):
        super().__init__()
        if query_size != key_size:
            raise ValueError(f"DotScore: the query ({query_size}) and key ({key_size}) sizes must be "
                             "equal for a dot product; use GeneralScore or AdditiveScore otherwise")

    def prepare(self, memory: Tensor) -> Tensor:
        return memory

    def forward(self, query: Tensor, prepared: Tensor) -> Tensor:
        return torch.bmm(prepared, query[:, :, None]).squeeze(-1)


class GeneralScore(nn.Module):
    """Luong's general score ``e_j = q^T W_a k_j`` (``W_a k_j`` computed once per sentence)."""

    def __init__(self, query_size: int, key_size: int, attn_size: int | None = None):
        super().__init__()
        self.W_a = nn.Linear(key_size, query_size, bias=False)

    def prepare(self, memory: Tensor) -> Tensor:
        return self.W_a(memory)

    def forward(self, query: Tensor, prepared: Tensor) -> Tensor:
        return torch.bmm(prepared, query[:, :, None]).squeeze(-1)


SCORES = {"additive": AdditiveScore, "dot": DotScore, "general": GeneralScore}


class AttentionSeq2Seq(EncoderDecoder):
    """RNNsearch (Bahdanau, Cho, Bengio 2014, section 3 and appendix A).

    * Encoder: a bidirectional GRU; the annotation ``h_j = [fwd_j; bwd_j]`` ``(B, S, A)``.
    * Initial decoder state ``s_0 = tanh(W_s bwd_1)``: the backward GRU's summary (A.2.2).
    * At step ``i``: scores ``e_ij = score(s_{i-1}, h_j)``, weights ``alpha_i = masked_softmax(e_i)``,
      context ``c_i = sum_j alpha_ij h_j``; then ``s_i = GRU([E y_{i-1}; c_i], s_{i-1})`` and the
      output layer reads ``[s_i; c_i; E y_{i-1}]`` (:class:`~tfmlib.seq2seq.DeepOutput`).

    ``score`` is ``"additive"`` (Bahdanau), ``"dot"`` or ``"general"`` (Luong); the rest of the
    model is the same, so the three compare like for like. ``decode_step`` returns the weights.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, embed: int = 128, enc_hidden: int = 128,
                 hidden: int = 256, attn_size: int = 256, score: str = "additive", dropout: float = 0.0,
                 max_source_len: int = 100):
        super().__init__()
        for name, value in [("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
                            ("embed", embed), ("enc_hidden", enc_hidden), ("hidden", hidden),
                            ("attn_size", attn_size), ("max_source_len", max_source_len)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AttentionSeq2Seq: {name} must be a positive int, got {value!r}")
        if score not in SCORES:
            raise ValueError(f"AttentionSeq2Seq: score must be one of {sorted(SCORES)}, got {score!r}")
        if score == "dot" and hidden != 2 * enc_hidden:
            raise ValueError("AttentionSeq2Seq: score='dot' compares the decoder state with the annotation, "
                             f"so it needs hidden == 2 * enc_hidden; got hidden={hidden}, "
                             f"enc_hidden={enc_hidden}")
        self.max_source_len = max_source_len
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.score_name = score
        self.encoder = GRUEncoder(src_vocab_size, embed, enc_hidden, bidirectional=True, dropout=dropout)
        A = self.encoder.state_size
        self.init_state = nn.Linear(enc_hidden, hidden)
        self.score = SCORES[score](hidden, A, attn_size)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, embed, padding_idx=PAD_ID)
        self.cell = nn.GRUCell(embed + A, hidden)
        self.output = DeepOutput(hidden, A, embed, tgt_vocab_size, maxout_units=hidden, dropout=dropout)
        self.dropout = nn.Dropout(dropout)

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        annotations, final = self.encoder(src, src_mask)        # (B, S, A), (2, B, enc_hidden)
        state = torch.tanh(self.init_state(final[1]))           # final[1]: the backward GRU at j = 1
        return EncoderOutput(annotations, src_mask, state, keys=self.score.prepare(annotations))

    def attend(self, query: Tensor, enc: EncoderOutput) -> tuple[Tensor, Tensor]:
        """``(context (B, A), weights (B, S))`` for decoder state ``query`` ``(B, H)``."""
        weights = masked_softmax(self.score(query, enc.keys), enc.mask)
        context = torch.bmm(weights[:, None, :], enc.memory).squeeze(1)
        return context, weights

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        e = self.dropout(self.tgt_embed(prev))                  # (B, E)
        context, weights = self.attend(state, enc)              # attention reads s_{i-1}
        new_state = self.cell(torch.cat([e, context], dim=-1), state)
        return StepOutput(self.output(new_state, context, e), new_state, weights)

    def decode_teacher_forced(self, tgt_in: Tensor, enc: EncoderOutput) -> Tensor:
        # The recurrence must run step by step, but the embeddings and the output layer (the
        # largest matrix product, into the vocabulary) can be done for all steps at once.
        emb = self.dropout(self.tgt_embed(tgt_in))              # (B, T, E)
        state, states, contexts = enc.state, [], []
        for t in range(tgt_in.shape[1]):
            context, _ = self.attend(state, enc)
            state = self.cell(torch.cat([emb[:, t], context], dim=-1), state)
            states.append(state)
            contexts.append(context)
        return self.output(torch.stack(states, 1), torch.stack(contexts, 1), emb)

    @torch.no_grad()
    def attention_weights(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """The weights ``(B, T, S)`` the model puts on the source while reading ``tgt_in`` (teacher
        forcing): for plotting the alignment of a reference translation. Runs in eval mode (no
        dropout) and restores the previous mode."""
        check_source(src, src_mask, "attention_weights", self.max_source_len, self.src_vocab_size)
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0] or tgt_in.shape[1] == 0:
            raise ValueError(f"attention_weights: tgt_in must be (batch={src.shape[0]}, target_len >= 1), "
                             f"got shape {tuple(tgt_in.shape)}")
        check_ids(tgt_in, self.tgt_vocab_size, "attention_weights", "tgt_in")
        was_training = self.training
        self.eval()
        try:
            enc = self.encode(src, src_mask)
            state, out = enc.state, []
            for t in range(tgt_in.shape[1]):
                step = self.decode_step(tgt_in[:, t], state, enc)
                state = step.state
                out.append(step.weights)
        finally:
            self.train(was_training)
        return torch.stack(out, dim=1)


class SelfAttentiveEncoder(nn.Module):
    """A structured self-attentive sentence embedding (Lin et al. 2017, section 2).

    A bidirectional GRU gives ``H`` ``(B, S, 2u)``; ``r`` attention hops read it:
    ``A = softmax(W_s2 tanh(W_s1 H^T))`` ``(B, r, S)`` (masked to the real tokens) and the
    sentence embedding is the matrix ``M = A H`` ``(B, r, 2u)``.
    ``forward(src, src_mask) -> (M, A)``.
    """

    def __init__(self, vocab_size: int, embed: int, hidden: int, attn_size: int, hops: int):
        super().__init__()
        if hops < 1 or attn_size < 1:
            raise ValueError(f"SelfAttentiveEncoder: hops and attn_size must be >= 1, got {hops} and "
                             f"{attn_size}")
        self.encoder = GRUEncoder(vocab_size, embed, hidden, bidirectional=True)
        self.W_s1 = nn.Linear(2 * hidden, attn_size, bias=False)
        self.W_s2 = nn.Linear(attn_size, hops, bias=False)
        self.hops = hops

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        check_source(src, src_mask, "SelfAttentiveEncoder")
        H, _ = self.encoder(src, src_mask)                              # (B, S, 2u)
        scores = self.W_s2(torch.tanh(self.W_s1(H))).transpose(1, 2)    # (B, r, S)
        A = masked_softmax(scores, src_mask[:, None, :])
        return torch.bmm(A, H), A


def attention_penalty(A: Tensor) -> Tensor:
    """Lin et al.'s penalty ``||A A^T - I||_F^2``, averaged over the batch. ``A`` is ``(B, r, S)``.

    It is 0 exactly when the ``r`` distributions are one-hot on distinct positions; it pushes the
    hops to look at different words, each at few of them.
    """
    if A.dim() != 3:
        raise ValueError(f"attention_penalty: A must be (batch, hops, length), got shape {tuple(A.shape)}")
    eye = torch.eye(A.shape[1], device=A.device, dtype=A.dtype)
    return ((torch.bmm(A, A.transpose(1, 2)) - eye) ** 2).sum(dim=(1, 2)).mean()


class SelfAttentiveClassifier(nn.Module):
    """:class:`SelfAttentiveEncoder` followed by a one-hidden-layer classifier on the flattened ``M``.

    ``forward(src, src_mask) -> (logits (B, classes), A (B, r, S))``.
    """

    def __init__(self, vocab_size: int, num_classes: int, *, embed: int = 64, hidden: int = 64,
                 attn_size: int = 64, hops: int = 4, mlp: int = 128):
        super().__init__()
        self.encoder = SelfAttentiveEncoder(vocab_size, embed, hidden, attn_size, hops)
        self.classifier = nn.Sequential(nn.Linear(hops * 2 * hidden, mlp), nn.ReLU(),
                                        nn.Linear(mlp, num_classes))

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        M, A = self.encoder(src, src_mask)
        return self.classifier(M.flatten(1)), A

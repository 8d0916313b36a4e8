"""Encoder-decoder translation with GRUs: a sentence squeezed into one vector, then unfolded.

Introduced in chapter 02 (sequence to sequence).

* :class:`EncoderDecoder` is the interface every translation model of the book implements:
  ``encode`` reads the source once, ``decode_step`` predicts one target token from the previous
  one. ``forward`` runs the decoder over a whole target (teacher forcing, or partly feeding the
  model its own predictions); :mod:`tfmlib.decoding` translates with any such model.
* :class:`GRUEncoder` embeds the source and runs a GRU over it (packed, so padding is never
  read), optionally in both directions.
* :class:`Seq2Seq` is the RNN encoder-decoder of Cho et al. (2014): the encoder's final state
  is the fixed-length summary ``c``; the decoder sees ``c`` at every step and in its output layer.
* :func:`translation_loss` is the padded cross-entropy; :func:`train_translator` the recipe
  (Adam, bucketed batches, clipping) both chapters 02 and 03 train with.

Shapes: ``B`` batch, ``S`` source length (EOS included), ``T`` target length, ``E`` embedding,
``H`` hidden units, ``A`` size of an encoder state (``H`` or ``2H`` when bidirectional), ``V``
vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from tfmlib.data import BOS_ID, PAD_ID, Batch, HostFacts, TranslationDataset, make_loader
from tfmlib.rnn import MPS_RNN_ISSUES, recurrent_device
from tfmlib.train import History, fit, warmup_inverse_sqrt

INTRODUCED_IN = 2

__all__ = [
    "DeepOutput",
    "EncoderDecoder",
    "EncoderOutput",
    "GRUEncoder",
    "Seq2Seq",
    "StepOutput",
    "check_ids",
    "check_source",
    "count_parameters",
    "first_token_batch",
    "host_checked",
    "host_lengths",
    "translation_loss",
    "train_translator",
]


class EncoderOutput(NamedTuple):
    """What ``encode`` returns.

    * ``memory``: ``(B, S, A)`` the encoder's state at every source position;
    * ``mask``: ``(B, S)`` bool, ``True`` at real source tokens;
    * ``state``: ``(B, H)`` the decoder's initial state;
    * ``context``: ``(B, A)`` a fixed context vector (the seq2seq summary ``c``), or ``None``;
    * ``keys``: ``(B, S, K)`` the memory pre-projected for an attention score, or ``None``.
    """

    memory: Tensor
    mask: Tensor
    state: Tensor
    context: Tensor | None = None
    keys: Tensor | None = None


class StepOutput(NamedTuple):
    """What ``decode_step`` returns: ``logits`` ``(B, V)``, the new ``state`` ``(B, H)`` and the
    attention ``weights`` ``(B, S)`` over the source (``None`` for a model without attention)."""

    logits: Tensor
    state: Tensor
    weights: Tensor | None = None


def check_source(src: Tensor, src_mask: Tensor, who: str, max_source_len: int | None = None,
                 vocab_size: int | None = None) -> None:
    """Raise a clear error unless ``src`` is ``(B, S)`` integer ids (in ``[0, vocab_size)`` when
    given) and ``src_mask`` a matching bool mask whose rows are left-aligned and non-empty (and no
    longer than ``max_source_len``)."""
    if not isinstance(src, Tensor) or not isinstance(src_mask, Tensor):
        raise TypeError(f"{who}: src and src_mask must be tensors, got {type(src).__name__} and "
                        f"{type(src_mask).__name__}")
    if src.dim() != 2:
        raise ValueError(f"{who}: src must be (batch, source_len) token ids, got shape {tuple(src.shape)}")
    if src.is_floating_point() or src.dtype == torch.bool or src.is_complex():
        raise TypeError(f"{who}: src must hold integer token ids, got dtype {src.dtype}")
    if src_mask.shape != src.shape:
        raise ValueError(f"{who}: src_mask {tuple(src_mask.shape)} must have src's shape {tuple(src.shape)}")
    if src_mask.dtype != torch.bool:
        raise TypeError(f"{who}: src_mask must be a bool tensor (True at real tokens), got {src_mask.dtype}")
    if src.shape[0] == 0 or src.shape[1] == 0:
        raise ValueError(f"{who}: empty batch (src has shape {tuple(src.shape)})")
    if _checked_on_host(src) and _checked_on_host(src_mask):
        return  # its values were checked on the CPU (see host_checked): nothing to read back
    lengths = src_mask.sum(dim=1)
    if bool((lengths == 0).any()):
        rows = torch.nonzero(lengths == 0).flatten().tolist()[:5]
        raise ValueError(f"{who}: source row(s) {rows} have no tokens (an empty sentence)")
    aligned = torch.arange(src.shape[1], device=src.device)[None, :] < lengths[:, None]
    if not torch.equal(aligned, src_mask):
        raise ValueError(f"{who}: src_mask must be True for a prefix of each row (padding at the end)")
    if max_source_len is not None and int(lengths.max()) > max_source_len:
        raise ValueError(f"{who}: a source of {int(lengths.max())} tokens (EOS included) is longer than "
                         f"this model's max_source_len={max_source_len}")
    check_ids(src, vocab_size, who, "src")


def check_ids(ids: Tensor, vocab_size: int | None, who: str, what: str) -> None:
    """Raise ``ValueError`` naming the offending id when ``ids`` holds one outside ``[0, vocab_size)``."""
    if vocab_size is None or ids.numel() == 0 or _checked_on_host(ids):
        return
    _check_id_range(int(ids.min()), int(ids.max()), vocab_size, who, what)


def _check_id_range(low: int, high: int, vocab_size: int | None, who: str, what: str) -> None:
    if vocab_size is not None and (low < 0 or high >= vocab_size):
        bad = low if low < 0 else high
        raise ValueError(f"{who}: {what} holds the id {bad}, outside the vocabulary of {vocab_size} tokens "
                         "(was it encoded with another vocabulary?)")


# ---------------------------------------------------------------- values checked on the host
# A check that reads a tensor's values (``int(ids.max())``, ``lengths.cpu()``) makes the host wait
# for the device: several per step halve the speed of a small model on a GPU. A Batch made by
# make_batch knows those values from the CPU (HostFacts), so translation_loss checks them there
# and marks the batch's tensors, by identity, for the duration of the model call.
_HOST_CHECKED: ContextVar[tuple[tuple[Tensor, ...], Tensor | None, Tensor | None]] = ContextVar(
    "tfmlib_host_checked", default=((), None, None))


def _checked_on_host(t: Tensor) -> bool:
    return any(t is known for known in _HOST_CHECKED.get()[0])


def host_lengths(src_mask: Tensor) -> Tensor:
    """The row lengths of ``src_mask`` ``(B, S)`` as a CPU ``long`` tensor ``(B,)`` (what
    ``pack_padded_sequence`` takes): from :class:`~tfmlib.data.HostFacts` when ``src_mask`` is
    inside :func:`host_checked`, else read back from the device."""
    _, mask, lengths = _HOST_CHECKED.get()
    if mask is not None and src_mask is mask:
        return lengths
    return src_mask.sum(dim=1).cpu()


@contextmanager
def host_checked(batch: Batch, who: str, max_source_len: int | None = None,
                 src_vocab_size: int | None = None, tgt_vocab_size: int | None = None) -> Iterator[bool]:
    """Check ``batch`` from its :class:`~tfmlib.data.HostFacts` (no value read from the device),
    then, inside the ``with``, let :func:`check_source`, :func:`check_ids` and
    :func:`host_lengths` take ``batch.src``, ``batch.src_mask`` and ``batch.tgt_in`` as checked.

    Raises the errors :func:`check_source` and :func:`check_ids` would (naming ``who``). A batch
    without facts (built by hand, or whose tensors were replaced) is left to those checks as
    before; the ``with`` yields whether the facts were used.
    """
    facts: HostFacts | None = batch.host_facts
    if facts is None:
        yield False
        return
    longest = max(facts.src_lengths)
    if max_source_len is not None and longest > max_source_len:
        raise ValueError(f"{who}: a source of {longest} tokens (EOS included) is longer than "
                         f"this model's max_source_len={max_source_len}")
    _check_id_range(*facts.src_ids, src_vocab_size, who, "src")
    _check_id_range(*facts.tgt_ids, tgt_vocab_size, who, "tgt_in")
    lengths = torch.tensor(facts.src_lengths, dtype=torch.long)
    token = _HOST_CHECKED.set(((batch.src, batch.src_mask, batch.tgt_in), batch.src_mask, lengths))
    try:
        yield True
    finally:
        _HOST_CHECKED.reset(token)


class GRUEncoder(nn.Module):
    """Embed the source ids and run a GRU over them, reading only the real tokens.

    ``forward(src (B, S), src_mask (B, S)) -> (states (B, S, A), final (directions, B, H))``
    where ``A = directions * H``. Padded positions of ``states`` are zero. Sequences are packed,
    so the final state of each row is its state after its own last real token, however much
    padding follows it.
    """

    def __init__(self, vocab_size: int, embed: int, hidden: int, *, bidirectional: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed, padding_idx=PAD_ID)
        self.rnn = nn.GRU(embed, hidden, batch_first=True, bidirectional=bidirectional)
        self.dropout = nn.Dropout(dropout)
        self.directions = 2 if bidirectional else 1
        self.hidden = hidden

    @property
    def state_size(self) -> int:
        return self.directions * self.hidden

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        # What pack_padded_sequence(enforce_sorted=False) and pad_packed_sequence do, with the
        # sorting done on the CPU lengths: pad_packed_sequence would read its permutation back from
        # the device (a host sync per call) only to return lengths we already know.
        lengths, order = torch.sort(host_lengths(src_mask), descending=True)
        unorder = torch.empty_like(order)
        unorder[order] = torch.arange(order.numel())
        order, unorder = order.to(src.device), unorder.to(src.device)
        packed = pack_padded_sequence(self.dropout(self.embed(src)).index_select(0, order), lengths,
                                      batch_first=True)
        states, final = self.rnn(packed)
        states, _ = pad_packed_sequence(states, batch_first=True, total_length=src.shape[1])
        return states.index_select(0, unorder), final.index_select(1, unorder)


class DeepOutput(nn.Module):
    """The output layer of Cho et al. (2014) and Bahdanau et al. (2014, eq. 4 and A.2.2).

    ``t = maxout(W [s; c; E y_prev])`` (pairs of units, their max), then ``logits = W_o t``.
    ``s`` is the decoder state after the step, as in Bahdanau et al.'s eq. (4); their appendix
    A.2.2 writes the previous state instead, an inconsistency of the paper.
    ``forward(state (..., H), context (..., A), prev_embedded (..., E)) -> (..., V)``.
    """

    def __init__(self, hidden: int, context: int, embed: int, vocab_size: int, maxout_units: int,
                 dropout: float = 0.0):
        super().__init__()
        self.pre = nn.Linear(hidden + context + embed, 2 * maxout_units)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(maxout_units, vocab_size)

    def forward(self, state: Tensor, context: Tensor, prev_embedded: Tensor) -> Tensor:
        t = self.pre(torch.cat([state, context, prev_embedded], dim=-1))
        t = t.unflatten(-1, (-1, 2)).amax(dim=-1)            # maxout over pairs of units
        return self.out(self.dropout(t))


class EncoderDecoder(nn.Module):
    """Base class of the book's translation models.

    A subclass sets ``max_source_len`` (and ``src_vocab_size``/``tgt_vocab_size``, so that ids
    from another vocabulary get a clear error) and implements

    * ``encode(src (B, S), src_mask (B, S)) -> EncoderOutput``;
    * ``decode_step(prev (B,), state (B, H), enc) -> StepOutput``: one target step, reading the
      previous target token (BOS at the first step).

    It may override ``decode_teacher_forced`` with a faster whole-sequence version.
    """

    max_source_len: int

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        raise NotImplementedError

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        raise NotImplementedError

    def decode_teacher_forced(self, tgt_in: Tensor, enc: EncoderOutput) -> Tensor:
        """Logits ``(B, T, V)`` when every step reads the reference previous token."""
        state, logits = enc.state, []
        for t in range(tgt_in.shape[1]):
            step = self.decode_step(tgt_in[:, t], state, enc)
            state = step.state
            logits.append(step.logits)
        return torch.stack(logits, dim=1)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, teacher_forcing: float = 1.0,
                generator: torch.Generator | None = None) -> Tensor:
        """Logits ``(B, T, V)`` for the targets ``tgt_out`` that follow ``tgt_in`` ``(B, T)``.

        With ``teacher_forcing=1`` every step reads the reference previous token. With a value
        ``p < 1``, each step of each sentence reads the reference with probability ``p`` and the
        model's own previous prediction (its argmax) otherwise; ``p=0`` is free running.
        """
        check_source(src, src_mask, type(self).__name__, self.max_source_len,
                     getattr(self, "src_vocab_size", None))
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0] or tgt_in.shape[1] == 0:
            raise ValueError(f"{type(self).__name__}: tgt_in must be (batch={src.shape[0]}, "
                             f"target_len >= 1), got shape {tuple(tgt_in.shape)}")
        check_ids(tgt_in, getattr(self, "tgt_vocab_size", None), type(self).__name__, "tgt_in")
        if not 0.0 <= teacher_forcing <= 1.0:
            raise ValueError(f"teacher_forcing must be in [0, 1], got {teacher_forcing}")
        enc = self.encode(src, src_mask)
        if teacher_forcing == 1.0:
            return self.decode_teacher_forced(tgt_in, enc)
        state, prev, logits = enc.state, tgt_in[:, 0], []
        for t in range(tgt_in.shape[1]):
            step = self.decode_step(prev, state, enc)
            state = step.state
            logits.append(step.logits)
            if t + 1 < tgt_in.shape[1]:
                use_reference = torch.rand(prev.shape, generator=generator,
                                           device="cpu").to(prev.device) < teacher_forcing
                own = step.logits.argmax(dim=-1)
                prev = torch.where(use_reference, tgt_in[:, t + 1], own)
        return torch.stack(logits, dim=1)


class Seq2Seq(EncoderDecoder):
    """The RNN encoder-decoder with a fixed-length summary (Cho et al. 2014, section 2).

    The encoder's last state (both directions' last states, joined, when ``bidirectional``) is
    the summary ``c`` of shape ``(B, A)``. The decoder starts from ``s_0 = tanh(W_init c)`` and,
    at every step, reads ``[E y_prev; c]``; its output layer sees ``[s_i; c; E y_prev]``
    (:class:`DeepOutput`). Nothing else of the source reaches the decoder: every word must pass
    through ``c``.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, embed: int = 128, hidden: int = 256,
                 bidirectional: bool = False, dropout: float = 0.0, max_source_len: int = 100):
        super().__init__()
        for name, value in [("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
                            ("embed", embed), ("hidden", hidden), ("max_source_len", max_source_len)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Seq2Seq: {name} must be a positive int, got {value!r}")
        self.max_source_len = max_source_len
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.encoder = GRUEncoder(src_vocab_size, embed, hidden, bidirectional=bidirectional, dropout=dropout)
        A = self.encoder.state_size
        self.init_state = nn.Linear(A, hidden)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, embed, padding_idx=PAD_ID)
        self.decoder = nn.GRU(embed + A, hidden, batch_first=True)
        self.output = DeepOutput(hidden, A, embed, tgt_vocab_size, maxout_units=hidden, dropout=dropout)
        self.dropout = nn.Dropout(dropout)

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        states, final = self.encoder(src, src_mask)
        context = torch.cat(list(final), dim=-1)                   # (B, A): the whole sentence
        return EncoderOutput(states, src_mask, torch.tanh(self.init_state(context)), context)

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        e = self.dropout(self.tgt_embed(prev))                     # (B, E)
        out, new_state = self.decoder(torch.cat([e, enc.context], -1)[:, None], state[None])
        s = out[:, 0]                                              # (B, H)
        return StepOutput(self.output(s, enc.context, e), new_state[0])

    def decode_teacher_forced(self, tgt_in: Tensor, enc: EncoderOutput) -> Tensor:
        # All steps at once: the decoder's inputs are known in advance under teacher forcing.
        e = self.dropout(self.tgt_embed(tgt_in))                   # (B, T, E)
        c = enc.context[:, None].expand(-1, tgt_in.shape[1], -1)   # (B, T, A)
        states, _ = self.decoder(torch.cat([e, c], -1), enc.state[None])
        return self.output(states, c, e)


def translation_loss(model: nn.Module, batch: Batch, teacher_forcing: float = 1.0,
                     label_smoothing: float = 0.0) -> tuple[Tensor, int]:
    """Mean cross-entropy over the real target tokens of ``batch``, and how many there were.

    Padded target positions (``PAD_ID`` in ``tgt_out``) do not count, so a sentence's loss does
    not depend on how long its batch neighbours are. ``model(src, src_mask, tgt_in, ...)`` must
    return logits ``(B, T, V)``. A batch from :func:`~tfmlib.data.make_batch` is counted and
    checked from its CPU-side facts (:func:`host_checked`): no step waits for the device to read
    a length, a count or an id back.
    """
    if not isinstance(batch, Batch):
        raise TypeError(f"translation_loss: expected a Batch, got {type(batch).__name__}")
    n_tokens = batch.num_target_tokens
    if n_tokens == 0:
        raise ValueError("translation_loss: the batch has no target tokens")
    with host_checked(batch, type(model).__name__, getattr(model, "max_source_len", None),
                      getattr(model, "src_vocab_size", None), getattr(model, "tgt_vocab_size", None)):
        if teacher_forcing == 1.0:
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
        else:
            logits = model(batch.src, batch.src_mask, batch.tgt_in, teacher_forcing=teacher_forcing)
    if logits.shape[:2] != batch.tgt_out.shape:
        raise ValueError(f"translation_loss: logits {tuple(logits.shape)} do not match the targets "
                         f"{tuple(batch.tgt_out.shape)}")
    loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD_ID,
                           label_smoothing=label_smoothing)
    return loss, n_tokens


def train_translator(
    model: EncoderDecoder,
    dataset: TranslationDataset,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    device: torch.device | str = "cpu",
    seed: int = 0,
    teacher_forcing: float = 1.0,
    max_steps: int | None = None,
    time_budget_s: float | None = None,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    eval_every: int | None = None,
    clip_norm: float = 1.0,
    label_smoothing: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
    warmup_steps: int | None = None,
    desc: str = "train",
    verbose: bool = True,
) -> tuple[History, torch.optim.Optimizer]:
    """The book's recipe for a translation model: Adam, length-bucketed shuffled batches, the
    gradient norm clipped to ``clip_norm``, :func:`translation_loss`. Returns the history and the
    optimizer (to save in a checkpoint). The same ``seed`` gives the same batches in the same order.
    ``max_steps`` and ``time_budget_s`` stop training early; ``eval_fn`` runs after every epoch,
    or every ``eval_every`` steps (see :func:`~tfmlib.train.fit`).

    Chapter 08 trains the Transformer with the paper's settings: ``label_smoothing`` (0.1),
    Adam's ``betas`` (0.9, 0.98) and ``adam_eps`` (1e-9), and ``warmup_steps``, which makes ``lr``
    the peak of :func:`~tfmlib.train.warmup_inverse_sqrt`'s schedule (a constant ``lr`` when
    ``None``).

    On Apple's MPS a model with PyTorch's recurrent modules (the GRU encoders) trains on the CPU
    instead, with a printed line saying so (:func:`~tfmlib.rnn.recurrent_device`): their MPS
    kernels are known to fail in the backward pass of packed sequences and to give NaN.
    """
    wanted = torch.device(device)
    device = recurrent_device(wanted, model)
    if device != wanted:
        print(f"train_translator: {type(model).__name__} trains on the {device.type.upper()}, not "
              f"{wanted}: PyTorch's recurrent modules are known to fail there "
              f"({', '.join(MPS_RNN_ISSUES.values())})")
    torch.manual_seed(seed)
    loader = make_loader(dataset, batch_size, shuffle=True, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=adam_eps)
    scheduler = None if warmup_steps is None else \
        torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_inverse_sqrt(warmup_steps))

    def loss_fn(m: nn.Module, batch: Batch) -> tuple[Tensor, int]:
        return translation_loss(m, batch, teacher_forcing=teacher_forcing, label_smoothing=label_smoothing)

    history = fit(model, loader, loss_fn, optimizer, epochs=epochs, device=device, clip_norm=clip_norm,
                  eval_fn=eval_fn, eval_every=eval_every, scheduler=scheduler, max_steps=max_steps,
                  time_budget_s=time_budget_s, desc=desc, verbose=verbose)
    return history, optimizer


def count_parameters(model: nn.Module, by_child: bool = False) -> int | dict[str, int]:
    """Trainable parameters of ``model`` (or a dict per direct child module)."""
    if by_child:
        return {name: sum(p.numel() for p in child.parameters() if p.requires_grad)
                for name, child in model.named_children()}
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def first_token_batch(batch_size: int, device: torch.device | str = "cpu") -> Tensor:
    """``(B,)`` BOS ids: what every decoder reads at its first step."""
    return torch.full((batch_size,), BOS_ID, dtype=torch.long, device=device)

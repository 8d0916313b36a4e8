"""Checkers for chapter 02 (seq2seq).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("02.name", answer)``.

The exercises ask for what the chapter discusses but does not build: Sutskever et al.'s decoder,
which sees the sentence vector only in its first state (Question 1); teacher-forced accuracy by
target position, which separates the bottleneck from exposure bias; the loss averaged per
sentence as each sentence's mean token loss (Question 3 sums them instead); and the reversed
source that the solutions train. ``02.padding_mask`` is a warm-up (and the example chapter 00's
tests use for the ``check`` API).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .core import Wrong, checker, expect_close, mask_mismatch

PAD = 0  # tfmlib.data.PAD_ID, which these checkers build their cases with


# ----------------------------------------------------------------------------- shared cases


def _padded_logits_and_targets(seed: int, pad_wins: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(B, T, V)`` logits and ``(B, T)`` targets of very different lengths, PAD after each
    row's end. ``pad_wins``: the logits' argmax is PAD at some padded positions (and right elsewhere
    often enough), so that counting padded positions shows."""
    g = torch.Generator().manual_seed(seed)
    B, T, V = 5, 8 + seed, 6 + seed % 3
    lengths = torch.tensor([T, 1, T - 2, 3, 2])
    targets = torch.randint(1, V, (B, T), generator=g)
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = PAD
    logits = torch.randn(B, T, V, generator=g) * 2
    if pad_wins:
        right = torch.rand(B, T, generator=g) < 0.5
        logits += 6 * F.one_hot(targets, V) * right[..., None]     # about half the positions right
        logits[..., PAD] += 8 * (targets == PAD)                     # and PAD "predicted" at the padding
    return logits, targets


# ----------------------------------------------------------------------------- sentence-mean loss


def _token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")    # (B, T)


@checker(
    "02.sentence_mean_loss",
    hint=("section 4 averages over all the batch's tokens and Question 3 sums each sentence's token "
          "losses; this exercise averages them within each sentence, so that each sentence counts once "
          "whatever its length; padding belongs to no sentence, so it must not enter any sentence's "
          "average, and a sentence's length is its own, not the batch's"),
)
def _check_sentence_mean_loss(
        sentence_mean_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    for seed in range(4):
        logits, targets = _padded_logits_and_targets(seed)
        nll, real = _token_nll(logits, targets), targets != PAD
        lengths = real.sum(1)
        want = ((nll * real).sum(1) / lengths).mean()
        got = sentence_mean_loss(logits.clone(), targets.clone())
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            raise Wrong(f"return one number (a 0-d tensor), the mean over the sentences; got shape "
                        f"{tuple(got.shape)}")
        known = [
            (nll[real].mean(), "that is the mean over all real tokens (what ignore_index gives): a "
                               "long sentence weighs as much as its tokens; here each sentence counts once"),
            (nll.mean(1).mean(), "padding counted: a sentence's mean runs over its real tokens only"),
            ((nll * real).sum(1).mean(), "that is Question 3's sum per sentence: here each sentence's loss "
                                         "is the mean of its tokens' losses, not their sum"),
            (((nll * real).sum(1) / targets.shape[1]).mean(), "divide each sentence's sum by its own length, "
                                                               "not by the padded width"),
            (((nll * real).sum(0) / real.sum(0).clamp(min=1)).mean(),
             "you averaged over the sentences at each position first: average over each sentence's "
             "positions first, then over the sentences"),
        ]
        for value, message in known:
            if isinstance(got, torch.Tensor) and torch.allclose(got.double(), value.double(), atol=1e-5) \
                    and not torch.allclose(value, want, atol=1e-5):
                raise Wrong(message)
        expect_close(got, want, f"sentence_mean_loss(logits {tuple(logits.shape)}, "
                                f"targets {tuple(targets.shape)})")


# ----------------------------------------------------------------------------- accuracy by position


@checker(
    "02.accuracy_by_position",
    hint=("section 1 says what the decoder reads and what it must predict at each position, and where the "
          "padding is; a position's accuracy needs no loss, only the model's most probable word, counted "
          "over the real tokens at that position"),
)
def _check_accuracy_by_position(accuracy: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
    for seed in range(4):
        logits, targets = _padded_logits_and_targets(seed, pad_wins=True)
        real = targets != PAD
        correct = logits.argmax(-1) == targets
        want_hits, want_counts = (correct & real).sum(0), real.sum(0)
        got = accuracy(logits.clone(), targets.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong(f"return a pair (hits (T,), counts (T,)); got {type(got).__name__}")
        hits, counts = got
        T = targets.shape[1]
        for value, what in ((hits, "hits"), (counts, "counts")):
            if not isinstance(value, torch.Tensor):
                raise Wrong(f"{what} should be a tensor, got {type(value).__name__}")
            if value.shape == (targets.shape[0],):
                raise Wrong(f"{what} has one entry per sentence (B,): count per target position, "
                            f"(T,) = ({T},)")
            if value.shape != (T,):
                raise Wrong(f"{what} should have shape ({T},), one entry per target position, got "
                            f"{tuple(value.shape)}")
            if value.is_floating_point() and not torch.equal(value, value.round()):
                raise Wrong(f"{what} should be counts (whole numbers), not fractions: return hits and "
                            "counts, and divide where you need the accuracy")
        if torch.equal(counts.long(), torch.full((T,), targets.shape[0])):
            raise Wrong("counts: count only the real target tokens at each position, not every sentence "
                        "(padding is no target)")
        expect_close(counts.double(), want_counts.double(), "counts (T,)")
        if torch.equal(hits.long(), correct.sum(0)):
            raise Wrong("hits: a padded position where the model's argmax is PAD is no hit; count real "
                        "tokens only")
        shifted = torch.zeros(T, dtype=torch.long)
        shifted[:-1] = ((logits[:, :-1].argmax(-1) == targets[:, 1:]) & real[:, 1:]).sum(0)
        if torch.equal(hits.long(), shifted) and not torch.equal(shifted, want_hits):
            raise Wrong("hits: the logits at position t already predict targets[:, t] (the targets are the "
                        "shifted sequence, section 1); don't shift again")
        expect_close(hits.double(), want_hits.double(), "hits (T,)")


# ----------------------------------------------------------------------------- c only in s_0


def _first_state_cases() -> tuple[torch.Tensor, ...]:
    from tfmlib.data import pad_sequences

    src, mask = pad_sequences([[3, 4, 5, 6, 7, 2], [8, 9, 2], [10, 2]])
    other, other_mask = pad_sequences([[9, 8, 7, 6, 5, 2], [4, 3, 2], [5, 2]])
    g = torch.Generator().manual_seed(0)
    tgt_in = torch.randint(3, 13, (3, 6), generator=g)
    tgt_in[:, 0] = 1  # BOS_ID
    return src, mask, other, other_mask, tgt_in


@checker(
    "02.first_state_only",
    hint=("section 3 says where Cho et al. and Sutskever et al. differ: after s_0, neither the decoder's "
          "GRU nor its output layer may be given the summary, so their input sizes change; keep the "
          "whole-sequence path and the one-step path (section 7's decoder calls it) in agreement"),
)
def _check_first_state_only(model_class: Any) -> None:
    from tfmlib.seq2seq import EncoderDecoder

    torch.manual_seed(0)
    try:
        model = model_class(11, 13, embed=6, hidden=8)
    except TypeError as e:
        raise Wrong("build it as model_class(src_vocab_size, tgt_vocab_size, embed=..., hidden=...): "
                    f"{e}") from e
    if not isinstance(model, EncoderDecoder):
        raise Wrong(f"make it a subclass of Seq2Seq (or EncoderDecoder), got {type(model).__name__}")
    model.eval()
    src, mask, other, other_mask, tgt_in = _first_state_cases()
    B, T = tgt_in.shape
    with torch.no_grad():  # the cheapest probes first: a wrong model class fails fast
        enc = model.encode(src, mask)
        if not isinstance(enc.state, torch.Tensor) or enc.state.shape != (B, 8):
            raise Wrong(f"encode should return the first decoder state s_0 of shape {(B, 8)} in .state")
        logits = model.decode_teacher_forced(tgt_in, enc)
        if not isinstance(logits, torch.Tensor) or logits.shape != (B, T, 13):
            raise Wrong(f"decode_teacher_forced(tgt_in, enc) should give logits of shape {(B, T, 13)}, got "
                        f"{getattr(logits, 'shape', type(logits).__name__)}")
        noise = torch.Generator().manual_seed(1)
        noisy = enc._replace(
            memory=torch.randn(enc.memory.shape, generator=noise),
            context=None if enc.context is None else torch.randn(enc.context.shape, generator=noise),
            keys=None if enc.keys is None else torch.randn(enc.keys.shape, generator=noise))
        if not torch.allclose(model.decode_teacher_forced(tgt_in, noisy), logits, atol=1e-6):
            raise Wrong("the decoder still reads the source after s_0 (the summary c or the encoder states "
                        "changed the output when s_0 did not): c may only set the first state")
        if torch.allclose(model.encode(other, other_mask).state, enc.state, atol=1e-6):
            raise Wrong("s_0 is the same for different sources: the first state must be made from the "
                        "summary c (it is the only way the source reaches this decoder)")
        if not torch.allclose(model(src, mask, tgt_in), logits, atol=1e-6):
            raise Wrong("model(src, src_mask, tgt_in) and decode_teacher_forced disagree: keep forward "
                        "as Seq2Seq has it")
        state, steps = enc.state, []
        for t in range(T):
            step = model.decode_step(tgt_in[:, t], state, enc)
            state = step.state
            steps.append(step.logits)
        by_step = torch.stack(steps, 1)
        if not torch.allclose(by_step, logits, atol=1e-5):
            gap = (by_step - logits).abs().max().item()
            raise Wrong("decode_step, applied step by step, disagrees with the whole-sequence "
                        f"(teacher-forced) path (max difference {gap:.3g}): greedy decoding would not "
                        "translate with the model you trained")
        moved = enc._replace(state=enc.state.flip(0))
        if torch.allclose(model.decode_teacher_forced(tgt_in, moved), logits, atol=1e-6):
            raise Wrong("the output does not depend on s_0: the decoder must start from the state encode "
                        "returns")
        changed = tgt_in.clone()
        changed[:, 1] = torch.where(changed[:, 1] == 3, 4, 3)
        late = model.decode_teacher_forced(changed, enc)[:, 3:]
        if torch.allclose(late, logits[:, 3:], atol=1e-6):
            raise Wrong("changing the word at step 1 changed nothing at steps 3 and later: the decoder must "
                        "carry its state from step to step")
        # s_0 is where the recurrence starts, not an input: decode_step is handed its state, so nothing
        # of enc (s_0 included) may matter to it, and restarting the fast path from the state after
        # step 1 must give the same later logits (a decoder fed s_0 at every step fails both).
        s0_reused = ("s_0 reaches a later step other than through the recurrence: it may only be the first "
                     "state (decode_step is handed its state; neither the GRU's input nor the output layer "
                     "may read enc.state, enc.context or enc.memory)")
        blind = enc._replace(
            state=torch.randn(enc.state.shape, generator=noise),
            memory=torch.randn(enc.memory.shape, generator=noise),
            context=None if enc.context is None else torch.randn(enc.context.shape, generator=noise),
            keys=None if enc.keys is None else torch.randn(enc.keys.shape, generator=noise))
        state, steps = enc.state, []
        for t in range(T):
            step = model.decode_step(tgt_in[:, t], state, blind)
            state = step.state
            steps.append(step.logits)
        if not torch.allclose(torch.stack(steps, 1), logits, atol=1e-5):
            raise Wrong(s0_reused)
        after_first = model.decode_step(tgt_in[:, 0], enc.state, enc).state
        restarted = model.decode_teacher_forced(tgt_in[:, 1:], enc._replace(state=after_first))
        if not torch.allclose(restarted, logits[:, 1:], atol=1e-5):
            raise Wrong(s0_reused)


# ----------------------------------------------------------------------------- reversed source


def _reverse_source_reference(src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
    out = src.clone()
    for i, n in enumerate(src_mask.sum(dim=1).tolist()):
        out[i, : n - 1] = src[i, : n - 1].flip(0)  # the words; EOS stays at n - 1
    return out


@checker(
    "02.reverse_source",
    hint=("section 1 shows the layout of a source row (words, then the end token, then padding); the mask "
          "gives each row's length, and only the words before the end token change places"),
)
def _check_reverse_source(reverse_source: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    from tfmlib.data import EOS_ID, pad_sequences

    cases = [[[5, 6, 7], [8], [9, 10]], [[4, 5, 6, 7, 8]], [[11, 12], [13, 14, 15, 16]]]
    for rows in cases:
        src, mask = pad_sequences([r + [EOS_ID] for r in rows])
        want = _reverse_source_reference(src, mask)
        given = src.clone()
        got = reverse_source(given, mask.clone())
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a tensor like src, got {type(got).__name__}")
        if not torch.equal(given, src):
            raise Wrong("you changed src in place: return a new tensor and leave the batch as it was")
        if got.shape != src.shape:
            raise Wrong(f"the result should keep src's shape {tuple(src.shape)}, got {tuple(got.shape)}")
        if torch.equal(got, src.flip(1)) and not torch.equal(want, src.flip(1)):
            raise Wrong("you flipped whole rows: the padding and EOS moved to the front; reverse "
                        "only each row's words")
        if torch.equal(got, src) and not torch.equal(want, src):
            raise Wrong("the source came back unchanged")
        if not torch.equal(got, want):
            raise Wrong(f"for sources {src.tolist()} expected {want.tolist()}, got {got.tolist()}")


# ----------------------------------------------------------------------------- padding mask (warm-up)


@checker(
    "02.padding_mask",
    hint=("section 1 draws this mask for three sentences of different lengths: a cell is real when its "
          "position comes before the sentence's length; tensors of different shapes can be compared "
          "without a loop"),
)
def _check_padding_mask(padding_mask: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    for lengths, max_len in [([3, 1, 2], 3), ([1], 4), ([5, 5], 5), ([2, 4, 1, 3], 6)]:
        got = padding_mask(torch.tensor(lengths), max_len)
        want = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise Wrong(f"the mask should be a bool tensor, got dtype {got.dtype}")
        if got.shape != want.shape:
            raise Wrong(f"for lengths {lengths} and max_len {max_len} the mask should have shape "
                        f"{tuple(want.shape)}, got {tuple(got.shape)}")
        if not torch.equal(got, want):
            raise Wrong(mask_mismatch(got, want, f"for lengths {lengths} and max_len {max_len} "
                                                 "(True at real tokens)"))

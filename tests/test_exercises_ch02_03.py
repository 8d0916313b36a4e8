"""Chapter 02 and 03 exercise checkers accept the reference solutions and reject typical wrong answers."""

import pytest
import torch
import torch.nn.functional as F
from test_exercises import _accepts, _rejects  # the helpers of chapter 01's checker tests
from torch import nn

from tfmlib import exercises
from tfmlib.data import padding_fraction
from tfmlib.seq2seq import DeepOutput, Seq2Seq, StepOutput


def _any_stub(*args, **kwargs):  # chapter 02's first_state_only is a class, built with keywords
    raise NotImplementedError


@pytest.mark.parametrize("chapter", [2, 3])
def test_check_api_never_raises_without_must_pass(chapter, capsys):
    assert exercises.names(chapter), f"chapter {chapter} registers no exercises"
    for name in exercises.names(chapter):
        assert not exercises.check(name, _any_stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a, **k: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


def _rejects_with(name, fn, diagnosis, capsys):
    """``fn`` is rejected, and the message names the mistake (``diagnosis`` is part of it)."""
    capsys.readouterr()
    _rejects(name, fn)
    out = capsys.readouterr().out
    assert "not correct yet" in out and diagnosis in out, out


# ----------------------------------------------------------------------------- chapter 02


def _nll(logits, targets):
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


def sentence_mean_loss_ref(logits, targets):
    real = targets != 0
    return ((_nll(logits, targets) * real).sum(1) / real.sum(1)).mean()


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (lambda lg, t: F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=0), "what ignore_index gives"),
    (lambda lg, t: _nll(lg, t).mean(1).mean(), "padding counted"),
    (lambda lg, t: (_nll(lg, t) * (t != 0)).sum(1).mean(), "Question 3's sum per sentence"),
    (lambda lg, t: ((_nll(lg, t) * (t != 0)).sum(1) / t.shape[1]).mean(), "by its own length"),
    (lambda lg, t: ((_nll(lg, t) * (t != 0)).sum(0) / (t != 0).sum(0)).mean(), "at each position first"),
    (lambda lg, t: (_nll(lg, t) * (t != 0)).sum(1) / (t != 0).sum(1), "return one number"),
], ids=["ignore-index-token-mean", "counts-padding", "sentence-sum", "padded-width",
        "position-first", "not-reduced"])
def test_02_sentence_mean_loss(wrong, diagnosis, capsys):  # review 2026-11-27-exercises-00-03, finding 8
    _accepts("02.sentence_mean_loss", sentence_mean_loss_ref)
    _rejects_with("02.sentence_mean_loss", wrong, diagnosis, capsys)


def accuracy_ref(logits, targets):
    real = targets != 0
    return ((logits.argmax(-1) == targets) & real).sum(0), real.sum(0)


def _shifted_hits(logits, targets):
    hits = torch.zeros(targets.shape[1], dtype=torch.long)
    hits[:-1] = ((logits[:, :-1].argmax(-1) == targets[:, 1:]) & (targets[:, 1:] != 0)).sum(0)
    return hits, (targets != 0).sum(0)


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (lambda lg, t: ((lg.argmax(-1) == t).sum(0), torch.full((t.shape[1],), t.shape[0])),
     "count only the real"),
    (lambda lg, t: ((lg.argmax(-1) == t).sum(0), (t != 0).sum(0)),
     "a padded position where the model's argmax"),
    (lambda lg, t: (((lg.argmax(-1) == t) & (t != 0)).sum(1), (t != 0).sum(1)), "one entry per sentence"),
    (_shifted_hits, "don't shift again"),
    (lambda lg, t: (accuracy_ref(lg, t)[0] / accuracy_ref(lg, t)[1].clamp(min=1),
                    accuracy_ref(lg, t)[1].float()), "should be counts"),
    (lambda lg, t: (((lg[:, 1:].argmax(-1) == t[:, :-1]) & (t[:, :-1] != 0)).sum(0), (t[:, :-1] != 0).sum(0)),
     "should have shape"),
    (lambda lg, t: accuracy_ref(lg, t)[0], "return a pair"),
], ids=["counts-padding", "hits-at-padding", "per-sentence", "shifted", "fractions", "shifted-back",
        "hits-only"])
def test_02_accuracy_by_position(wrong, diagnosis, capsys):
    _accepts("02.accuracy_by_position", accuracy_ref)
    _rejects_with("02.accuracy_by_position", wrong, diagnosis, capsys)


class FirstStateRef(Seq2Seq):
    """Sutskever et al.'s decoder: c sets s_0, and nothing after it."""

    def __init__(self, src_vocab_size, tgt_vocab_size, *, embed=128, hidden=256, **kwargs):
        super().__init__(src_vocab_size, tgt_vocab_size, embed=embed, hidden=hidden, **kwargs)
        self.decoder = nn.GRU(embed, hidden, batch_first=True)
        self.output = DeepOutput(hidden, 0, embed, tgt_vocab_size, maxout_units=hidden)

    def decode_step(self, prev, state, enc):
        e = self.tgt_embed(prev)
        out, new_state = self.decoder(e[:, None], state[None])
        return StepOutput(self.output(out[:, 0], out[:, 0, :0], e), new_state[0])

    def decode_teacher_forced(self, tgt_in, enc):
        e = self.tgt_embed(tgt_in)
        states, _ = self.decoder(e, enc.state[None])
        return self.output(states, states[..., :0], e)


class CInOutputOnly(FirstStateRef):
    """c left in the output layer."""

    def __init__(self, src_vocab_size, tgt_vocab_size, *, embed=128, hidden=256):
        super().__init__(src_vocab_size, tgt_vocab_size, embed=embed, hidden=hidden)
        self.output = DeepOutput(hidden, hidden, embed, tgt_vocab_size, maxout_units=hidden)

    def decode_step(self, prev, state, enc):
        e = self.tgt_embed(prev)
        out, new_state = self.decoder(e[:, None], state[None])
        return StepOutput(self.output(out[:, 0], enc.context, e), new_state[0])

    def decode_teacher_forced(self, tgt_in, enc):
        e = self.tgt_embed(tgt_in)
        states, _ = self.decoder(e, enc.state[None])
        return self.output(states, enc.context[:, None].expand(-1, tgt_in.shape[1], -1), e)


class ZeroFirstState(FirstStateRef):
    """s_0 = 0: the source never reaches the decoder."""

    def encode(self, src, src_mask):
        enc = super().encode(src, src_mask)
        return enc._replace(state=torch.zeros_like(enc.state))


class StaleState(FirstStateRef):
    """decode_step returns the state it was given."""

    def decode_step(self, prev, state, enc):
        return StepOutput(super().decode_step(prev, state, enc).logits, state)


class ShiftedTeacherForcing(FirstStateRef):
    """The fast path reads the next word instead of the previous one."""

    def decode_teacher_forced(self, tgt_in, enc):
        return super().decode_teacher_forced(torch.cat([tgt_in[:, 1:], tgt_in[:, -1:]], 1), enc)


class NoRecurrence(FirstStateRef):
    """Every position restarts from s_0: both paths agree, but nothing is carried."""

    def decode_step(self, prev, state, enc):
        return StepOutput(super().decode_step(prev, enc.state, enc).logits, state)

    def decode_teacher_forced(self, tgt_in, enc):
        return torch.stack([self.decode_step(tgt_in[:, t], enc.state, enc).logits
                            for t in range(tgt_in.shape[1])], 1)


class S0EveryStep(FirstStateRef):
    """s_0 fed to the GRU at every step beside the word: Cho's "c at every step" with tanh(W_init c)
    for c (review 2026-11-27-exercises-00-03, finding 7: the noise probe left enc.state alone)."""

    def __init__(self, src_vocab_size, tgt_vocab_size, *, embed=128, hidden=256):
        super().__init__(src_vocab_size, tgt_vocab_size, embed=embed, hidden=hidden)
        self.decoder = nn.GRU(embed + hidden, hidden, batch_first=True)

    def decode_step(self, prev, state, enc):
        e = self.tgt_embed(prev)
        out, new_state = self.decoder(torch.cat([e, enc.state], -1)[:, None], state[None])
        return StepOutput(self.output(out[:, 0], out[:, 0, :0], e), new_state[0])

    def decode_teacher_forced(self, tgt_in, enc):
        e = self.tgt_embed(tgt_in)
        s0 = enc.state[:, None].expand(-1, tgt_in.shape[1], -1)
        states, _ = self.decoder(torch.cat([e, s0], -1), enc.state[None])
        return self.output(states, states[..., :0], e)


class S0InOutput(FirstStateRef):
    """The output layer reads [s_i; s_0; E y] (review 2026-11-27-exercises-00-03, finding 7)."""

    def __init__(self, src_vocab_size, tgt_vocab_size, *, embed=128, hidden=256):
        super().__init__(src_vocab_size, tgt_vocab_size, embed=embed, hidden=hidden)
        self.output = DeepOutput(hidden, hidden, embed, tgt_vocab_size, maxout_units=hidden)

    def decode_step(self, prev, state, enc):
        e = self.tgt_embed(prev)
        out, new_state = self.decoder(e[:, None], state[None])
        return StepOutput(self.output(out[:, 0], enc.state, e), new_state[0])

    def decode_teacher_forced(self, tgt_in, enc):
        e = self.tgt_embed(tgt_in)
        states, _ = self.decoder(e, enc.state[None])
        return self.output(states, enc.state[:, None].expand_as(states), e)


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (Seq2Seq, "still reads the source after s_0"),
    (CInOutputOnly, "still reads the source after s_0"),
    (ZeroFirstState, "s_0 is the same for different sources"),
    (StaleState, "disagrees with the whole-sequence"),
    (ShiftedTeacherForcing, "disagrees with the whole-sequence"),
    (NoRecurrence, "must carry its state"),
    (S0EveryStep, "s_0 reaches a later step other than through the recurrence"),
    (S0InOutput, "s_0 reaches a later step other than through the recurrence"),
    (lambda src_vocab_size, tgt_vocab_size, embed, hidden: nn.GRU(embed, hidden), "subclass of Seq2Seq"),
], ids=["c-every-step", "c-in-output", "zero-s0", "stale-state", "shifted-fast-path", "no-recurrence",
        "s0-every-step", "s0-in-output", "not-a-model"])
def test_02_first_state_only(wrong, diagnosis, capsys):
    _accepts("02.first_state_only", FirstStateRef)
    _rejects_with("02.first_state_only", wrong, diagnosis, capsys)


def reverse_source_ref(src, mask):
    out = src.clone()
    for i, n in enumerate(mask.sum(1).tolist()):
        out[i, : n - 1] = src[i, : n - 1].flip(0)
    return out


def _reverse_with_eos(src, mask):
    out = src.clone()
    for i, n in enumerate(mask.sum(1).tolist()):
        out[i, :n] = src[i, :n].flip(0)
    return out


def _reverse_keeps_last_word(src, mask):
    out = src.clone()
    for i, n in enumerate(mask.sum(1).tolist()):
        out[i, : n - 2] = src[i, : n - 2].flip(0)
    return out


def _reverse_in_place(src, mask):
    for i, n in enumerate(mask.sum(1).tolist()):
        src[i, : n - 1] = src[i, : n - 1].flip(0).clone()
    return src


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (lambda s, m: s.flip(1), "flipped whole rows"),
    (_reverse_with_eos, "expected"),
    (lambda s, m: s, "came back unchanged"),
    (_reverse_keeps_last_word, "expected"),
    (_reverse_in_place, "changed src in place"),
    (lambda s, m: reverse_source_ref(s, m).tolist(), "return a tensor"),
], ids=["whole-row", "moves-eos", "unchanged", "off-by-one", "in-place", "a-list"])
def test_02_reverse_source(wrong, diagnosis, capsys):
    _accepts("02.reverse_source", reverse_source_ref)
    _rejects_with("02.reverse_source", wrong, diagnosis, capsys)


def right_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (lambda l, m: torch.arange(m)[None, :] <= l[:, None], "expected (left) and yours (right)"),  # off by one
    (lambda l, m: torch.arange(m)[None, :] >= l[:, None], "expected (left) and yours (right)"),  # at padding
    (lambda l, m: (torch.arange(m)[None, :] < l[:, None]).long(), "bool tensor"),
    (lambda l, m: torch.arange(m)[:, None] < l[None, :], "expected (left) and yours (right)"),   # transposed
    (lambda l, m: [[True] * m for _ in l], "return a torch.Tensor"),
], ids=["off-by-one", "true-at-padding", "not-bool", "transposed", "not-a-tensor"])
def test_02_padding_mask_rejects_wrong_answers(wrong, diagnosis, capsys):
    _accepts("02.padding_mask", right_mask)
    _rejects_with("02.padding_mask", wrong, diagnosis, capsys)


def test_02_package_functions_are_no_answers():
    """What the package already has answers none of the exercises (the old shortcuts included)."""
    for name in exercises.names(2):
        for fn in (padding_fraction, Seq2Seq, F.cross_entropy):
            assert not exercises.check(name, fn)


def test_chapter_02_exercises_are_registered():
    assert exercises.names(2) == ["02.accuracy_by_position", "02.first_state_only", "02.padding_mask",
                                  "02.reverse_source", "02.sentence_mean_loss"]


# ----------------------------------------------------------------------------- chapter 03


def _luong(query, annotations, mask, W_a):
    scores = torch.einsum("bh,ha,bsa->bs", query, W_a, annotations)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    return torch.einsum("bs,bsa->ba", weights, annotations), weights


def input_feeding_ref(prev_embedded, attentional, state, annotations, mask, cell, W_a, W_c):
    new_state = cell(torch.cat([prev_embedded, attentional], -1), state)
    context, weights = _luong(new_state, annotations, mask, W_a)
    return new_state, torch.tanh(torch.cat([context, new_state], -1) @ W_c.T), weights


def _feeding_wrong(attend_before=False, swap_input=False, swap_join=False, no_tanh=False, unmasked=False,
                   batch_softmax=False, return_context=False, feed_state=False, old_state_joined=False):
    def step(prev_embedded, attentional, state, annotations, mask, cell, W_a, W_c):
        fed = state if feed_state else attentional
        x = torch.cat([fed, prev_embedded] if swap_input else [prev_embedded, fed], -1)
        new_state = cell(x, state)
        query = state if attend_before else new_state
        scores = torch.einsum("bh,ha,bsa->bs", query, W_a, annotations)
        if not unmasked:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, 0 if batch_softmax else -1).nan_to_num(0.0)
        context = torch.einsum("bs,bsa->ba", weights, annotations)
        joined_state = state if old_state_joined else new_state
        joined = torch.cat([joined_state, context] if swap_join else [context, joined_state], -1) @ W_c.T
        out = context if return_context else joined if no_tanh else torch.tanh(joined)
        return new_state, out, weights
    return step


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (_feeding_wrong(attend_before=True), "attended with the state before the step"),
    (_feeding_wrong(swap_input=True), "[prev_embedded; attentional], in that order"),
    (_feeding_wrong(feed_state=True), "previous attentional vector must be fed"),
    (_feeding_wrong(swap_join=True), "join [c_t; s_t] in that order"),
    (_feeding_wrong(no_tanh=True), "squash W_c [c_t; s_t] with tanh"),
    (_feeding_wrong(unmasked=True), "padded source positions got a non-zero weight"),
    (_feeding_wrong(batch_softmax=True), "each row should sum to 1"),
    (_feeding_wrong(return_context=True), "return tanh(W_c [c_t; s_t])"),
    (_feeding_wrong(old_state_joined=True), "not with s_{t-1}"),  # review 2026-11-27-exercises-00-03, 12
    (lambda *a: input_feeding_ref(*a)[:2], "return a tuple of 3"),
], ids=["attend-before-step", "input-order", "feeds-state", "join-order", "no-tanh", "unmasked",
        "softmax-over-batch", "context-as-output", "old-state-in-join", "two-outputs"])
def test_03_input_feeding_step(wrong, diagnosis, capsys):
    _accepts("03.input_feeding_step", input_feeding_ref)
    _rejects_with("03.input_feeding_step", wrong, diagnosis, capsys)


def local_ref(scores, mask, query, W_p, v_p, D):
    center = mask.sum(1) * torch.sigmoid(torch.tanh(query @ W_p.T) @ v_p)
    distance = torch.arange(scores.shape[1])[None, :] - center[:, None]
    keep = mask & (distance.abs() <= D)
    align = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    return align * torch.exp(-distance ** 2 / (2 * (D / 2) ** 2)), center


def _local_wrong(padded_length=False, sigma=0.5, gaussian_first=False, no_window=False, whole_softmax=False,
                 floor=False, unmasked=False):
    def local(scores, mask, query, W_p, v_p, D):
        L = torch.full((scores.shape[0],), scores.shape[1]) if padded_length else mask.sum(1)
        center = L * torch.sigmoid(torch.tanh(query @ W_p.T) @ v_p)
        where = center.floor() if floor else center
        distance = torch.arange(scores.shape[1])[None, :] - where[:, None]
        keep = torch.ones_like(mask) if unmasked else mask
        window = keep if no_window else keep & (distance.abs() <= D)
        log_gauss = -distance ** 2 / (2 * (sigma * D) ** 2)
        if gaussian_first:
            return torch.softmax((scores + log_gauss).masked_fill(~window, float("-inf")), -1), center
        if whole_softmax:
            align = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) * window
        else:
            align = torch.softmax(scores.masked_fill(~window, float("-inf")), -1)
        return align * log_gauss.exp(), center
    return local


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (_local_wrong(padded_length=True), "each sentence's own length"),
    (_local_wrong(sigma=1.0), "standard deviation is D/2"),
    (_local_wrong(gaussian_first=True), "after the normalisation"),
    (_local_wrong(no_window=True), "outside the window"),
    (_local_wrong(whole_softmax=True), "over the window's positions only"),
    (_local_wrong(floor=True), "not from its integer part"),
    (_local_wrong(unmasked=True), "padded source positions got weight"),
    (lambda *a: local_ref(*a)[0], "return a tuple of 2"),
], ids=["padded-length", "sigma-D", "gaussian-in-scores", "no-window", "softmax-whole-sentence",
        "integer-centre", "unmasked", "weights-only"])
def test_03_local_attention(wrong, diagnosis, capsys):
    _accepts("03.local_attention", local_ref)
    _rejects_with("03.local_attention", wrong, diagnosis, capsys)


def coverage_ref(weights, tgt_mask, src_mask, low, high):
    coverage = (weights * tgt_mask[:, :, None]).sum(1)
    lengths = src_mask.sum(1)
    words = torch.arange(src_mask.shape[1])[None, :] < (lengths - 1)[:, None]
    return coverage, ((coverage < low) & words).sum(1), ((coverage > high) & words).sum(1)


def _coverage_wrong(all_steps=False, over_source=False, mean=False, with_padding=False, with_eos=False,
                    strict_swap=False, words_by_coverage=False, last_column=False):
    def coverage_fn(weights, tgt_mask, src_mask, low, high):
        w = weights if all_steps else weights * tgt_mask[:, :, None]
        if over_source:
            return w.sum(2), w.sum(2)[:, 0], w.sum(2)[:, 0]
        coverage = w.sum(1) / tgt_mask.sum(1, keepdim=True) if mean else w.sum(1)
        lengths = src_mask.sum(1)
        words = torch.arange(src_mask.shape[1])[None, :] < (lengths - (0 if with_eos else 1))[:, None]
        if with_padding:
            words = torch.ones_like(words) if with_eos else words | ~src_mask
        if words_by_coverage:  # "padding is where the coverage is 0"
            words = words & (coverage > 0)
        if last_column:        # the grid's last column dropped, not each row's end token
            words = src_mask & (torch.arange(src_mask.shape[1])[None, :] < src_mask.shape[1] - 1)
        if strict_swap:
            return coverage, ((coverage > low) & words).sum(1), ((coverage < high) & words).sum(1)
        return coverage, ((coverage < low) & words).sum(1), ((coverage > high) & words).sum(1)
    return coverage_fn


@pytest.mark.parametrize(("wrong", "diagnosis"), [
    (_coverage_wrong(all_steps=True), "counts the padded target steps"),
    (_coverage_wrong(over_source=True), "coverage has shape (B, T)"),
    (_coverage_wrong(mean=True), "don't average them over the steps"),
    (_coverage_wrong(with_padding=True), "padded source positions have coverage 0"),
    (_coverage_wrong(with_eos=True), "leave out the end token"),
    (_coverage_wrong(strict_swap=True), "skipped is coverage below low"),
    # review 2026-11-27-exercises-00-03, finding 11: both passed, or got a vaguer message, before
    (_coverage_wrong(words_by_coverage=True), "tell words from padding with src_mask, not with the coverage"),
    (_coverage_wrong(last_column=True), "at its own length - 1, not in the last column"),
    (lambda w, t, s, lo, hi: coverage_ref(w, t, s, lo, hi)[0], "return a tuple of 3"),
], ids=["all-target-steps", "sum-over-source", "mean", "counts-padding", "counts-eos", "thresholds-swapped",
        "words-by-coverage", "last-column", "coverage-only"])
def test_03_coverage(wrong, diagnosis, capsys):
    _accepts("03.coverage", coverage_ref)
    _rejects_with("03.coverage", wrong, diagnosis, capsys)


def test_03_package_functions_are_no_answers():
    """The chapter's own pieces, called as they are, answer none of the exercises."""
    from tfmlib.rnn_attention import attention_penalty, masked_softmax
    for name in exercises.names(3):
        for fn in (masked_softmax, attention_penalty):
            assert not exercises.check(name, fn)


def test_chapter_03_exercises_are_registered():
    assert exercises.names(3) == ["03.coverage", "03.input_feeding_step", "03.local_attention"]

"""Chapter 08 exercise checkers accept the reference solutions and reject typical wrong answers."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_exercises import (  # the helpers of chapter 01's checker tests
    _accepts,
    _hint_gives_no_code,
    _rejects,
    _stub,
)

from tfmlib import exercises


def test_check_api_never_raises_without_must_pass(capsys):
    assert exercises.names(8), "chapter 08 registers no exercises"
    for name in exercises.names(8):
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


def test_chapter_08_exercises_are_registered():
    assert exercises.names(8) == ["08.beam_step", "08.smoothed_loss", "08.transformer_lr"]


@pytest.mark.parametrize("name", ["08.beam_step", "08.smoothed_loss", "08.transformer_lr"])
def test_08_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("log_softmax", ".mean(", "** -0.5", "min(", "topk", "[:, :, None", "// V",
                               "% V", "return "))


# ----------------------------------------------------------------------------- 08.smoothed_loss


def smoothed_loss_ref(logits, targets, eps):
    """1 - eps on the reference, nothing on padding (id 0), eps / (V - 2) on every other token."""
    log_p = F.log_softmax(logits, -1)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)
    others = (-log_p.sum(-1) - nll + log_p[..., 0]) / (logits.shape[-1] - 2)
    per_token = (1 - eps) * nll + eps * others
    real = targets != 0
    return per_token[real].sum() / real.sum()


def _smoothed_over_v_minus_1(logits, targets, eps):
    log_p = F.log_softmax(logits, -1)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)
    others = (-log_p.sum(-1) - nll) / (logits.shape[-1] - 1)
    return ((1 - eps) * nll + eps * others)[targets != 0].mean()


def _pytorch_convention(logits, targets, eps):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0, label_smoothing=eps)


def _counts_padding(logits, targets, eps):
    log_p = F.log_softmax(logits, -1)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)
    others = (-log_p.sum(-1) - nll + log_p[..., 0]) / (logits.shape[-1] - 2)
    return ((1 - eps) * nll + eps * others).mean()


def test_08_smoothed_loss_reference_is_the_formula():
    """The reference answer is -sum_k q_k log p_k with the q the exercise defines, built explicitly."""
    torch.manual_seed(0)
    B, T, V, eps = 3, 4, 9, 0.2
    logits, targets = torch.randn(B, T, V, dtype=torch.double), torch.randint(1, V, (B, T))
    targets[2, 2:] = 0
    q = torch.full((B, T, V), eps / (V - 2), dtype=torch.double)
    q[..., 0] = 0.0
    q.scatter_(-1, targets[..., None], 1 - eps)
    real = targets != 0
    assert torch.allclose(q.sum(-1)[real], torch.ones(int(real.sum()), dtype=torch.double)), \
        "q must be a distribution at every real position"
    want = (-(q * F.log_softmax(logits, -1)).sum(-1))[real].mean()
    assert torch.allclose(smoothed_loss_ref(logits, targets, eps), want), "the reference must be the formula"
    plain = _pytorch_convention(logits, targets, 0.0)
    assert torch.allclose(smoothed_loss_ref(logits, targets, 0.0), plain), "eps = 0: the plain cross-entropy"


@pytest.mark.parametrize("wrong", [
    _counts_padding,                                                                       # counts padding
    lambda lg, t, e: F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=0),       # no smoothing
    _pytorch_convention,                                                                   # eps / V
    _smoothed_over_v_minus_1,                                                              # eps / (V - 1)
    lambda lg, t, e: smoothed_loss_ref(lg, t, e) + e * math.log(lg.shape[-1]) * 0.5,       # shifted
    lambda lg, t, e: F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=0, label_smoothing=e,
                                     reduction="none"),                                          # not reduced
    lambda lg, t, e: smoothed_loss_ref(lg, t, e) * (t != 0).sum() / t.numel(),                 # denominator
], ids=["counts-padding", "no-smoothing", "pytorch-convention", "over-v-minus-1", "shifted", "not-reduced",
        "denominator"])
def test_08_smoothed_loss(wrong):
    _accepts("08.smoothed_loss", smoothed_loss_ref)
    _rejects("08.smoothed_loss", wrong)


@pytest.mark.parametrize("wrong, message", [
    (_pytorch_convention, "PyTorch's convention"),
    (_smoothed_over_v_minus_1, "V - 1 tokens"),
    (_counts_padding, "padded positions"),
], ids=["pytorch-convention", "over-v-minus-1", "counts-padding"])
def test_08_smoothed_loss_names_the_mistake(wrong, message, capsys):
    exercises.check("08.smoothed_loss", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 08.transformer_lr


def transformer_lr_ref(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("wrong", [
    lambda s, d, w: d ** -0.5 * max(s ** -0.5, s * w ** -1.5),          # max
    lambda s, d, w: min(s ** -0.5, s * w ** -1.5),                      # no d_model factor
    lambda s, d, w: d ** -0.5 * min(s ** -0.5, s * w ** -0.5),          # wrong warm-up exponent
    lambda s, d, w: d ** -0.5 * min((s + 1) ** -0.5, (s + 1) * w ** -1.5),  # counts from 0
    lambda s, d, w: str(d ** -0.5 * min(s ** -0.5, s * w ** -1.5)),     # a string
], ids=["max", "no-d-factor", "exponent", "off-by-one", "string"])
def test_08_transformer_lr(wrong):
    _accepts("08.transformer_lr", transformer_lr_ref)
    _accepts("08.transformer_lr", lambda s, d, w: torch.tensor(transformer_lr_ref(s, d, w)))  # 0-d tensor
    _rejects("08.transformer_lr", wrong)


# ----------------------------------------------------------------------------- 08.beam_step


def beam_step_ref(beam_scores, log_probs):
    B, K, V = log_probs.shape
    scores, index = (beam_scores[:, :, None] + log_probs).view(B, K * V).topk(K, dim=1)
    return scores, index // V, index % V


def _ignores_prefix_scores(beam_scores, log_probs):
    B, K, V = log_probs.shape
    _, index = log_probs.reshape(B, K * V).topk(K, dim=1)
    beams, tokens = index // V, index % V
    return beam_scores.gather(1, beams) + log_probs.reshape(B, K * V).gather(1, index), beams, tokens


def _best_of_each_prefix(beam_scores, log_probs):
    best, tokens = log_probs.max(dim=-1)                      # (B, K): one extension per prefix
    scores = beam_scores + best
    order = scores.argsort(dim=1, descending=True)
    return scores.gather(1, order), order, tokens.gather(1, order)


def _wrong_index_arithmetic(beam_scores, log_probs):
    B, K, V = log_probs.shape
    scores, index = (beam_scores[:, :, None] + log_probs).view(B, K * V).topk(K, dim=1)
    return scores, index % K, index // K


def _unsorted(beam_scores, log_probs):
    scores, beams, tokens = beam_step_ref(beam_scores, log_probs)
    return scores.flip(1), beams.flip(1), tokens.flip(1)


def _across_the_batch(beam_scores, log_probs):
    B, K, V = log_probs.shape
    scores, index = (beam_scores[:, :, None] + log_probs).reshape(-1).topk(B * K)
    return scores.view(B, K), (index // V % K).view(B, K), (index % V).view(B, K)


@pytest.mark.parametrize("wrong", [_ignores_prefix_scores, _best_of_each_prefix, _wrong_index_arithmetic,
                                   _unsorted, _across_the_batch, lambda s, lp: beam_step_ref(s, lp)[1:]],
                         ids=["ignores-prefix-scores", "best-of-each-prefix", "index-arithmetic", "unsorted",
                              "across-the-batch", "no-scores"])
def test_08_beam_step(wrong):
    _accepts("08.beam_step", beam_step_ref)
    _rejects("08.beam_step", wrong)


def test_08_beam_step_matches_what_beam_search_does():
    """The reference is the candidate selection of tfmlib.decoding.beam_search (before EOS handling)."""
    torch.manual_seed(0)
    B, K, V = 2, 3, 7
    log_probs = torch.log_softmax(torch.randn(B * K, V), -1)
    beam_scores = -torch.rand(B, K)
    candidates = (beam_scores.view(-1, 1) + log_probs).view(B, K * V)          # as in beam_search
    top_scores, top_index = candidates.topk(K, dim=1)
    scores, beams, tokens = beam_step_ref(beam_scores, log_probs.view(B, K, V))
    assert torch.equal(scores, top_scores) and torch.equal(beams, top_index // V) and \
        torch.equal(tokens, top_index % V)

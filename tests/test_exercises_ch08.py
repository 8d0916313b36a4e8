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


NAMES = ["08.average_checkpoints", "08.calibration_error", "08.smoothed_loss"]


def test_chapter_08_exercises_are_registered():
    assert exercises.names(8) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_08_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("log_softmax", ".mean(", "** -0.5", "min(", "topk", "[:, :, None", "// V",
                               "% V", "return ", "torch.", "stack(", "max(", "argmax", "ceil", "floor",
                               "abs(", "[-n", "clone", "float64", ".double", "sum(", " / n", "== "))


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


def _kl_form(logits, targets, eps):
    """KL(q || p), as the Annotated Transformer's KLDivLoss computes it: the cross-entropy minus H(q)."""
    V = logits.shape[-1]
    h_q = -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (V - 2)) if eps > 0 else 0.0
    return smoothed_loss_ref(logits, targets, eps) - h_q


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


def _log_of_softmax(logits, targets, eps):
    """Review 2026-11-27-exercises-04-05-07-08-11, finding 7: an explicit q against log(softmax(...)),
    right on mild logits, nan once a token's probability underflows float32."""
    log_p = torch.log(torch.softmax(logits, -1))
    V = logits.shape[-1]
    q = torch.full_like(log_p, eps / (V - 2))
    q[..., 0] = 0
    q.scatter_(-1, targets[..., None], 1 - eps)
    return (-(q * log_p).sum(-1))[targets != 0].mean()


def test_08_smoothed_loss_accepts_an_explicit_q_with_log_softmax():
    def explicit(logits, targets, eps):
        log_p = F.log_softmax(logits, -1)
        V = logits.shape[-1]
        q = torch.full_like(log_p, eps / (V - 2))
        q[..., 0] = 0
        q.scatter_(-1, targets[..., None], 1 - eps)
        return (-(q * log_p).sum(-1))[targets != 0].mean()
    _accepts("08.smoothed_loss", explicit)


@pytest.mark.parametrize("wrong, message", [
    (_log_of_softmax, "use log_softmax"),
    (_pytorch_convention, "PyTorch's convention"),
    (_smoothed_over_v_minus_1, "V - 1 tokens"),
    (_counts_padding, "padded positions"),
    (_kl_form, "KL divergence"),
    (lambda lg, t, e: F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=0), "plain cross-entropy"),
], ids=["log-of-softmax", "pytorch-convention", "over-v-minus-1", "counts-padding", "kl-form",
        "no-smoothing"])
def test_08_smoothed_loss_names_the_mistake(wrong, message, capsys):
    _rejects("08.smoothed_loss", wrong)
    exercises.check("08.smoothed_loss", wrong)
    assert message in capsys.readouterr().out


# ----------------------------------------------------------------------------- 08.average_checkpoints


def average_checkpoints_ref(snapshots, n):
    if not 1 <= n <= len(snapshots):
        raise ValueError(f"n must be between 1 and {len(snapshots)}, got {n}")
    last = snapshots[-n:]
    out = {}
    for key, newest in last[-1].items():
        if newest.is_floating_point():
            out[key] = (sum(s[key].double() for s in last) / n).to(newest.dtype)
        else:
            out[key] = newest.clone()
    return out


def _average_keys(snapshots, chosen, divide=True, wide=True):
    """Average (or sum) the floating tensors of ``chosen``; counters from the newest snapshot."""
    out = {}
    for key, newest in snapshots[-1].items():
        if not newest.is_floating_point():
            out[key] = newest.clone()
            continue
        total = sum(s[key].double() if wide else s[key] for s in chosen)
        out[key] = (total / len(chosen) if divide else total).to(newest.dtype)
    return out


def _checked_n(snapshots, n):
    if not 1 <= n <= len(snapshots):
        raise ValueError("n")


def _first_n(snapshots, n):
    _checked_n(snapshots, n)
    return _average_keys(snapshots, snapshots[:n])


def _one_too_few(snapshots, n):                       # snapshots[-n + 1:] : off by one at the slice's start
    _checked_n(snapshots, n)
    return _average_keys(snapshots, snapshots[-n + 1:] if n > 1 else snapshots)


def _summed(snapshots, n):
    _checked_n(snapshots, n)
    return _average_keys(snapshots, snapshots[-n:], divide=False)


def _pairwise(snapshots, n):
    _checked_n(snapshots, n)
    out = {k: v.clone() for k, v in snapshots[-n].items()}
    for s in snapshots[-n + 1:] if n > 1 else []:
        for key, value in s.items():
            out[key] = (out[key].double() + value.double()).div(2).to(value.dtype) \
                if value.is_floating_point() else value.clone()
    return out


def _averages_the_counter(snapshots, n):
    _checked_n(snapshots, n)
    out = _average_keys(snapshots, snapshots[-n:])
    out["step"] = sum(s["step"] for s in snapshots[-n:]) // n
    return out


def _sums_in_float16(snapshots, n):
    _checked_n(snapshots, n)
    return _average_keys(snapshots, snapshots[-n:], wide=False)


def _in_place(snapshots, n):                         # accumulates into the newest snapshot's own tensors
    _checked_n(snapshots, n)
    out = snapshots[-1]
    for s in snapshots[-n:-1]:
        for key, value in s.items():
            if value.is_floating_point():
                out[key] += value
    for value in out.values():
        if value.is_floating_point():
            value /= n
    return out


def _float64_out(snapshots, n):
    _checked_n(snapshots, n)
    return {k: (sum(s[k].double() for s in snapshots[-n:]) / n) if v.is_floating_point() else v.clone()
            for k, v in snapshots[-1].items()}


def _no_range_check(snapshots, n):
    return _average_keys(snapshots, snapshots[-n:] if n > 0 else snapshots)


def _negative_n_passes(snapshots, n):              # finding 8: n = -1 averages snapshots[1:]
    if not n or n > len(snapshots):
        raise ValueError("n")
    return _average_keys(snapshots, snapshots[-n:])


def _newest_itself(snapshots, n):                  # finding 9: n = 1 hands back the caller's dict
    _checked_n(snapshots, n)
    return snapshots[-1] if n == 1 else _average_keys(snapshots, snapshots[-n:])


def _shared_counter(snapshots, n):                 # finding 9: the counter is the caller's tensor
    out = _average_keys(snapshots, snapshots[-n:]) if 1 <= n <= len(snapshots) else _checked_n(snapshots, n)
    out["step"] = snapshots[-1]["step"]
    return out


def test_08_average_checkpoints_accepts_the_solution_and_a_stacked_mean():
    _accepts("08.average_checkpoints", average_checkpoints_ref)

    def stacked(snapshots, n):
        if n < 1 or n > len(snapshots):
            raise ValueError(f"n={n}")
        return {k: torch.stack([s[k].float() for s in snapshots[-n:]]).mean(0).to(v.dtype)
                if v.is_floating_point() else v.clone() for k, v in snapshots[-1].items()}
    _accepts("08.average_checkpoints", stacked)


@pytest.mark.parametrize("wrong, message", [
    (_first_n, "the first"),
    (_one_too_few, "you averaged the last"),
    (_summed, "sum of the snapshots"),
    (_pairwise, "pairwise"),
    (_averages_the_counter, "counters are not weights"),
    (_sums_in_float16, "overflows float16"),
    (_in_place, "you changed the snapshots"),
    (_float64_out, "in its own dtype"),
    (_no_range_check, "raise ValueError"),
    (_negative_n_passes, "n=-1 with 5 snapshots returned an average"),
    (_newest_itself, "one of the snapshots itself"),
    (_shared_counter, "return new tensors"),
], ids=["first-n", "one-too-few", "summed", "pairwise", "averages-counter", "float16-sum", "in-place",
        "float64-out", "no-range-check", "negative-n", "newest-itself", "shared-counter"])
def test_08_average_checkpoints_rejects_with_a_diagnosis(wrong, message, capsys):
    _rejects("08.average_checkpoints", wrong)
    exercises.check("08.average_checkpoints", wrong)
    assert message in capsys.readouterr().out


def test_08_average_checkpoints_case_overflows_float16():
    """The float16 tensor of the checker's snapshots overflows when summed in float16 (the case must
    be able to catch that answer)."""
    from tfmlib.exercises.ch08 import _snapshots

    snaps = _snapshots(0, 5)
    assert torch.isinf(sum(s["h"] for s in snaps[-3:])).any()
    assert torch.isfinite(average_checkpoints_ref(snaps, 3)["h"]).all()


# ----------------------------------------------------------------------------- 08.calibration_error


def calibration_error_ref(probs, targets, bins):
    confidence, prediction = probs.max(dim=-1)
    correct = (prediction == targets).double()
    total = 0.0
    for b in range(bins):
        inside = (confidence > b / bins) & (confidence <= (b + 1) / bins)
        if inside.any():
            gap = (correct[inside].mean() - confidence[inside].double().mean()).abs()
            total += inside.double().mean().item() * gap.item()
    return total


def _ece_with(probs, targets, bins, *, confidence=None, index=None, weighted=True, empty=False, signed=False,
              worst=False):
    conf, prediction = probs.max(dim=-1)
    confidence = conf if confidence is None else confidence
    correct = (prediction == targets).double()
    if index is None:
        index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    gaps, sizes = [], []
    for b in range(bins):
        inside = index == b
        if not inside.any():
            if empty:
                gaps.append(0.0)
                sizes.append(0)
            continue
        gap = (correct[inside].mean() - confidence[inside].mean()).item()
        gaps.append(gap if signed else abs(gap))
        sizes.append(int(inside.sum()))
    if worst:
        return max(gaps)
    if not weighted:
        return sum(gaps) / len(gaps)
    return sum(g * s for g, s in zip(gaps, sizes, strict=True)) / len(targets)


@pytest.mark.parametrize("wrong, message", [
    (lambda p, t, b: _ece_with(p, t, b, confidence=p.gather(-1, t[:, None]).squeeze(-1)), "reference token"),
    (lambda p, t, b: _ece_with(torch.softmax(p, -1), t, b), "already probabilities"),
    (lambda p, t, b: _ece_with(p, t, b, signed=True), "absolute gap"),
    (lambda p, t, b: _ece_with(p, t, b, weighted=False), "same weight"),
    (lambda p, t, b: _ece_with(p, t, b, weighted=False, empty=True), "same weight"),
    (lambda p, t, b: _ece_with(p, t, b, worst=True), "largest gap"),
    (lambda p, t, b: _ece_with(p, t, b, index=(p.max(-1).values * b).floor().long().clamp(max=b - 1)),
     "exactly on a bin edge"),
    (lambda p, t, b: 100 * calibration_error_ref(p, t, b), "in percent"),
    (lambda p, t, b: str(calibration_error_ref(p, t, b)), "as a float"),
], ids=["p-reference", "softmax-again", "signed", "unweighted", "empty-bins", "max-gap", "left-closed",
        "percent", "string"])
def test_08_calibration_error_rejects_with_a_diagnosis(wrong, message, capsys):
    _rejects("08.calibration_error", wrong)
    exercises.check("08.calibration_error", wrong)
    assert message in capsys.readouterr().out


def test_08_calibration_error_accepts_the_solution_and_a_tensor():
    _accepts("08.calibration_error", calibration_error_ref)
    _accepts("08.calibration_error", lambda p, t, b: torch.tensor(calibration_error_ref(p, t, b)))


def test_08_calibration_error_reference_on_a_hand_example():
    """Four predictions, two bins: confidences 0.9, 0.8 (right, wrong) and 0.6, 0.5 (right, right)."""
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.4, 0.6], [0.5, 0.25]], dtype=torch.double)
    targets = torch.tensor([0, 1, 1, 0])
    # bin (0.5, 1]: 0.9, 0.8, 0.6 with accuracy 2/3; bin (0, 0.5]: 0.5 with accuracy 1
    want = 3 / 4 * abs(2 / 3 - (0.9 + 0.8 + 0.6) / 3) + 1 / 4 * abs(1 - 0.5)
    assert math.isclose(calibration_error_ref(probs, targets, 2), want)

"""Checkers for chapter 08 (Transformer translation).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("08.name", answer)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _smoothing_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    g = torch.Generator().manual_seed(100 + seed)
    B, T = (int(v) for v in torch.randint(2, 6, (2,), generator=g))
    V = int(torch.randint(4, 12, (1,), generator=g))
    # the last case's logits are spread as a trained model's are: tokens far below the top have
    # probabilities that underflow float32 (log(softmax) gives -inf there; log_softmax does not)
    logits = torch.randn(B, T, V, generator=g) * (60 if seed == 5 else 3)
    targets = torch.randint(1, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # PAD_ID
    eps = (0.1, 0.0, 0.3, 0.25, 0.5)[seed % 5]
    return logits, targets, eps


def _smoothed_over_others(logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference answer: 1 - eps on the reference, 0 on padding, eps / (V - 2) on the others."""
    log_p = torch.nn.functional.log_softmax(logits.double(), -1)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)
    others = (-log_p.sum(-1) - nll + log_p[..., 0]) / (logits.shape[-1] - 2)
    real = targets != 0
    return ((1 - eps) * nll + eps * others)[real].sum() / real.sum()


@checker("08.smoothed_loss", hint="start from section 1's split of the loss into a weighted cross-entropy "
         "with the reference token and one with a uniform distribution; here the uniform part covers only "
         "the V - 2 tokens that are neither the reference nor padding (id 0)")
def _check_smoothed_loss(smoothed_loss: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> None:
    F = torch.nn.functional
    for seed in range(6):
        logits, targets, eps = _smoothing_case(seed)
        V = logits.shape[-1]
        want = _smoothed_over_others(logits, targets, eps)
        got = smoothed_loss(logits.clone(), targets.clone(), eps)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a scalar tensor, got {type(got).__name__}")
        if got.dim() != 0:
            raise Wrong(f"return a scalar (0-d) tensor, averaged over the real tokens; got shape "
                        f"{tuple(got.shape)}")
        if not torch.isfinite(got).all():
            raise Wrong(f"smoothed_loss(logits {tuple(logits.shape)} {logits.dtype}, largest |logit| "
                        f"{logits.abs().max().item():.0f}, eps={eps}) returned {got.item()}, the loss is "
                        f"{want.item():.4f}: log(softmax) underflows to -inf for tokens far below the top "
                        "(and 0 * -inf is nan); use log_softmax")
        if eps > 0 and not torch.allclose(got.double(), want, atol=1e-5, rtol=1e-4):
            log_p = F.log_softmax(logits.double(), -1)
            nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)
            real = targets != 0
            pytorch = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0,
                                      label_smoothing=eps)
            if torch.allclose(got.double(), pytorch.double(), atol=1e-5):
                raise Wrong("that is PyTorch's convention (eps / V to every token, the reference and "
                            "padding included); this exercise gives the reference 1 - eps, padding 0, and "
                            "eps / (V - 2) to each of the other tokens")
            over_v1 = ((1 - eps) * nll + eps * (-log_p.sum(-1) - nll) / (V - 1))[real].mean()
            if torch.allclose(got.double(), over_v1, atol=1e-5):
                raise Wrong("you spread eps over the V - 1 tokens other than the reference, padding "
                            "included (fairseq's label_smoothed_nll_loss does that): here padding (id 0) "
                            "gets no mass, so eps goes to V - 2 tokens")
            h_q = -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (V - 2))
            if torch.allclose(got.double(), want - h_q, atol=1e-5):
                raise Wrong("that is the KL divergence KL(q || p) (the Annotated Transformer's KLDivLoss), "
                            f"which is the cross-entropy minus the entropy of q ({h_q:.4f} nats here): the "
                            "same gradients, but not the loss the exercise asks for")
            if (targets == 0).any():
                everything = _smoothed_over_others(logits, targets.clamp(min=1), eps)
                counted = ((1 - eps) * nll + eps * (-log_p.sum(-1) - nll + log_p[..., 0]) / (V - 2)).mean()
                if any(torch.allclose(got.double(), x, atol=1e-5) for x in (everything, counted)):
                    raise Wrong("your loss counts the padded positions too: average over the tokens "
                                "where targets != 0 only")
            plain = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0)
            if torch.allclose(got.double(), plain.double(), atol=1e-5):
                raise Wrong(f"with eps={eps} you returned the plain cross-entropy: mix in the uniform part")
        expect_close(got.double(), want, f"smoothed_loss(logits {tuple(logits.shape)}, targets "
                     f"{tuple(targets.shape)}, eps={eps})")




# ----------------------------------------------------------------------------- 08.average_checkpoints


def _snapshots(seed: int, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` state dicts of one training run, oldest first: float32 weights, a float16 tensor whose
    values are large enough that adding three of them in float16 overflows, and an int64 step counter."""
    g = torch.Generator().manual_seed(300 + seed)
    base = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g),
            "h": (2.4e4 + 1e3 * torch.rand(2, 3, generator=g)).half()}
    out = []
    for i in range(count):
        drift = 0.5 * (i + 1)  # training moves the weights: the snapshots differ, later ones more
        out.append({"w": base["w"] + drift * torch.randn(3, 4, generator=g),
                    "b": base["b"] + drift * torch.randn(4, generator=g),
                    "h": (base["h"].float() + 64 * i * torch.rand(2, 3, generator=g)).half(),
                    "step": torch.tensor(100 * (i + 1) + 7 * i * i)})
    return out


def _mean_of(snapshots: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    return torch.stack([s[key].double() for s in snapshots]).mean(0)


def _same_values(value: torch.Tensor, dtype: torch.dtype, tol: dict, x: torch.Tensor) -> bool:
    return torch.allclose(value, x.to(dtype).double(), **tol)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are views of one storage (the same object included)."""
    return a is b or (a.untyped_storage().nbytes() > 0
                      and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _average_reference(snapshots: list[dict[str, torch.Tensor]], n: int) -> dict[str, torch.Tensor]:
    last = snapshots[-n:]
    return {k: (_mean_of(last, k).to(v.dtype) if v.is_floating_point() else v.clone())
            for k, v in snapshots[-1].items()}


@checker("08.average_checkpoints", hint="Vaswani et al. section 6.1 (see this chapter's References) average "
         "the weights of the last snapshots written during training; think about which end of the list is "
         "the last, what an average of a step counter would mean, which tensors the caller still holds, and "
         "how large a sum of several float16 numbers may get before it is divided")
def _check_average_checkpoints(average_checkpoints: Callable[[list, int], dict]) -> None:
    for seed, (count, n) in enumerate(((5, 3), (4, 1), (6, 4), (3, 3), (5, 2))):
        snapshots = _snapshots(seed, count)
        originals = [{k: v.clone() for k, v in s.items()} for s in snapshots]
        want = _average_reference(snapshots, n)
        got = average_checkpoints(snapshots, n)
        if any(not torch.equal(s[k], o[k]) for s, o in zip(snapshots, originals, strict=True) for k in s):
            raise Wrong("you changed the snapshots you were given (an in-place update of one of them, e.g. "
                        "starting the sum from the newest state dict itself): the caller's checkpoints must "
                        "stay as they were; start from fresh tensors")
        if not isinstance(got, dict) or set(got) != set(want):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise Wrong(f"return a dict with the snapshots' keys {sorted(want)}, got {keys}")
        if any(got is s for s in snapshots):
            raise Wrong(f"with n={n} you returned one of the snapshots itself: return a new state dict, "
                        "or an edit of the average would edit the caller's checkpoint too")
        for key, value in got.items():
            if not isinstance(value, torch.Tensor) or value.shape != want[key].shape:
                raise Wrong(f"{key!r} should be a tensor of shape {tuple(want[key].shape)}")
            if any(_shares_memory(value, s[key]) for s in snapshots):
                raise Wrong(f"with n={n} the returned {key!r} is the same memory as a snapshot's "
                            f"{key!r}: return new tensors (a copy of the counter, a fresh average), or an "
                            "in-place edit of one changes the other")
            if value.dtype != want[key].dtype:
                raise Wrong(f"{key!r} comes back as {value.dtype}, the snapshots hold {want[key].dtype}: "
                            "return each tensor in its own dtype, so the average loads into the model")
        newest = snapshots[-1]["step"]
        if not torch.equal(got["step"], newest):
            raise Wrong(f"the integer tensor 'step' (a counter, like BatchNorm's num_batches_tracked) is "
                        f"{got['step'].item()}, not the newest snapshot's {newest.item()}: counters are not "
                        "weights; keep non-floating tensors from the newest snapshot")
        for key in ("w", "b", "h"):
            if key == "h" and n > 2 and not torch.isfinite(got["h"].float()).all():
                raise Wrong(f"'h' (float16, values near 2.5e4) came back with inf: the sum of {n} of them "
                            "overflows float16 (largest 65504); add them up in a wider dtype and cast back")
            tol = dict(atol=1e-2, rtol=1e-3) if key == "h" else dict(atol=1e-5, rtol=1e-5)
            if torch.allclose(got[key].double(), want[key].double(), **tol):
                continue
            value = got[key].double()
            same = functools.partial(_same_values, value, want[key].dtype, tol)
            for m in range(1, count + 1):
                if m != n and same(_mean_of(snapshots[-m:], key)):
                    raise Wrong(f"you averaged the last {m} snapshots where n={n} asks for the last {n}"
                                + (" (all of them)" if m == count else "") + ": count the slice's ends")
            if same(_mean_of(snapshots[:n], key)):
                raise Wrong(f"you averaged the first {n} snapshots (the oldest): the list runs oldest first, "
                            "and the average is over the last n, where training has settled")
            if same(_mean_of(snapshots[-n:], key) * n):
                raise Wrong("you returned the sum of the snapshots: divide by n")
            running = snapshots[-n][key].double()
            for s in snapshots[-n + 1:] if n > 1 else []:
                running = (running + s[key].double()) / 2
            if n > 2 and same(running):
                raise Wrong("you averaged pairwise ((average + next) / 2 at each step): that weights the "
                            "newest snapshot by 1/2 and the oldest by 1/2^(n-1); each should weigh 1/n")
            raise Wrong(f"{key!r} is wrong for {count} snapshots and n={n}: expected the element-wise mean "
                        f"of the last {n}, max abs error "
                        f"{(value - want[key].double()).abs().max().item():.3g}")
    for bad in (0, 6, -1):
        try:
            average_checkpoints(_snapshots(0, 5), bad)
        except ValueError:
            continue
        except Exception as e:
            raise Wrong(f"n={bad} with 5 snapshots should raise ValueError (naming n), got "
                        f"{type(e).__name__}") from e
        raise Wrong(f"n={bad} with 5 snapshots returned an average: raise ValueError naming n (n must be "
                    "between 1 and the number of snapshots), rather than averaging something else")


# ----------------------------------------------------------------------------- 08.calibration_error


def _calibration_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(400 + seed)
    N, V = (40, 7) if seed % 2 else (64, 5)
    scale = (0.5, 2.0, 4.0, 1.0)[seed % 4]
    probs = torch.softmax(torch.randn(N, V, generator=g, dtype=torch.double) * scale, -1)
    guess = probs.argmax(-1)
    targets = torch.where(torch.rand(N, generator=g) < 0.6, guess, torch.randint(0, V, (N,), generator=g))
    # rows whose confidence sits exactly on a bin edge when bins = 4 (0.25, 0.5 and 1.0 are exact)
    edges = torch.zeros(6, V, dtype=torch.double)
    edges[0, :2], edges[0, 2:] = torch.tensor([0.5, 0.3]), 0.2 / (V - 2)
    edges[1, 0], edges[1, 1:] = 0.25, 0.75 / (V - 1)
    edges[2, 3] = 1.0
    edges[3, 1], edges[3, 2:] = 0.5, 0.5 / (V - 2)
    edges[4, 0], edges[4, 1:] = 0.25, 0.75 / (V - 1)
    edges[5, 2] = 1.0
    edge_targets = torch.tensor([0, 0, 3, 1, 2, 2])
    bins = (4, 10, 4, 7)[seed % 4]
    return torch.cat([probs, edges]), torch.cat([targets, edge_targets]), bins


def _ece(confidence: torch.Tensor, correct: torch.Tensor, index: torch.Tensor, bins: int, *,
         weighted: bool = True, empty_bins: bool = False, signed: bool = False, worst: bool = False) -> float:
    gaps, sizes = [], []
    for b in range(bins):
        inside = index == b
        if inside.any():
            gap = correct[inside].double().mean() - confidence[inside].mean()
            gaps.append(float(gap if signed else gap.abs()))
            sizes.append(int(inside.sum()))
        elif empty_bins:
            gaps.append(0.0)
            sizes.append(0)
    if worst:
        return max(gaps)
    if not weighted:
        return sum(gaps) / len(gaps)
    return sum(g * s for g, s in zip(gaps, sizes, strict=True)) / len(confidence)


def _right_closed_bins(confidence: torch.Tensor, bins: int) -> torch.Tensor:
    """Bin b holds the confidences in (b / bins, (b + 1) / bins]."""
    return (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)


@checker("08.calibration_error", hint="section 4 measured how much probability the smoothed model gives the "
         "reference; Guo et al. (2017, section 2) and Mueller et al. (2019, section 3) measure calibration "
         "instead: group the predictions by how confident they are, and in each group compare the "
         "confidence with how often the prediction was right; which token is the prediction, and how much "
         "should a group of three examples count against one of three hundred?")
def _check_calibration_error(calibration_error: Callable[[torch.Tensor, torch.Tensor, int], float]) -> None:
    for seed in range(4):
        probs, targets, bins = _calibration_case(seed)
        confidence, prediction = probs.max(-1)
        correct = prediction == targets
        index = _right_closed_bins(confidence, bins)
        want = _ece(confidence, correct, index, bins)
        got = calibration_error(probs.clone(), targets.clone(), bins)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, (bool, str)) or not isinstance(got, (int, float)):
            raise Wrong(f"return the calibration error as a float, got {type(got).__name__}")
        got = float(got)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        near = functools.partial(math.isclose, got, rel_tol=1e-6, abs_tol=1e-9)
        p_target = probs.gather(-1, targets[:, None]).squeeze(-1)
        resoftmaxed = torch.softmax(probs, -1).max(-1).values
        floor_index = (confidence * bins).floor().long().clamp(max=bins - 1)
        if near(100 * want):
            raise Wrong("that is the right value in percent: return a fraction between 0 and 1")
        if near(_ece(p_target, correct, _right_closed_bins(p_target, bins), bins)):
            raise Wrong("you used the probability of the reference token as the confidence: the confidence "
                        "is the probability of the model's own prediction (its most probable token), and "
                        "'right' means that prediction equals the target")
        if near(_ece(resoftmaxed, correct, _right_closed_bins(resoftmaxed, bins), bins)):
            raise Wrong("probs are already probabilities (rows sum to 1): a softmax over them flattens them")
        if near(_ece(confidence, correct, index, bins, signed=True)):
            raise Wrong("over- and under-confident bins cancel in your sum: take the absolute gap between "
                        "accuracy and confidence in each bin")
        if near(_ece(confidence, correct, index, bins, weighted=False)):
            raise Wrong("you gave every non-empty bin the same weight: weight each bin by its share of the "
                        "examples, so a bin of two examples counts little")
        if near(_ece(confidence, correct, index, bins, weighted=False, empty_bins=True)):
            raise Wrong("you gave every bin the same weight, empty ones counting as 0: weight each bin by "
                        "its share of the examples (empty bins weigh nothing)")
        if near(_ece(confidence, correct, index, bins, worst=True)):
            raise Wrong("that is the largest gap of any bin (the maximum calibration error): the expected "
                        "calibration error weights each bin's gap by its share of the examples")
        if near(_ece(confidence, correct, floor_index, bins)):
            raise Wrong(f"confidences that sit exactly on a bin edge (0.5 with {bins} bins) went to the bin "
                        "above: the bins are closed on the right, (b / bins, (b + 1) / bins], so a "
                        "confidence of 0.5 belongs to the bin that ends at 0.5")
        raise Wrong(f"for {len(targets)} predictions and {bins} bins the expected calibration error is "
                    f"{want:.6f}, got {got:.6f}")

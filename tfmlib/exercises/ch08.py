"""Checkers for chapter 08 (Transformer translation).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("08.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _smoothing_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    g = torch.Generator().manual_seed(100 + seed)
    B, T = (int(v) for v in torch.randint(2, 6, (2,), generator=g))
    V = int(torch.randint(4, 12, (1,), generator=g))
    logits = torch.randn(B, T, V, generator=g) * 3
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
         "the V - 2 tokens that are neither the reference nor padding (id 0), so take those two terms out "
         "of the sum over the vocabulary before dividing; work in log-probabilities, and average over the "
         "real positions only")
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
                            "included: padding (id 0) gets no mass, so eps goes to V - 2 tokens")
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


@checker("08.transformer_lr", hint="eq. (3) is the smaller of two terms, one that grows linearly with the "
         "step and one that decays as its inverse square root; they meet at the end of warm-up; the scale in "
         "front depends only on d_model; steps count from 1")
def _check_transformer_lr(transformer_lr: Callable[[int, int, int], float]) -> None:
    import math

    for d_model, warmup in [(512, 4000), (128, 200), (64, 1), (256, 1000)]:
        for step in sorted({1, 2, max(1, warmup // 2), max(1, warmup - 1), warmup, warmup + 1, 3 * warmup,
                            100 * warmup}):
            want = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
            got = transformer_lr(step, d_model, warmup)
            if isinstance(got, torch.Tensor) and got.numel() == 1:
                got = got.item()
            if isinstance(got, (bool, str)) or not hasattr(got, "__float__"):
                raise Wrong(f"return a float, got {type(got).__name__}")
            got = float(got)
            if not math.isclose(got, want, rel_tol=1e-6):
                why = ""
                rising, falling = step * warmup ** -1.5, step ** -0.5
                if math.isclose(got, d_model ** -0.5 * max(rising, falling), rel_tol=1e-6):
                    why = " (min, not max: the rate is the smaller of the rising and the falling branch)"
                elif math.isclose(got, min(rising, falling), rel_tol=1e-6):
                    why = " (the whole schedule is scaled by d_model ** -0.5)"
                raise Wrong(f"for step={step}, d_model={d_model}, warmup={warmup} expected {want:.6g}, "
                            f"got {got:.6g}{why}")


def _beam_step_reference(beam_scores: torch.Tensor, log_probs: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, K, V = log_probs.shape
    top_scores, top_index = (beam_scores[:, :, None] + log_probs).view(B, K * V).topk(K, dim=1)
    return top_scores, top_index // V, top_index % V


@checker("08.beam_step", hint="a candidate's score is its prefix's score plus the log-probability of the "
         "token that extends it; put all K * V candidates of a sentence in one row so that one top-k call "
         "ranks them together, then recover each winner's prefix and token from its position in that row")
def _check_beam_step(beam_step: Callable[[torch.Tensor, torch.Tensor], tuple]) -> None:
    for seed in range(6):
        g = torch.Generator().manual_seed(200 + seed)
        B, K = int(torch.randint(1, 4, (1,), generator=g)), (1, 2, 3, 4, 2, 3)[seed]
        V = int(torch.randint(max(K, 3), 9, (1,), generator=g))
        log_probs = torch.log_softmax(torch.randn(B, K, V, generator=g) * 2, dim=-1)
        beam_scores = -torch.rand(B, K, generator=g) * 4
        if seed == 4:  # the first step: one live prefix per sentence, the others at -inf
            beam_scores[:, 1:] = float("-inf")
        if seed == 5:  # one prefix far ahead: all K best extensions come from it
            beam_scores[:, 0] = 5.0
        want_scores, want_beams, want_tokens = _beam_step_reference(beam_scores, log_probs)
        got = beam_step(beam_scores.clone(), log_probs.clone())
        if not isinstance(got, tuple) or len(got) != 3:
            raise Wrong("return a tuple (scores, beams, tokens), each (B, K)")
        scores, beams, tokens = got
        for name, x in (("scores", scores), ("beams", beams), ("tokens", tokens)):
            if not isinstance(x, torch.Tensor) or x.shape != (B, K):
                got_shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise Wrong(f"{name} should be a (B, K) = {(B, K)} tensor, got {got_shape}")
        ignored = (log_probs.view(B, K * V).topk(K, dim=1).indices % V)
        if K > 1 and torch.equal(tokens, ignored) and not torch.equal(tokens, want_tokens):
            raise Wrong("you ranked the extensions by the new token's log-probability alone: add the score "
                        "of the prefix it extends (beam_scores[:, :, None] + log_probs)")
        if K > 1 and seed == 5 and bool((beams != 0).any()):
            raise Wrong("all K best extensions may come from the same prefix (here prefix 0 is far ahead): "
                        "rank all K * V candidates together, not the best one of each prefix")
        if not torch.equal(beams, want_beams) or not torch.equal(tokens, want_tokens):
            if torch.equal(torch.sort(beams * V + tokens, dim=1).values,
                           torch.sort(want_beams * V + want_tokens, dim=1).values):
                raise Wrong("the right candidates in the wrong order: return them best first "
                            "(topk sorts them)")
            raise Wrong(f"for beam_scores {beam_scores.tolist()} the best extensions are beams "
                        f"{want_beams.tolist()} with tokens {want_tokens.tolist()}; got beams "
                        f"{beams.tolist()} and tokens {tokens.tolist()} (flat index j over K * V: beam "
                        "j // V, token j % V)")
        expect_close(scores, want_scores, "scores (B, K)")


"""Checkers for chapter 03 (Bahdanau attention).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("03.name", answer)``.

The three exercises ask for what the chapter discusses but does not build: Luong et al.'s decoder
step with input feeding (attend *after* the recurrent step, feed the attentional vector back),
Luong et al.'s local-p attention (a predicted window with a Gaussian around it), and a coverage
diagnosis of translations (Tu et al. 2016, the chapter's Question 4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .core import Wrong, checker, expect_close


def _masked_weights(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0) * mask


def _lengths_mask(lengths: list[int], S: int) -> torch.Tensor:
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


def _close(a: Any, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(
        a.double(), b.double(), atol=atol, rtol=1e-4)


def _as_tuple(got: Any, n: int, what: str) -> tuple[Any, ...]:
    if not isinstance(got, tuple) or len(got) != n:
        raise Wrong(f"return a tuple of {n}: {what}; got {type(got).__name__}"
                    + (f" of {len(got)}" if isinstance(got, tuple) else ""))
    return got


# ----------------------------------------------------------------------------- input feeding


def _feeding_case(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(100 + seed)
    B, S = 3 + seed % 2, 5 + seed
    E, H, A = 4, 6, 8 + 2 * (seed % 2)   # A != H: a context cannot pose as a state
    torch.manual_seed(100 + seed)
    cell = nn.GRUCell(E + H, H)
    lengths = [S] + [int(v) for v in torch.randint(1, S, (B - 1,), generator=g)]
    return dict(prev_embedded=torch.randn(B, E, generator=g),
                attentional=torch.randn(B, H, generator=g).tanh(),
                state=torch.randn(B, H, generator=g).tanh(), annotations=torch.randn(B, S, A, generator=g),
                mask=_lengths_mask(lengths, S), cell=cell, W_a=torch.randn(H, A, generator=g) / 2,
                W_c=torch.randn(H, A + H, generator=g) / 3)


def _luong_attend(query: torch.Tensor, c: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.einsum("bh,ha,bsa->bs", query, c["W_a"], c["annotations"])
    weights = _masked_weights(scores, c["mask"])
    return torch.einsum("bs,bsa->ba", weights, c["annotations"]), weights


def _input_feeding_reference(c: dict[str, Any]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        new_state = c["cell"](torch.cat([c["prev_embedded"], c["attentional"]], -1), c["state"])
        context, weights = _luong_attend(new_state, c)
        pre = torch.cat([context, new_state], -1) @ c["W_c"].T
        old_context, old_weights = _luong_attend(c["state"], c)
        return dict(
            state=new_state, weights=weights, attentional=torch.tanh(pre), no_tanh=pre,
            swapped=torch.tanh(torch.cat([new_state, context], -1) @ c["W_c"].T),
            old_weights=old_weights,
            old_attentional=torch.tanh(torch.cat([old_context, new_state], -1) @ c["W_c"].T),
            old_state_joined=torch.tanh(torch.cat([context, c["state"]], -1) @ c["W_c"].T),
            swapped_input=c["cell"](torch.cat([c["attentional"], c["prev_embedded"]], -1), c["state"]),
            no_feeding=c["cell"](torch.cat([c["prev_embedded"], torch.zeros_like(c["attentional"])], -1),
                                 c["state"]),
            state_fed=c["cell"](torch.cat([c["prev_embedded"], c["state"]], -1), c["state"]),
        )


@checker(
    "03.input_feeding_step",
    hint=("section 2 attends before the recurrent step; Luong et al. (2015, sections 3.1 and 3.3) do the "
          "opposite, and their section 3.3 says what is fed back into the next step, and why; padding is "
          "hidden as in section 1"),
)
def _check_input_feeding_step(step: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    names = ("prev_embedded", "attentional", "state", "annotations", "mask", "cell", "W_a", "W_c")
    for seed in range(4):
        c = _feeding_case(seed)
        ref = _input_feeding_reference(c)
        args = [c[k] if k == "cell" else c[k].clone() for k in names]
        with torch.no_grad():
            got = step(*args)
        new_state, attentional, weights = _as_tuple(got, 3, "(new_state, attentional, weights)")
        B, H = c["state"].shape
        if isinstance(new_state, torch.Tensor) and new_state.shape == ref["state"].shape \
                and not _close(new_state, ref["state"]):
            if _close(new_state, ref["swapped_input"]):
                raise Wrong("new_state: the cell's input is [prev_embedded; attentional], in that order "
                            "(the GRU cell's weights expect the word first)")
            if _close(new_state, ref["no_feeding"]) or _close(new_state, ref["state_fed"]):
                raise Wrong("new_state: the previous attentional vector must be fed into the cell beside "
                            "the word (that is input feeding)")
        expect_close(new_state, ref["state"], f"new_state (B={B}, H={H})")
        if isinstance(weights, torch.Tensor) and weights.shape == ref["weights"].shape:
            if (weights.masked_select(~c["mask"]).abs() > 1e-6).any():
                raise Wrong("weights: padded source positions got a non-zero weight; hide them before "
                            "normalising, so they get exactly 0")
            if not torch.allclose(weights.sum(-1).double(), torch.ones(B, dtype=torch.double), atol=1e-5):
                raise Wrong("weights: each row should sum to 1 over the source positions (normalise over "
                            "the last axis)")
            if _close(weights, ref["old_weights"]):
                raise Wrong("weights: you attended with the state before the step, s_{t-1}, as RNNsearch "
                            "does; Luong's decoder attends with the new state s_t")
        expect_close(weights, ref["weights"], "weights (B, S)")
        if isinstance(attentional, torch.Tensor) and attentional.shape == (B, c["annotations"].shape[-1]):
            raise Wrong("attentional has the context's shape (B, A): return tanh(W_c [c_t; s_t]), of "
                        "shape (B, H), not the context itself")
        if _close(attentional, ref["no_tanh"]):
            raise Wrong("attentional: squash W_c [c_t; s_t] with tanh (Luong et al. eq. 5)")
        if _close(attentional, ref["swapped"]):
            raise Wrong("attentional: join [c_t; s_t] in that order, the context first, as W_c's columns "
                        "expect")
        if _close(attentional, ref["old_state_joined"]):
            raise Wrong("attentional: join the new context with the new state s_t, not with s_{t-1} "
                        "(both come from the same step)")
        if _close(attentional, ref["old_attentional"]):
            raise Wrong("attentional: the context must come from the new state's weights, not s_{t-1}'s")
        expect_close(attentional, ref["attentional"], f"attentional (B={B}, H={H})")


# ----------------------------------------------------------------------------- local-p attention


def _local_case(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(200 + seed)
    B, S, H, P = 4, 9 + 2 * seed, 5, 6
    lengths = [S, S - 4, 3, S - 1 - seed]
    return dict(scores=torch.randn(B, S, generator=g) * 2, mask=_lengths_mask(lengths, S),
                query=torch.randn(B, H, generator=g), W_p=torch.randn(P, H, generator=g),
                v_p=torch.randn(P, generator=g), D=2 + seed % 2, lengths=torch.tensor(lengths))


def _local_reference(c: dict[str, Any], *, length: torch.Tensor | None = None, sigma_factor: float = 0.5,
                     gaussian_first: bool = False, window: bool = True, renormalise: bool = True,
                     int_center: bool = False, padding: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    L = c["lengths"] if length is None else length
    center = L * torch.sigmoid(torch.tanh(c["query"] @ c["W_p"].T) @ c["v_p"])           # (B,)
    where = center.floor() if int_center else center
    j = torch.arange(c["scores"].shape[1], dtype=center.dtype)
    distance = j[None, :] - where[:, None]
    sigma = sigma_factor * c["D"]
    gauss = torch.exp(-distance ** 2 / (2 * sigma ** 2))
    keep = c["mask"] if padding else torch.ones_like(c["mask"])
    if window:
        keep = keep & (distance.abs() <= c["D"])
    if gaussian_first:
        return _masked_weights(c["scores"] - distance ** 2 / (2 * sigma ** 2), keep), center
    base = c["mask"] if padding else torch.ones_like(c["mask"])
    align = _masked_weights(c["scores"], keep) if renormalise else _masked_weights(c["scores"], base) * keep
    return align * gauss, center


@checker(
    "03.local_attention",
    hint=("Luong et al. (2015, section 3.2, equations 9 and 10) define local-p; read carefully where the "
          "window's normalisation happens and where the Gaussian comes in; section 1 shows how padding is "
          "kept out, and a batch's padded width is not a sentence's length"),
)
def _check_local_attention(local: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(4):
        c = _local_case(seed)
        want, want_center = _local_reference(c)
        got = local(c["scores"].clone(), c["mask"].clone(), c["query"].clone(), c["W_p"].clone(),
                    c["v_p"].clone(), c["D"])
        weights, center = _as_tuple(got, 2, "(weights (B, S), center (B,))")
        if isinstance(center, torch.Tensor) and center.shape == want_center.shape \
                and not _close(center, want_center):
            padded = _local_reference(c, length=torch.full_like(c["lengths"], c["scores"].shape[1]))[1]
            if _close(center, padded):
                raise Wrong("center: scale the sigmoid by each sentence's own length (its real tokens), "
                            "not by the padded width S")
        expect_close(center, want_center, "center (B,)")
        if not isinstance(weights, torch.Tensor) or weights.shape != want.shape:
            expect_close(weights, want, "weights (B, S)")
        variants = [
            (dict(padding=False), "padded source positions got weight: the window must keep to the real "
                                  "tokens"),
            (dict(window=False), "positions outside the window [p - D, p + D] got weight: local attention "
                                 "normalises and keeps only the window"),
            (dict(gaussian_first=True), "the Gaussian goes on after the normalisation (Luong et al. eq. 10), "
                                        "not into the scores: your rows sum to 1"),
            (dict(renormalise=False), "normalise the alignment over the window's positions only, not over "
                                      "the whole sentence"),
            (dict(sigma_factor=1.0), "the Gaussian's standard deviation is D/2, not D"),
            (dict(int_center=True), "the centre is a real number: measure distances from it, not from its "
                                    "integer part"),
        ]
        for kwargs, message in variants:
            if _close(weights, _local_reference(c, **kwargs)[0]) and not _close(weights, want):
                raise Wrong(message)
        if (weights.masked_select(~c["mask"]).abs() > 1e-6).any():
            raise Wrong("padded source positions got weight: the window must keep to the real tokens")
        expect_close(weights, want, f"weights (B, S) for D={c['D']}")


# ----------------------------------------------------------------------------- coverage


def _coverage_case(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(300 + seed)
    B, S, T = 5, 7 + seed, 9 + seed
    src_len = [S, 4, S - 2, 3, S - 1]
    tgt_len = [T, T - 3, 5, 2, T - 1]
    src_mask, tgt_mask = _lengths_mask(src_len, S), _lengths_mask(tgt_len, T)
    # Peaked rows (as trained attention is), over the real source positions only; the rows of padded
    # target steps hold weights too, as teacher-forced attention over padding does.
    weights = _masked_weights(torch.randn(B, T, S, generator=g) * 4, src_mask[:, None, :].expand(B, T, S))
    # One real word that no step attends to at all (coverage exactly 0), as float32 softmax underflow
    # and hard or windowed attention give: the clearest skip, which "coverage > 0" would take for padding.
    # The full-length row's end token gets none either, so that counting the end tokens and dropping
    # the grid's last column (which holds only that row's end token) give different counts.
    weights[0, :, 1 + seed % 3] = 0.0
    weights[0, :, S - 1] = 0.0
    weights[0] /= weights[0].sum(-1, keepdim=True)
    return dict(weights=weights, tgt_mask=tgt_mask, src_mask=src_mask, low=0.5, high=1.5)


def _coverage_reference(c: dict[str, Any], *, tgt: bool = True, eos: bool = False, padding: bool = False,
                        reduce: str = "sum", nonzero: bool = False, last_column: bool = False,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w = c["weights"] * c["tgt_mask"][:, :, None] if tgt else c["weights"]
    coverage = w.sum(1) if reduce == "sum" else w.sum(1) / c["tgt_mask"].sum(1, keepdim=True)
    lengths = c["src_mask"].sum(1)
    positions = torch.arange(c["src_mask"].shape[1])[None, :]
    words = c["src_mask"] & (positions < (lengths - 1)[:, None])
    counted = c["src_mask"] if eos else words
    if padding:
        counted = torch.ones_like(counted) if eos else words | ~c["src_mask"]
    if nonzero:        # padding told from words by "coverage > 0"
        counted = counted & (coverage > 0)
    if last_column:    # the grid's last column dropped instead of each row's end token
        counted = c["src_mask"] & (positions < c["src_mask"].shape[1] - 1)
    skipped = ((coverage < c["low"]) & counted).sum(1)
    repeated = ((coverage > c["high"]) & counted).sum(1)
    return coverage, skipped, repeated


@checker(
    "03.coverage",
    hint=("Question 4 and Tu et al. (2016, section 3); in section 4's heatmaps, what does a column add up "
          "to? Then decide which target steps and which source positions belong to the sentence, and "
          "which of those are words"),
)
def _check_coverage(coverage_fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(4):
        c = _coverage_case(seed)
        want_cov, want_skip, want_rep = _coverage_reference(c)
        got = coverage_fn(c["weights"].clone(), c["tgt_mask"].clone(), c["src_mask"].clone(),
                          c["low"], c["high"])
        coverage, skipped, repeated = _as_tuple(got, 3, "(coverage (B, S), skipped (B,), repeated (B,))")
        if isinstance(coverage, torch.Tensor) and coverage.shape == c["weights"].shape[:2]:
            raise Wrong("coverage has shape (B, T): add up over the target steps (axis 1), so that each "
                        "source position gets its total, (B, S)")
        if _close(coverage, _coverage_reference(c, tgt=False)[0]):
            raise Wrong("coverage counts the padded target steps too: only the steps where tgt_mask is "
                        "True belong to the translation")
        if _close(coverage, _coverage_reference(c, reduce="mean")[0]):
            raise Wrong("coverage: add the weights up, don't average them over the steps (a word "
                        "translated once should have coverage about 1)")
        expect_close(coverage, want_cov, "coverage (B, S)")
        for got_count, want_count, what in ((skipped, want_skip, "skipped"),
                                            (repeated, want_rep, "repeated")):
            if not isinstance(got_count, torch.Tensor) or got_count.shape != want_count.shape:
                shape = f" of shape {tuple(got_count.shape)}" if isinstance(got_count, torch.Tensor) else ""
                raise Wrong(f"{what} should be a tensor of shape {tuple(want_count.shape)} (one count per "
                            f"sentence), got {type(got_count).__name__}{shape}")
            if torch.equal(got_count.long(), want_count):
                continue
            padded = _coverage_reference(c, padding=True)[1 if what == "skipped" else 2]
            with_eos = _coverage_reference(c, eos=True)[1 if what == "skipped" else 2]
            if what == "skipped" and torch.equal(got_count.long(), _coverage_reference(c, nonzero=True)[1]):
                raise Wrong("skipped: a word no step attended to has coverage 0 and is the clearest skip: "
                            "tell words from padding with src_mask, not with the coverage")
            if torch.equal(got_count.long(), _coverage_reference(c, last_column=True)[1 if what == "skipped"
                                                                                      else 2]):
                raise Wrong(f"{what}: the end token of each row is at its own length - 1, not in the last "
                            "column: leave out each row's end token (src_mask gives the lengths)")
            if torch.equal(got_count.long(), padded):
                raise Wrong(f"{what}: padded source positions have coverage 0, but they are no words: "
                            "count real positions only")
            if torch.equal(got_count.long(), with_eos):
                raise Wrong(f"{what}: leave out the end token, the last real position: it is no word to "
                            "translate")
            raise Wrong(f"{what}: expected {want_count.tolist()}, got {got_count.tolist()} (low={c['low']}, "
                        f"high={c['high']}; skipped is coverage below low, repeated above high)")

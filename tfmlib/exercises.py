"""Checkers for the coding exercises at the end of every chapter.

Introduced in chapter 00 (preface), which shows how exercises work; each chapter adds its
checkers here, in a section of its own.

In a chapter, a reader fills in a stub and calls :func:`check`::

    def rnn_step(x, h, W_xh, W_hh, b):
        raise NotImplementedError  # your code here

    exercises.check("01.rnn_step", rnn_step)

``check`` prints "not solved yet" and a hint while the stub raises ``NotImplementedError``, says
what is wrong for a wrong answer, and never stops the notebook. The solutions notebook passes
``must_pass=True``, which raises :class:`ExerciseFailed` instead, so the tests catch a broken
solution or a broken checker. A checker is a function ``answer -> None`` that raises
:class:`Wrong` with a reason; it is registered with :func:`checker`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

INTRODUCED_IN = 0


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says how."""


class ExerciseFailed(AssertionError):
    """Raised by ``check(..., must_pass=True)`` when an answer is not accepted."""


@dataclass(frozen=True)
class Exercise:
    name: str
    hint: str
    run: Callable[[Any], None]


_REGISTRY: dict[str, Exercise] = {}


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` returns: true when the answer was accepted.

    Use it as a bool (``if check(...)``, ``assert check(...)``). In a notebook it displays
    nothing, because :func:`check` has already printed the verdict.
    """

    name: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:  # the printed message is the display
        pass


def checker(name: str, hint: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register ``fn(answer)`` as the checker of exercise ``name`` (``"NN.short_name"``)."""
    if not re.fullmatch(r"\d\d\.\w+", name):
        raise ValueError(f"exercise name {name!r} must look like 'NN.short_name' (NN: the chapter)")

    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if name in _REGISTRY:
            raise ValueError(f"exercise {name!r} is registered twice")
        _REGISTRY[name] = Exercise(name, hint, fn)
        return fn
    return register


def names(chapter: int | None = None) -> list[str]:
    """The registered exercise names, optionally only chapter ``chapter``'s."""
    return sorted(n for n in _REGISTRY if chapter is None or n.startswith(f"{chapter:02d}."))


def hint(name: str) -> str:
    return _get(name).hint


def _get(name: str) -> Exercise:
    if name not in _REGISTRY:
        raise KeyError(f"no exercise named {name!r}; known: {names()}")
    return _REGISTRY[name]


def check(name: str, answer: Any, must_pass: bool = False) -> Verdict:
    """Check ``answer`` for exercise ``name``; print the verdict and return it (true if accepted).

    With ``must_pass=True`` (solutions), anything but an accepted answer raises
    :class:`ExerciseFailed`.
    """
    exercise = _get(name)
    try:
        exercise.run(answer)
    except NotImplementedError:
        verdict = f"[{name}] not solved yet. Hint: {exercise.hint}"
    except Wrong as e:
        verdict = f"[{name}] not correct yet: {e}"
    except Exception as e:  # the reader's code crashed: show it, don't stop the notebook
        verdict = f"[{name}] your code raised {type(e).__name__}: {e}"
    else:
        print(f"[{name}] correct!")
        return Verdict(name, True, f"[{name}] correct!")
    if must_pass:
        raise ExerciseFailed(verdict)
    print(verdict)
    return Verdict(name, False, verdict)


# ----------------------------------------------------------------------------- helpers


def expect_close(got: Any, want: torch.Tensor, what: str, atol: float = 1e-5,
                 rtol: float = 1e-4) -> None:
    """Raise :class:`Wrong` unless ``got`` is a tensor of ``want``'s shape and values."""
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise Wrong(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol):
        err = (got.double() - want.double()).abs().max().item()
        raise Wrong(f"{what} has the right shape but wrong values (max abs error {err:.3g})")


# Chapter checkers are registered below, chapter by chapter.


# ----------------------------------------------------------------------------- chapter 00


@checker("00.padding_mask", hint="compare torch.arange(max_len) with the lengths, broadcasting "
         "a (1, max_len) row against a (batch, 1) column")
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
            raise Wrong(f"for lengths {lengths}, max_len {max_len}: expected {want.int().tolist()} "
                        f"(True at real tokens), got {got.int().tolist()}")


@checker("00.padding_fraction", hint="padding = (cells of the padded grid) - (real tokens); "
         "the grid of one batch is len(batch) * max(lengths in batch)")
def _check_padding_fraction(fraction: Callable[[list[list[int]], list[int]], float]) -> None:
    cases = [([[0, 1], [2]], [3, 1, 2], 1 - 6 / 8), ([[0], [1], [2]], [3, 1, 2], 0.0),
             ([[0, 1, 2]], [4, 4, 1], 1 - 9 / 12)]
    for batches, lengths, want in cases:
        got = fraction(batches, lengths)
        if not isinstance(got, (float, int)) or isinstance(got, bool):
            raise Wrong(f"return a number, got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            raise Wrong(f"for batches {batches} and lengths {lengths}: expected {want:.4f}, got {got:.4f}")


# ----------------------------------------------------------------------------- chapter 01


def _ch01_cases(seed: int) -> tuple[int, int, int, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    batch, inp, hidden = (int(v) for v in torch.randint(2, 7, (3,), generator=g))
    return batch, inp, hidden, g


@checker("01.rnn_step", hint="h' = tanh(x @ W_xh.T + h @ W_hh.T + b): x is (B, I), W_xh is (H, I), "
         "so x @ W_xh.T is (B, H)")
def _check_rnn_step(rnn_step: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        B, D, H, g = _ch01_cases(seed)
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        W_xh, W_hh = torch.randn(H, D, generator=g) / D**0.5, torch.randn(H, H, generator=g) / H**0.5
        b = torch.randn(H, generator=g)
        want = torch.tanh(x @ W_xh.T + h @ W_hh.T + b)
        expect_close(rnn_step(x, h, W_xh, W_hh, b), want,
                     f"rnn_step(x {tuple(x.shape)}, h {tuple(h.shape)}, ...)")


@checker("01.gru_step", hint="split the stacked weights with .chunk(3) in the order reset, update, "
         "candidate; n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)); h' = (1 - z) * n + z * h")
def _check_gru_step(gru_step: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        B, D, H, g = _ch01_cases(seed)
        cell = torch.nn.GRUCell(D, H)
        with torch.no_grad():
            for p in cell.parameters():
                p.copy_(torch.randn(p.shape, generator=g))  # big weights: gates far from 0.5
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        with torch.no_grad():
            want = cell(x, h)
            got = gru_step(x, h, cell.weight_ih.clone(), cell.weight_hh.clone(),
                           cell.bias_ih.clone(), cell.bias_hh.clone())
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            W_ir, W_iz, W_in = cell.weight_ih.detach().chunk(3)
            W_hr, W_hz, W_hn = cell.weight_hh.detach().chunk(3)
            b_ir, b_iz, b_in = cell.bias_ih.detach().chunk(3)
            b_hr, b_hz, b_hn = cell.bias_hh.detach().chunk(3)
            z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
            n = torch.tanh(x @ W_in.T + b_in + torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
                           * (h @ W_hn.T + b_hn))
            if torch.allclose(got.double(), (z * n + (1 - z) * h).double(), atol=1e-5):
                raise Wrong("you swapped the roles of z: in PyTorch's convention z keeps the old "
                            "state, h' = (1 - z) * n + z * h")
        expect_close(got, want, f"gru_step(x {tuple(x.shape)}, h {tuple(h.shape)}, ...)")


@checker("01.unrolled_weights", hint="w_0 = prod_{j=1..T} z_j and w_i = (1 - z_i) * prod_{j=i+1..T} z_j; "
         "return T + 1 rows (row 0 for h_0); the rows sum to one")
def _check_unrolled_weights(unrolled: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for seed in range(4):
        _, T, H, g = _ch01_cases(seed)
        z = torch.rand(T, H, generator=g)
        # the reference: run the recurrence on one-hot "candidates" and read off each one's share
        want = torch.empty(T + 1, H)
        for i in range(T + 1):
            h = torch.ones(H) if i == 0 else torch.zeros(H)
            for t in range(1, T + 1):
                n = torch.ones(H) if t == i else torch.zeros(H)
                h = (1 - z[t - 1]) * n + z[t - 1] * h
            want[i] = h
        expect_close(unrolled(z.clone()), want, f"unrolled(z of shape {tuple(z.shape)}) (row 0: h_0, "
                     "row i: n_i)")


# ----------------------------------------------------------------------------- chapter 02


def _random_logits_and_targets(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, T, V = (int(v) for v in torch.randint(2, 7, (3,), generator=g))
    logits = torch.randn(B, T, V, generator=g) * 2
    targets = torch.randint(1, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # one full row, the others padded
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # PAD_ID
    return logits, targets


@checker("02.masked_token_loss", hint="mask = targets != 0; take -log_softmax(logits) at the target ids "
         "(gather on the last axis), keep the masked positions and divide their sum by mask.sum()")
def _check_masked_token_loss(masked_token_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    for seed in range(5):
        logits, targets = _random_logits_and_targets(seed)
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0)
        got = masked_token_loss(logits.clone(), targets.clone())
        if isinstance(got, torch.Tensor) and got.dim() == 0 and (targets == 0).any():
            everything = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            if torch.allclose(got.double(), everything.double(), atol=1e-5):
                raise Wrong("your loss counts the padded positions too: average over the real "
                            "tokens only (targets != 0)")
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            raise Wrong(f"return a scalar (0-d) tensor, got shape {tuple(got.shape)}")
        expect_close(got, want,
                     f"masked_token_loss(logits {tuple(logits.shape)}, targets {tuple(targets.shape)})")


@checker("02.cut_at_eos", hint="for each row: row.tolist(), then keep the ids before the first 2 (EOS_ID); "
         "list.index raises ValueError when there is none")
def _check_cut_at_eos(cut_at_eos: Callable[[torch.Tensor], list[list[int]]]) -> None:
    cases = [
        torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0], [4, 4, 4, 4]]),
        torch.tensor([[2, 5, 2]]),
        torch.tensor([[9, 2, 9, 9], [8, 8, 2, 0]]),
    ]
    for tokens in cases:
        want = [row[: row.index(2)] if 2 in row else row for row in tokens.tolist()]
        got = cut_at_eos(tokens.clone())
        if isinstance(got, torch.Tensor):
            raise Wrong("return a list of lists of ints (rows have different lengths), not a tensor")
        if not isinstance(got, list) or any(not isinstance(r, list) for r in got):
            raise Wrong(f"return a list of lists, got {type(got).__name__}")
        if got != want:
            raise Wrong(f"for tokens {tokens.tolist()} expected {want}, got {got}")


def _reverse_source_reference(src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
    out = src.clone()
    for i, n in enumerate(src_mask.sum(dim=1).tolist()):
        out[i, : n - 1] = src[i, : n - 1].flip(0)  # the words; EOS stays at n - 1
    return out


@checker("02.reverse_source", hint="per row, the words are the first n - 1 positions, n = src_mask[i].sum() "
         "(position n - 1 holds EOS): out[i, :n-1] = src[i, :n-1].flip(0)")
def _check_reverse_source(reverse_source: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    from tfmlib.data import EOS_ID, pad_sequences

    cases = [[[5, 6, 7], [8], [9, 10]], [[4, 5, 6, 7, 8]], [[11, 12], [13, 14, 15, 16]]]
    for rows in cases:
        src, mask = pad_sequences([r + [EOS_ID] for r in rows])
        want = _reverse_source_reference(src, mask)
        got = reverse_source(src.clone(), mask.clone())
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a tensor like src, got {type(got).__name__}")
        if got.shape != src.shape:
            raise Wrong(f"the result should keep src's shape {tuple(src.shape)}, got {tuple(got.shape)}")
        if torch.equal(got, src.flip(1)):
            raise Wrong("you flipped whole rows: the padding and EOS moved to the front; reverse "
                        "only each row's words")
        if not torch.equal(got, want):
            raise Wrong(f"for sources {src.tolist()} expected {want.tolist()}, got {got.tolist()}")


@checker("02.brevity_penalty", hint="BP = 1 when h > r, else exp(1 - r / h) (h: hypothesis length, "
         "r: reference length)")
def _check_brevity_penalty(brevity_penalty: Callable[[int, int], float]) -> None:
    import math

    for h, r in [(10, 10), (12, 10), (5, 10), (9, 10), (1, 7), (100, 3)]:
        want = 1.0 if h > r else math.exp(1 - r / h)
        got = brevity_penalty(h, r)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise Wrong(f"return a float, got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            raise Wrong(f"for h={h}, r={r} expected {want:.6f}, got {got:.6f}"
                        + (" (too-long output is not penalised)" if h > r else ""))


# ----------------------------------------------------------------------------- chapter 03


def _attention_case(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, S, H, A, D = (int(v) for v in torch.randint(2, 7, (5,), generator=g))
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    lengths[-1] = 1 if S > 1 else S  # a row that is mostly padding
    return dict(query=torch.randn(B, H, generator=g), annotations=torch.randn(B, S, A, generator=g),
                mask=torch.arange(S)[None, :] < lengths[:, None], W=torch.randn(D, H, generator=g),
                U=torch.randn(D, A, generator=g), v=torch.randn(D, generator=g))


def _additive_reference(c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.tanh((c["query"] @ c["W"].T)[:, None, :] + c["annotations"] @ c["U"].T) @ c["v"]  # (B, S)
    weights = torch.softmax(e.masked_fill(~c["mask"], float("-inf")), dim=-1)
    return torch.bmm(weights[:, None, :], c["annotations"]).squeeze(1), weights


@checker("03.additive_attention", hint="e = tanh((query @ W.T)[:, None, :] + annotations @ U.T) @ v, (B, S); "
         "set e to -inf where mask is False, softmax over the source axis (-1), then context = "
         "sum_j weights[:, j] * annotations[:, j] (torch.bmm)")
def _check_additive_attention(additive_attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(5):
        c = _attention_case(seed)
        want_context, want_weights = _additive_reference(c)
        got = additive_attention(*(c[k].clone() for k in ("query", "annotations", "mask", "W", "U", "v")))
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (context, weights)")
        context, weights = got
        if isinstance(weights, torch.Tensor) and weights.shape == want_weights.shape:
            if (weights.masked_select(~c["mask"]).abs() > 1e-6).any():
                raise Wrong("padded source positions got a non-zero weight: mask the scores before "
                            "the softmax (a padded position must get exactly 0)")
            if not torch.allclose(weights.sum(-1), torch.ones(weights.shape[0]), atol=1e-5):
                raise Wrong("each row of weights should sum to 1 over the source positions: "
                            "take the softmax over the last axis")
        expect_close(weights, want_weights, "weights (B, S)")
        expect_close(context, want_context, "context (B, A)")


@checker("03.general_score", hint="score[b, j] = query[b] @ W_a @ keys[b, j]: with einsum, "
         "torch.einsum('bq,qk,bsk->bs', query, W_a, keys)")
def _check_general_score(general_score: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, S, Q = (int(v) for v in torch.randint(2, 6, (3,), generator=g))
        K = Q + 1 + seed % 2  # Q != K, so a transposed W_a cannot fit by accident
        query, keys = torch.randn(B, Q, generator=g), torch.randn(B, S, K, generator=g)
        W_a = torch.randn(Q, K, generator=g)
        want = torch.einsum("bq,qk,bsk->bs", query, W_a, keys)
        got = general_score(query.clone(), keys.clone(), W_a.clone())
        expect_close(got, want, f"general_score(query {tuple(query.shape)}, keys {tuple(keys.shape)}, "
                     f"W_a {tuple(W_a.shape)})")


@checker("03.attention_penalty", hint="P = A @ A.transpose(1, 2) is (B, r, r); subtract the identity, "
         "square, sum over the last two axes, mean over the batch")
def _check_attention_penalty(attention_penalty: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, r, S = 2 + seed, 2 + seed % 2, 4 + seed
        A = torch.softmax(torch.randn(B, r, S, generator=g) * 3, dim=-1)
        want = ((A @ A.transpose(1, 2) - torch.eye(r)) ** 2).sum(dim=(1, 2)).mean()
        got = attention_penalty(A.clone())
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            raise Wrong(f"return a scalar (0-d) tensor, averaged over the batch; got shape "
                        f"{tuple(got.shape)}")
        expect_close(got, want, f"attention_penalty(A of shape {tuple(A.shape)})")


# ----------------------------------------------------------------------------- chapter 04


def _ch04_case(seed: int) -> tuple[int, int, int, torch.Generator]:
    g = torch.Generator().manual_seed(400 + seed)
    batch, length, width = (int(v) for v in torch.randint(2, 6, (3,), generator=g))
    return batch, length + 1, width, g  # length >= 3, so a position has a past and a future


def _ch04_causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    T = q.shape[-2]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@checker("04.causal_attention", hint="scores = q @ k.transpose(-2, -1) is (B, T, T); where i > t (above the "
         "diagonal: ~torch.ones(T, T, dtype=torch.bool).tril()) set the score to -inf, softmax over the last "
         "axis, then out = weights @ v")
def _check_causal_attention(causal_attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(5):
        B, T, d, g = _ch04_case(seed)
        d_v = d + 1 + seed % 2
        q, k = torch.randn(B, T, d, generator=g), torch.randn(B, T, d, generator=g)
        v = torch.randn(B, T, d_v, generator=g)
        want_out, want_w = _ch04_causal_reference(q, k, v)
        got = causal_attention(q.clone(), k.clone(), v.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (out, weights)")
        out, weights = got
        if isinstance(weights, torch.Tensor) and weights.shape == want_w.shape:
            future = ~torch.ones(T, T, dtype=torch.bool).tril()
            if (weights[:, future].abs() > 1e-6).any():
                raise Wrong("position t gave weight to a later position i > t: set the scores above the "
                            "diagonal to -inf before the softmax")
            if not torch.allclose(weights.sum(-1).double(), torch.ones(B, T, dtype=torch.double), atol=1e-5):
                raise Wrong("each row of weights should sum to 1 over i <= t: mask the scores before the "
                            "softmax, not the weights after it")
            scaled = _ch04_causal_reference(q, k, v, scale=d ** -0.5)[1]
            if torch.allclose(weights.double(), scaled.double(), atol=1e-5):
                raise Wrong("you divided the scores by sqrt(d): this chapter's score is the plain q_t . k_i "
                            "(chapter 05 adds the scale)")
        if isinstance(out, torch.Tensor) and out.shape == v.shape and torch.allclose(out.double(), v.double(),
                                                                                      atol=1e-5):
            raise Wrong("out equals v: you weighted each query's own value v_t. The sum runs over the "
                        "values' index: out_t = sum_i alpha_{t,i} v_i")
        expect_close(weights, want_w, f"weights (B, T, T) for q {tuple(q.shape)}")
        expect_close(out, want_out, f"out (B, T, d_v) for v {tuple(v.shape)}")


def _ch04_multi_head_reference(x: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor,
                               W_O: torch.Tensor, heads: int, transpose: bool = True) -> torch.Tensor:
    """Non-causal multi-head self-attention by a loop over heads (``transpose=False``: the common
    mistake of reshaping ``(B, T, d)`` straight to ``(B, heads, T, d_k)``)."""
    B, T, d = x.shape
    d_k = d // heads
    if not transpose:
        q, k, v = ((x @ W.T).reshape(B, heads, T, d_k) for W in (W_Q, W_K, W_V))
        out = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return out.reshape(B, T, d) @ W_O.T
    outs = []
    for g in range(heads):
        rows = slice(g * d_k, (g + 1) * d_k)
        q, k, v = x @ W_Q[rows].T, x @ W_K[rows].T, x @ W_V[rows].T
        outs.append(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)
    return torch.cat(outs, dim=-1) @ W_O.T


@checker("04.multi_head_self_attention", hint="project (x @ W.T), reshape (B, T, d) -> (B, T, heads, d_k) "
         "and transpose to (B, heads, T, d_k); softmax(q @ k.transpose(-2, -1)) @ v per head; transpose "
         "back, reshape to (B, T, d), then @ W_O.T")
def _check_multi_head_self_attention(fn: Callable[..., torch.Tensor]) -> None:
    for seed, heads in enumerate((2, 3, 4, 2, 1)):
        B, T, d_k, g = _ch04_case(seed)
        d = heads * d_k
        x = torch.randn(B, T, d, generator=g)
        W_Q, W_K, W_V, W_O = (torch.randn(d, d, generator=g) / d ** 0.5 for _ in range(4))
        want = _ch04_multi_head_reference(x, W_Q, W_K, W_V, W_O, heads)
        got = fn(x.clone(), W_Q.clone(), W_K.clone(), W_V.clone(), W_O.clone(), heads)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and heads > 1:
            checks = [
                (_ch04_multi_head_reference(x, W_Q, W_K, W_V, W_O, heads, transpose=False),
                 "your heads mix positions: reshape (B, T, d) to (B, T, heads, d_k) first, then transpose to "
                 "(B, heads, T, d_k); a reshape straight to (B, heads, T, d_k) cuts across positions"),
                (_ch04_multi_head_reference(x, W_Q, W_K, W_V, W_O, 1),
                 "this is one head of width d: split the projections into `heads` heads of d / heads"),
                (_ch04_multi_head_reference(x, W_Q, W_K, W_V, torch.eye(d), heads),
                 "the heads are right but W_O is missing: multiply the concatenated heads by W_O.T"),
            ]
            for wrong, message in checks:
                if torch.allclose(got.double(), wrong.double(), atol=1e-5) and not torch.allclose(
                        wrong.double(), want.double(), atol=1e-5):
                    raise Wrong(message)
        expect_close(got, want, f"multi-head output for x {tuple(x.shape)}, heads={heads}")


def _ch04_positions_reference(x: torch.Tensor, P: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor,
                              W_V: torch.Tensor, form: str = "own") -> torch.Tensor:
    xp = x + P
    k, v = xp @ W_K.T, xp @ W_V.T
    if form == "own":
        scores = (xp @ W_Q.T) @ k.transpose(-2, -1)
    elif form == "key's":  # q_{t,i} = W_Q(x_t + p(i)): the key's position in the query
        scores = (x @ W_Q.T) @ k.transpose(-2, -1) + ((P @ W_Q.T) * k).sum(-1)[:, None, :]
    else:  # "query only": the position added to the query and not to the key and value
        scores = (xp @ W_Q.T) @ (x @ W_K.T).transpose(-2, -1)
        return torch.softmax(scores, dim=-1) @ (x @ W_V.T)
    return torch.softmax(scores, dim=-1) @ v


@checker("04.attention_with_positions", hint="add P to x once (x + P broadcasts over the batch), then "
         "q = (x + P) @ W_Q.T, k = (x + P) @ W_K.T, v = (x + P) @ W_V.T; "
         "out = softmax(q @ k.transpose(-2, -1)) @ v")
def _check_attention_with_positions(fn: Callable[..., torch.Tensor]) -> None:
    for seed in range(5):
        B, T, d, g = _ch04_case(seed)
        d_k, d_v = d + 1, d + 2
        x, P = torch.randn(B, T, d, generator=g), torch.randn(T, d, generator=g)
        W_Q, W_K = torch.randn(d_k, d, generator=g), torch.randn(d_k, d, generator=g)
        W_V = torch.randn(d_v, d, generator=g)
        want = _ch04_positions_reference(x, P, W_Q, W_K, W_V)
        got = fn(x.clone(), P.clone(), W_Q.clone(), W_K.clone(), W_V.clone())
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            checks = [
                (_ch04_positions_reference(x, P, W_Q, W_K, W_V, "key's"),
                 "your query for key i uses p(i), the key's position: q_t must be W_Q(x_t + p(t)), "
                 "with the query's own position"),
                (_ch04_positions_reference(x, 0 * P, W_Q, W_K, W_V),
                 "the output does not depend on P: add the positions to the inputs"),
                (_ch04_positions_reference(x, P, W_Q, W_K, W_V, "query only"),
                 "the keys and values need positions too: k_i = W_K(x_i + p(i)), v_i = W_V(x_i + p(i))"),
            ]
            for wrong, message in checks:
                if torch.allclose(got.double(), wrong.double(), atol=1e-5):
                    raise Wrong(message)
        expect_close(got, want, f"output for x {tuple(x.shape)}, P {tuple(P.shape)}")


# (end of chapter 04's checkers)


# ----------------------------------------------------------------------------- chapter 05


def _ch05_attention_case(seed: int) -> tuple[torch.Tensor, ...]:
    """Random ``q, k, v`` and a ``(B, 1, T, S)`` mask: padded keys, and (in most cases) one query
    row that may attend to nothing. ``T != S`` and ``d_k != d_v``, so transposes do not fit."""
    g = torch.Generator().manual_seed(seed)
    B, h = 2 + seed % 2, 1 + seed % 3
    T, S = 3 + seed % 3, 5 + seed % 2
    d_k, d_v = 4 + seed % 2, 3
    q, k = torch.randn(B, h, T, d_k, generator=g), torch.randn(B, h, S, d_k, generator=g)
    v = torch.randn(B, h, S, d_v, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    mask = (torch.arange(S)[None, :] < lengths[:, None])[:, None, None, :].expand(B, 1, T, S).clone()
    if seed % 4 != 3:
        mask[-1, 0, T - 1] = False  # the last query of the last sentence may see nothing
    return q * 2, k * 2, v, mask  # scores with a spread large enough for scale mistakes to show


def _ch05_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf gives NaN: make it zeros
    return weights @ v, weights


@checker("05.attention", hint="scores = q @ k.transpose(-2, -1) / d_k ** 0.5, (B, h, T, S); fill the hidden "
         "scores (mask False) with a very negative finite number, softmax over the keys (dim=-1), multiply "
         "the weights by the mask (a row that sees nothing becomes all zeros), then out = weights @ v")
def _check_attention(attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(6):
        q, k, v, mask = _ch05_attention_case(seed)
        want_out, want_weights = _ch05_attention_reference(q, k, v, mask)
        got = attention(q.clone(), k.clone(), v.clone(), mask.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (out, weights)")
        out, weights = got
        if not isinstance(weights, torch.Tensor) or not isinstance(out, torch.Tensor):
            raise Wrong("return two tensors (out, weights)")
        if weights.shape == want_weights.shape:
            if torch.isnan(weights).any() or torch.isnan(out).any():
                raise Wrong("NaN in your result: a query that may attend to nothing gives a row of -inf "
                            "scores, and softmax of that row is 0/0; fill with a large finite negative "
                            "number instead of -inf, and multiply the weights by the mask")
            if (weights.masked_select(~mask.expand_as(weights)).abs() > 1e-6).any():
                raise Wrong("a hidden key (mask False) got a non-zero weight: apply the mask to the scores "
                            "before the softmax, and zero the rows that may see nothing")
            for wrong_scale, what in ((1.0, "you did not scale the scores: divide them by sqrt(d_k)"),
                                      (1.0 / q.shape[-1], "divide the scores by sqrt(d_k), not by d_k")):
                _, unscaled = _ch05_attention_reference(q, k, v, mask, scale=wrong_scale)
                if torch.allclose(weights.double(), unscaled.double(), atol=1e-5):
                    raise Wrong(what)
            visible = mask.expand_as(weights).any(-1)
            if not torch.allclose(weights.sum(-1)[visible], torch.ones(int(visible.sum())), atol=1e-5):
                raise Wrong("each query's weights should sum to 1 over the keys: take the softmax over the "
                            "last axis (the keys), not over the queries")
        expect_close(weights, want_weights,
                     f"weights (B, h, T, S) for q {tuple(q.shape)}, k {tuple(k.shape)}")
        expect_close(out, want_out, f"out (B, h, T, d_v) for v {tuple(v.shape)}")


@checker("05.split_heads", hint="x.view(B, L, heads, D // heads) keeps each position's features together and "
         "cuts them into heads; then .transpose(1, 2) puts the heads before the positions")
def _check_split_heads(split_heads: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    for B, L, heads, d in [(2, 5, 3, 4), (1, 3, 4, 2), (3, 7, 2, 5), (2, 4, 6, 1)]:
        x = torch.randn(B, L, heads * d, generator=torch.Generator().manual_seed(B * L + heads))
        want = x.view(B, L, heads, d).transpose(1, 2)
        got = split_heads(x.clone(), heads)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a tensor, got {type(got).__name__}")
        if got.shape == want.shape and not torch.equal(got, want):
            if torch.equal(got, x.reshape(B, heads, L, d)):
                raise Wrong("you reshaped straight to (B, heads, L, d): that cuts the memory of (L, heads*d) "
                            "into pieces that mix positions; reshape to (B, L, heads, d) first, then swap "
                            "axes 1 and 2")
            if torch.equal(got, x.view(B, L, d, heads).permute(0, 3, 1, 2)):
                raise Wrong(f"head i must hold the contiguous features i*d .. (i+1)*d - 1 (here d = {d}); "
                            "yours takes every heads-th feature")
        if got.shape == (B, L, heads, d):
            raise Wrong(f"the heads must come before the positions: shape (B, heads, L, d) = "
                        f"{(B, heads, L, d)}, got {tuple(got.shape)} (transpose axes 1 and 2)")
        expect_close(got, want, f"split_heads(x of shape {tuple(x.shape)}, heads={heads})", atol=0, rtol=0)


@checker("05.causal_mask", hint="torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T): query t (one of "
         "the last T positions) may see keys 0 .. t + S - T")
def _check_causal_mask(causal_mask: Callable[[int, int], torch.Tensor]) -> None:
    for T, S in [(1, 1), (4, 4), (3, 5), (2, 6), (5, 5), (1, 4)]:
        want = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
        got = causal_mask(T, S)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise Wrong(f"return a bool tensor (True = may attend), got dtype {got.dtype}")
        if got.shape != want.shape:
            raise Wrong(f"for T={T}, S={S} the mask should have shape {(T, S)} (queries, keys), "
                        f"got {tuple(got.shape)}")
        if torch.equal(got, ~want):
            raise Wrong("your mask is True where attention is NOT allowed (PyTorch's nn.MultiheadAttention "
                        "convention); the book's masks are True where a query may attend")
        own = torch.zeros(T, S, dtype=torch.bool)
        own[torch.arange(T), torch.arange(T) + S - T] = True  # query t is position t + S - T
        if torch.equal(got, want & ~own):
            raise Wrong("a position may attend to itself: the entries (t, t + S - T) must be True")
        if not torch.equal(got, want):
            hint = (" With S > T keys the T queries are the LAST T positions: query t sees keys "
                    "0 .. t + S - T (the diagonal argument of torch.tril)." if S > T else "")
            raise Wrong(f"for T={T}, S={S} expected {want.int().tolist()}, got {got.int().tolist()}.{hint}")
# (end of chapter 05's checkers)


# ----------------------------------------------------------------------------- chapter 06


def _ch06_frequencies(d: int) -> torch.Tensor:
    """``omega_i = 10000^(-2i/d)``, one per pair of columns (float64)."""
    return 10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _ch06_table(length: int, d: int, omega: torch.Tensor | None = None, first=torch.sin,
                second=torch.cos, interleave: bool = True) -> torch.Tensor:
    """The sinusoidal table (float64), or a variant of it made with a typical mistake."""
    omega = _ch06_frequencies(d) if omega is None else omega
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None, :]
    if not interleave:  # all sines, then all cosines
        return torch.cat([first(angles), second(angles)], dim=1)[:, :d]
    table = torch.empty(length, d, dtype=torch.float64)
    table[:, 0::2] = first(angles)
    table[:, 1::2] = second(angles[:, : d // 2])
    return table


def _same(got: Any, want: torch.Tensor, atol: float = 1e-5) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape and got.is_floating_point()
            and torch.allclose(got.double(), want, atol=atol, rtol=0))


@checker("06.sinusoidal_table", hint="omega = 10000 ** (-torch.arange(0, d_model, 2) / d_model) (one "
         "frequency per pair of columns); angles = positions[:, None] * omega[None, :]; "
         "table[:, 0::2] = sin(angles), table[:, 1::2] = cos(angles) (with an odd d_model there is one "
         "cosine column fewer)")
def _check_sinusoidal_table(sinusoidal_table: Callable[[int, int], torch.Tensor]) -> None:
    for length, d in [(10, 8), (50, 16), (7, 6), (30, 5), (120, 64)]:
        want = _ch06_table(length, d)
        got = sinusoidal_table(length, d)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if not got.is_floating_point():
            raise Wrong(f"the table should be float32 (or float64), got dtype {got.dtype}")
        if got.shape == (d, length) != want.shape:
            raise Wrong(f"sinusoidal_table({length}, {d}) should be (length, d_model) = {(length, d)}, "
                        f"got it transposed, {tuple(got.shape)}")
        if _same(got, _ch06_table(length, d, first=torch.cos, second=torch.sin)):
            raise Wrong("sine and cosine are swapped: the even columns 2i hold sin(p * omega_i), the odd "
                        "ones cos")
        if _same(got, _ch06_table(length, d, interleave=False)):
            raise Wrong("you put all the sines first and then all the cosines: the two columns of a pair "
                        "are neighbours, 2i (sin) and 2i + 1 (cos)")
        pair_index = 10_000.0 ** (-torch.arange(0, (d + 1) // 2, dtype=torch.float64) / d)
        if _same(got, _ch06_table(length, d, omega=pair_index)):
            raise Wrong("the exponent of pair i is 2i / d_model (2i is the index of the pair's first "
                        "column), not i / d_model")
        column_index = torch.empty(length, d, dtype=torch.float64)
        for j in range(d):  # the column index j in the exponent, for sin and cos alike
            w = 10_000.0 ** (-j / d)
            column_index[:, j] = (torch.sin if j % 2 == 0 else torch.cos)(torch.arange(length) * w)
        if _same(got, column_index):
            raise Wrong("a cosine column 2i + 1 uses the same frequency as its sine column 2i: "
                        "10000^(-2i/d_model), not 10000^(-(2i+1)/d_model)")
        expect_close(got, want, f"sinusoidal_table({length}, {d})", atol=1e-5, rtol=0)


def _ch06_offset_matrix(offset: int, d: int, sign: int = 1, scale_by_omega: bool = True) -> torch.Tensor:
    M = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(_ch06_frequencies(d).tolist()):
        a = offset * w if scale_by_omega else float(offset)
        angle = torch.tensor(a, dtype=torch.float64)
        c, s = torch.cos(angle), torch.sin(angle)
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1] = c, sign * s
        M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = -sign * s, c
    return M


@checker("06.offset_matrix", hint="block diagonal: for each pair i, with a = offset * omega_i, the 2x2 block "
         "at rows and columns (2i, 2i+1) is [[cos a, sin a], [-sin a, cos a]], because "
         "sin(x + a) = cos a sin x + sin a cos x and cos(x + a) = -sin a sin x + cos a cos x")
def _check_offset_matrix(offset_matrix: Callable[[int, int], torch.Tensor]) -> None:
    for offset, d in [(1, 4), (3, 8), (-5, 8), (17, 16), (0, 6), (100, 32)]:
        want = _ch06_offset_matrix(offset, d)
        got = offset_matrix(offset, d)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.shape != (d, d):
            raise Wrong(f"offset_matrix({offset}, {d}) should be ({d}, {d}), got {tuple(got.shape)}")
        if offset != 0 and _same(got, _ch06_offset_matrix(offset, d, sign=-1), atol=1e-5):
            raise Wrong(f"your matrix moves positions the wrong way, PE[p] -> PE[p - ({offset})]: the "
                        "block is [[cos a, sin a], [-sin a, cos a]] for rows (sin, cos)")
        if offset != 0 and _same(got, _ch06_offset_matrix(offset, d, scale_by_omega=False), atol=1e-5):
            raise Wrong("pair i turns by offset * omega_i, not by the offset itself: every pair has its "
                        "own frequency")
        table, lo = _ch06_table(50 + abs(offset), d), max(0, -offset)
        moved = table[lo: lo + 50] @ got.double().T if got.is_floating_point() else None
        if moved is not None and not torch.allclose(moved, table[lo + offset: lo + offset + 50], atol=1e-5):
            err = (moved - table[lo + offset: lo + offset + 50]).abs().max().item()
            raise Wrong(f"for offset {offset}, d_model {d}: M @ PE[p] should equal PE[p + {offset}] for "
                        f"every p, but they differ by up to {err:.3g}")
        expect_close(got, want, f"offset_matrix({offset}, {d})", atol=1e-5, rtol=0)


def _ch06_rotate(x: torch.Tensor, positions: torch.Tensor, sign: int = 1,
                 layout: str = "pairs") -> torch.Tensor:
    d = x.shape[-1]
    angles = sign * positions.double()[:, None] * _ch06_frequencies(d)[None, :]      # (L, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    x = x.double()
    a, b = (x[..., 0::2], x[..., 1::2]) if layout == "pairs" else (x[..., : d // 2], x[..., d // 2:])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if layout == "halves":
        return torch.cat([ra, rb], dim=-1)
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = ra, rb
    return out


@checker("06.rotate_pairs", hint="theta = 10000 ** (-torch.arange(0, d, 2) / d); angles = "
         "positions[:, None] * theta[None, :] is (L, d/2); with a = x[..., 0::2] and b = x[..., 1::2], "
         "the result has a * cos - b * sin in the even features and a * sin + b * cos in the odd ones")
def _check_rotate_pairs(rotate_pairs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    cases = [((5, 4), [0, 1, 2, 3, 4]), ((2, 3, 6, 8), [7, 0, 3, 12, 5, 40]), ((1, 2, 4, 16), [2, 9, 1, 30])]
    for seed, (shape, positions) in enumerate(cases):
        g = torch.Generator().manual_seed(seed)
        x, pos = torch.randn(shape, generator=g), torch.tensor(positions)
        want = _ch06_rotate(x, pos)
        got = rotate_pairs(x.clone(), pos.clone())
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a torch.Tensor, got {type(got).__name__}")
        if got.shape != x.shape:
            raise Wrong(f"the result should keep x's shape {tuple(x.shape)}, got {tuple(got.shape)}")
        if _same(got, _ch06_rotate(x, pos, layout="halves")):
            raise Wrong("you paired feature i with feature i + d/2 (the package's layout); this exercise "
                        "pairs neighbours, (2i, 2i + 1), as Su et al. write it")
        if _same(got, _ch06_rotate(x, pos, sign=-1)):
            raise Wrong("you rotated by -p * theta_i: x'_2i = x_2i cos - x_2i+1 sin and "
                        "x'_2i+1 = x_2i sin + x_2i+1 cos")
        if pos.tolist() != list(range(len(pos))) and _same(got, _ch06_rotate(x, torch.arange(len(pos)))):
            raise Wrong("use the positions you are given, not 0, 1, ..., L - 1")
        if isinstance(got, torch.Tensor) and got.is_floating_point() and not torch.allclose(
                got.double().norm(dim=-1), x.double().norm(dim=-1), atol=1e-4):
            raise Wrong("a rotation keeps the length of every vector, yours changes it: each pair must be "
                        "rotated by [[cos, -sin], [sin, cos]]")
        expect_close(got, want, f"rotate_pairs(x {tuple(x.shape)}, positions {positions})", atol=1e-5, rtol=0)


# (end of chapter 06's checkers)


# ----------------------------------------------------------------------------- chapter 07
def _layer_norm_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    g = torch.Generator().manual_seed(seed)
    shape = [(3, 8), (2, 5, 6), (4, 3, 2, 10), (1, 16)][seed % 4]
    x = torch.randn(*shape, generator=g, dtype=torch.double) * (1 + 3 * seed) + 2 * seed
    x[..., 0, :] = 1.5 + 1e-3 * torch.randn(shape[-1], generator=g, dtype=torch.double)  # near-constant
    gamma = torch.randn(shape[-1], generator=g, dtype=torch.double)
    beta = torch.randn(shape[-1], generator=g, dtype=torch.double)
    return x, gamma, beta, [1e-5, 1e-3, 0.1, 1e-2][seed % 4]


def _layer_norm_mistakes(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
                         eps: float) -> dict[str, torch.Tensor]:
    """What typical wrong versions of layer normalisation return (for helpful messages)."""
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return {
        "you divided by d - 1 (x.var() and x.std() are unbiased by default; layer norm uses "
        "unbiased=False)": gamma * (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + eps) + beta,
        "epsilon must go inside the square root: sqrt(var + eps), not sqrt(var) + eps":
            gamma * (x - mu) / (var.sqrt() + eps) + beta,
        "the mean and variance are over the last axis (the features of one position), not over "
        "the batch": gamma * (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, unbiased=False, keepdim=True)
                                                                         + eps) + beta,
        "mu is the mean of the features, not their sum":
            gamma * (x - x.sum(-1, keepdim=True)) / torch.sqrt(((x - x.sum(-1, keepdim=True)) ** 2).mean(
                -1, keepdim=True) + eps) + beta,
        "gamma multiplies the normalised vector and beta is added after: gamma * x_hat + beta":
            (x - mu) / torch.sqrt(var + eps) * beta + gamma,
    }


@checker("07.layer_norm", hint="both statistics are means over the last axis only, kept as an axis of size "
         "1 so they broadcast back; mind which variance torch computes by default (section 3's table shows "
         "the slip) and where eps goes; gamma and beta act after normalising")
def _check_layer_norm(layer_norm: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        x, gamma, beta, eps = _layer_norm_case(seed)
        want = torch.nn.functional.layer_norm(x, (x.shape[-1],), gamma, beta, eps)
        got = layer_norm(x.clone(), gamma.clone(), beta.clone(), eps)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                not torch.allclose(got.double(), want, atol=1e-6, rtol=1e-5):
            for reason, wrong in _layer_norm_mistakes(x, gamma, beta, eps).items():
                if wrong.shape == want.shape and torch.allclose(got.double(), wrong, atol=1e-6, rtol=1e-5):
                    raise Wrong(reason)
        expect_close(got, want, f"layer_norm(x of shape {tuple(x.shape)}, eps={eps})", atol=1e-6, rtol=1e-5)


@checker("07.sublayer", hint="read section 4's two formulas: ask for each what the LayerNorm is applied to, "
         "the residual sum or only the sublayer's input, and whether x itself is ever normalised")
def _check_sublayer(sublayer_connection: Callable[..., torch.Tensor]) -> None:
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        d = 4 + 2 * seed
        x = torch.randn(2, 3 + seed, d, generator=g) * 2 + 1
        sublayer = torch.nn.Linear(d, d)
        norm = torch.nn.LayerNorm(d)
        with torch.no_grad():
            for p in [*sublayer.parameters(), *norm.parameters()]:
                p.copy_(torch.randn(p.shape, generator=g))
        with torch.no_grad():
            want = {False: norm(x + sublayer(x)), True: x + sublayer(norm(x))}
            wrong = {False: {"that is pre-LN, x + sublayer(norm(x)); post-LN normalises the sum": want[True],
                             "the residual connection is missing: add x before normalising":
                                 norm(sublayer(x))},
                     True: {"that is post-LN, norm(x + sublayer(x)); pre-LN normalises the sublayer's input":
                                want[False],
                            "the residual connection is missing: the sublayer's output must be added to x":
                                sublayer(norm(x)),
                            "pre-LN leaves the residual sum alone: do not normalise x + sublayer(norm(x))":
                                norm(x + sublayer(norm(x)))}}
            for norm_first in (False, True):
                got = sublayer_connection(x.clone(), sublayer, norm, norm_first)
                if isinstance(got, torch.Tensor) and got.shape == x.shape:
                    for reason, w in wrong[norm_first].items():
                        distinct = not torch.allclose(w, want[norm_first], atol=1e-5)
                        if distinct and torch.allclose(got, w, atol=1e-5):
                            raise Wrong(f"norm_first={norm_first}: {reason}")
                expect_close(got, want[norm_first], f"sublayer_connection(..., norm_first={norm_first})")


def _as_attention_mask(mask: Any, B: int, T: int, S: int, what: str) -> torch.Tensor:
    """``mask`` broadcast to ``(B, 1, T, S)`` the way :func:`tfmlib.attention.check_mask` reads it."""
    if not isinstance(mask, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise Wrong(f"{what} should be a bool tensor (True = may attend), got {mask.dtype}")
    if mask.dim() == 3:
        mask = mask[:, None]
    if mask.dim() not in (2, 4):
        raise Wrong(f"{what} should have 2, 3 or 4 dimensions, got shape {tuple(mask.shape)}")
    try:
        return torch.broadcast_to(mask, (B, 1, T, S))
    except RuntimeError:
        raise Wrong(f"{what} of shape {tuple(mask.shape)} does not broadcast to (batch, heads, queries, "
                    f"keys) = {(B, 'h', T, S)}") from None


@checker("07.decoder_masks", hint="True = may attend; the last axis of a mask is the keys. Self-attention "
         "combines two conditions, one on (query, key) positions and one on which keys are real; place "
         "each on the axes it depends on so that they broadcast. Ask which of the two cross-attention needs")
def _check_decoder_masks(decoder_masks: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, S, T = 2 + seed % 2, 3 + seed, 2 + 2 * seed
        src_len = torch.randint(1, S + 1, (B,), generator=g)
        tgt_len = torch.randint(1, T + 1, (B,), generator=g)
        src_len[0], tgt_len[-1] = S, max(1, T - 1)
        src_mask = torch.arange(S)[None, :] < src_len[:, None]
        tgt_mask = torch.arange(T)[None, :] < tgt_len[:, None]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        want_self = (causal[None] & tgt_mask[:, None, :])[:, None]                  # (B, 1, T, T)
        want_cross = src_mask[:, None, None, :].expand(B, 1, T, S)
        got = decoder_masks(src_mask.clone(), tgt_mask.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return a pair (self_mask, cross_mask)")
        self_mask = _as_attention_mask(got[0], B, T, T, "self_mask")
        cross_mask = _as_attention_mask(got[1], B, T, S, "cross_mask")
        if torch.equal(self_mask, ~want_self) or torch.equal(cross_mask, ~want_cross):
            raise Wrong("the masks are inverted: in this book True means 'may attend' (PyTorch's "
                        "nn.MultiheadAttention reads True as 'may not')")
        if not torch.equal(self_mask, want_self):
            if torch.equal(self_mask, causal[None, None].expand(B, 1, T, T)):
                raise Wrong("self_mask must also hide the target's padded keys (tgt_mask), not only the "
                            "future")
            if torch.equal(self_mask, tgt_mask[:, None, None, :].expand(B, 1, T, T)):
                raise Wrong("self_mask must be causal: position t may attend to positions 0..t only")
            if torch.equal(self_mask, (causal[None] & tgt_mask[:, :, None])[:, None]):
                raise Wrong("padding masks the keys (the last axis): use tgt_mask[:, None, None, :]")
            raise Wrong("self_mask is wrong: position t may attend to u when u <= t and u is a real token")
        if not torch.equal(cross_mask, want_cross):
            lower = [torch.ones(T, S, dtype=torch.bool).tril(k) for k in (0, S - T)]
            if any(torch.equal(cross_mask, want_cross & tri) for tri in lower):
                raise Wrong("cross-attention is not causal: every target position may read the whole source")
            raise Wrong("cross_mask is wrong: every target position may attend to every real source token "
                        "(src_mask on the keys), and to no padding")


# (end of chapter 07's checkers)


# ----------------------------------------------------------------------------- chapter 08


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


@checker("08.smoothed_loss", hint="section 1 splits the loss into two cross-entropies: one with the "
         "reference token, weighted 1 - eps, and one with the uniform distribution over all V tokens (the "
         "reference included), weighted eps; work in log-probabilities for stability, and average over the "
         "real positions only (padding is id 0)")
def _check_smoothed_loss(smoothed_loss: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> None:
    F = torch.nn.functional
    for seed in range(6):
        logits, targets, eps = _smoothing_case(seed)
        V = logits.shape[-1]
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0, label_smoothing=eps)
        got = smoothed_loss(logits.clone(), targets.clone(), eps)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a scalar tensor, got {type(got).__name__}")
        if got.dim() != 0:
            raise Wrong(f"return a scalar (0-d) tensor, averaged over the real tokens; got shape "
                        f"{tuple(got.shape)}")
        if eps > 0 and not torch.allclose(got.double(), want.double(), atol=1e-5, rtol=1e-4):
            log_p = F.log_softmax(logits.double(), -1)
            nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)
            real = targets != 0
            others = (-log_p.sum(-1) - nll) / (V - 1)       # eps spread over the V - 1 wrong tokens
            if torch.allclose(got.double(), ((1 - eps) * nll + eps * others)[real].mean(), atol=1e-5):
                raise Wrong("you spread eps over the V - 1 wrong tokens; this book (like Szegedy et al. "
                            "and PyTorch's label_smoothing) gives eps / V to every token, the right one "
                            "included: q = (1 - eps) * one_hot + eps / V")
            if (targets == 0).any():
                everything = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=eps)
                if torch.allclose(got.double(), everything.double(), atol=1e-5):
                    raise Wrong("your loss counts the padded positions too: average over the tokens "
                                "where targets != 0 only")
            plain = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0)
            if torch.allclose(got.double(), plain.double(), atol=1e-5):
                raise Wrong(f"with eps={eps} you returned the plain cross-entropy: mix in the uniform part")
        expect_close(got, want, f"smoothed_loss(logits {tuple(logits.shape)}, targets "
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

# (end of chapter 08's checkers)

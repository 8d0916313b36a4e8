"""Checkers for chapter 04 (from GRU to self-attention).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("04.name", answer)``.
The three exercises turn the chapter's questions into code the chapter does not write out:

* ``04.xor_two_heads`` (question 6): weights, set by hand, for two heads without an FFN that compute
  the XOR of two marked bits, at every length up to a given one;
* ``04.linear_attention_recurrence`` (question 7): one step of causal linear attention as a
  recurrence with a fixed-size state, checked against the masked quadratic form;
* ``04.order_from_the_mask`` (questions 3 and 4): two causal layers without positions whose last
  output tells which of two tokens came first, the order that one layer cannot see.

The checkers run the reader's weights or step function in their own code, so what is checked is
behaviour on inputs the reader never sees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .core import Wrong, checker, expect_close

# ----------------------------------------------------------------------------- shared helpers


def _as_matrices(got: Any, count: int, what: str) -> list[Tensor]:
    """The reader's tuple of ``count`` weights as float64 tensors (numbers allowed for the bias)."""
    if not isinstance(got, (tuple, list)) or len(got) != count:
        raise Wrong(f"return a tuple of {count} things: {what}")
    out = []
    for item in got:
        try:
            out.append(torch.as_tensor(item).detach().to(torch.double))
        except (TypeError, ValueError, RuntimeError) as e:
            raise Wrong(f"every item of {what} must be a tensor or a number ({e})") from e
    return out


def _last_position_read(X: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor) -> Tensor:
    """One causal head, no scaling, read at the last position (which sees every position):
    ``X`` ``(N, L, d)`` -> ``(N, d_v)``."""
    q = X[:, -1] @ W_Q.T                                           # (N, d_k)
    scores = torch.einsum("nk,nlk->nl", q, X @ W_K.T)              # (N, L)
    return torch.einsum("nl,nlv->nv", torch.softmax(scores, dim=-1), X @ W_V.T)


def _causal_layer(X: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor) -> Tensor:
    """One causal head, no scaling, at every position: ``(N, L, d)`` -> ``(N, L, d_v)``."""
    L = X.shape[1]
    scores = (X @ W_Q.T) @ (X @ W_K.T).transpose(1, 2)
    future = ~torch.ones(L, L, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ (X @ W_V.T)


def _lengths_to_test(T_max: int) -> list[int]:
    return sorted({3, 4, 5, 6, max(3, T_max // 2), T_max})


# ----------------------------------------------------------------------------- 04.xor_two_heads

_XOR_TOKENS = 5          # 0, 1: unmarked bits; 2, 3: the marked bits 0 and 1; 4: the question


def _xor_sequences(L: int, n: int, g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` sequences of length ``L`` as in the chapter's xor task (the question last), the four
    cases ``(a, b)`` of the marked bits in turn. Returns ``(ids (n, L), a (n,), b (n,))``."""
    ids = torch.randint(0, 2, (n, L), generator=g)
    marked = torch.argsort(torch.rand(n, L - 1, generator=g), dim=1)[:, :2]
    a, b = torch.arange(n) % 2, (torch.arange(n) // 2) % 2
    rows = torch.arange(n)
    ids[rows, marked[:, 0]] = 2 + a
    ids[rows, marked[:, 1]] = 2 + b
    ids[:, -1] = 4
    return ids, a, b


def _xor_weights(got: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    W_Q, W_K, W_V, w, b = _as_matrices(got, 5, "(W_Q, W_K, W_V, w, b)")
    for name, W in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V)):
        if W.dim() != 3 or W.shape[2] != _XOR_TOKENS:
            raise Wrong(f"{name} must be (heads, rows, 5): one (rows, 5) matrix per head, applied to the "
                        f"one-hot token x_i of width 5; got shape {tuple(W.shape)}")
        if W.shape[0] != 2:
            raise Wrong(f"{name} has {W.shape[0]} head(s): the exercise asks for two heads (section 8 proves "
                        "that one head with a linear read-out is right on at most three of the four cases)")
    if W_Q.shape != W_K.shape:
        raise Wrong(f"W_Q {tuple(W_Q.shape)} and W_K {tuple(W_K.shape)} must have the same shape: a score is "
                    "the dot product of a query and a key")
    if w.shape != (2 * W_V.shape[1],):
        raise Wrong(f"w must be ({2 * W_V.shape[1]},): it reads the two heads' outputs side by side "
                    f"(2 x d_v, d_v = {W_V.shape[1]}); got shape {tuple(w.shape)}")
    if b.numel() != 1:
        raise Wrong(f"b must be one number, got shape {tuple(b.shape)}")
    return W_Q, W_K, W_V, w, b.reshape(())


def _xor_answers(weights: tuple[Tensor, ...], ids: Tensor) -> Tensor:
    W_Q, W_K, W_V, w, b = weights
    X = torch.nn.functional.one_hot(ids, _XOR_TOKENS).double()
    heads = torch.cat([_last_position_read(X, W_Q[g], W_K[g], W_V[g]) for g in range(2)], dim=-1)
    logit = heads @ w + b
    if not torch.isfinite(logit).all():
        raise Wrong("the read-out gave inf or NaN: keep the weights finite (a large score scale is fine, "
                    "the softmax handles it)")
    return (logit > 0).long()


_TRUTH_NAMES = {(0, 1, 1, 1): "OR", (0, 0, 0, 1): "AND", (1, 1, 1, 0): "NAND", (1, 0, 0, 0): "NOR",
                (1, 0, 0, 1): "XNOR, the opposite of XOR", (0, 0, 0, 0): "always 0", (1, 1, 1, 1): "always 1"}


@checker(
    "04.xor_two_heads",
    hint=("Question 6 and the closing notes on the xor task after the experiments: give each head one kind "
          "of marked bit to look for, and write XOR as a difference of what the two heads find. The weight a "
          "head can put on one position is shared with every other position in the sequence: section 8's "
          "formula for the decision shows how large the scores must be when there are T_max of them."),
)
def _check_xor_two_heads(xor_heads: Callable[[int], tuple]) -> None:
    g = torch.Generator().manual_seed(404)
    for T_max in (6, 12, 48, 300):
        weights = _xor_weights(xor_heads(T_max))
        results = []                                             # (L, ids, a, b, correct)
        for L in _lengths_to_test(T_max):
            ids, a, b = _xor_sequences(L, 64, g)
            got = _xor_answers(weights, ids)
            results.append((L, ids, a, b, got == (a ^ b)))
        if all(bool(c.all()) for *_, c in results):
            continue
        short = [r for r in results if r[0] <= 6]
        if all(bool(r[4].all()) for r in short):
            L_bad = next(r[0] for r in results if not r[4].all())
            raise Wrong(f"right on sequences of up to 6 positions, wrong at length {L_bad} "
                        f"(T_max = {T_max}): "
                        "the more positions a head's softmax spreads over, the less weight the one marked "
                        "position keeps. Make the scores' scale grow with T_max, so that the marked position "
                        "still takes nearly all the weight at length T_max")
        a = torch.cat([r[2] for r in short])
        b = torch.cat([r[3] for r in short])
        correct = torch.cat([r[4] for r in short])
        answer = torch.where(correct, a ^ b, 1 - (a ^ b))
        table = []
        for case in ((0, 0), (0, 1), (1, 0), (1, 1)):
            in_case = (a == case[0]) & (b == case[1])
            table.append(sorted(set(answer[in_case].tolist())))
        if any(len(t) > 1 for t in table):
            i = int((~correct).nonzero()[0])
            ids = [row for r in short for row in r[1]][i]
            raise Wrong("your answer depends on more than the two marked bits (tokens 2 and 3): for the same "
                        "marked bits it differs with the unmarked bits or with where the marks stand. For "
                        f"example {ids.tolist()} (marked bits {int(a[i])}, {int(b[i])}) gets "
                        f"{int(answer[i])}. "
                        "A head whose keys match only one token kind, and whose values read only that kind, "
                        "sees nothing else")
        truth = tuple(t[0] for t in table)
        name = _TRUTH_NAMES.get(truth, "not XOR")
        advice = {
            "OR": "One head that finds a marked 1 computes OR; a second head must reveal the case where both "
                  "are 1 (it finds no marked 0 then), and the read-out must subtract it",
            "XNOR, the opposite of XOR": "Every answer is inverted: flip the sign of the read-out (w and b)",
            "always 0": "The read-out gives the same answer for every input",
            "always 1": "The read-out gives the same answer for every input",
        }.get(name, "XOR answers 0, 1, 1, 0")
        answers = ", ".join(map(str, truth))
        raise Wrong(f"on the marked bits (0,0), (0,1), (1,0), (1,1) your layer answers {answers}: that is "
                    f"{name}. {advice}")


# ----------------------------------------------------------------------------- 04.linear_attention_recurrence


def _linear_case(seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(440 + seed)
    B, T, m = 2 + seed % 2, 5 + seed, 3 + seed % 2
    d_v = m + 1 if seed % 2 == 0 else m - 1                          # m != d_v: a transposed S shows
    feature = torch.nn.functional.elu
    phi_q = feature(torch.randn(B, T, m, generator=g, dtype=torch.double)) + 1     # positive features
    phi_k = feature(torch.randn(B, T, m, generator=g, dtype=torch.double)) + 1
    return phi_q, phi_k, torch.randn(B, T, d_v, generator=g, dtype=torch.double)


def _linear_reference(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
    """The masked quadratic form,
    ``out_t = sum_{i<=t} (phi_q_t . phi_k_i) v_i / sum_{i<=t} phi_q_t . phi_k_i``."""
    T = phi_q.shape[1]
    A = (phi_q @ phi_k.transpose(1, 2)) * torch.ones(T, T, dtype=phi_q.dtype).tril()
    return (A @ v) / A.sum(-1, keepdim=True)


def _close(x: Any, y: Tensor) -> bool:
    return isinstance(x, Tensor) and x.shape == y.shape and bool(torch.isfinite(x).all()) and \
        torch.allclose(x.double(), y, atol=1e-7, rtol=1e-6)


@checker(
    "04.linear_attention_recurrence",
    hint=("Question 7 and Katharopoulos et al. (2020, section 3.4, in the references): with a kernel in "
          "place of the exponential, the numerator and the denominator of a causal output are sums over the "
          "positions up to t, and each can be kept as a running total of fixed size. Mind the order within "
          "a step: position t may attend to itself."),
)
def _check_linear_attention_recurrence(step: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    for seed in range(4):
        phi_q, phi_k, v = _linear_case(seed)
        B, T, m = phi_q.shape
        d_v = v.shape[-1]
        want_out = _linear_reference(phi_q, phi_k, v)
        S, z = torch.zeros(B, m, d_v, dtype=torch.double), torch.zeros(B, m, dtype=torch.double)
        for t in range(T):
            fq, fk, vt = phi_q[:, t], phi_k[:, t], v[:, t]
            got = step(S.clone(), z.clone(), fq.clone(), fk.clone(), vt.clone())
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                raise Wrong("return a triple (S, z, out): the new state and the output at this position")
            S_new, z_new, out = got
            for what, x, shape in (("S", S_new, (B, m, d_v)), ("z", z_new, (B, m))):
                if not isinstance(x, Tensor) or x.shape != shape:
                    got_shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                    raise Wrong(f"the new {what} has shape {got_shape}, expected {shape} (B = {B}, m = {m} "
                                f"features, d_v = {d_v}): a recurrence carries a state of fixed size from "
                                "step to step, the same shape it was given, however many positions it has "
                                "read")
            S_ref, z_ref = S + fk[:, :, None] * vt[:, None, :], z + fk
            out_ref = want_out[:, t]                                    # the masked quadratic form
            strict = (fq[:, None, :] @ S)[:, 0] / (fq * z).sum(-1, keepdim=True)       # without position t
            if isinstance(out, Tensor) and out.shape == out_ref.shape:
                if (t == 0 and not torch.isfinite(out).all()) or (t > 0 and _close(out, strict)):
                    raise Wrong(f"out at position {t} reads the state before position {t} was added (at the "
                                "first position that is 0 / 0): a position may attend to itself, so add "
                                "(k_t, v_t) to the state first, then read it with q_t")
                if t > 0 and _close(out, vt) and not _close(out_ref, vt):
                    raise Wrong("out equals v_t: the state forgot the earlier positions. S and z are running "
                                "sums over every position up to t, not the current position's terms alone")
                by_key = (fk[:, None, :] @ S_ref)[:, 0] / (fk * z_ref).sum(-1, keepdim=True)
                if _close(out, by_key) and not _close(out, out_ref):
                    raise Wrong("the state is read with phi(k_t): the query reads, so phi(q_t) multiplies S "
                                "and z; the keys' features are only what is stored")
                if _close(out, (fq[:, None, :] @ S_ref)[:, 0]) and not _close(out, out_ref):
                    raise Wrong("out is not normalised: divide the read-out of S by phi(q_t) . z_t, so that "
                                "the weights phi(q_t) . phi(k_i) of the positions sum to one as in attention")
            if _close(S_new, S + fq[:, :, None] * vt[:, None, :]) or _close(z_new, z + fq):
                raise Wrong("the state sums the queries' features: S and z must collect the keys' features "
                            "phi(k_i) (what each position is found by); the query only reads the state")
            if t > 0 and (_close(S_new, fk[:, :, None] * vt[:, None, :]) or _close(z_new, fk)):
                raise Wrong("the state holds the current position only: S_t and z_t must add position t's "
                            "terms to the previous state")
            expect_close(out, out_ref, f"out at position {t}, (B, d_v) = {(B, d_v)}", atol=1e-7, rtol=1e-6)
            expect_close(S_new, S_ref, f"S after position {t}", atol=1e-7, rtol=1e-6)
            expect_close(z_new, z_ref, f"z after position {t}", atol=1e-7, rtol=1e-6)
            S, z = S_ref, z_ref


# ----------------------------------------------------------------------------- 04.order_from_the_mask

_ORDER_TOKENS = 4        # 0: filler; 1: A; 2: B; 3: the question, last


def _order_sequences(L: int, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` sequences of ``L - 1`` tokens holding one A and one B, then the question; half of them
    with A first. Returns ``(ids (n, L), a_first (n,))``."""
    ids = torch.zeros(n, L, dtype=torch.long)
    where = torch.argsort(torch.rand(n, L - 1, generator=g), dim=1)[:, :2].sort(dim=1).values
    a_first = torch.arange(n) % 2
    rows = torch.arange(n)
    ids[rows, where[:, 0]] = torch.where(a_first == 1, 1, 2)
    ids[rows, where[:, 1]] = torch.where(a_first == 1, 2, 1)
    ids[:, -1] = 3
    return ids, a_first


def _order_weights(got: Any) -> tuple[Tensor, ...]:
    names = "(W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b)"
    W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b = _as_matrices(got, 8, names)
    for name, W in (("W_Q1", W_Q1), ("W_K1", W_K1), ("W_V1", W_V1)):
        if W.dim() != 2 or W.shape[1] != _ORDER_TOKENS:
            raise Wrong(f"{name} must be (rows, 4): layer 1 reads the one-hot tokens of width 4; got "
                        f"{tuple(W.shape)}")
    if W_Q1.shape != W_K1.shape:
        raise Wrong(f"W_Q1 {tuple(W_Q1.shape)} and W_K1 {tuple(W_K1.shape)} must have the same shape")
    width = _ORDER_TOKENS + W_V1.shape[0]
    for name, W in (("W_Q2", W_Q2), ("W_K2", W_K2), ("W_V2", W_V2)):
        if W.dim() != 2 or W.shape[1] != width:
            raise Wrong(f"{name} must be (rows, {width}): layer 2 reads [x_t; h1_t], the token (4) and layer "
                        f"1's output ({W_V1.shape[0]}) side by side; got {tuple(W.shape)}")
    if W_Q2.shape != W_K2.shape:
        raise Wrong(f"W_Q2 {tuple(W_Q2.shape)} and W_K2 {tuple(W_K2.shape)} must have the same shape")
    if w.shape != (W_V2.shape[0],):
        raise Wrong(f"w must be ({W_V2.shape[0]},), one weight per coordinate of layer 2's output; got "
                    f"{tuple(w.shape)}")
    if b.numel() != 1:
        raise Wrong(f"b must be one number, got shape {tuple(b.shape)}")
    return W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b.reshape(())


def _order_answers(weights: tuple[Tensor, ...], ids: Tensor) -> Tensor:
    W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b = weights
    X = torch.nn.functional.one_hot(ids, _ORDER_TOKENS).double()
    U = torch.cat([X, _causal_layer(X, W_Q1, W_K1, W_V1)], dim=-1)        # [x_t; h1_t]
    logit = _last_position_read(U, W_Q2, W_K2, W_V2) @ w + b
    if not torch.isfinite(logit).all():
        raise Wrong("the read-out gave inf or NaN: keep the weights finite")
    return (logit > 0).long()


def _swapped(ids: Tensor) -> Tensor:
    out = ids.clone()
    out[ids == 1], out[ids == 2] = 2, 1
    return out


@checker(
    "04.order_from_the_mask",
    hint=("Questions 3 and 4, with section 7's check that one causal layer's last output ignores the order "
          "of its prefix: the order has to be written down earlier, at a position whose causal mask cuts "
          "the sequence between A and B. Let layer 1, at one of the two tokens, record whether the other "
          "one is visible; let layer 2, at the question, find that token and read the record. As in "
          "exercise 1, the scores must be sharp enough for T_max positions."),
)
def _check_order_from_the_mask(two_layers: Callable[[int], tuple]) -> None:
    g = torch.Generator().manual_seed(414)
    for T_max in (6, 12, 48, 300):
        weights = _order_weights(two_layers(T_max))
        results = []
        for L in _lengths_to_test(T_max):
            ids, a_first = _order_sequences(L, 64, g)
            got = _order_answers(weights, ids)
            results.append((L, ids, a_first, got))
        if all(bool((got == a_first).all()) for _, _, a_first, got in results):
            continue
        short = [r for r in results if r[0] <= 6]
        examples = [row for r in short for row in r[1]]
        a_first = torch.cat([r[2] for r in short])
        got = torch.cat([r[3] for r in short])
        swapped = torch.cat([_order_answers(weights, _swapped(r[1])) for r in short])
        if torch.equal(got, swapped):
            raise Wrong("your answer does not change when A and B swap places: it cannot see their order. "
                        "Layer 2's last position sees only which tokens occur (section 7); the order must "
                        "come from layer 1, at a position where the causal mask hides one of the two tokens")
        if bool((got != a_first).all()):
            raise Wrong("every answer is inverted (1 when B comes first): flip the sign of the read-out")
        if bool((got == a_first).all()):
            L_bad = next(r[0] for r in results if not (r[3] == r[2]).all())
            raise Wrong(f"right on sequences of up to 6 positions, wrong at length {L_bad} "
                        f"(T_max = {T_max}): "
                        "a softmax over more positions leaves less weight on the one you want. Make the "
                        "scores' scale grow with T_max")
        i = int((got != a_first).nonzero()[0])
        raise Wrong(f"wrong on {int((got != a_first).sum())} of {len(got)} short sequences, for example "
                    f"{examples[i].tolist()} ({'A' if a_first[i] else 'B'} first) gets {int(got[i])}. Check "
                    "what layer 1 writes at each position, then what layer 2's query finds")

"""Checkers for chapter 09 (a decoder-only language model, sampling and the KV cache).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("09.name", answer)``.

Three extensions of what the chapter builds: a cached attention step for grouped-query attention
(``09.gqa_step``), a sliding-window cache kept in a ring buffer (``09.window_step``), and batched
greedy generation from prompts of different lengths, left-padded with per-row positions
(``09.left_padded_generate``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .core import Wrong, checker, expect_close

PAD = 0  # tfmlib.data.PAD_ID


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: bool = True) -> torch.Tensor:
    scores = q @ keys.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ values


def _top_left_message(n_keys: int) -> str:
    return (f"your output is the query attending to the first key only, as a causal mask aligned "
            f"top-left makes it (for instance F.scaled_dot_product_attention(..., is_causal=True) with one "
            f"query and {n_keys} keys: query 0 sees key 0 only); a cached step's one query is the newest "
            "position and may see every cached key: pass no causal mask (or align it bottom-right)")


def _same_dtype(got: torch.Tensor, q: torch.Tensor) -> None:
    """The checker compares in float64; a result in another dtype is the reader's slip, not a crash."""
    if got.dtype != q.dtype:
        raise Wrong(f"the inputs are {q.dtype} and your output is {got.dtype}: compute in the inputs' "
                    "dtype (a cast to float32 on the way loses the precision the comparison needs)")


# ----------------------------------------------------------------------------- 09.gqa_step


def _expand(x: torch.Tensor, heads: int, interleaved: bool = False) -> torch.Tensor:
    """(B, G, T, d) -> (B, heads, T, d): query head h reads key-value head h // (heads / G)
    (or h % G when ``interleaved``, the wrong grouping)."""
    group = heads // x.shape[1]
    return x.repeat(1, group, 1, 1) if interleaved else x.repeat_interleave(group, dim=1)


@checker("09.gqa_step", hint="section 5's cached step, with question 3's grouped-query attention: the cache "
         "holds only the G key-value heads, and each run of neighbouring query heads (H over G of them) "
         "shares one "
         "(Ainslie et al. 2023, section 2); write into the small cache, widen only what you attend with, and "
         "remember where the one new query sits relative to the cached keys (section 5's pitfall)")
def _check_gqa_step(gqa_step: Callable[..., tuple[torch.Tensor, int]]) -> None:
    g = torch.Generator().manual_seed(5)
    for B, H, G, d, cap, length in ((1, 4, 2, 4, 6, 3), (2, 6, 3, 8, 10, 4), (2, 4, 1, 4, 5, 2),
                                    (1, 2, 2, 4, 4, 0), (1, 8, 2, 4, 9, 6)):
        K = torch.randn(B, G, cap, d, generator=g, dtype=torch.double)
        Vb = torch.randn(B, G, cap, d, generator=g, dtype=torch.double)
        q = torch.randn(B, H, 1, d, generator=g, dtype=torch.double)
        k, v = (torch.randn(B, G, 1, d, generator=g, dtype=torch.double) for _ in range(2))
        keys = torch.cat([K[:, :, :length], k], 2)
        values = torch.cat([Vb[:, :, :length], v], 2)
        want = _attend(q, _expand(keys, H), _expand(values, H))
        K_in, V_in = K.clone(), Vb.clone()
        out = gqa_step(q, k, v, K_in, V_in, length)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Wrong("return a pair (output (B, H, 1, d), new length)")
        got, new_length = out
        if new_length != length + 1:
            raise Wrong(f"after one step the length is {length + 1}, got {new_length}")
        untouched = torch.ones(cap, dtype=torch.bool)
        untouched[length] = False
        if not torch.equal(K_in[:, :, length], k[:, :, 0]) or not torch.equal(V_in[:, :, length], v[:, :, 0]):
            raise Wrong("write the new key and value into the (B, G, capacity, d) buffers at position "
                        f"{length}, "
                        "in place (a widened copy of the cache is lost when the step returns)")
        if not torch.equal(K_in[:, :, untouched], K[:, :, untouched]) or \
                not torch.equal(V_in[:, :, untouched], Vb[:, :, untouched]):
            raise Wrong(f"only position {length} of the buffers may change in this step")
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise Wrong(f"the output has one row per *query* head: expected {tuple(want.shape)} (B, H, 1, "
                        "d), "
                        f"got {shape}")
        _same_dtype(got, q)
        if torch.allclose(got, want, atol=1e-8):
            continue
        _diagnose_gqa(got, q, K, Vb, keys, values, length, H)
        tiled = _attend(q, _expand(keys, H, True), _expand(values, H, True))
        if G not in (1, H) and torch.allclose(got, tiled):
            raise Wrong(f"query head h read key-value head h mod G: with H={H}, G={G} the groups are runs of "
                        f"{H // G} neighbouring query heads, so heads 0..{H // G - 1} share key-value head 0 "
                        "(repeat each key-value head, don't tile the whole set)")
        if length > 0 and torch.allclose(got, _expand(values[:, :, :1], H)):
            raise Wrong(_top_left_message(length + 1))
        if cap > length + 1 and torch.allclose(got, _attend(q, _expand(K_in, H), _expand(V_in, H))):
            raise Wrong("you attended over the whole buffer, including positions not written yet: use only "
                        "the first length + 1 positions")
        if torch.allclose(got, _attend(q, _expand(keys, H), _expand(values, H), scale=False)):
            raise Wrong("the scores are not scaled: divide them by the square root of the head size d")
        expect_close(got, want, f"gqa_step(B={B}, H={H}, G={G}, d={d}, length={length})", atol=1e-8)


def _diagnose_gqa(got: torch.Tensor, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor, length: int, H: int) -> None:
    """Name four slips that a plain value comparison would only call wrong: attending before the write,
    leaving the new key out, dividing by d, and a softmax over the heads."""
    def same(x: torch.Tensor) -> bool:
        return torch.allclose(got, x, atol=1e-8)

    d = q.shape[-1]
    if same(_attend(q, _expand(K[:, :, :length + 1], H), _expand(V[:, :, :length + 1], H))):
        raise Wrong(f"the query attended over the buffer as it was before the write (position {length} "
                    "still held garbage): write the new key and value first, then attend")
    if length > 0 and same(_attend(q, _expand(keys[:, :, :length], H), _expand(values[:, :, :length], H))):
        raise Wrong(f"the query attended over the {length} cached positions only: the new key and value "
                    f"are part of what the query sees, so attend over length + 1 = {length + 1} positions")
    wide_k, wide_v = _expand(keys, H), _expand(values, H)
    scores = q @ wide_k.transpose(-2, -1)
    if same(torch.softmax(scores / d, -1) @ wide_v):
        raise Wrong(f"you divided the scores by d = {d}: divide them by the square root of d")
    for axis, name in ((1, "query heads"), (0, "batch")):
        if q.shape[axis] > 1 and same(torch.softmax(scores / math.sqrt(d), axis) @ wide_v):
            raise Wrong(f"the softmax ran over the {name} axis: each head's weights are a distribution "
                        "over the keys, the last axis of the scores")


# ----------------------------------------------------------------------------- 09.window_step


@checker("09.window_step", hint="section 5's cache, bounded: with a window of W tokens (Longformer, Mistral; "
         "see the References) the newest token attends to itself and the tokens before it, W in all, so a "
         "buffer of W slots is enough if each new token overwrites the one that just left the window; ask "
         "which slots hold real tokens before the buffer has filled, whether the order of the keys in the "
         "buffer matters to attention, and whether you write or attend first")
def _check_window_step(window_step: Callable[..., torch.Tensor]) -> None:
    g = torch.Generator().manual_seed(6)
    for B, h, d, W, T in ((1, 1, 4, 4, 11), (2, 3, 8, 3, 8), (1, 2, 4, 5, 12)):
        ks, vs, qs = (torch.randn(B, h, T, d, generator=g, dtype=torch.double) for _ in range(3))
        K = torch.randn(B, h, W, d, generator=g, dtype=torch.double) * 3  # garbage before anything is written
        V = torch.randn(B, h, W, d, generator=g, dtype=torch.double) * 3
        # at pos = 1, "the first key only" fits two slips (is_causal, the new token left out): pos = 2 tells
        first_key_at_1 = False
        for pos in range(T):
            before_K, before_V = K.clone(), V.clone()
            q, k, v = qs[:, :, pos:pos + 1], ks[:, :, pos:pos + 1], vs[:, :, pos:pos + 1]
            try:
                got = window_step(q, k, v, K, V, pos)
            except IndexError as e:
                if pos < W:
                    raise
                raise Wrong(f"at pos={pos} with a window of {W} your step indexed past the buffer ({e}): "
                            f"a ring buffer writes token pos into slot pos mod W ({pos % W} here)") from e
            slot = pos % W
            if not torch.equal(K[:, :, slot], k[:, :, 0]) or not torch.equal(V[:, :, slot], v[:, :, 0]):
                held = f"token {pos - W}, the one that just left the window" if pos >= W else "nothing yet"
                raise Wrong(f"token {pos} must be written, in place, into slot pos mod W = {slot} of the "
                            f"(B, h, W={W}, d) buffers: that slot held {held}")
            others = torch.arange(W) != slot
            if not torch.equal(K[:, :, others], before_K[:, :, others]) or \
                    not torch.equal(V[:, :, others], before_V[:, :, others]):
                raise Wrong(f"at pos={pos} only slot {slot} may change: the other slots hold the rest of "
                            "the window")
            start = max(0, pos - W + 1)
            want = _attend(q, ks[:, :, start:pos + 1], vs[:, :, start:pos + 1])
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise Wrong(f"return the output, {tuple(want.shape)} (B, h, 1, d); got {shape}")
            _same_dtype(got, q)
            if torch.allclose(got, want, atol=1e-8):
                if first_key_at_1:
                    raise Wrong(_top_left_message(2))
                continue
            if pos == 1 and torch.allclose(got, V[:, :, :1].expand_as(got), atol=1e-8) and T > 2 and W > 2:
                first_key_at_1 = True
                continue
            _diagnose_window(got, q, K, V, before_K, before_V, ks, vs, pos, W)
            if first_key_at_1:
                raise Wrong(_top_left_message(2))
            expect_close(got, want, f"window_step at pos={pos}, W={W}", atol=1e-8)
        if first_key_at_1:
            raise Wrong(_top_left_message(2))


def _diagnose_window(got: torch.Tensor, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                     before_K: torch.Tensor, before_V: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
                     pos: int, W: int) -> None:
    def same(x: torch.Tensor) -> bool:
        return torch.allclose(got, x, atol=1e-8)

    slot = pos % W
    if pos < W - 1 and same(_attend(q, K, V)):
        raise Wrong(f"at pos={pos} you attended over all {W} slots, but only slots 0..{pos} have been "
                    "written "
                    "yet: before the buffer fills, attend over the filled slots only")
    if pos >= W and slot < W - 1 and same(_attend(q, K[:, :, :slot + 1], V[:, :, :slot + 1])):
        raise Wrong(f"at pos={pos} you attended over slots 0..{slot} only: once the buffer has wrapped "
                    "around, "
                    f"every one of the {W} slots holds one of the last {W} tokens, and the query sees them "
                    "all")
    if pos >= W and same(_attend(q, before_K, before_V)):
        raise Wrong(f"at pos={pos} the query attended over the buffer as it was before the write: it saw "
                    "token "
                    f"{pos - W}, which has left the window, and not itself; write first, then attend")
    if pos >= W - 1 and W > 1:
        keep = torch.arange(W) != (pos + 1) % W
        if same(_attend(q, K[:, :, keep], V[:, :, keep])):
            raise Wrong(f"at pos={pos} you attended over {W - 1} tokens: the window holds W = {W} tokens, "
                        "the new one included")
    start = max(0, pos - W + 1)
    if same(_attend(q, ks[:, :, start:pos + 1], vs[:, :, start:pos + 1], scale=False)):
        raise Wrong("the scores are not scaled: divide them by the square root of the head size d")
    if pos > 0:
        seen = torch.arange(W) < pos if pos < W else torch.arange(W) != slot
        if same(_attend(q, K[:, :, seen], V[:, :, seen])):
            raise Wrong(f"at pos={pos} you attended over every filled slot but the new token's (slot "
                        f"{slot}): the window includes the new token itself, so attend over slots "
                        f"0..{min(pos, W - 1)}, slot {slot} included")
    if pos > 0 and same(V[:, :, :1].expand_as(got)):
        raise Wrong(_top_left_message(min(pos + 1, W)))


# ----------------------------------------------------------------------------- 09.left_padded_generate


class _TinyLM:
    """A small language model with learned *absolute* positions and an explicit attention mask:
    ``model(ids (B, T), positions (B, T), mask (B, T, T)) -> logits (B, T, V)``, ``mask[b, i, j]`` True
    where query ``i`` may attend to key ``j``. With absolute positions, shifting a row's positions
    changes its outputs (rotary positions would hide that mistake). Unless ``emits_pad``, it never
    predicts ``PAD``; with it, a greedy row may generate id 0, which is then a token like any other.
    A row whose mask is all False (a padded query that may see nothing) gets a zero attention output,
    not NaN. It records every call, so that the checker can say what was wrong with the inputs."""

    vocab, d, context, layers = 13, 16, 40, 2

    def __init__(self, seed: int, emits_pad: bool = False) -> None:
        self.emits_pad = emits_pad
        g = torch.Generator().manual_seed(seed)
        d = self.d
        self.embed = torch.randn(self.vocab, d, generator=g, dtype=torch.double)
        self.pos = torch.randn(self.context, d, generator=g, dtype=torch.double) * 1.5
        scale = 2 / math.sqrt(d)
        self.w = [tuple(torch.randn(d, d, generator=g, dtype=torch.double) * scale for _ in range(3))
                  for _ in range(self.layers)]
        self.out = torch.randn(d, self.vocab, generator=g, dtype=torch.double)
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, ids: Any, positions: Any, mask: Any) -> torch.Tensor:
        for name, x, dim in (("ids", ids, 2), ("positions", positions, 2), ("mask", mask, 3)):
            if not isinstance(x, torch.Tensor) or x.dim() != dim:
                got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise Wrong(f"the model takes ids (B, T), positions (B, T) and mask (B, T, T); {name} was "
                            f"{got}")
        B, T = ids.shape
        if ids.dtype != torch.long or positions.dtype != torch.long:
            raise Wrong(f"ids and positions must be integer (torch.long) tensors, got {ids.dtype} and "
                        f"{positions.dtype}")
        if mask.dtype != torch.bool or tuple(mask.shape) != (B, T, T) or tuple(positions.shape) != (B, T):
            raise Wrong(f"for ids of shape {(B, T)} the model takes positions {(B, T)} and a boolean mask "
                        f"{(B, T, T)}; got positions {tuple(positions.shape)} and a {mask.dtype} mask "
                        f"{tuple(mask.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise Wrong(f"token ids must be in 0..{self.vocab - 1}")
        if int(positions.min()) < 0 or int(positions.max()) >= self.context:
            raise Wrong(f"positions must be in 0..{self.context - 1} (padding too: give it position 0), got "
                        f"{int(positions.min())}..{int(positions.max())}")
        self.calls.append((ids.clone(), positions.clone(), mask.clone()))
        return self.forward(ids, positions, mask)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed[ids] + self.pos[positions]
        for wq, wk, wv in self.w:
            scores = (x @ wq) @ (x @ wk).transpose(-2, -1) / math.sqrt(self.d)
            weights = torch.softmax(scores.masked_fill(~mask, -math.inf), -1).nan_to_num(0.0)
            x = x + torch.tanh(weights @ (x @ wv))
        logits = x @ self.out
        if not self.emits_pad:
            logits[..., PAD] = -math.inf
        return logits

    def alone(self, prompt: list[int], steps: int) -> list[int]:
        """Greedy generation for one prompt, no padding: the answer every batched row must equal."""
        ids = list(prompt)
        for _ in range(steps):
            T = len(ids)
            logits = self.forward(torch.tensor([ids]), torch.arange(T)[None],
                                  torch.ones(T, T, dtype=torch.bool).tril()[None])
            ids.append(int(logits[0, -1].argmax()))
        return ids[len(prompt):]


def _left_padded_inputs(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (P - len(p)) + p for p in prompts])
    keep = ids != PAD
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    return ids, positions, keep


def _diagnose_first_call(calls: list, prompts: list[list[int]]) -> None:
    B = len(prompts)
    ids, positions, mask = calls[0]
    want_ids, want_pos, keep = _left_padded_inputs(prompts)
    if ids.shape[0] != B:
        raise Wrong(f"the model was called with a batch of {ids.shape[0]} rows for {B} prompts: run all "
                    "prompts as one batch (one call per step), not each prompt alone")
    if ids.shape != want_ids.shape or not torch.equal(ids, want_ids):
        right = torch.tensor([p + [PAD] * (want_ids.shape[1] - len(p)) for p in prompts])
        if torch.equal(ids, right):
            raise Wrong("you padded on the right: every row's next token is predicted from its last "
                        "column, so the newest real token of every row must sit in the last column; pad on "
                        "the left")
        raise Wrong(f"the first call should read the prompts left-padded with PAD ({PAD}) to the longest "
                    f"length {want_ids.shape[1]}: expected ids {want_ids.tolist()}, got {ids.tolist()}")
    if not torch.equal(positions[keep], want_pos[keep]):
        shared = torch.arange(ids.shape[1]).expand_as(ids)
        if torch.equal(positions[keep], shared[keep]):
            raise Wrong("the positions count from the batch's first column, so a short prompt's first token "
                        "sits at a later position than it would alone: count each row's positions from its "
                        "own first real token (0 there)")
        if torch.equal(positions[keep], want_pos[keep] + 1):
            raise Wrong("the positions are off by one: a row's first real token is at position 0")
        raise Wrong(f"the positions of the real tokens are wrong: expected {want_pos.tolist()} at the "
                    f"non-padded places, got {positions.tolist()}")
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    want_mask = causal[None] & keep[:, None, :]
    real_rows = keep[:, :, None].expand(B, T, T)
    if torch.equal(mask[real_rows], want_mask[real_rows]):
        return
    if torch.equal(mask[real_rows], causal[None].expand(B, T, T)[real_rows]):
        raise Wrong("real tokens may attend to the padding on their left: the mask must also hide every "
                    "padded key (column)")
    if torch.equal(mask[real_rows], keep[:, None, :].expand(B, T, T)[real_rows]):
        raise Wrong("real tokens may attend to later tokens: the mask must be causal (key j <= query i) "
                    "as well as hide the padding")
    if torch.equal(mask[real_rows], (causal.T[None] & keep[:, None, :])[real_rows]):
        raise Wrong("your mask lets query i see keys j >= i: it is transposed (True where a query may "
                    "attend, key j <= query i)")
    raise Wrong("the mask is wrong at the real tokens' rows: True where query i may attend to key j, "
                "that is j <= i and key j is not padding")


def _diagnose_generated_pad(calls: list, P: int) -> None:
    """A generated id 0 hidden from the newest query, as if it were padding (``keep = ids != PAD``)."""
    for ids, _, mask in calls[1:]:
        generated = ids[:, P:]
        hidden = (generated == PAD) & ~mask[:, -1, P:]
        if hidden.any():
            b, j = (int(i) for i in hidden.nonzero()[0])
            raise Wrong(f"row {b} generated id {PAD} (PAD_ID) at step {j}, and your mask then hid it as "
                        "padding: a generated token is a token even if its id is PAD_ID; grow the "
                        "keep-mask (and the positions) by one column of real tokens per step instead of "
                        "re-deriving them from the ids")


@checker("09.left_padded_generate", hint="the package's generate, which sections 4 and 5 call, refuses "
         "padding in a prompt, because its model gives every row the same positions and masks no key; "
         "here the model takes positions and a mask, so you supply what generate lacks: where each row's "
         "newest token must sit for the next prediction, which position each real token has when its "
         "prompt is alone, and which keys each real query may see; then grow all three by one column per "
         "step")
def _check_left_padded_generate(left_padded_generate: Callable[..., torch.Tensor]) -> None:
    # the last model may generate id 0 (PAD_ID), which a real model's vocabulary also allows: a generated
    # token is a token whatever its id, so the padding cannot be re-derived from the ids at each step
    for seed, prompts, steps, emits_pad in ((0, [[4, 7, 2, 9, 5], [6], [3, 3, 8]], 5, False),
                                            (1, [[5, 1, 12], [9, 10, 4, 4, 2, 7, 11]], 6, False),
                                            (2, [[2, 5], [8, 4]], 3, False),
                                            (20, [[5, 11], [6], [3, 1, 7, 7, 2]], 5, True)):
        model = _TinyLM(seed, emits_pad)
        want = torch.tensor([model.alone(p, steps) for p in prompts])
        got = left_padded_generate(model, [list(p) for p in prompts], steps)
        if not model.calls:
            raise Wrong("call the model given to you (model(ids, positions, mask)) to predict each token")
        _diagnose_first_call(model.calls, prompts)
        if any(c[0].shape[0] != len(prompts) for c in model.calls):
            raise Wrong("every call must read the whole batch, one row per prompt")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (len(prompts), steps):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise Wrong(f"return the {steps} new tokens of each prompt, a ({len(prompts)}, {steps}) tensor "
                        f"(without the prompt); got {shape}")
        if torch.equal(got.long(), want):
            continue
        _diagnose_generated_pad(model.calls, len(max(prompts, key=len)))
        first_bad = int((got.long() != want).any(0).nonzero()[0])
        raise Wrong(f"the prompts' first new tokens are right but step {first_bad} differs from generating "
                    "each "
                    f"prompt alone (expected {want.tolist()}, got {got.tolist()}): after each step, append "
                    "the new tokens in a new last column, with the next position of each row and a mask that "
                    "still hides the padding" if first_bad > 0 else
                    f"the first new tokens differ from generating each prompt alone (expected "
                    f"{want[:, 0].tolist()}, got {got[:, 0].tolist()}): read each row's prediction from the "
                    "last column")

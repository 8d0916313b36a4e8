"""Checkers for chapter 09 (a decoder-only language model, sampling and the KV cache).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("09.name", answer)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _nucleus_reference(logits: torch.Tensor, p: float) -> torch.Tensor:
    probs = torch.softmax(logits.double(), -1)
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= p)
    return logits.masked_fill(drop, -math.inf)


@checker("09.top_p", hint="section 4: the nucleus is the smallest set of most probable tokens whose mass "
         "reaches p, so it includes the token that crosses p and is never empty; the filtered logits must "
         "come back in the original token order")
def _check_top_p(top_p: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
    g = torch.Generator().manual_seed(9)
    cases = [(torch.tensor([0.5, 0.05, 0.3, 0.15]).log(), p) for p in (0.5, 0.51, 0.8, 0.81, 0.01, 1.0)]
    cases += [(torch.randn(3, 17, generator=g) * s, p) for s, p in ((1.0, 0.9), (3.0, 0.5), (0.3, 0.95))]
    for logits, p in cases:
        want = _nucleus_reference(logits, p)
        got = top_p(logits.clone(), p)
        if not isinstance(got, torch.Tensor) or got.shape != logits.shape:
            raise Wrong(f"return the filtered logits, a tensor of shape {tuple(logits.shape)}")
        kept_want, kept_got = torch.isfinite(want), torch.isfinite(got)
        if not torch.equal(kept_want, kept_got):
            n_want, n_got = int(kept_want.sum()), int(kept_got.sum())
            if n_got == n_want + kept_want.dim() and n_got > n_want:
                raise Wrong(f"p={p}: you keep one token too many per row: keep a token while the mass "
                            "*before* it is below p, not while the mass including it is")
            if n_got < n_want:
                raise Wrong(f"p={p}: you keep {n_got} tokens where the nucleus has {n_want}: is the most "
                            "probable token always kept, and is the mass counted before each token?")
            raise Wrong(f"p={p}: you keep the wrong tokens ({n_got} kept, {n_want} expected); sort by "
                        "probability, and scatter the result back to the original order")
        if not torch.equal(got[kept_got], logits[kept_got]):
            raise Wrong("the kept logits must be unchanged (filtering only sets the others to -inf)")


@checker("09.cached_step", hint="section 5: write the new key and value into the buffers at the position "
         "given by the length, then attend with the one new query over every position up to and including "
         "it (scaled scores, softmax over those keys only); the answer is the output and the new length")
def _check_cached_step(cached_step: Callable[..., tuple[torch.Tensor, int]]) -> None:
    g = torch.Generator().manual_seed(5)
    for B, h, d, cap, length in ((1, 1, 4, 6, 0), (2, 3, 8, 10, 4), (3, 2, 4, 5, 4)):
        K = torch.randn(B, h, cap, d, generator=g, dtype=torch.double)
        Vb = torch.randn(B, h, cap, d, generator=g, dtype=torch.double)
        q, k, v = (torch.randn(B, h, 1, d, generator=g, dtype=torch.double) for _ in range(3))
        keys = torch.cat([K[:, :, :length], k], 2)
        values = torch.cat([Vb[:, :, :length], v], 2)
        want = torch.softmax(q @ keys.transpose(-2, -1) / math.sqrt(d), -1) @ values
        K_in, V_in = K.clone(), Vb.clone()
        out = cached_step(q, k, v, K_in, V_in, length)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Wrong("return a pair (output (B, h, 1, d), new length)")
        got, new_length = out
        if new_length != length + 1:
            raise Wrong(f"after one step the length is {length + 1}, got {new_length}")
        if not torch.equal(K_in[:, :, length], k[:, :, 0]) or not torch.equal(V_in[:, :, length], v[:, :, 0]):
            raise Wrong(f"write the new key and value into the buffers at position {length} (in place)")
        if cap > length + 1 and isinstance(got, torch.Tensor) and got.shape == want.shape:
            wide = torch.softmax(q @ K_in.transpose(-2, -1) / math.sqrt(d), -1) @ V_in
            if torch.allclose(got, wide):
                raise Wrong("you attended over the whole buffer, including positions not written yet: "
                            "use only the first length + 1 positions")
        expect_close(got, want, f"cached_step(B={B}, h={h}, d={d}, length={length})", atol=1e-8)


@checker("09.cache_bytes", hint="a cache holds two vectors per token per layer (which two?), each as wide as "
         "the model, for every sequence of the batch; multiply by the bytes of one number in the dtype")
def _check_cache_bytes(cache_bytes: Callable[..., int]) -> None:
    cases = [(12, 768, 1024, 1, torch.float32), (2, 128, 64, 8, torch.float32),
             (32, 4096, 4096, 1, torch.float16), (4, 256, 1000, 3, torch.bfloat16)]
    for layers, d_model, tokens, batch, dtype in cases:
        size = torch.empty((), dtype=dtype).element_size()
        want = 2 * layers * d_model * tokens * batch * size
        got = cache_bytes(layers=layers, d_model=d_model, tokens=tokens, batch=batch, dtype=dtype)
        if isinstance(got, torch.Tensor):
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise Wrong(f"return a number of bytes, got {type(got).__name__}")
        if got == want // 2:
            raise Wrong("a cache stores keys AND values: twice what you counted")
        if got == want // size:
            raise Wrong("that is a count of numbers; multiply by the bytes of one number in the dtype")
        if got != want:
            raise Wrong(f"layers={layers}, d_model={d_model}, tokens={tokens}, batch={batch}, {dtype}: "
                        f"expected {want:,} bytes, got {got:,}")

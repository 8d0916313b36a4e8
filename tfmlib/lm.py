"""A GPT-style decoder-only language model, and generation from it with or without the KV cache.

Introduced in chapter 09 (a decoder-only language model, sampling and the KV cache).

:class:`DecoderLM` is the Transformer's decoder with the cross-attention taken out (Radford et al.
2018, section 3.1; Liu et al. 2018): token embeddings, positions, a stack of chapter 07's pre-LN
:class:`~tfmlib.transformer.EncoderLayer` s run *causally* (each position attends to itself and
the positions before it), a final LayerNorm, and an output layer that shares its weight with the
token embedding (Press & Wolf 2017). Positions are rotary (``positional="rotary"``, the default:
no table, so the context is a limit we choose, not one the weights impose) or a learned table of
``context`` rows (``"learned"``, GPT-2's).

Training (``forward``) and decoding with the cache (``step``) run the same blocks: chapter 07's
``EncoderLayer.forward`` with ``causal=True``, given each block's
:class:`~tfmlib.kv_cache.KVCache` when decoding. :func:`generate` extends prompts one token at a
time, choosing each with :mod:`tfmlib.sampling`; ``use_cache=True`` keeps every layer's keys and
values in a :class:`~tfmlib.kv_cache.DecoderCache` (one new position per step), ``use_cache=False``
re-runs the whole sequence at every step. The two give the same tokens and the same logits (tested).

Shapes: ``B`` batch, ``T`` tokens, ``V`` vocabulary, ``d`` = ``d_model``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfmlib.attention import AttentionKernel, fast_attention, scaled_dot_product_attention
from tfmlib.data import PAD_ID
from tfmlib.kv_cache import DecoderCache
from tfmlib.positional import LearnedPositionalEmbedding, RotaryEmbedding
from tfmlib.sampling import greedy_next, sample_next
from tfmlib.transformer import EncoderLayer

INTRODUCED_IN = 9

__all__ = ["ATTENTION_KERNELS", "DecoderLM", "generate", "lm_log_probs"]


def _explicit_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                     dropout_p: float) -> Tensor:
    return scaled_dot_product_attention(q, k, v, mask, dropout_p, causal=causal)[0]


# The attention computations a DecoderLM can train with (chapter 10 times them against each other):
# "fused" is F.scaled_dot_product_attention (PyTorch's fused kernels where the device has them),
# "explicit" is chapter 05's softmax(Q K^T / sqrt(d_k)) V written out, the (T, T) weights stored.
ATTENTION_KERNELS: dict[str, AttentionKernel] = {"fused": fast_attention, "explicit": _explicit_kernel}


class DecoderLM(nn.Module):
    """A decoder-only Transformer language model.

    ``forward(ids (B, T)) -> logits (B, T, V)``: the logits at position ``t`` predict token
    ``t + 1`` from tokens ``0 .. t`` (use it with :func:`tfmlib.rnn.lm_loss` and
    :func:`tfmlib.rnn.collate_lm`, like chapter 01's language models). ``step(ids (B, T), cache)
    -> (logits (B, T, V), cache)`` reads ``T`` more tokens after those in ``cache`` (a
    :meth:`new_cache`) and returns a cache that holds their keys and values too; the cache it was
    given is left as it was, so a step from one cache always gives the same logits.

    ``d_ff`` defaults to ``4 * d_model``; ``context`` is the longest sequence the model reads
    (the size of the learned position table; for rotary positions, a limit that
    :func:`generate` and ``forward`` check). The embedding is drawn from ``N(0, 0.02^2)`` (GPT-2's)
    and the output layer is the embedding matrix itself (``tie_weights=True``).

    ``attention`` picks how ``forward`` computes causal attention: ``"fused"`` (default,
    ``F.scaled_dot_product_attention``), ``"explicit"`` (chapter 05's written-out softmax, which
    stores the ``(T, T)`` weights), or a callable with :func:`~tfmlib.attention.fast_attention`'s
    arguments ``(q, k, v, mask, causal, dropout_p) -> out``. It is an attribute: set
    ``model.attention`` to switch (it sets every block's ``self_attn.kernel``); the weights do not
    change. ``step`` (generation with a cache) uses it too.
    """

    def __init__(self, vocab_size: int, *, d_model: int = 128, heads: int = 4, layers: int = 2,
                 d_ff: int | None = None, dropout: float = 0.0, context: int = 128,
                 positional: str = "rotary", rotary_base: float = 10_000.0, tie_weights: bool = True,
                 attention: str | AttentionKernel = "fused"):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("d_model", d_model), ("heads", heads),
                        ("layers", layers), ("context", context)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"DecoderLM: {name} must be a positive int, got {v!r}")
        if d_model % heads:
            raise ValueError(f"DecoderLM: d_model={d_model} is not divisible by heads={heads}")
        if positional not in ("rotary", "learned"):
            raise ValueError(f"DecoderLM: positional must be 'rotary' or 'learned', got {positional!r}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.vocab_size, self.d_model = vocab_size, d_model
        self.context, self.positional = context, positional
        self.config = dict(d_model=d_model, heads=heads, layers=layers, d_ff=d_ff, dropout=dropout,
                           context=context, positional=positional, rotary_base=rotary_base,
                           tie_weights=tie_weights)
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.pos = LearnedPositionalEmbedding(context, d_model) if positional == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(EncoderLayer(d_model, heads, d_ff, dropout, norm_first=True,
                                                 activation="gelu") for _ in range(layers))
        if positional == "rotary":
            for block in self.blocks:
                block.self_attn.rotary = RotaryEmbedding(d_model // heads, rotary_base)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, 0.0, 0.02)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()
        if tie_weights:
            self.head.weight = self.embed.weight
        self.attention = attention  # sets the blocks' attention kernel

    def _check_ids(self, ids: Tensor, who: str, start: int = 0) -> None:
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int):
            got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"DecoderLM.{who}: ids must be a (batch, tokens) integer tensor, got {got}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"DecoderLM.{who}: empty input, shape {tuple(ids.shape)}")
        if start + ids.shape[1] > self.context:
            raise ValueError(f"DecoderLM.{who}: {start + ids.shape[1]} tokens are more than the model's "
                             f"context={self.context}")

    def _embed(self, ids: Tensor, offset: int) -> Tensor:
        x = self.embed(ids)
        if self.pos is not None:
            x = self.pos(x, offset)
        return self.drop(x)

    @property
    def attention(self) -> str | AttentionKernel:
        return self._attention

    @attention.setter
    def attention(self, value: str | AttentionKernel) -> None:
        if isinstance(value, str) and value not in ATTENTION_KERNELS:
            raise ValueError(f"DecoderLM: attention must be one of {sorted(ATTENTION_KERNELS)} or a callable "
                             f"(q, k, v, mask, causal, dropout_p) -> out, got {value!r}")
        if not isinstance(value, str) and not callable(value):
            raise TypeError(f"DecoderLM: attention must be a name or a callable, got {type(value).__name__}")
        self._attention = value
        kernel = ATTENTION_KERNELS[value] if isinstance(value, str) else value
        for block in self.blocks:
            block.self_attn.kernel = kernel

    def forward(self, ids: Tensor) -> Tensor:
        self._check_ids(ids, "forward")
        x = self._embed(ids, 0)
        for block in self.blocks:
            x, _ = block(x, causal=True)
        return self.head(self.norm(x))

    def new_cache(self, capacity: int | None = None, *, preallocate: bool = True) -> DecoderCache:
        """An empty cache for :meth:`step`, for up to ``capacity`` tokens (default: ``context``)."""
        return DecoderCache.empty(len(self.blocks), self.context if capacity is None else capacity,
                                  preallocate=preallocate)

    def step(self, ids: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        self._check_ids(ids, "step", cache.length)
        x = self._embed(ids, cache.length)
        cache = cache.fork()  # extend a fork: the caller's cache stays as it was (nothing is copied)
        for block, layer_cache in zip(self.blocks, cache.layers, strict=True):
            x, _ = block(x, causal=True, cache=layer_cache)
        return self.head(self.norm(x)), cache


def generate(model: DecoderLM, prompt: Tensor, max_new_tokens: int, *, use_cache: bool = True,
             preallocate: bool = True, temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             return_logits: bool = False,
             choose: Callable[[Tensor], Tensor] | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Extend ``prompt`` ``(B, P)`` by ``max_new_tokens`` tokens: ``(B, P + max_new_tokens)`` ids.

    Each token is chosen from the logits of the last position: greedily when ``temperature``,
    ``top_k`` and ``top_p`` are all ``None``, else drawn by :func:`~tfmlib.sampling.sample_next`
    (temperature default 1) with ``generator``; or by ``choose(logits (B, V)) -> (B,)``. No stop
    token: every row gets ``max_new_tokens`` (the chapter's timings compare fixed lengths).

    ``use_cache=True`` reads the prompt once and then one token per step through a
    :class:`~tfmlib.kv_cache.DecoderCache` (pre-allocated for the whole length, or concatenated
    when ``preallocate=False``); ``use_cache=False`` re-runs the model on the whole sequence at
    every step. With ``return_logits`` the logits ``(B, max_new_tokens, V)`` of every choice are
    returned too. Runs in eval mode (restored afterwards), without gradients.
    ``ValueError`` for an empty prompt, a prompt that holds ``PAD_ID`` (padding is not masked: one
    prompt length per batch), a prompt plus ``max_new_tokens`` longer than the model's context,
    ``max_new_tokens < 1`` and bad sampling settings.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.shape[0] == 0 or prompt.shape[1] == 0:
        got = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
        raise ValueError(f"generate: prompt must be a non-empty (batch, tokens) id tensor, got {got}")
    padded = (prompt == PAD_ID).nonzero()
    if len(padded):
        row, col = padded[0].tolist()
        raise ValueError(f"generate: prompt row {row} holds PAD_ID ({PAD_ID}) at position {col}; generate "
                         "masks no padding and gives every row the same positions, so the prompts of one "
                         "batch must have one length: generate prompts of different lengths separately "
                         "(or in groups of equal length)")
    total = prompt.shape[1] + max_new_tokens
    if total > model.context:
        raise ValueError(f"generate: a prompt of {prompt.shape[1]} tokens plus "
                         f"max_new_tokens={max_new_tokens} is {total} tokens, more than the model's "
                         f"context={model.context}")
    sampling = temperature is not None or top_k is not None or top_p is not None
    if choose is None:
        if sampling:
            settings = dict(temperature=1.0 if temperature is None else temperature, top_k=top_k, top_p=top_p)
            sample_next(prompt.new_zeros((1, 2), dtype=torch.float), **settings)  # validates the settings

            def choose(logits: Tensor) -> Tensor:
                return sample_next(logits, generator=generator, **settings)
        else:
            choose = greedy_next
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids, chosen_logits = prompt, []
            if use_cache:
                logits, cache = model.step(prompt, model.new_cache(total, preallocate=preallocate))
                logits = logits[:, -1]
            else:
                logits = model(prompt)[:, -1]
            for i in range(max_new_tokens):
                chosen_logits.append(logits)
                token = choose(logits)                                    # (B,)
                ids = torch.cat([ids, token[:, None]], dim=1)
                if i + 1 == max_new_tokens:
                    break
                if use_cache:
                    logits, cache = model.step(token[:, None], cache)
                    logits = logits[:, -1]
                else:
                    logits = model(ids)[:, -1]
    finally:
        model.train(was_training)
    if return_logits:
        return ids, torch.stack(chosen_logits, dim=1)
    return ids


def lm_log_probs(model: DecoderLM, ids: Tensor) -> Tensor:
    """``log p(ids[:, t] | ids[:, :t])`` for ``t >= 1``: ``(B, T - 1)`` (a helper for scoring)."""
    logits = model(ids[:, :-1])
    return F.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]

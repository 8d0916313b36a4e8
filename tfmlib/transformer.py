"""The Transformer (Vaswani et al. 2017): layers, stacks and the encoder-decoder model.

Introduced in chapter 07 (the Transformer architecture); chapter 08 trains it to translate.

* :class:`LayerNormScratch` is layer normalisation written out (a *mean* over the features, and
  the epsilon *inside* the square root), for teaching; the layers use ``nn.LayerNorm``, which the
  tests show computes the same thing.
* :class:`FeedForward` is the position-wise network ``W_2 act(W_1 x + b_1) + b_2``.
* :class:`EncoderLayer` and :class:`DecoderLayer` wrap self-attention (and, in the decoder,
  cross-attention: queries from the decoder, keys and values from the encoder) and the
  feed-forward network in residual connections with LayerNorm, either after each residual sum
  (``norm_first=False``, "post-LN", the paper's) or before each sublayer (``norm_first=True``,
  "pre-LN", most later models').
* the layers take chapter 09's key-value cache as optional arguments (``cache=``, and the
  decoder's ``memory_kv=``; :class:`Decoder` takes a whole :class:`~tfmlib.kv_cache.DecoderCache`),
  so that cached decoding runs the same code as training; an :class:`EncoderLayer` with
  ``causal=True`` is chapter 09's decoder-only block; :func:`new_decoder_cache` and
  :func:`cached_decode_step` are :class:`Transformer`'s decoding with that cache (its default,
  ``kv_cache = True``), kept out of the class, whose own ``decode_step`` re-reads the prefix;
* :class:`Encoder` and :class:`Decoder` stack them; :class:`Transformer` adds token embeddings
  scaled by ``sqrt(d_model)``, positions (:mod:`tfmlib.positional`) and the output projection
  (optionally tied to the target embedding) and implements the book's
  :class:`~tfmlib.seq2seq.EncoderDecoder` interface, so chapter 02's decoding and training code
  runs it unchanged.
* :func:`copy_from_torch_transformer` (and the per-layer copies) load ``nn.Transformer``'s weights
  into these modules: the tests check equal outputs and gradients.

The cache's types come from :mod:`tfmlib.kv_cache` (chapter 09), which imports nothing from the
package, so there is no import circle. This module imports it for type hints, and at run time only
inside :meth:`Decoder.new_cache`, the one place that builds a cache: chapter 07's notebook runs this
module's classes from its own cells and imports only modules of chapters up to 07, so a top-level
import would not be available there. A chapter-07 reader meets the cache only as optional
arguments and the ``kv_cache`` switch.

Masks follow :mod:`tfmlib.attention`: bool (``True`` = may attend) or floating (added to the
scores). Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``d`` = ``d_model``, ``V``
vocabulary, ``h`` heads.

**Differences from PyTorch** (``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``,
``nn.Transformer``); what the copies cannot represent is refused, never copied approximately:

* batch first only (no ``batch_first=False``) and no unbatched input;
* the decoder's self-attention is always causal (``tgt_mask`` need not say so), and masks are
  keep-masks: pass ``padding_mask(keep)``, not ``key_padding_mask=~keep``;
* ``nn.Transformer`` always ends each stack with a LayerNorm; ours only with ``final_norm=True``
  (the default for pre-LN), and :func:`copy_from_torch_transformer` checks they match;
* one dropout probability per layer; the copies check it, the activation (``"relu"``,
  ``"gelu"`` or the same callable), ``d_ff``, ``norm_first`` and the LayerNorms' ``eps`` match;
* no nested-tensor fast path (PyTorch's inference-only optimisation; outputs are the same).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfmlib.attention import MultiHeadAttention, copy_from_torch_mha, padding_mask
from tfmlib.data import PAD_ID, SPECIAL_TOKENS
from tfmlib.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from tfmlib.seq2seq import EncoderDecoder, EncoderOutput, StepOutput, check_ids, check_source

if TYPE_CHECKING:  # for type hints; Decoder.new_cache imports the cache where it builds one
    from tfmlib.kv_cache import DecoderCache, KVCache

INTRODUCED_IN = 7

__all__ = [
    "ACTIVATIONS",
    "AttentionMaps",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LayerNormScratch",
    "Transformer",
    "cached_decode_step",
    "copy_from_torch_decoder_layer",
    "copy_from_torch_encoder_layer",
    "copy_from_torch_transformer",
    "new_decoder_cache",
]

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _activation(who: str, activation: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """The function an ``activation`` argument names: a key of :data:`ACTIVATIONS`, or a callable
    (a function such as ``F.gelu`` or a module such as ``nn.GELU()``), as PyTorch's layers accept."""
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"{who}: activation must be one of {sorted(ACTIVATIONS)} or a callable, "
                             f"got {activation!r}")
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise ValueError(f"{who}: activation must be one of {sorted(ACTIVATIONS)} or a callable, got "
                         f"{type(activation).__name__}")
    return activation


def _positive_int(who: str, **values: object) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{who}: {name} must be a positive int, got {v!r}")


def _check_dropout(who: str, p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{who}: dropout must be in [0, 1), got {p}")


class LayerNormScratch(nn.Module):
    """Layer normalisation (Ba et al. 2016) over the last axis, written out::

        mu = mean_i x_i,  var = mean_i (x_i - mu)^2,  y = gamma * (x - mu) / sqrt(var + eps) + beta

    The mean and the (biased) variance are *means* over the ``d`` features, and ``eps`` sits
    inside the square root: what ``nn.LayerNorm`` computes. ``forward(x (..., d)) -> (..., d)``.
    """

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        _positive_int("LayerNormScratch", d=d)
        self.d, self.eps = d, eps
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d:
            raise ValueError(f"LayerNormScratch: expected {self.d} features on the last axis, got shape "
                             f"{tuple(x.shape)}")
        mu = x.mean(dim=-1, keepdim=True)
        var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
        return self.gamma * (x - mu) / torch.sqrt(var + self.eps) + self.beta


class FeedForward(nn.Module):
    """The position-wise feed-forward network ``linear2(dropout(act(linear1(x))))``.

    ``forward(x (..., d_model)) -> (..., d_model)``; every position is transformed by the same
    two-layer MLP, independently of the others. ``d_ff`` is the hidden width (the paper: 4 d_model).
    ``activation`` is ``"relu"`` (the paper's), ``"gelu"``, or any callable ``Tensor -> Tensor``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0,
                 activation: str | Callable[[Tensor], Tensor] = "relu"):
        super().__init__()
        _positive_int("FeedForward", d_model=d_model, d_ff=d_ff)
        _check_dropout("FeedForward", dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = _activation("FeedForward", activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each in a residual connection with LayerNorm.

    ``norm_first=False`` (post-LN, the paper's)::

        x = norm1(x + dropout(SelfAttn(x)));   x = norm2(x + dropout(FFN(x)))

    ``norm_first=True`` (pre-LN)::

        x = x + dropout(SelfAttn(norm1(x)));   x = x + dropout(FFN(norm2(x)))

    ``forward(x (B, S, d), mask=None, need_weights=False, *, causal=False, cache=None) -> (x (B, S,
    d), weights (B, h, S, S) or None)``; ``mask`` as in :class:`~tfmlib.attention.MultiHeadAttention`
    (e.g. ``padding_mask``). ``causal=True`` lets each position see only itself and earlier ones
    (chapter 09's decoder-only block); ``cache`` (a :class:`~tfmlib.kv_cache.KVCache`, chapter 09)
    holds the keys and values of earlier positions, ``x`` is then the new ones only, and the
    self-attention appends their keys and values to it.
    """

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float = 0.1, *, norm_first: bool = False,
                 activation: str | Callable[[Tensor], Tensor] = "relu", eps: float = 1e-5):
        super().__init__()
        _check_dropout("EncoderLayer", dropout)
        self.self_attn = MultiHeadAttention(d_model, heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2 = nn.LayerNorm(d_model, eps=eps), nn.LayerNorm(d_model, eps=eps)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False, *,
                causal: bool = False, cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        if self.norm_first:
            a, weights = self.self_attn(self.norm1(x), mask=mask, causal=causal, need_weights=need_weights,
                                        cache=cache)
            x = x + self.dropout1(a)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            a, weights = self.self_attn(x, mask=mask, causal=causal, need_weights=need_weights, cache=cache)
            x = self.norm1(x + self.dropout1(a))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked (causal) self-attention, cross-attention over the encoder's output, the feed-forward
    network; each in a residual connection with LayerNorm (post-LN or pre-LN as in
    :class:`EncoderLayer`).

    Cross-attention takes its *queries* from the decoder and its *keys and values* from the
    encoder output ``memory``: each target position reads the source.

    ``forward(x (B, T, d), memory (B, S, d), memory_mask=None, self_mask=None, need_weights=False)
    -> (x (B, T, d), self_weights (B, h, T, T) or None, cross_weights (B, h, T, S) or None)``.
    Self-attention is always causal (position ``t`` sees ``0..t``); ``self_mask`` may restrict it
    further (e.g. target padding); ``memory_mask`` is usually ``padding_mask(src_mask)``.

    Decoding with chapter 09's cache: ``cache`` (a :class:`~tfmlib.kv_cache.KVCache`) holds the
    self-attention keys and values of the target tokens read so far, ``x`` is the new ones only,
    and their keys and values are appended to it; ``memory_kv`` is the cross-attention's keys and
    values of ``memory`` ``(B, h, S, d_k)``, projected once per sentence
    (``cross_attn.keys_values(memory)``) instead of at every step.
    """

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float = 0.1, *, norm_first: bool = False,
                 activation: str | Callable[[Tensor], Tensor] = "relu", eps: float = 1e-5):
        super().__init__()
        _check_dropout("DecoderLayer", dropout)
        self.self_attn = MultiHeadAttention(d_model, heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model, eps=eps) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))
        self.norm_first = norm_first

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None,
                self_mask: Tensor | None = None, need_weights: bool = False, *,
                cache: KVCache | None = None, memory_kv: tuple[Tensor, Tensor] | None = None,
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if self.norm_first:
            a, self_w = self.self_attn(self.norm1(x), mask=self_mask, causal=True, need_weights=need_weights,
                                       cache=cache)
            x = x + self.dropout1(a)
            c, cross_w = self.cross_attn(self.norm2(x), memory, mask=memory_mask, need_weights=need_weights,
                                         kv=memory_kv)
            x = x + self.dropout2(c)
            x = x + self.dropout3(self.ff(self.norm3(x)))
        else:
            a, self_w = self.self_attn(x, mask=self_mask, causal=True, need_weights=need_weights, cache=cache)
            x = self.norm1(x + self.dropout1(a))
            c, cross_w = self.cross_attn(x, memory, mask=memory_mask, need_weights=need_weights, kv=memory_kv)
            x = self.norm2(x + self.dropout2(c))
            x = self.norm3(x + self.dropout3(self.ff(x)))
        return x, self_w, cross_w


class Encoder(nn.Module):
    """``num_layers`` :class:`EncoderLayer` s, then a LayerNorm when ``final_norm``.

    A pre-LN stack needs the final norm (its residual stream is never normalised otherwise); the
    paper's post-LN stack does not have one (its default here), while ``nn.Transformer`` always
    adds one. ``forward(x (B, S, d), mask=None, need_weights=False) -> (x, [weights per layer] or
    None)``.
    """

    def __init__(self, num_layers: int, d_model: int, heads: int, d_ff: int, dropout: float = 0.1, *,
                 norm_first: bool = False, final_norm: bool | None = None,
                 activation: str | Callable[[Tensor], Tensor] = "relu", eps: float = 1e-5):
        super().__init__()
        _positive_int("Encoder", num_layers=num_layers)
        self.layers = nn.ModuleList(EncoderLayer(d_model, heads, d_ff, dropout, norm_first=norm_first,
                                                 activation=activation, eps=eps) for _ in range(num_layers))
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(d_model, eps=eps) if final_norm else None

    def forward(self, x: Tensor, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, list[Tensor] | None]:
        maps = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights)
            maps.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, (maps if need_weights else None)


class Decoder(nn.Module):
    """``num_layers`` :class:`DecoderLayer` s, then a LayerNorm when ``final_norm`` (see :class:`Encoder`).

    ``forward(x (B, T, d), memory (B, S, d), memory_mask=None, self_mask=None, need_weights=False,
    *, cache=None) -> (x, [self weights per layer] or None, [cross weights per layer] or None)``.
    ``cache`` is a :class:`~tfmlib.kv_cache.DecoderCache` from :meth:`new_cache` (chapter 09): ``x``
    is then the target tokens after the ``cache.length`` already read, and every layer appends their
    keys and values to its part of the cache.
    """

    def __init__(self, num_layers: int, d_model: int, heads: int, d_ff: int, dropout: float = 0.1, *,
                 norm_first: bool = False, final_norm: bool | None = None,
                 activation: str | Callable[[Tensor], Tensor] = "relu", eps: float = 1e-5):
        super().__init__()
        _positive_int("Decoder", num_layers=num_layers)
        self.layers = nn.ModuleList(DecoderLayer(d_model, heads, d_ff, dropout, norm_first=norm_first,
                                                 activation=activation, eps=eps) for _ in range(num_layers))
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(d_model, eps=eps) if final_norm else None

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None,
                self_mask: Tensor | None = None, need_weights: bool = False, *,
                cache: DecoderCache | None = None) -> tuple[Tensor, list[Tensor] | None, list[Tensor] | None]:
        self_maps, cross_maps = [], []
        for i, layer in enumerate(self.layers):
            layer_cache, memory_kv = (None, None) if cache is None else (cache.layers[i], cache.cross[i])
            x, sw, cw = layer(x, memory, memory_mask, self_mask, need_weights, cache=layer_cache,
                              memory_kv=memory_kv)
            self_maps.append(sw)
            cross_maps.append(cw)
        if self.norm is not None:
            x = self.norm(x)
        return x, (self_maps if need_weights else None), (cross_maps if need_weights else None)

    def new_cache(self, memory: Tensor, capacity: int, *, initial: int | None = None,
                  preallocate: bool = True) -> DecoderCache:
        """An empty cache for up to ``capacity`` target tokens, with every layer's cross-attention
        keys and values of ``memory`` ``(B, S, d)`` computed once (see :class:`~tfmlib.kv_cache.KVCache`
        for ``initial`` and ``preallocate``)."""
        from tfmlib.kv_cache import DecoderCache  # chapter 09's; kv_cache imports nothing of ours: no circle

        return DecoderCache.empty(len(self.layers), capacity, initial=initial, preallocate=preallocate,
                                  cross=[layer.cross_attn.keys_values(memory) for layer in self.layers])


class AttentionMaps(NamedTuple):
    """Attention weights of every layer, for plots: lists (one per layer) of tensors.

    * ``encoder``: ``(B, h, S, S)`` encoder self-attention;
    * ``decoder``: ``(B, h, T, T)`` decoder (causal) self-attention;
    * ``cross``: ``(B, h, T, S)`` decoder-to-encoder attention.
    """

    encoder: list[Tensor]
    decoder: list[Tensor]
    cross: list[Tensor]


def _check_transformer_config(src_vocab_size: int, tgt_vocab_size: int, config: dict) -> None:
    """The checks of :class:`Transformer`'s arguments (``config`` is its ``config``): a
    ``ValueError`` naming the bad one."""
    sizes = {k: config[k] for k in ("d_model", "heads", "encoder_layers", "decoder_layers", "d_ff",
                                    "max_len")}
    _positive_int("Transformer", src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, **sizes)
    d_model, heads, positional = config["d_model"], config["heads"], config["positional"]
    if d_model % heads:
        raise ValueError(f"Transformer: d_model={d_model} is not divisible by heads={heads}")
    for name, size in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size)):
        if size < len(SPECIAL_TOKENS):
            raise ValueError(f"Transformer: {name}={size} is too small: a vocabulary starts with the "
                             f"{len(SPECIAL_TOKENS)} special tokens {', '.join(SPECIAL_TOKENS)} "
                             f"(ids 0..{len(SPECIAL_TOKENS) - 1}), which decoding reads and writes")
    if positional not in ("sinusoidal", "learned"):
        raise ValueError(f"Transformer: positional must be 'sinusoidal' or 'learned', got {positional!r}")
    if config["share_embeddings"] and src_vocab_size != tgt_vocab_size:
        raise ValueError("Transformer: share_embeddings needs one vocabulary for both sides, got sizes "
                         f"{src_vocab_size} and {tgt_vocab_size}")


def _positions(positional: str, d_model: int, dropout: float, max_len: int) -> nn.Module:
    """The positions ``positional`` names: chapter 06's sinusoidal table, or a learned one of
    ``max_len`` rows."""
    if positional == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, dropout, max_len=max_len)
    return LearnedPositionalEmbedding(max_len, d_model, dropout)


def _init_parameters(model: Transformer) -> None:
    """A :class:`Transformer`'s initial weights: Glorot-uniform matrices in the stacks (as
    ``nn.Transformer``); embeddings drawn from N(0, 1/d) (std d^-1/2), so that after the sqrt(d)
    scale a token vector has entries of variance 1; a learned position table drawn again at the scale
    of the sinusoidal one, whose entries have mean square 1/2 (``LearnedPositionalEmbedding.INIT_STD``
    = 2^-1/2); the output layer's bias 0."""
    for stack in (model.encoder, model.decoder):
        for p in stack.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
    # A list, not a set: a set of modules iterates in id order, which changes from run to run,
    # and would draw the two tables from the generator in a different order each time.
    embeddings = [model.src_embed]
    if model.tgt_embed is not model.src_embed:
        embeddings.append(model.tgt_embed)
    for emb in embeddings:
        nn.init.normal_(emb.weight, 0.0, model.d_model ** -0.5)
        with torch.no_grad():
            emb.weight[PAD_ID].zero_()
    for pos in (model.src_pos, model.tgt_pos):
        if isinstance(pos, LearnedPositionalEmbedding):
            pos.reset_parameters()
    nn.init.zeros_(model.generator.bias)


def _check_target_length(model: Transformer, length: int) -> None:
    if length > model.max_target_len:
        raise ValueError(f"Transformer: a target of {length} tokens is longer than this model's "
                         f"max_len={model.max_target_len}")


def _check_maps_input(model: Transformer, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> None:
    """The checks of :meth:`Transformer.attention_maps`'s arguments: a ``ValueError`` naming the bad one."""
    check_source(src, src_mask, "attention_maps", model.max_source_len, model.src_vocab_size)
    if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0] or tgt_in.shape[1] == 0:
        raise ValueError(f"attention_maps: tgt_in must be (batch={src.shape[0]}, target_len >= 1), "
                         f"got shape {tuple(tgt_in.shape)}")
    check_ids(tgt_in, model.tgt_vocab_size, "attention_maps", "tgt_in")


class Transformer(EncoderDecoder):
    """The Transformer encoder-decoder for translation (Vaswani et al. 2017, section 3).

    Source and target tokens are embedded, scaled by ``sqrt(d_model)`` (section 3.4) and given
    positions (``positional="sinusoidal"``, section 3.5, or ``"learned"``, a trained table of
    ``max_len`` rows); the encoder reads the source, the decoder reads the target prefix and the
    encoder's output, and a linear layer maps its output to logits. ``tie_output`` shares that
    layer's weight with the target embedding (section 3.4); ``share_embeddings`` also shares the
    source embedding (needs one vocabulary for both sides).

    Implements :class:`~tfmlib.seq2seq.EncoderDecoder`: ``encode`` runs the encoder once;
    ``decode_step`` reads one more target token; ``decode_teacher_forced`` runs the decoder on the
    whole target at once, the causal mask keeping each position from seeing later ones.
    :meth:`attention_maps` returns every layer's and head's weights. ``decode_step``'s state is
    the target prefix ``(B, t)``, which the decoder re-reads at every step, when
    ``model.kv_cache = False``; with ``model.kv_cache = True`` (the default) it is chapter 09's
    :class:`~tfmlib.kv_cache.DecoderCache` (:func:`new_decoder_cache`, :func:`cached_decode_step`),
    every decoder layer's keys and values so far, so a step computes the new token only; the
    outputs are the same. Either way a step returns a new state and leaves the one it was given
    unchanged.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, d_model: int = 512, heads: int = 8,
                 encoder_layers: int = 6, decoder_layers: int = 6, d_ff: int = 2048, dropout: float = 0.1,
                 norm_first: bool = False, activation: str = "relu", positional: str = "sinusoidal",
                 max_len: int = 256, tie_output: bool = True, share_embeddings: bool = False):
        super().__init__()
        self.config = dict(d_model=d_model, heads=heads, encoder_layers=encoder_layers,
                           decoder_layers=decoder_layers, d_ff=d_ff, dropout=dropout, norm_first=norm_first,
                           activation=activation, positional=positional, max_len=max_len,
                           tie_output=tie_output, share_embeddings=share_embeddings)
        _check_transformer_config(src_vocab_size, tgt_vocab_size, self.config)
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.max_source_len = self.max_target_len = max_len
        self.d_model, self.heads = d_model, heads
        self.src_embed = nn.Embedding(src_vocab_size, d_model, padding_idx=PAD_ID)
        self.tgt_embed = self.src_embed if share_embeddings else \
            nn.Embedding(tgt_vocab_size, d_model, padding_idx=PAD_ID)
        self.src_pos = _positions(positional, d_model, dropout, max_len)
        self.tgt_pos = _positions(positional, d_model, dropout, max_len)
        layer_args = dict(d_model=d_model, heads=heads, d_ff=d_ff, dropout=dropout, norm_first=norm_first,
                          activation=activation)
        self.encoder = Encoder(encoder_layers, **layer_args)
        self.decoder = Decoder(decoder_layers, **layer_args)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        self.kv_cache = True  # decode_step keeps chapter 09's key-value cache; False: it re-reads the prefix
        _init_parameters(self)
        if tie_output:
            self.generator.weight = self.tgt_embed.weight

    def embed_source(self, src: Tensor) -> Tensor:
        """``(B, S)`` ids -> ``(B, S, d)``: ``sqrt(d) * E[src] + positions`` (then dropout)."""
        return self.src_pos(self.src_embed(src) * math.sqrt(self.d_model))

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        """``(B, T)`` ids at positions ``offset ..`` -> ``(B, T, d)``: ``sqrt(d) * E[tgt] + positions``
        (then dropout)."""
        return self.tgt_pos(self.tgt_embed(tgt) * math.sqrt(self.d_model), offset=offset)

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        memory, _ = self.encoder(self.embed_source(src), padding_mask(src_mask))
        if self.kv_cache:  # chapter 09: decode_step's state is every decoder layer's keys and values
            return EncoderOutput(memory, src_mask, new_decoder_cache(self, memory))
        return EncoderOutput(memory, src_mask, src.new_zeros((src.shape[0], 0)))  # no target read yet

    def decode(self, tgt_in: Tensor, enc: EncoderOutput) -> Tensor:
        """The decoder's output ``(B, T, d)`` for the target prefix ``tgt_in`` ``(B, T)``."""
        x, _, _ = self.decoder(self.embed_target(tgt_in), enc.memory, padding_mask(enc.mask))
        return x

    def decode_teacher_forced(self, tgt_in: Tensor, enc: EncoderOutput) -> Tensor:
        return self.generator(self.decode(tgt_in, enc))

    def decode_step(self, prev: Tensor, state: Tensor | DecoderCache, enc: EncoderOutput) -> StepOutput:
        if not isinstance(state, Tensor):  # chapter 09's key-value cache (kv_cache = True)
            return cached_decode_step(self, prev, state, enc)
        _check_target_length(self, state.shape[1] + 1)
        prefix = torch.cat([state, prev[:, None]], dim=1)                        # (B, t + 1)
        return StepOutput(self.generator(self.decode(prefix, enc)[:, -1]), prefix)  # re-read it all

    @torch.no_grad()
    def attention_maps(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """Every layer's and head's attention weights while reading the reference ``tgt_in``
        (teacher forcing), in eval mode (no dropout; the previous mode is restored)."""
        _check_maps_input(self, src, src_mask, tgt_in)
        was_training = self.training
        self.eval()
        try:
            memory_mask = padding_mask(src_mask)
            memory, enc_maps = self.encoder(self.embed_source(src), memory_mask, need_weights=True)
            _, self_maps, cross_maps = self.decoder(self.embed_target(tgt_in), memory, memory_mask,
                                                    need_weights=True)
        finally:
            self.train(was_training)
        return AttentionMaps(enc_maps, self_maps, cross_maps)


# --------------------------------------------------------------------------- chapter 09's cache


def new_decoder_cache(model: Transformer, memory: Tensor) -> DecoderCache:
    """``model.encode``'s first decoding state when ``model.kv_cache`` (chapter 09): an empty
    :class:`~tfmlib.kv_cache.DecoderCache` for up to ``model.max_target_len`` target tokens, with
    every decoder layer's cross-attention keys and values of ``memory`` ``(B, S, d)`` computed once."""
    return model.decoder.new_cache(memory, model.max_target_len, initial=min(model.max_target_len, 32))


def cached_decode_step(model: Transformer, prev: Tensor, cache: DecoderCache,
                       enc: EncoderOutput) -> StepOutput:
    """:meth:`Transformer.decode_step` with chapter 09's key-value cache: the decoder reads the new
    token ``prev`` ``(B,)`` only, at position ``cache.length``, and every layer appends its keys and
    values to a fork of ``cache`` (the cache given stays as it was; nothing is copied), which is the
    returned state. The logits are those of re-reading the whole prefix."""
    t = cache.length                                                     # target tokens read so far
    _check_target_length(model, t + 1)
    cache = cache.fork()
    x, _, _ = model.decoder(model.embed_target(prev[:, None], offset=t), enc.memory, padding_mask(enc.mask),
                            cache=cache)
    return StepOutput(model.generator(x[:, -1]), cache)


# --------------------------------------------------------------------------- PyTorch's modules


def _copy_linear(src: nn.Linear, dst: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _copy_norm(src: nn.LayerNorm, dst: nn.LayerNorm) -> None:
    if src.normalized_shape != dst.normalized_shape or src.eps != dst.eps:
        raise ValueError(f"LayerNorms differ: {src} vs {dst}")
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _same_activation(theirs: Callable, ours: Callable) -> bool:
    """Whether two activations compute the same function: the same callable, or both relu, or both
    exact (erf) gelu, as a function or as a module."""
    if theirs is ours:
        return True

    def kind(f: Callable) -> str | None:
        if f is F.relu or isinstance(f, nn.ReLU):
            return "relu"
        if f is F.gelu or (isinstance(f, nn.GELU) and f.approximate == "none"):
            return "gelu"
        return None

    return kind(theirs) is not None and kind(theirs) == kind(ours)


def _check_layer_kind(src: nn.Module, dst: nn.Module, kind: type) -> None:
    if not isinstance(src, kind):
        raise TypeError(f"expected an {kind.__name__}, got {type(src).__name__}")
    if src.norm_first != dst.norm_first:
        raise ValueError(f"norm_first differs: PyTorch's layer has {src.norm_first}, ours {dst.norm_first}")
    if src.linear1.out_features != dst.ff.linear1.out_features:
        raise ValueError(f"d_ff differs: {src.linear1.out_features} vs {dst.ff.linear1.out_features}")
    if not _same_activation(src.activation, dst.ff.activation):
        raise ValueError(f"activation differs: PyTorch's layer has {src.activation!r}, ours "
                         f"{dst.ff.activation!r}")
    if src.dropout.p != dst.ff.dropout.p or src.dropout1.p != dst.dropout1.p:
        raise ValueError(f"dropout differs: PyTorch's layer has {src.dropout1.p}, ours {dst.dropout1.p}")


@torch.no_grad()
def copy_from_torch_encoder_layer(src: nn.TransformerEncoderLayer, dst: EncoderLayer) -> EncoderLayer:
    """Copy an ``nn.TransformerEncoderLayer``'s weights into ``dst`` (same sizes and ``norm_first``)."""
    _check_layer_kind(src, dst, nn.TransformerEncoderLayer)
    copy_from_torch_mha(src.self_attn, dst.self_attn)
    _copy_linear(src.linear1, dst.ff.linear1)
    _copy_linear(src.linear2, dst.ff.linear2)
    _copy_norm(src.norm1, dst.norm1)
    _copy_norm(src.norm2, dst.norm2)
    return dst


@torch.no_grad()
def copy_from_torch_decoder_layer(src: nn.TransformerDecoderLayer, dst: DecoderLayer) -> DecoderLayer:
    """Copy an ``nn.TransformerDecoderLayer``'s weights into ``dst`` (its ``multihead_attn`` is our
    ``cross_attn``)."""
    _check_layer_kind(src, dst, nn.TransformerDecoderLayer)
    copy_from_torch_mha(src.self_attn, dst.self_attn)
    copy_from_torch_mha(src.multihead_attn, dst.cross_attn)
    _copy_linear(src.linear1, dst.ff.linear1)
    _copy_linear(src.linear2, dst.ff.linear2)
    for name in ("norm1", "norm2", "norm3"):
        _copy_norm(getattr(src, name), getattr(dst, name))
    return dst


@torch.no_grad()
def copy_from_torch_transformer(src: nn.Transformer, encoder: Encoder, decoder: Decoder) -> None:
    """Copy ``nn.Transformer``'s weights into ``encoder`` and ``decoder``.

    ``nn.Transformer`` always ends each stack with a LayerNorm, so both stacks need
    ``final_norm=True``, and the same number of layers, sizes and ``norm_first``.
    """
    if not isinstance(src, nn.Transformer):
        raise TypeError(f"copy_from_torch_transformer: src must be nn.Transformer, got {type(src).__name__}")
    for name, theirs, ours in (("encoder", src.encoder, encoder), ("decoder", src.decoder, decoder)):
        if len(theirs.layers) != len(ours.layers):
            raise ValueError(f"copy_from_torch_transformer: the {name} has {len(theirs.layers)} layers in "
                             f"nn.Transformer and {len(ours.layers)} here")
        if (theirs.norm is None) != (ours.norm is None):
            raise ValueError(f"copy_from_torch_transformer: nn.Transformer's {name} "
                             f"{'has' if theirs.norm is not None else 'has no'} final LayerNorm; "
                             "build ours with "
                             f"final_norm={theirs.norm is not None}")
        copy_layer = copy_from_torch_encoder_layer if name == "encoder" else copy_from_torch_decoder_layer
        for t, o in zip(theirs.layers, ours.layers, strict=True):
            copy_layer(t, o)
        if theirs.norm is not None:
            _copy_norm(theirs.norm, ours.norm)

"""Throughput accounting: tokens per second, model FLOPs per token, and how far a run is from the peak.

Introduced in chapter 10 (scaling up: fused attention, mixed precision, ``torch.compile``,
several processes with ``torchrun``).

**Model FLOPs utilisation** (MFU; Chowdhery et al. 2022, PaLM, appendix B) is the FLOP/s that the
model's arithmetic *needs* (not what the kernels happen to execute: recomputation and padding do
not count) divided by the device's peak FLOP/s at the precision used::

    mfu = tokens_per_s * flops_per_token / peak

**FLOPs per training token** of a decoder-only language model (:func:`lm_flops_per_token`), 2 FLOPs
per multiply-add, counted as PaLM does (Chowdhery et al. 2022, appendix B: ``6 N + 12 L H Q T``) and
as nanoGPT's ``estimate_mfu`` does:

* every weight matrix is used once per token in the forward pass (2 FLOPs per weight), and twice
  in the backward pass (the gradient with respect to the input and with respect to the weight: 4
  FLOPs per weight): **6 N** for ``N`` matrix parameters (Kaplan et al. 2020, section 2.1).
  ``N`` here is :func:`count_parameters` ``(non_embedding=True)`` plus the output layer
  ``d_model x vocab``: the token embedding is a table lookup (no FLOPs, Kaplan leaves it out of
  ``N``), but the output layer is a real matmul, counted once even when it shares its weight with
  the embedding (as nanoGPT counts its tied ``lm_head``);
* attention adds the two products that have no weights, the scores ``Q K^T`` and the weighted sum
  ``A V``: ``2 x 2 d T`` FLOPs per token and layer forward for a context of ``T`` tokens, times 3
  with the backward pass: **12 L d T** (PaLM's ``12 L H Q T`` with ``H Q = d``).

Kaplan et al.'s Table 1 counts attention differently: ``2 n_layer n_ctx d_attn`` per token forward
(``6 L d T`` for training, half of PaLM's), and leaves the output layer out of their compute ``C``.
The causal mask means a token attends to ``(T + 1) / 2`` keys on average, so half of PaLM's score
and weighted-sum products are not needed; ``attention="causal"`` counts only those
(``6 L d (T + 1)``, Kaplan's figure up to the ``+ 1``). The default (``attention="full"``) counts the
whole square, which makes MFU figures comparable with PaLM's and nanoGPT's. Causal kernels do skip
the tiles above the diagonal: FlashAttention on a GPU, and PyTorch's CPU flash kernel as well
(``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`` stops each query block at
``num_keys = is_causal ? min(m + qBlockSize, kvSize) : kvSize``), so the full count overstates the
attention work they do by about a factor of 2; chapter 05's explicit attention and SDPA's math
backend compute (and mask) the full square. Norms, softmax, GELU, rotary positions and the
optimiser are left out (small next to the matmuls: a few FLOPs per activation, not per weight).

**Peaks.** :func:`peak_flops` gives a GPU's dense datasheet peak at the precision the matrix
products run in: bf16 and fp16 on the tensor cores; for fp32, TF32's tensor-core rate when
float32 products may use TF32 (:func:`tfmlib.precision.fp32_matmul_is_tf32`: after
``torch.set_float32_matmul_precision("high")``), else the plain float32 rate. An MFU is always
against the peak of its own precision, so a bf16 row's MFU divides by a peak several times fp32's:
bf16 can raise tokens per second and lower MFU at once. :func:`peak_name` says which peak was used.

:func:`measure_training_steps` times whole training steps with :mod:`tfmlib.timing` (warmed up,
median of rounds, the device synchronised once per window of steps, as a training loop runs) and
returns seconds per step and tokens per second.

``PEAK_FLOPS``, :func:`peak_flops` and :func:`training_flops` (the encoder-decoder count of
chapter 08's Multi30k benchmark) moved here from ``benchmarks/multi30k_transformer.py``.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tfmlib.positional import LearnedPositionalEmbedding
from tfmlib.precision import fp32_matmul_is_tf32
from tfmlib.timing import interleaved_medians

INTRODUCED_IN = 10

__all__ = [
    "PEAK_FLOPS",
    "count_parameters",
    "lm_flops_per_token",
    "measure_training_steps",
    "mfu",
    "peak_flops",
    "peak_name",
    "training_flops",
]

# Dense peak FLOP/s (no structured sparsity: half the datasheets' starred figures) from the vendors'
# datasheets, matched against torch.cuda.get_device_name() as whole words ("L4" does not match "NVIDIA
# L40"), the first match in this order winning: "bf16" and "fp16" are the tensor-core rates with fp32
# accumulation, "tf32" the tensor-core rate of float32 products in TF32 (None where the GPU has no TF32:
# before Ampere), "fp32" the plain float32 rate that PyTorch's default ("highest") gets.
PEAK_FLOPS: list[tuple[str, dict[str, float | None]]] = [
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}),         # SXM
    ("H200", {"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("L40", {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    ("RTX 4090", {"bf16": 165e12, "fp16": 165e12, "tf32": 82.6e12, "fp32": 82.6e12}),
    ("RTX 3090", {"bf16": 71e12, "fp16": 71e12, "tf32": 35.6e12, "fp32": 35.6e12}),
    ("V100", {"bf16": None, "fp16": 125e12, "tf32": None, "fp32": 15.7e12}),
    ("T4", {"bf16": None, "fp16": 65e12, "tf32": None, "fp32": 8.1e12}),
]

_PRECISIONS = ("bf16", "fp16", "tf32", "fp32")


def _entry(name: str) -> dict[str, float | None] | None:
    for key, peaks in PEAK_FLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return peaks
    return None


def peak_name(device: torch.device, precision: str, *, tf32: bool | None = None) -> str:
    """Which peak :func:`peak_flops` uses for ``precision`` on ``device``: the precision itself,
    except ``"tf32"`` for ``"fp32"`` on CUDA while float32 products may use TF32 (``tf32=None``
    reads the setting: :func:`tfmlib.precision.fp32_matmul_is_tf32`)."""
    if precision not in _PRECISIONS:
        raise ValueError(f"peak_name: precision must be one of {_PRECISIONS}, got {precision!r}")
    if precision == "fp32" and device.type == "cuda":
        return "tf32" if (fp32_matmul_is_tf32() if tf32 is None else tf32) else "fp32"
    return precision


def peak_flops(device: torch.device, precision: str, name: str | None = None, *,
               tf32: bool | None = None) -> float | None:
    """The device's dense peak FLOP/s at ``precision`` (``bf16``, ``fp16``, ``tf32``, ``fp32``), or
    ``None`` when it is not in :data:`PEAK_FLOPS` (every CPU, Apple's MPS, unlisted GPUs) or has no
    such unit (TF32 before Ampere).

    ``"fp32"`` follows the float32 matmul setting: the TF32 rate while TF32 is on
    (:func:`peak_name`; ``tf32=True/False`` overrides the setting), else the plain float32 rate; a
    GPU without TF32 keeps the plain rate. ``name`` overrides ``torch.cuda.get_device_name`` (for
    tests). Matching is by whole words, the first entry of :data:`PEAK_FLOPS` that matches."""
    if precision not in _PRECISIONS:
        raise ValueError(f"peak_flops: precision must be bf16, fp16, tf32 or fp32, got {precision!r}")
    if device.type != "cuda":
        return None
    name = name if name is not None else torch.cuda.get_device_name(device)
    peaks = _entry(name)
    if peaks is None:
        return None
    used = peak_name(device, precision, tf32=tf32)
    if used == "tf32" and precision == "fp32" and peaks["tf32"] is None:
        used = "fp32"
    return peaks[used]


def training_flops(cfg: dict, vocab: int, src_tokens: int, tgt_tokens: int, src_len: int,
                   tgt_len: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward) of the encoder-decoder
    Transformer of ``cfg`` (``d_model``, ``d_ff``, ``layers``) on a batch with
    ``src_tokens``/``tgt_tokens`` real tokens, padded to ``src_len``/``tgt_len``.

    Counted per real token, 2 FLOPs per multiply-add: an encoder layer's projections (4 d^2) and
    feed-forward (2 d d_ff), self-attention over ``src_len`` keys (scores and weighted sum,
    2 d src_len); a decoder layer's 8 d^2 + 2 d d_ff, causal self-attention over half of
    ``tgt_len`` on average and cross-attention over ``src_len``; the output layer d V. Embeddings,
    norms and softmaxes are left out (the usual MFU convention: the work the model needs, not the
    padding or the recomputation a kernel may do)."""
    d, ff, L = cfg["d_model"], cfg["d_ff"], cfg["layers"]
    encoder = L * (4 * d * d + 2 * d * ff + 2 * d * src_len)
    decoder = L * (8 * d * d + 2 * d * ff + d * tgt_len + 2 * d * src_len) + d * vocab
    return 3 * 2 * (encoder * src_tokens + decoder * tgt_tokens)


def _embedding_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters that are tables looked up by index: every ``nn.Embedding`` weight and
    every learned position table (:class:`tfmlib.positional.LearnedPositionalEmbedding`)."""
    ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
            ids.update(id(p) for p in module.parameters())
    return ids


def count_parameters(model: nn.Module, non_embedding: bool = True) -> int:
    """Trainable parameters of ``model``, each shared tensor counted once.

    With ``non_embedding=True`` (Kaplan et al. 2020's ``N``) the lookup tables are left out: every
    ``nn.Embedding`` weight and learned position table. A tied output layer *is* the embedding
    tensor, so it is left out with it (:func:`lm_flops_per_token` adds the output layer's matmul
    back). ``TypeError`` for anything but an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"count_parameters: model must be an nn.Module, got {type(model).__name__}")
    skip = _embedding_parameters(model) if non_embedding else set()
    seen: set[int] = set()
    total = 0
    for p in model.parameters():          # parameters() already yields a shared tensor once
        if p.requires_grad and id(p) not in seen and id(p) not in skip:
            seen.add(id(p))
            total += p.numel()
    return total


def lm_flops_per_token(model: nn.Module, context: int, *, attention: str = "full") -> float:
    """Training FLOPs (forward and backward) per token of a decoder-only LM reading ``context`` tokens.

    ``6 * (N + d V) + 12 L d T`` for ``attention="full"`` (the convention of PaLM's appendix B
    and nanoGPT; the module docstring says why) or ``6 * (N + d V) + 6 L d (T + 1)`` for
    ``"causal"`` (only the score and weighted-sum products the causal mask keeps), where ``N`` is
    :func:`count_parameters` ``(model, non_embedding=True)``, ``d`` = ``d_model``, ``V`` the
    vocabulary, ``L`` the layers, ``T`` = ``context`` (the length of the training sequences, not
    the model's maximum).

    ``model``: a :class:`tfmlib.lm.DecoderLM`, or any module with ``vocab_size``, ``d_model`` and
    ``blocks``; to count a model too large to build, build it on the meta device (shapes, no
    memory): ``with torch.device("meta"): model = DecoderLM(...)``. ``ValueError`` for a
    non-positive ``context`` or an unknown ``attention``; ``TypeError`` for anything else.
    """
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise ValueError(f"lm_flops_per_token: context must be an int >= 1, got {context!r}")
    if attention not in ("full", "causal"):
        raise ValueError(f"lm_flops_per_token: attention must be 'full' or 'causal', got {attention!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"lm_flops_per_token: model must be an nn.Module (a DecoderLM, on the meta device "
                        f"to count one without memory), got {type(model).__name__}")
    try:
        d, vocab, layers = model.d_model, model.vocab_size, len(model.blocks)
    except AttributeError as e:
        raise TypeError(f"lm_flops_per_token: {type(model).__name__} has no d_model, vocab_size and blocks "
                        f"(a tfmlib.lm.DecoderLM has them): {e}") from None
    matrices = count_parameters(model, non_embedding=True) + d * vocab
    attn = 12 * layers * d * context if attention == "full" else 6 * layers * d * (context + 1)
    return float(6 * matrices + attn)


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``tokens_per_s * flops_per_token / peak`` (a fraction, 0.4 = 40%),
    or ``None`` when ``peak`` is ``None`` (no known peak, e.g. the CPU). ``ValueError`` for a
    negative rate or count, or a non-positive peak."""
    if not tokens_per_s >= 0:
        raise ValueError(f"mfu: tokens_per_s must be >= 0, got {tokens_per_s!r}")
    if not flops_per_token >= 0:
        raise ValueError(f"mfu: flops_per_token must be >= 0, got {flops_per_token!r}")
    if peak is None:
        return None
    if not peak > 0:
        raise ValueError(f"mfu: peak must be positive FLOP/s or None, got {peak!r}")
    return tokens_per_s * flops_per_token / peak


def measure_training_steps(step_fn: Callable[[], object], *, steps: int, warmup: int = 2,
                           device: torch.device | str, tokens_per_step: int,
                           flops_per_token: float | None = None,
                           peak: float | None = None, window: int = 1,
                           clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Time whole training steps (``step_fn()``: forward, backward, optimiser step) after ``warmup``
    untimed ones, through :func:`tfmlib.timing.interleaved_medians`: ``steps`` samples, each a
    *window* of ``window`` consecutive steps (``steps * window`` timed steps in all).

    The device is synchronised before and after each window, not between its steps, so within a
    window the host queues the next step while the device runs this one, as in a training loop
    that does not read anything back. ``window=1`` waits for the device around every step: on a
    GPU each step then starts from an empty queue and pays its launch latency in full, which a
    real loop hides (use ``window >= 5`` there); on the CPU, which runs synchronously, the two
    agree.

    Returns a dict: ``step_s`` (median seconds per step: a window's time divided by ``window``),
    ``step_s_q1``/``step_s_q3`` (quartiles), ``step_s_min``/``step_s_max``, ``steps``, ``window``,
    ``warmup``, ``tokens_per_step``, ``tokens_per_s`` (``tokens_per_step / step_s``), ``device``,
    and, when ``flops_per_token`` is given, ``model_flops_per_s`` and ``mfu`` (``None`` without a
    ``peak``). ``ValueError`` for ``tokens_per_step < 1`` (and, from the timing helper, for
    ``steps < 1``, ``window < 1`` or ``warmup < 0``). ``clock`` (seconds, like
    ``time.perf_counter``) is for tests.
    """
    if not isinstance(tokens_per_step, int) or isinstance(tokens_per_step, bool) or tokens_per_step < 1:
        raise ValueError("measure_training_steps: tokens_per_step must be an int >= 1, "
                         f"got {tokens_per_step!r}")
    if not callable(step_fn):
        raise TypeError(f"measure_training_steps: step_fn must be callable, got {type(step_fn).__name__}")
    timings = interleaved_medians({"step": step_fn}, repeats=steps, warmup=warmup, device=device,
                                  number=window, clock=clock)
    t = timings.detail["step"]
    q1, q3 = t.quartiles
    out: dict[str, Any] = {
        "step_s": t.median, "step_s_q1": q1, "step_s_q3": q3, "step_s_min": t.min, "step_s_max": t.max,
        "step_s_stdev": statistics.stdev(t.samples) if len(t.samples) > 1 else 0.0,
        "steps": steps, "window": window, "warmup": warmup, "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / t.median, "device": str(timings.device),
    }
    if flops_per_token is not None:
        out["flops_per_token"] = flops_per_token
        out["model_flops_per_s"] = out["tokens_per_s"] * flops_per_token
        out["mfu"] = mfu(out["tokens_per_s"], flops_per_token, peak)
    return out

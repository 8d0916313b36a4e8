"""A small, readable training loop and safe checkpoints.

Introduced in chapter 01; every chapter that trains a model uses :func:`fit`.

The loop is deliberately plain: for each batch, compute the loss with a function you pass in,
back-propagate, clip the gradient norm, step. It records the loss of every step and a summary of
every epoch (with whatever your evaluation function measures), and shows progress with
``tqdm.auto``; the losses stay on the device and are read back a few at a time, so a GPU is not
made to wait for the host every step. Checkpoints hold the model, the optimizer, the
vocabularies and the run's config together; they are written to a temporary file and moved into
place (a reader never sees half of one) and read back with ``torch.load(..., weights_only=True)``:
loading one never runs code from the file.
"""

from __future__ import annotations

import math
import operator
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from tfmlib.data import Vocab
from tfmlib.timing import synchronize

INTRODUCED_IN = 1

LossFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, int]"]


@dataclass
class History:
    """What :func:`fit` records.

    * ``step_loss``: the mean loss of every optimisation step, in order.
    * ``epochs``: one dict per epoch: ``epoch``, ``train_loss`` (token-weighted mean),
      ``seconds`` (training time, evaluations excluded), ``tokens_per_second``, plus the keys
      returned by ``eval_fn`` when it runs once per epoch.
    * ``evals``: one dict per call of ``eval_fn``: ``step`` (optimiser steps taken so far),
      ``seconds`` (training seconds so far, evaluations excluded), plus its keys. With
      ``eval_every`` this is a learning curve against steps and against training time.
    """

    step_loss: list[float] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)

    def metric(self, key: str) -> list[float]:
        """The per-epoch values of ``key`` (e.g. ``"valid_loss"``)."""
        missing = [e["epoch"] for e in self.epochs if key not in e]
        if missing:
            known = sorted(self.epochs[0]) if self.epochs else []
            raise KeyError(f"History.metric: {key!r} not recorded (epoch keys: {known})")
        return [e[key] for e in self.epochs]

    @property
    def seconds(self) -> float:
        return sum(e["seconds"] for e in self.epochs)


def move_to(batch: Any, device: torch.device | str) -> Any:
    """Move a batch (a tensor, a tuple/list/dict of tensors, or an object with ``.to``) to ``device``."""
    if isinstance(batch, torch.Tensor) or hasattr(batch, "to"):
        return batch.to(device)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple takes positional fields
        return type(batch)(*(move_to(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(b, device) for b in batch)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch


def _token_count(n_tokens: Any, step: int) -> int:
    """``n_tokens`` (an int, a NumPy integer or a 0-d integer tensor) as an int >= 0."""
    try:
        count = -1 if isinstance(n_tokens, bool) else operator.index(n_tokens)
    except TypeError:
        count = -1
    if count < 0:
        raise TypeError(f"fit: loss_fn must return (loss, n_tokens) with n_tokens an int >= 0, "
                        f"got {n_tokens!r} at step {step}")
    return count


def _check_token_count(n_tokens: Any, step: int) -> int | torch.Tensor:
    """``n_tokens`` as an int >= 0, or a 0-d integer tensor kept as it is (on its device: reading
    it would wait for the device; it is read, and checked >= 0, with the losses)."""
    if isinstance(n_tokens, torch.Tensor) and n_tokens.dim() == 0 and not (
            n_tokens.is_floating_point() or n_tokens.is_complex() or n_tokens.dtype == torch.bool):
        return n_tokens.detach()
    return _token_count(n_tokens, step)


def fit(
    model: nn.Module,
    loader: Any,
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    device: torch.device | str = "cpu",
    clip_norm: float | None = 1.0,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    scheduler: Any = None,
    max_steps: int | None = None,
    time_budget_s: float | None = None,
    eval_every: int | None = None,
    log_every: int = 50,
    desc: str = "train",
    verbose: bool = True,
) -> History:
    """Train ``model`` for ``epochs`` passes over ``loader``.

    ``loss_fn(model, batch)`` returns ``(loss, n_tokens)``: the mean loss of the batch (a scalar
    tensor to back-propagate) and how many tokens it averaged over (to weight the epoch mean; an
    int, or a 0-d integer tensor). ``eval_fn(model)`` (called in ``eval`` mode under ``no_grad``)
    returns a dict of metrics to record: after each epoch, or, with ``eval_every=N``, after every
    ``N`` optimiser steps and after the last one (a learning curve in ``History.evals``).
    Evaluation time is not training time: it is left out of every recorded ``seconds`` and does
    not count against ``time_budget_s``. ``scheduler.step()`` is called after every optimiser
    step. ``clip_norm`` clips the global gradient norm (``None`` disables it). Training stops
    early after ``max_steps`` steps or ``time_budget_s`` seconds of training, finishing the
    epoch's bookkeeping.

    The step losses stay on the device and are read back together every ``log_every`` steps and
    at the end of each epoch (reading a value from a GPU makes the host wait for it; once a step
    would halve the speed of a small model). ``History`` is the same as reading every step: only
    the progress bar updates less often, and a non-finite loss is reported (with its step) when it
    is read, up to ``log_every - 1`` steps after it happened (the weights have taken those steps:
    reload a checkpoint rather than go on from them). The device is synchronised around evaluations and
    at the end of each epoch, so recorded times hold the work they name.

    Raises ``ValueError`` for a non-positive ``epochs``, ``eval_every`` or ``log_every``, an
    empty loader or a non-finite loss, and ``TypeError`` when ``loss_fn`` does not return a
    scalar tensor and a non-negative int.
    """
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"fit: epochs must be an int >= 1, got {epochs!r}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"fit: clip_norm must be positive or None, got {clip_norm!r}")
    if eval_every is not None and (not isinstance(eval_every, int) or isinstance(eval_every, bool)
                                   or eval_every < 1):
        raise ValueError(f"fit: eval_every must be an int >= 1 or None, got {eval_every!r}")
    if eval_every is not None and eval_fn is None:
        raise ValueError("fit: eval_every needs an eval_fn to call")
    if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
        raise ValueError(f"fit: log_every must be an int >= 1, got {log_every!r}")
    device = torch.device(device)
    model.to(device)
    history = History()
    start, steps, stop = time.perf_counter(), 0, False
    eval_seconds = 0.0  # time spent in eval_fn, kept out of the training time
    # losses (detached, on the device) and token counts of the steps not yet read back
    pending_loss: list[torch.Tensor] = []
    pending_tokens: list[int | torch.Tensor] = []
    total_loss, total_tokens = 0.0, 0

    def read_pending(bar: Any) -> None:
        """Read the pending losses (and tensor token counts) in one transfer; check and record them."""
        nonlocal total_loss, total_tokens
        if not pending_loss:
            return
        first_step = steps - len(pending_loss) + 1
        values = torch.stack(pending_loss).tolist()
        tensor_counts = [n for n in pending_tokens if isinstance(n, torch.Tensor)]
        read_counts = iter(torch.stack(tensor_counts).tolist() if tensor_counts else [])
        counts = [next(read_counts) if isinstance(n, torch.Tensor) else n for n in pending_tokens]
        pending_loss.clear()
        pending_tokens.clear()
        for k, (value, n_tokens) in enumerate(zip(values, counts, strict=True)):
            if not math.isfinite(value):
                raise ValueError(f"fit: loss became {value} at step {first_step + k}")
            n_tokens = _token_count(n_tokens, first_step + k)
            history.step_loss.append(value)
            total_loss += value * n_tokens
            total_tokens += n_tokens
        bar.set_postfix(loss=f"{values[-1]:.3f}")

    def evaluate() -> dict[str, float]:
        nonlocal eval_seconds
        synchronize(device)  # queued training work is training time, not evaluation time
        t_eval = time.perf_counter()
        model.eval()
        with torch.no_grad():
            metrics = dict(eval_fn(model))
        model.train()
        synchronize(device)
        history.evals.append({"step": steps, "seconds": t_eval - start - eval_seconds, **metrics})
        eval_seconds += time.perf_counter() - t_eval
        return metrics

    for epoch in range(1, epochs + 1):
        model.train()
        t0, total_loss, total_tokens = time.perf_counter(), 0.0, 0
        eval_seconds_at_t0 = eval_seconds
        bar = tqdm(loader, desc=f"{desc} {epoch}/{epochs}", leave=False, disable=not verbose)
        for batch in bar:
            batch = move_to(batch, device)
            loss, n_tokens = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise TypeError(f"fit: loss_fn must return (scalar loss tensor, n_tokens); the loss "
                                f"is {got} at step {steps + 1} (reduce it with .mean())")
            pending_tokens.append(_check_token_count(n_tokens, steps + 1))
            pending_loss.append(loss.detach())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            steps += 1
            if len(pending_loss) >= log_every:
                read_pending(bar)
            if (max_steps is not None and steps >= max_steps) or (
                time_budget_s is not None
                and time.perf_counter() - start - eval_seconds >= time_budget_s
            ):
                stop = True
            if eval_every is not None and steps % eval_every == 0:
                evaluate()
            if stop:
                break
        read_pending(bar)
        synchronize(device)
        if total_tokens == 0:
            raise ValueError("fit: the loader yielded no batches (or no tokens)")
        seconds = max(time.perf_counter() - t0 - (eval_seconds - eval_seconds_at_t0), 1e-9)
        record = {"epoch": epoch, "train_loss": total_loss / total_tokens, "seconds": seconds,
                  "tokens_per_second": total_tokens / seconds}
        if eval_fn is not None and eval_every is None:
            record.update(evaluate())
        history.epochs.append(record)
        if verbose:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch")
            print(f"epoch {epoch}: {shown}")
        if stop:
            break
    if eval_every is not None and (not history.evals or history.evals[-1]["step"] != steps):
        evaluate()  # the last step, unless it was a multiple of eval_every
    return history


def warmup_inverse_sqrt(warmup_steps: int) -> Callable[[int], float]:
    """The learning-rate shape of Vaswani et al. (2017, section 5.3, eq. 3), scaled to peak at 1.

    Returns ``f(step) = min(s / warmup, sqrt(warmup / s))`` with ``s = step + 1``: a linear rise
    over the first ``warmup_steps`` optimiser steps, then a decay as ``1 / sqrt(s)``. Multiply it by
    a peak learning rate (``torch.optim.lr_scheduler.LambdaLR(optimizer, f)`` with ``lr=peak``);
    the paper's ``d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`` is this shape with the peak
    :func:`transformer_peak_lr`. Added in chapter 08.
    """
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 1:
        raise ValueError(f"warmup_inverse_sqrt: warmup_steps must be a positive int, got {warmup_steps!r}")

    def factor(step: int) -> float:
        s = step + 1
        return min(s / warmup_steps, math.sqrt(warmup_steps / s))

    return factor


def transformer_peak_lr(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """The peak of the paper's schedule, ``scale * d_model^-0.5 * warmup^-0.5`` (reached at the end
    of warm-up): about 7e-4 for the base model (``d_model=512``, 4000 warm-up steps)."""
    if d_model < 1 or warmup_steps < 1:
        raise ValueError(f"transformer_peak_lr: d_model and warmup_steps must be >= 1, got {d_model}, "
                         f"{warmup_steps}")
    return scale * d_model ** -0.5 * warmup_steps ** -0.5


def perplexity(mean_nll: float) -> float:
    """``exp`` of a mean negative log-likelihood per token (nats); ``inf`` when that overflows."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf


# --------------------------------------------------------------------------- checkpoints

CHECKPOINT_FORMAT = "tfmlib-checkpoint-1"


def checkpoint_dir() -> Path:
    """Where notebooks keep the models they train for later chapters: ``$TFM_CHECKPOINT_DIR``, or
    ``checkpoints/`` at the top of the project (git ignores it). Created if missing."""
    path = Path(os.environ.get("TFM_CHECKPOINT_DIR") or Path(__file__).resolve().parents[1] / "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, from another format, or does not fit the model."""


def _check_plain(value: Any, where: str) -> None:
    """Configs must be plain data (what ``weights_only`` loading accepts and JSON could hold)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"save_checkpoint: {where} has a non-str key {k!r}")
            _check_plain(v, f"{where}[{k!r}]")
        return
    raise TypeError(
        f"save_checkpoint: {where} is a {type(value).__name__}; configs hold only "
        "None/bool/int/float/str and lists/dicts of them"
    )


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    vocabs: Mapping[str, Vocab] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Save model and optimizer state, vocabularies (by name, e.g. ``{"src": v1, "tgt": v2}``)
    and a plain-data ``config`` (what is needed to rebuild the model) in one file.

    The file is written to a temporary file in the same folder and moved into place with
    ``os.replace``: a reader never sees half a checkpoint, and a write that fails leaves an older
    checkpoint at ``path`` intact. Tensors are saved from the device they are on;
    :func:`load_checkpoint` maps them to ``map_location`` (the CPU by default)."""
    config = dict(config or {})
    _check_plain(config, "config")
    for name, v in (vocabs or {}).items():
        if not isinstance(v, Vocab):
            raise TypeError(f"save_checkpoint: vocabs[{name!r}] must be a Vocab, got {type(v).__name__}")
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model_class": type(model).__name__,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "vocabs": {name: v.to_dict() for name, v in (vocabs or {}).items()},
        "config": config,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target, then rename over it: os.replace is atomic within one file system, so
    # a reader (another chapter running at the same time) sees the old file or the new one, never
    # half of one; a failed write leaves the old file as it was.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); keep the mode an existing checkpoint had
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    model_class: str
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict | None
    vocabs: dict[str, Vocab]
    config: dict[str, Any]


def load_checkpoint(
    path: str | Path,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device = "cpu",
) -> Checkpoint:
    """Read a checkpoint safely (``weights_only=True``); load it into ``model``/``optimizer`` if given.

    Raises :class:`CheckpointError` when the file is missing, unreadable or not a tfmlib
    checkpoint, when it was saved from another model class, or when parameter names or shapes
    differ from ``model``'s (the message lists them).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated file, not a zip, unpickling refused...
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a {CHECKPOINT_FORMAT} file")
    try:
        ckpt = Checkpoint(
            model_class=payload["model_class"],
            model_state=payload["model"],
            optimizer_state=payload["optimizer"],
            vocabs={name: Vocab.from_dict(d) for name, d in payload["vocabs"].items()},
            config=payload["config"],
        )
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} is a damaged {CHECKPOINT_FORMAT} file "
                              f"({type(e).__name__}: {e})") from e
    if model is not None:
        if type(model).__name__ != ckpt.model_class:
            raise CheckpointError(
                f"{path} holds a {ckpt.model_class}, not a {type(model).__name__}"
            )
        own = model.state_dict()
        missing = sorted(set(own) - set(ckpt.model_state))
        unexpected = sorted(set(ckpt.model_state) - set(own))
        wrong_shape = [
            f"{k}: checkpoint {tuple(ckpt.model_state[k].shape)} vs model {tuple(own[k].shape)}"
            for k in own
            if k in ckpt.model_state and own[k].shape != ckpt.model_state[k].shape
        ]
        if missing or unexpected or wrong_shape:
            raise CheckpointError(
                f"{path} does not fit this model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}, shape mismatches {wrong_shape[:5]}"
            )
        model.load_state_dict(ckpt.model_state)
    if optimizer is not None:
        if ckpt.optimizer_state is None:
            raise CheckpointError(f"{path} holds no optimizer state")
        try:
            optimizer.load_state_dict(ckpt.optimizer_state)
        except (KeyError, ValueError) as e:  # other parameter groups or another optimizer class
            raise CheckpointError(f"{path}: the optimizer state does not fit this optimizer ({e})") from e
    return ckpt

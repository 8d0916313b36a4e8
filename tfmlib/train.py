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

import contextlib
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

    * ``step_loss``: the mean loss of every optimisation step, in order (with ``accumulate``, the
      token-weighted mean over the step's batches).
    * ``epochs``: one dict per epoch: ``epoch``, ``train_loss`` (token-weighted mean),
      ``seconds`` (training time, evaluations excluded), ``tokens_per_second``, plus the keys
      returned by ``eval_fn`` when it runs once per epoch.
    * ``evals``: one dict per call of ``eval_fn``: ``step`` (optimiser steps taken so far),
      ``seconds`` (training seconds so far, evaluations excluded), plus its keys. With
      ``eval_every`` this is a learning curve against steps and against training time.
    * ``skipped_steps``: optimiser steps that fp16's gradient scaler skipped because the scaled
      gradients held an inf or a NaN (always 0 in fp32 and bf16; chapter 10).
    * ``resumed_from_step``: the optimiser step a resumed :func:`fit` started from (0 for a
      fresh run; chapter 10).
    """

    step_loss: list[float] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    skipped_steps: int = 0
    resumed_from_step: int = 0

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

    def to_dict(self) -> dict[str, Any]:
        """The history as plain data (lists, dicts, floats), e.g. to save in a training state."""
        return {"step_loss": list(self.step_loss), "epochs": [dict(e) for e in self.epochs],
                "evals": [dict(e) for e in self.evals], "skipped_steps": self.skipped_steps,
                "resumed_from_step": self.resumed_from_step}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> History:
        """The inverse of :meth:`to_dict`."""
        return cls(step_loss=list(d["step_loss"]), epochs=[dict(e) for e in d["epochs"]],
                   evals=[dict(e) for e in d["evals"]], skipped_steps=int(d.get("skipped_steps", 0)),
                   resumed_from_step=int(d.get("resumed_from_step", 0)))


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


def _positive_int_or_none(value: Any, name: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"fit: {name} must be an int >= 1 or None, got {value!r}")


def _at_least_one(n_tokens: int | torch.Tensor) -> int | torch.Tensor:
    """A token count to divide by: ``max(n, 1)``, on the device for a tensor (no host read)."""
    return n_tokens.clamp(min=1) if isinstance(n_tokens, torch.Tensor) else max(n_tokens, 1)


def _epoch_sampler(loader: Any) -> Any:
    """The sampler of ``loader`` whose order depends only on (seed, epoch): ``loader.batch_sampler``
    or ``loader.sampler`` when it has ``set_epoch`` (else ``None``)."""
    for attr in ("batch_sampler", "sampler"):
        sampler = getattr(loader, attr, None)
        if callable(getattr(sampler, "set_epoch", None)):
            return sampler
    return None


def _ddp_world_size(model: nn.Module) -> int | None:
    """The world size when ``model`` is a ``DistributedDataParallel`` (possibly inside
    ``torch.compile``'s wrapper) and a process group is running, else ``None``."""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, nn.parallel.DistributedDataParallel) and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return None


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
    precision: str = "fp32",
    accumulate: int = 1,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
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

    Chapter 10 adds three options; at their defaults ``fit`` computes exactly what it did before.

    * ``precision`` (``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"auto"``, see
      :func:`tfmlib.precision.pick_precision`): ``loss_fn`` runs under
      :func:`tfmlib.precision.autocast`; the weights, gradients and optimizer state stay float32.
      fp16 uses a ``torch.amp.GradScaler``: the loss is scaled before ``backward``, the gradients
      unscaled before clipping; a step whose gradients overflowed is skipped by the scaler (not an
      error; counted in ``History.skipped_steps``). A non-finite *loss* is still an error.
    * ``accumulate=k``: one optimiser step per ``k`` batches of ``loader``, equal to one step on
      the batch made of those ``k`` batches: each batch back-propagates ``loss * n_tokens`` and the
      summed gradients are divided by the group's token count before clipping (no host read, also
      with tensor counts). The last, shorter group of an epoch still steps. ``step_loss``,
      ``max_steps``, ``eval_every``, ``checkpoint_every`` and the scheduler count optimiser steps.
      Under ``DistributedDataParallel`` the first ``k - 1`` batches of a group run inside the
      model's ``no_sync()`` (their gradients are summed locally, and the gradients are all-reduced
      once per step, not ``k`` times), and the divisor is the group's token count summed over the
      ranks (divided by the world size, since DDP averages): each rank divides by the same number,
      and the step equals one step on the global group even when the ranks' token counts differ.
      (A group cut short by the end of an epoch has its gradients all-reduced explicitly.) Without
      accumulation DDP averages the ranks' mean losses, weighting each rank equally.
    * ``checkpoint_path``: write a training state there (:mod:`tfmlib.resume`: model, optimizer,
      scheduler, scaler, random number generators, data position, History, training time and the
      settings that must match) every ``checkpoint_every`` optimiser steps and when training ends,
      atomically. With ``resume=True`` and an existing file, ``fit`` restores it and carries on
      from the next batch, ending with the weights an uninterrupted run would have; without the
      file it starts afresh. The loader's batch order must depend only on a seed and the epoch:
      ``loader.batch_sampler`` or ``loader.sampler`` needs ``set_epoch`` (``BucketBatchSampler``,
      ``TokenBatchSampler``, torch's ``DistributedSampler``), which ``fit`` then calls at the start
      of every epoch. It also calls it for a ``DistributedSampler`` without checkpoints, as
      torch's documentation asks (else every epoch has the same order).

    Raises ``ValueError`` for a non-positive ``epochs``, ``eval_every``, ``log_every``,
    ``accumulate`` or ``checkpoint_every``, an empty loader, a non-finite loss, an unknown or
    unsupported ``precision``, ``checkpoint_every``/``resume`` without ``checkpoint_path``, or a
    loader without ``set_epoch`` when checkpointing; ``TypeError`` when ``loss_fn`` does not
    return a scalar tensor and a non-negative int; :class:`CheckpointError` when the training
    state to resume from is damaged or does not fit (the model, the optimizer, the settings).
    """
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"fit: epochs must be an int >= 1, got {epochs!r}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"fit: clip_norm must be positive or None, got {clip_norm!r}")
    _positive_int_or_none(eval_every, "eval_every")
    if eval_every is not None and eval_fn is None:
        raise ValueError("fit: eval_every needs an eval_fn to call")
    if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
        raise ValueError(f"fit: log_every must be an int >= 1, got {log_every!r}")
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise ValueError(f"fit: accumulate must be an int >= 1, got {accumulate!r}")
    _positive_int_or_none(checkpoint_every, "checkpoint_every")
    if checkpoint_path is None and (checkpoint_every is not None or resume):
        raise ValueError("fit: checkpoint_every and resume need a checkpoint_path")
    device = torch.device(device)
    scaler = None
    if precision == "fp32":
        amp: Callable[[], Any] = contextlib.nullcontext
    else:
        from tfmlib.precision import autocast, make_grad_scaler, pick_precision

        precision = pick_precision(device, precision)
        amp = lambda: autocast(device, precision)  # noqa: E731
        scaler = make_grad_scaler(device, precision) if precision == "fp16" else None
    sampler = None
    if checkpoint_path is not None or isinstance(getattr(loader, "sampler", None),
                                                 torch.utils.data.DistributedSampler):
        sampler = _epoch_sampler(loader)
        if sampler is None or not isinstance(getattr(sampler, "epoch", None), int):
            raise ValueError(
                "fit: checkpoint_path needs a loader whose batch order depends only on a seed and the epoch, "
                "so that a resumed run can replay it: loader.batch_sampler or loader.sampler must have "
                "set_epoch and an int attribute epoch (tfmlib.data.BucketBatchSampler, TokenBatchSampler, "
                "torch's DistributedSampler); "
                f"got a {type(loader).__name__}"
                + (f" with batch_sampler {type(loader.batch_sampler).__name__}"
                   if getattr(loader, "batch_sampler", None) is not None else ""))
    # A DistributedSampler keeps its epoch until told (fit tells it at every epoch); tfmlib's samplers
    # advance their own (the DataLoader iterates them twice per epoch: once when it starts and once
    # when it resets), so fit only reads their value, and sets it back when resuming.
    managed = isinstance(sampler, torch.utils.data.DistributedSampler)
    sampler_epoch0 = sampler.epoch if sampler is not None else 0
    sampler_epoch_now = sampler_epoch0  # the sampler's epoch value when the current epoch started
    settings = {"epochs": epochs, "accumulate": accumulate, "precision": precision, "clip_norm": clip_norm,
                "scheduler": type(scheduler).__name__ if scheduler is not None else None}
    model.to(device)
    ddp_world = _ddp_world_size(model) if accumulate > 1 else None
    history = History()
    start, steps, stop = time.perf_counter(), 0, False
    eval_seconds = 0.0  # time spent in eval_fn, kept out of the training time
    # losses (detached, on the device) and token counts of the steps not yet read back
    pending_loss: list[torch.Tensor] = []
    pending_tokens: list[int | torch.Tensor] = []
    pending_skipped: list[torch.Tensor] = []  # fp16: whether the scaler skipped each step
    total_loss, total_tokens = 0.0, 0
    first_epoch, skip_batches, restored = 1, 0, None
    if checkpoint_path is not None:
        # tfmlib.resume imports this module, so it is imported here rather than at the top
        from tfmlib.resume import load_training_state, restore_rng_state, save_training_state
    if resume and Path(checkpoint_path).is_file():  # type: ignore[arg-type]
        restored = load_training_state(checkpoint_path, model=model, optimizer=optimizer,  # type: ignore[arg-type]
                                       scheduler=scheduler, scaler=scaler, settings=settings)
        history = History.from_dict(restored.history)
        history.resumed_from_step = steps = restored.steps
        first_epoch, skip_batches = restored.epoch, restored.batches_done
        sampler_epoch0 = restored.sampler_epoch - (restored.epoch - 1)  # for a DistributedSampler
        start = time.perf_counter() - restored.train_seconds
        if verbose:
            print(f"fit: resumed from {checkpoint_path} at step {steps} (epoch {first_epoch}, "
                  f"{skip_batches} batches done)")
    elif resume and verbose:
        print(f"fit: no training state at {checkpoint_path} yet: starting from step 0")

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
        if pending_skipped:
            history.skipped_steps += int(sum(torch.stack(pending_skipped).tolist()))
            pending_skipped.clear()
        if bar is not None:
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

    def save_state(bar: Any, epoch: int, batches_done: int, epoch_seconds: float) -> None:
        read_pending(bar)
        synchronize(device)
        save_training_state(
            checkpoint_path, model=model, optimizer=optimizer, scheduler=scheduler,  # type: ignore[arg-type]
            scaler=scaler, epoch=epoch, batches_done=batches_done, steps=steps,
            sampler_epoch=sampler_epoch_now, history=history.to_dict(),
            train_seconds=time.perf_counter() - start - eval_seconds, epoch_seconds=epoch_seconds,
            epoch_loss_sum=total_loss, epoch_tokens=total_tokens, settings=settings)

    def optimizer_step(group_tokens: int | torch.Tensor | None) -> None:
        """Unscale (fp16), average over the group's tokens (``accumulate > 1``), clip, step."""
        nonlocal steps
        if scaler is not None:
            scaler.unscale_(optimizer)
        if group_tokens is not None:
            if ddp_world is not None:  # the same divisor on every rank: the global group's tokens / W
                total = torch.as_tensor(group_tokens, device=device).to(torch.float64).reshape(1)
                torch.distributed.all_reduce(total)
                divisor: int | torch.Tensor = total[0].clamp(min=1) / ddp_world
            else:
                divisor = _at_least_one(group_tokens)
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(divisor)
        if clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        if scaler is None:
            optimizer.step()
        else:
            # the scaler lowers its scale (x backoff_factor, 0.5) exactly when it skipped the step because
            # the gradients held an inf or a NaN; compared on the device, read with the losses
            scale_before = scaler._get_scale_async().clone()
            scaler.step(optimizer)
            scaler.update()
            pending_skipped.append(scaler._get_scale_async() < scale_before)
        if scheduler is not None:
            scheduler.step()
        steps += 1

    def out_of_steps_or_time() -> bool:
        return (max_steps is not None and steps >= max_steps) or (
            time_budget_s is not None and time.perf_counter() - start - eval_seconds >= time_budget_s)

    def after_step(bar: Any, epoch: int, batches_done: int, epoch_t0: float, epoch_eval0: float) -> bool:
        """Bookkeeping after an optimiser step: read the losses, evaluate, save the training state;
        True when training should stop."""
        if len(pending_loss) >= log_every:
            read_pending(bar)
        done = out_of_steps_or_time()
        if eval_every is not None and steps % eval_every == 0:
            evaluate()
        if checkpoint_path is not None and (done or (checkpoint_every is not None
                                                     and steps % checkpoint_every == 0)):
            epoch_seconds = time.perf_counter() - epoch_t0 - (eval_seconds - epoch_eval0)
            save_state(bar, epoch, batches_done, epoch_seconds)
        return done

    def end_group(group_loss: torch.Tensor, group_tokens: int | torch.Tensor) -> None:
        """Record the token-weighted mean loss of an accumulated group and take its step."""
        pending_loss.append(group_loss / _at_least_one(group_tokens))
        pending_tokens.append(group_tokens)
        optimizer_step(group_tokens)

    for epoch in range(first_epoch, epochs + 1):
        model.train()
        t0, total_loss, total_tokens = time.perf_counter(), 0.0, 0
        eval_seconds_at_t0 = eval_seconds
        if restored is not None and epoch == restored.epoch:
            t0 -= restored.epoch_seconds
            total_loss, total_tokens = restored.epoch_loss_sum, restored.epoch_tokens
            sampler.set_epoch(restored.sampler_epoch)  # replay the interrupted epoch's order
        elif managed:
            sampler.set_epoch(sampler_epoch0 + epoch - 1)
        if sampler is not None:
            sampler_epoch_now = sampler.epoch
        bar = tqdm(loader, desc=f"{desc} {epoch}/{epochs}", leave=False, disable=not verbose)
        batches = iter(bar)
        batches_done, micro = 0, 0
        group_loss: torch.Tensor | None = None
        group_tokens: int | torch.Tensor = 0
        if restored is not None:
            for _ in range(skip_batches):  # the batches the saved run had consumed
                if next(batches, None) is None:
                    raise CheckpointError(f"{checkpoint_path}: the loader has fewer batches in epoch {epoch} "
                                          f"than the saved run had consumed ({skip_batches})")
            batches_done = skip_batches
            # after the skipped batches (and the loader's own draw when it started): from here on the
            # random numbers are those the saved run went on with
            restore_rng_state(restored.rng)
            restored = None
            stop = out_of_steps_or_time()

        for batch in batches if not stop else ():
            batch = move_to(batch, device)
            # DDP: the batches of a group before its last only accumulate their gradients locally
            # (DDP decides in the forward pass whether the backward all-reduces)
            local_only = ddp_world is not None and micro < accumulate - 1
            with model.no_sync() if local_only else contextlib.nullcontext(), amp():  # type: ignore[operator]
                loss, n_tokens = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise TypeError(f"fit: loss_fn must return (scalar loss tensor, n_tokens); the loss "
                                f"is {got} at step {steps + 1} (reduce it with .mean())")
            batches_done += 1
            if accumulate == 1:
                pending_tokens.append(_check_token_count(n_tokens, steps + 1))
                pending_loss.append(loss.detach())
                optimizer.zero_grad(set_to_none=True)
                (loss if scaler is None else scaler.scale(loss)).backward()
                optimizer_step(None)
                stop = after_step(bar, epoch, batches_done, t0, eval_seconds_at_t0)
                if stop:
                    break
                continue
            n_tokens = _check_token_count(n_tokens, steps + 1)
            if micro == 0:
                optimizer.zero_grad(set_to_none=True)
                # summed in at least float32 (a bf16 loss of a large group would round)
                group_loss = loss.detach().to(torch.promote_types(loss.dtype, torch.float32)) * n_tokens
                group_tokens = n_tokens
            else:
                group_loss = group_loss + loss.detach().to(group_loss.dtype) * n_tokens
                group_tokens = group_tokens + n_tokens
            weighted = loss * n_tokens  # summed over the group, then divided by its token count
            with model.no_sync() if local_only else contextlib.nullcontext():  # type: ignore[operator]
                (weighted if scaler is None else scaler.scale(weighted)).backward()
            micro += 1
            if micro == accumulate:
                end_group(group_loss, group_tokens)
                micro = 0
                stop = after_step(bar, epoch, batches_done, t0, eval_seconds_at_t0)
                if stop:
                    break
        if micro > 0:  # the last, shorter group of the epoch
            if ddp_world is not None:  # its batches all ran in no_sync: average the gradients here
                for p in model.parameters():
                    if p.grad is not None:
                        torch.distributed.all_reduce(p.grad)
                        p.grad.div_(ddp_world)
            end_group(group_loss, group_tokens)
            stop = after_step(bar, epoch, batches_done, t0, eval_seconds_at_t0)
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
    if restored is not None:  # resumed from the state saved when all epochs were done
        restore_rng_state(restored.rng)
    if eval_every is not None and (not history.evals or history.evals[-1]["step"] != steps):
        evaluate()  # the last step, unless it was a multiple of eval_every
    if checkpoint_path is not None and not stop and first_epoch <= epochs:
        sampler_epoch_now = sampler.epoch + (1 if managed else 0)
        save_state(None, epochs + 1, 0, 0.0)  # all epochs done: the state after the last
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
    return write_atomically(payload, path)


def read_safely(path: str | Path, what: str, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``: loading never runs code from the file. Raises
    :class:`CheckpointError` naming ``what`` (e.g. ``"checkpoint"``) for a missing file and for one
    that cannot be read (truncated, not a zip, holding objects ``weights_only`` refuses)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no {what} at {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated file, not a zip, unpickling refused...
        raise CheckpointError(f"{path} is not a readable {what} ({type(e).__name__}: {e})") from e


def write_atomically(payload: Any, path: str | Path) -> Path:
    """``torch.save(payload)`` to ``path`` through a temporary file in the same folder moved into
    place with ``os.replace``; the folder is created if missing. Returns ``path``."""
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


def state_mismatch(own: Mapping[str, torch.Tensor], saved: Mapping[str, Any]) -> str | None:
    """How a saved ``state_dict`` differs from a model's (missing and unexpected names, shape
    mismatches; five of each), or ``None`` when the names and shapes agree."""
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    def shape(v: Any) -> tuple[int, ...] | str:
        return tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__

    wrong_shape = [f"{k}: checkpoint {shape(saved[k])} vs model {shape(own[k])}"
                   for k in own if k in saved and shape(saved[k]) != shape(own[k])]
    if missing or unexpected or wrong_shape:
        return f"missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {wrong_shape[:5]}"
    return None


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
    payload = read_safely(path, "checkpoint", map_location)
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
        mismatch = state_mismatch(model.state_dict(), ckpt.model_state)
        if mismatch:
            raise CheckpointError(f"{path} does not fit this model: {mismatch}")
        model.load_state_dict(ckpt.model_state)
    if optimizer is not None:
        if ckpt.optimizer_state is None:
            raise CheckpointError(f"{path} holds no optimizer state")
        try:
            optimizer.load_state_dict(ckpt.optimizer_state)
        except (KeyError, ValueError) as e:  # other parameter groups or another optimizer class
            raise CheckpointError(f"{path}: the optimizer state does not fit this optimizer ({e})") from e
    return ckpt

"""The training loop of the book, and the parts it calls.

Introduced in chapter 01; every chapter that trains a model uses :func:`fit`.

The loop, :func:`train_loop`, is the one every PyTorch tutorial writes: for each batch, the loss
(a function you pass in), its gradients, an optimiser step, a record of the loss. Everything else
``fit`` does is a small named part that the loop calls:

* :class:`~tfmlib.training_step.TrainingStep`: the step's arithmetic (``zero_grad``, ``backward``,
  clipping the gradient norm, ``optimizer.step()``, ``scheduler.step()``); chapter 10 adds mixed
  precision, gradient accumulation and data-parallel weighting to it;
* :class:`LossLog`: the losses stay on the device and are read back a few steps at a time, so a
  GPU is not made to wait for the host every step; it records ``History.step_loss`` and the
  epoch's token-weighted mean;
* :class:`TrainingClock`: training time, with evaluation left out, for time budgets and tokens/s;
* :class:`EvalSchedule`: ``eval_fn`` after every epoch, or every ``N`` steps (chapter 08);
* :class:`~tfmlib.resume.EpochOrder` and :class:`~tfmlib.resume.Checkpointing` (chapter 10): the
  sampler's epoch, training states written every ``N`` steps, and the run a killed one resumes;
* :class:`Bookkeeping`: where the run is (epoch, batches, limits) and what it has recorded; it
  holds the parts above.

Model checkpoints (:mod:`tfmlib.checkpoint`: the model, the optimizer, the vocabularies and the
run's config together, written atomically and read with ``torch.load(..., weights_only=True)``)
are importable from here too, as chapters 01-03 and 08 do.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from tfmlib.checkpoint import (  # chapters 01-03 and 08 import these from here
    CHECKPOINT_FORMAT,
    Checkpoint,
    CheckpointError,
    checkpoint_dir,
    load_checkpoint,
    read_safely,
    save_checkpoint,
    state_mismatch,
    write_atomically,
)
from tfmlib.resume import Checkpointing, EpochOrder, TrainingState
from tfmlib.rng import restore_rng_state
from tfmlib.timing import synchronize, time_scale_from_env
from tfmlib.training_step import StepResult, TrainingStep, token_count

INTRODUCED_IN = 1

__all__ = [
    # the loop and its parts
    "Bookkeeping", "EvalSchedule", "History", "LossFn", "LossLog", "TimeGuardWarning", "TrainingClock",
    "TrainingStep", "fit",
    "move_to", "train_loop",
    # schedules and metrics
    "perplexity", "transformer_peak_lr", "warmup_inverse_sqrt",
    # tfmlib.checkpoint's, re-exported
    "CHECKPOINT_FORMAT", "Checkpoint", "CheckpointError", "checkpoint_dir", "load_checkpoint", "read_safely",
    "save_checkpoint", "state_mismatch", "write_atomically",
]

LossFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, int]"]


class TimeGuardWarning(UserWarning):
    """:func:`fit`'s time guard (``time_budget_s``) ended a run before its step or epoch count."""


@dataclass
class History:
    """What :func:`fit` records.

    * ``step_loss``: the mean loss of every optimisation step, in order (with ``accumulate``, the
      token-weighted mean over the step's batches).
    * ``step_tokens``: the number of tokens each step's loss is the mean over (the ``n`` the loss
      function returned, summed over an accumulated step's batches), so that averages over steps
      can weight each step by its tokens, as ``train_loss`` and a validation loss do.
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
    * ``stopped_by``: what ended the run: ``"epochs"`` (all of them ran), ``"max_steps"``, or
      ``"time_budget_s"`` (the time guard: a run that means less than its count promised; a
      notebook checks this before it asserts what a shorter run could reverse).
    """

    step_loss: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    skipped_steps: int = 0
    resumed_from_step: int = 0
    stopped_by: str = "epochs"

    @property
    def cut_by_time(self) -> bool:
        """True when the time guard (``time_budget_s``), not a count, ended the run."""
        return self.stopped_by == "time_budget_s"

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
        return {"step_loss": list(self.step_loss), "step_tokens": list(self.step_tokens),
                "epochs": [dict(e) for e in self.epochs],
                "evals": [dict(e) for e in self.evals], "skipped_steps": self.skipped_steps,
                "resumed_from_step": self.resumed_from_step, "stopped_by": self.stopped_by}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> History:
        """The inverse of :meth:`to_dict`."""
        return cls(step_loss=list(d["step_loss"]), step_tokens=[int(n) for n in d.get("step_tokens", [])],
                   epochs=[dict(e) for e in d["epochs"]],
                   evals=[dict(e) for e in d["evals"]], skipped_steps=int(d.get("skipped_steps", 0)),
                   resumed_from_step=int(d.get("resumed_from_step", 0)),
                   stopped_by=str(d.get("stopped_by", "epochs")))


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


# --------------------------------------------------------------------------- the loop's parts


class LossLog:
    """The step losses, kept on the device and read back ``log_every`` at a time.

    Reading a value from a GPU makes the host wait for it (once a step, that would halve the speed
    of a small model), so :meth:`add` only keeps the step's loss tensor; :meth:`read` reads every
    pending loss together (one read for the losses, one for tensor token counts, one for fp16's
    skipped-step flags: a few reads every ``log_every`` steps instead of one every step), checks
    them, and records them in ``history``: ``step_loss``, ``skipped_steps``, and the epoch's
    token-weighted sum (``epoch_loss``, ``epoch_tokens``). A non-finite loss is a ``ValueError``
    naming its step, found when it is read.
    """

    def __init__(self, history: History, log_every: int = 50) -> None:
        if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
            raise ValueError(f"fit: log_every must be an int >= 1, got {log_every!r}")
        self.history, self.log_every = history, log_every
        self.pending: list[StepResult] = []
        self.epoch_loss, self.epoch_tokens = 0.0, 0

    def start_epoch(self, loss_sum: float = 0.0, tokens: int = 0) -> None:
        """Start the epoch's sums (from a resumed epoch's, when given)."""
        self.epoch_loss, self.epoch_tokens = loss_sum, tokens

    def add(self, result: StepResult) -> None:
        """Keep one step's loss, token count and skipped flag (on the device) until :meth:`read`."""
        self.pending.append(result)

    def due(self) -> bool:
        """True when ``log_every`` steps are pending."""
        return len(self.pending) >= self.log_every

    def read(self, bar: Any = None) -> None:
        """Read the pending steps (one read each for the losses, the counts and the skipped flags);
        check and record them; show the last loss on ``bar`` (a tqdm bar) if given."""
        if not self.pending:
            return
        first_step = len(self.history.step_loss) + 1
        values = torch.stack([r.loss for r in self.pending]).tolist()
        tensor_counts = [r.n_tokens for r in self.pending if isinstance(r.n_tokens, torch.Tensor)]
        read_counts = iter(torch.stack(tensor_counts).tolist() if tensor_counts else [])
        counts = [next(read_counts) if isinstance(r.n_tokens, torch.Tensor) else r.n_tokens
                  for r in self.pending]
        skipped = [r.skipped for r in self.pending if r.skipped is not None]
        self.pending.clear()
        for k, (value, n_tokens) in enumerate(zip(values, counts, strict=True)):
            if not math.isfinite(value):
                raise ValueError(f"fit: loss became {value} at step {first_step + k}")
            n_tokens = token_count(n_tokens, first_step + k)
            self.history.step_loss.append(value)
            self.history.step_tokens.append(n_tokens)
            self.epoch_loss += value * n_tokens
            self.epoch_tokens += n_tokens
        if skipped:
            self.history.skipped_steps += int(sum(torch.stack(skipped).tolist()))
        if bar is not None:
            bar.set_postfix(loss=f"{values[-1]:.3f}")


class TrainingClock:
    """Training time: wall-clock seconds since the run started, less the time spent evaluating.

    ``already`` is the training time a resumed run had spent. :meth:`excluding` times an
    evaluation out of it; the device is synchronised around it, so queued training work counts as
    training and the evaluation's own work does not.
    """

    def __init__(self, device: torch.device | str = "cpu", already: float = 0.0) -> None:
        self.device = torch.device(device)
        self.start = time.perf_counter() - already
        self.eval_seconds = 0.0
        self.start_epoch()

    def training_seconds(self) -> float:
        """Training seconds so far (evaluations excluded)."""
        return time.perf_counter() - self.start - self.eval_seconds

    def start_epoch(self, already: float = 0.0) -> None:
        """Start timing an epoch (``already``: the seconds a resumed epoch had run)."""
        self.epoch_start = time.perf_counter() - already
        self.eval_seconds_at_epoch_start = self.eval_seconds

    def epoch_seconds(self) -> float:
        """Training seconds of the current epoch so far."""
        return time.perf_counter() - self.epoch_start - (self.eval_seconds - self.eval_seconds_at_epoch_start)

    @contextlib.contextmanager
    def excluding(self) -> Iterator[float]:
        """Time spent in the ``with`` block is not training time; yields the training seconds at
        its start."""
        synchronize(self.device)  # queued training work is training time, not evaluation time
        started = time.perf_counter()
        try:
            yield started - self.start - self.eval_seconds
        finally:
            synchronize(self.device)
            self.eval_seconds += time.perf_counter() - started


class EvalSchedule:
    """When ``eval_fn`` runs: after every epoch (``every=None``), or after every ``every`` optimiser
    steps and after the last step (a learning curve, chapter 08). :meth:`evaluate` calls it in
    ``eval`` mode under ``no_grad``, out of the training time, and records ``step``, ``seconds``
    (training seconds so far) and its metrics in ``history.evals``."""

    def __init__(self, model: nn.Module, eval_fn: Callable[[nn.Module], Mapping[str, float]] | None,
                 every: int | None, history: History, clock: TrainingClock) -> None:
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ValueError(f"fit: eval_every must be an int >= 1 or None, got {every!r}")
        if every is not None and eval_fn is None:
            raise ValueError("fit: eval_every needs an eval_fn to call")
        self.model, self.eval_fn, self.every, self.history, self.clock = model, eval_fn, every, history, clock

    @property
    def per_epoch(self) -> bool:
        """True when ``eval_fn`` runs once per epoch."""
        return self.eval_fn is not None and self.every is None

    def due(self, steps: int) -> bool:
        """True after every ``every``-th optimiser step."""
        return self.every is not None and steps % self.every == 0

    def evaluate(self, steps: int) -> dict[str, float]:
        """Run ``eval_fn`` now (after ``steps`` optimiser steps) and record what it returns."""
        with self.clock.excluding() as seconds:
            self.model.eval()
            with torch.no_grad():
                metrics = dict(self.eval_fn(self.model))  # type: ignore[misc]
            self.model.train()
            self.history.evals.append({"step": steps, "seconds": seconds, **metrics})
        return metrics

    def after_last_step(self, steps: int) -> None:
        """With ``every``: evaluate the last step too, unless it was a multiple of ``every``."""
        if self.every is not None and (not self.history.evals or self.history.evals[-1]["step"] != steps):
            self.evaluate(steps)


class Bookkeeping:
    """Where a run of :func:`fit` is and what it has recorded: the epoch and the batches done in it,
    the step and time limits, and the parts that keep the records (:class:`LossLog`,
    :class:`TrainingClock`, :class:`EvalSchedule`; :class:`~tfmlib.resume.EpochOrder` and
    :class:`~tfmlib.resume.Checkpointing` when they are needed). ``restored`` is the training state
    a resumed run starts from: its History, step count, time, epoch and position are taken over
    here, and its random number generators are put back once the batches it had done are skipped.
    """

    def __init__(self, model: nn.Module, step: TrainingStep, *, log_every: int = 50,
                 eval_fn: Callable[[nn.Module], Mapping[str, float]] | None = None,
                 eval_every: int | None = None, max_steps: int | None = None,
                 time_budget_s: float | None = None, order: EpochOrder | None = None,
                 checkpoints: Checkpointing | None = None, restored: TrainingState | None = None,
                 verbose: bool = True) -> None:
        self.model, self.step, self.device, self.verbose = model, step, step.device, verbose
        # the guard in seconds: time_budget_s times TFM_TIME_SCALE (1 unless a test simulates a slow device)
        self.max_steps, self.time_budget_s = max_steps, time_budget_s
        self.time_limit_s = None if time_budget_s is None else time_budget_s * time_scale_from_env()
        self.order, self.checkpoints, self.restored = order, checkpoints, restored
        self.history = History() if restored is None else History.from_dict(restored.history)
        self.history.stopped_by = "epochs"  # until a limit is reached (a resumed run may go past it)
        self.first_epoch, self.epoch, self.batches_done = 1, 1, 0
        self.stop = False  # out of steps or time: the loop ends after this epoch's bookkeeping
        if restored is not None:
            self.history.resumed_from_step = step.steps = restored.steps
            self.first_epoch = restored.epoch
            if order is not None:
                order.first = restored.sampler_epoch - (restored.epoch - 1)  # for a DistributedSampler
        self.clock = TrainingClock(step.device, restored.train_seconds if restored is not None else 0.0)
        self.log = LossLog(self.history, log_every)
        self.evals = EvalSchedule(model, eval_fn, eval_every, self.history, self.clock)

    def epochs(self, epochs: int) -> range:
        """The epochs to run: ``1 .. epochs``, or from the one a resumed run was in."""
        return range(self.first_epoch, epochs + 1)

    def batches(self, epoch: int, bar: Iterable[Any]) -> Iterator[Any]:
        """Start ``epoch`` and yield the batches of ``bar`` (the loader in a progress bar), counting
        them. A resumed epoch replays its order and skips the batches the saved run had done, then
        puts the random number generators back; a resumed run that had already reached its step or
        time limit yields none (and sets ``stop``)."""
        replay = self.restored if self.restored is not None and epoch == self.restored.epoch else None
        self.epoch, self.batches_done = epoch, 0
        self.clock.start_epoch(replay.epoch_seconds if replay is not None else 0.0)
        self.log.start_epoch(*((replay.epoch_loss_sum, replay.epoch_tokens) if replay is not None else ()))
        if self.order is not None:
            self.order.start_epoch(epoch, replay.sampler_epoch if replay is not None else None)
        batches = iter(bar)
        if self.restored is not None:
            for _ in range(self.restored.batches_done):  # the batches the saved run had consumed
                if next(batches, None) is None:
                    path = self.checkpoints.path  # type: ignore[union-attr]
                    raise CheckpointError(f"{path}: the loader has fewer batches in epoch {epoch} than the "
                                          f"saved run had consumed ({self.restored.batches_done})")
            self.batches_done = self.restored.batches_done
            # after the skipped batches (and the loader's own draw when it started): from here on the
            # random numbers are those the saved run went on with
            restore_rng_state(self.restored.rng)
            self.restored = None
            self.stop = self.out_of_steps_or_time()
            if self.stop:
                return
        for batch in batches:
            self.batches_done += 1
            yield batch

    def out_of_steps_or_time(self) -> bool:
        """True once ``max_steps`` optimiser steps are taken or ``time_budget_s`` training seconds
        spent (scaled by ``TFM_TIME_SCALE``); records which in ``History.stopped_by`` (the count
        first, when both are reached) and warns (:class:`TimeGuardWarning`) when it is the time."""
        if self.max_steps is not None and self.step.steps >= self.max_steps:
            self.history.stopped_by = "max_steps"
            return True
        if self.time_limit_s is not None and self.clock.training_seconds() >= self.time_limit_s:
            if self.history.stopped_by != "time_budget_s":
                scaled = "" if self.time_limit_s == self.time_budget_s else \
                    f" x TFM_TIME_SCALE={time_scale_from_env():g}"
                warnings.warn(f"fit: the time guard (time_budget_s={self.time_budget_s:g}{scaled}) stopped "
                              f"training after {self.step.steps} optimiser steps", TimeGuardWarning,
                              stacklevel=2)
            self.history.stopped_by = "time_budget_s"
            return True
        return False

    def after_step(self, result: StepResult, bar: Any = None) -> bool:
        """Record a step; read the losses, evaluate and save a training state when they are due.
        Sets and returns ``stop``: True when training should stop (out of steps or time)."""
        self.log.add(result)
        if self.log.due():
            self.log.read(bar)
        done = self.stop = self.out_of_steps_or_time()
        if self.evals.due(self.step.steps):
            self.evals.evaluate(self.step.steps)
        if self.checkpoints is not None and self.checkpoints.due(self.step.steps, done):
            self.save(bar, self.epoch, self.batches_done, self.clock.epoch_seconds())
        return done

    def save(self, bar: Any, epoch: int, batches_done: int, epoch_seconds: float,
             sampler_epoch: int | None = None) -> None:
        """Write a training state (after reading the pending losses, so its History is complete)."""
        self.log.read(bar)
        synchronize(self.device)
        self.checkpoints.save(  # type: ignore[union-attr]
            model=self.model, optimizer=self.step.optimizer, scheduler=self.step.scheduler,
            scaler=self.step.scaler, epoch=epoch, batches_done=batches_done, steps=self.step.steps,
            sampler_epoch=self.order.now if sampler_epoch is None else sampler_epoch,  # type: ignore[union-attr]
            history=self.history.to_dict(), train_seconds=self.clock.training_seconds(),
            epoch_seconds=epoch_seconds, epoch_loss_sum=self.log.epoch_loss,
            epoch_tokens=self.log.epoch_tokens)

    def end_epoch(self, bar: Any = None) -> dict[str, float]:
        """Read the losses; record (and print, if ``verbose``) the epoch's summary, evaluating it
        if ``eval_fn`` runs per epoch."""
        self.log.read(bar)
        synchronize(self.device)
        if self.log.epoch_tokens == 0:
            raise ValueError("fit: the loader yielded no batches (or no tokens)")
        seconds = max(self.clock.epoch_seconds(), 1e-9)
        record = {"epoch": self.epoch, "train_loss": self.log.epoch_loss / self.log.epoch_tokens,
                  "seconds": seconds, "tokens_per_second": self.log.epoch_tokens / seconds}
        if self.evals.per_epoch:
            record.update(self.evals.evaluate(self.step.steps))
        self.history.epochs.append(record)
        if self.verbose:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch")
            print(f"epoch {self.epoch}: {shown}")
        return record

    def finish(self, epochs: int) -> History:
        """After the last epoch: evaluate the last step (with ``eval_every``), save the finished
        run's state (when checkpointing and not stopped early); returns the History."""
        if self.restored is not None:  # resumed from the state saved when all epochs were done
            restore_rng_state(self.restored.rng)
        self.evals.after_last_step(self.step.steps)
        if self.checkpoints is not None and not self.stop and self.first_epoch <= epochs:
            # all epochs done: the state after the last
            self.save(None, epochs + 1, 0, 0.0, sampler_epoch=self.order.after_all_epochs())  # type: ignore[union-attr]
        return self.history


# --------------------------------------------------------------------------- the loop


def train_loop(model: nn.Module, loader: Any, loss_fn: LossFn, step: TrainingStep, books: Bookkeeping, *,
               epochs: int, desc: str = "train", verbose: bool = True) -> History:
    """Chapter 01's training loop: for every batch, the loss, its gradients, a step, a record.

    ``step`` does the arithmetic (zero the gradients, backward, clip, ``optimizer.step()``);
    ``books`` keeps the records (losses, time, evaluations, checkpoints). :func:`fit` builds both.
    """
    for epoch in books.epochs(epochs):
        model.train()
        bar = tqdm(loader, desc=f"{desc} {epoch}/{epochs}", leave=False, disable=not verbose)
        for batch in books.batches(epoch, bar):  # counted; a resumed epoch skips those done
            batch = move_to(batch, step.device)
            with step.forward():  # nothing in fp32 (chapter 10: autocast)
                loss, n_tokens = loss_fn(model, batch)
            if step.backward(loss, n_tokens):  # True: time for a step (chapter 10: every k batches)
                books.after_step(step.step(), bar)  # record the loss; evaluate, save when due
                if books.stop:  # out of steps or time
                    break
        if step.group_open():  # chapter 10: a last, shorter group of k batches still steps
            books.after_step(step.step(), bar)
        books.end_epoch(bar)
        if books.stop:
            break
    return books.finish(epochs)


# --------------------------------------------------------------------------- fit


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
    epoch's bookkeeping; ``History.stopped_by`` says which ended it. The book stops runs by
    count and keeps ``time_budget_s`` as a guard only: a run it cuts short means less than its
    count promised, so ``fit`` warns (:class:`TimeGuardWarning`) and the caller should say so.
    ``TFM_TIME_SCALE`` (:func:`tfmlib.timing.time_scale_from_env`) multiplies ``time_budget_s``,
    to simulate a slower device.

    The step losses stay on the device and are read back together every ``log_every`` steps and
    at the end of each epoch (reading a value from a GPU makes the host wait for it; once a step
    would halve the speed of a small model). ``History`` is the same as reading every step: only
    the progress bar updates less often, and a non-finite loss is reported (with its step) when it
    is read, up to ``log_every - 1`` steps after it happened (the weights have taken those steps:
    reload a checkpoint rather than go on from them). The device is synchronised around evaluations and
    at the end of each epoch, so recorded times hold the work they name.

    ``fit`` checks its arguments, builds the parts (a :class:`~tfmlib.training_step.TrainingStep`
    and a :class:`Bookkeeping`, with :class:`~tfmlib.resume.EpochOrder` and
    :class:`~tfmlib.resume.Checkpointing` when needed) and runs :func:`train_loop` with them.

    Chapter 10 adds three options; at their defaults ``fit`` computes exactly what it did before.

    * ``precision`` (``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"auto"``, see
      :func:`tfmlib.precision.pick_precision`): ``loss_fn`` runs under
      :func:`tfmlib.precision.autocast`; the weights, gradients and optimizer state stay float32.
      fp16 uses a ``torch.amp.GradScaler``: the loss is scaled before ``backward``, the gradients
      unscaled before clipping; a step whose gradients overflowed is skipped by the scaler (not an
      error; counted in ``History.skipped_steps``). A non-finite *loss* is still an error.
    * ``accumulate=k``: one optimiser step per ``k`` batches of ``loader``, equal to one step on
      the batch made of those ``k`` batches: each batch back-propagates ``loss * n_tokens / n_ref``
      (``n_ref`` the group's first token count, so the summed gradients stay the size of a few
      batches' and fp16's scaled gradients do not overflow) and the summed gradients are divided by
      the group's token count over ``n_ref`` before clipping (no host read, also with tensor counts;
      see :mod:`tfmlib.training_step`). The last, shorter group of an epoch still steps. ``step_loss``,
      ``max_steps``, ``eval_every``, ``checkpoint_every`` and the scheduler count optimiser steps.
      Under ``DistributedDataParallel`` the first ``k - 1`` batches of a group run inside the
      model's ``no_sync()`` (their gradients are summed locally, and the gradients are all-reduced
      once per step, not ``k`` times), ``n_ref`` is the mean of the ranks' first counts, and the
      divisor is the group's token count summed over the ranks over ``n_ref`` (divided by the world
      size, since DDP averages): each rank weights a token alike and divides by the same number, and
      the step equals one step on the global group even when the ranks' token counts differ.
      (A group cut short by the end of an epoch has its gradients all-reduced explicitly.) Without
      accumulation (``k = 1``) the same weighting applies to the single batch: each rank's mean
      loss is scaled by its token count over the ranks' mean count (one scalar all-reduce per
      step), so a rank with more tokens counts for more, as in one step on the global batch.
    * ``checkpoint_path``: write a training state there (:mod:`tfmlib.resume`: model, optimizer,
      scheduler, scaler, random number generators, data position, History, training time and the
      settings that must match) every ``checkpoint_every`` optimiser steps and when training ends,
      atomically. With ``resume=True`` and an existing file, ``fit`` restores it and carries on
      from the next batch, ending with the weights an uninterrupted run would have; without the
      file it starts afresh. The loader's batch order must depend only on a seed and the epoch:
      ``loader.batch_sampler`` or ``loader.sampler`` needs ``set_epoch`` (``BucketBatchSampler``,
      ``TokenBatchSampler``, torch's ``DistributedSampler``), which ``fit`` then calls at the start
      of every epoch. It also calls it for a ``DistributedSampler`` without checkpoints, as
      torch's documentation asks (else every epoch has the same order). The state holds the
      model inside ``torch.compile``'s and DDP's wrappers, so a compiled, a DDP and a plain model
      resume each other's states; under DDP every rank calls ``fit`` alike, rank 0 alone writes the
      file (with every rank's generators, History and epoch sums) and the others wait for it.

    Raises ``ValueError`` for a non-positive ``epochs``, ``eval_every``, ``log_every``,
    ``accumulate``, ``checkpoint_every`` or ``time_budget_s``, an empty loader, a non-finite
    loss, an unknown or unsupported ``precision``, ``checkpoint_every``/``resume`` without
    ``checkpoint_path``, or a loader without ``set_epoch`` when checkpointing; ``TypeError``
    when ``loss_fn`` does not return a scalar tensor and a non-negative int;
    :class:`CheckpointError` when the training state to resume from is damaged or does not fit
    (the model, the optimizer, the settings).
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
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not time_budget_s > 0):
        raise ValueError(f"fit: time_budget_s must be a number of seconds > 0 or None, got {time_budget_s!r}")
    if checkpoint_path is None and (checkpoint_every is not None or resume):
        raise ValueError("fit: checkpoint_every and resume need a checkpoint_path")
    step = TrainingStep(model, optimizer, device=device, precision=precision, accumulate=accumulate,
                        clip_norm=clip_norm, scheduler=scheduler)
    order = EpochOrder.of(loader, checkpointing=checkpoint_path is not None)
    model.to(step.device)
    checkpoints, restored = None, None
    if checkpoint_path is not None:
        settings = {"epochs": epochs, "accumulate": accumulate, "precision": step.precision,
                    "clip_norm": clip_norm,
                    "scheduler": type(scheduler).__name__ if scheduler is not None else None}
        checkpoints = Checkpointing(checkpoint_path, checkpoint_every, settings)
        if resume:
            restored = checkpoints.restore(model=model, optimizer=optimizer, scheduler=scheduler,
                                           scaler=step.scaler, verbose=verbose)
    books = Bookkeeping(model, step, log_every=log_every, eval_fn=eval_fn, eval_every=eval_every,
                        max_steps=max_steps, time_budget_s=time_budget_s, order=order,
                        checkpoints=checkpoints, restored=restored, verbose=verbose)
    return train_loop(model, loader, loss_fn, step, books, epochs=epochs, desc=desc, verbose=verbose)


def _positive_int_or_none(value: Any, name: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"fit: {name} must be an int >= 1 or None, got {value!r}")


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

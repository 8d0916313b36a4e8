"""Training states: everything a killed run needs to go on as if it had never stopped.

Introduced in chapter 10 (scaling up); :func:`tfmlib.train.fit` writes and reads them through its
``checkpoint_path``, ``checkpoint_every`` and ``resume`` arguments.

A model checkpoint (:func:`tfmlib.checkpoint.save_checkpoint`) holds what is needed to *use* a model.
To *continue training* so that the run ends with the very weights an uninterrupted run would have,
a training state also holds:

* the optimizer's state (Adam's two moment estimates and its step count), the learning-rate
  scheduler's position and fp16's gradient scaler (its current scale);
* every random number generator the step may draw from (:mod:`tfmlib.rng`): Python's ``random``,
  NumPy's global generator, torch's CPU generator (dropout on the CPU, ``torch.randperm``...), the
  generator of every CUDA device (dropout on a GPU) when CUDA has been used, and MPS's;
* the data position: the epoch, how many batches of it were consumed (micro-batches with
  ``accumulate``), the optimiser steps so far, and the epoch value of the sampler, whose order
  depends only on (seed, epoch), so that the resumed run replays the epoch and skips what was done;
* the History so far, the epoch's running loss sums, and the training seconds already spent (a
  time budget goes on counting where it stopped);
* ``fit``'s settings that must not change on resume (``epochs``, ``accumulate``, ``precision``,
  ``clip_norm``, the scheduler's class).

What is not replayed: randomness inside DataLoader worker processes (``num_workers > 0``): the
loader draws its workers' seeds when an epoch starts, and a resumed epoch starts in the new process.
With ``num_workers=0`` (the book's loaders) a dataset's own draws are replayed too. Under
DistributedDataParallel every process has its own generators and losses: ``fit`` gathers them and
rank 0 alone writes one file holding every rank's (each rank resumes with its own);
the model is saved as the model inside the DDP and ``torch.compile`` wrappers, so a state saved
by any of them resumes in a plain model, and the other way round.

The file is written like a model checkpoint (a temporary file moved into place with ``os.replace``,
so a run killed while writing leaves the previous state intact) and read with
``torch.load(weights_only=True)``: everything in it is tensors and plain data (NumPy's generator
state is stored as a tensor and numbers), and loading it never runs code from the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfmlib.checkpoint import (
    CheckpointError,
    is_rank_zero,
    read_safely,
    state_mismatch,
    strip_wrapper_prefixes,
    unwrap_model,
    write_atomically,
)
from tfmlib.rng import capture_rng_state, restore_rng_state

INTRODUCED_IN = 10

STATE_FORMAT = "tfmlib-training-state-1"

__all__ = ["STATE_FORMAT", "CheckpointError", "Checkpointing", "EpochOrder", "TrainingState",
           "capture_rng_state", "epoch_sampler", "load_training_state", "restore_rng_state",
           "save_training_state"]


# --------------------------------------------------------------------------- the training state


@dataclass
class TrainingState:
    """What :func:`load_training_state` returns (and :func:`save_training_state` writes).

    ``epoch`` is the epoch to continue (1-based, as ``fit`` counts), of which ``batches_done``
    batches were consumed; ``steps`` the optimiser steps taken; ``sampler_epoch`` the value to
    give the sampler's ``set_epoch`` before replaying ``epoch``. ``epoch_loss_sum`` and
    ``epoch_tokens`` are the epoch's token-weighted loss sum and token count so far,
    ``epoch_seconds`` and ``train_seconds`` the training time spent in the epoch and in all.
    ``ranks``: when the state was saved under DDP, what differs between the ranks, one dict per rank
    (``rng``, ``history``, ``epoch_loss_sum``, ``epoch_tokens``: each rank's generators and its own
    losses), with rank 0's in the fields above; else ``None``.
    """

    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    optimizer_class: str
    scheduler_state: dict[str, Any] | None
    scaler_state: dict[str, Any] | None
    rng: dict[str, Any]
    epoch: int
    batches_done: int
    steps: int
    sampler_epoch: int
    history: dict[str, Any]
    train_seconds: float
    epoch_seconds: float
    epoch_loss_sum: float
    epoch_tokens: int
    settings: dict[str, Any]
    ranks: list[dict[str, Any]] | None = None


def save_training_state(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    epoch: int,
    batches_done: int,
    steps: int,
    sampler_epoch: int,
    history: Mapping[str, Any],
    train_seconds: float,
    epoch_seconds: float = 0.0,
    epoch_loss_sum: float = 0.0,
    epoch_tokens: int = 0,
    settings: Mapping[str, Any] | None = None,
    rng: Mapping[str, Any] | None = None,
    ranks: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Write a training state to ``path`` atomically (a temporary file moved into place): the
    model, optimizer, scheduler and scaler states, the generators (``rng``, by default
    :func:`capture_rng_state` now), the data position and the History (``History.to_dict()``).
    ``settings`` are plain data that must be equal when the state is loaded. ``ranks``: under DDP,
    each rank's generators, History and epoch sums (:meth:`Checkpointing.save` gathers them; see
    :class:`TrainingState`). The model is saved
    as the one inside ``torch.compile``'s and DDP's wrappers (:func:`tfmlib.checkpoint.unwrap_model`),
    with the names a plain model has. Returns ``path``."""
    for name, value in (("epoch", epoch), ("batches_done", batches_done), ("steps", steps),
                        ("sampler_epoch", sampler_epoch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"save_training_state: {name} must be an int >= 0, got {value!r}")
    enabled_scaler = scaler is not None and scaler.is_enabled()
    payload = {
        "format": STATE_FORMAT,
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "optimizer_class": type(optimizer).__name__,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if enabled_scaler else None,  # type: ignore[union-attr]
        "rng": dict(rng) if rng is not None else capture_rng_state(),
        "ranks": [dict(r) for r in ranks] if ranks is not None else None,
        "position": {"epoch": epoch, "batches_done": batches_done, "steps": steps,
                     "sampler_epoch": sampler_epoch},
        "history": dict(history),
        "time": {"train_seconds": float(train_seconds), "epoch_seconds": float(epoch_seconds)},
        "epoch_sums": {"loss_sum": float(epoch_loss_sum), "tokens": int(epoch_tokens)},
        "settings": dict(settings or {}),
    }
    return write_atomically(payload, path)


def _settings_differ(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return [f"{k}: saved {saved.get(k, '<unset>')!r}, now {now.get(k, '<unset>')!r}"
            for k in sorted(set(saved) | set(now)) if saved.get(k, "<unset>") != now.get(k, "<unset>")]


def _optimizer_mismatch(optimizer: torch.optim.Optimizer, saved: Any) -> str | None:
    """Why ``saved`` (an optimizer ``state_dict``) cannot be loaded into ``optimizer``, or ``None``:
    other parameter groups, or per-parameter state (e.g. Adam's moments) of another shape."""
    try:
        saved_groups = [len(g["params"]) for g in saved["param_groups"]]
        saved_ids = [i for g in saved["param_groups"] for i in g["params"]]
        saved_state = saved["state"]
    except (KeyError, TypeError) as e:
        return f"not an optimizer state: {type(e).__name__}: {e}"
    own_groups = [len(g["params"]) for g in optimizer.param_groups]
    if saved_groups != own_groups:
        return f"parameters per group: saved {saved_groups}, this optimizer {own_groups}"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for index, p in zip(saved_ids, params, strict=True):
        for key, value in saved_state.get(index, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                return (f"state {key!r} of parameter {index} has shape {tuple(value.shape)}, "
                        f"the parameter {tuple(p.shape)}")
    return None


def load_training_state(
    path: str | Path,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    settings: Mapping[str, Any] | None = None,
    map_location: str | torch.device = "cpu",
) -> TrainingState:
    """Read a training state safely (``weights_only=True``) and load it into the objects given.

    Does not touch the random number generators: call :func:`restore_rng_state` with
    ``.rng`` at the point where the saved run captured them (``fit`` does it after replaying the
    consumed batches). Everything is checked before anything is loaded, so an error leaves the
    model and optimizer as they were.

    Raises :class:`CheckpointError` when the file is missing, truncated or corrupt, is not a
    training state (e.g. a model checkpoint), when ``model``'s parameter names or shapes differ
    (listed), when ``optimizer`` is of another class or has other parameter groups, when a
    scheduler is given and the state has none, when a scaler is given that is enabled and the
    state has no scaler state (or disabled and the state has one), and when
    ``settings`` differ from the saved ones (every difference listed).
    """
    path = Path(path)
    payload = read_safely(path, "training state", map_location)
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        what = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path} is not a {STATE_FORMAT} file (it holds {what!r}; a model "
                              "checkpoint has no position or random states to resume from)")
    try:
        position, times, sums = payload["position"], payload["time"], payload["epoch_sums"]
        state = TrainingState(
            model_state=strip_wrapper_prefixes(payload["model"]), optimizer_state=payload["optimizer"],
            optimizer_class=str(payload["optimizer_class"]), scheduler_state=payload["scheduler"],
            scaler_state=payload["scaler"], rng=payload["rng"], epoch=int(position["epoch"]),
            batches_done=int(position["batches_done"]), steps=int(position["steps"]),
            sampler_epoch=int(position["sampler_epoch"]), history=payload["history"],
            train_seconds=float(times["train_seconds"]), epoch_seconds=float(times["epoch_seconds"]),
            epoch_loss_sum=float(sums["loss_sum"]), epoch_tokens=int(sums["tokens"]),
            settings=dict(payload["settings"]), ranks=payload.get("ranks"),
        )
        for key in ("python", "numpy", "torch"):
            state.rng[key]  # noqa: B018  (present, or the state is damaged)
        for key in ("step_loss", "epochs", "evals"):
            state.history[key]  # noqa: B018
        for own in state.ranks or ():
            own["rng"]["torch"], own["history"]["step_loss"], own["epoch_loss_sum"], own["epoch_tokens"]  # noqa: B018
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path} is a damaged {STATE_FORMAT} file ({type(e).__name__}: {e})") from e
    if settings is not None:
        differ = _settings_differ(state.settings, settings)
        if differ:
            raise CheckpointError(f"{path} was saved with other settings; resume with the same ones or start "
                                  f"afresh: {'; '.join(differ)}")
    if model is not None:
        model = unwrap_model(model)
        mismatch = state_mismatch(model.state_dict(), state.model_state)
        if mismatch:
            raise CheckpointError(f"{path} does not fit this model: {mismatch}")
    if optimizer is not None and type(optimizer).__name__ != state.optimizer_class:
        raise CheckpointError(f"{path} holds the state of a {state.optimizer_class} optimizer, "
                              f"not of a {type(optimizer).__name__}")
    if optimizer is not None:
        problem = _optimizer_mismatch(optimizer, state.optimizer_state)
        if problem:
            raise CheckpointError(f"{path}: the optimizer state does not fit this optimizer ({problem})")
    if scheduler is not None and state.scheduler_state is None:
        raise CheckpointError(f"{path} holds no scheduler state, and a scheduler was given")
    enabled_scaler = scaler is not None and scaler.is_enabled()
    if scaler is not None and enabled_scaler != (state.scaler_state is not None):
        saved_what = "no" if state.scaler_state is None else "a"
        given = "an enabled" if enabled_scaler else "no enabled"
        raise CheckpointError(f"{path}: {saved_what} gradient scaler state is saved, "
                              f"and {given} scaler was given")
    if model is not None:
        model.load_state_dict(state.model_state)
    if optimizer is not None:
        try:
            optimizer.load_state_dict(state.optimizer_state)
        except (KeyError, ValueError, TypeError) as e:  # other parameter groups or sizes
            raise CheckpointError(f"{path}: the optimizer state does not fit this optimizer ({e})") from e
    if scheduler is not None:
        scheduler.load_state_dict(state.scheduler_state)
    if enabled_scaler:
        scaler.load_state_dict(state.scaler_state)  # type: ignore[union-attr,arg-type]
    return state


# --------------------------------------------------------------------------- fit's parts


def epoch_sampler(loader: Any) -> Any:
    """The sampler of ``loader`` whose order depends only on (seed, epoch): ``loader.batch_sampler``
    or ``loader.sampler`` when it has ``set_epoch`` (else ``None``)."""
    for attr in ("batch_sampler", "sampler"):
        sampler = getattr(loader, attr, None)
        if callable(getattr(sampler, "set_epoch", None)):
            return sampler
    return None


class EpochOrder:
    """The loader's sampler, whose batch order depends only on (seed, epoch), and its epoch value.

    :func:`tfmlib.train.fit` needs one to checkpoint (a resumed run replays the interrupted epoch's
    order and skips the batches it had done), and drives torch's ``DistributedSampler`` with it even
    without checkpoints: that sampler keeps its epoch until told, so ``fit`` calls ``set_epoch`` at
    the start of every epoch, as torch's documentation asks (else every epoch has the same order).
    tfmlib's samplers advance their own epoch (the DataLoader iterates them twice per epoch: once
    when it starts and once when it resets), so ``fit`` only reads their value, and sets it back
    when resuming. ``first`` is the sampler's value for ``fit``'s epoch 1, ``now`` its value when the
    current epoch started (what a training state saves).
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.managed = isinstance(sampler, torch.utils.data.DistributedSampler)
        self.first: int = sampler.epoch
        self.now: int = self.first

    @classmethod
    def of(cls, loader: Any, *, checkpointing: bool) -> EpochOrder | None:
        """The order of ``loader``'s batches when ``fit`` must manage it (``checkpointing``, or a
        ``DistributedSampler``), else ``None``. ``ValueError`` when checkpointing needs a sampler
        with ``set_epoch`` and an int ``epoch`` and the loader has none."""
        if not checkpointing and not isinstance(getattr(loader, "sampler", None),
                                                torch.utils.data.DistributedSampler):
            return None
        sampler = epoch_sampler(loader)
        if sampler is None or not isinstance(getattr(sampler, "epoch", None), int):
            raise ValueError(
                "fit: checkpoint_path needs a loader whose batch order depends only on a seed and the epoch, "
                "so that a resumed run can replay it: loader.batch_sampler or loader.sampler must have "
                "set_epoch and an int attribute epoch (tfmlib.data.BucketBatchSampler, TokenBatchSampler, "
                "torch's DistributedSampler); "
                f"got a {type(loader).__name__}"
                + (f" with batch_sampler {type(loader.batch_sampler).__name__}"
                   if getattr(loader, "batch_sampler", None) is not None else ""))
        return cls(sampler)

    def start_epoch(self, epoch: int, replay: int | None = None) -> None:
        """Before ``fit``'s ``epoch`` (1-based): the sampler's epoch set to ``replay`` (a resumed
        epoch), or to ``first + epoch - 1`` for a ``DistributedSampler``; ``now`` recorded."""
        if replay is not None:
            self.sampler.set_epoch(replay)
        elif self.managed:
            self.sampler.set_epoch(self.first + epoch - 1)
        self.now = self.sampler.epoch

    def after_all_epochs(self) -> int:
        """The sampler's epoch value for the epoch after the last (what the final state saves)."""
        return self.sampler.epoch + (1 if self.managed else 0)


class Checkpointing:
    """``fit``'s ``checkpoint_path``, ``checkpoint_every`` and ``resume``: when a training state is
    written, with which ``settings`` (plain data that must be equal on resume), and the state a
    resumed run starts from."""

    def __init__(self, path: str | Path, every: int | None = None,
                 settings: Mapping[str, Any] | None = None) -> None:
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ValueError(f"Checkpointing: every must be an int >= 1 or None, got {every!r}")
        self.path, self.every, self.settings = Path(path), every, dict(settings or {})

    def due(self, steps: int, stopping: bool) -> bool:
        """Save after this step? At every ``every``-th step and when training stops early."""
        return stopping or (self.every is not None and steps % self.every == 0)

    def restore(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None,
                scaler: torch.amp.GradScaler | None = None, verbose: bool = True) -> TrainingState | None:
        """The state at ``path`` loaded into the objects given (:func:`load_training_state`, with
        ``settings`` checked), or ``None`` (and a printed line) when there is no file yet. Under DDP,
        when the file holds the ranks of this world size, its generators, History and epoch sums
        are this rank's (else rank 0's)."""
        if not self.path.is_file():
            if verbose:
                print(f"fit: no training state at {self.path} yet: starting from step 0")
            return None
        state = load_training_state(self.path, model=model, optimizer=optimizer, scheduler=scheduler,
                                    scaler=scaler, settings=self.settings)
        rank, world = _rank_and_world()
        if state.ranks is not None and len(state.ranks) == world:
            own = state.ranks[rank]
            state.rng, state.history = own["rng"], own["history"]
            state.epoch_loss_sum, state.epoch_tokens = float(own["epoch_loss_sum"]), int(own["epoch_tokens"])
        if verbose:
            print(f"fit: resumed from {self.path} at step {state.steps} (epoch {state.epoch}, "
                  f"{state.batches_done} batches done)")
        return state

    def save(self, **state: Any) -> Path:
        """:func:`save_training_state` to ``path`` with ``settings``; ``state`` its other arguments.

        Under a process group of several ranks every rank must call it (``fit`` does, at the same
        steps): what differs between the ranks (their generators, their History of their own
        losses, their epoch sums) is gathered, rank 0 alone writes the file, and every rank waits at
        a barrier until it is in place."""
        _, world = _rank_and_world()
        if world == 1:
            return save_training_state(self.path, settings=self.settings, **state)
        own = {"rng": capture_rng_state(), "history": dict(state["history"]),
               "epoch_loss_sum": float(state.get("epoch_loss_sum", 0.0)),
               "epoch_tokens": int(state.get("epoch_tokens", 0))}
        ranks: list[Any] = [None] * world
        torch.distributed.all_gather_object(ranks, own)
        if is_rank_zero():
            save_training_state(self.path, settings=self.settings, rng=ranks[0]["rng"], ranks=ranks, **state)
        torch.distributed.barrier()
        return self.path


def _rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the running process group; (0, 1) in a plain process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1

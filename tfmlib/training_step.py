"""One optimiser step of :func:`tfmlib.train.fit`: precision, gradient accumulation, data-parallel
weighting, clipping.

Introduced in chapter 10 (scaling up), which opens up the step that chapter 01's loop
(:func:`tfmlib.train.train_loop`) calls. At its defaults (fp32, one batch per step) a
:class:`TrainingStep` is the step every PyTorch tutorial writes::

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()

Chapter 10 adds three things to it, each one a few lines here:

* **precision** (``"bf16"``, ``"fp16"``): the forward pass runs under
  :func:`tfmlib.precision.autocast`; fp16 scales the loss with a ``torch.amp.GradScaler`` before
  ``backward`` and unscales the gradients before clipping; the scaler skips a step whose gradients
  overflowed (:attr:`StepResult.skipped`).
* **accumulation** (``accumulate=k``): one optimiser step per ``k`` batches, equal to one step on
  the batch made of them. Each batch's mean loss is weighted by its token count, so a batch of 300
  tokens counts three times one of 100: batch ``i`` back-propagates ``loss_i * n_i / n_ref``, with
  ``n_ref`` the group's first count, and the summed gradients are divided by ``sum(n_i) / n_ref``
  before clipping. (Weighting by ``n_i`` itself is the same step in exact arithmetic, but makes the
  summed gradients ``n_i`` times one batch's: fp16's scaled gradients then overflow, and the scaler
  skips steps that one batch a step would not.)
* **data parallelism** (a ``DistributedDataParallel`` model): the batches of a group before its last
  run inside the model's ``no_sync()`` (gradients summed locally, all-reduced once per step), and
  the divisor is the group's token count summed over the ranks, so every rank divides by the same
  number and the step equals one step on the global group (``n_ref`` is then the ranks' mean first
  count, one more all-reduce of a number per step). This holds at ``accumulate=1`` too: DDP
  averages the ranks' gradients, so each rank's mean loss is weighted by its token count over the
  ranks' mean count (one all-reduce of a number per step; the divisor is then 1 and skipped);
  otherwise a rank with 100 tokens would count as much as one with 300 (the "mean of means").

Nothing here reads a value back to the host: token counts may be 0-d tensors on the device, and
the step's loss and the scaler's verdict stay there until the loop's :class:`tfmlib.train.LossLog`
reads them, a few steps at a time.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from tfmlib.precision import autocast, make_grad_scaler, pick_precision

INTRODUCED_IN = 10

__all__ = ["StepResult", "TrainingStep", "check_token_count", "ddp_world_size", "scale_on_device",
           "token_count"]


def token_count(n_tokens: Any, step: int) -> int:
    """``n_tokens`` (an int, a NumPy integer or a 0-d integer tensor) as an int >= 0; ``TypeError``
    naming ``step`` otherwise."""
    try:
        count = -1 if isinstance(n_tokens, bool) else operator.index(n_tokens)
    except TypeError:
        count = -1
    if count < 0:
        raise TypeError(f"fit: loss_fn must return (loss, n_tokens) with n_tokens an int >= 0, "
                        f"got {n_tokens!r} at step {step}")
    return count


def check_token_count(n_tokens: Any, step: int) -> int | torch.Tensor:
    """``n_tokens`` as an int >= 0, or a 0-d integer tensor kept as it is (on its device: reading
    it would wait for the device; :class:`tfmlib.train.LossLog` reads it, and checks it >= 0, with
    the losses)."""
    if isinstance(n_tokens, torch.Tensor) and n_tokens.dim() == 0 and not (
            n_tokens.is_floating_point() or n_tokens.is_complex() or n_tokens.dtype == torch.bool):
        return n_tokens.detach()
    return token_count(n_tokens, step)


def at_least_one(n_tokens: int | torch.Tensor) -> int | torch.Tensor:
    """A token count to divide by: ``max(n, 1)``, on the device for a tensor (no host read)."""
    return n_tokens.clamp(min=1) if isinstance(n_tokens, torch.Tensor) else max(n_tokens, 1)


def ddp_world_size(model: nn.Module) -> int | None:
    """The world size when ``model`` is a ``DistributedDataParallel`` (possibly inside
    ``torch.compile``'s wrapper) and a process group is running, else ``None``."""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, nn.parallel.DistributedDataParallel) and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return None


def scale_on_device(scaler: torch.amp.GradScaler) -> torch.Tensor:
    """The scaler's current scale as a 0-d tensor on its device, read without waiting for it.

    Private API on purpose: GradScaler's public ``get_scale()`` calls ``.item()``, a host sync at
    every step, which a fused optimizer's ``scaler.step`` otherwise avoids (torch 2.13,
    ``torch/amp/grad_scaler.py``); if a later torch drops ``_get_scale_async``, ``get_scale()``."""
    read = getattr(scaler, "_get_scale_async", None)
    scale = read() if callable(read) else None
    return scale if isinstance(scale, torch.Tensor) else torch.tensor(float(scaler.get_scale()))


class StepResult(NamedTuple):
    """What :meth:`TrainingStep.step` returns, all still on the device.

    ``loss``: the step's mean loss (0-d; with accumulation the token-weighted mean of its batches);
    ``n_tokens``: its token count (an int or a 0-d integer tensor); ``skipped``: fp16 only, a 0-d
    bool tensor, true when the gradient scaler skipped the step (``None`` otherwise).
    """

    loss: torch.Tensor
    n_tokens: int | torch.Tensor
    skipped: torch.Tensor | None


class TrainingStep:
    """The arithmetic of one optimiser step: :meth:`forward` (a context for the forward pass),
    :meth:`backward` for every batch, :meth:`step` when :meth:`backward` says the group is complete.

    ``steps`` counts the optimiser steps taken. ``precision`` is resolved by
    :func:`tfmlib.precision.pick_precision` (``"auto"`` picks one for ``device``); ``scaler`` is the
    fp16 gradient scaler (``None`` otherwise). See the module docstring for what each option adds.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 device: torch.device | str = "cpu", precision: str = "fp32", accumulate: int = 1,
                 clip_norm: float | None = 1.0, scheduler: Any = None) -> None:
        if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
            raise ValueError(f"TrainingStep: accumulate must be an int >= 1, got {accumulate!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"TrainingStep: clip_norm must be positive or None, got {clip_norm!r}")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.device = torch.device(device)
        self.accumulate, self.clip_norm = accumulate, clip_norm
        self.precision = precision if precision == "fp32" else pick_precision(self.device, precision)
        self.scaler = make_grad_scaler(self.device, self.precision) if self.precision == "fp16" else None
        self.ddp_world = ddp_world_size(model)
        self.steps = 0
        self.micro = 0  # batches in the current group so far
        self._loss: torch.Tensor | None = None  # the group's loss: a mean (k = 1), else a token-weighted sum
        self._tokens: int | torch.Tensor = 0
        self._n_ref: int | torch.Tensor = 1  # the group's reference token count (accumulate > 1 or DDP)

    # ------------------------------------------------------------------ one batch

    def _local_only(self) -> bool:
        """DDP: the batches of a group before its last only accumulate their gradients locally (DDP
        decides in the forward pass whether the backward all-reduces)."""
        return self.ddp_world is not None and self.micro < self.accumulate - 1

    def _no_sync(self) -> contextlib.AbstractContextManager[Any]:
        return self.model.no_sync() if self._local_only() else contextlib.nullcontext()  # type: ignore[operator]

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """The context of a forward pass: autocast at ``precision`` (nothing in fp32), and DDP's
        ``no_sync()`` for the batches of a group before its last."""
        amp = contextlib.nullcontext() if self.precision == "fp32" else autocast(self.device, self.precision)
        with self._no_sync(), amp:
            yield

    def _scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scaler is None else self.scaler.scale(loss)

    def backward(self, loss: torch.Tensor, n_tokens: Any) -> bool:
        """Add the gradients of one batch's mean ``loss`` over ``n_tokens`` tokens to the group's;
        True when the group holds ``accumulate`` batches (time for :meth:`step`).

        Raises ``TypeError`` when ``loss`` is not a scalar tensor or ``n_tokens`` not a count.
        """
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise TypeError(f"fit: loss_fn must return (scalar loss tensor, n_tokens); the loss "
                            f"is {got} at step {self.steps + 1} (reduce it with .mean())")
        n_tokens = check_token_count(n_tokens, self.steps + 1)
        if self.accumulate == 1 and self.ddp_world is None:
            self._loss, self._tokens = loss.detach(), n_tokens
            self.optimizer.zero_grad(set_to_none=True)
            self._scaled(loss).backward()
            return True
        if self.micro == 0:
            self.optimizer.zero_grad(set_to_none=True)
            # summed in at least float32 (a bf16 loss of a large group would round)
            self._loss = loss.detach().to(torch.promote_types(loss.dtype, torch.float32)) * n_tokens
            self._tokens = n_tokens
            self._n_ref = self._reference_count(n_tokens)
        else:
            self._loss = self._loss + loss.detach().to(self._loss.dtype) * n_tokens  # type: ignore[operator]
            self._tokens = self._tokens + n_tokens
        # weighted by n_i / n_ref, not n_i: the summed gradients stay a few times one batch's (fp16's
        # scaled gradients would overflow n_i times sooner); the step divides by sum(n_i) / n_ref
        weight = n_tokens / self._n_ref
        weighted = loss * (weight.to(loss.dtype) if isinstance(weight, torch.Tensor) else weight)
        with self._no_sync():
            self._scaled(weighted).backward()
        self.micro += 1
        return self.micro == self.accumulate

    def _reference_count(self, n_tokens: int | torch.Tensor) -> int | torch.Tensor:
        """``n_ref``, what a group's token counts are measured in: its first batch's count (at least
        1); under DDP the mean of the ranks' first counts, so that every rank weights a token alike
        (one all-reduce of a number)."""
        if self.ddp_world is None:
            return at_least_one(n_tokens)
        first = torch.as_tensor(n_tokens, device=self.device).to(torch.float64).reshape(1)
        torch.distributed.all_reduce(first)
        mean = first[0] / self.ddp_world
        # any positive mean will do (1 only where no rank has a token): at accumulate=1 the divisor
        # sum(n) / (n_ref * world) is then exactly 1 and the step skips it
        return torch.where(mean > 0, mean, torch.ones_like(mean))

    def group_open(self) -> bool:
        """True when batches have added gradients that no step has used yet (the last, shorter
        group of an epoch)."""
        return self.micro > 0

    # ------------------------------------------------------------------ the step

    def step(self) -> StepResult:
        """Unscale (fp16), average over the group's tokens (``accumulate > 1``), clip, step the
        optimizer and the scheduler; returns the step's loss and token count (on the device)."""
        if self.accumulate == 1 and self.ddp_world is None:
            loss, tokens = self._loss, self._tokens
            skipped = self._optimizer_step(None)
        else:
            if self.ddp_world is not None and self.micro < self.accumulate:
                # a group cut short by the end of the epoch ran all its batches in no_sync
                for p in self.model.parameters():
                    if p.grad is not None:
                        torch.distributed.all_reduce(p.grad)
                        p.grad.div_(self.ddp_world)
            loss, tokens = self._loss / at_least_one(self._tokens), self._tokens  # type: ignore[operator]
            # one batch per step under DDP: n_ref is the ranks' mean count, so the divisor is 1
            skipped = self._optimizer_step(self._tokens if self.accumulate > 1 else None)
            self.micro = 0
        return StepResult(loss, tokens, skipped)  # type: ignore[arg-type]

    def _divisor(self, group_tokens: int | torch.Tensor) -> float | torch.Tensor:
        """What the summed gradients of a group are divided by: its token count in units of
        ``n_ref``; under DDP the same number on every rank, the global group's tokens over
        ``n_ref`` times the world size (DDP averages the ranks' sums)."""
        if self.ddp_world is None:
            return at_least_one(group_tokens) / self._n_ref
        total = torch.as_tensor(group_tokens, device=self.device).to(torch.float64).reshape(1)
        torch.distributed.all_reduce(total)
        return total[0].clamp(min=1) / (self._n_ref * self.ddp_world)

    def _optimizer_step(self, group_tokens: int | torch.Tensor | None) -> torch.Tensor | None:
        scaler = self.scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        if group_tokens is not None:
            divisor = self._divisor(group_tokens)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(divisor)
        if self.clip_norm is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        skipped = None
        if scaler is None:
            self.optimizer.step()
        else:
            # the scaler lowers its scale (x backoff_factor, 0.5) exactly when it skipped the step because
            # the gradients held an inf or a NaN; compared on the device, read with the losses
            scale_before = scale_on_device(scaler).clone()
            scaler.step(self.optimizer)
            scaler.update()
            skipped = scale_on_device(scaler) < scale_before
        if self.scheduler is not None:
            self.scheduler.step()
        self.steps += 1
        return skipped

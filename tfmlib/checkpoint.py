"""The checkpoint file format: a model, its optimizer, vocabularies and config in one file, written
atomically and read safely.

Introduced in chapter 01 (``tfmlib.train`` re-exports these names, which chapters 01-03 and 08 import
from there); :mod:`tfmlib.resume` (chapter 10) writes its training states with the same helpers.

A checkpoint is written to a temporary file in the target's folder and moved into place with
``os.replace``, so a reader never sees half of one and a failed write leaves the older file intact;
it is read back with ``torch.load(..., weights_only=True)``, so loading one never runs code from the
file. A missing, truncated or foreign file, or one that does not fit the model, is a
:class:`CheckpointError` that names the file and what is wrong.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfmlib.data import Vocab

INTRODUCED_IN = 1

__all__ = ["CHECKPOINT_FORMAT", "WRAPPER_PREFIXES", "Checkpoint", "CheckpointError", "checkpoint_dir",
           "is_rank_zero", "load_checkpoint", "read_safely", "save_checkpoint", "state_mismatch",
           "strip_wrapper_prefixes", "unwrap_model", "write_atomically"]

# what torch.compile's wrapper and DistributedDataParallel (or DataParallel) put before every name of
# the state_dict of the model they wrap
WRAPPER_PREFIXES = ("_orig_mod.", "module.")
# the class names an older file saved from a wrapped model records instead of the model's
WRAPPER_CLASSES = ("OptimizedModule", "DistributedDataParallel", "DataParallel")

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


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside ``torch.compile``'s wrapper (its ``_orig_mod``) and
    ``DistributedDataParallel``'s or ``DataParallel``'s (their ``module``), however nested; ``model``
    itself when it is not wrapped. The wrappers share the inner model's parameters, and their own
    ``state_dict`` names them with a prefix (``_orig_mod.``, ``module.``) that a plain model lacks:
    checkpoints hold the inner model's names, so that any of them can be resumed by any other."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
        elif isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        else:
            return model


def strip_wrapper_prefixes(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` (a ``state_dict``) with the wrappers' prefixes removed: while every name starts with
    ``_orig_mod.`` or ``module.``, that prefix is dropped (a file saved from a wrapped model before
    checkpoints held the inner names). The ``_metadata`` that ``load_state_dict`` reads is kept."""
    out: OrderedDict[str, Any] = OrderedDict(state)
    metadata = getattr(state, "_metadata", None)
    stripped = True
    while out and stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in out):
                out = OrderedDict((k[len(prefix):], v) for k, v in out.items())
                if metadata is not None:  # its names are module paths: "module" -> "", "module.x" -> "x"
                    metadata = OrderedDict((_strip_module_path(k, prefix), v) for k, v in metadata.items())
                stripped = True
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]
    return out


def _strip_module_path(name: str, prefix: str) -> str:
    if name == prefix[:-1]:
        return ""
    return name[len(prefix):] if name.startswith(prefix) else name


def is_rank_zero() -> bool:
    """True in a plain process and on rank 0 of a running process group: the process that writes
    files every rank would write alike."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
        torch.distributed.get_rank() == 0


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
    :func:`load_checkpoint` maps them to ``map_location`` (the CPU by default).

    A model inside ``torch.compile``'s or ``DistributedDataParallel``'s wrapper is saved as the model
    it wraps (:func:`unwrap_model`: its class, its parameter names without ``_orig_mod.`` or
    ``module.``), so the file loads into the plain model, a compiled one or a wrapped one. Under a
    running process group only rank 0 writes (the ranks of DDP hold the same weights); the other
    ranks return ``path`` at once, without waiting."""
    config = dict(config or {})
    _check_plain(config, "config")
    for name, v in (vocabs or {}).items():
        if not isinstance(v, Vocab):
            raise TypeError(f"save_checkpoint: vocabs[{name!r}] must be a Vocab, got {type(v).__name__}")
    model = unwrap_model(model)
    if not is_rank_zero():
        return Path(path)
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

    ``model`` may be wrapped by ``torch.compile`` or ``DistributedDataParallel``: the state is loaded
    into the model inside (:func:`unwrap_model`); a file saved from a wrapped model by an older
    version, with the wrappers' prefixes in its names, loads too (:func:`strip_wrapper_prefixes`).

    Raises :class:`CheckpointError` when the file is missing, unreadable or not a tfmlib
    checkpoint, when it was saved from another model class, or when parameter names or shapes
    differ from ``model``'s (the message lists them).
    """
    path = Path(path)
    model = unwrap_model(model) if model is not None else None
    payload = read_safely(path, "checkpoint", map_location)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a {CHECKPOINT_FORMAT} file")
    try:
        ckpt = Checkpoint(
            model_class=payload["model_class"],
            model_state=strip_wrapper_prefixes(payload["model"]),
            optimizer_state=payload["optimizer"],
            vocabs={name: Vocab.from_dict(d) for name, d in payload["vocabs"].items()},
            config=payload["config"],
        )
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} is a damaged {CHECKPOINT_FORMAT} file "
                              f"({type(e).__name__}: {e})") from e
    if model is not None:
        if type(model).__name__ != ckpt.model_class and ckpt.model_class not in WRAPPER_CLASSES:
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

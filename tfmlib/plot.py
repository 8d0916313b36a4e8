"""Figures the book draws again and again: loss curves and labelled heatmaps.

Introduced in chapter 00 (preface). Every function draws on ``ax`` (a new figure when ``None``),
always sets a title and axis labels, and returns the Axes so a cell can add to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
import torch

if TYPE_CHECKING:  # avoid importing the training module (chapter 01) at run time
    from tfmlib.train import History

INTRODUCED_IN = 0


def _axes(ax: plt.Axes | None, figsize: tuple[float, float]) -> plt.Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_curves(
    curves: Mapping[str, Sequence[float]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ax: plt.Axes | None = None,
    logy: bool = False,
    x: Sequence[float] | None = None,
    smooth: int = 1,
) -> plt.Axes:
    """One line per named curve: each a 1-D sequence (list, array or tensor) of ``n`` values.

    ``x`` gives the positions of the points (at least ``n`` of them; ``1..n`` when ``None``).
    ``smooth`` > 1 draws a trailing moving average over that many points, each average drawn at
    the position of the last point of its window (so a smoothed curve stays aligned with ``x``).
    """
    if not curves:
        raise ValueError("plot_curves: no curves given")
    if not isinstance(smooth, int) or isinstance(smooth, bool) or smooth < 1:
        raise ValueError(f"plot_curves: smooth must be an int >= 1, got {smooth!r}")
    ax = _axes(ax, (6, 3.5))
    for name, ys in curves.items():
        if isinstance(ys, torch.Tensor):
            ys = ys.detach().float().cpu().numpy()
        ys = np.asarray(ys, dtype=float)
        if ys.ndim != 1 or len(ys) == 0:
            raise ValueError(f"plot_curves: curve {name!r} must be a non-empty 1-D sequence, "
                             f"got shape {ys.shape}")
        xs = np.asarray(x, dtype=float) if x is not None else np.arange(1, len(ys) + 1)
        if xs.ndim != 1 or len(xs) < len(ys):
            raise ValueError(f"plot_curves: x has shape {xs.shape}, curve {name!r} has {len(ys)} "
                             "points: give x one position per point")
        xs = xs[: len(ys)]
        if smooth > 1 and len(ys) >= smooth:
            ys = np.convolve(ys, np.ones(smooth) / smooth, mode="valid")
            xs = xs[smooth - 1:]  # the average of points i-smooth+1..i is drawn at point i
        ax.plot(xs, ys, label=name, marker="o" if len(ys) <= 20 else None)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend()
    return ax


def plot_history(history: History, *, title: str, ax: plt.Axes | None = None,
                 smooth: int = 20) -> plt.Axes:
    """Training loss per step (smoothed) and, when recorded, validation loss per epoch."""
    if not history.step_loss:
        raise ValueError("plot_history: the history has no steps")
    ax = _axes(ax, (6, 3.5))
    plot_curves({"train (per step)": history.step_loss}, title=title, xlabel="optimisation step",
                ylabel="loss (nats per token)", ax=ax, smooth=smooth)
    if history.epochs and all("valid_loss" in e for e in history.epochs):
        steps_per_epoch = len(history.step_loss) / len(history.epochs)
        xs = [steps_per_epoch * e["epoch"] for e in history.epochs]
        ax.plot(xs, history.metric("valid_loss"), "o-", label="valid (per epoch)")
        ax.legend()
    return ax


def plot_heatmap(
    matrix: Any,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    ax: plt.Axes | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar: bool = True,
) -> plt.Axes:
    """A 2-D array (rows = y, columns = x) as an image with token labels on the axes.

    Used for attention weights (rows: output positions, columns: input positions) and for gate
    activations. ``matrix`` may be a tensor or an array of shape ``(rows, cols)``.
    """
    if isinstance(matrix, torch.Tensor):
        matrix = matrix.detach().float().cpu().numpy()
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or 0 in m.shape:
        raise ValueError(f"plot_heatmap: matrix must be 2-D and non-empty, got shape {m.shape}")
    if x_labels is not None and len(x_labels) != m.shape[1]:
        raise ValueError(f"plot_heatmap: {len(x_labels)} x_labels for {m.shape[1]} columns")
    if y_labels is not None and len(y_labels) != m.shape[0]:
        raise ValueError(f"plot_heatmap: {len(y_labels)} y_labels for {m.shape[0]} rows")
    ax = _axes(ax, (max(4.0, 0.45 * m.shape[1] + 2), max(3.0, 0.35 * m.shape[0] + 1.5)))
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    if x_labels is not None:
        ax.set_xticks(range(m.shape[1]), x_labels, rotation=60, ha="right")
    if y_labels is not None:
        ax.set_yticks(range(m.shape[0]), y_labels)
    if annotate:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if m[i, j] < (np.nanmax(m) + np.nanmin(m)) / 2 else "black")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return ax


def plot_bleu_by_length(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    title: str,
    metric: str = "bleu",
    ylabel: str = "BLEU",
    ax: plt.Axes | None = None,
) -> plt.Axes:
    """BLEU (or another per-bucket ``metric``) against source-length bucket, one line per model.

    ``results`` maps a model's name to the rows of :func:`tfmlib.metrics.bleu_by_length`: dicts
    with ``bucket`` (a label such as ``"11-17"``), ``n`` and ``metric``. All models must share
    the same buckets. The x-axis labels give each bucket's sentence count.
    """
    if not results:
        raise ValueError("plot_bleu_by_length: no results given")
    buckets = None
    ax = _axes(ax, (6, 3.5))
    for name, rows in results.items():
        if not rows or any("bucket" not in r or metric not in r for r in rows):
            raise ValueError(f"plot_bleu_by_length: the rows of {name!r} need 'bucket' and {metric!r}")
        labels = [r["bucket"] for r in rows]
        if buckets is None:
            buckets = labels
            counts = [r.get("n") for r in rows]
        elif labels != buckets:
            raise ValueError(f"plot_bleu_by_length: {name!r} has buckets {labels}, expected {buckets}")
        ax.plot(range(len(rows)), [r[metric] for r in rows], "o-", label=name)
    ax.set_xticks(range(len(buckets)),
                  [f"{b}\n(n={n})" if n is not None else b for b, n in zip(buckets, counts, strict=False)])
    ax.set(title=title, xlabel="source length (tokens)", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    return ax

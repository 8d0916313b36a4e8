"""Figures the book draws again and again, on seaborn: one theme, curves, heatmaps, spreads, bars.

Introduced in chapter 00 (preface). :func:`book_theme` sets the book's one look (``setup()`` calls
it). Every plotting function draws on ``ax`` (a new figure when ``None``), always sets a title and
axis labels, and returns the Axes so a cell can add to it.

- :func:`plot_curves`, :func:`plot_history`: one line per named curve (losses, norms, timings).
- :func:`plot_heatmap`: a matrix with token labels (attention weights, gates, masks).
- :func:`plot_over_seeds`: results of several seeds, their median (or mean) and their spread.
- :func:`plot_grouped_bars`, :func:`plot_bleu_by_length`: one bar per model within each group.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.patches import Rectangle
from seaborn.utils import axis_ticklabels_overlap

if TYPE_CHECKING:  # avoid importing the training module (chapter 01) at run time
    from tfmlib.train import History

INTRODUCED_IN = 0

#: The book's seaborn theme: sized for a ~800 px text column (a 6-inch figure is drawn at
#: 600 px, a 13-inch row of panels shrinks to ~0.6 of its size and keeps ~10 px text), a
#: colour-blind-safe palette, a light grid behind the data, no top and right spines.
BOOK_THEME: dict[str, Any] = dict(
    context="notebook", style="whitegrid", palette="colorblind", font_scale=1.0,
    rc={"figure.dpi": 100, "savefig.dpi": 100, "grid.color": "0.92", "grid.linewidth": 0.8,
        "axes.spines.top": False, "axes.spines.right": False, "axes.titlesize": 12,
        "legend.fontsize": 10, "legend.title_fontsize": 10,
        "legend.framealpha": 0.85, "image.cmap": "viridis", "lines.markersize": 5},
)

_MAX_FAINT_SEEDS = 10  # plot_over_seeds draws each seed faintly up to this many seeds


def book_theme() -> None:
    """Set the book's one seaborn theme (:data:`BOOK_THEME`) on matplotlib's rcParams.

    Idempotent: calling it again gives the same rcParams, whatever a cell changed in between
    among the settings the theme names. ``tfmlib.config.setup()`` calls it.
    """
    sns.set_theme(**BOOK_THEME)


def _axes(ax: plt.Axes | None, figsize: tuple[float, float]) -> plt.Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def _as_array(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=float)


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
    Curves with at most 20 points get a marker at each point. Colours follow the theme's palette.
    """
    if not curves:
        raise ValueError("plot_curves: no curves given")
    if not isinstance(smooth, int) or isinstance(smooth, bool) or smooth < 1:
        raise ValueError(f"plot_curves: smooth must be an int >= 1, got {smooth!r}")
    ax = _axes(ax, (6, 3.5))
    for name, ys in curves.items():
        ys = _as_array(ys)
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
        ax.plot(xs, ys, label=name, marker="o" if len(ys) <= 20 else None, lw=1.6)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(curves) > 1:
        ax.legend()
    return ax


def plot_history(history: History, *, title: str, ax: plt.Axes | None = None,
                 smooth: int = 20) -> plt.Axes:
    """Training loss per step and, when recorded, validation loss per epoch.

    The training curve is a trailing average over ``smooth`` steps, each step weighted by its
    tokens (``history.step_tokens``), the way the epoch's ``train_loss`` and a validation loss
    are averaged: with length-bucketed batches, an unweighted average gives the many short
    batches the weight of the few long ones, and a curve that sits apart from the validation loss
    for that reason alone. A history without token counts (from an older ``to_dict``) is averaged
    unweighted, and the legend says so.
    """
    if not history.step_loss:
        raise ValueError("plot_history: the history has no steps")
    if not isinstance(smooth, int) or isinstance(smooth, bool) or smooth < 1:
        raise ValueError(f"plot_history: smooth must be an int >= 1, got {smooth!r}")
    ax = _axes(ax, (6, 3.5))
    losses = np.asarray(history.step_loss, dtype=float)
    weighted = len(history.step_tokens) == len(losses)
    weights = np.asarray(history.step_tokens, dtype=float) if weighted else np.ones_like(losses)
    window = min(smooth, len(losses))
    kernel = np.ones(window)
    curve = np.convolve(losses * weights, kernel, mode="valid") / np.convolve(weights, kernel, mode="valid")
    label = ("train (token-weighted" if weighted else "train (unweighted") + \
        (f", last {window} steps)" if window > 1 else ")")
    plot_curves({label: curve}, title=title, xlabel="optimisation step", ylabel="loss (nats per token)",
                ax=ax, x=np.arange(window, len(losses) + 1))
    if history.epochs and all("valid_loss" in e for e in history.epochs):
        steps_per_epoch = len(history.step_loss) / len(history.epochs)
        xs = [steps_per_epoch * e["epoch"] for e in history.epochs]
        ax.plot(xs, history.metric("valid_loss"), "o-", label="valid (per epoch)", lw=1.6)
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
    fmt: str = ".2f",
    cbar_label: str | None = None,
    mask: Any = None,
    center: float | None = None,
) -> plt.Axes:
    """A 2-D array (rows = y, columns = x) as a heatmap (``sns.heatmap``) with token labels.

    Used for attention weights (rows: output positions, columns: input positions), masks and gate
    activations. ``matrix`` may be a tensor or an array of shape ``(rows, cols)``; ``x_labels``
    (``cols`` of them) and ``y_labels`` (``rows``) label every column and row, integer positions
    are shown when they are ``None``. ``annotate`` writes each cell's value with format ``fmt``.
    Give side-by-side panels the same ``vmin``/``vmax`` so that one colour means one value in
    all of them; ``center`` centres a diverging ``cmap`` (e.g. ``"RdBu"``) on a value.
    ``mask`` (bool, shape ``(rows, cols)``, True = hidden) and non-finite entries (NaN, -inf, as
    in masked scores) are drawn as grey hatched cells, outside the colour scale.
    """
    m = _as_array(matrix)
    if m.ndim != 2 or 0 in m.shape:
        raise ValueError(f"plot_heatmap: matrix must be 2-D and non-empty, got shape {m.shape}")
    if x_labels is not None and len(x_labels) != m.shape[1]:
        raise ValueError(f"plot_heatmap: {len(x_labels)} x_labels for {m.shape[1]} columns")
    if y_labels is not None and len(y_labels) != m.shape[0]:
        raise ValueError(f"plot_heatmap: {len(y_labels)} y_labels for {m.shape[0]} rows")
    hidden = ~np.isfinite(m)
    if mask is not None:
        mask_array = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
        if mask_array.shape != m.shape:
            raise ValueError(f"plot_heatmap: mask has shape {mask_array.shape}, the matrix {m.shape}")
        hidden |= mask_array.astype(bool)
    if hidden.all():
        raise ValueError("plot_heatmap: every cell is masked or non-finite: nothing to draw")
    ax = _axes(ax, (max(4.0, 0.45 * m.shape[1] + 2), max(3.0, 0.35 * m.shape[0] + 1.5)))
    if hidden.any():  # masked cells show this hatched rectangle, which lies under the cells drawn
        ax.add_patch(Rectangle((0, 0), m.shape[1], m.shape[0], facecolor="0.93", edgecolor="0.65",
                               hatch="///", lw=0, zorder=0))
    cbar_kws: dict[str, Any] = {"fraction": 0.046, "pad": 0.04}
    if cbar_label is not None:
        cbar_kws["label"] = cbar_label
    sns.heatmap(np.where(hidden, np.nan, m), mask=hidden, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax,
                center=center, annot=annotate, fmt=fmt, cbar=colorbar, cbar_kws=cbar_kws,
                annot_kws={"fontsize": 8 if max(m.shape) > 8 else 9},
                xticklabels=list(x_labels) if x_labels is not None else "auto",
                yticklabels=list(y_labels) if y_labels is not None else "auto")
    ax.grid(False)
    for spine in ax.spines.values():  # a thin frame, so white cells do not melt into the page
        spine.set(visible=True, color="0.75", linewidth=0.8)
    if x_labels is not None and max(len(str(s)) for s in x_labels) > 2:  # words: slanted
        plt.setp(ax.get_xticklabels(), rotation=60, ha="right", rotation_mode="anchor")
    else:  # positions and short tokens stay level unless they would overlap
        plt.setp(ax.get_xticklabels(), rotation=0)
        if axis_ticklabels_overlap(ax.get_xticklabels()):
            plt.setp(ax.get_xticklabels(), rotation=90)
    plt.setp(ax.get_yticklabels(), rotation=0)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return ax


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _curves_by_x(name: str, curves: Any, x: Sequence[float] | None, smooth: int) -> dict[float, np.ndarray]:
    """A ``(seeds, points)`` array as ``{x: the seeds' values at x}``, smoothed along the points."""
    arr = _as_array(curves)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"plot_over_seeds: results[{name!r}] must be a mapping {{x: values}} or a "
                         f"non-empty 2-D (seeds, points) array, got shape {arr.shape}")
    xs = np.asarray(x, dtype=float) if x is not None else np.arange(1, arr.shape[1] + 1, dtype=float)
    if xs.ndim != 1 or len(xs) < arr.shape[1]:
        raise ValueError(f"plot_over_seeds: x has shape {xs.shape}, results[{name!r}] has "
                         f"{arr.shape[1]} points per seed: give x one position per point")
    xs = xs[: arr.shape[1]]
    if smooth > 1 and arr.shape[1] >= smooth:
        arr = np.stack([np.convolve(row, np.ones(smooth) / smooth, mode="valid") for row in arr])
        xs = xs[smooth - 1:]  # the average of points i-smooth+1..i is drawn at point i
    return {float(xv): arr[:, i] for i, xv in enumerate(xs)}


def plot_over_seeds(
    results: Mapping[str, Mapping[Any, Sequence[float]] | Any],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ax: plt.Axes | None = None,
    estimator: str = "median",
    spread: str = "range",
    show_seeds: bool | None = None,
    logy: bool = False,
    x: Sequence[float] | None = None,
    smooth: int = 1,
    colors: Mapping[str, Any] | None = None,
) -> plt.Axes:
    """Results of several seeds per point: a line through their ``estimator``, and their spread.

    ``results`` maps a model's name to ``{x: values}``, one value per seed (list, array or
    tensor), e.g. ``{"pre-LN": {6: [0.91, 0.88, 0.93], 12: [...]}, "post-LN": {...}}``; seed ``i``
    is the ``i``-th value at every ``x``. A model's results may also be one 2-D array (or
    tensor) of shape ``(seeds, points)``, e.g. a loss curve per seed: the points are then drawn
    at ``x`` (``1..points`` when ``None``), after a trailing moving average over ``smooth``
    points of each seed's curve (as in :func:`plot_curves`).

    ``estimator`` is ``"median"`` or ``"mean"``. ``spread`` is ``"range"`` (min to max of the
    seeds), ``"sd"`` (the estimate plus and minus the seeds' standard deviation, ``ddof=1``) or
    ``"ci"`` (a 95% bootstrap interval of the estimator, seeded, so it repeats). Numeric ``x``
    give a line with a shaded band (``sns.lineplot``); other ``x`` (names, configurations) are
    placed in their given order with error bars and no connecting line, models side by side.
    Each seed is also drawn faintly (lines labelled
    ``"_seed i of name"``) when ``show_seeds`` (default: when there are at most 10 seeds).
    ``colors`` gives some models a colour of their own (any matplotlib colour, e.g. ``"0.4"`` for a
    baseline in grey); the others take the palette's colours in order.
    """
    if not results:
        raise ValueError("plot_over_seeds: results is empty: give {model: {x: [one value per seed]}}")
    estimators = {"median": np.median, "mean": np.mean}
    if estimator not in estimators:
        raise ValueError(f"plot_over_seeds: estimator must be one of {sorted(estimators)}, got {estimator!r}")
    errorbars = {"range": ("pi", 100), "sd": "sd", "ci": ("ci", 95)}
    if spread not in errorbars:
        raise ValueError(f"plot_over_seeds: spread must be one of {sorted(errorbars)}, got {spread!r}")
    if not isinstance(smooth, int) or isinstance(smooth, bool) or smooth < 1:
        raise ValueError(f"plot_over_seeds: smooth must be an int >= 1, got {smooth!r}")
    rows, xs_all = [], []
    for name, per_x in results.items():
        if not isinstance(per_x, Mapping):
            per_x = _curves_by_x(name, per_x, x, smooth)
        if not per_x:
            raise ValueError(f"plot_over_seeds: results[{name!r}] must be a non-empty mapping "
                             "{x: [one value per seed]} or a (seeds, points) array")
        for xv, values in per_x.items():
            vals = _as_array(values).reshape(-1) if not _is_number(values) else np.array([float(values)])
            if len(vals) == 0:
                raise ValueError(f"plot_over_seeds: results[{name!r}][{xv!r}] has no values")
            rows += [{"model": name, "x": xv, "seed": i, "value": v} for i, v in enumerate(vals)]
            if xv not in xs_all:
                xs_all.append(xv)
    data = pd.DataFrame(rows)
    names = list(results)
    colours = dict(zip(names, sns.color_palette(n_colors=len(names)), strict=True))
    if colors:
        unknown = [n for n in colors if n not in colours]
        if unknown:
            raise ValueError(f"plot_over_seeds: colors names {unknown}, which are not in results {names}")
        colours |= dict(colors)
    numeric = all(_is_number(xv) for xv in xs_all)
    if show_seeds is None:
        show_seeds = data["seed"].max() + 1 <= _MAX_FAINT_SEEDS
    few_points = len(xs_all) <= 20  # markers on the points only when they can be told apart
    ax = _axes(ax, (6, 3.5))
    if numeric:
        data["pos"] = data["x"].astype(float)
    else:  # categories in their given order, models side by side within each
        width = 0.5 if len(names) > 1 else 0.0
        offsets = {n: (i / max(1, len(names) - 1) - 0.5) * width for i, n in enumerate(names)}
        data["pos"] = [xs_all.index(xv) + offsets[n] for xv, n in zip(data["x"], data["model"], strict=True)]
    sns.lineplot(data=data, x="pos", y="value", hue="model", hue_order=names, palette=colours,
                 estimator=estimators[estimator], errorbar=errorbars[spread], n_boot=1000, seed=0,
                 err_style="band" if numeric else "bars", marker="o" if few_points or not numeric else None,
                 sort=True, ax=ax,
                 legend=len(names) > 1, linestyle="-" if numeric else "none",
                 err_kws={"alpha": 0.2} if numeric else {"capsize": 4, "elinewidth": 1.5})
    if show_seeds:
        for (name, seed), seed_rows in data.sort_values("pos").groupby(["model", "seed"], sort=False):
            style = "-" if numeric and len(seed_rows) > 1 else "none"
            ax.plot(seed_rows["pos"], seed_rows["value"], linestyle=style,
                    marker="." if few_points or not numeric else None, lw=0.8,
                    alpha=0.35, color=colours[name], zorder=1, label=f"_seed {seed} of {name}")
    if not numeric:
        ax.xaxis.grid(False)
        ax.set_xticks(range(len(xs_all)), [str(xv) for xv in xs_all])
        ax.set_xlim(-0.6, len(xs_all) - 0.4)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(names) > 1:
        ax.legend(title=None)
    return ax


def plot_grouped_bars(
    values: Mapping[str, Mapping[str, float | Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ax: plt.Axes | None = None,
    label_bars: bool | None = None,
    fmt: str = "{:.1f}",
) -> plt.Axes:
    """Grouped bars (``sns.barplot``): a group per x category, one bar (and colour) per series.

    ``values`` maps a series' name (a model) to ``{group: value}``; every series must give the
    same groups, in the same order (the order on the x-axis). A value may also be several numbers
    (one per seed): the bar is then their median and a black bar shows their range. With
    ``label_bars`` (default: when every value is one number) each bar carries its value written
    with ``fmt``.
    """
    if not values:
        raise ValueError("plot_grouped_bars: values is empty: give {series: {group: value}}")
    groups: list[str] | None = None
    rows = []
    for name, per_group in values.items():
        if not isinstance(per_group, Mapping) or not per_group:
            raise ValueError(f"plot_grouped_bars: values[{name!r}] must be a non-empty mapping "
                             "{group: value}")
        if groups is None:
            groups = list(per_group)
        elif list(per_group) != groups:
            raise ValueError(f"plot_grouped_bars: values[{name!r}] has groups {list(per_group)}, "
                             f"expected {groups}")
        for group, v in per_group.items():
            vals = np.array([float(v)]) if _is_number(v) else _as_array(v).reshape(-1)
            if len(vals) == 0:
                raise ValueError(f"plot_grouped_bars: values[{name!r}][{group!r}] has no values")
            rows += [{"series": name, "group": str(group), "value": x} for x in vals]
    data = pd.DataFrame(rows)
    several = data.groupby(["series", "group"]).size().max() > 1
    ax = _axes(ax, (max(6.0, 1.2 * len(groups) + 0.4 * len(values) + 2), 3.5))
    sns.barplot(data=data, x="group", y="value", hue="series", order=[str(g) for g in groups],
                hue_order=list(values), estimator=np.median, errorbar=("pi", 100) if several else None,
                err_kws={"linewidth": 1.2, "color": "0.15"}, capsize=0.15 if several else 0,
                ax=ax, legend=len(values) > 1, saturation=0.9)
    if label_bars is None:
        label_bars = not several
    if label_bars:
        for container in ax.containers:
            ax.bar_label(container, fmt=fmt, fontsize=8, padding=2)
        ax.margins(y=0.12)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(values) > 1:
        ax.legend(title=None)
    return ax


def plot_bleu_by_length(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    title: str,
    metric: str = "bleu",
    ylabel: str = "BLEU",
    ax: plt.Axes | None = None,
) -> plt.Axes:
    """BLEU (or another per-bucket ``metric``) per source-length bucket: grouped bars, a colour per model.

    ``results`` maps a model's name to the rows of :func:`tfmlib.metrics.bleu_by_length`: dicts
    with ``bucket`` (a label such as ``"11-17"``), ``n`` and ``metric``. All models must share
    the same buckets. The x-axis labels give each bucket's sentence count; each bar its value.
    """
    if not results:
        raise ValueError("plot_bleu_by_length: no results given")
    buckets = counts = None
    values: dict[str, dict[str, float]] = {}
    for name, rows in results.items():
        if not rows or any("bucket" not in r or metric not in r for r in rows):
            raise ValueError(f"plot_bleu_by_length: the rows of {name!r} need 'bucket' and {metric!r}")
        labels = [r["bucket"] for r in rows]
        if buckets is None:
            buckets, counts = labels, [r.get("n") for r in rows]
        elif labels != buckets:
            raise ValueError(f"plot_bleu_by_length: {name!r} has buckets {labels}, expected {buckets}")
        ticks = [f"{b}\n(n={n})" if n is not None else str(b) for b, n in zip(buckets, counts, strict=True)]
        values[name] = {t: float(r[metric]) for t, r in zip(ticks, rows, strict=True)}
    return plot_grouped_bars(values, title=title, xlabel="source length (tokens)", ylabel=ylabel, ax=ax)


import matplotlib

matplotlib.use("Agg")
import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402

from tfmlib.plot import (  # noqa: E402
    BOOK_THEME,
    book_theme,
    plot_bleu_by_length,
    plot_curves,
    plot_grouped_bars,
    plot_heatmap,
    plot_history,
    plot_over_seeds,
)
from tfmlib.train import History, fit  # noqa: E402

KW = dict(title="t", xlabel="x", ylabel="y")


@pytest.fixture(autouse=True)
def _restore_rc_and_close():
    """The theme changes global rcParams: give them back so other test files see the defaults."""
    with mpl.rc_context():
        yield
    plt.close("all")


def _labels(ax):
    return ax.get_title(), ax.get_xlabel(), ax.get_ylabel()


def _seed_lines(ax):
    return [line for line in ax.lines if line.get_label().startswith("_seed ")]


def _bars(ax):
    return [bar for container in ax.containers for bar in container]


# --- the theme ----------------------------------------------------------------------------------

def test_book_theme_sets_palette_grid_and_sizes_and_is_idempotent():
    mpl.rcdefaults()
    book_theme()
    colours = [mpl.colors.to_hex(c) for c in mpl.rcParams["axes.prop_cycle"].by_key()["color"]]
    assert colours == sns.color_palette("colorblind").as_hex(), "palette is not seaborn's colorblind"
    assert mpl.rcParams["axes.grid"] is True, "whitegrid style should draw a grid"
    assert mpl.rcParams["grid.color"] == BOOK_THEME["rc"]["grid.color"], "grid is not the light grey"
    assert mpl.rcParams["font.size"] == 12, "notebook context should give 12 pt text"
    assert not mpl.rcParams["axes.spines.top"], "top spine should be off"
    first = dict(mpl.rcParams)
    mpl.rcParams["font.size"] = 30
    mpl.rcParams["axes.grid"] = False
    book_theme()
    assert dict(mpl.rcParams) == first, "book_theme() a second time changed rcParams"
    ax = plot_curves({"a": [1, 2], "b": [2, 1]}, **KW)
    assert mpl.colors.to_hex(ax.lines[1].get_color()) == colours[1], "curves do not follow the palette"


# --- curves and history -------------------------------------------------------------------------

def test_curves_and_history():
    ax = plot_curves({"rnn": [3, 2, 1], "gru": [3, 1, 0.5]}, title="t", xlabel="x", ylabel="y",
                     logy=True)
    assert len(ax.lines) == 2 and ax.get_yscale() == "log" and ax.get_legend() is not None
    assert _labels(ax) == ("t", "x", "y")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rnn", "gru"]
    ax = plot_curves({"a": list(range(100))}, title="t", xlabel="x", ylabel="y", smooth=10)
    assert len(ax.lines[0].get_ydata()) == 91
    assert ax.get_legend() is None, "one curve needs no legend"
    h = History(step_loss=[3.0, 2.0, 1.5, 1.0], epochs=[
        {"epoch": 1, "train_loss": 2.5, "seconds": 1.0, "valid_loss": 2.0},
        {"epoch": 2, "train_loss": 1.2, "seconds": 1.0, "valid_loss": 1.4}])
    ax = plot_history(h, title="loss", smooth=1)
    assert len(ax.lines) == 2 and ax.get_xlabel() == "optimisation step"
    assert list(ax.lines[1].get_xdata()) == [2.0, 4.0] and list(ax.lines[1].get_ydata()) == [2.0, 1.4]
    assert _labels(ax) == ("loss", "optimisation step", "loss (nats per token)")
    with pytest.raises(ValueError, match="no curves"):
        plot_curves({}, title="t", xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="no steps"):
        plot_history(History(), title="t")


def test_smoothed_curve_stays_aligned_with_x():
    """A moving average over points i-k+1..i is drawn at point i, not shifted to the left."""
    ys = [float(v) for v in range(10)]
    line = plot_curves({"a": ys}, title="t", xlabel="x", ylabel="y", smooth=3).lines[0]
    assert list(line.get_xdata()) == list(range(3, 11))        # default x: 1..10
    assert list(line.get_ydata()) == pytest.approx([1.0 + i for i in range(8)])  # mean of i..i+2
    line = plot_curves({"a": ys}, x=[10 * i for i in range(10)], title="t", xlabel="x", ylabel="y",
                       smooth=3).lines[0]
    assert list(line.get_xdata()) == [10 * i for i in range(2, 10)]
    line = plot_curves({"a": torch.arange(4.0)}, title="t", xlabel="x", ylabel="y").lines[0]
    assert list(line.get_ydata()) == [0.0, 1.0, 2.0, 3.0]  # a tensor is a curve too


def test_curves_and_heatmap_bad_input():
    with pytest.raises(ValueError, match="smooth must be an int >= 1, got 0"):
        plot_curves({"a": [1, 2]}, smooth=0, **KW)
    with pytest.raises(ValueError, match=r"x has shape \(2,\), curve 'a' has 3 points"):
        plot_curves({"a": [1, 2, 3]}, x=[0, 1], **KW)
    with pytest.raises(ValueError, match=r"curve 'a' must be a non-empty 1-D sequence, got shape \(0,\)"):
        plot_curves({"a": []}, **KW)
    with pytest.raises(ValueError, match=r"non-empty, got shape \(0, 3\)"):
        plot_heatmap(torch.rand(0, 3), **KW)


# --- heatmaps -----------------------------------------------------------------------------------

def test_heatmap_labels_title_cells_and_colour_scale():
    m = torch.rand(2, 3)
    ax = plot_heatmap(m, x_labels=["le", "chat", "."], y_labels=["the", "cat"],
                      title="weights", xlabel="source", ylabel="target", vmin=0, vmax=1,
                      cbar_label="attention weight")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["le", "chat", "."]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["the", "cat"]
    assert _labels(ax) == ("weights", "source", "target")
    mesh = ax.collections[0]
    assert mesh.get_array().size == 6, "one cell per matrix entry"
    cells = np.asarray(mesh.get_array()).reshape(2, 3)
    assert np.allclose(cells, m.numpy()), "cells hold the matrix, rows = y"
    assert mesh.get_clim() == (0, 1), "vmin/vmax fix the shared colour scale"
    colorbars = [a for a in ax.figure.axes if a is not ax]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "attention weight"
    assert len(ax.texts) == 0, "no annotations unless asked"
    assert ax.get_xticklabels()[1].get_rotation() == 60, "word labels are slanted"
    assert all(spine.get_visible() for spine in ax.spines.values()), "a heatmap keeps a frame"
    ax = plot_heatmap(torch.rand(2, 3), **KW)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"], "no labels: positions"
    assert ax.get_xticklabels()[0].get_rotation() == 0, "few positions stay level"


def test_heatmap_annotations_and_no_colorbar():
    m = np.array([[0.125, 0.5], [0.25, 0.75]])
    ax = plot_heatmap(m, annotate=True, fmt=".1%", colorbar=False, **KW)
    assert sorted(t.get_text() for t in ax.texts) == ["12.5%", "25.0%", "50.0%", "75.0%"]
    assert ax.figure.axes == [ax], "colorbar=False draws no colour bar"
    ax = plot_heatmap(m, annotate=True, **KW)
    assert sorted(t.get_text() for t in ax.texts) == ["0.12", "0.25", "0.50", "0.75"]


def test_heatmap_masked_and_non_finite_cells_are_hatched_not_coloured():
    scores = torch.tensor([[1.0, float("-inf")], [0.5, 2.0]])
    mask = torch.tensor([[False, False], [True, False]])
    ax = plot_heatmap(scores, mask=mask, annotate=True, **KW)
    cells = np.ma.getmaskarray(ax.collections[0].get_array()).reshape(2, 2)
    assert cells.tolist() == [[False, True], [True, False]], "the -inf cell and the masked cell are hidden"
    assert sorted(t.get_text() for t in ax.texts) == ["1.00", "2.00"], "hidden cells carry no number"
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_width() == 2 and hatched[0].get_height() == 2
    assert ax.collections[0].get_clim() == (1.0, 2.0), "hidden cells stay outside the colour scale"
    ax = plot_heatmap(torch.ones(2, 2), **KW)
    assert not [p for p in ax.patches if p.get_hatch()], "no hatching when nothing is hidden"


def test_heatmap_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        plot_heatmap(torch.rand(2, 3, 4), **KW)
    with pytest.raises(ValueError, match="2 x_labels for 3 columns"):
        plot_heatmap(torch.rand(2, 3), x_labels=["a", "b"], **KW)
    with pytest.raises(ValueError, match="3 y_labels for 2 rows"):
        plot_heatmap(torch.rand(2, 3), y_labels=["a", "b", "c"], **KW)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 2\), the matrix \(2, 3\)"):
        plot_heatmap(torch.rand(2, 3), mask=torch.zeros(3, 2, dtype=torch.bool), **KW)
    with pytest.raises(ValueError, match="every cell is masked"):
        plot_heatmap(torch.full((2, 2), float("nan")), **KW)


# --- several seeds ------------------------------------------------------------------------------

def _band(ax, i):
    """(x, low, high) of the i-th shaded band, read back from its polygon."""
    v = ax.collections[i].get_paths()[0].vertices
    xs = np.unique(v[:, 0])
    return xs, [v[v[:, 0] == x, 1].min() for x in xs], [v[v[:, 0] == x, 1].max() for x in xs]


def test_over_seeds_line_is_the_median_and_band_the_range():
    results = {"pre-LN": {1: [1.0, 2.0, 6.0], 2: [2.0, 5.0, 4.0], 4: [3.0, 3.5, 0.5]},
               "post-LN": {1: [0.0, 1.0], 2: [1.0, 3.0], 4: [2.0, 2.0]}}
    ax = plot_over_seeds(results, title="depth", xlabel="layers", ylabel="accuracy")
    assert _labels(ax) == ("depth", "layers", "accuracy")
    assert len(ax.collections) == 2, "one band per model"
    for i, per_x in enumerate(results.values()):
        xs, low, high = _band(ax, i)
        assert xs.tolist() == [1, 2, 4]
        assert low == [min(v) for v in per_x.values()] and high == [max(v) for v in per_x.values()], \
            f"band {i} is not min..max of the seeds"
    lines = [line for line in ax.lines if len(line.get_xdata()) and not line.get_label().startswith("_seed")]
    medians = [list(line.get_ydata()) for line in lines]
    assert medians == [[2.0, 4.0, 3.0], [0.5, 2.0, 2.0]], f"estimator lines are not the medians: {medians}"
    assert len(_seed_lines(ax)) == 5, "3 + 2 seeds, each drawn faintly"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pre-LN", "post-LN"]
    ax = plot_over_seeds(results, show_seeds=False, **KW)
    assert not _seed_lines(ax)


def test_over_seeds_sd_and_ci():
    vals = [1.0, 2.0, 4.0, 9.0]
    ax = plot_over_seeds({"m": {1: vals, 2: vals}}, estimator="mean", spread="sd", **KW)
    _, low, high = _band(ax, 0)
    mean, sd = np.mean(vals), np.std(vals, ddof=1)
    assert np.allclose(low, mean - sd) and np.allclose(high, mean + sd), "sd band is not mean +- sd"
    assert ax.get_legend() is None, "one model needs no legend"
    ax = plot_over_seeds({"m": {1: vals, 2: vals}}, spread="ci", **KW)
    _, low, high = _band(ax, 0)
    assert min(vals) <= low[0] < np.median(vals) < high[0] <= max(vals), "CI must hold the median"
    again = _band(plot_over_seeds({"m": {1: vals, 2: vals}}, spread="ci", **KW), 0)
    assert (again[1], again[2]) == (low, high), "the bootstrap is seeded: same band twice"


def test_over_seeds_categories_get_error_bars_in_order():
    results = {"train": {"1 head": [0.5, 0.7, 0.6], "4 heads": [0.9, 0.8, 1.0]},
               "test": {"1 head": [0.4, 0.6, 0.5], "4 heads": [0.7, 0.9, 0.8]}}
    ax = plot_over_seeds(results, title="heads", xlabel="heads", ylabel="accuracy")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 head", "4 heads"]
    bars = [seg for c in ax.collections for seg in c.get_segments()]
    assert len(bars) == 4, "one error bar per model and category"
    spans = sorted((round(seg[:, 1].min(), 6), round(seg[:, 1].max(), 6)) for seg in bars)
    assert spans == [(0.4, 0.6), (0.5, 0.7), (0.7, 0.9), (0.8, 1.0)], "error bars are not min..max"
    xs = sorted(seg[0, 0] for seg in bars)
    assert xs[0] < xs[1] < 0.5 < xs[2] < xs[3], "models side by side within each category"
    assert all(line.get_linestyle() == "None" for line in _seed_lines(ax)), "categories are not joined"


def test_over_seeds_from_seed_by_point_arrays_smoothed():
    curves = np.array([[4.0, 3.0, 2.0, 1.0], [6.0, 5.0, 2.0, 3.0], [5.0, 1.0, 0.0, 2.0]])  # (seeds, points)
    ax = plot_over_seeds({"a": torch.tensor(curves)}, x=[10, 20, 30, 40, 50], smooth=2, **KW)
    smoothed = (curves[:, 1:] + curves[:, :-1]) / 2          # drawn at the last point of each window
    xs, low, high = _band(ax, 0)
    assert xs.tolist() == [20, 30, 40], "x: one position per point, shifted by the smoothing window"
    assert low == pytest.approx(smoothed.min(0)) and high == pytest.approx(smoothed.max(0))
    median = [line for line in ax.lines if len(line.get_xdata()) and not line.get_label().startswith("_seed")]
    assert list(median[0].get_ydata()) == pytest.approx(np.median(smoothed, 0))
    seeds = sorted(tuple(line.get_ydata()) for line in _seed_lines(ax))
    assert seeds == sorted(tuple(row) for row in smoothed), "each seed's smoothed curve drawn faintly"
    ax = plot_over_seeds({"a": curves}, **KW)
    assert _band(ax, 0)[0].tolist() == [1, 2, 3, 4], "no x: positions 1..points"
    assert median[0].get_marker() == "o", "few points: each one marked"
    ax = plot_over_seeds({"a": np.ones((2, 30))}, **KW)
    assert all(line.get_marker() in ("None", None) for line in ax.lines), "30 points: lines, no markers"


def test_over_seeds_colors_override_some_models():
    results = {"attention": {1: [1.0, 2.0], 2: [2.0, 3.0]}, "no attention": {1: [0.0, 1.0], 2: [0.5, 1.5]}}
    ax = plot_over_seeds(results, colors={"no attention": "0.4"}, **KW)
    to_rgb = matplotlib.colors.to_rgb
    lines = {line.get_label(): line for line in ax.lines}
    assert to_rgb(lines["no attention"].get_color()) == to_rgb("0.4"), "the given colour is used"
    assert to_rgb(lines["attention"].get_color()) == to_rgb(sns.color_palette(n_colors=2)[0]), \
        "a model without a given colour keeps the palette's"
    faint = [line for line in _seed_lines(ax) if line.get_label().endswith("of no attention")]
    assert faint and all(to_rgb(line.get_color()) == to_rgb("0.4") for line in faint), "its seeds too"
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles,
                                               strict=True)}
    assert to_rgb(legend["no attention"].get_color()) == to_rgb("0.4"), "and its legend entry"
    with pytest.raises(ValueError, match=r"colors names \['seq2seq'\]"):
        plot_over_seeds(results, colors={"seq2seq": "0.4"}, **KW)


def test_over_seeds_bad_input():
    with pytest.raises(ValueError, match="results is empty"):
        plot_over_seeds({}, **KW)
    with pytest.raises(ValueError, match=r"results\['a'\] must be a non-empty mapping"):
        plot_over_seeds({"a": {}}, **KW)
    with pytest.raises(ValueError, match=r"results\['a'\]\[2\] has no values"):
        plot_over_seeds({"a": {1: [1.0], 2: []}}, **KW)
    with pytest.raises(ValueError, match="estimator must be one of"):
        plot_over_seeds({"a": {1: [1.0]}}, estimator="max", **KW)
    with pytest.raises(ValueError, match="spread must be one of"):
        plot_over_seeds({"a": {1: [1.0]}}, spread="iqr", **KW)
    with pytest.raises(ValueError, match=r"results\['a'\] must be a mapping .* got shape \(3,\)"):
        plot_over_seeds({"a": [1.0, 2.0, 3.0]}, **KW)
    with pytest.raises(ValueError, match=r"x has shape \(2,\), results\['a'\] has 3 points per seed"):
        plot_over_seeds({"a": np.ones((2, 3))}, x=[1, 2], **KW)
    with pytest.raises(ValueError, match="smooth must be an int >= 1, got 0"):
        plot_over_seeds({"a": np.ones((2, 3))}, smooth=0, **KW)


# --- bars ---------------------------------------------------------------------------------------

def test_grouped_bars_one_colour_per_series_and_labels():
    values = {"Transformer": {"short": 30.0, "long": 25.0}, "GRU": {"short": 20.0, "long": 10.0}}
    ax = plot_grouped_bars(values, title="BLEU", xlabel="length", ylabel="BLEU")
    assert _labels(ax) == ("BLEU", "length", "BLEU")
    assert len(ax.containers) == 2 and len(_bars(ax)) == 4, "2 series x 2 groups"
    heights = [[b.get_height() for b in c] for c in ax.containers]
    assert heights == [[30.0, 25.0], [20.0, 10.0]], f"series and groups in the order given: {heights}"
    colours = [{mpl.colors.to_hex(b.get_facecolor()) for b in c} for c in ax.containers]
    assert all(len(c) == 1 for c in colours) and colours[0] != colours[1], "one colour per series"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["short", "long"]
    assert sorted(t.get_text() for t in ax.texts) == ["10.0", "20.0", "25.0", "30.0"], "bar labels"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Transformer", "GRU"]
    ax = plot_grouped_bars({"a": {"x": [1.0, 2.0, 6.0]}}, **KW)
    assert _bars(ax)[0].get_height() == 2.0, "several values: the bar is their median"
    ends = np.concatenate([line.get_ydata() for line in ax.lines])
    assert (np.nanmin(ends), np.nanmax(ends)) == (1.0, 6.0), "several values: an error bar spans their range"
    assert not ax.texts, "no value labels over range bars by default"


def test_grouped_bars_bad_input():
    with pytest.raises(ValueError, match="values is empty"):
        plot_grouped_bars({}, **KW)
    with pytest.raises(ValueError, match=r"values\['b'\] has groups \['y', 'x'\], expected \['x', 'y'\]"):
        plot_grouped_bars({"a": {"x": 1, "y": 2}, "b": {"y": 1, "x": 2}}, **KW)
    with pytest.raises(ValueError, match=r"values\['a'\]\['x'\] has no values"):
        plot_grouped_bars({"a": {"x": []}}, **KW)


def test_bleu_by_length_is_grouped_bars():
    rows = [{"bucket": "1-10", "n": 40, "bleu": 30.0}, {"bucket": "11+", "n": 9, "bleu": 20.0}]
    other = [dict(r, bleu=r["bleu"] / 2) for r in rows]
    ax = plot_bleu_by_length({"attention": rows, "seq2seq": other}, title="by length")
    assert _labels(ax) == ("by length", "source length (tokens)", "BLEU")
    assert [[b.get_height() for b in c] for c in ax.containers] == [[30.0, 20.0], [15.0, 10.0]]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1-10\n(n=40)", "11+\n(n=9)"]
    with pytest.raises(ValueError, match="no results"):
        plot_bleu_by_length({}, title="t")
    with pytest.raises(ValueError, match=r"'b' has buckets \['1-10'\], expected \['1-10', '11\+'\]"):
        plot_bleu_by_length({"a": rows, "b": rows[:1]}, title="t")
    with pytest.raises(ValueError, match=r"the rows of 'a' need 'bucket' and 'exact'"):
        plot_bleu_by_length({"a": rows}, title="t", metric="exact")


def test_plot_history_weights_each_step_by_its_tokens():
    """Short bucketed batches (2 tokens, loss 3) between long ones (100 tokens, loss 1): the mean
    loss per token over a window is (2*3 + 100*1) / 102, not the unweighted 2.0 (review
    2026-11-26-ch00-02: the unweighted curve drew overfitting that was not there)."""
    losses, tokens = [3.0, 1.0] * 10, [2, 100] * 10
    weighted = plot_history(History(step_loss=losses, step_tokens=tokens), title="t", smooth=2)
    y = weighted.lines[0].get_ydata()
    assert len(y) == 19 and np.allclose(y, (2 * 3 + 100 * 1) / 102)
    assert list(weighted.lines[0].get_xdata()) == list(range(2, 21)), "each average sits at its last step"
    assert "token-weighted" in weighted.get_legend().get_texts()[0].get_text()
    old = plot_history(History(step_loss=losses), title="t", smooth=2)  # no token counts recorded
    assert np.allclose(old.lines[0].get_ydata(), 2.0)
    assert "unweighted" in old.get_legend().get_texts()[0].get_text()
    assert len(plot_history(History(step_loss=[1.0, 2.0]), title="t", smooth=20).lines[0].get_ydata()) == 1


def test_fit_records_the_tokens_of_every_step():
    model = torch.nn.Linear(2, 1)
    batches = [(torch.randn(n, 2), torch.randn(n, 1)) for n in (3, 7, 5, 7)]

    def loss_fn(m, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(m(x), y), len(x)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = fit(model, batches, loss_fn, optimizer, epochs=2, verbose=False)
    assert history.step_tokens == [3, 7, 5, 7] * 2
    again = History.from_dict(history.to_dict())
    assert again.step_tokens == history.step_tokens
    older = {k: v for k, v in history.to_dict().items() if k != "step_tokens"}
    assert History.from_dict(older).step_tokens == []

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tfmlib.plot import plot_curves, plot_heatmap, plot_history  # noqa: E402
from tfmlib.train import History  # noqa: E402


def test_heatmap_labels_and_title():
    ax = plot_heatmap(torch.rand(2, 3), x_labels=["le", "chat", "."], y_labels=["the", "cat"],
                      title="weights", xlabel="source", ylabel="target")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["le", "chat", "."]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["the", "cat"]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("weights", "source", "target")
    assert ax.images[0].get_array().shape == (2, 3)
    plt.close("all")


def test_heatmap_bad_input():
    kw = dict(title="t", xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="2-D"):
        plot_heatmap(torch.rand(2, 3, 4), **kw)
    with pytest.raises(ValueError, match="2 x_labels for 3 columns"):
        plot_heatmap(torch.rand(2, 3), x_labels=["a", "b"], **kw)


def test_curves_and_history():
    ax = plot_curves({"rnn": [3, 2, 1], "gru": [3, 1, 0.5]}, title="t", xlabel="x", ylabel="y",
                     logy=True)
    assert len(ax.lines) == 2 and ax.get_yscale() == "log" and ax.get_legend() is not None
    ax = plot_curves({"a": list(range(100))}, title="t", xlabel="x", ylabel="y", smooth=10)
    assert len(ax.lines[0].get_ydata()) == 91
    h = History(step_loss=[3.0, 2.0, 1.5, 1.0], epochs=[
        {"epoch": 1, "train_loss": 2.5, "seconds": 1.0, "valid_loss": 2.0},
        {"epoch": 2, "train_loss": 1.2, "seconds": 1.0, "valid_loss": 1.4}])
    ax = plot_history(h, title="loss", smooth=1)
    assert len(ax.lines) == 2 and ax.get_xlabel() == "optimisation step"
    with pytest.raises(ValueError, match="no curves"):
        plot_curves({}, title="t", xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="no steps"):
        plot_history(History(), title="t")
    plt.close("all")


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
    plt.close("all")


def test_curves_and_heatmap_bad_input():
    kw = dict(title="t", xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="smooth must be an int >= 1, got 0"):
        plot_curves({"a": [1, 2]}, smooth=0, **kw)
    with pytest.raises(ValueError, match=r"x has shape \(2,\), curve 'a' has 3 points"):
        plot_curves({"a": [1, 2, 3]}, x=[0, 1], **kw)
    with pytest.raises(ValueError, match=r"curve 'a' must be a non-empty 1-D sequence, got shape \(0,\)"):
        plot_curves({"a": []}, **kw)
    with pytest.raises(ValueError, match=r"non-empty, got shape \(0, 3\)"):
        plot_heatmap(torch.rand(0, 3), **kw)
    plt.close("all")

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

"""tfmlib.seeds: results per seed, median and range, conclusions that must hold for every seed."""

import random

import numpy as np
import pytest
import torch

from tfmlib.seeds import SeedResults, over_seeds


def test_over_seeds_seeds_every_run_and_collects_in_order():
    def run_one(seed):
        # everything drawn here is fixed by the seed over_seeds set
        return {"a": random.random(), "b": float(np.random.rand()), "c": torch.rand(()).item() + seed}

    first, again = over_seeds(run_one, [3, 1, 2]), over_seeds(run_one, [3, 1, 2])
    assert first.seeds == [3, 1, 2] and first.names == ["a", "b", "c"]
    assert first.values == again.values, "the same seeds must give the same results"
    random.seed(1)
    assert first.values["a"][1] == random.random(), "seed 1 is the second run"
    assert len(set(first.values["a"])) == 3


def test_median_range_and_summary():
    r = SeedResults([0, 1, 2, 3], {"x": [4.0, 1.0, 3.0, 10.0]})
    assert r.median("x") == 3.5 and r.range("x") == (1.0, 10.0)
    assert r.summary("x", ".1f") == "3.5 [1.0, 10.0]"
    with pytest.raises(KeyError, match="no quantity 'y'; measured: \\['x'\\]"):
        r.median("y")


def test_a_conclusion_holds_only_if_every_seed_agrees():
    r = SeedResults([0, 1, 2], {"gru": [0.30, 0.35, 0.50], "rnn": [0.40, 0.45, 0.41]})
    assert r.wins("gru", "rnn", better="lower") == [True, True, False]
    assert not r.holds_for_every_seed("gru", "rnn", better="lower")
    assert not r.holds_for_every_seed("rnn", "gru", better="lower")
    assert r.median("gru") < r.median("rnn"), "the medians alone would call it for the GRU"
    tie = SeedResults([0, 1], {"a": [1.0, 2.0], "b": [1.0, 1.0]})
    assert not tie.holds_for_every_seed("a", "b"), "a tie is not a win"
    assert SeedResults([0, 1], {"a": [2.0, 3.0], "b": [1.0, 1.0]}).holds_for_every_seed("a", "b")
    assert r.verdict("gru", "rnn", better="lower", fmt=".2f") == \
        "gru lower than rnn for 2 of 3 seeds; gru - rnn: -0.10 [-0.10, 0.09]"
    with pytest.raises(ValueError, match="better must be"):
        r.wins("gru", "rnn", better="smaller")


def test_table_and_plot_shape():
    r = SeedResults([0, 7], {"pre-LN": [1.0, 2.0], "post": [3.0, 5.0]})
    lines = r.table(".1f").splitlines()
    assert len(lines) == 3 and "seed 7" in lines[0]
    assert lines[1].startswith("pre-LN") and "1.5 [1.0, 2.0]" in lines[1]
    assert r.for_plot() == {"pre-LN": [1.0, 2.0], "post": [3.0, 5.0]}
    assert r.for_plot(["post"]) == {"post": [3.0, 5.0]}
    # a signed format, as for differences, is a whole format spec: the table pads after formatting
    signed = SeedResults([0, 1], {"a - b": [-0.25, 0.5]}).table("+.2f").splitlines()
    assert "+0.12 [-0.25, +0.50]" in signed[1] and "  -0.25        +0.50" in signed[1], signed
    with pytest.raises(ValueError, match="fmt='q' is not a number format"):
        r.table("q")


def test_bad_runs_are_refused():
    with pytest.raises(ValueError, match="no seeds"):
        over_seeds(lambda s: {"a": 1.0}, [])
    with pytest.raises(ValueError, match="seeds repeat"):
        over_seeds(lambda s: {"a": 1.0}, [0, 0])
    with pytest.raises(ValueError, match="returned \\['b'\\], the first run \\['a'\\]"):
        over_seeds(lambda s: {"a": 1.0} if s == 0 else {"b": 1.0}, [0, 1])
    with pytest.raises(ValueError, match="a=nan"):
        over_seeds(lambda s: {"a": float("nan")}, [0])
    with pytest.raises(ValueError, match="non-empty mapping"):
        over_seeds(lambda s: 1.0, [0])
    with pytest.raises(ValueError, match="2 values for 3 seeds"):
        SeedResults([0, 1, 2], {"a": [1.0, 2.0]})

import random

import numpy as np
import pytest
import torch

from tfmlib import config


def test_profile_from_env(monkeypatch):
    for name in config.PROFILES:
        monkeypatch.setenv("TFM_PROFILE", name)
        assert config.active_profile() == name
    monkeypatch.setenv("TFM_PROFILE", " CPU ")
    assert config.active_profile() == "cpu"


def test_profile_default_by_hardware(monkeypatch):
    monkeypatch.delenv("TFM_PROFILE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert config.active_profile() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert config.active_profile() == "gpu"


def test_bad_profile_names_the_choices(monkeypatch):
    monkeypatch.setenv("TFM_PROFILE", "huge")
    with pytest.raises(ValueError, match="smoke"):
        config.active_profile()


def test_setup_picks_the_active_profile_sizes(monkeypatch, capsys):
    monkeypatch.setenv("TFM_PROFILE", "smoke")
    run = config.setup(3, smoke=dict(epochs=1, hidden=8), cpu=dict(epochs=5, hidden=64),
                       gpu=dict(epochs=9, hidden=512))
    assert (run.profile, run.seed, run.epochs, run["hidden"]) == ("smoke", 3, 1, 8)
    assert "profile='smoke'" in capsys.readouterr().out
    with pytest.raises(AttributeError, match="no size 'layers'"):
        _ = run.layers


def test_setup_rejects_inconsistent_profiles():
    with pytest.raises(ValueError, match="same sizes"):
        config.setup(0, smoke=dict(a=1), cpu=dict(a=1, b=2), gpu=dict(a=1))
    with pytest.raises(ValueError, match="missing"):
        config.setup(0, smoke=dict(a=1), cpu=dict(a=1))
    with pytest.raises(ValueError, match="unknown profile"):
        config.setup(0, smoke=dict(a=1), cpu=dict(a=1), gpu=dict(a=1), tpu=dict(a=1))
    with pytest.raises(TypeError, match=r"must be a dict, got \{'cpu': 'int'\}"):
        config.setup(0, smoke=dict(a=1), cpu=5, gpu=dict(a=1))


def test_setup_refuses_a_bad_seed_before_printing(capsys):
    with pytest.raises(ValueError, match="seed must be a non-negative int, got -1"):
        config.setup(-1)
    assert capsys.readouterr().out == ""


def test_seed_everything_makes_runs_repeatable():
    def draw():
        return random.random(), np.random.rand(), torch.rand(3).tolist()

    config.seed_everything(7)
    first = draw()
    config.seed_everything(7)
    assert draw() == first
    config.seed_everything(8)
    assert draw() != first
    with pytest.raises(ValueError, match="seed"):
        config.seed_everything(-1)


def test_pick_device(monkeypatch):
    monkeypatch.delenv("TFM_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert config.pick_device().type == "cpu"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert config.pick_device().type == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert config.pick_device().type == "cuda"
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    assert config.pick_device().type == "cpu"


def test_pick_device_refuses_missing_hardware(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        config.pick_device("cuda")

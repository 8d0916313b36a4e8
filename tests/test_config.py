import random

import numpy as np
import pytest
import torch

from tfmlib import config, timing


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
    with pytest.raises(ValueError, match=r"\['threads'\] would be hidden by Run's own fields"):
        config.setup(0, smoke=dict(threads=1), cpu=dict(threads=2), gpu=dict(threads=4))
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


# --------------------------------------------------------------------------- threads and MPS


@pytest.fixture
def keep_threads():
    """Tests below change torch's thread count; put it back afterwards."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_from_env(monkeypatch):
    monkeypatch.delenv("TFM_THREADS", raising=False)
    assert config.threads_from_env() is None
    monkeypatch.setenv("TFM_THREADS", " 3 ")
    assert config.threads_from_env() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("TFM_THREADS", bad)
        with pytest.raises(ValueError, match=f"TFM_THREADS='{bad}' is not a thread count"):
            config.threads_from_env()


def test_setup_applies_tfm_threads_and_prints_them(monkeypatch, capsys, keep_threads):
    monkeypatch.setenv("TFM_PROFILE", "smoke")
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    interop: list[int] = []
    monkeypatch.setattr(torch, "set_num_interop_threads", interop.append)
    monkeypatch.setattr(torch, "get_num_interop_threads", lambda: 99)
    torch.set_num_threads(2)
    monkeypatch.setenv("TFM_THREADS", "1")
    run = config.setup(0)
    assert torch.get_num_threads() == 1, "setup() must apply TFM_THREADS to torch"
    assert run.threads == 1 and interop == [1], (run.threads, interop)
    assert "threads=1" in capsys.readouterr().out, "the one-line summary shows the threads"
    monkeypatch.setenv("TFM_THREADS", "2")
    assert config.setup(0, verbose=False).threads == 2 == torch.get_num_threads()


def test_setup_leaves_threads_alone_without_tfm_threads(monkeypatch, capsys, keep_threads):
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    monkeypatch.delenv("TFM_THREADS", raising=False)
    torch.set_num_threads(2)
    run = config.setup(0)
    assert run.threads == 2 == torch.get_num_threads()
    assert "threads=2" in capsys.readouterr().out


def test_interop_threads_already_fixed_are_kept(monkeypatch, keep_threads):
    def refuse(n: int) -> None:
        raise RuntimeError("Error: cannot set number of interop threads after parallel work has started")

    monkeypatch.setattr(torch, "get_num_interop_threads", lambda: 4)
    monkeypatch.setattr(torch, "set_num_interop_threads", refuse)
    assert config.apply_threads(1) == 1 == torch.get_num_threads()
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        config.apply_threads(0)


def test_setup_bad_tfm_threads_is_an_error(monkeypatch):
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    monkeypatch.setenv("TFM_THREADS", "many")
    with pytest.raises(ValueError, match="TFM_THREADS='many'"):
        config.setup(0, verbose=False)


def test_setup_on_mps_says_how_to_force_the_cpu(monkeypatch, capsys):
    monkeypatch.delenv("TFM_DEVICE", raising=False)
    monkeypatch.delenv("TFM_THREADS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    run = config.setup(0)
    lines = capsys.readouterr().out.splitlines()
    assert run.device.type == "mps"
    assert len(lines) == 2 and "TFM_DEVICE=cpu" in lines[1], lines
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    config.setup(0)
    out = capsys.readouterr().out
    assert "TFM_DEVICE=cpu" not in out and len(out.splitlines()) == 1, out


# --------------------------------------------------------------------------- conftest under xdist


def test_share_of_cores():
    import conftest

    assert conftest.share_of_cores(16, 9) == 1
    assert conftest.share_of_cores(16, 4) == 4
    assert conftest.share_of_cores(2, 4) == 1, "at least one thread each"
    assert conftest.share_of_cores(16, 2, omp_threads="3") == 3, "a user's OMP_NUM_THREADS caps it"
    assert conftest.share_of_cores(16, 2, omp_threads="") == 8
    with pytest.raises(ValueError, match="workers must be >= 1"):
        conftest.share_of_cores(16, 0)


def _tfm_threads_after_conftest(env: dict[str, str]) -> str:
    """TFM_THREADS as the root conftest leaves it when imported in a process with ``env``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    base = {k: v for k, v in os.environ.items()
            if k not in ("TFM_THREADS", "PYTEST_XDIST_WORKER_COUNT", "OMP_NUM_THREADS")}
    code = ("import os, runpy; runpy.run_path('conftest.py'); "
            "print(os.environ.get('TFM_THREADS', 'unset'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_conftest_sets_tfm_threads_from_the_xdist_worker_count():
    import conftest

    cores = conftest.available_cores()
    assert _tfm_threads_after_conftest({}) == "unset", "without xdist, threads are left alone"
    assert _tfm_threads_after_conftest({"PYTEST_XDIST_WORKER_COUNT": "2"}) == str(max(1, cores // 2))
    assert _tfm_threads_after_conftest({"PYTEST_XDIST_WORKER_COUNT": str(4 * cores)}) == "1"
    assert _tfm_threads_after_conftest({"PYTEST_XDIST_WORKER_COUNT": "1", "OMP_NUM_THREADS": "1"}) == "1"
    assert _tfm_threads_after_conftest({"PYTEST_XDIST_WORKER_COUNT": "2", "TFM_THREADS": "7"}) == "7", \
        "a TFM_THREADS the user set wins"


def test_setup_sets_the_book_figure_theme(monkeypatch):
    import matplotlib as mpl

    from tfmlib import config
    from tfmlib.plot import BOOK_THEME, book_theme

    mpl.rcdefaults()
    monkeypatch.setenv("TFM_PROFILE", "smoke")
    config.setup(0, verbose=False)
    themed = dict(mpl.rcParams)
    book_theme()
    assert themed == dict(mpl.rcParams), "setup() should leave matplotlib in the book's theme"
    mpl.rcdefaults()
    assert dict(mpl.rcParams) != themed, "the theme should change something (else this test proves nothing)"
    assert BOOK_THEME, "the theme is described by BOOK_THEME"


# --------------------------------------------------------------------------- TF32 on CUDA


@pytest.fixture
def keep_tf32():
    """Restore the process-wide TF32 switches a test changes, and matplotlib's settings (setup()
    applies the book's theme, which would restyle the figures that later tests draw)."""
    import matplotlib as mpl

    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    with mpl.rc_context():
        yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


def test_setup_turns_tf32_off_on_cuda_and_says_so(monkeypatch, capsys, keep_tf32):
    # cuDNN's TF32 is on by default: a float32 GRU on an Ampere GPU would compute in TF32 and the
    # book's exact comparisons with the CPU would fail. setup() must turn it off and print it.
    from tfmlib import precision

    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    monkeypatch.setattr(config, "pick_device", lambda device=None: torch.device("cuda"))
    run = config.setup(0, verbose=True)
    assert run.tf32 is False
    assert not precision.fp32_matmul_is_tf32() and not precision.cudnn_is_tf32()
    assert "tf32=off" in capsys.readouterr().out


def test_setup_on_a_cpu_leaves_tf32_unmentioned(monkeypatch, capsys, keep_tf32):
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    torch.backends.cudnn.allow_tf32 = True
    run = config.setup(0, verbose=True)
    assert run.tf32 is None and "tf32" not in capsys.readouterr().out
    assert torch.backends.cudnn.allow_tf32, "on a CPU setup() leaves the CUDA switches as they were"


def test_run_repr_without_sizes_has_no_dangling_separator():
    """A notebook that passes no sizes prints ``Run(..., seed=0)``, not ``seed=0, )``."""
    bare = config.Run("cpu", torch.device("cpu"), 0)
    assert repr(bare) == "Run(profile='cpu', device='cpu', seed=0)"
    sized = config.Run("cpu", torch.device("cpu"), 1, {"epochs": 2}, threads=1)
    assert repr(sized) == "Run(profile='cpu', device='cpu', threads=1, seed=1, epochs=2)"


def test_time_scale_from_env(monkeypatch):
    monkeypatch.delenv("TFM_TIME_SCALE", raising=False)
    assert timing.time_scale_from_env() == 1.0
    monkeypatch.setenv("TFM_TIME_SCALE", " 0.01 ")
    assert timing.time_scale_from_env() == 0.01
    for bad in ("0", "-0.5", "inf", "nan", "slow"):
        monkeypatch.setenv("TFM_TIME_SCALE", bad)
        with pytest.raises(ValueError, match=f"TFM_TIME_SCALE='{bad}' is not a time scale"):
            timing.time_scale_from_env()


def test_setup_says_when_the_time_guards_are_scaled(monkeypatch, capsys):
    import matplotlib as mpl

    with mpl.rc_context():  # setup() applies the book's theme; later tests draw figures with the defaults
        _setup_with_time_scales(monkeypatch, capsys)


def _setup_with_time_scales(monkeypatch, capsys):
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    monkeypatch.delenv("TFM_TIME_SCALE", raising=False)
    config.setup(0)
    assert "TFM_TIME_SCALE" not in capsys.readouterr().out, "nothing to say when the guards are as written"
    monkeypatch.setenv("TFM_TIME_SCALE", "0.001")
    config.setup(0)
    assert "TFM_TIME_SCALE=0.001: every time guard" in capsys.readouterr().out
    monkeypatch.setenv("TFM_TIME_SCALE", "never")
    with pytest.raises(ValueError, match="TFM_TIME_SCALE='never'"):
        config.setup(0, verbose=False)

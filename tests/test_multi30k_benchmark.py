"""benchmarks/multi30k_transformer.py: the gpu profile's code path (bf16 autocast, token batches,
the torch.compile fallback, tokens/s and MFU) runs on the CPU in a smoke run; the FLOP count and the
peak table say what they should. The smoke run needs Multi30k (../shared/data/multi30k) and is
skipped cleanly without it; the rest runs anywhere."""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import multi30k_transformer as bench  # noqa: E402

from tfmlib.compiling import compile_or_fallback  # noqa: E402  (moved out of the benchmark in ch. 10)
from tfmlib.throughput import peak_flops, training_flops  # noqa: E402

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def test_peak_table_and_precision_choice(monkeypatch):
    cuda = torch.device("cuda")
    assert peak_flops(cuda, "bf16", name="NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops(cuda, "bf16", name="NVIDIA H100 PCIe") == 756e12, "PCIe must not match SXM"
    assert peak_flops(cuda, "fp32", name="NVIDIA A100-SXM4-40GB") == 19.5e12
    assert peak_flops(cuda, "bf16", name="Tesla T4") is None, "a T4 has no bf16 tensor cores"
    assert peak_flops(cuda, "bf16", name="Some Future GPU") is None
    assert peak_flops(torch.device("cpu"), "bf16") is None, "no peak on the CPU"
    assert peak_flops(torch.device("mps"), "fp32") is None
    with pytest.raises(ValueError, match="precision must be"):
        peak_flops(cuda, "int8", name="H100")
    cpu = torch.device("cpu")
    assert bench.pick_precision(cpu, "auto", "cpu") == "fp32", "the cpu profile must stay as measured"
    import tfmlib.precision

    monkeypatch.setattr(tfmlib.precision, "cpu_has_fast_bf16", lambda: True)  # a CPU with bf16 units
    assert bench.pick_precision(cpu, "auto", "gpu") == "bf16"
    assert bench.pick_precision(cpu, "fp16", "gpu") == "fp16"


def test_training_flops_match_a_hand_count():
    cfg = dict(d_model=4, d_ff=8, layers=1)
    # encoder per token: 4*16 + 2*4*8 + 2*4*S; decoder per token: 8*16 + 2*4*8 + 4*T + 2*4*S + 4*V
    S, T, V = 5, 6, 10
    enc = 64 + 64 + 8 * S
    dec = 128 + 64 + 4 * T + 8 * S + 4 * V
    assert training_flops(cfg, V, 7, 3, S, T) == 6 * (enc * 7 + dec * 3)
    two = dict(cfg, layers=2)
    assert training_flops(two, 0, 1, 0, S, T) == 2 * training_flops(cfg, 0, 1, 0, S, T)


def test_compile_fallback_trains_the_eager_model():
    model = torch.nn.Linear(3, 1)
    calls = []

    def broken(m):
        raise RuntimeError("no C++ compiler\nmore detail")

    def trial(m):
        calls.append(m)
        m(torch.ones(2, 3)).sum().backward()

    chosen, note = compile_or_fallback(model, trial, compiler=broken)
    assert chosen is model and str(note) == "eager (compile failed: RuntimeError: no C++ compiler)", note
    assert calls == [], "the trial must not run when compiling failed"
    chosen, note = compile_or_fallback(model, trial, compiler=lambda m: m)
    assert chosen is model and note.compiled and calls == [model]
    assert str(note).startswith("compiled (first call"), note
    assert all(p.grad is None for p in model.parameters()), "the trial step's gradients must be cleared"


@pytest.mark.skipif(not MULTI30K.exists(), reason="Multi30k not in ../shared/data/multi30k")
def test_gpu_profile_smoke_run_on_the_cpu(tmp_path, capsys, monkeypatch):
    import tfmlib.precision

    monkeypatch.setattr(tfmlib.precision, "cpu_has_fast_bf16", lambda: True)  # "auto" is bf16 on such a CPU

    def no_compiler(model):
        raise RuntimeError("compilation unavailable in this test")

    out = tmp_path / "m30k.json"
    payload = bench.main(["--smoke", "--profile", "gpu", "--device", "cpu", "--compile", "--budget-s", "3",
                          "--data", str(MULTI30K), "--out", str(out)], compiler=no_compiler)
    assert json.loads(out.read_text()) == payload, "the JSON must be what main returned"
    assert payload["profile"] == "gpu" and payload["smoke"] is True
    assert payload["precision"] == "bf16", "the gpu profile must take bf16 autocast on the CPU"
    assert payload["batches"].startswith("token-count") and payload["config"]["max_tokens"] == 512
    assert payload["compile"].startswith("eager (compile failed: RuntimeError"), payload["compile"]
    assert payload["device"] == "cpu" and payload["device_name"], "where it ran must be recorded"
    assert payload["steps"] >= 1 and payload["train_target_tokens_per_s"] > 0
    assert payload["model_tflops_per_s"] > 0 and payload["mfu"] is None, "no peak, no MFU on the CPU"
    assert payload["epochs_log"] and "val_loss" in payload["epochs_log"][0], "validation after each epoch"
    assert set(payload["results"]) == {"greedy", "beam5"}
    printed = capsys.readouterr().out
    assert "target tokens/s" in printed and "MFU: no peak known" in printed

"""benchmarks/scaling_steps.py runs (smoke sizes, on the CPU) and writes what it prints: every step of
chapter 10's table with its tokens/s, the torchrun rows with 1 and 2 processes, and the device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scaling_steps as bench  # noqa: E402

STEPS = ["baseline: explicit attention, fp32, eager, bucketed sentences", "+ fused attention (SDPA)",
         "+ {low} autocast", "+ torch.compile", "+ packed fixed-token batches"]


def test_smoke_run_writes_every_step(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scaling_steps.py"), "--smoke", "--device", "cpu",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"the smoke run failed:\n{proc.stdout}\n{proc.stderr}"
    assert "tokens/s" in proc.stdout and "x base" in proc.stdout, f"no table printed:\n{proc.stdout}"
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["profile"] == "smoke", f"where it ran: {data['device']}"
    low = data["rows"][2]["precision"]
    assert low in ("bf16", "fp16", "fp32"), f"the autocast row's precision: {low}"
    names = [r["step"] for r in data["rows"]]
    assert names[:5] == [s.format(low=low) for s in STEPS], f"the single-process steps, in order: {names}"
    assert "packed, eager" in names[5] and data["rows"][5]["compiled"] == "eager", names[5]
    unbucketed, packed_fp32 = data["rows"][6], data["rows"][7]
    assert "not bucketed" in unbucketed["step"] and unbucketed["data"] == "unbucketed", unbucketed["step"]
    assert packed_fp32["data"] == "packed" and packed_fp32["precision"] == "fp32", packed_fp32["step"]
    assert [r["processes"] for r in data["rows"][8:]] == [1, 2], f"the torchrun rows: {names[8:]}"
    for row in data["rows"]:
        assert row["tokens_per_s"] > 0 and row["flops_per_token"] > 0, f"{row['step']}: {row}"
        assert row["mfu"] is None, "the CPU has no datasheet peak: MFU must be None, not a number"
        assert 0 < row["of_matmul_peak"], f"{row['step']}: fraction of the measured matmul peak"
    single = data["rows"][:5]
    assert [r["attention"] for r in single] == ["explicit"] + ["fused"] * 4
    assert [r["data"] for r in single] == ["padded"] * 4 + ["packed"]
    assert single[0]["precision"] == single[1]["precision"] == "fp32"
    assert single[3]["compiled"].startswith(("compiled", "eager")), single[3]["compiled"]
    packed = single[4]
    assert packed["real_tokens_per_round"] == packed["slots_per_round"], "packed blocks have no padding"
    def padding(row: dict) -> float:
        return 1 - row["real_tokens_per_round"] / row["slots_per_round"]

    assert padding(unbucketed) > 0, "random sentence batches carry padding"
    assert padding(single[0]) <= padding(unbucketed), "bucketing must not add padding"
    ddp = data["rows"][9]
    assert ddp["backend"] == "gloo" and ddp["steps"] == data["sizes"]["ddp_steps"], ddp


def test_batches_hold_about_the_same_real_tokens() -> None:
    sentences = [[5 + (i % 7)] * (3 + i % 11) for i in range(200)]
    padded = bench.padded_batches(sentences, 3, tokens_per_batch=64, max_len=8, seed=0)
    for x, y in padded:
        real = int((y != 0).sum())
        assert 64 <= real < 64 + 8, f"a padded batch holds {real} real tokens, asked for about 64"
        assert x.shape[1] <= 8, f"sentences are cut to the context: length {x.shape[1]}"
    assert bench.real_tokens(padded) == sum(int((y != 0).sum()) for _, y in padded)


def test_bucketing_leaves_less_padding_than_random_batches() -> None:
    lengths = [3 + (i * 7919) % 40 for i in range(2_000)]             # 3..42 words, scattered
    sentences = [[5] * n for n in lengths]

    def padding(batches: list) -> float:
        return 1 - bench.real_tokens(batches) / sum(x.numel() for x, _ in batches)

    bucketed = bench.padded_batches(sentences, 8, tokens_per_batch=256, max_len=64, seed=0)
    scattered = bench.padded_batches(sentences, 8, tokens_per_batch=256, max_len=64, seed=0, bucketed=False)
    assert len(bucketed) == len(scattered) == 8
    assert padding(bucketed) < 0.1 < 0.3 < padding(scattered), (padding(bucketed), padding(scattered))


def test_matmul_flops_is_positive_and_counts_2n3() -> None:
    flops = bench.matmul_flops(torch.device("cpu"), "fp32", 64, repeats=2)
    assert 1e6 < flops < 1e14, f"an implausible FLOP/s for a 64x64 matmul on the CPU: {flops:.3g}"

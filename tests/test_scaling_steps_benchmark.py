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
         "+ TF32 matmuls (fp32 weights and activations)", "+ {low} autocast",
         "+ torch.compile (dynamic shapes)",
         "+ packed fixed-token batches (static compile)", "+ fused AdamW"]


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
    low = data["rows"][3]["precision"]
    assert low in ("bf16", "fp16", "fp32"), f"the autocast row's precision: {low}"
    names = [r["step"] for r in data["rows"]]
    assert names[:7] == [s.format(low=low) for s in STEPS], f"the single-process steps, in order: {names}"
    assert "packed, eager" in names[7] and data["rows"][7]["compiled"] == "eager", names[7]
    unbucketed, packed_fp32 = data["rows"][8], data["rows"][9]
    assert "not bucketed" in unbucketed["step"] and unbucketed["data"] == "unbucketed", unbucketed["step"]
    assert packed_fp32["data"] == "packed" and packed_fp32["precision"] == "fp32", packed_fp32["step"]
    assert [r["processes"] for r in data["rows"][10:]] == [1, 2], f"the torchrun rows: {names[10:]}"
    assert set(data["skipped"]) == {"+ micro-batch sized to memory", "+ max-autotune and CUDA graphs"}, \
        "the CUDA-only rows say why they are skipped on the CPU"
    for row in data["rows"]:
        assert row["tokens_per_s"] > 0 and row["flops_per_token"] > 0, f"{row['step']}: {row}"
        assert row["mfu"] is None, "the CPU has no datasheet peak: MFU must be None, not a number"
        assert 0 < row["of_matmul_peak"], f"{row['step']}: fraction of the measured matmul peak"
    single = data["rows"][:7]
    assert [r["attention"] for r in single] == ["explicit"] + ["fused"] * 6
    assert [r["data"] for r in single] == ["padded"] * 5 + ["packed"] * 2
    assert [r["precision"] for r in single[:3]] == ["fp32", "fp32", "tf32"]
    assert single[2]["peak"] == "tf32" and single[1]["peak"] == "fp32"
    assert "dynamic=True" in single[4]["compiled"], "padded batches change shape: symbolic sizes"
    assert "dynamic=False" in single[5]["compiled"], "packed blocks have one shape: a static compile"
    assert single[6]["optimizer"] == "AdamW fused" and single[5]["optimizer"] == "AdamW (default)"
    packed = single[5]
    assert packed["real_tokens_per_round"] == packed["slots_per_round"], "packed blocks have no padding"
    padded = single[0]
    assert padded["slots_per_round"] <= packed["slots_per_round"], "TokenBatchSampler caps the positions"
    assert padded["real_tokens_per_round"] >= 0.7 * packed["real_tokens_per_round"], \
        "a padded batch holds about as many real tokens as a packed one"

    def padding(row: dict) -> float:
        return 1 - row["real_tokens_per_round"] / row["slots_per_round"]

    assert padding(unbucketed) > 0, "random sentence batches carry padding"
    assert padding(single[0]) <= padding(unbucketed), "bucketing must not add padding"
    ddp = data["rows"][11]
    assert ddp["backend"] == "gloo" and ddp["steps"] == data["sizes"]["ddp_steps"], ddp
    prof = data["profile_of_one_step"]
    assert prof["row"] == "+ fused AdamW" and prof["top"] and prof["busy_ms"] <= prof["wall_ms"], prof


def test_bucketed_batches_come_from_the_token_sampler_at_the_packed_token_count() -> None:
    sentences = [[5 + (i % 7)] * (3 + i % 11) for i in range(200)]
    padded = bench.padded_batches(sentences, 3, tokens_per_batch=64, max_len=8, seed=0)
    assert len(padded) == 3
    for x, y in padded:
        assert x.numel() <= 64, f"at most 64 positions per batch, got {tuple(x.shape)}"
        assert int((y != 0).sum()) >= 48, "sentences of one length fill the positions with real tokens"
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

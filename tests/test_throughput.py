"""tfmlib.throughput (chapter 10): FLOPs per token, parameter counts, peaks, MFU, timed steps."""

import itertools

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from tfmlib.lm import DecoderLM
from tfmlib.precision import tf32_matmul
from tfmlib.throughput import (
    count_parameters,
    lm_flops_per_token,
    measure_training_steps,
    mfu,
    peak_flops,
    peak_name,
    training_flops,
)


def _bias_and_norm_parameters(model):
    """Parameters that are not matrices (biases, LayerNorm scales and shifts)."""
    return sum(p.numel() for p in model.parameters() if p.dim() == 1)


@pytest.mark.parametrize("positional", ["rotary", "learned"])
def test_flops_per_token_agree_with_pytorchs_flop_counter(positional):
    """FlopCounterMode counts the matmuls that one forward + backward really runs (2 FLOPs per
    multiply-add). With the math attention backend the scores and weighted sum are two full T x T
    batched matmuls, as our "full" convention counts them. The two conventions differ in one
    known way: ours charges 6 FLOPs per token to every parameter, biases and LayerNorm vectors
    included, while the counter sees only matrix products (addmm's bias add and the norms are
    not counted). So: equal once that term is removed, and within its share overall."""
    torch.manual_seed(0)
    B, T = 3, 16
    model = DecoderLM(50, d_model=32, heads=4, layers=2, context=T, positional=positional)
    x = torch.randint(4, 50, (B, T))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    counted = counter.get_total_flops()
    ours = lm_flops_per_token(model, T) * B * T
    vectors = 6 * _bias_and_norm_parameters(model) * B * T
    assert ours - vectors == counted, f"matrix FLOPs: ours {ours - vectors:,.0f} vs counter {counted:,}"
    assert abs(ours - counted) / counted < 0.04, "the vector parameters are a small share"
    bmm = sum(v for k, v in counter.get_flop_counts()["Global"].items() if "bmm" in str(k))
    assert bmm == 12 * 2 * 32 * T * B * T, f"attention's own matmuls are 12 L d T per token, got {bmm}"


def test_count_parameters_conventions():
    model = DecoderLM(50, d_model=32, heads=4, layers=2, context=16, positional="learned")
    everything = sum(p.numel() for p in model.parameters())
    assert count_parameters(model, non_embedding=False) == everything, "tied weights once"
    table = model.pos.table.numel()
    assert count_parameters(model) == everything - 50 * 32 - table, "embedding and positions excluded"
    untied = DecoderLM(50, d_model=32, heads=4, layers=2, context=16, tie_weights=False)
    assert count_parameters(untied) == count_parameters(model) + 50 * 32, "an untied head is a matrix"
    with pytest.raises(TypeError, match="nn.Module"):
        count_parameters("model")


def test_flops_of_a_meta_model_and_the_causal_convention():
    model = DecoderLM(50, d_model=32, heads=4, layers=2, d_ff=64)
    with torch.device("meta"):
        shapes_only = DecoderLM(50, d_model=32, heads=4, layers=2, d_ff=64)
    assert lm_flops_per_token(shapes_only, 24) == lm_flops_per_token(model, 24)
    full, causal = lm_flops_per_token(model, 24), lm_flops_per_token(model, 24, attention="causal")
    assert full - causal == 12 * 2 * 32 * 24 - 6 * 2 * 32 * 25
    with torch.device("meta"):
        gpt2_small = DecoderLM(50257, d_model=768, heads=12, layers=12, positional="learned", context=1024)
    n = lm_flops_per_token(gpt2_small, 1024)
    # nanoGPT's GPT-2 small: N = 123.7M (124.4M less the position table; the tied head counted once)
    assert 6 * 123e6 < n - 12 * 12 * 768 * 1024 < 6 * 125e6, n
    with pytest.raises(ValueError, match="context must be"):
        lm_flops_per_token(model, 0)
    with pytest.raises(ValueError, match="attention must be"):
        lm_flops_per_token(model, 8, attention="half")
    with pytest.raises(TypeError, match="must be an nn.Module"):
        lm_flops_per_token(dict(vocab_size=50, d_model=32, heads=4, layers=2), 8)
    with pytest.raises(TypeError, match="has no d_model"):
        lm_flops_per_token(torch.nn.Linear(2, 2), 8)


def test_peak_table_and_mfu():
    cuda = torch.device("cuda")
    assert peak_flops(cuda, "bf16", name="NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops(cuda, "bf16", name="NVIDIA H100 PCIe") == 756e12, "PCIe must not match SXM"
    assert peak_flops(cuda, "bf16", name="NVIDIA H100 NVL") == 835e12, "NVL must not match SXM"
    assert peak_flops(cuda, "bf16", name="Tesla T4") is None, "a T4 has no bf16 tensor cores"
    assert peak_flops(torch.device("cpu"), "fp32") is None
    with pytest.raises(ValueError, match="precision must be"):
        peak_flops(cuda, "int8", name="H100")
    assert mfu(1000.0, 2e9, 4e12) == pytest.approx(0.5)
    assert mfu(1000.0, 2e9, None) is None
    for bad in (dict(tokens_per_s=-1.0, flops_per_token=1.0, peak=1.0),
                dict(tokens_per_s=1.0, flops_per_token=float("nan"), peak=1.0),
                dict(tokens_per_s=1.0, flops_per_token=1.0, peak=0.0)):
        with pytest.raises(ValueError, match="mfu"):
            mfu(**bad)
    assert training_flops(dict(d_model=4, d_ff=8, layers=1), 0, 1, 0, 5, 6) == 6 * (64 + 64 + 40)


def test_peaks_match_whole_words_and_follow_the_tf32_setting():
    cuda = torch.device("cuda")
    assert peak_flops(cuda, "bf16", name="NVIDIA L40") == 181e12, "an L40 is not an L4 (121)"
    assert peak_flops(cuda, "bf16", name="NVIDIA L40S") == 362e12
    assert peak_flops(cuda, "bf16", name="NVIDIA L4") == 121e12
    h100 = "NVIDIA H100 80GB HBM3"
    assert peak_flops(cuda, "fp32", name=h100, tf32=False) == 67e12
    assert peak_flops(cuda, "fp32", name=h100, tf32=True) == 495e12
    assert peak_flops(cuda, "tf32", name=h100) == 495e12
    v100 = "Tesla V100-SXM2-16GB"
    assert peak_flops(cuda, "fp32", name=v100, tf32=True) == 15.7e12, "no TF32 before Ampere"
    assert peak_flops(cuda, "tf32", name="Tesla V100-SXM2-16GB") is None
    assert peak_flops(cuda, "fp32", name=h100) == 67e12, "TF32 is off by default"
    with tf32_matmul(True):
        assert peak_flops(cuda, "fp32", name=h100) == 495e12, "fp32 follows set_float32_matmul_precision"
        assert peak_name(cuda, "fp32") == "tf32" and peak_name(torch.device("cpu"), "fp32") == "fp32"
        assert peak_flops(torch.device("cpu"), "fp32") is None
    assert peak_name(cuda, "fp32") == "fp32" and peak_name(cuda, "bf16") == "bf16"


def test_measure_training_steps_times_windows_of_steps(monkeypatch):
    """window=k: one synchronisation per k steps (the host runs ahead inside a window)."""
    import tfmlib.timing as timing

    syncs = []
    monkeypatch.setattr(timing, "synchronize", lambda device: syncs.append(str(device)))
    ticks = itertools.count()
    calls = []
    clock = lambda: 2.0 * next(ticks)  # noqa: E731  (each window spans one tick: 2 s)
    out = measure_training_steps(lambda: calls.append(1), steps=3, warmup=1, device="cpu", window=4,
                                 tokens_per_step=10, clock=clock)
    assert len(calls) == 1 + 3 * 4, "warm-up, then 3 windows of 4 steps"
    assert len(syncs) == 1 + 2 * 3, f"one sync after the warm-up, one before and after each window: {syncs}"
    assert out["step_s"] == 0.5 and out["window"] == 4 and out["tokens_per_s"] == 20.0, out


def test_measure_training_steps_reads_the_timing_helper():
    ticks = itertools.count()
    calls = []
    clock = lambda: 0.5 * next(ticks)  # noqa: E731  (every sample spans one tick: 0.5 s)
    out = measure_training_steps(lambda: calls.append(1), steps=5, warmup=2, device="cpu",
                                 tokens_per_step=1000, flops_per_token=2e6, peak=None, clock=clock)
    assert len(calls) == 7, "warm-up steps run but are not timed"
    assert out["step_s"] == 0.5 and out["tokens_per_s"] == 2000.0, out
    assert out["model_flops_per_s"] == 4e9 and out["mfu"] is None and out["device"] == "cpu"
    assert out["steps"] == 5 and out["step_s_q1"] == out["step_s_q3"] == 0.5
    with pytest.raises(ValueError, match="tokens_per_step"):
        measure_training_steps(lambda: None, steps=1, device="cpu", tokens_per_step=0)
    with pytest.raises(ValueError, match="repeats"):
        measure_training_steps(lambda: None, steps=0, device="cpu", tokens_per_step=1)

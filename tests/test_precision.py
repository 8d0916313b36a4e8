"""tfmlib.precision and fit's ``precision`` argument (chapter 10)."""

import contextlib

import pytest
import torch
from torch import nn

import tfmlib.precision as precision_module
from tfmlib.precision import (
    autocast,
    cpu_bf16_features,
    fp32_matmul_is_tf32,
    make_grad_scaler,
    pick_precision,
    supports_bf16,
    tf32_matmul,
)
from tfmlib.train import fit


def classification(n=96, seed=0, batch=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.randn(8, 4, generator=g)).argmax(-1)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n, batch)]


def ce(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y), len(y)


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 4))


def fake_cuda(monkeypatch, bf16: bool):
    """CUDA present; a GPU with native bf16 (Ampere+) or one without (a V100 or a T4), where
    torch.cuda.is_bf16_supported() says True by default because bf16 runs there emulated."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: bf16 or including_emulation)


def test_pick_precision_resolves_auto_per_device(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_fast_bf16", lambda: True)
    assert supports_bf16("cpu") and pick_precision("cpu") == "bf16", "a CPU with bf16 instructions: bf16"
    explicit = ("fp32", "bf16", "fp16")
    assert [pick_precision(torch.device("cpu"), p) for p in explicit] == list(explicit)
    assert pick_precision("meta") == "fp32", "a device without autocast gets fp32"
    with pytest.raises(ValueError, match="meta cannot compute in bf16.*it can: fp32"):
        pick_precision("meta", "bf16")
    with pytest.raises(ValueError, match="requested must be 'auto'.*got 'float16'"):
        pick_precision("cpu", "float16")
    fake_cuda(monkeypatch, bf16=True)
    assert pick_precision("cuda") == "bf16"
    fake_cuda(monkeypatch, bf16=False)  # a V100 or a T4
    assert pick_precision("cuda") == "fp16" and pick_precision("cuda", "fp32") == "fp32"
    with pytest.raises(ValueError, match="cannot compute in bf16"):
        pick_precision("cuda", "bf16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_precision("cuda") == "fp32", "no CUDA at all: nothing to autocast"


def test_auto_on_a_cpu_follows_its_bf16_instructions(monkeypatch):
    """bf16 is emulated (slower than fp32) on CPUs without bf16 instructions: "auto" must not pick it
    there, and must pick it where they exist; an explicit bf16 stays allowed on both."""
    monkeypatch.setattr(precision_module, "cpu_has_fast_bf16", lambda: False)
    assert pick_precision("cpu") == "fp32", "no AVX512-BF16/AMX/Arm BF16: bf16 would be emulated"
    assert pick_precision("cpu", "bf16") == "bf16", "asking for bf16 explicitly is still allowed"
    monkeypatch.setattr(precision_module, "cpu_has_fast_bf16", lambda: True)
    assert pick_precision("cpu") == "bf16"


def test_cpu_bf16_features_read_proc_cpuinfo(tmp_path):
    x86_old = tmp_path / "avx2"
    x86_old.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n\nprocessor\t: 1\n"
                       "flags\t\t: fpu sse2 avx avx2 fma avx512f\n")
    x86_new = tmp_path / "spr"
    x86_new.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    arm_old = tmp_path / "arm_old"
    arm_old.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n")
    assert cpu_bf16_features(x86_old) == set(), "avx512f alone is not avx512_bf16"
    assert cpu_bf16_features(x86_new) == {"avx512_bf16", "amx_bf16"}
    assert cpu_bf16_features(arm) == {"bf16"}
    assert cpu_bf16_features(arm_old) == set()


def test_tf32_switch_is_read_back_and_restored():
    before = torch.get_float32_matmul_precision()
    assert not fp32_matmul_is_tf32(), "PyTorch's default: float32 products in IEEE float32"
    with tf32_matmul(True):
        assert fp32_matmul_is_tf32() and torch.get_float32_matmul_precision() == "high"
        with tf32_matmul(False):
            assert not fp32_matmul_is_tf32()
        assert fp32_matmul_is_tf32(), "the inner block restores the outer setting"
    assert torch.get_float32_matmul_precision() == before and not fp32_matmul_is_tf32()
    with pytest.raises(TypeError, match="enabled must be a bool"):
        with tf32_matmul("yes"):
            pass
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with tf32_matmul(True):
        c = a @ b
    assert torch.equal(c, a @ b), "on the CPU TF32 changes nothing: the same float32 products"


def test_autocast_runs_linear_layers_in_bf16_and_losses_in_fp32(monkeypatch):
    model = mlp()
    x, y = classification()[0]
    seen = {}
    model[0].register_forward_hook(lambda m, i, out: seen.__setitem__("linear", out.dtype))
    assert isinstance(autocast("cpu", "fp32"), contextlib.nullcontext)
    with autocast("cpu", "fp32"):
        model(x)
    assert seen["linear"] == torch.float32
    with autocast("cpu", "bf16"):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    assert seen["linear"] == torch.bfloat16 and logits.dtype == torch.bfloat16, "matmuls run in bf16"
    assert loss.dtype == torch.float32, "cross_entropy is on the CPU's autocast-to-float32 list"
    assert all(p.dtype == torch.float32 for p in model.parameters()), "the weights stay fp32"
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters()), "so do their gradients"
    monkeypatch.setattr(precision_module, "cpu_has_fast_bf16", lambda: True)
    with autocast("cpu", "auto"):
        model(x)
    assert seen["linear"] == torch.bfloat16, "auto is bf16 on a CPU with bf16 instructions"
    monkeypatch.setattr(precision_module, "cpu_has_fast_bf16", lambda: False)
    with autocast("cpu", "auto"):
        model(x)
    assert seen["linear"] == torch.float32, "and fp32 on one without"


def test_grad_scaler_is_enabled_only_for_fp16():
    assert make_grad_scaler("cpu", "fp16").is_enabled()
    assert not make_grad_scaler("cpu", "bf16").is_enabled()
    assert not make_grad_scaler("cpu", "fp32").is_enabled()
    loss = torch.tensor(2.0)
    assert make_grad_scaler("cpu", "bf16").scale(loss) is loss, "a disabled scaler passes the loss through"
    assert make_grad_scaler("cpu", "fp16").scale(loss).item() == 2.0 * 2**16


def test_fit_in_bf16_trains_in_bf16_and_keeps_fp32_weights_and_optimizer_state(monkeypatch):
    dtypes = []

    def run(precision):
        model = mlp()
        model[0].register_forward_hook(lambda m, i, out: dtypes.append(out.dtype) if m.training else None)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        hist = fit(model, classification(), ce, opt, epochs=5, verbose=False, precision=precision)
        return model, opt, hist

    model, opt, bf16 = run("bf16")
    assert set(dtypes) == {torch.bfloat16} and len(dtypes) == 5 * 6, "every training forward ran in bf16"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items() if k != "step"), \
        "Adam's moments are fp32"
    dtypes.clear()
    _, _, fp32 = run("fp32")
    assert set(dtypes) == {torch.float32}
    assert bf16.step_loss != fp32.step_loss, "bf16 rounds: the losses are not bit-equal"
    assert bf16.step_loss[0] == pytest.approx(fp32.step_loss[0], rel=0.02), "but close"
    assert bf16.epochs[-1]["train_loss"] < bf16.epochs[0]["train_loss"] * 0.7, "and it learns"
    assert bf16.skipped_steps == 0, "no scaler in bf16"
    monkeypatch.setattr(precision_module, "cpu_has_fast_bf16", lambda: True)
    dtypes.clear()
    run("auto")
    assert set(dtypes) == {torch.bfloat16}, "auto means bf16 on a CPU with bf16 instructions"
    with pytest.raises(ValueError, match="requested must be"):
        fit(mlp(), classification(), ce, torch.optim.SGD(mlp().parameters(), lr=0.1), epochs=1,
            precision="half")


def exploding(n_batches=12):
    """Targets of 1000: the scaled gradient of the output (2 * 1000 * 65536 / 8) overflows fp16."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 8, generator=g), torch.full((8,), 1000.0)) for _ in range(n_batches)]


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1), y), len(y)


def test_fit_in_fp16_uses_the_grad_scaler_and_counts_skipped_steps():
    """CPU fp16 autocast works in torch 2.13, so the scaler path runs here as it would on a GPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 1))
    changed = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):  # called by scaler.step only when the gradients are finite
            changed.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
            return super().step(closure)

    hist = fit(model, exploding(), mse, Spy(model.parameters(), lr=1e-4), epochs=1, verbose=False,
               precision="fp16", clip_norm=0.5, log_every=5)
    assert len(hist.step_loss) == 12 and all(v == v for v in hist.step_loss), "skipped steps are no error"
    assert hist.skipped_steps >= 1, "the first scale, 65536, overflows fp16's gradients"
    assert len(changed) == 12 - hist.skipped_steps, "the optimizer stepped exactly on the finite steps"
    # clipping saw unscaled gradients: their clipped norm is clip_norm, not clip_norm / scale
    assert changed and all(n == pytest.approx(0.5, rel=1e-3) for n in changed), changed
    # the same run in fp32 never skips
    torch.manual_seed(0)
    model32 = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 1))
    assert fit(model32, exploding(), mse, torch.optim.SGD(model32.parameters(), lr=1e-4), epochs=1,
               verbose=False).skipped_steps == 0


def test_a_non_finite_loss_is_still_an_error_in_fp16():
    batches = exploding(3)
    batches[1] = (torch.full((8, 8), float("nan")), torch.zeros(8))
    model = nn.Linear(8, 1)
    with pytest.raises(ValueError, match="loss became nan at step 2"):
        fit(model, batches, mse, torch.optim.SGD(model.parameters(), lr=1e-4), epochs=1, verbose=False,
            precision="fp16")


def test_set_tf32_switches_matmul_and_cudnn_together():
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        precision_module.set_tf32(True)
        assert precision_module.fp32_matmul_is_tf32() and precision_module.cudnn_is_tf32()
        precision_module.set_tf32(False)
        assert not precision_module.fp32_matmul_is_tf32() and not precision_module.cudnn_is_tf32()
        assert torch.backends.cudnn.rnn.fp32_precision != "tf32", "the RNN flag follows the legacy switch"
        with pytest.raises(TypeError, match="enabled must be a bool"):
            precision_module.set_tf32(1)
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn

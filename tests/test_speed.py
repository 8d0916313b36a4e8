"""tfmlib.speed (chapter 10): the fused AdamW where it exists, a micro-batch sized to free memory."""

import pytest
import torch
from torch import nn

from tfmlib.speed import fused_adamw_supported, largest_batch_that_fits, make_adamw, micro_batch_for_memory


def test_fused_adamw_is_chosen_where_the_device_has_it_and_equals_the_loop():
    torch.manual_seed(0)
    a, b = nn.Linear(6, 3), nn.Linear(6, 3)
    b.load_state_dict(a.state_dict())
    fused = make_adamw(a.parameters(), lr=1e-2, weight_decay=0.1)
    assert fused.defaults["fused"] is True, "torch 2.13 has fused AdamW kernels on the CPU"
    plain = make_adamw(b.parameters(), lr=1e-2, weight_decay=0.1, fused=False)
    assert not plain.defaults["fused"]
    x = torch.randn(8, 6)
    for _ in range(3):
        for model, opt in ((a, fused), (b, plain)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_device_or_dtype_without_fused_kernels_falls_back():
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    assert not fused_adamw_supported(model.parameters())
    opt = make_adamw(model.parameters(), lr=1e-3)
    assert not opt.defaults["fused"], "meta tensors have no fused kernel: the default implementation"
    complex_param = nn.Parameter(torch.randn(3, dtype=torch.complex64))
    assert not fused_adamw_supported([complex_param])
    opt = make_adamw([complex_param], lr=1e-3)
    complex_param.grad = torch.ones_like(complex_param)
    opt.step()                                           # the fallback steps where fused would raise
    insisted = make_adamw([complex_param], lr=1e-3, fused=True)
    with pytest.raises(RuntimeError, match="fused=True"):
        insisted.step()
    with pytest.raises(ValueError, match="params is empty"):
        make_adamw([], lr=1e-3)


def test_largest_batch_that_fits_is_the_arithmetic():
    gib = 2**30
    # 2 GiB fixed + 1 GiB per row in 80% of 20 GiB = 16 GiB: 14 rows
    assert largest_batch_that_fits(2 * gib, gib, 20 * gib, fraction=0.8) == 14
    assert largest_batch_that_fits(2 * gib, gib, 20 * gib, fraction=0.8, multiple_of=4) == 12
    assert largest_batch_that_fits(2 * gib, gib, 20 * gib, fraction=0.8, maximum=8) == 8
    assert largest_batch_that_fits(20 * gib, gib, 20 * gib) == 0, "not even one row"
    with pytest.raises(ValueError, match="fraction"):
        largest_batch_that_fits(0, 1, 1, fraction=1.5)


def test_micro_batch_on_the_cpu_is_the_given_one_and_on_cuda_from_two_measurements():
    built = []

    def step_at(rows: int):
        built.append(rows)
        return lambda: None

    cpu = micro_batch_for_memory(step_at, "cpu", default=16)
    assert cpu.rows == 16 and "cpu" in cpu.reason and built == [], "the CPU path measures nothing"
    mib = 2**20
    fake_peaks = {2: 300 * mib, 4: 500 * mib}           # 100 MiB per row + 100 MiB fixed
    current = {}

    def fake_step_at(rows: int):
        current["rows"] = rows
        return lambda: None

    choice = micro_batch_for_memory(fake_step_at, torch.device("cuda"), default=16, probe=(2, 4),
                                    fraction=0.5,
                                    measure=lambda step, device: fake_peaks[current["rows"]],
                                    free=lambda device: 8 * 1024 * mib)
    # 50% of 8 GiB = 4096 MiB; (4096 - 100) / 100 = 39.96 -> 39 rows
    assert choice.rows == 39 and choice.per_row_bytes == 100 * mib and choice.fixed_bytes == 100 * mib, choice
    with pytest.raises(ValueError, match="probe"):
        micro_batch_for_memory(step_at, "cpu", default=4, probe=(4, 2))

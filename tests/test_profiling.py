"""tfmlib.profiling (chapter 10): host reads counted, a training step of fit with lm_loss reads nothing
back per step, and torch.profiler's table of a step."""

import pytest
import torch

from tfmlib.lm import DecoderLM
from tfmlib.profiling import count_host_reads, profile_steps
from tfmlib.rnn import lm_loss
from tfmlib.speed import make_adamw
from tfmlib.train import fit


def test_host_reads_are_counted_once_each_and_the_methods_restored():
    original = torch.Tensor.item
    t = torch.tensor([1.5, 2.0])
    with count_host_reads() as reads:
        t[0].item()
        int(t[1])
        float(t[0])
        t.tolist()
        if t.sum() > 0:           # __bool__
            pass
        f"{t[0]:.2f}"             # __format__ calls item: counted once, as item
        t + 1                     # no read
    assert reads.calls == {"item": 2, "__int__": 1, "__float__": 1, "tolist": 1, "__bool__": 1}, reads.calls
    assert reads.total == 6 and "6 host read(s)" in str(reads)
    assert torch.Tensor.item is original, "the methods are restored after the block"
    with pytest.raises(RuntimeError, match="inside"):
        with count_host_reads():
            raise RuntimeError("inside")
    assert torch.Tensor.item is original, "and restored when the block raises"


def tiny_lm_batches(n: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(4, 40, (4, 16), generator=g), torch.randint(4, 40, (4, 16), generator=g))
            for _ in range(n)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fit_with_lm_loss_reads_nothing_back_per_step(precision):
    """The reads of a run of fit must not grow with its steps: the losses and token counts stay on the
    device and are read together (fit's log_every), the fused AdamW reads no step counter."""
    totals = {}
    for steps in (4, 12):
        torch.manual_seed(0)
        model = DecoderLM(40, d_model=32, heads=2, layers=1, context=16)
        optimizer = make_adamw(model.parameters(), lr=1e-3)
        with count_host_reads() as reads:
            fit(model, tiny_lm_batches(steps), lm_loss, optimizer, epochs=1, precision=precision,
                verbose=False)
        totals[steps] = reads.total
    assert totals[12] == totals[4], f"host reads grow with the steps: {totals}"
    assert totals[12] <= 3, f"a handful of reads per epoch at most: {totals}"


def test_profile_of_a_training_step_ranks_the_operators():
    torch.manual_seed(0)
    model = DecoderLM(40, d_model=32, heads=2, layers=1, context=16)
    optimizer = make_adamw(model.parameters(), lr=1e-3)
    batch = tiny_lm_batches(1)[0]

    def step() -> None:
        loss, _ = lm_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    prof = profile_steps(step, device="cpu", steps=2, warmup=1)
    names = [op.name for op in prof.ops]
    assert any(n in ("aten::mm", "aten::addmm") for n in names), names[:10]
    assert any("adamw" in n.lower() for n in names), "the fused optimizer is one of the operators"
    assert prof.ops == tuple(sorted(prof.ops, key=lambda o: -o.ms_per_step)), "largest self time first"
    assert sum(op.share for op in prof.ops) == pytest.approx(1.0)
    assert 0 < prof.busy_ms <= prof.wall_ms and prof.gap_ms >= 0 and prof.clock == "cpu"
    assert 0 < prof.share_of("aten::mm", "aten::addmm") < 1
    table = prof.table(top=5)
    assert "ms/step" in table and "gaps" in table and "others" in table
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        profile_steps(step, device="cpu", steps=0)
    with pytest.raises(TypeError, match="callable"):
        profile_steps(None, device="cpu")

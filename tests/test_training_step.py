"""tfmlib.training_step: the arithmetic of one optimiser step (chapter 10's view of fit's step)."""

import pytest
import torch
from torch import nn

from tfmlib.training_step import StepResult, TrainingStep, check_token_count, ddp_world_size, token_count


def batches(seed=0, sizes=(3, 5, 2)):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 4, generator=g, dtype=torch.float64),
             torch.randn(n, generator=g, dtype=torch.float64)) for n in sizes]


def model_and_optimizer(lr=0.1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, opt


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1), y)


def test_the_default_step_is_the_tutorial_step_bit_for_bit():
    """fp32, one batch a step: zero_grad, backward, clip, optimizer.step, scheduler.step."""
    data = batches()
    model, opt = model_and_optimizer()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    step = TrainingStep(model, opt, clip_norm=0.3, scheduler=sched)
    ref, ref_opt = model_and_optimizer()
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 1, 0.5)
    for batch in data:
        with step.forward():
            loss = mse(model, batch)
        assert step.backward(loss, len(batch[1])), "without accumulation every batch completes a step"
        result = step.step()
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = mse(ref, batch)
        ref_loss.backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 0.3)
        ref_opt.step()
        ref_sched.step()
        assert isinstance(result, StepResult) and result.skipped is None
        assert torch.equal(result.loss, ref_loss.detach()) and result.n_tokens == len(batch[1])
    assert step.steps == 3 and sched.last_epoch == 3
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def test_accumulation_waits_for_the_group_and_weights_batches_by_tokens():
    data = batches()
    model, opt = model_and_optimizer()
    step = TrainingStep(model, opt, accumulate=3, clip_norm=None)
    done = []
    for batch in data:
        with step.forward():
            loss = mse(model, batch)
        done.append(step.backward(loss, len(batch[1])))
    assert done == [False, False, True] and step.group_open()
    result = step.step()
    assert not step.group_open() and step.steps == 1
    # the step's loss is the token-weighted mean: the loss of the three batches as one
    x = torch.cat([b[0] for b in data])
    y = torch.cat([b[1] for b in data])
    ref, ref_opt = model_and_optimizer()
    one = mse(ref, (x, y))
    assert result.n_tokens == 10
    assert torch.allclose(result.loss, one.detach(), rtol=1e-12, atol=0)
    one.backward()
    ref_opt.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_a_short_group_steps_when_asked():
    model, opt = model_and_optimizer()
    step = TrainingStep(model, opt, accumulate=4)
    for batch in batches()[:2]:
        with step.forward():
            assert not step.backward(mse(model, batch), len(batch[1]))
    assert step.group_open()
    result = step.step()
    assert result.n_tokens == 8 and step.steps == 1 and not step.group_open()


def test_fp16_reports_a_skipped_step_on_the_device():
    """A gradient that overflows fp16's scaled range is skipped by the scaler; the step says so in
    a 0-d bool tensor (read later, with the losses)."""
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = TrainingStep(model, opt, precision="fp16", clip_norm=None)
    assert step.scaler is not None and step.precision == "fp16"
    before = [p.detach().clone() for p in model.parameters()]
    with step.forward():
        loss = model(torch.full((2, 4), 1e4)).float().pow(2).mean()  # its scaled gradient overflows
    step.backward(loss, 2)
    result = step.step()
    assert result.skipped is not None and result.skipped.dtype == torch.bool and bool(result.skipped)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "not stepped"


def test_bad_losses_and_counts_are_errors_naming_the_step():
    model, opt = model_and_optimizer()
    step = TrainingStep(model, opt)
    x, y = batches()[0]
    with pytest.raises(TypeError, match=r"the loss is \(3,\) at step 1"):
        step.backward((model(x).squeeze(-1) - y) ** 2, 3)
    with pytest.raises(TypeError, match="n_tokens an int >= 0, got 2.5 at step 1"):
        step.backward(mse(model, (x, y)), 2.5)
    assert token_count(torch.tensor(4), 1) == 4
    count = torch.tensor(7)
    assert check_token_count(count, 1) is not count and torch.equal(check_token_count(count, 1), count)
    with pytest.raises(TypeError, match="got True"):
        token_count(True, 2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="TrainingStep: accumulate must be an int >= 1"):
            TrainingStep(model, opt, accumulate=bad)
    with pytest.raises(ValueError, match="TrainingStep: clip_norm must be positive or None"):
        TrainingStep(model, opt, clip_norm=0.0)


def test_no_ddp_world_without_a_process_group():
    model = nn.Linear(2, 2)
    assert ddp_world_size(model) is None
    assert TrainingStep(model, torch.optim.SGD(model.parameters(), lr=1.0), accumulate=2).ddp_world is None


def test_accumulated_gradients_stay_the_size_of_one_batch_before_the_division():
    """Each batch is weighted by n_i / n_ref (n_ref: the group's first count), not by n_i: the summed
    gradient is a few times one batch's, whatever the token counts (fp16's scaled gradients would
    overflow n_i times sooner), and the step divides by sum(n_i) / n_ref: the same step."""
    data = batches(sizes=(300, 100, 200))
    model, opt = model_and_optimizer()
    step = TrainingStep(model, opt, accumulate=3, clip_norm=None)
    grads = []
    for batch in data:
        ref, _ = model_and_optimizer()
        ref.load_state_dict(model.state_dict())
        mse(ref, batch).backward()
        grads.append([p.grad.clone() for p in ref.parameters()])
        with step.forward():
            step.backward(mse(model, batch), len(batch[1]))
    for k, p in enumerate(model.parameters()):
        expected = sum(n / 300 * g[k] for n, g in zip((300, 100, 200), grads, strict=True))
        assert torch.allclose(p.grad, expected, rtol=1e-12, atol=0), "weights n_i / n_ref before the step"


def test_the_scale_is_read_without_a_host_sync_and_without_the_private_method_too(monkeypatch):
    from tfmlib.training_step import scale_on_device

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale tensor exists once the scaler has scaled something
    monkeypatch.setattr(torch.Tensor, "item", lambda self: (_ for _ in ()).throw(AssertionError("item()")))
    scale = scale_on_device(scaler)
    monkeypatch.undo()
    assert isinstance(scale, torch.Tensor) and float(scale) == 1024.0

    class PublicOnly:  # a GradScaler without the private method: the public, syncing getter
        def get_scale(self):
            return 256.0

    assert float(scale_on_device(PublicOnly())) == 256.0

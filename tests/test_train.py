from collections import namedtuple

import pytest
import torch
from torch import nn

from tfmlib.data import Vocab
from tfmlib.train import (
    CheckpointError,
    History,
    TimeGuardWarning,
    fit,
    load_checkpoint,
    move_to,
    perplexity,
    save_checkpoint,
    transformer_peak_lr,
    warmup_inverse_sqrt,
)


def regression_problem(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    return [(x[i:i + 32], y[i:i + 32]) for i in range(0, n, 32)]


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1), y), len(y)


def test_fit_learns_and_records_history():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    batches = regression_problem()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    hist = fit(model, batches, mse, opt, epochs=30, verbose=False,
               eval_fn=lambda m: {"valid_loss": mse(m, batches[0])[0].item()})
    assert len(hist.step_loss) == 30 * len(batches) and len(hist.epochs) == 30
    assert hist.metric("valid_loss")[-1] < 1e-3 < hist.metric("valid_loss")[0]
    assert hist.epochs[-1]["train_loss"] < hist.epochs[0]["train_loss"] / 100
    assert torch.allclose(model.weight.detach(), torch.tensor([[1.0, -2.0, 0.5, 3.0]]), atol=0.02)
    assert {"epoch", "train_loss", "seconds", "tokens_per_second", "valid_loss"} <= set(hist.epochs[0])
    with pytest.raises(KeyError, match="bleu"):
        hist.metric("bleu")


def test_fit_clips_gradients():
    model = nn.Linear(4, 1)
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
            return super().step(closure)

    big = [(torch.full((8, 4), 100.0), torch.zeros(8))]
    fit(model, big, mse, Spy(model.parameters(), lr=0.0), epochs=1, clip_norm=0.5, verbose=False)
    assert seen[0] == pytest.approx(0.5, rel=1e-4)


def test_fit_stops_at_max_steps_and_rejects_bad_input():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hist = fit(model, regression_problem(), mse, opt, epochs=5, max_steps=3, verbose=False)
    assert len(hist.step_loss) == 3 and len(hist.epochs) == 1
    with pytest.raises(ValueError, match="epochs"):
        fit(model, regression_problem(), mse, opt, epochs=0)
    with pytest.raises(ValueError, match="no batches"):
        fit(model, [], mse, opt, epochs=1, verbose=False)
    nan_batches = [(torch.full((2, 4), float("nan")), torch.zeros(2))]
    with pytest.raises(ValueError, match="loss became nan"):
        fit(model, nan_batches, mse, opt, epochs=1, verbose=False)


def test_move_to_handles_nested_batches():
    # the "meta" device exists everywhere, so the move is visible without a GPU
    b = move_to({"x": (torch.ones(1), [torch.zeros(1)]), "n": 3}, "meta")
    assert b["n"] == 3 and b["x"][0].device.type == "meta" and b["x"][1][0].device.type == "meta"
    assert isinstance(b["x"], tuple) and isinstance(b["x"][1], list)
    Pair = namedtuple("Pair", "inputs targets")
    p = move_to(Pair(torch.ones(2), torch.zeros(2)), "meta")
    assert isinstance(p, Pair) and p.inputs.device.type == p.targets.device.type == "meta"


def test_fit_evaluates_in_eval_mode_without_grad_and_steps_the_scheduler():
    model = nn.Sequential(nn.Linear(4, 1), nn.Dropout(0.5))
    seen = []

    def eval_fn(m):
        seen.append((m.training, torch.is_grad_enabled()))
        return {}

    def loss_fn(m, batch):
        assert m.training, "training steps run in train mode"
        return mse(m, batch)

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    batches = regression_problem(n=96)  # 3 batches
    fit(model, batches, loss_fn, opt, epochs=2, eval_fn=eval_fn, scheduler=sched, verbose=False)
    assert seen == [(False, False), (False, False)]
    assert sched.last_epoch == 6 and opt.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**6)


def test_fit_stops_at_the_time_budget_and_says_so():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.warns(TimeGuardWarning, match="stopped training after 1 optimiser steps"):
        hist = fit(model, regression_problem(), mse, opt, epochs=3, time_budget_s=1e-9, verbose=False)
    assert len(hist.step_loss) == 1 and len(hist.epochs) == 1
    assert hist.stopped_by == "time_budget_s" and hist.cut_by_time
    for bad in (0, 0.0, -1.0, True):
        with pytest.raises(ValueError, match="time_budget_s"):
            fit(model, regression_problem(), mse, opt, epochs=1, time_budget_s=bad, verbose=False)


def test_history_says_which_limit_ended_the_run():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = regression_problem()  # 8 batches
    assert fit(model, batches, mse, opt, epochs=2, verbose=False).stopped_by == "epochs"
    # a generous guard that does not fire leaves the count in charge
    hist = fit(model, batches, mse, opt, epochs=2, time_budget_s=3600.0, verbose=False)
    assert hist.stopped_by == "epochs" and not hist.cut_by_time and len(hist.step_loss) == 16
    hist = fit(model, batches, mse, opt, epochs=2, max_steps=5, time_budget_s=3600.0, verbose=False)
    assert hist.stopped_by == "max_steps" and len(hist.step_loss) == 5
    # the count wins when both are reached at the same step
    hist = fit(model, batches, mse, opt, epochs=2, max_steps=1, time_budget_s=1e-9, verbose=False)
    assert hist.stopped_by == "max_steps"
    assert History.from_dict(hist.to_dict()).stopped_by == "max_steps"
    assert History.from_dict({"step_loss": [], "epochs": [], "evals": []}).stopped_by == "epochs"


def test_tfm_time_scale_shrinks_the_guard_as_on_a_slower_device(monkeypatch):
    """The slow-device simulation: a guard that an hour would not reach fires after one step."""
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = regression_problem()
    monkeypatch.setenv("TFM_TIME_SCALE", "1e-12")
    with pytest.warns(TimeGuardWarning, match="time_budget_s=3600 x TFM_TIME_SCALE=1e-12"):
        hist = fit(model, batches, mse, opt, epochs=2, time_budget_s=3600.0, verbose=False)
    assert hist.cut_by_time and len(hist.step_loss) == 1
    # no guard, nothing to shrink: the count decides
    assert fit(model, batches, mse, opt, epochs=1, verbose=False).stopped_by == "epochs"
    monkeypatch.setenv("TFM_TIME_SCALE", "2")  # a faster device: the guard grows
    hist = fit(model, batches, mse, opt, epochs=1, time_budget_s=3600.0, verbose=False)
    assert hist.stopped_by == "epochs" and len(hist.step_loss) == 8
    for bad in ("0", "-1", "inf", "nan", "fast"):
        monkeypatch.setenv("TFM_TIME_SCALE", bad)
        with pytest.raises(ValueError, match="TFM_TIME_SCALE"):
            fit(model, batches, mse, opt, epochs=1, time_budget_s=10.0, verbose=False)


def test_fit_evaluates_every_n_steps_and_after_the_last():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []

    def eval_fn(m):
        seen.append((m.training, torch.is_grad_enabled()))
        return {"weight_norm": m.weight.norm().item()}

    batches = regression_problem()  # 8 batches per epoch, 24 steps in 3 epochs
    hist = fit(model, batches, mse, opt, epochs=3, eval_fn=eval_fn, eval_every=5, verbose=False)
    assert [e["step"] for e in hist.evals] == [5, 10, 15, 20, 24]
    assert seen == [(False, False)] * 5 and model.training, "eval mode only while evaluating"
    assert all("weight_norm" not in e for e in hist.epochs), "per-step evaluations stay out of the epochs"
    assert hist.evals[-1]["weight_norm"] == pytest.approx(model.weight.norm().item())
    seconds = [e["seconds"] for e in hist.evals]
    assert seconds == sorted(seconds) and seconds[-1] == pytest.approx(hist.seconds, abs=0.05)
    # stopping early evaluates the last step taken, once
    hist = fit(model, batches, mse, opt, epochs=3, eval_fn=eval_fn, eval_every=5, max_steps=10, verbose=False)
    assert [e["step"] for e in hist.evals] == [5, 10]
    hist = fit(model, batches, mse, opt, epochs=3, eval_fn=eval_fn, eval_every=100, max_steps=7,
               verbose=False)
    assert [e["step"] for e in hist.evals] == [7]
    # once per epoch (no eval_every): recorded in both places
    hist = fit(model, batches, mse, opt, epochs=2, eval_fn=eval_fn, verbose=False)
    assert [e["step"] for e in hist.evals] == [8, 16] and hist.metric("weight_norm") == \
        [e["weight_norm"] for e in hist.evals]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="eval_every"):
            fit(model, batches, mse, opt, epochs=1, eval_fn=eval_fn, eval_every=bad)
    with pytest.raises(ValueError, match="eval_every needs an eval_fn"):
        fit(model, batches, mse, opt, epochs=1, eval_every=2)


def test_evaluation_time_is_not_training_time():
    """A slow eval_fn neither shows up in the recorded seconds nor eats the time budget."""
    import time

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def slow_eval(m):
        time.sleep(0.2)
        return {}

    batches = regression_problem()
    hist = fit(model, batches, mse, opt, epochs=2, eval_fn=slow_eval, eval_every=4, verbose=False)
    assert len(hist.evals) == 4
    assert hist.seconds < 0.2, f"4 evaluations of 0.2 s leaked into the training time ({hist.seconds:.2f} s)"
    assert all(e["seconds"] < 0.2 for e in hist.evals)
    # a 0.3 s budget with 0.2 s evaluations every 2 steps: counting them would stop after 4 steps
    hist = fit(model, batches, mse, opt, epochs=1, eval_fn=slow_eval, eval_every=2, time_budget_s=0.3,
               verbose=False)
    assert len(hist.step_loss) == len(batches), "the evaluations used up the training budget"
    hist = fit(model, batches, mse, opt, epochs=2, eval_fn=slow_eval, verbose=False)
    assert hist.seconds < 0.2, "per-epoch evaluations leaked into the training time"


def test_fit_checks_what_the_loss_function_returns():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    per_example = lambda m, b: (nn.functional.mse_loss(m(b[0]).squeeze(-1), b[1], reduction="none"), 2)  # noqa: E731
    with pytest.raises(TypeError, match=r"the loss is \(32,\) at step 1"):
        fit(model, regression_problem(), per_example, opt, epochs=1, verbose=False)
    with pytest.raises(TypeError, match="n_tokens an int >= 0, got 2.5"):
        fit(model, regression_problem(), lambda m, b: (mse(m, b)[0], 2.5), opt, epochs=1, verbose=False)
    hist = fit(model, regression_problem(), lambda m, b: (mse(m, b)[0], torch.tensor(len(b[1]))), opt,
               epochs=1, verbose=False)  # a 0-d integer tensor is a count too
    assert len(hist.epochs) == 1
    with pytest.raises(ValueError, match="clip_norm"):
        fit(model, regression_problem(), mse, opt, epochs=1, clip_norm=0.0)


def test_perplexity():
    assert perplexity(0.0) == 1.0
    assert perplexity(torch.log(torch.tensor(50.0)).item()) == pytest.approx(50.0)
    assert perplexity(1e4) == float("inf")  # overflow is an infinite perplexity, not a crash


def make_model():
    return nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.tensor([1, 2])).sum().backward()
    opt.step()
    vocab = Vocab.build([["le", "chat"]])
    path = save_checkpoint(tmp_path / "ck" / "m.pt", model, opt, vocabs={"tgt": vocab},
                           config={"hidden": 4, "layers": [1, 2], "name": "x"})
    fresh, fresh_opt = make_model(), None
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    ck = load_checkpoint(path, fresh, fresh_opt)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert ck.vocabs["tgt"] == vocab and ck.config["layers"] == [1, 2]
    assert fresh_opt.state_dict()["state"][0]["step"] == 1


def test_checkpoint_errors(tmp_path):
    model = make_model()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt", model)
    path = save_checkpoint(tmp_path / "m.pt", model)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(corrupt, model)
    torch.save({"weights": torch.ones(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a tfmlib-checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    other_size = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
    with pytest.raises(CheckpointError, match="shape mismatches.*0.weight"):
        load_checkpoint(path, other_size)
    with pytest.raises(CheckpointError, match="holds a Sequential, not a Linear"):
        load_checkpoint(path, nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="config"):
        save_checkpoint(tmp_path / "x.pt", model, config={"device": torch.device("cpu")})
    with pytest.raises(TypeError, match=r"vocabs\['src'\] must be a Vocab, got list"):
        save_checkpoint(tmp_path / "x.pt", model, vocabs={"src": ["<pad>"]})


def test_checkpoint_damaged_payload_and_wrong_optimizer(tmp_path):
    model = make_model()
    torch.save({"format": "tfmlib-checkpoint-1", "model": model.state_dict()}, tmp_path / "half.pt")
    with pytest.raises(CheckpointError, match="damaged.*model_class"):
        load_checkpoint(tmp_path / "half.pt")
    opt = torch.optim.Adam(model.parameters())
    path = save_checkpoint(tmp_path / "m.pt", model, opt)
    one_group = torch.optim.Adam([next(model.parameters())])
    with pytest.raises(CheckpointError, match="optimizer state does not fit"):
        load_checkpoint(path, model, one_group)


def test_checkpoint_refuses_code_in_the_file(tmp_path):
    """weights_only loading never unpickles arbitrary objects."""
    path = tmp_path / "evil.pt"
    torch.save({"format": "tfmlib-checkpoint-1", "model": History()}, path)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(path)


def test_warmup_inverse_sqrt_rises_linearly_then_decays_as_one_over_root():
    f = warmup_inverse_sqrt(4)
    assert [f(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f(15) == pytest.approx(0.5)          # s = 16: sqrt(4 / 16)
    d, w = 512, 4000
    peak = transformer_peak_lr(d, w)
    for step in (0, 100, 3999, 4000, 20_000):   # the paper's formula, eq. (3)
        s = step + 1
        assert peak * warmup_inverse_sqrt(w)(step) == pytest.approx(d ** -0.5 * min(s ** -0.5, s * w ** -1.5))
    with pytest.raises(ValueError, match="positive int"):
        warmup_inverse_sqrt(0)


# ------------------------------------------------------------- host syncs and atomic checkpoints


def test_fit_reads_the_losses_in_batches_with_the_same_history(monkeypatch):
    """The step losses stay on the device until ``log_every`` steps are pending: no ``.item()`` per
    step, and the History is the same as reading every step."""
    def run(log_every):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return fit(model, regression_problem(), mse, opt, epochs=3, verbose=False, log_every=log_every)

    every_step = run(1)
    reads = {"item": 0, "tolist": 0}
    original_tolist = torch.Tensor.tolist

    def counting_item(self):
        reads["item"] += 1
        raise AssertionError("fit read a tensor with .item()")

    def counting_tolist(self):
        reads["tolist"] += 1
        return original_tolist(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    batched = run(5)   # 8 steps an epoch: read after step 5 and at the end of the epoch
    monkeypatch.undo()
    assert reads == {"item": 0, "tolist": 2 * 3}, f"expected 2 reads an epoch, got {reads}"
    assert batched.step_loss == every_step.step_loss, "the same losses, read later"
    for a, b in zip(batched.epochs, every_step.epochs, strict=True):
        assert a["train_loss"] == b["train_loss"] and a.keys() == b.keys(), (a, b)
    assert run(50).step_loss == every_step.step_loss


def test_fit_accepts_token_counts_as_integer_tensors():
    def mse_tensor_count(model, batch):
        loss, n = mse(model, batch)
        return loss, torch.tensor(n)

    def run(loss_fn):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        return fit(model, regression_problem(), loss_fn, torch.optim.SGD(model.parameters(), lr=0.05),
                   epochs=2, verbose=False, log_every=3)

    assert run(mse_tensor_count).epochs[-1]["train_loss"] == run(mse).epochs[-1]["train_loss"]
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(TypeError, match="n_tokens an int >= 0, got -1 at step 1"):
        fit(model, regression_problem(), lambda m, b: (mse(m, b)[0], torch.tensor(-1)), opt, epochs=1,
            verbose=False)
    with pytest.raises(TypeError, match="n_tokens"):
        fit(model, regression_problem(), lambda m, b: (mse(m, b)[0], torch.tensor(2.0)), opt, epochs=1,
            verbose=False)
    with pytest.raises(ValueError, match="log_every must be an int >= 1, got 0"):
        fit(model, regression_problem(), mse, opt, epochs=1, log_every=0)


def test_a_non_finite_loss_names_its_step_when_read_late():
    batches = regression_problem()
    batches[2] = (torch.full((2, 4), float("nan")), torch.zeros(2))
    model = nn.Linear(4, 1)
    with pytest.raises(ValueError, match="loss became nan at step 3"):
        fit(model, batches, mse, torch.optim.SGD(model.parameters(), lr=0.01), epochs=1, verbose=False,
            log_every=5)


def test_save_checkpoint_replaces_the_file_atomically(tmp_path, monkeypatch):
    import tfmlib.train as train

    model = make_model()
    path = save_checkpoint(tmp_path / "m.pt", model, config={"version": 1})
    before = path.read_bytes()
    seen = []
    real_save = torch.save

    def save_and_look(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        seen.append((sorted(p.name for p in tmp_path.iterdir()), path.read_bytes() == before))

    monkeypatch.setattr(train.torch, "save", save_and_look)
    save_checkpoint(path, model, config={"version": 2})
    monkeypatch.undo()
    (names, old_intact), = seen
    assert len(names) == 2 and "m.pt" in names, f"the new file is written beside the old one: {names}"
    assert old_intact, "while the new file is written, the old one is untouched"
    assert load_checkpoint(path).config == {"version": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"], "no temporary file left behind"


def test_a_failed_checkpoint_write_leaves_the_old_file(tmp_path, monkeypatch):
    import tfmlib.train as train

    model = make_model()
    path = save_checkpoint(tmp_path / "m.pt", model, config={"version": 1})
    mode = path.stat().st_mode

    def fail_half_way(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(train.torch, "save", fail_half_way)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, config={"version": 2})
    monkeypatch.undo()
    assert load_checkpoint(path, make_model()).config == {"version": 1}, "the old checkpoint survives"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"], "the half-written file is removed"
    save_checkpoint(path, model, config={"version": 3})
    assert path.stat().st_mode == mode, "a replaced checkpoint keeps its file mode"


@pytest.mark.parametrize("keep", [0, 10, 0.5, -1])
def test_a_truncated_checkpoint_is_an_error_naming_the_file(tmp_path, keep):
    model = make_model()
    good = save_checkpoint(tmp_path / "good.pt", model).read_bytes()
    cut = int(len(good) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(good) - 1)
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(good[:cut])
    with pytest.raises(CheckpointError, match=f"{bad}.* not a readable checkpoint"):
        load_checkpoint(bad, model)


# ------------------------------------------------------------- gradient accumulation (chapter 10)


def padded_batches(seed=0):
    """Three float64 batches of padded sequences with unequal token counts (padding masked out)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for size, length in ((3, 5), (5, 2), (2, 7)):
        x = torch.randn(size, length, 4, generator=g, dtype=torch.float64)
        y = torch.randn(size, length, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, length + 1, (size,), generator=g)
        mask = torch.arange(length)[None, :] < lengths[:, None]
        batches.append((x, y, mask))
    return batches


def concatenate(batches):
    """The batches as one, padded to the longest length."""
    longest = max(x.shape[1] for x, _, _ in batches)

    def pad(t):
        extra = longest - t.shape[1]
        return nn.functional.pad(t, (0, 0, 0, extra) if t.dim() == 3 else (0, extra))

    return tuple(torch.cat([pad(b[i]) for b in batches]) for i in range(3))


def masked_mse(model, batch):
    x, y, mask = batch
    err = (model(x).squeeze(-1) - y) ** 2
    n = mask.sum()
    return (err * mask).sum() / n, int(n)


def train_double(batches, accumulate, epochs=3, clip_norm=0.05, loss_fn=masked_mse):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hist = fit(model, batches, loss_fn, opt, epochs=epochs, verbose=False, accumulate=accumulate,
               clip_norm=clip_norm)
    return model, hist


def test_accumulating_batches_equals_one_batch_made_of_them():
    batches = padded_batches()
    assert len({int(m.sum()) for _, _, m in batches}) == 3, "unequal token counts"
    accumulated, hist = train_double(batches, accumulate=3)
    one, one_hist = train_double([concatenate(batches)], accumulate=1)
    for a, b in zip(accumulated.parameters(), one.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12), (a - b).abs().max()
    assert len(hist.step_loss) == 3, "one optimiser step per 3 batches, 3 epochs"
    assert hist.step_loss == pytest.approx(one_hist.step_loss, rel=1e-12), "the step loss is the big batch's"
    assert [e["train_loss"] for e in hist.epochs] == pytest.approx([e["train_loss"] for e in one_hist.epochs],
                                                                   rel=1e-12)
    # clipping acts on the accumulated gradient: a clip_norm that bites changes both runs alike
    assert not torch.allclose(train_double(batches, 3, clip_norm=None)[0][0].weight, accumulated[0].weight)


def test_dividing_the_loss_by_the_number_of_batches_would_not_be_one_batch():
    """The naive recipe, (loss_i / k).backward() per batch, weights every batch equally: with unequal
    token counts it is not the step of the concatenated batch (fit's is, to 1e-12)."""
    batches = padded_batches()
    one, _ = train_double([concatenate(batches)], accumulate=1, epochs=1, clip_norm=None)
    torch.manual_seed(0)
    naive = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    opt = torch.optim.SGD(naive.parameters(), lr=0.1, momentum=0.9)
    for batch in batches:
        (masked_mse(naive, batch)[0] / len(batches)).backward()
    opt.step()
    gap = max((a - b).abs().max().item() for a, b in zip(naive.parameters(), one.parameters(), strict=True))
    assert gap > 1e-4, f"the naive mean of means should differ visibly, differs by {gap}"
    ours, _ = train_double(batches, accumulate=3, epochs=1, clip_norm=None)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(ours.parameters(), one.parameters(),
                                                                                strict=True))


def test_accumulation_with_tensor_token_counts_reads_nothing_per_step(monkeypatch):
    batches = padded_batches()

    def tensor_count(model, batch):
        loss, n = masked_mse(model, batch)
        return loss, batch[2].sum()

    expected, _ = train_double(batches, accumulate=3)
    monkeypatch.setattr(torch.Tensor, "item", lambda self: (_ for _ in ()).throw(AssertionError("item()")))
    got, hist = train_double(batches, accumulate=3, loss_fn=tensor_count)
    monkeypatch.undo()
    assert len(hist.step_loss) == 3
    for a, b in zip(got.parameters(), expected.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_the_last_shorter_group_of_an_epoch_still_steps():
    batches = padded_batches() + padded_batches(seed=1)[:2]  # 5 batches, accumulate 2: groups 2, 2, 1
    got, hist = train_double(batches, accumulate=2, epochs=2)
    regrouped = [concatenate(batches[0:2]), concatenate(batches[2:4]), batches[4]]
    expected, expected_hist = train_double(regrouped, accumulate=1, epochs=2)
    assert len(hist.step_loss) == 2 * 3
    assert hist.step_loss == pytest.approx(expected_hist.step_loss, rel=1e-12)
    for a, b in zip(got.parameters(), expected.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_steps_limits_evaluations_and_the_scheduler_count_optimiser_steps():
    seen = []

    def counting(model, batch):
        seen.append(len(batch[1]))
        return mse(model, batch)

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    hist = fit(model, regression_problem(), counting, opt, epochs=3, accumulate=3, max_steps=5,
               scheduler=sched, eval_fn=lambda m: {}, eval_every=2, verbose=False)  # groups 3, 3, 2
    assert len(hist.step_loss) == 5 and sched.last_epoch == 5
    assert len(seen) == 8 + 6, "epoch 1: 3 steps of 8 batches; epoch 2: 2 steps of 3 batches"
    assert [e["step"] for e in hist.evals] == [2, 4, 5]
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="accumulate must be an int >= 1"):
            fit(model, regression_problem(), mse, opt, epochs=1, accumulate=bad)


# ------------------------------------------------------------- the loop's parts (issue 24)


def test_loss_log_reads_when_due_and_keeps_the_epoch_sums():
    from tfmlib.train import LossLog
    from tfmlib.training_step import StepResult

    history = History()
    log = LossLog(history, log_every=2)
    log.start_epoch(loss_sum=1.0, tokens=2)  # a resumed epoch's sums go on
    log.add(StepResult(torch.tensor(2.0), 3, None))
    assert not log.due() and history.step_loss == [], "nothing read before log_every steps"
    log.add(StepResult(torch.tensor(4.0), torch.tensor(1), torch.tensor(True)))
    assert log.due()
    log.read()
    assert history.step_loss == [2.0, 4.0] and history.skipped_steps == 1
    assert (log.epoch_loss, log.epoch_tokens) == (1.0 + 2.0 * 3 + 4.0 * 1, 2 + 3 + 1)
    log.add(StepResult(torch.tensor(float("inf")), 1, None))
    with pytest.raises(ValueError, match="loss became inf at step 3"):
        log.read()
    with pytest.raises(ValueError, match="log_every must be an int >= 1, got 0"):
        LossLog(history, log_every=0)


def test_training_clock_leaves_evaluations_out(monkeypatch):
    import tfmlib.train as train

    now = [100.0]
    monkeypatch.setattr(train.time, "perf_counter", lambda: now[0])
    clock = train.TrainingClock("cpu", already=5.0)  # a resumed run had trained 5 s
    now[0] += 2.0
    with clock.excluding() as at:
        assert at == 7.0
        now[0] += 30.0  # an evaluation
    now[0] += 1.0
    assert clock.training_seconds() == 8.0 and clock.eval_seconds == 30.0
    clock.start_epoch(already=0.5)
    now[0] += 1.0
    with clock.excluding():
        now[0] += 4.0
    assert clock.epoch_seconds() == 1.5


def test_eval_schedule_runs_in_eval_mode_without_grad_and_after_the_last_step():
    from tfmlib.train import EvalSchedule, TrainingClock

    model = nn.Dropout(0.5)
    seen = []

    def eval_fn(m):
        seen.append((m.training, torch.is_grad_enabled()))
        return {"n": len(seen)}

    history = History()
    every = EvalSchedule(model, eval_fn, 3, history, TrainingClock())
    assert [s for s in range(1, 8) if every.due(s)] == [3, 6] and not every.per_epoch
    every.evaluate(3)
    every.after_last_step(3)  # the last step was evaluated already
    every.after_last_step(5)
    assert [e["step"] for e in history.evals] == [3, 5] and seen == [(False, False)] * 2 and model.training
    assert EvalSchedule(model, eval_fn, None, History(), TrainingClock()).per_epoch
    assert not EvalSchedule(model, None, None, History(), TrainingClock()).per_epoch
    with pytest.raises(ValueError, match="eval_every needs an eval_fn"):
        EvalSchedule(model, None, 2, History(), TrainingClock())


def test_bookkeeping_stops_at_max_steps_and_records_the_epoch():
    from tfmlib.train import Bookkeeping
    from tfmlib.training_step import StepResult, TrainingStep

    model = nn.Linear(4, 1)
    step = TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1))
    books = Bookkeeping(model, step, log_every=10, max_steps=2, verbose=False)
    assert list(books.epochs(3)) == [1, 2, 3]
    assert list(books.batches(1, [1, 2, 3])) == [1, 2, 3] and books.batches_done == 3 and not books.stop
    step.steps = 1
    assert not books.after_step(StepResult(torch.tensor(1.0), 4, None))
    step.steps = 2
    assert books.after_step(StepResult(torch.tensor(3.0), 4, None)) and books.stop, "max_steps reached"
    assert books.history.step_loss == [], "still on the device: log_every is 10"
    record = books.end_epoch()
    assert books.history.step_loss == [1.0, 3.0] and record["train_loss"] == 2.0 and record["epoch"] == 1


def test_train_loop_is_what_fit_runs():
    """fit builds the parts and hands them to train_loop: driving the loop by hand gives fit's run."""
    from tfmlib.train import Bookkeeping, train_loop
    from tfmlib.training_step import TrainingStep

    def by_fit():
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        hist = fit(model, regression_problem(), mse, torch.optim.SGD(model.parameters(), lr=0.05), epochs=2,
                   verbose=False)
        return model, hist

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    step = TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.05))
    books = Bookkeeping(model, step, verbose=False)
    hist = train_loop(model, regression_problem(), mse, step, books, epochs=2, verbose=False)
    ref, ref_hist = by_fit()
    assert hist.step_loss == ref_hist.step_loss and torch.equal(model.weight, ref.weight)


# ------------------------------------------------------------- fp16 and accumulation (issue 25, finding 1)


def fp16_lm_run(accumulate, micro_batches=40):
    """A tiny DecoderLM on packed rows (4 x 16 = 64 tokens a micro-batch), fp16 with its scaler."""
    from tfmlib.lm import DecoderLM
    from tfmlib.rnn import lm_loss

    torch.manual_seed(0)
    rows = torch.randint(4, 40, (micro_batches * 4, 17), generator=torch.Generator().manual_seed(1))
    data = [(rows[i:i + 4, :-1], rows[i:i + 4, 1:]) for i in range(0, len(rows), 4)]
    model = DecoderLM(40, d_model=32, heads=2, layers=2, context=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return fit(model, data, lm_loss, opt, epochs=1, precision="fp16", accumulate=accumulate, verbose=False)


def test_fp16_with_accumulation_skips_no_step():
    """Back-propagating loss * n_tokens made fp16's scaled gradients 64 times too large here: the
    scaler skipped 4 of 10 steps with accumulate=4 and none of 40 without accumulation."""
    one = fp16_lm_run(accumulate=1)
    assert len(one.step_loss) == 40 and one.skipped_steps == 0
    four = fp16_lm_run(accumulate=4)
    assert len(four.step_loss) == 10
    assert four.skipped_steps == 0, f"fp16 + accumulate=4 skipped {four.skipped_steps} of 10 steps"


# ------------------------------------------------------------- wrapped models (issue 25, finding 2)


def test_unwrap_model_and_strip_wrapper_prefixes():
    from tfmlib.checkpoint import strip_wrapper_prefixes, unwrap_model

    inner = make_model()
    wrapped = nn.DataParallel(inner)
    assert unwrap_model(wrapped) is inner and unwrap_model(inner) is inner
    state = wrapped.state_dict()
    assert all(k.startswith("module.") for k in state)
    stripped = strip_wrapper_prefixes({f"_orig_mod.{k}": v for k, v in state.items()})
    assert list(stripped) == list(inner.state_dict()), "both prefixes go, in any nesting"
    with_meta = strip_wrapper_prefixes(state)
    assert "" in with_meta._metadata and not any(k.startswith("module") for k in with_meta._metadata)
    mixed = {"module.a": 1, "b": 2}
    assert strip_wrapper_prefixes(mixed) == mixed, "a prefix only some names have is a real name"


def test_a_compiled_models_checkpoint_loads_into_the_plain_model_and_back(tmp_path):
    torch.manual_seed(0)
    plain = make_model()
    compiled = torch.compile(plain, backend="eager")  # torch.compile's wrapper, no compiler needed
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    path = save_checkpoint(tmp_path / "c.pt", compiled, config={"n": 1})
    ckpt = load_checkpoint(path, make_model())
    assert ckpt.model_class == type(plain).__name__ and list(ckpt.model_state) == list(plain.state_dict())
    fresh = make_model()
    load_checkpoint(path, torch.compile(fresh, backend="eager"))  # plain names into a compiled model
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), plain.parameters(), strict=True))
    # a file written before checkpoints held the inner names: _orig_mod. names, OptimizedModule class
    old = torch.load(path, weights_only=True)
    old.update(model={f"_orig_mod.{k}": v for k, v in old["model"].items()}, model_class="OptimizedModule")
    torch.save(old, tmp_path / "old.pt")
    again = make_model()
    load_checkpoint(tmp_path / "old.pt", again)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), plain.parameters(), strict=True))

from collections import namedtuple

import pytest
import torch
from torch import nn

from tfmlib.data import Vocab
from tfmlib.train import (
    CheckpointError,
    History,
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


def test_fit_stops_at_the_time_budget():
    model = nn.Linear(4, 1)
    hist = fit(model, regression_problem(), mse, torch.optim.SGD(model.parameters(), lr=0.01),
               epochs=3, time_budget_s=0.0, verbose=False)
    assert len(hist.step_loss) == 1 and len(hist.epochs) == 1


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

"""Kill-and-resume training (tfmlib.resume, fit's checkpoint_path/resume; chapter 10)."""

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tfmlib.data import BucketBatchSampler, TokenBatchSampler
from tfmlib.resume import (
    STATE_FORMAT,
    CheckpointError,
    capture_rng_state,
    load_training_state,
    restore_rng_state,
    save_training_state,
)
from tfmlib.train import History, TimeGuardWarning, fit, save_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "resume_run.py"
_spec = importlib.util.spec_from_file_location("resume_run", FIXTURE)
resume_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resume_run)
STEPS = resume_run.EPOCHS * (resume_run.N_EXAMPLES // resume_run.BATCH) // resume_run.ACCUMULATE  # 18


def train(seed=0, wrap_loss=None, **kwargs):
    """The fixture's run in this process (its loss function passed through ``wrap_loss`` if given);
    returns (model, history)."""
    model, loader, loss_fn, optimizer, scheduler, base = resume_run.build(seed, accumulate=kwargs.pop(
        "accumulate", resume_run.ACCUMULATE))
    if wrap_loss is not None:
        loss_fn = wrap_loss(loss_fn)
    history = fit(model, loader, loss_fn, optimizer, scheduler=scheduler, verbose=False,
                  **{**base, **kwargs})
    return model, history


def same_weights(a, b):
    sa, sb = (m.state_dict() if isinstance(m, nn.Module) else m for m in (a, b))
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --------------------------------------------------------------------------- samplers and generators


@pytest.mark.parametrize("make", [lambda n: BucketBatchSampler(n, 4, seed=5, pool_factor=2),
                                  lambda n: TokenBatchSampler(n, 24, seed=5, pool_size=8)])
def test_set_epoch_replays_an_epoch_and_iteration_still_advances(make):
    lengths = [1 + (7 * i) % 11 for i in range(40)]
    fresh = make(lengths)
    orders = [list(fresh) for _ in range(4)]
    assert len({str(o) for o in orders}) == 4, "every epoch has its own order"
    replay = make(lengths)
    replay.set_epoch(2)
    assert list(replay) == orders[2] and replay.epoch == 3, "set_epoch(2) gives epoch 2's order, and advances"
    assert list(replay) == orders[3]
    with pytest.raises(ValueError, match="set_epoch: epoch must be an int >= 0, got -1"):
        replay.set_epoch(-1)


def test_rng_states_survive_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    np.random.randn()  # NumPy caches the second Gaussian: the state holds it
    state = capture_rng_state()
    expected = (random.random(), np.random.randn(), np.random.rand(), torch.rand(3))
    torch.save(state, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng_state(loaded)
    got = (random.random(), np.random.randn(), np.random.rand(), torch.rand(3))
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])
    with pytest.raises(CheckpointError, match="not a generator state"):
        restore_rng_state({"python": state["python"]})


# --------------------------------------------------------------------------- resuming in this process


@pytest.mark.parametrize(("accumulate", "stop_at"), [(2, 4), (2, 6), (1, 17)])
def test_a_run_stopped_and_resumed_ends_with_the_uninterrupted_weights(tmp_path, accumulate, stop_at):
    """stop_at 4: in the middle of epoch 1 (8 of 12 batches); 6: at the end of epoch 1; 17 (no
    accumulation, 36 steps): in the middle of epoch 2."""
    path = tmp_path / "state.pt"
    evals = {"eval_fn": lambda m: {"w": m[0].weight.sum().item()}, "eval_every": 4}
    full, full_hist = train(accumulate=accumulate, **evals)
    _, first = train(accumulate=accumulate, checkpoint_path=path, max_steps=stop_at, **evals)
    assert len(first.step_loss) == stop_at and load_training_state(path).steps == stop_at
    # another seed: the model, the generators and everything else must come from the file
    resumed, hist = train(seed=1, accumulate=accumulate, checkpoint_path=path, resume=True, **evals)
    assert hist.resumed_from_step == stop_at > 0
    assert same_weights(resumed, full), "the resumed run ends with the uninterrupted weights, bit for bit"
    assert hist.step_loss == full_hist.step_loss
    assert [e["train_loss"] for e in hist.epochs] == [e["train_loss"] for e in full_hist.epochs]
    assert [(e["step"], e["w"]) for e in hist.evals] == [(e["step"], e["w"]) for e in full_hist.evals]
    # the file now holds the finished run: resuming it again trains nothing more
    again, hist = train(seed=2, accumulate=accumulate, checkpoint_path=path, resume=True)
    assert same_weights(again, full) and hist.step_loss == full_hist.step_loss


def spiking(loss_fn):
    """``loss_fn`` with a loss spike (x 1e4) on the batches whose first input is above 1: their fp16
    gradients at the scaler's scale (65536 to start) overflow, so the scaler skips those steps and
    lowers its scale. The spike depends on the batch only, so a resumed run meets the same ones."""
    def spiky(model, batch):
        loss, n_tokens = loss_fn(model, batch)
        return (loss * 1e4 if float(batch[0][0, 0]) > 1.0 else loss), n_tokens
    return spiky


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_fp16_runs_resume_with_their_gradient_scaler(tmp_path):
    """The scaler's scale is part of the state: a resumed fp16 run skips the same steps and ends
    equal. (Without the spikes this run skips no step: fp16 with accumulation did only while fit
    weighted each batch's loss by its token count, issue 25.)"""
    path = tmp_path / "state.pt"
    assert train(precision="fp16")[1].skipped_steps == 0
    full, full_hist = train(precision="fp16", wrap_loss=spiking)
    assert full_hist.skipped_steps >= 2, "the spikes overflow fp16's scaled gradients: steps are skipped"
    _, first = train(precision="fp16", wrap_loss=spiking, checkpoint_path=path, max_steps=9)
    saved = load_training_state(path)
    assert 1 <= first.skipped_steps < full_hist.skipped_steps, "skips before and after the interruption"
    assert saved.scaler_state is not None and 0 < saved.scaler_state["scale"] < 65536.0
    with pytest.raises(CheckpointError, match="a gradient scaler state is saved, and no enabled scaler"):
        load_training_state(path, scaler=torch.amp.GradScaler("cpu", enabled=False))
    resumed, hist = train(seed=1, precision="fp16", wrap_loss=spiking, checkpoint_path=path, resume=True)
    assert same_weights(resumed, full) and hist.step_loss == full_hist.step_loss
    assert hist.skipped_steps == full_hist.skipped_steps


def test_a_distributed_sampler_run_resumes_too(tmp_path):
    """fit sets a DistributedSampler's epoch itself; a resumed run replays it (here 1 replica)."""
    def run(seed, **kwargs):
        model, _, loss_fn, optimizer, scheduler, base = resume_run.build(seed)
        data = resume_run.Pairs()
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
        hist = fit(model, loader, loss_fn, optimizer, scheduler=scheduler, verbose=False, **base, **kwargs)
        return model, hist

    path = tmp_path / "state.pt"
    full, full_hist = run(0)
    run(0, checkpoint_path=path, max_steps=8)  # in epoch 2
    assert load_training_state(path).sampler_epoch == 1
    resumed, hist = run(1, checkpoint_path=path, resume=True)
    assert same_weights(resumed, full) and hist.step_loss == full_hist.step_loss


def test_resume_without_a_file_starts_fresh_and_writes_one(tmp_path):
    path = tmp_path / "sub" / "state.pt"
    full, _ = train()
    model, hist = train(checkpoint_path=path, checkpoint_every=5, resume=True)
    assert hist.resumed_from_step == 0 and same_weights(model, full), "checkpointing changes no number"
    state = load_training_state(path)
    assert (state.epoch, state.batches_done, state.steps) == (resume_run.EPOCHS + 1, 0, STEPS)
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.pt"], "no temporary file left"


def test_the_time_budget_goes_on_counting_after_a_resume(tmp_path):
    path = tmp_path / "state.pt"
    train(checkpoint_path=path, max_steps=3)
    spent = load_training_state(path).train_seconds
    assert spent > 0
    with pytest.warns(TimeGuardWarning, match="after 3 optimiser steps"):
        _, hist = train(checkpoint_path=path, resume=True, time_budget_s=spent)
    assert len(hist.step_loss) == 3, "the budget was already spent before the kill: no step more"
    assert hist.stopped_by == "time_budget_s", "the resumed run says the guard, not a count, stopped it"
    _, hist = train(checkpoint_path=path, resume=True, time_budget_s=spent + 60)
    assert len(hist.step_loss) == STEPS and hist.stopped_by == "epochs"


def test_fit_sets_a_distributed_samplers_epoch():
    data = resume_run.Pairs()
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=len(data), sampler=sampler)
    orders = []

    def loss_fn(m, batch):
        orders.append(batch[0][:, 0].tolist())
        return nn.functional.cross_entropy(m(batch[0]), batch[1]), len(batch[1])

    model = nn.Linear(6, 3)
    fit(model, loader, loss_fn, torch.optim.SGD(model.parameters(), lr=0.1), epochs=3, verbose=False)
    assert len({str(o) for o in orders}) == 3 and sampler.epoch == 2, "a new order every epoch"


# --------------------------------------------------------------------------- errors


def test_checkpointing_needs_a_path_and_a_replayable_loader(tmp_path):
    model = nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))]
    ce = lambda m, b: (nn.functional.cross_entropy(m(b[0]), b[1]), 4)  # noqa: E731
    with pytest.raises(ValueError, match="checkpoint_every and resume need a checkpoint_path"):
        fit(model, batches, ce, opt, epochs=1, checkpoint_every=2)
    with pytest.raises(ValueError, match="checkpoint_every and resume need a checkpoint_path"):
        fit(model, batches, ce, opt, epochs=1, resume=True)
    with pytest.raises(ValueError, match="checkpoint_every must be an int >= 1"):
        fit(model, batches, ce, opt, epochs=1, checkpoint_path=tmp_path / "s.pt", checkpoint_every=0)
    with pytest.raises(ValueError, match="batch order depends only on a seed and the epoch.*got a list"):
        fit(model, batches, ce, opt, epochs=1, checkpoint_path=tmp_path / "s.pt")
    shuffled = torch.utils.data.DataLoader(resume_run.Pairs(), batch_size=8, shuffle=True)
    with pytest.raises(ValueError, match="set_epoch.*got a DataLoader with batch_sampler BatchSampler"):
        fit(model, shuffled, ce, opt, epochs=1, checkpoint_path=tmp_path / "s.pt")
    assert not (tmp_path / "s.pt").exists()


def test_resuming_with_other_settings_is_an_error_listing_them(tmp_path):
    path = tmp_path / "state.pt"
    train(checkpoint_path=path, max_steps=2)
    with pytest.raises(CheckpointError, match=r"other settings.*accumulate: saved 2, now 3; clip_norm: saved "
                                              r"1\.0, now 0\.5"):
        train(checkpoint_path=path, resume=True, accumulate=3, clip_norm=0.5)
    with pytest.raises(CheckpointError, match="precision: saved 'fp32', now 'bf16'"):
        train(checkpoint_path=path, resume=True, precision="bf16")
    with pytest.raises(CheckpointError, match="epochs: saved 3, now 4"):
        train(checkpoint_path=path, resume=True, epochs=4)


@pytest.fixture
def saved_state(tmp_path):
    path = tmp_path / "state.pt"
    train(checkpoint_path=path, max_steps=2)
    return path


def test_unreadable_or_foreign_files_are_errors(saved_state, tmp_path):
    with pytest.raises(CheckpointError, match="no training state at"):
        load_training_state(tmp_path / "missing.pt")
    good = saved_state.read_bytes()
    for cut in (0, 10, len(good) // 2, len(good) - 1):
        bad = tmp_path / f"truncated{cut}.pt"
        bad.write_bytes(good[:cut])
        with pytest.raises(CheckpointError, match=f"{bad}.* not a readable training state"):
            load_training_state(bad)
    model_only = save_checkpoint(tmp_path / "model.pt", nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=f"not a {STATE_FORMAT} file.*tfmlib-checkpoint-1"):
        load_training_state(model_only)
    payload = torch.load(saved_state, weights_only=True)
    del payload["position"]
    torch.save(payload, tmp_path / "damaged.pt")
    with pytest.raises(CheckpointError, match="damaged.*position"):
        load_training_state(tmp_path / "damaged.pt")
    torch.save({"format": STATE_FORMAT, "history": History()}, tmp_path / "code.pt")
    # weights_only loading refuses to unpickle objects
    with pytest.raises(CheckpointError, match="not a readable training state"):
        load_training_state(tmp_path / "code.pt")


def test_a_state_that_does_not_fit_is_an_error_and_loads_nothing(saved_state):
    model, _, _, optimizer, scheduler, _ = resume_run.build()
    wider = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 3))
    with pytest.raises(CheckpointError, match=r"does not fit this model.*0\.weight: checkpoint \(32, 6\) vs "
                                              r"model \(64, 6\)"):
        load_training_state(saved_state, model=wider)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="holds the state of a Adam optimizer, not of a SGD"):
        load_training_state(saved_state, model=model, optimizer=sgd)
    first_layer_only = torch.optim.Adam(model[0].parameters())
    with pytest.raises(CheckpointError, match=r"optimizer state does not fit.*parameters per group: "
                                              r"saved \[4\], this optimizer \[2\]"):
        load_training_state(saved_state, model=model, optimizer=first_layer_only)
    assert same_weights(model, before), "a refused state leaves the model as it was"
    with pytest.raises(CheckpointError, match="no gradient scaler state is saved, and an enabled scaler"):
        load_training_state(saved_state, model=model, scaler=torch.amp.GradScaler("cpu"))
    state = load_training_state(saved_state, model=model, optimizer=optimizer, scheduler=scheduler)
    assert same_weights(model, state.model_state) and scheduler.last_epoch == 2 == state.steps


def test_save_training_state_checks_the_position(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="batches_done must be an int >= 0, got -1"):
        save_training_state(tmp_path / "s.pt", model=model,
                            optimizer=torch.optim.SGD(model.parameters(), lr=1), epoch=1, batches_done=-1,
                            steps=0, sampler_epoch=0, history=History().to_dict(), train_seconds=0.0)


# --------------------------------------------------------------------------- killed for real


def run_fixture(weights, *extra):
    cmd = [sys.executable, str(FIXTURE), "--weights", str(weights), *map(str, extra)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_run_resumed_ends_with_the_uninterrupted_weights(tmp_path):
    state, kill_at = tmp_path / "state.pt", 5
    uninterrupted = run_fixture(tmp_path / "a.pt")
    killed = run_fixture(tmp_path / "b.pt", "--state", state, "--every", 1, "--resume", "--sleep", 0.1)
    out, err = uninterrupted.communicate(timeout=120)
    assert uninterrupted.returncode == 0, err
    deadline = time.monotonic() + 120
    saved_step = 0
    while saved_step < kill_at:  # poll the state file (written atomically: never half a file)
        assert killed.poll() is None, f"the run ended before it was killed: {killed.communicate()}"
        assert time.monotonic() < deadline, "no training state at step >= 5 within 120 s"
        time.sleep(0.05)
        if state.exists():
            saved_step = load_training_state(state).steps
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=30)
    assert killed.returncode == -signal.SIGKILL, killed.returncode
    assert not (tmp_path / "b.pt").exists(), "killed before it finished"
    at_kill = load_training_state(state).steps
    assert kill_at <= at_kill < STEPS, at_kill
    resumed = run_fixture(tmp_path / "b.pt", "--state", state, "--every", 1, "--resume")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    assert report == {"resumed_from_step": at_kill, "steps": STEPS}, report
    a = torch.load(tmp_path / "a.pt", weights_only=True)
    b = torch.load(tmp_path / "b.pt", weights_only=True)
    assert same_weights(a, b), "killed and resumed: the uninterrupted run's weights, bit for bit"
    assert json.loads((tmp_path / "a.json").read_text()) == {"resumed_from_step": 0, "steps": STEPS}


# --------------------------------------------------------------------------- fit's resume parts (issue 24)


def test_epoch_order_drives_a_distributed_sampler_and_only_reads_tfmlibs():
    from tfmlib.resume import EpochOrder

    data = list(range(12))
    dist = torch.utils.data.DataLoader(data, sampler=torch.utils.data.DistributedSampler(
        data, num_replicas=1, rank=0, seed=3), batch_size=4)
    order = EpochOrder.of(dist, checkpointing=False)
    assert order is not None and order.managed
    order.start_epoch(3)
    assert dist.sampler.epoch == 2 and order.now == 2, "fit's epoch 3 is the sampler's epoch 2"
    order.start_epoch(1, replay=7)
    assert order.now == 7 and order.after_all_epochs() == 8
    bucketed = torch.utils.data.DataLoader(data, batch_sampler=BucketBatchSampler([1] * 12, 4, seed=0))
    assert EpochOrder.of(bucketed, checkpointing=False) is None, "nothing to manage without checkpoints"
    order = EpochOrder.of(bucketed, checkpointing=True)
    list(bucketed)
    order.start_epoch(2)
    assert order.now == 1 == bucketed.batch_sampler.epoch, "tfmlib's samplers advance their own epoch"
    with pytest.raises(ValueError, match="checkpoint_path needs a loader whose batch order"):
        EpochOrder.of(torch.utils.data.DataLoader(data, batch_size=4), checkpointing=True)


def test_checkpointing_saves_when_due_and_restores_what_it_saved(tmp_path, capsys):
    from tfmlib.resume import Checkpointing

    every = Checkpointing(tmp_path / "s.pt", 3, settings={"epochs": 2})
    assert [s for s in range(1, 8) if every.due(s, stopping=False)] == [3, 6]
    assert every.due(4, stopping=True) and Checkpointing(tmp_path / "x.pt").due(5, True)
    assert not Checkpointing(tmp_path / "x.pt").due(5, False)
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert every.restore(model=model, optimizer=opt) is None
    assert "no training state" in capsys.readouterr().out
    every.save(model=model, optimizer=opt, epoch=1, batches_done=2, steps=3, sampler_epoch=0,
               history=History().to_dict(), train_seconds=1.0)
    state = every.restore(model=model, optimizer=opt, verbose=False)
    assert (state.steps, state.batches_done, state.settings) == (3, 2, {"epochs": 2})
    with pytest.raises(CheckpointError, match="epochs: saved 2, now 3"):
        Checkpointing(tmp_path / "s.pt", settings={"epochs": 3}).restore(model=model, optimizer=opt)
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        Checkpointing(tmp_path / "s.pt", 0)


# --------------------------------------------------------------------------- wrapped models (issue 25, #2)


@pytest.mark.parametrize("wrapped_first", [True, False], ids=["compiled-then-plain", "plain-then-compiled"])
def test_a_compiled_run_resumes_in_the_plain_model_and_back(tmp_path, wrapped_first):
    """The training state holds the names of the model inside torch.compile's wrapper (no
    ``_orig_mod.``), so a run started compiled resumes in the plain model, and the other way round,
    and ends with the uninterrupted weights."""
    path = tmp_path / "state.pt"
    full, full_hist = train()

    def compiled(seed, **kwargs):
        model, loader, loss_fn, optimizer, scheduler, base = resume_run.build(seed)
        wrapper = torch.compile(model, backend="eager")  # the wrapper without a compiler
        hist = fit(wrapper, loader, loss_fn, optimizer, scheduler=scheduler, verbose=False, **base, **kwargs)
        return model, wrapper, hist

    if wrapped_first:
        _, wrapper, _ = compiled(0, checkpoint_path=path, max_steps=5)
        assert not any(k.startswith("_orig_mod.") for k in load_training_state(path).model_state)
        resumed, hist = train(seed=1, checkpoint_path=path, resume=True)
    else:
        train(checkpoint_path=path, max_steps=5)
        resumed, _, hist = compiled(1, checkpoint_path=path, resume=True)
    assert hist.resumed_from_step == 5
    assert same_weights(resumed, full) and hist.step_loss == full_hist.step_loss

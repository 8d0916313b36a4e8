"""tfmlib.distributed and tfmlib.ddp_train (chapter 10): torchrun + DistributedDataParallel on the CPU.

The main test launches ``torchrun --standalone --nproc_per_node 2 -m tfmlib.ddp_train`` (two gloo
processes) and the same with one process and the same global batch, and checks that the two
runs are one run: the same global loss at every step and the same final weights, to float
rounding. A run with another global batch (a plain process, no torchrun) must give another curve,
so the agreement is not that of two runs that ignore their data."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfmlib.ddp_train import main as ddp_main
from tfmlib.ddp_train import parse_args, state_sha256
from tfmlib.distributed import (
    DistributedContext,
    all_reduce_mean,
    barrier,
    cleanup,
    distributed,
    is_distributed,
    is_main,
    per_rank_batch,
    pick_backend,
    pick_device,
    read_torchrun_env,
    setup_distributed,
)
from tfmlib.train import fit

ROOT = Path(__file__).resolve().parents[1]
# small enough for CI (each launch is a few seconds, mostly importing torch), big enough to learn
TRAIN = ["--steps", "8", "--block-len", "16", "--sentences", "600", "--d-model", "32", "--heads", "2",
         "--layers", "2", "--threads", "1", "--seed", "3"]


def _launch(tmp_path: Path, name: str, nproc: int | None, global_batch: int) -> dict:
    out = tmp_path / f"{name}.json"
    module = ["-m", "tfmlib.ddp_train", *TRAIN, "--global-batch", str(global_batch), "--out", str(out)]
    if nproc is None:                                                    # a plain process
        cmd = [sys.executable, *module]
    else:  # --standalone: a rendezvous on localhost with a free port that torchrun picks
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               *module]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(out.read_text())
    print(f"{name}: {done.stdout.strip().splitlines()[-1]}")
    return result


def test_two_processes_train_exactly_like_one(tmp_path):
    two = _launch(tmp_path, "two", 2, global_batch=8)
    one = _launch(tmp_path, "one", 1, global_batch=8)
    other = _launch(tmp_path, "other", None, global_batch=6)
    assert (two["world_size"], two["backend"], two["per_process_batch"]) == (2, "gloo", 4), two
    assert (one["world_size"], one["backend"], one["per_process_batch"]) == (1, "gloo", 8), one
    assert other["world_size"] == 1 and other["backend"].startswith("none"), other
    assert two["device"] == one["device"] == "cpu"
    assert len(two["step_loss"]) == len(one["step_loss"]) == 8
    # one step on 2 x 4 blocks is one step on the 8 blocks: the losses agree to float rounding
    torch.testing.assert_close(torch.tensor(two["step_loss"]), torch.tensor(one["step_loss"]),
                               rtol=1e-5, atol=0.0,
                               msg="the 2-process loss curve must equal the 1-process one")
    assert one["step_loss"][-1] < one["step_loss"][0] - 0.1, f"the model must learn: {one['step_loss']}"
    w2, w1 = torch.load(two["weights"]), torch.load(one["weights"])
    assert w2.keys() == w1.keys()
    # AdamW divides by sqrt(v) + 1e-8: where a gradient is near zero, a rounding difference of the
    # other summation order becomes a visible part of the update (at most lr = 1e-3 per step).
    # Eight steps move weights by up to 8e-3; 1e-4 is about 1% of that, while nearly all weights
    # agree to ~1e-7, as the loss curve does.
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-4, msg=f"final weights differ at {k}")
    close = sum(int(torch.isclose(w2[k], w1[k], rtol=1e-5, atol=1e-6).sum()) for k in w1)
    total = sum(t.numel() for t in w1.values())
    assert close >= 0.999 * total, f"only {close} of {total} weights agree to float rounding"
    # not trivially equal: another global batch takes other steps and ends elsewhere
    diff = (torch.tensor(other["step_loss"][1:]) - torch.tensor(one["step_loss"][1:])).abs().max()
    assert diff > 1e-3, f"a different global batch gave the same curve (max difference {diff})"
    assert other["weights_sha256"] != one["weights_sha256"]
    for r in (two, one, other):
        assert r["tokens_per_s"] > 0 and r["wall_s"] > r["train_s"] > 0 and r["mfu"] is None, r
        assert state_sha256(torch.load(r["weights"])) == r["weights_sha256"]


def test_read_torchrun_env():
    plain = read_torchrun_env({})
    assert (plain.rank, plain.local_rank, plain.world_size, plain.launched) == (0, 0, 1, False)
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    got = read_torchrun_env(env)
    assert (got.rank, got.local_rank, got.world_size, got.local_world_size) == (5, 1, 8, 4)
    assert (got.master_addr, got.master_port, got.launched) == ("node0", 29500, True)
    assert read_torchrun_env({"RANK": "3", "WORLD_SIZE": "4"}).local_rank == 3, "one node by default"
    with pytest.raises(ValueError, match="RANK=4 must be below WORLD_SIZE=4"):
        read_torchrun_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="must be set together"):
        read_torchrun_env({"RANK": "0"})
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        read_torchrun_env({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="LOCAL_RANK=2 must be below LOCAL_WORLD_SIZE=2"):
        read_torchrun_env({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"})


def test_backend_device_and_batch_split():
    assert pick_backend("auto", cuda_available=False) == "gloo"
    assert pick_backend("auto", cuda_available=True) == "nccl"
    assert pick_backend("gloo", cuda_available=True) == "gloo"
    with pytest.raises(ValueError, match="needs CUDA"):
        pick_backend("nccl", cuda_available=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        pick_backend("mpi")
    assert pick_device("gloo", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="has no GPU"):
            pick_device("nccl", 0)
    assert per_rank_batch(32, 4) == 8
    with pytest.raises(ValueError, match="does not divide by the world size 3"):
        per_rank_batch(32, 3)
    with pytest.raises(ValueError, match="global_batch must be"):
        per_rank_batch(0, 1)


def test_a_plain_process_needs_no_process_group():
    with distributed("gloo", env={}) as ctx:
        assert isinstance(ctx, DistributedContext) and not ctx.initialized
        assert (ctx.rank, ctx.world_size, ctx.backend, ctx.is_main) == (0, 1, None, True)
        assert not is_distributed() and is_main()
        x = torch.tensor([1.0, 3.0])
        y = all_reduce_mean(x)
        assert torch.equal(y, x) and y is not x, "a copy, equal in one process"
        barrier()
    cleanup()
    with pytest.raises(ValueError, match="floating point"):
        all_reduce_mean(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="expected a tensor"):
        all_reduce_mean([1.0])


def test_a_process_group_of_one(monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ctx = setup_distributed("gloo", timeout_s=30)
    try:
        assert ctx.initialized and ctx.backend == "gloo" and is_distributed() and is_main()
        assert torch.equal(all_reduce_mean(torch.tensor([2.0, 4.0])), torch.tensor([2.0, 4.0]))
        barrier()
    finally:
        cleanup()
    assert not is_distributed(), "cleanup must destroy the group"


def test_script_arguments():
    args = parse_args(["--global-batch", "32", "--steps", "5"])
    assert (args.global_batch, args.steps, args.backend, args.precision) == (32, 5, "auto", "fp32")
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    threads = torch.get_num_threads()
    try:
        result = ddp_main([*TRAIN, "--steps", "2", "--global-batch", "4"])    # a plain process, no file
    finally:
        torch.set_num_threads(threads)                   # main sets this process's threads
    assert result["world_size"] == 1 and len(result["step_loss"]) == 2 and "weights" not in result


# A worker of the accumulation tests below: rank RANK of 2 trains a float64 linear layer wrapped in
# DistributedDataParallel through fit(accumulate=ACCUMULATE) on its own micro-batches (unequal token
# counts) and saves its weights and how many times DDP's all-reduce hook ran.
_ACCUMULATE_WORKER = r"""
import os, sys
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from tfmlib.distributed import distributed
from tfmlib.train import fit

sys.path.insert(0, os.environ["TEST_DIR"])
from test_distributed import _accumulation_batches, _mse_tokens

torch.set_num_threads(1)
with distributed("gloo", timeout_s=60) as ctx:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 3).double())
    calls = []
    def counting_hook(state, bucket):
        calls.append(1)
        return default_hooks.allreduce_hook(state, bucket)
    model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    fit(model, _accumulation_batches()[ctx.rank], _mse_tokens, optimizer, epochs=1,
        accumulate=int(os.environ["ACCUMULATE"]), clip_norm=None, verbose=False)
    torch.save({"weights": {k: v.clone() for k, v in model.module.state_dict().items()},
                "allreduce_calls": len(calls)}, os.environ["OUT"])
"""


def _accumulation_batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Three micro-batches per rank, with 5, 2, 3 (rank 0) and 1, 8, 4 (rank 1) examples: the groups of
    accumulate=2 hold 7 and 9 tokens, then 3 and 4."""
    g = torch.Generator().manual_seed(7)
    sizes = [[5, 2, 3], [1, 8, 4]]
    return [[(torch.randn(n, 4, generator=g, dtype=torch.float64),
              torch.randn(n, 3, generator=g, dtype=torch.float64)) for n in rank] for rank in sizes]


def _mse_tokens(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).sum(-1).mean(), x.shape[0]


def _run_accumulation_workers(tmp_path: Path, accumulate: int) -> list[dict]:
    """Run _ACCUMULATE_WORKER as ranks 0 and 1 of a gloo group; each rank's saved weights and
    all-reduce count."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OUT": str(tmp_path / f"rank{rank}.pt"),
               "TEST_DIR": str(Path(__file__).parent), "ACCUMULATE": str(accumulate),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, "-c", _ACCUMULATE_WORKER], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"a DDP worker failed:\n{out[-3000:]}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]


def _one_step_per_global_group(groups: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> dict:
    """The reference: one process, one SGD step on each global group's micro-batches concatenated."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3).double()
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.5)
    big = [(torch.cat([x for x, _ in g]), torch.cat([y for _, y in g])) for g in groups]
    fit(ref, big, _mse_tokens, optimizer, epochs=1, clip_norm=None, verbose=False)
    return ref.state_dict()


def test_ddp_accumulation_all_reduces_once_per_step_and_weights_tokens_over_ranks(tmp_path):
    ranks = _run_accumulation_workers(tmp_path, accumulate=2)
    batches = _accumulation_batches()
    groups = [[batches[0][0], batches[0][1], batches[1][0], batches[1][1]], [batches[0][2], batches[1][2]]]
    ref = _one_step_per_global_group(groups)
    for r, got in enumerate(ranks):
        for k, v in ref.items():
            torch.testing.assert_close(got["weights"][k], v, rtol=1e-12, atol=1e-12,
                                       msg=f"rank {r}: {k} differs from one step per global group")
    # the 2 micro-batches of the full group: one all-reduce (the first ran in no_sync); the short group
    # of one micro-batch ran in no_sync and was averaged by fit, outside DDP's hook
    assert [got["allreduce_calls"] for got in ranks] == [1, 1], [got["allreduce_calls"] for got in ranks]


def test_ddp_without_accumulation_weights_each_rank_by_its_tokens(tmp_path):
    """accumulate=1 under DDP: the ranks' batches hold 5 and 1, 2 and 8, 3 and 4 examples, so the mean
    of the two ranks' means (DDP's plain average) is another step than the mean over the 6, 10 and 7
    examples of one global batch; fit must take the second."""
    ranks = _run_accumulation_workers(tmp_path, accumulate=1)
    batches = _accumulation_batches()
    ref = _one_step_per_global_group([[batches[0][i], batches[1][i]] for i in range(3)])
    for r, got in enumerate(ranks):
        for k, v in ref.items():
            torch.testing.assert_close(got["weights"][k], v, rtol=1e-12, atol=1e-12,
                                       msg=f"rank {r}: {k} differs from one step per global batch")
    assert [got["allreduce_calls"] for got in ranks] == [3, 3], [got["allreduce_calls"] for got in ranks]


# A worker of the checkpoint test below: rank RANK of 2 trains a dropout MLP wrapped in
# DistributedDataParallel through fit (accumulate=2, a DistributedSampler): once uninterrupted, once
# stopped after 4 of 6 steps with a training state saved every step, and once resumed from that state
# (another seed: everything must come from the file). It records which steps it wrote a state at.
_CHECKPOINT_WORKER = r"""
import json, os
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
import tfmlib.resume as resume
from tfmlib.distributed import distributed
from tfmlib.train import fit, save_checkpoint

torch.set_num_threads(1)
writes = []
real_save = resume.save_training_state
def counting_save(*args, **kwargs):
    writes.append(kwargs["steps"])
    return real_save(*args, **kwargs)
resume.save_training_state = counting_save

g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(48, 4, generator=g, dtype=torch.float64),
                                      torch.randn(48, 3, generator=g, dtype=torch.float64))

def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).sum(-1).mean(), x.shape[0]

with distributed("gloo", timeout_s=60) as ctx:
    def run(seed, **kwargs):
        torch.manual_seed(0)
        inner = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 3)).double()
        model = DistributedDataParallel(inner)
        torch.manual_seed(seed + 100 * ctx.rank)  # each rank draws its own dropout masks
        loader = torch.utils.data.DataLoader(data, batch_size=4,
                                             sampler=torch.utils.data.DistributedSampler(data, seed=5))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        hist = fit(model, loader, mse, optimizer, epochs=2, accumulate=2, verbose=False, **kwargs)
        return model, inner, hist

    _, full, full_hist = run(0)
    run(0, checkpoint_path=os.environ["STATE"], checkpoint_every=1, max_steps=4)
    stopped_writes = list(writes)
    model, resumed, hist = run(7, checkpoint_path=os.environ["STATE"], resume=True)
    save_checkpoint(os.environ["CKPT"], model)  # the DDP wrapper itself
    same = all(torch.equal(a, b) for a, b in zip(resumed.parameters(), full.parameters()))
    torch.save({"weights": {k: v.clone() for k, v in resumed.state_dict().items()},
                "rng": torch.get_rng_state()}, os.environ["OUT"] + ".pt")
    with open(os.environ["OUT"], "w") as f:
        json.dump({"writes": stopped_writes, "resumed_from": hist.resumed_from_step, "same_weights": same,
                   "same_losses": hist.step_loss == full_hist.step_loss,
                   "same_epochs": [e["train_loss"] for e in hist.epochs] == [e["train_loss"] for e in
                                                                              full_hist.epochs],
                   "steps": len(full_hist.step_loss)}, f)
"""


def test_a_ddp_run_writes_one_state_from_rank_0_that_resumes_ddp_and_plain_models(tmp_path):
    """Only rank 0 writes the training state (and the model checkpoint); the state holds the inner
    model's names (no ``module.``) and every rank's generators, so the 2-process run resumes exactly,
    and a plain model loads the state and the checkpoint."""
    import socket

    from tfmlib.resume import load_training_state
    from tfmlib.train import load_checkpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state, ckpt = tmp_path / "state.pt", tmp_path / "model.pt"
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OUT": str(tmp_path / f"rank{rank}.json"),
               "STATE": str(state), "CKPT": str(ckpt),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, "-c", _CHECKPOINT_WORKER], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, f"a DDP worker failed:\n{out[-3000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["steps"] == 6
    assert ranks[0]["writes"] == [1, 2, 3, 4] and ranks[1]["writes"] == [], "rank 0 alone writes the state"
    for r, got in enumerate(ranks):
        assert got["resumed_from"] == 4, (r, got)
        assert got["same_weights"] and got["same_losses"] and got["same_epochs"], (r, got)
    ends = [torch.load(tmp_path / f"rank{r}.json.pt") for r in range(2)]
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 3)).double()
    saved = load_training_state(state, model=plain)
    assert not any(k.startswith("module.") for k in saved.model_state)
    assert all(torch.equal(v, ends[0]["weights"][k]) for k, v in plain.state_dict().items())
    assert len(saved.ranks) == 2
    for r in range(2):  # the final state holds each rank's generator as it ended
        assert torch.equal(saved.ranks[r]["rng"]["torch"], ends[r]["rng"]), f"rank {r}'s generator"
    assert not torch.equal(ends[0]["rng"], ends[1]["rng"])
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 3)).double()
    assert load_checkpoint(ckpt, other).model_class == "Sequential"
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), plain.parameters(), strict=True))

"""Several processes, one model: what ``torchrun`` sets up and what DistributedDataParallel does.

Introduced in chapter 10 (scaling up: fused attention, mixed precision, ``torch.compile``,
several processes with ``torchrun``). The training script that uses it is
:mod:`tfmlib.ddp_train`.

**Data parallelism.** Every process holds a full copy of the model and trains it on its own
part of each batch. With a *global* batch of ``G`` examples and ``W`` processes (the *world
size*), each process takes ``G / W`` of them (the per-process batch), computes its loss and its
gradients, and the gradients are then averaged over the processes, so every copy takes the same
optimiser step and the copies stay equal. One step on ``W`` processes is thus one step on the
global batch: when each process's loss is the mean over an equal share of the examples, the mean
of the ``W`` gradients is the gradient of the global batch's mean loss (the 2-process loss curve
equals the 1-process one to float rounding: ``tests/test_distributed.py``).

**Who reads what.** :class:`torch.utils.data.DistributedSampler` gives each rank a disjoint slice
of the epoch's data: every rank draws the *same* permutation of the dataset (seeded with
``seed + epoch``, so ``sampler.set_epoch(epoch)`` must be called at each epoch, else every epoch
has the same order) and rank ``r`` keeps positions ``r, r + W, r + 2W, ...`` of it. A per-rank
``DataLoader`` with batch size ``G / W`` then gives step ``k`` of rank ``r`` the examples
``perm[k G + r + j W]``: together, the ranks cover exactly ``perm[k G : (k + 1) G]``, the batch
one process would have taken.

**The gradient all-reduce.** :class:`torch.nn.parallel.DistributedDataParallel` (DDP) wraps the
model. At construction it broadcasts rank 0's parameters and buffers to every rank. During
``backward`` it does not wait for the end: parameters are grouped into *buckets* (25 MiB by
default, in roughly reverse order of use), and as soon as every gradient of a bucket is ready,
an asynchronous all-reduce of that bucket starts, while autograd goes on computing the earlier
layers' gradients: communication overlaps computation. Each all-reduce sums the bucket over the
ranks and DDP divides by ``W``: after ``backward`` every rank holds the *mean* gradient, and the
optimiser step (run by every rank on equal gradients) keeps the copies equal. (Li et al. 2020,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training", sections 3-4.)

**Backends and devices.** ``gloo`` runs collectives on CPU tensors (and is what a laptop
uses); ``nccl`` runs them GPU to GPU (NVLink, InfiniBand) and needs one CUDA device per process:
rank ``local_rank`` of a machine takes ``cuda:<local_rank>``. :func:`setup_distributed` with
``backend="auto"`` picks ``nccl`` where CUDA is available and ``gloo`` otherwise.

**Launching.** ``torchrun`` starts the processes and sets, in each, ``RANK`` (0 .. W - 1 over
all machines), ``LOCAL_RANK`` (0 .. on this machine), ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and
``MASTER_ADDR``/``MASTER_PORT`` (where rank 0 listens for the others); :func:`read_torchrun_env`
reads them. On one machine::

    torchrun --standalone --nproc_per_node 2 -m tfmlib.ddp_train --global-batch 32 --steps 100

On two machines with eight GPUs each, the same command on both (``host`` is one of them, the
rendezvous point; ``--node_rank`` is not needed with the c10d rendezvous)::

    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint host:29500 \\
        --rdzv_id my-run -m tfmlib.ddp_train --global-batch 512 --backend auto

Without ``torchrun`` (``python -m tfmlib.ddp_train``) every helper here works unchanged as a
single process: world size 1, rank 0, no process group, collectives that return their input.

**When a model does not fit one device.** DDP keeps a full copy of the parameters, gradients and
optimiser state on every device. The next step is to *shard* them: PyTorch's Fully Sharded Data
Parallel (``torch.distributed.fsdp``; FSDP2's ``fully_shard``) keeps ``1 / W`` of each on every
rank and gathers a layer's parameters only while it computes (Zhao et al. 2023, "PyTorch FSDP";
the ZeRO stages of Rajbhandari et al. 2020).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

INTRODUCED_IN = 10

__all__ = [
    "DistributedContext",
    "TorchrunEnv",
    "all_reduce_mean",
    "barrier",
    "cleanup",
    "distributed",
    "is_distributed",
    "is_main",
    "per_rank_batch",
    "pick_backend",
    "pick_device",
    "read_torchrun_env",
    "setup_distributed",
]

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class TorchrunEnv:
    """The variables ``torchrun`` sets in each process (defaults: one plain process).

    ``launched`` is ``True`` when ``RANK`` and ``WORLD_SIZE`` were in the environment (a process
    started by ``torchrun`` or another launcher), ``False`` for a plain ``python`` process.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launched: bool = False


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"read_torchrun_env: {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"read_torchrun_env: {name}={value} must be >= {minimum}")
    return value


def read_torchrun_env(env: Mapping[str, str] | None = None) -> TorchrunEnv:
    """Read ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` from ``env`` (default ``os.environ``).

    Missing variables take the values of one plain process (rank 0 of 1). ``ValueError`` for a
    non-integer or negative value, ``RANK >= WORLD_SIZE``, ``LOCAL_RANK >= LOCAL_WORLD_SIZE``, or
    only one of ``RANK`` and ``WORLD_SIZE`` set (a half-configured launch).
    """
    env = os.environ if env is None else env
    has_rank, has_world = "RANK" in env, "WORLD_SIZE" in env
    if has_rank != has_world:
        raise ValueError("read_torchrun_env: RANK and WORLD_SIZE must be set together (torchrun sets both); "
                         f"got only {'RANK' if has_rank else 'WORLD_SIZE'}")
    world = _env_int(env, "WORLD_SIZE", 1, 1)
    rank = _env_int(env, "RANK", 0, 0)
    local_world = _env_int(env, "LOCAL_WORLD_SIZE", world, 1)
    local_rank = _env_int(env, "LOCAL_RANK", rank % local_world, 0)
    if rank >= world:
        raise ValueError(f"read_torchrun_env: RANK={rank} must be below WORLD_SIZE={world}")
    if local_rank >= local_world:
        raise ValueError(f"read_torchrun_env: LOCAL_RANK={local_rank} must be below "
                         f"LOCAL_WORLD_SIZE={local_world}")
    port = env.get("MASTER_PORT")
    return TorchrunEnv(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                       master_addr=env.get("MASTER_ADDR"),
                       master_port=_env_int(env, "MASTER_PORT", 0, 0) if port else None,
                       launched=has_rank)


def pick_backend(requested: str = "auto", *, cuda_available: bool | None = None) -> str:
    """``"gloo"`` or ``"nccl"``: ``requested`` itself, or for ``"auto"`` ``nccl`` where CUDA is
    available and ``gloo`` otherwise. ``ValueError`` for an unknown name or ``nccl`` without CUDA.
    ``cuda_available`` overrides ``torch.cuda.is_available()`` (for tests)."""
    if requested not in BACKENDS:
        raise ValueError(f"pick_backend: backend must be one of {BACKENDS}, got {requested!r}")
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if requested == "auto":
        return "nccl" if cuda else "gloo"
    if requested == "nccl" and not cuda:
        raise ValueError("pick_backend: backend 'nccl' needs CUDA GPUs, and none is available; use 'gloo' "
                         "(or 'auto') on the CPU")
    return requested


def pick_device(backend: str, local_rank: int = 0) -> torch.device:
    """The device a process trains on: ``cuda:<local_rank>`` for ``nccl`` (one GPU per process),
    the CPU for ``gloo``. ``ValueError`` for another backend, a negative ``local_rank`` or a
    ``local_rank`` beyond the GPUs this machine has."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"pick_device: backend must be 'gloo' or 'nccl', got {backend!r}")
    if not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"pick_device: local_rank must be an int >= 0, got {local_rank!r}")
    if backend == "gloo":
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise ValueError(f"pick_device: local rank {local_rank} has no GPU (this machine has "
                         f"{torch.cuda.device_count()}); start at most that many processes per node")
    return torch.device("cuda", local_rank)


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: ``rank`` of ``world_size`` (``local_rank`` of
    ``local_world_size`` on its machine), the ``backend`` (``None`` without a process group), the
    ``device`` it trains on, and whether :func:`setup_distributed` started the process group."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str | None
    device: torch.device
    initialized: bool

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints and writes files."""
        return self.rank == 0


def setup_distributed(backend: str = "auto", *, env: Mapping[str, str] | None = None,
                      timeout_s: float = 600.0) -> DistributedContext:
    """Read the environment ``torchrun`` set, pick the backend and this process's device, and
    start the process group (``dist.init_process_group``, rendezvous through ``MASTER_ADDR`` and
    ``MASTER_PORT``: the ``env://`` method).

    A plain process (no ``RANK``/``WORLD_SIZE`` in the environment) starts no process group: it
    gets rank 0 of 1, ``backend=None``, the device the backend implies, and every helper of this
    module works on it unchanged. A process group already started is reused. On CUDA,
    ``torch.cuda.set_device`` is called so that NCCL's collectives run on this rank's GPU.
    ``timeout_s`` bounds how long collectives (and the rendezvous) wait for the other ranks.
    """
    info = read_torchrun_env(env)
    chosen = pick_backend(backend)
    device = pick_device(chosen, info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not info.launched:
        return DistributedContext(rank=0, local_rank=0, world_size=1, local_world_size=1, backend=None,
                                  device=device, initialized=False)
    if not dist.is_initialized():
        dist.init_process_group(backend=chosen, rank=info.rank, world_size=info.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistributedContext(rank=info.rank, local_rank=info.local_rank, world_size=info.world_size,
                              local_world_size=info.local_world_size, backend=dist.get_backend(),
                              device=device, initialized=True)


def is_distributed() -> bool:
    """Whether a process group is running (``torch.distributed`` available and initialised)."""
    return dist.is_available() and dist.is_initialized()


def is_main() -> bool:
    """``True`` on rank 0, and in a plain process."""
    return not is_distributed() or dist.get_rank() == 0


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over all ranks (a new tensor; ``tensor`` is left as it is). In a
    plain process, a copy of ``tensor``. Every rank must call it with the same shape and dtype
    (a collective: a rank that does not call it makes the others wait until the timeout).
    ``TypeError`` for a non-tensor, ``ValueError`` for a non-floating tensor (a mean of integers
    would be truncated)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_reduce_mean: expected a tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise ValueError(f"all_reduce_mean: the tensor must be floating point, got {tensor.dtype}")
    out = tensor.detach().clone()
    if is_distributed() and dist.get_world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out /= dist.get_world_size()
    return out


def barrier() -> None:
    """Wait until every rank gets here (nothing to wait for in a plain process)."""
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    """Destroy the process group if one is running (safe to call twice, or in a plain process)."""
    if is_distributed():
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(backend: str = "auto", **kwargs: object) -> Iterator[DistributedContext]:
    """``with distributed() as ctx:``: :func:`setup_distributed` on entry, :func:`cleanup` on exit
    (also after an error)."""
    ctx = setup_distributed(backend, **kwargs)  # type: ignore[arg-type]
    try:
        yield ctx
    finally:
        if ctx.initialized:
            cleanup()


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """``global_batch // world_size``, the batch each process takes. ``ValueError`` unless
    ``global_batch`` is a positive multiple of ``world_size`` (an uneven split would weight the
    ranks' examples differently, and the run would not be the 1-process run)."""
    for name, v in (("global_batch", global_batch), ("world_size", world_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"per_rank_batch: {name} must be an int >= 1, got {v!r}")
    if global_batch % world_size:
        raise ValueError(f"per_rank_batch: the global batch {global_batch} does not divide by the world size "
                         f"{world_size} (processes); choose a multiple of {world_size}")
    return global_batch // world_size

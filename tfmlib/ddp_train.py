"""Train chapter 09's language model data-parallel: ``torchrun`` + DistributedDataParallel.

Introduced in chapter 10 (scaling up: fused attention, mixed precision, ``torch.compile``,
several processes with ``torchrun``). The ideas are in :mod:`tfmlib.distributed`.

Trains a :class:`tfmlib.lm.DecoderLM` (small sizes by default, dropout 0 so that every rank and
every world size computes the same function) on packed blocks (:mod:`tfmlib.packing`) of the
English side of the bundled corpus, with chapter 09's word vocabulary. The batch size given is
the **global** batch: each of the ``W`` processes takes ``global_batch / W`` blocks per step
through a :class:`torch.utils.data.DistributedSampler`, and DDP averages the gradients, so the
run takes the same steps whatever ``W`` is (tested: ``tests/test_distributed.py``). The loop is
:func:`tfmlib.train.fit` (it calls the sampler's ``set_epoch`` each epoch); the per-step loss it
records is this rank's, and the ranks' curves are averaged once at the end (one all-reduce) into
the global loss: the mean of equal shares' mean losses is the mean loss of the global batch.

On the CPU (``gloo``), one machine, two processes::

    torchrun --standalone --nproc_per_node 2 -m tfmlib.ddp_train --global-batch 16 --steps 50 --out ddp.json

The same command trains on GPUs with ``nccl`` (``--backend auto``, the default, picks it where
CUDA is available), one process per GPU; the multi-node command is in :mod:`tfmlib.distributed`.
Without ``torchrun`` (``python -m tfmlib.ddp_train``) it trains as one plain process.

Rank 0 writes ``--out`` (JSON): the world size, backend, device, the per-step global loss,
tokens per second, wall time, and the path and SHA-256 of the final weights (saved next to it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from tfmlib.config import seed_everything
from tfmlib.distributed import all_reduce_mean, distributed, per_rank_batch
from tfmlib.lm import DecoderLM
from tfmlib.packing import bundled_english_blocks
from tfmlib.precision import pick_precision
from tfmlib.rnn import lm_loss
from tfmlib.throughput import lm_flops_per_token, mfu, peak_flops
from tfmlib.train import fit

INTRODUCED_IN = 10


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tfmlib.ddp_train",
        description="Data-parallel training of a small decoder-only LM on packed blocks of the bundled "
                    "corpus (launch with torchrun; works as a plain process too).")
    parser.add_argument("--global-batch", type=int, default=16,
                        help="blocks per optimiser step over ALL processes; must divide by the world size")
    parser.add_argument("--steps", type=int, default=50, help="optimiser steps")
    parser.add_argument("--block-len", type=int, default=32, help="tokens per packed block (the context)")
    parser.add_argument("--sentences", type=int, default=4000,
                        help="English sentences of the bundled training split to pack")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16", "fp16"],
                        help="autocast dtype (tfmlib.precision; auto: bf16 where supported)")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                        help="auto: nccl where CUDA is available, else gloo")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per process (default: CPU cores // processes on this machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON results written by rank 0 (the weights go next to it, .pt)")
    args = parser.parse_args(argv)
    for name in ("global_batch", "steps", "block_len", "sentences", "d_model", "heads", "layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    return args


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's tensors (names, dtypes, shapes and bytes, in order)."""
    h = hashlib.sha256()
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Train; on rank 0 return (and write to ``--out``) the results, on other ranks ``None``."""
    args = parse_args(argv)
    wall_start = time.perf_counter()
    with distributed(args.backend) as ctx:
        try:
            batch = per_rank_batch(args.global_batch, ctx.world_size)
        except ValueError as e:
            raise SystemExit(f"ddp_train: --global-batch {args.global_batch} with {ctx.world_size} "
                             f"processes: {e}") from None
        threads = args.threads or max(1, available_cores() // ctx.local_world_size)
        torch.set_num_threads(threads)

        data, vocab = bundled_english_blocks(args.sentences, args.block_len)
        seed_everything(args.seed)                        # the same initial weights on every rank
        model = DecoderLM(len(vocab), d_model=args.d_model, heads=args.heads, layers=args.layers,
                          context=args.block_len, dropout=0.0).to(ctx.device)
        # DDP broadcasts rank 0's weights at construction and averages gradients in backward;
        # in a plain process the model trains as it is (DDP needs a process group).
        trained = (DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda"
                                           else None) if ctx.initialized else model)
        sampler = DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                     seed=args.seed, drop_last=True)
        loader = DataLoader(data, batch_size=batch, sampler=sampler, drop_last=True)
        if len(loader) == 0:
            raise SystemExit(f"ddp_train: {len(data)} blocks give no batch of {batch} per process; "
                             "lower --global-batch or --block-len, or raise --sentences")
        epochs = -(-args.steps // len(loader))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        history = fit(trained, loader, lm_loss, optimizer, epochs=epochs, max_steps=args.steps,
                      device=ctx.device, precision=args.precision, log_every=args.steps, verbose=False,
                      desc=f"rank {ctx.rank}")
        train_s = sum(e["seconds"] for e in history.epochs)
        # the global loss of each step: the mean over ranks of their equal shares' mean losses
        local = torch.tensor(history.step_loss, dtype=torch.float64, device=ctx.device)
        global_loss = all_reduce_mean(local).tolist()
        mean_train_s = all_reduce_mean(torch.tensor([train_s], dtype=torch.float64, device=ctx.device)).item()
        if not ctx.is_main:
            return None
        tokens = len(global_loss) * args.global_batch * args.block_len
        flops_per_token = lm_flops_per_token(model, args.block_len)
        tokens_per_s = tokens / train_s
        precision = pick_precision(ctx.device, args.precision)   # what fit resolved it to
        peak = peak_flops(ctx.device, precision)
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        result: dict[str, Any] = {
            "world_size": ctx.world_size, "backend": ctx.backend or "none (one plain process)",
            "device": str(ctx.device), "threads_per_process": threads,
            "global_batch": args.global_batch, "per_process_batch": batch, "block_len": args.block_len,
            "steps": len(global_loss), "epochs": epochs, "blocks": len(data),
            "precision": precision, "seed": args.seed, "lr": args.lr,
            "model": {"vocab_size": len(vocab), **model.config},
            "step_loss": global_loss,
            "train_s": train_s, "train_s_mean_over_ranks": mean_train_s,
            "step_s": train_s / len(global_loss), "tokens_per_s": tokens_per_s,
            "flops_per_token": flops_per_token, "mfu": mfu(tokens_per_s, flops_per_token, peak),
            "wall_s": time.perf_counter() - wall_start,
            "weights_sha256": state_sha256(state),
        }
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            weights = args.out.with_suffix(".pt")
            torch.save(state, weights)
            result["weights"] = str(weights)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"ddp_train: {ctx.world_size} process(es), backend {result['backend']}, {ctx.device}, "
              f"{threads} thread(s) each; global batch {args.global_batch} = {ctx.world_size} x {batch} "
              f"blocks of {args.block_len} tokens; {len(global_loss)} steps, loss {global_loss[0]:.4f} -> "
              f"{global_loss[-1]:.4f}; {result['step_s'] * 1e3:.1f} ms/step, {tokens_per_s:,.0f} tokens/s")
        return result


if __name__ == "__main__":
    main(sys.argv[1:])

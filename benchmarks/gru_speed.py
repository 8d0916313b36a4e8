"""How much slower is the teaching GRU than PyTorch's? (chapter 01)

Times a forward+backward pass of ``tfmlib.rnn.GRUScratch`` (one Python step per token, every
equation explicit) against ``nn.GRU`` (PyTorch's fused kernels) with copied weights, for several
sequence lengths, after checking that the two give the same outputs.

Measured on a 2-core CPU (see the JSON), the scratch GRU is only about 1.2x slower: PyTorch's CPU
GRU also steps through time, and the per-step matrix products dominate. The gap that justifies
``nn.GRU`` in later chapters is on a GPU, where cuDNN fuses the whole sequence into a few
kernels, and in multi-layer or bidirectional models, which ``nn.GRU`` provides in one call.

    python benchmarks/gru_speed.py [--batch 64] [--hidden 256] [--repeats 5]

Prints a table and writes ``benchmarks/results/gru_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

from tfmlib.rnn import GRUScratch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, where_it_ran  # noqa: E402  (where it ran: one function for every script)

RESULTS = Path(__file__).resolve().parent / "results" / "gru_speed.json"


def best_time(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls after one warm-up call, in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 40, 80])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    fused = nn.GRU(args.input, args.hidden, batch_first=True)
    scratch = GRUScratch(args.input, args.hidden).copy_from_torch(fused)
    rows = []
    for length in args.lengths:
        x = torch.randn(args.batch, length, args.input, requires_grad=True)
        with torch.no_grad():
            err = (scratch(x)[0] - fused(x)[0]).abs().max().item()
        if err > 1e-4:
            raise SystemExit(f"the two GRUs disagree by {err:.2e} at length {length}")

        def step(model: nn.Module, x: torch.Tensor = x):
            return lambda: model(x)[0].sum().backward()

        t_scratch, t_fused = best_time(step(scratch), args.repeats), best_time(step(fused), args.repeats)
        rows.append({"length": length, "scratch_ms": 1e3 * t_scratch, "nn_gru_ms": 1e3 * t_fused,
                     "ratio": t_scratch / t_fused, "max_abs_diff": err})

    machine = where_it_ran("cpu")
    print(f"forward+backward, batch {args.batch}, input {args.input}, hidden {args.hidden}, "
          f"best of {args.repeats}; {describe(machine)}")
    print(f"{'length':>6} {'GRUScratch ms':>14} {'nn.GRU ms':>10} {'ratio':>7} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['length']:>6} {r['scratch_ms']:>14.1f} {r['nn_gru_ms']:>10.1f} {r['ratio']:>7.2f} "
              f"{r['max_abs_diff']:>11.1e}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "GRUScratch vs nn.GRU, forward+backward",
        "config": vars(args),
        **machine,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

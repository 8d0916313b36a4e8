"""How much slower is the teaching GRU than PyTorch's? (chapter 01)

Times a forward+backward pass of ``tfmlib.rnn.GRUScratch`` (one Python step per token, every
equation explicit) against ``nn.GRU`` (PyTorch's fused kernels) with copied weights, for several
sequence lengths, after checking that the two give the same outputs.

Measured on a 2-core CPU (see the JSON), the scratch GRU is only about 1.2x slower: PyTorch's CPU
GRU also steps through time, and the per-step matrix products dominate. The gap that justifies
``nn.GRU`` in later chapters is on a GPU, where cuDNN fuses the whole sequence into a few
kernels, and in multi-layer or bidirectional models, which ``nn.GRU`` provides in one call.

Timed with ``tfmlib.timing.interleaved_medians`` (the two GRUs take turns, the device is
synchronised around every sample, medians are kept).

    python benchmarks/gru_speed.py [--batch 64] [--hidden 256] [--repeats 5] [--device cuda] [--smoke]

Prints a table and writes ``benchmarks/results/gru_speed.json`` (``--smoke``: tiny sizes, written
to the temporary folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

from tfmlib.rnn import GRUScratch
from tfmlib.timing import interleaved_medians

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import (  # noqa: E402  (where it ran: one module for every script)
    add_run_options,
    chosen_device,
    describe,
    output_path,
    run_config,
    where_it_ran,
)

RESULTS = Path(__file__).resolve().parent / "results" / "gru_speed.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 40, 80])
    parser.add_argument("--repeats", type=int, default=5)
    add_run_options(parser)
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.input, args.hidden, args.lengths, args.repeats = 2, 8, 16, [5], 2
    device = chosen_device(args)

    torch.manual_seed(0)
    fused = nn.GRU(args.input, args.hidden, batch_first=True)
    scratch = GRUScratch(args.input, args.hidden).copy_from_torch(fused)
    fused, scratch = fused.to(device), scratch.to(device)
    rows = []
    for length in args.lengths:
        x = torch.randn(args.batch, length, args.input).to(device).requires_grad_()
        with torch.no_grad():
            err = (scratch(x)[0] - fused(x)[0]).abs().max().item()
        if err > 1e-4:
            raise SystemExit(f"the two GRUs disagree by {err:.2e} at length {length}")

        def step(model: nn.Module, x: torch.Tensor = x):
            return lambda: model(x)[0].sum().backward()

        t = interleaved_medians({"scratch": step(scratch), "fused": step(fused)}, args.repeats, warmup=1,
                                device=device)
        rows.append({"length": length, "scratch_ms": t.ms("scratch"), "nn_gru_ms": t.ms("fused"),
                     "ratio": t.ratio("scratch", "fused"), "max_abs_diff": err})

    machine = where_it_ran(device)
    print(f"forward+backward, batch {args.batch}, input {args.input}, hidden {args.hidden}, "
          f"median of {args.repeats} (interleaved, synchronised); {describe(machine)}")
    print(f"{'length':>6} {'GRUScratch ms':>14} {'nn.GRU ms':>10} {'ratio':>7} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['length']:>6} {r['scratch_ms']:>14.1f} {r['nn_gru_ms']:>10.1f} {r['ratio']:>7.2f} "
              f"{r['max_abs_diff']:>11.1e}")
    out = output_path(args, RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "GRUScratch vs nn.GRU, forward+backward",
        "timing": "tfmlib.timing.interleaved_medians (medians, device synchronised)",
        "config": run_config(args),
        **machine,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

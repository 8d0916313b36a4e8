"""What the initial scale of a learned position table changes (tfmlib.positional, issue 14).

``LearnedPositionalEmbedding`` starts its table at std ``2 ** -0.5``, the root mean square of the
sinusoidal table's entries, instead of ``d ** -0.5`` (which starts it ``sqrt(d / 2)`` times
weaker: 5.7x at d = 64, 16x at d = 512). This script measures both:

1. at initialisation, the RMS of the position vectors against that of the scaled token
   embeddings (``sqrt(d) * E[x]``, entries of variance 1), for several widths;
2. in training, a small learned-position ``Transformer`` on a task that needs positions
   (reverse a random sequence of 5-12 tokens: without positions the model cannot tell the order),
   with the two scales and several seeds: the training loss and the token accuracy on held-out
   sequences after a fixed number of steps.

    python benchmarks/learned_position_init.py [--d-model 64] [--steps 300] [--seeds 0 1 2]
                                               [--device cuda] [--smoke]

Prints two tables and writes ``benchmarks/results/learned_position_init.json`` (``--smoke``: a few
steps, written to the temporary folder). Training goes through :func:`tfmlib.train.fit` (one epoch
over ``--steps`` batches drawn up front from a seeded generator, no clipping). Nothing here compares
timings: each run's ``seconds`` is its wall clock (``fit`` synchronises the device at the end of
the epoch, so the device's work is inside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from tfmlib.data import make_batch
from tfmlib.decoding import greedy_decode
from tfmlib.positional import sinusoidal_encoding
from tfmlib.seq2seq import translation_loss
from tfmlib.train import fit
from tfmlib.transformer import Transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import (  # noqa: E402  (where it ran: one module for every script)
    add_run_options,
    chosen_device,
    describe,
    output_path,
    run_config,
    where_it_ran,
)

RESULTS = Path(__file__).resolve().parent / "results" / "learned_position_init.json"
VOCAB = 24          # 4 special tokens + 20 words
MIN_LEN, MAX_LEN = 5, 12


def scales(d: int, seed: int = 0) -> dict:
    """RMS of the position vectors (old std, new std, sinusoids) and of the scaled token vectors."""
    torch.manual_seed(seed)
    model = Transformer(VOCAB, VOCAB, d_model=d, heads=4, encoder_layers=1, decoder_layers=1, d_ff=2 * d,
                        positional="learned", max_len=64)
    tokens = model.src_embed.weight[4:] * d ** 0.5
    rms = {"tokens": tokens.square().mean().sqrt().item(),
           "learned_new": model.src_pos.table.square().mean().sqrt().item(),
           "learned_old": (torch.randn(64, d) * d ** -0.5).square().mean().sqrt().item(),
           "sinusoidal": sinusoidal_encoding(64, d).square().mean().sqrt().item()}
    return {"d_model": d, **{f"rms_{k}": round(v, 4) for k, v in rms.items()}}


def reversal_batch(g: torch.Generator, n: int):
    examples = []
    for _ in range(n):
        length = int(torch.randint(MIN_LEN, MAX_LEN + 1, (1,), generator=g))
        x = torch.randint(4, VOCAB, (length,), generator=g).tolist()
        examples.append((x, x[::-1]))
    return make_batch(examples)


def train(init_std: float, d: int, steps: int, seed: int, batch: int,
          device: torch.device | str = "cpu") -> dict:
    torch.manual_seed(seed)
    model = Transformer(VOCAB, VOCAB, d_model=d, heads=4, encoder_layers=2, decoder_layers=2, d_ff=2 * d,
                        dropout=0.0, positional="learned", max_len=MAX_LEN + 2)
    with torch.no_grad():
        for pos in (model.src_pos, model.tgt_pos):
            nn.init.normal_(pos.table, 0.0, init_std)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1000 + seed)
    start = time.perf_counter()
    batches = [reversal_batch(g, batch) for _ in range(steps)]  # one epoch of `steps` optimiser steps
    losses = fit(model, batches, translation_loss, opt, epochs=1, device=device, clip_norm=None,
                 verbose=False).step_loss
    test = reversal_batch(torch.Generator().manual_seed(99), 256).to(device)
    out = greedy_decode(model, test.src, test.src_mask, max_len=MAX_LEN + 1)
    L = min(out.tokens.shape[1], test.tgt_out.shape[1])
    real = test.tgt_mask[:, :L]
    accuracy = ((out.tokens[:, :L] == test.tgt_out[:, :L]) & real).sum().item() / real.sum().item()
    return {"final_loss": round(statistics.mean(losses[-20:]), 4), "accuracy": round(accuracy, 4),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scale-widths", type=int, nargs="+", default=[64, 256, 512])
    add_run_options(parser)
    args = parser.parse_args()
    if args.smoke:
        args.d_model, args.steps, args.batch, args.seeds, args.scale_widths = 16, 3, 8, [0], [16]
    device = chosen_device(args)
    machine = where_it_ran(device)
    print(f"learned position tables at initialisation and after {args.steps} steps; {describe(machine)}")

    scale_rows = [scales(d) for d in args.scale_widths]
    print(f"{'d_model':>7} {'tokens':>7} {'sinusoid':>8} {'learned 2^-1/2':>15} {'learned d^-1/2':>15} "
          f"{'new/old':>8}")
    for r in scale_rows:
        print(f"{r['d_model']:>7} {r['rms_tokens']:>7.3f} {r['rms_sinusoidal']:>8.3f} "
              f"{r['rms_learned_new']:>15.3f} {r['rms_learned_old']:>15.3f} "
              f"{r['rms_learned_new'] / r['rms_learned_old']:>8.1f}")

    d = args.d_model
    inits = {"2^-1/2 (new)": 2 ** -0.5, "d^-1/2 (old)": d ** -0.5}
    runs = {name: [train(std, d, args.steps, seed, args.batch, device) for seed in args.seeds]
            for name, std in inits.items()}
    print(f"\nreversal task, d_model {d}, 2+2 layers, {args.steps} Adam steps of {args.batch} sequences, "
          f"seeds {args.seeds}")
    print(f"{'init std':>14} {'final train loss per seed':>30} {'held-out token accuracy per seed':>36}")
    for name, rs in runs.items():
        losses = " ".join(f"{r['final_loss']:.3f}" for r in rs)
        accuracies = " ".join(f"{r['accuracy']:.3f}" for r in rs)
        print(f"{name:>14} {losses:>30} {accuracies:>36}")
    out = output_path(args, RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "learned position table: initial scale 2^-1/2 vs d^-1/2",
        "config": run_config(args),
        **machine,
        "scales": scale_rows,
        "training": {name: [{"seed": s, **r} for s, r in zip(args.seeds, rs, strict=True)]
                     for name, rs in runs.items()},
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

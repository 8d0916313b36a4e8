"""Is the book's Transformer as fast as PyTorch's? (chapters 07-08)

1. Training step: ``tfmlib.transformer.Transformer`` against the same model built on
   ``nn.Transformer`` (same embeddings, positions and output layer; the weights copied with
   ``copy_from_torch_transformer``, and the two checked to give the same logits first), timing a
   whole optimisation step (forward, backward, Adam step) on padded batches of random sentences,
   for a small and a base-like configuration. The goal is a ratio package / PyTorch of at most 1.1.
2. Decoding: greedy and beam search of the package model, in generated tokens per second.

Timings go through ``tfmlib.timing.interleaved_medians``: the two models take turns, the device is
synchronised around every sample and medians of several repeats are kept, so a busy machine
affects both alike. Decoding is timed the same way (one contender at a time).

    python benchmarks/transformer_speed.py [--repeats 7] [--configs small base] [--device cuda] [--smoke]

Prints a table and writes ``benchmarks/results/transformer_speed.json`` (``--smoke``: a tiny
configuration, written to the temporary folder).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from tfmlib.attention import causal_mask
from tfmlib.data import EOS_ID, PAD_ID, make_batch
from tfmlib.decoding import beam_search, greedy_decode
from tfmlib.seq2seq import EncoderDecoder, EncoderOutput, translation_loss
from tfmlib.timing import interleaved_medians
from tfmlib.transformer import Transformer, copy_from_torch_transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import (  # noqa: E402  (where it ran: one module for every script)
    add_run_options,
    chosen_device,
    describe,
    output_path,
    run_config,
    where_it_ran,
)

RESULTS = Path(__file__).resolve().parent / "results" / "transformer_speed.json"

CONFIGS = {
    # name: model sizes, vocabularies, batch of sentences and their length range
    "small": dict(d_model=256, heads=4, layers=3, d_ff=1024, vocab=8000, batch=64, min_len=8, max_len=24),
    "base": dict(d_model=512, heads=8, layers=6, d_ff=2048, vocab=16000, batch=32, min_len=10, max_len=30),
}
SMOKE = dict(d_model=16, heads=2, layers=1, d_ff=32, vocab=50, batch=4, min_len=2, max_len=5)


class TorchTransformer(EncoderDecoder):
    """The package model's embeddings, positions and output layer around ``nn.Transformer``."""

    def __init__(self, ours: Transformer):
        super().__init__()
        c = ours.config
        self.ours_parts = nn.ModuleDict({"src_embed": ours.src_embed, "tgt_embed": ours.tgt_embed,
                                         "src_pos": ours.src_pos, "tgt_pos": ours.tgt_pos,
                                         "generator": ours.generator})
        self.core = nn.Transformer(c["d_model"], c["heads"], c["encoder_layers"], c["decoder_layers"],
                                   c["d_ff"],
                                   dropout=c["dropout"], batch_first=True, norm_first=c["norm_first"])
        self.d_model, self.max_source_len = c["d_model"], ours.max_source_len

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, teacher_forcing: float = 1.0) -> Tensor:
        p, scale = self.ours_parts, math.sqrt(self.d_model)
        x = p["src_pos"](p["src_embed"](src) * scale)
        y = p["tgt_pos"](p["tgt_embed"](tgt_in) * scale)
        out = self.core(x, y, tgt_mask=~causal_mask(tgt_in.shape[1], device=src.device),
                        src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask)
        return p["generator"](out)

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:  # not used: training only
        raise NotImplementedError


def random_batches(cfg: dict, n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        examples = []
        for _ in range(cfg["batch"]):
            ls, lt = (int(v) for v in torch.randint(cfg["min_len"], cfg["max_len"] + 1, (2,), generator=g))
            examples.append((torch.randint(4, cfg["vocab"], (ls,), generator=g).tolist(),
                             torch.randint(4, cfg["vocab"], (lt,), generator=g).tolist()))
        batches.append(make_batch(examples))
    return batches


def build_pair(cfg: dict, seed: int = 0) -> tuple[Transformer, TorchTransformer]:
    torch.manual_seed(seed)
    ours = Transformer(cfg["vocab"], cfg["vocab"], d_model=cfg["d_model"], heads=cfg["heads"],
                       encoder_layers=cfg["layers"], decoder_layers=cfg["layers"], d_ff=cfg["d_ff"],
                       dropout=0.1)
    # nn.Transformer always ends its stacks with a LayerNorm; give ours the same, so they compute alike
    ours.encoder.norm, ours.decoder.norm = nn.LayerNorm(cfg["d_model"]), nn.LayerNorm(cfg["d_model"])
    theirs = TorchTransformer(copy.deepcopy(ours))  # a copy: the two models share no parameter
    # identical stacks: nn.Transformer's random weights copied into ours
    copy_from_torch_transformer(theirs.core, ours.encoder, ours.decoder)
    return ours, theirs


def check_equal(ours: nn.Module, theirs: nn.Module, batch) -> float:
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        a = ours(batch.src, batch.src_mask, batch.tgt_in)
        b = theirs(batch.src, batch.src_mask, batch.tgt_in)
    ours.train()
    theirs.train()
    diff = (a - b).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"the two models disagree by {diff:.2e}: the benchmark would compare different "
                         "things")
    return diff


def time_training(models: dict[str, nn.Module], batches: list, repeats: int,
                  device: torch.device) -> dict[str, float]:
    """Median seconds per optimisation step of each model on ``device``, interleaving the models
    (``tfmlib.timing.interleaved_medians`` over one pass through ``batches``)."""
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, m in models.items()}

    def steps(name: str) -> Callable[[], None]:
        def run() -> None:
            for batch in batches:
                loss, _ = translation_loss(models[name], batch, label_smoothing=0.1)
                optimizers[name].zero_grad(set_to_none=True)
                loss.backward()
                optimizers[name].step()
        return run

    medians = interleaved_medians({name: steps(name) for name in models}, repeats, device=device)
    return {name: t / len(batches) for name, t in medians.items()}


def time_decoding(model: Transformer, batch, beam_size: int, max_len: int, repeats: int,
                  device: torch.device) -> dict[str, float]:
    """Seconds (median of ``repeats``, after a warm-up) and output tokens per second of greedy
    decoding and beam search on ``batch``.

    An untrained model tends to end every sentence at once, which would time one step; so the
    end token is made unreachable (its output bias set to -1e9, on a copy of the model) and every
    hypothesis runs the full ``max_len`` steps: the speed of decoding ``max_len`` tokens."""
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        model.generator.bias[EOS_ID] = -1e9
    runs = {"greedy": lambda: greedy_decode(model, batch.src, batch.src_mask, max_len=max_len),
            f"beam{beam_size}": lambda: beam_search(model, batch.src, batch.src_mask, beam_size,
                                                    max_len=max_len)}
    out = {}
    for name, run in runs.items():
        last = []  # the output of the latest call, to count its tokens after timing

        def call(run: Callable = run, last: list = last) -> None:
            last[:] = [run()]

        seconds = interleaved_medians({name: call}, repeats, warmup=1, device=device)[name]
        tokens = int((last[0].tokens != PAD_ID).sum())  # every generated position
        out[name] = {"seconds": round(seconds, 3), "tokens": tokens,
                     "tokens_per_s": round(tokens / seconds, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=3, help="batches per timed repeat")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--decode-repeats", type=int, default=1,
                        help="timed decoding calls after one warm-up (base beam: ~1 min each on 2 cores)")
    add_run_options(parser)
    args = parser.parse_args()
    if args.smoke:
        args.configs, args.repeats, args.batches = ["smoke"], 2, 1
    device = chosen_device(args)

    rows = []
    for name in args.configs:
        cfg = SMOKE if name == "smoke" else CONFIGS[name]
        ours, theirs = build_pair(cfg)
        ours, theirs = ours.to(device), theirs.to(device)
        batches = [b.to(device) for b in random_batches(cfg, args.batches, seed=1)]
        diff = check_equal(ours, theirs, batches[0])
        t = time_training({"tfmlib": ours, "nn.Transformer": theirs}, batches, args.repeats, device)
        tokens = statistics.mean(b.num_target_tokens for b in batches)
        decode = time_decoding(ours, batches[0], args.beam_size, max_len=cfg["max_len"] + 10,
                               repeats=args.decode_repeats, device=device)
        rows.append({"config": name, **cfg, "max_abs_logit_diff": diff,
                     "step_s_tfmlib": round(t["tfmlib"], 4), "step_s_torch": round(t["nn.Transformer"], 4),
                     "ratio": round(t["tfmlib"] / t["nn.Transformer"], 3),
                     "train_tokens_per_s_tfmlib": round(tokens / t["tfmlib"], 1),
                     "train_tokens_per_s_torch": round(tokens / t["nn.Transformer"], 1),
                     "decoding": decode})

    machine = where_it_ran(device)
    print(f"training step (forward + backward + Adam), median of {args.repeats} x {args.batches} batches, "
          f"{describe(machine)}")
    print(f"{'config':>7} {'tfmlib s':>9} {'nn.Transformer s':>17} {'ratio':>6} {'tokens/s':>9} "
          f"{'greedy tok/s':>13} {'beam' + str(args.beam_size) + ' tok/s':>12}")
    for r in rows:
        d = r["decoding"]
        print(f"{r['config']:>7} {r['step_s_tfmlib']:>9.3f} {r['step_s_torch']:>17.3f} {r['ratio']:>6.2f} "
              f"{r['train_tokens_per_s_tfmlib']:>9.0f} {d['greedy']['tokens_per_s']:>13.0f} "
              f"{d[f'beam{args.beam_size}']['tokens_per_s']:>12.0f}")
    out = output_path(args, RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "tfmlib Transformer vs nn.Transformer: training step; decoding speed",
        "timing": "tfmlib.timing.interleaved_medians (medians, device synchronised)",
        "config": run_config(args),
        **machine,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

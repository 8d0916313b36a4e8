"""Chapter 08 on real data: the package Transformer on Multi30k, for a fixed wall-clock budget.

Trains ``tfmlib.transformer.Transformer`` on Multi30k (German -> English by default) with the
recipe of chapter 08 (Adam with beta2 = 0.98 and eps = 1e-9, warm-up then inverse square root,
label smoothing, length-bucketed batches, gradient clipping) for ``--budget-s`` seconds of
training, then translates ``test_2016_flickr`` greedily and with beam search and scores it with
sacreBLEU (default ``13a`` tokenization, lowercased, since the book's vocabularies are lowercase,
against the raw references). Prints a table and writes
``benchmarks/results/multi30k_transformer_<device>.json`` with the device, budget,
configuration, BLEU (overall and by source length) and the metric's signature.

Multi30k is read from ``--data``, by default the first of ``$TFM_CORPORA_DIR/multi30k``,
``data/external/multi30k`` and ``../shared/data/multi30k`` that exists; without it the script
says so and exits cleanly (status 0). Download steps: ``tfmlib.corpora.DOWNLOAD_INSTRUCTIONS``.

    python benchmarks/multi30k_transformer.py [--budget-s 1800] [--profile cpu|gpu]

``--profile`` picks the model size and batch (``cpu``: what fits 30 minutes of two CPU cores;
``gpu``: a bigger model and batch); any size can be overridden on the command line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tfmlib.config import pick_device, seed_everything
from tfmlib.corpora import load_multi30k
from tfmlib.data import TranslationDataset, build_vocabs
from tfmlib.decoding import evaluate_translator
from tfmlib.seq2seq import count_parameters, train_translator
from tfmlib.transformer import Transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, where_it_ran  # noqa: E402  (where it ran: one function for every script)
from multi30k_rnn_translation import find_multi30k, report_fields  # noqa: E402  (shared with ch. 02-03)

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"

PROFILES = {
    "cpu": dict(d_model=256, heads=4, layers=3, d_ff=512, dropout=0.1, batch_size=128, lr=1e-3, warmup=400),
    "gpu": dict(d_model=512, heads=8, layers=6, d_ff=2048, dropout=0.2, batch_size=256, lr=7e-4, warmup=2000),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder with Multi30k's train/val/test_2016_flickr files")
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--profile", choices=sorted(PROFILES), help="default: gpu on CUDA, else cpu")
    parser.add_argument("--budget-s", type=float, default=1800.0, help="training seconds")
    for key, value in PROFILES["cpu"].items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), help=f"(cpu profile: {value})")
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--min-freq", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty of beam search")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path,
                        help="default: benchmarks/results/multi30k_transformer_<device>.json")
    args = parser.parse_args()

    data = find_multi30k(args.data)
    if data is None:
        print("Multi30k not found (looked in $TFM_CORPORA_DIR/multi30k, data/external/multi30k, "
              "../shared/data/multi30k); nothing to do. See tfmlib.corpora.DOWNLOAD_INSTRUCTIONS.")
        sys.exit(0)
    device = pick_device()
    profile = args.profile or ("gpu" if device.type == "cuda" else "cpu")
    config = {k: (v if getattr(args, k) is None else getattr(args, k)) for k, v in PROFILES[profile].items()}
    train = load_multi30k(data, "train", args.src, args.tgt)
    test = load_multi30k(data, "test_2016_flickr", args.src, args.tgt)
    src_vocab, tgt_vocab = build_vocabs(train, min_freq=args.min_freq)
    train_data = TranslationDataset(train, src_vocab, tgt_vocab)
    max_len = max(train_data.lengths()) + 60
    print(f"Multi30k {args.src}->{args.tgt} from {data}: {len(train):,} training pairs, "
          f"{len(test):,} test pairs; "
          f"vocabularies {len(src_vocab):,} / {len(tgt_vocab):,}; {describe(where_it_ran(device))}; "
          f"profile {profile}; "
          f"{args.budget_s:.0f} s of training; {config}")

    seed_everything(args.seed)
    model = Transformer(len(src_vocab), len(tgt_vocab), d_model=config["d_model"], heads=config["heads"],
                        encoder_layers=config["layers"], decoder_layers=config["layers"], d_ff=config["d_ff"],
                        dropout=config["dropout"], max_len=max_len)
    history, _ = train_translator(model, train_data, epochs=10_000, batch_size=config["batch_size"],
                                  lr=config["lr"], warmup_steps=config["warmup"], betas=(0.9, 0.98),
                                  adam_eps=1e-9, label_smoothing=args.label_smoothing, device=device,
                                  seed=args.seed, time_budget_s=args.budget_s, desc="transformer",
                                  verbose=True)
    steps = len(history.step_loss)
    epochs = steps / math.ceil(len(train_data) / config["batch_size"])
    train_tokens = sum(e["tokens_per_second"] * e["seconds"] for e in history.epochs)
    print(f"trained {steps} steps ({epochs:.1f} epochs) in {history.seconds:.0f} s, "
          f"{train_tokens / history.seconds:,.0f} target tokens/s")
    reports = {"greedy": evaluate_translator(model, test, src_vocab, tgt_vocab, lowercase_bleu=True)}
    reports[f"beam{args.beam_size}"] = evaluate_translator(model, test, src_vocab, tgt_vocab,
                                                          lowercase_bleu=True, beam_size=args.beam_size,
                                                          alpha=args.alpha)
    results = {name: report_fields(r) for name, r in reports.items()}
    for name, r in reports.items():
        print(f"  {name:>8s}: {r.bleu}  ({r.seconds:.1f} s to translate {len(test)} sentences)")
    best = reports[f"beam{args.beam_size}"]
    for i in (0, 1, 2):
        print(f"  src: {best.sources[i]}\n  ref: {best.references[i]}\n  hyp: {best.hypotheses[i]}")
    print(f"signature: {best.bleu.signature}")

    payload = {
        "benchmark": "multi30k_transformer",
        "pair": f"{args.src}-{args.tgt}",
        "test_set": "test_2016_flickr",
        **where_it_ran(device),
        "profile": profile,
        "budget_s": args.budget_s,
        "config": {**config, "label_smoothing": args.label_smoothing, "min_freq": args.min_freq,
                   "beam_size": args.beam_size, "alpha": args.alpha, "seed": args.seed, "max_len": max_len},
        "parameters": count_parameters(model),
        "vocab_sizes": [len(src_vocab), len(tgt_vocab)],
        "train_seconds": round(history.seconds, 1),
        "steps": steps,
        "epochs": round(epochs, 2),
        "train_target_tokens_per_s": round(train_tokens / history.seconds, 1),
        "final_train_loss": round(history.epochs[-1]["train_loss"], 4),
        "results": results,
    }
    out = args.out or RESULTS_DIR / f"multi30k_transformer_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()

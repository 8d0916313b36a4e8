"""Chapters 02-03 on real data: the GRU encoder-decoder and RNNsearch on Multi30k, same budget.

Trains ``tfmlib.seq2seq.Seq2Seq`` (the fixed-vector model of chapter 02) and
``tfmlib.rnn_attention.AttentionSeq2Seq`` (chapter 03) on Multi30k for the same wall-clock budget
each, with the book's recipe (Adam, bucketed batches, clipping, teacher forcing), then translates
``test_2016_flickr`` greedily and scores it with sacreBLEU (default ``13a`` tokenization,
lowercased, since the book's vocabularies are lowercase, against the raw references). Prints a
table and writes ``benchmarks/results/multi30k_rnn_translation.json`` with the device, budget,
configuration, BLEU by source length and the metric's signature.

Multi30k is read from ``--data``, by default the first of ``$TFM_CORPORA_DIR/multi30k``,
``data/external/multi30k`` and ``../shared/data/multi30k`` that exists; without it the script
says so and exits cleanly (status 0). Download steps: ``tfmlib.corpora.DOWNLOAD_INSTRUCTIONS``.

    python benchmarks/multi30k_rnn_translation.py [--budget-s 600] [--src de --tgt en] [--device cuda]

``--smoke`` trains tiny models for a few seconds on 2,000 pairs and scores 100 test sentences,
only to check that the script runs (its JSON goes to the temporary folder). Nothing here compares
timings: the budget is training wall clock, measured by ``fit`` (which synchronises the device).
On Apple's MPS the GRU models train on the CPU (``tfmlib.rnn.recurrent_device``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from tfmlib.config import seed_everything
from tfmlib.corpora import load_multi30k
from tfmlib.data import TranslationDataset, build_vocabs
from tfmlib.decoding import evaluate_translator
from tfmlib.rnn_attention import AttentionSeq2Seq
from tfmlib.seq2seq import Seq2Seq, count_parameters, train_translator
from tfmlib.train import TimeGuardWarning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import (  # noqa: E402  (where it ran: one module for every script)
    add_run_options,
    chosen_device,
    describe,
    output_path,
    run_config,
    where_it_ran,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "multi30k_rnn_translation.json"


def find_multi30k(explicit: str | None) -> Path | None:
    candidates = [Path(explicit)] if explicit else [
        *([Path(os.environ["TFM_CORPORA_DIR"]) / "multi30k"] if os.environ.get("TFM_CORPORA_DIR") else []),
        ROOT / "data" / "external" / "multi30k",
        ROOT.parent / "shared" / "data" / "multi30k",
    ]
    return next((p for p in candidates if (p / "train.en.gz").exists() or (p / "train.en").exists()), None)


def report_fields(report) -> dict:
    """The JSON fields of an ``evaluate_translator`` report: BLEU (overall, detail, by source
    length), exact matches, decoding time, three examples and sacreBLEU's signature."""
    return {
        "bleu": round(report.bleu.score, 2),
        "bleu_detail": str(report.bleu),
        "exact_match": round(report.exact, 4),
        "bleu_by_length": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
                           for r in report.by_length],
        "decode_seconds": round(report.seconds, 2),
        "examples": [{"src": report.sources[i], "ref": report.references[i], "hyp": report.hypotheses[i]}
                     for i in (0, 1, 2)],
        "signature": report.bleu.signature,
    }


def main() -> None:
    # this benchmark trains for a set number of seconds on purpose: its time_budget_s is the budget, not a
    # guard, so fit's TimeGuardWarning would only repeat what the results say
    warnings.filterwarnings("ignore", category=TimeGuardWarning)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder with Multi30k's train/val/test_2016_flickr files")
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--budget-s", type=float, default=600.0, help="training seconds per model")
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512, help="decoder (and seq2seq encoder) units")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--min-freq", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", default=["seq2seq", "attention"],
                        choices=["seq2seq", "attention"])
    add_run_options(parser)
    args = parser.parse_args()
    if args.smoke:
        args.budget_s, args.embed, args.hidden, args.batch_size = 3.0, 16, 32, 32

    data = find_multi30k(args.data)
    if data is None:
        print("Multi30k not found (looked in $TFM_CORPORA_DIR/multi30k, data/external/multi30k, "
              "../shared/data/multi30k); nothing to do. See tfmlib.corpora.DOWNLOAD_INSTRUCTIONS.")
        sys.exit(0)
    device = chosen_device(args)
    train = load_multi30k(data, "train", args.src, args.tgt)
    test = load_multi30k(data, "test_2016_flickr", args.src, args.tgt)
    if args.smoke:
        train, test = train[:2_000], test[:100]
    src_vocab, tgt_vocab = build_vocabs(train, min_freq=args.min_freq)
    train_data = TranslationDataset(train, src_vocab, tgt_vocab)
    max_source_len = max(train_data.lengths()) + 50
    print(f"Multi30k {args.src}->{args.tgt} from {data}: {len(train):,} training pairs, {len(test):,} test "
          f"pairs; vocabularies {len(src_vocab):,} / {len(tgt_vocab):,}; {describe(where_it_ran(device))}; "
          f"{args.budget_s:.0f} s per model")

    results = {}
    for name in args.models:
        seed_everything(args.seed)
        if name == "seq2seq":
            model = Seq2Seq(len(src_vocab), len(tgt_vocab), embed=args.embed, hidden=args.hidden,
                            dropout=args.dropout, max_source_len=max_source_len)
        else:
            model = AttentionSeq2Seq(len(src_vocab), len(tgt_vocab), embed=args.embed,
                                     enc_hidden=args.hidden // 2, hidden=args.hidden, attn_size=args.hidden,
                                     dropout=args.dropout, max_source_len=max_source_len)
        history, _ = train_translator(model, train_data, epochs=10_000, batch_size=args.batch_size,
                                      lr=args.lr, device=device, seed=args.seed, time_budget_s=args.budget_s,
                                      desc=name, verbose=False)
        steps = len(history.step_loss)
        report = evaluate_translator(model, test, src_vocab, tgt_vocab, lowercase_bleu=True)
        results[name] = {
            "parameters": count_parameters(model),
            "train_seconds": round(history.seconds, 1),
            "steps": steps,
            "epochs": round(steps / (len(train_data) / args.batch_size), 2),
            "final_train_loss": round(history.epochs[-1]["train_loss"], 4),
            **report_fields(report),
        }
        print(f"  {name}: {results[name]['epochs']} epochs, train loss {results[name]['final_train_loss']}, "
              f"BLEU {results[name]['bleu']}")

    buckets = [r["bucket"] for r in next(iter(results.values()))["bleu_by_length"]]
    print(f"\n{'model':>10s} {'params':>10s} {'epochs':>7s} {'BLEU':>6s} "
          + " ".join(f"{b:>7s}" for b in buckets))
    for name, r in results.items():
        print(f"{name:>10s} {r['parameters']:>10,} {r['epochs']:>7.2f} {r['bleu']:>6.2f} "
              + " ".join(f"{row['bleu']:>7.1f}" for row in r["bleu_by_length"]))
    print(f"signature: {next(iter(results.values()))['signature']}")
    payload = {
        "benchmark": "multi30k_rnn_translation",
        "pair": f"{args.src}-{args.tgt}",
        "test_set": "test_2016_flickr",
        **where_it_ran(device),
        "budget_s_per_model": args.budget_s,
        "config": {k: v for k, v in run_config(args).items() if k != "data"},
        "vocab_sizes": [len(src_vocab), len(tgt_vocab)],
        "results": results,
    }
    out = output_path(args, RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()

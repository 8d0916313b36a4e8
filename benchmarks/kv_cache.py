"""Chapter 09's KV cache, timed: tokens/s with and without the cache, for the language model and
for the translator's greedy and beam search.

Two parts, each merged into ``benchmarks/results/kv_cache.json`` with the device
(``_machine.where_it_ran``); every time goes through ``tfmlib.timing.interleaved_medians``.

* ``--part lm``: a :class:`tfmlib.lm.DecoderLM` (untrained: the cost of a step does not depend
  on the weights) generates 64, 256 and 1024 tokens after an 8-token prompt, batch 1, greedily,
  (a) re-running the whole sequence at every step, (b) with the cache concatenated at every step,
  (c) with the cache pre-allocated; the outputs of the three are checked equal. One invocation
  times every length and writes all the rows together (rows of earlier runs are replaced, never
  merged: rows timed under different loads cannot be compared), with each contender's median,
  quartiles, minimum and maximum, and the per-round ratios' median and range.
* ``--part multi30k``: the Transformer of ``benchmarks/multi30k_transformer.py`` (its ``cpu``
  configuration) trained for ``--budget-s`` seconds (default 300: far less than that script's 30
  minutes, so its translations are worse and may run longer), then greedy and beam-5 decoding of
  the 1,000 sentences of ``test_2016_flickr`` with ``kv_cache`` on and off (the outputs are
  checked equal). Skipped cleanly when Multi30k is absent.

    python benchmarks/kv_cache.py --part lm
    python benchmarks/kv_cache.py --part multi30k [--budget-s 300]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import warnings
from pathlib import Path

import torch

from tfmlib.config import pick_device, seed_everything
from tfmlib.lm import DecoderLM, generate
from tfmlib.timing import interleaved_medians
from tfmlib.train import TimeGuardWarning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, where_it_ran  # noqa: E402  (where it ran: one function for every script)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "kv_cache.json"
LM_CONFIG = dict(vocab_size=300, d_model=256, heads=4, layers=4, context=1100)
# generated tokens -> timed rounds; 1024 tokens without the cache take about 100 s a round on one
# core, so they are timed once (with no warm-up): about 4 minutes in all on one idle core
LENGTHS = {64: 7, 256: 5, 1024: 1}


def merge(part: str, payload: dict) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {"benchmark": "kv_cache"}
    data[part] = payload
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} [{part}]")


def _ratios(t, a: str, b: str) -> dict:
    """``a / b`` within each timed round (both timed in the same round): median, min and max."""
    r = [x / y for x, y in zip(t.detail[a].samples, t.detail[b].samples, strict=True)]
    return {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3)}


def lm_part(device: torch.device) -> None:
    seed_everything(0)
    config = dict(LM_CONFIG)
    model = DecoderLM(config.pop("vocab_size"), **config).to(device).eval()
    prompt = torch.randint(4, LM_CONFIG["vocab_size"], (1, 8), device=device)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    print(f"DecoderLM {LM_CONFIG}, batch 1, prompt 8 tokens; {describe(where_it_ran(device))}")
    for n, repeats in LENGTHS.items():
        outs = {}

        def run(name: str, n: int = n, outs: dict = outs, **kw) -> None:
            outs[name] = generate(model, prompt, n, **kw)

        t = interleaved_medians({"no cache": lambda: run("no cache", use_cache=False),
                                 "concatenated": lambda: run("concatenated", preallocate=False),
                                 "pre-allocated": lambda: run("pre-allocated")},
                                repeats=repeats, warmup=1 if n < 1024 else 0, device=device)
        assert torch.equal(outs["no cache"], outs["pre-allocated"]) and \
            torch.equal(outs["no cache"], outs["concatenated"]), f"{n} tokens: the cache changed the output"
        row = {"tokens": n, "rounds": repeats, "warmup": t.warmup,
               "seconds": {k: {"median": round(d.median, 4), "q1": round(d.quartiles[0], 4),
                               "q3": round(d.quartiles[1], 4), "min": round(d.min, 4), "max": round(d.max, 4)}
                           for k, d in t.detail.items()},
               "tokens_per_s": {k: round(n / v, 1) for k, v in t.items()},
               "speedup_cache": _ratios(t, "no cache", "pre-allocated"),
               "concat_over_prealloc": _ratios(t, "concatenated", "pre-allocated")}
        rows.append(row)
        print(f"--- {n} tokens: {t.table()}")
        print(f"    no cache / pre-allocated {row['speedup_cache']}; concatenated / pre-allocated "
              f"{row['concat_over_prealloc']} (per-round ratios)")
    finished = datetime.datetime.now(datetime.timezone.utc)
    merge("lm", {**where_it_ran(device), "config": LM_CONFIG, "batch": 1, "prompt_tokens": 8,
                 "started_utc": started.isoformat(timespec="seconds"),
                 "finished_utc": finished.isoformat(timespec="seconds"),
                 "note": "all rows from this one invocation; ratios are per round (same round, same load)",
                 "rows": rows})


def multi30k_part(device: torch.device, budget_s: float) -> None:
    from multi30k_rnn_translation import find_multi30k
    from multi30k_transformer import PROFILES

    from tfmlib.corpora import load_multi30k
    from tfmlib.data import TranslationDataset, build_vocabs
    from tfmlib.decoding import translate
    from tfmlib.seq2seq import train_translator
    from tfmlib.transformer import Transformer

    data = find_multi30k(None)
    if data is None:
        print("Multi30k not found; the multi30k part is skipped (see tfmlib.corpora.DOWNLOAD_INSTRUCTIONS)")
        return
    config = PROFILES["cpu"]
    train = load_multi30k(data, "train", "de", "en")
    test = load_multi30k(data, "test_2016_flickr", "de", "en")
    src_vocab, tgt_vocab = build_vocabs(train, min_freq=2)
    train_data = TranslationDataset(train, src_vocab, tgt_vocab)
    max_len = max(train_data.lengths()) + 60
    seed_everything(0)
    model = Transformer(len(src_vocab), len(tgt_vocab), d_model=config["d_model"], heads=config["heads"],
                        encoder_layers=config["layers"], decoder_layers=config["layers"], d_ff=config["d_ff"],
                        dropout=config["dropout"], max_len=max_len)
    history, _ = train_translator(model, train_data, epochs=10_000, batch_size=config["batch_size"],
                                  lr=config["lr"], warmup_steps=config["warmup"], betas=(0.9, 0.98),
                                  adam_eps=1e-9, label_smoothing=0.1, device=device, seed=0,
                                  time_budget_s=budget_s, desc="transformer")
    print(f"trained {len(history.step_loss)} steps in {history.seconds:.0f} s; "
          f"{describe(where_it_ran(device))}")
    sources = [s for s, _ in test]
    results = {}
    for name, beam in (("greedy", 1), ("beam5", 5)):
        outs = {}

        def run(cache: bool, key: str, beam: int = beam, outs: dict = outs) -> None:
            model.kv_cache = cache
            outs[key] = translate(model, sources, src_vocab, tgt_vocab, beam_size=beam, device=device)

        t = interleaved_medians({"no cache": lambda: run(False, "no cache"),
                                 "cache": lambda: run(True, "cache")}, repeats=3, warmup=0, device=device)
        model.kv_cache = True
        same = sum(a == b for a, b in zip(outs["no cache"], outs["cache"], strict=True))
        words = sum(len(h.split()) for h in outs["cache"])
        results[name] = {"seconds": {k: round(v, 2) for k, v in t.items()},
                         "speedup": round(t["no cache"] / t["cache"], 2), "identical_outputs": same,
                         "sentences": len(sources), "output_words": words,
                         "words_per_s": {k: round(words / v, 1) for k, v in t.items()}}
        print(f"{name:>7s}: {t['no cache']:.1f} s without the cache, {t['cache']:.1f} s with it "
              f"({results[name]['speedup']:.2f}x); identical outputs {same}/{len(sources)}")
        assert same == len(sources), "the cache changed a translation"
    merge("multi30k", {**where_it_ran(device), "pair": "de-en", "test_set": "test_2016_flickr",
                       "train_budget_s": budget_s, "train_seconds": round(history.seconds, 1),
                       "steps": len(history.step_loss), "config": config, "max_len": max_len,
                       "note": "trained for the budget only (benchmarks/multi30k_transformer.py trains "
                               "30 min), so outputs differ from that model's and may be longer",
                       "results": results})


def main() -> None:
    # this benchmark trains for a set number of seconds on purpose: its time_budget_s is the budget, not a
    # guard, so fit's TimeGuardWarning would only repeat what the results say
    warnings.filterwarnings("ignore", category=TimeGuardWarning)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("lm", "multi30k"), required=True)
    parser.add_argument("--budget-s", type=float, default=300.0, help="Multi30k training seconds")
    args = parser.parse_args()
    device = pick_device()
    if args.part == "lm":
        lm_part(device)
    else:
        multi30k_part(device, args.budget_s)


if __name__ == "__main__":
    main()

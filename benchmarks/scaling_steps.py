"""Chapter 10's step-by-step table: the same language model and data, each step of the chapter added
in turn, with tokens/s of real tokens and, where the device's peak is known, model FLOPs utilisation.

The model is chapter 09's :class:`tfmlib.lm.DecoderLM` (dropout 0), the data the English side of
the bundled corpus with chapter 09's word vocabulary, built exactly as ``python -m tfmlib.ddp_train``
builds them (:func:`tfmlib.ddp_train.build_data`), so that the last step, which runs that script
under ``torchrun``, trains the same model on the same data. The steps, each keeping the ones before:

1. baseline: explicit attention (chapter 05's softmax, ``model.attention = "explicit"``), fp32,
   eager, padded sentence batches bucketed by length as chapters 02 and 09 batch them
   (``tfmlib.rnn.collate_lm``: one sentence per row, padded to the longest of its batch; the little
   padding left is computed and thrown away);
2. + fused attention (``model.attention = "fused"``: ``F.scaled_dot_product_attention``);
3. + bf16 autocast (:func:`tfmlib.precision.autocast`; fp16 where bf16 is missing, fp32 where
   neither is: the row says which ran);
4. + ``torch.compile`` (:func:`tfmlib.compiling.compile_or_fallback`; where the platform cannot
   compile, the row trains eagerly and its note says why);
5. + packed fixed-token batches (:mod:`tfmlib.packing`: every position a real token, one shape);
6. + 2 processes: ``torchrun --standalone --nproc_per_node 2 -m tfmlib.ddp_train`` with the same
   sizes and the same global batch (gloo on the CPU, nccl on GPUs; it trains eagerly: that script
   has no compile step), next to the same script with 1 process, timed by the same clock (the
   script's own tokens/s over all its steps; ``ddp_repeats`` runs of each, alternating, the median
   shown). On one GPU there is no second device: the row is
   skipped with the reason.

Four reference rows, marked by parentheses, are not steps: step 5 without compile (so that what
compile does to fixed-shape batches can be read off); sentence batches *not* bucketed and packed
blocks, both fused, fp32 and eager (to read off what the batching alone does: against the bucketed
batches of step 2, packing removes only the little padding bucketing leaves, while random batches
are mostly padding); and the torchrun script with 1 process.

Each padded batch holds about as many real tokens as a packed batch (``--batch`` blocks of
``--block-len`` tokens), so every row trains on about the same number of real tokens per step.
Steps 1-5 are timed together through :func:`tfmlib.timing.interleaved_medians` (each contender a
round of ``--cycle`` optimiser steps over the same fixed batches, contenders taking turns, so a
change in the machine's load hits them all alike). Tokens/s counts real (non-padding) target tokens.
Model FLOPs per token are :func:`tfmlib.throughput.lm_flops_per_token` (6N + 12 L d T); MFU divides
by the device's datasheet peak (:func:`tfmlib.throughput.peak_flops`), which the CPU has none of,
so every row also reports the fraction of a large matmul's FLOP/s measured here at the same
precision (the "reachable" peak of this machine).

``--profile`` picks the sizes: ``cpu`` (the default; the committed JSON, one thread), ``smoke``
(tiny, seconds, compile through the "eager" backend so the path runs without code generation) and
``gpu`` (chapter 09's model at GPT-2-small size: d_model 768, 12 layers, 12 heads, context 1024,
16 blocks of 1024 tokens per step). The issue's goal for ``gpu`` is **>= 35% MFU on one H100** in
bf16 with compile and packed blocks. Nobody could run the ``gpu`` profile while this was written
(no GPU here): its code path (device moves, autocast dtype, synchronised timing, peak lookup,
compile, the skipped 2-process row on one GPU) is written for CUDA and guarded, and is untested on
a GPU; its numbers are for whoever runs it.

    python benchmarks/scaling_steps.py                      # cpu profile, results/scaling_steps_cpu.json
    python benchmarks/scaling_steps.py --profile gpu        # on a GPU: results/scaling_steps_gpu.json
    python benchmarks/scaling_steps.py --smoke              # tiny, JSON to the temporary folder
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tfmlib.compiling import compile_or_fallback
from tfmlib.config import seed_everything
from tfmlib.data import tokenize
from tfmlib.ddp_train import build_data
from tfmlib.lm import DecoderLM
from tfmlib.precision import DTYPES, autocast, pick_precision
from tfmlib.rnn import collate_lm, lm_loss
from tfmlib.synthetic import load_bundled
from tfmlib.throughput import lm_flops_per_token, mfu, peak_flops
from tfmlib.timing import interleaved_medians

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import add_run_options, chosen_device, describe, output_path, run_config, where_it_ran  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

PROFILES: dict[str, dict[str, Any]] = {
    # d_model, heads, layers; block_len = the context; batch = blocks per step; cycle = batches per
    # timed round; rounds = timed rounds per contender; ddp_steps = optimiser steps of each torchrun run
    "smoke": dict(d_model=32, heads=2, layers=1, block_len=16, batch=4, sentences=400, cycle=2, rounds=2,
                  ddp_steps=4, ddp_repeats=1, compile_backend="eager", matmul=256),
    "cpu": dict(d_model=128, heads=4, layers=2, block_len=64, batch=16, sentences=6000, cycle=4, rounds=5,
                ddp_steps=40, ddp_repeats=3, compile_backend="inductor", matmul=1024),
    "gpu": dict(d_model=768, heads=12, layers=12, block_len=1024, batch=16, sentences=50000, cycle=4,
                rounds=10, ddp_steps=40, ddp_repeats=1, compile_backend="inductor", matmul=8192),
}


def matmul_flops(device: torch.device, precision: str, n: int, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` matmul at ``precision`` on ``device`` (2 n^3 FLOPs, median of
    ``repeats``): the reachable peak of this machine, where no datasheet peak is known."""
    dtype = DTYPES[precision]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = interleaved_medians({"matmul": lambda: a @ b}, repeats=repeats, warmup=1, device=device)
    return 2 * n ** 3 / t["matmul"]


def padded_batches(sentences: list[list[int]], n_batches: int, tokens_per_batch: int, max_len: int,
                   seed: int, *, bucketed: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` padded sentence batches (``collate_lm``), each of about ``tokens_per_batch`` real
    target tokens: random sentences (fixed seed), each cut to ``max_len - 1`` words (+ EOS).
    ``bucketed`` (chapter 02's and 09's bucketing): the drawn sentences are sorted by length before
    they are cut into batches, so a batch holds sentences of about one length and little padding;
    otherwise each batch holds sentences in random order, padded to its longest."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(sentences), generator=g).tolist()
    # bucketing sorts a pool 20 times larger than needed (as BucketBatchSampler's pool_factor does), so
    # that neighbours in the sorted pool have about one length; a random pick of its batches is kept
    pool = 20 if bucketed else 1
    drawn, real, pos = [], 0, 0
    while real < pool * n_batches * tokens_per_batch:
        s = sentences[order[pos % len(order)]][: max_len - 1]
        pos += 1
        drawn.append(s)
        real += len(s) + 1
    if bucketed:
        drawn.sort(key=len)
    batches, rows, real = [], [], 0
    for s in drawn:
        rows.append(s)
        real += len(s) + 1
        if real >= tokens_per_batch:
            batches.append(collate_lm(rows))
            rows, real = [], 0
    if rows and len(batches) < n_batches:
        batches.append(collate_lm(rows))
    if bucketed:  # the batches in random order, not shortest first
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    return batches[:n_batches]


def packed_batches(blocks: Any, n_batches: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``n_batches * batch`` packed blocks, stacked into ``n_batches`` batches."""
    need = n_batches * batch
    if len(blocks) < need:
        raise SystemExit(f"scaling_steps: {len(blocks)} packed blocks, {need} needed; raise --sentences or "
                         "lower --batch, --cycle or --block-len")
    pairs = [blocks[i] for i in range(need)]
    return [(torch.stack([p[0] for p in pairs[k * batch:(k + 1) * batch]]),
             torch.stack([p[1] for p in pairs[k * batch:(k + 1) * batch]])) for k in range(n_batches)]


def real_tokens(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return int(sum(int((t != 0).sum()) for _, t in batches))      # PAD_ID = 0 is not a target


def make_model(vocab_size: int, cfg: dict, device: torch.device, attention: str) -> DecoderLM:
    seed_everything(0)                       # every row starts from the same weights
    model = DecoderLM(vocab_size, d_model=cfg["d_model"], heads=cfg["heads"], layers=cfg["layers"],
                      context=cfg["block_len"], dropout=0.0).to(device)
    model.attention = attention
    return model


def training_round(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list,
                   device: torch.device, precision: str) -> Callable[[], None]:
    """One timed round: an optimiser step on each batch of the cycle (forward and loss under autocast)."""
    on_device = [(x.to(device), y.to(device)) for x, y in batches]

    def run() -> None:
        for batch in on_device:
            optimizer.zero_grad(set_to_none=True)
            with autocast(device, precision):
                loss, _ = lm_loss(model, batch)
            loss.backward()
            optimizer.step()
    return run


def compile_model(model: DecoderLM, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                  precision: str, backend: str) -> tuple[torch.nn.Module, str, float | None]:
    """``torch.compile`` with the fallback of :mod:`tfmlib.compiling`: (module, note, compile seconds)."""
    x, y = batch[0].to(device), batch[1].to(device)

    def trial(m: torch.nn.Module) -> None:
        with autocast(device, precision):
            loss, _ = lm_loss(m, (x, y))
        loss.backward()

    def compiler(m: torch.nn.Module) -> torch.nn.Module:
        return torch.compile(m, backend=backend)

    module, report = compile_or_fallback(model, trial, compiler, device=device)
    note = f"{report} [backend {backend}]"
    return module, note, report.seconds if report.compiled else None


def torchrun(nproc: int, cfg: dict, precision: str, threads: int, out: Path, timeout: float) -> dict:
    """Run ``tfmlib.ddp_train`` under torchrun with ``nproc`` processes; its JSON (rank 0's)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "tfmlib.ddp_train", "--global-batch", str(cfg["batch"]), "--steps", str(cfg["ddp_steps"]),
           "--block-len", str(cfg["block_len"]), "--sentences", str(cfg["sentences"]),
           "--d-model", str(cfg["d_model"]), "--heads", str(cfg["heads"]), "--layers", str(cfg["layers"]),
           "--precision", precision, "--threads", str(threads), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun with {nproc} process(es) failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_options(parser)
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="sizes (default: cpu; smoke with --smoke)")
    parser.add_argument("--no-ddp", action="store_true", help="leave out the torchrun rows")
    parser.add_argument("--warm-cache", action="store_true",
                        help="let Inductor reuse code compiled by an earlier run (default: its caches are "
                             "off, so the compile time is what a first run pays)")
    args = parser.parse_args(argv)
    if not args.warm_cache:          # (the environment variable is read when torch is imported: too late)
        torch.compiler.config.force_disable_caches = True
    profile = args.profile or ("smoke" if args.smoke else "cpu")
    args.profile = profile
    cfg = dict(PROFILES[profile])
    device = chosen_device(args)
    if profile == "gpu" and device.type != "cuda":
        print(f"scaling_steps: the gpu profile is sized for a CUDA GPU; running it on {device} will be slow")
    seed_everything(0)

    blocks, vocab = build_data(cfg["sentences"], cfg["block_len"])
    english = [vocab.encode(s) for s in _english(cfg["sentences"])]
    tokens_per_step = cfg["batch"] * cfg["block_len"]
    packed = packed_batches(blocks, cfg["cycle"], cfg["batch"])
    padded = padded_batches(english, cfg["cycle"], tokens_per_step, cfg["block_len"], seed=0)
    unbucketed = padded_batches(english, cfg["cycle"], tokens_per_step, cfg["block_len"], seed=0,
                                bucketed=False)
    low = pick_precision(device, "auto")                    # bf16 where the device has it
    threads = torch.get_num_threads()

    where = where_it_ran(device)
    print(f"scaling_steps ({profile}): DecoderLM d_model {cfg['d_model']}, {cfg['layers']} layers, "
          f"{cfg['heads']} heads, vocab {len(vocab)}, context {cfg['block_len']}; ~{tokens_per_step} real "
          f"tokens per step, {cfg['cycle']} steps per timed round, {cfg['rounds']} rounds")
    print(f"  {describe(where)}")

    steps = [  # name, attention, precision, compile, data
        ("baseline: explicit attention, fp32, eager, bucketed sentences", "explicit", "fp32", False,
         "padded"),
        ("+ fused attention (SDPA)", "fused", "fp32", False, "padded"),
        (f"+ {low} autocast", "fused", low, False, "padded"),
        ("+ torch.compile", "fused", low, True, "padded"),
        ("+ packed fixed-token batches", "fused", low, True, "packed"),
        ("  (packed, eager: the same without compile, for reference)", "fused", low, False, "packed"),
        ("  (sentences not bucketed: fused, fp32, eager, for reference)", "fused", "fp32", False,
         "unbucketed"),
        ("  (packed: fused, fp32, eager, for reference)", "fused", "fp32", False, "packed"),
    ]
    contenders: dict[str, Callable[[], None]] = {}
    rows: list[dict[str, Any]] = []
    for name, attention, precision, compiled, data in steps:
        batches = {"padded": padded, "unbucketed": unbucketed, "packed": packed}[data]
        model = make_model(len(vocab), cfg, device, attention)
        note, compile_s = "eager", None
        module: torch.nn.Module = model
        if compiled:
            module, note, compile_s = compile_model(model, batches[0], device, precision,
                                                    cfg["compile_backend"])
            print(f"  {name}: {note}")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        contenders[name] = training_round(module, optimizer, batches, device, precision)
        mean_len = round(sum(x.shape[1] for x, _ in batches) / len(batches))
        rows.append({"step": name, "attention": attention, "precision": precision, "compiled": note,
                     "compile_s": compile_s, "data": data, "threads": threads, "processes": 1,
                     "real_tokens_per_round": real_tokens(batches),
                     "slots_per_round": sum(x.numel() for x, _ in batches), "mean_length": mean_len,
                     "flops_per_token": lm_flops_per_token(model, mean_len)})

    times = interleaved_medians(contenders, repeats=cfg["rounds"], warmup=1, device=device)
    reachable = {p: matmul_flops(device, p, cfg["matmul"]) for p in sorted({r["precision"] for r in rows})}
    for row in rows:
        seconds = times[row["step"]]
        detail = times.detail[row["step"]]
        row["round_s"] = seconds
        row["round_s_quartiles"] = list(detail.quartiles)
        row["tokens_per_s"] = row["real_tokens_per_round"] / seconds
        row["model_flops_per_s"] = row["tokens_per_s"] * row["flops_per_token"]
        row["mfu"] = mfu(row["tokens_per_s"], row["flops_per_token"], peak_flops(device, row["precision"]))
        row["of_matmul_peak"] = row["model_flops_per_s"] / reachable[row["precision"]]

    ddp_note = None
    if args.no_ddp:
        ddp_note = "left out (--no-ddp)"
    elif device.type == "cuda" and torch.cuda.device_count() < 2:
        ddp_note = f"skipped: {torch.cuda.device_count()} GPU here, 2 processes need one device each"
    elif device.type not in ("cpu", "cuda"):
        ddp_note = f"skipped: torchrun's backends (gloo, nccl) do not drive {device.type}"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            runs: dict[int, list[dict]] = {1: [], 2: []}
            for k in range(cfg["ddp_repeats"]):          # 1, 2, 1, 2, ...: load changes hit both alike
                for nproc in (1, 2):
                    runs[nproc].append(torchrun(nproc, cfg, low, threads, Path(tmp) / f"ddp{nproc}_{k}.json",
                                                timeout=600 if profile != "smoke" else 180))
            for nproc in (1, 2):
                ordered = sorted(runs[nproc], key=lambda r: r["tokens_per_s"])
                r = ordered[len(ordered) // 2]                  # the median run
                name = ("+ 2 processes (torchrun, DDP; eager)" if nproc == 2 else
                        "  (the torchrun script, 1 process, for reference)")
                rows.append({"step": name, "attention": "fused", "precision": r["precision"],
                             "compiled": "eager (ddp_train does not compile)", "compile_s": None,
                             "data": "packed", "threads": r["threads_per_process"], "processes": nproc,
                             "backend": r["backend"], "steps": r["steps"], "step_s": r["step_s"],
                             "tokens_per_s": r["tokens_per_s"],
                             "tokens_per_s_runs": [x["tokens_per_s"] for x in runs[nproc]],
                             "flops_per_token": r["flops_per_token"],
                             "model_flops_per_s": r["tokens_per_s"] * r["flops_per_token"], "mfu": r["mfu"],
                             "of_matmul_peak": r["tokens_per_s"] * r["flops_per_token"]
                             / _reachable(reachable, device, r["precision"], cfg["matmul"]) / nproc,
                             "loss_first_last": [r["step_loss"][0], r["step_loss"][-1]]})
    base = rows[0]["tokens_per_s"]
    print("\nreachable here (a {n} x {n} matmul, {t} thread(s)): ".format(n=cfg["matmul"], t=threads)
          + ", ".join(f"{p} {f / 1e9:,.1f} GFLOP/s" for p, f in reachable.items()))
    print(f"{'step':64s}{'prec':>6s}{'proc x thr':>11s}{'tokens/s':>11s}{'x base':>8s}{'MFU':>7s}"
          f"{'of matmul':>10s}")
    for row in rows:
        m = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        print(f"{row['step']:64s}{row['precision']:>6s}{row['processes']:>6d} x {row['threads']:<3d}"
              f"{row['tokens_per_s']:>11,.0f}{row['tokens_per_s'] / base:>7.2f}x{m:>7s}"
              f"{100 * row['of_matmul_peak']:>9.1f}%")
        row["speedup_vs_baseline"] = row["tokens_per_s"] / base
    if ddp_note:
        print(f"+ 2 processes: {ddp_note}")
    for label, batches in (("bucketed sentences", padded), ("sentences not bucketed", unbucketed)):
        slots = sum(x.numel() for x, _ in batches)
        print(f"{label}: {1 - real_tokens(batches) / slots:.1%} of the positions are padding")
    print("tokens/s: real target tokens (padding excluded); MFU: of the datasheet peak (none for a CPU); "
          "of matmul: of a large matmul's FLOP/s measured here at that precision, per process")

    result = {"benchmark": "scaling_steps", **where, "profile": profile, "config": run_config(args),
              "sizes": cfg, "vocab_size": len(vocab), "tokens_per_step": tokens_per_step,
              "reachable_matmul_flops": reachable, "ddp_note": ddp_note, "rows": rows}
    out = output_path(args, RESULTS / f"scaling_steps_{profile}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


def _reachable(reachable: dict[str, float], device: torch.device, precision: str, n: int) -> float:
    if precision not in reachable:
        reachable[precision] = matmul_flops(device, precision, n)
    return reachable[precision]


def _english(n: int) -> list[list[str]]:
    """The English sentences :func:`tfmlib.ddp_train.build_data` packs, as word lists."""
    return [tokenize(en) for en, _ in load_bundled("train")[:n]]


if __name__ == "__main__":
    main()

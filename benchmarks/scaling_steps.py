"""Chapter 10's step-by-step table: the same language model and data, each step of the chapter added
in turn, with tokens/s of real tokens and, where the device's peak is known, model FLOPs utilisation.

The model is chapter 09's :class:`tfmlib.lm.DecoderLM` (dropout 0), the data the English side of
the bundled corpus with chapter 09's word vocabulary, built exactly as ``python -m tfmlib.ddp_train``
builds them (:func:`tfmlib.packing.bundled_english_blocks`), so that the last step, which runs that script
under ``torchrun``, trains the same model on the same data. The steps, each keeping the ones before:

1. baseline: explicit attention (chapter 05's softmax, ``model.attention = "explicit"``), fp32,
   eager, padded sentence batches bucketed by length (:class:`tfmlib.data.TokenBatchSampler`: the
   sentences of a batch have about one length, and a batch holds at most as many positions as a
   packed batch has tokens, so every row trains on about the same number of tokens per step);
2. + fused attention (``model.attention = "fused"``: ``F.scaled_dot_product_attention``);
3. + TF32 matmuls (:func:`tfmlib.precision.tf32_matmul`: fp32 weights and activations, the
   products on the tensor cores in TensorFloat-32; on a CPU there is no TF32 unit and the row
   computes exactly what the row above does);
4. + bf16 autocast (:func:`tfmlib.precision.autocast`; fp16 with a gradient scaler where bf16 is
   missing: the row says which ran);
5. + ``torch.compile`` with symbolic shapes (``dynamic=True``: the padded batches change length);
6. + packed fixed-token batches (:mod:`tfmlib.packing`), compiled for their one static shape
   (``dynamic=False``);
7. + fused AdamW (:func:`tfmlib.speed.make_adamw`: one kernel per update instead of a loop or a
   ``foreach`` chain; rows 1-6 use ``torch.optim.AdamW``'s default); it shares row 6's compiled
   module, with an optimizer of its own;
8. CUDA only: + ``mode="max-autotune"`` (Inductor tries several kernels per matmul and records the
   step in CUDA graphs: no launch gaps), where the shapes are static;
9. CUDA only: + a micro-batch sized to the free memory (:func:`tfmlib.speed.micro_batch_for_memory`,
   a multiple of 8 rows, at most 64): the one row whose tokens per step differ;
10. + 2 processes: ``torchrun --standalone --nproc_per_node 2 -m tfmlib.ddp_train`` with the same
   sizes and the same global batch (gloo on the CPU, nccl on GPUs; it trains eagerly: that script
   has no compile step), next to the same script with 1 process (``ddp_repeats`` runs of each,
   alternating, the median shown). On one GPU the row is skipped with the reason.

Reference rows, in parentheses, are not steps: the packed blocks in bf16 eagerly (what compile
does to fixed-shape batches); sentence batches *not* bucketed, and packed blocks, both fused, fp32
and eager (what the batching alone does); and the torchrun script with 1 process.

**Timing as a training loop runs.** Every contender is a round of ``cycle`` optimiser steps over
fixed batches, and :func:`tfmlib.timing.interleaved_medians` synchronises the device once per round,
not per step: within a round the host queues step k + 1 while the device runs step k, as in a loop
that reads nothing back. No step reads a value back either: :func:`tfmlib.rnn.lm_loss` keeps its
token count on the device, and the losses are not read. Contenders take turns, so a change in the
machine's load hits them all alike. Tokens/s counts real (non-padding) target tokens. Model FLOPs
per token are :func:`tfmlib.throughput.lm_flops_per_token` (PaLM's 6N + 12 L d T); MFU divides by
the datasheet peak of the precision the products ran in (:func:`tfmlib.throughput.peak_flops`: the
TF32 peak for the TF32 row), which the CPU has none of, so every row also reports the fraction of
a large matmul's FLOP/s measured here at the same precision (the "reachable" peak of this
machine). After the table, :func:`tfmlib.profiling.profile_steps` profiles one step of the last
single-process row and prints where its time went (the top operations, the gaps).

``--profile`` picks the sizes: ``cpu`` (the default; the committed JSON, one thread), ``smoke``
(tiny, seconds, compile through the "eager" backend so the path runs without code generation) and
``gpu`` (chapter 09's model at GPT-2-small size: d_model 768, 12 layers, 12 heads, context 1024,
16 blocks of 1024 tokens per step, 10 steps per timed round).

**The GPU goal and an estimate on paper.** The goal is >= 40% MFU of the bf16 datasheet peak on one
H100 (989 TFLOP/s) in the gpu profile. Its first run (2026-11-26, H100 80GB, torch 2.11, this
script before these changes) reached 433k tokens/s = 27.4% with bf16 + compile + packed blocks:
16,384 tokens x 0.625 GFLOP = 10.24 TFLOP per step in 37.8 ms (the 8192^3 bf16 matmul reached 724
TFLOP/s there: 37.4% of it). 40% of 989 TFLOP/s is 633k tokens/s, 25.9 ms per 16,384 tokens: 11.9
ms must go. What each change should buy, from those numbers:

* no host read per step (``lm_loss`` read its count with ``int()``): the host waited for the GPU
  at every step and then launched the next step's first kernels into an empty queue, plus the
  Python of a step (zero_grad, autocast, Dynamo's guards): about 0.5-1.5 ms per step;
* fused AdamW: the default ``foreach`` update of 85 M fp32 parameters makes about ten passes over
  340 MB arrays (~7 GB of traffic, ~2.3 ms at ~3 TB/s); the fused kernel reads weight, gradient and
  two moments and writes three of them once (~2.4 GB, ~0.8 ms): about 1.5 ms per step;
* a static compile with ``max-autotune`` and CUDA graphs: the step's ~1,000 kernels launch as one
  graph (no gap between kernels), and the matmuls get autotuned Triton/cuBLAS choices: 1-3 ms;
* a micro-batch twice as large (32 rows, if the memory allows): the optimizer's ~0.8 ms and the
  per-step fixed costs are shared by twice the tokens, and the matmuls get taller (M = 32,768):
  about 1-1.5 ms per 16,384 tokens.

Summed, 4-7.5 ms of the 11.9: 30-34 ms per 16,384 tokens, 31-35% MFU. The remaining ~4-8 ms are
what the profile printed after the table must locate on the H100 (candidates: the rotary and
layer-norm kernels between the matmuls, the fp32 casts autocast adds, the attention backward at
head size 64); 40% is therefore not promised by this arithmetic. Nobody has run this version on
a GPU yet (no GPU where it was written): its CUDA-only rows (8, 9) and the CUDA profile are
untested.

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
from tfmlib.data import TokenBatchSampler, tokenize
from tfmlib.lm import DecoderLM
from tfmlib.packing import bundled_english_blocks
from tfmlib.precision import DTYPES, autocast, make_grad_scaler, supports_bf16, tf32_matmul
from tfmlib.profiling import profile_steps
from tfmlib.rnn import collate_lm, lm_loss
from tfmlib.speed import make_adamw, micro_batch_for_memory
from tfmlib.synthetic import load_bundled
from tfmlib.throughput import lm_flops_per_token, mfu, peak_flops, peak_name
from tfmlib.timing import interleaved_medians

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import add_run_options, chosen_device, describe, output_path, run_config, where_it_ran  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

PROFILES: dict[str, dict[str, Any]] = {
    # d_model, heads, layers; block_len = the context; batch = blocks per step; cycle = optimiser steps
    # per timed round (the device is synchronised once per round); rounds = timed rounds per contender;
    # ddp_steps = optimiser steps of each torchrun run
    "smoke": dict(d_model=32, heads=2, layers=1, block_len=16, batch=4, sentences=400, cycle=2, rounds=2,
                  ddp_steps=4, ddp_repeats=1, compile_backend="eager", matmul=256),
    "cpu": dict(d_model=128, heads=4, layers=2, block_len=64, batch=16, sentences=6000, cycle=4, rounds=5,
                ddp_steps=40, ddp_repeats=3, compile_backend="inductor", matmul=1024),
    "gpu": dict(d_model=768, heads=12, layers=12, block_len=1024, batch=16, sentences=50000, cycle=10,
                rounds=10, ddp_steps=40, ddp_repeats=1, compile_backend="inductor", matmul=8192),
}


def matmul_flops(device: torch.device, precision: str, n: int, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` matmul at ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``) on
    ``device`` (2 n^3 FLOPs, median of ``repeats``): the reachable peak of this machine, where no
    datasheet peak is known. ``tf32`` is a float32 product with TF32 allowed."""
    dtype = DTYPES["fp32" if precision == "tf32" else precision]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    with tf32_matmul(precision == "tf32"):
        t = interleaved_medians({"matmul": lambda: a @ b}, repeats=repeats, warmup=1, device=device)
    return 2 * n ** 3 / t["matmul"]


def padded_batches(sentences: list[list[int]], n_batches: int, tokens_per_batch: int, max_len: int,
                   seed: int, *, bucketed: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` padded sentence batches (``collate_lm``: ``[BOS] + s`` -> ``s + [EOS]``), each
    sentence cut to ``max_len - 1`` words.

    ``bucketed`` (chapters 02, 08 and 09): :class:`tfmlib.data.TokenBatchSampler` with
    ``max_tokens=tokens_per_batch``: sentences of about one length per batch, at most
    ``tokens_per_batch`` positions (so about as many real tokens as a packed batch of that many
    tokens, less the little padding). Otherwise sentences in random order (fixed seed), each batch
    padded to its longest and holding about ``tokens_per_batch`` *real* tokens (so its positions
    are mostly padding)."""
    cut = [s[: max_len - 1] for s in sentences]
    if bucketed:
        sampler = TokenBatchSampler([len(s) for s in cut], max_tokens=tokens_per_batch, seed=seed)
        return [collate_lm([cut[i] for i in idx]) for idx in sampler.batches(0)[:n_batches]]
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(cut), generator=g).tolist()
    batches, rows, real, pos = [], [], 0, 0
    while len(batches) < n_batches:
        s = cut[order[pos % len(order)]]
        pos += 1
        rows.append(s)
        real += len(s) + 1
        if real >= tokens_per_batch:
            batches.append(collate_lm(rows))
            rows, real = [], 0
    return batches


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
                   device: torch.device, precision: str, *, cuda_graphs: bool = False) -> Callable[[], None]:
    """One timed round: an optimiser step on each batch of the cycle (forward and loss under autocast;
    ``precision="tf32"`` is fp32 with TF32 matmuls). Nothing is read back: the round queues its steps
    and the timing helper waits once, after the round. ``cuda_graphs``: mark each step's start for
    the CUDA graphs of a ``max-autotune`` compile."""
    on_device = [(x.to(device), y.to(device)) for x, y in batches]
    amp = "fp32" if precision == "tf32" else precision
    scaler = make_grad_scaler(device, amp)

    def run() -> None:
        with tf32_matmul(precision == "tf32"):
            for batch in on_device:
                if cuda_graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                optimizer.zero_grad(set_to_none=True)
                with autocast(device, amp):
                    loss, _ = lm_loss(model, batch)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
    return run


def compile_model(model: DecoderLM, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                  precision: str, backend: str, *, dynamic: bool,
                  mode: str | None = None) -> tuple[torch.nn.Module, str, float | None]:
    """``torch.compile(model, backend=backend, dynamic=dynamic, mode=mode)`` with the fallback of
    :mod:`tfmlib.compiling`: (module, note, compile seconds)."""
    x, y = batch[0].to(device), batch[1].to(device)

    def trial(m: torch.nn.Module) -> None:
        with autocast(device, precision):
            loss, _ = lm_loss(m, (x, y))
        loss.backward()

    def compiler(m: torch.nn.Module) -> torch.nn.Module:
        return torch.compile(m, backend=backend, dynamic=dynamic, mode=mode)

    module, report = compile_or_fallback(model, trial, compiler, device=device)
    note = f"{report} [backend {backend}, dynamic={dynamic}{', mode ' + mode if mode else ''}]"
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

    blocks, vocab = bundled_english_blocks(cfg["sentences"], cfg["block_len"])
    english = [vocab.encode(s) for s in _english(cfg["sentences"])]
    tokens_per_step = cfg["batch"] * cfg["block_len"]
    packed = packed_batches(blocks, cfg["cycle"], cfg["batch"])
    padded = padded_batches(english, cfg["cycle"], tokens_per_step, cfg["block_len"], seed=0)
    unbucketed = padded_batches(english, cfg["cycle"], tokens_per_step, cfg["block_len"], seed=0,
                                bucketed=False)
    # the chapter's low precision, measured wherever autocast can run it (on a CPU without bf16
    # instructions it is emulated and slower: the row shows it); fp16 with a scaler on older GPUs
    low = "bf16" if supports_bf16(device) else ("fp16" if device.type == "cuda" else "fp32")
    threads = torch.get_num_threads()
    on_cuda = device.type == "cuda"

    where = where_it_ran(device)
    print(f"scaling_steps ({profile}): DecoderLM d_model {cfg['d_model']}, {cfg['layers']} layers, "
          f"{cfg['heads']} heads, vocab {len(vocab)}, context {cfg['block_len']}; ~{tokens_per_step} real "
          f"tokens per step, {cfg['cycle']} steps per timed round (one device synchronisation per round), "
          f"{cfg['rounds']} rounds")
    print(f"  {describe(where)}")

    # name, attention, precision, compile (None, "dynamic", "static", "autotune"), data, fused AdamW
    steps: list[tuple[str, str, str, str | None, str, bool]] = [
        ("baseline: explicit attention, fp32, eager, bucketed sentences", "explicit", "fp32", None, "padded",
         False),
        ("+ fused attention (SDPA)", "fused", "fp32", None, "padded", False),
        ("+ TF32 matmuls (fp32 weights and activations)", "fused", "tf32", None, "padded", False),
        (f"+ {low} autocast", "fused", low, None, "padded", False),
        ("+ torch.compile (dynamic shapes)", "fused", low, "dynamic", "padded", False),
        ("+ packed fixed-token batches (static compile)", "fused", low, "static", "packed", False),
        ("+ fused AdamW", "fused", low, "static", "packed", True),
    ]
    skipped: dict[str, str] = {}
    micro = None
    if on_cuda:
        def step_at(rows: int) -> Callable[[], None]:
            model = make_model(len(vocab), cfg, device, "fused")
            opt = make_adamw(model.parameters(), lr=1e-3)
            return training_round(model, opt, packed_batches(blocks, 1, rows), device, low)

        micro = micro_batch_for_memory(step_at, device, default=cfg["batch"], probe=(2, 4), fraction=0.7,
                                       maximum=64, multiple_of=8)
        torch.cuda.empty_cache()
        print(f"  micro-batch sized to the free memory: {micro.reason}")
        steps += [(f"+ micro-batch sized to memory ({micro.rows} rows)", "fused", low, "static", "packed_mb",
                   True),
                  ("+ max-autotune and CUDA graphs", "fused", low, "autotune", "packed_mb", True)]
    else:
        skipped["+ micro-batch sized to memory"] = (f"{device.type}: no free-memory figure to size by (the "
                                                    f"profile's {cfg['batch']} rows throughout)")
        skipped["+ max-autotune and CUDA graphs"] = (f"{device.type}: CUDA graphs are CUDA's; Inductor's CPU "
                                                     "autotuning is left out")
    steps += [
        ("  (packed, eager: the same without compile, for reference)", "fused", low, None, "packed", False),
        ("  (sentences not bucketed: fused, fp32, eager, for reference)", "fused", "fp32", None, "unbucketed",
         False),
        ("  (packed: fused, fp32, eager, for reference)", "fused", "fp32", None, "packed", False),
    ]
    data_sets = {"padded": padded, "unbucketed": unbucketed, "packed": packed}
    if micro is not None:
        data_sets["packed_mb"] = packed_batches(blocks, cfg["cycle"], micro.rows)
    contenders: dict[str, Callable[[], None]] = {}
    rows: list[dict[str, Any]] = []
    one_step: dict[str, Callable[[], None]] = {}
    shared: dict[tuple, tuple[torch.nn.Module, DecoderLM]] = {}
    for name, attention, precision, compiled, data, fused in steps:
        batches = data_sets[data]
        amp = "fp32" if precision == "tf32" else precision
        note, compile_s = "eager", None
        key = (attention, precision, compiled, data)
        if compiled is not None and key in shared:        # the fused-AdamW row reuses row 6's compiled module
            module, model = shared[key]
            note = "the compiled module of the row above, with its own optimizer"
        else:
            model = make_model(len(vocab), cfg, device, attention)
            module = model
            if compiled is not None:
                module, note, compile_s = compile_model(
                    model, batches[0], device, amp, cfg["compile_backend"], dynamic=compiled == "dynamic",
                    mode="max-autotune" if compiled == "autotune" else None)
                print(f"  {name}: {note}")
                shared[key] = (module, model)
        optimizer = (make_adamw(model.parameters(), lr=1e-3) if fused
                     else torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0))
        graphs = compiled == "autotune"
        contenders[name] = training_round(module, optimizer, batches, device, precision, cuda_graphs=graphs)
        one_step[name] = training_round(module, optimizer, batches[:1], device, precision, cuda_graphs=graphs)
        mean_len = round(sum(x.shape[1] for x, _ in batches) / len(batches))
        rows.append({"step": name, "attention": attention, "precision": precision, "compiled": note,
                     "compile_s": compile_s, "data": data, "threads": threads, "processes": 1,
                     "optimizer": "AdamW fused" if optimizer.defaults.get("fused") else "AdamW (default)",
                     "rows_per_step": round(sum(x.shape[0] for x, _ in batches) / len(batches), 1),
                     "real_tokens_per_round": real_tokens(batches),
                     "slots_per_round": sum(x.numel() for x, _ in batches), "mean_length": mean_len,
                     "flops_per_token": lm_flops_per_token(model, mean_len),
                     "peak": peak_name(device, precision)})

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

    last = [r["step"] for r in rows if not r["step"].startswith("  (")][-1]
    trace = profile_steps(one_step[last], device=device, steps=3, warmup=1)
    print(f"\nprofile of one step of {last.strip()!r} (torch.profiler, 3 steps):")
    print(trace.table(top=12))

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
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    if ddp_note:
        print(f"+ 2 processes: {ddp_note}")
    if not on_cuda:
        print("TF32 row: this device has no TF32 unit; its float32 products are those of the fp32 row "
              f"(reachable fp32 {reachable['fp32'] / 1e9:,.1f} vs 'tf32' {reachable['tf32'] / 1e9:,.1f} "
              "GFLOP/s: the same kernel, timed twice)")
    for label, batches in (("bucketed sentences", padded), ("sentences not bucketed", unbucketed)):
        slots = sum(x.numel() for x, _ in batches)
        print(f"{label}: {1 - real_tokens(batches) / slots:.1%} of the positions are padding")
    print("tokens/s: real target tokens (padding excluded); MFU: of the datasheet peak of the row's "
          "precision (TF32's for the TF32 row; none for a CPU); of matmul: of a large matmul's FLOP/s "
          "measured here at that precision, per process")

    result = {"benchmark": "scaling_steps", **where, "profile": profile, "config": run_config(args),
              "sizes": cfg, "vocab_size": len(vocab), "tokens_per_step": tokens_per_step,
              "reachable_matmul_flops": reachable, "ddp_note": ddp_note, "skipped": skipped,
              "micro_batch": None if micro is None else {"rows": micro.rows, "reason": micro.reason},
              "profile_of_one_step": {"row": last, "wall_ms": trace.wall_ms, "busy_ms": trace.busy_ms,
                                      "gap_ms": trace.gap_ms, "clock": trace.clock,
                                      "top": [{"op": o.name, "calls": o.calls_per_step, "ms": o.ms_per_step,
                                               "share": o.share} for o in trace.ops[:12]]},
              "rows": rows}
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
    """The English sentences :func:`tfmlib.packing.bundled_english_blocks` packs, as word lists."""
    return [tokenize(en) for en, _ in load_bundled("train")[:n]]


if __name__ == "__main__":
    main()

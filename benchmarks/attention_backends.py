"""Attention backends as length grows: explicit, SDPA's kernels, FlashAttention in Python (chapter 10)

Times forward + backward of one causal self-attention ``(batch, heads, length, head_dim)`` on
``--device`` at growing lengths, for:

* ``explicit``: chapter 05's ``tfmlib.attention.scaled_dot_product_attention`` (scores, masked
  softmax, weighted sum: the ``(B, h, T, T)`` matrix is stored);
* ``sdpa``: ``F.scaled_dot_product_attention(..., is_causal=True)`` with PyTorch's own choice of
  kernel, and the same call with each backend forced alone by
  ``torch.nn.attention.sdpa_kernel([SDPBackend.X])``: ``MATH``, ``FLASH_ATTENTION``,
  ``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION``. A backend that refuses the device, dtype or shape
  raises; it is recorded as ``refused: <PyTorch's reason>`` rather than timed;
* ``tiled``: ``tfmlib.flash.tiled_attention``, FlashAttention's algorithm in Python loops, at
  lengths up to ``--tiled-max-length`` only (it is slow: it is there to be read, not used).

Which kernel PyTorch picks by default is read from the profiler (the ``aten::`` operator the call
dispatches to). Memory: the bytes autograd saves for the backward pass
(``tfmlib.flash.saved_tensor_bytes``, every device) and, on CUDA, the peak of
``torch.cuda.max_memory_allocated`` during forward + backward above what was allocated before.
Before timing, every contender's output is checked against the explicit attention's (float64 on
the CPU, float32 elsewhere; PyTorch's default kernel in float32 where that runs out of memory).
Timed with ``tfmlib.timing.interleaved_medians`` (synchronised, interleaved, medians). float32
everywhere; on CUDA also bfloat16 (the flash kernel needs float16 or bfloat16 there). Running out
of memory at a length is recorded as such, and that contender is not tried at longer lengths.

    OMP_NUM_THREADS=1 python benchmarks/attention_backends.py [--device cuda] [--smoke]
        [--lengths 128 256 512 1024 2048] [--batch 1] [--heads 4] [--head-dim 64] [--repeats 9]

Prints a table and writes ``benchmarks/results/attention_backends.json`` (``--smoke``: tiny
sizes, written to the temporary folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from tfmlib.attention import scaled_dot_product_attention
from tfmlib.flash import saved_tensor_bytes, tiled_attention
from tfmlib.timing import interleaved_medians, synchronize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import (  # noqa: E402  (where it ran: one module for every script)
    add_run_options,
    chosen_device,
    describe,
    output_path,
    run_config,
    where_it_ran,
)

RESULTS = Path(__file__).resolve().parent / "results" / "attention_backends.json"
BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
# the aten operator each backend dispatches to (what the profiler shows for PyTorch's own choice)
OPERATORS = {"_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
             "_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
             "_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
             "_scaled_dot_product_attention_math": "MATH"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}

Attention = Callable[[Tensor, Tensor, Tensor], Tensor]


def contenders(device: torch.device, length: int, tiled_max: int, block: int) -> dict[str, Attention]:
    """name -> attention(q, k, v) (causal) for one length."""
    fns: dict[str, Attention] = {
        "explicit": lambda q, k, v: scaled_dot_product_attention(q, k, v, causal=True)[0],
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    for name in BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:                      # an older PyTorch without this backend
            continue

        def forced(q: Tensor, k: Tensor, v: Tensor, backend: SDPBackend = backend) -> Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        fns[f"sdpa {name}"] = forced
    if length <= tiled_max:
        fns["tiled"] = lambda q, k, v: tiled_attention(q, k, v, causal=True, block_q=block, block_k=block)
    return fns


def fwd_bwd(fn: Attention, q: Tensor, k: Tensor, v: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
    """One forward and backward pass: the output and the gradients of q, k, v."""
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def refusal(exc: BaseException, caught: list[warnings.WarningMessage]) -> str:
    """PyTorch's reason, short: the first line of each warning it gave during the call (on CUDA it
    says why each kernel cannot run), then the error's first line."""
    reasons = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return "refused: " + "; ".join(dict.fromkeys([*reasons, first]))[:600]


def default_kernel(q: Tensor, k: Tensor, v: Tensor) -> str:
    """The backend ``F.scaled_dot_product_attention`` picks for these inputs, read from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    names = [e.key for e in prof.key_averages()]
    for op, backend in OPERATORS.items():
        if any(op in name for name in names):
            return f"{backend} ({next(n for n in names if op in n)})"
    return "unknown (" + ", ".join(n for n in names if "attention" in n) + ")"


def peak_bytes(fn: Attention, q: Tensor, k: Tensor, v: Tensor, grad: Tensor,
               device: torch.device) -> int | None:
    """CUDA only: the peak memory of a forward+backward above what was allocated before it."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fwd_bwd(fn, q, k, v, grad)
    synchronize(device)
    del result
    return torch.cuda.max_memory_allocated(device) - before


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(device: torch.device, dtype: torch.dtype, length: int, args: argparse.Namespace,
            gave_up: set[str]) -> dict:
    """One row: every contender at one (dtype, length)."""
    g = torch.Generator().manual_seed(length)
    shape = (args.batch, args.heads, length, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=g).to(device=device, dtype=dtype) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    row: dict = {"dtype": str(dtype).removeprefix("torch."), "length": length,
                 "default_kernel": default_kernel(q, k, v), "contenders": {}}
    # the reference: the explicit attention in float32 (float64 on the CPU); where that does not
    # fit in memory, PyTorch's default kernel in float32
    ref_dtype = torch.float64 if device.type == "cpu" else torch.float32
    qr, kr, vr = (x.detach().to(ref_dtype) for x in (q, k, v))
    try:
        with torch.no_grad():
            reference = scaled_dot_product_attention(qr, kr, vr, causal=True)[0]
        row["reference"] = f"explicit attention in {str(ref_dtype).removeprefix('torch.')}"
    except RuntimeError as exc:
        if not is_oom(exc):
            raise
        reference = None
    if reference is None:
        free_memory(device)
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
        row["reference"] = "F.scaled_dot_product_attention in float32 (the explicit one ran out of memory)"
    del qr, kr, vr
    scale = reference.abs().max().item()
    accepted: dict[str, Callable[[], object]] = {}
    for name, fn in contenders(device, length, args.tiled_max_length, args.block).items():
        entry: dict = {}
        row["contenders"][name] = entry
        if name in gave_up:
            entry["skipped"] = "ran out of memory at a shorter length"
            continue
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = fwd_bwd(fn, q, k, v, grad)[0]
            entry["max_abs_diff"] = (out.detach().to(ref_dtype) - reference).abs().max().item()
            del out
            entry["saved_bytes"] = saved_tensor_bytes(lambda fn=fn: fn(q, k, v))
            entry["peak_bytes"] = peak_bytes(fn, q, k, v, grad, device)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            entry.clear()
            if is_oom(exc):
                entry["skipped"] = "out of memory"
                gave_up.add(name)
            else:
                entry["refused"] = refusal(exc, caught)
        if "skipped" in entry:
            free_memory(device)      # outside the except block: the traceback no longer holds tensors
        if "max_abs_diff" not in entry:
            continue
        if entry["max_abs_diff"] > TOLERANCE[dtype] * max(1.0, scale):
            raise SystemExit(f"{name} differs from the reference ({row['reference']}) by "
                             f"{entry['max_abs_diff']:.2e} ({dtype}, length {length})")
        accepted[name] = lambda fn=fn: fwd_bwd(fn, q, k, v, grad)
    slow = {"tiled"} if args.repeats > 1 else set()   # Python loops: fewer rounds
    try:
        t = interleaved_medians({n: f for n, f in accepted.items() if n not in slow}, args.repeats,
                                warmup=1, device=device)
        times = {n: t[n] for n in t}
        if slow & accepted.keys():
            t_slow = interleaved_medians({n: accepted[n] for n in slow & accepted.keys()},
                                         max(1, args.repeats // 3), warmup=0, device=device)
            times.update({n: t_slow[n] for n in t_slow})
    except RuntimeError as exc:   # out of memory while timing: record and move on
        if not is_oom(exc):
            raise
        free_memory(device)
        for entry in row["contenders"].values():
            if "saved_bytes" in entry:
                entry["timing"] = "out of memory while timing"
        return row
    for name, seconds in times.items():
        row["contenders"][name]["ms"] = round(1e3 * seconds, 3)
    return row


def cell(entry: dict, key: str, scale: float, fmt: str) -> str:
    if key in entry and entry[key] is not None:
        return format(entry[key] / scale, fmt)
    if "refused" in entry:
        return "refused"
    if "skipped" in entry:
        return "OOM" if "memory" in entry["skipped"] else "-"
    return "-"


def print_tables(rows: list[dict]) -> None:
    names = list(dict.fromkeys(n for r in rows for n in r["contenders"]))
    short = {n: n.replace("sdpa ", "").replace("_ATTENTION", "").lower() if n.startswith("sdpa ") else n
             for n in names}
    for title, key, scale, fmt in (("forward+backward, median ms", "ms", 1.0, ".2f"),
                                   ("bytes saved for backward, MiB", "saved_bytes", 2**20, ".2f"),
                                   ("CUDA peak memory of forward+backward, MiB", "peak_bytes", 2**20, ".1f")):
        if key == "peak_bytes" and not any(e.get("peak_bytes") for r in rows
                                           for e in r["contenders"].values()):
            continue
        print(f"\n{title}")
        print(f"{'dtype':>9} {'length':>6} " + " ".join(f"{short[n]:>10}" for n in names))
        for r in rows:
            print(f"{r['dtype']:>9} {r['length']:>6} "
                  + " ".join(f"{cell(r['contenders'].get(n, {}), key, scale, fmt):>10}" for n in names))
    print("\nPyTorch's default kernel (causal, no mask):")
    for r in rows:
        print(f"  {r['dtype']:>9} {r['length']:>6}: {r['default_kernel']}")
    refused = {(r["dtype"], n): e["refused"] for r in rows for n, e in r["contenders"].items()
               if "refused" in e}
    for (dtype, name), why in refused.items():
        print(f"  {name} ({dtype}): {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        help="sequence lengths (default 128..2048 on the CPU, 512..16384 on a GPU)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES),
                        help="default: float32 on the CPU and MPS; float32 and bfloat16 on CUDA")
    parser.add_argument("--tiled-max-length", type=int, default=1024,
                        help="longest length at which tfmlib.flash.tiled_attention is timed (it is slow)")
    parser.add_argument("--block", type=int, default=64, help="tiled_attention's block_q and block_k")
    add_run_options(parser)
    args = parser.parse_args()
    device = chosen_device(args)
    if args.lengths is None:
        args.lengths = [128, 256, 512, 1024, 2048] if device.type == "cpu" else [512, 1024, 2048, 4096,
                                                                                  8192, 16384]
    if args.dtypes is None:
        args.dtypes = ["float32", "bfloat16"] if device.type == "cuda" else ["float32"]
    if args.smoke:
        args.lengths, args.batch, args.heads, args.head_dim, args.repeats = [32, 64], 1, 2, 16, 2
        args.tiled_max_length, args.block = 64, 16

    machine = where_it_ran(device)
    print(f"causal self-attention, batch {args.batch}, {args.heads} heads, head_dim {args.head_dim}, "
          f"forward+backward, median of {args.repeats} interleaved rounds (tiled: "
          f"{max(1, args.repeats // 3)}); {describe(machine)}")
    rows = []
    for dtype_name in args.dtypes:
        gave_up: set[str] = set()
        for length in args.lengths:
            row = measure(device, DTYPES[dtype_name], length, args, gave_up)
            rows.append(row)
            timed = {n: e["ms"] for n, e in row["contenders"].items() if "ms" in e}
            print(f"  {dtype_name} {length}: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in timed.items()),
                  flush=True)
    print_tables(rows)
    out = output_path(args, RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "attention backends: explicit vs F.scaled_dot_product_attention's kernels vs "
                     "tfmlib.flash.tiled_attention, causal self-attention, forward+backward",
        "timing": "tfmlib.timing.interleaved_medians (medians, device synchronised)",
        "memory": "saved_bytes: tfmlib.flash.saved_tensor_bytes (what autograd keeps for backward); "
                  "peak_bytes: CUDA max_memory_allocated during forward+backward above the inputs",
        "config": run_config(args),
        **machine,
        "rows": rows,
    }, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

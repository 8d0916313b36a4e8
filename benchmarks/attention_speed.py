"""Is the book's multi-head attention as fast as PyTorch's? (chapter 05)

Times a forward+backward pass of ``tfmlib.attention.MultiHeadAttention`` (its fast path, on
``F.scaled_dot_product_attention``) against ``nn.MultiheadAttention`` with copied weights, on the
CPU, for self-attention without a mask, with a padding mask, and with a causal mask, at several
sequence lengths. Before timing, each case checks that the two layers give the same outputs and
the same gradients (inputs and weights), with the masks translated between the two conventions
(the book: ``True`` = may attend; ``nn.MultiheadAttention``: ``True`` = may not).

Both layers are called the way a training loop calls them: ``nn.MultiheadAttention`` with
``need_weights=False`` (otherwise it takes its slower path that also averages the weights) and,
for the causal case, ``is_causal=True`` with its mask, which lets it use the same causal kernel.
The two implementations take turns within each repeat and the median is kept, so that load from
other processes affects both alike. The goal is a ratio (package / PyTorch) of at most 1.1.

    python benchmarks/attention_speed.py [--batch 16] [--d-model 256] [--heads 8] [--repeats 15]

Prints a table and writes ``benchmarks/results/attention_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tfmlib.attention import MultiHeadAttention, causal_mask, copy_from_torch_mha, padding_mask

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, where_it_ran  # noqa: E402  (where it ran: one function for every script)

RESULTS = Path(__file__).resolve().parent / "results" / "attention_speed.json"
CASES = ("self", "self + padding", "causal")


def make_case(case: str, batch: int, length: int, seed: int) -> tuple[dict, dict]:
    """Keyword arguments for (the package's layer, nn.MultiheadAttention) in one case."""
    if case == "self":
        return {}, {}
    if case == "self + padding":
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
        lengths[0] = length
        keep = torch.arange(length)[None, :] < lengths[:, None]
        return {"mask": padding_mask(keep)}, {"key_padding_mask": ~keep}       # PyTorch: True = hidden
    if case == "causal":
        return {"causal": True}, {"attn_mask": ~causal_mask(length), "is_causal": True}
    raise ValueError(f"unknown case {case!r}")


def max_difference(ours: MultiHeadAttention, ref: nn.MultiheadAttention, x: torch.Tensor, our_kwargs: dict,
                   ref_kwargs: dict) -> float:
    """The largest difference between the two layers' outputs and gradients (input and weights)."""
    x = x.detach().requires_grad_()
    got, _ = ours(x, **our_kwargs)
    want, _ = ref(x, x, x, need_weights=False, **ref_kwargs)
    ours_grads = torch.autograd.grad(got.square().sum(), [x, *ours.parameters()])
    ref_grads = torch.autograd.grad(want.square().sum(), [x, *ref.parameters()])
    named = dict(zip([n for n, _ in ours.named_parameters()], ours_grads[1:], strict=True))
    ref_named = dict(zip([n for n, _ in ref.named_parameters()], ref_grads[1:], strict=True))
    pairs = [(got, want), (ours_grads[0], ref_grads[0]),
             (torch.cat([named[f"{p}_proj.weight"] for p in "qkv"]), ref_named["in_proj_weight"]),
             (torch.cat([named[f"{p}_proj.bias"] for p in "qkv"]), ref_named["in_proj_bias"]),
             (named["out_proj.weight"], ref_named["out_proj.weight"]),
             (named["out_proj.bias"], ref_named["out_proj.bias"])]
    return max((a - b).abs().max().item() for a, b in pairs)


def interleaved_medians(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds of each function over ``repeats`` rounds (after two warm-up calls each); the
    functions take turns within a round."""
    for _ in range(2):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(repeats):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))   # neither always goes first
        for name in order:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest allowed |difference| (float32)")
    args = parser.parse_args()

    torch.manual_seed(0)
    ref = nn.MultiheadAttention(args.d_model, args.heads, batch_first=True)
    ours = copy_from_torch_mha(ref, MultiHeadAttention(args.d_model, args.heads))
    rows = []
    for length in args.lengths:
        x = torch.randn(args.batch, length, args.d_model)
        for case in CASES:
            our_kwargs, ref_kwargs = make_case(case, args.batch, length, seed=length)
            diff = max_difference(ours, ref, x, our_kwargs, ref_kwargs)
            if diff > args.tolerance:
                raise SystemExit(f"the two layers disagree by {diff:.2e} ({case}, length {length})")
            x_grad = x.clone().requires_grad_()

            def step_ours(kw: dict = our_kwargs, inp: torch.Tensor = x_grad) -> None:
                ours(inp, **kw)[0].sum().backward()

            def step_ref(kw: dict = ref_kwargs, inp: torch.Tensor = x_grad) -> None:
                ref(inp, inp, inp, need_weights=False, **kw)[0].sum().backward()

            t = interleaved_medians({"ours": step_ours, "torch": step_ref}, args.repeats)
            rows.append({"case": case, "length": length, "tfmlib_ms": 1e3 * t["ours"],
                         "nn_multiheadattention_ms": 1e3 * t["torch"], "ratio": t["ours"] / t["torch"],
                         "max_abs_diff": diff})

    machine = where_it_ran("cpu")
    print(f"forward+backward, batch {args.batch}, d_model {args.d_model}, {args.heads} heads, median of "
          f"{args.repeats} (interleaved); {describe(machine)}")
    print(f"{'case':>15} {'length':>6} {'tfmlib ms':>10} {'nn.MHA ms':>10} {'ratio':>6} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['case']:>15} {r['length']:>6} {r['tfmlib_ms']:>10.2f} "
              f"{r['nn_multiheadattention_ms']:>10.2f} {r['ratio']:>6.2f} {r['max_abs_diff']:>11.1e}")
    worst = max(r["ratio"] for r in rows)
    geo = statistics.geometric_mean([r["ratio"] for r in rows])
    print(f"ratio tfmlib / nn.MultiheadAttention: geometric mean {geo:.2f}, worst {worst:.2f} (goal <= 1.1)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "tfmlib.attention.MultiHeadAttention vs nn.MultiheadAttention, forward+backward",
        "config": vars(args),
        **machine,
        "rows": rows,
        "ratio_geometric_mean": geo,
        "ratio_worst": worst,
        "goal": "ratio <= 1.1",
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

"""Is the book's multi-head attention as fast as PyTorch's? (chapter 05)

Times a forward+backward pass of ``tfmlib.attention.MultiHeadAttention`` (its fast path, on
``F.scaled_dot_product_attention``) against ``nn.MultiheadAttention`` with copied weights, on
``--device``, for self-attention without a mask, with a padding mask, and with a causal mask, at several
sequence lengths. Before timing, each case checks that the two layers give the same outputs and
the same gradients (inputs and weights), with the masks translated between the two conventions
(the book: ``True`` = may attend; ``nn.MultiheadAttention``: ``True`` = may not).

Both layers are called the way a training loop calls them: ``nn.MultiheadAttention`` with
``need_weights=False`` (otherwise it takes its slower path that also averages the weights) and,
for the causal case, ``is_causal=True`` with its mask, which lets it use the same causal kernel.
Timed with ``tfmlib.timing.interleaved_medians``: the device is synchronised around every sample,
the two implementations take turns within each round and the median is kept, so that load from
other processes affects both alike. The goal is a ratio (package / PyTorch) of at most 1.1.

    python benchmarks/attention_speed.py [--batch 16] [--d-model 256] [--heads 8] [--repeats 15]
                                         [--device cuda] [--smoke]

Prints a table and writes ``benchmarks/results/attention_speed.json`` (``--smoke``: tiny sizes,
written to the temporary folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

from tfmlib.attention import MultiHeadAttention, causal_mask, copy_from_torch_mha, padding_mask
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

RESULTS = Path(__file__).resolve().parent / "results" / "attention_speed.json"
CASES = ("self", "self + padding", "causal")


def make_case(case: str, batch: int, length: int, seed: int,
              device: torch.device | str = "cpu") -> tuple[dict, dict]:
    """Keyword arguments for (the package's layer, nn.MultiheadAttention) in one case, on ``device``."""
    if case == "self":
        return {}, {}
    if case == "self + padding":
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
        lengths[0] = length
        keep = (torch.arange(length)[None, :] < lengths[:, None]).to(device)
        return {"mask": padding_mask(keep)}, {"key_padding_mask": ~keep}       # PyTorch: True = hidden
    if case == "causal":
        return {"causal": True}, {"attn_mask": ~causal_mask(length, device=device), "is_causal": True}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest allowed |difference| (float32)")
    add_run_options(parser)
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.d_model, args.heads, args.lengths, args.repeats = 2, 32, 4, [16], 3
    device = chosen_device(args)

    torch.manual_seed(0)
    ref = nn.MultiheadAttention(args.d_model, args.heads, batch_first=True)
    ours = copy_from_torch_mha(ref, MultiHeadAttention(args.d_model, args.heads))
    ref, ours = ref.to(device), ours.to(device)
    rows = []
    for length in args.lengths:
        x = torch.randn(args.batch, length, args.d_model).to(device)
        for case in CASES:
            our_kwargs, ref_kwargs = make_case(case, args.batch, length, seed=length, device=device)
            diff = max_difference(ours, ref, x, our_kwargs, ref_kwargs)
            if diff > args.tolerance:
                raise SystemExit(f"the two layers disagree by {diff:.2e} ({case}, length {length})")
            x_grad = x.clone().requires_grad_()

            def step_ours(kw: dict = our_kwargs, inp: torch.Tensor = x_grad) -> None:
                ours(inp, **kw)[0].sum().backward()

            def step_ref(kw: dict = ref_kwargs, inp: torch.Tensor = x_grad) -> None:
                ref(inp, inp, inp, need_weights=False, **kw)[0].sum().backward()

            t = interleaved_medians({"ours": step_ours, "torch": step_ref}, args.repeats, device=device)
            rows.append({"case": case, "length": length, "tfmlib_ms": t.ms("ours"),
                         "nn_multiheadattention_ms": t.ms("torch"), "ratio": t.ratio("ours", "torch"),
                         "max_abs_diff": diff})

    machine = where_it_ran(device)
    print(f"forward+backward, batch {args.batch}, d_model {args.d_model}, {args.heads} heads, median of "
          f"{args.repeats} (interleaved, synchronised); {describe(machine)}")
    print(f"{'case':>15} {'length':>6} {'tfmlib ms':>10} {'nn.MHA ms':>10} {'ratio':>6} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['case']:>15} {r['length']:>6} {r['tfmlib_ms']:>10.2f} "
              f"{r['nn_multiheadattention_ms']:>10.2f} {r['ratio']:>6.2f} {r['max_abs_diff']:>11.1e}")
    worst = max(r["ratio"] for r in rows)
    geo = statistics.geometric_mean([r["ratio"] for r in rows])
    print(f"ratio tfmlib / nn.MultiheadAttention: geometric mean {geo:.2f}, worst {worst:.2f} (goal <= 1.1)")
    out = output_path(args, RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "tfmlib.attention.MultiHeadAttention vs nn.MultiheadAttention, forward+backward",
        "timing": "tfmlib.timing.interleaved_medians (medians, device synchronised)",
        "config": run_config(args),
        **machine,
        "rows": rows,
        "ratio_geometric_mean": geo,
        "ratio_worst": worst,
        "goal": "ratio <= 1.1",
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

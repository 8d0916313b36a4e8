"""Speed of ``tfmlib.train.fit`` now against an earlier revision of it, on three small models.

``fit`` used to read every step's loss back to the host (``loss.item()``), which makes the host
wait for the device each step; it now reads the losses together every ``log_every`` steps. This
script checks that the change costs nothing on the CPU (and measures what it gains on a GPU):
it loads ``tfmlib/train.py`` as it was at ``--baseline`` (a git revision; default: the last one
before the change) next to the current one, trains the same models with both, and

* checks they compute the same thing: from the same initial weights, two epochs with each give
  the same step losses (the largest difference is printed and recorded);
* times one epoch of each, interleaved round by round with :func:`tfmlib.timing.interleaved_medians`
  (synchronised on CUDA/MPS), and prints milliseconds per optimiser step with the spread.

The workloads are deliberately small (launch- and overhead-bound, where per-step host work shows):
a linear regression (nothing but the loop's own overhead), a GRU language model and a two-layer
Transformer encoder. Results go to ``benchmarks/results/fit_speed.json`` with the device and the
thread settings. On a shared machine run it with one thread::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/fit_speed.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import describe, where_it_ran  # noqa: E402  (where it ran: one function for every script)

from tfmlib import train as current  # noqa: E402
from tfmlib.config import pick_device  # noqa: E402
from tfmlib.timing import interleaved_medians  # noqa: E402

BASELINE = "9ba7e66"  # main before fit's per-step .item() was removed (issue 13)


def load_baseline(rev: str) -> ModuleType:
    """``tfmlib/train.py`` as it was at git revision ``rev``, imported as its own module."""
    source = subprocess.run(["git", "show", f"{rev}:tfmlib/train.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="fit_speed_"))
    path = folder / "train_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("train_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the three workloads


class GRULM(nn.Module):
    def __init__(self, vocab: int = 200, d: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.embed, self.rnn, self.out = nn.Embedding(vocab, d), nn.GRU(d, hidden, batch_first=True), \
            nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        return self.out(self.rnn(self.embed(ids))[0])


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 200, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        return self.out(self.encoder(self.embed(ids)))


def regression_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1), y), len(y)


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
    ids, targets = batch
    logits = model(ids)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()), targets.numel()


def workloads(batches: int) -> dict[str, tuple[Callable[[], nn.Module], list, Callable]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batches * 16, 16, generator=g)
    y = x @ torch.randn(16, generator=g)
    regression = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    ids = torch.randint(0, 200, (batches * 16, 21), generator=g)
    lm = [(ids[i:i + 16, :-1], ids[i:i + 16, 1:]) for i in range(0, len(ids), 16)]
    return {
        "linear regression (loop overhead)": (lambda: nn.Linear(16, 1), regression, regression_loss),
        "GRU language model (64 units)": (GRULM, lm, lm_loss),
        "Transformer encoder (2 x d64)": (TinyEncoder, lm, lm_loss),
    }


def make(build: Callable[[], nn.Module], device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build().to(device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, mps (default: cpu)")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the older tfmlib/train.py")
    parser.add_argument("--batches", type=int, default=60, help="batches per epoch")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--note", default="", help="what else to record (e.g. a shared machine)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fit_speed.json")
    args = parser.parse_args()

    device = pick_device(args.device)
    before = load_baseline(args.baseline)
    rows = []
    for name, (build, batches, loss_fn) in workloads(args.batches).items():
        on_device = [current.move_to(b, device) for b in batches]
        # the same computation: two epochs from the same weights with each version
        hist = {}
        for label, module in (("before", before), ("after", current)):
            model, opt = make(build, device)
            hist[label] = module.fit(model, on_device, loss_fn, opt, epochs=2, device=device, verbose=False)
        diff = max(abs(a - b) for a, b in zip(hist["before"].step_loss, hist["after"].step_loss, strict=True))
        # the timing: one epoch per call, models kept training between calls
        contenders = {}
        for label, module in (("before", before), ("after", current)):
            model, opt = make(build, device)

            def one_epoch(module: ModuleType = module, model: nn.Module = model,
                          opt: torch.optim.Optimizer = opt, data: list = on_device,
                          loss_fn: Callable = loss_fn) -> None:
                module.fit(model, data, loss_fn, opt, epochs=1, device=device, verbose=False)

            contenders[label] = one_epoch
        t = interleaved_medians(contenders, repeats=args.repeats, warmup=1, device=device)
        steps = len(batches)
        row = {"workload": name, "steps_per_epoch": steps, "max_abs_step_loss_difference": diff}
        for label in contenders:
            q1, q3 = t.detail[label].quartiles
            row |= {f"{label}_ms_per_step": 1e3 * t[label] / steps,
                    f"{label}_q1_ms_per_step": 1e3 * q1 / steps,
                    f"{label}_q3_ms_per_step": 1e3 * q3 / steps}
        row["after_over_before"] = t["after"] / t["before"]
        # the two ran back to back in each round: the median of the per-round ratios cancels drift
        pairs = zip(t.detail["after"].samples, t.detail["before"].samples, strict=True)
        row["after_over_before_per_round_median"] = statistics.median(a / b for a, b in pairs)
        rows.append(row)

    machine = where_it_ran(device)
    print(f"fit, one epoch of {args.batches} batches per sample, median of {args.repeats} interleaved "
          "rounds; "
          f"baseline tfmlib/train.py at {args.baseline}; {describe(machine)}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"{'workload':36s} {'before ms/step':>15s} {'after ms/step':>14s} {'after/before':>13s} "
          f"{'per round':>10s} {'max |loss diff|':>16s}")
    for r in rows:
        print(f"{r['workload']:36s} {r['before_ms_per_step']:15.3f} {r['after_ms_per_step']:14.3f} "
              f"{r['after_over_before']:13.3f} {r['after_over_before_per_round_median']:10.3f} "
              f"{r['max_abs_step_loss_difference']:16.2e}")
    print("after/before: ratio of the medians; per round: median of the ratios of each round's two "
          "back-to-back epochs")
    result = {**machine, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "mkl_num_threads": os.environ.get("MKL_NUM_THREADS"),
              "method": "'before' is tfmlib/train.py at the baseline revision, 'after' the current one, "
                        "loaded side by side and timed interleaved in one process",
              "note": args.note,
              "baseline": args.baseline, "batches_per_epoch": args.batches, "repeats": args.repeats,
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()

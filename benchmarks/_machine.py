"""Where a benchmark ran: the one function every script of ``benchmarks/`` uses to record it.

:func:`where_it_ran` returns the JSON fields (device and its name, CPU cores and the threads torch
uses, torch and Python versions, machine, date); :func:`describe` turns them into the one line a
script prints above its table. A number in ``benchmarks/results/`` means little without them:
timings depend on the machine, and BLEU after a fixed time budget on how many steps it allowed.

:func:`add_run_options` gives every script the same ``--device`` (default
``tfmlib.config.pick_device()``: ``TFM_DEVICE``, else CUDA, MPS, the CPU), ``--smoke`` (tiny
sizes, to check that the script runs) and ``--out``; :func:`output_path` sends a smoke run's JSON
to the temporary folder, never over the committed result.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from tfmlib.config import pick_device


def where_it_ran(device: torch.device | str = "cpu") -> dict:
    """The fields that say where a benchmark ran, for its JSON (``{**where_it_ran(device), ...}``)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple MPS ({platform.processor() or platform.machine()})"
    else:
        name = platform.processor() or platform.machine()
    return {
        "device": str(device),
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def describe(fields: dict) -> str:
    """One line for a script's printed header, from :func:`where_it_ran`'s fields."""
    return (f"{fields['device']} ({fields['device_name']}), torch {fields['torch']}, {fields['threads']} "
            f"threads of {fields['cpu_count']} cores, Python {fields['python']}, {fields['date']}")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--device``, ``--smoke`` and ``--out`` to a script's parser."""
    parser.add_argument("--device", help="torch device, e.g. cpu, cuda, mps (default: tfmlib.config."
                        "pick_device(): TFM_DEVICE, else CUDA, then MPS, then the CPU)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, only to check that the script runs; its JSON goes to the "
                             "temporary folder unless --out is given")
    parser.add_argument("--out", type=Path, help="where to write the JSON")


def chosen_device(args: argparse.Namespace) -> torch.device:
    """``--device``, or :func:`tfmlib.config.pick_device`'s choice."""
    return pick_device(args.device)


def output_path(args: argparse.Namespace, committed: Path) -> Path:
    """``--out``; else the committed result's path, or, for ``--smoke``, a file of the same name
    in the temporary folder (a smoke run never overwrites a committed result)."""
    if args.out is not None:
        return args.out
    if args.smoke:
        return Path(tempfile.gettempdir()) / f"{committed.stem}_smoke{committed.suffix}"
    return committed


def run_config(args: argparse.Namespace) -> dict:
    """The script's arguments for its JSON (paths as strings; ``--out`` and ``--device`` left out:
    the device is recorded by :func:`where_it_ran`)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in ("out", "device")}

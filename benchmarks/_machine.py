"""Where a benchmark ran: the one function every script of ``benchmarks/`` uses to record it.

:func:`where_it_ran` returns the JSON fields (device and its name, CPU cores and the threads torch
uses, torch and Python versions, machine, date); :func:`describe` turns them into the one line a
script prints above its table. A number in ``benchmarks/results/`` means little without them:
timings depend on the machine, and BLEU after a fixed time budget on how many steps it allowed.
"""

from __future__ import annotations

import os
import platform
import time

import torch


def where_it_ran(device: torch.device | str = "cpu") -> dict:
    """The fields that say where a benchmark ran, for its JSON (``{**where_it_ran(device), ...}``)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
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

"""Timing on any device: synchronise, warm up, interleave, take medians, say where it ran.

Introduced in chapter 01 (RNN and GRU), the first chapter that times something; every notebook and
every script of ``benchmarks/`` times with :func:`interleaved_medians`.

Three things make a wall-clock time on a GPU mean something:

* **synchronise**: CUDA and Apple's MPS run kernels asynchronously; a Python call returns when the
  work is *queued*. :func:`synchronize` waits for the device to finish (``torch.cuda.synchronize``,
  ``torch.mps.synchronize``; nothing on the CPU), and the clock is read only after it, before and
  after every timed sample. A sample may be a *window* of several calls (``number``): the device is
  then synchronised once per window, so the host queues each call while the device still runs the
  one before, as in a training loop that reads nothing back. Time training steps that way on a GPU
  (``number >= 5``): synchronising around every single step makes each one start from an empty
  queue and pay its launch latency in full, which a real loop hides;
* **warm up**: the first calls pay for allocation, kernel selection (cuDNN, SDPA) and caches;
  they are run but not timed;
* **interleave**: the contenders take turns within each round (the one that goes first rotates),
  so a burst of load from another process, or a clock that drifts, hits all of them alike; the
  median of the rounds is kept, with the quartiles and the extremes to show the spread.

The result, :class:`Timings`, reads like a dict of median seconds (``t["fast"] / t["slow"]``)
and carries the device it was measured on: a ratio printed from it says where it holds::

    t = interleaved_medians({"loop": run_loop, "fused": run_fused}, repeats=15, device=run.device)
    print(t)                                  # a table in ms, with the device
    speedup = t["loop"] / t["fused"]
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

INTRODUCED_IN = 1

Clock = Callable[[], float]


def _as_device(device: torch.device | str, where: str) -> torch.device:
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{where}: device {device!r} is not a torch device ({e})") from e
    raise TypeError(f"{where}: device must be a torch.device or a str, got {type(device).__name__}")


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU).

    ``cuda`` calls ``torch.cuda.synchronize(device)``, ``mps`` calls ``torch.mps.synchronize()``;
    the CPU (and ``meta``) run synchronously, so there is nothing to wait for. Any other device
    type raises ``ValueError`` rather than time without waiting.
    """
    device = _as_device(device, "synchronize")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type not in ("cpu", "meta"):
        raise ValueError(f"synchronize: no way to wait for device type {device.type!r} "
                         "(cpu, cuda and mps are supported)")


@dataclass(frozen=True)
class Timing:
    """One contender's seconds per call over the timed rounds (``samples``, in round order)."""

    name: str
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The first and third quartiles (the median of each half; both equal one sample when
        there is only one)."""
        if len(self.samples) == 1:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3


@dataclass(frozen=True)
class Timings(Mapping[str, float]):
    """What :func:`interleaved_medians` returns: a read-only mapping ``name -> median seconds``,
    plus the device it ran on, the rounds, the warm-up calls, calls per sample, and each
    contender's :class:`Timing` (``timings.detail["name"]``) for the spread."""

    device: torch.device
    repeats: int
    warmup: int
    number: int
    detail: Mapping[str, Timing]

    def __getitem__(self, name: str) -> float:
        try:
            return self.detail[name].median
        except KeyError:
            raise KeyError(f"Timings: no contender {name!r}; timed {list(self.detail)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.detail)

    def __len__(self) -> int:
        return len(self.detail)

    def ms(self, name: str) -> float:
        """The median of ``name`` in milliseconds."""
        return 1e3 * self[name]

    def ratio(self, slower: str, faster: str) -> float:
        """``median[slower] / median[faster]``: how many times longer ``slower`` takes."""
        return self[slower] / self[faster]

    def table(self) -> str:
        """A small table in milliseconds: median, quartiles and extremes of each contender."""
        width = max(9, *(len(n) for n in self.detail))
        head = (f"{'':{width}s} {'median ms':>10s} {'q1 ms':>9s} {'q3 ms':>9s} "
                f"{'min ms':>9s} {'max ms':>9s}")
        rows = [head]
        for name, t in self.detail.items():
            q1, q3 = t.quartiles
            rows.append(f"{name:{width}s} {1e3 * t.median:10.3f} {1e3 * q1:9.3f} {1e3 * q3:9.3f} "
                        f"{1e3 * t.min:9.3f} {1e3 * t.max:9.3f}")
        calls = f", {self.number} calls per sample" if self.number > 1 else ""
        return (f"on {self.device}: median of {self.repeats} interleaved rounds after {self.warmup} "
                f"warm-up call(s) each{calls}\n" + "\n".join(rows))

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        medians = ", ".join(f"{n}={1e3 * t.median:.3g} ms" for n, t in self.detail.items())
        return f"Timings(device={str(self.device)!r}, repeats={self.repeats}, {medians})"


def _positive_int(value: object, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"interleaved_medians: {name} must be an int >= {minimum}, got {value!r}")
    return value


def interleaved_medians(
    fns: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int = 2,
    *,
    device: torch.device | str,
    number: int = 1,
    clock: Clock = time.perf_counter,
) -> Timings:
    """Time each function of ``fns`` (``name -> fn()``) on ``device``: medians of interleaved rounds.

    Each function is first called ``warmup`` times (taking turns, untimed). Then, ``repeats``
    times, each function is timed once, in turn, starting with a different one each round (round
    ``r`` starts at contender ``r mod len(fns)``). A sample is the time of ``number`` consecutive
    calls divided by ``number``: a window of calls, for calls too short for the clock and for
    training steps on a GPU, whose host queues the next step while the device runs this one
    (the module docstring). The device is synchronised after the warm-up and before and after
    every sample (not between the calls of a window), so a sample holds the whole work of its
    calls and nothing queued before them. ``device`` is required: it
    is what gets synchronised and what the result is labelled with. ``clock`` (seconds, like
    ``time.perf_counter``) is for tests.

    Returns :class:`Timings` (median seconds per call by name, with the spread and the device).
    Raises ``ValueError`` for an empty ``fns``, a non-callable, ``repeats < 1``, ``warmup < 0``
    or ``number < 1``; the functions' own errors propagate.
    """
    if not isinstance(fns, Mapping) or not fns:
        raise ValueError(f"interleaved_medians: fns must be a non-empty dict name -> function, got {fns!r}")
    bad = [name for name, fn in fns.items() if not callable(fn)]
    if bad:
        raise ValueError(f"interleaved_medians: fns[{bad[0]!r}] is not callable")
    repeats = _positive_int(repeats, "repeats", 1)
    warmup = _positive_int(warmup, "warmup", 0)
    number = _positive_int(number, "number", 1)
    device = _as_device(device, "interleaved_medians")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        first = r % len(names)
        for name in names[first:] + names[:first]:
            fn = fns[name]
            synchronize(device)
            start = clock()
            for _ in range(number):
                fn()
            synchronize(device)
            samples[name].append((clock() - start) / number)
    detail = {name: Timing(name, tuple(s)) for name, s in samples.items()}
    return Timings(device=device, repeats=repeats, warmup=warmup, number=number, detail=detail)


def time_scale_from_env() -> float:
    """The factor ``TFM_TIME_SCALE`` names (a finite number > 0), or 1.0 when it is unset/empty.

    :func:`tfmlib.train.fit` multiplies its ``time_budget_s`` by it: a slow-device simulation
    (``TFM_TIME_SCALE=0.001`` fires every guard after a thousandth of its seconds) for testing that
    a notebook reports a run its time guard cut short."""
    raw = os.environ.get("TFM_TIME_SCALE", "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = float("nan")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"TFM_TIME_SCALE={raw!r} is not a time scale; set it to a finite number > 0 "
                         f"(0.01: guards fire after 1% of their seconds) or unset it")
    return scale

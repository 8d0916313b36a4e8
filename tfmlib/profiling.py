"""Where a training step's time goes: a ``torch.profiler`` table of a few steps, the gaps between the
operations, and the host reads that make the host wait for the device.

Introduced in chapter 10 (scaling up), whose profiling section reads one trace of a training step.

**Host reads.** CUDA (and MPS) run asynchronously: Python queues kernels and goes on, and the device
works through the queue. Whenever Python needs a *value* computed on the device (``loss.item()``,
``int(n_tokens)``, ``if (x > 0).any():``, ``t.tolist()``), it must wait until everything queued before
has run: a *host sync*. The queue then runs dry while Python prepares the next operations, and
every step pays the launch latency of its first kernels. PyTorch can report syncs on CUDA
(``torch.cuda.set_sync_debug_mode("warn")``), but not on the CPU, where nothing is asynchronous.
:func:`count_host_reads` counts the Python calls that read a tensor's value (``Tensor.item``,
``tolist``, ``numpy``, ``__int__``, ``__float__``, ``__bool__``, ``__index__``, and with them
``__format__`` and ``math`` functions, which go through them): on the CPU it is the proxy that a
test can check (each such call would be a sync on a GPU), on any device the count of places to
look at. It does not see reads made inside C++ (``torch.equal``, a ``GradScaler``'s
``found_inf`` check runs ``.item()`` in Python and is counted).

**A profile.** :func:`profile_steps` runs a step function under ``torch.profiler`` and returns
:class:`StepProfile`: the operations ranked by their *self* time (time inside the operation itself,
not in the operations it calls), per step, on the device that did the work (the CPU's clock for a
CPU run; the GPU kernels' for a CUDA run), and the **gaps**: how much of the profiled wall time no
operation was running (on the CPU: the time between the top-level operators, which is Python and
framework overhead; on CUDA: the time the GPU had no kernel running, which is what launch
overhead and host syncs cost). A sentence such as "a step is dominated by matrix products" should
be a row of this table.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from tfmlib.timing import synchronize

INTRODUCED_IN = 10

__all__ = ["HostReads", "OpTime", "StepProfile", "count_host_reads", "profile_steps"]

# the Tensor methods through which Python reads a value computed on the device
_READS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")


@dataclass
class HostReads:
    """What :func:`count_host_reads` counted: ``calls`` maps a method name to how many times it ran
    (outermost calls only: ``__format__`` calling ``item`` counts once), ``total`` sums them."""

    calls: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def __str__(self) -> str:
        inner = ", ".join(f"{name} {n}" for name, n in sorted(self.calls.items())) or "none"
        return f"{self.total} host read(s): {inner}"


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """Count the Python calls that read a tensor's value inside the ``with`` block.

    ``with count_host_reads() as reads: ...`` then ``reads.total``, ``reads.calls["item"]``. The
    methods of :data:`_READS` on ``torch.Tensor`` are wrapped for the duration of the block and
    restored after it (also when it raises); a read inside another (``__format__`` -> ``item``)
    counts once. Not thread-safe: it patches the class for every thread.
    """
    reads = HostReads()
    originals = {name: getattr(torch.Tensor, name) for name in _READS}
    depth = [0]

    def wrap(name: str, method: Callable) -> Callable:
        def counted(self, *args, **kwargs):
            if depth[0] == 0:
                reads.calls[name] = reads.calls.get(name, 0) + 1
            depth[0] += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        counted.__name__ = name
        return counted

    for name, method in originals.items():
        setattr(torch.Tensor, name, wrap(name, method))
    try:
        yield reads
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


@dataclass(frozen=True)
class OpTime:
    """One operation of a profile: its name, calls per step and self time per step (ms), and its
    share of the summed self time of all operations."""

    name: str
    calls_per_step: float
    ms_per_step: float
    share: float


@dataclass(frozen=True)
class StepProfile:
    """What :func:`profile_steps` returns.

    ``ops``: every operation, largest self time first (``ops[:k]`` for the top ``k``);
    ``wall_ms``: wall-clock ms per step while profiled (the profiler adds some overhead);
    ``busy_ms``: ms per step during which at least one operation ran (top-level CPU operators on
    the CPU; GPU kernels on CUDA); ``gap_ms = wall_ms - busy_ms``; ``largest_gaps_ms``: the five
    longest idle stretches (ms); ``clock``: whose time it is (``"cpu"`` or ``"cuda"``);
    ``steps``: how many steps were profiled.
    """

    device: torch.device
    clock: str
    steps: int
    wall_ms: float
    busy_ms: float
    ops: tuple[OpTime, ...]
    largest_gaps_ms: tuple[float, ...]

    @property
    def gap_ms(self) -> float:
        return max(self.wall_ms - self.busy_ms, 0.0)

    def share_of(self, *fragments: str) -> float:
        """The summed share of the operations whose name contains any of ``fragments``
        (``share_of("mm", "matmul")`` for the matrix products)."""
        return sum(op.share for op in self.ops if any(f in op.name for f in fragments))

    def table(self, top: int = 10) -> str:
        """The ``top`` operations by self time per step, then the busy time and the gaps."""
        width = max([12] + [len(op.name) for op in self.ops[:top]])
        lines = [f"{'operation':{width}s} {'calls/step':>10s} {'ms/step':>9s} {'share':>7s}"]
        for op in self.ops[:top]:
            lines.append(f"{op.name:{width}s} {op.calls_per_step:10.1f} {op.ms_per_step:9.3f} "
                         f"{op.share:7.1%}")
        rest = self.ops[top:]
        if rest:
            others = f"({len(rest)} others)"
            lines.append(f"{others:{width}s} {'':10s} {sum(o.ms_per_step for o in rest):9.3f} "
                         f"{sum(o.share for o in rest):7.1%}")
        where = "GPU kernels" if self.clock == "cuda" else "top-level CPU operators"
        lines.append(f"per step on {self.device}: {self.wall_ms:.2f} ms wall, {where} busy "
                     f"{self.busy_ms:.2f} ms, gaps {self.gap_ms:.2f} ms "
                     f"({self.gap_ms / self.wall_ms:.0%}); largest gaps "
                     + ", ".join(f"{g:.3f}" for g in self.largest_gaps_ms) + " ms")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _union(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """The covered length of ``intervals`` and the gaps between them (same units)."""
    covered, gaps = 0.0, []
    end = None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            if end is not None:
                gaps.append(start - end)
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    return covered, gaps


def profile_steps(step_fn: Callable[[], object], *, device: torch.device | str, steps: int = 3,
                  warmup: int = 1) -> StepProfile:
    """Profile ``steps`` calls of ``step_fn`` (one training step each) after ``warmup`` untimed ones.

    On CUDA the profiler records the CPU and the GPU, and the table ranks the GPU kernels by their
    duration; elsewhere it ranks the CPU operators by their self CPU time.
    The device is synchronised before and after the profiled steps (not between them). Returns
    :class:`StepProfile`; ``ValueError`` for ``steps < 1`` or ``warmup < 0``, ``TypeError`` for a
    non-callable.
    """
    if not callable(step_fn):
        raise TypeError(f"profile_steps: step_fn must be callable, got {type(step_fn).__name__}")
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"profile_steps: {name} must be an int >= {low}, got {value!r}")
    device = torch.device(device) if isinstance(device, str) else device
    on_cuda = device.type == "cuda"
    for _ in range(warmup):
        step_fn()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            with record_function("training step"):
                step_fn()
        synchronize(device)
        wall_s = time.perf_counter() - start
    events = [e for e in prof.events() if e.name != "training step"]
    if on_cuda:
        timed = [e for e in events if e.device_type == DeviceType.CUDA]
        spans = [(e.time_range.start, e.time_range.end) for e in timed]
    else:
        timed = [e for e in events if e.device_type == DeviceType.CPU]
        top_level = [e for e in timed if e.cpu_parent is None or e.cpu_parent.name == "training step"]
        spans = [(e.time_range.start, e.time_range.end) for e in top_level]
    busy_us, gaps_us = _union(spans)
    per_name: dict[str, list[float]] = {}
    for e in timed:
        own = e.time_range.elapsed_us() if on_cuda else e.self_cpu_time_total   # a kernel has no children
        entry = per_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += own
    total = sum(us for _, us in per_name.values()) or 1.0
    ops = tuple(sorted((OpTime(name, n / steps, us / 1e3 / steps, us / total)
                        for name, (n, us) in per_name.items()), key=lambda o: -o.ms_per_step))
    wall_ms = 1e3 * wall_s / steps
    busy_ms = min(busy_us / 1e3 / steps, wall_ms)
    return StepProfile(device=device, clock="cuda" if on_cuda else "cpu", steps=steps, wall_ms=wall_ms,
                       busy_ms=busy_ms, ops=ops,
                       largest_gaps_ms=tuple(g / 1e3 for g in sorted(gaps_us, reverse=True)[:5]))

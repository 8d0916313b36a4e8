"""tfmlib.timing: interleaving, warm-up, medians on a fake clock, device synchronisation, errors."""

from __future__ import annotations

import statistics

import pytest
import torch

from tfmlib import timing
from tfmlib.timing import Timing, interleaved_medians, synchronize


class FakeClock:
    """A clock that each contender advances by its own cost per call, recording who ran when."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now

    def contender(self, name: str, costs: list[float]):
        calls = iter(costs)

        def fn() -> None:
            self.log.append(name)
            self.now += next(calls)

        return fn


def test_contenders_take_turns_and_the_first_one_rotates():
    clock = FakeClock()
    fns = {n: clock.contender(n, [1.0] * 10) for n in "abc"}
    interleaved_medians(fns, repeats=3, warmup=1, device="cpu", clock=clock)
    warm, timed = clock.log[:3], clock.log[3:]
    assert warm == ["a", "b", "c"], f"warm-up calls each contender once, in turn: {warm}"
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"], f"rounds not interleaved: {timed}"


def test_warmup_calls_are_run_but_not_timed():
    clock = FakeClock()
    # the two warm-up calls cost 100 s; the timed ones 1, 2, 3 s
    fns = {"x": clock.contender("x", [100.0, 100.0, 1.0, 2.0, 3.0])}
    t = interleaved_medians(fns, repeats=3, warmup=2, device="cpu", clock=clock)
    assert clock.log == ["x"] * 5, "two warm-up calls and three timed ones"
    assert t.detail["x"].samples == (1.0, 2.0, 3.0), t.detail["x"]
    assert t["x"] == 2.0


def test_medians_quartiles_and_extremes_of_a_fake_clock():
    clock = FakeClock()
    fast = [0.0, 1.0, 5.0, 2.0, 4.0, 3.0, 100.0]   # warm-up 0.0, then an outlier at the end
    slow = [0.0, 10.0, 30.0, 20.0, 50.0, 40.0, 60.0]
    t = interleaved_medians({"fast": clock.contender("fast", fast), "slow": clock.contender("slow", slow)},
                            repeats=6, warmup=1, device="cpu", clock=clock)
    assert t["fast"] == statistics.median(fast[1:]) == 3.5, "the median ignores the outlier"
    assert t["slow"] == 35.0
    assert t.ratio("slow", "fast") == pytest.approx(10.0)
    assert t.ms("fast") == pytest.approx(3500.0)
    assert (t.detail["fast"].min, t.detail["fast"].max) == (1.0, 100.0)
    q1, q3 = t.detail["slow"].quartiles
    assert (q1, q3) == (22.5, 47.5), (q1, q3)   # inclusive quartiles of 10, 20, ..., 60
    assert dict(t) == {"fast": 3.5, "slow": 35.0} and len(t) == 2 and list(t) == ["fast", "slow"]


def test_number_divides_a_sample_by_the_calls_it_holds():
    clock = FakeClock()
    t = interleaved_medians({"x": clock.contender("x", [2.0] * 8)}, repeats=2, warmup=0, number=4,
                            device="cpu", clock=clock)
    assert clock.log == ["x"] * 8
    assert t.detail["x"].samples == (2.0, 2.0), "each sample is seconds per call, not per batch of calls"


def test_the_device_is_synchronised_around_every_timed_call(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(f"sync {device}"))
    clock = FakeClock()

    def fn(name: str):
        def call() -> None:
            events.append(name)
            clock.now += 1.0
        return call

    t = interleaved_medians({"a": fn("a"), "b": fn("b")}, repeats=2, warmup=1,
                            device=torch.device("cuda", 0), clock=clock)
    s = "sync cuda:0"
    assert events == ["a", "b", s,                    # warm-up, then wait for it
                      s, "a", s, s, "b", s,           # round 0
                      s, "b", s, s, "a", s], events   # round 1 starts with b
    assert t.device == torch.device("cuda", 0)
    assert "on cuda:0" in str(t), "the table says which device it timed"


def test_synchronize_per_device(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(f"cuda {device}"))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    synchronize("cpu")
    assert calls == [], "the CPU has nothing to wait for"
    synchronize("cuda:1")
    synchronize(torch.device("mps"))
    assert calls == ["cuda cuda:1", "mps"], calls
    with pytest.raises(ValueError, match="no way to wait for device type 'xpu'"):
        synchronize("xpu")
    with pytest.raises(TypeError, match="device must be"):
        synchronize(0)  # type: ignore[arg-type]


def test_real_clock_on_the_cpu_orders_work_by_its_cost():
    # sleeping has a guaranteed lower bound on every machine; the order cannot flip
    import time as _time
    t = interleaved_medians({"long": lambda: _time.sleep(0.02), "short": lambda: None}, repeats=3,
                            device="cpu")
    assert t["long"] >= 0.02 > t["short"], repr(t)
    assert t.device.type == "cpu" and t.repeats == 3 and t.warmup == 2


def test_table_lists_every_contender_in_ms():
    t = timing.Timings(device=torch.device("cpu"), repeats=2, warmup=1, number=1,
                       detail={"explicit": Timing("explicit", (0.002, 0.004)),
                               "fast": Timing("fast", (0.001, 0.001))})
    text = str(t)
    assert text.splitlines()[0].startswith("on cpu: median of 2 interleaved rounds")
    row = next(line for line in text.splitlines() if line.startswith("explicit"))
    assert row.split()[1:] == ["3.000", "2.500", "3.500", "2.000", "4.000"], row
    assert "explicit=3 ms" in repr(t)
    with pytest.raises(KeyError, match="no contender 'slow'"):
        t["slow"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(fns={}), "non-empty"),
    (dict(fns={"a": 3}), r"fns\['a'\] is not callable"),
    (dict(repeats=0), "repeats must be an int >= 1"),
    (dict(repeats=2.5), "repeats must be an int >= 1"),
    (dict(warmup=-1), "warmup must be an int >= 0"),
    (dict(number=0), "number must be an int >= 1"),
    (dict(device="not-a-device"), "not a torch device"),
])
def test_bad_input_is_refused_before_anything_runs(kwargs, match):
    ran: list[int] = []
    args = dict(fns={"a": lambda: ran.append(1)}, repeats=3, device="cpu") | kwargs
    with pytest.raises(ValueError, match=match):
        interleaved_medians(**args)
    assert ran == [], "nothing is timed when the arguments are wrong"


def test_device_is_required():
    with pytest.raises(TypeError, match="device"):
        interleaved_medians({"a": lambda: None}, 3)  # type: ignore[call-arg]

"""tools/timing_asserts.py: the static check that a notebook asserts wall-clock comparisons only
under a device guard. Small synthetic sources: what must be flagged (unguarded timing
comparisons, however the timing reached the assert) and what must not (guarded ones, asserts that
compare no timing, a time compared with 0)."""

from __future__ import annotations

import textwrap

import pytest
import timing_asserts
from timing_asserts import check_source


def flagged(source: str) -> list[int]:
    """The line numbers the checker reports in ``source``."""
    return [f.line for f in check_source(textwrap.dedent(source), "nb.py")]


# --------------------------------------------------------------------------- flagged


@pytest.mark.parametrize("helper", ["interleaved_medians", "median_times", "best_ms", "time_gru",
                                    "ms_per_step"])
def test_an_unguarded_comparison_of_a_helper_s_timings_is_flagged(helper):
    src = f"""
    t = {helper}(fns, 5)
    assert t["loop"] > 2 * t["fused"], "the fused loop should be faster"
    """
    assert flagged(src) == [3]


def test_clock_arithmetic_is_a_timing():
    src = """
    import time
    from time import perf_counter
    start = time.perf_counter()
    work()
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, "fast"
    t0 = perf_counter()
    assert perf_counter() - t0 < 2
    wall = time.time()
    assert time.time() - wall < 3
    """
    assert flagged(src) == [7, 9, 11]


def test_names_derived_from_timings_are_timings():
    src = """
    timings = {"loop": [], "fused": []}
    for T in lengths:
        for name in timings:
            timings[name].append(best_ms(lambda: f(name, T), 3))
    growth = timings["loop"][-1] / timings["loop"][0]
    ratio = np.array(timings["loop"]) / np.array(timings["fused"])
    last = {name: t[-1] for name, t in timings.items()}
    assert growth > 4, "linear in T"
    assert ratio[0] < 1
    assert last["loop"] > last["fused"]
    assert all(a < b for a, b, T in zip(timings["fused"], timings["loop"], lengths))
    """
    assert flagged(src) == [9, 10, 11, 12]


def test_containers_filled_with_timings_and_functions_returning_them():
    src = """
    store = {}
    for T in lengths:
        for name, seconds in median_times(fns, 5).items():
            store.setdefault(name, []).append(seconds)

    def measure(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    per_call = [measure(f) for f in fns]
    assert store["a"][0] < store["b"][0]
    assert per_call[0] < per_call[1]
    assert measure(g) < 0.5
    """
    assert flagged(src) == [13, 14, 15]


def test_recorded_wall_clock_fields_are_timings():
    src = """
    history = fit(model, loader, loss_fn, opt, epochs=1)
    results = {}
    for name in models:
        results[name] = dict(bleu=report.bleu, speed=sum(e["tokens_per_second"] for e in history.epochs))
    speed_of = {name: r["speed"] for name, r in results.items()}
    assert history.seconds < 60
    assert speed_of["Transformer"] > speed_of["RNN"]
    assert results["Transformer"]["bleu"] > results["RNN"]["bleu"], "a record's other fields are not times"
    """
    assert flagged(src) == [7, 8]


def test_a_profile_guard_is_not_a_device_guard():
    src = """
    t = interleaved_medians(fns, 5, device=run.device)
    if run.profile != "smoke":
        assert t["slow"] > t["fast"]
    """
    assert flagged(src) == [4]


def test_asserts_inside_functions_use_their_own_names():
    src = """
    def check(fns):
        t = median_times(fns, 3)
        assert t["a"] < t["b"]

    def unrelated(t):
        assert t["a"] < t["b"], "this t is a parameter, not a timing"
    """
    assert flagged(src) == [4]


# --------------------------------------------------------------------------- not flagged


@pytest.mark.parametrize("guard", [
    'if run.device.type == "cpu":',
    'if run.profile != "smoke" and run.device.type == "cpu":',
    'if device.type != "cuda":',
    'if torch.cuda.is_available():',
    'if device == "cpu":',
])
def test_a_device_guard_lets_a_timing_assert_through(guard):
    src = f"""
    t = interleaved_medians(fns, 5, device=run.device)
    {guard}
        assert t["slow"] > 1.5 * t["fast"], "claimed on the CPU"
    """
    assert flagged(src) == []


def test_the_else_branch_and_an_or_in_the_assert_are_guarded_too():
    src = """
    t = interleaved_medians(fns, 5, device=run.device)
    if run.device.type != "cpu":
        print(t)
    else:
        for k in range(3):
            assert t["slow"] > t["fast"]
    assert run.device.type != "cpu" or t["slow"] > t["fast"]
    """
    assert flagged(src) == []


def test_asserts_that_compare_no_timing_are_not_flagged():
    src = """
    t = interleaved_medians(fns, 5, device=run.device)
    ratio = t["slow"] / t["fast"]
    assert len(t) == 2 and set(t) == {"slow", "fast"}
    assert t.device.type == run.device.type
    assert t["fast"] > 0 and 0 < ratio, "a time is positive on every device"
    assert isinstance(ratio, float)
    assert loss < 1.0 and bleu > 30, "not timings"
    for name in t:
        assert name in ("slow", "fast")
    assert all(p.grad is not None for p in model.parameters())
    print(f"{ratio:.1f}x")
    """
    assert flagged(src) == []


def test_comprehension_variables_shadow_outer_timings():
    src = """
    t = best_ms(f, 3)
    assert all(t < 5 for t in step_counts), "this t counts steps"
    assert [x for x in range(3)] == [0, 1, 2]
    """
    assert flagged(src) == []


# --------------------------------------------------------------------------- reporting


def test_findings_name_the_file_line_and_timing(tmp_path, capsys):
    nb = tmp_path / "04_x.py"
    nb.write_text("t = best_ms(f, 3)\nx = 1\nassert t < 5, 'fast'\n")
    clean = tmp_path / "05_y.py"
    clean.write_text("t = best_ms(f, 3)\nif run.device.type == 'cpu':\n    assert t < 5\n")
    (finding,) = timing_asserts.check_files([nb, clean])
    assert (finding.line, finding.names) == (3, ("t",))
    assert str(finding) == f"{nb}:3: assert t < 5, 'fast'  [timing: t]"
    assert timing_asserts.main([str(nb), str(clean)]) == 1
    out = capsys.readouterr().out
    assert f"{nb}:3:" in out and "1 timing assert(s) without a device guard in 2 file(s)" in out
    assert timing_asserts.main([str(clean)]) == 0


def test_the_checker_reads_every_notebook_source():
    sources = timing_asserts.notebook_sources()
    names = {p.name for p in sources}
    assert "00_preface.py" in names and any(p.parent.name == "solutions" for p in sources), names
    for path in sources:  # every notebook parses (a syntax error would hide its asserts)
        timing_asserts.check_source(path.read_text(encoding="utf-8"), str(path))

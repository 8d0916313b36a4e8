"""A slow device must change how much a notebook can check, never what it concludes (issue 22).

Training in the book stops by step or epoch count; a wall-clock limit (``fit``'s ``time_budget_s``)
stays only as a guard. When a guard cuts a run short, the run means less than its count promised,
so the notebook must say so and skip what a shorter run could reverse. That path never runs on a
normal machine, so it is tested here by simulation: ``TFM_TIME_SCALE`` multiplies every
``time_budget_s`` that ``fit`` is given (``tfmlib.timing.time_scale_from_env``), and at ``1e-9``
every guard fires after the first optimiser step, as on a device a billion times slower.

Which notebooks can a slow device change? Only those that pass ``time_budget_s`` to something:
``fit`` reads no clock otherwise. :func:`guarded_notebooks` finds them statically (a keyword
``time_budget_s=`` whose value is not ``None`` and not a function's own parameter handed on); each
runs here in ``smoke`` under the simulation, and must

* run to the end without an error;
* print the ``setup()`` line that says the guards are scaled (the variable reached the kernel);
* where ``fit`` warned that its guard cut a run (``TimeGuardWarning`` on stderr), print a line that
  says the run was "cut short" and what is therefore "not checked".

Notebooks that pass no guard cannot be changed by the variable (``fit`` scales only a given
``time_budget_s``), so running them again would test nothing. Chapters 07 and 10 keep a guard in
``smoke`` on purpose, so that the cut-short path runs here (asserted below).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import book  # tools/book.py (conftest puts tools/ on sys.path): executes a notebook in a fresh kernel
import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SCALE = "1e-9"
# chapters whose smoke profile sets a guard, so that the simulation must fire it
MUST_FIRE = {"07_transformer_architecture", "10_scaling_up"}


def guard_calls(source: str) -> list[int]:
    """Lines of the calls in ``source`` that pass a time guard: a keyword ``time_budget_s`` whose
    value is not the constant ``None`` and not a parameter of the function the call is in (a
    wrapper handing its own argument on is not a guard; its callers are scanned too)."""
    tree = ast.parse(source)
    found: list[int] = []

    def visit(node: ast.AST, params: frozenset[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = params | {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg != "time_budget_s":
                    continue
                value = kw.value
                if isinstance(value, ast.Constant) and value.value is None:
                    continue
                if isinstance(value, ast.Name) and value.id in params:
                    continue
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, params)

    visit(tree, frozenset())
    return found


def guarded_notebooks() -> list[Path]:
    return [p for p in book.notebook_sources(NOTEBOOKS) if guard_calls(book.notebook_code(p))]


def test_the_scan_finds_guards_and_only_guards():
    source = (
        "fit(m, d, l, o, epochs=1, time_budget_s=run.budget_s)\n"       # a guard from the profile: found
        "fit(m, d, l, o, epochs=1, time_budget_s=None)\n"               # no guard
        "fit(m, d, l, o, epochs=1)\n"                                   # no guard
        "def train(model, time_budget_s=None):\n"
        "    return fit(model, d, l, o, epochs=1, time_budget_s=time_budget_s)\n"  # handed on
        "train(m, time_budget_s=cfg['budget_s'])\n"                     # the wrapper's caller: found
    )
    assert guard_calls(source) == [1, 6]
    names = {p.stem.removesuffix("_solutions") for p in guarded_notebooks()}
    assert MUST_FIRE <= names, f"chapters 07 and 10 pass their guards to fit: {sorted(names)}"


@pytest.mark.parametrize("path", guarded_notebooks(), ids=lambda p: p.stem)
def test_a_notebook_whose_guard_fires_says_what_it_does_not_check(path, monkeypatch, tmp_path):
    monkeypatch.setenv("TFM_PROFILE", "smoke")
    monkeypatch.setenv("MPLBACKEND", os.environ.get("MPLBACKEND", "Agg"))  # execute() clears it
    monkeypatch.setenv("TFM_TIME_SCALE", SCALE)
    nb = jupytext.read(path)
    result = book.execute(nb, path.parent, "smoke", timeout=900)
    assert result.ok, (f"{path.name} fails on a slow device (TFM_TIME_SCALE={SCALE}): {result.error}\n"
                       f"{result.details[-3000:]}")
    stdout = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.get("name") == "stdout")
    stderr = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.get("name") == "stderr")
    assert f"TFM_TIME_SCALE={float(SCALE):g}: every time guard" in stdout, \
        "setup() should say that the guards are scaled (did the variable reach the kernel?)"
    fired = "TimeGuardWarning" in stderr
    if path.stem in MUST_FIRE:
        assert fired, f"{path.name} keeps a guard in smoke: at TFM_TIME_SCALE={SCALE} fit should cut a run"
    if fired:
        said = [line for line in stdout.splitlines() if "cut short" in line and "not checked" in line]
        assert said, (f"{path.name}: a time guard cut a run short (fit warned), but no line says so and what "
                      f"is therefore not checked (print one with 'cut short' ... 'not checked')")

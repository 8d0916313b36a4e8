"""No exercise can be passed by handing in code the reader already has (issue 27).

An exercise asks the reader to build or measure something; if a function of the package, or a
function the chapter defined above its exercises, passes the checker, the exercise asks for
nothing. Two sweeps:

* every public function and class of ``tfmlib`` (every submodule's names without a leading
  underscore, defined in the package) is handed to every checker;
* every top-level function and class defined in a chapter's cells before its "Exercises" heading
  is handed to that chapter's checkers. The chapter's ``.py`` file is read, not run: its imports,
  functions and classes are executed, its training cells are not. A chapter function that needs a
  global computed by a training cell fails with a ``NameError`` here, as it would not in the
  notebook; such failures are listed by :func:`test_chapter_functions_are_really_tried` so that
  the sweep cannot go quietly blind.

A candidate that runs past :data:`SECONDS_PER_CALL` inside a checker is stopped and reported:
either the checker fed it something huge or the candidate does real work (training, a
download); both deserve a look, so they fail the test rather than pass silently.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import os
import pkgutil
import re
import signal
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import pytest
import torch

import tfmlib
from tfmlib import exercises
from tfmlib.exercises import core
from tfmlib.rng import capture_rng_state, restore_rng_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import book  # noqa: E402  (tools/book.py: which statements of a chapter are its definitions)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch._dynamo  # noqa: E402, F401  (imported once here: the first torch.compile call takes seconds to import it)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
SECONDS_PER_CALL = 5.0

# Callables never handed to a checker, each with the reason. Keep this short: every entry is a
# hole in the sweep.
NOT_TRIED = {
    # compiles whatever it is given: seconds of work past the limit, and no computation of its own
    "tfmlib.compiling.default_compiler": "torch.compile",
    # builds and splits the bundled corpus (seconds); returns sentence pairs, never a tensor answer
    "tfmlib.synthetic.bundled_splits": "loads the corpus",
}


class _TooSlow(BaseException):
    """Raised by the alarm; a BaseException so that a checker's ``except Exception`` cannot eat it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _TooSlow


@contextlib.contextmanager
def _isolated(tmp: Path, seconds: float) -> Iterator[None]:
    """Run one candidate with a time limit, in ``tmp``, and undo what it may change globally."""
    threads, dtype, grad = torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()
    generators = capture_rng_state()
    cwd = os.getcwd()
    env = dict(os.environ)
    old = signal.signal(signal.SIGALRM, _on_alarm)
    os.chdir(tmp)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with matplotlib.rc_context():  # a plotting helper may restyle matplotlib for every later test
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        restore_rng_state(generators)
        os.environ.clear()
        os.environ.update(env)
        plt.close("all")


def _passes(name: str, candidate: Any, tmp: Path, seconds: float = SECONDS_PER_CALL) -> str | None:
    """``"passes"`` if ``candidate`` is accepted by exercise ``name``, ``"too slow"`` if it ran past
    the limit, else None."""
    run = core._REGISTRY[name].run
    try:
        with _isolated(tmp, seconds), contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
            run(candidate)
    except _TooSlow:
        return "too slow"
    except BaseException as e:  # noqa: BLE001  (any failure means: not accepted)
        if isinstance(e, KeyboardInterrupt):
            raise
        return None
    return "passes"


@functools.cache
def package_callables() -> dict[str, Any]:
    """Every public function and class defined in ``tfmlib``, by qualified name."""
    found: dict[int, tuple[str, Any]] = {}
    modules = [tfmlib] + [importlib.import_module(m.name)
                          for m in pkgutil.walk_packages(tfmlib.__path__, "tfmlib.")]
    for module in modules:
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not callable(obj):
                continue
            home = getattr(obj, "__module__", "") or ""
            if not home.startswith("tfmlib"):
                continue  # torch, typing, ...: not the package's code
            qualified = f"{home}.{getattr(obj, '__qualname__', attr)}"
            found.setdefault(id(obj), (qualified, obj))
    return {q: obj for q, obj in sorted(found.values(), key=lambda item: item[0]) if q not in NOT_TRIED}


def test_the_sweep_sees_the_package():
    found = package_callables()
    # a broken walk (an import error swallowed, a filter too strict) would make every check vacuous
    assert len(found) > 200, f"only {len(found)} public callables found in tfmlib"
    for expected in ("tfmlib.data.padding_fraction", "tfmlib.rnn_attention.attention_penalty",
                     "tfmlib.sampling.top_p_filter", "tfmlib.attention.scaled_dot_product_attention"):
        assert expected in found, expected


def test_a_known_shortcut_is_caught(tmp_path):
    """The sweep's own test: a checker that any tensor function passes is reported."""
    name = "99.sweep_selftest"
    core._REGISTRY[name] = core.Exercise(name, "no hint", lambda answer: answer(torch.ones(2, 3)).shape)
    try:
        assert _passes(name, torch.relu, tmp_path) == "passes"
        assert _passes(name, lambda x: 1 / 0, tmp_path) is None
        core._REGISTRY[name] = core.Exercise(name, "no hint", lambda answer: answer())
        assert _passes(name, lambda: __import__("time").sleep(60), tmp_path, seconds=0.2) == "too slow"
    finally:
        del core._REGISTRY[name]


@pytest.mark.parametrize("name", exercises.names())
def test_no_package_callable_passes(name, tmp_path):
    results = {q: _passes(name, obj, tmp_path) for q, obj in package_callables().items()}
    passing = sorted(q for q, r in results.items() if r == "passes")
    slow = sorted(q for q, r in results.items() if r == "too slow")
    assert not passing, f"{name} is passed by the package's own {passing}: the exercise asks for nothing"
    assert not slow, f"{name}: package callables ran past {SECONDS_PER_CALL} s inside the checker: {slow}"


# ----------------------------------------------------------------------------- the chapters' own functions


def _chapter_file(chapter: int) -> Path:
    (path,) = NOTEBOOKS.glob(f"{chapter:02d}_*.py")
    return path


@functools.cache
def chapter_definitions(chapter: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The functions and classes a chapter defines before its Exercises heading, executed with the
    chapter's imports and its ``run = setup(...)`` (in the smoke profile), and the errors of the
    definitions that could not be executed."""
    path = _chapter_file(chapter)
    text = path.read_text()
    heading = re.search(r"^# #+ (?:\d+[.:]?\s*)?Exercises", text, re.M)
    assert heading, f"chapter {chapter:02d} has no Exercises heading"
    tree = ast.parse(text[: heading.start()])
    module = types.ModuleType(f"_chapter_{chapter:02d}_sweep")  # dataclasses look their module up
    sys.modules[module.__name__] = module
    errors: dict[str, str] = {}
    saved_env, threads = dict(os.environ), torch.get_num_threads()
    os.environ["TFM_PROFILE"] = "smoke"
    try:  # setup() styles matplotlib for the chapter: keep that out of every later test
        with contextlib.redirect_stdout(None), matplotlib.rc_context():
            for node in tree.body:
                if not book.is_definition(node):
                    continue
                code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
                try:
                    exec(code, module.__dict__)  # noqa: S102  (the book's own source)
                except Exception as e:  # a definition that needs a training cell's result
                    errors[getattr(node, "name", ast.unparse(node)[:60])] = f"{type(e).__name__}: {e}"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    defined = {n.name for n in tree.body if isinstance(n, kinds)}
    return {n: module.__dict__[n] for n in sorted(defined) if n in module.__dict__}, errors


CHAPTERS = sorted({int(n[:2]) for n in exercises.names()})


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_chapter_function_passes(chapter, tmp_path):
    defined, _ = chapter_definitions(chapter)
    problems = []
    for name in exercises.names(chapter):
        for fn_name, fn in defined.items():
            verdict = _passes(name, fn, tmp_path)
            if verdict:
                problems.append(f"{name}: the chapter's own {fn_name} {verdict}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_functions_are_really_tried(chapter):
    """Every definition before the exercises executes, so the sweep above sees all of them."""
    defined, errors = chapter_definitions(chapter)
    assert not errors, f"chapter {chapter:02d}: definitions the sweep could not execute: {errors}"
    if chapter > 0:  # the preface defines nothing; every other chapter builds something
        assert defined, f"chapter {chapter:02d}: no function or class found before the exercises"
    assert all(callable(fn) for fn in defined.values())


# ----------------------------------------------------------------------------- hints, in every chapter


@pytest.mark.parametrize("name", exercises.names())
def test_every_hint_points_the_way_without_code(name):
    """Chapter 00's rule for hints (where to look, and no code), applied to every chapter's."""
    from test_exercises_ch00 import CODE_IN_HINTS  # tests/ is on the path under pytest

    hint = exercises.hint(name)
    given_away = [code for code in CODE_IN_HINTS if code in hint]
    assert not given_away, f"{name}'s hint gives away code: {given_away} in {hint!r}"
    assert re.search(r"\bsection|\bquestion|\bfigure|\bcell", hint, re.I), (
        f"{name}'s hint should say where in the chapter to look (a section, question or figure): {hint!r}")

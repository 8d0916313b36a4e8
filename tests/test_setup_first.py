"""Every notebook calls ``tfmlib.config.setup()`` before it computes anything.

``setup()`` chooses the profile and the device, sets the thread count and seeds everything; work done
before it runs with another thread count (a timing measures something else), other seeds, and, on a
GPU, the default device. Issue 22 found a solutions notebook timing twelve calls before its
``setup()``. The rule read statically from each notebook's code cells, in order: until the first
statement that calls ``setup(``, only imports, definitions (functions, classes) and assignments of
literal settings (numbers, strings, ``dict(...)`` / lists of them) may appear.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT / "tools"))
import book  # noqa: E402  (tools/book.py: what counts as a literal setting, shared with the exercises' sweep)


def _calls_setup(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) == "setup"
                                            or getattr(n.func, "attr", None) == "setup")
               for n in ast.walk(node))


def work_before_setup(source: str) -> list[str]:
    """The statements of ``source`` (a notebook's code cells, in order) that run before ``setup()``
    and are neither imports, definitions, docstrings, nor literal settings; ``["no setup() call"]`` when
    the notebook never calls it."""
    tree = ast.parse(source)
    problems = []
    for stmt in tree.body:
        if _calls_setup(stmt):
            return problems
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If) and getattr(stmt.test, "id", None) == "TYPE_CHECKING":
            continue                                          # imports for type hints only
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue                                          # a docstring or a bare string
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None \
                and book.is_literal_setting(stmt.value):
            continue
        problems.append(f"line {stmt.lineno}: {ast.unparse(stmt).splitlines()[0][:80]}")
    return problems + ["no setup() call"]


@pytest.mark.parametrize("path", book.notebook_sources(NOTEBOOKS), ids=lambda p: p.name)
def test_notebook_calls_setup_before_any_work(path: Path):
    problems = work_before_setup(book.notebook_code(path))
    assert not problems, f"{path.relative_to(ROOT)}: work before setup():\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("source, expected", [
    ("import torch\nrun = setup(seed=0)\nx = torch.zeros(3)", []),
    ("SIZES = dict(a=1, b=[2, 3])\nrun = setup(cpu=SIZES)", []),
    ("BASE = dict(a=1)\nGPU = dict(BASE, seeds=[0, 1])\nrun = setup(gpu=GPU)", []),
    ("x = [i for i in range(3)]\nrun = setup()", ["line 1: x = [i for i in range(3)]"]),
    ("n = len(data)\nrun = setup()", ["line 1: n = len(data)"]),
    ("Z = A @ V\nrun = setup()", ["line 1: Z = A @ V"]),
    ("size = d_model\nrun = setup()", ["line 1: size = d_model"]),
    ("LR = -3e-3\nrun = setup()", []),
    ("def f():\n    return 1\nclass A:\n    pass\nrun = setup()", []),
    ("import torch\nt = torch.randn(3)\nrun = setup()", ["line 2: t = torch.randn(3)"]),
    ("x = time_it()\nrun = setup()", ["line 1: x = time_it()"]),
    ("import torch", ["no setup() call"]),
    ("for i in range(3):\n    pass\nrun = setup()", ["line 1: for i in range(3):"]),
    ("run = tfmlib.config.setup(seed=1)", []),
    ("if TYPE_CHECKING:\n    from x import Y\nrun = setup()", []),
])
def test_the_rule_finds_work_before_setup(source: str, expected: list[str]):
    assert work_before_setup(source) == expected

"""Tensors a notebook makes must be made on the device they will meet (issue 22 item 3).

The first GPU run of the book failed in chapter 09 because a cell built ``src`` with
``torch.zeros(...)`` on the CPU and fed it to a translator on ``run.device`` ("index is on cpu").
On a CPU-only machine such a cell passes every test. This test reads every notebook (chapters and
solutions) statically and flags a tensor factory (``torch.zeros``, ``torch.randn``, ``torch.tensor``,
...) called without ``device=`` where a device is in play, unless the tensor is moved or the line
says why the CPU is meant.

A call is flagged when all of these hold:

* its scope (the innermost function, else the notebook cell's top level) is *device-aware*: it
  names a device (``run.device``, a ``device`` variable or keyword, ``x.device``). A cell that
  never names one runs everything on the CPU, where a CPU tensor is right on every machine;
* it has no ``device=`` keyword and is not moved on the spot (``torch.zeros(3).to(run.device)``);
* the name it is assigned to is not moved later in the same scope (``x.to(...)``, ``move_to(x, ...)``,
  or given to ``fit``, which moves every batch);
* no line of its statement carries the marker ``# cpu: <why>`` (a tensor kept on the CPU on
  purpose: data drawn from a seeded CPU generator before a loader moves it, statistics for
  printing, a model the cell puts on the CPU on purpose).
"""

from __future__ import annotations

import ast
from pathlib import Path

import book  # tools/book.py (conftest puts tools/ on sys.path): which files are the notebooks
import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "arange", "linspace", "eye", "tensor", "as_tensor",
                       "rand", "randn", "randint", "randperm", "normal"})
MOVES = frozenset({"to", "cuda"})
MOVERS = frozenset({"move_to", "fit"})  # functions that move the tensors they are given to the device
MARKER = "# cpu:"


def _names_a_device(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == "device":
            return True
        if isinstance(n, ast.Attribute) and n.attr == "device":
            return True
        if isinstance(n, ast.keyword) and n.arg == "device":
            return True
        if isinstance(n, ast.arg) and n.arg == "device":
            return True
    return False


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope`` outside the functions and classes defined in it."""
    out: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        n = stack.pop()
        out.append(n)
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(n))
    return out


def _is_factory(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr in FACTORIES and isinstance(f.value, ast.Name)
            and f.value.id == "torch")


def unplaced_factories(source: str, lines: list[str] | None = None) -> list[tuple[int, str]]:
    """``(line, text)`` of every flagged factory call in ``source`` (one cell's code)."""
    tree = ast.parse(source)
    lines = source.splitlines() if lines is None else lines
    parent: dict[ast.AST, ast.AST] = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parent[c] = n
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    flagged: list[tuple[int, str]] = []
    for scope in scopes:
        own = _own_nodes(scope)
        aware = _names_a_device(scope if scope is not tree else ast.Module(body=[
            n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))],
            type_ignores=[]))
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            aware = aware or _names_a_device(scope.args)
        if not aware:
            continue
        moved = set()
        for n in own:
            if isinstance(n, ast.Attribute) and n.attr in MOVES and isinstance(n.value, ast.Name):
                moved.add(n.value.id)
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) in MOVERS:
                moved.update(a.id for a in n.args if isinstance(a, ast.Name))
        for n in own:
            if not (isinstance(n, ast.Call) and _is_factory(n)):
                continue
            if any(kw.arg == "device" for kw in n.keywords):
                continue
            stmt, moved_on_the_spot = n, False
            while stmt in parent and not isinstance(stmt, ast.stmt):
                stmt = parent[stmt]
                if isinstance(stmt, ast.Attribute) and stmt.attr in MOVES:
                    moved_on_the_spot = True  # torch.zeros(...).to(device), f(torch.randn(...)).to(device)
            if moved_on_the_spot:
                continue
            targets = []
            if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                tlist = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in tlist:
                    targets += [x.id for x in ast.walk(t) if isinstance(x, ast.Name)]
            if targets and any(t in moved for t in targets):
                continue
            span = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
            if any(MARKER in lines[i - 1] for i in span if i - 1 < len(lines)):
                continue
            flagged.append((n.lineno, lines[n.lineno - 1].strip()))
    return flagged


def notebook_findings(path: Path) -> list[str]:
    nb = jupytext.read(path)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        src = "\n".join(book.code_lines(cell.source))
        try:
            hits = unplaced_factories(src)
        except SyntaxError:
            continue  # a cell that is not Python (rare); nbval runs it anyway
        found += [f"{path.relative_to(ROOT)}, cell {i}, line {line}: {text}" for line, text in hits]
    return found


def test_the_rule_on_cells_written_for_it():
    assert unplaced_factories("x = torch.zeros(3)\ny = x + 1\n") == [], "no device in play: the CPU is right"
    bad = "model = model.to(run.device)\nsrc = torch.zeros(2, 5, dtype=torch.long)\nmodel(src)\n"
    assert unplaced_factories(bad) == [(2, "src = torch.zeros(2, 5, dtype=torch.long)")], "chapter 09's bug"
    assert unplaced_factories(bad.replace("torch.long)", "torch.long, device=run.device)")) == []
    assert unplaced_factories(bad.replace("torch.long)", "torch.long).to(run.device)")) == []
    assert unplaced_factories(bad + "src = src.to(run.device)\n") == [], "moved later in the same scope"
    on_the_spot = "src = (torch.zeros(2, 5, dtype=torch.long) + 1).to(run.device)"
    assert unplaced_factories(bad.replace("src = torch.zeros(2, 5, dtype=torch.long)", on_the_spot)) == []
    given_to_fit = "b = [torch.randn(4) for _ in range(3)]\nfit(m, b, f, o, device=run.device)\n"
    assert unplaced_factories(given_to_fit) == [], "fit moves every batch"
    assert unplaced_factories(bad.replace("torch.long)", "torch.long)  # cpu: a CPU model here")) == []
    inside = "def f(model, device):\n    x = torch.randn(4)\n    return model(x)\n"
    assert unplaced_factories(inside) == [(2, "x = torch.randn(4)")], "a function given a device is aware"
    assert unplaced_factories("def f(model):\n    x = torch.randn(4)\n    return model(x)\n"
                              "y = f(m.to(run.device))\n") == [], "awareness is per scope"


@pytest.mark.parametrize("path", book.notebook_sources(NOTEBOOKS), ids=lambda p: p.stem)
def test_no_notebook_makes_a_tensor_off_the_device_it_meets(path):
    found = notebook_findings(path)
    assert not found, ("tensor factories without device= in a cell or function that names a device; add "
                       "device=..., move the tensor, or mark the line '# cpu: <why>':\n  "
                       + "\n  ".join(found))

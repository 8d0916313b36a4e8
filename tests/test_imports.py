"""No import circle in tfmlib (issue 24): every module's imports, walked with ``ast``.

Counted: every ``import tfmlib.x`` / ``from tfmlib.x import ...`` / ``from tfmlib import x`` /
relative import, at module level, inside functions, methods and ``try``/``if`` blocks (an import
inside a function is how a circle is usually hidden, and it still runs), and under
``if TYPE_CHECKING:``. Those never run, so they make no circle at run time, but they are counted
all the same: a module that names another's types depends on it as much as one that calls it, and
the circle issue 24 named between ``transformer`` and ``kv_cache`` was one of these (``kv_cache``
imported ``transformer`` under ``TYPE_CHECKING``, ``transformer`` imported ``kv_cache`` inside its
methods). Types both sides need belong in a module both can import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tfmlib"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """``tfmlib.x`` (or ``tfmlib.exercises.ch05``) -> file, for every module of the package."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in ``tree``: module level, functions, ``TYPE_CHECKING`` blocks."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The tfmlib modules that module ``name`` (file ``path``) imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in _all_imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from tfmlib import train" imports the module tfmlib.train
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for candidate in candidates:
            # the deepest known module named (importing tfmlib.a.b runs tfmlib.a too, but a package's
            # __init__ is counted only when it is named)
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name and candidate != "tfmlib":
                targets.add(candidate)
    return targets


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(package)
    return {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Every set of modules that import one another (a strongly connected component of two or more
    modules, found with Tarjan's algorithm), with one circle ``[a, b, ..., a]`` through its first
    module (the shortest): ``(modules, circle)`` pairs, enough to name what to fix."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:
        start, members = component[0], set(component)
        paths, seen = {start: [start]}, {start}
        queue = [start]
        while queue:  # breadth-first within the component, back to start
            node = queue.pop(0)
            if start in graph[node]:
                cycles.append((component, paths[node] + [start]))
                break
            for nxt in sorted(graph[node] & members - seen):
                seen.add(nxt)
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return cycles


GRAPH = import_graph()
CYCLES = find_cycles(GRAPH)


def test_the_walk_sees_imports_inside_functions_and_type_checking_blocks(tmp_path):
    """The walker on a package written for the test: it must find the circle hidden in a function
    and the one that only type checkers see."""
    pkg = tmp_path / "tfmlib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""pkg"""\n')
    (pkg / "a.py").write_text("from tfmlib.b import x\n")
    (pkg / "b.py").write_text("x = 1\ndef f():\n    from tfmlib import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from tfmlib.d import y\nelse:\n    import math\n")
    (pkg / "d.py").write_text("from tfmlib.c import TYPE_CHECKING\ny = 2\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("from . import e\n")
    (pkg / "sub" / "e.py").write_text("from ..sub import f\n")
    (pkg / "sub" / "f.py").write_text("from .e import z\n")
    graph = import_graph(pkg)
    assert graph["tfmlib.b"] == {"tfmlib.a"}, "an import inside a function counts"
    assert graph["tfmlib.c"] == {"tfmlib.d"}, "an import under TYPE_CHECKING counts too"
    assert graph["tfmlib.sub.f"] == {"tfmlib.sub.e"}, "a relative import"
    assert graph["tfmlib.sub.e"] == {"tfmlib.sub", "tfmlib.sub.f"}, "from ..sub import f names a module"
    cycles = find_cycles(graph)
    assert cycles == [(["tfmlib.a", "tfmlib.b"], ["tfmlib.a", "tfmlib.b", "tfmlib.a"]),
                      (["tfmlib.c", "tfmlib.d"], ["tfmlib.c", "tfmlib.d", "tfmlib.c"]),
                      (["tfmlib.sub", "tfmlib.sub.e", "tfmlib.sub.f"],
                       ["tfmlib.sub", "tfmlib.sub.e", "tfmlib.sub"])]


def test_the_graph_knows_the_real_package():
    graph = GRAPH
    assert "tfmlib.train" in graph and "tfmlib.exercises.core" in graph
    assert {"tfmlib.checkpoint", "tfmlib.training_step", "tfmlib.resume"} <= graph["tfmlib.train"]
    assert "tfmlib.train" not in graph["tfmlib.resume"], "resume reads the file format from tfmlib.checkpoint"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_is_part_of_an_import_circle(module):
    circles = [(members, circle) for members, circle in CYCLES if module in members]
    assert not circles, f"{module} is in an import circle: " + "; ".join(
        f"{' -> '.join(circle)} (modules importing one another: {', '.join(members)})"
        for members, circle in circles)

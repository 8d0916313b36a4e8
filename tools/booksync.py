"""Keep the book and the package in step.

A code cell in a notebook that repeats a ``tfmlib`` definition starts with a marker line::

    # tfmlib-source: tfmlib.rnn.GRUCellScratch

and the rest of the cell must be exactly the source of that object, ``inspect.getsource(obj)``
(dedented, so a method shown on its own starts at column 0; compared after stripping trailing
whitespace of the whole text). The name after the marker is ``tfmlib.<module>.<QualifiedName>``:
a function, a class, or a method (``tfmlib.rnn.GRUCellScratch.forward``).

    python tools/booksync.py --check    # report drift (a short diff per cell); exit 1 on any
    python tools/booksync.py --write    # rewrite every marked cell from the package, both files

The tool works on the jupytext percent ``.py`` files of ``notebooks/`` and ``notebooks/solutions/``;
``--write`` rewrites the marked cells of each ``.py`` and then brings its paired ``.ipynb`` up to
date through jupytext, keeping its outputs (what ``jupytext --sync`` does).

It also holds the helpers behind the progressive-import rule (a notebook of chapter NN imports
only ``tfmlib`` modules with ``INTRODUCED_IN <= NN``), which ``tests/test_book.py`` uses.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jupytext

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO_ROOT / "notebooks"
PACKAGE_DIR = REPO_ROOT / "tfmlib"

MARKER_RE = re.compile(r"^#\s*tfmlib-source:\s*(?P<name>tfmlib(?:\.[A-Za-z_]\w*)+)\s*$")
CHAPTER_RE = re.compile(r"^(?P<nn>\d{2})_")
PERCENT_FMT = "py:percent"


# ---------------------------------------------------------------------------------------------
# Finding the notebooks and the marked cells
# ---------------------------------------------------------------------------------------------


def notebook_py_files(notebooks_dir: Path | str = NOTEBOOKS) -> list[Path]:
    """The jupytext ``.py`` files of ``notebooks_dir`` and ``notebooks_dir/solutions``, sorted."""
    root = Path(notebooks_dir)
    files = sorted(root.glob("*.py")) + sorted((root / "solutions").glob("*.py"))
    return [f for f in files if ".ipynb_checkpoints" not in f.parts]


@dataclass(frozen=True)
class MarkedCell:
    """A code cell that starts with a ``# tfmlib-source:`` marker."""

    path: Path  # the notebook file the cell was read from
    index: int  # position of the cell in the notebook
    name: str  # the dotted name after the marker, e.g. "tfmlib.rnn.GRUCellScratch"
    body: str  # the cell's text after the marker line


@dataclass(frozen=True)
class Drift:
    """A marked cell whose text differs from the package, or whose name does not resolve."""

    path: Path
    index: int
    name: str
    diff: str  # a unified diff (cell -> package), or the error message when ``missing``
    missing: bool = False  # True when the name does not resolve to an object

    def report(self) -> str:
        what = "unknown name" if self.missing else "drift"
        return f"{self.path}: cell {self.index}: {what}: {self.name}\n{self.diff}"


def _split_marker(source: str) -> tuple[str, str] | None:
    """(name, body) when the first line of ``source`` is a marker, else None."""
    first, _, rest = source.partition("\n")
    m = MARKER_RE.match(first.strip())
    if m is None:
        return None
    return m.group("name"), rest


def find_marked_cells(path: Path | str) -> list[MarkedCell]:
    """The marked code cells of one notebook (``.py`` percent or ``.ipynb``), read with jupytext."""
    path = Path(path)
    nb = jupytext.read(path)
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        found = _split_marker(cell.source)
        if found is not None:
            cells.append(MarkedCell(path, i, found[0], found[1]))
    return cells


def resolve(name: str) -> object:
    """The object named ``tfmlib.<module>[.<sub>].<QualifiedName>``.

    The longest importable module prefix is imported, then the rest is followed with getattr.
    Raises ``LookupError`` with a readable message when the name does not exist.
    """
    parts = name.split(".")
    if parts[0] != "tfmlib" or len(parts) < 3:
        raise LookupError(f"{name!r}: a marker must name tfmlib.<module>.<QualifiedName>")
    module = None
    attrs: list[str] = []
    errors = []
    for k in range(len(parts), 1, -1):
        modname = ".".join(parts[:k])
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not modname.startswith(exc.name):
                raise LookupError(f"{name!r}: importing {modname} failed: {exc}") from exc
            errors.append(str(exc))
            continue
        except Exception as exc:  # a module that does not import is reported, not crashed on
            raise LookupError(f"{name!r}: importing {modname} failed: {exc!r}") from exc
        attrs = parts[k:]
        break
    if module is None or not attrs:
        raise LookupError(f"{name!r}: no module of tfmlib holds it ({'; '.join(errors) or 'a module'})")
    obj: object = module
    for i, attr in enumerate(attrs):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            where = ".".join(parts[: len(parts) - len(attrs) + i])
            raise LookupError(f"{name!r}: {where} has no attribute {attr!r}") from None
    return obj


def package_source(name: str) -> str:
    """``inspect.getsource`` of the named object, dedented (methods start at column 0)."""
    obj = resolve(name)
    try:
        src = inspect.getsource(obj)
    except (TypeError, OSError) as exc:
        raise LookupError(f"{name!r}: no source for it ({exc})") from None
    return textwrap.dedent(src)


def _cell_text(name: str, body: str) -> str:
    return f"# tfmlib-source: {name}\n{body.rstrip()}"


def _diff(name: str, current: str, expected: str, context: int = 2, limit: int = 40) -> str:
    lines = list(
        difflib.unified_diff(
            current.rstrip().splitlines(),
            expected.rstrip().splitlines(),
            fromfile=f"cell ({name})",
            tofile=f"package ({name})",
            n=context,
            lineterm="",
        )
    )
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more diff lines)"]
    return "\n".join(lines)


def check(paths: list[Path | str] | None = None) -> list[Drift]:
    """The drifted or unresolvable marked cells of ``paths`` (default: every notebook ``.py``)."""
    paths = notebook_py_files() if paths is None else [Path(p) for p in paths]
    drifts = []
    for path in paths:
        for cell in find_marked_cells(path):
            try:
                expected = package_source(cell.name)
            except LookupError as exc:
                drifts.append(Drift(cell.path, cell.index, cell.name, str(exc), missing=True))
                continue
            if cell.body.rstrip() != expected.rstrip():
                drifts.append(Drift(cell.path, cell.index, cell.name, _diff(cell.name, cell.body, expected)))
    return drifts


def paired_ipynb(py_path: Path) -> Path:
    return py_path.with_suffix(".ipynb")


def _rewrite_cells(nb, sources: dict[str, str]) -> int:
    """Replace the text of each marked code cell of ``nb`` whose name is in ``sources``."""
    changed = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        found = _split_marker(cell.source)
        if found is None or found[0] not in sources:
            continue
        new = _cell_text(found[0], sources[found[0]])
        if cell.source != new:
            cell.source = new
            changed += 1
    return changed


def write(paths: list[Path | str] | None = None, verbose: bool = False) -> list[Path]:
    """Rewrite every marked cell of ``paths`` (``.py`` files) from the package.

    The ``.py`` is rewritten through jupytext (its header and other cells unchanged), then its
    paired ``.ipynb``, when there is one, gets the new inputs with its outputs kept
    (``jupytext.combine.combine_inputs_with_outputs``, the step behind ``jupytext --sync``).
    Unknown names raise ``LookupError`` before any file is touched. Returns the files written.
    """
    from jupytext.combine import combine_inputs_with_outputs

    paths = notebook_py_files() if paths is None else [Path(p) for p in paths]
    plans = []
    for path in paths:
        if path.suffix != ".py":
            raise ValueError(f"{path}: write() works on the jupytext .py files")
        names = {cell.name for cell in find_marked_cells(path)}
        sources = {name: package_source(name) for name in sorted(names)}  # may raise LookupError
        plans.append((path, sources))
    written = []
    for path, sources in plans:
        if not sources:
            continue
        nb = jupytext.read(path)
        if _rewrite_cells(nb, sources) == 0:
            continue
        jupytext.write(nb, path, fmt=PERCENT_FMT)
        written.append(path)
        ipynb = paired_ipynb(path)
        if ipynb.exists():
            nb_outputs = jupytext.read(ipynb)
            nb_inputs = jupytext.read(path)
            combined = combine_inputs_with_outputs(nb_inputs, nb_outputs, fmt=PERCENT_FMT)
            jupytext.write(combined, ipynb)
            written.append(ipynb)
        if verbose:
            print(f"rewrote marked cells of {path}")
    return written


# ---------------------------------------------------------------------------------------------
# Progressive imports: chapter NN imports only modules with INTRODUCED_IN <= NN
# ---------------------------------------------------------------------------------------------


def chapter_of(path: Path | str) -> int | None:
    """The chapter number of ``NN_name.py`` / ``NN_name_solutions.py``, or None."""
    m = CHAPTER_RE.match(Path(path).name)
    return int(m.group("nn")) if m else None


def module_info(module_file: Path | str) -> tuple[int | None, str | None]:
    """(``INTRODUCED_IN``, docstring) of a tfmlib module file, read with ``ast`` (no import)."""
    tree = ast.parse(Path(module_file).read_text(encoding="utf-8"))
    introduced = None
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
            value = node.value
        if "INTRODUCED_IN" in targets and isinstance(value, ast.Constant) and isinstance(value.value, int):
            introduced = value.value
    return introduced, ast.get_docstring(tree)


def package_modules(package_dir: Path | str = PACKAGE_DIR) -> dict[str, Path]:
    """Module name (``rnn``) -> file, for every module of the package (not ``__init__``)."""
    package_dir = Path(package_dir)
    mods = {p.stem: p for p in sorted(package_dir.glob("*.py")) if p.stem != "__init__"}
    for sub in sorted(package_dir.iterdir()):
        if sub.is_dir() and (sub / "__init__.py").exists():
            mods[sub.name] = sub / "__init__.py"
    return mods


def _is_type_checking_block(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): code that never runs; type checkers read it."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _is_type_checking_block(node):
            stack.extend([node.test, *node.orelse])
        else:
            stack.extend(ast.iter_child_nodes(node))


def _imports_from_tree(tree: ast.AST, package_names: set[str] | None) -> list[tuple[str, int]]:
    """Imports that run: an import a type checker alone reads (under ``if TYPE_CHECKING:``) loads
    nothing, so it may name a later chapter's module for a type hint."""
    found = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tfmlib" and len(parts) > 1:
                    found.append((parts[1], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "tfmlib":
                continue
            if len(parts) > 1:
                found.append((parts[1], node.lineno))
            else:
                for alias in node.names:
                    # ``from tfmlib import __version__`` names no module
                    if package_names is None or alias.name in package_names:
                        found.append((alias.name, node.lineno))
    return found


_IMPORT_LINE_RE = re.compile(
    r"^\s*(?:from\s+tfmlib\.(?P<a>\w+)\s+import|import\s+tfmlib\.(?P<b>\w+)"
    r"|from\s+tfmlib\s+import\s+(?P<c>[\w, ()]+))",
    re.M,
)


def tfmlib_imports(source: str, package_names: set[str] | None = None) -> list[tuple[str, int]]:
    """(module, line) for every ``tfmlib`` module that ``source`` imports.

    Handles ``import tfmlib.X``, ``from tfmlib.X import ...`` and ``from tfmlib import X, Y``.
    Parsed with ``ast``; a file that does not parse falls back to a line-by-line regex.
    """
    try:
        return _imports_from_tree(ast.parse(source), package_names)
    except SyntaxError:
        pass
    found = []
    for m in _IMPORT_LINE_RE.finditer(source):
        line = source.count("\n", 0, m.start()) + 1
        if m.group("a") or m.group("b"):
            found.append((m.group("a") or m.group("b"), line))
        else:
            for name in re.split(r"[\s,()]+", m.group("c")):
                if name and (package_names is None or name in package_names):
                    found.append((name, line))
    return found


def without_marked_cells(py_source: str) -> str:
    """A percent-format notebook with the bodies of its marked cells blanked (line numbers kept).

    A marked cell is the package's own source, shown verbatim; what it imports inside a function
    is the package's dependency, not the chapter's. The chapter's own imports are what count.
    """
    lines = py_source.split("\n")
    in_marked = False
    for i, line in enumerate(lines):
        if line.startswith("# %%"):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            in_marked = MARKER_RE.match(following.strip()) is not None
            continue
        if in_marked:
            lines[i] = ""
    return "\n".join(lines)


def progressive_violations(
    notebook_files: list[Path | str], package_dir: Path | str = PACKAGE_DIR
) -> list[str]:
    """Messages for each import of a module introduced after the notebook's chapter.

    ``notebook_files`` are ``NN_*.py`` notebooks; an import of a module that does not exist, or of
    one without ``INTRODUCED_IN``, is reported too.
    """
    modules = package_modules(package_dir)
    chapters = {name: module_info(path)[0] for name, path in modules.items()}
    problems = []
    for nb in notebook_files:
        nb = Path(nb)
        nn = chapter_of(nb)
        if nn is None:
            continue
        source = without_marked_cells(nb.read_text(encoding="utf-8"))
        for mod, line in tfmlib_imports(source, set(modules)):
            if mod not in modules:
                problems.append(f"{nb}:{line}: imports tfmlib.{mod}, which does not exist")
            elif chapters[mod] is None:
                problems.append(f"{nb}:{line}: tfmlib.{mod} has no INTRODUCED_IN constant")
            elif chapters[mod] > nn:
                problems.append(
                    f"{nb}:{line}: chapter {nn:02d} imports tfmlib.{mod}, introduced in chapter "
                    f"{chapters[mod]:02d}"
                )
    return problems


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report drifted cells, exit 1 on drift")
    mode.add_argument("--write", action="store_true", help="rewrite marked cells from the package")
    parser.add_argument("--notebooks", default=str(NOTEBOOKS), help="notebooks folder (default: notebooks)")
    parser.add_argument("files", nargs="*", help=".py notebooks (default: all under --notebooks)")
    args = parser.parse_args(argv)
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    paths = [Path(f) for f in args.files] or notebook_py_files(args.notebooks)
    if args.check:
        drifts = check(paths)
        for d in drifts:
            print(d.report(), end="\n\n")
        n_cells = sum(len(find_marked_cells(p)) for p in paths)
        if drifts:
            print(
                f"booksync: {len(drifts)} of {n_cells} marked cells differ from tfmlib; "
                "run `python tools/booksync.py --write`"
            )
            return 1
        print(f"booksync: {n_cells} marked cells in {len(paths)} notebooks match tfmlib")
        return 0
    try:
        written = write(paths, verbose=True)
    except LookupError as exc:
        print(f"booksync: {exc}", file=sys.stderr)
        return 1
    print(f"booksync: wrote {len(written)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

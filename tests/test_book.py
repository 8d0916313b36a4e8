"""The book's own conventions, checked over the real notebooks (see CONTRIBUTING.md).

* every notebook is a jupytext pair (``.ipynb`` + percent ``.py``) holding the same cells;
* cells marked ``# tfmlib-source: tfmlib.<module>.<name>`` equal the package source (booksync);
* a notebook of chapter NN imports only tfmlib modules with ``INTRODUCED_IN <= NN``;
* committed notebooks are executed, without errors, and chapters end with a summary, exercises
  and references; a chapter with coding exercises has a solutions notebook that must pass.

Each check is also unit-tested on tiny notebooks in ``tmp_path``, so it is known to be able to
fail even while ``notebooks/`` is nearly empty.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
PACKAGE = ROOT / "tfmlib"
sys.path.insert(0, str(ROOT / "tools"))

import book  # noqa: E402
import booksync  # noqa: E402

HEADER = """\
# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---
"""


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def rel(p: Path) -> str:
    """``p`` relative to the repository when it is inside it (shorter messages)."""
    try:
        return p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(p)


def _skip_dir(p: Path) -> bool:
    return any(part in (".ipynb_checkpoints", "build") for part in p.parts)


def ipynb_files(root: Path = NOTEBOOKS) -> list[Path]:
    return sorted(p for p in root.rglob("*.ipynb") if not _skip_dir(p.relative_to(root)))


def py_files(root: Path = NOTEBOOKS) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not _skip_dir(p.relative_to(root)))


def chapter_py(root: Path = NOTEBOOKS) -> list[Path]:
    """``NN_*.py`` chapters and ``solutions/NN_*_solutions.py``."""
    files = [p for p in sorted(root.glob("*.py")) if re.match(r"\d{2}_", p.name)]
    files += [
        p for p in sorted((root / "solutions").glob("*.py")) if re.match(r"\d{2}_.*_solutions\.py$", p.name)
    ]
    return files


def cells_of(path: Path) -> list[tuple[str, str]]:
    nb = jupytext.read(path)
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def pair_problems(root: Path) -> list[str]:
    problems = []
    ipynbs, pys = ipynb_files(root), py_files(root)
    for nb in ipynbs:
        if not nb.with_suffix(".py").exists():
            problems.append(f"{rel(nb)}: no paired .py (jupytext --set-formats ipynb,py:percent {rel(nb)})")
    for py in pys:
        if not py.with_suffix(".ipynb").exists():
            problems.append(f"{rel(py)}: no paired .ipynb (python tools/book.py refresh {rel(py)})")
    for nb in ipynbs:
        py = nb.with_suffix(".py")
        if not py.exists():
            continue
        a, b = cells_of(nb), cells_of(py)
        if a != b:
            first = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
            )
            problems.append(
                f"{rel(nb)}: .ipynb and .py differ ({len(a)} vs {len(b)} cells, first difference at cell "
                f"{first}); run `jupytext --sync {rel(py)}`"
            )
    return problems


def markdown_headings(nb: nbformat.NotebookNode) -> list[str]:
    heads = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", line)
                if m:
                    heads.append(m.group(1))
    return heads


def has_heading(heads: list[str], name: str) -> bool:
    """A heading named ``name``, allowing a number in front ("7. Summary") and words after it."""
    pat = re.compile(rf"^(?:[\d.\s·:-]+)?{re.escape(name)}\b", re.I)
    return any(pat.match(h.strip("*_ ")) for h in heads)


def execution_problems(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    unrun = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if cell.get("execution_count") is None:
            unrun.append(i)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(
                    f"{rel(path)}: cell {i} has an error output: {out.get('ename')}: {out.get('evalue')}"
                )
            if book.WIDGET_MIME in out.get("data", {}):  # a progress bar, stored at 0%
                problems.append(f"{rel(path)}: cell {i} keeps a progress bar's widget output "
                                f"(python tools/book.py refresh drops them)")
    if unrun:
        problems.append(
            f"{rel(path)}: cells {unrun} were not executed (run `python tools/book.py refresh {rel(path)}`)"
        )
    if code and not any(c.get("outputs") for c in code):
        problems.append(f"{rel(path)}: no code cell has an output (outputs stripped?)")
    return problems


def structure_problems(root: Path) -> list[str]:
    """Chapters end with Summary/Exercises/References; exercises imply a must-pass solution."""
    problems = []
    for nb_path in sorted(root.glob("*.ipynb")):
        if not re.match(r"\d{2}_", nb_path.name):
            continue
        nb = nbformat.read(nb_path, as_version=4)
        heads = markdown_headings(nb)
        for name in ("Summary", "Exercises", "References"):
            if not has_heading(heads, name):
                problems.append(f"{rel(nb_path)}: no heading named {name!r}")
        source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        if "exercises.check(" in source:
            nn = nb_path.name[:2]
            sols = sorted((root / "solutions").glob(f"{nn}_*_solutions.ipynb"))
            if not sols:
                problems.append(
                    f"{rel(nb_path)}: calls exercises.check( but solutions/{nn}_*_solutions.ipynb is missing"
                )
            for sol in sols:
                sol_nb = nbformat.read(sol, as_version=4)
                text = "\n".join(c.source for c in sol_nb.cells if c.cell_type == "code")
                if "must_pass=True" not in text:
                    problems.append(f"{rel(sol)}: solutions must call exercises.check(..., must_pass=True)")
    return problems


def make_pair(folder: Path, name: str, body: str, execute_outputs: bool = True) -> tuple[Path, Path]:
    """Write ``name.py`` (percent format) and its ``.ipynb``; fake outputs on code cells."""
    folder.mkdir(parents=True, exist_ok=True)
    py = folder / f"{name}.py"
    py.write_text(HEADER + "\n" + textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    nb = jupytext.read(py)
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            n += 1
            cell.execution_count = n if execute_outputs else None
            cell.outputs = [nbformat.v4.new_output("stream", text="ok\n")] if execute_outputs else []
    ipynb = py.with_suffix(".ipynb")
    jupytext.write(nb, ipynb)
    return py, ipynb


CHAPTER_BODY = """
# %% [markdown]
# # 03 · A chapter

# %%
from tfmlib import config
import tfmlib.data
print(config.PROFILES)

# %% [markdown]
# ## Summary
#
# ## Exercises

# %%
exercises.check("03.thing", thing)

# %% [markdown]
# ## References
"""


# ---------------------------------------------------------------------------------------------
# the real notebooks
# ---------------------------------------------------------------------------------------------


def test_notebooks_are_jupytext_pairs_with_the_same_cells():
    problems = pair_problems(NOTEBOOKS)
    assert not problems, "\n".join(problems)


def test_marked_cells_match_the_package():
    drifts = booksync.check(booksync.notebook_py_files(NOTEBOOKS))
    assert not drifts, "\n\n".join(d.report() for d in drifts) + "\nrun: python tools/booksync.py --write"


def test_progressive_imports():
    problems = booksync.progressive_violations(chapter_py(NOTEBOOKS), PACKAGE)
    assert not problems, "\n".join(problems)


def test_every_module_names_its_chapter():
    modules = booksync.package_modules(PACKAGE)
    assert modules, "tfmlib has no modules"
    problems = []
    for name, path in modules.items():
        introduced, doc = booksync.module_info(path)
        if introduced is None:
            problems.append(f"tfmlib/{name}: no module constant INTRODUCED_IN = NN")
        if not doc or "chapter" not in doc.lower():
            problems.append(f"tfmlib/{name}: the module docstring must name the chapter that introduces it")
    assert not problems, "\n".join(problems)


def test_committed_notebooks_are_executed_without_errors():
    problems = [p for nb in ipynb_files(NOTEBOOKS) for p in execution_problems(nb)]
    assert not problems, "\n".join(problems)


def test_chapters_have_summary_exercises_references_and_solutions():
    problems = structure_problems(NOTEBOOKS)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# the checks themselves, on tiny notebooks: each can fail
# ---------------------------------------------------------------------------------------------


def test_pair_check_catches_missing_and_differing_pairs(tmp_path):
    py, ipynb = make_pair(tmp_path, "00_a", "# %%\nx = 1\n")
    assert pair_problems(tmp_path) == []
    (tmp_path / "01_only.py").write_text(HEADER + "\n# %%\ny = 2\n", encoding="utf-8")
    py.write_text(py.read_text(encoding="utf-8").replace("x = 1", "x = 2"), encoding="utf-8")
    problems = pair_problems(tmp_path)
    assert any("01_only.py: no paired .ipynb" in p for p in problems), problems
    assert any("00_a.ipynb: .ipynb and .py differ" in p for p in problems), problems


PROBE = '''\
"""A stand-in tfmlib module for the booksync tests."""


def double(x: int) -> int:
    """Twice x."""
    return 2 * x


class Box:
    """A box."""

    def __init__(self, w: float, h: float) -> None:
        self.w, self.h = w, h

    def area(self) -> float:
        return self.w * self.h
'''


@pytest.fixture
def probe(tmp_path_factory, monkeypatch):
    """A module ``tfmlib.probe`` loaded from a file, so getsource works and tfmlib stays untouched."""
    import importlib.util

    import tfmlib

    path = tmp_path_factory.mktemp("probe_src") / "probe.py"
    path.write_text(PROBE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tfmlib.probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "tfmlib.probe", module)
    monkeypatch.setattr(tfmlib, "probe", module, raising=False)
    return module


def test_booksync_detects_drift_and_write_repairs_both_files(tmp_path, probe):
    name = "tfmlib.probe.double"
    body = f"""
    # %% [markdown]
    # # 01 · Sync

    # %%
    # tfmlib-source: {name}
    def stale():
        return "edited by hand"

    # %%
    print("untouched")
    """
    py, ipynb = make_pair(tmp_path, "01_sync", body)
    cells = booksync.find_marked_cells(py)
    assert [c.name for c in cells] == [name]
    drifts = booksync.check([py])
    assert len(drifts) == 1 and not drifts[0].missing
    assert "edited by hand" in drifts[0].diff and drifts[0].diff.startswith("---")
    assert booksync.main(["--check", str(py)]) == 1

    written = booksync.write([py])
    assert set(written) == {py, ipynb}
    assert booksync.check([py]) == []
    assert booksync.main(["--check", str(py)]) == 0
    # the ipynb got the new source and kept the outputs of the other cells
    nb = nbformat.read(ipynb, as_version=4)
    marked = [c for c in nb.cells if c.source.startswith("# tfmlib-source:")]
    assert marked and "edited by hand" not in marked[0].source
    untouched = [c for c in nb.cells if "untouched" in c.source]
    assert untouched[0].outputs, "write() dropped the outputs of an unchanged cell"
    assert pair_problems(tmp_path) == []
    assert booksync.write([py]) == []  # idempotent


def test_booksync_reports_names_that_do_not_exist(tmp_path):
    body = """
    # %%
    # tfmlib-source: tfmlib.config.no_such_thing
    def no_such_thing():
        pass

    # %%
    # tfmlib-source: tfmlib.no_such_module.Thing
    class Thing:
        pass
    """
    py, _ = make_pair(tmp_path, "02_missing", body)
    drifts = booksync.check([py])
    assert [d.missing for d in drifts] == [True, True], drifts
    assert "no_such_thing" in drifts[0].diff
    with pytest.raises(LookupError):
        booksync.write([py])


def test_booksync_handles_functions_classes_and_methods(probe):
    assert booksync.package_source("tfmlib.probe.double").startswith("def double(x: int) -> int:")
    cls = booksync.package_source("tfmlib.probe.Box")
    assert cls.startswith("class Box:") and "def area" in cls
    method = booksync.package_source("tfmlib.probe.Box.area")
    assert method == "def area(self) -> float:\n    return self.w * self.h\n"  # dedented
    with pytest.raises(LookupError, match="has no attribute 'volume'"):
        booksync.package_source("tfmlib.probe.Box.volume")
    with pytest.raises(LookupError):
        booksync.package_source("tfmlib.probe")  # a marker names an object inside a module


def test_progressive_check_reports_a_too_early_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""pkg"""\n')
    (pkg / "config.py").write_text('"""Introduced in chapter 00."""\nINTRODUCED_IN = 0\n')
    (pkg / "data.py").write_text('"""Introduced in chapter 00."""\nINTRODUCED_IN = 0\n')
    (pkg / "attention.py").write_text('"""Introduced in chapter 05."""\nINTRODUCED_IN = 5\n')
    (pkg / "nochapter.py").write_text('"""No constant."""\n')
    nbdir = tmp_path / "notebooks"
    make_pair(nbdir, "03_chapter", CHAPTER_BODY)
    ok = nbdir / "03_chapter.py"
    assert booksync.progressive_violations([ok], pkg) == []

    bad = nbdir / "03_early.py"
    bad.write_text(
        HEADER
        + "\n# %%\nfrom tfmlib.attention import attend\n\n# %%\nfrom tfmlib import nochapter, __version__\n"
        + "\n# %%\nimport tfmlib.ghost\n",
        encoding="utf-8",
    )
    problems = booksync.progressive_violations([bad], pkg)
    assert any("chapter 03 imports tfmlib.attention, introduced in chapter 05" in p for p in problems), (
        problems
    )
    assert any("tfmlib.nochapter has no INTRODUCED_IN" in p for p in problems), problems
    assert any("tfmlib.ghost, which does not exist" in p for p in problems), problems
    assert len(problems) == 3, problems

    late = nbdir / "solutions" / "05_attn_solutions.py"
    late.parent.mkdir()
    late.write_text(HEADER + "\n# %%\nfrom tfmlib import attention\n", encoding="utf-8")
    assert booksync.progressive_violations([late], pkg) == []
    assert booksync.chapter_of(late) == 5


def test_import_parser_forms():
    src = (
        "import tfmlib.rnn as r\nfrom tfmlib.data import Vocab\n"
        "from tfmlib import config, plot\nimport tfmlib\n"
    )
    assert sorted(m for m, _ in booksync.tfmlib_imports(src)) == ["config", "data", "plot", "rnn"]
    # a file that does not parse (a stray magic) still gets its imports read
    broken = "%time x = 1\nfrom tfmlib.train import fit\n"
    assert [m for m, _ in booksync.tfmlib_imports(broken)] == ["train"]
    ast.parse("x = 1")
    # an import only a type checker reads loads nothing; its else branch does run
    hinted = (
        "from typing import TYPE_CHECKING\nimport typing\n"
        "if TYPE_CHECKING:\n    from tfmlib.kv_cache import C\n"
        "if typing.TYPE_CHECKING:\n    import tfmlib.lm\nelse:\n    from tfmlib.rnn import GRU\n"
        "if True:\n    from tfmlib.train import fit\n"
    )
    assert sorted(m for m, _ in booksync.tfmlib_imports(hinted)) == ["rnn", "train"]


def test_marked_cells_do_not_count_as_the_chapters_imports():
    nb = (
        "# %%\nfrom tfmlib.rnn import GRU\n\n"
        "# %%\n# tfmlib-source: tfmlib.transformer.Transformer\nclass Transformer:\n"
        "    def encode(self):\n        from tfmlib.kv_cache import DecoderCache\n\n"
        "# %%\nfrom tfmlib.lm import DecoderLM\n"
    )
    kept = booksync.without_marked_cells(nb)
    assert kept.count("\n") == nb.count("\n"), "line numbers must be kept"
    assert sorted(m for m, _ in booksync.tfmlib_imports(kept)) == ["lm", "rnn"]


def test_execution_and_structure_checks_can_fail(tmp_path):
    nbdir = tmp_path / "notebooks"
    _, good = make_pair(nbdir, "03_chapter", CHAPTER_BODY)
    assert execution_problems(good) == []
    problems = structure_problems(nbdir)
    assert any("solutions/03_*_solutions.ipynb is missing" in p for p in problems), problems

    make_pair(nbdir / "solutions", "03_chapter_solutions", '# %%\nexercises.check("03.thing", f)\n')
    problems = structure_problems(nbdir)
    assert any("must_pass=True" in p for p in problems), problems
    make_pair(
        nbdir / "solutions", "03_chapter_solutions", '# %%\nexercises.check("03.thing", f, must_pass=True)\n'
    )
    assert structure_problems(nbdir) == []

    _, unrun = make_pair(
        nbdir, "04_unrun", "# %% [markdown]\n# # 04 · x\n\n# %%\nx = 1\n", execute_outputs=False
    )
    assert any("not executed" in p for p in execution_problems(unrun))
    assert any("no heading named 'Summary'" in p for p in structure_problems(nbdir))

    nb = nbformat.read(good, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[])]
    nbformat.write(nb, good)
    assert any("error output: ValueError: boom" in p for p in execution_problems(good))


def test_heading_names():
    assert has_heading(["7. Summary"], "Summary")
    assert has_heading(["summary"], "Summary")
    assert has_heading(["Exercises: questions and code"], "Exercises")
    assert not has_heading(["Summaryish"], "Summary")
    assert not has_heading(["A summary of results"], "Summary")


def test_readme_times_table_is_rewritten_between_markers(tmp_path):
    import book

    readme = tmp_path / "README.md"
    readme.write_text(f"# Book\n\n{book.README_TIMES_START}\nold table\n{book.README_TIMES_END}\n\nend\n")
    data = {"notebooks/01_x.ipynb": {"seconds": 47.25, "profile": "cpu", "cpu_count": 2,
                                     "torch": "2.13.0", "date": "2026-11-22"}}
    book.update_readme_times(readme, data)
    once = readme.read_text()
    book.update_readme_times(readme, data)
    assert readme.read_text() == once, "rewriting must be idempotent"
    assert "old table" not in once and once.endswith("end\n")
    assert "| `notebooks/01_x.ipynb` | cpu | 47.2 | 2 | 2.13.0 | 2026-11-22 |" in once
    readme.write_text(f"takes {book.README_TOTAL_START}?{book.README_TOTAL_END} in all\n{once}")
    data["notebooks/02_x.ipynb"] = {**data["notebooks/01_x.ipynb"], "seconds": 100.0}
    data["notebooks/03_x.ipynb"] = {**data["notebooks/01_x.ipynb"], "seconds": 900.0, "profile": "gpu"}
    book.update_readme_times(readme, data)
    text = readme.read_text()
    assert text.startswith(f"takes {book.README_TOTAL_START}about 2 minutes"), text


def test_readme_times_match_the_recorded_json():
    import json

    import book

    times = json.loads(book.TIMES_FILE.read_text())
    readme = (book.REPO_ROOT / "README.md").read_text()
    assert book.times_table(times) in readme, "run `python tools/book.py refresh` to update README"
    total = book.README_TOTAL_START + book.total_time_text(times) + book.README_TOTAL_END
    assert total in readme, f"the README's total time should read {total!r}"


def test_execute_shuts_down_the_kernel_it_started(tmp_path, monkeypatch):
    """A build runs 18 notebooks: each kernel must end with its notebook, not with the build."""
    import book
    from jupyter_core.utils import run_sync

    managers = []
    make_manager = book.current_env_kernel_manager

    def recording_manager():
        managers.append(make_manager())
        return managers[-1]

    monkeypatch.setattr(book, "current_env_kernel_manager", recording_manager)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1 + 1)")])
    result = book.execute(nb, tmp_path, "smoke", timeout=120)
    assert result.ok, result.error
    assert nb.cells[0].outputs[0]["text"].strip() == "2"
    assert len(managers) == 1, "execute should start exactly one kernel"
    assert not run_sync(managers[0].is_alive)(), "the notebook's kernel is still running after execute()"


def private_imports(py_files: list[Path]) -> list[str]:
    """``file:line: name`` for every private name a notebook imports from tfmlib."""
    found = []
    for path in py_files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfmlib"):
                found += [f"{rel(path)}:{node.lineno}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    return found


def test_notebooks_import_no_private_names(tmp_path):
    """A chapter shows what it needs (a marked cell) or imports a public name, never ``_private``."""
    problems = private_imports(py_files())
    assert not problems, "notebooks import private tfmlib names:\n" + "\n".join(problems)
    bad = tmp_path / "01_x.py"
    bad.write_text("from tfmlib.positional import _check_base, sinusoidal_encoding\n")
    assert private_imports([bad]) == [f"{rel(bad)}:1: tfmlib.positional._check_base"]


def test_index_descriptions_render_code_spans():
    import book

    assert book.inline_code("equal to `nn.GRU` & <x>") == "equal to <code>nn.GRU</code> &amp; &lt;x&gt;"


def test_refresh_exercise_cells_reruns_only_the_exercises(tmp_path):
    """``refresh --exercise-cells``: the exercise cells run on the imports and definitions above
    them; every other output stays as the last full refresh left it; a cell that needs a computed
    value is refused."""
    import book

    def notebook(exercise_source: str) -> Path:
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell("import math\nvalue = abs(-41)\ndef half(x):\n    return x / 2",
                                      execution_count=1,
                                      outputs=[nbformat.v4.new_output("stream", text="from the full run\n")]),
            nbformat.v4.new_markdown_cell("## Exercises"),
            nbformat.v4.new_code_cell(exercise_source),
        ])
        path = tmp_path / "01_x.ipynb"
        nbformat.write(nb, path)
        path.with_suffix(".py").unlink(missing_ok=True)
        return path

    path = notebook("print(half(math.sqrt(64)))")
    assert book.refresh_exercise_cells(path, "smoke", timeout=120) is None
    cells = nbformat.read(path, as_version=4).cells
    assert cells[0].outputs[0]["text"] == "from the full run\n", "a cell above the exercises was re-run"
    assert cells[2].outputs[0]["text"] == "4.0\n" and cells[2].execution_count == 2
    assert path.with_suffix(".py").exists(), "the pair is written"

    py = path.with_suffix(".py")
    py.write_text(py.read_text().replace("math.sqrt(64)", "math.sqrt(25)"))  # edited, not synced
    assert "hold different cells" in book.refresh_exercise_cells(path, "smoke", timeout=120)

    path = notebook("print(value + 1)")  # needs a computed value above: not a definition
    before = path.read_text()
    assert "failed on the definitions alone" in book.refresh_exercise_cells(path, "smoke", timeout=120)
    assert path.read_text() == before, "a refused notebook must be left untouched"


def test_notebook_text_has_no_control_characters():
    """A TeX command written through a Python string lost its backslash once: ``\\tilde`` became a
    TAB and 'ilde', ``\\big`` a backspace, and MathJax showed nonsense. No notebook or solution holds
    a control character other than the newline."""
    import unicodedata

    problems = []
    for py in sorted(NOTEBOOKS.rglob("*.py")):
        text = py.read_text(encoding="utf-8")
        for lineno, line in enumerate(text.splitlines(), 1):
            bad = sorted({repr(ch) for ch in line if unicodedata.category(ch) == "Cc"})
            if bad:
                problems.append(f"{rel(py)}:{lineno}: {', '.join(bad)}")
    assert not problems, "control characters (a lost backslash?):\n" + "\n".join(problems)


def test_drop_progress_bars_keeps_everything_else():
    bar = nbformat.v4.new_output("display_data", data={book.WIDGET_MIME: {"model_id": "x"},
                                                       "text/plain": "train 1/3:   0%|          | 0/782"})
    printed = nbformat.v4.new_output("stream", name="stdout", text="BLEU 25.2\n")
    figure = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})
    cell = nbformat.v4.new_code_cell("fit(...)", outputs=[bar, printed, figure])
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_markdown_cell("text")])
    assert book.drop_progress_bars(nb) == 1
    assert nb.cells[0].outputs == [printed, figure]
    book.strip_volatile(nb)
    assert book.drop_progress_bars(nb) == 0, "strip_volatile (what refresh does) drops them too"

"""Execute the book's notebooks: build the HTML book, or refresh the committed outputs.

    python tools/book.py build   [--profile P] [--out build]      # readers: copies, HTML, index
    python tools/book.py refresh [--profile cpu] [NOTEBOOK ...]   # developers: in place, timed

``build`` copies ``notebooks/*.ipynb`` and ``notebooks/solutions/*.ipynb`` to ``build/notebooks/``
(the files in ``notebooks/`` are never written: a reader's edits are safe), executes the copies
in order and writes the executed notebooks and their HTML to ``build/html/`` with an
``index.html`` (title, profile, device; per notebook its time and status). A notebook that fails
is still rendered up to its error and marked failed; the command then exits 1.

``refresh`` re-executes committed notebooks in place (default: every chapter and solution; the
``cpu`` profile), writes the ``.ipynb`` with its outputs and its paired jupytext ``.py``, and
records each notebook's wall time with the profile, CPU count and torch version in
``benchmarks/results/notebook_times.json`` (entries of notebooks not re-run are kept). A notebook
with an error output is not written: the error is reported and the file left untouched.

Both run every notebook in a fresh kernel of *this* interpreter (the kernel spec is ipykernel's
own, built from ``sys.executable``, so no registered kernel is needed), with the working
directory set to the notebook's folder and ``TFM_PROFILE`` in its environment.
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime as _dt
import html
import json
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata as _metadata
from pathlib import Path

import jupytext
import nbformat

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO_ROOT / "notebooks"
TIMES_FILE = REPO_ROOT / "benchmarks" / "results" / "notebook_times.json"
BOOK_TITLE = "From GRU to Transformer"
PAIRED_FORMATS = "ipynb,py:percent"
DEFAULT_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime")
CHAPTER_RE = re.compile(r"^(?P<nn>\d{2})_")
TEMPLATE_DIR = REPO_ROOT / "tools" / "book_template"  # nbconvert template "book" (navigation, MathJax)
FIGURES = "figures"  # notebooks/figures/: the diagrams, copied beside the HTML pages
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
SMOKE_BANNER = (
    "This page was built in the <b>smoke</b> profile: models and data are toy-sized so that the "
    "whole book runs in minutes, and its numbers, figures and translations say nothing about the "
    "methods. The committed notebooks carry a <code>cpu</code> run; build one with "
    "<code>bash run.sh book cpu</code>."
)


# ---------------------------------------------------------------------------------------------
# The executor shared by build and refresh
# ---------------------------------------------------------------------------------------------


def current_env_kernel_manager():
    """An async kernel manager whose ``python3`` kernel is ipykernel in this interpreter."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class CurrentEnvSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):  # every name resolves to this interpreter
            return self.kernel_spec_class(
                resource_dir=ipykernel.kernelspec.RESOURCES, **ipykernel.kernelspec.get_kernel_dict()
            )

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=CurrentEnvSpecs())


def shutdown_kernel(km) -> None:
    """Stop ``km``'s kernel now if it is still running.

    nbclient shuts down only the kernels of managers it created itself; ``execute`` passes its own
    manager (to pin the interpreter), so without this every notebook's kernel, with its tensors,
    would stay alive until the whole build ends (18 kernels, several GB).
    """
    from jupyter_core.utils import run_sync

    if run_sync(km.is_alive)():
        run_sync(km.shutdown_kernel)(now=True)


@dataclass
class Result:
    """What executing one notebook gave."""

    nb: nbformat.NotebookNode
    seconds: float
    error: str | None = None  # a one-line description of the first error, None if it ran clean
    error_cell: int | None = None
    details: str = ""  # the traceback of the error, for the console

    @property
    def ok(self) -> bool:
        return self.error is None


def clear_outputs(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None


def drop_progress_bars(nb: nbformat.NotebookNode) -> int:
    """Remove the progress bars' outputs (ipywidgets, from ``tqdm.auto``) from ``nb``; returns how
    many. A stored bar is a widget view whose only text is the bar as it was drawn first, at 0%:
    on the code host, in a Markdown export and anywhere without a widget manager, a reader sees
    runs that seem never to have started, right above their results. A finished bar says nothing
    the printed results do not."""
    dropped = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            kept = [o for o in cell.get("outputs", []) if WIDGET_MIME not in o.get("data", {})]
            dropped += len(cell.get("outputs", [])) - len(kept)
            cell.outputs = kept
    return dropped


def strip_volatile(nb: nbformat.NotebookNode) -> None:
    """Drop what changes on every run or cannot be shown without a live kernel: execution
    timestamps, widget state, progress bars (:func:`drop_progress_bars`)."""
    for cell in nb.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
    nb.metadata.pop("widgets", None)
    drop_progress_bars(nb)


def first_error(nb: nbformat.NotebookNode) -> tuple[int, str, str] | None:
    """(cell index, 'Name: value', traceback) of the first error output, or None."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                tb = "\n".join(out.get("traceback", []))
                tb = re.sub(r"\x1b\[[0-9;]*m", "", tb)  # no ANSI colours in reports
                return i, f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip(), tb
    return None


def execute(
    nb: nbformat.NotebookNode,
    cwd: Path,
    profile: str,
    timeout: int = 3600,
    store_widget_state: bool = True,
) -> Result:
    """Execute ``nb`` (in memory) in a fresh kernel of this interpreter, cwd = ``cwd``.

    Outputs are cleared first, so a failed run shows nothing stale after its error.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    clear_outputs(nb)
    nb.metadata.setdefault("kernelspec", dict(DEFAULT_KERNELSPEC))
    os.environ["TFM_PROFILE"] = profile  # the kernel inherits this environment
    os.environ.pop("MPLBACKEND", None)  # let ipykernel pick the inline backend: figures show
    km = current_env_kernel_manager()
    client = NotebookClient(
        nb,
        km=km,
        timeout=timeout,
        startup_timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
        record_timing=False,
        store_widget_state=store_widget_state,
        allow_errors=False,
        # ipykernel warns on every start that TCP is unencrypted (it is local); keep the console clean
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    start = time.perf_counter()
    error = details = None
    try:
        client.execute()
    except CellExecutionError as exc:
        error, details = "CellExecutionError", str(exc)
    except (CellTimeoutError, DeadKernelError, TimeoutError, RuntimeError) as exc:
        error, details = f"{type(exc).__name__}: {exc}", str(exc)
    finally:
        seconds = time.perf_counter() - start
        shutdown_kernel(km)
    result = Result(nb, seconds)
    found = first_error(nb)
    if found is not None:
        result.error_cell, result.error, result.details = found
    elif error is not None:
        result.error, result.details = error.splitlines()[0][:300], details or ""
    return result


# ---------------------------------------------------------------------------------------------
# Notebook discovery and metadata
# ---------------------------------------------------------------------------------------------


def chapter_notebooks(notebooks_dir: Path, suffix: str = ".ipynb") -> tuple[list[Path], list[Path]]:
    """(chapters, solutions): the notebooks of ``notebooks_dir`` and its ``solutions/``, sorted."""
    chapters = sorted(notebooks_dir.glob(f"*{suffix}"))
    solutions = sorted((notebooks_dir / "solutions").glob(f"*{suffix}"))
    return chapters, solutions


def notebook_sources(notebooks_dir: Path) -> list[Path]:
    """The chapters' jupytext ``.py`` files, then the solutions', each sorted: what the static
    tests of the notebooks read."""
    chapters, solutions = chapter_notebooks(notebooks_dir, ".py")
    return chapters + solutions


def code_lines(source: str) -> list[str]:
    """A code cell's ``source`` as Python lines: IPython magics and shell lines (``%...``,
    ``!...``) blanked, so that ``ast.parse`` reads it and line numbers stay the cell's."""
    return ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]


def notebook_code(path: Path) -> str:
    """A notebook's code cells (read with jupytext, ``.py`` or ``.ipynb``), in order, as one Python
    source (:func:`code_lines` of each)."""
    nb = jupytext.read(path)
    cells = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return "\n".join(line for source in cells for line in code_lines(source))


def notebook_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The first markdown heading of ``nb`` (without the #s), else ``fallback``."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            m = re.match(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", line)
            if m:
                return m.group(1)
    return fallback


def chapter_number(path: Path) -> str:
    m = CHAPTER_RE.match(path.name)
    return m.group("nn") if m else ""


def default_profile() -> str:
    """The profile the notebooks will pick (``TFM_PROFILE``, else by hardware), as tfmlib.config says."""
    sys.path.insert(0, str(REPO_ROOT))
    from tfmlib.config import active_profile

    try:
        return active_profile()
    except ValueError as exc:  # a mistyped TFM_PROFILE: say so before starting any kernel
        raise SystemExit(f"book: {exc}") from exc


def describe_device() -> str:
    """The device the notebooks will pick (tfmlib.config.pick_device), in words."""
    try:
        sys.path.insert(0, str(REPO_ROOT))
        import torch

        from tfmlib.config import pick_device

        dev = pick_device()
        if dev.type == "cuda":
            return f"cuda ({torch.cuda.get_device_name(dev)})"
        return f"{dev.type} ({os.cpu_count()} CPU cores)"
    except Exception as exc:  # the index still gets written
        return f"unknown ({type(exc).__name__}: {exc})"


def torch_version() -> str:
    try:
        return _metadata.version("torch")
    except _metadata.PackageNotFoundError:
        return "not installed"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s:.1f} s" if s < 90 else f"{int(s // 60)} min {int(s % 60):02d} s"


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    number: str
    title: str
    html: str  # relative link from index.html
    ipynb: str
    seconds: float | None
    status: str
    ok: bool
    extra: dict = field(default_factory=dict)


MATHJAX_CONFIG = "?config=TeX-AMS-MML_HTMLorMML-full,Safe"


def install_mathjax(html_dir: Path) -> Path | None:
    """Copy MathJax (from the ``jupyter-server-mathjax`` package) beside the HTML pages.

    nbconvert's pages load MathJax from a CDN by default, so offline readers would see raw LaTeX.
    Returns the folder it was copied to, or None (then pages fall back to the CDN) when the
    package is not installed.
    """
    try:
        import jupyter_server_mathjax
    except ImportError:
        print("book: jupyter-server-mathjax not installed; the HTML loads MathJax from its CDN")
        return None
    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    target = html_dir / "mathjax"
    if not (target / "MathJax.js").is_file():
        shutil.copytree(static, target, dirs_exist_ok=True)
    return target


def render_html(nb: nbformat.NotebookNode, title: str, mathjax_url: str | None = None,
                book: dict | None = None) -> str:
    """The page of ``nb``: nbconvert's lab page through the book's template (``tools/book_template``).

    ``book`` carries the navigation (see :func:`page_navigation`); without it the page has none.
    """
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="book", extra_template_basedirs=[str(TEMPLATE_DIR)],
        exclude_input_prompt=True, exclude_output_prompt=True,
    )
    if mathjax_url:
        exporter.mathjax_url = mathjax_url
    body, _ = exporter.from_notebook_node(
        prepare_for_html(nb, (book or {}).get("readme_href")),
        resources={"metadata": {"name": title}, "book": book or {}},
    )
    return body


_LOCAL_NOTEBOOK_LINK = re.compile(r"(\]\((?!https?:|#)[^)\s]+?)\.ipynb(#[^)\s]*)?\)")


_README_LINK = re.compile(r"\]\((?:\.\./)+README\.md(#[^)\s]*)?\)")


def prepare_for_html(nb: nbformat.NotebookNode, readme_href: str | None = None) -> nbformat.NotebookNode:
    """A copy of ``nb`` fit for a static page.

    * progress bars (ipywidgets) are dropped: offline there is no widget manager to draw them,
      and a finished bar says nothing a reader needs;
    * Markdown links to the book's notebooks (``[x](solutions/y.ipynb)``) point to their pages, and
      links to the repository's README (``../README.md``) to its page, ``readme_href``.
    """
    import copy

    nb = copy.deepcopy(nb)
    drop_progress_bars(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _LOCAL_NOTEBOOK_LINK.sub(lambda m: f"{m.group(1)}.html{m.group(2) or ''})",
                                                   cell.source)
            if readme_href:  # the repository's README (../README.md from a chapter) is a page of the book
                cell.source = _README_LINK.sub(lambda m: f"]({readme_href}{m.group(1) or ''})", cell.source)
    nb.metadata.pop("widgets", None)
    return nb


def chapter_toc(nb: nbformat.NotebookNode, level: int = 2) -> list[dict[str, str]]:
    """The ``level`` headings of ``nb`` as ``{"anchor", "text"}``, with nbconvert's own anchor ids."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    toc = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        in_code = False
        for line in cell.source.splitlines():
            if line.lstrip().startswith("```"):
                in_code = not in_code
            m = re.match(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$", line)
            if in_code or not m or len(m.group(1)) != level:
                continue
            rendered = markdown2html_mistune(line.strip())
            anchor = re.search(r'\bid="([^"]+)"', rendered)
            text = html.unescape(re.sub(r"<[^>]+>", "", rendered)).replace("\u00b6", "").strip()
            if anchor:
                toc.append({"anchor": html.unescape(anchor.group(1)), "text": text})
    return toc


@dataclass
class Page:
    """One page of the HTML book."""

    kind: str  # "chapters" or "solutions"
    src: Path  # the notebook it is made from
    sub: Path  # its folder below the HTML root: Path() or Path("solutions")
    title: str

    @property
    def href(self) -> str:  # from the HTML root
        return (self.sub / (self.src.stem + ".html")).as_posix()


def _href(page_sub: Path, target: str) -> str:
    """``target`` (relative to the HTML root) as a link from a page in ``page_sub``."""
    return Path(os.path.relpath(target, page_sub.as_posix() or ".")).as_posix()


def page_navigation(pages: list[Page], i: int, profile: str) -> dict:
    """What the template shows around page ``i``: previous/next page of the same kind, the index,
    the companion page (a chapter's solutions, a solution's chapter), the chapter's contents, and
    the smoke-profile banner."""
    page = pages[i]
    same = [p for p in pages if p.kind == page.kind]
    j = same.index(page)

    def link(p: Page | None) -> dict | None:
        return None if p is None else {"href": _href(page.sub, p.href), "title": p.title}

    number = chapter_number(page.src)
    companion = None
    for p in pages:
        if p is not page and p.kind != page.kind and chapter_number(p.src) == number:
            companion = {"href": _href(page.sub, p.href),
                         "title": "Solutions" if p.kind == "solutions" else "The chapter"}
    return {
        "prev": link(same[j - 1] if j > 0 else None),
        "next": link(same[j + 1] if j + 1 < len(same) else None),
        "index_href": _href(page.sub, "index.html"),
        "readme_href": _href(page.sub, README_PAGE),
        "companion": companion,
        "banner": SMOKE_BANNER if profile == "smoke" else "",
    }


README_PAGE = "readme.html"


def write_readme_page(readme: Path, target: Path) -> None:
    """The repository's README as a page of the book, its links turned into the book's pages.

    Chapters link to the README for what the preface leaves out (real corpora, the package map);
    notebooks become their pages, figures the copied figures, and other files of the repository
    are linked where they are when the book is built inside it (``build/html`` by default).
    """
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    if not readme.exists():
        return
    text = readme.read_text(encoding="utf-8")
    text = re.sub(r"\]\(notebooks/figures/", "](figures/", text)
    text = re.sub(r"\]\(notebooks/([^)#\s]+?)\.ipynb", r"](\1.html", text)
    text = re.sub(r"\]\(notebooks/solutions/\)", "](index.html#solutions)", text)
    to_repo = Path(os.path.relpath(readme.parent, target.parent)).as_posix()
    text = re.sub(r"\]\((?!https?:|#|figures/|[\w/]+\.html|index\.html)([^)\s]+)\)",
                  lambda m: f"]({to_repo}/{m.group(1)})", text)
    body = markdown2html_mistune(text)

    def github_anchor(m: re.Match) -> str:  # the README's own links use the code host's heading ids
        plain = html.unescape(re.sub(r"<[^>]+>", "", m.group(2))).replace("\u00b6", "").strip().lower()
        slug = re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", plain))
        return f'<span id="{html.escape(slug)}"></span>{m.group(0)}'

    body = re.sub(r"<h([1-6])[^>]*>(.*?)</h\1>", github_anchor, body, flags=re.S)
    target.write_text(f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(BOOK_TITLE)}: README</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1.25rem;
       line-height: 1.55; }}
table {{ border-collapse: collapse; }} th, td {{ padding: .3rem .5rem; border-bottom: 1px solid #ddd; }}
pre {{ overflow-x: auto; background: #f6f8fa; padding: .6rem; }} img {{ max-width: 100%; }}
</style>
</head>
<body>
<p><a href="index.html">Contents</a></p>
{body}
</body>
</html>
""", encoding="utf-8")


def chapter_descriptions(readme: Path = REPO_ROOT / "README.md") -> dict[str, str]:
    """Notebook file name -> the one-line description in the README's chapter table."""
    found = {}
    if readme.exists():
        row = re.compile(
            r"^\|\s*\d\d\s*\|\s*\[[^\]]+\]\((?:notebooks/)?([^)]+\.ipynb)\)\s*\|\s*([^|]+?)\s*\|"
        )
        for line in readme.read_text(encoding="utf-8").splitlines():
            m = row.match(line)
            if m:
                found[Path(m.group(1)).name] = m.group(2)
    return found


def inline_code(text: str) -> str:
    """``text`` escaped for HTML, its Markdown `code` spans as <code> (the README's descriptions)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def write_index(path: Path, rows: list[Row], solution_rows: list[Row], profile: str, device: str) -> None:
    def table(rs: list[Row]) -> str:
        if not rs:
            return "<p><em>none</em></p>"
        lines = [
            "<table>",
            "<thead><tr><th>#</th><th>chapter</th><th>what you build and measure</th><th>notebook</th>"
            "<th>time</th><th>status</th></tr></thead>",
            "<tbody>",
        ]
        for r in rs:
            cls = "ok" if r.ok else "failed"
            lines.append(
                f'<tr class="{cls}"><td>{html.escape(r.number)}</td>'
                f'<td><a href="{html.escape(r.html)}">{html.escape(r.title)}</a></td>'
                f'<td>{inline_code(r.extra.get("description", ""))}</td>'
                f'<td><a href="{html.escape(r.ipynb)}">.ipynb</a></td>'
                f"<td>{fmt_seconds(r.seconds)}</td><td>{html.escape(r.status)}</td></tr>"
            )
        lines += ["</tbody>", "</table>"]
        return "\n".join(lines)

    all_rows = rows + solution_rows
    n_failed = sum(not r.ok for r in all_rows)
    total = sum(r.seconds or 0.0 for r in all_rows)
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    summary = (
        f"{len(all_rows)} notebooks, {n_failed} failed" if n_failed else f"{len(all_rows)} notebooks, all ran"
    )
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(BOOK_TITLE)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }}
table {{ border-collapse: collapse; width: 100%; margin-bottom: 2rem; }}
th, td {{ text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #ddd; }}
tr.failed td {{ background: #fde8e8; }}
td:nth-last-child(2) {{ white-space: nowrap; }}
tr.failed td:last-child {{ color: #a00; font-weight: bold; }}
.meta {{ color: #555; }}
</style>
</head>
<body>
<h1>{html.escape(BOOK_TITLE)}</h1>
<p class="meta">Profile <b>{html.escape(profile)}</b> &middot; device <b>{html.escape(device)}</b>
&middot; torch {html.escape(torch_version())} &middot; Python {platform.python_version()}
&middot; built {now} &middot; {summary}, {fmt_seconds(total)} in all.</p>
<p>New here? <a href="readme.html">What this book is, how to run it, and what it measured</a>.</p>
<h2>Chapters</h2>
{table(rows)}
<h2 id="solutions">Solutions to the exercises</h2>
{table(solution_rows)}
</body>
</html>
"""
    path.write_text(page, encoding="utf-8")


def cmd_build(args: argparse.Namespace) -> int:
    notebooks_dir = Path(args.notebooks).resolve()
    out = Path(args.out).resolve()
    if out == notebooks_dir or notebooks_dir in out.parents:
        print(f"book: --out {out} must not be inside {notebooks_dir}", file=sys.stderr)
        return 2
    execute_them = not args.no_execute
    profile = (args.profile or default_profile()) if execute_them else "as committed (cpu)"
    device = describe_device() if execute_them else "as committed"
    chapters, solutions = chapter_notebooks(notebooks_dir)
    if args.only:
        wanted = set(args.only)
        chapters = [p for p in chapters if p.name in wanted or p.stem in wanted]
        solutions = [p for p in solutions if p.name in wanted or p.stem in wanted]
    if not chapters and not solutions:
        print(f"book: no notebooks in {notebooks_dir}", file=sys.stderr)
    copies_dir, html_dir = out / "notebooks", out / "html"
    for d in (copies_dir, html_dir):
        d.mkdir(parents=True, exist_ok=True)
    what = "executing" if execute_them else "rendering the committed outputs of"
    print(f"book: {what} {len(chapters)} chapters, {len(solutions)} solutions; profile {profile}, "
          f"device {device}")
    mathjax_dir = install_mathjax(html_dir)
    if (notebooks_dir / FIGURES).is_dir():  # diagrams, linked from the Markdown as figures/...
        for d in (copies_dir, html_dir):  # the pages, and the executed copies opened in Jupyter
            shutil.copytree(notebooks_dir / FIGURES, d / FIGURES, dirs_exist_ok=True)

    pages = [
        Page(kind, src, sub, notebook_title(nbformat.read(src, as_version=4), src.stem))
        for kind, group, sub in (("chapters", chapters, Path()), ("solutions", solutions, Path("solutions")))
        for src in group
    ]
    rows: dict[str, list[Row]] = {"chapters": [], "solutions": []}
    descriptions = chapter_descriptions()  # the README's one-liners, read once for the index
    for k, page in enumerate(pages):
        src, sub = page.src, page.sub
        copy = copies_dir / sub / src.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, copy)
        nb = nbformat.read(copy, as_version=4)
        print(f"[{k + 1}/{len(pages)}] {sub / src.name} ...", end=" ", flush=True)
        if execute_them:
            result = execute(nb, copy.parent, profile, timeout=args.timeout, store_widget_state=True)
        else:
            found = first_error(nb)
            result = Result(nb, 0.0)
            if found is not None:
                result.error_cell, result.error, result.details = found
        status = "ok" if result.ok else "failed"
        if not result.ok:
            where = f" in cell {result.error_cell}" if result.error_cell is not None else ""
            status = f"failed{where}: {result.error}"
        print(f"{status} ({fmt_seconds(result.seconds)})", flush=True)
        if not result.ok and result.details:
            print(result.details[-3000:], flush=True)
        nbformat.write(result.nb, copy)  # the executed copy, to open in Jupyter
        (html_dir / sub).mkdir(parents=True, exist_ok=True)
        nbformat.write(result.nb, html_dir / sub / src.name)
        try:
            mathjax_url = None
            if mathjax_dir is not None:  # a relative link, so the book also reads from a copied folder
                rel = os.path.relpath(mathjax_dir / "MathJax.js", html_dir / sub)
                mathjax_url = Path(rel).as_posix() + MATHJAX_CONFIG
            book = page_navigation(pages, k, profile)
            book["toc"] = chapter_toc(result.nb)
            html_page = render_html(result.nb, page.title, mathjax_url, book)
        except Exception as exc:  # rendering must not hide the rest of the book
            html_page = (
                f"<html><body><h1>{html.escape(page.title)}</h1>"
                f"<pre>render failed: {html.escape(repr(exc))}</pre>"
            )
            status = f"{status}; HTML render failed"
        (html_dir / page.href).write_text(html_page, encoding="utf-8")
        rows[page.kind].append(
            Row(
                number=chapter_number(src),
                title=page.title,
                html=page.href,
                ipynb=(sub / src.name).as_posix(),
                seconds=result.seconds if execute_them else None,
                status=status,
                ok=result.ok and "render failed" not in status,
                extra={"description": descriptions.get(src.name, "")},
            )
        )
    write_readme_page(REPO_ROOT / "README.md", html_dir / README_PAGE)
    index = html_dir / "index.html"
    write_index(index, rows["chapters"], rows["solutions"], profile, device)
    failed = [r for r in rows["chapters"] + rows["solutions"] if not r.ok]
    print(f"book: index at {index}")
    if failed:
        print(
            f"book: {len(failed)} notebook(s) failed: " + ", ".join(r.ipynb for r in failed), file=sys.stderr
        )
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# refresh
# ---------------------------------------------------------------------------------------------


def _resolve_targets(names: list[str], notebooks_dir: Path) -> list[Path]:
    """.ipynb paths for the given names (.py or .ipynb; default: every chapter and solution)."""
    if not names:
        found: dict[str, Path] = {}
        for suffix in (".ipynb", ".py"):
            for p in sum(chapter_notebooks(notebooks_dir, suffix), []):
                found.setdefault(str(p.with_suffix("")), p.with_suffix(".ipynb"))
        chapters = sorted(p for p in found.values() if p.parent == notebooks_dir)
        return chapters + sorted(p for p in found.values() if p.parent != notebooks_dir)
    targets = []
    for name in names:
        p = Path(name).resolve()
        if p.suffix not in (".ipynb", ".py"):
            raise SystemExit(f"book: {name}: give a .ipynb or its paired .py")
        if not p.exists() and not p.with_suffix(".py").exists():
            raise SystemExit(f"book: {name}: no such notebook")
        targets.append(p.with_suffix(".ipynb"))
    return targets


def read_inputs(ipynb: Path) -> nbformat.NotebookNode:
    """The notebook to execute: the newer of the pair gives the inputs (as ``jupytext --sync``)."""
    py = ipynb.with_suffix(".py")
    if ipynb.exists() and (not py.exists() or ipynb.stat().st_mtime >= py.stat().st_mtime):
        nb = nbformat.read(ipynb, as_version=4)
    else:
        nb = jupytext.read(py)
        if ipynb.exists():  # keep the ipynb's notebook metadata (kernelspec, language_info)
            old = nbformat.read(ipynb, as_version=4)
            for key, value in old.metadata.items():
                nb.metadata.setdefault(key, value)
    nb.metadata.setdefault("jupytext", {})
    nb.metadata.jupytext.pop("text_representation", None)
    if py.exists() or "formats" not in nb.metadata.jupytext:
        nb.metadata.jupytext.setdefault("formats", PAIRED_FORMATS)
    nb.metadata.setdefault("kernelspec", dict(DEFAULT_KERNELSPEC))
    return nb


def write_pair(nb: nbformat.NotebookNode, ipynb: Path) -> None:
    """Write ``ipynb`` and its paired percent ``.py`` from the same notebook."""
    jupytext.write(nb, ipynb)
    jupytext.write(nb, ipynb.with_suffix(".py"), fmt="py:percent")


def record_times(times_file: Path, entries: dict[str, dict]) -> None:
    data = {}
    if times_file.exists():
        try:
            data = json.loads(times_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            print(f"book: {times_file} was not valid JSON; starting it afresh", file=sys.stderr)
    data.update(entries)
    times_file.parent.mkdir(parents=True, exist_ok=True)
    times_file.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n", encoding="utf-8")
    if times_file.resolve() == TIMES_FILE.resolve():
        update_readme_times(REPO_ROOT / "README.md", data)


README_TIMES_START = "<!-- times: filled from notebook_times.json -->"
README_TIMES_END = "<!-- /times -->"


def times_table(data: dict[str, dict]) -> str:
    """The README's markdown table of recorded notebook times."""
    lines = ["| notebook | profile | seconds | CPU cores | torch | recorded |", "|---|---|---|---|---|---|"]
    for name, e in sorted(data.items()):
        lines.append(
            f"| `{name}` | {e.get('profile', '?')} | {e.get('seconds', float('nan')):.1f} | "
            f"{e.get('cpu_count', '?')} | {e.get('torch', '?')} | {e.get('date', '?')} |"
        )
    return "\n".join(lines)


def update_readme_times(readme: Path, data: dict[str, dict]) -> None:
    """Rewrite the table between the README's times markers (nothing happens without them)."""
    if not readme.exists():
        return
    text = readme.read_text(encoding="utf-8")
    start = text.find(README_TIMES_START)
    if start < 0:
        return
    end = text.find(README_TIMES_END, start)
    tail = text[end:] if end >= 0 else README_TIMES_END + "\n" + text[start + len(README_TIMES_START):]
    new = text[:start] + README_TIMES_START + "\n\n" + times_table(data) + "\n\n" + tail
    new = re.sub(re.escape(README_TOTAL_START) + r".*?" + re.escape(README_TOTAL_END),
                 lambda _: README_TOTAL_START + total_time_text(data) + README_TOTAL_END, new)
    readme.write_text(new, encoding="utf-8")


README_TOTAL_START = "<!-- total -->"
README_TOTAL_END = "<!-- /total -->"


def total_time_text(data: dict[str, dict], profile: str = "cpu") -> str:
    """'about N minutes' for executing every recorded notebook of ``profile`` one after another."""
    seconds = sum(e.get("seconds", 0.0) for e in data.values() if e.get("profile") == profile)
    return f"about {max(1, round(seconds / 60))} minutes"


def _key(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.as_posix()


EXERCISES_HEADING = re.compile(r"^#+\s*(?:\d+[.:]?\s*)?Exercises\b", re.M)


#: calls allowed in a literal setting: containers of constants
LITERAL_CALLS = frozenset({"dict", "list", "tuple", "set", "frozenset", "range"})


def is_literal_setting(value: ast.expr) -> bool:
    """Whether ``value`` is made of constants, containers of them and the upper-case names of other
    settings (``dict(a=1, b=[2, 3])``, ``{**SIZES, "a": 1}``, ``dict(CPU_SIZES, seeds=[0])``):
    what a chapter may assign before ``setup()``, since computing it runs nothing."""
    allowed = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.keyword, ast.Starred,
               ast.Load, ast.USub, ast.UnaryOp)
    for n in ast.walk(value):
        if isinstance(n, ast.Call):
            if not (isinstance(n.func, ast.Name) and n.func.id in LITERAL_CALLS):
                return False
        elif isinstance(n, ast.Name):
            if not (n.id in LITERAL_CALLS or n.id.isupper()):
                return False
        elif isinstance(n, ast.UnaryOp) and not isinstance(n.operand, ast.Constant):
            return False
        elif not isinstance(n, allowed):
            return False
    return True


def is_definition(node: ast.stmt) -> bool:
    """Whether a chapter's top-level statement is one that an exercise needs and that runs without
    any training: an import, a function or class definition, a literal setting (``SIZES =
    dict(...)``, see :func:`is_literal_setting`) or ``run = setup(...)`` (the profile every
    chapter's functions take their defaults from). Shared by ``refresh --exercise-cells`` and the
    exercises' no-shortcuts sweep, which executes a chapter's definitions the same way."""
    definitions = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    one_target = isinstance(node, ast.Assign) and len(node.targets) == 1
    target = node.targets[0] if one_target else None  # type: ignore[attr-defined]
    names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", []))
    to_names = bool(names) and all(isinstance(t, ast.Name) for t in names)
    is_run_setup = isinstance(target, ast.Name) and target.id == "run"
    is_setting = to_names and is_literal_setting(node.value)  # type: ignore[attr-defined]
    return isinstance(node, definitions) or is_run_setup or is_setting


def _definitions(source: str) -> list[str]:
    """The statements of a code cell that :func:`is_definition` keeps, as source (none if the cell
    is not plain Python)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in body if is_definition(node)]


def refresh_exercise_cells(ipynb: Path, profile: str, timeout: int) -> str | None:
    """Re-execute only the cells of ``ipynb``'s Exercises section (after the imports, ``run =
    setup(...)`` and the function and class definitions of the cells above it, nothing else of
    them) and put their outputs in place; every other cell keeps the outputs of the last full
    refresh.

    For a chapter whose exercise stubs or hints changed and nothing above them: a stub's output is
    its checker's hint, which depends on those definitions alone. Refuses (returns the reason) when the
    ``.py`` and the ``.ipynb`` hold different cells (run ``jupytext --sync`` first: it keeps the
    outputs of unchanged cells), when a cell above the exercises has no output of a full run, or when an
    exercise cell fails on the imports alone. Returns None on success.
    """
    py = ipynb.with_suffix(".py")
    nb = nbformat.read(ipynb, as_version=4)
    if py.exists() and [c.source for c in jupytext.read(py).cells] != [c.source for c in nb.cells]:
        return f"{py.name} and {ipynb.name} hold different cells: run `jupytext --sync {py}` first"
    starts = [i for i, c in enumerate(nb.cells)
              if c.cell_type == "markdown" and EXERCISES_HEADING.search(c.source)]
    if not starts:
        return "no Exercises heading"
    start = starts[0]
    above = [i for i, c in enumerate(nb.cells[:start]) if c.cell_type == "code" and c.source.strip()]
    unrun = [i for i in above if nb.cells[i].get("execution_count") is None]
    if unrun:
        return f"cells {unrun} above the exercises never ran: this needs a full refresh"
    imports = [line for i in above for line in _definitions(nb.cells[i].source)]
    chosen = [i for i, c in enumerate(nb.cells) if i > start and c.cell_type == "code" and c.source.strip()]
    cells = [nbformat.v4.new_code_cell("\n".join(imports))] + [copy.deepcopy(nb.cells[i]) for i in chosen]
    part = nbformat.v4.new_notebook(metadata=nb.metadata, cells=cells)
    result = execute(part, ipynb.parent, profile, timeout=timeout, store_widget_state=False)
    if not result.ok:
        return f"an exercise cell failed on the definitions alone: {result.error}"
    last = max((c.get("execution_count") or 0) for c in nb.cells if c.cell_type == "code")
    for i, done in zip(chosen, result.nb.cells[1:], strict=True):
        nb.cells[i].outputs = done.outputs
        if nb.cells[i].get("execution_count") is None:
            last += 1
            nb.cells[i].execution_count = last
    strip_volatile(nb)
    write_pair(nb, ipynb)
    return None


def cmd_refresh(args: argparse.Namespace) -> int:
    notebooks_dir = Path(args.notebooks).resolve()
    targets = _resolve_targets(args.notebooks_to_run, notebooks_dir)
    if args.exercise_cells:
        failed = []
        for ipynb in targets:
            reason = refresh_exercise_cells(ipynb, args.profile, args.timeout)
            verdict = "re-executed" if reason is None else f"NOT written: {reason}"
            print(f"{_key(ipynb)}: exercise cells {verdict}", flush=True)
            failed += [ipynb] if reason else []
        return 1 if failed else 0
    profile = args.profile
    env_info = {
        "profile": profile,
        "cpu_count": os.cpu_count(),
        "torch": torch_version(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(f"book: refreshing {len(targets)} notebook(s) in profile {profile}")
    entries, failed = {}, []
    for k, ipynb in enumerate(targets, 1):
        print(f"[{k}/{len(targets)}] {_key(ipynb)} ...", end=" ", flush=True)
        nb = read_inputs(ipynb)
        result = execute(nb, ipynb.parent, profile, timeout=args.timeout, store_widget_state=False)
        if not result.ok:
            where = f" in cell {result.error_cell}" if result.error_cell is not None else ""
            print(f"FAILED{where}: {result.error} ({fmt_seconds(result.seconds)}); file left untouched")
            if result.details:
                print(result.details[-3000:], flush=True)
            failed.append(ipynb)
            continue
        strip_volatile(result.nb)
        write_pair(result.nb, ipynb)
        entries[_key(ipynb)] = {
            "seconds": round(result.seconds, 1),
            **env_info,
            "date": _dt.date.today().isoformat(),
        }
        print(f"ok ({fmt_seconds(result.seconds)})", flush=True)
    if entries:
        times_file = Path(args.times)
        record_times(times_file, entries)
        print(f"book: times recorded in {times_file}")
    if failed:
        print(
            f"book: {len(failed)} notebook(s) not written: " + ", ".join(map(_key, failed)), file=sys.stderr
        )
        return 1
    return 0


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="execute copies of every notebook and write the HTML book")
    b.add_argument(
        "--profile", choices=["smoke", "cpu", "gpu"], help="default: TFM_PROFILE, else by hardware"
    )
    b.add_argument("--out", default=str(REPO_ROOT / "build"), help="output folder (default: build)")
    b.add_argument("--no-execute", action="store_true",
                   help="render the notebooks' committed outputs instead of executing copies (fast)")
    b.add_argument("--only", nargs="+", metavar="NOTEBOOK",
                   help="build only these notebooks (file names or stems), e.g. for a quick look")
    b.set_defaults(func=cmd_build)

    r = sub.add_parser("refresh", help="re-execute committed notebooks in place (developers)")
    r.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "gpu"], help="default: cpu")
    r.add_argument("--times", default=str(TIMES_FILE), help="JSON file of recorded notebook times")
    r.add_argument(
        "notebooks_to_run", nargs="*", metavar="NOTEBOOK", help="default: all chapters and solutions"
    )
    r.add_argument("--exercise-cells", action="store_true",
                   help="re-execute only the Exercises section's cells (after the imports), keeping every "
                        "other output: for changed stubs or hints when nothing above them changed")
    r.set_defaults(func=cmd_refresh)

    for p in (b, r):
        p.add_argument("--notebooks", default=str(NOTEBOOKS), help="notebooks folder (default: notebooks)")
        p.add_argument("--timeout", type=int, default=3600, help="seconds per cell (default: 3600)")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""The book's diagrams: links from the chapters resolve, and the SVGs are what tools/figures.py draws.

``tools/figures.py`` draws every diagram; ``notebooks/figures/`` holds the committed SVGs, which the
chapters show with Markdown image links such as ``![...](figures/01_gru_cell.svg)``.
"""

from __future__ import annotations

import re
from pathlib import Path

import figures  # tools/figures.py (the root conftest puts tools/ on sys.path)
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py") if not p.name.startswith("00_"))  # no preface


def notebook_sources() -> list[Path]:
    return sorted(NOTEBOOKS.glob("**/*.py"))


def test_every_figure_link_points_to_an_existing_file():
    bad = figures.broken_figure_links(notebook_sources())
    assert not bad, "image links to missing figures:\n" + "\n".join(bad)


def test_a_missing_figure_is_reported(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "there.svg").write_text("<svg/>")
    (tmp_path / "solutions").mkdir()
    chapter = tmp_path / "01_x.py"
    chapter.write_text("# %% [markdown]\n# ![here](figures/there.svg)\n# text ![gone](figures/gone.svg)\n")
    solution = tmp_path / "solutions" / "01_x_solutions.py"
    solution.write_text("# ![up](../figures/there.svg) and ![missing](../figures/none.svg)\n")
    assert figures.figure_links(chapter) == [(2, "figures/there.svg"), (3, "figures/gone.svg")]
    bad = figures.broken_figure_links([chapter, solution])
    assert len(bad) == 2, f"expected the two missing targets to be reported, got {bad}"
    assert "figures/gone.svg" in bad[0] and ":3:" in bad[0], bad[0]
    assert "../figures/none.svg" in bad[1] and ":1:" in bad[1], bad[1]
    (tmp_path / "figures" / "gone.svg").write_text("<svg/>")
    (tmp_path / "figures" / "none.svg").write_text("<svg/>")
    assert figures.broken_figure_links([chapter, solution]) == [], "links to existing files must pass"


def test_committed_svgs_are_what_the_script_draws(capsys):
    committed = sorted(figures.FIG_DIR.glob("*.svg"))
    assert committed, "notebooks/figures/ holds no SVG"
    versions = {figures.drawn_with(p) for p in committed}
    assert len(versions) == 1 and None not in versions, f"SVGs drawn by different matplotlibs: {versions}"
    import matplotlib

    if versions != {matplotlib.__version__}:  # other versions lay out SVGs differently, byte for byte
        pytest.skip(f"the SVGs were drawn with matplotlib {versions.pop()}, this is "
                    f"{matplotlib.__version__}: bytes are compared only under the same version "
                    "(determinism is tested below)")
    assert figures.main(["--check"]) == 0, (
        "notebooks/figures/ is out of date: run `python tools/figures.py` and commit the SVGs\n"
        + capsys.readouterr().err)


def test_check_fails_on_a_changed_or_missing_svg(tmp_path, monkeypatch, capsys):
    name = "01_gru_cell.svg"
    monkeypatch.setattr(figures, "FIG_DIR", tmp_path)
    monkeypatch.setattr(figures, "REPO_ROOT", tmp_path.parent)
    assert figures.main(["--check", "--only", name]) == 1, "a missing SVG must fail the check"
    assert "missing" in capsys.readouterr().err
    assert figures.main(["--only", name]) == 0
    assert figures.main(["--check", "--only", name]) == 0, "a freshly drawn SVG must pass the check"
    svg = tmp_path / name
    svg.write_bytes(svg.read_bytes().replace(b"reset gate", b"forget gate"))
    assert figures.main(["--check", "--only", name]) == 1, "an edited SVG must fail the check"
    assert "differs" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(figures.FIGURES))
def test_svgs_are_deterministic_and_keep_text_as_text(name):
    first, second = figures.render(name), figures.render(name)
    assert first == second, f"{name}: two renders differ"
    text = first.decode("utf-8")
    assert "<dc:date>" not in text, f"{name}: the SVG carries a date"
    assert "<text" in text, f"{name}: no <text> elements: text was turned into paths"
    assert not re.search(r'id="DejaVuSans-', text), f"{name}: glyphs are embedded as paths"
    # sized mathtext glyphs (\sqrt, \sum, \left) come out in STIX or "Display" fonts that
    # browsers do not have; every text element must use the DejaVu Sans stack with its fallbacks
    families = set(re.findall(r"font-family: ([^;\"]+)", text))
    assert families == {figures.FONT_STACK.decode().removeprefix("font-family: ")}, (
        f"{name}: unexpected font families {families}")
    assert len(first) < 200_000, f"{name}: {len(first)} bytes, expected a small SVG"


def test_every_chapter_shows_at_least_one_figure():
    numbers = [int(p.name[:2]) for p in CHAPTERS]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 9, (
        f"expected chapters 01, 02, ... (at least to 09), found {[p.name for p in CHAPTERS]}")
    without = [p.name for p in CHAPTERS if not figures.figure_links(p)]
    assert not without, f"chapters without a diagram (no ![...](figures/...) link): {without}"


def test_every_drawn_figure_is_shown_somewhere():
    shown = {Path(target).name for path in notebook_sources() for _, target in figures.figure_links(path)}
    unused = sorted(set(figures.FIGURES) - shown)
    assert not unused, f"figures drawn by tools/figures.py but linked from no notebook: {unused}"

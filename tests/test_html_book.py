"""The HTML book in a real browser: headless Chromium renders built pages and we look at them.

Pages are built by ``tools/book.py`` as a reader builds them: the chapters with the most
mathematics from their committed outputs (``--no-execute``, fast), and the preface executed in
the ``smoke`` profile (that page must say its numbers are toy-sized). Each page must show

* no MathJax error and no raw TeX left in the text,
* every image loaded,
* links that resolve: other pages and files exist, in-page anchors name an element,
* the book's navigation (index, previous / next where there is one, the chapter's contents),
* a text column narrow enough to read (at most ~60 rem on a wide window).

Needs Chromium and its driver (Debian: ``apt-get install -y chromium chromium-driver``; ``.ci/run``
installs them) and ``selenium``; without them the tests skip and say why.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import book
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
# Chapters whose formulas broke under the TeX-font MathJax setup, the newest chapter, and their solutions.
CHAPTERS = ["01_rnn_and_gru", "03_bahdanau_attention", "05_scaled_dot_product_and_multihead",
            "06_positional_encoding", "10_scaling_up", "11_real_text"]
MATH_PAGES = CHAPTERS + [f"{name}_solutions" for name in CHAPTERS]

# Runs in the page: everything the tests look at, in one round trip.
INSPECT_PAGE = r"""
const text = el => {  // visible text of an element, without code, scripts and rendered math
  const c = el.cloneNode(true);
  c.querySelectorAll('code, pre, script, style, .MathJax, .MathJax_Display, .MathJax_Preview')
   .forEach(n => n.remove());
  return c.textContent;
};
const markdown = Array.from(document.querySelectorAll('.jp-MarkdownOutput')).map(text).join('\n');
const rawTex = markdown.match(
  /\$\$|\$[^$\s][^$\n]{0,200}\$|\\(frac|sqrt|mathrm|mathbf|sum|alpha|top|left|right|begin)\b/g);
const images = Array.from(document.images).map(i => ({src: i.getAttribute('src').slice(0, 120),
                                                       ok: i.complete && i.naturalWidth > 0}));
const links = Array.from(document.querySelectorAll('a[href]')).map(a => ({
  href: a.getAttribute('href'), resolved: a.href, rel: a.getAttribute('rel') || ''}));
const ids = Array.from(document.querySelectorAll('[id]')).map(e => e.id);
const main = document.querySelector('main');
return {
  mathErrors: (document.body.innerText.match(/Math Processing Error/g) || []).length
              + document.querySelectorAll('.MathJax_Error, merror').length,
  mathCount: document.querySelectorAll('.MathJax, .MathJax_Display').length,
  rawTex: rawTex ? rawTex.slice(0, 5) : [],
  images, links, ids,
  columnPx: main ? main.getBoundingClientRect().width : null,
  remPx: parseFloat(getComputedStyle(document.documentElement).fontSize),
  tocEntries: document.querySelectorAll('nav.book-toc li').length,
  banner: (document.querySelector('.book-banner') || {}).innerText || '',
  wrappedOutputs: Array.from(document.querySelectorAll('.jp-OutputArea-output pre'))
    .filter(p => getComputedStyle(p).whiteSpace !== 'pre').length,
};
"""


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no Chromium and chromedriver on PATH "
                    "(Debian: apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1000", "--allow-file-access-from-files"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def load(driver, page: Path) -> dict:
    """Open ``page``, wait until MathJax has typeset everything, and inspect it."""
    driver.get(page.as_uri())
    driver.execute_script(
        "window.__typeset = !window.MathJax;"
        "if (window.MathJax) MathJax.Hub.Queue(function () { window.__typeset = true; });"
    )
    deadline = time.monotonic() + 90
    while not driver.execute_script("return window.__typeset === true;"):
        assert time.monotonic() < deadline, f"{page.name}: MathJax did not finish in 90 s"
        time.sleep(0.2)
    return driver.execute_script(INSPECT_PAGE)


def broken_links(page: Path, found: dict) -> list[str]:
    problems = []
    for link in found["links"]:
        url = urlparse(link["resolved"])
        if url.scheme in ("http", "https", "mailto"):
            continue  # the book is read offline; external references are not ours to check
        if url.scheme != "file":
            problems.append(f"{link['href']}: unexpected scheme {url.scheme!r}")
            continue
        target = Path(unquote(url.path))
        if target == page:
            # browsers try the fragment as written, then percent-decoded (nbconvert's ids are encoded)
            if url.fragment and not {url.fragment, unquote(url.fragment)} & set(found["ids"]):
                problems.append(f"{link['href']}: no element with id {unquote(url.fragment)!r} on the page")
        elif not target.exists():
            problems.append(f"{link['href']}: {target} does not exist")
    return problems


@pytest.fixture(scope="module")
def committed_pages(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    assert book.main(["build", "--no-execute", "--out", str(out), "--only", *MATH_PAGES]) == 0
    return out / "html"


@pytest.mark.parametrize("name", MATH_PAGES)
def test_page_reads_in_a_browser(browser, committed_pages, name):
    sub = "solutions" if name.endswith("_solutions") else ""
    page = committed_pages / sub / f"{name}.html"
    assert page.exists(), f"the build wrote no {page}"
    found = load(browser, page)
    assert found["mathErrors"] == 0, f"{name}: {found['mathErrors']} MathJax errors"
    assert found["mathCount"] > 0, f"{name}: no typeset formula on a page with mathematics"
    assert not found["rawTex"], f"{name}: TeX left untypeset in the text: {found['rawTex']}"
    assert all(img["ok"] for img in found["images"]), (
        f"{name}: images that did not load: {[i['src'] for i in found['images'] if not i['ok']]}"
    )
    problems = broken_links(page, found)
    assert not problems, f"{name}: dead links:\n" + "\n".join(problems)
    rels = {link["rel"] for link in found["links"]}
    assert "index" in rels, f"{name}: no link back to the index"
    assert rels & {"prev", "next"}, f"{name}: neither a previous nor a next page"
    if not sub:
        assert found["tocEntries"] >= 3, (
            f"{name}: the chapter's contents list has {found['tocEntries']} entries"
        )
        assert any(link["href"].startswith("solutions/") for link in found["links"]), (
            f"{name}: no link to the chapter's solutions"
        )
    assert found["wrappedOutputs"] == 0, (
        f"{name}: {found['wrappedOutputs']} printed outputs wrap their lines (a table's columns break)"
    )
    assert found["columnPx"] <= 60 * found["remPx"], (
        f"{name}: the text column is {found['columnPx']:.0f} px wide on a 1600 px window"
    )


def test_index_links_every_page(browser, committed_pages):
    index = committed_pages / "index.html"
    found = load(browser, index)
    problems = broken_links(index, found)
    assert not problems, "dead links on the index:\n" + "\n".join(problems)
    hrefs = {link["href"] for link in found["links"]}
    for name in MATH_PAGES:
        sub = "solutions/" if name.endswith("_solutions") else ""
        assert f"{sub}{name}.html" in hrefs, f"the index does not link {sub}{name}.html"


def test_a_smoke_page_says_its_numbers_are_toy_sized(browser, tmp_path):
    out = tmp_path / "book"
    assert book.main(["build", "--profile", "smoke", "--out", str(out), "--only", "00_preface"]) == 0
    page = out / "html" / "00_preface.html"
    found = load(browser, page)
    assert "smoke" in found["banner"] and "toy-sized" in found["banner"], (
        f"the smoke page carries no toy-size note: {found['banner']!r}"
    )
    assert found["mathErrors"] == 0 and not found["rawTex"]
    assert all(img["ok"] for img in found["images"])
    assert not broken_links(page, found)
    # the preface sends readers to the README for corpora and the package: a page of the book
    readme_links = [link for link in found["links"] if link["href"].startswith("readme.html#")]
    assert readme_links, "the preface should link to the README's sections"
    readme = load(browser, out / "html" / "readme.html")
    for link in readme_links:
        anchor = link["href"].split("#", 1)[1]
        assert anchor in readme["ids"], f"readme.html has no section {anchor!r}"
    assert not [p for p in broken_links(out / "html" / "readme.html", readme) if ".ipynb" in p or "#" in p]


def test_link_checker_and_raw_tex_check_can_fail(browser, tmp_path):
    """The checks above catch what they claim to: a dead link, a missing anchor, raw TeX, a broken image."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<html><body><main><a href="missing.html">x</a><a href="#nowhere">y</a>'
        '<div class="jp-MarkdownOutput"><p>$\\frac{a}{b}$ stays raw</p></div>'
        '<img src="absent.svg"></main></body></html>'
    )
    found = load(browser, page)
    problems = broken_links(page, found)
    assert any("missing.html" in p for p in problems) and any("nowhere" in p for p in problems), problems
    assert found["rawTex"], "raw TeX on a page without MathJax went unnoticed"
    assert not all(img["ok"] for img in found["images"]), "a missing image counted as loaded"

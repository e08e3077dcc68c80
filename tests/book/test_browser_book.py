"""The built book, opened page by page in headless Chromium, as a reader would.

Every page of _toc.yml renders with its title; every image on it loads; every internal
link resolves to a file of the site; no table or figure runs past the column, no formula is
left as TeX, no sentence is cut, and no page is wider than a phone; no number reads as a
tuple, no NaN shows where a value should, and no generated sentence is left unfinished; every notebook page has a
Colab and a Binder launch link for its own notebook and a download link to the executed .ipynb, and every
figure a numbered caption and alt text. Screenshots of the intro and one chapter are saved to
_build/screenshots/ (CI uploads them as artifacts).

Each page is opened once at 1280 px and once at 390 px (a phone), everything measured in that
one visit (``measured``), and the tests read the measurements: a page load is most of a
browser test's time.
"""
from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

from tools.book import layout, pages
from tests.helpers import ROOT
from tests.browser import DevTools, close_page, open_page_at

PAGES = [Path(f).with_suffix(".html").as_posix() for f in layout.toc_files(ROOT / "_toc.yml")]
NOTEBOOK_PAGES = [Path(p).with_suffix(".html").as_posix() for p in map(Path, map(str, layout.notebooks(ROOT)))]
REPO = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].removeprefix("https://github.com/")
SCREENSHOTS = ROOT / "_build" / "screenshots"
SCREENSHOT_PAGES = ("book/intro.html", "book/01_naive.html")

READ_PAGE = """(() => ({
  title: document.title,
  h1: (document.querySelector("main h1, article h1, h1") || {}).textContent || "",
  images: Array.from(document.images).map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
  links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
}))()"""


@pytest.fixture(scope="module")
def site(built_book, book_in_chromium):
    tools, base = book_in_chromium
    return tools, base, built_book[2], {}


def measured(site, page: str, width: int = 1280) -> dict:
    """Everything the tests below read on ``page`` at ``width`` px, from one visit (kept for
    the next test of the same page): READ_PAGE, FIT_AND_MATH, CUT_TEXT, FIGURES, PROSE and the
    page model's measurement (``tools.book.pages.MEASURE``)."""
    tools, base, _, seen = site
    if (page, width) not in seen:
        seen[page, width] = visit(tools, f"{base}/{page}", width, screenshot=width == 1280 and page in SCREENSHOT_PAGES)
    return seen[page, width]


def local_file(html: Path, base: str, href: str) -> Path | None:
    """The site file an internal link points at (None for links leaving the site)."""
    if not href.startswith(base):
        return None
    path = unquote(urlparse(href).path).lstrip("/")
    target = html / path
    return target / "index.html" if target.is_dir() else target


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_page_renders_with_its_images_and_links(site, page):
    _, base, html, _ = site
    seen = measured(site, page)["read"]
    assert seen["h1"].strip(), f"{page} has no title heading"
    assert seen["h1"].strip().rstrip("#").strip() in seen["title"], (seen["h1"], seen["title"])
    broken_images = [i["src"] for i in seen["images"] if not i["ok"]]
    assert not broken_images, f"images that did not load on {page}: {broken_images}"
    broken_links = sorted({h for h in seen["links"] if (f := local_file(html, base, h)) is not None and not f.exists()})
    assert not broken_links, f"internal links to missing files on {page}: {broken_links}"


FIT_AND_MATH = r"""(() => {
  const main = document.querySelector("article.bd-article") || document.querySelector("main");
  const right = main.getBoundingClientRect().right;
  const wide = Array.from(main.querySelectorAll("table, img, svg:not(.MathJax_SVG svg)"))
    .filter(e => e.getBoundingClientRect().width > 0 && e.getBoundingClientRect().right > right + 1)
    .map(e => `${e.tagName.toLowerCase()} (${Math.round(e.getBoundingClientRect().right - right)} px over)`);
  return {
    wide,
    // Sphinx marks each formula .math.notranslate; MathJax adds spans of its own inside.
    math: main.querySelectorAll(".math.notranslate").length,
    typeset: Array.from(main.querySelectorAll(".math.notranslate")).filter(e => e.querySelector(".MathJax, .MathJax_Display")).length,
    raw_tex: Array.from(main.querySelectorAll(".math.notranslate")).filter(e => !e.querySelector(".MathJax, .MathJax_Display") && /\\\(|\\\[/.test(e.textContent)).length,
  };
})()"""


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_page_fits_its_column_and_typesets_its_math(site, page):
    seen = measured(site, page)["fit"]
    assert not seen["wide"], f"{page}: tables or figures run past the main column at 1280 px: {seen['wide']}"
    assert seen["raw_tex"] == 0 and seen["typeset"] >= seen["math"], \
        f"{page}: {seen['raw_tex']} of {seen['math']} formulas left as raw TeX (MathJax is served by the book)"


@pytest.mark.slow
@pytest.mark.parametrize("page", NOTEBOOK_PAGES)
def test_notebook_page_has_launch_and_download_links(site, page):
    _, base, html, _ = site
    seen = measured(site, page)["read"]
    notebook = Path(page).with_suffix(".ipynb").as_posix()
    colab = [h for h in seen["links"] if "colab.research.google.com" in h]
    assert any(h.endswith(f"/github/{REPO}/blob/main/{notebook}") for h in colab), \
        f"no Colab launch link for {notebook} on {page}: {colab}"
    binder = [h for h in seen["links"] if h.startswith(f"https://mybinder.org/v2/gh/{REPO}/main?urlpath=")]
    assert any(h.endswith(f"/{notebook}") for h in binder), \
        f"no Binder launch link for {notebook} on {page} (it needs no release): {binder}"
    downloads = [f for h in seen["links"] if h.endswith(".ipynb") and (f := local_file(html, base, h)) is not None]
    assert downloads and all(f.exists() for f in downloads), f"no working .ipynb download on {page}: {downloads}"
    downloaded = json.loads(downloads[0].read_text())
    code = [c for c in downloaded["cells"] if c["cell_type"] == "code"]
    if "/exercises/" in page:
        params = ["".join(c["source"]) for c in code if "parameters" in c["metadata"].get("tags", [])]
        injected = [c for c in code if "injected-parameters" in c["metadata"].get("tags", [])]
        assert not any(c.get("outputs") for c in code) and not injected and \
            re.search(r"^solutions = False$", params[0], re.M), \
            "an exercise's download is the unsolved exercise: solutions = False, nothing injected, no outputs"
    else:
        assert any(c.get("outputs") for c in code), "a chapter's download is the executed notebook, with its outputs"
    source = [h for h in seen["links"] if h.startswith(f"https://github.com/{REPO}/blob/main/{notebook}")]
    assert source, f"no link to the source notebook {notebook} in the repository on {page}"


# What a reader must be able to read without scrolling sideways: the sentences the page exists
# for (lessons and notices: kernels.notebook.say), what cells print (bar a cell tagged wide-text),
# hints and figure captions. Each is measured against its own box and against the column.
CUT_TEXT = r"""(() => {
  const main = document.querySelector("article.bd-article") || document.querySelector("main");
  const right = main.getBoundingClientRect().right;
  const name = e => (e.className ? e.tagName.toLowerCase() + "." + String(e.className).split(" ")[0] : e.tagName.toLowerCase());
  const readable = Array.from(main.querySelectorAll(".ap-say, figcaption, details.ap-hint, .cell_output .output.stream pre"))
    .filter(e => !e.closest(".tag_wide-text") && e.offsetWidth > 0);
  const lessonsInCode = Array.from(main.querySelectorAll("pre")).filter(e => /✔/.test(e.textContent) && !e.closest(".ap-say"));
  const cut = readable.concat(lessonsInCode)
    .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > right + 1)
    .map(e => `${name(e)}: "${e.textContent.trim().slice(0, 70)}" (${e.scrollWidth} px in ${e.clientWidth} px)`);
  return {cut: Array.from(new Set(cut)), readable: readable.length,
          page_width: document.documentElement.scrollWidth, viewport: window.innerWidth,
          wide: Array.from(document.querySelectorAll("body *")).filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
                  && getComputedStyle(e).position !== "fixed" && !e.closest("[style*='overflow'], .highlight, pre, .cell_output figure, .table-wrapper, table, .MathJax_Display, .bd-sidebar-primary, .bd-sidebar-secondary, .search-button__wrapper"))
                .slice(0, 5).map(e => `${name(e)}: "${(e.textContent || "").trim().slice(0, 50)}"`)};
})()"""


def visit(tools: DevTools, url: str, width: int, screenshot: bool = False) -> dict:
    """``url`` measured at ``width`` px once MathJax has typeset it, in a tab closed afterwards
    (every page at two widths would otherwise leave dozens open)."""
    session = open_page_at(tools, url, width=width)
    try:
        deadline = time.monotonic() + 20
        while True:  # MathJax typesets after the load event, and changes what fits
            fit = tools.evaluate(session, FIT_AND_MATH)
            if fit is None or fit["typeset"] >= fit["math"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        seen = {"fit": fit, **{name: tools.evaluate(session, expression) for name, expression in
                               (("read", READ_PAGE), ("cut", CUT_TEXT), ("figures", FIGURES), ("prose", PROSE),
                                ("page", pages.MEASURE))}}
        if screenshot:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shot = tools.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False}, session)
            name = urlparse(url).path.lstrip("/").replace("/", "_").replace(".html", ".png")
            (SCREENSHOTS / name).write_bytes(base64.b64decode(shot["data"]))
    finally:
        close_page(tools, url)
    missing = [name for name, value in seen.items() if value is None]
    assert not missing, f"{url} at {width} px: the measurement failed ({missing}): {tools.log[-3:]}"
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_lessons_notices_and_captions_wrap_and_no_page_is_wider_than_a_phone(site, page):
    seen = measured(site, page)["cut"]
    assert not seen["cut"], f"{page}: text cut at 1280 px (it must wrap): {seen['cut']}"
    narrow = measured(site, page, width=390)["cut"]
    assert narrow["page_width"] <= narrow["viewport"] + 1, \
        f"{page} is {narrow['page_width']} px wide on a 390 px phone; widest: {narrow['wide']}"


FIGURES = r"""(() => {
  const main = document.querySelector("article.bd-article") || document.querySelector("main");
  const captionedText = Array.from(main.querySelectorAll(".cell_output figure")).filter(f => !f.querySelector("img"));
  return Array.from(main.querySelectorAll(".cell_output img")).concat(captionedText).map(img => {
    if (img.tagName === "FIGURE") return {src: "(a caption on no image)", alt: "", caption: "", number: "",
                                          text: img.textContent.trim().slice(0, 80)};
    const figure = img.closest("figure");
    const caption = figure && figure.querySelector("figcaption");
    return {src: img.getAttribute("src"), alt: img.getAttribute("alt") || "",
            caption: caption ? caption.textContent.trim() : "",
            number: caption && caption.querySelector(".caption-number") ? caption.querySelector(".caption-number").textContent.trim() : ""};
  });
})()"""


@pytest.mark.slow
@pytest.mark.parametrize("page", NOTEBOOK_PAGES)
def test_every_figure_has_a_numbered_caption_and_alt_text(site, page):
    for f in measured(site, page)["figures"]:
        assert f["caption"] and re.match(r"Fig\. ?\d", f["number"]), f"{page}: a figure without a numbered caption: {f}"
        assert len(f["alt"]) > 20 and not re.search(r"\.(png|svg|jpg)$", f["alt"]), \
            f"{page}: alt text must say what the figure shows, not name its file: {f['alt']!r}"


# ------------------------------------------------------------------------- what the text says

# The text a reader reads, block by block (paragraphs, list items, captions, headings, table
# cells), each without its code, math or nested blocks: code and printed output may hold
# tuples, None and nan legitimately; prose and tables may not.
PROSE = r"""(() => {
  const main = document.querySelector("article.bd-article") || document.querySelector("main");
  const code = "pre, code, kbd, samp, script, style, .math, .MathJax, .MathJax_Display, .MathJax_Preview, .highlight";
  const blocks = "p, li, dt, dd, figcaption, caption, h1, h2, h3, h4, h5, h6, td, th";
  const own = e => {
    const copy = e.cloneNode(true);
    copy.querySelectorAll(code + ", ul, ol, dl, table, " + blocks).forEach(x => x.remove());
    return copy.textContent.replace(/\s+/g, " ").trim();
  };
  return Array.from(main.querySelectorAll(blocks)).filter(e => !e.closest(code))
    .map(e => ({kind: e.closest("td, th") ? "table" : "prose", text: own(e)})).filter(b => b.text);
})()"""

# A number printed with thousands separators that Python parsed back as a tuple: "524,288"
# reads (524, 288). (A group with a leading zero does not parse, and "1,000" reads (1, 0),
# which a capability such as sm_80's (8, 0) also reads: those are left alone.)
TUPLE_NUMBER = re.compile(r"\(\d{1,3}(?:, [1-9]\d\d)+\)")
# Python writes a float NaN "nan" (the prose writes the concept "NaN"); pandas fills a missing
# cell with NaN, <NA> or NaT; a unit after NaN is a value that was never computed.
NAN_IN_TEXT = re.compile(r"(?<![A-Za-z_])nan(?![A-Za-z]{2})|\bNaN(?: ?(?:x|%|[KMG]i?B|ms|µs|TFLOP/s)| s)(?![A-Za-z])")
MISSING_CELL = re.compile(r"(?i)nan|<NA>|NaT")
# Sentences a generated glue left unfinished.
UNFINISHED = {
    "a placeholder where a value should be": re.compile(r"\(not read here\)"),
    "a doubled 'so' (a glued clause repeating the sentence's own)": re.compile(r"\bSo\b[^.!?]*,\s+so\b"),
    "Python's None inside a sentence": re.compile(r"(?<=[\w,;:] )None\b(?! of\b)|\(None\)"),
}


def excerpt(text: str, match: re.Match) -> str:
    return f"...{text[max(0, match.start() - 40):match.end() + 40]}..."


def numbers_read_as_tuples(blocks: list[dict]) -> list[str]:
    """In prose only: a table's column of tensor shapes holds real tuples, (512, 512) among them."""
    return [excerpt(b["text"], m) for b in blocks if b["kind"] == "prose" for m in TUPLE_NUMBER.finditer(b["text"])]


def nans_a_reader_sees(blocks: list[dict]) -> list[str]:
    found = [excerpt(b["text"], m) for b in blocks for m in NAN_IN_TEXT.finditer(b["text"])]
    return found + [f"a table cell reading {b['text']!r}" for b in blocks
                    if b["kind"] == "table" and MISSING_CELL.fullmatch(b["text"])]


def unfinished_sentences(blocks: list[dict]) -> list[str]:
    return [f"{why}: {excerpt(b['text'], m)}" for b in blocks for why, pattern in UNFINISHED.items()
            for m in pattern.finditer(b["text"])]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_no_number_reads_as_a_tuple(site, page):
    found = numbers_read_as_tuples(measured(site, page)["prose"])
    assert not found, (f"{page}: numbers shown as Python tuples (a '{{x:,}}' string parsed back by the glue role; "
                       f"kernels.notebook.glue quotes strings, so look for another path to the page): {found}")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_no_nan_shows_where_a_value_should(site, page):
    found = nans_a_reader_sees(measured(site, page)["prose"])
    assert not found, f"{page}: a reader sees NaN where a value should be (say in words what was not measured): {found}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_no_generated_sentence_is_left_unfinished(site, page):
    found = unfinished_sentences(measured(site, page)["prose"])
    assert not found, f"{page}: {found}"


# A page built like the book's (the article, prose, a pandas table, a say box, code, printed
# output, math) with each defect planted once, beside look-alikes a reader may legitimately see.
PLANTED = """<!doctype html><html><head><title>Planted</title></head><body><main><article class="bd-article">
<h1>Planted defects</h1>
<p>The matmul does (134, 217, 728) multiply-adds; the relu 1,048,576 comparisons.</p>
<p>Block shapes are <code>(64, 128)</code>; the grid is [5, 16, 16]; sm_80 is (8, 0).</p>
<p>Fill V with NaN: a kernel that reads it spreads NaN, in nanoseconds. Its peak was nan MiB, up nanx.</p>
<p>The error names the switch: autograd.set_detect_anomaly(True, check_nan=False).</p>
<table><thead><tr><th>S</th><th>peak (MiB)</th><th>note</th></tr></thead>
<tbody><tr><td>128</td><td>NaN</td><td>NaN-guarded softmax</td></tr><tr><td>256</td><td>2.5</td><td>None of it</td></tr></tbody></table>
<p>In that step rank (not read here) computed longer.</p>
<div class="ap-say ap-note" role="note"><p>So this machine was too noisy to separate these two, so no time says it.</p></div>
<p>None of the ops ran twice. So the order matters. The fastest was None here.</p>
<div class="cell_output"><pre>(134, 217, 728) nan None (not read here)</pre></div>
<p>Math: <span class="math notranslate nohighlight">\\(x = nan\\)</span>.</p>
</article></main></body></html>"""


@pytest.mark.slow
def test_the_reading_checks_find_each_planted_defect_and_nothing_else(tmp_path):
    from tests.browser import served_in_chromium

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "planted.html").write_text(PLANTED)
    with served_in_chromium(tmp_path / "site", tmp_path / "profile") as (tools, base):
        blocks = visit(tools, f"{base}/planted.html", 1280)["prose"]
    tuples = numbers_read_as_tuples(blocks)
    assert len(tuples) == 1 and "does (134, 217, 728) multiply-adds" in tuples[0], tuples
    nans = nans_a_reader_sees(blocks)
    assert len(nans) == 3 and "nan MiB" in nans[0] and "nanx" in nans[1] and nans[2] == "a table cell reading 'NaN'", nans
    unfinished = unfinished_sentences(blocks)
    assert [u.split(":")[0] for u in unfinished] == [
        "a placeholder where a value should be", "a doubled 'so' (a glued clause repeating the sentence's own)",
        "Python's None inside a sentence"], unfinished
    assert "was None here" in unfinished[2]


# Issue 37 item 10: a chapter is prose, calls and figures. Counted on the notebook each chapter
# page serves: non-blank lines of its code cells (the shared install and parameters cells and
# papermill's injected parameters left out) against non-blank lines of its markdown.
SHARED_CELL_TAGS = {"parameters", "injected-parameters"}
DEFINES = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s|\blambda\b", re.M)


def non_blank_lines(cells) -> int:
    return sum(1 for c in cells for line in c.source.splitlines() if line.strip())


# Cells whose code the page does not show: the page model's checks and glue run there (issue #42).
HIDDEN_CODE_TAGS = {"remove-input", "remove-cell", "hide-input", "hide-cell"}


def shown_code_cells(cells) -> list:
    """The code cells whose input the page shows: not the shared cells, not the hidden ones."""
    from tools.book.convert import INSTALL

    return [c for c in cells if c.cell_type == "code"
            and not (SHARED_CELL_TAGS | HIDDEN_CODE_TAGS) & set(c.metadata.get("tags", []))
            and not c.source.startswith(INSTALL.splitlines()[0])]


def code_and_prose_lines(cells) -> tuple[int, int]:
    """Lines of the code a page shows, and of its prose."""
    return non_blank_lines(shown_code_cells(cells)), non_blank_lines([c for c in cells if c.cell_type == "markdown"])


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in NOTEBOOK_PAGES if p.startswith("book/") and p[5:7].isdigit()])
def test_a_chapter_shows_fewer_code_lines_than_prose_and_defines_nothing(built_book, page):
    """What a reader sees: the shown code is calls, fewer lines than the prose (the checks and glue
    of the hidden cells are the page model's, issue #42, and the ~60-line budget bounds them)."""
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    _, _, html = built_book
    cells = nbformat.read(html / "_sources" / Path(page).with_suffix(".ipynb"), as_version=4).cells
    code, prose = code_and_prose_lines(cells)
    assert code < prose, f"{page}: {code} lines of code against {prose} of prose (library code belongs in kernels/)"
    defined = [m.group(0).strip() for c in shown_code_cells(cells) for m in DEFINES.finditer(c.source)]
    assert not defined, f"{page} shows code that defines {defined}: a chapter calls the library, it does not define it"


# ------------------------------------------------------------------- the page model (issue #42)

# Every rule on every chapter page; on the other notebook pages (exercises, the appendix's) every
# rule but the chapter's budgets of code lines and height. tests/book/test_page_rules.py shows
# each rule failing on a planted page.
CHAPTER_PAGES = pages.chapter_pages(ROOT)
BUDGETS = {"code", "height"}
PAGE_RULES = [(page, rule.key) for page in NOTEBOOK_PAGES for rule in pages.RULES
              if page in CHAPTER_PAGES or rule.key not in BUDGETS]


@pytest.mark.slow
@pytest.mark.parametrize("page,rule", PAGE_RULES, ids=[f"{p.removeprefix('book/')}-{r}" for p, r in PAGE_RULES])
def test_the_page_keeps_the_page_model(site, page, rule):
    by_width = {width: measured(site, page, width)["page"] for width in pages.WIDTHS}
    found = pages.broken_rules(by_width, [pages.RULE[rule]]).get(rule, [])
    assert not found, (f"{page} breaks the page model's rule '{pages.RULE[rule].name}' ({len(found)}): "
                       + "; ".join(found[:12]) + (f"; ... {len(found) - 12} more" if len(found) > 12 else ""))

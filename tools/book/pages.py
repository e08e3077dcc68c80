"""The reader's page, measured in headless Chromium: what issue #42's page model allows.

    python -m tools.book.pages _build/html          # every chapter page of a built book
    python -m tools.book.pages _build/html --all    # every notebook page (exercises, appendix too)

Each page is opened once at 1280 px and once at 390 px (a phone); ``MEASURE``, one script,
reads what the rules need in that visit. Each rule (``RULES``) is a small function over those
measurements that returns what breaks it, each item naming the offending text or number; the
tool prints a row per page, tests/book/test_browser_book.py asserts the rules on every chapter
page of the built book, and tests/book/test_page_rules.py shows each rule failing on a planted
page. What the rules look at (myst-nb's markup):

* a visible code input: a ``.cell_input`` outside a folded ``details.hide`` (a cell tagged
  remove-input or remove-cell has none on the page);
* a folded box: a ``details.hide.above-input`` (a cell tagged hide-input or hide-cell) not
  tagged ``solution`` (the setup box is one; an output folded by hide-output is not counted);
* a lesson: a ``.ap-lesson`` box (``kernels.notebook.lesson``), or a printed line starting ✔;
* a credit paragraph: a ``.ap-traces`` box (``kernels.borrowed.traces_box``), or the words
  "not this book's run" in rendered text outside it (code inputs aside).
"""
from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

WIDTHS = (1280, 390)
MAX_HEIGHT = 12_000          # px at 1280: a chapter a reader finishes
MAX_CODE_LINES = 60          # non-blank lines of visible code inputs, the folded setup box aside
MAX_FOLDED = 1               # the setup box
MAX_CREDITS = 1              # the "Traces on this page" box, or one credit sentence
MIN_PHONE_TEXT_PX = 7.5      # at 390 px, a figure's smallest text as shown (a laptop's floor is 9: figures.MIN_FONT_PX)
MIN_PHONE_SCALE = 0.6        # ...or, for an image with no text size known, its shown / drawn width
# Calls that are the page's bookkeeping, never what a learner types (issue #42).
BOOKKEEPING = re.compile(r"(?<!\w)(?:glue|glue_all|lesson|say|timing_claims|traces_box)\s*\(|\.credit\(")
# A number printed raw: five or more decimals and five or more significant digits (4.536724,
# 119.276845; 4 significant digits, as kernels.notebook.readable writes them, "0.01234" or
# "0.07000", read fine), or an exponent with a plus (2.147484e+09, 3.18e+00). A small number's
# e- (an error bound, 5.3e-07) reads fine.
RAW_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE]\+\d+|(?<![\w.])\d+\.\d{5,}(?![\d]|[eE]-)")
RAW_DIGITS = 5
CUT_CELL = re.compile(r"(?:\.\.\.|…)$")
CREDIT = re.compile(r"not this book['’]s run", re.I)

MEASURE = r"""(() => {
  const main = document.querySelector("article.bd-article") || document.querySelector("main");
  const rendered = e => e.getClientRects().length > 0;
  const column = main.getBoundingClientRect();
  const style = getComputedStyle(main);
  const contentWidth = main.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const inputs = Array.from(main.querySelectorAll(".cell_input"))
    .filter(e => !e.closest("details.hide") && rendered(e))
    .map(e => (e.querySelector("pre") || e).textContent);
  const folded = Array.from(main.querySelectorAll("details.hide.above-input"))
    .filter(d => !(d.closest(".cell") || d).classList.contains("tag_solution"))
    .map(d => ((d.querySelector("summary .collapsed") || d.querySelector("summary") || d).textContent || "").trim());
  const outputs = Array.from(main.querySelectorAll(".cell_output, .pasted-text"))
    .filter(e => rendered(e) && !e.parentElement.closest(".cell_output"))
    .map(e => e.innerText);
  const lessonLines = Array.from(main.querySelectorAll(".cell_output pre"))
    .filter(p => !p.closest(".ap-say")).map(p => p.textContent.split("\n").filter(l => l.trim().startsWith("✔")).length)
    .reduce((a, b) => a + b, 0);
  const cells = Array.from(main.querySelectorAll(".cell_output td, .cell_output th"))
    .filter(rendered).map(e => e.textContent.trim());
  const credits = [];
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const at = n.parentElement;
    if (!at || at.closest(".ap-traces, .cell_input, script, style") || !rendered(at)) continue;
    const found = n.textContent.match(/not this book['’]s run/gi);
    if (found) credits.push(...found.map(() => n.textContent.trim().slice(0, 100)));
  }
  const images = Array.from(main.querySelectorAll("img")).filter(rendered).map(i => ({
    src: (i.currentSrc || i.getAttribute("src") || "").split("/").pop().slice(0, 24),
    width: Math.round(i.getBoundingClientRect().width), natural: i.naturalWidth,
    text_px: parseFloat((i.currentSrc || "").endsWith("-phone.png") ? i.dataset.phoneTextPx : i.dataset.textPx) || null,
    over: Math.round(i.getBoundingClientRect().right - column.right)}));
  const tables = Array.from(main.querySelectorAll(".cell_output table")).filter(rendered).map(t => ({
    head: Array.from(t.querySelectorAll("th")).slice(0, 3).map(h => h.textContent.trim()).join(" | ").slice(0, 60),
    width: Math.round(t.getBoundingClientRect().width), over: Math.round(t.getBoundingClientRect().right - column.right),
    scrolls: t.scrollWidth > t.clientWidth + 1}));
  return {width: window.innerWidth, height: document.documentElement.scrollHeight,
          column: Math.round(contentWidth), inputs, folded, outputs, cells, credits, images, tables,
          traces_boxes: main.querySelectorAll(".ap-traces").length,
          lessons: main.querySelectorAll(".ap-lesson").length + lessonLines};
})()"""


def excerpt(text: str, match: re.Match, around: int = 30) -> str:
    return text[max(0, match.start() - around):match.end() + around].replace("\n", " ").strip()


# ------------------------------------------------------------------------------ what is counted

def visible_code_lines(m: dict) -> list[str]:
    """The non-blank lines of the code inputs a reader sees (folded boxes aside)."""
    return [line for text in m["inputs"] for line in text.splitlines() if line.strip()]


def is_raw(number: str) -> bool:
    if "e" in number.lower():
        return True
    return len(number.replace(".", "").lstrip("0")) >= RAW_DIGITS


def raw_numbers(m: dict) -> list[str]:
    return [f"{match.group(0)} in ...{excerpt(text, match)}..." for text in m["outputs"] + m["cells"]
            for match in RAW_NUMBER.finditer(text) if is_raw(match.group(0))]


def cut_cells(m: dict) -> list[str]:
    return [cell for cell in m["cells"] if CUT_CELL.search(cell)]


def credit_count(m: dict) -> int:
    return m["traces_boxes"] + len(m["credits"])


def wide_images(m: dict) -> list[str]:
    return [f"{i['src']} is {i['width']} px wide in a {m['column']} px column" for i in m["images"]
            if i["width"] > m["column"] + 1 or i["over"] > 1]


# --------------------------------------------------------------------------------------- rules

@dataclass(frozen=True)
class Rule:
    """One rule of the page model, called ``key`` in tests: ``broken(measurement)`` lists what
    breaks it at ``width`` px (None: at every width measured)."""

    key: str
    name: str
    broken: Callable[[dict], list[str]]
    width: int | None = None


def bookkeeping_calls(m: dict) -> list[str]:
    return [line.strip() for line in visible_code_lines(m) if BOOKKEEPING.search(line)]


def extra_folded_boxes(m: dict) -> list[str]:
    return [f"{len(m['folded'])} folded boxes: {m['folded']}"] if len(m["folded"]) > MAX_FOLDED else []


def too_much_code(m: dict) -> list[str]:
    lines = visible_code_lines(m)
    return [f"{len(lines)} visible code lines (at most {MAX_CODE_LINES})"] if len(lines) > MAX_CODE_LINES else []


def extra_credits(m: dict) -> list[str]:
    """More than one credit: two traces boxes, or a credit sentence shown besides the box (the
    box itself says "not this book's run" for each trace: it is one credit)."""
    if credit_count(m) <= MAX_CREDITS:
        return []
    return [f"{m['traces_boxes']} traces box(es) and {len(m['credits'])} credit sentence(s) outside it: {m['credits'][:4]}"]


def too_tall(m: dict) -> list[str]:
    return [f"{m['height']:,} px tall (at most {MAX_HEIGHT:,})"] if m["height"] > MAX_HEIGHT else []


def shrunk_figures(m: dict) -> list[str]:
    """Figures whose smallest text a phone shows under ``MIN_PHONE_TEXT_PX`` (a figure's phone
    copy, ``kernels.figures.phone_copy``, is drawn narrow enough to keep it legible). The build
    marks each figure with its smallest text (``data-text-px``); an image without the mark is
    held to ``MIN_PHONE_SCALE`` of its drawn size, where text drawn at 10 points is 8 px."""
    broken = []
    for i in m["images"]:
        if not i["natural"]:
            continue
        scale = i["width"] / i["natural"]
        if i.get("text_px") and i["text_px"] * scale < MIN_PHONE_TEXT_PX:
            broken.append(f"{i['src']}: its smallest text ({i['text_px']:g} px drawn) is shown at "
                          f"{i['text_px'] * scale:.1f} px ({scale:.2f} of its drawn {i['natural']} px)")
        elif not i.get("text_px") and scale < MIN_PHONE_SCALE:
            broken.append(f"{i['src']} is shown at {scale:.2f} of its drawn {i['natural']} px")
    return broken


def tables_past_the_column(m: dict) -> list[str]:
    return [f"table '{t['head']}' runs {t['over']} px past the column" for t in m["tables"] if t["over"] > 1]


RULES = (
    Rule("calls", "no bookkeeping call in a visible input (glue, glue_all, lesson, say, timing_claims, "
         "traces_box, .credit)", bookkeeping_calls),
    Rule("folded", f"at most {MAX_FOLDED} folded setup box (solutions aside)", extra_folded_boxes),
    Rule("code", f"at most {MAX_CODE_LINES} visible code lines", too_much_code),
    Rule("cut", "no table cell cut short (... or …)", lambda m: [f"a cell reading {c!r}" for c in cut_cells(m)]),
    Rule("raw", "no number printed raw (5+ decimals and digits, or e+ notation)", raw_numbers),
    Rule("credits", f"at most {MAX_CREDITS} credit paragraph (the traces box counts)", extra_credits),
    Rule("image", "every image fits the column at 390 px", wide_images, width=390),
    Rule("legible", f"every figure's text shown at {MIN_PHONE_TEXT_PX} px or more at 390 px", shrunk_figures,
         width=390),
    Rule("table", "every table scrolls inside its own box at 390 px", tables_past_the_column, width=390),
    Rule("height", f"at most {MAX_HEIGHT:,} px tall at 1280 px", too_tall, width=1280),
)
RULE = {rule.key: rule for rule in RULES}


def broken_rules(by_width: dict[int, dict], rules=RULES) -> dict[str, list[str]]:
    """``{rule key: what breaks it}`` for the rules a page breaks, from its measurements at each
    width; a width-free rule is read at every width measured, each finding said once."""
    found = {}
    for rule in rules:
        widths = [rule.width] if rule.width is not None else sorted(by_width, reverse=True)
        items = list(dict.fromkeys(item for w in widths if w in by_width for item in rule.broken(by_width[w])))
        if items:
            found[rule.key] = items
    return found


def measure_widths(tools, url: str) -> dict[int, dict]:
    """``url`` measured at each of ``WIDTHS``."""
    return {width: measure(tools, url, width) for width in WIDTHS}


# ------------------------------------------------------------------------------- measuring

def chapter_pages(root: Path, every_notebook: bool = False) -> list[str]:
    """The chapter pages of the book at ``root`` (``book/NN_*.html``), in _toc.yml's order; with
    ``every_notebook``, every notebook page (exercises and the appendix's notebooks too)."""
    from tools.book.layout import notebooks

    pages = [p.with_suffix(".html").as_posix() for p in notebooks(root)]
    return pages if every_notebook else [p for p in pages if re.match(r"book/\d\d[a-z]?_", p)]


def measure(tools, url: str, width: int, settle: float = 20) -> dict:
    """``MEASURE`` on ``url`` at ``width`` px once MathJax has typeset the page (it changes
    heights), in a tab closed afterwards."""
    import time

    from tools.book.browser import close_page, open_page_at

    session = open_page_at(tools, url, width=width)
    typeset = ("Array.from(document.querySelectorAll('.math.notranslate'))"
               ".every(e => e.querySelector('.MathJax, .MathJax_Display'))")
    try:
        deadline = time.monotonic() + settle
        while not tools.evaluate(session, typeset) and time.monotonic() < deadline:
            time.sleep(0.2)
        seen = tools.evaluate(session, MEASURE)
    finally:
        close_page(tools, url)
    if seen is None:
        raise RuntimeError(f"{url} at {width} px: the measurement failed: {tools.log[-3:]}")
    return seen


def summary(by_width: dict[int, dict]) -> dict:
    """The numbers the tool prints for one page."""
    wide, narrow = by_width[1280], by_width[390]
    widest = max(narrow["images"], key=lambda i: i["width"], default=None)
    return {"height": wide["height"], "code": len(visible_code_lines(wide)),
            "calls": len(bookkeeping_calls(wide)), "lessons": wide["lessons"], "folded": len(wide["folded"]),
            "credits": credit_count(wide), "raw": len(raw_numbers(wide)), "cut": len(cut_cells(wide)),
            "image": f"{widest['width']}/{narrow['column']}" if widest else f"-/{narrow['column']}",
            "scale": min((round(i["width"] / i["natural"], 2) for i in narrow["images"] if i["natural"]), default="-")}


COLUMNS = (("page", 29), ("height", 7), ("code", 5), ("calls", 5), ("lessons", 7), ("folded", 6),
           ("credits", 7), ("raw", 4), ("cut", 4), ("image", 9), ("scale", 5))


def main(argv=None) -> int:
    import argparse

    from tools.book.browser import INSTALL, find_chromium, served

    ap = argparse.ArgumentParser(prog="python -m tools.book.pages", description=__doc__.split("\n\n")[0])
    ap.add_argument("html", type=Path, help="a built book (the folder holding book/ and index.html)")
    ap.add_argument("--all", action="store_true", help="every notebook page, not only the chapters")
    ap.add_argument("--rules", action="store_true", help="then list what breaks each rule, page by page")
    ap.add_argument("--root", type=Path, default=None, help="the checkout whose _toc.yml lists the pages")
    args = ap.parse_args(argv)
    from tools.book.layout import find_root

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit(f"no Chromium on PATH: {INSTALL}")
    pages = [p for p in chapter_pages(find_root(args.root), args.all) if (args.html / p).exists()]
    print("  ".join(name.ljust(width) for name, width in COLUMNS))
    print("(height: px at 1280; code: visible code lines; calls: of them bookkeeping calls; folded: folded "
          "boxes; credits: credit paragraphs; raw: raw numbers; cut: cells cut short; image: widest image / "
          "column at 390 px; scale: the most a figure is shrunk there, shown / drawn width)")
    found = {}
    with tempfile.TemporaryDirectory() as profile, served(args.html, chromium, Path(profile)) as (tools, base):
        for page in pages:
            by_width = measure_widths(tools, f"{base}/{page}")
            row = {"page": page.removeprefix("book/").removesuffix(".html"), **summary(by_width)}
            print("  ".join(str(row[name]).ljust(width) for name, width in COLUMNS), flush=True)
            found[page] = broken_rules(by_width)
    if args.rules:
        for page, rules in found.items():
            for key, items in rules.items():
                print(f"\n{page}: {RULE[key].name}:\n  " + "\n  ".join(items[:12]) + (f"\n  ... {len(items) - 12} more" if len(items) > 12 else ""))
    broken = sum(bool(r) for r in found.values())
    print(f"\n{broken} of {len(found)} page(s) break a rule of the page model" + ("" if args.rules else " (--rules lists them)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

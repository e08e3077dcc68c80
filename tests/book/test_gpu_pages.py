"""The CPU-built book shows real GPU traces: every GPU chapter has a figure or a table read from
one, credited, and no page says that no GPU run exists (issue #35).

Over the built HTML (the ``built_book`` fixture: cpu preset, so the GPU sections read the borrowed
traces of ``kernels.borrowed``). "Credited" is precise, in one of two ways:

* the page's "Traces on this page" box (``kernels.borrowed.traces_box``, issue #42) credits each
  trace under a short name ("H100 Qwen"), and a figure or a table names one of them: in the
  output of the cell that shows it, or in the prose just before that cell;
* or the credit sentence that ``Borrowed.credit`` writes ("...: not this book's run.") is in the
  output of the same code cell as an ``<img>`` or a ``<table>``, or of the code cell just before
  or after one.
"""
from __future__ import annotations

import html as html_lib
import re
from html.parser import HTMLParser
from pathlib import Path

from tools.book import layout
from tests.helpers import ROOT

CREDIT = re.compile(r"not this book.s runs?\b")
NO_GPU_NOTICE = re.compile(r"no GPU run has been recorded", re.I)
# Chapters 0 to 10 (3b included) and chapter 12: the pages about GPU tracks. Chapter 11 runs
# ranks on CPU processes; its borrowed 128-rank pair is checked by tests/parallel.
GPU_CHAPTER = re.compile(r"^(0\d|10)b?_|^12_")


class _Cells(HTMLParser):
    """The source of each code cell's ``<div class="cell ...">``, nested divs included, and where
    each starts and ends in the page (``spans``)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.text, self.cells, self.spans = text, [], []
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._depth = 0          # divs open inside the current cell (0: not in a cell)
        self._start = 0

    def _offset(self) -> int:
        line, col = self.getpos()
        return self._line_starts[line - 1] + col

    def handle_starttag(self, tag, attrs):
        if tag != "div":
            return
        if self._depth:
            self._depth += 1
        elif "cell" in (dict(attrs).get("class") or "").split():
            self._depth, self._start = 1, self._offset()

    def handle_endtag(self, tag):
        if tag == "div" and self._depth:
            self._depth -= 1
            if not self._depth:
                self.cells.append(self.text[self._start:self._offset()])
                self.spans.append((self._start, self._offset()))


def code_cells(page_html: str) -> list[str]:
    """Each code cell of a built page, as its HTML (input and outputs)."""
    parser = _Cells(page_html)
    parser.feed(page_html)
    return parser.cells


def outputs(cell_html: str) -> str:
    """The part of a cell's HTML that is its output (empty when it printed nothing)."""
    at = cell_html.find('class="cell_output')
    return cell_html[at:] if at >= 0 else ""


def text_of(fragment: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", fragment))


# The box: who recorded which traces ("not this book's run"), then, folded, each trace's facts.
TRACES_BOX = re.compile(r'<div class="ap-traces".*?</div>', re.S)


def named_trace_shown(page_html: str) -> bool:
    """Whether the page's traces box credits a trace that a figure or a table names (in its
    cell's output or in the prose just before the cell)."""
    box = TRACES_BOX.search(page_html)
    if not box or not CREDIT.search(text_of(box.group(0))):
        return False
    names = [text_of(n).strip() for n in re.findall(r"<b>(.*?)</b>", box.group(0))]
    parser = _Cells(page_html)
    parser.feed(page_html)
    ends = [0] + [end for _, end in parser.spans]
    for (start, _), before, cell in zip(parser.spans, ends, parser.cells):
        out = outputs(cell)
        if ("<img" in out or "<table" in out) and "ap-traces" not in out:
            near = text_of(TRACES_BOX.sub("", page_html[before:start]) + out)
            if any(name in near for name in names):
                return True
    return False


def credited_trace_shown(page_html: str) -> bool:
    """Whether a figure or a table of a borrowed trace is credited: by name from the page's
    traces box, or by a credit in its cell's output or its neighbour's."""
    if named_trace_shown(page_html):
        return True
    shown = [outputs(c) for c in code_cells(page_html)]
    has_view = [("<img" in o or "<table" in o) for o in shown]
    for i, out in enumerate(shown):
        if CREDIT.search(html_lib.unescape(re.sub(r"<[^>]+>", " ", out))):
            if any(has_view[j] for j in (i - 1, i, i + 1) if 0 <= j < len(shown)):
                return True
    return False


def gpu_chapter_pages(html_root: Path) -> list[Path]:
    files = [Path(f) for f in layout.toc_files(ROOT / "_toc.yml")]
    return [html_root / f.with_suffix(".html") for f in files
            if f.parent.name == "book" and GPU_CHAPTER.match(f.name)]


def test_every_gpu_chapter_shows_a_real_gpu_trace_with_its_credit(built_book):
    """Every GPU chapter reads a borrowed trace, shown with its credit."""
    _, _, html = built_book
    pages = gpu_chapter_pages(html)
    assert len(pages) >= 13, [p.name for p in pages]
    missing = [p.name for p in pages if not credited_trace_shown(p.read_text())]
    assert not missing, ("these chapters show no figure or table of a real GPU trace, credited (named from "
                         "the page's traces box, or with its credit in the same or the next cell): " f"{missing}")


def test_no_page_says_no_gpu_run_was_recorded(built_book):
    _, _, html = built_book
    saying = [p.relative_to(html).as_posix() for p in sorted(html.rglob("*.html"))
              if "_static" not in p.parts and NO_GPU_NOTICE.search(p.read_text())]
    assert not saying, f"pages that still say no GPU run has been recorded: {saying}"


def test_the_page_checks_can_fail():
    """The reading above on hand-made pages: a credit beside a table passes; a credit far from any
    figure, a figure without a credit, and a credit only in the prose do not."""
    def cell(output: str) -> str:
        return ('<div class="cell docutils container"><div class="cell_input docutils container"><pre>x</pre></div>'
                f'<div class="cell_output docutils container"><div class="output">{output}</div></div></div>')
    credit = "<p>Recorded by someone on an H100 (MIT licence): not this book&#x27;s run.</p>"
    def page(*cells: str) -> str:
        return "<html><body>" + "\n".join(cells) + "</body></html>"

    table, image, text = "<table><tr><td>1</td></tr></table>", '<img src="a.png"/>', "<pre>42</pre>"
    assert credited_trace_shown(page(cell(credit + table)))
    assert credited_trace_shown(page(cell(credit), cell(image)))
    assert not credited_trace_shown(page(cell(credit), cell(text), cell(image)))
    assert not credited_trace_shown(page(cell(image), cell(table)))
    assert not credited_trace_shown(page(f"<p>{credit}</p>", cell(table)))
    assert len(code_cells(page(cell("<div><div></div></div>"), cell(text)))) == 2
    # the traces box: a figure or table naming a trace it credits, in its output or the prose before it
    from kernels.borrowed import TRACELENS, traces_box_html

    box = cell(traces_box_html({"H100 Qwen": TRACELENS["h100_qwen"]}))
    assert credited_trace_shown(page(box, cell(text), cell("<figcaption>H100 Qwen: one step</figcaption>" + image)))
    assert credited_trace_shown(page(box, cell(text), "<p>The H100 Qwen step, by kernel:</p>", cell(table)))
    assert not credited_trace_shown(page(box, cell(text), "<p>Some prose.</p>", cell(table))), "no view names the trace"
    assert not credited_trace_shown(page(box, cell(text), "<p>H100 Qwen</p>", cell(text), "<p>x</p>", cell(table))), \
        "the name is not next to the table"
    assert not credited_trace_shown(page(cell("<figcaption>H100 Qwen</figcaption>" + image))), "no box, no credit"
    assert NO_GPU_NOTICE.search("No GPU run has been recorded for it yet")

"""The page model's rules (tools/book/pages.py) on planted pages, without building the book.

A clean page is written in the markup myst-nb gives a chapter (a folded setup box, a traces box,
a visible call with its table, a cell of lessons with its input removed, a figure, a folded
solution), styled by the book's own pages.css and traces.css; each planted page adds one
violation to it. The clean page must break no rule at 1280 or 390 px (its 1,200 px figure and
its wide table fit the phone's column only through pages.css), and each planted page exactly
the rule it was planted for, naming what was planted. tests/book/test_browser_book.py applies
the same rules to every chapter page of the built book.
"""
from __future__ import annotations

import io
import shutil

import pytest

from tests.helpers import ROOT
from tools.book import pages

HEAD = """<!doctype html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Planted</title>
<link rel="stylesheet" href="traces.css"><link rel="stylesheet" href="pages.css">
<style>/* the theme's column: a centred article, 16 px from a phone's edges */
body {{ margin: 0; font: 16px/1.5 sans-serif; }} main {{ max-width: 740px; margin: 0 auto; padding: 0 16px; }}
</style>{style}</head><body><main><article class="bd-article">
<h1>A planted chapter</h1>
"""
FOOT = "</article></main></body></html>"


def code_cell(code: str, output: str = "", tags: str = "") -> str:
    """A cell as myst-nb writes it: its input shown, its output below."""
    return (f'<div class="cell docutils container {tags}"><div class="cell_input docutils container">'
            f'<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>{code}\n</pre></div></div></div>'
            + (f'<div class="cell_output docutils container">{output}</div>' if output else "") + "</div>\n")


def folded_cell(label: str, code: str, output: str = "", tags: str = "tag_hide-input") -> str:
    """A cell tagged hide-input: its input folded behind ``label``, its output shown."""
    return (f'<div class="cell {tags} docutils container"><details class="admonition hide above-input">'
            f'<summary aria-label="Toggle hidden content"><p class="collapsed admonition-title">{label}</p>'
            f'<p class="expanded admonition-title">Hide</p></summary><div class="cell_input docutils container">'
            f'<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>{code}\n</pre></div></div>'
            f'</div></details>' + (f'<div class="cell_output docutils container">{output}</div>' if output else "")
            + "</div>\n")


def output_cell(output: str, tags: str = "tag_remove-input") -> str:
    """A cell tagged remove-input: only its output is on the page."""
    return f'<div class="cell {tags} docutils container"><div class="cell_output docutils container">{output}</div></div>\n'


def stream(text: str) -> str:
    return (f'<div class="output stream highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
            f"{text}\n</pre></div></div>")


def dataframe(header: list[str], rows: list[list[str]], attrs: str = "") -> str:
    """A pandas DataFrame's HTML as a text/html output."""
    head = "".join(f"<th>{h}</th>" for h in ["", *header])
    body = "".join(f"<tr><th>{i}</th>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for i, row in enumerate(rows))
    return (f'<div class="output text_html"><div><style scoped>.dataframe thead th {{ text-align: right; }}</style>'
            f'<table border="1" class="dataframe"{attrs}><thead><tr style="text-align: right;">{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div></div>")


def lesson(claim: str) -> str:
    from kernels.notebook import say_html

    return f'<div class="output text_html">{say_html(f"✔ {claim}", kind="lesson")}</div>'


def credit_box() -> str:
    return ('<div class="output text_html"><div class="ap-traces" role="note"><p class="ap-traces-title">Traces on this page</p>'
            "<ul><li><b>H100 Qwen</b>: Qwen1.5-0.5B, one inference step in bfloat16 on an H100, recorded by AMD's "
            "TraceLens project (torch 2.5; MIT licence): not this book's run.</li></ul></div></div>")


def figure(src: str = "wide.png", phone: str | None = "phone.png", text_px: float | None = 13.9) -> str:
    """A figure as the built book shows it: its PNG, marked with its smallest text's size in the
    PNG's pixels, and the narrower copy a phone takes."""
    mark = f' data-text-px="{text_px}" data-phone-text-px="{text_px}"' if text_px else ""
    img = f'<img{mark} alt="A timeline of one forward, drawn 1,200 px wide" src="{src}" />'
    if phone:
        img = f'<picture><source media="(max-width: 600px)" srcset="{phone}">{img}</picture>'
    return (f'<figure class="align-default" id="id1">{img}'
            '<figcaption><p><span class="caption-number">Fig. 1 </span><span class="caption-text">One forward: '
            "the copy under masked_fill is the long bar.</span></p></figcaption></figure>")


WIDE_TABLE = dataframe(["op", "called from", "input shapes", "self time (ms)", "total time (ms)", "calls", "bytes"],
                       [["aten::masked_fill", "NaiveAttention.forward", "[[1, 8, 512, 512], [512, 512], []]", "4.537",
                         "119.3", "5", "2,147,483,648"],
                        ["aten::copy_", "aten::clone", "[[1, 8, 512, 512], [1, 8, 512, 512]]", "0.01234", "0.07000",
                         "5", "8,388,608"]])
CLEAN_BODY = "".join([
    folded_cell("Setup: install, parameters, imports",
                "import torch\nfrom kernels.notebook import glue, lesson, setup\ndevice, dtype = setup(device, dtype)\n"
                'glue("folded_code_is_not_on_the_page", 1)',
                stream("Parameters: device cpu, dtype float32, batch 1, heads 8, seq 512, head_dim 64, active_steps 5")),
    output_cell(credit_box()),
    '<p>The copy takes <span class="pasted-text">4.537</span> ms of the forward\'s '
    '<span class="pasted-text">119.3</span> ms; the error is at most <span class="pasted-text">5.3e-07</span>.</p>\n',
    code_cell("step = record.profile(naive, q, k, v)\ntables.op_table(step)", WIDE_TABLE),
    output_cell(lesson("masked_fill copies the S×S scores once per forward (1 clone)")
                + lesson("at its peak the forward holds at least two S×S buffers (8.0 MiB of 8.0 MiB)")),
    code_cell("timeline.timeline(step)", figure()),
    folded_cell("Solution", "def answer():\n    return 42", tags="tag_solution tag_hide-input"),
    # hide-output: the call shows, its long output (a listing) is folded for the reader to open
    '<div class="cell tag_hide-output docutils container"><div class="cell_input docutils container">'
    '<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>show_lines(ring.merge)\n'
    '</pre></div></div></div><details class="admonition hide below-input"><summary aria-label="Toggle hidden content">'
    '<p class="collapsed admonition-title">Show code cell output</p><p class="expanded admonition-title">Hide</p>'
    '</summary><div class="cell_output docutils container">' + stream("def merge(o1, lse1, o2, lse2): ...") +
    "</div></details></div>\n",
])

# One violation per rule: (rule key, what the page gains, text the finding must name).
PLANTED = [
    ("calls", code_cell('lesson(ok, "the copy is gone")'), 'lesson(ok, "the copy is gone")'),
    ("calls", code_cell("say(borrowed.TRACELENS['h100_qwen'].credit())"), ".credit()"),
    ("folded", folded_cell("Show code cell source", "gpu_only_branch()"), "Show code cell source"),
    ("folded", folded_cell("Show code cell content", "gpu_only_branch()", tags="tag_hide-cell"), "Show code cell content"),
    ("code", code_cell("\n".join(f"row_{i} = {i}" for i in range(61))), "65 visible code lines"),
    ("cut", output_cell(dataframe(["ops"], [["native_layer_norm, add, gelu ..."]])), "native_layer_norm, add, gelu ..."),
    ("raw", output_cell(stream("the forward took 4.536724 ms")), "4.536724"),
    ("raw", output_cell(dataframe(["bytes"], [["2.147484e+09"]])), "2.147484e+09"),
    ("raw", output_cell(stream("max|ref| 3.18e+00")), "3.18e+00"),
    ("credits", output_cell(credit_box()), "2 traces box(es)"),
    ("credits", output_cell(stream("Recorded by AMD's TraceLens project: not this book's run.")), "1 credit sentence"),
    # the rule pages.css had before issue #42: a figure 600 px wide, scrolling sideways on a phone
    ("image", "<style>@media (max-width: 640px) { article.bd-article .cell_output figure img { max-width: none; "
              "width: 600px; } .bd-article figure { overflow-x: auto; } }</style>" + code_cell("timeline.timeline(step)", figure("wide2.png")),
     "600 px wide"),
    # a figure with no phone's copy: 1,200 px shown in a column of about 350, its text at 0.29 of its size
    ("legible", code_cell("timeline.timeline(step)", figure("wide2.png", phone=None, text_px=None)), "of its drawn 1200 px"),
    # a phone's copy whose smallest text (8 px drawn) the column shrinks to about 6.5 px
    ("legible", code_cell("timeline.timeline(step)", figure("wide2.png", text_px=8)), "its smallest text (8 px drawn)"),
    ("table", output_cell(dataframe(["a very long column name"] * 7, [["a long cell value"] * 7],
                                    attrs=' style="display: table"')), "runs"),
    ("height", '<div style="height: 13000px"></div>', "px tall"),
]


@pytest.fixture(scope="module")
def planted_site(tmp_path_factory):
    """The clean page and each planted page, beside the book's CSS, a 1,200 × 400 px figure and its
    420 px phone's copy."""
    from PIL import Image

    site = tmp_path_factory.mktemp("planted")
    for css in ("pages.css", "traces.css"):
        shutil.copy2(ROOT / "book" / "_static" / css, site / css)
    png = io.BytesIO()
    Image.new("RGB", (1200, 400), (240, 240, 255)).save(png, format="PNG")
    (site / "wide.png").write_bytes(png.getvalue())
    (site / "wide2.png").write_bytes(png.getvalue())
    phone = io.BytesIO()
    Image.new("RGB", (420, 400), (240, 240, 255)).save(phone, format="PNG")
    (site / "phone.png").write_bytes(phone.getvalue())
    (site / "clean.html").write_text(HEAD.format(style="") + CLEAN_BODY + FOOT)
    for i, (_, extra, _) in enumerate(PLANTED):
        (site / f"planted_{i}.html").write_text(HEAD.format(style="") + CLEAN_BODY + extra + FOOT)
    return site


@pytest.fixture(scope="module")
def measured_pages(planted_site, tmp_path_factory):
    """Every page of the planted site measured at 1280 and 390 px, in one Chromium."""
    from tests.browser import served_in_chromium

    names = ["clean"] + [f"planted_{i}" for i in range(len(PLANTED))]
    with served_in_chromium(planted_site, tmp_path_factory.mktemp("profile")) as (tools, base):
        return {name: pages.measure_widths(tools, f"{base}/{name}.html") for name in names}


@pytest.mark.slow
def test_a_clean_page_breaks_no_rule_and_the_css_fits_its_figure_and_table_to_a_phone(measured_pages):
    clean = measured_pages["clean"]
    assert pages.broken_rules(clean) == {}
    phone = clean[390]
    image, table = phone["images"][0], phone["tables"][0]
    assert image["natural"] == 420 and image["width"] <= phone["column"], \
        f"a phone takes the figure's 420 px copy and pages.css scales it to the {phone['column']} px column: {image}"
    assert clean[1280]["images"][0]["natural"] == 1200, "a laptop takes the figure as drawn"
    assert table["over"] <= 1 and table["scrolls"], f"the wide table scrolls inside its own box: {table}"
    summary = pages.summary(clean)
    assert (summary["code"], summary["calls"], summary["lessons"], summary["folded"], summary["credits"]) == (4, 0, 2, 1, 1), \
        "the folded setup code and the solution are not visible code, a folded output is not a folded box; " \
        "the traces box is the one credit"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PLANTED)), ids=[f"{key}-{i}" for i, (key, _, _) in enumerate(PLANTED)])
def test_each_rule_fails_on_the_page_planted_for_it(measured_pages, index):
    key, _, named = PLANTED[index]
    broken = pages.broken_rules(measured_pages[f"planted_{index}"])
    assert list(broken) == [key], f"planted for '{pages.RULE[key].name}', broke {broken}"
    assert any(named in item for item in broken[key]), f"the finding names what was planted ({named!r}): {broken[key]}"


def test_every_rule_has_a_planted_page():
    assert {key for key, _, _ in PLANTED} == set(pages.RULE)

"""The course's figures as a reader sees them in the book's main column.

The book shows a figure's PNG (saved at the figure's dpi, cropped to its drawn extent as the
notebook's inline backend does) at its natural width, or scaled down to the column's width
when it is wider. Every text must then be at least ``figures.MIN_FONT_PX`` pixels; legends
list only what the figure draws and sit outside the data; timelines on a shared x axis show
every step whole. Tables: op_table's nesting and the copies table read in any HTML.
"""
from __future__ import annotations

import copy

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kernels.trace import diff as tracediff
from kernels.trace import reader
from kernels.trace import record
from kernels.cuda import threads
from kernels import figures
from kernels.triton import tiling
from kernels.trace import timeline as tl
from kernels.trace import tables
from tests.gpu_trace import forward_trace
from tests.helpers import png_width, too_small

matplotlib.use("Agg")

COLUMN_PX = figures.COLUMN_PX  # 676: the narrowest main column figure text is sized for (see the browser test below)


def stretched(data: dict, factor: float) -> dict:
    """The same trace with every time and duration multiplied by ``factor`` (a slower step)."""
    out = copy.deepcopy(data)
    for e in out["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(e.get(key), (int, float)):
                e[key] = e[key] * factor
    return out


@pytest.fixture
def naive_step():
    return reader.load_trace(forward_trace("naive")).steps("naive")[0]


def renderer_of(fig):
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure: give it an Agg canvas
        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def legend_clear_of_data(fig, ax, legend) -> bool:
    renderer = renderer_of(fig)
    return not overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


# ------------------------------------------------------------------------------------ the floor

def test_timeline_text_is_at_least_9px_in_the_column(naive_step):
    fig = tl.timeline(naive_step)
    assert not too_small(fig), f"timeline text below {figures.MIN_FONT_PX} px at {COLUMN_PX} px: {too_small(fig)}"
    labels = [t for t in fig.axes[0].texts if isinstance(t, tl.BarLabel) and t.get_text()]
    assert labels, "wide bars keep a label"


def test_bar_labels_fit_inside_their_bars(naive_step):
    fig = tl.timeline(naive_step)
    png_width(fig)
    renderer = renderer_of(fig)
    ax = fig.axes[0]
    for t in ax.texts:
        if isinstance(t, tl.BarLabel) and t.get_text():
            left, right = ax.transData.transform([(t.x0, 0), (t.x1, 0)])[:, 0]
            assert t.get_window_extent(renderer).width <= right - left, \
                f"the label {t.get_text()!r} spills out of its bar"


def test_timeline_legend_lists_only_the_categories_drawn(naive_step):
    for step in (naive_step, reader.load_trace(forward_trace("sdpa_flash")).steps("sdpa_flash")[0]):
        fig = tl.timeline(step)
        ax = fig.axes[0]
        category = {colour: label for label, colour in tl.LEGEND}
        drawn = {category[matplotlib.colors.to_hex(c.get_facecolor()[0])] for c in ax.collections
                 if len(c.get_facecolor())}
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert set(legend) == drawn and len(legend) == len(drawn), \
            f"the legend names exactly the categories drawn: legend {legend}, drawn {sorted(drawn)}"
        png_width(fig)
        assert legend_clear_of_data(fig, ax, ax.get_legend()), "the legend sits outside the tracks"


@pytest.mark.parametrize("order", ["long first", "short first"])
def test_shared_x_axis_spans_the_longest_step(order):
    data = forward_trace("naive")
    short = reader.load_trace(data).steps("naive")[0]
    long = reader.load_trace(stretched(data, 1.5)).steps("naive")[0]

    def span_ms(step):
        k, ops = step.gpu_work, step.ops
        return max([step.cpu_time_us] + (k["start_us"] + k["dur_us"]).tolist()
                   + (ops["start_us"] + ops["dur_us"]).tolist()) / 1e3

    assert span_ms(long) > 1.4 * span_ms(short)
    fig = Figure(figsize=(11, 6.5))
    axes = fig.subplots(2, 1, sharex=True)
    steps = (long, short) if order == "long first" else (short, long)
    for ax, step in zip(axes, steps):
        tl.timeline(step, ax=ax)
    for ax in axes:
        assert ax.get_xlim()[1] >= span_ms(long), \
            f"a shared x axis shows the longer step whole: limit {ax.get_xlim()[1]:.3f} ms, step {span_ms(long):.3f} ms"


# --------------------------------------------------------------------------- diff, tiles, threads

def test_diff_figure_text_and_legend():
    a = reader.load_trace(forward_trace("naive")).steps("naive")[0]
    b = reader.load_trace(forward_trace("inplace")).steps("inplace")[0]
    fig = tracediff.diff(a, b).figure()
    assert not too_small(fig), f"diff figure text below the floor: {too_small(fig)}"
    ax = fig.axes[0]
    assert legend_clear_of_data(fig, ax, ax.get_legend()), "the legend covers none of the rows"


@pytest.mark.parametrize("layout", ["alone", "two panels, 12 in (chapter 4)"])
def test_tiling_text_and_legend(layout):
    if layout == "alone":
        fig = tiling.draw_tiles(200, 32, 16, causal=True, program=2)
    else:
        fig = Figure(figsize=(12, 5.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        tiling.draw_tiles(200, 32, 16, causal=True, program=2, ax=left)
        tiling.draw_tiles(200, 32, 16, causal=False, program=2, ax=right)
    assert not too_small(fig), f"tiling text below the floor: {too_small(fig)}"
    for ax in fig.axes:
        assert legend_clear_of_data(fig, ax, ax.get_legend()), "the legend sits outside the grid"
        assert not overlaps(ax.get_legend().get_window_extent(), ax.xaxis.label.get_window_extent()), \
            "the legend clears the axis label"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_thread_map_text_and_key(head_dim):
    fig = threads.thread_map(head_dim=head_dim)
    try:
        assert not too_small(fig), f"thread map text below the floor: {too_small(fig)}"
        assert png_width(fig) <= COLUMN_PX, "the thread map is drawn at the column's width, shown unscaled"
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        assert len(legends) == 1, "one key to the warps' colours"
        for ax in fig.axes:
            if ax.images:
                assert legend_clear_of_data(fig, ax, legends[0]), "the key covers no panel"
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


# ------------------------------------------------------------------------------------ tables

@pytest.fixture(scope="module")
def cpu_naive(tmp_path_factory):
    """One recorded CPU forward of the naive attention: [1, 2, 64, 64] scores, nested ops."""
    import torch

    import kernels
    q = k = v = torch.randn(1, 2, 64, 16)
    return record.profile(kernels.get("naive"), q, k, v, label="naive", active=1,
                             trace_dir=tmp_path_factory.mktemp("traces")).step()


def test_op_table_nesting_survives_html(cpu_naive):
    table = tables.op_table(cpu_naive)
    ops = cpu_naive.ops[~cpu_naive.ops["is_view"]]
    assert (ops["depth"] >= 2).any(), "the naive forward nests (clone under masked_fill, copy_ under clone)"
    for op, name, depth in zip(table["op"], ops["name"], ops["depth"]):
        assert op == tables.NESTING * depth + name, f"one marker per level of nesting: {op!r} at depth {depth}"
    html = table.to_html()
    assert (tables.NESTING * 2 + "aten::copy_") in html, \
        "the nesting is in the HTML as visible characters (leading spaces would collapse there)"
    assert not any(op.startswith(" ") for op in table["op"]), "no leading spaces, which HTML collapses"


def test_copy_table_columns(cpu_naive):
    table = tables.copy_table(cpu_naive)
    assert list(table.columns) == ["op", "called from", "shape", "dtype", "size (KiB)", "time (µs)"], \
        "the unit is the header's (KiB: the largest copy, 1×2×64×64 floats, is 32 KiB)"
    assert set(table["shape"]) == {"1×2×64×64", "scalar"}, table
    assert table.loc[table["shape"] == "1×2×64×64", "size (KiB)"].item() == "32.00"
    assert table.loc[table["shape"] == "scalar", "size (KiB)"].item() == "< 0.01", \
        "a 4-byte copy next to a 32 KiB one reads as too small for the unit, not as 0"
    assert list(tables.copy_table(cpu_naive, min_bytes=2 * 64 * 64 * 4)["called from"]) == ["aten::clone"]
    assert not any(isinstance(v, list) for v in table.to_numpy().ravel()), "no raw lists in the table"
    assert "time (µs)" not in tables.copy_table(cpu_naive, times=False).columns
    assert "time (µs)" in tables.op_table(cpu_naive).columns and \
        "time (µs)" not in tables.op_table(cpu_naive, times=False).columns, "times=False: no one-sample times"


# ------------------------------------------------------------------------ the column, measured

COLUMN_WIDTH = """(() => {
  const out = document.querySelector("article.bd-article .cell_output");
  const img = document.querySelector("article.bd-article .cell_output img");
  return {column: out ? out.getBoundingClientRect().width : null,
          img: img ? [img.naturalWidth, img.getBoundingClientRect().width] : null};
})()"""


@pytest.mark.slow
def test_the_assumed_column_width_is_the_books(book_in_chromium):
    from tests.browser import open_page_at
    tools, base = book_in_chromium
    session = open_page_at(tools, f"{base}/book/02_inplace.html")
    seen = tools.evaluate(session, COLUMN_WIDTH)
    assert seen["column"] >= COLUMN_PX - 2, \
        f"figure text is sized for a column of at least {COLUMN_PX} px; the book's is {seen['column']} px at 1280 px"
    natural, shown = seen["img"]
    assert shown <= natural + 0.5, "a figure is never shown wider than its PNG (upscaled, blurred)"



def test_a_phone_gets_a_narrower_copy_of_a_wide_figure_with_text_at_the_same_size():
    import base64
    import struct

    fig = Figure(figsize=(8.5, 3))
    ax = fig.add_subplot()
    ax.plot([1, 2, 3])
    ax.set_title("a title", fontsize=11)
    fig.tight_layout()
    wide, meta = figures.figure_png(fig)
    phone = base64.b64decode(meta[figures.PHONE_METADATA])
    width = lambda png: struct.unpack(">I", png[16:20])[0]  # noqa: E731 (a PNG's IHDR width)
    assert width(phone) <= (figures.PHONE_WIDTH_IN + 0.25) * fig.dpi < width(wide), \
        "the phone's copy is drawn PHONE_WIDTH_IN wide (plus the tight crop's padding), narrower than the figure"
    assert fig.get_figwidth() == 8.5 and ax.title.get_fontsize() == 11, "drawing the copy leaves the figure as it was"
    assert meta[figures.TEXT_METADATA] == pytest.approx(figures.smallest_text_px(fig)) and \
        figures.smallest_text_px(fig) <= 11 * fig.dpi / 72, "the smallest text, in the PNG's pixels, travels too"
    shown = lambda png, px: px * min(1.0, figures.PHONE_COLUMN_PX / width(png))  # noqa: E731
    assert shown(phone, meta[figures.PHONE_TEXT_METADATA]) >= figures.PHONE_MIN_TEXT_PX - 0.1, \
        "on a phone the copy's smallest text shows at PHONE_MIN_TEXT_PX or more (raised where it would not)"
    narrow = Figure(figsize=(figures.PHONE_WIDTH_IN + 0.2, 3))
    narrow.add_subplot().plot([1, 2])
    _, narrow_meta = figures.figure_png(narrow)
    assert figures.PHONE_METADATA not in narrow_meta and figures.phone_copy(narrow) is None, \
        "a figure already about a phone's width has one copy"


def test_a_phone_copy_makes_room_for_a_legend_beside_its_axes():
    import struct

    fig = Figure(figsize=(8.5, 3))
    ax = fig.add_subplot()
    for i in range(3):
        ax.plot([1, 2, 3], [i, i + 1, i], label=f"a long series name number {i}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))   # outside the axes, on the right
    fig.tight_layout()
    phone, _ = figures.phone_copy(fig)
    assert struct.unpack(">I", phone[16:20])[0] <= 1.05 * (figures.PHONE_WIDTH_IN + 0.2) * fig.dpi, \
        "the axes narrow so that the legend beside them still fits a phone's copy"


def test_a_built_page_offers_the_phone_copy_to_a_phone(tmp_path):
    import base64
    import hashlib

    import nbformat
    from tools.book import html as book_html

    wide, phone = b"\x89PNG wide", b"\x89PNG phone"
    name = hashlib.sha256(wide).hexdigest() + ".png"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(wide).decode()},
                                           metadata={"image/png": {figures.PHONE_METADATA: base64.b64encode(phone).decode()}})]
    nb.cells = [cell]
    (tmp_path / "out" / "book").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "out" / "book" / "ch.ipynb")
    site = tmp_path / "html"
    (site / "_images").mkdir(parents=True)
    (site / "_images" / name).write_bytes(wide)
    (site / "book").mkdir()
    page = site / "book" / "ch.html"
    page.write_text(f'<figure><img alt="a" src="../_images/{name}" /></figure><img src="../_images/other.png" />')
    assert book_html.serve_phone_figures(tmp_path / "out", site) == 1
    assert (site / "_images" / name.replace(".png", "-phone.png")).read_bytes() == phone
    shown = page.read_text()
    assert f'<picture><source media="{book_html.PHONE_MEDIA}" srcset="../_images/{name[:-4]}-phone.png">' \
           f'<img alt="a" src="../_images/{name}" /></picture>' in shown, "the figure's <img> is wrapped, its src kept"
    assert '<picture><source media="(max-width: 600px)" srcset="../_images/other' not in shown, \
        "an image without a phone's copy is left alone"

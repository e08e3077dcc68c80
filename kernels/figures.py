"""The book's font floor: no figure text smaller than ``MIN_FONT_PX`` as the page shows it.

The book shows a figure's PNG (saved at the figure's dpi) at its natural size, or scaled down
to the main column's width (``COLUMN_PX``) when it is wider: an 11-inch figure at 100 dpi is
scaled by 676 / 1100, so its text needs about 10.5 pt.

- ``rendered_scale(width_px)``: how the page scales an image that wide;
- ``font_floor(fig)``: the smallest font size (points) that still renders at ``MIN_FONT_PX``;
- ``apply_font_floor(fig)``: raises every text of a figure below that size to it.

A leaf module (matplotlib only), so the trace, bench and chapter figures all import it.
"""
from __future__ import annotations

from typing import Optional

from matplotlib.text import Text

# The column figure text is sized for: a cell's output in an article 740 px wide with 32 px of
# padding either side, the narrowest a laptop shows (at 1280 px the article is wider, about
# 1,012 px, book/_static/pages.css; tests/trace/test_figures.py checks the column is never
# narrower when it builds the book). On a phone a figure shrinks further; a tap shows it whole.
COLUMN_PX = 676
MIN_FONT_PX = 9.0  # the smallest text a figure may show, in CSS pixels as the page renders it


def rendered_scale(width_px: float, column_px: float = COLUMN_PX) -> float:
    """How the page scales an image ``width_px`` wide: down to the column, never up."""
    return min(1.0, column_px / width_px)


def font_floor(fig, width_in: Optional[float] = None, column_px: float = COLUMN_PX,
               min_px: float = MIN_FONT_PX) -> float:
    """The smallest font size (points) that renders at ``min_px`` when ``fig`` (or a PNG of it
    ``width_in`` inches wide) is shown in the book's column.

    The notebook saves a figure cropped to what it draws plus 0.1 in of padding each side
    (``bbox_inches="tight"``), so a figure drawn to its edges gives a PNG 0.2 in wider than
    the figure: the floor is computed for that width."""
    width_px = (width_in or fig.get_figwidth() + 0.2) * fig.dpi
    pixels_per_point = fig.dpi / 72 * rendered_scale(width_px, column_px)
    return round(min_px / pixels_per_point + 0.05, 1)


def apply_font_floor(fig, width_in: Optional[float] = None) -> float:
    """Raise every text of ``fig`` (titles, labels, tick labels, legends, annotations) to at
    least ``font_floor(fig)``; returns that size. Call it after drawing, before the layout."""
    floor = font_floor(fig, width_in)
    raise_fonts(fig, floor)
    return floor


def raise_fonts(fig, floor: float) -> None:
    """Every text of ``fig`` smaller than ``floor`` points set to ``floor``."""
    for ax in fig.axes:
        for axis, which in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            ticks = axis.get_major_ticks()[:1] + axis.get_minor_ticks()[:1]
            if any(t.label1.get_fontsize() < floor for t in ticks) or not ticks:
                ax.tick_params(axis=which, which="both", labelsize=floor)
    for text in fig.findobj(Text):
        if text.get_fontsize() < floor:
            text.set_fontsize(floor)


# ----------------------------------------------------------------------------- a phone's copy
# On a phone the column is about 358 px: a figure drawn 8.5 in wide shows at 0.4 of its size and
# its 10-point text at 5 px. The book therefore also draws each figure PHONE_WIDTH_IN wide, its
# text at the same point sizes (the smallest raised where a phone would still show it under
# PHONE_MIN_TEXT_PX), and a phone's browser picks that copy (tools/book/html.py).
PHONE_WIDTH_IN = 4.0
PHONE_METADATA = "phone_png"  # where the copy travels: the PNG output's metadata, base64
TEXT_METADATA = "text_px"     # and the smallest text's size in the PNG's pixels, the figure's
PHONE_TEXT_METADATA = "phone_text_px"  # and the copy's
MIN_PHONE_AXES_IN = 2.0       # the narrowest a copy is drawn to make room for what sits beside its axes
PHONE_COLUMN_PX = 300         # a captioned figure's width on a 390 px screen: the column less the figure's margins
PHONE_MIN_TEXT_PX = 8.0       # the copy's smallest text as a phone shows it (the page rule's floor is 7.5)


def phone_copy(fig) -> Optional[tuple[bytes, float]]:
    """``fig`` drawn again ``PHONE_WIDTH_IN`` wide at its own height (a PNG), its layout redone
    for that width, long texts broken into lines and its smallest texts raised to what a phone
    shows at ``PHONE_MIN_TEXT_PX``; with its smallest text in the PNG's pixels. None where the
    figure is already that narrow or cannot be copied: the phone's copy is a convenience, and a
    figure it fails on keeps its one copy."""
    if fig.get_figwidth() <= PHONE_WIDTH_IN + 0.3:
        return None
    for wrap in (True, False):  # matplotlib cannot wrap some texts (a bar's label): then unwrapped
        try:
            return _narrow_enough(fig, wrap)
        except Exception:
            continue
    return None


def _narrow_enough(fig, wrap: bool) -> tuple[bytes, float]:
    """The copy, drawn narrower again while what sits outside its axes (a legend beside them, a
    long tick label) makes the PNG wider than a phone's copy should be, the axes taking the cut;
    then, if its smallest text would show under ``PHONE_MIN_TEXT_PX``, with that text raised."""
    target_px, width = (PHONE_WIDTH_IN + 0.2) * fig.dpi, PHONE_WIDTH_IN
    best, _ = _narrow_png(fig, width, wrap)
    for _ in range(3):
        over_px = _png_width(best) - target_px
        if over_px <= 0.05 * target_px or width - over_px / fig.dpi < MIN_PHONE_AXES_IN:
            break
        width -= over_px / fig.dpi
        png, axes_in = _narrow_png(fig, width, wrap)
        # A layout that cannot shrink spills further out, or squeezes its axes to nothing: keep the last good one.
        if _png_width(png) >= _png_width(best) or axes_in < MIN_PHONE_AXES_IN / 2:
            break
        best = png
    smallest_pt = smallest_text_px(fig) * 72 / fig.dpi
    floor_pt = PHONE_MIN_TEXT_PX / (fig.dpi / 72 * min(1.0, PHONE_COLUMN_PX / _png_width(best)))
    if smallest_pt >= floor_pt:
        return best, smallest_text_px(fig)
    raised, _ = _narrow_png(fig, width, wrap, min_pt=round(floor_pt + 0.05, 1))
    shown = lambda png, pt: pt * min(1.0, PHONE_COLUMN_PX / _png_width(png))  # noqa: E731
    if shown(raised, floor_pt) > shown(best, smallest_pt):   # larger text can widen the layout: keep the better
        return raised, round(round(floor_pt + 0.05, 1) * fig.dpi / 72, 1)
    return best, smallest_text_px(fig)


def _narrow_png(fig, width_in: float, wrap: bool, min_pt: float = 0.0) -> tuple[bytes, float]:
    """The copy ``width_in`` wide (no text under ``min_pt``), and the width (in) of its narrowest
    axes as drawn."""
    import io
    import pickle
    import warnings

    copy = pickle.loads(pickle.dumps(fig))  # drawing the copy leaves the reader's figure as it was
    copy.set_size_inches(width_in, fig.get_figheight())
    if min_pt:
        raise_fonts(copy, min_pt)
    if wrap:
        for text in copy.findobj(Text):
            text.set_wrap(True)  # a title or a label longer than the narrow figure breaks into lines
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tight_layout's "not compatible" notes: the copy is best effort
        if copy.get_layout_engine() is None:
            copy.tight_layout()
        buffer = io.BytesIO()
        copy.savefig(buffer, format="png", bbox_inches="tight")
    axes_in = min((ax.get_position().width * width_in for ax in copy.axes if ax.get_visible()), default=width_in)
    return buffer.getvalue(), axes_in


def smallest_text_px(fig) -> float:
    """The smallest text ``fig`` draws, in pixels of its PNG (points at its dpi): how small its
    text reads once the page scales the PNG (``TEXT_METADATA``, measured at 390 px)."""
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return round(min(sizes, default=0.0) * fig.dpi / 72, 1)


def figure_png(fig):
    """IPython's PNG of ``fig`` (as ``%matplotlib inline`` saves it); its metadata carries its
    smallest text's size in PNG pixels and, if the figure needs one, the phone's copy and that
    copy's smallest text."""
    import base64

    from IPython.core.pylabtools import print_figure

    png = print_figure(fig, "png", bbox_inches="tight")
    meta: dict[str, object] = {TEXT_METADATA: smallest_text_px(fig)}
    phone = phone_copy(fig)
    if phone and _png_width(phone[0]) < _png_width(png):   # a copy no narrower is no help
        meta[PHONE_METADATA] = base64.b64encode(phone[0]).decode("ascii")
        meta[PHONE_TEXT_METADATA] = phone[1]
    return png, meta


def _png_width(png: bytes) -> int:
    import struct

    return struct.unpack(">I", png[16:20])[0]   # a PNG's width is in its header

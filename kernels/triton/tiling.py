"""Chapter 4: how FlashAttention tiles the S×S score matrix, and what causal attention skips.

A program owns ``block_m`` query rows and walks the keys ``block_n`` at a time, so the
scores are a grid of tiles, each **full** (computed with no mask), **masked** (crossing the
causal diagonal or the ragged end of the sequence) or **skipped** (entirely in the future).
``tile_map`` classifies the tiles from the geometry alone, ``computed_fraction`` counts what
a causal program still computes ((n+1)/(2n) of the grid for n query tiles: half, plus the
diagonal), and ``draw_tiles`` draws the grid with one program's Q, K and V tiles picked out.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from kernels.figures import apply_font_floor, font_floor

SKIPPED, MASKED, FULL = 0, 1, 2
CLASS_NAMES = {SKIPPED: "skipped", MASKED: "masked", FULL: "full"}
# Skipped tiles pale (nothing happens there), masked orange and full blue, as the
# timelines colour mask and matmul work.
CLASS_COLOURS = {SKIPPED: "#eeeeee", MASKED: "#ff9f4a", FULL: "#5b8fd1"}
PROGRAM_COLOUR = "#2ca02c"


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _tile_edges(seq: int, block: int) -> np.ndarray:
    """Token positions where tiles start, plus ``seq`` at the end (the last tile may be short)."""
    return np.append(np.arange(0, seq, block), seq)


def tile_map(seq: int, block_m: int, block_n: int, causal: bool = True) -> np.ndarray:
    """Classify every tile of the ``seq × seq`` score matrix.

    Returns an int array of shape ``[ceil(seq / block_m), ceil(seq / block_n)]``: row ``i``
    is query tile ``i`` (one program), column ``j`` is key tile ``j``; entries are
    ``FULL``, ``MASKED`` or ``SKIPPED``. Only real tokens count: a tile that reaches past
    the sequence is masked (its extra columns must read as -inf), never full.
    """
    for name, value in (("seq", seq), ("block_m", block_m), ("block_n", block_n)):
        _check_positive_int(name, value)
    rows = _tile_edges(seq, block_m)
    cols = _tile_edges(seq, block_n)
    first_row, last_row = rows[:-1, None], rows[1:, None] - 1
    first_col, last_col = cols[None, :-1], cols[None, 1:] - 1
    ragged = (first_col + block_n) > seq          # the key tile hangs past the last token
    if causal:
        # Row r sees columns c <= r. A tile is skipped when even its last row sees none of
        # its columns, and full when even its first row sees all of them.
        skipped = first_col > last_row
        full = (last_col <= first_row) & ~ragged
    else:
        skipped = np.zeros((len(rows) - 1, len(cols) - 1), dtype=bool)
        full = np.broadcast_to(~ragged, skipped.shape)
    return np.where(skipped, SKIPPED, np.where(full, FULL, MASKED))


def tile_counts(tiles: np.ndarray) -> dict[str, int]:
    """How many tiles of each class: ``{"full": ..., "masked": ..., "skipped": ...}``."""
    return {CLASS_NAMES[c]: int((tiles == c).sum()) for c in (FULL, MASKED, SKIPPED)}


def computed_fraction(seq: int, block_m: int, block_n: int) -> float:
    """Tiles a causal pass computes (full + masked) over the tiles a non-causal pass computes.

    Every computed tile costs the same (a masked lane is computed, then discarded), so
    this is the causal kernel's share of the non-causal kernel's work.
    """
    causal = int((tile_map(seq, block_m, block_n, causal=True) != SKIPPED).sum())
    full = int((tile_map(seq, block_m, block_n, causal=False) != SKIPPED).sum())
    return causal / full


def draw_tiles(seq: int, block_m: int, block_n: int, causal: bool = True,
               program: Optional[int] = None, ax=None, title: Optional[str] = None) -> Figure:
    """Draw the tile grid of ``tile_map``; with ``program``, pick out what that program touches.

    Axes are in tokens (keys across, queries down), so a ragged last tile is drawn
    narrower. With ``program = i``, the strip left of the grid marks the Q tile the
    program loads once, the strip above marks the K/V tiles it streams (in their class
    colour; the ones it skips stay pale), and its row of score tiles is outlined. Text keeps
    the book's font floor for the figure's width (``kernels.figures.font_floor``); the legend sits
    under the axis label, outside the grid. Returns the Figure (``ax``'s when one is given).
    """
    tiles = tile_map(seq, block_m, block_n, causal)
    if program is not None:
        if not isinstance(program, (int, np.integer)) or isinstance(program, bool):
            raise TypeError(f"program must be an int, got {type(program).__name__} {program!r}")
        if not 0 <= program < tiles.shape[0]:
            raise ValueError(f"program must be in 0..{tiles.shape[0] - 1} (one per query tile), got {program}")
    if ax is None:
        fig = Figure(figsize=(5.2, 5.2), layout="constrained")
        ax = fig.add_subplot()
    fig = ax.figure
    size = max(font_floor(fig), 9.0)  # notes and legend: the floor, and never below 9 pt
    rows, cols = _tile_edges(seq, block_m), _tile_edges(seq, block_n)
    cmap = ListedColormap([CLASS_COLOURS[c] for c in (SKIPPED, MASKED, FULL)])
    ax.pcolormesh(cols, rows, tiles, cmap=cmap, vmin=-0.5, vmax=2.5, edgecolors="white", linewidth=1.0)
    if causal:
        ax.plot([0, seq], [0, seq], color="black", lw=1, ls="--")  # key == query: the diagonal
    strip = max(seq * 0.04, 1.0)  # width of the Q and K/V strips, in tokens
    if program is not None:
        y0, y1 = rows[program], rows[program + 1]
        ax.add_patch(Rectangle((0, y0), seq, y1 - y0, fill=False, lw=2.5, ec=PROGRAM_COLOUR, clip_on=False))
        # The Q tile, right of the grid: loaded once, kept on-chip for the whole loop.
        ax.add_patch(Rectangle((seq + 0.5 * strip, y0), strip, y1 - y0, color=PROGRAM_COLOUR, clip_on=False))
        ax.text(seq + 1.8 * strip, (y0 + y1) / 2, f"query\ntile {program}", va="center",
                fontsize=size, color=PROGRAM_COLOUR, clip_on=False)
        # The K/V tiles, above the grid, coloured by what the program does with each.
        for j, cls in enumerate(tiles[program]):
            ax.add_patch(Rectangle((cols[j], -1.5 * strip), cols[j + 1] - cols[j], strip,
                                   color=CLASS_COLOURS[cls], ec="white", clip_on=False))
        ax.text(seq + 0.5 * strip, -strip, "K, V tiles it\nstreams", va="center", fontsize=size,
                clip_on=False)
    ax.set_xlim(0, seq)
    ax.set_ylim(seq, 0)  # query 0 at the top, as the matrix is written
    ax.set_aspect("equal")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    counts = tile_counts(tiles)
    handles = [Patch(color=CLASS_COLOURS[c], label=f"{CLASS_NAMES[c]} ({counts[CLASS_NAMES[c]]})")
               for c in (FULL, MASKED, SKIPPED)]
    ax.set_title(title or (f"{'causal' if causal else 'full'}: S={seq}, "
                           f"BLOCK_M={block_m}, BLOCK_N={block_n}"), fontsize=max(10, size),
                 pad=24 if program is not None else 6)  # room for the K/V strip above the grid
    apply_font_floor(fig)
    # Below the tick labels and the axis label, outside the grid: ticks (3.5 pt) and their pad
    # (3.5 pt), a line of tick labels, the label's pad (4 pt), a line of label, 4 pt of air.
    below_pt = 15 + 1.25 * (ax.xaxis.get_major_ticks()[0].label1.get_fontsize() + ax.xaxis.label.get_fontsize())
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=size,
              frameon=False, borderaxespad=below_pt / size, handlelength=1.2, columnspacing=1.2)
    return fig


def expected_fraction(n_query_tiles: int) -> float:
    """``(n+1)/(2n)``: the causal fraction for ``seq = n·block_m`` with ``block_n`` dividing ``block_m``."""
    _check_positive_int("n_query_tiles", n_query_tiles)
    return (n_query_tiles + 1) / (2 * n_query_tiles)



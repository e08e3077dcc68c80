"""Chapter 5's who-owns-what: which thread computes which element of a tile, in both kernels.

The index formulas of ``flash_v1.cu`` and ``flash_v2.cu`` written out in NumPy, element by
element, for the chapter to draw (tests/cuda/test_cuda_threads.py runs the kernels' own index
code on the host and checks these maps against what each thread writes):

* ``owners_v1_scores``, ``owners_v1_softmax``, ``owners_v1_output``: the thread of each
  element in v1's three phases (scores, online softmax, ``O += P V``).
* ``owners_v2(cols)``: the thread holding each accumulator of v2's S or O tile, the C
  fragment layout of ``mma.m16n8k16``.
* ``thread_map(head_dim)``: the figure of all four, coloured by warp.
* ``rows_of_warps(owners)``: the rows of a tile each warp's threads touch.
"""
from __future__ import annotations

import numpy as np

from kernels.cuda import flash as cuda_flash
from kernels.cuda.resources import MMA_M, MMA_N, WARP


def owners_v1_scores(block_m: int = 32, block_n: int = 32, threads: int = 128) -> np.ndarray:
    """Thread computing each score S[r][c] in v1's phase 1: c = tid % N, r = tid / N + i * (threads / N)."""
    owner = np.full((block_m, block_n), -1)
    row_stride = threads // block_n
    for tid in range(threads):
        owner[tid // block_n::row_stride, tid % block_n] = tid
    return owner


def owners_v1_softmax(block_m: int = 32, block_n: int = 32) -> np.ndarray:
    """Thread computing row r's softmax in v1's phase 2: thread r (threads >= block_m sit idle)."""
    return np.repeat(np.arange(block_m)[:, None], block_n, axis=1)


def owners_v1_output(head_dim: int, block_m: int = 32, threads: int = 128) -> np.ndarray:
    """Thread accumulating O[r][d] in v1's phase 3: d = tid % D, r = tid / D + i * (threads / D)."""
    owner = np.full((block_m, head_dim), -1)
    row_stride = threads // head_dim
    for tid in range(threads):
        owner[tid // head_dim::row_stride, tid % head_dim] = tid
    return owner


def owners_v2(cols: int, block_m: int = 128, threads: int = 256) -> np.ndarray:
    """Thread holding accumulator (r, c) of v2's S (cols = 64 keys) or O (cols = head_dim) tile.

    Warp w owns rows 16w..16w+15; in it lane = 4g + t holds rows g and g+8, columns 2t and
    2t+1 of every 8-column tile (the C fragment of mma.m16n8k16).
    """
    owner = np.full((block_m, cols), -1)
    for tid in range(threads):
        warp, lane = divmod(tid, WARP)
        g, t = divmod(lane, 4)
        for row in (warp * MMA_M + g, warp * MMA_M + g + 8):
            for tile in range(cols // MMA_N):
                owner[row, tile * MMA_N + 2 * t: tile * MMA_N + 2 * t + 2] = tid
    return owner


def rows_of_warps(owners: np.ndarray) -> dict[int, set[int]]:
    """{warp: the rows of ``owners`` (a map of thread ids, -1 for none) its threads hold an
    element of}: in v2 each warp's set is 16 whole rows, in v1's output phase rows are shared."""
    rows: dict[int, set[int]] = {}
    for r, c in zip(*np.nonzero(owners >= 0)):
        rows.setdefault(int(owners[r, c]) // WARP, set()).add(int(r))
    return dict(sorted(rows.items()))


def thread_map(head_dim: int = 64, lane: int = 5):
    """Four panels: which warp computes which element in v1's three phases (4 warps) and in
    v2 (8 warps, 128 query rows).

    Colours are warps; in the v2 panel the elements of one lane of warp 0 are outlined. The
    figure is about as wide as the book's column (so it is shown unscaled), its text keeps
    the font floor (``kernels.figures.font_floor``) and the key to the colours sits in the empty cell
    beside v2, never over the data.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.figure import Figure  # here, with what it draws with: only the figure needs matplotlib

    from kernels.figures import COLUMN_PX, apply_font_floor

    v2 = cuda_flash.launch_config("v2", head_dim)
    v2_owner = owners_v2(v2.block_n, v2.block_m, v2.threads)  # the S tile: [block_m, block_n]
    warps = v2.threads // WARP
    colours = ListedColormap(["#f2f2f2", "#4c72b0", "#dd8452", "#55a868", "#c44e52",
                              "#8172b3", "#937860", "#da8bc3", "#8c8c8c"][:warps + 1])
    panels = {
        "p1": ("v1 phase 1\nscores S", owners_v1_scores()),
        "p2": ("v1 phase 2\nsoftmax", owners_v1_softmax()),
        "p3": (f"v1 phase 3\noutput O (32 × {head_dim})", owners_v1_output(head_dim)),
        "v2": (f"v2: S accumulators ({v2.block_m} × {v2.block_n});\nO's columns follow the same pattern", v2_owner),
    }
    fig = Figure(figsize=(0.98 * COLUMN_PX / 100, 5.6), dpi=100, layout="constrained")
    axes = fig.subplot_mosaic([["p1", "p2", "p3", "p3"], ["v2", "v2", ".", "."]], height_ratios=[1, 2.6])
    for name, (title, owner) in panels.items():
        ax = axes[name]
        warp = np.where(owner >= 0, owner // WARP + 1, 0)
        ax.imshow(warp, cmap=colours, vmin=0, vmax=warps, interpolation="nearest", aspect="equal")
        ax.set_title(title, loc="left")
        rows, cols = owner.shape
        xstep = 16 if cols <= 64 else 32
        ax.set_xticks(list(range(0, cols - xstep // 2, xstep)) + [cols - 1])
        ystep = 16 if rows <= 64 else 32
        ax.set_yticks(list(range(0, rows - ystep // 2, ystep)) + [rows - 1])
        if name in ("p2", "p3"):  # the same 32 rows as phase 1, labelled there
            ax.tick_params(axis="y", labelleft=False)
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
    axes["p1"].set_ylabel("query row")
    axes["v2"].set_ylabel("query row")
    axes["v2"].set_xlabel("column (key, or d of the output)")
    rows, cols = np.nonzero(v2_owner == lane)
    axes["v2"].scatter(cols, rows, s=6, marker="s", facecolors="none", edgecolors="black", linewidths=0.7)
    handles: list = [Rectangle((0, 0), 1, 1, color=colours(i + 1)) for i in range(warps)]
    handles.append(Line2D([], [], ls="", marker="s", markerfacecolor="none", markeredgecolor="black"))
    apply_font_floor(fig)
    # In the empty cell right of v2 (the mosaic's "."), level with v2's middle.
    fig.legend(handles, [f"warp {i} (threads {32 * i}-{32 * i + 31})" + (" (v2 only)" if i >= 4 else "")
                         for i in range(warps)]
               + [f"lane {lane} of warp 0 (v2)"], loc="center left", bbox_to_anchor=(0.53, 0.36),
               frameon=False, title="who computes each element", fontsize=axes["v2"].xaxis.label.get_fontsize(),
               title_fontsize=axes["v2"].xaxis.label.get_fontsize())
    return fig


"""The tile classification of kernels.triton.tiling, against grids counted by hand.

F = full (no mask needed), M = masked, . = skipped. In every hand-drawn grid, row i is
query tile i (rows i·block_m .. (i+1)·block_m - 1) and column j is key tile j.
"""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from kernels.triton import tiling
from kernels.triton.tiling import FULL, MASKED, SKIPPED

CODE = {"F": FULL, "M": MASKED, ".": SKIPPED}


def grid(*rows: str) -> np.ndarray:
    return np.array([[CODE[c] for c in row] for row in rows])


HAND_COUNTED = [
    # seq 4, 2x2 tiles, causal: query rows 0-1 see keys 0-1 only partly (row 0 not key 1),
    # keys 2-3 not at all; rows 2-3 see keys 0-1 fully, keys 2-3 partly.
    ((4, 2, 2, True), grid("M.",
                           "FM")),
    # seq 5, 2x2 tiles, full: the last key tile holds key 4 only and hangs past the end.
    ((5, 2, 2, False), grid("FFM",
                            "FFM",
                            "FFM")),
    # seq 5, 2x2 tiles, causal: the last query tile is row 4, which sees keys 0-3 fully and
    # its own key 4 in a tile that is both diagonal and ragged.
    ((5, 2, 2, True), grid("M..",
                           "FM.",
                           "FFM")),
    # seq 8, block_m 4 = 2 x block_n 2 (the kernel's shape of tiles), causal: the diagonal
    # of each query tile crosses two key tiles, and both need a mask (row 0 cannot see key 1,
    # rows 0-2 cannot see key 3).
    ((8, 4, 2, True), grid("MM..",
                           "FFMM")),
    # block_m smaller than block_n: query tile 1 is row 1 alone, which sees keys 0 and 1.
    ((4, 1, 2, True), grid("M.",
                           "F.",
                           "FM",
                           "FF")),
    # A single token: the one tile hangs past the end (block 16 > seq 1), so it is masked.
    ((1, 16, 16, True), grid("M")),
    ((1, 16, 16, False), grid("M")),
    # 1x1 tiles need no mask anywhere: the diagonal entry itself is visible.
    ((3, 1, 1, True), grid("F..",
                           "FF.",
                           "FFF")),
]


@pytest.mark.parametrize("args,expected", HAND_COUNTED)
def test_tile_map_matches_hand_counted_grids(args, expected):
    np.testing.assert_array_equal(tiling.tile_map(*args), expected)


def test_tile_counts():
    # grid (8, 4, 2, causal) above: F F (row 1), M M M M, . . (row 0).
    assert tiling.tile_counts(tiling.tile_map(8, 4, 2, True)) == {"full": 2, "masked": 4, "skipped": 2}


def test_classification_agrees_with_every_entry():
    """Brute force on odd sizes: a tile is skipped iff every entry is hidden (future or past the
    end), full iff none is, masked otherwise."""
    for seq, bm, bn in [(17, 4, 2), (23, 8, 8), (13, 2, 4), (31, 16, 4)]:
        for causal in (True, False):
            tiles = tiling.tile_map(seq, bm, bn, causal)
            for i in range(tiles.shape[0]):
                for j in range(tiles.shape[1]):
                    rows = np.arange(i * bm, min((i + 1) * bm, seq))[:, None]
                    cols = np.arange(j * bn, (j + 1) * bn)[None, :]   # may reach past seq
                    visible = cols < seq
                    if causal:
                        visible = visible & (cols <= rows)
                    want = SKIPPED if not visible.any() else FULL if visible.all() else MASKED
                    assert tiles[i, j] == want, (seq, bm, bn, causal, i, j)


def kernel_stages(seq: int, block_m: int, block_n: int, causal: bool) -> np.ndarray:
    """The tiles `attn_fwd` in kernels/triton/flash.py visits, from its two loop bounds:
    stage 1 (no mask) covers keys [0, full_hi), stage 2 (masked) covers [full_hi, masked_hi),
    with full_hi = start_m·BLOCK_M and masked_hi = min((start_m+1)·BLOCK_M, S) when causal,
    and full_hi = (S // BLOCK_N)·BLOCK_N, masked_hi = S when not."""
    n_m, n_n = math.ceil(seq / block_m), math.ceil(seq / block_n)
    out = np.full((n_m, n_n), SKIPPED)
    for start_m in range(n_m):
        if causal:
            full_hi, masked_hi = start_m * block_m, min((start_m + 1) * block_m, seq)
        else:
            full_hi, masked_hi = (seq // block_n) * block_n, seq
        for start_n in range(0, full_hi, block_n):
            out[start_m, start_n // block_n] = FULL
        for start_n in range(full_hi, masked_hi, block_n):
            out[start_m, start_n // block_n] = MASKED
    return out


@pytest.mark.parametrize("seq", [1, 17, 64, 113, 203, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_the_kernels_two_stages_visit_exactly_these_tiles(seq, causal):
    # BLOCK_M a multiple of BLOCK_N (the kernel's rule) and both > 1, as in every config.
    for bm, bn in [(64, 32), (128, 64), (32, 32)]:
        np.testing.assert_array_equal(tiling.tile_map(seq, bm, bn, causal),
                                      kernel_stages(seq, bm, bn, causal))


@pytest.mark.parametrize("n,r", [(1, 1), (2, 2), (3, 4), (16, 2), (7, 1)])
def test_causal_fraction_is_n_plus_1_over_2n(n, r):
    # seq = n·block_m, block_m = r·block_n: query tile i computes r·i full + r masked tiles,
    # r·n(n+1)/2 in all, against r·n·n without the mask.
    block_n = 16
    block_m = r * block_n
    frac = tiling.computed_fraction(n * block_m, block_m, block_n)
    assert frac == pytest.approx((r * n * (n + 1) / 2) / (r * n * n))
    assert frac == pytest.approx(tiling.expected_fraction(n))


@pytest.mark.parametrize("bad,err", [
    (dict(seq=0), ValueError), (dict(block_m=0), ValueError), (dict(block_n=-1), ValueError),
    (dict(seq=4.0), TypeError), (dict(block_m=True), TypeError),
])
def test_bad_sizes_are_refused(bad, err):
    args = dict(seq=8, block_m=4, block_n=2)
    args.update(bad)
    with pytest.raises(err):
        tiling.tile_map(**args)


def test_draw_tiles_colours_each_tile_by_its_class():
    fig = tiling.draw_tiles(200, 64, 32, causal=True, program=2)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    (mesh,) = ax.collections
    np.testing.assert_array_equal(np.asarray(mesh.get_array()).reshape(4, 7),
                                  tiling.tile_map(200, 64, 32, True))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["full (12)", "masked (7)", "skipped (9)"]
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=30)   # a Figure needs no pyplot backend
    assert png.getvalue()[:4] == b"\x89PNG"


def test_draw_tiles_on_given_axes_and_bad_program():
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert tiling.draw_tiles(64, 16, 16, causal=False, ax=right) is fig
    assert not left.collections and right.collections
    with pytest.raises(ValueError):
        tiling.draw_tiles(64, 16, 16, program=4)   # 64 / 16 = 4 programs: 0..3
    with pytest.raises(TypeError):
        tiling.draw_tiles(64, 16, 16, program=1.0)

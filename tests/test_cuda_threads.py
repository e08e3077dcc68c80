"""kernels.cuda.threads: who owns what, the kernels' index formulas element by element, and their figure."""
from __future__ import annotations

import numpy as np
import pytest

import kernels.cuda.flash as cf
from kernels.cuda import threads as ct


def each_thread_owns(owner: np.ndarray, threads: int = 128) -> set:
    assert (owner >= 0).all(), "an element nobody computes"
    return set(np.bincount(owner.ravel(), minlength=threads).tolist())


def test_v1_scores_split_evenly_with_one_key_column_per_thread():
    owner = ct.owners_v1_scores()
    # 32 x 32 scores over 128 threads: 8 each, all in the column tid % 32.
    assert each_thread_owns(owner) == {32 * 32 // 128}
    cols = np.broadcast_to(np.arange(32), owner.shape)
    assert (owner % 32 == cols).all()
    # Warp w (threads 32w..32w+31) computes rows w, w+4, w+8, ...
    assert ((owner // 32) == (np.arange(32)[:, None] % 4)).all()


def test_v1_softmax_is_warp_zero_only():
    owner = ct.owners_v1_softmax()
    assert set(np.unique(owner // 32)) == {0}
    assert (owner[:, 0] == np.arange(32)).all()


@pytest.mark.parametrize("head_dim", cf.HEAD_DIMS)
def test_v1_output_gives_each_thread_one_column(head_dim):
    owner = ct.owners_v1_output(head_dim)
    assert owner.shape == (32, head_dim)
    assert each_thread_owns(owner) == {32 * head_dim // 128}
    assert (owner % head_dim == np.arange(head_dim)).all()


@pytest.mark.parametrize("cols", [64, 128])
def test_v2_fragments_cover_the_tile_and_keep_rows_in_one_warp(cols):
    cfg = cf.launch_config("v2", cols)
    owner = ct.owners_v2(cols, cfg.block_m, cfg.threads)
    assert owner.shape == (cfg.block_m, cols)
    # Per lane: 2 rows x 2 columns of each 8-column tile = 4 * cols / 8 accumulators.
    assert each_thread_owns(owner, cfg.threads) == {4 * cols // 8}
    for w in range(cfg.threads // 32):
        rows = np.unique(np.nonzero((owner // 32) == w)[0])
        assert rows.tolist() == list(range(16 * w, 16 * w + 16))
    # Lane 5 of warp 0: g = 1, t = 1 -> rows 1 and 9, columns 2 and 3 of each tile.
    r, c = np.nonzero(owner == 5)
    assert set(r) == {1, 9} and set(c % 8) == {2, 3}


def test_thread_map_draws_four_panels():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = ct.thread_map(64)
    assert len(fig.axes) == 4
    plt.close(fig)

"""kernels.cuda.design: cuda_v2's design revisions, as the nvcc snapshot holds them and as this nvcc compiles them.

Most tests need neither nvcc nor a GPU: they read the snapshot. The one marked needs_nvcc
compiles flash_v2.cu's design revisions (bf16, sm_80 and sm_90; one head dim in ``make test``,
each in ``make test-sweep``) and checks them against kernels/cuda/nvcc_snapshot.json.
"""
from __future__ import annotations

import pytest

import kernels.cuda.flash as cf
from kernels.cuda import design as cd
from kernels.cuda import resources as cr
from kernels.hw import occupancy
from kernels.cuda import ptxas

needs_nvcc = pytest.mark.skipif(not ptxas.nvcc_available(), reason="needs the CUDA compiler nvcc (not on PATH)")


@pytest.mark.parametrize("head_dim", cf.HEAD_DIMS)
def test_each_design_revision_changes_what_it_says(head_dim):
    """Revision k of DESIGN_REVISIONS turns on one more change; the kernel's resources must show it."""
    for arch in ("sm_80", "sm_90"):
        revisions = cd.design_revisions(head_dim, [arch], live=False)
        assert [r.index for r in revisions] == list(range(len(cd.DESIGN_REVISIONS))), arch
        first, rows128, split, fast, double = revisions
        assert not any(r.kernel.spills or r.kernel.stack_frame_bytes for r in revisions), "no revision spills"
        assert (first.kernel.threads_per_block, rows128.kernel.threads_per_block) == (128, 256)
        assert all(cr.occupancy_of(r.kernel).blocks_per_sm >= 1 for r in revisions)
        # Two tile-pass bodies once the mask is split off, one before.
        assert [cd.tile_bodies(r) for r in revisions] == [1, 1, 2, 2, 2]
        # exp2f (ex2.approx.f32 with its range fix-up) until the fast revision, ex2.approx.ftz after.
        assert all(r.counts["ex2.approx.ftz.f32"] == 0 < r.counts["ex2.approx.f32"] for r in (first, rows128, split))
        assert all(r.counts["ex2.approx.f32"] == 0 < r.counts["ex2.approx.ftz.f32"] for r in (fast, double))
        # Single-buffered: a barrier before and after each tile; double-buffered: one.
        assert [cd.barriers_per_tile(r) for r in revisions] == [2, 2, 2, 2, 1]
        # The last revision is the kernel the launcher runs: the same resources.
        production = cr.find_kernel(cr.snapshot_kernels(), arch, "v2", "bf16", head_dim)
        assert (double.kernel.registers, double.kernel.total_shared_bytes, double.kernel.threads_per_block) == (
            production.registers, production.total_shared_bytes, production.threads_per_block)


def test_tile_census_by_hand():
    # Causal 256 x 256 in blocks of 128 rows and tiles of 64 keys. Rows 0-127: row 0 sees only
    # key 0, row 127 keys 0-127, so tiles 0 and 1 are masked, 2 and 3 skipped. Rows 128-255:
    # row 128 sees keys 0-128 (tiles 0 and 1 whole), tiles 2 and 3 are masked.
    assert cd.tile_census(256, 256, 128, 64) == {"unmasked": 2, "masked": 4, "skipped": 2}
    # Not causal, 200 keys: three whole tiles and the ragged fourth, per block of 100 queries.
    assert cd.tile_census(100, 200, 128, 64, causal=False) == {"unmasked": 3, "masked": 1, "skipped": 0}
    # Sq > Sk: queries 0-99 of 300 see no key of 200 at all; the first block still sees some.
    assert cd.tile_census(300, 200, 128, 64)["skipped"] > 0


def test_design_table_has_a_row_per_revision_and_the_trace_estimate():
    revisions = cd.design_revisions(128, live=False)
    table = cd.design_table(revisions)
    assert len(table) == len(revisions) == 2 * len(cd.DESIGN_REVISIONS)
    for (_, row), r in zip(table.iterrows(), revisions):
        assert (row["registers"], row["threads"]) == (r.kernel.registers, r.kernel.threads_per_block)
        over = r.kernel.total_shared_bytes > occupancy.KINETO_SHARED_MEM_LIMIT
        assert (row["a trace reads %"] == 0) == over, "Kineto's estimate is 0% exactly above 48 KiB"


# ---- with nvcc ---------------------------------------------------------------------------------------

# make test compiles one head dim's revisions (a minute of nvcc on two cores); the weekly sweep
# (make test-sweep) compiles the other too.
LIVE_HEAD_DIMS = [pytest.param(d, marks=[] if d == min(cf.HEAD_DIMS) else [pytest.mark.sweep]) for d in cf.HEAD_DIMS]


@needs_nvcc
@pytest.mark.parametrize("head_dim", LIVE_HEAD_DIMS)
def test_design_revisions_are_the_sources_and_the_snapshot(head_dim):
    # Every explicit instantiation of flash_v2.cu's FLASH_V2_DESIGN_REVISIONS block is a revision
    # of DESIGN_REVISIONS, each exactly once per arch.
    live = cd.design_revisions(head_dim, live=True)
    seen = sorted((r.kernel.arch, r.head_dim, r.index) for r in live)
    assert seen == sorted((a, head_dim, i) for a in ("sm_80", "sm_90") for i in range(len(cd.DESIGN_REVISIONS)))
    snapshot = cr.load_snapshot()
    if ptxas.nvcc_version() != snapshot["nvcc"]:
        pytest.skip(f"the snapshot is from nvcc {snapshot['nvcc']}, this is {ptxas.nvcc_version()}")
    recorded = [r for r in cd.snapshot_revisions(snapshot) if r.head_dim == head_dim]
    assert cd.revision_rows(live) == cd.revision_rows(recorded), (
        "the kernel or its design revisions changed: run python -m tools.nvcc_snapshot to write "
        "kernels/cuda/nvcc_snapshot.json anew")


def test_register_cost_is_the_most_any_arch_added():
    from dataclasses import replace

    revisions = cd.design_revisions(64, live=False)
    made_up = {"sm_80": [100, 90, 95, 95, 120], "sm_90": [100, 100, 90, 99, 110]}
    edited = [replace(r, kernel=replace(r.kernel, registers=made_up[r.kernel.arch][r.index])) for r in revisions]
    assert cd.register_cost(edited) == {1: 0, 2: 5, 3: 9, 4: 25}


def test_unmasked_percent_of_the_tiles_read():
    assert cd.unmasked_percent({"unmasked": 3, "masked": 1, "skipped": 40}) == 75
    # Causal S = 512, 128-row blocks, 64-key tiles: block b reads 2b whole tiles and 2 on the diagonal.
    assert cd.unmasked_percent(cd.tile_census(512, 512, 128, 64)) == 100 * 12 / 20
    with pytest.raises(ValueError, match="reads no tile"):
        cd.unmasked_percent({"unmasked": 0, "masked": 0, "skipped": 3})


def test_read_revisions_falls_back_when_the_compile_fails(monkeypatch):
    # The fallback itself (no nvcc, a failed compile) is read_compiled's, tested through
    # read_kernels in test_cuda_resources.py; here, that the revisions come back from the snapshot.
    def broken(*args, **kwargs):
        raise RuntimeError("ptxas fatal: unknown target")
    monkeypatch.setattr(ptxas, "nvcc_path", lambda: "/somewhere/nvcc")
    monkeypatch.setattr(cf, "compile_sources", broken)
    revisions, where = cd.read_revisions(64, ["sm_80"])
    assert len(revisions) == len(cd.DESIGN_REVISIONS) and {r.kernel.arch for r in revisions} == {"sm_80"}
    assert where.startswith("read from a snapshot of nvcc") and "failed (ptxas fatal: unknown target)" in where

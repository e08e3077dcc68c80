"""kernels.cuda.resources: instruction counts, the nvcc snapshot, and the kernels as this nvcc compiles them.

Most tests need neither nvcc nor a GPU. The ones marked needs_nvcc compile the kernels once
(both files, sm_80 and sm_90, side by side; the same compile tests/cuda/test_cuda_compile.py
reads) and check the chapter's claims and kernels/cuda/nvcc_snapshot.json against them.
"""
from __future__ import annotations

import textwrap

import pytest

import kernels.cuda.flash as cf
from kernels.cuda import resources as cr
from kernels.hw import occupancy
from kernels.cuda import ptxas
from kernels.cuda.design import REVISION_OPCODES

needs_nvcc = pytest.mark.skipif(not ptxas.nvcc_available(), reason="needs the CUDA compiler nvcc (not on PATH)")
V1_NAME = "void (anonymous namespace)::flash_v1_kernel<__nv_bfloat16, 128>(flash::Problem)"


def test_parse_instance_reads_version_dtype_and_head_dim():
    assert cr.parse_instance(V1_NAME) == ("v1", "bf16", 128)
    assert cr.instance_label("flash_v2_kernel<__half, 64>(flash::Problem, bool)") == "v2<fp16, 64>"
    with pytest.raises(ValueError, match="not a flash_v1/flash_v2"):
        cr.parse_instance("void other_kernel<float, 64>()")


# ---- instruction counts ----------------------------------------------------------------------------

PTX_SAMPLE = textwrap.dedent("""\
    .version 9.0
    .target sm_80
    .visible .entry _Z5firstPf(
        .param .u64 _Z5firstPf_param_0
    )
    {
        fma.rn.f32 %f3, %f1, %f2, %f3;
        fma.rn.f32x2 %rd1, %rd2, %rd3, %rd4;
        @%p1 mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f1};
        mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f1};
    }
    .entry _ZN12_GLOBAL__N_16secondEv(
    )
    {
        // mma.sync in a comment is not an instruction
        fma.rn.f32 %f3, %f1, %f2, %f3;
    }
    """)


def test_instruction_counts_per_kernel():
    mma = cr.instruction_counts(PTX_SAMPLE, "mma.sync")
    fma = cr.instruction_counts(PTX_SAMPLE, "fma.rn.f32")
    names = list(mma)
    assert len(names) == 2 and "first" in names[0] and "second" in names[1]
    assert list(mma.values()) == [2, 0]        # the predicated one counts, the comment does not
    assert list(fma.values()) == [1, 1]        # fma.rn.f32x2 is another instruction


# ---- the nvcc snapshot -------------------------------------------------------------------------------

def test_snapshot_covers_every_instantiation():
    kernels = cr.snapshot_kernels()
    expected = {(a, "v1", t, d) for a in ("sm_80", "sm_90") for t in ("fp32", "fp16", "bf16") for d in cf.HEAD_DIMS}
    expected |= {(a, "v2", t, d) for a in ("sm_80", "sm_90") for t in ("fp16", "bf16") for d in cf.HEAD_DIMS}
    assert {(k.arch, *cr.parse_instance(k.name)) for k in kernels} == expected
    assert len(kernels) == len(expected)


def test_snapshot_rows_read_back_as_written():
    # The file's rows, through KernelResources and back: nothing lost or renamed on the way.
    rows = sorted(cr.load_snapshot()["kernels"], key=lambda r: (r["arch"], r["kernel"], r["dtype"], r["head_dim"]))
    assert cr.kernel_rows(cr.snapshot_kernels()) == rows, "every field of the file's rows is read"


def test_resources_table_matches_the_occupancy_calculator():
    kernels = cr.snapshot_kernels()
    table = cr.resources_table(kernels)
    assert len(table) == len(kernels)
    k = cr.find_kernel(kernels, "sm_80", "v2", "bf16", 64)
    occ = occupancy.occupancy(threads_per_block=k.threads_per_block, registers_per_thread=k.registers,
                              shared_mem_per_block=k.dynamic_shared_bytes, arch="sm_80")
    row = table[(table["arch"] == "sm_80") & (table["kernel"] == "v2") & (table["dtype"] == "bf16")
                & (table["head_dim"] == 64)].iloc[0]
    assert (row["registers"], row["blocks/SM"], row["warps/SM"]) == (k.registers, occ.blocks_per_sm, occ.warps_per_sm)


def test_occupancy_needs_the_launch_configuration():
    bare = ptxas.KernelResources(name=V1_NAME, mangled="x", arch="sm_80", registers=128)
    with pytest.raises(ValueError, match="threads per block unknown"):
        cr.occupancy_of(bare)
    with pytest.raises(KeyError, match="0 kernels match"):
        cr.find_kernel([bare], "sm_90", "v1", "bf16", 128)


# ---- with nvcc ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled():
    return cr.compile_cuda_kernels(("sm_80", "sm_90"))


@needs_nvcc
def test_snapshot_is_what_this_nvcc_prints(compiled):
    kernels, _ = compiled
    snapshot = cr.load_snapshot()
    if ptxas.nvcc_version() != snapshot["nvcc"]:
        pytest.skip(f"the snapshot is from nvcc {snapshot['nvcc']}, this is {ptxas.nvcc_version()}")
    assert cr.kernel_rows(kernels) == cr.kernel_rows(cr.snapshot_kernels(snapshot)), (
        "the kernels changed: run python -m tools.nvcc_snapshot to write kernels/cuda/nvcc_snapshot.json anew")


@needs_nvcc
def test_v2_exp2_is_the_fast_one_and_each_tile_has_one_barrier(compiled):
    _, ptx = compiled
    for arch, files in ptx.items():
        text = files["flash_v2.cu"]
        counts = {op: cr.instruction_counts(text, op) for op in REVISION_OPCODES}
        for name in counts["mma.sync"]:
            n = {op: counts[op][name] for op in REVISION_OPCODES}
            # Per tile pass and row pair: 64 probabilities over 4 lanes (2 x 16) plus 2 rescale factors.
            assert n["ex2.approx.f32"] == 0 and n["ex2.approx.ftz.f32"] == 2 * 34, (arch, name, n)
            assert n["bar.sync"] == 1 + 2, f"{arch} {name}: one barrier before the loop and one per tile pass"


# ---- what the chapter reads: where the kernels came from, Kineto's estimate, counts per kernel ----

def test_kineto_reads_zero_exactly_above_48_kib():
    kernels = cr.snapshot_kernels()
    small = cr.find_kernel(kernels, "sm_80", "v2", "bf16", 64)     # 36,864 B of shared memory
    big = cr.find_kernel(kernels, "sm_80", "v2", "bf16", 128)      # 69,632 B: opted in above the default
    assert small.total_shared_bytes <= occupancy.KINETO_SHARED_MEM_LIMIT < big.total_shared_bytes
    assert cr.kineto_reads(small) == cr.occupancy_of(small).percent > 0
    assert cr.kineto_reads(big) == 0 < cr.occupancy_of(big).percent, "0% in a trace, yet a block fits"
    table = cr.resources_table([small, big])
    assert list(table["a trace reads %"]) == [cr.occupancy_of(small).percent, 0]


def test_read_kernels_without_nvcc_reads_the_snapshot_and_says_so(monkeypatch):
    monkeypatch.setattr(ptxas, "nvcc_path", lambda: None)
    kernels, ptx, where = cr.read_kernels(["sm_90"])
    assert ptx is None and {k.arch for k in kernels} == {"sm_90"}
    assert len(kernels) == len(cr.snapshot_kernels()) // 2
    assert "snapshot" in where and "no nvcc" in where


def test_read_kernels_falls_back_when_the_compile_fails(monkeypatch):
    def broken(archs):
        raise RuntimeError("nvcc said no\nmore detail")
    monkeypatch.setattr(ptxas, "nvcc_path", lambda: "/somewhere/nvcc")
    monkeypatch.setattr(cr, "compile_cuda_kernels", broken)
    kernels, ptx, where = cr.read_kernels()
    assert ptx is None and kernels and "failed (nvcc said no)" in where


@needs_nvcc
def test_instruction_table_counts_each_kernel(compiled):
    _, ptx = compiled
    table = cr.instruction_table(ptx, ["mma.sync", "fma.rn.f32"])
    assert len(table) == 2 * (6 + 4), "every instantiation of both files, on both archs"
    for arch, files in ptx.items():
        for name, n in cr.instruction_counts(files["flash_v2.cu"], "mma.sync").items():
            assert table.loc[(arch, cr.instance_label(name)), "mma.sync"] == n
    v1 = table[table.index.get_level_values("kernel").str.startswith("v1")]
    assert (v1["mma.sync"] == 0).all() and (v1["fma.rn.f32"] > 0).all()

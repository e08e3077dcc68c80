"""kernels.cuda_report: ownership maps, instruction counts, excerpts, and the recorded report.

Most tests need neither nvcc nor a GPU. The ones marked needs_nvcc compile the kernels once
(both files, sm_80 and sm_90, side by side; the same compile tests/test_cuda_compile.py reads)
and cuda_v2's design steps, and check the chapter's claims and RECORDED against them.
"""
from __future__ import annotations

import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kernels.cuda_flash as cf
from kernels import cuda_report as cr
from kernels import occupancy, ptxas

needs_nvcc = pytest.mark.skipif(not ptxas.nvcc_available(), reason="needs the CUDA compiler nvcc (not on PATH)")
V1_NAME = "void (anonymous namespace)::flash_v1_kernel<__nv_bfloat16, 128>(flash::Problem)"


def test_parse_instance_reads_version_dtype_and_head_dim():
    assert cr.parse_instance(V1_NAME) == ("v1", "bf16", 128)
    assert cr.short_name("flash_v2_kernel<__half, 64>(flash::Problem, bool)") == "v2<fp16, 64>"
    with pytest.raises(ValueError, match="not a flash_v1/flash_v2"):
        cr.parse_instance("void other_kernel<float, 64>()")


# ---- who owns what -------------------------------------------------------------------------------

def each_thread_owns(owner: np.ndarray, threads: int = 128) -> set:
    assert (owner >= 0).all(), "an element nobody computes"
    return set(np.bincount(owner.ravel(), minlength=threads).tolist())


def test_v1_scores_split_evenly_with_one_key_column_per_thread():
    owner = cr.owners_v1_scores()
    # 32 x 32 scores over 128 threads: 8 each, all in the column tid % 32.
    assert each_thread_owns(owner) == {32 * 32 // 128}
    cols = np.broadcast_to(np.arange(32), owner.shape)
    assert (owner % 32 == cols).all()
    # Warp w (threads 32w..32w+31) computes rows w, w+4, w+8, ...
    assert ((owner // 32) == (np.arange(32)[:, None] % 4)).all()


def test_v1_softmax_is_warp_zero_only():
    owner = cr.owners_v1_softmax()
    assert set(np.unique(owner // 32)) == {0}
    assert (owner[:, 0] == np.arange(32)).all()


@pytest.mark.parametrize("head_dim", cf.HEAD_DIMS)
def test_v1_output_gives_each_thread_one_column(head_dim):
    owner = cr.owners_v1_output(head_dim)
    assert owner.shape == (32, head_dim)
    assert each_thread_owns(owner) == {32 * head_dim // 128}
    assert (owner % head_dim == np.arange(head_dim)).all()


@pytest.mark.parametrize("cols", [64, 128])
def test_v2_fragments_cover_the_tile_and_keep_rows_in_one_warp(cols):
    cfg = cf.launch_config("v2", cols)
    owner = cr.owners_v2(cols, cfg.block_m, cfg.threads)
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

    fig = cr.thread_map(64)
    assert len(fig.axes) == 4
    plt.close(fig)


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


def test_mma_per_key_tile_covers_the_warps_multiply_adds():
    for d in cf.HEAD_DIMS:
        n = cf.launch_config("v2", d).block_n
        # A warp's 16 rows need 16 x n x d MACs for S = Q K^T and 16 x d x n for O += P V;
        # one mma.m16n8k16 does 16 x 8 x 16 = 2048.
        assert cr.mma_per_key_tile(d, n) * 16 * 8 * 16 == 2 * 16 * n * d


# ---- the recorded report ----------------------------------------------------------------------------

def test_recorded_report_covers_every_instantiation_with_its_launch():
    report = cr.recorded_report()
    expected = {(a, "v1", t, d) for a in ("sm_80", "sm_90") for t in ("fp32", "fp16", "bf16") for d in cf.HEAD_DIMS}
    expected |= {(a, "v2", t, d) for a in ("sm_80", "sm_90") for t in ("fp16", "bf16") for d in cf.HEAD_DIMS}
    assert {(k.arch, *cr.parse_instance(k.name)) for k in report} == expected
    assert len(report) == len(expected)
    for k in report:
        version, _, d = cr.parse_instance(k.name)
        assert k.dynamic_shared_bytes == cf.launch_config(version, d).dynamic_shared_bytes
        assert k.threads_per_block == cf.launch_config(version, d).threads


def test_resources_table_matches_the_occupancy_calculator():
    report = cr.recorded_report()
    table = cr.resources_table(report)
    assert len(table) == len(report)
    k = cr.find(report, "sm_80", "v2", "bf16", 64)
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
        cr.find([bare], "sm_90", "v1", "bf16", 128)


# ---- source excerpts ----------------------------------------------------------------------------

def test_cuda_excerpt_block_and_range(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(textwrap.dedent("""\
        // header
        __global__ void k(float* x) {
            if (x) {
        #pragma unroll
                x[0] = 1.0f;  // }
            }
            x[1] = 2.0f;
        }
        int after;
        """))
    block = cr.cuda_excerpt(src, "__global__ void k")
    assert block.splitlines()[0] == "__global__ void k(float* x) {" and block.splitlines()[-1] == "}"
    # The pragma in column 0 does not stop the common indentation from being removed.
    assert cr.cuda_excerpt(src, "if (x)", "x[1]").splitlines() == ["if (x) {", "#pragma unroll",
                                                                 "    x[0] = 1.0f;  // }", "}"]
    with pytest.raises(ValueError, match="does not occur"):
        cr.cuda_excerpt(src, "nowhere")


# The excerpts chapter 5 shows: if a .cu file changes, these markers must still be there.
CHAPTER_EXCERPTS = [
    ("flash_v1.cu", "int launch(const flash::Problem& p", None),
    ("flash_v1.cu", "__global__ void __launch_bounds__", "load_tile<T, D>(q_s"),
    ("flash_v1.cu", "__device__ void load_tile", None),
    ("flash_v1.cu", "// Phase 1: scores", "// Phase 2"),
    ("flash_v1.cu", "// Phase 2: online softmax", "// Phase 3"),
    ("flash_v1.cu", "// Phase 3: O = alpha", "template <typename T, int D>"),
    ("flash_v2.cu", "__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,",
     None),
    ("flash_v2.cu", "// S = Q K_j^T.", "// The masked instantiation"),
    ("flash_v2.cu", "// C layout of S tiles", "// O += P V_j"),
    ("flash_v2.cu", "template <int kBlockM, bool kSplitMask", None),
    ("flash_v2.cu", "// One key tile: S = Q K_j^T", "// S = Q K_j^T."),
    ("flash_v2.cu", "// The masked instantiation", "// Online softmax."),
    ("flash_v2.cu", "// Online softmax.", "// C layout of S tiles"),
    ("flash_v2.cu", "// Fully visible tiles first", "// Epilogue"),
    ("flash_v2.cu", "__device__ __forceinline__ float fast_exp2(float x)", None),
    ("flash_v2.cu", "int launch(const flash::Problem& p", None),
    ("flash_api.h", "FLASH_HOST_DEVICE constexpr KeyTiles key_tiles(", None),
    ("flash_api.h", "// The course's causal rule", "// Which key tiles"),
]


@pytest.mark.parametrize("source, start, end", CHAPTER_EXCERPTS)
def test_chapter_excerpts_exist(source, start, end):
    text = cr.cuda_excerpt(cf.CSRC / source, start, end)
    assert 2 <= len(text.splitlines()) <= 60


def test_compile_without_nvcc_says_so(monkeypatch):
    monkeypatch.setattr(ptxas, "nvcc_path", lambda: None)
    with pytest.raises(RuntimeError, match="needs the CUDA compiler nvcc"):
        cr.compile_device_code(cf.CSRC / "flash_v1.cu")
    assert cr.nvcc_version() is None


def test_inlined_functions_reads_line_information():
    ptx = textwrap.dedent("""\
        .visible .entry _Z1kv(
        )
        {
        \t.loc\t1 10 3, function_name $L__info_string1, inlined_at 1 20 5
        \tret;
        }
        \t.section\t.debug_str
        \t{
        $L__info_string0:
        .b8 95,90,49,107,118,0
        $L__info_string1:
        .b8 95,90,52,115,116,101
        .b8 112,73,76,98,49,69,69,118,118,0
        \t}
        """)
    found = cr.inlined_functions(ptx)
    assert len(found) == 1
    assert list(found.values())[0] in ({"void step<true>()"}, {"_Z4stepILb1EEvv"})  # demangled where c++filt is


# ---- the design steps, recorded ------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", cf.HEAD_DIMS)
def test_each_recorded_design_step_changes_what_it_says(head_dim):
    """Step k of DESIGN_STEPS turns on one more change; the compiler's report must show it."""
    for arch in ("sm_80", "sm_90"):
        steps = [r for r in cr.design_steps(head_dim, [arch], live=False)]
        assert [r.index for r in steps] == list(range(len(cr.DESIGN_STEPS))), arch
        first, rows128, split, fast, double = steps
        assert not any(r.kernel.spills or r.kernel.stack_frame_bytes for r in steps), "no step spills"
        assert (first.kernel.threads_per_block, rows128.kernel.threads_per_block) == (128, 256)
        assert all(cr.occupancy_of(r.kernel).blocks_per_sm >= 1 for r in steps)
        # Two tile-step bodies once the mask is split off, one before.
        assert [cr.tile_bodies(r) for r in steps] == [1, 1, 2, 2, 2]
        # exp2f (ex2.approx.f32 with its range fix-up) until the fast step, ex2.approx.ftz after.
        assert all(r.counts["ex2.approx.ftz.f32"] == 0 < r.counts["ex2.approx.f32"] for r in (first, rows128, split))
        assert all(r.counts["ex2.approx.f32"] == 0 < r.counts["ex2.approx.ftz.f32"] for r in (fast, double))
        # Single-buffered: a barrier before and after each tile; double-buffered: one.
        assert [cr.barriers_per_tile(r) for r in steps] == [2, 2, 2, 2, 1]
        # The last step is the kernel the launcher runs: the same resources.
        production = cr.find(cr.recorded_report(), arch, "v2", "bf16", head_dim)
        assert (double.kernel.registers, double.kernel.total_shared_bytes, double.kernel.threads_per_block) == (
            production.registers, production.total_shared_bytes, production.threads_per_block)


def test_tile_census_by_hand():
    # Causal 256 x 256 in blocks of 128 rows and tiles of 64 keys. Rows 0-127: row 0 sees only
    # key 0, row 127 keys 0-127, so tiles 0 and 1 are masked, 2 and 3 skipped. Rows 128-255:
    # row 128 sees keys 0-128 (tiles 0 and 1 whole), tiles 2 and 3 are masked.
    assert cr.tile_census(256, 256, 128, 64) == {"unmasked": 2, "masked": 4, "skipped": 2}
    # Not causal, 200 keys: three whole tiles and the ragged fourth, per block of 100 queries.
    assert cr.tile_census(100, 200, 128, 64, causal=False) == {"unmasked": 3, "masked": 1, "skipped": 0}
    # Sq > Sk: queries 0-99 of 300 see no key of 200 at all; the first block still sees some.
    assert cr.tile_census(300, 200, 128, 64)["skipped"] > 0


def test_design_table_has_a_row_per_step_and_the_trace_estimate():
    reports = cr.design_steps(128, live=False)
    table = cr.design_table(reports)
    assert len(table) == len(reports) == 2 * len(cr.DESIGN_STEPS)
    for (_, row), r in zip(table.iterrows(), reports):
        assert (row["registers"], row["threads"]) == (r.kernel.registers, r.kernel.threads_per_block)
        over = r.kernel.total_shared_bytes > occupancy.KINETO_SHARED_MEM_LIMIT
        assert (row["a trace reads %"] == 0) == over, "Kineto's estimate is 0% exactly above 48 KiB"


# ---- with nvcc ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled():
    return cr.compile_kernels(("sm_80", "sm_90"))


@pytest.fixture(scope="module")
def live_steps():
    with ThreadPoolExecutor(max_workers=len(cf.HEAD_DIMS)) as pool:
        return [r for reports in pool.map(lambda d: cr.design_steps(d, live=True), cf.HEAD_DIMS) for r in reports]


@needs_nvcc
def test_design_steps_are_the_sources_and_as_recorded(live_steps):
    # Every explicit instantiation of flash_v2.cu's FLASH_V2_DESIGN_STEPS block is a step of
    # DESIGN_STEPS, each exactly once per (arch, head_dim).
    seen = sorted((r.kernel.arch, r.head_dim, r.index) for r in live_steps)
    assert seen == sorted((a, d, i) for a in ("sm_80", "sm_90") for d in cf.HEAD_DIMS for i in range(len(cr.DESIGN_STEPS)))
    if cr.nvcc_version() != cr.RECORDED["nvcc"]:
        pytest.skip(f"RECORDED is from nvcc {cr.RECORDED['nvcc']}, this is {cr.nvcc_version()}")
    assert sorted(cr.as_recorded_steps(live_steps)) == sorted(tuple(r) for r in cr.RECORDED["design_steps"]), (
        "the kernel or its design steps changed: paste kernels.cuda_report.record() over RECORDED")


@needs_nvcc
def test_recorded_report_is_what_this_nvcc_prints(compiled):
    report, _ = compiled
    if cr.nvcc_version() != cr.RECORDED["nvcc"]:
        pytest.skip(f"RECORDED is from nvcc {cr.RECORDED['nvcc']}, this is {cr.nvcc_version()}")
    assert sorted(cr.as_recorded_rows(report)) == sorted(tuple(r) for r in cr.RECORDED["kernels"]), (
        "the kernels changed: paste kernels.cuda_report.record() over RECORDED")


@needs_nvcc
def test_tensor_cores_only_in_v2(compiled):
    _, ptx = compiled
    for arch, files in ptx.items():
        v1 = cr.instruction_counts(files["flash_v1.cu"], "mma.sync")
        v2 = cr.instruction_counts(files["flash_v2.cu"], "mma.sync")
        assert len(v1) == 6 and set(v1.values()) == {0}, arch
        assert len(v2) == 4, arch
        for name, n in v2.items():
            # Two copies of the tile step (unmasked and masked), each one key tile's worth.
            assert n == 2 * cr.mma_per_key_tile(cr.parse_instance(name)[2]), (arch, name)


@needs_nvcc
@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt to read the inlined functions' names")
def test_v2_holds_both_instantiations_of_the_tile_step(compiled):
    """The masked and unmasked tile steps are two instantiations, both compiled into every
    cuda_v2 kernel (inlined, so they leave no symbol: the PTX's line information names them)."""
    _, ptx = compiled
    for arch, files in ptx.items():
        kernels = cr.inlined_functions(files["flash_v2.cu"])
        assert len(kernels) == 4, arch
        for name, inlined in kernels.items():
            steps = {f for f in inlined if "::tile_step<" in f}
            assert any("tile_step<false>" in f for f in steps) and any("tile_step<true>" in f for f in steps), (
                f"{arch} {cr.short_name(name)} holds {sorted(steps)}")
            assert all("Design<128, true, true, true>" in f for f in steps), "the launcher runs the production design"


@needs_nvcc
def test_v2_exp2_is_the_fast_one_and_each_tile_has_one_barrier(compiled):
    _, ptx = compiled
    for arch, files in ptx.items():
        text = files["flash_v2.cu"]
        counts = {op: cr.instruction_counts(text, op) for op in cr.STEP_OPCODES}
        for name in counts["mma.sync"]:
            n = {op: counts[op][name] for op in cr.STEP_OPCODES}
            # Per tile step and row pair: 64 probabilities over 4 lanes (2 x 16) plus 2 rescale factors.
            assert n["ex2.approx.f32"] == 0 and n["ex2.approx.ftz.f32"] == 2 * 34, (arch, name, n)
            assert n["bar.sync"] == 1 + 2, f"{arch} {name}: one barrier before the loop and one per tile step"

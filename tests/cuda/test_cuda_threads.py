"""kernels.cuda.threads against the kernels' own code: which thread writes which element.

The maps in kernels/cuda/threads.py are NumPy formulas; here they are checked against the
.cu files themselves. The lines of flash_v1.cu's three phases and of both kernels' epilogues
(cut out by the chapter's own cutter, kernels.notebook.source_piece) are pasted into a small
host C++ program with stand-ins for what they touch (shared memory as plain arrays, threadIdx
as a variable, ``flash::visible`` recording the element it is asked about in v2), compiled
with the host compiler and run once per thread. Each thread then says which elements it
wrote, so an index changed in a kernel changes what this program prints and fails the test
(test_a_changed_index_in_a_kernel_is_caught shows it on edited copies of the sources).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kernels.cuda.flash as cf
from kernels.cuda import threads as ct
from kernels.notebook import source_piece

CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler (g++) to run the kernels' index code")
UNWRITTEN = "0.5f"   # what every array holds before a thread runs: no phase writes 0.5 from zero inputs


def v1_program(source: Path, head_dim: int) -> str:
    """flash_v1.cu's constants, per-thread state, three phases and epilogue, run for every thread."""
    constants = source_piece(source, "constexpr int M = kV1BlockM", "constexpr int kScoresPerThread")[1]
    state = source_piece(source, "// Running softmax state", "my_row0 = threadIdx.x / D")[1]
    scores = source_piece(source, "// Phase 1: scores")[1]
    softmax = source_piece(source, "// Phase 2: online softmax")[1]
    epilogue = source_piece(source, "// A row that saw no key")[1]
    return textwrap.dedent("""\
        #include <math.h>
        #include <cstdio>
        #include "flash_api.h"
        #define __syncthreads() ((void)0)
        using flash::kV1BlockM;
        using flash::kV1BlockN;
        using flash::kV1Threads;
        struct { int x; } threadIdx;
        using T = float;
        template <typename U> U from_float(float x) { return U(x); }
        constexpr int D = %(head_dim)d;
        static void fill(float* a, int n) { for (int i = 0; i < n; ++i) a[i] = %(unwritten)s; }
        static void written(const char* what, const float* a, int rows, int pitch) {
          for (int i = 0; i < rows * pitch; ++i)
            if (a[i] != %(unwritten)s) std::printf("%%s %%d %%d %%d\\n", what, threadIdx.x, i / pitch, i %% pitch);
        }
        int main() {
        %(constants)s
          static float q_s[M * D], k_s[N * (D + 1)], v_s[N * D], s_s[M * (N + 1)], row_s[M], o[M * D];
          (void)v_s;
          flash::Problem p{};
          p.seq_q = M; p.seq_k = N; p.causal = false; p.scale = 1.0f; p.o_stride[2] = D; p.o_stride[3] = 1;
          const int q_first = 0, k_first = 0;
          for (int tid = 0; tid < kV1Threads; ++tid) {
            threadIdx.x = tid;
        %(state)s
            fill(s_s, M * (N + 1));
        %(scores)s
            written("scores", s_s, M, N + 1);
            fill(s_s, M * (N + 1));
        %(softmax)s
            written("softmax", s_s, M, N + 1);
            fill(o, M * D);
        %(epilogue)s
            written("output", o, M, D);
          }
        }
        """) % {"head_dim": head_dim, "unwritten": UNWRITTEN, "constants": constants, "state": state,
                "scores": scores, "softmax": softmax, "epilogue": epilogue}


def v2_program(source: Path, head_dim: int) -> str:
    """flash_v2.cu's lane arithmetic, the query rows it gives each lane, the masked tile pass's
    mask (which S element each accumulator is) and the epilogue's stores (which O element)."""
    cfg = cf.launch_config("v2", head_dim)
    text = source.read_text()
    ids = source_piece(source, "const int warp =", "const int g = lane / 4")[1]
    rows = re.search(r"B blk\{.*?\{([^{}]*)\}", text, re.S)
    assert rows, "flash_v2.cu: the query rows of the lane, the first brace list of `B blk{...}`, not found"
    mask = source_piece(source, "if constexpr (kMasked) {")[1]
    epilogue = source_piece(source, "// Epilogue: complete each row's sum")[1]
    return textwrap.dedent("""\
        #include <math.h>
        #include <cstdint>
        #include <cstdio>
        struct { int x; } threadIdx;
        struct { int seq_q, seq_k; bool causal; long o_stride[4]; } p;
        namespace flash {
        bool visible(int query, int key, int, int, bool) {
          std::printf("scores %%d %%d %%d\\n", threadIdx.x, query, key);
          return true;
        }
        }
        using T = float;
        constexpr int D = %(head_dim)d, M = %(block_m)d, N = %(block_n)d, kThreads = %(threads)d;
        constexpr int kNTiles = N / 8;
        struct B { static constexpr int kDTiles = D / 8; };
        static float to_16bit(float x, float) { return x; }
        static uint32_t pack2(float, float, float) { return 0; }
        static float __shfl_xor_sync(unsigned, float v, int) { return v; }
        int main() {
          static float o[M * D];
          p.seq_q = M; p.seq_k = N; p.causal = false; p.o_stride[2] = D; p.o_stride[3] = 1;
          const int q_first = 0, j = 0;
          const bool vec = false;
          const float scale_log2 = 1.0f;
          for (int tid = 0; tid < kThreads; ++tid) {
            threadIdx.x = tid;
        %(ids)s
            (void)g; (void)t; (void)warp;
            const int query[2] = {%(rows)s};
            float s[kNTiles][4] = {};
            constexpr bool kMasked = true, kFold = false;
        %(mask)s
            struct { float row_sum[2]; int query[2]; float o_acc[B::kDTiles][4]; } blk = {{1.0f, 1.0f}, {query[0], query[1]}, {}};
            for (int i = 0; i < M * D; ++i) o[i] = %(unwritten)s;
        %(epilogue)s
            for (int i = 0; i < M * D; ++i)
              if (o[i] != %(unwritten)s) std::printf("output %%d %%d %%d\\n", tid, i / D, i %% D);
          }
        }
        """) % {"head_dim": head_dim, "block_m": cfg.block_m, "block_n": cfg.block_n, "threads": cfg.threads,
                "unwritten": UNWRITTEN, "ids": ids, "rows": rows.group(1), "mask": mask, "epilogue": epilogue}


def run_program(program: str, tmp: Path) -> dict[str, list[tuple[int, int, int]]]:
    """{what: [(thread, row, column), ...]} as the compiled stand-in prints them."""
    (tmp / "owners.cpp").write_text(program)
    built = subprocess.run([CXX, "-std=c++17", "-O0", "-w", f"-I{cf.CSRC}", str(tmp / "owners.cpp"),
                            "-o", str(tmp / "owners")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, f"the kernels' index code no longer builds on the host:\n{built.stderr[-3000:]}"
    out: dict[str, list[tuple[int, int, int]]] = {}
    for line in subprocess.run([str(tmp / "owners")], check=True, capture_output=True, text=True,
                               timeout=60).stdout.splitlines():
        what, tid, row, col = line.split()
        out.setdefault(what, []).append((int(tid), int(row), int(col)))
    return out


def owner_map(writes: list[tuple[int, int, int]], shape: tuple[int, int]) -> np.ndarray:
    """The thread of each element, -1 where none wrote; fails on an element two threads write."""
    owner = np.full(shape, -1)
    for tid, row, col in writes:
        assert 0 <= row < shape[0] and 0 <= col < shape[1], f"thread {tid} writes ({row}, {col}), outside the tile {shape}"
        assert owner[row, col] in (-1, tid), f"({row}, {col}) is written by threads {owner[row, col]} and {tid}"
        owner[row, col] = tid
    return owner


def source_owners(version: str, head_dim: int, source: Path, tmp: Path) -> dict[str, np.ndarray]:
    """{phase: owner map} of the kernel in ``source``."""
    if version == "v1":
        writes = run_program(v1_program(source, head_dim), tmp)
        m, n = cf.launch_config("v1", head_dim).block_m, cf.launch_config("v1", head_dim).block_n
        # The score rows have a pitch of N + 1 (no bank conflicts): the extra column is never a score.
        return {"scores": owner_map(writes.get("scores", []), (m, n + 1)),
                "softmax": owner_map(writes.get("softmax", []), (m, n + 1)),
                "output": owner_map(writes.get("output", []), (m, head_dim))}
    cfg = cf.launch_config("v2", head_dim)
    writes = run_program(v2_program(source, head_dim), tmp)
    return {"scores": owner_map(writes.get("scores", []), (cfg.block_m, cfg.block_n)),
            "output": owner_map(writes.get("output", []), (cfg.block_m, head_dim))}


def expected_owners(version: str, head_dim: int) -> dict[str, np.ndarray]:
    """threads.py's maps, the padding column of v1's score rows unowned."""
    if version == "v1":
        unowned = np.full((32, 1), -1)
        return {"scores": np.hstack([ct.owners_v1_scores(), unowned]),
                "softmax": np.hstack([ct.owners_v1_softmax(), unowned]),
                "output": ct.owners_v1_output(head_dim)}
    cfg = cf.launch_config("v2", head_dim)
    return {"scores": ct.owners_v2(cfg.block_n, cfg.block_m, cfg.threads),
            "output": ct.owners_v2(head_dim, cfg.block_m, cfg.threads)}


def mismatches(found: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, int]:
    return {phase: int((found[phase] != expected[phase]).sum()) for phase in expected
            if (found[phase] != expected[phase]).any()}


@needs_cxx
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("head_dim", cf.HEAD_DIMS)
def test_threads_maps_are_what_the_kernels_write(version, head_dim, tmp_path):
    found = source_owners(version, head_dim, cf.CSRC / f"flash_{version}.cu", tmp_path)
    expected = expected_owners(version, head_dim)
    assert not mismatches(found, expected), (
        f"kernels.cuda.threads' maps of {version} at D = {head_dim} differ from flash_{version}.cu "
        f"(elements per phase): {mismatches(found, expected)}")


# Edits that keep every index in range, so only the ownership can tell them apart.
MUTATIONS = [
    ("v1", "const int c = threadIdx.x % N, r0 = threadIdx.x / N;",
     "const int c = (threadIdx.x + 1) % N, r0 = threadIdx.x / N;", "scores"),
    ("v1", "const int my_col = threadIdx.x % D, my_row0 = threadIdx.x / D;",
     "const int my_col = (D - 1) - threadIdx.x % D, my_row0 = threadIdx.x / D;", "output"),
    ("v2", "const int key = j * N + n * 8 + 2 * (lane % 4) + (e % 2);",
     "const int key = j * N + n * 8 + 2 * (3 - lane % 4) + (e % 2);", "scores"),
    ("v2", "const int col = dt * 8 + 2 * t;", "const int col = dt * 8 + 2 * (3 - t);", "output"),
]


@needs_cxx
@pytest.mark.parametrize("version, line, edited, phase", MUTATIONS)
def test_a_changed_index_in_a_kernel_is_caught(version, line, edited, phase, tmp_path):
    source = cf.CSRC / f"flash_{version}.cu"
    text = source.read_text()
    assert text.count(line) == 1, f"flash_{version}.cu no longer has the line this mutation edits: {line!r}"
    copy = tmp_path / source.name
    copy.write_text(text.replace(line, edited))
    found = source_owners(version, 64, copy, tmp_path)
    assert phase in mismatches(found, expected_owners(version, 64)), (
        f"an edited index in flash_{version}.cu ({edited!r}) went unnoticed in {phase}")



def test_rows_of_warps():
    assert ct.rows_of_warps(np.array([[0, 33], [-1, 64]])) == {0: {0}, 1: {0}, 2: {1}}
    v2 = ct.rows_of_warps(ct.owners_v2(64))
    assert v2 == {w: set(range(16 * w, 16 * w + 16)) for w in range(8)}, "v2: 16 whole rows per warp"
    v1 = ct.rows_of_warps(ct.owners_v1_output(64))
    assert v1[0] == v1[1] == set(range(0, 32, 2)), "v1's output phase: two warps share each even row"


def test_launch_configs_for_one_shape():
    table = cf.launch_configs(batch=1, heads=8, seq=512, head_dim=64)
    assert table.loc["blocks", "v1"] == 16 * 8 and table.loc["grid at B=1 H=8 S=512", "v1"] == "16 × 8"
    assert table.loc["blocks", "v2"] == 8 * 4 and table.loc["warps per block", "v2"] == 8
    assert table.loc["dynamic shared memory (B)", "v2"] == cf.launch_config("v2", 64).dynamic_shared_bytes

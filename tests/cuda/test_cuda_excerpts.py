"""kernels.cuda.excerpts: the lines of the .cu files chapter 5 shows, cut out by their markers."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

import kernels.cuda.flash as cf
from kernels.cuda.excerpts import cuda_excerpt


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
    block = cuda_excerpt(src, "__global__ void k")
    assert block.splitlines()[0] == "__global__ void k(float* x) {" and block.splitlines()[-1] == "}"
    # The pragma in column 0 does not stop the common indentation from being removed.
    assert cuda_excerpt(src, "if (x)", "x[1]").splitlines() == ["if (x) {", "#pragma unroll",
                                                                 "    x[0] = 1.0f;  // }", "}"]
    with pytest.raises(ValueError, match="does not occur"):
        cuda_excerpt(src, "nowhere")


# The excerpts chapter 5 shows: if a .cu file changes, these markers must still be there.
CHAPTER_EXCERPTS = [
    ("flash_v1.cu", "extern __shared__ float smem[];", "const int b = bh / p.heads"),
    ("flash_v1.cu", "for (int idx = threadIdx.x; idx < count * D", None),
    ("flash_v1.cu", "for (int d = 0; d < D; ++d) {", None),
    ("flash_v1.cu", "const float alpha = expf(row_max - shift);", "row_s[threadIdx.x] = alpha;"),
    ("flash_v1.cu", "for (int i = 0; i < kRowsPerThread; ++i) acc[i] *= row_s", "__syncthreads();  // K, V, P"),
    ("flash_v2.cu", "__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,",
     None),
    ("flash_v2.cu", "for (int ks = 0; ks < kDSteps; ++ks) {", None),
    ("flash_v2.cu", "// C layout of S tiles", "// O += P V_j"),
    ("flash_v2.cu", "const int unmasked = Dsg::split_mask", "// Epilogue"),
    ("flash_v2.cu", "asm(\"ex2.approx.ftz.f32", "return y;"),
    ("flash_v2.cu", "const float x = kFold ? fmaf", "tile_sum += s[n][c];"),
    ("flash_v2.cu", "cp_async_wait<0>();  // this thread's copies of tile j", "const T* k_s = kv_buffer(j);"),
]


@pytest.mark.parametrize("source, start, end", CHAPTER_EXCERPTS)
def test_chapter_excerpts_exist(source, start, end):
    text = cuda_excerpt(cf.CSRC / source, start, end)
    assert 1 <= len(text.splitlines()) <= 60


def test_the_list_is_what_the_chapter_cuts():
    # Literal calls only: cuda_excerpt(V1|V2, "start"[, "end"]) in the chapter's source.
    chapter = (Path(__file__).resolve().parents[2] / "notebooks" / "05_cuda.py").read_text()
    call = re.compile(r'cuda_excerpt\((V[12]), ("(?:[^"\\]|\\.)*")(?:, ("(?:[^"\\]|\\.)*"))?\)')
    files = {"V1": "flash_v1.cu", "V2": "flash_v2.cu"}
    used = {(files[f], ast.literal_eval(start), ast.literal_eval(end) if end else None)
            for f, start, end in call.findall(chapter)}
    assert used and used == set(CHAPTER_EXCERPTS)

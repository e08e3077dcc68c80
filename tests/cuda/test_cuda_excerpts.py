"""kernels.cuda.excerpts: the lines of the .cu files chapter 5 shows, cut out by their markers."""
from __future__ import annotations

import textwrap

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
    text = cuda_excerpt(cf.CSRC / source, start, end)
    assert 2 <= len(text.splitlines()) <= 60

"""kernels.cuda.excerpts: the lines of the .cu files chapter 5 shows, cut out by their markers. (A
marker the chapter names and a .cu file lost fails the chapter itself, with the marker in the error.)"""
from __future__ import annotations

import textwrap

import pytest

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

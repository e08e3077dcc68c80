"""kernels.notebook.show_lines: a chapter shows a library function, or a .cu file, in the pieces it explains."""
from __future__ import annotations

import textwrap

import pytest

import kernels.triton.flash as tf
from kernels.notebook import show_lines, source_piece


def test_a_piece_runs_from_the_first_marker_to_the_next_line_with_the_second():
    block = show_lines(tf.tiled_softmax, "new_max = torch.maximum", "running_max = new_max").data
    header, *code = block.removeprefix("```python\n").removesuffix("\n```").splitlines()
    assert header.startswith("# kernels/triton/flash.py, tiled_softmax, lines ")
    assert code[0] == "new_max = torch.maximum(running_max, tile.amax(dim=-1))"   # dedented
    assert code[-1] == "running_max = new_max" and len(code) == 5
    first, last = map(int, header.rsplit(" ", 1)[1].split("-"))
    assert last - first + 1 == len(code)


def test_a_triton_kernel_is_read_through_its_python_function_and_one_marker_shows_one_statement():
    block = show_lines(tf.attn_fwd, "bh = tl.program_id(0)").data
    assert ", attn_fwd, lines " in block and block.count("\n") == 3


def test_without_markers_the_whole_class_is_shown_as_its_file_has_it():
    from kernels.attention.naive import NaiveAttention
    from tests.helpers import ROOT

    where, code = source_piece(NaiveAttention)
    assert where.startswith("kernels/attention/naive.py, NaiveAttention, lines ")
    first, last = map(int, where.rsplit(" ", 1)[1].split("-"))
    lines = (ROOT / "kernels/attention/naive.py").read_text().splitlines()
    assert code.splitlines() == lines[first - 1:last] and code.startswith("class NaiveAttention")
    after = [line for line in lines[last:] if line.strip()]
    assert not after or not after[0].startswith(" "), "the piece runs to the end of the class"


@pytest.mark.parametrize("first, last, named", [("no such line", None, "'no such line'"),
                                                ("new_max = torch.maximum", "no such end", "'no such end'")])
def test_a_marker_that_matches_nothing_is_named_in_the_error(first, last, named):
    with pytest.raises(ValueError, match=named):
        show_lines(tf.tiled_softmax, first, last)


def test_a_cuda_piece_is_a_brace_balanced_block_or_a_range(tmp_path):
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
    where, block = source_piece(src, "__global__ void k")
    assert where == "k.cu, lines 2-8"
    assert source_piece(src)[0] == "k.cu, lines 1-9", "without markers, the whole file"
    assert block.splitlines()[0] == "__global__ void k(float* x) {" and block.splitlines()[-1] == "}"
    # The pragma in column 0 does not stop the common indentation from being removed.
    assert source_piece(src, "if (x)", "    }")[1].splitlines() == ["if (x) {", "#pragma unroll",
                                                                   "    x[0] = 1.0f;  // }", "}"]
    assert show_lines(src, "x[1]", "x[1]").data == "```cuda\n// k.cu, lines 7-7\nx[1] = 2.0f;\n```"
    with pytest.raises(ValueError, match="never closes"):
        source_piece(src, "x[1]")

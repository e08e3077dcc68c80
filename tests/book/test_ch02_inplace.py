"""Chapter 2's own check (kernels/book/ch02_inplace.py) on the synthetic A100 forwards of
tests/gpu_trace.py: it holds on the article's six and five activities, and fails on an
"in-place" forward that still copies (tests/trace/test_recorded.py runs the chapter on such a
recording too)."""
import pytest

from kernels.book.ch02_inplace import inplace_drops_the_copy_on_gpu
from kernels.notebook import LessonFailed
from kernels.trace import reader
from tests.gpu_trace import forward_trace


def a100_step(label: str, rows=None):
    return reader.load_trace(forward_trace(label, rows=rows)).steps(label)[0]


def test_six_activities_become_five_and_the_copy_is_the_one_that_went(capsys):
    inplace_drops_the_copy_on_gpu({"naive": a100_step("naive"), "inplace": a100_step("inplace")}, "fixture A100")
    assert "✔ the GPU track goes from 6 activities to 5" in capsys.readouterr().out


def test_an_inplace_forward_that_still_copies_fails():
    from tests.gpu_trace import NAIVE_A100
    with pytest.raises(LessonFailed, match="6 activities to 5"):
        inplace_drops_the_copy_on_gpu({"naive": a100_step("naive"), "inplace": a100_step("inplace", rows=NAIVE_A100)})

"""Chapter 1's own checks (kernels/book/ch01_naive.py): the naive copy on a GPU track, on the
synthetic A100 forwards of tests/gpu_trace.py, and the input TimeSformer's borrowed steps were
given, read from their recorded shapes."""
import pytest

from kernels.book.ch01_naive import naive_copy_on_gpu
from kernels.notebook import LessonFailed
from kernels.trace import reader
from tests.gpu_trace import forward_trace


def a100_step(label: str):
    return reader.load_trace(forward_trace(label)).steps(label)[0]


def test_the_naive_copy_holds_on_the_articles_forward_and_its_table_lists_the_six():
    table = naive_copy_on_gpu(a100_step("naive"))
    assert len(table) == 6


def test_the_naive_copy_fails_on_a_forward_without_it():
    """Chapters 1 and 2 assert it holds on a recording (tests/trace/test_recorded.py, which also
    plants an in-place run that still copies)."""
    with pytest.raises(LessonFailed, match="six GPU activities"):
        naive_copy_on_gpu(a100_step("inplace"))

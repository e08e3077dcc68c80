"""kernels.book.ch07_compiled: the reading of a GPU run's compiled and flex forwards (on
Hopper-shaped fixture steps), and the sentence about the graph break's timing."""
import time

import pytest
import torch

from kernels.book import ch07_compiled as ch07
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop


def test_compiled_and_flex_forwards():
    table = ch07.compiled_forward(hop.step("compiled_naive", hop.COMPILED_NAIVE).gpu_work)
    assert list(table["kind"]) == ["gemm", "softmax", "gemm"], "nvjet GEMMs around Inductor's softmax"
    ch07.flex_forward(hop.step("flex", hop.COMPILED_FLEX).gpu_work)
    with pytest.raises(LessonFailed, match="no copy"):
        ch07.compiled_forward(hop.step("c", hop.COMPILED_NAIVE + [hop.copy("aten::clone")]).gpu_work)
    with pytest.raises(LessonFailed, match="Triton kernels"):
        ch07.compiled_forward(hop.step("eager", hop.INPLACE).gpu_work)
    with pytest.raises(LessonFailed, match="one FlexAttention template"):
        ch07.flex_forward(hop.step("flex", hop.COMPILED_NAIVE).gpu_work)


def test_break_timing_ranks_only_apart_spreads_and_quotes_no_noisy_time():
    apart = ch07.break_timing((10.0, 9.5, 10.5), (14.0, 13.0, 15.0))
    assert "cost time as well as memory" in apart and "10 ms (9.5 to 10.5)" in apart
    assert "broken forward was the faster" in ch07.break_timing((14.0, 13.0, 15.0), (10.0, 9.5, 10.5))
    overlap = ch07.break_timing((10.0, 9.0, 12.0), (11.0, 9.5, 13.0))
    assert "spreads overlap" in overlap and "faster" not in overlap and "cost time" not in overlap
    noisy = ch07.break_timing((10.0, 5.0, 20.0), (11.0, 10.0, 12.0))
    assert "unbroken forward's calls failed the spread check" in noisy and "ms" not in noisy


def test_timed_gives_the_median_and_spread_of_real_calls():
    median, p10, p90 = ch07.timed(lambda: time.sleep(0.002), torch.device("cpu"), reps=7)
    assert 2.0 <= p10 <= median <= p90

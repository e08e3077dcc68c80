"""Chapter 12's own reading (kernels.book.ch12_real_models) on the TraceLens traces it shows:
TimeSformer's input from its recorded shapes, the passes over its scores, each step's largest kind."""
import pandas as pd
import pytest

from kernels.book import ch12_real_models as ch12
from kernels.borrowed import TRACELENS
from kernels.trace import breakdown
from kernels.trace.attention import find_attention


@pytest.fixture(scope="module")
def timesformer():
    report = find_attention(TRACELENS["h100_timesformer"].step())
    return report, max(report.calls, key=lambda c: c.gpu_us)


def test_every_short_name_is_a_borrowed_trace():
    assert set(ch12.SHORT) <= set(TRACELENS) and len(set(ch12.SHORT.values())) == len(ch12.SHORT)


@pytest.mark.parametrize("key", ["h100_timesformer", "mi300x_timesformer"])
def test_timesformer_ran_128_frames_on_an_8_frame_checkpoint(key):
    report = find_attention(TRACELENS[key].step())
    longest = max(report.calls, key=lambda c: c.gpu_us)
    assert (longest.batch_heads, longest.sq, longest.sk) == (96, 3137, 3137)
    video = ch12.timesformer_input(report.step, longest.sq)
    assert video == {"frames": 128, "trained_frames": 8, "patches": 196, "space_batch": 8, "space_frames": 16}
    with pytest.raises(ValueError, match="no recorded cat"):
        ch12.timesformer_input(report.step, 1000)


def test_the_scores_are_written_three_times_and_read_three_times(timesformer):
    report, longest = timesformer
    passes = ch12.score_passes(longest, report.step)
    assert passes == {"between": ["aten::mul", "aten::_softmax"], "writes": 3, "reads": 3}
    short = min(report.calls, key=lambda c: c.sq)
    assert ch12.score_passes(short, report.step)["between"] == ["aten::mul", "aten::_softmax"]


def test_largest_kind_leaves_attention_out():
    reports = {name: find_attention(TRACELENS[key].step()) for key, name in ch12.SHORT.items() if "qwen" in key}
    largest = ch12.largest_kind(breakdown.shares(reports))
    assert largest.to_dict() == {"H100 Qwen": "elementwise", "MI300X Qwen": "gemm"}
    planted = pd.DataFrame({"attention": [0.9], "gemm": [0.05], "copy": [0.05]}, index=["hand-written"])
    assert ch12.largest_kind(planted)["hand-written"] == "gemm"

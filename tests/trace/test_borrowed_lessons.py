"""The readers chapters 6, 8 and 10 use on real GPU traces (book/data/borrowed), run on those
traces: what each returns, and that bad input is refused in words."""
import math

import pytest

from kernels import gpu_lessons
from kernels.attention import decoding
from kernels.bench import plots
from kernels.borrowed import TRACELENS
from kernels.hw import devices
from kernels.trace.attention import find_attention


@pytest.fixture(scope="module")
def reports():
    return {key: find_attention(TRACELENS[key].step()) for key in ("h100_qwen", "mi300x_qwen", "h100_bert",
                                                                   "sglang_decode")}


def test_multiprocessors_reads_the_sm_count_of_each_vendor(reports):
    assert devices.multiprocessors(reports["h100_qwen"].step.trace.device_properties[0]) == 132
    assert devices.multiprocessors(reports["mi300x_qwen"].step.trace.device_properties[0]) == 304
    assert devices.multiprocessors({"multiProcessorCount": 108}) == 108
    with pytest.raises(ValueError, match="no SM or CU count"):
        devices.multiprocessors({"name": "a GPU", "warpSize": 32})


def test_achieved_against_peak_rows_are_each_call_over_its_gpu_peak(reports):
    calls = gpu_lessons.achieved_against_peak({k: reports[k] for k in ("h100_qwen", "mi300x_qwen")})
    assert len(calls) == 48 and set(calls["trace"]) == {"h100_qwen", "mi300x_qwen"}
    for _, row in calls.iterrows():
        assert math.isclose(row["% of peak"], 100 * row["TFLOP/s"] / row["peak TFLOP/s"])
    median = calls.groupby("trace")["TFLOP/s"].median()
    assert 80 < median["h100_qwen"] < 100 and 50 < median["mi300x_qwen"] < 70   # TraceLens: 90.3 and 61.4
    assert set(calls.groupby("trace")["peak TFLOP/s"].first().round(1)) == {989.0, 1307.4}
    fig = plots.achieved_vs_peak(calls)
    assert len(fig.axes[0].lines) == 4   # points and a peak line per GPU


def test_achieved_against_peak_refuses_calls_without_flops(reports):
    with pytest.raises(ValueError, match="no FLOPs"):
        gpu_lessons.achieved_against_peak({"sglang": reports["sglang_decode"]})   # graph replay: no shapes


def test_grid_against_sms_counts_waves_from_the_recorded_grid(reports):
    h100 = gpu_lessons.grid_against_sms(reports["h100_qwen"]).iloc[0]
    assert h100["grid"] == "5x16x16" and h100["CTAs"] == 1280 and h100["SMs (CUs)"] == 132
    assert h100["CTAs per SM at once"] == 2   # 255 registers x 128 threads: two blocks of 64K registers
    assert math.isclose(h100["waves"], 1280 / 264) and h100["calls"] == 24
    bert = gpu_lessons.grid_against_sms(reports["h100_bert"]).iloc[0]
    assert bert["CTAs"] == 16 and math.isclose(bert["% of SMs the grid can fill"], 100 * 16 / 132)
    mi300x = gpu_lessons.grid_against_sms(reports["mi300x_qwen"]).iloc[0]
    assert mi300x["CTAs"] == 608 and mi300x["SMs (CUs)"] == 304
    assert mi300x["CTAs per SM at once"] is None and mi300x["waves"] is None   # ROCm records no registers
    with pytest.raises(ValueError, match="recorded its grid"):
        gpu_lessons.grid_against_sms(reports["sglang_decode"])   # graph-replayed kernels carry no grid


def test_split_and_reduce_pairs_each_decode_call(reports):
    pairs = decoding.split_and_reduce(reports["sglang_decode"])
    assert len(pairs) == 36 and (pairs["kernels"] == 2).all()
    assert set(pairs["main kernel"]) == {"paged_attention_ll4mi_QKV_mfma16_kernel"}
    assert set(pairs["reduce kernel"]) == {"paged_attention_ll4mi_reduce_kernel"}
    assert set(pairs["launched by"]) == {"hipGraphLaunch"}
    assert math.isclose((pairs["main µs"] + pairs["reduce µs"]).sum(), reports["sglang_decode"].attention_gpu_us)
    assert (pairs["reduce share"] < 0.15).all() and (pairs["reduce µs"] > 0).all()
    with pytest.raises(ValueError, match="no attention call found by kernel name"):
        decoding.split_and_reduce(reports["h100_qwen"])   # fused SDPA calls, not kernels by name


def test_decode_backend_here_on_a_cpu_is_the_cpu_flash_kernel_for_both_calls():
    import torch

    from kernels.notebook import LessonFailed
    gpu_lessons.decode_backend_here("sdpa_flash", "sdpa_flash", "cpu", torch.float32, 64)
    with pytest.raises(LessonFailed):
        gpu_lessons.decode_backend_here("sdpa_flash", "sdpa_math", "cpu", torch.float32, 64)


def test_split_summary_sums_up_the_decode_calls(reports):
    pairs = decoding.split_and_reduce(reports["sglang_decode"])
    summary = decoding.split_summary(pairs)
    assert list(summary.index) == ["calls", "min", "median", "max"]
    assert summary.loc["calls", "main µs"] == len(pairs) == 36
    assert summary.loc["median", "reduce share"] == pairs["reduce share"].median()

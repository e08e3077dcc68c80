"""kernels.book.ch06_showdown: what chapter 6 reads from the borrowed H100/MI300X traces (run on
those traces), which timings rank nothing, the tail estimate, and a GPU run's fused medians."""
import math

import pytest

from kernels.bench import plots
from kernels.bench.results import FORWARD, BenchResult
from kernels.book import ch06_showdown as ch06
from kernels.borrowed import TRACELENS
from kernels.trace.attention import find_attention
from tests import hopper_trace as hop


@pytest.fixture(scope="module")
def reports():
    return {key: find_attention(TRACELENS[key].step()) for key in ("h100_qwen", "mi300x_qwen", "h100_bert",
                                                                   "sglang_decode")}


def test_achieved_against_peak_rows_are_each_call_over_its_gpu_peak(reports):
    calls = ch06.achieved_against_peak({k: reports[k] for k in ("h100_qwen", "mi300x_qwen")})
    assert len(calls) == 48 and set(calls["trace"]) == {"h100_qwen", "mi300x_qwen"}
    for _, row in calls.iterrows():
        assert math.isclose(row["% of peak"], 100 * row["TFLOP/s"] / row["peak TFLOP/s"])
    median = calls.groupby("trace")["TFLOP/s"].median()
    assert 80 < median["h100_qwen"] < 100 and 50 < median["mi300x_qwen"] < 70   # TraceLens: 90.3 and 61.4
    assert set(calls.groupby("trace")["peak TFLOP/s"].first().round(1)) == {989.0, 1307.4}
    fig = plots.achieved_vs_peak(calls)
    assert len(fig.axes[0].lines) == 4   # points and a peak line per GPU
    summary = ch06.per_gpu(calls)
    assert list(summary.index) == ["h100_qwen", "mi300x_qwen"] and list(summary["calls"]) == [24, 24]
    assert summary.loc["h100_qwen", "median TFLOP/s"] == pytest.approx(median["h100_qwen"])
    assert summary.loc["mi300x_qwen", "best % of peak"] == pytest.approx(calls[calls["trace"] == "mi300x_qwen"]["% of peak"].max())


def test_achieved_against_peak_refuses_calls_without_flops(reports):
    with pytest.raises(ValueError, match="no FLOPs"):
        ch06.achieved_against_peak({"sglang": reports["sglang_decode"]})   # graph replay: no shapes


def test_grid_against_sms_counts_waves_from_the_recorded_grid(reports):
    h100 = ch06.grid_against_sms(reports["h100_qwen"]).iloc[0]
    assert h100["grid"] == "5x16x16" and h100["CTAs"] == 1280 and h100["SMs (CUs)"] == 132
    assert h100["CTAs per SM at once"] == 2   # 255 registers x 128 threads: two blocks of 64K registers
    assert math.isclose(h100["waves"], 1280 / 264) and h100["calls"] == 24
    bert = ch06.grid_against_sms(reports["h100_bert"]).iloc[0]
    assert bert["CTAs"] == 16 and math.isclose(bert["% of SMs the grid can fill"], 100 * 16 / 132)
    mi300x = ch06.grid_against_sms(reports["mi300x_qwen"]).iloc[0]
    assert mi300x["CTAs"] == 608 and mi300x["SMs (CUs)"] == 304
    assert mi300x["CTAs per SM at once"] is None and mi300x["waves"] is None   # ROCm records no registers
    with pytest.raises(ValueError, match="recorded its grid"):
        ch06.grid_against_sms(reports["sglang_decode"])   # graph-replayed kernels carry no grid


def test_grids_table_is_one_row_a_trace_in_seven_columns(reports):
    table = ch06.grids_table({"H100 Qwen": reports["h100_qwen"], "H100 BERT": reports["h100_bert"]})
    assert list(table.index) == ["H100 Qwen", "H100 BERT"] and len(table.columns) == 7
    assert list(table["CTAs"]) == [1280, 16]


def test_tail_estimate_is_the_idle_share_of_the_last_wave_under_equal_work():
    assert ch06.tail_estimate(4.848) == pytest.approx(0.152 / 5)
    assert ch06.tail_estimate(2.0) == 0 and ch06.tail_estimate(0.25) == pytest.approx(0.75)


def point(impl, p10, p90):
    return BenchResult(impl=impl, device="cpu", dtype="float32", batch=1, heads=8, seq=512, head_dim=64,
                       causal=True, mode=FORWARD, flops=1e9, bytes=1e9, median_ms=(p10 + p90) / 2, p10_ms=p10,
                       p90_ms=p90, tflops=1.0, reps=10)


def test_overlapping_names_the_pairs_whose_spreads_overlap_and_only_those():
    points = {"naive": point("naive", 11.0, 21.3), "inplace": point("inplace", 10.0, 13.0),
              "sdpa_math": point("sdpa_math", 30.0, 35.0), "sdpa_flash": point("sdpa_flash", 1.0, 1.5)}
    assert ch06.overlapping(points) == [("naive", "inplace")]
    assert ch06.overlapping({"a": point("a", 1.0, 2.0), "b": point("b", 2.0, 3.0)}) == [("a", "b")], "touching counts"


def test_fused_medians_one_line_per_backend_measured():
    at_seq = {r.impl: r for r in hop.sweep_points(["naive", "sdpa_flash", "sdpa_cudnn"], seqs=(2048,))
              if r.seq == 2048}
    lines = ch06.fused_medians(at_seq).splitlines()
    flash_us = 1e3 * at_seq["sdpa_flash"].median_ms
    assert lines == [f"this run, sdpa_flash: {flash_us:.1f} µs median per forward (B=4 H=16 S=2048 D=64, bfloat16)",
                     lines[1]] and lines[1].startswith("this run, sdpa_cudnn: "), "fused backends only, in FUSED's order"

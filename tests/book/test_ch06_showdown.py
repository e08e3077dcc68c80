"""kernels.book.ch06_showdown: chapter 6's contenders, op counts and glance table; what it reads
from the borrowed H100/MI300X traces (run on those traces), which timings rank nothing, the tail
estimate, and a GPU run's fused medians."""
import math
from types import SimpleNamespace

import pytest

import kernels
from kernels.bench import plots
from kernels.bench.results import FORWARD, BenchResult
from kernels.book import ch06_showdown as ch06
from kernels.borrowed import TRACELENS
from kernels.hw.devices import Peaks
from kernels.trace.attention import find_attention
from tests import hopper_trace as hop

# 100 GFLOP/s and 10 GB/s: the ridge is 10 FLOP/byte.
ROOF = Peaks("test CPU", 100e9, 10e9, "float32", "made up for the test")


def point(impl, p10, p90, flops=1e9, nbytes=1e9):
    median = (p10 + p90) / 2
    return BenchResult(impl=impl, device="cpu", dtype="float32", batch=1, heads=8, seq=512, head_dim=64,
                       causal=True, mode=FORWARD, flops=flops, bytes=nbytes, median_ms=median, p10_ms=p10,
                       p90_ms=p90, tflops=flops / (median * 1e-3) / 1e12, reps=10, peak_memory_bytes=2**20)


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
    table = ch06.grids_table({"H100 Qwen": reports["h100_qwen"], "H100 BERT": reports["h100_bert"],
                              "MI300X Qwen": reports["mi300x_qwen"]})
    assert list(table.index) == ["H100 Qwen", "H100 BERT", "MI300X Qwen"] and len(table.columns) == 7
    assert list(table["CTAs"]) == [1280, 16, 608]
    assert list(table["waves"]) == ["4.85", "0.06", "—"], "two decimals; a dash where nothing was recorded"
    assert list(table["CTAs/SM"]) == ["2", "2", "—"]
    busy, kineto = table["busy-SM occupancy %"], table["Kineto occupancy %"]
    assert list(busy) == ["12.5", "12.5", "—"] and kineto["MI300X Qwen"] == "—"
    assert "None" not in table.to_string() and "nan" not in table.to_string().lower()


def test_tail_estimate_is_the_idle_share_of_the_last_wave_under_equal_work():
    assert ch06.tail_estimate(4.848) == pytest.approx(0.152 / 5)
    assert ch06.tail_estimate(2.0) == 0 and ch06.tail_estimate(0.25) == pytest.approx(0.75)


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



def test_contenders_on_a_cpu_leave_out_the_interpreted_and_compiled_entries_with_a_reason():
    measured, left_out = ch06.contenders("cpu")
    assert measured == ["naive", "inplace", "sdpa_math", "sdpa_flash"]
    slow = [n for n in kernels.names() if kernels.implementation(n).slow_on_cpu]
    assert slow and all(left_out[n].startswith(f"{n}: ") for n in slow)
    assert "interpreted" in left_out["triton"] and "not a performance number" in left_out["triton"]
    assert all("compiles once per length" in left_out[n] and "chapter 7" in left_out[n]
               for n in ("compiled_naive", "flex") if n in slow)
    assert set(measured) | set(left_out) == set(kernels.names())


def test_glance_shows_a_time_only_where_the_spread_check_passes():
    quiet, noisy = point("naive", 10.0, 11.0), point("sdpa_flash", 1.0, 1.0 * (plots.NOISY_SPREAD + 1), nbytes=1e7)
    table = ch06.glance({"naive": quiet, "sdpa_flash": noisy}, ROOF)
    assert table.loc["naive", "time (ms)"] == pytest.approx(10.5)
    assert table.loc["naive", "p10-p90 (ms)"] == "10-11"
    assert table.loc["naive", "% of roof"] == pytest.approx(100 * quiet.tflops * 1e12 / 10e9)   # intensity 1: the slope
    assert table.loc["naive", "side of ridge"] == "memory"
    assert table.loc["sdpa_flash", "side of ridge"] == "compute"                        # 100 FLOP/byte
    assert table[["time (ms)", "GFLOP/s", "% of roof", "p10-p90 (ms)"]].loc["sdpa_flash"].isna().all()
    assert table.loc["naive", "GFLOP/s"] == pytest.approx(1e3 * quiet.tflops), "a CPU-sized roof reads GFLOP/s"
    assert "TFLOP/s" in ch06.glance({"naive": quiet}, Peaks("GPU", 989e12, 3.35e12, "bfloat16", "datasheet"))
    assert table.loc["sdpa_flash", "peak (MiB)"] == 1.0
    assert table.columns[0] == "peak (MiB)" and len(table.columns) <= 7, "the answer column first, fits a page"


def test_lineup_says_for_each_implementation_whether_it_is_measured_and_its_lesson():
    table = ch06.lineup("cpu")
    assert list(table.index) == kernels.names()
    assert table.loc["naive", "here"] == "measured" and "copies" in table.loc["naive", "its lesson"]
    assert table.loc["triton", "here"] == "correct, but interpreted on a CPU"
    assert table.loc["compiled_naive", "here"].startswith("compiles once per length")
    assert "tiles" in table.loc["sdpa_flash", "its lesson"]
    assert table.loc["sdpa_efficient", "here"] == "needs a CUDA GPU", "the reason's shortest clause, one line a row"


def test_short_reason_keeps_the_clause_that_says_what_is_needed_or_the_whole_reason():
    assert ch06.short_reason("PyTorch has no CPU kernel (SDPA raises); it needs a CUDA GPU") == "needs a CUDA GPU"
    assert ch06.short_reason("needs a CUDA GPU; the inputs are on cpu") == "needs a CUDA GPU"
    assert ch06.short_reason("compute capability 7.5 is too old") == "compute capability 7.5 is too old"
    assert ch06.short_reason("correct, but not timed here; its time is noise") == "correct, but not timed here"


def test_smallest_first_orders_by_amount_and_breaks_ties_the_guess_s_way():
    peaks = {"naive": 66, "sdpa_math": 90, "inplace": 66, "sdpa_flash": 2}
    assert ch06.smallest_first(peaks) == ["sdpa_flash", "naive", "inplace", "sdpa_math"], "ties in the table's order"
    assert ch06.smallest_first(peaks, ["inplace", "naive"]) == ["sdpa_flash", "inplace", "naive", "sdpa_math"], \
        "a tie is ordered as the guess ordered it"
    assert ch06.smallest_first(peaks, ["sdpa_math", "naive"]) == ["sdpa_flash", "naive", "inplace", "sdpa_math"], \
        "a guess never reorders names whose amounts differ"


def test_smallest_first_verdict_credits_either_order_of_a_tie():
    peaks = {"naive": 17.0, "inplace": 17.0, "sdpa_math": 20.0, "sdpa_flash": 1.157}
    line = ch06.smallest_first_verdict(["sdpa_flash", "inplace", "naive", "sdpa_math"], peaks)
    assert line.startswith("Measured, smallest first: sdpa_flash 1.157 MiB; naive and inplace tied at 17 MiB; "
                           "sdpa_math 20 MiB.") and line.endswith("4 of 4 at a right place.")
    assert ch06.smallest_first_verdict(["sdpa_flash", "naive", "inplace", "sdpa_math"], peaks).endswith("4 of 4 at a right place.")
    assert ch06.smallest_first_verdict(["inplace", "naive", "sdpa_flash", "sdpa_math"], peaks).endswith("2 of 4 at a right place.")


def test_count_of_says_one_thing_without_a_plural():
    assert ch06.count_of(1, "key tile") == "1 key tile" and ch06.count_of(5, "key tile") == "5 key tiles"


def test_ops_table_counts_and_names_the_work_ops():
    step = SimpleNamespace(work_ops=lambda: ["aten::bmm", "aten::mul", "aten::bmm"], gpu_work=[1, 2, 3])
    table = ch06.ops_table({"naive": step}, on_gpu=True)
    assert table.loc["naive", "work ops per forward"] == 3
    assert table.loc["naive", "which"] == "bmm ×2, mul"
    assert table.loc["naive", "GPU activities per forward"] == 3
    assert "GPU activities per forward" not in ch06.ops_table({"naive": step}, on_gpu=False)
    assert "GPU activities per forward" in ch06.ops_table({"naive": step}), "GPU work recorded: a GPU run"
    cpu_step = SimpleNamespace(work_ops=step.work_ops, gpu_work=[])
    assert "GPU activities per forward" not in ch06.ops_table({"naive": cpu_step})


def test_the_articles_a100_table_matches_the_reference_numbers():
    cuda_us = ch06.ARTICLE_A100["CUDA time per forward (µs)"]
    assert cuda_us["SDPA math"] / cuda_us["in-place (masked_fill_)"] == pytest.approx(3.7, abs=0.01)
    assert ch06.ARTICLE_A100["kernels per forward"].tolist() == [6, 5, 20, 1, 1, 1]


def test_profile_forwards_keeps_a_median_step_each_and_leaves_out_what_cannot_run(capsys, tmp_path):
    import torch

    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    steps = ch06.profile_forwards(["naive", "no_such_implementation"], q, k, v, active=2, trace_dir=tmp_path)
    assert list(steps) == ["naive"] and steps["naive"].work_ops()
    assert "no_such_implementation could not run here" in capsys.readouterr().out


def test_glance_and_article_tables_are_captioned():
    table = ch06.glance({"naive": point("naive", 1.0, 1.2)}, ROOF)
    styled = ch06.glance_styled(table, "this run")
    assert styled.caption == "this run" and "e+" not in styled.to_html()
    article = ch06.article_styled()
    assert "not measured by this build" in article.caption
    assert "1,955" in article.to_html() and "1955.0" not in article.to_html() and "—" in article.to_html()


def test_exercise_check_waves_passes_the_arithmetic_and_names_each_slip():
    from kernels.exercises import showdown as ex6
    from kernels.exercises.judge import ExerciseFailed

    assert ex6.waves_answer((5, 16, 16), 128, 255, 132) == (2, 1280 / 264, 12.5), "chapter 6's H100 Qwen row"
    assert ex6.check_waves(ex6.waves_answer)

    def slipped(fn, match):
        with pytest.raises(ExerciseFailed, match=match):
            ex6.check_waves(fn)

    slipped(lambda *a: None, r"must return three numbers")
    slipped(lambda g, t, r, s: (64 // (t // 32),) + ex6.waves_answer(g, t, r, s)[1:], r"registers limit it further")
    slipped(lambda g, t, r, s: (ex6.waves_answer(g, t, r, s)[0], math.prod(g) / s, ex6.waves_answer(g, t, r, s)[2]),
            r"waves are off")
    slipped(lambda g, t, r, s: ex6.waves_answer(g, t, r, s)[:2] + (ex6.waves_answer(g, t, r, s)[2] / 100,),
            r"in %, not as a fraction")


def at(impl, seq, median, spread=1.1):
    """A sweep row at ``seq`` with its p10-p90 around ``median`` (``spread`` = p90/p10)."""
    r = point(impl, median / spread ** 0.5, median * spread ** 0.5)
    r.seq = seq
    return r


def test_sweep_reading_says_the_s2_shows_only_when_enough_points_pass_and_slopes_are_near_2():
    quiet = [at("naive", s, (s / 256) ** 2) for s in (256, 512, 1024)] + [at("flash", s, (s / 256) ** 2 / 4)
                                                                         for s in (256, 512, 1024)]
    said = ch06.sweep_reading(quiet)
    assert "6 of 6 points" in said and "naive 2.0" in said and "S² of attention shows" in said
    assert math.isclose(ch06.slopes(quiet)["flash"], 2.0)
    # the reviewer's run: a line with a slope of 0.9, and most points failing the spread check
    noisy = [at("inplace", 256, 85.0), at("inplace", 512, 160.0), at("naive", 1024, 500, spread=3),
             at("naive", 512, 120, spread=3)]
    said = ch06.sweep_reading(noisy)
    assert "2 of 4 points" in said and "inplace 0.9" in said and "slopes stray from 2" in said
    assert "shows." not in said
    # a fused line flattened at short S by a fixed per-call cost: explained, with its steeper tail
    fixed = [at("naive", s, (s / 256) ** 2) for s in (128, 256, 512, 1024)] + [
        at("flash", s, 0.3 + (s / 256) ** 2) for s in (128, 256, 512, 1024)]
    said = ch06.sweep_reading(fixed)
    assert "S² of attention shows" in said and "flash's 1.6 is flatter because a fixed per-call cost" in said
    assert "from S=512 to 1024 its slope is 1.9" in said and "naive's" not in said
    assert ch06.flatter_text({"flash": 1.6}, {"flash": (512, 1024, 1.5)}) == (
        "; flash's 1.6 is flatter, and this run does not say why")
    lone = [at("naive", 512, 1.0)]
    assert ch06.slopes(lone) == {} and "Too few points passed" in ch06.sweep_reading(lone)


def test_three_figures_gives_one_precision_to_the_glance_and_its_quotes():
    assert ch06.three_figures(1.2984) == 1.3 and ch06.three_figures(160.4) == 160 and ch06.three_figures(32.81) == 32.8
    assert math.isnan(ch06.three_figures(float("nan")))
    table = ch06.glance({"naive": point("naive", 47.97, 52.014)}, ROOF)
    assert table.loc["naive", "p10-p90 (ms)"] == "48-52"


def test_untimed_text_names_the_rows_without_a_time_or_says_every_row_passed():
    import pandas as pd

    assert ch06.untimed_text(pd.DataFrame({"time (ms)": [1.0, 2.0]}, index=["a", "b"])) == (
        "every row passed the spread check on this run")
    assert ch06.untimed_text(pd.DataFrame({"time (ms)": [1.0, float("nan")]}, index=["a", "b"])).endswith(": b")

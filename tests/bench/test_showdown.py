"""kernels.bench.showdown: chapter 6's contenders, op counts and glance table."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import kernels
from kernels.bench import plots, showdown
from kernels.bench.results import FORWARD, BenchResult
from kernels.hw.devices import Peaks

# 100 GFLOP/s and 10 GB/s: the ridge is 10 FLOP/byte.
ROOF = Peaks("test CPU", 100e9, 10e9, "float32", "made up for the test")


def point(impl, p10, p90, flops=1e9, nbytes=1e9):
    median = (p10 + p90) / 2
    return BenchResult(impl=impl, device="cpu", dtype="float32", batch=1, heads=8, seq=512, head_dim=64,
                       causal=True, mode=FORWARD, flops=flops, bytes=nbytes, median_ms=median, p10_ms=p10,
                       p90_ms=p90, tflops=flops / (median * 1e-3) / 1e12, reps=10, peak_memory_bytes=2**20)


def test_contenders_on_a_cpu_leave_out_the_interpreted_and_compiled_entries_with_a_reason():
    measured, left_out = showdown.contenders("cpu")
    assert measured == ["naive", "inplace", "sdpa_math", "sdpa_flash"]
    slow = [n for n in kernels.names() if kernels.implementation(n).slow_on_cpu]
    assert slow and all("not a performance number" in left_out[n] for n in slow)
    assert set(measured) | set(left_out) == set(kernels.names())


def test_glance_shows_a_time_only_where_the_spread_check_passes():
    quiet, noisy = point("naive", 10.0, 11.0), point("sdpa_flash", 1.0, 1.0 * (plots.NOISY_SPREAD + 1), nbytes=1e7)
    table = showdown.glance({"naive": quiet, "sdpa_flash": noisy}, ROOF)
    assert table.loc["naive", "time (ms)"] == pytest.approx(10.5)
    assert table.loc["naive", "p10-p90 (ms)"] == "10-11"
    assert table.loc["naive", "% of roof"] == pytest.approx(100 * quiet.tflops * 1e12 / 10e9)   # intensity 1: the slope
    assert table.loc["naive", "side of ridge"] == "memory-bound"
    assert table.loc["sdpa_flash", "side of ridge"] == "compute-bound"                        # 100 FLOP/byte
    assert table[["time (ms)", "TFLOP/s", "% of roof", "p10-p90 (ms)"]].loc["sdpa_flash"].isna().all()
    assert table.loc["sdpa_flash", "peak memory (MiB)"] == 1.0
    assert table.columns[0] == "peak memory (MiB)" and len(table.columns) <= 7, "the answer column first, fits a page"


def test_lineup_says_for_each_implementation_whether_it_is_measured_and_its_lesson():
    table = showdown.lineup("cpu")
    assert list(table.index) == kernels.names()
    assert table.loc["naive", "here"] == "measured" and "copies" in table.loc["naive", "its lesson"]
    assert table.loc["triton", "here"] == "correct, but not timed on a CPU"
    assert "tiles" in table.loc["sdpa_flash", "its lesson"]
    assert table.loc["sdpa_efficient", "here"] == "needs a CUDA GPU", "the reason's shortest clause, one line a row"


def test_short_reason_keeps_the_clause_that_says_what_is_needed_or_the_whole_reason():
    assert showdown.short_reason("PyTorch has no CPU kernel (SDPA raises); it needs a CUDA GPU") == "needs a CUDA GPU"
    assert showdown.short_reason("needs a CUDA GPU; the inputs are on cpu") == "needs a CUDA GPU"
    assert showdown.short_reason("compute capability 7.5 is too old") == "compute capability 7.5 is too old"
    assert showdown.short_reason("correct, but not timed here; its time is noise") == "correct, but not timed here"


def test_smallest_first_orders_by_amount_and_breaks_ties_the_guess_s_way():
    peaks = {"naive": 66, "sdpa_math": 90, "inplace": 66, "sdpa_flash": 2}
    assert showdown.smallest_first(peaks) == ["sdpa_flash", "naive", "inplace", "sdpa_math"], "ties in the table's order"
    assert showdown.smallest_first(peaks, ["inplace", "naive"]) == ["sdpa_flash", "inplace", "naive", "sdpa_math"], \
        "a tie is ordered as the guess ordered it"
    assert showdown.smallest_first(peaks, ["sdpa_math", "naive"]) == ["sdpa_flash", "naive", "inplace", "sdpa_math"], \
        "a guess never reorders names whose amounts differ"


def test_ops_table_counts_and_names_the_work_ops():
    step = SimpleNamespace(work_ops=lambda: ["aten::bmm", "aten::mul", "aten::bmm"], gpu_work=[1, 2, 3])
    table = showdown.ops_table({"naive": step}, on_gpu=True)
    assert table.loc["naive", "work ops per forward"] == 3
    assert table.loc["naive", "which"] == "bmm ×2, mul"
    assert table.loc["naive", "GPU activities per forward"] == 3
    assert "GPU activities per forward" not in showdown.ops_table({"naive": step}, on_gpu=False)


def test_the_articles_a100_table_matches_the_reference_numbers():
    cuda_us = showdown.ARTICLE_A100["CUDA time per forward (µs)"]
    assert cuda_us["SDPA math"] / cuda_us["in-place (masked_fill_)"] == pytest.approx(3.7, abs=0.01)
    assert showdown.ARTICLE_A100["kernels per forward"].tolist() == [6, 5, 20, 1, 1, 1]


def test_profile_forwards_keeps_a_median_step_each_and_leaves_out_what_cannot_run(capsys, tmp_path):
    import torch

    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    steps = showdown.profile_forwards(["naive", "no_such_implementation"], q, k, v, active=2, trace_dir=tmp_path)
    assert list(steps) == ["naive"] and steps["naive"].work_ops()
    assert "no_such_implementation could not run here" in capsys.readouterr().out


def test_glance_and_article_tables_are_captioned():
    table = showdown.glance({"naive": point("naive", 1.0, 1.2)}, ROOF)
    styled = showdown.glance_styled(table, "this run")
    assert styled.caption == "this run" and "e+" not in styled.to_html()
    assert "not measured by this build" in showdown.article_styled().caption

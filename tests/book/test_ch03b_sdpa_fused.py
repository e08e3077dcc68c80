"""Chapter 3b's own reading (kernels.book.ch03b_sdpa_fused): the peak-memory sweep and the CPU
flash kernel's allocations on real CPU profiles, the CPU time of a first call, the reveal of the
page's occupancy question, and the fused kernels of a GPU run on Hopper-shaped fixture steps."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from kernels.book import ch03b_sdpa_fused as ch03b
from kernels.hw.occupancy import occupancy
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop


# ---- the CPU readings chapter 3 shows, on real CPU profiles -------------------------------------

def _profile(name: str, seq: int, tmp_path):
    from kernels.trace import record
    from tests.helpers import make_qkv
    import kernels

    q, k, v = make_qkv(1, 2, seq, 16, seed=1)
    run = record.profile(kernels.get(name), q, k, v, label=name, wait=0, warmup=1, active=1, trace_dir=tmp_path)
    return run.step(), q


def test_the_peak_memory_sweep_grows_4x_for_math_and_says_where_a_backend_did_not_run(tmp_path):
    lengths = {"sdpa_math": [64, 128], "sdpa_flash": [64, 128, 256]}
    peaks, steps = ch03b.peak_memory_sweep(lengths, 1, 2, 16, dtype=torch.float32, device=torch.device("cpu"),
                                          trace_dir=str(tmp_path))
    assert sorted(steps) == sorted((n, s) for n, seqs in lengths.items() for s in seqs)
    assert peaks.index.tolist() == [64, 128, 256] and pd.isna(peaks.loc[256, "sdpa_math"])
    growth = ch03b.growth_per_doubling(peaks)["sdpa_math x per doubling"].dropna()
    assert 3 < growth.iloc[-1] < 4.5                     # the S x S buffers
    shown = ch03b.peaks_and_growth(peaks)
    assert not shown.isna().any().any()
    assert shown.loc[64, "math growth"] == "—" and shown.loc[256, "math (MiB)"] == "—"
    assert shown.loc[128, "math growth"] == f"{growth.loc[128]:.2f}x"
    assert shown.loc[128, "math (MiB)"] == f"{peaks.loc[128, 'sdpa_math']:,.2f}"
    assert len(ch03b.peak_memory_figure(peaks, "t").axes[0].lines) == 4   # two backends, two guides
    legend = ch03b.peak_memory_figure(peaks).axes[0].get_legend()   # a title of its own, the legend above the axes
    assert legend.get_bbox_to_anchor().transformed(legend.axes.transAxes.inverted()).y0 > 0.999
    with pytest.raises(ValueError, match="at least one sequence length"):
        ch03b.peak_memory_sweep({"sdpa_math": []}, 1, 2, 16, dtype=torch.float32, device=torch.device("cpu"),
                               trace_dir=str(tmp_path))


def test_cpu_flash_allocations_name_the_output_and_the_log_sum_exp(tmp_path):
    step, q = _profile("sdpa_flash", 128, tmp_path)
    got = ch03b.cpu_flash_allocations(step, 1, 2, 128, 16, q.element_size())
    sizes = step.memory.loc[step.memory["bytes"] > 0, "bytes"].tolist()
    assert got["allocations"] == len(sizes) >= 2
    assert got["output"] and got["log-sum-exp"]
    assert got["scratch (KiB)"] * 1024 == sum(sizes) - 1 * 2 * 128 * 16 * 4 - 1 * 2 * 128 * 4


def test_cpu_flash_allocation_table_refuses_a_sweep_without_flash():
    """Its rows over a sweep's flash steps are chapter 3b's lessons (every row three buffers, the
    math backend's steps beside them), asserted when the chapter executes."""
    with pytest.raises(ValueError, match="no sdpa_flash step"):
        ch03b.cpu_flash_allocation_table({("sdpa_math", 128): None}, 1, 2, 16, 4)



def test_first_call_cpu_ms_separates_a_slow_first_call_from_the_median_after_it():
    import time

    seen = []

    def builds_once(x):
        if not seen:
            time.sleep(0.05)   # the first call at a new shape builds a plan
        seen.append(x)

    first, steady = ch03b.first_call_cpu_ms(builds_once, (torch.zeros(1),), calls=5)
    assert len(seen) == 5 and first >= 50 and steady < first / 5
    with pytest.raises(ValueError, match="at least 2"):
        ch03b.first_call_cpu_ms(builds_once, (), calls=1)



def test_reveal_limit_names_the_resource_that_runs_out_first_and_every_limit(capsys):
    occ = occupancy(threads_per_block=128, registers_per_thread=255, arch="sm_90")
    text = ch03b.reveal_limit("shared memory", occ)
    assert text.startswith("The resource that runs out first is registers (you guessed shared memory)")
    assert "registers 2" in text and f"shared memory {occ.blocks_by_shared_memory}" in text
    assert capsys.readouterr().out.strip() == text
    assert "(as you guessed)" in ch03b.reveal_limit("registers", occ)
    with pytest.raises(ValueError, match="guess one of"):
        ch03b.reveal_limit("L2", occ)


def steps_of(**replace):
    rows = {**hop.FUSED, **replace}
    return {name: hop.step(name, r) for name, r in rows.items()}


def test_chapter3b_fused_kernels_read_one_kernel_each_and_kinetos_zero_rule():
    table = ch03b.fused_kernels_read(steps_of())
    assert list(table.columns) == [n for n in ch03b.FUSED if n in hop.FUSED]
    with pytest.raises(LessonFailed, match="sdpa_efficient launches exactly one kernel"):
        ch03b.fused_kernels_read(steps_of(sdpa_efficient=hop.FUSED["sdpa_efficient"] * 2))


# ---- the page's tables and sentences --------------------------------------------------------------

def test_the_article_table_says_why_a_shortened_name_has_no_dtype_and_lists_the_full_names():
    from kernels.attention import sdpa
    from kernels.trace.fingerprints import classify_many

    names = sdpa.ARTICLE_A100_KERNELS
    table = ch03b.article_kernel_table(classify_many(names.values()), list(names))
    assert table.index.tolist() == list(names) and "name" not in table.columns
    assert table.loc["sdpa_flash", "dtype"] == "not in the shortened name"
    assert table.loc["sdpa_efficient", "dtype"] == "bf16" and (table["tensor cores"] == "yes").all()
    listed = ch03b.kernel_name_list(names).splitlines()
    assert listed == [f"- {backend}: `{name}`" for backend, name in names.items()]


def _comparison(p10: dict, p90: dict):
    from kernels.bench.comparison import Comparison

    return Comparison(median_ms={n: (p10[n] + p90[n]) / 2 for n in p10}, p10_ms=p10, p90_ms=p90, rounds=11)


def test_the_timing_table_shows_each_spread_and_the_pair_reading_ranks_only_apart_ranges():
    apart = _comparison({"inplace": 10.0, "sdpa_math": 20.0}, {"inplace": 12.0, "sdpa_math": 25.0})
    table = ch03b.timing_table(apart)
    assert table.columns.tolist() == ["p10 (ms)", "median (ms)", "p90 (ms)"] and table.index.name == "variant"
    assert table.loc["sdpa_math", "p90 (ms)"] == 25.0
    assert ch03b.pair_reading(apart, "inplace", "sdpa_math").startswith("Between inplace and sdpa_math the check ranks inplace faster")
    assert "ranks inplace faster" in ch03b.pair_reading(apart, "sdpa_math", "inplace")
    overlap = _comparison({"inplace": 10.0, "sdpa_math": 11.0}, {"inplace": 12.0, "sdpa_math": 25.0})
    assert "not ranked against each other" in ch03b.pair_reading(overlap, "inplace", "sdpa_math")


def test_the_figure_marks_a_flash_doubling_above_2x_with_its_factor():
    peaks = pd.DataFrame({"sdpa_math": [1.0, 4.0, None], "sdpa_flash": [1.0, 2.5, 5.0]}, index=[256, 512, 1024])
    texts = [t.get_text() for t in ch03b.peak_memory_figure(peaks, "t").axes[0].texts]
    assert texts == ["2.50x"]


def test_pair_verdict_ranks_a_pair_only_when_its_ranges_are_apart():
    timing = _comparison({"a": 10.0, "b": 20.0, "c": 11.0}, {"a": 12.0, "b": 25.0, "c": 30.0})
    assert ch03b.pair_verdict(timing, "a", "b") == "a faster than b"
    assert ch03b.pair_verdict(timing, "b", "a") == "a faster than b"
    assert ch03b.pair_verdict(timing, "a", "c") == "a and c overlap: not ranked"


def test_pair_reading_prints_long_times_without_e_notation():
    timing = _comparison({"a": 200.0, "b": 404.4}, {"a": 462.5, "b": 1059.3})
    assert "404.4-1,059 ms" in ch03b.pair_reading(timing, "a", "b") and "e+" not in ch03b.pair_reading(timing, "a", "b")

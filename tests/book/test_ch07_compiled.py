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


def test_compiles_text_says_one_graph_without_a_plural_and_where_it_came_from():
    from kernels.attention.torch_compile import Compiles

    assert ch07.compiles_text(Compiles(1, 1, 0, 0)) == "1 graph compiled (1 from Inductor's cache)"
    assert ch07.compiles_text(Compiles(0, 0, 0, 0)) == "0 graphs compiled"
    assert ch07.compiles_text(Compiles(3, 1, 2, 1)) == "3 graphs compiled (1 from Inductor's cache, 2 generated), 1 given up"


def test_first_call_text_calls_a_cache_hit_a_cache_load_and_a_miss_a_compile():
    from kernels.attention.torch_compile import Compiles, FirstAndSteady

    loaded = FirstAndSteady(2.9, 0.01, Compiles(1, 1, 0, 0), Compiles(0, 0, 0, 0))
    assert "cache load" in ch07.first_call_text(loaded, 0.1) and "0.10 s" in ch07.first_call_text(loaded, 0.1)
    cold = FirstAndSteady(9.0, 0.01, Compiles(1, 0, 1, 0), Compiles(0, 0, 0, 0))
    assert "cold compile" in ch07.first_call_text(cold, 0.1) and "cache load" not in ch07.first_call_text(cold, 0.1)


def test_steady_text_quotes_only_a_spread_that_passes():
    quiet = ch07.steady_text(2.9, (10.0, 9.0, 11.0))
    assert "10 ms" in quiet and "290 steady calls" in quiet
    assert "failed the spread check" in ch07.steady_text(2.9, (10.0, 5.0, 20.0))


def test_ops_present_grades_what_and_how_many_never_where():
    seen = ["aten::bmm", "aten::bmm"]
    assert ch07.ops_present(["aten::bmm", "aten::bmm"], seen) == "aten::bmm ×2: ✔. Nothing unguessed."
    said = ch07.ops_present(["aten::bmm", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::bmm"], seen)
    assert said.startswith("aten::bmm ×2: ✔; aten::mul ×1: not there") and "Not guessed" not in said
    assert ch07.ops_present(["aten::mul"], seen) == "aten::mul ×1: not there. Not guessed: aten::bmm ×2."
    assert "the trace has ×2" in ch07.ops_present(["aten::bmm"], seen)


def test_kernels_table_shows_names_fused_ops_as_text_and_no_filter_row_numbers():
    import pandas as pd

    generated = pd.DataFrame({"name": ["graph_0_cpp_fused_mul_0"], "fused": [["mul"]], "dur_us": [6.9]}, index=[7])
    table = ch07.kernels_table(generated)
    assert list(table.columns) == ["kernel", "ops it fused"] and list(table.index) == [0]
    assert table.loc[0, "ops it fused"] == "mul"
    assert list(ch07.shown(generated.rename(columns={"fused": "x"})).columns) == ["name", "x", "time (µs)"]

"""kernels.book.ch07_compiled: the reading of a GPU run's compiled and flex forwards (on
Hopper-shaped fixture steps) and the sentences about what timing in turns shows."""
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


def test_break_timing_ranks_only_a_ratio_on_one_side_of_one():
    slower = ch07.break_timing({"broken": [14.0, 15.0, 13.0], "unbroken": [10.0, 10.0, 10.0]})
    assert "unbroken forward is the faster" in slower and "3 rounds" in slower
    faster = ch07.break_timing({"broken": [8.0, 9.0, 8.5], "unbroken": [10.0, 10.0, 10.0]})
    assert "broken forward is the faster" in faster and "unbroken forward is" not in faster
    # a busy machine: each forward's own times swing threefold, but round by round the ratio holds
    busy = ch07.break_timing({"broken": [30.0, 12.0, 45.0, 13.0], "unbroken": [20.0, 8.0, 30.0, 9.0]})
    assert "unbroken forward is the faster" in busy
    straddles = ch07.break_timing({"broken": [9.0, 11.0, 10.0], "unbroken": [10.0, 10.0, 10.0]})
    assert "does not rank them" in straddles and "faster" not in straddles


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


def test_steady_text_bounds_the_count_by_the_p90_and_quotes_no_absolute_time():
    quiet = ch07.steady_text(2.9, {"compiled": [10.0] * 5, "eager": [20.0] * 5})
    assert "at least 290 steady calls" in quiet and " ms" not in quiet
    assert "compiled forward is the faster" in quiet
    noisy = ch07.steady_text(2.9, {"compiled": [5.0, 10.0, 20.0, 20.0], "eager": [10.0, 20.0, 40.0, 40.0]})
    assert "at least 145 steady calls" in noisy and " ms" not in noisy
    assert "compiled forward is the faster" in noisy
    straddles = ch07.steady_text(2.9, {"compiled": [10.0, 20.0, 10.0, 20.0], "eager": [20.0, 10.0, 20.0, 10.0]})
    assert "does not rank them" in straddles


def test_rotated_turns_calls_each_module_on_a_different_input_set_each_round():
    seen = []

    def module(q, k, v):
        seen.append(q.data_ptr())
        return q

    times = ch07.rotated_turns({"a": module, "b": module}, (1, 1, 4, 2), torch.float32, "cpu", rounds=3)
    assert [len(t) for t in times.values()] == [3, 3]
    assert len(set(seen)) > 1 and all(x != y for x, y in zip(seen, seen[1:]))


def test_ops_present_grades_what_and_how_many_never_where():
    seen = ["aten::bmm", "aten::bmm"]
    assert ch07.ops_present(["aten::bmm", "aten::bmm"], seen) == "aten::bmm ×2 ✔. Nothing unguessed."
    said = ch07.ops_present(["aten::bmm", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::bmm"], seen)
    assert said == "aten::bmm ×2 ✔; not there: aten::mul ×1, aten::masked_fill ×1, aten::softmax ×1. Nothing unguessed."
    assert ch07.ops_present(["aten::mul"], seen) == "not there: aten::mul ×1. Not guessed: aten::bmm ×2."
    assert "(the trace has ×2)" in ch07.ops_present(["aten::bmm"], seen)


def test_error_text_quotes_each_tensor_error_against_its_bound():
    from kernels.reference import Judgement, Verdict

    said = ch07.error_text(Judgement({"out": Verdict("out", 7.78e-07, 3.28e-05, "rule")}))
    assert said == "out error 7.78e-07 <= 3.28e-05"


def test_call_table_puts_the_cpu_ops_then_the_gpu_kernels_with_their_launcher():
    import pandas as pd
    from types import SimpleNamespace

    call = SimpleNamespace(ops=pd.DataFrame({"name": ["TorchDynamo Cache Lookup", "Torch-Compiled Region: 0/0", "triton_k"],
                                             "depth": [0, 0, 1], "dur_us": [35.6, 1353.0, 95.8]}),
                           kernels=pd.DataFrame({"name": ["triton_k"], "launcher": ["cuLaunchKernel"], "dur_us": [1.76]}))
    table = ch07.call_table(call)
    assert list(table["event"]) == ["TorchDynamo Cache Lookup", "Torch-Compiled Region: 0/0", "· triton_k", "triton_k"]
    assert list(table["on"]) == ["CPU", "CPU", "CPU", "GPU"]
    assert list(table["launched by"]) == ["", "", "", "cuLaunchKernel"] and table["time (µs)"].iloc[-1] == 1.76

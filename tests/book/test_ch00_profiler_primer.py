"""Chapter 0's own checks (kernels/book/ch00_profiler_primer.py): where each wait for the GPU in
a step comes from, on the borrowed BERT step the page reads and on a synthetic step."""
import pandas as pd

from kernels import borrowed
from kernels.book.ch00_profiler_primer import frames_around, runtime_table_whole, synchronisations
from kernels.trace import reader
from tests.gpu_trace import forward_trace


def test_the_bert_step_waits_twice_once_for_the_harness_and_once_for_the_model():
    step = borrowed.TRACELENS["h100_bert"].step()
    waits = synchronisations(step)
    assert waits["call"].tolist() == ["cudaDeviceSynchronize", "cudaStreamSynchronize"]
    harness, model = waits.iloc[0], waits.iloc[1]
    # the harness's torch.cuda.synchronize(): outside every op and module, before the model's first op and launch
    assert pd.isna(harness["op"]) and not harness["in_module"] and not harness["after_first_launch"]
    assert harness["python"].startswith("torch/cuda/__init__.py") and harness["python"].endswith(": synchronize")
    assert harness["start_us"] < step.ops["start_us"].min()
    # the model's read of a GPU value: inside an op, a module and after work was queued
    assert model["op"] == "aten::_local_scalar_dense" and model["in_module"] and model["after_first_launch"]
    assert "modeling_attn_mask_utils" in model["python"]


def test_a_step_without_python_frames_has_none_and_a_sync_after_the_launches_says_so():
    profiler_step = reader.load_trace(forward_trace("mlp_step")).profiler_steps()[0]
    waits = synchronisations(profiler_step)
    assert waits["call"].tolist() == ["cudaDeviceSynchronize"]   # record.profile's, after the label
    assert waits["python"].tolist() == [None] and waits["after_first_launch"].tolist() == [True]
    call = profiler_step.runtime_calls.iloc[0]
    assert frames_around(profiler_step, call) == []


def test_the_runtime_table_names_every_op_a_call_was_made_in():
    step = borrowed.TRACELENS["h100_bert"].step()
    table = runtime_table_whole(step).set_index("call")
    assert not table["made in"].str.endswith("...").any()
    launches = step.runtime_calls[step.runtime_calls["name"] == "cudaLaunchKernel"]
    assert set(table.at["cudaLaunchKernel", "made in"].split(", ")) == {o.removeprefix("aten::") for o in launches["op"].dropna()}
    assert table.at["cudaDeviceSynchronize", "made in"] == ""    # the harness's, outside every op


def test_the_summary_columns_are_the_key_averages_sums_most_cpu_total_first():
    import torch

    from kernels.book.ch00_profiler_primer import summary_columns
    from kernels.trace import record

    x, w = torch.randn(64, 32), torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            record.mlp_step(x, w)
    assert len(summary_columns(prof.key_averages(), rows=3)) == 3
    table = summary_columns(prof.key_averages(), rows=20).set_index("op")
    assert table["CPU total (µs)"].is_monotonic_decreasing
    mm = next(e for e in prof.key_averages() if e.key == "aten::mm")
    assert table.at["aten::mm", "# of Calls"] == 3 == mm.count
    assert table.at["aten::mm", "Self CPU Mem (MiB)"] == 3 * 64 * 32 * 4 / 2**20   # one output a call
    assert abs(table.at["aten::mm", "Self CPU (µs)"] - mm.self_cpu_time_total) <= 0.5

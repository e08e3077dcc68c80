"""The readings chapters 0-2 make of real GPU steps recorded by others (book/data/borrowed):
BERT-small's launch-bound step (chapter 0), TimeSformer's hand-written attention and its S×S
score tensor (chapter 1), Qwen1.5's copies and where they come from (chapter 2). Each number is
checked against the trace's raw events or recomputed another way, never against a typed value.
"""
from __future__ import annotations

import math

import pytest
from matplotlib.figure import Figure

from kernels import borrowed
from kernels.trace import tables, timeline
from kernels.trace.attention import find_attention
from kernels.trace.events import LAUNCH_CATEGORIES, is_contiguous, memory_layout, tensor_bytes
from kernels.trace.reader import load_trace


@pytest.fixture(scope="module")
def bert():
    return borrowed.TRACELENS["h100_bert"].step()


@pytest.fixture(scope="module")
def timesformer():
    return borrowed.TRACELENS["h100_timesformer"].step()


@pytest.fixture(scope="module")
def qwen():
    return borrowed.TRACELENS["h100_qwen"].step()


def raw_in_step(step, cats):
    """The trace's raw complete events of ``cats`` whose start lies in the step (launches) or whose
    launch does (GPU work is counted by its launch, as Step does)."""
    t0, t1 = float(step.range["ts"]), float(step.range["end"])
    return [e for e in step.trace.raw["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in cats and t0 <= float(e["ts"]) < t1]


# ---------------------------------------------------------------- chapter 0: BERT-small

def test_bert_summary_counts_what_the_raw_trace_holds(bert):
    numbers = tables.gpu_summary(bert)
    raw_kernels = [e for e in bert.trace.raw["traceEvents"] if e.get("cat") == "kernel"]
    assert numbers["kernels"] == len(raw_kernels) > 0, "the trimmed trace holds this one step's kernels"
    assert numbers["gpu_busy_us"] == pytest.approx(sum(float(e["dur"]) for e in bert.trace.raw["traceEvents"]
                                                       if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")))
    assert numbers["step_us"] == pytest.approx(bert.cpu_time_us)
    assert numbers["gpu_busy_us"] < numbers["step_us"] / 2, "one sentence on an H100 leaves the GPU mostly idle"


def test_bert_gaps_add_up_with_the_busy_time_to_the_gpu_span(bert):
    numbers, gaps = tables.gpu_summary(bert), tables.gpu_gaps(bert)
    assert numbers["streams"] == 1, "one stream: busy time + idle time is the span from first start to last end"
    assert numbers["gpu_busy_us"] + gaps["gap_us"].sum() == pytest.approx(numbers["gpu_span_us"])
    assert (gaps["gap_us"] > 0).all() and len(gaps) == numbers["gaps"]
    assert numbers["cpu_late_gaps"] == len(gaps), "every gap of this launch-bound step waited for a launch"


def test_bert_has_one_launch_per_kernel_and_one_sync_in_a_scalar_read(bert):
    calls = bert.runtime_calls
    assert len(calls) == len(raw_in_step(bert, LAUNCH_CATEGORIES))
    runtime = tables.runtime_table(bert)
    launches = runtime[runtime["call"].str.contains("LaunchKernel")]
    assert launches["calls"].sum() == launches["GPU work launched"].sum() == tables.gpu_summary(bert)["kernels"]
    assert runtime["GPU work launched"].sum() == len(bert.gpu_work)
    sync = calls[calls["name"] == "cudaStreamSynchronize"]
    assert sync["op"].tolist() == ["aten::_local_scalar_dense"]
    stack = bert.python_stack(bert.find("aten::_local_scalar_dense").index[0])
    assert any("_prepare_4d_attention_mask_for_sdpa" in f for f in stack)
    assert any(f.startswith("nn.Module: BertModel") for f in stack)


def test_a_zoomed_timeline_shows_its_window_and_refuses_a_bad_one(bert):
    fig = timeline.timeline(bert, window_ms=(1.0, 1.5))
    assert isinstance(fig, Figure) and fig.axes[0].get_xlim() == (1.0, 1.5)
    with pytest.raises(ValueError, match="window_ms"):
        timeline.timeline(bert, window_ms=(2.0, 1.0))


def test_gaps_tell_a_late_cpu_from_a_full_queue():
    """Two kernels on one stream after an idle stretch each: the first launched after the GPU
    went idle (the CPU was late), the second queued long before (something else held it)."""
    def launch(ts, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                "dur": 2, "args": {"correlation": corr}}

    def kernel(ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "name": f"k{corr}", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "stream": 7, "device": 0}}

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
              launch(1, 1), kernel(5, 10, 1), launch(30, 2), kernel(40, 5, 2), launch(31, 3), kernel(60, 5, 3)]
    step = load_trace({"traceEvents": events}).profiler_steps()[0]
    gaps = tables.gpu_gaps(step)
    assert gaps["gap_us"].tolist() == [25.0, 15.0] and gaps["cpu_late"].tolist() == [True, False]
    numbers = tables.gpu_summary(step)
    assert numbers["cpu_late_gaps"] == 1 and numbers["gpu_busy_us"] == 20.0 and numbers["idle_us"] == 40.0


def test_a_cpu_only_step_has_no_gpu_summary_and_says_so():
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 5, "args": {}}]
    step = load_trace({"traceEvents": events}).profiler_steps()[0]
    with pytest.raises(ValueError, match="no GPU work"):
        tables.gpu_summary(step)
    assert tables.gpu_gaps(step).empty and step.python_stack(0) == []


# ---------------------------------------------------------------- chapter 1: TimeSformer

def test_timesformer_score_tensor_is_the_softmax_input_it_recorded(timesformer):
    report = find_attention(timesformer)
    call = max(report.calls, key=lambda c: c.gpu_us)
    scores = tables.score_tensor(call)
    softmax = timesformer.find("aten::softmax", shape=scores["shape"])
    assert len(softmax) >= 1 and softmax["input_types"].iloc[0][0] == "c10::BFloat16"
    assert scores["shape"][-2] == scores["shape"][-1] == call.sq == call.sk
    assert scores["bytes"] == math.prod(scores["shape"]) * 2
    work = tables.work_table(call.kernels)
    assert len(work) == len(call.kernels) and not work["kernel"].str.startswith("void").any()
    assert (work["launched by"] == "aten::bmm").sum() == 2 and work["starts at (µs)"].iloc[0] == 0


def test_a_fused_call_has_no_score_tensor_of_its_own(bert):
    fused = find_attention(bert).calls[0]
    assert fused.how == "fused"
    with pytest.raises(ValueError, match="only a hand-written attention core"):
        tables.score_tensor(fused)


# ---------------------------------------------------------------- chapter 2: Qwen1.5

def test_qwen_copy_groups_account_for_every_copy(qwen):
    copies = qwen.copies()
    groups = tables.copy_groups(qwen)
    assert groups["count"].sum() == len(copies) > 0
    assert groups["MiB total"].sum() == pytest.approx(sum(copies["bytes"]) / 2**20, abs=0.1 * len(groups))
    assert groups["GPU µs"].sum() <= qwen.gpu_time_us
    assert list(groups["MiB total"]) == sorted(groups["MiB total"], reverse=True)
    assert set(groups["module"]) >= {"Qwen2RMSNorm", "Qwen2Attention", "Qwen2RotaryEmbedding"}
    sdpa = groups[groups["frame"].str.endswith("sdpa_attention_forward")]
    assert set(sdpa["call"]) == {"Tensor.contiguous"} and set(sdpa["made by"]) == {"clone"}
    layers = len(qwen.find("aten::scaled_dot_product_attention"))
    assert sdpa["count"].sum() == 4 * layers, "q, k, v and the output, once per layer"


def test_qwen_strides_show_what_the_contiguous_copies_changed(qwen):
    clone = qwen.find("aten::clone").iloc[0]
    dims, strides = clone["input_dims"][0], clone["input_strides"][0]
    assert not is_contiguous(dims, strides)
    assert is_contiguous([dims[0], dims[2], dims[1], dims[3]], [strides[0], strides[2], strides[1], strides[3]])
    assert memory_layout(dims, strides, "BHSD") == "BSHD"
    flash = qwen.find("aten::_flash_attention_forward").iloc[0]
    assert memory_layout(flash["input_dims"][0], flash["input_strides"][0], "BSHD") == "BHSD"
    assert len(qwen.find("aten::clone")) == 4 * len(qwen.find("aten::_flash_attention_forward"))


def test_memory_layout_names_the_order_torch_laid_a_tensor_out_in():
    torch = pytest.importorskip("torch")
    bshd = torch.empty(2, 5, 3, 4)
    for view, names, want in ((bshd.transpose(1, 2), "BHSD", "BSHD"), (bshd, "BSHD", "BSHD"),
                              (bshd.permute(3, 0, 1, 2), "DBSH", "BSHD"), (bshd[:, :2], "BSHD", None),
                              (torch.empty(3, 1).expand(3, 4), "AB", None)):
        assert memory_layout(list(view.shape), list(view.stride()), names) == want, (view.shape, view.stride())
    with pytest.raises(ValueError, match="must match"):
        memory_layout([2, 3], [3, 1], "ABC")


def test_python_calls_read_as_the_prose_names_them():
    assert tables.python_call("<built-in method contiguous of Tensor object at 0x7d67180cc500>") == "Tensor.contiguous"
    assert tables.python_call("<built-in function linear>") == "linear"
    origin = tables.where_from(["nn.Module: Qwen2Attention_0", "a/b.py(18): f", "<built-in method to of Tensor object at 0x1>"])
    assert origin == {"call": "Tensor.to", "frame": "a/b.py(18): f", "module": "Qwen2Attention"}
    assert tables.where_from([]) == {"call": "", "frame": "", "module": ""}


# ---------------------------------------------------------------- shapes, strides, bytes

def test_contiguity_follows_torch():
    torch = pytest.importorskip("torch")
    for t in (torch.empty(2, 3, 4), torch.empty(2, 3, 4).transpose(0, 1), torch.empty(4, 1, 3)[:, :, :1],
              torch.empty(2, 4, 3, 5).transpose(1, 2), torch.empty(1, 5).t()):
        assert is_contiguous(list(t.shape), list(t.stride())) == t.is_contiguous(), (t.shape, t.stride())
    with pytest.raises(ValueError, match="2 dims but 1 strides"):
        is_contiguous([2, 3], [1])


def test_tensor_bytes_and_its_errors():
    assert tensor_bytes([8, 12, 3137, 3137], "c10::BFloat16") == 8 * 12 * 3137 * 3137 * 2
    assert tensor_bytes([], "float") == 4
    with pytest.raises(ValueError, match="no known element size"):
        tensor_bytes([2], "c10::Float4")
    with pytest.raises(ValueError, match="not a tensor shape"):
        tensor_bytes([2, -1], "float")


def test_most_alive_counts_tensors_of_one_size_alive_together():
    def mem(ts, nbytes, total):
        return {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": 0}}

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
              mem(1, 64, 64), mem(2, 64, 128), mem(3, 8, 136), mem(4, -64, 72), mem(5, 64, 136), mem(6, 64, 200),
              mem(7, -64, 136)]
    step = load_trace({"traceEvents": events}).profiler_steps()[0]
    assert step.most_alive(64) == 3 and step.most_alive(8) == 1 and step.most_alive(16) == 0


def test_runtime_calls_place_each_call_in_its_op_on_the_synthetic_mlp_step():
    """Chapter 0's GPU reading of its own mlp_step, on the tests' A100-shaped step (Part 1 of the
    source series): the occupancy query inside aten::mm before the GEMM's launch, the
    synchronize after the label but inside the profiler step."""
    from tests.gpu_trace import forward_trace
    step = load_trace(forward_trace("mlp_step", steps=1)).steps("mlp_step")[0]
    outer = next(p for p in step.trace.profiler_steps()
                 if p.range["ts"] <= step.range["ts"] and p.range["end"] >= step.range["end"])
    calls = step.runtime_calls
    query = calls[calls["name"].str.startswith("cudaOccupancyMaxActiveBlocksPerMultiprocessor")]
    gemm_launch = step.gpu_work.loc[step.gpu_work["op"] == "aten::mm", "launch_start_us"].min()
    assert query["op"].tolist() == ["aten::mm"] and (query["start_us"] < gemm_launch).all()
    after_label = outer.runtime_calls[outer.runtime_calls["start_us"] >= float(step.range["end"] - outer.range["ts"])]
    assert "cudaDeviceSynchronize" in after_label["name"].tolist()
    assert "cudaDeviceSynchronize" not in calls["name"].tolist()
    assert set(tables.runtime_table(outer)["call"]) >= {"cudaLaunchKernel", "Activity Buffer Request"}

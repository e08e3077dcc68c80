"""kernels.trace.reader on real GPU traces recorded by other people (tests/data/real_traces, HTA's test data).

Every check compares the reader with a count this file makes itself from the raw JSON, in the
plainest way: a GPU event (kernel, memcpy, memset) belongs to a labelled range when the runtime
or driver call with its correlation id starts inside that range, whatever thread made the call.
"""
from __future__ import annotations

import gzip
import json
import time
import warnings
from collections import Counter
from pathlib import Path

import matplotlib
import pytest
import torch

from kernels.trace import record
from kernels.trace import timeline
from kernels.trace import tables
from kernels.trace.reader import load_trace
from tests.helpers import ROOT

matplotlib.use("Agg")
DATA = ROOT / "tests" / "data" / "real_traces"
TRACES = sorted(p for p in DATA.iterdir() if p.name.startswith("hta_"))
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cuda_runtime", "cuda_driver")
NS_TRACE = DATA / "hta_ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.json.gz"
BACKWARD = DATA / "hta_call_stack_backward_thread.json"
MULTI_STREAM = DATA / "hta_critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz"
CUPTI_RANGES = DATA / "hta_cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz"


# ------------------------------------------------------------------ the independent counter

def raw_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def launch_times(events: list[dict]) -> dict:
    """correlation id -> start of the runtime/driver call that has it."""
    return {e["args"]["correlation"]: e["ts"] for e in events
            if e.get("ph") == "X" and e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}


def expected_work(events: list[dict], start: float, dur: float) -> dict:
    """Per category: how many GPU events were launched inside [start, start + dur), and their GPU time."""
    launched = launch_times(events)
    counts, gpu_us = Counter(), 0.0
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_WORK:
            ts = launched.get(e.get("args", {}).get("correlation"))
            if ts is not None and start <= ts < start + dur:   # [start, end), as the reader
                counts[e["cat"]] += 1
                gpu_us += e["dur"]
    return {"counts": {c: counts[c] for c in GPU_WORK}, "gpu_us": gpu_us}


def labelled_ranges(events: list[dict]) -> dict:
    """Every user_annotation range, ProfilerStep#N included, by name, in time order."""
    ranges: dict = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"),
                    key=lambda e: e["ts"]):
        ranges.setdefault(e["name"], []).append(e)
    return ranges


def reader_work(step) -> dict:
    k = step.gpu_work
    return {"counts": {c: int((k["cat"] == c).sum()) for c in GPU_WORK}, "gpu_us": step.gpu_time_us}


def quiet_load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the CUPTI-range trace warns; tested below
        return load_trace(path)


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name[4:40])
def real(request):
    return request.param, raw_events(request.param), quiet_load(request.param)


# ---------------------------------------------------------------------------------- tests

def test_the_shared_traces_are_all_here():
    assert len(TRACES) == 9 and (DATA / "LICENSE-HolisticTraceAnalysis").is_file(), \
        "all nine HTA traces travel with their MIT licence notice"


def test_every_labelled_range_is_a_step(real):
    path, events, tr = real
    ranges = labelled_ranges(events)
    assert tr.labels(profiler_steps=True) == sorted(ranges), "labels(profiler_steps=True) lists every range name"
    assert tr.labels() == sorted(n for n in ranges if not n.startswith("ProfilerStep#"))
    steps = [name for name in ranges if name.startswith("ProfilerStep#")]
    assert [s.label for s in tr.profiler_steps()] == sorted(steps, key=lambda n: ranges[n][0]["ts"]), \
        "profiler_steps() reaches every ProfilerStep#N, in time order"


def test_gpu_work_per_step_matches_the_raw_count(real):
    path, events, tr = real
    for name, ranges in labelled_ranges(events).items():
        for step, r in zip(tr.steps(name), ranges):
            want, got = expected_work(events, r["ts"], r["dur"]), reader_work(step)
            assert got["counts"] == want["counts"], \
                f"{path.name} {name}: a step holds the GPU work whose launch starts inside it, on any thread"
            assert got["gpu_us"] == pytest.approx(want["gpu_us"], rel=1e-9, abs=1e-6), \
                f"{path.name} {name}: a step's GPU time is the sum of that work's durations"


def test_the_whole_trace_holds_all_launched_work(real):
    path, events, tr = real
    whole = tr.whole()
    want = expected_work(events, whole.range["ts"], whole.range["dur"])
    assert reader_work(whole)["counts"] == want["counts"], "every GPU event with a launch in the trace is in whole()"
    linked = tr.gpu["linked_by"].notna().sum()
    assert linked == sum(want["counts"].values()), "a GPU event is linked exactly when its launch is in the trace"
    launched = launch_times(events)
    per_stream = Counter(e["args"]["stream"] for e in events if e.get("ph") == "X" and e.get("cat") in GPU_WORK
                         and e.get("args", {}).get("correlation") in launched)
    assert Counter(whole.gpu_work["stream"].astype(int)) == per_stream, "each GPU event on the stream it ran on"


def test_work_launched_by_another_thread_is_counted():
    events = raw_events(NS_TRACE)
    tr = load_trace(NS_TRACE)
    for step in tr.profiler_steps():
        own = step.thread[1]
        launched_elsewhere = step.gpu_work[step.gpu_work["thread"] != own]
        assert len(launched_elsewhere) > 100, "the autograd thread launches the backward's kernels"
        r = step.range
        threads = {str(e["tid"]) for e in events if e.get("cat") == "cpu_op" and r["ts"] <= e["ts"] <= r["end"]}
        assert len(threads) == 2 and set(step.ops["tid"]) == threads, \
            "the autograd thread's ops are kept, with their thread"
        # the raw count of kernels launched from threads other than the step's own
        launched = {e["args"]["correlation"]: e for e in events if e.get("cat") in LAUNCHES}
        raw = sum(1 for e in events if e.get("cat") in GPU_WORK
                  and (lc := launched.get(e["args"].get("correlation"))) is not None
                  and r["ts"] <= lc["ts"] <= r["ts"] + r["dur"] and str(lc["tid"]) != own)
        assert len(launched_elsewhere) == raw


def test_a_backward_kernel_belongs_to_the_range_on_the_main_thread():
    tr = load_trace(BACKWARD)
    step = tr.steps("## backward ##")[0]
    assert len(step.gpu_work) == 1 and step.gpu_work.iloc[0]["thread"] == "24922", \
        "the kernel was launched by the backward thread, inside the main thread's label"
    assert step.gpu_work.iloc[0]["op"] == "aten::mm", "its launching op is the innermost op of the launching thread"
    table = tables.op_table(step)
    assert "thread" in table and set(table["thread"]) == {"24922"}, "op_table says which thread ran each op"


def test_flows_link_where_present_correlation_otherwise():
    sampled = quiet_load(DATA / "hta_trace_filter_sampled_rank-0.json.gz")
    assert (sampled.gpu["linked_by"] == "correlation").all(), "a sampled trace has no flow arrows"
    ns = quiet_load(NS_TRACE)
    assert (ns.gpu["linked_by"] == "flow").all(), "every GPU event of the V100 trace has an ac2g arrow"


def test_a_triton_kernel_launched_through_the_driver():
    tr = load_trace(DATA / "hta_triton_example_triton_example.json.gz")
    (step,) = tr.profiler_steps()
    assert step.gpu_work["launcher"].tolist() == ["cuLaunchKernel"], "cuda_driver launches count as launches"


def test_one_timeline_track_per_gpu_stream():
    events = raw_events(MULTI_STREAM)
    streams = {str(e["tid"]) for e in events if e.get("cat") in GPU_WORK}
    fig = timeline.timeline(load_trace(MULTI_STREAM).whole())
    tracks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert sorted(t for t in tracks if t.startswith("GPU")) == sorted(f"GPU stream {s}" for s in streams), \
        "each stream gets its own track, so kernels overlapping on different streams are seen overlapping"
    assert type(fig).__module__ == "matplotlib.figure", "drawn on a Figure object, not through pyplot"


def test_a_training_step_draws_every_thread():
    step = load_trace(NS_TRACE).profiler_steps()[0]
    tracks = [t.get_text() for t in timeline.timeline(step).axes[0].get_yticklabels()]
    assert "CPU depth 0" in tracks and "thread 1262 depth 0" in tracks and "GPU stream 7" in tracks


def test_range_profiler_trace_warns_that_it_has_no_gpu_timeline():
    with pytest.warns(UserWarning, match="cuda_profiler_range"):
        tr = load_trace(CUPTI_RANGES)
    assert not tr.has_gpu and tr.unread["cuda_profiler_range"] > 0


# ------------------------------------------------------------------------ formats

def as_legacy(events: list[dict]) -> list[dict]:
    """The same events under the category names Kineto wrote before torch 1.10."""
    old = {"cpu_op": "Operator", "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset",
           "cuda_runtime": "Runtime", "cuda_driver": "Driver", "ac2g": "async_gpu"}
    out = []
    for e in events:
        e = dict(e)
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            e["cat"] = "Operator"  # the profiler's steps were Operators then
        elif e.get("cat") in old:
            e["cat"] = old[e["cat"]]
        if e.get("cat") != "user_annotation":
            out.append(e)
    return out


def test_the_older_kineto_format_reads_the_same():
    events = raw_events(NS_TRACE)
    new, old = load_trace({"traceEvents": events}), load_trace({"traceEvents": as_legacy(events)})
    assert old.legacy and not new.legacy
    for a, b in zip(new.profiler_steps(), old.profiler_steps()):
        assert a.label == b.label and reader_work(a) == reader_work(b), "Kernel/Runtime/Operator read as kernel/..."
        assert len(a.ops) == len(b.ops)


def test_an_old_format_record_function_range_is_a_step():
    raw = raw_events(BACKWARD)
    label = next(e for e in raw if e["name"] == "## backward ##")
    events = as_legacy(raw) + [{**label, "cat": "Operator"}]  # what a user_annotation was then
    (step,) = load_trace({"traceEvents": events}).steps("## backward ##")
    assert len(step.gpu_work) == 1 and "## backward ##" not in set(step.ops["name"]), \
        "the range is the step, not one of its own ops"


@pytest.mark.parametrize("raw, words", [
    ({"schema": "1.0.1", "pid": 1, "nodes": []}, "execution trace"),
    ({"something": 1}, "no 'traceEvents'"),
    ({"traceEvents": [{"ph": "X", "cat": "GpuThing", "name": "k", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]},
     "GpuThing"),
])
def test_a_format_the_reader_does_not_read_is_a_clear_error(raw, words):
    with pytest.raises(ValueError, match=words):
        load_trace(raw)


# ------------------------------------------------------------------------ self-nested ops

def op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def step_of(*ops):
    label = {"ph": "X", "cat": "user_annotation", "name": "s", "pid": 1, "tid": 1, "ts": 0, "dur": 100, "args": {}}
    return load_trace({"traceEvents": [label, *ops]}).steps("s")[0]


def test_self_nesting_folds_only_an_only_child():
    one = step_of(op("aten::mul", 1, 10), op("aten::mul", 2, 5), op("aten::to", 3, 1))
    assert one.ops["name"].tolist() == ["aten::mul", "aten::to"], "a same-name only child is one op"
    assert one.ops.iloc[0]["dur_us"] == 10 and one.ops.iloc[1]["parent"] == 0, "the outer call stays, adopting"
    chain = step_of(op("aten::mul", 1, 10), op("aten::mul", 2, 8), op("aten::mul", 3, 5))
    assert len(chain.ops) == 1, "a chain folds all the way"
    two = step_of(op("aten::mul", 1, 10), op("aten::mul", 2, 2), op("aten::mul", 5, 2))
    assert len(two.ops) == 3, "a parent with two children keeps them"
    threads = step_of(op("aten::mul", 1, 10), op("aten::mul", 2, 5, tid=2))
    assert len(threads.ops) == 2, "nesting is per thread"


def nested_scalar_ops(x):
    torch.ops.aten.mul.Scalar(x, 2.0)  # mul.Scalar calls mul.Tensor: an aten::mul under an aten::mul
    torch.ops.aten.add.Scalar(x, 1.0)
    return torch.softmax(x * 3, dim=-1)


def test_op_counts_and_times_match_key_averages(tmp_path):

    run = record.profile(nested_scalar_ops, torch.randn(32, 32), label="nested", trace_dir=tmp_path, active=3)
    ops = [s.ops for s in run.steps()]
    counts = Counter(n for o in ops for n in o["name"])
    totals = Counter()
    for o in ops:
        for n, d in zip(o["name"], o["dur_us"]):
            totals[n] += d
    averages = {e.key: e for e in run.averages if e.key != "nested" and not e.key.startswith("ProfilerStep")}
    assert counts == {k: e.count for k, e in averages.items()}, "ops counted as prof.key_averages() counts them"
    for name, e in averages.items():
        assert totals[name] == pytest.approx(e.cpu_time_total, rel=1e-3, abs=0.05), f"{name}: total CPU time"


# ------------------------------------------------------------------------ speed

def test_a_100k_event_trace_loads_in_under_2_s(tmp_path):
    events = raw_events(NS_TRACE)
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(e["ts"] for e in events if "ts" in e)
    copy = []  # the V100 trace again, later in time: new steps, new correlation and flow ids
    for e in events:
        if e.get("ph") == "M":
            continue
        e = {**e, "ts": e["ts"] + span + 1000, "args": dict(e.get("args", {}))}
        if "correlation" in e["args"]:
            e["args"]["correlation"] += 10**7
        if "id" in e:
            e["id"] += 10**7
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 100}"
        copy.append(e)
    big = events + copy[:100_000 - len(events)]  # its first steps again, up to 100k events in all
    path = tmp_path / "big.json.gz"
    with gzip.open(path, "wt", compresslevel=1) as f:
        json.dump({"traceEvents": big}, f)
    # CPU time, not wall time: this machine's two cores are shared, and wall time would
    # measure the neighbours. Reading, parsing and linking every GPU event to its launch.
    # The best of three: a busy machine only adds time (cache and memory contention), so
    # the fastest load is the one that measures the reader.
    elapsed = float("inf")
    for _ in range(3):
        start = time.process_time()
        tr = load_trace(path)
        elapsed = min(elapsed, time.process_time() - start)
    assert len(tr.profiler_steps()) > 5 and len(tr.gpu) > len(load_trace(NS_TRACE).gpu)
    assert elapsed < 2.0, f"loading {len(big)} events took {elapsed:.2f} s, over the 2 s a reader waits"


# ------------------------------------------------------------- flows, windows, missing values

ALEXNET = DATA / "hta_critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"


def with_a_call_beside_each_memset_launch(events: list[dict], after: bool) -> list[dict]:
    """The events with a cudaPeekAtLastError starting in the same microsecond, on the same thread,
    as each cudaMemsetAsync (as real traces hold), written after or before it in the file."""
    out, corr = [], 10**9
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "cudaMemsetAsync":
            corr += 1
            peek = {**e, "name": "cudaPeekAtLastError", "dur": 1, "args": {"correlation": corr}}
            out.extend([e, peek] if after else [peek, e])
        else:
            out.append(e)
    return out


@pytest.mark.parametrize("reverse", [False, True], ids=["file-order", "reversed"])
def test_flows_find_their_launch_by_id_not_by_where_it_starts(reverse):
    events = raw_events(ALEXNET)
    memsets_run = sum(e.get("cat") == "gpu_memset" for e in events if e.get("ph") == "X")
    assert memsets_run >= 3, "the A100 trace runs memsets"
    for after in (True, False):
        changed = with_a_call_beside_each_memset_launch(events, after)
        tr = load_trace({"traceEvents": changed[::-1] if reverse else changed})
        memsets = tr.gpu[tr.gpu["cat"] == "gpu_memset"]
        assert len(memsets) == memsets_run and (memsets["linked_by"] == "flow").all()
        assert set(memsets["launcher"]) == {"cudaMemsetAsync"}, \
            "a memset's launcher is the call its flow arrow's id names, whichever call the file lists last"


def test_the_whole_reversed_trace_links_every_gpu_event_the_same():
    events = raw_events(ALEXNET)
    key = lambda g: sorted(zip(g["pid"], g["tid"], g["ts"], g["name"], g["launcher"].fillna("-")))  # noqa: E731
    assert key(load_trace({"traceEvents": events}).gpu) == key(load_trace({"traceEvents": events[::-1]}).gpu)


def test_older_flow_categories_link_too():
    events = raw_events(ALEXNET)
    for cat in ("async_cpu_to_gpu", "async"):
        renamed = [{**e, "cat": cat} if e.get("cat") == "ac2g" else e for e in events]
        assert (load_trace({"traceEvents": renamed}).gpu["linked_by"] == "flow").all(), f"{cat} flows are read"


def touching_steps():
    """Two ProfilerSteps that touch at t = 100, with an op, a launch (and its kernel) and an
    allocation starting exactly there."""
    def x(name, cat, ts, dur, tid=1, pid=1, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}
    return {"traceEvents": [
        x("ProfilerStep#1", "user_annotation", 0, 100), x("ProfilerStep#2", "user_annotation", 100, 100),
        x("aten::mm", "cpu_op", 10, 20), x("aten::add", "cpu_op", 100, 10),
        x("cudaLaunchKernel", "cuda_runtime", 100, 5, correlation=1),
        x("gemm_kernel", "kernel", 120, 30, pid=0, tid=7, correlation=1, stream=7, device=0),
        {"ph": "i", "name": "[memory]", "ts": 100, "pid": 1, "tid": 1, "s": "t",
         "args": {"Bytes": 64, "Total Allocated": 64, "Device Type": 0}},
    ]}


def test_an_event_on_the_boundary_of_two_touching_steps_belongs_to_the_later_one():
    first, second = load_trace(touching_steps()).profiler_steps()
    assert first.ops["name"].tolist() == ["aten::mm"] and "aten::add" in second.ops["name"].tolist()
    assert first.gpu_work.empty and second.gpu_work["name"].tolist() == ["gemm_kernel"]
    assert first.memory.empty and second.memory["bytes"].tolist() == [64]


def test_missing_launchers_and_ops_are_none_not_nan():
    raw = touching_steps()
    orphan = {"ph": "X", "name": "lost_kernel", "cat": "kernel", "ts": 150, "dur": 5, "pid": 0, "tid": 7,
              "args": {"correlation": 99, "stream": 7, "device": 0}}   # no launch has correlation 99
    tr = load_trace({"traceEvents": raw["traceEvents"] + [orphan]})
    lost = tr.gpu[tr.gpu["name"] == "lost_kernel"].iloc[0]
    assert lost["launcher"] is None and lost["linked_by"] is None and lost["launch_tid"] is None
    late = [{"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 180, "dur": 5, "pid": 1, "tid": 1,
             "args": {"correlation": 2}},   # under no CPU op
            {"ph": "X", "name": "late_kernel", "cat": "kernel", "ts": 190, "dur": 5, "pid": 0, "tid": 7,
             "args": {"correlation": 2, "stream": 7, "device": 0}}]
    step = load_trace({"traceEvents": raw["traceEvents"] + late}).profiler_steps()[1]
    kernels = step.gpu_work.set_index("name")
    assert kernels.loc["late_kernel", "op"] is None, "a kernel whose launch is under no op has op None"
    assert kernels.loc["gemm_kernel", "op"] == "aten::add"

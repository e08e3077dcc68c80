"""The trace reader held against HolisticTraceAnalysis (HTA), on the shared real traces.

HTA is a second, independent reader of the same Kineto JSON (a test-only dependency,
requirements-test.txt). Where the two agree by design, they must agree here: per GPU stream,
how many kernels, memcpys and memsets ran and their total time; per ProfilerStep, how many
GPU events were launched inside it and their time.

Known differences, by design or HTA's (checked against the raw JSON), and how this test
keeps them out of the comparison:

- HTA stores timestamps as whole microseconds, so on traces written with nanosecond
  fractions its durations come out lower (about 0.7-1% of kernel time on the V100 trace; a
  1.76 us Triton kernel reads 1 us): there the counts must be equal and the times less than
  1 us per event apart; on microsecond traces both must be exact.
- HTA keys some CPU events by the stream their arguments name (``cudaStreamWaitEvent``...),
  so its frame holds CPU rows with a stream: only kernel, gpu_memcpy and gpu_memset rows are
  compared as GPU work.
- By default HTA drops the last ProfilerStep and, with two or more steps, every GPU event
  whose launch did not start before the last step ended (or that has no launch at all):
  the test asks for ``include_last_profiler_step=True`` and compares the reader's GPU events
  launched by then.
- HTA leaves ``cuLaunchKernel`` and ``cudaGraphLaunch`` out of its launch statistics, and
  nests a few launches under zero-length events: launch statistics are not compared.
"""
from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import pytest

from kernels.trace.reader import load_trace
from tests.helpers import ROOT

hta_analysis = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (requirements-test.txt)")

DATA = ROOT / "tests" / "data" / "real_traces"
TRACES = [DATA / name for name in (
    "hta_call_stack_backward_thread.json",
    "hta_critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    "hta_critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz",
    "hta_ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.json.gz",
    "hta_trace_filter_sampled_rank-0.json.gz",
    "hta_triton_example_triton_example.json.gz",
)]
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


@pytest.fixture(scope="module")
def hta_frames(tmp_path_factory):
    """HTA's frame of each trace, parsed once for both tests."""
    frames: dict = {}

    def frame(path: Path):
        if path not in frames:
            frames[path] = hta_frame(path, tmp_path_factory.mktemp("hta"))
        return frames[path]
    return frame


def hta_frame(path: Path, tmp_path: Path):
    """HTA's event frame of one trace (its rank), with category names."""
    folder = tmp_path / path.name.split(".")[0]
    folder.mkdir()
    shutil.copy(path, folder)
    logging.disable(logging.WARNING)   # HTA logs every parse step
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = hta_analysis.TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    finally:
        logging.disable(logging.NOTSET)
    traces = analysis.t.traces
    frame = traces[min(traces)]
    names = analysis.t.symbol_table.get_sym_table()
    return frame.assign(category=[names[c] for c in frame["cat"]])


def ns_resolution(path: Path) -> bool:
    """True when the trace's GPU events carry fractions of a microsecond (HTA rounds those)."""
    tr = load_trace(path)
    return bool(((tr.gpu["ts"] % 1) != 0).any() or ((tr.gpu["dur"] % 1) != 0).any())


def totals(frame, key: str) -> dict:
    grouped = frame.groupby(key)["dur"]
    return {int(k): (int(n), float(us)) for (k, n), us in zip(grouped.size().items(), grouped.sum())}


def assert_agree(ours: dict, theirs: dict, rounded: bool, what: str) -> None:
    assert ours.keys() == theirs.keys(), f"{what}: the same keys in both readers"
    for key in ours:
        (n, us), (hta_n, hta_us) = ours[key], theirs[key]
        assert n == hta_n, f"{what} {key}: {n} GPU events here, {hta_n} in HTA"
        if rounded:   # HTA's whole microseconds: less than 1 us per event apart
            assert abs(us - hta_us) < n, f"{what} {key}: {us:.1f} vs HTA's {hta_us:.1f} us over {n} events"
        else:
            assert us == pytest.approx(hta_us, rel=1e-9), f"{what} {key}: {us:.1f} vs HTA's {hta_us:.1f} us"


def launched_by_last_step_end(tr):
    """The reader's GPU events that HTA keeps: with two or more ProfilerSteps, those whose
    launch started by the end of the last step; all of them otherwise."""
    steps = tr.profiler_steps()
    gpu = tr.gpu
    if len(steps) < 2:
        return gpu
    return gpu[gpu["launch_ts"] <= float(steps[-1].range["end"])]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name[4:40])
def test_per_stream_totals_agree_with_hta(path, hta_frames):
    frame = hta_frames(path)
    theirs = totals(frame[frame["category"].isin(GPU_WORK)], "stream")
    gpu = launched_by_last_step_end(load_trace(path))
    ours = totals(gpu.assign(stream=gpu["stream"].astype(int)), "stream")
    assert ours, "each of these traces holds GPU work"
    assert_agree(ours, theirs, ns_resolution(path), "stream")


@pytest.mark.parametrize("path", [p for p in TRACES if "alexnet" not in p.name and "multi_stream" not in p.name],
                         ids=lambda p: p.name[4:40])
def test_per_step_totals_agree_with_hta(path, hta_frames):
    frame = hta_frames(path)
    gpu = frame[frame["category"].isin(GPU_WORK) & (frame["iteration"] >= 0)]
    theirs = totals(gpu, "iteration")
    steps = load_trace(path).profiler_steps()
    assert steps, "these traces have ProfilerSteps"
    ours = {int(s.label.split("#")[1]): (len(s.gpu_work), float(s.gpu_work["dur_us"].sum())) for s in steps}
    assert_agree(ours, theirs, ns_resolution(path), "ProfilerStep#")

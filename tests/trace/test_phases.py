"""kernels.trace.phases on real traces: a DDP training step split into forward, backward and
communication, recounted from the raw JSON by independent code; inference steps have no backward."""
from __future__ import annotations

import pytest

from kernels import borrowed
from kernels.trace.phases import time_by_phase
from kernels.trace.reader import load_trace
from tests.helpers import ROOT


def recount_by_phase(raw: dict, step_name: str) -> dict[str, float]:
    """GPU µs by phase straight from the events: each GPU event's launch (same correlation id)
    inside the step's range, its launching thread's name, NCCL kernels apart."""
    events = raw["traceEvents"]
    step = next(e for e in events if e.get("name") == step_name and e.get("ph") == "X")
    start, end = step["ts"], step["ts"] + step["dur"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    launcher_thread = {e["args"]["correlation"]: e["tid"] for e in events
                       if e.get("cat") in ("cuda_runtime", "cuda_driver") and start <= e["ts"] < end
                       and "correlation" in e.get("args", {})}
    totals = {"forward": 0.0, "backward": 0.0, "communication": 0.0}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("correlation") in launcher_thread:
            if e["name"].startswith("ncclKernel"):
                phase = "communication"
            elif "pt_autograd" in names.get(launcher_thread[e["args"]["correlation"]], ""):
                phase = "backward"
            else:
                phase = "forward"
            totals[phase] += e["dur"]
    return totals


def test_a_training_step_splits_into_forward_backward_and_communication_as_the_raw_events_say():
    trace = borrowed.TRAINING_STEP.trace()
    step = borrowed.TRAINING_STEP.step(trace=trace)
    table = time_by_phase(step)
    expected = recount_by_phase(trace.raw, step.label)
    assert list(table.index) == ["forward", "backward", "communication"]
    for phase, us in expected.items():
        assert table.loc[phase, "GPU µs"] == pytest.approx(us, rel=1e-9), f"{phase}: the table's GPU time is the events' sum"
    assert table["share"].sum() == pytest.approx(1.0), "the three phases are all of the step's GPU work"
    assert table.loc["backward", "GPU µs"] > table.loc["forward", "GPU µs"], \
        "in this recorded step the backward's kernels took longer than the forward's"


def test_the_training_step_is_what_its_credit_says():
    """The credit readers see says "rank 0 of 2" and "53 convolutions": read from the trace."""
    trace = borrowed.TRAINING_STEP.trace()
    info = trace.raw["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (0, 2) and "rank 0 of 2" in borrowed.TRAINING_STEP.what
    convolutions = (borrowed.TRAINING_STEP.step(trace=trace).ops["name"] == "aten::convolution").sum()
    assert convolutions == 53 and "53 convolutions" in borrowed.TRAINING_STEP.what, convolutions


@pytest.mark.parametrize("key", ["h100_qwen", "mi300x_bert", "sglang_decode"])
def test_an_inference_step_is_all_forward(key):
    table = time_by_phase(borrowed.TRACELENS[key].step())
    assert list(table.index) == ["forward"], "no autograd thread, no NCCL: nothing but the forward"


def test_a_step_without_gpu_work_says_so():
    # CUPTI's range profiler records counters, not a timeline: the reader sees no GPU work in it.
    with pytest.warns(UserWarning, match="cuda_profiler_range"):
        trace = load_trace(ROOT / "tests" / "data" / "real_traces"
                           / "hta_cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz")
    step = (trace.profiler_steps() or [trace.whole()])[0]
    with pytest.raises(ValueError, match="no GPU work"):
        time_by_phase(step)

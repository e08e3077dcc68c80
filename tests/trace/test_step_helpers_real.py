"""Every public ``Step`` helper, and the tables, diff, timeline tracks and attention report built on
it, on every real trace the project holds (HTA's and Kineto's in tests/data/real_traces, the
borrowed ones in book/data/borrowed): a reader's own trace must never crash a table helper.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from kernels import borrowed
from kernels.trace import attention, diff, tables, timeline
from kernels.trace.events import DTYPE_BYTES
from kernels.trace.reader import load_trace
from tests.helpers import ROOT

REAL = sorted(p for p in (ROOT / "tests" / "data" / "real_traces").iterdir() if ".json" in p.name) + \
    sorted(p for p in borrowed.root().iterdir() if p.name.endswith(".json.gz"))
OLD_KINETO = "kineto_tb_plugin_samples_resnet50_num_workers_0_worker0.json.gz"


def first_step(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the CUPTI range-profiler trace warns that it has no GPU timeline
        trace = load_trace(path)
    steps = trace.profiler_steps()
    if steps:
        return steps[0]
    labels = trace.labels()
    return trace.steps(labels[0])[0] if labels else trace.whole()


def test_the_real_traces_are_all_here():
    names = [p.name for p in REAL]
    shipped = {b.file for b in (*borrowed.TRACELENS.values(), borrowed.SGLANG_DECODE_CAPTURE)}
    assert OLD_KINETO in names and shipped <= set(names), f"borrowed traces missing: {shipped - set(names)}"
    assert len([n for n in names if n.startswith("hta_")]) >= 10


@pytest.mark.parametrize("path", REAL, ids=[p.name[:48] for p in REAL])
def test_every_step_helper_runs_on_every_real_trace(path):
    step = first_step(path)
    ops, work = step.ops, step.gpu_work
    assert step.gpu_time_us == pytest.approx(float(work["dur_us"].sum()))
    assert step.cpu_time_us >= 0 and step.peak_bytes >= 0 and step.allocated_bytes >= 0
    assert len(step.thread) == 2
    assert len(step.top_level()) <= len(ops)
    if len(ops):
        name, dims = ops["name"].iloc[0], ops["input_dims"].iloc[0]
        assert len(step.find(name)) >= 1
        if dims and isinstance(dims[0], list):
            assert len(step.find(name, dims[0])) >= 1
    assert isinstance(step.work_ops(), list)
    copies = step.copies()
    for b, types in zip(copies["bytes"], copies["input_types"]):
        assert (b is None) == (not types or types[0] not in DTYPE_BYTES), \
            "a size is unknown exactly where the type was not recorded (or is not a tensor type the reader knows)"
    summary = step.summary()
    assert summary["ops"] == len(ops) and summary["gpu_time_ms"] == pytest.approx(step.gpu_time_us / 1e3)
    assert len(tables.op_table(step)) <= len(ops) and len(tables.kernel_table(step)) == len(work)
    assert len(tables.copy_table(step)) == len(copies)
    assert len(tables.counts([step])) == 1
    same = diff.diff(step, step)
    assert same.changed().empty, "a step compared with itself has no change"
    assert isinstance(timeline.tracks(step), list)
    report = attention.find_attention(step)
    assert report.attention_gpu_us <= step.gpu_time_us + 1e-6
    assert isinstance(report.text(), str) and "calls" in report.as_dict()


def test_the_torch_18_sample_has_copies_of_unknown_size_and_says_so():
    step = first_step(ROOT / "tests" / "data" / "real_traces" / OLD_KINETO)
    copies = step.copies(min_bytes=10**12)
    assert len(copies) > 0 and not copies["size_known"].any(), "unknown sizes are kept, whatever min_bytes is"
    assert set(tables.copy_table(step)["size (bytes)"]) == {tables.UNKNOWN_SIZE}

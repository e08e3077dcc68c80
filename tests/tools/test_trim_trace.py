"""tools/trim_trace.py: a trace trimmed to one step reads back as the same step.

Checked on real multi-step traces (HTA's DDP training trace, its sampled trace without flow
arrows, Kineto's torch 1.8 sample in the older format) and on the borrowed TraceLens traces
(trimming one again changes nothing of its step), comparing the reader's view of the step in
the source and in the trimmed file: ops, GPU work, memory and every time.
"""
from __future__ import annotations

import gzip
import json
import warnings

import pytest

from kernels import borrowed
from kernels.trace.reader import load_trace
from tests.helpers import ROOT
from tools import trim_trace

DATA = ROOT / "tests" / "data" / "real_traces"
MULTI_STEP = ["hta_ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.json.gz", "hta_trace_filter_sampled_rank-0.json.gz",
              "kineto_tb_plugin_samples_resnet50_num_workers_0_worker0.json.gz"]
OP_COLUMNS = ["name", "depth", "parent", "start_us", "dur_us", "ts", "end", "pid", "tid", "input_dims", "input_types",
              "self_alloc_bytes", "alloc_bytes", "self_us"]
GPU_COLUMNS = ["name", "cat", "start_us", "dur_us", "launcher", "launch_start_us", "op", "grid", "block",
               "registers_per_thread", "shared_memory", "occupancy_pct", "stream", "device", "thread", "linked_by"]


def load(raw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_trace(raw)


def assert_same_step(a, b):
    assert a.label == b.label and a.cpu_time_us == b.cpu_time_us
    assert a.ops[OP_COLUMNS].astype(str).equals(b.ops[OP_COLUMNS].astype(str)), "the same ops, nesting and times"
    assert a.gpu_work[GPU_COLUMNS].astype(str).equals(b.gpu_work[GPU_COLUMNS].astype(str)), \
        "the same GPU work, launches and times"
    assert a.memory[["ts", "bytes", "total_allocated"]].equals(b.memory[["ts", "bytes", "total_allocated"]])
    assert a.summary() == b.summary()


@pytest.mark.parametrize("name", MULTI_STEP)
def test_each_step_of_a_multi_step_trace_trims_to_the_same_step(name):
    raw = trim_trace.read(DATA / name)
    source = load(raw)
    steps = source.profiler_steps()
    assert len(steps) >= 2
    for step in (steps[0], steps[-1]):
        number = int(step.label.split("#")[1])
        trimmed = trim_trace.trim(raw, step=number)
        kept = load(trimmed).profiler_steps()
        assert [s.label for s in kept] == [step.label], "only the chosen step is left"
        assert_same_step(step, kept[0])
        assert len(trimmed["traceEvents"]) < len(raw["traceEvents"])


@pytest.mark.parametrize("key", sorted(borrowed.TRACELENS))
def test_a_borrowed_trace_trims_to_its_own_step_again(key):
    entry = borrowed.TRACELENS[key]
    raw = trim_trace.read(borrowed.root() / entry.file)
    if not any(e.get("name", "").startswith("ProfilerStep#") for e in raw["traceEvents"]):
        with pytest.raises(ValueError, match="its profiler steps: none"):
            trim_trace.trim(raw)
        return
    again = trim_trace.trim(raw, drop_python=True)
    assert_same_step(entry.step(trace=load(raw)), load(again).profiler_steps()[0])
    assert not [e for e in again["traceEvents"] if e.get("cat") == "python_function"]
    assert again["deviceProperties"] == raw["deviceProperties"] and again["metadata"] == raw["metadata"]


def test_the_command_writes_a_reproducible_gzip_and_names_a_missing_step(tmp_path, capsys):
    source = DATA / MULTI_STEP[1]
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    assert trim_trace.main([str(source), str(first), "--step", "552"]) == 0
    assert trim_trace.main([str(source), str(second), "--step", "552"]) == 0
    assert first.read_bytes() == second.read_bytes(), "the same input gives the same bytes"
    with gzip.open(first, "rt") as f:
        assert json.load(f)["trimmed"]["range"] == "ProfilerStep#552"
    assert trim_trace.main([str(source), str(tmp_path / "c.json.gz"), "--step", "9"]) == 1
    err = capsys.readouterr().err
    assert "no ProfilerStep#9" in err and "ProfilerStep#551" in err


def test_the_borrowed_training_step_is_its_source_step_and_the_compiled_call_is_a_byte_copy():
    entry = borrowed.TRAINING_STEP
    source = load(trim_trace.read(DATA / entry.file)).profiler_steps()
    assert_same_step(source[0], entry.step(trace=load(trim_trace.read(borrowed.root() / entry.file))))
    copy = borrowed.COMPILED_POINTWISE.file
    assert (borrowed.root() / copy).read_bytes() == (DATA / copy).read_bytes()

"""kernels.trace.attention on the borrowed real traces (book/data/borrowed: H100, MI300X, SGLang decode).

The recount is this file's own, from the raw JSON with plain ``json``: the step's window, the
launches that start in it, the GPU work with their correlation ids, and attention found by the
plainest rules (an SDPA op and the kernels launched inside it; a softmax between two matmuls of
matching shapes; paged-attention kernels by name). Nothing of ``kernels.trace`` is used for it.
"""
from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import borrowed
from kernels.hw import devices
from kernels.trace import attention
from kernels.trace.reader import load_trace
from tests.helpers import ROOT

BORROWED = borrowed.TRACELENS
LAUNCHES = ("cuda_runtime", "cuda_driver")
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


# ------------------------------------------------------------------ the independent recount

def raw(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def window(events: list[dict]) -> tuple[float, float]:
    """The first ProfilerStep's [start, end), or the whole trace's CPU span."""
    steps = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    if steps:
        return steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") + LAUNCHES]
    return min(e["ts"] for e in cpu), math.inf


def launched_work(events: list[dict], t0: float, t1: float) -> list[dict]:
    """GPU events whose launch starts in [t0, t1), each with its launch's ts and tid."""
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("ph") == "X" and e.get("cat") in LAUNCHES and t0 <= e["ts"] < t1}
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_WORK and e["args"].get("correlation") in launch:
            by = launch[e["args"]["correlation"]]
            out.append({**e, "launch_ts": by["ts"], "launch_tid": by["tid"]})
    return out


def kernels_inside(work: list[dict], op: dict) -> list[dict]:
    return [w for w in work if w["launch_tid"] == op["tid"] and op["ts"] <= w["launch_ts"] <= op["ts"] + op["dur"]]


def recount(path: Path) -> list[dict]:
    """Per attention call: its kernel count, GPU µs and FLOPs (None where shapes are unknown)."""
    events = raw(path)
    t0, t1 = window(events)
    work = launched_work(events, t0, t1)
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and t0 <= e["ts"] < t1), key=lambda e: e["ts"])
    calls = []
    for op in (o for o in ops if o["name"] == "aten::scaled_dot_product_attention"):
        inside = kernels_inside(work, op)
        b, h, sq, d = op["args"]["Input Dims"][0]
        sk = op["args"]["Input Dims"][1][2]
        causal = op["args"]["Concrete Inputs"][5] == "True"
        flops = 4 * b * h * sq * sk * d / (2 if causal else 1)
        calls.append({"kernels": len(inside), "gpu_us": sum(w["dur"] for w in inside), "flops": flops})
    if calls:
        return calls
    for i, s in enumerate(ops):
        if s["name"] != "aten::softmax":
            continue
        x = s["args"]["Input Dims"][0]
        before = [o for o in ops[:i] if o["name"] == "aten::matmul" and o["tid"] == s["tid"]
                  and o["args"]["Input Dims"][1][-1] == x[-1] and o["args"]["Input Dims"][0][-2] == x[-2]]
        after = [o for o in ops[i + 1:] if o["name"] == "aten::matmul" and o["tid"] == s["tid"]
                 and o["args"]["Input Dims"][0][-2:] == x[-2:]]
        if before and after:
            first, last = before[-1], after[0]
            inside = [w for w in work if w["launch_tid"] == s["tid"]
                      and first["ts"] <= w["launch_ts"] <= last["ts"] + last["dur"]]
            q = first["args"]["Input Dims"][0]
            flops = 4 * math.prod(q[:-2]) * x[-2] * x[-1] * q[-1]
            calls.append({"kernels": len(inside), "gpu_us": sum(w["dur"] for w in inside), "flops": flops})
    if calls:
        return calls
    paged = [w for w in sorted(work, key=lambda w: w["ts"]) if "paged_attention" in w["name"]]
    for w in paged:
        if "reduce" in w["name"]:
            calls[-1]["kernels"] += 1
            calls[-1]["gpu_us"] += w["dur"]
        else:
            calls.append({"kernels": 1, "gpu_us": w["dur"], "flops": None})
    return calls


def step_gpu_us(path: Path) -> float:
    events = raw(path)
    return sum(w["dur"] for w in launched_work(events, *window(events)))


@pytest.fixture(scope="module", params=sorted(BORROWED), ids=sorted(BORROWED))
def found(request):
    entry = BORROWED[request.param]
    trace = entry.trace()
    return request.param, borrowed.root() / entry.file, attention.find_attention(entry.step(trace=trace))


# ------------------------------------------------------------------ the tests

def test_every_borrowed_step_has_the_attention_calls_kernels_and_gpu_time_of_the_raw_recount(found):
    name, path, report = found
    expected = recount(path)
    assert expected, f"{name}: the recount finds attention in every borrowed trace"
    assert len(report.calls) == len(expected), name
    for call, want in zip(report.calls, expected):
        assert len(call.kernels) == want["kernels"], name
        assert call.gpu_us == pytest.approx(want["gpu_us"], rel=1e-9, abs=1e-6), name
        if want["flops"] is None:
            assert call.flops is None, f"{name}: no shapes recorded, no FLOPs guessed"
        else:
            assert call.flops == pytest.approx(want["flops"]), name
            assert call.tflops == pytest.approx(want["flops"] / (want["gpu_us"] * 1e-6) / 1e12)
    assert report.step_gpu_us == pytest.approx(step_gpu_us(path), rel=1e-9)
    assert report.attention_share == pytest.approx(sum(c["gpu_us"] for c in expected) / step_gpu_us(path))


def test_the_device_and_its_peak_come_from_the_trace(found):
    name, path, report = found
    with gzip.open(path, "rt") as f:
        recorded = {p["name"] for p in json.load(f)["deviceProperties"]}
    assert report.device in recorded
    assert report.peaks == devices.match_gpu(report.device) and report.peaks is not None, \
        f"{name}: H100 SXM and MI300X both have a datasheet row"
    for call in report.calls:
        share = call.peak_share(report.peaks.flops)
        if call.tflops is not None:
            assert call.dtype == "bf16" and share == pytest.approx(call.tflops * 1e12 / report.peaks.flops)


def test_how_each_call_was_written_is_told():
    hows = {key: {c.how for c in attention.find_attention(entry.step()).calls} for key, entry in BORROWED.items()}
    assert hows["h100_qwen"] == hows["mi300x_qwen"] == {"fused"}
    assert hows["h100_timesformer"] == hows["mi300x_timesformer"] == {"hand-written"}
    assert hows["sglang_decode"] == {"kernels"}, "graph-launched decode kernels are found by name, with no op"
    decode = attention.find_attention(BORROWED["sglang_decode"].step()).calls
    assert all(len(c.kernels) == 2 and "reduce" in c.kernels["name"].iloc[1] for c in decode), \
        "each decode call is its split over the KV cache, then the reduce"


def test_causality_is_read_from_the_recorded_inputs():
    qwen = attention.find_attention(BORROWED["h100_qwen"].step()).calls
    bert = attention.find_attention(BORROWED["h100_bert"].step()).calls
    assert {c.causal for c in qwen} == {True} and {c.causal for c in bert} == {False}
    call = qwen[0]
    assert call.flops == pytest.approx(2 * call.batch_heads * call.sq * call.sk * (call.d + call.dv) / 2)


def test_the_footprint_is_the_attention_kernels_own():
    step = BORROWED["h100_qwen"].step()
    report = attention.find_attention(step)
    for call in report.calls:
        fp = call.footprint()
        main = call.main_kernel()
        assert "flash_fwd_kernel" in main["name"]
        assert fp["registers_per_thread"] == main["registers_per_thread"] and fp["grid"] == list(main["grid"])
        assert fp["occupancy_pct"] == main["occupancy_pct"] and fp["shared_memory"] == main["shared_memory"]
    rocm = attention.find_attention(BORROWED["mi300x_qwen"].step()).calls[0].footprint()
    assert rocm["grid"] and rocm["registers_per_thread"] is None, "ROCm traces record grid and block only"


def test_a_step_with_no_attention_says_so():
    report = attention.find_attention(borrowed.ALEXNET_FORWARD.step())
    assert report.calls == [] and report.attention_gpu_us == 0
    assert "no attention in this step" in report.text()


# ------------------------------------------------------------------ the command

def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernels.trace.attention", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_command_prints_one_json_object_with_the_calls():
    entry = BORROWED["h100_bert"]
    done = run(borrowed.root() / entry.file, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {"device", "step", "calls"} <= set(out) and out["step"] == "ProfilerStep#6"
    expected = recount(borrowed.root() / entry.file)
    assert len(out["calls"]) == len(expected)
    for call, want in zip(out["calls"], expected):
        assert {"kernels", "gpu_us", "flops", "tflops"} <= set(call)
        assert len(call["kernels"]) == want["kernels"] and call["flops"] == pytest.approx(want["flops"])
    table = run(borrowed.root() / entry.file)
    assert table.returncode == 0 and "flash_fwd_kernel" in table.stdout and "NVIDIA H100" in table.stdout


def cpu_only_trace(path: Path) -> Path:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "args": {}}]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("case, words", [
    ("missing", "no such file"),
    ("folder", "not a file"),
    ("not json", "not a Kineto trace"),
    ("no events", "not a Kineto trace"),
    ("cpu only", "no GPU work in it"),
    ("no such step", "no ProfilerStep#99 in this trace; its steps are 6"),
    ("steps on a stepless trace", "has no profiler steps"),
])
def test_the_command_says_what_is_wrong_in_words(tmp_path, case, words):
    bert = borrowed.root() / BORROWED["h100_bert"].file
    sglang = borrowed.root() / BORROWED["sglang_decode"].file
    (tmp_path / "text.json").write_text("hello")
    (tmp_path / "other.json").write_text(json.dumps({"nodes": []}))
    args = {"missing": [tmp_path / "nothing.json"], "folder": [tmp_path], "not json": [tmp_path / "text.json"],
            "no events": [tmp_path / "other.json"], "cpu only": [cpu_only_trace(tmp_path / "cpu.json")],
            "no such step": [bert, "--step", 99], "steps on a stepless trace": [sglang, "--step", 1]}[case]
    done = run(*args)
    assert done.returncode == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_trace_without_profiler_steps_is_read_whole():
    trace = load_trace(borrowed.root() / BORROWED["sglang_decode"].file)
    assert attention.pick_step(trace, None).label == "(whole trace)"


# ------------------------------------------------------------------ beyond the borrowed traces

def test_the_courses_own_cpu_steps_are_found_with_their_shapes():
    import torch

    import kernels
    from kernels.trace import record

    b, h, s, d = 1, 2, 48, 16
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    for name, how, flops in (("sdpa_flash", "fused", 4 * b * h * s * s * d / 2),
                             ("naive", "hand-written", 4 * b * h * s * s * d)):
        step = record.profile(kernels.get(name), q, k, v, causal=True, label=name).steps()[0]
        calls = attention.find_attention(step).calls
        assert [c.how for c in calls] == [how], name
        assert calls[0].flops == pytest.approx(flops), f"{name}: causal fused counts half, a hand-written core in full"
        assert calls[0].gpu_us == 0 and calls[0].tflops is None and calls[0].cpu_us > 0


def synthetic_trace(with_op: bool) -> dict:
    """A vLLM decode op launching a FlashInfer kernel, then a second FlashInfer kernel replayed
    from a graph (no op), a split-KV merge after it, and a GEMM that is not attention."""
    def x(cat, name, ts, dur, tid, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat not in GPU_WORK else 0, "tid": tid,
                "ts": ts, "dur": dur, "args": args}
    events = [x("user_annotation", "ProfilerStep#1", 0, 1000, 1),
              x("cuda_runtime", "cudaLaunchKernel", 20, 5, 1, correlation=1),
              x("kernel", "BatchDecodeWithPagedKVCacheKernel<128>", 100, 40, 7, correlation=1, stream=7),
              x("cuda_runtime", "cudaGraphLaunch", 300, 5, 1, correlation=2),
              x("kernel", "BatchDecodeWithPagedKVCacheKernel<128>", 400, 30, 7, correlation=2, stream=7),
              x("kernel", "MergeStatesKernel<8>", 431, 4, 7, correlation=2, stream=7),
              x("kernel", "nvjet_tst_128x64_64x4_1x2_h_bz_TNT", 436, 20, 7, correlation=2, stream=7)]
    if with_op:
        events.insert(1, x("cpu_op", "vllm::unified_attention", 10, 50, 1))
    return {"traceEvents": events}


def test_other_libraries_ops_and_kernels_come_from_the_name_tables():
    calls = attention.find_attention(load_trace(synthetic_trace(True)).profiler_steps()[0]).calls
    assert [(c.how, c.op, len(c.kernels)) for c in calls] == [
        ("fused", "vllm::unified_attention", 1), ("kernels", None, 2)]
    assert calls[0].library == calls[1].library == "FlashInfer" and calls[1].gpu_us == 34
    assert all(c.flops is None for c in calls), "no shapes recorded, no FLOPs"
    bare = attention.find_attention(load_trace(synthetic_trace(False)).profiler_steps()[0]).calls
    assert [len(c.kernels) for c in bare] == [1, 2]

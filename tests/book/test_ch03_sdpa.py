"""Chapter 3's own reading (kernels.book.ch03_sdpa): SDPA calls read out of real GPU traces
(book/data/borrowed: Qwen1.5-0.5B on an H100 and an MI300X), the CPU readings the page shows, its
diff figure without a CPU ranking, and the math backend's GEMMs on a GPU run.

The expected values of the borrowed traces are recounted here from the raw JSON with plain
``json`` (the op's args, the runtime calls and kernels by correlation id), never from
``kernels.trace``. That the recorded H100 call took the backend the rules of its torch predict
is chapter 3's lesson.
"""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from kernels import borrowed
from kernels.attention import sdpa
from kernels.book import ch03_sdpa as ch03
from kernels.notebook import LessonFailed
from kernels.trace import reader
from tests.gpu_trace import forward_trace

QWEN = ("h100_qwen", "mi300x_qwen")


def raw(key: str) -> dict:
    with gzip.open(borrowed.root() / borrowed.TRACELENS[key].file, "rt") as f:
        return json.load(f)


def raw_sdpa_calls(events: list) -> list:
    return sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] == sdpa.SDPA_OP), key=lambda e: e["ts"])


def raw_kernels_under(events: list, op: dict) -> list:
    """Kernels whose launch (same correlation id) lies inside ``op`` on its thread."""
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"
                and e["tid"] == op["tid"] and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]}
    return [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in launches]


@pytest.fixture(scope="module", params=QWEN)
def qwen(request):
    entry = borrowed.TRACELENS[request.param]
    trace = entry.trace()
    return request.param, raw(request.param), entry.step(trace=trace)


def test_recorded_calls_read_every_sdpa_op_with_the_inputs_the_raw_args_hold(qwen):
    _, data, step = qwen
    ops = raw_sdpa_calls(data["traceEvents"])
    calls = ch03.recorded_calls(step)
    assert len(calls) == len(ops) > 0
    for call, op in zip(calls, ops):
        dims, values = op["args"]["Input Dims"], op["args"]["Concrete Inputs"]
        assert [call.q, call.k, call.v] == dims[:3]
        assert call.attn_mask is None and dims[3] == [] and op["args"]["Input type"][3] == ""
        assert call.is_causal == (values[5] == "True")
        assert call.scale == float(values[6]) and call.dropout_p == float(values[4])
        assert call.dtype == torch.bfloat16 and op["args"]["Input type"][0] == "c10::BFloat16"
        assert call.rules_reason() is None


def test_the_backend_op_nested_in_each_call_is_flash_on_both_vendors(qwen):
    _, data, step = qwen
    events = data["traceEvents"]
    for call, op in zip(ch03.recorded_calls(step), raw_sdpa_calls(events)):
        inside = [e["name"] for e in events if e.get("cat") == "cpu_op" and e["tid"] == op["tid"]
                  and op["ts"] < e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"]]
        backend_ops = [n for n in inside if n in ch03.BACKEND_OPS]
        assert backend_ops == [call.backend_op] == ["aten::_scaled_dot_product_flash_attention"]
        assert call.backend == "sdpa_flash"


def test_chain_puts_each_kernel_under_the_runtime_call_that_launched_it(qwen):
    key, data, step = qwen
    events = data["traceEvents"]
    call = ch03.recorded_calls(step)[0]
    table = ch03.chain(ch03.call_step(step, call))
    assert table.iloc[0]["name"] == sdpa.SDPA_OP and table.iloc[0]["level"] == 0
    assert table.iloc[1]["name"] == call.backend_op and table.iloc[1]["level"] == 1
    want = raw_kernels_under(events, raw_sdpa_calls(events)[0])
    gpu = table[table["kind"] == "GPU kernel"]
    assert len(gpu) == len(want) >= 1
    main = "flash_fwd_kernel" if key.startswith("h100") else "attn_fwd"
    assert any(main in n for n in gpu["name"]) and any(main in e["name"] for e in want)
    for i in gpu.index:   # right under its launch, one level deeper
        assert table.at[i - 1, "kind"] == "runtime" and table.at[i, "level"] == table.at[i - 1, "level"] + 1
    assert (table["name"] != "aten::as_strided").all()


def test_recorded_calls_say_when_the_trace_has_no_inputs():
    from kernels.trace.reader import load_trace
    events = [{"ph": "X", "cat": "cpu_op", "name": sdpa.SDPA_OP, "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {}}]
    step = load_trace({"traceEvents": events}).whole()
    with pytest.raises(ValueError, match="record_shapes"):
        ch03.recorded_calls(step)


def test_chain_indented_for_display_keeps_the_rows_and_nests_the_names():
    step = borrowed.TRACELENS["h100_qwen"].step()
    call = ch03.call_step(step, ch03.recorded_calls(step)[0])
    flat, shown = ch03.chain(call), ch03.chain(call, indent=True)
    assert len(flat) == len(shown) and "level" not in shown.columns
    assert [n.count("· ") for n in shown.index] == flat["level"].tolist()
    assert [n.replace("· ", "") for n in shown.index] == flat["name"].tolist()


def test_summary_says_what_the_rules_read():
    call = ch03.recorded_calls(borrowed.TRACELENS["mi300x_qwen"].step())[0]
    row = call.summary()
    assert row["dtype"] == "bfloat16" and row["attn_mask"] == "None" and row["is_causal"] is True
    assert row["backend"] == "sdpa_flash" and row["q shape [B, H, S, D]"] == str(call.q)


# ---- the CPU readings chapter 3 shows, on real CPU profiles -------------------------------------

def _profile(name: str, seq: int, tmp_path):
    from kernels.trace import record
    from tests.helpers import make_qkv
    import kernels

    q, k, v = make_qkv(1, 2, seq, 16, seed=1)
    run = record.profile(kernels.get(name), q, k, v, label=name, wait=0, warmup=1, active=1, trace_dir=tmp_path)
    return run.step(), q


def test_mask_build_order_finds_ones_tril_where_in_order_in_a_math_step(tmp_path):
    step, _ = _profile("sdpa_math", 64, tmp_path)
    order = ch03.mask_build_order(step, 64, 64)
    assert None not in order.values() and 1 <= order["ones"] < order["tril"] < order["where"] <= len(step.ops)
    ops = step.ops.sort_values("start_us", kind="stable")["name"].tolist()
    assert ops[order["tril"] - 1] == "aten::tril" and ops[order["ones"] - 1] == "aten::ones"
    assert ch03.mask_build_order(step, 63, 63)["tril"] is None   # no [63, 63] tensor in this step


def test_dtype_casts_find_no_cast_in_an_fp32_math_step(tmp_path):
    """The bf16 upcast itself is chapter 3's lesson (notebooks/03_sdpa.py), asserted when it executes."""
    fp32_step, _ = _profile("sdpa_math", 64, tmp_path)
    assert ch03.dtype_casts(fp32_step)["upcasts"] == [] and ch03.dtype_casts(fp32_step)["downcasts"] == []


def test_the_diff_figure_keeps_its_bars_and_drops_the_matched_rows_times(tmp_path):
    from kernels.trace import diff

    inplace, _ = _profile("inplace", 64, tmp_path)
    math_step, _ = _profile("sdpa_math", 64, tmp_path)
    changes = diff.diff(inplace, math_step)
    fig = changes.figure()
    bars = len(fig.axes[0].patches)
    label = ch03.without_matched_times(fig, changes).axes[0].get_xlabel()
    assert "matched rows with the same counts and bytes" in label and " ms (" not in label
    assert label.splitlines()[0].startswith("self time") and len(fig.axes[0].patches) == bars
    assert fig.get_size_inches()[0] == 9


def test_so_far_counts_as_integers_and_adds_the_gpu_columns_only_on_a_gpu(tmp_path):
    step, _ = _profile("sdpa_math", 64, tmp_path)
    table = ch03.so_far({"sdpa_math": step}, {"sdpa_math": 7}, torch.device("cpu"))
    assert list(table.columns) == ["ops", "ops doing work", "peak (MiB)"]
    assert table.loc["sdpa_math", "ops"] == len(step.ops) and table.loc["sdpa_math", "ops doing work"] == 7
    assert str(table["ops"].dtype) == "int64"
    gpu = ch03.so_far({"sdpa_math": step}, {"sdpa_math": 7}, torch.device("cuda"))
    assert list(gpu.columns)[-2:] == ["kernels", "GPU time (ms)"]


def a100_step(label: str):
    return reader.load_trace(forward_trace(label)).steps(label)[0]


def test_the_math_backends_gemms_read_fp32_and_a_16_bit_gemm_fails():
    table = ch03.math_gemms_not_16bit(a100_step("sdpa_math"), "fixture A100")
    assert "gemm" in set(table["kind"]) and table["name"].str.len().max() <= 70
    with pytest.raises(LessonFailed, match="16 bits"):
        ch03.math_gemms_not_16bit(a100_step("naive"), "fixture A100")


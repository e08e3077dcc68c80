"""Reading SDPA calls out of real GPU traces (book/data/borrowed: Qwen1.5-0.5B on an H100 and an MI300X).

The expected values are recounted here from the raw JSON with plain ``json`` (the op's args, the
runtime calls and kernels by correlation id), never from ``kernels.trace``. That the recorded
H100 call took the backend the rules of its torch predict is chapter 3's lesson.
"""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
import torch

from kernels import borrowed
from kernels.attention import sdpa

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
    calls = sdpa.recorded_calls(step)
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
    for call, op in zip(sdpa.recorded_calls(step), raw_sdpa_calls(events)):
        inside = [e["name"] for e in events if e.get("cat") == "cpu_op" and e["tid"] == op["tid"]
                  and op["ts"] < e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"]]
        backend_ops = [n for n in inside if n in sdpa.BACKEND_OPS]
        assert backend_ops == [call.backend_op] == ["aten::_scaled_dot_product_flash_attention"]
        assert call.backend == "sdpa_flash"


def test_chain_puts_each_kernel_under_the_runtime_call_that_launched_it(qwen):
    key, data, step = qwen
    events = data["traceEvents"]
    call = sdpa.recorded_calls(step)[0]
    table = sdpa.chain(sdpa.call_step(step, call))
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


def test_priority_before_torch_2_9_keeps_the_default_order_and_2_5_0_is_refused():
    assert sdpa.priority((9, 0), 92000, torch_version="2.6.0+cu124") == list(sdpa.DEFAULT_PRIORITY)
    assert sdpa.priority((9, 0), 92000, torch_version="2.11.0")[0] == "sdpa_cudnn"
    with pytest.raises(ValueError, match="2.5.0"):
        sdpa.priority((9, 0), 92000, torch_version="2.5.0")


def test_recorded_calls_say_when_the_trace_has_no_inputs():
    from kernels.trace.reader import load_trace
    events = [{"ph": "X", "cat": "cpu_op", "name": sdpa.SDPA_OP, "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {}}]
    step = load_trace({"traceEvents": events}).whole()
    with pytest.raises(ValueError, match="record_shapes"):
        sdpa.recorded_calls(step)


def test_flash_tiles_of_the_h100_kernel_give_its_recorded_shared_memory_and_grid():
    step = borrowed.TRACELENS["h100_qwen"].step()
    call = sdpa.recorded_calls(step)[0]
    events = raw("h100_qwen")["traceEvents"]
    kernel = next(e for e in raw_kernels_under(events, raw_sdpa_calls(events)[0]) if "flash_fwd" in e["name"])
    tiles = sdpa.flash_tiles(kernel["name"])
    assert tiles.head_dim == call.head_dim
    assert tiles.threads == kernel["args"]["block"][0]
    assert tiles.shared_bytes() == kernel["args"]["shared memory"]
    batch, heads, seq = call.q[0], call.q[1], call.q[2]
    assert tiles.grid(batch, heads, seq) == kernel["args"]["grid"]
    with pytest.raises(ValueError, match="FlashAttention-2"):
        sdpa.flash_tiles("attn_fwd")


def test_chain_indented_for_display_keeps_the_rows_and_nests_the_names():
    step = borrowed.TRACELENS["h100_qwen"].step()
    call = sdpa.call_step(step, sdpa.recorded_calls(step)[0])
    flat, shown = sdpa.chain(call), sdpa.chain(call, indent=True)
    assert len(flat) == len(shown) and "level" not in shown.columns
    assert [n.count("· ") for n in shown.index] == flat["level"].tolist()
    assert [n.replace("· ", "") for n in shown.index] == flat["name"].tolist()


def test_summary_says_what_the_rules_read():
    call = sdpa.recorded_calls(borrowed.TRACELENS["mi300x_qwen"].step())[0]
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
    order = sdpa.mask_build_order(step, 64, 64)
    assert None not in order.values() and 1 <= order["ones"] < order["tril"] < order["where"] <= len(step.ops)
    ops = step.ops.sort_values("start_us", kind="stable")["name"].tolist()
    assert ops[order["tril"] - 1] == "aten::tril" and ops[order["ones"] - 1] == "aten::ones"
    assert sdpa.mask_build_order(step, 63, 63)["tril"] is None   # no [63, 63] tensor in this step


def test_the_peak_memory_sweep_grows_4x_for_math_and_says_where_a_backend_did_not_run(tmp_path):
    lengths = {"sdpa_math": [64, 128], "sdpa_flash": [64, 128, 256]}
    peaks, steps = sdpa.peak_memory_sweep(lengths, 1, 2, 16, dtype=torch.float32, device=torch.device("cpu"),
                                          trace_dir=str(tmp_path))
    assert sorted(steps) == sorted((n, s) for n, seqs in lengths.items() for s in seqs)
    assert peaks.index.tolist() == [64, 128, 256] and pd.isna(peaks.loc[256, "sdpa_math"])
    growth = sdpa.growth_per_doubling(peaks)["sdpa_math x per doubling"].dropna()
    assert 3 < growth.iloc[-1] < 4.5                     # the S x S buffers
    shown = sdpa.peaks_and_growth(peaks)
    assert shown.loc[256, "sdpa_math"] == "—" and not shown.isna().any().any()
    assert len(sdpa.peak_memory_figure(peaks, "t").axes[0].lines) == 4   # two backends, two guides
    with pytest.raises(ValueError, match="at least one sequence length"):
        sdpa.peak_memory_sweep({"sdpa_math": []}, 1, 2, 16, dtype=torch.float32, device=torch.device("cpu"),
                               trace_dir=str(tmp_path))


def test_cpu_flash_allocations_name_the_output_and_the_log_sum_exp(tmp_path):
    step, q = _profile("sdpa_flash", 128, tmp_path)
    got = sdpa.cpu_flash_allocations(step, 1, 2, 128, 16, q.element_size())
    sizes = step.memory.loc[step.memory["bytes"] > 0, "bytes"].tolist()
    assert got["allocations"] == len(sizes) >= 2
    assert got["output"] and got["log-sum-exp"]
    assert got["scratch (KiB)"] * 1024 == sum(sizes) - 1 * 2 * 128 * 16 * 4 - 1 * 2 * 128 * 4


def test_dtype_casts_find_no_cast_in_an_fp32_math_step(tmp_path):
    """The bf16 upcast itself is chapter 3's lesson (notebooks/03_sdpa.py), asserted when it executes."""
    fp32_step, _ = _profile("sdpa_math", 64, tmp_path)
    assert sdpa.dtype_casts(fp32_step)["upcasts"] == [] and sdpa.dtype_casts(fp32_step)["downcasts"] == []


def test_cpu_flash_allocation_table_refuses_a_sweep_without_flash():
    """Its rows over a sweep's flash steps are chapter 3b's lessons (every row three buffers, the
    math backend's steps beside them), asserted when the chapter executes."""
    with pytest.raises(ValueError, match="no sdpa_flash step"):
        sdpa.cpu_flash_allocation_table({("sdpa_math", 128): None}, 1, 2, 16, 4)

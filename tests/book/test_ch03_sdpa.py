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
    assert row["backend op"] == "_scaled_dot_product_flash_attention"   # no aten:: prefix in the table


def test_chain_figure_draws_every_launch_and_a_line_to_each_kernel(qwen):
    """Fig. 7: one bar per launch in the launch row, one per kernel in the GPU row, a line from
    each launch to its kernel, the top row named "call", and no name cut with "…"."""
    key, _, step = qwen
    call = ch03.call_step(step, ch03.recorded_calls(step)[0])
    table = ch03.chain(call)
    fig = ch03.chain_figure({key: call})
    ax = fig.axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes[0] == "call" and lanes[ch03.CHAIN_LANES.index("launch")] == "launch"
    rows = {}
    for bars in ax.collections:
        for path in bars.get_paths():
            rows.setdefault(round(float(path.vertices[:, 1].mean())), []).append(path)
    assert len(rows[ch03.CHAIN_LANES.index("launch")]) == (table["kind"] == "runtime").sum() >= 1
    assert len(rows[ch03.CHAIN_LANES.index("GPU")]) == (table["kind"] == "GPU kernel").sum()
    assert len(ax.get_lines()) == (table["kind"] == "GPU kernel").sum()
    texts = [t.get_text() for t in ax.texts]
    assert "launch" in texts and not any("…" in t or "aten::" in t for t in texts)
    main = "flash_fwd_kernel" if key.startswith("h100") else "attn_fwd"
    assert main in texts
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "launch (CPU runtime call)" in legend and "SDPA call" in legend


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
    assert ch03.dtype_casts(fp32_step)["matmul input types"] == "float32 × float32"


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
    assert fig.get_size_inches()[0] == 7
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert not any("()" in t or "0.00" in t for t in labels)
    assert any("· build mask" in t for t in labels) and any("· NaN guard" in t for t in labels)


def test_diff_row_label_keeps_the_largest_shape_and_writes_small_allocations_in_kib():
    from types import SimpleNamespace as Row

    where = Row(name="aten::where", shapes="(1, 8, 512, 1) () (1, 8, 512, 512) (1, 8, 512, 512)",
                count_a=0, count_b=1, alloc_bytes_change=0)
    assert ch03.diff_row_label(where, 512) == "where (1, 8, 512, 512)\n0 → 1 · NaN guard"
    mask = Row(name="aten::where", shapes="(512, 512) () ()", count_a=0, count_b=2, alloc_bytes_change=2**20)
    assert ch03.diff_row_label(mask, 512) == "where (512, 512)\n0 → 2, +1 MiB · build mask"
    alloc = Row(name="aten::all", shapes="(1, 8, 512, 512) () ()", count_a=0, count_b=1, alloc_bytes_change=4096)
    assert ch03.diff_row_label(alloc, 512).splitlines()[1] == "0 → 1, +4 KiB · NaN guard"
    scale = Row(name="aten::mul", shapes="(1, 8, 512, 512) ()", count_a=1, count_b=0, alloc_bytes_change=-8 * 2**20)
    assert ch03.diff_row_label(scale, 512) == "mul (1, 8, 512, 512)\n1 → 0, -8 MiB · scale scores"


def test_math_timeline_colours_the_wrappers_apart_and_the_nan_guard_as_softmax(tmp_path):
    from matplotlib.colors import to_hex

    from kernels.trace import timeline

    step, _ = _profile("sdpa_math", 64, tmp_path)
    fig = ch03.math_timeline_colours(timeline.timeline(step), step)
    ax = fig.axes[0]
    lane = {track: i for i, track in enumerate(timeline.tracks(step))}
    colour_at = {}
    for bars in ax.collections:
        faces = [to_hex(c) for c in bars.get_facecolors()]
        faces = faces * len(bars.get_paths()) if len(faces) == 1 else faces
        for path, face in zip(bars.get_paths(), faces):
            colour_at[(round(float(path.vertices[:, 1].mean())), round(float(path.vertices[:, 0].min()), 3))] = face
    ops = step.ops
    def colour(name):
        return {colour_at[(lane[("cpu", r.pid, r.tid, r.depth)], round(r.start_us / 1e3, 3))]
                for r in ops[ops["name"] == name].itertuples()}
    assert colour(sdpa.SDPA_OP) == colour("aten::_scaled_dot_product_attention_math") == {ch03.SDPA_CALL_COLOUR}
    safe = ops.index[ops["name"] == "aten::_safe_softmax"]
    guard_where = ops[(ops["name"] == "aten::where") & ops["parent"].isin(safe)]
    mask_where = ops[(ops["name"] == "aten::where") & ~ops["parent"].isin(safe)]
    assert len(guard_where) == 1 and len(mask_where) >= 1
    r = guard_where.iloc[0]
    assert colour_at[(lane[("cpu", r.pid, r.tid, r.depth)], round(r.start_us / 1e3, 3))] == ch03.SOFTMAX_COLOUR
    r = mask_where.iloc[0]
    assert colour_at[(lane[("cpu", r.pid, r.tid, r.depth)], round(r.start_us / 1e3, 3))] != ch03.SOFTMAX_COLOUR
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fused attention" not in legend and "SDPA call (not fused)" in legend


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


"""kernels.trace.breakdown and AttentionReport.summary on the borrowed real traces (H100 and MI300X).

Where a number is checked it is recounted here another way: kinds against the ops that launched
the kernels (a kernel launched by aten::mm is a GEMM, whatever its vendor's name for it), sums
against the step's own GPU time.
"""
from __future__ import annotations

import pandas as pd
import pytest

from kernels import borrowed
from kernels.trace import attention, breakdown
from kernels.trace.fingerprints import kind_of
from kernels.trace.reader import load_trace

KEYS = ("h100_qwen", "mi300x_qwen", "h100_timesformer", "h100_vit", "mi300x_vit")
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


@pytest.fixture(scope="module")
def reports():
    return {k: attention.find_attention(borrowed.TRACELENS[k].step()) for k in KEYS}


def test_the_kinds_share_out_the_whole_step(reports):
    for key, report in reports.items():
        table = breakdown.time_by_kind(report)
        assert table.index[0] == "attention" and set(table.index) <= set(breakdown.KINDS), key
        assert table["GPU µs"].sum() == pytest.approx(report.step_gpu_us, rel=1e-9), key
        assert table["share"].sum() == pytest.approx(1.0), key
        assert table.loc["attention", "share"] == pytest.approx(report.attention_share), key
        assert table["work"].sum() == len(report.step.gpu_work), f"{key}: every kernel, memcpy and memset once"


def test_gemm_kernels_are_gemms_on_both_vendors(reports):
    """Outside attention, whatever aten::mm/addmm/bmm launched is counted as GEMM: cuBLAS's names on
    the H100, Tensile's Cijk_* on the MI300X."""
    for key, report in reports.items():
        work = report.step.gpu_work
        rest = work[~work.index.isin(breakdown.attention_rows(report))]
        launched_by_gemm = rest[rest["op"].isin(GEMM_OPS) & (rest["cat"] == "kernel")]
        assert len(launched_by_gemm), key
        kinds = {kind_of(n) for n in launched_by_gemm["name"]}
        assert kinds == {"gemm"}, f"{key}: {kinds}"
        table = breakdown.time_by_kind(report)
        assert table.loc["gemm", "GPU µs"] >= launched_by_gemm["dur_us"].sum() - 1e-6, key
    mi300x = breakdown.time_by_kind(reports["mi300x_qwen"])
    assert mi300x.loc["other", "share"] < 0.01, "the MI300X's GEMMs are not left as 'other'"


def test_rest_by_op_names_the_ops_outside_attention(reports):
    report = reports["h100_qwen"]
    top = breakdown.rest_by_op(report, top=5)
    assert len(top) == 5 and top["GPU µs"].is_monotonic_decreasing
    work = report.step.gpu_work
    rest = work[~work.index.isin(breakdown.attention_rows(report))]
    for op, row in top.iterrows():
        mine = rest[rest["op"] == op]
        assert row["GPU µs"] == pytest.approx(mine["dur_us"].sum()) and row["work"] == len(mine), op
    assert "aten::scaled_dot_product_attention" not in top.index, "attention's ops are not in the rest"
    everything = breakdown.rest_by_op(report, top=10_000)
    assert everything["GPU µs"].sum() == pytest.approx(report.step_gpu_us - report.attention_gpu_us)


def test_launched_by_names_the_ops_behind_most_of_each_kind(reports):
    report = reports["h100_qwen"]
    table = breakdown.time_by_kind(report)
    work = report.step.gpu_work
    gemm_ops = work[[kind_of(n) == "gemm" for n in work["name"]]].groupby("op")["dur_us"].sum()
    assert table.loc["gemm", "launched by"].split(", ")[0] == gemm_ops.idxmax().removeprefix("aten::")
    assert "addmm" in table.loc["gemm", "launched by"] and "mean" in table.loc["reduction", "launched by"]
    assert table.loc["attention", "launched by"] == "_flash_attention_forward"


def test_hand_written_attention_counts_all_its_kernels(reports):
    """TimeSformer's softmax kernels run inside its hand-written attention: they count as attention,
    and no softmax is left outside it."""
    report = reports["h100_timesformer"]
    table = breakdown.time_by_kind(report)
    assert "softmax" not in table.index
    inside = report.step.gpu_work.loc[breakdown.attention_rows(report)]
    assert inside["name"].str.contains("SoftMax").any() and inside["name"].str.contains("cutlass|gemm", case=False).any()


def test_shares_put_steps_side_by_side_and_the_bars_draw_them(reports):
    table = breakdown.shares(reports)
    assert list(table.index) == list(KEYS) and list(table.columns) == list(breakdown.KINDS)
    assert table.sum(axis=1).round(9).eq(1.0).all()
    assert table.loc["h100_qwen", "attention"] == pytest.approx(reports["h100_qwen"].attention_share)
    fig = breakdown.share_bars(table, title="attention's share")
    ax = fig.axes[0]
    drawn_kinds = [k for k in table.columns if (table[k] > 0).any()]
    assert len(ax.patches) == len(table) * len(drawn_kinds), "one bar segment per step and kind drawn"
    labels = [t.get_text() for t in ax.texts]
    assert labels == [f"{100 * s:.0f}%" for s in table["attention"]], "attention's share is written on each bar"
    ticks = sorted((t.get_position()[1], t.get_text()) for t in ax.get_yticklabels())
    assert [name for _, name in ticks][::-1] == list(table.index), "the first step is the top bar"


def test_the_summary_sets_one_model_on_two_vendors_side_by_side(reports):
    h100, mi300x = reports["h100_qwen"].summary(), reports["mi300x_qwen"].summary()
    assert h100["device"].startswith("NVIDIA H100") and mi300x["device"].startswith("AMD Instinct MI300X")
    assert h100["attention calls"] == len(reports["h100_qwen"].calls)
    per_call = pd.Series([c.gpu_us for c in reports["mi300x_qwen"].calls])
    assert mi300x["GPU µs per call (median)"] == pytest.approx(per_call.median(), abs=0.05)
    assert "flash_fwd_kernel" in h100["main kernel"] and mi300x["main kernel"] == "attn_fwd"
    assert isinstance(h100["registers per thread"], int) and isinstance(h100["shared memory (KiB)"], float)
    assert mi300x["registers per thread"] == mi300x["shared memory (KiB)"] == mi300x["occupancy (%)"] == "not recorded", \
        "a ROCm trace records grid and block only"
    assert mi300x["grid"] != "not recorded" and mi300x["block"] != "not recorded"


def test_bad_input_is_refused_in_words(reports):
    with pytest.raises(ValueError, match="at least one report"):
        breakdown.shares({})
    with pytest.raises(ValueError, match="not kinds of breakdown.KINDS"):
        breakdown.share_bars(pd.DataFrame({"flops": [1.0]}, index=["x"]))
    empty = attention.AttentionReport(reports["h100_vit"].step, None, None, [])
    with pytest.raises(ValueError, match="no attention call to summarise"):
        empty.summary()
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "args": {}}
    cpu_only = attention.find_attention(load_trace({"traceEvents": [mm]}).whole())
    with pytest.raises(ValueError, match="has no GPU time: a CPU-only step"):
        breakdown.time_by_kind(cpu_only)

"""Where a model step's GPU time goes: its attention calls, and the rest of its GPU work by kind.

``time_by_kind(report)`` sums one step's GPU work (kernels, memcpy, memset; an
``AttentionReport`` of ``kernels.trace.attention``) into kinds. Every kernel of an attention
call counts as "attention" (the scale, mask and softmax of a hand-written core included, the
small fill kernel a fused op may launch too); the rest is sorted by
``kernels.trace.fingerprints.kind_of`` (GEMM, elementwise, reduction, softmax, copy, memset,
other; AMD's Tensile and MIOpen names included). ``rest_by_op`` names
the ops that launched the rest. ``shares({label: report})`` puts several steps side by side,
one row each, and ``share_bars`` draws that table as stacked bars.

Shares are of ``Step.gpu_time_us``: the GPU work's durations summed over streams (busy time,
not the step's wall time).
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
from matplotlib.figure import Figure

from kernels.figures import apply_font_floor
from kernels.trace.attention import AttentionReport
from kernels.trace.fingerprints import kind_of

# The order of the kinds in tables and bars: attention first, then what a model step mostly is.
KINDS = ("attention", "gemm", "elementwise", "reduction", "softmax", "copy", "memset", "other")
KIND_LABELS = {"attention": "attention", "gemm": "GEMM", "elementwise": "elementwise",
               "reduction": "reduction (norms, means)", "softmax": "softmax (outside attention)",
               "copy": "copy and layout", "memset": "memset", "other": "other"}
KIND_COLORS = {"attention": "#d62728", "gemm": "#1f77b4", "elementwise": "#ff7f0e", "reduction": "#2ca02c",
               "softmax": "#9467bd", "copy": "#8c564b", "memset": "#7f7f7f", "other": "#bcbd22"}

def attention_rows(report: AttentionReport) -> pd.Index:
    """The rows of the step's ``gpu_work`` that belong to an attention call."""
    rows = [c.kernels.index for c in report.calls]
    return rows[0].append(rows[1:]).unique() if rows else pd.Index([])


def _rest(report: AttentionReport) -> pd.DataFrame:
    work = report.step.gpu_work
    rest = work[~work.index.isin(attention_rows(report))]
    return rest.assign(kind=[kind_of(n) for n in rest["name"]])


def launched_by(work: pd.DataFrame, top: int = 4) -> str:
    """The ``top`` ops that launched most of ``work``'s GPU time, most first, without ``aten::``."""
    by_op = work.assign(op=work["op"].fillna("(no op)")).groupby("op")["dur_us"].sum().sort_values(ascending=False)
    return ", ".join(o.removeprefix("aten::") for o in by_op.index[:top])


def time_by_kind(report: AttentionReport) -> pd.DataFrame:
    """GPU time of the step by kind: one row per kind present, attention first, then the rest
    by time; columns ``GPU µs``, ``share`` (of the step's GPU time), ``work`` (how many
    kernels, memcpys or memsets) and ``launched by`` (``launched_by``: the ops behind most of it)."""
    total = report.step_gpu_us
    if total <= 0:
        raise ValueError(f"step {report.step.label} has no GPU time: a CPU-only step has no GPU work to share out")
    rest = _rest(report)
    attention = pd.DataFrame({"GPU µs": [report.attention_gpu_us], "work": [len(attention_rows(report))],
                              "launched by": [launched_by(report.step.gpu_work.loc[attention_rows(report)])]},
                             index=["attention"])
    others = rest.groupby("kind")["dur_us"].agg(["sum", "count"]).rename(columns={"sum": "GPU µs", "count": "work"})
    others["launched by"] = [launched_by(rest[rest["kind"] == kind]) for kind in others.index]
    table = pd.concat([attention, others.sort_values("GPU µs", ascending=False)])
    table["share"] = table["GPU µs"] / total
    table.index.name = "kind"
    return table[["GPU µs", "share", "work", "launched by"]]


def rest_by_op(report: AttentionReport, top: int = 8) -> pd.DataFrame:
    """The ``top`` ops whose kernels take most of the GPU time outside attention: ``op`` (the
    innermost op that launched them; "(no op)" for work no op launched), the kind of most of its
    time, ``work``, ``GPU µs`` and ``share`` of the step."""
    rest = _rest(report).assign(op=lambda r: r["op"].fillna("(no op)"))
    by_op = rest.groupby("op").agg(work=("dur_us", "size"), gpu_us=("dur_us", "sum"))
    main_kind = rest.groupby(["op", "kind"])["dur_us"].sum().reset_index() \
        .sort_values("dur_us", ascending=False).drop_duplicates("op").set_index("op")["kind"]
    by_op["kind"] = main_kind.reindex(by_op.index)
    by_op["share"] = by_op["gpu_us"] / report.step_gpu_us
    by_op = by_op.sort_values("gpu_us", ascending=False).head(top).rename(columns={"gpu_us": "GPU µs"})
    return by_op[["kind", "work", "GPU µs", "share"]]


def shares(reports: dict[str, AttentionReport]) -> pd.DataFrame:
    """One row per labelled step, one column per kind (``KINDS`` order, absent kinds 0): the
    share of that step's GPU time."""
    if not reports:
        raise ValueError("shares needs at least one report: {label: AttentionReport}")
    rows = {label: time_by_kind(r)["share"] for label, r in reports.items()}
    table = pd.DataFrame(rows).T.reindex(columns=list(KINDS)).fillna(0.0)
    table.index.name = "step"
    return table


def share_bars(table: pd.DataFrame, ax=None, title: Optional[str] = None):
    """``shares``' table as horizontal stacked bars, one per step (the first at the top), each
    kind in its colour, attention's share written on its bar. Returns the figure."""
    unknown = [c for c in table.columns if c not in KIND_COLORS]
    if unknown:
        raise ValueError(f"columns {unknown} are not kinds of breakdown.KINDS: pass the table shares() returns")
    if ax is None:
        ax = Figure(figsize=(8, 0.45 * len(table) + 1.6)).add_subplot()
    shown = [k for k in table.columns if (table[k] > 0).any()]
    left = pd.Series(0.0, index=table.index)
    y = list(range(len(table)))[::-1]
    for kind in shown:
        ax.barh(y, 100 * table[kind], left=100 * left, color=KIND_COLORS[kind], label=KIND_LABELS[kind])
        left += table[kind]
    if "attention" in table.columns:
        for yi, share in zip(y, table["attention"]):
            ax.text(1, yi, f"{100 * share:.0f}%", va="center", ha="left", color="white", fontweight="bold")
    ax.set_yticks(y, list(table.index))
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the step's GPU time (%)")
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    if title:
        ax.set_title(title)
    fig = ax.figure
    apply_font_floor(fig)
    fig.tight_layout()
    return fig

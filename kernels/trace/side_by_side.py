"""Two attention reports (``kernels.trace.attention``) side by side: the same model on two GPUs, or a step before and after a change.

``side_by_side(a, b)`` groups each report's calls by their shape (``call_shape``: B·H, Sq, Sk, D,
Dv and causality for an op's call; the heads, head dims and the engine step's token counts for a
serving call; "unknown" where the trace records none) and matches the groups the two share. Per
matched group: the calls on each side, the main kernel on each side (readable), the mean GPU µs per
call, TFLOP/s and TB/s on each side, and B's time over A's. Groups only one side has are listed as
unmatched. Means, as TraceLens's reports give them; a group's calls are alike by construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Optional, Protocol

import pandas as pd

from kernels.trace.families import readable_name



class Report(Protocol):
    """What a side needs of a report: ``kernels.trace.attention.AttentionReport`` is one (not
    imported here: that package imports this module)."""

    calls: list

    def as_dict(self) -> dict: ...


def shape_text(c) -> str:
    """A call's (``kernels.trace.attention.AttentionCall``) shape as tables show it: "B·H x Sq x Sk x D",
    or a serving call's "H H_Q/H_KV x D d; prefill+decode: Σsq q, Σsk k"; "?" where unknown."""
    if c.tokens is not None:
        heads = "?" if c.heads is None else f"H {c.heads}/{c.kv_heads} x D {c.d}"
        return f"{heads}; {c.tokens.kind}: {c.tokens.queries:,} q, {c.tokens.keys:,} k"
    if c.batch_heads is None:
        return "?"
    d = f"{c.d}" if c.d == c.dv else f"{c.d}/{c.dv}"
    return f"{c.batch_heads} x {c.sq} x {c.sk} x {d}"


def call_shape(call) -> tuple:
    """What two calls must share to be compared: the work they did, not the kernel that did it."""
    if call.tokens is not None:
        t = call.tokens
        return ("serving", call.heads, call.kv_heads, call.d, call.dv, t.c_sq, t.c_sk, t.c_sqsq, t.c_sqsk,
                t.g_sq, t.g_sk, t.g_sqsq, t.g_sqsk)
    if call.batch_heads is None:
        return ("unknown", call.library)
    return ("op", call.batch_heads, call.sq, call.sk, call.d, call.dv, call.causal)


@dataclass
class Group:
    """The calls of one shape on each side."""

    shape: str
    a: list
    b: list

    def _side(self, calls: list) -> dict:
        if not calls:
            return dict.fromkeys(("calls", "kernel", "gpu_us", "tflops", "tbps"))
        mains = sorted({readable_name(m["name"]) for m in (c.main_kernel() for c in calls) if m is not None})
        known = [c.tflops for c in calls if c.tflops is not None]
        moved = [c.tbps for c in calls if c.tbps is not None]
        return {"calls": len(calls), "kernel": ", ".join(mains) or None,
                "gpu_us": mean(c.gpu_us for c in calls),
                "tflops": mean(known) if known else None, "tbps": mean(moved) if moved else None}

    def as_dict(self) -> dict:
        a, b = self._side(self.a), self._side(self.b)
        ratio = b["gpu_us"] / a["gpu_us"] if a["gpu_us"] and b["gpu_us"] else None
        return {"shape": self.shape, "a": a, "b": b, "time_ratio_b_over_a": ratio}


@dataclass
class SideBySide:
    """Two ``kernels.trace.attention.AttentionReport``s and their calls grouped by shape."""

    a: Report
    b: Report
    groups: list[Group]

    @property
    def matched(self) -> list[Group]:
        return [g for g in self.groups if g.a and g.b]

    def as_dict(self) -> dict:
        return {"a": self.a.as_dict(), "b": self.b.as_dict(), "matched": [g.as_dict() for g in self.matched],
                "only_a": [g.as_dict() for g in self.groups if not g.b],
                "only_b": [g.as_dict() for g in self.groups if not g.a]}

    def table(self) -> pd.DataFrame:
        """One row per matched shape, seven columns, each "A / B"."""
        rows = []
        for g in self.matched:
            d = g.as_dict()
            a, b = d["a"], d["b"]
            rows.append({
                "shape": g.shape, "calls (A / B)": f"{a['calls']} / {b['calls']}",
                "kernel (A / B)": f"{a['kernel']} / {b['kernel']}",
                "µs per call (A / B)": f"{a['gpu_us']:.1f} / {b['gpu_us']:.1f}",
                "TFLOP/s (A / B)": _pair(a["tflops"], b["tflops"], "{:.1f}"),
                "TB/s (A / B)": _pair(a["tbps"], b["tbps"], "{:.2f}"),
                "time B ÷ A": "" if d["time_ratio_b_over_a"] is None else f"{d['time_ratio_b_over_a']:.2f}",
            })
        return pd.DataFrame(rows)


def _pair(x: Optional[float], y: Optional[float], fmt: str) -> str:
    return f"{'' if x is None else fmt.format(x)} / {'' if y is None else fmt.format(y)}"


def side_by_side(a, b) -> SideBySide:
    """Both reports' calls, grouped by shape; groups in A's order, then B's own."""
    groups: dict[tuple, Group] = {}
    for side, report in (("a", a), ("b", b)):
        for call in report.calls:
            key = call_shape(call)
            group = groups.setdefault(key, Group(shape_text(call), [], []))
            getattr(group, side).append(call)
    return SideBySide(a, b, list(groups.values()))


__all__ = ["Group", "SideBySide", "call_shape", "shape_text", "side_by_side"]

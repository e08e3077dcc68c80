"""What only chapter 12 (attention in a real model's trace) needs: the short names its tables and
figures give the borrowed traces, what TimeSformer's recorded shapes say about its input, how
many passes its hand-written attention makes over the score tensor, and the page's tables in
the words and units its prose reads them in."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import pandas as pd

from kernels.borrowed import TRACELENS, root
from kernels.trace.breakdown import KIND_LABELS
from kernels.trace.attention import SCORE_GEMMS, AttentionCall, AttentionReport, short_kernel_name
from kernels.trace.links import TraceLinks, links
from matplotlib.figure import Figure
from kernels.trace.reader import Step
from kernels.trace.roof import Roof

# The traces the chapter reads (keys of kernels.borrowed.TRACELENS), by the short name every
# table, figure and sentence of the page uses; the "Traces on this page" box credits each.
SHORT = {"h100_qwen": "H100 Qwen", "mi300x_qwen": "MI300X Qwen", "h100_timesformer": "H100 TimeSformer",
         "mi300x_timesformer": "MI300X TimeSformer", "h100_vit": "H100 ViT", "mi300x_vit": "MI300X ViT",
         "h100_bert": "H100 BERT"}


def attention_shares(reports: Mapping[str, AttentionReport]) -> dict[str, float]:
    """Each report's ``attention_share`` of its step's GPU time, by name (a ValueError for a step
    with no GPU time, which has none)."""
    shares = {}
    for name, report in reports.items():
        share = report.attention_share
        if share is None:
            raise ValueError(f"{name}: the step has no GPU time, so no attention share")
        shares[name] = share
    return shares


def placed_calls(report: AttentionReport) -> list[Roof]:
    """Where each of ``report``'s calls sits under its GPU's roofline (``AttentionCall.roof``); a
    ValueError, with ``AttentionCall.why``'s reasons, for the first call that has no place."""
    roofs = []
    for i, call in enumerate(report.calls):
        found = call.roof()
        if found is None:
            raise ValueError(f"call {i} has no place on the roofline: {call.why() or 'no datasheet peaks for this GPU'}")
        roofs.append(found)
    return roofs


def score_passes(call: AttentionCall, step: Step) -> dict:
    """The passes a hand-written attention call makes over its score tensor ([..., Sq, Sk]): the
    score GEMM writes it, each op between the two GEMMs whose input is score-shaped reads and
    writes it (a scale, a softmax), the value GEMM reads it. Returns those ops in order and the
    ``writes`` and ``reads`` counted."""
    start, wall = call.cpu_start_us, call.cpu_us
    if start is None or wall is None:
        raise ValueError(f"this {call.how} call has no CPU window (found by kernel name): no ops to count passes over")
    ops = step.ops
    inside = ops[(ops["start_us"] >= start) & (ops["start_us"] <= start + wall)]
    launching = set(call.kernels["op"].dropna()) - SCORE_GEMMS
    over_scores = [name for name, dims in zip(inside["name"], inside["input_dims"])
                   if name in launching and dims and isinstance(dims[0], list) and dims[0][-2:] == [call.sq, call.sk]]
    gemms = call.kernels["op"].isin(SCORE_GEMMS).sum()
    if gemms != 2:
        raise ValueError(f"a hand-written call has two GEMMs; this one launched {gemms}")
    return {"between": over_scores, "writes": 1 + len(over_scores), "reads": len(over_scores) + 1}


def largest_kind(shares: pd.DataFrame) -> pd.Series:
    """Each step's largest kind of GPU work other than attention (``breakdown.shares``' rows)."""
    return shares.drop(columns="attention").idxmax(axis=1)


def calls_text(calls: list[AttentionCall]) -> str:
    """Calls of one shape in words: "24 calls, all B·H 256 x 559 x 559 x 64, causal" (a ValueError
    for calls of several shapes, which no one line describes)."""
    shapes = {(c.batch_heads, c.sq, c.sk, c.d, c.causal) for c in calls}
    if len(shapes) != 1:
        raise ValueError(f"{len(shapes)} shapes of call: one line describes one")
    bh, sq, sk, d, causal = shapes.pop()
    return f"{len(calls)} calls, all B·H {bh} x {sq} x {sk} x {d}, {'causal' if causal else 'not causal'}"


def tensors_text(shapes: Optional[Mapping[str, Sequence[int]]]) -> str:
    """An ``AttentionCall.shapes`` dict in words: "q, k, v [1, 8, 512, 64]" when the three agree,
    else each named with its own shape (a ValueError for a call with no recorded shapes)."""
    if shapes is None:
        raise ValueError("the call has no recorded shapes (profile with record_shapes=True)")
    named = {name: list(dims) for name, dims in shapes.items() if name in ("q", "k", "v") and dims is not None}
    if len({str(dims) for dims in named.values()}) == 1:
        return f"{', '.join(named)} {next(iter(named.values()))}"
    return ", ".join(f"{name} {dims}" for name, dims in named.items())


def rest_in_percent(rest: pd.DataFrame) -> pd.DataFrame:
    """``breakdown.rest_by_op``'s table with its words spelled out: ``work`` is the number of
    kernels (and copies, fills) the op launched, ``share`` its % of the step's GPU time, each kind
    under the name the share bars give it."""
    shown = rest.assign(share=(100 * rest["share"]).round(1), kind=rest["kind"].map(KIND_LABELS))
    return shown.rename(columns={"work": "kernels launched", "share": "% of the step"})


def calls_by_shape(table: pd.DataFrame) -> pd.DataFrame:
    """``AttentionReport.table``'s calls grouped by shape, in the order the step first ran each:
    how many calls, the kernels a call launched, the GPU time of them all."""
    return table.groupby("B·H x Sq x Sk x D", sort=False).agg(
        **{"calls": ("#", "size"), "kernels a call": ("kernels", "max"), "GPU µs, all calls": ("GPU µs", "sum")})


def kernels_in_order(call: AttentionCall) -> pd.DataFrame:
    """One call's kernels in launch order: the kernel's short name, the op that launched it, its
    GPU µs."""
    kernels = call.kernels.assign(kernel=call.kernels["name"].map(short_kernel_name))
    return kernels[["kernel", "op", "dur_us"]].rename(columns={"dur_us": "GPU µs"}).reset_index(drop=True)


def shapes_table(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """``AttentionReport.table`` rows of several runs, one block a run, with "?" for a FLOP count
    that is unknown and "none" for GPU time where the run launched no GPU work (a CPU run)."""
    joined = pd.concat(tables)
    if "GFLOP" in joined:
        joined["GFLOP"] = joined["GFLOP"].replace("", "?")
    if "GPU µs" in joined and not (joined["GPU µs"] > 0).any():
        joined["GPU µs"] = "none"
    return joined


def trace_links(short_names: Mapping[str, str], here: Path = Path(".")) -> list[TraceLinks]:
    """Download / Open-in-Perfetto links for borrowed traces (``{TRACELENS key: short name}``): to
    the copy beside the notebook (``data/borrowed/``, which the book publishes) where there is one,
    else to the checkout's or package's own."""
    beside = here / "data" / "borrowed"
    folder = beside if beside.is_dir() else root()
    return [links(folder / TRACELENS[key].file, title=short) for key, short in short_names.items()]


def legend_in_two_columns(fig: Figure) -> Figure:
    """``breakdown.share_bars``' figure with its legend in two columns under the bars, so a
    narrow figure keeps its legend no wider than itself (and legible when a phone shrinks it)."""
    ax = fig.axes[0]
    ax.legend(ncol=2, loc="upper center", bbox_to_anchor=(0.35, -0.2), frameon=False)
    return fig

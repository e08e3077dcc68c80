"""What only chapter 3's page (notebooks/03_sdpa.py) needs, and chapter 3b reuses: SDPA calls read
out of a trace (``recorded_calls``, ``call_step``, ``chain``) and one call's chain drawn
(``chain_figure``), what the page reads off its CPU steps (``mask_build_order``, ``dtype_casts``),
its diff figure without a CPU ranking and with each row's part in the forward, the math backend's
timeline coloured for what the page says (``math_timeline_colours``), its "so far" table, and the
reading of the math backend's GEMMs on a GPU run."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np
import pandas as pd
import torch

from kernels.attention.sdpa import SDPA_OP
from kernels.notebook import lesson
from kernels.registry import Reason
from kernels.trace import fingerprints
from kernels.trace.diff import StepDiff
from kernels.trace.reader import Step


# ---- an SDPA call as a trace recorded it --------------------------------------------------------

# The op each backend runs under ``aten::scaled_dot_product_attention`` (CUDA, ROCm and CPU builds;
# ROCm's flash backend keeps the CUDA op names and launches AMD's kernel below them).
BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention": "sdpa_flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "sdpa_flash",
    "aten::_scaled_dot_product_efficient_attention": "sdpa_efficient",
    "aten::_scaled_dot_product_cudnn_attention": "sdpa_cudnn",
    "aten::_scaled_dot_product_attention_math": "sdpa_math",
}
# Kineto's names for tensor element types
TRACE_DTYPES = {"c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16, "float": torch.float32,
                "double": torch.float64}
# Ops that only re-describe memory inside a view op: left out of a call's chain
_VIEW_INTERNALS = frozenset({"aten::as_strided"})
# Bare allocations: they reserve an output buffer and compute nothing; a reader may drop them
_ALLOCATIONS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided"})


@dataclass(frozen=True)
class RecordedSdpa:
    """One ``aten::scaled_dot_product_attention`` call as the trace recorded its inputs.

    Read from the op's ``Input Dims``, ``Input type`` and ``Concrete Inputs`` (the schema:
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)."""

    row: int                  # the op's row in ``Step.ops``
    q: list
    k: list
    v: list
    dtype: torch.dtype
    attn_mask: Optional[list]  # its dims; None: no mask was passed
    dropout_p: float
    is_causal: bool
    scale: Optional[float]     # None: the default 1/sqrt(head_dim)
    enable_gqa: bool
    backend_op: Optional[str]  # the backend's op nested in it (None: none recorded)

    @property
    def head_dim(self) -> int:
        return int(self.q[-1])

    @property
    def backend(self) -> Optional[str]:
        """The course's name of the backend that ran (``sdpa_flash``...), from its op."""
        return BACKEND_OPS.get(self.backend_op) if self.backend_op else None

    def summary(self) -> dict:
        """What the rules read, as the trace recorded it, for a table."""
        return {"q shape [B, H, S, D]": str(self.q), "dtype": str(self.dtype).replace("torch.", ""),
                "attn_mask": "None" if self.attn_mask is None else str(self.attn_mask),
                "is_causal": self.is_causal, "dropout_p": self.dropout_p,
                "backend op": (self.backend_op or "").removeprefix("aten::") or None, "backend": self.backend}

    def rules_reason(self) -> Reason:
        """Why ``predicted_backend`` cannot answer for this call (None: it can): it models an
        unpinned call with no mask, no dropout, and causal only with Sq == Sk."""
        if self.attn_mask is not None:
            return f"the call passed a mask of shape {self.attn_mask}"
        if self.dropout_p:
            return f"the call used dropout_p={self.dropout_p}"
        if self.is_causal and self.q[-2] != self.k[-2]:
            return f"causal with Sq {self.q[-2]} != Sk {self.k[-2]}"
        return None


def recorded_calls(step: Step) -> list[RecordedSdpa]:
    """Every ``aten::scaled_dot_product_attention`` call of ``step``, with its recorded inputs.

    A ValueError says when the trace did not record the inputs (a profile without
    ``record_shapes=True``, or a torch too old to record scalar values)."""
    ops = step.ops
    found = []
    for row in ops.index[ops["name"] == SDPA_OP]:
        found.append(_read_sdpa(ops, int(row)))
    return found


def _read_sdpa(ops: pd.DataFrame, row: int) -> RecordedSdpa:
    dims, types, values = (ops.at[row, c] for c in ("input_dims", "input_types", "concrete_inputs"))
    if len(dims) < 3 or len(values) < 6 or not types:
        raise ValueError(f"the SDPA call at row {row} has no recorded inputs (Input Dims {dims}, Concrete "
                         f"Inputs {values}): profile with record_shapes=True on a torch that records scalars")
    if types[0] not in TRACE_DTYPES:
        raise ValueError(f"the SDPA call at row {row} has inputs of type {types[0]!r}, not a float type")
    inner = ops.index[(ops["parent"] == row) & ops["name"].isin(list(BACKEND_OPS))]
    mask_dims = dims[3] if len(dims) > 3 and dims[3] else None
    return RecordedSdpa(
        row=row, q=list(dims[0]), k=list(dims[1]), v=list(dims[2]), dtype=TRACE_DTYPES[types[0]],
        attn_mask=mask_dims, dropout_p=float(values[4] or 0.0), is_causal=values[5].strip() == "True",
        scale=float(values[6]) if len(values) > 6 and values[6] not in ("", "None") else None,
        enable_gqa=len(values) > 7 and values[7].strip() == "True",
        backend_op=str(ops.at[int(inner[0]), "name"]) if len(inner) else None)


def call_step(step: Step, call: RecordedSdpa) -> Step:
    """The one call as a step of its own: its ops, and the GPU work launched inside it
    (for a timeline, or ``chain``)."""
    op = step.ops.loc[call.row]
    window = pd.Series({"name": SDPA_OP, "cat": "user_annotation", "pid": op["pid"], "tid": op["tid"],
                       "ts": float(op["ts"]), "dur": float(op["dur_us"]), "args": {}, "end": float(op["end"])})
    return Step(step.trace, SDPA_OP, 0, window)


def chain(call: Step, every_runtime_call: bool = False, indent: bool = False,
          allocations: bool = True) -> pd.DataFrame:
    """The call's nesting, from ``scaled_dot_product_attention`` down to the kernel it launched:
    one row per op (views' own ``as_strided`` left out), per runtime call that launched GPU work
    (``every_runtime_call``: all of them), and per GPU kernel, right under its launch (kernel
    names shortened: no template arguments). ``call`` is a step cut to one call
    (``call_step``). Times in µs from the call's start; a kernel's start is on the GPU's clock
    as the trace aligns it, so it may start after the call has returned. ``indent``: the names,
    indented by one "· " per level, become the index (for display), and ``level`` goes.
    ``allocations=False`` leaves out the bare allocations (``empty`` and its kin) too."""
    from kernels.trace.attention import short_kernel_name

    t0, t1 = float(call.range["ts"]), float(call.range["end"])
    ops = call.ops[~call.ops["name"].isin(_VIEW_INTERNALS)]
    rows = [{"level": 0, "kind": "op", "name": str(call.range["name"]), "starts (µs)": 0.0,
             "takes (µs)": t1 - t0, "order": 0.0}]
    rows += [{"level": int(r.depth) + 1, "kind": "op", "name": r.name, "starts (µs)": r.start_us,
              "takes (µs)": r.dur_us, "order": r.start_us} for r in ops.itertuples()]
    work = call.gpu_work
    spans = call.trace.spans
    runtime = spans[spans["cat"].isin(["cuda_runtime", "cuda_driver"]) & (spans["tid"] == str(call.range["tid"]))
                    & (spans["ts"] >= t0) & (spans["ts"] < t1)]
    for r in runtime.itertuples():
        launched = work[(work["launch_start_us"] - (r.ts - t0)).abs() < 1e-3]
        if launched.empty and not every_runtime_call:
            continue
        level = _level_at(ops, r.ts) + 2
        rows.append({"level": level, "kind": "runtime", "name": r.name, "starts (µs)": r.ts - t0,
                     "takes (µs)": r.dur, "order": r.ts - t0})
        rows += [{"level": level + 1, "kind": "GPU " + k.cat.replace("gpu_", ""), "name": short_kernel_name(k.name),
                  "starts (µs)": k.start_us, "takes (µs)": k.dur_us, "order": r.ts - t0 + 1e-6}
                 for k in launched.itertuples()]
    table = pd.DataFrame(rows).sort_values(["order", "level"], kind="stable").drop(columns="order")
    if not allocations:
        table = table[~table["name"].isin(_ALLOCATIONS)]
    table = table.round({"starts (µs)": 1, "takes (µs)": 1}).reset_index(drop=True)
    if indent:
        names = ["· " * level + name for level, name in zip(table["level"], table["name"])]
        table = table.drop(columns=["level", "name"]).set_axis(pd.Index(names, name="name"))
    return table


def _level_at(ops: pd.DataFrame, ts: float) -> int:
    """The depth of the innermost op running at ``ts`` (-1 if none)."""
    inside = ops[(ops["ts"] <= ts) & (ops["end"] >= ts)]
    return int(inside["depth"].max()) if len(inside) else -1


# ---- what the page reads off a CPU step ------------------------------------------------------------

def mask_build_order(step: Step, seq_q: int, seq_k: int) -> dict:
    """Where the math backend built its causal mask in ``step``: the position (1 = first) of its
    first ``ones``, and of ``tril`` and ``where`` on an [Sq, Sk] tensor, among the step's ops in
    the order they started; None for an op that did not run. Positions, not start times: the
    order is the lesson, and a start time on a busy machine measures everything before it."""
    ops = step.ops.sort_values("start_us", kind="stable").reset_index(drop=True)
    found = {"ones": step.find("aten::ones"), "tril": step.find("aten::tril", [seq_q, seq_k]),
             "where": step.find("aten::where", [seq_q, seq_k])}
    position = {start: i + 1 for i, start in reversed(list(enumerate(ops["start_us"])))}
    return {name: position[float(hits["start_us"].min())] if not hits.empty else None
            for name, hits in found.items()}


def dtype_casts(step: Step) -> dict:
    """The dtype conversions in one math-backend forward of 16-bit inputs (chapter 3): the
    input shapes of every ``copy_`` from a 16-bit dtype into float32 (``upcasts``) and back
    (``downcasts``), and the (input, input) types its ``bmm`` calls ran on. The math
    backend upcasts q, k and v by default (``allow_fp16_bf16_reduction_math_sdp`` turns that
    off), multiplies in float32 and converts its outputs back. The matmul types read
    "float32 × float32" (one entry per distinct pair, comma-separated)."""
    copies = step.find("aten::copy_")
    sixteen = {"c10::BFloat16", "c10::Half"}
    types = [t[:2] for t in copies["input_types"]]
    dims = [d[0] for d in copies["input_dims"]]
    return {"upcasts": [d for t, d in zip(types, dims) if t[0] == "float" and t[1] in sixteen],
            "downcasts": [d for t, d in zip(types, dims) if t[0] in sixteen and t[1] == "float"],
            "matmul input types": ", ".join(sorted({" × ".join(_dtype_name(x) for x in t[:2])
                                                     for t in step.find("aten::bmm")["input_types"]}))}


def _dtype_name(trace_type: str) -> str:
    """A Kineto element type as torch names it (``c10::BFloat16`` -> ``bfloat16``)."""
    known = TRACE_DTYPES.get(trace_type)
    return str(known).removeprefix("torch.") if known is not None else trace_type


# ---- the page's figure and tables ----------------------------------------------------------------

def without_matched_times(fig, changes: StepDiff, seq: Optional[int] = None):
    """``changes.figure()`` as chapter 3 shows it: its axis label without the two steps' summed
    self times of the matched rows (one profile each on a shared CPU, where run-to-run noise is
    larger than the difference between the two forwards, so they must not read as a ranking),
    and each row labelled with what it does in the forward (``diff_row_label``; ``seq`` tells
    the S×S tensors apart). Drawn 7 in wide with larger text, so a phone shows it legibly.
    Returns ``fig``."""
    ax = fig.axes[0]
    first_line = ax.get_xlabel().split("\n")[0]
    rest = pd.concat([changes.ops, changes.gpu_work])
    matched = int((~rest["substance"]).sum())
    changed = changes.changed()
    shown = changed.head(len(ax.get_yticks()))
    left_out = changed.iloc[len(shown):]
    names = list(dict.fromkeys(n.removeprefix("aten::") for n in left_out["name"]))
    more = (f";\n{len(left_out)} more changed rows not drawn ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
            if len(left_out) else "")
    ax.set_xlabel(f"{first_line}\neverything else: {matched} matched rows with the same counts and bytes{more}")
    ax.set_yticks(ax.get_yticks(), [diff_row_label(r, seq) for r in shown.itertuples()])
    fig.set_size_inches(7, 0.58 * max(len(ax.get_yticks()), 1) + 2.0)
    for text in [*ax.get_yticklabels(), *ax.get_xticklabels(), ax.xaxis.label, ax.title, *ax.get_legend().get_texts()]:
        text.set_fontsize(13)
    # The title sits above the legend's row: its pad grows with the legend's larger text.
    ax.set_title(ax.get_title(loc="left"), loc="left", pad=2.6 * 13, fontsize=13)
    return fig


def diff_row_label(row, seq: Optional[int] = None) -> str:
    """A diff row's label: the op, its largest input shape (no scalars), the count change, the
    bytes it allocates in KiB or MiB, and, for the ops that differ between chapter 2's in-place
    module and the math backend, the part of attention it does."""
    shapes = [tuple(int(x) for x in part.split(",") if x.strip()) for part in re.findall(r"\(([^()]*)\)", row.shapes)]
    shapes = [s for s in shapes if s]
    largest = max(shapes, key=lambda s: (torch.Size(s).numel(), len(s)), default=None)
    name = row.name.removeprefix("aten::")
    counts = f"{row.count_a} → {row.count_b}" + (f", {_bytes(row.alloc_bytes_change)}" if row.alloc_bytes_change else "")
    role = _role(name, largest, seq)
    return f"{name} {largest if largest else ''}".rstrip() + f"\n{counts}" + (f" · {role}" if role else "")


def _bytes(n: int) -> str:
    return f"{n / 2**10:+.0f} KiB" if abs(n) < 2**20 else f"{n / 2**20:+.3g} MiB"


def _role(name: str, shape: Optional[tuple], seq: Optional[int]) -> str:
    """What an op that differs between the two forwards does (by its name and shape)."""
    square = shape is not None and seq is not None and shape[-2:] == (seq, seq)
    if name == "masked_fill_":
        return "cached mask"
    if name == "mul":
        return "scale scores" if square else "scale q or k"
    if name in ("ones", "tril") or (name in ("where", "fill_") and shape is not None and len(shape) == 2):
        return "build mask"
    if name == "add_":
        return "add mask"
    if name in ("isneginf", "all", "where", "fill_"):
        return "NaN guard"
    if name == "_scaled_dot_product_attention_math":
        return "backend op"
    return ""


# ---- Fig. 7: one SDPA call's chain, drawn from ``chain`` -------------------------------------------

# A bar's colour says its role in the chain; the legend lists only the roles drawn.
CHAIN_ROLES = {"SDPA call": "#8c8c8c", "flash backend (op or kernel)": "#9467bd", "view or allocation": "#c7c7c7",
               "fill (op or kernel)": "#ff7f0e", "launch (CPU runtime call)": "#17becf"}
CHAIN_LANES = ("call", "backend op", "in backend", "in forward", "launch", "GPU")
_VIEWS_AND_ALLOCATIONS = frozenset({"transpose", "permute", "view", "as_strided", "empty", "empty_like",
                                    "empty_strided"})


def _chain_role(row, launched_by: Optional[str]) -> str:
    name = row["name"].removeprefix("aten::")
    if row["kind"] == "runtime":
        return "launch (CPU runtime call)"
    if row["kind"].startswith("GPU"):
        return "fill (op or kernel)" if launched_by in ("fill_", "zero_", "zeros") else "flash backend (op or kernel)"
    if row["level"] == 0:
        return "SDPA call"
    if name in _VIEWS_AND_ALLOCATIONS:
        return "view or allocation"
    if name in ("zeros", "zero_", "fill_"):
        return "fill (op or kernel)"
    return "flash backend (op or kernel)"


def _chain_lane(row) -> Optional[int]:
    """The figure's row for a chain row: ops of levels 0 to 3 (deeper ones sit inside a level-3
    op), every launch, every kernel."""
    if row["kind"] == "runtime":
        return 4
    if row["kind"].startswith("GPU"):
        return 5
    return int(row["level"]) if row["level"] <= 3 else None


def chain_figure(calls: Mapping[str, Step], width_in: float = 6.0):
    """Fig. 7: one panel per SDPA call (``call_step``) drawn from its ``chain``: the call, the
    backend op, the ops inside them, each launch (a CPU runtime call) and the kernel it queued,
    with a line from the launch to the kernel. Short names; a bar is named where its name fits
    inside it or beside it (inside it a size smaller, if only that fits). Returns the Figure."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(width_in, 3.3 * len(calls) + 0.6))
    axes = fig.subplots(len(calls), 1, squeeze=False)[:, 0]
    drawn: set = set()
    for ax, (title, call) in zip(axes, calls.items()):
        drawn |= _draw_chain(ax, chain(call), title)
    handles = [Patch(color=c, label=r) for r, c in CHAIN_ROLES.items() if r in drawn]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=12.5, frameon=False,
               handlelength=1.2, columnspacing=1.0)
    fig.tight_layout(rect=(0, 0.11, 1, 1))
    return fig


def _draw_chain(ax, table: pd.DataFrame, title: str) -> set:
    span = float((table["starts (µs)"] + table["takes (µs)"]).max()) * 1.02
    ax.set_xlim(0, span)
    ax.set_ylim(len(CHAIN_LANES) - 0.5, -0.5)
    ax.set_yticks(range(len(CHAIN_LANES)), CHAIN_LANES, fontsize=13)
    ax.tick_params(axis="x", labelsize=12.5)
    ax.set_xlabel("µs since the call began", fontsize=13)
    ax.set_title(title, fontsize=13.5, loc="left")
    ax.grid(axis="x", alpha=0.3)
    roles, bars, launch_at = set(), [], None
    ops = table[table["kind"] == "op"]
    for _, row in table.iterrows():
        if row["kind"] == "runtime":
            launch_at = (row["starts (µs)"] + row["takes (µs)"] / 2, _op_at(ops, row["starts (µs)"]))
        lane = _chain_lane(row)
        if lane is None:
            continue
        role = _chain_role(row, launch_at[1] if launch_at and row["kind"].startswith("GPU") else None)
        roles.add(role)
        start, dur = float(row["starts (µs)"]), max(float(row["takes (µs)"]), span * 0.004)
        ax.broken_barh([(start, dur)], (lane - 0.38, 0.76), facecolors=CHAIN_ROLES[role], edgecolors="white",
                       linewidth=0.4)
        bars.append((lane, start, start + dur, _short(row)))
        if row["kind"].startswith("GPU") and launch_at:
            ax.plot([launch_at[0], start], [4.38, lane - 0.38], color="#555555", linewidth=0.8, zorder=0)
    _name_bars(ax, bars, span)
    return roles


def _op_at(ops: pd.DataFrame, at_us: float) -> Optional[str]:
    """The innermost op running at ``at_us`` (a launch's start): the op that launched."""
    inside = ops[(ops["starts (µs)"] <= at_us) & (ops["starts (µs)"] + ops["takes (µs)"] >= at_us)]
    return str(inside.sort_values("level")["name"].iloc[-1]).removeprefix("aten::") if len(inside) else None


def _short(row) -> tuple:
    """A bar's names, longest first: the first that fits is written."""
    name = row["name"].removeprefix("aten::")
    if row["kind"] == "runtime":
        return ("launch",)
    if row["kind"].startswith("GPU"):
        return (name.split("::")[-1],)
    if row["level"] == 0:
        return (name, "SDPA call")
    return (name, name.removeprefix("_scaled_dot_product_"), name.removeprefix("_flash_attention_"))


def _name_bars(ax, bars: list, span: float, fontsize: float = 12.5) -> None:
    """Write each bar's name inside it where it fits, else in the free room right or left of it
    in its lane; a name with no room is left out (the legend's colour still says the role)."""
    fig = ax.figure
    fig.canvas.draw()   # axes extents in pixels
    box = ax.get_window_extent()
    px_per_us = box.width / span
    char_px = 0.62 * fontsize * fig.dpi / 72
    by_lane: dict = {}
    for lane, x0, x1, text in bars:
        by_lane.setdefault(lane, []).append((x0, x1, text))
    for lane, row in by_lane.items():
        row.sort()
        for i, (x0, x1, names) in enumerate(row):
            left = row[i - 1][1] if i else 0.0
            right = row[i + 1][0] if i + 1 < len(row) else span
            room = max(x1 - x0, right - x1, x0 - left)
            text = next((n for n in names if (len(n) + 1) * char_px / px_per_us <= room), names[-1])
            need = (len(text) + 1) * char_px / px_per_us
            if x1 - x0 >= need:
                ax.text((x0 + x1) / 2, lane, text, ha="center", va="center", color="white", fontsize=fontsize)
            elif right - x1 >= need:
                ax.text(x1 + need * 0.04, lane, text, ha="left", va="center", color="#333333", fontsize=fontsize)
            elif x0 - left >= need:
                ax.text(x0 - need * 0.04, lane, text, ha="right", va="center", color="#333333", fontsize=fontsize)
            elif x1 - x0 >= need * 0.85:   # a bar just too short for its name: the name a size smaller
                ax.text((x0 + x1) / 2, lane, text, ha="center", va="center", color="white", fontsize=fontsize * 0.85)


# ---- Fig. 9: the math backend's timeline, coloured for what chapter 3 says -----------------------

SDPA_CALL_COLOUR = "#4f5b66"   # the SDPA call and the math backend's op: a wrapper, not fused attention
SOFTMAX_COLOUR = "#2ca02c"     # timeline's softmax colour, here for _safe_softmax and its NaN guards


def math_timeline_colours(fig, step: Step):
    """Recolour ``timeline.timeline(step)`` of one math-backend forward: the SDPA call and
    ``_scaled_dot_product_attention_math`` (purple "fused attention" by the timeline's name rule)
    get a colour of their own, "SDPA call (not fused)", and every op inside ``_safe_softmax``
    (its ``where``, ``isneginf``, ``all``: the NaN guard) the softmax's green. Text grows for a
    phone. Returns ``fig``."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_hex
    from matplotlib.patches import Patch

    from kernels.trace import timeline

    ax = fig.axes[0]
    ops = step.ops[~step.ops["is_view"]]
    lane = {track: i for i, track in enumerate(timeline.tracks(step))}
    wrappers = ops.index[ops["name"].isin([SDPA_OP, "aten::_scaled_dot_product_attention_math"])]
    guarded = _subtree(step.ops, step.ops.index[step.ops["name"] == "aten::_safe_softmax"])
    wanted = {(lane[("cpu", r.pid, r.tid, r.depth)], round(r.start_us / 1e3, 3)): colour
              for colour, rows in ((SDPA_CALL_COLOUR, wrappers), (SOFTMAX_COLOUR, ops.index.intersection(guarded)))
              for r in ops.loc[rows].itertuples()}
    for bars in (c for c in ax.collections if isinstance(c, PolyCollection)):
        faces = [to_hex(c) for c in np.asarray(bars.get_facecolor())]
        faces = faces * len(bars.get_paths()) if len(faces) == 1 else faces
        for i, path in enumerate(bars.get_paths()):
            corners = np.asarray(path.vertices, dtype=float)
            key = (round(float(corners[:, 1].mean())), round(float(corners[:, 0].min()), 3))
            faces[i] = wanted.get(key, faces[i])
        bars.set_facecolor(faces)
    shown = {to_hex(c) for b in ax.collections if isinstance(b, PolyCollection) for c in np.asarray(b.get_facecolor())}
    names = dict(timeline.LEGEND, **{"softmax + NaN guard": SOFTMAX_COLOUR, "SDPA call (not fused)": SDPA_CALL_COLOUR})
    names.pop("softmax")
    handles = [Patch(color=c, label=label) for label, c in names.items() if c in shown]
    ax.get_legend().remove()
    fig.set_size_inches(5.6, fig.get_figheight() + 0.9)   # narrow: a phone scales it less, its text stays legible
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=13, frameon=False,
              borderaxespad=0.2, handlelength=1.2, columnspacing=1.0)
    title = ax.get_title()
    ax.set_title("")
    ax.set_title(title, pad=80, loc="left", fontsize=13.5)
    ax.set_yticks(ax.get_yticks(), [t.get_text().replace("CPU depth", "depth") for t in ax.get_yticklabels()])
    for text in [*ax.get_yticklabels(), *ax.get_xticklabels(), ax.xaxis.label]:
        text.set_fontsize(13)
    for name in fig.findobj(timeline.BarLabel):   # each refits its bar when drawn
        name.set_fontsize(12)
    fig.tight_layout()
    return fig


def _subtree(ops: pd.DataFrame, roots) -> set:
    """The rows of ``roots`` and of every op nested below them."""
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = set(ops.index[ops["parent"].isin(frontier)]) - found
        found |= frontier
    return found


def so_far(steps: Mapping[str, Step], work_ops: Mapping[str, int], device: torch.device) -> pd.DataFrame:
    """One row per variant: ops per forward, ops doing work, peak memory; on a GPU run also the
    kernels and their GPU time."""
    rows = {}
    for name, step in steps.items():
        summary = step.summary()
        row = {"ops": summary["ops"], "ops doing work": work_ops[name], "peak (MiB)": summary["peak_MiB"]}
        if device.type == "cuda":
            row.update({"kernels": summary["kernels"], "GPU time (ms)": summary["gpu_time_ms"]})
        rows[name] = row
    return pd.DataFrame(rows).T.rename_axis("variant").astype({"ops": int, "ops doing work": int})


def math_gemms_not_16bit(step: Step, source: str) -> pd.DataFrame:
    """Chapter 3 on a GPU run (``source`` names it): no GEMM the math backend launched runs in 16
    bits, read from the kernel names. Returns each kernel's name (cut to 70 characters), kind,
    tensor-core use and dtype."""
    fps = fingerprints.classify_many(step.gpu_work["name"])
    gemm_dtypes = set(fps.loc[fps["kind"] == "gemm", "dtype"])
    lesson(bool(gemm_dtypes) and not gemm_dtypes & {"bf16", "fp16"},
           "no GEMM of the math backend runs in 16 bits on the GPU track",
           f"GEMM dtypes from the names: {gemm_dtypes}, {source}")
    return fps[["name", "kind", "tensor_cores", "dtype"]].assign(name=fps["name"].str.slice(0, 70))

"""What only chapter 3's page (notebooks/03_sdpa.py) needs, and chapter 3b reuses: SDPA calls read
out of a trace (``recorded_calls``, ``call_step``, ``chain``), what the page reads off its CPU
steps (``mask_build_order``, ``dtype_casts``), its diff figure without a CPU ranking, its "so far"
table, and the reading of the math backend's GEMMs on a GPU run."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

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
                "is_causal": self.is_causal, "dropout_p": self.dropout_p, "backend op": self.backend_op,
                "backend": self.backend}

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
    (``downcasts``), and the set of (input, input) types its ``bmm`` calls ran on. The math
    backend upcasts q, k and v by default (``allow_fp16_bf16_reduction_math_sdp`` turns that
    off), multiplies in float32 and converts its outputs back."""
    copies = step.find("aten::copy_")
    sixteen = {"c10::BFloat16", "c10::Half"}
    types = [t[:2] for t in copies["input_types"]]
    dims = [d[0] for d in copies["input_dims"]]
    return {"upcasts": [d for t, d in zip(types, dims) if t[0] == "float" and t[1] in sixteen],
            "downcasts": [d for t, d in zip(types, dims) if t[0] in sixteen and t[1] == "float"],
            "matmul input types": {tuple(t[:2]) for t in step.find("aten::bmm")["input_types"]}}


# ---- the page's figure and tables ----------------------------------------------------------------

def without_matched_times(fig, changes: StepDiff):
    """``changes.figure()``'s axis label without the two steps' summed self times of the matched
    rows: those sums come from one profile each on a shared CPU, where run-to-run noise is larger
    than the difference between the two forwards, so they must not read as a ranking. Returns
    ``fig``."""
    ax = fig.axes[0]
    first_line = ax.get_xlabel().split("\n")[0]
    rest = pd.concat([changes.ops, changes.gpu_work])
    matched = int((~rest["substance"]).sum())
    ax.set_xlabel(f"{first_line}\neverything else: {matched} matched rows with the same counts and bytes")
    # The book's widest figure, legible on a phone; rows packed closer than diff's default (two
    # label lines need less than its 0.7 in), so the page does not scroll past empty space.
    fig.set_size_inches(9, 0.42 * max(len(ax.get_yticks()), 1) + 1.8)
    return fig


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

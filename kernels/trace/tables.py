"""A traced step for display: the tables the chapters show of a ``kernels.trace.reader.Step``.

``kernels.trace.reader`` reads a trace into a ``Step``'s raw columns; these turn them into what
a page shows:

* ``op_table(step)``: the ops in call order, one ``NESTING`` marker per level of nesting
  (readable in any HTML), with their input shapes, time and allocations;
* ``kernel_table(step)``: the GPU work, with each kernel's launch footprint and stream;
* ``copy_table(step)``: every ``aten::copy_``, who called it, the shape as the prose writes
  it (``shape_text``) and its size in one unit;
* ``counts(steps)``: one row per step, so a reader sees every step looks alike;
* ``gpu_gaps(step)`` and ``gpu_summary(step)``: where each GPU stream sat idle between two
  pieces of work, and whether the CPU had launched the next one yet;
* ``runtime_table(step)``: the CUDA/HIP runtime calls on the CPU, by name, with the GPU work
  each kind launched;
* ``copy_groups(step)``: the step's copies grouped by where they come from (op, shape, type,
  the Python call and frame, the ``nn.Module``), largest total first;
* ``work_table(kernels)``: rows of GPU work (a step's, or one attention call's) by short name;
* ``score_tensor(call)``: a hand-written attention call's S×S score tensor, shape, type and bytes,
  from the shapes the trace recorded.
"""
from __future__ import annotations

import re
from typing import Optional

import pandas as pd

from kernels.trace.attention import AttentionCall, dims_text, short_kernel_name
from kernels.trace.events import tensor_bytes
from kernels.trace.reader import Step


# One per level of nesting in op_table: a visible dot and a no-break space, so the depth reads
# in any HTML (leading spaces collapse, and Jupyter right-aligns table cells).
NESTING = "·\u00a0"


def shape_text(dims) -> str:
    """A tensor shape as the prose writes it: ``1×8×512×512``; ``scalar`` for a 0-d tensor."""
    return "×".join(str(d) for d in dims) if dims else "scalar"


def _size_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1


# The tables' time column: a span's duration in the trace, in microseconds.
TIME = "time (µs)"
# What the size column says of a copy whose trace recorded no shape or type (torch 1.8's format).
UNKNOWN_SIZE = "unknown (no type recorded)"


def copy_table(step: Step, min_bytes: int = 1, times: bool = True) -> pd.DataFrame:
    """The step's ``aten::copy_`` calls for display (``Step.copies`` holds the raw columns):
    the op that called each, what it copied (shape, dtype) and its size in the unit of the
    largest copy. A size too small to show in that unit reads ``< 0.01``. ``times=False``
    leaves out the time column (``op_table``)."""
    c = step.copies(min_bytes)
    known = [b for b in c["bytes"] if b is not None]
    unit, scale = _size_unit(float(max(known)) if known else 0.0)
    sizes = [UNKNOWN_SIZE if b is None else f"{b / scale:,.2f}" if unit != "bytes" else f"{b:,d}"
             for b in c["bytes"]]
    sizes = ["< 0.01" if b and text == "0.00" else text for b, text in zip(c["bytes"], sizes)]
    table = pd.DataFrame({
        "op": c["name"].values,
        "called from": [n if n else "(your code)" for n in c["called_from"]],
        "shape": [shape_text(d[0] if d else []) for d in c["input_dims"]],
        "dtype": [t[0] if t else "" for t in c["input_types"]],
        f"size ({unit})": sizes,
        TIME: c["dur_us"].round(1).values,
    })
    return table if times else table.drop(columns=TIME)


def op_table(step: Step, views: bool = False, max_depth: Optional[int] = None, times: bool = True) -> pd.DataFrame:
    """The step's ops in call order, one ``NESTING`` marker (``· ``) per level below the top,
    for display. When ops of threads other than the label's ran in the step (a training
    step's backward), a ``thread`` column says whose. ``times=False`` leaves out the time
    column: one profiled step's times are one sample each, profiler included, not a result."""
    ops = step.ops if views else step.ops[~step.ops["is_view"]]
    if max_depth is not None:
        ops = ops[ops["depth"] <= max_depth]
    table = pd.DataFrame({
        "op": [NESTING * d + n for d, n in zip(ops["depth"], ops["name"])],
        "input shapes": [" ".join(str(tuple(x)) for x in dims if x) for dims in ops["input_dims"]],
        TIME: ops["dur_us"].round(1),
        "allocated (KiB, incl. children)": (ops["alloc_bytes"] / 1024).round(1),
    })
    if not times:
        table = table.drop(columns=TIME)
    if (step.ops["tid"] != step.thread[1]).any():
        table.insert(0, "thread", ops["tid"].values)
    return table.reset_index(drop=True)


def kernel_table(step: Step) -> pd.DataFrame:
    """The step's GPU work in order, with each kernel's launch footprint and its stream."""
    k = step.gpu_work
    return pd.DataFrame({
        "kernel": k["name"].str.slice(0, 80), TIME: k["dur_us"].round(1), "launched by": k["op"],
        "grid": k["grid"], "block": k["block"], "regs/thread": k["registers_per_thread"],
        "smem (B)": k["shared_memory"], "est. occupancy %": k["occupancy_pct"], "stream": k["stream"],
    })


def counts(steps: list[Step]) -> pd.DataFrame:
    """Per step: how many ops (and kernels), so a reader can see every step looks alike."""
    return pd.DataFrame([{"step": s.index, **{k: v for k, v in s.summary().items() if k != "label"}}
                         for s in steps]).set_index("step")


def gpu_gaps(step: Step) -> pd.DataFrame:
    """Every stretch a GPU stream sat idle between two pieces of the step's work, in order: the
    work before and after it, the gap (µs), and ``cpu_late``: whether the launch of the work
    after it began only after the work before it had ended, i.e. the GPU waited for the CPU to
    ask (a launch-bound gap), rather than for a dependency."""
    k = step.gpu_work
    rows = []
    for (device, stream), work in k.groupby(["device", "stream"], sort=False):
        ends = (work["start_us"] + work["dur_us"]).tolist()
        starts, launches, names = work["start_us"].tolist(), work["launch_start_us"].tolist(), work["name"].tolist()
        busy_until = ends[0]
        for i in range(1, len(work)):
            if starts[i] > busy_until:
                rows.append({"device": device, "stream": stream, "after": short_kernel_name(names[i - 1]),
                             "before": short_kernel_name(names[i]), "gap_us": starts[i] - busy_until,
                             "cpu_late": launches[i] >= busy_until})
            busy_until = max(busy_until, ends[i])
    return pd.DataFrame(rows, columns=["device", "stream", "after", "before", "gap_us", "cpu_late"])


def gpu_summary(step: Step) -> dict:
    """The step's GPU work in numbers: kernels, copies/memsets, GPU busy time (µs, summed over
    streams), the step's CPU time, the span from the first work's start to the last one's end,
    the idle gaps inside it and how many of them the CPU was late for, and the median time from
    a launch call's start to its work's start on the GPU."""
    k = step.gpu_work
    if k.empty:
        raise ValueError(f"{step.label}: no GPU work in this step (a CPU-only trace?)")
    gaps = gpu_gaps(step)
    return {
        "kernels": int((k["cat"] == "kernel").sum()),
        "copies and memsets": int(k["cat"].isin(["gpu_memcpy", "gpu_memset"]).sum()),
        "streams": int(k[["device", "stream"]].drop_duplicates().shape[0]),
        "gpu_busy_us": step.gpu_time_us,
        "step_us": step.cpu_time_us,
        "gpu_span_us": float((k["start_us"] + k["dur_us"]).max() - k["start_us"].min()),
        "gaps": len(gaps),
        "idle_us": float(gaps["gap_us"].sum()),
        "median_gap_us": float(gaps["gap_us"].median()) if len(gaps) else 0.0,
        "cpu_late_gaps": int(gaps["cpu_late"].sum()),
        "median_launch_to_start_us": float((k["start_us"] - k["launch_start_us"]).median()),
    }


def runtime_table(step: Step) -> pd.DataFrame:
    """The runtime and driver calls of the step by name, most CPU time first: how many, their
    CPU time, how many pieces of GPU work calls of that name launched, and the ops they were
    made in."""
    calls = step.runtime_calls
    launched = step.gpu_work["launcher"].value_counts()
    rows = []
    for name, group in calls.groupby("name", sort=False):
        ops = group["op"].dropna().value_counts()
        rows.append({"call": name, "calls": len(group), "CPU µs": round(float(group["dur_us"].sum()), 1),
                     "GPU work launched": int(launched.get(name, 0)),
                     "made in": ", ".join(o.removeprefix("aten::") for o in ops.index[:3]) + (" ..." if len(ops) > 3 else "")})
    table = pd.DataFrame(rows, columns=["call", "calls", "CPU µs", "GPU work launched", "made in"])
    return table.sort_values("CPU µs", ascending=False, kind="stable").reset_index(drop=True)


def work_table(kernels: pd.DataFrame) -> pd.DataFrame:
    """Rows of GPU work (``Step.gpu_work``, or an ``AttentionCall.kernels``) in GPU order, by short
    name: the op that launched each, its time, its start after the first one's, and its grid."""
    t0 = float(kernels["start_us"].min()) if len(kernels) else 0.0
    return pd.DataFrame({
        "kernel": [short_kernel_name(n) for n in kernels["name"]],
        "launched by": kernels["op"].values,
        "time (µs)": kernels["dur_us"].round(1).values,
        "starts at (µs)": (kernels["start_us"] - t0).round(1).values,
        "grid": [dims_text(grid) for grid in kernels["grid"]],
    })


# Kineto's element type for the short names AttentionCall.dtype uses.
KINETO_TYPES = {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp32": "float", "fp64": "double"}


def score_tensor(call: AttentionCall) -> dict:
    """A hand-written attention call's score tensor (the softmax's input, S×S per head): its
    shape and element type as the trace recorded them, and its bytes."""
    if call.how != "hand-written" or not call.shapes or "softmax" not in call.shapes:
        raise ValueError(f"a {call.how} call has no score tensor of its own in the trace: only a hand-written "
                         "attention core materialises one")
    if call.dtype not in KINETO_TYPES:
        raise ValueError(f"the call's element type was not recorded as a float type (dtype {call.dtype!r})")
    shape = list(call.shapes["softmax"])
    return {"shape": shape, "dtype": call.dtype, "bytes": tensor_bytes(shape, KINETO_TYPES[call.dtype])}


def python_call(frame: str) -> str:
    """A Python stack entry as the prose names it: ``<built-in method contiguous of Tensor object
    at 0x7d...>`` reads ``Tensor.contiguous``, ``<built-in function linear>`` reads ``linear``, a
    frame ``path/file.py(18): name`` stays as it is."""
    method = re.match(r"<built-in method (\w+) of (\w+) object", frame)
    if method:
        return f"{method.group(2)}.{method.group(1)}"
    function = re.match(r"<built-in function (\w+)>", frame)
    return function.group(1) if function else frame


def where_from(stack: list[str]) -> dict:
    """From a Python stack (``Step.python_stack``): the innermost built-in call, the innermost
    Python frame and the innermost ``nn.Module`` (its instance number dropped); "" for what the
    stack does not hold."""
    builtins = [f for f in stack if f.startswith("<built-in")]
    frames = [f for f in stack if re.match(r".+\.py\(\d+\): ", f)]
    modules = [f[len("nn.Module: "):] for f in stack if f.startswith("nn.Module: ")]
    return {"call": python_call(builtins[-1]) if builtins else "", "frame": frames[-1] if frames else "",
            "module": re.sub(r"_\d+$", "", modules[-1]) if modules else ""}


def copy_groups(step: Step) -> pd.DataFrame:
    """The step's ``aten::copy_`` calls grouped by where they come from: the op that made each
    (``clone``, ``_to_copy``...), what it copied (shape, type), and, where the trace recorded
    Python stacks and modules, the Python call, frame and ``nn.Module`` around it. One row per
    group, largest total first: count, size of one (MiB), total (MiB), and the GPU time of the
    work they launched (0 on a CPU-only step)."""
    c = step.copies()
    if c.empty:
        return pd.DataFrame(columns=["made by", "shape", "dtype", "call", "frame", "module", "count",
                                     "MiB each", "MiB total", "GPU µs"])
    # the op that asked for the copy: the copy_'s parent (clone, _to_copy), with that op's stack
    asker = [p if p >= 0 else i for i, p in zip(c.index, c["parent"])]
    origin = pd.DataFrame([where_from(step.python_stack(a)) for a in asker], index=c.index)
    rows = pd.DataFrame({
        "made by": [n.removeprefix("aten::") if n else "(your code)" for n in c["called_from"]],
        "shape": [shape_text(d[0] if d else []) for d in c["input_dims"]],
        "dtype": [t[0] if t else "" for t in c["input_types"]],
        **{k: origin[k] for k in ("call", "frame", "module")},
        "bytes": [b if b is not None else 0 for b in c["bytes"]],
        "gpu_us": [_gpu_us_launched(step, r) for _, r in c.iterrows()],
    })
    keys = ["made by", "shape", "dtype", "call", "frame", "module"]
    grouped = rows.groupby(keys, sort=False)
    table = grouped["bytes"].agg(["count", "first", "sum"]).reset_index()
    table["MiB each"] = (table["first"] / 2**20).round(2)
    table["MiB total"] = (table["sum"] / 2**20).round(1)
    table["GPU µs"] = grouped["gpu_us"].sum().round(1).values
    return table.sort_values("sum", ascending=False, kind="stable").drop(columns=["first", "sum"]).reset_index(drop=True)


def _gpu_us_launched(step: Step, op: pd.Series) -> float:
    """GPU time of the work launched from inside one op (on its thread): 0 on a CPU-only step."""
    k = step.gpu_work
    inside = (k["thread"] == op["tid"]) & (k["launch_start_us"] >= op["start_us"]) & \
        (k["launch_start_us"] <= op["start_us"] + op["dur_us"])
    return float(k.loc[inside, "dur_us"].sum())

"""A traced step for display: the tables the chapters show of a ``kernels.trace.reader.Step``.

``kernels.trace.reader`` reads a trace into a ``Step``'s raw columns; these turn them into what
a page shows:

* ``op_table(step)``: the ops in call order, one ``NESTING`` marker per level of nesting
  (readable in any HTML), with their input shapes, time and allocations;
* ``kernel_table(step)``: the GPU work, with each kernel's launch footprint and stream;
* ``copy_table(step)``: every ``aten::copy_``, who called it, the shape as the prose writes
  it (``shape_text``) and its size in one unit;
* ``counts(steps)``: one row per step, so a reader sees every step looks alike.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd

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


# What the size column says of a copy whose trace recorded no shape or type (torch 1.8's format).
UNKNOWN_SIZE = "unknown (no type recorded)"


def copy_table(step: Step, min_bytes: int = 1) -> pd.DataFrame:
    """The step's ``aten::copy_`` calls for display (``Step.copies`` holds the raw columns):
    the op that called each, what it copied (shape, dtype) and its size in the unit of the
    largest copy. A size too small to show in that unit reads ``< 0.01``."""
    c = step.copies(min_bytes)
    known = [b for b in c["bytes"] if b is not None]
    unit, scale = _size_unit(float(max(known)) if known else 0.0)
    sizes = [UNKNOWN_SIZE if b is None else f"{b / scale:,.2f}" if unit != "bytes" else f"{b:,d}"
             for b in c["bytes"]]
    sizes = ["< 0.01" if b and text == "0.00" else text for b, text in zip(c["bytes"], sizes)]
    return pd.DataFrame({
        "op": c["name"].values,
        "called from": [n if n else "(your code)" for n in c["called_from"]],
        "shape": [shape_text(d[0] if d else []) for d in c["input_dims"]],
        "dtype": [t[0] if t else "" for t in c["input_types"]],
        f"size ({unit})": sizes,
        "time (us)": c["dur_us"].round(1).values,
    })


def op_table(step: Step, views: bool = False, max_depth: Optional[int] = None) -> pd.DataFrame:
    """The step's ops in call order, one ``NESTING`` marker (``· ``) per level below the top,
    for display. When ops of threads other than the label's ran in the step (a training
    step's backward), a ``thread`` column says whose."""
    ops = step.ops if views else step.ops[~step.ops["is_view"]]
    if max_depth is not None:
        ops = ops[ops["depth"] <= max_depth]
    table = pd.DataFrame({
        "op": [NESTING * d + n for d, n in zip(ops["depth"], ops["name"])],
        "input shapes": [" ".join(str(tuple(x)) for x in dims if x) for dims in ops["input_dims"]],
        "time (us)": ops["dur_us"].round(1),
        "allocated (KiB, incl. children)": (ops["alloc_bytes"] / 1024).round(1),
    })
    if (step.ops["tid"] != step.thread[1]).any():
        table.insert(0, "thread", ops["tid"].values)
    return table.reset_index(drop=True)


def kernel_table(step: Step) -> pd.DataFrame:
    """The step's GPU work in order, with each kernel's launch footprint and its stream."""
    k = step.gpu_work
    return pd.DataFrame({
        "kernel": k["name"].str.slice(0, 80), "time (us)": k["dur_us"].round(1), "launched by": k["op"],
        "grid": k["grid"], "block": k["block"], "regs/thread": k["registers_per_thread"],
        "smem (B)": k["shared_memory"], "est. occupancy %": k["occupancy_pct"], "stream": k["stream"],
    })


def counts(steps: list[Step]) -> pd.DataFrame:
    """Per step: how many ops (and kernels), so a reader can see every step looks alike."""
    return pd.DataFrame([{"step": s.index, **{k: v for k, v in s.summary().items() if k != "label"}}
                         for s in steps]).set_index("step")

"""A ``Step``: one labelled range of a trace, its CPU ops, GPU work and memory; ``median_step``.

``kernels.trace.reader.Trace.steps(label)`` cuts a trace into steps; the nesting of ops on
each thread (``nest``), the folding of self-nested ops as ``prof.key_averages()`` folds them
and the op that launched each kernel are worked out here.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional

import numpy as np
import pandas as pd

from kernels.trace.events import DTYPE_BYTES, LAUNCH_CATEGORIES, VIEW_OPS

def _copy_bytes(dims: list, types: list) -> Optional[int]:
    """Bytes a copy_ moves: its destination's (first input's) size, None where the trace left out
    the shape or the type."""
    if not types or not types[0] or types[0] not in DTYPE_BYTES:
        return None
    if not dims or not isinstance(dims[0], list):
        return None
    return math.prod(dims[0]) * DTYPE_BYTES[types[0]]


def _inclusive(values: list, parent: list) -> list:
    """Each op's value plus all its descendants' (children always follow their parent)."""
    total = list(values)
    for i in range(len(total) - 1, -1, -1):
        if parent[i] >= 0:
            total[parent[i]] += total[i]
    return total


# ----------------------------------------------------------------------------- the trace

def _none_for_missing(values) -> list:
    """The values with pandas' missing markers (NaN, pd.NA) as None."""
    return [None if v is None or (not isinstance(v, str) and pd.isna(v)) else v for v in values]



def _nest(keys: list, ts: list, end: list) -> tuple[list, list]:
    """Depth and parent (row index, -1 at top) of each op, nesting by time on each thread.
    Ops come sorted by start, longest first, so a parent always precedes its children."""
    stacks: dict = {}
    depth, parent = [], []
    for i, (key, t) in enumerate(zip(keys, ts)):
        stack = stacks.setdefault(key, [])
        while stack and t >= end[stack[-1]]:
            stack.pop()
        depth.append(len(stack))
        parent.append(stack[-1] if stack else -1)
        stack.append(i)
    return depth, parent


def _self_nested(names: list, parent: list) -> set:
    """Rows to fold into their parent, by ``prof.key_averages()``'s rule.

    torch (``EventList._remove_dup_nodes``) merges an op into its parent when the parent has
    the same name and this op is its only child: ``aten::mul(Tensor, Scalar)`` calling
    ``aten::mul(Tensor, Tensor)`` is one ``aten::mul``, with the outer call's time and shapes.
    It repeats until nothing merges, so a chain of three folds into one. Here: walk parents
    before children, folding each qualifying child and handing its children to the parent.
    """
    children = Counter(p for p in parent if p >= 0)
    owner = list(range(len(names)))  # the row a folded row's children now belong to
    folded = set()
    for i, p in enumerate(parent):
        if p < 0:
            continue
        p = owner[p]
        if names[i] == names[p] and children[p] == 1:
            folded.add(i)
            owner[i] = p
            children[p] = children[i]
    return folded


def _innermost(ops: pd.DataFrame, keys: list, ts: list) -> list[int]:
    """For each point (thread key, ts), the row of the deepest op of that thread whose span
    holds it, or -1: one sweep per thread over ops and points in time order."""
    rows_of: dict = {}
    for i, key in enumerate(zip(ops["pid"], ops["tid"])):
        rows_of.setdefault(key, []).append(i)
    starts, ends = ops["ts"].tolist(), ops["end"].tolist()
    points_of: dict = {}
    for j, key in enumerate(keys):
        points_of.setdefault(key, []).append(j)
    found = [-1] * len(ts)
    for key, points in points_of.items():
        rows, stack, k = rows_of.get(key, []), list[int](), 0
        for j in sorted(points, key=lambda j: ts[j]):
            t = ts[j]
            while k < len(rows) and starts[rows[k]] <= t:
                while stack and starts[rows[k]] >= ends[stack[-1]]:
                    stack.pop()
                stack.append(rows[k])
                k += 1
            while stack and ends[stack[-1]] < t:
                stack.pop()
            found[j] = stack[-1] if stack else -1
    return found


# ----------------------------------------------------------------------------- a step

@dataclass


class Step:
    """One labelled range: its CPU ops, its GPU work and the memory it allocated.

    What belongs to a step:

    - CPU ops that start inside the range, on any thread of the process (the autograd
      engine's thread runs the backward ops of a training step); ``ops["tid"]`` says which
      thread, and ``depth``/``parent`` nest ops on their own thread. A Kineto trace records
      one process, so every CPU pid in it counts (HTA's Triton example writes its
      ``ProfilerStep#1`` under a different pid from its ops and launches).
    - Self-nested ops are counted as ``prof.key_averages()`` counts them: an op that is the
      only child of an op of the same name is folded into it (see ``_self_nested``).
    - GPU work (kernels, memcpys, memsets) whose launching runtime or driver call, on any
      thread, starts inside the range, wherever and whenever the GPU ran it (on a GPU the
      label closes when the CPU has queued the work, long before the GPU has run it).
    - ``[memory]`` events inside the range, on any thread.

    "Inside" is half open, [start, end): an op, launch or allocation exactly at the boundary of
    two touching steps belongs to the later step, never to both (HTA assigns them the same way).
    """

    trace: Any = field(repr=False)   # a kernels.trace.reader.Trace (which imports this module)
    label: str
    index: int
    range: pd.Series = field(repr=False)

    # Built when first read: a trace with thousands of labelled ranges costs only the steps looked at.
    @cached_property
    def memory(self) -> pd.DataFrame:
        """The ``[memory]`` events inside the range, on any thread."""
        return self.trace.memory_between(float(self.range["ts"]), float(self.range["end"])).copy()

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The CPU ops, one row each, in start order (see the class docstring for which)."""
        return self._ops(self.trace.cpu_ops_between(float(self.range["ts"]), float(self.range["end"])))

    @cached_property
    def gpu_work(self) -> pd.DataFrame:
        """The GPU work launched inside the range, in GPU start order."""
        gpu = self.trace.gpu
        t0, t1 = float(self.range["ts"]), float(self.range["end"])
        return self._kernels(gpu[(gpu["launch_ts"] >= t0) & (gpu["launch_ts"] < t1)])   # [start, end)

    @property
    def thread(self) -> tuple[str, str]:
        """(pid, tid) of the thread the label itself was recorded on."""
        return str(self.range["pid"]), str(self.range["tid"])

    # --- CPU side
    def _ops(self, ops: pd.DataFrame) -> pd.DataFrame:
        own = (ops["pid"] == self.range["pid"]) & (ops["tid"] == self.range["tid"])
        itself = own & (ops["ts"] == self.range["ts"]) & (ops["dur"] == self.range["dur"]) & \
            (ops["name"] == self.range["name"])  # an old-format label is an op of its own range
        ops = ops[(~own | (ops["end"] <= self.range["end"])) & ~itself]  # on the label's thread: inside it
        keys = list(zip(ops["pid"], ops["tid"]))
        _, parent = _nest(keys, ops["ts"].tolist(), ops["end"].tolist())
        folded = _self_nested(ops["name"].tolist(), parent)
        if folded:
            ops = ops[np.array([i not in folded for i in range(len(ops))], dtype=bool)]
            keys = list(zip(ops["pid"], ops["tid"]))
        ops = ops.reset_index(drop=True)
        depth, parent = _nest(keys, ops["ts"].tolist(), ops["end"].tolist())
        args = ops["args"]
        table = pd.DataFrame({
            "name": ops["name"],
            "depth": depth,
            "parent": parent,
            "start_us": ops["ts"] - self.range["ts"],
            "dur_us": ops["dur"],
            "input_dims": [a.get("Input Dims", a.get("Input dims", [])) for a in args],
            "input_types": [a.get("Input type", []) for a in args],
            "input_strides": [a.get("Input Strides", []) for a in args],   # [] where not recorded
            # the values of scalar inputs (is_causal, a scale) as text; "" for a tensor, [] when not recorded
            "concrete_inputs": [a.get("Concrete Inputs", []) for a in args],
            "ts": ops["ts"],
            "end": ops["end"],
            "pid": ops["pid"],
            "tid": ops["tid"],
        })
        table["is_view"] = table["name"].isin(VIEW_OPS)
        table["self_alloc_bytes"] = self._self_alloc(table)
        table["alloc_bytes"] = _inclusive(table["self_alloc_bytes"].tolist(), parent)
        child_time = table[table["parent"] >= 0].groupby("parent")["dur_us"].sum()
        table["self_us"] = table["dur_us"] - table.index.map(child_time).fillna(0.0)
        return table

    def _self_alloc(self, ops: pd.DataFrame) -> list[int]:
        """Bytes each op allocated itself (not its children): the innermost op of the
        allocating thread wins."""
        alloc = [0] * len(ops)
        mem = self.memory[self.memory["bytes"] > 0]
        hits = _innermost(ops, list(zip(mem["pid"], mem["tid"])), mem["ts"].tolist())
        for row, b in zip(hits, mem["bytes"]):
            if row >= 0:
                alloc[row] += int(b)
        return alloc

    # --- GPU side
    KERNEL_COLUMNS = ["name", "cat", "start_us", "dur_us", "launcher", "launch_start_us", "op", "grid",
                      "block", "registers_per_thread", "shared_memory", "occupancy_pct", "stream", "device",
                      "thread", "linked_by"]

    def _kernels(self, gpu: pd.DataFrame) -> pd.DataFrame:
        if gpu.empty:
            return pd.DataFrame(columns=self.KERNEL_COLUMNS)
        hits = _innermost(self.ops, list(zip(gpu["launch_pid"], gpu["launch_tid"])), gpu["launch_ts"].tolist())
        names = self.ops["name"].tolist()
        args = gpu["args"]
        t0 = self.range["ts"]
        table = pd.DataFrame({
            "name": gpu["name"].values, "cat": gpu["cat"].values,
            "start_us": (gpu["ts"] - t0).values, "dur_us": gpu["dur"].values,
            "launcher": gpu["launcher"].values, "launch_start_us": (gpu["launch_ts"] - t0).values,
            "op": [names[h] if h >= 0 else None for h in hits],
            "grid": [a.get("grid") for a in args], "block": [a.get("block") for a in args],
            "registers_per_thread": [a.get("registers per thread") for a in args],
            "shared_memory": [a.get("shared memory") for a in args],
            "occupancy_pct": [a.get("est. achieved occupancy %") for a in args],
            "stream": gpu["stream"].values, "device": gpu["device"].values,
            "thread": gpu["launch_tid"].values, "linked_by": gpu["linked_by"].values,
        }, columns=self.KERNEL_COLUMNS)
        for col in ("launcher", "op", "thread", "linked_by"):   # None, not pandas 3's NaN, where missing
            table[col] = pd.Series(_none_for_missing(table[col]), index=table.index, dtype=object)
        return table.sort_values("start_us", kind="stable").reset_index(drop=True)

    @cached_property
    def runtime_calls(self) -> pd.DataFrame:
        """The CUDA/HIP runtime and driver calls made on the CPU inside the range (launches,
        copies, synchronisations, attribute queries) and the profiler's own ``overhead`` rows, in
        start order: name, cat, start_us, dur_us, pid, tid and ``op``, the innermost op of its
        thread the call was made in (None outside every op)."""
        spans = self.trace.spans
        t0, t1 = float(self.range["ts"]), float(self.range["end"])
        calls = spans[spans["cat"].isin(LAUNCH_CATEGORIES + ("overhead",))
                      & (spans["ts"] >= t0) & (spans["ts"] < t1)].sort_values("ts", kind="stable")
        hits = _innermost(self.ops, list(zip(calls["pid"], calls["tid"])), calls["ts"].tolist())
        names = self.ops["name"].tolist()
        table = pd.DataFrame({
            "name": calls["name"].values, "cat": calls["cat"].values,
            "start_us": (calls["ts"] - t0).values, "dur_us": calls["dur"].values,
            "pid": calls["pid"].values, "tid": calls["tid"].values,
        })
        table["op"] = pd.Series([names[h] if h >= 0 else None for h in hits], index=table.index, dtype=object)
        return table

    def python_stack(self, row: int) -> list[str]:
        """The Python frames and ``nn.Module`` ranges around op ``row`` of ``ops``, outermost
        first, as a trace recorded ``with_stack=True`` / ``with_modules=True`` holds them; []
        where it recorded none."""
        op = self.ops.loc[row]
        spans = self.trace.spans
        around = spans[(spans["cat"] == "python_function") & (spans["pid"] == op["pid"]) & (spans["tid"] == op["tid"])
                       & (spans["ts"] <= op["ts"]) & (spans["end"] >= op["end"])]
        return around.sort_values(["ts", "dur"], ascending=[True, False], kind="stable")["name"].tolist()

    # --- what chapters ask
    @property
    def cpu_time_us(self) -> float:
        """Wall time of the labelled call on the CPU (launch overhead included)."""
        return float(self.range["dur"])

    @property
    def gpu_time_us(self) -> float:
        """Sum of this step's kernel, memcpy and memset durations (0 on a CPU-only trace)."""
        return float(self.gpu_work["dur_us"].sum())

    @property
    def peak_bytes(self) -> int:
        """Highest memory in use during the step, above what was in use when it began."""
        if self.memory.empty:
            return 0
        m = self.memory.sort_values("ts", kind="stable")
        before = int(m["total_allocated"].iloc[0] - m["bytes"].iloc[0])
        return max(0, int(m["total_allocated"].max()) - before)

    @property
    def allocated_bytes(self) -> int:
        """Total of every allocation in the step (a buffer allocated twice counts twice)."""
        return int(self.memory.loc[self.memory["bytes"] > 0, "bytes"].sum())

    def most_alive(self, nbytes: int) -> int:
        """The most tensors of exactly ``nbytes`` alive at once during the step, from its
        allocation events (a free of one allocated before the step counts down from 0)."""
        events = self.memory[self.memory["bytes"].abs() == nbytes].sort_values("ts", kind="stable")
        if events.empty:
            return 0
        return max(0, int(events["bytes"].gt(0).map({True: 1, False: -1}).cumsum().max()))

    def top_level(self) -> pd.DataFrame:
        """The ops your code called directly (depth 0 on the label's own thread), views and
        allocations left out."""
        own = (self.ops["pid"] == self.range["pid"]) & (self.ops["tid"] == self.range["tid"])
        return self.ops[(self.ops["depth"] == 0) & ~self.ops["is_view"] & own]

    def find(self, name: Optional[str] = None, shape: Optional[list] = None) -> pd.DataFrame:
        """Ops named ``name`` (any if None) with an input of exactly ``shape`` (any if None)."""
        hits = self.ops if name is None else self.ops[self.ops["name"] == name]
        if shape is not None:
            shape = list(shape)
            hits = hits[np.array([shape in dims for dims in hits["input_dims"]], dtype=bool)]
        return hits

    def work_ops(self) -> list[str]:
        """Names of the ops that do arithmetic themselves, in call order.

        Views and bare allocations are left out. Of the rest, an op counts when no other
        such op runs below it (``matmul`` only wraps its ``bmm``), or when it allocates its
        own result (``mul`` computes into a buffer it allocates, even though it first turns
        the Python scale into a tensor with a small ``copy_`` below it).
        """
        ops = self.ops
        working = ops.index[~ops["is_view"]]
        wrappers = set()
        for i in working:
            parent = ops.at[i, "parent"]
            while parent >= 0:  # every ancestor of a working op wraps work
                wrappers.add(parent)
                parent = ops.at[parent, "parent"]
        return [ops.at[i, "name"] for i in working
                if i not in wrappers or ops.at[i, "self_alloc_bytes"] > 0]

    def copies(self, min_bytes: int = 1) -> pd.DataFrame:
        """Every ``aten::copy_`` with its size: copies are found by what they move, not by name.

        ``bytes`` is None where the trace did not record the copy's shape and type (torch 1.8's
        traces record dims without types): such a copy is kept whatever ``min_bytes`` is, since
        its size is unknown, and ``size_known`` says so."""
        c = self.find("aten::copy_").copy()
        c["bytes"] = pd.Series([_copy_bytes(d, t) for d, t in zip(c["input_dims"], c["input_types"])],
                               index=c.index, dtype=object)
        c["size_known"] = [b is not None for b in c["bytes"]]
        c["called_from"] = [self.ops.at[p, "name"] if p >= 0 else None for p in c["parent"]]
        return c[np.array([b is None or b >= min_bytes for b in c["bytes"]], dtype=bool)]

    def summary(self) -> dict:
        """One row for a "so far" table."""
        return {
            "label": self.label,
            "ops": len(self.ops),
            "ops (no views)": int((~self.ops["is_view"]).sum()),
            "top-level ops": len(self.top_level()),
            "kernels": int((self.gpu_work["cat"] == "kernel").sum()),
            "memcpy/memset": int(self.gpu_work["cat"].isin(["gpu_memcpy", "gpu_memset"]).sum()),
            "cpu_time_ms": self.cpu_time_us / 1e3,
            "gpu_time_ms": self.gpu_time_us / 1e3,
            "peak_MiB": self.peak_bytes / 2**20,
            "allocated_MiB": self.allocated_bytes / 2**20,
        }


def median_step(steps: list[Step]) -> Step:
    """The step with the median CPU time: a representative one to draw or tabulate."""
    order = sorted(steps, key=lambda s: s.cpu_time_us)
    return order[len(order) // 2]

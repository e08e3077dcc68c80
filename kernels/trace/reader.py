"""A profiler trace file as tables: ``load_trace``, ``Trace``, ``Step`` and ``median_step`` (the
raw events, their categories and tensor types: ``kernels.trace.events``).

``load_trace(path)`` reads a Chrome/Perfetto trace (plain or gzip) that ``torch.profiler``
exported into a ``Trace``; ``trace.steps(label)`` cuts it into ``Step``s. A ``Step`` is one
labelled range of the trace (a ``record_function`` label, or the profiler's own
``ProfilerStep#N``): the CPU ops that ran in it, on every thread of the process, the GPU
work it launched (``Step.gpu_work``), and the memory it allocated. Durations (``dur``) and
timestamps (``ts``) are in microseconds. The Kineto facts the reading relies on are listed in
``kernels.trace.events``.

What the chapters display of a step (``op_table``, ``kernel_table``, ``copy_table``,
``counts``) is in ``kernels.trace.tables``, which imports this module.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kernels.trace.events import (DTYPE_BYTES, FLOW_CATEGORIES, GPU_CATEGORIES, LAUNCH_CATEGORIES, LEGACY_CATEGORIES,
                                  PROFILER_STEP, VIEW_OPS, check_categories, device_properties, read_events,
                                  trace_events)


def load_trace(source) -> "Trace":
    """A ``Trace`` from a trace file path or an already-loaded trace dict.

    Raises ``ValueError`` naming the format when the file is not a trace this reader reads
    (a PyTorch execution trace, a JSON without ``traceEvents``, events of no known category).
    """
    raw = source if isinstance(source, (dict, list)) else read_events(source)
    return Trace(raw, path=None if isinstance(source, (dict, list)) else Path(source))




class Trace:
    """A parsed trace: durations (``dur``) and timestamps (``ts``) in microseconds.

    ``gpu`` holds every kernel, memcpy and memset with the launch it was linked to
    (``launcher``, ``launch_ts``, ``launch_pid``/``launch_tid``, and ``linked_by``: ``"flow"``,
    ``"correlation"``, or None when its launch is not in the trace); ``memory`` the ``[memory]``
    events; ``spans`` every complete event; ``legacy`` says the file is in Kineto's older
    format; ``unread`` counts the events of categories the reader does not read.
    Steps: ``steps(label)``, ``profiler_steps()``, ``whole()``.
    """

    def __init__(self, raw, path: Optional[Path] = None):
        self.raw = raw
        self.path = path
        where = str(path) if path is not None else "trace"
        events = trace_events(raw)
        self.device_properties = device_properties(raw)
        cols, flows, mem = self._columns(events)
        cats = Counter(cols["cat"])
        self.unread = check_categories(cats, where)
        # The old format has no cpu_op or kernel category at all; a modern one never has "Kernel".
        self.legacy = bool(set(cats) & set(LEGACY_CATEGORIES)) and "cpu_op" not in cats and "kernel" not in cats
        if self.legacy:  # old names; the profiler's steps were Operators then
            cols["cat"] = ["user_annotation" if c == "Operator" and n.startswith(PROFILER_STEP)
                           else LEGACY_CATEGORIES.get(c, c) for c, n in zip(cols["cat"], cols["name"])]
        self.gpu = self._link_gpu(cols, flows)
        cpu = [i for i, c in enumerate(cols["cat"]) if c == "cpu_op"]
        ts, dur = np.asarray(cols["ts"]), np.asarray(cols["dur"])
        cpu = [cpu[j] for j in np.lexsort((-dur[cpu], ts[cpu]))] if cpu else []  # a parent before its children
        self._cpu_ops = self._rows(cols, cpu)
        self._cpu_ts = ts[cpu].tolist()
        self._cols = cols
        self._annotations = self._rows(cols, [i for i, c in enumerate(cols["cat"]) if c == "user_annotation"])
        self.memory = self._memory_table(mem)
        self._mem_ts = self.memory["ts"].tolist()

    @staticmethod
    def _columns(events: list[dict]) -> tuple[dict, list, list]:
        """One pass over the events: complete events as plain column lists, flow ends, memory
        events. The reader works on lists and builds frames once (element-wise access to
        pandas columns is what makes a big trace slow)."""
        name, cat, pid, tid, ts, dur, args = [], [], [], [], [], [], []
        flows, mem = [], []
        for e in events:
            ph = e.get("ph")
            if ph == "X":
                name.append(e.get("name", ""))
                cat.append(e.get("cat", ""))
                pid.append(e.get("pid"))
                tid.append(e.get("tid"))
                ts.append(float(e.get("ts", 0.0)))
                dur.append(float(e.get("dur", 0.0)))
                args.append(e.get("args") or {})
            elif ph == "s" or ph == "f":
                if e.get("cat") in FLOW_CATEGORIES:
                    flows.append(e)
            elif e.get("name") == "[memory]":
                mem.append(e)
        return {"name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}, flows, mem

    @staticmethod
    def _rows(cols: dict, rows) -> pd.DataFrame:
        rows = list(rows)
        table = pd.DataFrame({k: [str(v[i]) for i in rows] if k in ("pid", "tid") else [v[i] for i in rows]
                              for k, v in cols.items()})
        table["ts"] = table["ts"].astype(float)
        table["dur"] = table["dur"].astype(float)
        table["end"] = table["ts"] + table["dur"]
        return table

    @staticmethod
    def _memory_table(mem: list[dict]) -> pd.DataFrame:
        mem = sorted(mem, key=lambda e: float(e.get("ts", 0.0)))
        args = [e.get("args") or {} for e in mem]
        return pd.DataFrame({
            "pid": [str(e.get("pid")) for e in mem], "tid": [str(e.get("tid")) for e in mem],
            "ts": [float(e.get("ts", 0.0)) for e in mem],
            "bytes": [int(a.get("Bytes", 0)) for a in args],
            "total_allocated": [int(a.get("Total Allocated", 0)) for a in args],
            "device_type": [int(a.get("Device Type", 0)) for a in args],
        }, columns=["pid", "tid", "ts", "bytes", "total_allocated", "device_type"])

    def _link_gpu(self, cols: dict, flows: list[dict]) -> pd.DataFrame:
        """Every GPU event with the launch it came from: by its flow arrow where the trace
        draws one, else by correlation id (a sampled trace has no flows)."""
        cat, pid, tid, ts, args = cols["cat"], cols["pid"], cols["tid"], cols["ts"], cols["args"]
        launches = [i for i, c in enumerate(cat) if c in LAUNCH_CATEGORIES]
        # Two runtime calls can start in the same microsecond on one thread (a memset and the
        # cudaPeekAtLastError after it), so a position names a list of launches, and the flow's
        # id (Kineto gives an arrow its launch's correlation id) picks among them.
        at: dict = {}
        for i in launches:
            at.setdefault((pid[i], tid[i], ts[i]), []).append(i)
        by_corr = {args[i]["correlation"]: i for i in launches if "correlation" in args[i]}
        flow_start = {f.get("id"): (f.get("pid"), f.get("tid"), float(f.get("ts", 0.0)))
                      for f in flows if f.get("ph") == "s"}
        flow_end_ids = {f.get("id") for f in flows if f.get("ph") == "f"}
        flow_end_at = {(f.get("pid"), f.get("tid"), float(f.get("ts", 0.0))): f.get("id")
                       for f in flows if f.get("ph") == "f"}
        gpu = sorted((i for i, c in enumerate(cat) if c in GPU_CATEGORIES), key=lambda i: ts[i])
        link: list[Optional[int]] = []
        how: list[Optional[str]] = []  # None: no flow and no correlation found its launch
        for i in gpu:
            corr = args[i].get("correlation")
            flow = corr if corr in flow_end_ids else flow_end_at.get((pid[i], tid[i], ts[i]))
            launch = _flow_launch(at.get(flow_start.get(flow), []), flow, args)
            if launch is not None:
                link.append(launch); how.append("flow")  # noqa: E702
                continue
            launch = by_corr.get(args[i].get("correlation"))
            link.append(launch)
            how.append(None if launch is None else "correlation")
        table = self._rows(cols, gpu)
        table["launch"] = [-1 if j is None else j for j in link]
        # object columns: pandas 3 would store missing strings as NaN, and these say None
        table["linked_by"] = pd.Series(how, index=table.index, dtype=object)
        table["launcher"] = pd.Series([None if j is None else cols["name"][j] for j in link],
                                      index=table.index, dtype=object)
        for col, src in (("launch_pid", "pid"), ("launch_tid", "tid")):
            table[col] = pd.Series([None if j is None else str(cols[src][j]) for j in link],
                                   index=table.index, dtype=object)
        table["launch_ts"] = [float("nan") if j is None else ts[j] for j in link]
        table["stream"] = [args[i].get("stream", str(tid[i])) for i in gpu]
        table["device"] = [args[i].get("device", str(pid[i])) for i in gpu]
        return table

    @cached_property
    def spans(self) -> pd.DataFrame:
        """Every complete event (``ph: X``) as one table, built when first asked for: the
        reader's own work does not need it, and on a big trace it is the largest table."""
        return self._rows(self._cols, range(len(self._cols["ts"])))

    @property
    def has_gpu(self) -> bool:
        return not self.gpu.empty

    def _ranges(self) -> pd.DataFrame:
        """The labelled ranges: record_function labels and ProfilerStep#N."""
        return self._annotations

    def labels(self, profiler_steps: bool = False) -> list[str]:
        """The record_function labels in the trace, sorted; with ``profiler_steps=True`` also
        the profiler's own ``ProfilerStep#N`` (each one step, also reached by ``profiler_steps()``)."""
        names = set(self._ranges()["name"])
        return sorted(n for n in names if profiler_steps or not n.startswith(PROFILER_STEP))

    def steps(self, label: str) -> list["Step"]:
        """Every range labelled ``label``, in time order (a KeyError lists the labels). In the
        old format a ``record_function`` range was an ``Operator`` like any op: ask for it by
        name (``labels()`` cannot tell it from an op there)."""
        ranges = self._ranges()
        ranges = ranges[ranges["name"] == label]
        if ranges.empty and self.legacy:  # before user_annotation, a record_function was an Operator
            ranges = self._cpu_ops[self._cpu_ops["name"] == label]
        if ranges.empty:
            raise KeyError(f"no step labelled {label!r} in this trace; labels: {self.labels()}"
                           + (f"; profiler steps: {self._profiler_step_names()}" if self._profiler_step_names() else ""))
        return [Step(self, label, i, r) for i, (_, r) in enumerate(ranges.sort_values("ts", kind="stable").iterrows())]

    def _profiler_step_ranges(self) -> pd.DataFrame:
        ranges = self._ranges()
        mask = np.array([n.startswith(PROFILER_STEP) for n in ranges["name"]], dtype=bool)
        return ranges[mask].sort_values("ts", kind="stable")

    def _profiler_step_names(self) -> list[str]:
        return self._profiler_step_ranges()["name"].tolist()

    def profiler_steps(self) -> list["Step"]:
        """The profiler's own steps (``ProfilerStep#N``, one per ``prof.step()``) in time order."""
        return [Step(self, r["name"], i, r) for i, (_, r) in enumerate(self._profiler_step_ranges().iterrows())]

    def whole(self) -> "Step":
        """The whole trace as one step, from its first CPU event to its last: for traces with
        no labelled range (a benchmark's), or to see everything at once. Its own thread is the
        busiest CPU thread."""
        cpu = self.spans[self.spans["cat"].isin(("cpu_op", "user_annotation") + LAUNCH_CATEGORIES)]
        if cpu.empty:
            raise ValueError("this trace has no CPU events, so no step to draw from it")
        pid, tid = cpu.groupby(["pid", "tid"]).size().idxmax()
        # Just past the last end: the window is half open, and a zero-length last event counts.
        t0, t1 = float(cpu["ts"].min()), float(np.nextafter(cpu["end"].max(), np.inf))
        label = "(whole trace)"
        r = pd.Series({"name": label, "cat": "user_annotation", "pid": pid, "tid": tid, "ts": t0,
                       "dur": t1 - t0, "args": {}, "end": t1})
        return Step(self, label, 0, r)

    def __repr__(self) -> str:
        where = self.path.name if self.path is not None else "in memory"
        return (f"Trace({where}: {len(self._cols['ts'])} spans, labels {self.labels()}, "
                f"{len(self._profiler_step_names())} profiler steps, {len(self.gpu)} GPU events)")

    # --- what Step slices out of the trace (sorted arrays: a step costs its own size)
    # A step's window is [start, end): what starts exactly where one step ends and the next
    # begins (two touching ProfilerSteps) belongs to the later one only, as in HTA.
    def _cpu_ops_between(self, t0: float, t1: float) -> pd.DataFrame:
        return self._cpu_ops.iloc[bisect_left(self._cpu_ts, t0):bisect_left(self._cpu_ts, t1)]

    def _memory_between(self, t0: float, t1: float) -> pd.DataFrame:
        return self.memory.iloc[bisect_left(self._mem_ts, t0):bisect_left(self._mem_ts, t1)]


def _flow_launch(candidates: list, flow, args: list):
    """The launch a flow arrow starts at: the one at its start whose correlation id is the
    flow's id, or the only one there (None when no launch starts there)."""
    if len(candidates) == 1:
        return candidates[0]
    for i in candidates:
        if args[i].get("correlation") == flow:
            return i
    return None


# ----------------------------------------------------------------------------- nesting

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

    trace: Trace = field(repr=False)
    label: str
    index: int
    range: pd.Series = field(repr=False)

    # Built when first read: a trace with thousands of labelled ranges costs only the steps looked at.
    @cached_property
    def memory(self) -> pd.DataFrame:
        """The ``[memory]`` events inside the range, on any thread."""
        return self.trace._memory_between(float(self.range["ts"]), float(self.range["end"])).copy()

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The CPU ops, one row each, in start order (see the class docstring for which)."""
        return self._ops(self.trace._cpu_ops_between(float(self.range["ts"]), float(self.range["end"])))

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

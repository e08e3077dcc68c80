"""A profiler trace file as tables: ``load_trace`` and ``Trace`` (and, from their own modules,
``Step`` and ``median_step``: ``kernels.trace.step``; the raw events: ``kernels.trace.events``).

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

from bisect import bisect_left
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kernels.trace.events import (DTYPE_BYTES, FLOW_CATEGORIES, GPU_CATEGORIES, LAUNCH_CATEGORIES, LEGACY_CATEGORIES,
                                  PROFILER_STEP, check_categories, device_properties, is_contiguous, memory_layout,
                                  read_events, tensor_bytes, trace_events)
from kernels.trace.step import Step, median_step

# What callers have always imported from here; each lives in the module of its concept.
__all__ = ["DTYPE_BYTES", "LAUNCH_CATEGORIES", "PROFILER_STEP", "Step", "Trace", "is_contiguous", "load_trace",
           "median_step", "memory_layout", "read_events", "tensor_bytes"]


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
    def cpu_ops_between(self, t0: float, t1: float) -> pd.DataFrame:
        return self._cpu_ops.iloc[bisect_left(self._cpu_ts, t0):bisect_left(self._cpu_ts, t1)]

    def memory_between(self, t0: float, t1: float) -> pd.DataFrame:
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


"""Profile a function, then read its trace as data.

``profile(fn, q, k, v)`` runs ``fn`` for a few steps under ``torch.profiler`` (wait, warm-up,
active), each call inside a ``record_function`` label, exports the Chrome/Perfetto trace
(the file you would open in Perfetto), and parses that file back into pandas tables:
for every labelled step, the CPU ops in order (with nesting depth, input shapes, memory
they allocated) and, on a GPU, the kernels, copies and memsets each launch produced.

Why parse the exported file instead of ``prof.key_averages()``? Because the trace keeps
what the averages throw away: order, nesting, which call each op belongs to, and the
GPU kernels' launch footprint (grid, block, registers, shared memory, occupancy). It is
also the same file a reader opens in Perfetto, so the book and the UI cannot disagree.

Trace facts this parser relies on (torch 2.x Chrome export):
- ``cpu_op`` and ``user_annotation`` events are complete events (``ph: X``) with
  ``ts``/``dur`` in microseconds; nesting is not stored, it follows from time
  containment on the same process and thread.
- ``[memory]`` instant events carry ``Bytes`` (+alloc / -free) and ``Total Allocated``.
- GPU work (``kernel``, ``gpu_memcpy``, ``gpu_memset``) is linked to the CPU call that
  launched it (``cuda_runtime``/``cuda_driver``) by ``args.correlation``.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, record_function, schedule

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")

# Ops that only make a new view of existing memory or allocate it: they do no arithmetic
# and launch no kernel, so "what did my code compute" tables leave them out.
VIEW_OPS = frozenset({
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::expand",
    "aten::as_strided", "aten::transpose", "aten::t", "aten::permute", "aten::alias",
    "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::resolve_conj",
    "aten::resolve_neg", "aten::detach", "aten::lift_fresh", "aten::empty", "aten::empty_like",
    "aten::empty_strided", "aten::contiguous", "aten::split", "aten::unbind",
})
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "bool": 1,
               "long int": 8, "int": 4, "unsigned char": 1, "signed char": 1, "short int": 2}


# ----------------------------------------------------------------------------- recording

@dataclass
class Profile:
    """What ``profile()`` returns: the trace file, the parsed trace, and the averages table."""

    label: str
    trace_path: Path
    trace: "Trace"
    averages: object  # torch.autograd.profiler_util.EventList (prof.key_averages())

    def steps(self) -> list["Step"]:
        return self.trace.steps(self.label)

    def step(self, index: int = -1) -> "Step":
        return self.steps()[index]

    def table(self, sort_by: str = "cpu_time_total", row_limit: int = 12) -> str:
        """PyTorch's own summary table (``prof.key_averages().table()``)."""
        return self.averages.table(sort_by=sort_by, row_limit=row_limit)


def profile(fn: Callable, *args, label: Optional[str] = None, wait: int = 1, warmup: int = 2,
            active: int = 3, trace_dir: str | os.PathLike = "traces", trace_name: Optional[str] = None,
            record_shapes: bool = True, profile_memory: bool = True, with_stack: bool = False,
            **kwargs) -> Profile:
    """Call ``fn(*args, **kwargs)`` for ``wait + warmup + active`` steps under the profiler.

    Each call runs inside ``record_function(label)``; only the ``active`` steps are
    recorded. On a GPU every step ends with a synchronize so that one step's kernels do
    not spill into the next step's lane. Runs under ``torch.no_grad()`` unless an input
    requires grad. The trace is written to ``trace_dir/<trace_name>.json.gz``.
    """
    label = label or getattr(fn, "__name__", "step")
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / f"{trace_name or label}.json.gz"
    needs_grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)

    with _quiet_kineto(), torch.set_grad_enabled(needs_grad), torch.profiler.profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
    ) as prof:
        for _ in range(wait + warmup + active):
            with record_function(label):
                fn(*args, **kwargs)
            if on_gpu:
                torch.cuda.synchronize()
            prof.step()
    return Profile(label, path, load_trace(path), prof.key_averages())


# Kineto's start/stop status lines, and c10's note when a block allocated before profiling
# began is freed during it (harmless: the trace simply has no size for that block).
KINETO_NOISE = re.compile(r"^(USDT|STAGE):.*SyncActivityProfilerHandler|.*CPUAllocator.*Memory block of unknown size")


@contextlib.contextmanager
def _quiet_kineto():
    """Drop Kineto's start/stop status lines, which it writes straight to file descriptor 2
    (so Jupyter shows them in every cell); everything else written there is passed on."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (embedded interpreters): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                    if not KINETO_NOISE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))


# ------------------------------------------------------------------------------- parsing

def read_events(path: str | os.PathLike) -> dict:
    """The raw Chrome trace JSON (plain or gzip-compressed)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def load_trace(source) -> "Trace":
    """A ``Trace`` from a trace file path or an already-loaded trace dict."""
    raw = source if isinstance(source, dict) else read_events(source)
    return Trace(raw, path=None if isinstance(source, dict) else Path(source))


def _inclusive(values: list, parent: list) -> list:
    """Each op's value plus all its descendants' (children always follow their parent)."""
    total = list(values)
    for i in range(len(total) - 1, -1, -1):
        if parent[i] >= 0:
            total[parent[i]] += total[i]
    return total


def _shape_bytes(dims, dtype: str) -> int:
    n = 1
    for d in dims:
        n *= d
    return n * DTYPE_BYTES.get(dtype, 4)


class Trace:
    """A parsed trace: durations (``dur``) and timestamps (``ts``) in microseconds."""

    def __init__(self, raw: dict, path: Optional[Path] = None):
        self.raw = raw
        self.path = path
        self.device_properties = raw.get("deviceProperties", [])
        events = [e for e in raw.get("traceEvents", []) if isinstance(e, dict)]
        spans = [e for e in events if e.get("ph") == "X"]
        self.spans = pd.DataFrame({
            "name": [e.get("name", "") for e in spans],
            "cat": [e.get("cat", "") for e in spans],
            "pid": [str(e.get("pid")) for e in spans],
            "tid": [str(e.get("tid")) for e in spans],
            "ts": [float(e.get("ts", 0.0)) for e in spans],
            "dur": [float(e.get("dur", 0.0)) for e in spans],
            "args": [e.get("args", {}) for e in spans],
        })
        self.spans["end"] = self.spans["ts"] + self.spans["dur"]
        mem = [e for e in events if e.get("name") == "[memory]"]
        self.memory = pd.DataFrame({
            "pid": [str(e.get("pid")) for e in mem],
            "tid": [str(e.get("tid")) for e in mem],
            "ts": [float(e.get("ts", 0.0)) for e in mem],
            "bytes": [int(e["args"].get("Bytes", 0)) for e in mem],
            "total_allocated": [int(e["args"].get("Total Allocated", 0)) for e in mem],
            "device_type": [int(e["args"].get("Device Type", 0)) for e in mem],
        })

    @property
    def has_gpu(self) -> bool:
        return bool(self.spans["cat"].isin(GPU_CATEGORIES).any())

    def labels(self) -> list[str]:
        """The record_function labels in the trace (ProfilerStep#N excluded)."""
        ann = self.spans[self.spans["cat"] == "user_annotation"]["name"]
        return sorted({n for n in ann if not n.startswith("ProfilerStep#")})

    def steps(self, label: str) -> list["Step"]:
        ranges = self.spans[(self.spans["cat"] == "user_annotation") & (self.spans["name"] == label)]
        if ranges.empty:
            raise KeyError(f"no step labelled {label!r} in this trace; labels: {self.labels()}")
        return [Step(self, label, i, r) for i, (_, r) in enumerate(ranges.sort_values("ts").iterrows())]


@dataclass
class Step:
    """One labelled call: its CPU ops, its GPU work and the memory it allocated."""

    trace: Trace
    label: str
    index: int
    range: pd.Series
    ops: pd.DataFrame = field(init=False)
    kernels: pd.DataFrame = field(init=False)
    memory: pd.DataFrame = field(init=False)

    def __post_init__(self):
        r, spans = self.range, self.trace.spans
        inside = (spans["pid"] == r["pid"]) & (spans["tid"] == r["tid"]) & \
                 (spans["ts"] >= r["ts"]) & (spans["end"] <= r["end"])
        mem = self.trace.memory
        self.memory = mem[(mem["tid"] == r["tid"]) & (mem["ts"] >= r["ts"]) & (mem["ts"] <= r["end"])].copy()
        self.ops = self._ops(spans[inside & (spans["cat"] == "cpu_op")])
        launches = spans[inside & spans["cat"].isin(LAUNCH_CATEGORIES)]
        self.kernels = self._kernels(launches)

    # --- CPU side
    def _ops(self, ops: pd.DataFrame) -> pd.DataFrame:
        ops = ops.sort_values(["ts", "dur"], ascending=[True, False]).reset_index(drop=True)
        depth, parent, stack = [], [], []
        for i, (ts, end) in enumerate(zip(ops["ts"], ops["end"])):
            while stack and ts >= ops.at[stack[-1], "end"]:
                stack.pop()
            depth.append(len(stack))
            parent.append(stack[-1] if stack else -1)
            stack.append(i)
        args = ops["args"]
        table = pd.DataFrame({
            "name": ops["name"],
            "depth": depth,
            "parent": parent,
            "start_us": ops["ts"] - self.range["ts"],
            "dur_us": ops["dur"],
            "input_dims": [a.get("Input Dims", []) for a in args],
            "input_types": [a.get("Input type", []) for a in args],
            "ts": ops["ts"],
            "end": ops["end"],
        })
        table["is_view"] = table["name"].isin(VIEW_OPS)
        table["self_alloc_bytes"] = self._self_alloc(table)
        table["alloc_bytes"] = _inclusive(table["self_alloc_bytes"].tolist(), parent)
        child_time = table[table["parent"] >= 0].groupby("parent")["dur_us"].sum()
        table["self_us"] = table["dur_us"] - table.index.map(child_time).fillna(0.0)
        return table

    def _self_alloc(self, ops: pd.DataFrame) -> list[int]:
        """Bytes each op allocated itself (not its children): the innermost op wins."""
        alloc = [0] * len(ops)
        for ts, b in zip(self.memory["ts"], self.memory["bytes"]):
            if b <= 0:
                continue
            hits = ops[(ops["ts"] <= ts) & (ops["end"] >= ts)]
            if not hits.empty:
                alloc[int(hits["depth"].idxmax())] += b
        return alloc

    # --- GPU side
    def _kernels(self, launches: pd.DataFrame) -> pd.DataFrame:
        spans = self.trace.spans
        gpu = spans[spans["cat"].isin(GPU_CATEGORIES)]
        columns = ["name", "cat", "start_us", "dur_us", "launcher", "launch_start_us", "op", "grid",
                   "block", "registers_per_thread", "shared_memory", "occupancy_pct", "stream"]
        if gpu.empty or launches.empty:
            return pd.DataFrame(columns=columns)
        by_corr = {a.get("correlation"): row for row, a in zip(launches.itertuples(), launches["args"])}
        rows = []
        for g in gpu.itertuples():
            launch = by_corr.get(g.args.get("correlation"))
            if launch is None:
                continue
            a = g.args
            rows.append({
                "name": g.name, "cat": g.cat,
                "start_us": g.ts - self.range["ts"], "dur_us": g.dur,
                "launcher": launch.name, "launch_start_us": launch.ts - self.range["ts"],
                "op": self._enclosing_op(launch.ts),
                "grid": a.get("grid"), "block": a.get("block"),
                "registers_per_thread": a.get("registers per thread"),
                "shared_memory": a.get("shared memory"),
                "occupancy_pct": a.get("est. achieved occupancy %"),
                "stream": a.get("stream"),
            })
        return pd.DataFrame(rows, columns=columns).sort_values("start_us").reset_index(drop=True)

    def _enclosing_op(self, ts: float) -> Optional[str]:
        hits = self.ops[(self.ops["ts"] <= ts) & (self.ops["end"] >= ts)]
        return None if hits.empty else hits.loc[hits["depth"].idxmax(), "name"]

    # --- what chapters ask
    @property
    def cpu_time_us(self) -> float:
        """Wall time of the labelled call on the CPU (launch overhead included)."""
        return float(self.range["dur"])

    @property
    def gpu_time_us(self) -> float:
        """Sum of this step's kernel, memcpy and memset durations (0 on a CPU-only trace)."""
        return float(self.kernels["dur_us"].sum())

    @property
    def peak_bytes(self) -> int:
        """Highest memory in use during the step, above what was in use when it began."""
        if self.memory.empty:
            return 0
        m = self.memory.sort_values("ts")
        before = int(m["total_allocated"].iloc[0] - m["bytes"].iloc[0])
        return max(0, int(m["total_allocated"].max()) - before)

    @property
    def allocated_bytes(self) -> int:
        """Total of every allocation in the step (a buffer allocated twice counts twice)."""
        return int(self.memory.loc[self.memory["bytes"] > 0, "bytes"].sum())

    def top_level(self) -> pd.DataFrame:
        """The ops your code called directly (depth 0), views and allocations left out."""
        return self.ops[(self.ops["depth"] == 0) & ~self.ops["is_view"]]

    def find(self, name: Optional[str] = None, shape: Optional[list] = None) -> pd.DataFrame:
        """Ops named ``name`` (any if None) with an input of exactly ``shape`` (any if None)."""
        hits = self.ops if name is None else self.ops[self.ops["name"] == name]
        if shape is not None:
            shape = list(shape)
            hits = hits[[shape in dims for dims in hits["input_dims"]]]
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
        """Every ``aten::copy_`` with its size: copies are found by what they move, not by name."""
        c = self.find("aten::copy_").copy()
        c["bytes"] = [_shape_bytes(d[0], t[0]) if d and d[0] else _shape_bytes([], t[0] if t else "")
                      for d, t in zip(c["input_dims"], c["input_types"])]
        c["called_from"] = [self.ops.at[p, "name"] if p >= 0 else None for p in c["parent"]]
        return c[c["bytes"] >= min_bytes]

    def summary(self) -> dict:
        """One row for a "so far" table."""
        return {
            "label": self.label,
            "ops": len(self.ops),
            "ops (no views)": int((~self.ops["is_view"]).sum()),
            "top-level ops": len(self.top_level()),
            "kernels": int((self.kernels["cat"] == "kernel").sum()),
            "memcpy/memset": int(self.kernels["cat"].isin(["gpu_memcpy", "gpu_memset"]).sum()),
            "cpu_time_ms": self.cpu_time_us / 1e3,
            "gpu_time_ms": self.gpu_time_us / 1e3,
            "peak_MiB": self.peak_bytes / 2**20,
            "allocated_MiB": self.allocated_bytes / 2**20,
        }


def op_table(step: Step, views: bool = False, max_depth: Optional[int] = None) -> pd.DataFrame:
    """The step's ops in call order, indented by depth, for display."""
    ops = step.ops if views else step.ops[~step.ops["is_view"]]
    if max_depth is not None:
        ops = ops[ops["depth"] <= max_depth]
    return pd.DataFrame({
        "op": ["  " * d + n for d, n in zip(ops["depth"], ops["name"])],
        "input shapes": [" ".join(str(tuple(x)) for x in dims if x) for dims in ops["input_dims"]],
        "time (us)": ops["dur_us"].round(1),
        "allocated (KiB, incl. children)": (ops["alloc_bytes"] / 1024).round(1),
    }).reset_index(drop=True)


def kernel_table(step: Step) -> pd.DataFrame:
    """The step's GPU work in order, with each kernel's launch footprint."""
    k = step.kernels
    return pd.DataFrame({
        "kernel": k["name"].str.slice(0, 80), "time (us)": k["dur_us"].round(1), "launched by": k["op"],
        "grid": k["grid"], "block": k["block"], "regs/thread": k["registers_per_thread"],
        "smem (B)": k["shared_memory"], "est. occupancy %": k["occupancy_pct"],
    })


def counts(steps: list[Step]) -> pd.DataFrame:
    """Per step: how many ops (and kernels), so a reader can see every step looks alike."""
    return pd.DataFrame([{"step": s.index, **{k: v for k, v in s.summary().items() if k != "label"}}
                         for s in steps]).set_index("step")


def median_step(steps: list[Step]) -> Step:
    """The step with the median CPU time: a representative one to draw or tabulate."""
    order = sorted(steps, key=lambda s: s.cpu_time_us)
    return order[len(order) // 2]


# ------------------------------------------------------------------------------ timeline

def _color(name: str) -> str:
    n = name.lower()
    if "copy" in n or "clone" in n or "memcpy" in n:
        return "#d62728"  # copies in red: they are what chapter 1 hunts
    if "mm" in n or "gemm" in n or "matmul" in n or "linear" in n:
        return "#1f77b4"
    if "softmax" in n:
        return "#2ca02c"
    if "attention" in n or "flash" in n or "fmha" in n or "attn" in n:
        return "#9467bd"
    if "fill" in n or "where" in n or "tril" in n or "triu" in n or "mask" in n:
        return "#ff7f0e"
    return "#8c8c8c"


def timeline(step: Step, ax=None, title: Optional[str] = None, min_label_frac: float = 0.06,
             views: bool = False):
    """Draw one step as Perfetto would: CPU ops stacked by depth, GPU kernels on their own lane.

    Returns the matplotlib Figure. Time is in milliseconds from the start of the label.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ops = step.ops if views else step.ops[~step.ops["is_view"]]
    kernels = step.kernels
    cpu_rows = int(ops["depth"].max()) + 1 if not ops.empty else 1
    rows = cpu_rows + 1 + (1 if not kernels.empty else 0)
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 0.45 * rows + 1.4))
    fig = ax.figure
    span_ms = max(step.cpu_time_us, (kernels["start_us"] + kernels["dur_us"]).max() if not kernels.empty else 0) / 1e3

    def bar(y, start_us, dur_us, name):
        ax.broken_barh([(start_us / 1e3, max(dur_us / 1e3, span_ms * 0.002))], (y - 0.4, 0.8),
                       facecolors=_color(name), edgecolors="white", linewidth=0.5)
        if dur_us / 1e3 >= min_label_frac * span_ms:
            ax.text((start_us + dur_us / 2) / 1e3, y, name.replace("aten::", "")[:28],
                    ha="center", va="center", fontsize=7, color="white", clip_on=True)

    bar(0, 0, step.cpu_time_us, step.label)
    for o in ops.itertuples():
        bar(o.depth + 1, o.start_us, o.dur_us, o.name)
    yticks = [0] + [d + 1 for d in range(cpu_rows)]
    ylabels = [f"label: {step.label}"] + [f"CPU depth {d}" for d in range(cpu_rows)]
    if not kernels.empty:
        gy = cpu_rows + 1.3
        for k in kernels.itertuples():
            bar(gy, k.start_us, k.dur_us, k.name)
            # The flow arrow Perfetto draws: from the CPU launch call to the kernel it queued.
            ax.plot([k.launch_start_us / 1e3, k.start_us / 1e3], [cpu_rows + 0.4, gy - 0.4],
                    color="#bbbbbb", linewidth=0.6, zorder=0)
        yticks.append(gy)
        ylabels.append("GPU stream")
    ax.set_yticks(yticks, ylabels)
    ax.invert_yaxis()
    ax.set_xlabel("time since the labelled call began (ms)")
    ax.set_xlim(0, span_ms * 1.02)
    ax.set_title(title or f"{step.label}: one step ({'CPU + GPU' if not kernels.empty else 'CPU only'})")
    legend = [("matmul / GEMM", "#1f77b4"), ("copy", "#d62728"), ("mask / fill", "#ff7f0e"),
              ("softmax", "#2ca02c"), ("fused attention", "#9467bd"), ("other", "#8c8c8c")]
    ax.legend(handles=[Patch(color=c, label=l) for l, c in legend], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if rows < 6 else -0.12), ncol=6, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------- diff
#
# "What changed?" is the question every chapter after the first asks: naive against in-place,
# math against flash. ``diff(a, b)`` answers it from two steps, the way you would by eye in
# two Perfetto windows, but exhaustively: every op is matched by its name *and* its input
# shapes (a 4-byte ``copy_`` is not an S×S ``copy_``), every kernel by its name and launch
# shape (grid, block), and the counts, times and allocations of each match are compared.
# Views and bare allocations (``VIEW_OPS``) do no work of their own, so their time and bytes
# are credited to the op that called them: ``clone`` owns the buffer its ``empty_like``
# allocated. Times are self times, so the rows of one step add up to its whole op time.

def _shapes_key(dims) -> str:
    """Input shapes as one readable string: ``(1, 8, 512, 512) (512, 512) ()``."""
    return " ".join(str(tuple(d)) if isinstance(d, list) else repr(d) for d in dims)


def _owners(ops: pd.DataFrame) -> list[int]:
    """For each op, the op its work counts towards: itself, or for a view/allocation the
    nearest ancestor that is not one (a view called directly by your code owns itself)."""
    owner = []
    for i in range(len(ops)):
        j = i
        while ops.at[j, "is_view"] and ops.at[j, "parent"] >= 0:
            j = ops.at[j, "parent"]
        owner.append(j)
    return owner


def _op_groups(step: Step) -> pd.DataFrame:
    """One row per (name, input shapes) of the step's working ops: count, self time, bytes."""
    ops = step.ops
    columns = ["name", "shapes", "count", "time_us", "alloc_bytes"]
    if ops.empty:
        return pd.DataFrame(columns=columns)
    owner = pd.Series(_owners(ops), index=ops.index)
    credited = pd.DataFrame({"owner": owner, "self_us": ops["self_us"], "bytes": ops["self_alloc_bytes"]})
    per_owner = credited.groupby("owner")[["self_us", "bytes"]].sum()
    rows = ops.loc[per_owner.index]
    table = pd.DataFrame({"name": rows["name"].values,
                          "shapes": [_shapes_key(d) for d in rows["input_dims"]],
                          "time_us": per_owner["self_us"].values,
                          "alloc_bytes": per_owner["bytes"].values})
    table["count"] = 1
    return table.groupby(["name", "shapes"], as_index=False)[["count", "time_us", "alloc_bytes"]].sum()[columns]


def _kernel_groups(step: Step) -> pd.DataFrame:
    """One row per (kernel name, grid × block) of the step's GPU work: count and GPU time."""
    k = step.kernels
    columns = ["name", "shapes", "count", "time_us", "alloc_bytes"]
    if k.empty:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame({"name": k["name"].values,
                          "shapes": [f"grid {tuple(g)} block {tuple(b)}" if g is not None else ""
                                     for g, b in zip(k["grid"], k["block"])],
                          "time_us": k["dur_us"].values, "alloc_bytes": 0, "count": 1})
    return table.groupby(["name", "shapes"], as_index=False)[["count", "time_us", "alloc_bytes"]].sum()[columns]


def _compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    both = a.merge(b, on=["name", "shapes"], how="outer", suffixes=("_a", "_b"))
    for col in ("count", "time_us", "alloc_bytes"):
        both[f"{col}_a"] = both[f"{col}_a"].fillna(0)
        both[f"{col}_b"] = both[f"{col}_b"].fillna(0)
        both[f"{col}_change"] = both[f"{col}_b"] - both[f"{col}_a"]
    for col in ("count_a", "count_b", "count_change", "alloc_bytes_a", "alloc_bytes_b", "alloc_bytes_change"):
        both[col] = both[col].astype(int)
    both["only_in"] = ["a" if nb == 0 else "b" if na == 0 else ""
                       for na, nb in zip(both["count_a"], both["count_b"])]
    # Rows of substance first (by how much they moved), then the unchanged ones by time.
    both["_substance"] = (both["count_change"] != 0) | (both["alloc_bytes_change"] != 0)
    both["_weight"] = both["time_us_change"].abs() + both[["time_us_a", "time_us_b"]].max(axis=1) * 1e-6
    both = both.sort_values(["_substance", "_weight"], ascending=False).drop(columns="_weight")
    return both.reset_index(drop=True)


@dataclass
class StepDiff:
    """What ``diff(a, b)`` returns. Changes are *b minus a*.

    ``ops`` and ``kernels`` hold one row per matched (name, shapes) with ``count_a``,
    ``count_b``, ``time_us_a``/``_b`` (self time), ``alloc_bytes_a``/``_b`` and their
    ``*_change``; ``only_in`` is ``"a"``, ``"b"`` or empty.
    """

    a: Step
    b: Step
    label_a: str
    label_b: str
    ops: pd.DataFrame
    kernels: pd.DataFrame

    def changed(self) -> pd.DataFrame:
        """Ops and kernels whose count or allocated bytes differ: the substance of the diff.
        (Time alone always differs a little; it is reported, never a reason to list a row.)"""
        rows = pd.concat([self.ops.assign(kind="op"), self.kernels.assign(kind="GPU")], ignore_index=True)
        return rows[rows["_substance"]].drop(columns="_substance").reset_index(drop=True)

    def only_in(self, side: str) -> pd.DataFrame:
        """Rows found in only one step: ``side`` is ``"a"``, ``"b"`` or that step's label."""
        side = {self.label_a: "a", self.label_b: "b"}.get(side, side)
        if side not in ("a", "b"):
            raise ValueError(f"side must be 'a', 'b', {self.label_a!r} or {self.label_b!r}, got {side!r}")
        return self.changed()[lambda t: t["only_in"] == side]

    def totals(self) -> pd.DataFrame:
        """The two steps' summaries side by side, with the change."""
        sa, sb = self.a.summary(), self.b.summary()
        keys = [k for k in sa if k != "label"]
        return pd.DataFrame({self.label_a: [sa[k] for k in keys], self.label_b: [sb[k] for k in keys],
                             "change": [sb[k] - sa[k] for k in keys]}, index=keys)

    def table(self, everything: bool = False) -> pd.DataFrame:
        """The diff for display: by default only the rows of substance."""
        rows = pd.concat([self.ops.assign(kind="op"), self.kernels.assign(kind="GPU")], ignore_index=True)
        if not everything:
            rows = rows[rows["_substance"]]
        a, b = self.label_a, self.label_b
        return pd.DataFrame({
            "kind": rows["kind"], "name": rows["name"].str.slice(0, 60), "input shapes": rows["shapes"],
            f"count {a}": rows["count_a"], f"count {b}": rows["count_b"], "count change": rows["count_change"],
            f"self time {a} (us)": rows["time_us_a"].round(1), f"self time {b} (us)": rows["time_us_b"].round(1),
            "allocated change (KiB)": (rows["alloc_bytes_change"] / 1024).round(1),
            "only in": rows["only_in"].map({"a": a, "b": b, "": ""}),
        }).reset_index(drop=True)

    def figure(self, ax=None, max_rows: int = 12):
        """Self time of every changed row in both steps; the unchanged rest as a note.

        A row found in one step only has a single bar; its label says the count (a → b)
        and the allocation change. Returns the matplotlib Figure.
        """
        import matplotlib.pyplot as plt  # like timeline(): a notebook shows it at the cell's end

        changed = self.changed().head(max_rows)
        rest = pd.concat([self.ops, self.kernels])
        rest = rest[~rest["_substance"]]
        labels = [f"{n.replace('aten::', '')[:32]} {s[:34]}\n{ca} → {cb}"
                  + (f", {alloc / 2**20:+.2f} MiB" if alloc else "")
                  for n, s, ca, cb, alloc in zip(changed["name"], changed["shapes"], changed["count_a"],
                                                 changed["count_b"], changed["alloc_bytes_change"])]
        if ax is None:
            _, ax = plt.subplots(figsize=(10, 0.7 * max(len(labels), 1) + 1.8))
        fig = ax.figure
        y = list(range(len(labels)))
        ax.barh([i - 0.2 for i in y], changed["time_us_a"] / 1e3, height=0.38, color="#d62728", label=self.label_a)
        ax.barh([i + 0.2 for i in y], changed["time_us_b"] / 1e3, height=0.38, color="#1f77b4", label=self.label_b)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        if not labels:
            ax.text(0.5, 0.5, "no op or kernel changed its count or allocation", ha="center",
                    va="center", transform=ax.transAxes)
        ax.set_xlabel("self time in one step (ms)\n"
                      f"everything else: {len(rest)} matched rows with the same counts and bytes, "
                      f"{rest['time_us_a'].sum() / 1e3:.2f} ms ({self.label_a}) vs "
                      f"{rest['time_us_b'].sum() / 1e3:.2f} ms ({self.label_b})")
        ax.set_title(f"what changed from {self.label_a} to {self.label_b}")
        ax.legend(loc="best", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        return fig

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def diff(a: Step, b: Step, label_a: Optional[str] = None, label_b: Optional[str] = None) -> StepDiff:
    """Compare two steps op by op (name and input shapes) and kernel by kernel (name and
    launch shape): what only one of them runs, and which counts, times and allocations moved.

    ``diff(naive_step, inplace_step).table()`` lists the rows of substance (count or bytes
    changed); ``.figure()`` draws them; ``.totals()`` compares the two steps' summaries.
    """
    if not isinstance(a, Step) or not isinstance(b, Step):
        raise TypeError(f"diff compares two Steps (profile(...).step(i)), got {type(a).__name__} and {type(b).__name__}")
    label_a, label_b = label_a or a.label, label_b or b.label
    if label_a == label_b:
        label_a, label_b = f"{label_a} (a)", f"{label_b} (b)"
    return StepDiff(a, b, label_a, label_b, _compare(_op_groups(a), _op_groups(b)),
                    _compare(_kernel_groups(a), _kernel_groups(b)))

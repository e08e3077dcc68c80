"""A folder of per-rank profiler traces, read side by side.

``load_ranks(folder)`` reads every ``*.json`` / ``*.json.gz`` in it with ``kernels.trace.reader``,
ordered by rank (the trace's ``distributedInfo``, else ``rank-N`` in the file name).
``folder.step(label)`` picks the same step on every rank, a :class:`RankStep`, which answers:
``summary()`` (per rank: compute, communication, their overlap, exposed communication, idle,
the wait on the slowest rank), ``critical_path()`` (the rank that set the pace of each round)
and ``timeline()`` (a track per rank). ``activity`` says what counts as communication: NCCL
kernels on a GPU trace, the process group's ``gloo:*`` ranges on a CPU one; compute is the
rest of the step's GPU work, or the step thread's time inside CPU ops that do not wait.

What a ``gloo:*`` range spans: it starts when the request is created (PyTorch's ``Work``; for a
collective, when gloo's worker thread takes it up) and a point-to-point one ends when ``wait()``
returns: it lasts as long as the code took to come to wait, so it bounds the transfer from above
and never times it (``kernels.parallel.ring`` waits on a helper thread, so its ranges end when
the transfer completed). Where the rank program marks its blocking waits with ``<name>:wait ...``
ranges on the step's thread (the course's ring, Ulysses and step barrier do), exposed
communication is the time inside them: measured, not inferred from the gloo ranges; and a wait
whose name ends ``(arrived)`` found its transfer already complete (it hid behind the compute
before it), ``(in flight)`` did not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kernels.figures import apply_font_floor
from kernels.trace.events import DTYPE_BYTES, PROFILER_STEP, read_events
from kernels.trace.reader import Step, Trace, load_trace

COMM_SPAN = re.compile(r"^(gloo|nccl|mpi|ucc):")
WAIT_SPAN = re.compile(r"^[\w ]+:wait\b")
ARRIVED, IN_FLIGHT = "(arrived)", "(in flight)"
COMM_OP = re.compile(r"^(gloo|nccl|mpi|ucc):|^c10d::|^record_param_comms$")
COMM_KERNEL = re.compile(r"^nccl", re.IGNORECASE)
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
RECEIVES = re.compile(r"(^|[:_])(recv|irecv)$")
NCCL_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Byte": 1,
                    "Char": 1, "Int8": 1, "Bool": 1}
COLOURS = {"compute": "#4c72b0", "communication": "#dd8452", "wait": "#c44e52"}


@dataclass
class RankTrace:
    """One rank's trace: its rank, the world size it belonged to, its backend, the parsed trace."""

    rank: int
    world: Optional[int]
    backend: Optional[str]
    path: Path
    trace: Trace


def rank_of(raw: dict, path: Path) -> tuple[int, Optional[int], Optional[str]]:
    """(rank, world size, backend) from ``distributedInfo``, else the rank from the file name."""
    info = raw.get("distributedInfo") if isinstance(raw, dict) else None
    if isinstance(info, dict) and "rank" in info:
        return int(info["rank"]), info.get("world_size"), info.get("backend")
    found = RANK_IN_NAME.search(path.name)
    if found is None:
        raise ValueError(f"{path.name}: no distributedInfo in the trace and no rank-N in its name, so its rank "
                         "is unknown (name rank files rank-0.json.gz, rank-1.json.gz, ...)")
    return int(found.group(1)), None, None


def trace_files(folder) -> list[Path]:
    """The trace files of a rank folder (every *.json and *.json.gz in it), or the given list of
    files itself (a job's traces picked out of a folder that holds others)."""
    if isinstance(folder, (list, tuple)):
        files = [Path(f) for f in folder]
        absent = [str(f) for f in files if not f.is_file()]
        if not files or absent:
            raise ValueError(f"no such rank trace: {absent}" if absent else "an empty list of rank traces")
        return files
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of rank traces")
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    if not files:
        raise ValueError(f"{folder} holds no trace (*.json or *.json.gz)")
    return files


def load_ranks(folder) -> "RankFolder":
    """Every rank trace in ``folder`` (or a list of trace files), ordered by rank (a ValueError for a duplicate rank)."""
    ranks: dict[int, RankTrace] = {}
    for path in trace_files(folder):
        raw = read_events(path)
        rank, world, backend = rank_of(raw, path)
        if rank in ranks:
            raise ValueError(f"{path.name} and {ranks[rank].path.name} are both rank {rank}: one trace per rank")
        ranks[rank] = RankTrace(rank, world, backend, path, load_trace(raw))
        ranks[rank].trace.path = path
    return RankFolder([ranks[r] for r in sorted(ranks)])


class RankFolder:
    """The rank traces of one job, ordered by rank. ``world`` is the job's world size as the
    traces state it (or the number of files); ``missing`` the ranks without a file here."""

    def __init__(self, ranks: list[RankTrace]):
        self.ranks = ranks
        worlds = {r.world for r in ranks if r.world is not None}
        if len(worlds) > 1:
            raise ValueError(f"these traces come from jobs of different sizes (world sizes {sorted(worlds)})")
        self.world = worlds.pop() if worlds else len(ranks)
        self.missing = sorted(set(range(self.world)) - {r.rank for r in ranks})

    def __repr__(self) -> str:
        return (f"RankFolder(ranks {[r.rank for r in self.ranks]} of {self.world}"
                + (f", {len(self.missing)} missing" if self.missing else "") + ")")

    def steps(self, label: str, count: int) -> list["RankStep"]:
        """The first ``count`` steps labelled ``label``, each read once on every rank."""
        return [self.step(label, i) for i in range(count)]

    def step(self, label: Optional[str] = None, index: int = 0) -> "RankStep":
        """Step ``index`` labelled ``label`` on every rank; with no label, the ``index``-th
        ``ProfilerStep#N`` that every rank recorded (matched by name)."""
        if label is not None:
            return RankStep(self, [r.trace.steps(label)[index] for r in self.ranks], label)
        names = [set(s.label for s in r.trace.profiler_steps()) for r in self.ranks]
        common = sorted(set.intersection(*names), key=lambda n: int(n[len(PROFILER_STEP):] or 0))
        if not common:
            raise KeyError("no ProfilerStep#N recorded by every rank; name a label (labels of rank "
                           f"{self.ranks[0].rank}: {self.ranks[0].trace.labels()})")
        name = common[index]
        return RankStep(self, [next(s for s in r.trace.profiler_steps() if s.label == name) for r in self.ranks], name)


# ----------------------------------------------------------------------------- intervals

def _union(intervals) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(union) -> float:
    return float(sum(b - a for a, b in union))


def _overlap(u, v) -> float:
    """Length of the intersection of two unions of intervals (both sorted, disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(u) and j < len(v):
        lo, hi = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        total += max(0.0, hi - lo)
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clip(union, lo: float, hi: float):
    return [(max(a, lo), min(b, hi)) for a, b in union if b > lo and a < hi]


def _span_bytes(args: dict) -> float:
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if not dims or not types:
        return float("nan")
    n = int(np.prod(dims[0])) if dims[0] else 1
    return float(n * DTYPE_BYTES.get(types[0], 4))


def _kernel_bytes(args: dict) -> float:
    if "In msg nelems" not in args:
        return float("nan")
    return float(args["In msg nelems"]) * NCCL_DTYPE_BYTES.get(str(args.get("dtype")), 4)


def activity(step: Step) -> pd.DataFrame:
    """The step's compute, communication and (on a CPU trace whose program marks them) wait
    intervals, absolute µs, with names and bytes."""
    trace, t0, t1 = step.trace, float(step.range["ts"]), float(step.range["end"])
    gpu = trace.gpu
    gpu = gpu[(gpu["launch_ts"] >= t0) & (gpu["launch_ts"] <= t1)] if not gpu.empty else gpu
    if len(gpu):
        comm = np.array([bool(COMM_KERNEL.match(n)) for n in gpu["name"]], dtype=bool)
        return pd.DataFrame({"kind": np.where(comm, "communication", "compute"), "name": gpu["name"].values,
                             "ts": gpu["ts"].values, "end": gpu["end"].values,
                             "bytes": [_kernel_bytes(a) if c else float("nan") for a, c in zip(gpu["args"], comm)],
                             "where": "gpu"})
    spans = trace.spans
    pid = step.range["pid"]
    inside = spans[(spans["ts"] >= t0) & (spans["ts"] <= t1) & (spans["pid"] == pid)
                   & spans["cat"].isin(("user_annotation", "cpu_op"))]
    comm = inside[[bool(COMM_SPAN.match(n)) for n in inside["name"]]]
    top = _compute_ops(step, comm["ts"].to_numpy())
    waits = inside[(inside["tid"] == step.range["tid"]) & (inside["cat"] == "user_annotation")
                   & np.array([bool(WAIT_SPAN.match(n)) for n in inside["name"]], dtype=bool)]
    return pd.concat([
        pd.DataFrame({"kind": "compute", "name": top["name"].values, "ts": top["ts"].values, "end": top["end"].values,
                      "bytes": float("nan"), "where": "cpu"}),
        pd.DataFrame({"kind": "communication", "name": comm["name"].values, "ts": comm["ts"].values,
                      "end": comm["end"].values, "bytes": [_span_bytes(a) for a in comm["args"]], "where": "cpu"}),
        pd.DataFrame({"kind": "wait", "name": waits["name"].values, "ts": waits["ts"].values,
                      "end": waits["end"].values, "bytes": float("nan"), "where": "cpu"}),
    ], ignore_index=True).sort_values("ts", kind="stable").reset_index(drop=True)


def _compute_ops(step: Step, comm_starts: np.ndarray) -> pd.DataFrame:
    """The CPU ops of the step's own thread that compute: not the process group's own ops, and
    not an op that merely encloses communication (an autograd Function's apply around a whole
    ring, a collective's wrapper): what is left, unioned, is when the thread was computing."""
    ops = step.ops
    own = ops[(ops["pid"] == step.range["pid"]) & (ops["tid"] == step.range["tid"])]
    own = own[[not COMM_OP.match(n) for n in own["name"]]]
    starts = np.sort(comm_starts)
    encloses = np.searchsorted(starts, own["ts"].to_numpy(), "left") < np.searchsorted(starts, own["end"].to_numpy(), "left")
    return own[~encloses]


MATMULS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"}


def matmul_flop(step: Step) -> float:
    """FLOPs of the step's matrix products on its own process, from the shapes the profiler
    recorded (``record_shapes``): 2·m·k·n per (batched) product. The work a rank did, whatever
    the machine's load did to its time. 0 when the trace has no shapes."""
    ops = step.ops
    ops = ops[(ops["pid"] == step.range["pid"]) & ops["name"].isin(MATMULS)]
    total = 0.0
    for name, dims in zip(ops["name"], ops["input_dims"]):
        first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0  # their first input is the bias
        if len(dims) < first + 2 or len(dims[first]) < 2 or len(dims[first + 1]) < 2:
            continue  # no shapes recorded for this call
        a, b = dims[first], dims[first + 1]
        batch = int(np.prod(a[:-2])) if len(a) > 2 else 1
        total += 2.0 * batch * a[-2] * a[-1] * b[-1]
    return total


def _sent(rows: pd.DataFrame, world: int) -> float:
    comm = rows[rows["kind"] == "communication"]
    sent = 0.0
    for name, b in zip(comm["name"], comm["bytes"]):
        if RECEIVES.search(name.split("(")[0]) or np.isnan(b):
            continue
        sent += b * (world - 1) / world if "all_to_all" in name or "AllToAll" in name else b
    return sent


# ----------------------------------------------------------------------------- one step, every rank

class RankStep:
    """The same step on every rank of a folder."""

    def __init__(self, folder: RankFolder, steps: list[Step], label: str):
        self.folder, self.steps, self.label = folder, steps, label
        self.ranks = [r.rank for r in folder.ranks]
        self.activity = [activity(s) for s in steps]
        self._bounds = [self._extent(s, a) for s, a in zip(steps, self.activity)]
        self._union_cache: dict = {}
        self._summary: Optional[pd.DataFrame] = None

    @staticmethod
    def _extent(step: Step, rows: pd.DataFrame) -> tuple[float, float]:
        """Where the step's work lies: the GPU work's extent on a GPU trace, the label's range on a CPU."""
        if len(rows) and (rows["where"] == "gpu").all():
            return float(rows["ts"].min()), float(rows["end"].max())
        return float(step.range["ts"]), float(step.range["end"])

    def _unions(self, i: int):
        if i not in self._union_cache:
            self._union_cache[i] = self._compute_unions(i)
        return self._union_cache[i]

    def _compute_unions(self, i: int):
        """(compute, communication, waits) of rank ``i``, each a sorted union of intervals."""
        rows = self.activity[i]
        return tuple(_union(zip(rows.loc[rows["kind"] == kind, "ts"], rows.loc[rows["kind"] == kind, "end"]))
                     for kind in ("compute", "communication", "wait"))

    def marks_waits(self, i: int) -> bool:
        """Whether rank ``i``'s program marked where it blocked (``<name>:wait`` ranges)."""
        return bool((self.activity[i]["kind"] == "wait").any())

    def summary(self) -> pd.DataFrame:
        """One row per rank, µs: step, compute, communication, overlap (communication while
        computing), exposed communication, idle (none of these), behind_slowest (the slowest
        rank's compute minus this rank's), sent bytes, and the FLOPs of its matrix products
        (``matmul_flop``, from the recorded shapes). Computed once per step.

        Exposed communication is the time blocked in the program's ``<name>:wait`` ranges where it
        marks them (``waited_us`` too; ``exchanges`` counts the waits that say whether their
        transfer had arrived, ``arrived_before_wait`` those that had); elsewhere (NCCL kernels, a
        trace without such marks) it is communication not overlapping compute."""
        if self._summary is None:
            self._summary = self._summarize()
        return self._summary.copy()

    def _summarize(self) -> pd.DataFrame:
        rows = []
        for i, rank in enumerate(self.ranks):
            compute, comm, waits = self._unions(i)
            t0, t1 = self._bounds[i]
            overlap = _overlap(compute, comm)
            busy = _length(_union(compute + comm + waits))
            marked = self.marks_waits(i)
            names = self.activity[i].loc[self.activity[i]["kind"] == "wait", "name"]
            rows.append({"rank": rank, "step_us": t1 - t0, "compute_us": _length(compute),
                         "communication_us": _length(comm), "overlap_us": overlap,
                         "exposed_communication_us": _length(waits) if marked else _length(comm) - overlap,
                         "waited_us": _length(waits) if marked else float("nan"),
                         "exchanges": int(sum(n.endswith((ARRIVED, IN_FLIGHT)) for n in names)),
                         "arrived_before_wait": int(sum(n.endswith(ARRIVED) for n in names)),
                         "idle_us": max(0.0, (t1 - t0) - busy),
                         "sent_bytes": _sent(self.activity[i], self.folder.world),
                         "matmul_flop": matmul_flop(self.steps[i])})
        table = pd.DataFrame(rows).set_index("rank")
        table["behind_slowest_us"] = table["compute_us"].max() - table["compute_us"]
        table["hidden_fraction"] = (table["overlap_us"] / table["communication_us"]).where(
            table["communication_us"] > 0)
        return table

    def slowest_rank(self) -> int:
        """The rank with the most compute in this step: the one the others wait on."""
        return int(self.summary()["compute_us"].idxmax())

    def rounds(self, i: int) -> list[tuple[float, float]]:
        """Rank ``i``'s communication rounds: its communication intervals merged where they overlap."""
        return self._unions(i)[1]

    def critical_path(self) -> pd.DataFrame:
        """The pace-setter of each round: the step cut at the end of every communication round
        (the k-th round of each rank taken as the same round), and in each piece the rank that
        computed longest, since every other rank's next round waits for its data.

        Columns: round, rank (on the path), compute_us and exposed_us (its exposed communication,
        as ``summary`` counts it) in that piece, slack_us (how much less the least busy rank computed there).
        ``matched`` is False when the ranks did not record the same number of rounds (then
        only the rounds every rank has are compared, and the path is a lower bound)."""
        per_rank = [self.rounds(i) for i in range(len(self.ranks))]
        n = min(len(r) for r in per_rank)
        matched = len({len(r) for r in per_rank}) == 1
        rows = []
        for k in range(n + 1):
            pieces = []
            for i in range(len(self.ranks)):
                compute, comm, waits = self._unions(i)
                t0, t1 = self._bounds[i]
                lo = per_rank[i][k - 1][1] if k > 0 else t0
                hi = per_rank[i][k][1] if k < n else t1
                c = _length(_clip(compute, lo, hi))
                if self.marks_waits(i):
                    e = _length(_clip(waits, lo, hi))
                else:
                    e = _length(_clip(comm, lo, hi)) - _overlap(_clip(compute, lo, hi), _clip(comm, lo, hi))
                pieces.append((c, e))
            at = int(np.argmax([c for c, _ in pieces]))
            rows.append({"round": k, "rank": self.ranks[at], "compute_us": pieces[at][0], "exposed_us": pieces[at][1],
                         "slack_us": pieces[at][0] - min(c for c, _ in pieces), "matched": matched})
        return pd.DataFrame(rows)

    def timeline(self, title: Optional[str] = None) -> Figure:
        """A track per rank (compute above, communication below, and where the program marks them
        its blocking waits at the bottom), on one time axis in ms from the earliest start of the
        step on any rank."""
        fig = Figure(figsize=(8.5, 0.9 * len(self.ranks) + 1.4), layout="constrained")
        ax = fig.add_subplot()
        origin = min(b[0] for b in self._bounds)
        marked = any(self.marks_waits(i) for i in range(len(self.ranks)))
        rows = ((0.62, "compute"), (0.33, "communication"), (0.04, "wait")) if marked else \
            ((0.5, "compute"), (0.05, "communication"))
        labels = {"compute": "compute", "communication": "communication", "wait": "blocked in a wait"}
        ticks, names = [], []
        for i, rank in enumerate(self.ranks):
            base = (len(self.ranks) - 1 - i) * 1.0
            for (row, kind), union in zip(rows, self._unions(i)):
                ax.broken_barh([((a - origin) / 1e3, (b - a) / 1e3) for a, b in union],
                               (base + row, 0.26 if marked else 0.38), color=COLOURS[kind],
                               label=labels[kind] if i == 0 else None)
            ticks.append(base + 0.45)
            names.append(f"rank {rank}")
        ax.set_yticks(ticks, names)
        ax.set_xlabel("ms from the step's first start on any rank")
        below = "communication, then waits, below" if marked else "communication below"
        ax.set_title(title or f"{self.label}: a track per rank (compute above, {below})")
        ax.legend(loc="upper right", fontsize="small")
        ax.grid(True, axis="x", alpha=0.3)
        apply_font_floor(fig)
        return fig


# ----------------------------------------------------------------------------- several steps

# The columns of ``RankStep.summary`` that are times, in the order a table shows them.
TIME_COLUMNS = ["step_us", "compute_us", "communication_us", "overlap_us", "exposed_communication_us",
                "behind_slowest_us"]


def median_rank_step(steps: list["RankStep"]) -> "RankStep":
    """The step whose slowest rank took the median time: a representative one to draw.
    (``kernels.trace.reader.median_step`` does the same for one process's steps.)"""
    if not steps:
        raise ValueError("median_rank_step needs at least one step")
    return sorted(steps, key=lambda s: s.summary()["step_us"].max())[len(steps) // 2]


def step_totals(steps: list["RankStep"]) -> pd.DataFrame:
    """Each rank's summary summed over ``steps``: one step's times are noisy on a busy machine,
    their total much less so. The hidden fraction is recomputed from the totals."""
    if not steps:
        raise ValueError("step_totals needs at least one step")
    total = pd.concat([s.summary() for s in steps]).groupby(level=0).sum()
    total["hidden_fraction"] = total["overlap_us"] / total["communication_us"]
    return total


def in_ranges(steps: list["RankStep"], prefix: str) -> pd.Series:
    """µs each rank spent inside ranges whose name starts with ``prefix`` (a communication op
    or a wait), summed over ``steps``."""
    if not steps:
        raise ValueError("in_ranges needs at least one step")
    return pd.Series({rank: sum(float((rows["end"] - rows["ts"])[rows["name"].str.startswith(prefix)].sum())
                                for rows in (s.activity[i] for s in steps))
                      for i, rank in enumerate(steps[0].ranks)})


def times_ms(summary: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """The time columns of a summary (one step's or ``step_totals``) in ms, named without ``_us``."""
    return (summary[TIME_COLUMNS] / 1e3).round(digits).rename(columns=lambda c: c.replace("_us", " (ms)"))

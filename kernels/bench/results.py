"""A benchmark's results: one row per point, what the columns mean, and the files they go to.

A *point* is one implementation at one shape, dtype, causal flag and mode; ``BenchResult``
is its row, ``BenchResults`` the rows plus ``meta`` (``run_meta``: device, versions, peaks,
date, command, how everything was counted). ``save_results`` writes JSON and CSV,
``load_results`` reads the JSON back (older files too). The modes: ``forward`` (no grad),
``forward+backward`` (3.5x the forward's FLOPs), ``backward`` alone (replayed on forwards
made before the clock starts), ``decode`` (one query against a cache of ``seq`` keys).
``points_table`` is a run's points as a table to read. ``GOALS`` are the performance goals
MAINTAINING.md states.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from kernels.dtypes import dtype_name
from kernels.hw import devices
from kernels.registry import implementation, names
from kernels.bench.timing import MEMORY_METHODS

FORWARD, FORWARD_BACKWARD, BACKWARD, DECODE = "forward", "forward+backward", "backward", "decode"
MODES = (FORWARD, FORWARD_BACKWARD, BACKWARD, DECODE)
MODE_LABELS = {FORWARD: "fwd", FORWARD_BACKWARD: "fwd+bwd", BACKWARD: "bwd", DECODE: "decode"}

STATUSES = {
    "ok": "measured",
    "unavailable": "the implementation cannot run on this device (registry's reason)",
    "unsupported": "the implementation refuses these inputs (head dim, dtype, ...)",
    "skipped": "left out on purpose (e.g. the Triton interpreter on CPU)",
    "no backward": "forward+backward asked, but the implementation has no autograd",
    "oom": "out of memory",
    "error": "anything else went wrong; the reason holds the exception",
}

def first_line(err: BaseException) -> str:
    """An exception as a row's ``reason``: its first line (its type's name if it says nothing)."""
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


@dataclass
class BenchResult:
    """One point of a sweep. Times in milliseconds; ``None`` where nothing was measured."""

    impl: str
    device: str
    dtype: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    mode: str
    status: str = "ok"
    reason: str = ""
    reps: int = 0
    median_ms: Optional[float] = None
    p10_ms: Optional[float] = None
    p90_ms: Optional[float] = None
    flops: float = 0.0
    bytes: float = 0.0
    tflops: Optional[float] = None
    gbps: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    memory_method: str = ""
    # The first call alone (it autotunes, compiles, builds caches): never part of the warm-up's
    # estimate nor of the timed calls.
    first_call_ms: Optional[float] = None
    # The Triton configs the autotuner chose for this point, as JSON ({"fwd": {...}, ...});
    # None where nothing was autotuned (the interpreter, other implementations).
    config: Optional[str] = None
    # With repeats > 1 the whole sweep runs that many rounds: each round's median, as JSON,
    # and their spread, (max - min) / median of them.
    round_medians_ms: Optional[str] = None
    round_spread: Optional[float] = None
    # Queries per head (1 for decode; ``seq`` otherwise) and K/V heads (``heads`` unless
    # grouped-query attention shares them). None in files written before these columns.
    seq_q: Optional[int] = None
    kv_heads: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte that must cross memory."""
        return self.flops / self.bytes if self.bytes else float("nan")

    @property
    def backward(self) -> bool:
        """Whether a backward pass is timed (forward+backward, or backward alone)."""
        return self.mode in (FORWARD_BACKWARD, BACKWARD)

    def as_row(self) -> dict:
        """The fields, plus the derived ``intensity`` (FLOP/byte; None without bytes) that
        the CSV and JSON files show as a column of their own."""
        row = dataclasses.asdict(self)
        row["intensity"] = self.flops / self.bytes if self.bytes else None
        return row


FIELDS = [f.name for f in dataclasses.fields(BenchResult)]
COLUMNS = FIELDS + ["intensity"]   # what a file holds: the fields and the derived intensity


class BenchResults(list):
    """A list of BenchResult rows plus ``meta``: device, versions, date, command."""

    def __init__(self, rows: Iterable[BenchResult] = (), meta: Optional[dict] = None):
        super().__init__(rows)
        self.meta = dict(meta or {})

    def ok(self) -> "BenchResults":
        return BenchResults((r for r in self if r.ok), self.meta)

    def to_frame(self):
        """The rows as a pandas DataFrame, with the ``intensity`` column (pandas imported only when asked)."""
        import pandas as pd

        return pd.DataFrame([r.as_row() for r in self], columns=COLUMNS)


def points_table(results: Iterable[BenchResult], columns: Sequence[str], index: Optional[str] = None,
                 digits: int = 3):
    """The points as a table to read: ``columns`` (of ``COLUMNS``), one row per point, indexed
    by the column ``index`` if given, numbers rounded to ``digits`` decimals."""
    unknown = [c for c in [*columns, *([index] if index else [])] if c not in COLUMNS]
    if unknown:
        raise ValueError(f"no such column {', '.join(map(repr, unknown))}; the columns are: {', '.join(COLUMNS)}")
    frame = BenchResults(results).to_frame()
    if index is not None:
        frame = frame.set_index(index)
    return frame[list(columns)].round(digits)


# --------------------------------------------------------------------------- where and how (meta)

def locals_for_command(impls, seqs, head_dims, dtypes, causal, modes, batch, heads, kv_heads, device, reps):
    return dict(impls=list(impls), seqs=list(seqs), head_dims=list(head_dims),
                dtypes=[dtype_name(d) for d in dtypes], causal=list(causal), modes=list(modes),
                batch=batch, heads=heads, kv_heads=kv_heads, device=str(device), reps=reps)


def call_text(kwargs: dict) -> str:
    return "kernels.bench.sweep(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


def run_meta(device: torch.device, command: str) -> dict:
    description = devices.describe_device(device)
    return {
        "device": description,
        "peaks": peak_pair(device),
        "versions": description["versions"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "timing": ("CUDA events around each call" if device.type == "cuda"
                   else "time.perf_counter around each call"),
        "memory_methods": MEMORY_METHODS,
        "statuses": STATUSES,
        "flops": ("reference.flops: 4·B·H·S²·D per forward, halved when causal; backward 2.5x forward, "
                  "forward+backward 3.5x; decode (Sq = 1 against Sk keys): reference.decode_flops, "
                  "4·B·H·Sk·D, never halved"),
        "bytes": ("reference.io_bytes: q, k, v, o once (plus dO, dQ, dK, dV for backward), K/V at kv_heads; "
                  "decode: the K/V cache 2·B·Hkv·Sk·D plus q and o; "
                  f"S×S scores written and read once for {', '.join(n for n in names() if implementation(n).materializes_scores)}"),
    }


def peak_pair(device: torch.device) -> dict:
    """The datasheet's peaks (a GPU in devices' table; None otherwise) beside measured ones
    (a matmul and a copy on this device, well under two seconds; GPU only when one is there)."""
    datasheet = devices.match_gpu(devices.device_name(device)) if device.type == "cuda" else None
    measured = devices.measured_peaks(str(device))
    return {"datasheet": datasheet.as_dict() if datasheet else None, "measured": measured.as_dict(),
            "note": "datasheet: dense bf16 peak and HBM bandwidth as published; measured: what this "
                    "device reached in a matmul and a copy just now"}


# --------------------------------------------------------------------------- files

def output_paths(out) -> tuple[Path, Path]:
    """``out`` as a stem (``bench`` -> bench.json, bench.csv), a .json/.csv name, or a folder."""
    out = Path(out)
    if out.is_dir() or str(out).endswith(os.sep):
        out = out / "bench"
    elif out.suffix in (".json", ".csv"):
        out = out.with_suffix("")
    return out.with_name(out.name + ".json"), out.with_name(out.name + ".csv")


def save_results(results: BenchResults, out) -> tuple[Path, Path]:
    """Write ``results`` as JSON (rows + meta) and CSV (rows); return both paths."""
    json_path, csv_path = output_paths(out)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r.as_row() for r in results]
    json_path.write_text(json.dumps({"meta": getattr(results, "meta", {}), "results": rows},
                                    indent=1, allow_nan=False) + "\n")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return json_path, csv_path


def load_results(path) -> BenchResults:
    """Read back the JSON file (rows and meta) that save_results wrote; a stem or the CSV's
    name finds it. The CSV beside it is for spreadsheets and ``pandas.read_csv``: it holds
    the same rows, without their types and without the meta."""
    path = output_paths(path)[0] if Path(path).suffix != ".json" else Path(path)
    data = json.loads(path.read_text())
    # Derived columns (intensity) are recomputed, not stored; absent columns take their default.
    return BenchResults((BenchResult(**{k: v for k, v in row.items() if k in FIELDS}) for row in data["results"]),
                        data.get("meta", {}))


# ------------------------------------------------------------------------ the goals

# The course's kernels against SDPA's flash backend, on H100/H200, causal bf16, S 1k-16k,
# D 64 and 128 (MAINTAINING.md, "Performance goals"): (implementation, mode, least speed ratio).
GOALS = (("triton", FORWARD, 1.0), ("triton", FORWARD_BACKWARD, 0.85), ("cuda_v2", FORWARD, 0.7))
GOAL_BASELINE = "sdpa_flash"

"""Trim a Kineto trace to one step: what the book ships of a trace recorded by others.

    python -m tools.trim_trace SOURCE DEST [--step N] [--drop-python]

Keeps, of SOURCE, the events of one profiler step (``ProfilerStep#N``, by default the first):
every CPU event (ops, labels, Python frames, runtime and driver
calls, instant and ``[memory]`` events) that starts inside the range, the GPU work (kernels,
memcpys, memsets) those launches queued, wherever it ran, with its flow arrows, the GPU-side
label of the same range, and every metadata event (process and thread names) and top-level field
(``deviceProperties``, ``distributedInfo``, ``metadata``...). The range is half open, [start, end),
as ``kernels.trace.reader`` cuts steps, so the trimmed file's step has the same ops, GPU work and
times as the source's. Adds one top-level field, ``trimmed``, saying from what and how.
``--drop-python`` also leaves out the Python frames (``python_function`` events, what
``with_stack=True`` records): no op, launch or GPU work is among them, and in a model with many
small Python calls they are most of the file. DEST is written gzip-compressed with no timestamp in the header (the same input gives the same bytes).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Optional

STEP_PREFIX = "ProfilerStep#"
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
GPU_LABEL = "gpu_user_annotation"


def read(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        raw = json.load(f)
    if not isinstance(raw, dict) or not isinstance(raw.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Kineto trace (no traceEvents list)")
    return raw


def the_range(events: list[dict], step: Optional[int]) -> dict:
    """The CPU-side profiler step to keep (a ValueError lists the steps the trace has)."""
    ranges = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "Operator")),
                    key=lambda e: float(e.get("ts", 0)))
    steps = [e for e in ranges if str(e.get("name", "")).startswith(STEP_PREFIX)]
    wanted = [e for e in steps if step is None or e["name"] == f"{STEP_PREFIX}{step}"]
    if not wanted:
        raise ValueError(f"no {STEP_PREFIX}{step if step is not None else 'N'} in it; its profiler steps: "
                         f"{[e['name'] for e in steps] or 'none'}")
    return wanted[0]


def trim(raw: dict, step: Optional[int] = None, source: str = "", drop_python: bool = False) -> dict:
    """A new trace dict holding only the chosen range's events (see the module docstring)."""
    events = [e for e in raw["traceEvents"] if isinstance(e, dict)]
    r = the_range(events, step)
    t0, t1 = float(r["ts"]), float(r["ts"]) + float(r.get("dur", 0))

    def inside(e: dict) -> bool:
        return t0 <= float(e.get("ts", 0)) < t1

    kept_launches = {e.get("args", {}).get("correlation") for e in events
                     if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES and inside(e)}
    kept_launches.discard(None)
    out = []
    for e in events:
        ph, cat = e.get("ph"), e.get("cat")
        if drop_python and cat == "python_function":
            keep = False
        elif ph == "M":
            keep = True     # process and thread names, sort indices
        elif cat in GPU_CATEGORIES:
            keep = e.get("args", {}).get("correlation") in kept_launches
        elif ph in ("s", "f"):
            keep = e.get("id") in kept_launches if cat == "ac2g" else inside(e)
        elif cat == GPU_LABEL:
            keep = e.get("name") == r.get("name")
        else:
            keep = inside(e)
        if keep:
            out.append(e)
    trimmed = {k: v for k, v in raw.items() if k != "traceEvents"}
    trimmed["traceEvents"] = out
    trimmed["trimmed"] = {"from": source, "range": r.get("name"), "events_kept": len(out),
                          "events_in_source": len(events), "python_frames": not drop_python,
                          "by": "tools/trim_trace.py"}
    return trimmed


def write(trace: dict, dest: Path) -> None:
    data = json.dumps(trace, separators=(",", ":")).encode()
    with open(dest, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as z:
        z.write(data)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.trim_trace", description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--step", type=int, help="N of ProfilerStep#N (default: the first profiler step)")
    parser.add_argument("--drop-python", action="store_true", help="leave out the Python frames (python_function)")
    args = parser.parse_args(argv)
    try:
        trace = trim(read(args.source), args.step, source=args.source.name, drop_python=args.drop_python)
    except (OSError, ValueError) as e:
        print(f"error: {args.source}: {e}", file=sys.stderr)
        return 1
    write(trace, args.dest)
    info = trace["trimmed"]
    print(f"{args.dest}: {info['range']}, {info['events_kept']} of {info['events_in_source']} events, "
          f"{args.dest.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

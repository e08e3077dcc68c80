"""``python -m kernels.trace.attention``: the attention report of one trace, or two side by side.

    python -m kernels.trace.attention TRACE [--step N] [--json]
    python -m kernels.trace.attention TRACE --capture CAPTURE_TRACE      # a serving engine's replay
    python -m kernels.trace.attention TRACE --heads 32/8 --head-dim 128  # heads given by hand
    python -m kernels.trace.attention TRACE --device "AMD Instinct MI300X"
    python -m kernels.trace.attention A B [--json]                       # matched by shape

``--capture`` may be given once per trace (the first goes with A, the second with B); ``--heads``,
``--head-dim`` and ``--device`` apply to every trace given. Errors are one line in words on stderr,
exit status 1.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import zlib
from pathlib import Path
from typing import Optional

from kernels.trace import serving
from kernels.trace.attention.calls import AttentionReport
from kernels.trace.attention.find import find_attention
from kernels.trace.attention_text import report_text
from kernels.trace.events import PROFILER_STEP
from kernels.trace.reader import Trace, load_trace
from kernels.trace.reader import Step
from kernels.trace.side_by_side import side_by_side


class TraceError(Exception):
    """A trace the command cannot report on, in words."""


def pick_step(trace: Trace, number: Optional[int]) -> Step:
    """``ProfilerStep#number`` (the first profiler step when None); the whole trace when it has
    no profiler steps."""
    steps = trace.profiler_steps()
    if not steps:
        if number is not None:
            raise TraceError(f"--step {number}: this trace has no profiler steps (ProfilerStep#N); "
                             "leave out --step to read it whole")
        return trace.whole()
    if number is None:
        return steps[0]
    for s in steps:
        if s.label == f"{PROFILER_STEP}{number}":
            return s
    there = ", ".join(s.label[len(PROFILER_STEP):] for s in steps)
    raise TraceError(f"--step {number}: no {PROFILER_STEP}{number} in this trace; its steps are {there}")


def read_trace(path: str, require_gpu: bool = True) -> Trace:
    """A trace file, or a TraceError in words (``require_gpu=False`` for a graph-capture trace,
    which may have no kernel at all)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{path}: no such file")
    if not p.is_file():
        raise TraceError(f"{path}: not a file")
    try:
        trace = load_trace(p)
    except (ValueError, UnicodeDecodeError, OSError, EOFError, zlib.error) as e:
        raise TraceError(f"{path}: not a Kineto trace ({_first_line(e)})") from None
    if require_gpu and not trace.has_gpu:
        raise TraceError(f"{path}: no GPU work in it (no kernel, memcpy or memset events): "
                         "a CPU-only trace has no attention kernels to report")
    return trace


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.trace.attention",
        description="Every attention call in one step of a Kineto (PyTorch profiler) trace: its kernels, GPU "
                    "time, shapes, FLOPs, bytes, TFLOP/s, TB/s and the roof it sits under; with two traces, "
                    "both reports and their calls matched by shape.")
    parser.add_argument("traces", nargs="+", metavar="TRACE",
                        help="one or two trace files (.json or .json.gz) exported by torch.profiler")
    parser.add_argument("--step", type=int, default=None,
                        help="N of ProfilerStep#N (default: the first; a trace without steps is read whole)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--capture", action="append", default=[], metavar="TRACE",
                        help="the serving engine's graph-capture trace of the same run (its attention ops' "
                             "shapes give the heads and head dims); once per trace, in order")
    parser.add_argument("--heads", default=None, metavar="HQ/HKV",
                        help="query heads / KV heads, where no op of the trace records them (with --head-dim)")
    parser.add_argument("--head-dim", type=int, default=None, metavar="D", help="the head dim (with --heads)")
    parser.add_argument("--device", default=None, metavar="NAME",
                        help="the GPU's name (e.g. 'NVIDIA H100 SXM') where the trace does not name it")
    return parser


def _reports(args) -> list[AttentionReport]:
    if len(args.traces) > 2:
        raise TraceError(f"{len(args.traces)} traces given: give one, or two to set side by side")
    if len(args.capture) > len(args.traces):
        raise TraceError(f"{len(args.capture)} --capture traces for {len(args.traces)} traces: one per trace at most")
    if (args.heads is None) != (args.head_dim is None):
        raise TraceError("--heads and --head-dim go together (e.g. --heads 32/8 --head-dim 128)")
    try:
        heads = serving.heads_from_user(args.heads, args.head_dim, None) if args.heads else None
    except ValueError as e:
        raise TraceError(str(e)) from None
    reports = []
    for i, path in enumerate(args.traces):
        capture = read_trace(args.capture[i], require_gpu=False) if i < len(args.capture) else None
        step = pick_step(read_trace(path), args.step)
        reports.append(find_attention(step, capture=capture, heads=heads, device=args.device))
    return reports


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    # A big trace is millions of small dicts with no reference cycles: the collector's repeated
    # passes over them while json.load builds them cost as much as the parse itself.
    gc.disable()
    try:
        reports = _reports(args)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        gc.enable()
    names = [Path(t).name for t in args.traces]
    try:
        if len(reports) == 1:
            if args.json:
                print(json.dumps({"trace": names[0], **reports[0].as_dict()}, indent=1))
            else:
                print(f"trace: {names[0]}")
                print(report_text(reports[0]))
        else:
            pair = side_by_side(*reports)
            if args.json:
                out = pair.as_dict()
                out["a"] = {"trace": names[0], **out["a"]}
                out["b"] = {"trace": names[1], **out["b"]}
                print(json.dumps(out, indent=1))
            else:
                for label, name, report in zip("AB", names, reports):
                    print(f"===== {label}: {name}")
                    print(report_text(report))
                    print()
                print(f"===== A and B side by side: calls matched by shape (A: {names[0]}, B: {names[1]})")
                print(pair.table().to_string(index=False) if pair.matched else "no call of A has the shape of a call of B")
                for side, groups in (("A", [g for g in pair.groups if not g.b]), ("B", [g for g in pair.groups if not g.a])):
                    for g in groups:
                        print(f"only in {side}: {len(g.a or g.b)} calls of shape {g.shape}")
        sys.stdout.flush()
    except BrokenPipeError:   # the reader piped it into head: not an error of theirs
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


__all__ = ["TraceError", "main", "pick_step", "read_trace"]

"""Every attention call in a model's step, however it was written, with what it cost on the GPU.

``find_attention(step)`` reads one ``Step`` (``kernels.trace.reader``) of any Kineto trace, from
any vendor, and returns an ``AttentionReport``: one ``AttentionCall`` per attention forward, found
three ways, in this order:

- **fused**: an attention op (``aten::scaled_dot_product_attention`` and its backend op, down to
  the kernel that ran: FlashAttention-2's ``flash_fwd_kernel``, ``fmha_cutlass*``, cuDNN's, AMD's
  ``attn_fwd``; other libraries' ops). The call is the outermost such op; its kernels are every
  kernel launched inside it. Ops and kernels are recognised from the tables ``ATTENTION_OPS`` and
  ``ATTENTION_KERNELS`` in ``kernels.trace.fingerprints``, not by special code.
- **by kernel name**: attention kernels that no op launched (a CUDA/HIP graph replays them: a
  serving engine's decode step). Each "main" kernel opens a call; a "combine" kernel after it on
  the same stream (the reduce of a split over the KV cache) joins it. Shapes are unknown there.
- **hand-written**: the core ``scores = q @ k^T``, ``softmax(scores)``, ``scores @ v`` (matmul,
  bmm or baddbmm, then softmax, then a matmul on the softmax's shape) on one thread; the call is
  everything launched from the first GEMM to the last, the scale and mask between them included.

FLOPs (forward, the convention of the FlashAttention benchmarks and of TraceLens): the two
matrix products, ``2·B·H·Sq·Sk·D`` for the scores and ``2·B·H·Sq·Sk·Dv`` for the product with V
(``4·B·H·Sq·Sk·D`` when Dv = D), H the query heads; softmax and scaling are not counted. A causal
fused call counts half (its kernel skips the masked tiles; exact only for Sq = Sk). A fused call
whose trace did not record ``is_causal`` gets no FLOPs rather than a guess. A hand-written core
counts in full: its GEMMs compute every score, masked or not. Achieved TFLOP/s is FLOPs over the
call's GPU time (the sum of all its kernels' durations), and its share of the device's dense
16-bit peak (``kernels.hw.devices``, datasheet figures) is given for 16-bit inputs only.

The kernel's footprint (grid, block, registers per thread, shared memory) and Kineto's estimated
occupancy come from the call's main kernel (its attention kernel, else its longest), where the
trace records them (CUDA traces do; ROCm traces record grid and block only). Attention's share of
the step is its GPU time over the step's (``Step.gpu_time_us``: every kernel, memcpy and memset,
summed over streams).

From a shell: ``python -m kernels.trace.attention TRACE [--step N] [--json]``.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd

from kernels.hw.devices import Peaks, match_gpu
from kernels.trace.fingerprints import ATTENTION_OPS, attention_kernel
from kernels.trace.reader import PROFILER_STEP, Step, Trace, load_trace

SCORE_GEMMS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm"})
SOFTMAXES = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
SIXTEEN_BIT = {"c10::BFloat16": "bf16", "c10::Half": "fp16"}
TYPE_NAMES = {**SIXTEEN_BIT, "float": "fp32", "double": "fp64"}
FOOTPRINT = ("grid", "block", "registers_per_thread", "shared_memory", "occupancy_pct")


@dataclass
class AttentionCall:
    """One attention forward in a step: how it was found, its kernels, shapes and cost."""

    how: str                        # "fused", "kernels" (by name, no op) or "hand-written"
    library: str
    op: Optional[str]               # the outermost op of the call (None: kernels by name)
    kernels: pd.DataFrame = field(repr=False)   # its rows of Step.gpu_work, in GPU start order
    batch_heads: Optional[int] = None           # B·H (query heads), None where shapes are unknown
    sq: Optional[int] = None
    sk: Optional[int] = None
    d: Optional[int] = None
    dv: Optional[int] = None
    shapes: Optional[dict] = None   # the recorded input dims it was read from
    causal: Optional[bool] = None   # None: not recorded (hand-written cores, some traces)
    dtype: Optional[str] = None
    cpu_start_us: Optional[float] = None    # where its ops begin on the CPU (None: kernels by name)
    cpu_us: Optional[float] = None          # its ops' CPU wall time, launches included

    @property
    def gpu_us(self) -> float:
        return float(self.kernels["dur_us"].sum())

    @property
    def start_us(self) -> float:
        """When its first kernel started (µs from the step's start); on a CPU-only trace, its first op."""
        if len(self.kernels):
            return float(self.kernels["start_us"].min())
        return self.cpu_start_us if self.cpu_start_us is not None else math.nan

    @property
    def flops(self) -> Optional[float]:
        """Forward FLOPs by the module's convention; None where shapes or causality are unknown."""
        bh, sq, sk, d, dv = self.batch_heads, self.sq, self.sk, self.d, self.dv
        if bh is None or sq is None or sk is None or d is None or dv is None:
            return None
        full = 2.0 * bh * sq * sk * (d + dv)
        if self.how == "hand-written":
            return full
        if self.causal is None:
            return None
        return full / 2 if self.causal else full

    @property
    def tflops(self) -> Optional[float]:
        flops = self.flops
        return flops / (self.gpu_us * 1e-6) / 1e12 if flops is not None and self.gpu_us > 0 else None

    def main_kernel(self) -> Optional[pd.Series]:
        """The call's attention kernel (by name), else its longest kernel."""
        k = self.kernels[self.kernels["cat"] == "kernel"]
        if k.empty:
            return None
        named = k[[attention_kernel(n) is not None for n in k["name"]]]
        pool = named if len(named) else k
        return pool.loc[pool["dur_us"].idxmax()]

    def footprint(self) -> dict:
        """Grid, block, registers per thread, shared memory (bytes) and Kineto's estimated
        occupancy (%) of the main kernel; None for what the trace did not record."""
        main = self.main_kernel()
        if main is None:
            return dict.fromkeys(FOOTPRINT)
        return {k: _plain(main[k]) for k in FOOTPRINT}

    def as_dict(self, peak_flops: Optional[float] = None) -> dict:
        main = self.main_kernel()
        return {
            "how": self.how, "library": self.library, "op": self.op,
            "kernels": self.kernels["name"].tolist(),
            "main_kernel": None if main is None else main["name"],
            "start_us": round(self.start_us, 3), "gpu_us": round(self.gpu_us, 3), "cpu_us": self.cpu_us,
            "batch_heads": self.batch_heads, "sq": self.sq, "sk": self.sk, "d": self.d, "dv": self.dv,
            "shapes": self.shapes, "causal": self.causal, "dtype": self.dtype,
            "flops": self.flops, "tflops": self.tflops, "peak_share": self.peak_share(peak_flops),
            **self.footprint(),
        }

    def peak_share(self, peak_flops: Optional[float]) -> Optional[float]:
        """Achieved FLOP/s over the device's dense 16-bit peak, for 16-bit inputs only."""
        t = self.tflops
        if t is None or not peak_flops or self.dtype not in SIXTEEN_BIT.values():
            return None
        return t * 1e12 / peak_flops


@dataclass
class AttentionReport:
    """The attention calls of one step, with the device they ran on."""

    step: Step = field(repr=False)
    device: Optional[str]
    peaks: Optional[Peaks]
    calls: list[AttentionCall]

    @property
    def step_gpu_us(self) -> float:
        return self.step.gpu_time_us

    @property
    def attention_gpu_us(self) -> float:
        return sum(c.gpu_us for c in self.calls)

    @property
    def attention_share(self) -> Optional[float]:
        return self.attention_gpu_us / self.step_gpu_us if self.step_gpu_us > 0 else None

    def as_dict(self) -> dict:
        peak = self.peaks.flops if self.peaks else None
        return {
            "device": self.device,
            "peak_tflops": peak / 1e12 if peak else None,
            "peak_source": f"{self.peaks.name}: {self.peaks.source}" if self.peaks else None,
            "step": self.step.label, "step_gpu_us": round(self.step_gpu_us, 3),
            "attention_gpu_us": round(self.attention_gpu_us, 3), "attention_share": self.attention_share,
            "calls": [c.as_dict(peak) for c in self.calls],
        }

    def summary(self) -> dict:
        """The step's attention in one column, to set one model's step on two devices side by
        side: the device, how many calls, their kernels, the median call's GPU time, TFLOP/s and
        share of peak, attention's share of the step, and the first call's footprint ("not
        recorded" where the trace has none). Medians suit a step whose calls are alike (one
        model's layers); a step with calls of two shapes is better read with ``table``."""
        if not self.calls:
            raise ValueError(f"step {self.step.label} has no attention call to summarise")
        peak = self.peaks.flops if self.peaks else None
        calls = pd.DataFrame([{"gpu_us": c.gpu_us, "kernels": len(c.kernels), "tflops": c.tflops,
                               "peak": c.peak_share(peak)} for c in self.calls])
        mains = sorted({short_kernel_name(m["name"]) for m in (c.main_kernel() for c in self.calls) if m is not None})
        fp = self.calls[0].footprint()
        missing = "not recorded"
        share = self.attention_share
        return {
            "device": self.device or missing,
            "attention calls": len(self.calls),
            "kernels per call": int(calls["kernels"].median()),
            "main kernel": ", ".join(mains) or "none",
            "GPU µs per call (median)": round(float(calls["gpu_us"].median()), 1),
            "TFLOP/s (median)": _median_or(calls["tflops"], missing, 1),
            "% of dense 16-bit peak (median)": _median_or(100 * calls["peak"].astype(float), missing, 1),
            "attention's share of the step (%)": missing if share is None else round(100 * share, 1),
            "grid": dims_text(fp["grid"]) or missing, "block": dims_text(fp["block"]) or missing,
            "registers per thread": missing if fp["registers_per_thread"] is None else int(fp["registers_per_thread"]),
            "shared memory (KiB)": missing if fp["shared_memory"] is None else round(fp["shared_memory"] / 1024, 1),
            "occupancy (%)": missing if fp["occupancy_pct"] is None else fp["occupancy_pct"],
        }

    def table(self) -> pd.DataFrame:
        """One row per call, for display."""
        peak = self.peaks.flops if self.peaks else None
        rows = []
        for i, c in enumerate(self.calls):
            main, fp = c.main_kernel(), c.footprint()
            share = c.peak_share(peak)
            rows.append({
                "#": i, "how": c.how, "kernels": len(c.kernels),
                "main kernel": "" if main is None else short_kernel_name(main["name"]),
                "B·H x Sq x Sk x D": _shape_text(c), "causal": {None: "?", True: "yes", False: "no"}[c.causal],
                "GPU µs": round(c.gpu_us, 1),
                "GFLOP": "" if c.flops is None else f"{c.flops / 1e9:.2f}",
                "TFLOP/s": "" if c.tflops is None else f"{c.tflops:.1f}",
                "% peak": "" if share is None else f"{100 * share:.1f}",
                "grid": dims_text(fp["grid"]), "block": dims_text(fp["block"]),
                "regs": "" if fp["registers_per_thread"] is None else int(fp["registers_per_thread"]),
                "smem KiB": "" if fp["shared_memory"] is None else f"{fp['shared_memory'] / 1024:g}",
                "occ %": "" if fp["occupancy_pct"] is None else f"{fp['occupancy_pct']:g}",
            })
        return pd.DataFrame(rows)

    def text(self) -> str:
        """The report as a reader sees it in a terminal."""
        lines = [f"device: {self.device or 'not recorded (no deviceProperties)'}"
                 + (f"; dense 16-bit peak {self.peaks.flops / 1e12:g} TFLOP/s ({self.peaks.name}, "
                    f"{self.peaks.source})" if self.peaks else "; no datasheet peak known for it"),
                 f"step: {self.step.label}, GPU time {self.step_gpu_us / 1e3:.3f} ms"]
        if not self.calls:
            lines.append("no attention in this step: no attention op, no attention kernel by name, "
                         "no matmul -> softmax -> matmul core")
            return "\n".join(lines)
        share = self.attention_share
        lines.append(f"attention: {len(self.calls)} calls, {self.attention_gpu_us / 1e3:.3f} ms of GPU time"
                     + (f" ({100 * share:.1f}% of the step's)" if share is not None else ""))
        libraries = sorted({f"{c.how}: {c.library}" + (f" ({c.op})" if c.op else "") for c in self.calls})
        lines += [f"  {x}" for x in libraries]
        lines.append(self.table().to_string(index=False))
        lines.append("FLOPs: 2·B·H·Sq·Sk·(D + Dv), forward; causal fused calls count half; "
                     "TFLOP/s over the call's GPU time")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- finding calls

def find_attention(step: Step) -> AttentionReport:
    """Every attention call of ``step`` (see the module docstring for what counts)."""
    ops = step.ops
    kernels = step.gpu_work
    taken = pd.Series(False, index=kernels.index)
    calls: list[AttentionCall] = []
    inside_fused = pd.Series(False, index=ops.index)
    for row in _outermost(ops, [n in ATTENTION_OPS for n in ops["name"]]):
        call, span = _fused_call(ops, row, kernels)
        calls.append(call)
        taken |= kernels.index.isin(call.kernels.index)
        inside_fused |= span
    calls += _hand_written(ops[~inside_fused], ops, kernels[~taken])
    for call in calls:
        taken |= kernels.index.isin(call.kernels.index)
    calls += _by_kernel_name(kernels[~taken])
    calls.sort(key=lambda c: c.start_us)
    device = _device(step.trace)
    return AttentionReport(step, device, match_gpu(device) if device else None, calls)


def _device(trace: Trace) -> Optional[str]:
    names = sorted({p.get("name") for p in trace.device_properties if p.get("name")})
    return " and ".join(names) if names else None


def _outermost(ops: pd.DataFrame, mask: list) -> list[int]:
    """Rows where ``mask`` holds and no ancestor's does."""
    parent = ops["parent"].tolist()
    rows = []
    for i, hit in enumerate(mask):
        if not hit:
            continue
        p = parent[i]
        while p >= 0 and not mask[p]:
            p = parent[p]
        if p < 0:
            rows.append(i)
    return rows


def _span(ops: pd.DataFrame, row: int) -> pd.Series:
    """The op at ``row`` and everything nested in it (time containment on its thread)."""
    r = ops.loc[row]
    return (ops["tid"] == r["tid"]) & (ops["pid"] == r["pid"]) & (ops["ts"] >= r["ts"]) & (ops["end"] <= r["end"])


def _launched_between(kernels: pd.DataFrame, tid, t0: float, t1: float) -> pd.DataFrame:
    """Kernels launched from thread ``tid`` between t0 and t1 (µs from the step's start)."""
    return kernels[(kernels["thread"] == tid) & (kernels["launch_start_us"] >= t0) & (kernels["launch_start_us"] <= t1)]


def _fused_call(ops: pd.DataFrame, row: int, kernels: pd.DataFrame) -> tuple[AttentionCall, pd.Series]:
    span = _span(ops, row)
    r = ops.loc[row]
    mine = _launched_between(kernels, r["tid"], r["start_us"], r["start_us"] + r["dur_us"])
    named = [attention_kernel(n) for n in mine["name"]]
    library = next((x[0] for x in named if x), ATTENTION_OPS[r["name"]].library)
    call = AttentionCall("fused", library, r["name"], mine, cpu_start_us=float(r["start_us"]),
                         cpu_us=float(r["dur_us"]))
    inner = ops[span & ops["name"].isin(list(ATTENTION_OPS))]   # the op itself first, then its backend ops
    for _, op in inner.iterrows():
        spec = ATTENTION_OPS[op["name"]]
        if call.causal is None and spec.causal_arg is not None:
            call.causal = _flag(op["concrete_inputs"], spec.causal_arg)
        if call.sq is None and spec.layout:
            _read_fused_shapes(call, op["input_dims"], spec.layout)
        if call.dtype is None and op["input_types"]:
            call.dtype = TYPE_NAMES.get(op["input_types"][0], op["input_types"][0] or None)
    return call, span


def _flag(concrete: list, index: int) -> Optional[bool]:
    value = concrete[index] if index < len(concrete) else ""
    return {"True": True, "False": False, "1": True, "0": False}.get(str(value).strip())


def _read_fused_shapes(call: AttentionCall, dims: list, layout: str) -> None:
    if len(dims) < 3 or not all(isinstance(x, list) and len(x) == 4 for x in dims[:3]):
        return
    q, k, v = dims[:3]
    if layout == "BSHD":   # to [B, H, S, D]
        q, k, v = ([x[0], x[2], x[1], x[3]] for x in (q, k, v))
    call.batch_heads, call.sq, call.d = q[0] * q[1], q[2], q[3]
    call.sk, call.dv = k[2], v[3]
    call.shapes = {"q": q, "k": k, "v": v, "layout": "BHSD"}


def _hand_written(candidates: pd.DataFrame, ops: pd.DataFrame, kernels: pd.DataFrame) -> list[AttentionCall]:
    """matmul -> softmax -> matmul chains, on each thread, matched by their shapes."""
    names = ops["name"].tolist()
    parent = ops["parent"].tolist()

    def outer(row: int, family: frozenset) -> bool:
        return names[row] in family and (parent[row] < 0 or names[parent[row]] not in family)

    calls = []
    for _, thread in candidates.groupby(["pid", "tid"], sort=False):
        gemms = [i for i in thread.index if outer(i, SCORE_GEMMS)]
        used: set = set()
        for s in (i for i in thread.index if outer(i, SOFTMAXES)):
            x = ops.at[s, "input_dims"][0] if ops.at[s, "input_dims"] else []
            if len(x) < 2:
                continue
            sq, sk = x[-2], x[-1]
            score = next((g for g in reversed(gemms) if ops.at[g, "end"] <= ops.at[s, "ts"] and g not in used
                          and _is_score_gemm(ops.at[g, "input_dims"], sq, sk)), None)
            pv = next((g for g in gemms if ops.at[g, "ts"] >= ops.at[s, "end"] and g not in used
                       and _is_value_gemm(ops.at[g, "input_dims"], sq, sk)), None)
            if score is None or pv is None:
                continue
            used |= {score, pv}
            a, b = ops.at[score, "input_dims"][:2]
            v = ops.at[pv, "input_dims"][1]
            mine = _launched_between(kernels, ops.at[score, "tid"], ops.at[score, "start_us"],
                                     ops.at[pv, "start_us"] + ops.at[pv, "dur_us"])
            types = ops.at[score, "input_types"]
            calls.append(AttentionCall(
                "hand-written", "PyTorch ops", f"{names[score]} -> {names[s]} -> {names[pv]}", mine,
                batch_heads=max(math.prod(a[:-2]), math.prod(b[:-2])), sq=sq, sk=sk, d=a[-1], dv=v[-1],
                shapes={"scores": [a, b], "softmax": x, "values": ops.at[pv, "input_dims"][:2]},
                dtype=TYPE_NAMES.get(types[0]) if types else None, cpu_start_us=float(ops.at[score, "start_us"]),
                cpu_us=float(ops.at[pv, "end"] - ops.at[score, "ts"])))
    return calls


def _is_score_gemm(dims: list, sq: int, sk: int) -> bool:
    if len(dims) < 2 or not all(isinstance(x, list) and len(x) >= 2 for x in dims[:2]):
        return False
    a, b = dims[:2]
    return a[-2] == sq and b[-1] == sk and a[-1] == b[-2]


def _is_value_gemm(dims: list, sq: int, sk: int) -> bool:
    if len(dims) < 2 or not all(isinstance(x, list) and len(x) >= 2 for x in dims[:2]):
        return False
    p, v = dims[:2]
    return p[-2] == sq and p[-1] == sk and v[-2] == sk


def _by_kernel_name(kernels: pd.DataFrame) -> list[AttentionCall]:
    """Attention kernels no op launched: a main kernel opens a call on its stream, a combine
    kernel joins the open one."""
    calls: list[AttentionCall] = []
    rows: dict = {}    # stream -> (library, [row labels]) of the open call
    done = []
    for i, name, stream in zip(kernels.index, kernels["name"], kernels["stream"]):
        found = attention_kernel(name)
        if found is None:
            continue
        library, stage = found
        if stage == "combine" and stream in rows:
            rows[stream][1].append(i)
            continue
        if stream in rows:
            done.append(rows.pop(stream))
        rows[stream] = (library, [i])
    done += rows.values()
    for library, members in done:
        calls.append(AttentionCall("kernels", library, None, kernels.loc[members]))
    return calls


# ----------------------------------------------------------------------------- display helpers

def short_kernel_name(name: str) -> str:
    """A kernel's identifier without ``void``, template arguments and parameters."""
    text = re.sub(r"^void\s+", "", name).replace("(anonymous namespace)::", "")
    return re.split(r"[<(]", text, maxsplit=1)[0].strip()


def _shape_text(c: AttentionCall) -> str:
    if c.batch_heads is None:
        return "?"
    d = f"{c.d}" if c.d == c.dv else f"{c.d}/{c.dv}"
    return f"{c.batch_heads} x {c.sq} x {c.sk} x {d}"


def _median_or(values: pd.Series, missing: str, digits: int):
    known = pd.to_numeric(values, errors="coerce").dropna()
    return round(float(known.median()), digits) if len(known) else missing


def dims_text(dims) -> str:
    """A kernel's grid or block as a reader writes it ("5x16x16"); "" where none was recorded."""
    return "x".join(str(int(x)) for x in dims) if isinstance(dims, (list, tuple)) and dims else ""


def _plain(value):
    """A trace value as plain JSON (no NaN, no numpy scalars)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, list):
        return [int(x) for x in value]
    return float(value) if isinstance(value, (int, float)) or hasattr(value, "item") else value


# ----------------------------------------------------------------------------- the command

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


def read_trace(path: str) -> Trace:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{path}: no such file")
    if not p.is_file():
        raise TraceError(f"{path}: not a file")
    try:
        trace = load_trace(p)
    except (ValueError, UnicodeDecodeError, OSError, EOFError, zlib.error) as e:
        raise TraceError(f"{path}: not a Kineto trace ({_first_line(e)})") from None
    if not trace.has_gpu:
        raise TraceError(f"{path}: no GPU work in it (no kernel, memcpy or memset events): "
                         "a CPU-only trace has no attention kernels to report")
    return trace


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.trace.attention",
        description="Every attention call in one step of a Kineto (PyTorch profiler) trace: its kernels, "
                    "GPU time, shapes, FLOPs, TFLOP/s and share of the device's peak.")
    parser.add_argument("trace", help="a trace file (.json or .json.gz) exported by torch.profiler")
    parser.add_argument("--step", type=int, default=None,
                        help="N of ProfilerStep#N (default: the first; a trace without steps is read whole)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    # A big trace is millions of small dicts with no reference cycles: the collector's repeated
    # passes over them while json.load builds them cost as much as the parse itself.
    gc.disable()
    try:
        trace = read_trace(args.trace)
        report = find_attention(pick_step(trace, args.step))
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        gc.enable()
    try:
        if args.json:
            print(json.dumps({"trace": Path(args.trace).name, **report.as_dict()}, indent=1))
        else:
            print(f"trace: {Path(args.trace).name}")
            print(report.text())
        sys.stdout.flush()
    except BrokenPipeError:   # the reader piped it into head: not an error of theirs
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())

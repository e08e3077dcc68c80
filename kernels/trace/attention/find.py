"""Finding the attention calls of a step: fused ops, kernels by name, hand-written cores (see the
package's docstring, ``kernels.trace.attention``)."""
from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np
import pandas as pd

from kernels.hw.devices import trace_device
from kernels.trace import serving
from kernels.trace.attention.calls import AttentionCall, AttentionReport
from kernels.trace.fingerprints import ATTENTION_OPS, attention_kernel
from kernels.trace.reader import Trace
from kernels.trace.reader import Step

SCORE_GEMMS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm"})
SOFTMAXES = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
TYPE_NAMES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}
COMPILED_RANGE = re.compile(r"CompiledFxGraph|Torch-Compiled Region")


def find_attention(step: Step, capture: Optional[Trace] = None, heads: Optional[serving.Heads] = None,
                   device: Optional[str] = None) -> AttentionReport:
    """Every attention call of ``step`` (see the module docstring for what counts).

    ``capture``: the serving engine's graph-capture trace of the same run, read for the heads and
    head dims its replayed calls lack; ``heads``: the same given by hand (``serving.heads_from_user``);
    ``device``: the GPU's name where the trace does not say it (its datasheet peaks are used)."""
    ops = step.ops
    kernels = step.gpu_work
    calls: list[AttentionCall] = []
    cols = _Columns(ops, kernels)
    inside_fused = np.zeros(len(ops), dtype=bool)
    for row in _outermost(ops, cols.is_attention_op.tolist()):
        call, span = _fused_call(ops, row, kernels, cols)
        calls.append(call)
        inside_fused |= span
    taken = kernels.index.isin([i for c in calls for i in c.kernels.index])
    calls += _hand_written(ops[~inside_fused], ops, kernels[~taken])
    taken = kernels.index.isin([i for c in calls for i in c.kernels.index])
    calls += _by_kernel_name(kernels[~taken])
    calls.sort(key=lambda c: c.start_us)
    name, how, peaks = trace_device(step.trace.device_properties, device)
    captured = serving.heads_from_trace(capture, _trace_name(capture)) if capture is not None else None
    engine_steps = serving.attach_shapes(step, calls, captured or heads)
    compiled = serving.labelled_ranges(step, COMPILED_RANGE)
    for call in calls:
        if call.cpu_start_us is not None:
            call.compiled = any(a <= call.cpu_start_us <= b for a, b in compiled)
    for call in calls:
        call.peaks = peaks
    return AttentionReport(step, name, peaks, calls, how, engine_steps)


def _trace_name(trace: Trace) -> str:
    return trace.path.name if trace.path is not None else "the capture trace"


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


class _Columns:
    """A step's ops and kernels as numpy arrays: a trace with hundreds of calls in thousands of ops
    is scanned once a call, not once a call per pandas comparison."""

    def __init__(self, ops: pd.DataFrame, kernels: pd.DataFrame):
        threads = pd.Series(list(zip(ops["pid"], ops["tid"])), dtype=object)
        self.op_thread = pd.factorize(threads)[0] if len(ops) else np.zeros(0, dtype=int)
        self.op_tid = ops["tid"].to_numpy()
        self.ts, self.end = ops["ts"].to_numpy(float), ops["end"].to_numpy(float)
        self.is_attention_op = ops["name"].isin(list(ATTENTION_OPS)).to_numpy()
        codes, threads = pd.factorize(kernels["thread"].astype(object), use_na_sentinel=True)
        self.k_thread, self.thread_code = codes, {t: i for i, t in enumerate(threads)}
        self.k_launch = kernels["launch_start_us"].to_numpy(float)

    def span(self, row: int) -> np.ndarray:
        """The op at ``row`` and everything nested in it (time containment on its thread)."""
        return (self.op_thread == self.op_thread[row]) & (self.ts >= self.ts[row]) & (self.end <= self.end[row])

    def launched_between(self, kernels: pd.DataFrame, tid, t0: float, t1: float) -> pd.DataFrame:
        """Kernels launched from thread ``tid`` between t0 and t1 (µs from the step's start)."""
        code = self.thread_code.get(tid, -2)
        return kernels.iloc[np.flatnonzero((self.k_thread == code) & (self.k_launch >= t0) & (self.k_launch <= t1))]


def _fused_call(ops: pd.DataFrame, row: int, kernels: pd.DataFrame, cols: _Columns) -> tuple[AttentionCall, np.ndarray]:
    span = cols.span(row)
    r = ops.loc[row]
    mine = cols.launched_between(kernels, r["tid"], r["start_us"], r["start_us"] + r["dur_us"])
    named = [attention_kernel(n) for n in mine["name"]]
    library = next((x[0] for x in named if x), ATTENTION_OPS[r["name"]].library)
    call = AttentionCall("fused", library, r["name"], mine, cpu_start_us=float(r["start_us"]),
                         cpu_us=float(r["dur_us"]))
    for i in np.flatnonzero(span & cols.is_attention_op):   # the op itself first, then its backend ops
        spec = ATTENTION_OPS[ops.at[i, "name"]]
        if call.causal is None and spec.causal_arg is not None:
            call.causal = _flag(ops.at[i, "concrete_inputs"], spec.causal_arg)
        if call.sq is None and spec.layout:
            _read_fused_shapes(call, ops.at[i, "input_dims"], spec.layout)
        types = ops.at[i, "input_types"]
        if call.dtype is None and types:
            call.dtype = TYPE_NAMES.get(types[0], types[0] or None)
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
    call.batch, call.heads, call.kv_heads = q[0], q[1], k[1]
    call.shapes = {"q": q, "k": k, "v": v, "layout": "BHSD"}


def _hand_written(candidates: pd.DataFrame, ops: pd.DataFrame, kernels: pd.DataFrame) -> list[AttentionCall]:
    """matmul -> softmax -> matmul chains, on each thread, matched by their shapes."""
    names, parent = ops["name"].tolist(), ops["parent"].tolist()
    ts, end, dims = ops["ts"].tolist(), ops["end"].tolist(), ops["input_dims"].tolist()
    cols = _Columns(ops.iloc[:0], kernels)

    def outer(row: int, family: frozenset) -> bool:
        return names[row] in family and (parent[row] < 0 or names[parent[row]] not in family)

    calls = []
    for _, thread in candidates.groupby(["pid", "tid"], sort=False):
        gemms = [i for i in thread.index if outer(i, SCORE_GEMMS)]
        used: set = set()
        for s in (i for i in thread.index if outer(i, SOFTMAXES)):
            x = dims[s][0] if dims[s] else []
            if len(x) < 2:
                continue
            sq, sk = x[-2], x[-1]
            score = next((g for g in reversed(gemms) if end[g] <= ts[s] and g not in used
                          and _is_score_gemm(dims[g], sq, sk)), None)
            pv = next((g for g in gemms if ts[g] >= end[s] and g not in used
                       and _is_value_gemm(dims[g], sq, sk)), None)
            if score is None or pv is None:
                continue
            used |= {score, pv}
            a, b = dims[score][:2]
            v = dims[pv][1]
            mine = cols.launched_between(kernels, ops.at[score, "tid"], ops.at[score, "start_us"],
                                         ops.at[pv, "start_us"] + ops.at[pv, "dur_us"])
            types = ops.at[score, "input_types"]
            calls.append(AttentionCall(
                "hand-written", "PyTorch ops", f"{names[score]} -> {names[s]} -> {names[pv]}", mine,
                batch_heads=max(math.prod(a[:-2]), math.prod(b[:-2])), sq=sq, sk=sk, d=a[-1], dv=v[-1],
                shapes={"scores": [a, b], "softmax": x, "values": dims[pv][:2]},
                dtype=TYPE_NAMES.get(types[0]) if types else None, cpu_start_us=float(ops.at[score, "start_us"]),
                cpu_us=float(end[pv] - ts[score])))
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
    """Attention kernels no op launched: a main kernel opens a call on its stream (taking the
    prologue kernels before it), a combine kernel of the same library joins the open one."""
    open_calls: dict = {}    # stream -> (library, [row labels]) of the open call
    prologue: dict = {}      # stream -> [row labels] waiting for their main kernel
    done = []
    for i, name, stream in zip(kernels.index, kernels["name"], kernels["stream"]):
        found = attention_kernel(name)
        if found is None:
            continue
        library, stage = found
        if stage == "prologue":
            prologue.setdefault(stream, []).append(i)
            continue
        if stage == "combine" and stream in open_calls and open_calls[stream][0] == library:
            open_calls[stream][1].append(i)
            continue
        if stream in open_calls:
            done.append(open_calls.pop(stream))
        open_calls[stream] = (library, prologue.pop(stream, []) + [i])
    done += open_calls.values()
    for rows in prologue.values():   # prologues whose main kernel never came: a call of their own
        first = attention_kernel(kernels.at[rows[0], "name"])
        assert first is not None, "a prologue row was queued only because attention_kernel recognised it"
        done.append((first[0], rows))
    return [AttentionCall("kernels", library, None, kernels.loc[members]) for library, members in done]


__all__ = ["COMPILED_RANGE", "SCORE_GEMMS", "SOFTMAXES", "TYPE_NAMES", "find_attention"]

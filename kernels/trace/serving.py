"""Shapes of a serving engine's attention where its ops record none.

vLLM and SGLang replay most of a step from a CUDA/HIP graph: the kernels are in the trace, the ops
that would have recorded their input shapes are not. Two things still say what each call did:

- **The step's annotation.** Both engines label a step with a user annotation such as
  ``execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)``: the number
  of tokens scheduled, then for the prefill ("context") and the decode ("generation") requests
  their count and the sums of query lengths (sq), key lengths (sk, the cached prefix included),
  sq² and sq·sk. ``parse_step_annotation`` reads one; ``annotated_ranges(step)`` every one inside
  a step, with where it lies. Every attention call launched inside a range (one per layer) did
  all of that range's requests.
- **The heads and head dims.** From an engine's attention op where the trace records one with
  shapes (vLLM's ``vllm::unified_attention_with_output`` in a piecewise step; SGLang's
  ``sglang_profiler::attention_*`` in its graph-capture trace): ``heads_from_ops``. The capture
  trace of the same engine run is read with ``heads_from_trace``; a user who knows the model
  gives them with ``heads_from_user``.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional

import pandas as pd

from kernels.trace.families import readable_name
from kernels.trace.reader import Trace
from kernels.trace.reader import Step

_SUMS = r"\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
STEP_ANNOTATION = re.compile(r"execute_(\d+)_context_(\d+)" + _SUMS + r"_generation_(\d+)" + _SUMS)
TYPE_NAMES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}


@dataclass(frozen=True)
class TokenCounts:
    """One engine step's requests, as its annotation records them."""

    label: str
    scheduled: int            # tokens the step scheduled (padded to the graph's size)
    context_requests: int
    c_sq: int
    c_sk: int
    c_sqsq: int
    c_sqsk: int
    generation_requests: int
    g_sq: int
    g_sk: int
    g_sqsq: int
    g_sqsk: int

    @property
    def queries(self) -> int:
        return self.c_sq + self.g_sq

    @property
    def keys(self) -> int:
        """Every key a call reads: the prefills' (cached prefix included) and the decodes' KV cache."""
        return self.c_sk + self.g_sk

    @property
    def pairs(self) -> float:
        """(query, key) pairs a call computes: causal prefill Σ sq·sk − Σ sq²/2, decode Σ sq·sk."""
        return self.c_sqsk - self.c_sqsq / 2 + self.g_sqsk

    @property
    def kind(self) -> str:
        parts = [w for w, n in (("prefill", self.context_requests), ("decode", self.generation_requests)) if n]
        return "+".join(parts) or "empty"

    def as_dict(self) -> dict:
        return {**asdict(self), "queries": self.queries, "keys": self.keys, "pairs": self.pairs}


def parse_step_annotation(text: str) -> Optional[TokenCounts]:
    """The token counts of an ``execute_..._context_N(...)_generation_M(...)`` label; None for any other."""
    m = STEP_ANNOTATION.search(text)
    if not m:
        return None
    return TokenCounts(text, *(int(x) for x in m.groups()))


def labelled_ranges(step: Step, pattern: re.Pattern) -> list[tuple[float, float]]:
    """(start, end) in µs from the step's start of every labelled range whose label matches ``pattern``."""
    trace, t0 = step.trace, float(step.range["ts"])
    return [(float(s.range["ts"]) - t0, float(s.range["end"]) - t0)
            for label in trace.labels() if pattern.search(label) for s in trace.steps(label)]


def annotated_ranges(step: Step) -> list[tuple[float, float, TokenCounts]]:
    """Every engine-step annotation inside ``step``: (start, end) in µs from the step's start, and
    its counts."""
    trace, t0 = step.trace, float(step.range["ts"])
    t1 = float(step.range["end"])
    found = []
    for label in trace.labels():
        counts = parse_step_annotation(label)
        if counts is None:
            continue
        for s in trace.steps(label):
            start, end = float(s.range["ts"]), float(s.range["end"])
            if start >= t0 and start < t1:
                found.append((start - t0, end - t0, counts))
    return sorted(found, key=lambda x: x[0])


def counts_at(ranges: list[tuple[float, float, TokenCounts]], launch_us: float) -> Optional[TokenCounts]:
    """The counts of the annotated range a launch at ``launch_us`` lies in; None outside every range."""
    for start, end, counts in ranges:
        if start <= launch_us <= end:
            return counts
    return None


@dataclass(frozen=True)
class Heads:
    """Query heads, KV heads, head dims and dtype of an engine's attention, and where they were read."""

    q_heads: int
    kv_heads: int
    d: int
    dv: int
    dtype: Optional[str]
    source: str

    def as_dict(self) -> dict:
        return asdict(self)


# An engine's attention op -> the inputs holding q [tokens, H_Q, D], k and v ([..., H_KV, D]).
# vLLM: unified_attention_with_output(query, key, value, output, layer_name, ...) (vllm/attention/layer.py).
# SGLang's profiler op (capture traces): (q, workspace, output, k_cache [slots, 1, H_KV, D], v_cache, ...),
# as the shared capture trace records it.
SERVING_OPS: tuple[tuple[str, int, int, int], ...] = (
    (r"^vllm::unified_attention", 0, 1, 2),
    (r"^sglang_profiler::attention_", 0, 3, 4),
)
_SERVING_OP_RES = tuple((re.compile(p), q, k, v) for p, q, k, v in SERVING_OPS)


def serving_op(name: str) -> Optional[tuple[int, int, int]]:
    """(q, k, v) input positions of an engine's attention op; None for any other op."""
    for pattern, q, k, v in _SERVING_OP_RES:
        if pattern.search(name):
            return q, k, v
    return None


def heads_of_op(name: str, dims: list, types: list, where: str) -> Optional[Heads]:
    """Heads and head dims from one engine attention op's recorded inputs; None if unreadable."""
    at = serving_op(name)
    if at is None:
        return None
    q_at, k_at, v_at = at
    if len(dims) <= max(at) or not all(isinstance(dims[i], list) and len(dims[i]) >= 3 for i in at):
        return None
    q, k, v = dims[q_at], dims[k_at], dims[v_at]
    if q[-1] != k[-1]:
        return None
    dtype = TYPE_NAMES.get(types[q_at]) if len(types) > q_at else None
    return Heads(int(q[-2]), int(k[-2]), int(q[-1]), int(v[-1]), dtype, f"{name} in {where}")


def heads_from_ops(ops: pd.DataFrame, where: str) -> Optional[Heads]:
    """The first engine attention op in ``ops`` (a ``Step.ops`` table) whose inputs give the heads."""
    for name, dims, types in zip(ops["name"], ops["input_dims"], ops["input_types"]):
        if serving_op(name) is not None:
            found = heads_of_op(name, dims, types, where)
            if found is not None:
                return found
    return None


def heads_from_trace(trace: Trace, where: str) -> Optional[Heads]:
    """The heads an engine's graph-capture trace records on its attention ops (None if it has none)."""
    return heads_from_ops(trace.whole().ops, where)


def heads_from_user(heads: str, head_dim: int, dtype: Optional[str] = "bf16") -> Heads:
    """``--heads 32/8 --head-dim 128`` (query heads / KV heads; one number when they are equal)."""
    parts = heads.split("/")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--heads {heads!r}: give the query and KV heads as HQ/HKV (e.g. 32/8), or one number")
    if head_dim <= 0:
        raise ValueError(f"--head-dim {head_dim}: a head dim is a positive number of elements")
    q = int(parts[0])
    kv = int(parts[-1])
    return Heads(q, kv, head_dim, head_dim, dtype, "given with --heads and --head-dim")


def attach_shapes(step: Step, calls: list, given: Optional[Heads] = None) -> list[TokenCounts]:
    """Give each attention call of ``step`` (``kernels.trace.attention.AttentionCall``) that has no
    shapes of its own the token counts of the engine step it was launched in, and the heads and head
    dims of its own op, else of an engine attention op of the step, else ``given`` (a capture
    trace's, or the user's). Returns the engine steps read, in order."""
    ranges = annotated_ranges(step)
    if not ranges:
        return []
    in_trace = heads_from_ops(step.ops, "this trace")
    for call in calls:
        if call.batch_heads is not None:      # shapes already read from its op (SDPA)
            continue
        launch = float(call.kernels["launch_start_us"].min()) if len(call.kernels) else call.cpu_start_us
        counts = counts_at(ranges, launch) if launch is not None else None
        if counts is None:
            continue
        call.tokens = counts
        found = _own_heads(step.ops, call) or in_trace or given
        if found is not None:
            call.heads, call.kv_heads, call.d, call.dv = found.q_heads, found.kv_heads, found.d, found.dv
            call.heads_source = found.source
            call.dtype = call.dtype or found.dtype or _kernel_dtype(call)
        call.sq, call.sk = counts.queries, counts.keys
    return list(dict.fromkeys(c for _, _, c in ranges))


def _own_heads(ops: pd.DataFrame, call) -> Optional[Heads]:
    if call.op is None or serving_op(call.op) is None or call.cpu_start_us is None:
        return None
    mine = ops[(ops["name"] == call.op) & (ops["start_us"] == call.cpu_start_us)]
    if mine.empty:
        return None
    r = mine.iloc[0]
    return heads_of_op(r["name"], r["input_dims"], r["input_types"], "its own op")


def _kernel_dtype(call) -> Optional[str]:
    """The dtype a main kernel's template names (``__hip_bfloat16`` -> bf16), where it names one alone."""
    main = call.main_kernel()
    if main is None:
        return None
    found = re.findall(r"\b(bf16|fp16)\b", readable_name(main["name"]))
    return found[0] if len(set(found)) == 1 else None


__all__ = ["Heads", "attach_shapes", "labelled_ranges", "SERVING_OPS", "STEP_ANNOTATION", "TokenCounts", "annotated_ranges", "counts_at",
           "heads_from_ops", "heads_from_trace", "heads_from_user", "heads_of_op", "parse_step_annotation",
           "serving_op"]

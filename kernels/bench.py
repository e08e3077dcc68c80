"""The benchmark harness: time every implementation over a sweep, and say what it achieved.

One *point* is one implementation at one shape (batch, heads, sequence length, head dim),
dtype, causal flag and mode (forward, or forward+backward). For each point:

1. **Warm up** a few calls: first calls pay for kernel selection, compilation, caches.
2. **Time many calls** and keep the median (robust to the odd slow run) and the 10th and
   90th percentiles (the spread). On a GPU each call is bracketed by CUDA events, which
   time the GPU's own work; on a CPU by ``time.perf_counter``.
3. **Rotate the inputs** among pre-made sets (up to 256, together larger than the caches
   where that many allow): calling the same small q, k, v over and over would serve them
   from cache and flatter small shapes.
4. **Convert** the median into TFLOP/s (FLOPs from ``reference.flops``: causal halved,
   backward 2.5x forward) and GB/s (bytes from ``reference.io_bytes``; implementations that
   write the S×S scores to memory are charged for them).
5. **Measure peak memory** of one more call, apart from the timed ones (see MEMORY_METHODS).

Nothing stops the sweep: a point that cannot run records why (``status`` and ``reason``)
and the sweep goes on. Results save to JSON (with where, when and how they were made) and
CSV, and ``load_results`` reads either back.

    python -m kernels.bench --out bench_cpu                 # the CPU sweep, < 2 min on 2 cores
    python -m kernels.bench --device cuda --backward --out bench_gpu
    python -m kernels.bench --device cuda --impls triton --backward-only --repeats 3 --crosscheck

More than the medians, each row carries what makes a GPU number trustworthy:

* the first call (autotuning, compiling) is timed apart (``first_call_ms``), so the warm-up
  and the timed calls see the steady state;
* the Triton configs the autotuner chose (``config``, from each kernel's ``best_config``;
  None in the interpreter, which does not autotune);
* with ``repeats`` > 1, each round's median and their spread (``round_spread``);
* with ``crosscheck`` on a GPU, Triton's ``do_bench`` (L2 flushed between calls) and
  ``do_bench_cudagraph`` (a CUDA graph, no Python dispatch): a median far above the graph's
  means the point measured dispatch, not the kernel. On a CPU the row says it was not run;
* the run's ``meta["peaks"]``: the datasheet's ceilings next to a matmul and a copy measured
  on the same device just before.

Performance goals (not yet measured: no GPU run has recorded them). On H100/H200, causal
bf16, S 1k-16k, D 64 and 128, all in the same run: the ``triton`` forward at >= 1.0x the
speed of ``sdpa_flash`` (SDPA's FlashAttention-2 backend), ``triton`` forward+backward at
>= 0.85x, and ``cuda_v2``'s forward at >= 0.7x. ``.ci/device-run`` measures them in its bench
phase (``tools/gpu_run.py`` BENCH_ARGS: sdpa_flash, sdpa_cudnn, triton and cuda_v2 at S 1024,
2048, 4096, 16384, D 64 and 128, B 4, H 16, bf16, causal, forward and forward+backward); the
ratio is the two medians of one run at the same shape. For scale, FlashAttention-3's paper
(arXiv 2407.08608, Fig. 5) shows Triton's tutorial kernel between FA2 and cuDNN on H100.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import gc
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from . import devices, reference
from .registry import CannotRun, available, implementation, names

FORWARD, FORWARD_BACKWARD, BACKWARD = "forward", "forward+backward", "backward"
MODES = (FORWARD, FORWARD_BACKWARD, BACKWARD)
# Backward-only timing replays the backward of forwards made before the clock starts
# (retain_graph): at most this many graphs are kept, one per input set, in turn.
MAX_GRAPHS = 16

# Which implementations write the S×S scores (io_bytes charges them) and which a CPU sweep
# leaves out unless named (Triton's interpreter, compile-per-shape entries) are facts of
# their registry entries: ``implementation(name).materializes_scores`` / ``.slow_on_cpu``.

# Input sets are rotated until together they exceed this: more than the last-level cache
# (tens of MB on CPUs, 40-50 MB of L2 on A100/H100/H200), so each call reads cold data.
# At most MAX_SETS sets, so tiny shapes do not spend longer making inputs than timing.
ROTATE_BYTES = {"cpu": 64 * 2**20, "cuda": 256 * 2**20}
MAX_SETS = 256

MEMORY_METHODS = {
    "cuda.max_memory_allocated": (
        "torch.cuda.max_memory_allocated() during one call, minus torch.cuda.memory_allocated() "
        "before it: the peak of what the call itself allocated (caching allocator, GPU)"),
    "profiler memory events": (
        "torch.profiler with profile_memory=True around one call: the peak of 'Total Allocated' "
        "in the trace's [memory] events minus its value before the call's first allocation "
        "(CPU allocations made through PyTorch's allocator)"),
}

STATUSES = {
    "ok": "measured",
    "unavailable": "the implementation cannot run on this device (registry's reason)",
    "unsupported": "the implementation refuses these inputs (head dim, dtype, ...)",
    "skipped": "left out on purpose (e.g. the Triton interpreter on CPU)",
    "no backward": "forward+backward asked, but the implementation has no autograd",
    "oom": "out of memory",
    "error": "anything else went wrong; the reason holds the exception",
}

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16,
          "float16": torch.float16, "half": torch.float16, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp64": torch.float64, "float64": torch.float64}


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
    # Cross-checks on a GPU: triton.testing.do_bench (flushes L2 between calls) and
    # do_bench_cudagraph (replays a CUDA graph: no Python dispatch), medians in ms.
    do_bench_ms: Optional[float] = None
    cudagraph_ms: Optional[float] = None
    crosscheck: str = ""        # what was run, or why not

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


class BenchResults(list):
    """A list of BenchResult rows plus ``meta``: device, versions, date, command."""

    def __init__(self, rows: Iterable[BenchResult] = (), meta: Optional[dict] = None):
        super().__init__(rows)
        self.meta = dict(meta or {})

    def ok(self) -> "BenchResults":
        return BenchResults((r for r in self if r.ok), self.meta)

    def to_frame(self):
        """The rows as a pandas DataFrame (pandas imported only when asked)."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(r) for r in self])


# --------------------------------------------------------------------------- inputs

def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(text) -> torch.dtype:
    if isinstance(text, torch.dtype):
        return text
    try:
        return DTYPES[str(text).lower().replace("torch.", "")]
    except KeyError:
        raise ValueError(f"unknown dtype {text!r}; use one of {', '.join(DTYPES)}") from None


class InputPool:
    """Random input sets for one shape, carved out of one buffer and used in turn."""

    def __init__(self, shape, dtype, device, backward: bool, seed: int = 0):
        numel = math.prod(shape)
        per_set = 4 * numel  # q, k, v and the gradient fed to backward
        budget = ROTATE_BYTES.get(torch.device(device).type, ROTATE_BYTES["cuda"])
        bytes_per_set = per_set * torch.empty((), dtype=dtype).element_size()
        count = min(MAX_SETS, max(2, budget // bytes_per_set))
        g = torch.Generator(device=device).manual_seed(seed)
        # Random, never zeros: some kernels are faster on zeros (and softmax of zeros is flat).
        buffer = torch.randn(count * per_set, generator=g, device=device, dtype=dtype)
        self.sets = []
        for i in range(count):
            chunk = buffer[i * per_set:(i + 1) * per_set].view(4, *shape)
            q, k, v, grad = (t.detach() for t in chunk.unbind(0))
            if backward:
                q, k, v = (t.requires_grad_(True) for t in (q, k, v))
            self.sets.append((q, k, v, grad))
        self.turn = 0

    def next(self):
        chosen = self.sets[self.turn % len(self.sets)]
        self.turn += 1
        return chosen


# --------------------------------------------------------------------------- one point

class NoBackward(Exception):
    """The implementation's output cannot be differentiated."""


def make_step(fn, pool: InputPool, causal: bool, backward):
    """One benchmarked call: a forward (under no_grad), a forward and its backward, or (``backward``
    = BACKWARD) a backward alone, replayed on forwards made here, before any timing."""
    mode = backward if isinstance(backward, str) else FORWARD_BACKWARD if backward else FORWARD

    def forward():
        q, k, v, _ = pool.next()
        with torch.no_grad():
            return fn(q, k, v, causal=causal)

    def differentiate(out, inputs, grad, retain: bool = False):
        if not out.requires_grad:
            raise NoBackward("its output does not require grad: it has no autograd support")
        try:
            # autograd.grad, not .backward(): no .grad accumulates on the inputs between calls.
            return torch.autograd.grad(out, inputs, grad, retain_graph=retain)
        except (RuntimeError, NotImplementedError) as err:
            if is_oom(err):
                raise
            raise NoBackward(f"its backward failed: {err}") from err

    def forward_backward():
        q, k, v, grad = pool.next()
        return differentiate(fn(q, k, v, causal=causal), (q, k, v), grad)

    if mode == FORWARD:
        return forward
    if mode == FORWARD_BACKWARD:
        return forward_backward
    graphs = []
    for _ in range(min(len(pool.sets), MAX_GRAPHS)):
        q, k, v, grad = pool.next()
        out = fn(q, k, v, causal=causal)
        if not out.requires_grad:
            raise NoBackward("its output does not require grad: it has no autograd support")
        graphs.append((out, (q, k, v), grad))
    turn = [0]

    def backward_only():
        out, inputs, grad = graphs[turn[0] % len(graphs)]
        turn[0] += 1
        return differentiate(out, inputs, grad, retain=True)

    return backward_only


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(step, device: torch.device, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls: CUDA events on a GPU, perf_counter on a CPU."""
    synchronize(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            start.record()
            step()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def warm_up(step, device: torch.device, calls: int, budget_ms: float) -> float:
    """Up to ``calls`` calls kept out of the record (at least one, fewer once they have
    used ``budget_ms``: a slow call is warm after one run); return the fastest's ms."""
    best, spent = float("inf"), 0.0
    for _ in range(max(1, calls)):
        start = time.perf_counter()
        step()
        synchronize(device)
        took = (time.perf_counter() - start) * 1e3
        best, spent = min(best, took), spent + took
        if spent > budget_ms:
            break
    return best


def spread(times: Sequence[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of the timed calls."""
    if len(times) == 1:
        return times[0], times[0], times[0]
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    return statistics.median(times), deciles[0], deciles[-1]


def peak_memory(step, device: torch.device) -> tuple[int, str]:
    """Bytes allocated at the peak of one call, above what was allocated before it."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, "cuda.max_memory_allocated"
    return profiler_peak_memory(step), "profiler memory events"


def profiler_peak_memory(step) -> int:
    """Peak of 'Total Allocated' in the [memory] events of one profiled call, minus its start."""
    from torch.profiler import ProfilerActivity, profile

    from .profiling import _quiet_kineto  # Kineto's start/stop lines would land in notebooks

    with _quiet_kineto(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not memory:
        return 0
    first = memory[0]["args"]
    # Before the first event, the total was its value minus the bytes it added.
    start = first["Total Allocated"] - first["Bytes"]
    return max(0, max(e["args"]["Total Allocated"] for e in memory) - start)


OOM_WORDS = ("out of memory", "can't allocate", "cannot allocate", "failed to allocate")


def is_oom(err: BaseException) -> bool:
    """Out of memory, whichever way the allocator said it."""
    if isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(w in str(err).lower() for w in OOM_WORDS)


def classify(name: str, err: BaseException) -> tuple[str, str]:
    """(status, reason) for an exception raised while benchmarking ``name``."""
    if is_oom(err):
        return "oom", first_line(err)
    if isinstance(err, NoBackward):
        return "no backward", str(err)
    # The implementation contract: "cannot run here" is CannotRun; input it refuses everywhere
    # is a ValueError/TypeError.
    if isinstance(err, CannotRun):
        return "unavailable", first_line(err)
    if isinstance(err, (ValueError, TypeError)):
        return "unsupported", first_line(err)
    return "error", f"{type(err).__name__}: {first_line(err)}"


def first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


def input_refusal(name: str, head_dim: int, dtype: torch.dtype) -> Optional[str]:
    """The registry's own head-dim/dtype limits, checked before any input is made."""
    impl = implementation(name)
    if impl.head_dims is not None and head_dim not in impl.head_dims:
        return f"{name}: head_dim {head_dim} is not supported; supported: {impl.head_dims}"
    if impl.dtypes is not None and dtype not in impl.dtypes:
        return f"{name}: dtype {dtype_name(dtype)} is not supported"
    return None


def measure(point: BenchResult, device: torch.device, dtype: torch.dtype, *, reps: int,
            warmup: int, min_reps: int, max_seconds: float, memory: bool,
            crosscheck: bool = False) -> BenchResult:
    """Fill in one point's timings, rates and memory, or its failure status."""
    fn = implementation(point.impl).call
    shape = (point.batch, point.heads, point.seq, point.head_dim)
    pool = None
    try:
        pool = InputPool(shape, dtype, device, point.backward)
        step = make_step(fn, pool, point.causal, point.mode)
        # The first call autotunes and compiles (seconds for Triton): it is timed on its own,
        # so the warm-up that follows estimates the steady state and keeps its calls.
        point.first_call_ms = warm_up(step, device, 1, budget_ms=0)
        estimate_ms = warm_up(step, device, warmup, budget_ms=max_seconds * 1e3 / 2)
        # As many timed calls as fit the time budget, within [min_reps, reps].
        n = max(min_reps, min(reps, int(max_seconds * 1e3 / max(estimate_ms, 1e-3))))
        point.median_ms, point.p10_ms, point.p90_ms = spread(time_calls(step, device, n))
        point.reps = n
        point.config = chosen_configs(point.impl)
        if crosscheck:
            point.do_bench_ms, point.cudagraph_ms, point.crosscheck = cross_check(step, device)
        if memory:
            point.peak_memory_bytes, point.memory_method = peak_memory(step, device)
    except Exception as err:  # the sweep goes on; the row says what happened
        point.status, point.reason = classify(point.impl, err)
    finally:
        del pool
        if device.type == "cuda" and point.status == "oom":
            gc.collect()
            torch.cuda.empty_cache()
    if point.ok:
        point.tflops = point.flops / (point.median_ms * 1e-3) / 1e12
        point.gbps = point.bytes / (point.median_ms * 1e-3) / 1e9
    return point


TRITON_KERNELS = {"fwd": "attn_fwd", "bwd_dkdv": "attn_bwd_dkdv", "bwd_dq": "attn_bwd_dq"}


def chosen_configs(name: str) -> Optional[str]:
    """The configs Triton's autotuner chose in the last call of ``name`` (JSON), or None.

    Only the ``triton`` implementation is autotuned; in the interpreter it is not (its
    kernels are plain functions without ``best_config``), and then this is None too.
    """
    if name != "triton":
        return None
    import sys as _sys

    tf = _sys.modules.get("kernels.triton_flash")
    chosen = {}
    for short, attr in TRITON_KERNELS.items():
        config = getattr(getattr(tf, attr, None), "best_config", None)
        if config is not None:
            chosen[short] = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return json.dumps(chosen, sort_keys=True) if chosen else None


def cross_check(step, device: torch.device) -> tuple[Optional[float], Optional[float], str]:
    """(do_bench ms, do_bench_cudagraph ms, note): Triton's own timers on the same step.

    ``triton.testing.do_bench`` clears a 256 MB buffer (the L2) before each call and times
    with CUDA events; ``do_bench_cudagraph`` captures the step in a CUDA graph and replays it,
    which takes the CPU's dispatch out. Where our median sits far above the graph's, the point
    measures Python and launch overhead rather than the kernel. Needs a CUDA GPU.
    """
    if device.type != "cuda":
        return None, None, f"not run: triton.testing.do_bench needs a CUDA GPU (device is {device.type})"
    try:
        from triton.testing import do_bench, do_bench_cudagraph
    except Exception as err:  # no Triton, or a broken one
        return None, None, f"not run: triton.testing unavailable ({type(err).__name__}: {err})"
    notes, flushed, graphed = [], None, None
    try:
        flushed = float(do_bench(step, warmup=5, rep=50, return_mode="median"))
        notes.append("do_bench (L2 flushed, median)")
    except Exception as err:
        notes.append(f"do_bench failed: {first_line(err)}")
    try:
        graphed = float(do_bench_cudagraph(step, rep=50, return_mode="median"))
        notes.append("do_bench_cudagraph (median)")
    except Exception as err:  # e.g. a step that cannot be captured
        notes.append(f"do_bench_cudagraph failed: {first_line(err)}")
    return flushed, graphed, "; ".join(notes)


# --------------------------------------------------------------------------- the sweep

def sweep(impls: Optional[Sequence[str]] = None, seqs: Sequence[int] = (128, 256, 512, 1024, 2048),
          head_dims: Sequence[int] = (64,), dtypes: Sequence = (torch.float32,),
          causal: Sequence[bool] = (True,), modes: Sequence[str] = (FORWARD,), *,
          batch: int = 1, heads: int = 8, device="cpu", reps: int = 30, warmup: int = 3,
          min_reps: int = 5, max_seconds: float = 2.0, memory: bool = True,
          repeats: int = 1, crosscheck: bool = False,
          progress=sys.stderr, command: Optional[str] = None) -> BenchResults:
    """Benchmark implementations x seqs x head_dims x dtypes x causal x modes.

    ``impls=None`` means every registered name; on a CPU the ``slow_on_cpu`` ones are then
    recorded as skipped (name them to include them). Each point takes at most about
    ``max_seconds`` of timed calls (at least ``min_reps``, at most ``reps`` of them).
    ``repeats`` > 1 runs the whole sweep that many times, so that drift (clocks, other
    load) shows as the spread of each point's round medians; the point's median is then the
    median of its rounds. ``crosscheck`` also times each point with Triton's do_bench and
    do_bench_cudagraph (GPU only; on a CPU each row says it was not run, and why).
    A progress line per point goes to ``progress`` (None for silence).
    """
    device = torch.device(device)
    dtypes = [parse_dtype(d) for d in dtypes]
    check_sweep_args(seqs, head_dims, modes, batch, heads, reps, min_reps)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    chosen = list(impls) if impls is not None else names()
    unknown = [n for n in chosen if n not in names()]
    if unknown:
        raise KeyError(f"unknown implementation(s) {', '.join(unknown)}; registered: {', '.join(names())}")
    reasons = available(device)
    results = BenchResults(meta=run_meta(device, command or call_text(locals_for_command(
        chosen, seqs, head_dims, dtypes, causal, modes, batch, heads, device, reps))))
    points = [(n, s, d, t, c, m) for n in chosen for m in modes for t in dtypes for d in head_dims
              for c in causal for s in seqs]
    rounds: dict = {}
    for round_no in range(repeats):
        for i, (name, seq, head_dim, dtype, is_causal, mode) in enumerate(points, 1):
            point = new_point(name, device, dtype, batch, heads, seq, head_dim, is_causal, mode)
            why_not = reasons[name] or input_refusal(name, head_dim, dtype)
            if impls is None and device.type == "cpu" and implementation(name).slow_on_cpu:
                point.status, point.reason = "skipped", (
                    f"{name}: left out of CPU sweeps by default (the Triton interpreter takes seconds "
                    "per call); name it in impls / --impls to include it")
            elif why_not:
                point.status = "unavailable" if reasons[name] else "unsupported"
                point.reason = why_not
            else:
                measure(point, device, dtype, reps=reps, warmup=warmup, min_reps=min_reps,
                        max_seconds=max_seconds, memory=memory and round_no == 0,
                        crosscheck=crosscheck and round_no == 0)
            rounds.setdefault(i, []).append(point)
            if progress is not None:
                label = f"round {round_no + 1}/{repeats} " if repeats > 1 else ""
                print(label + progress_line(i, len(points), point), file=progress, flush=True)
    for i in range(1, len(points) + 1):
        results.append(merge_rounds(rounds[i]))
    return results


def merge_rounds(measured: list) -> BenchResult:
    """One row from the rounds of one point: the first round's row (its memory, its
    cross-check), with the median of the round medians, their spread, and the widest p10-p90."""
    first = measured[0]
    failed = [r for r in measured if not r.ok]
    if failed:
        return failed[0]
    if len(measured) == 1:
        return first
    medians = [r.median_ms for r in measured]
    first.median_ms = statistics.median(medians)
    first.p10_ms = min(r.p10_ms for r in measured)
    first.p90_ms = max(r.p90_ms for r in measured)
    first.reps = sum(r.reps for r in measured)
    first.round_medians_ms = json.dumps([round(m, 6) for m in medians])
    first.round_spread = (max(medians) - min(medians)) / first.median_ms
    first.tflops = first.flops / (first.median_ms * 1e-3) / 1e12
    first.gbps = first.bytes / (first.median_ms * 1e-3) / 1e9
    first.config = measured[-1].config or first.config
    return first


def check_sweep_args(seqs, head_dims, modes, batch, heads, reps, min_reps) -> None:
    for label, values in (("seqs", seqs), ("head_dims", head_dims), ("batch", [batch]),
                          ("heads", [heads]), ("reps", [reps]), ("min_reps", [min_reps])):
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{label} must be positive integers, got {values!r}")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be among {MODES!r}, got {modes!r}")


def new_point(name, device, dtype, batch, heads, seq, head_dim, causal, mode) -> BenchResult:
    """A row with its FLOPs and bytes. Backward alone: forward+backward less the forward, so
    2.5x the forward's FLOPs, and the bytes dO, dQ, dK, dV add."""
    def count(backward):
        return (reference.flops(batch, heads, seq, head_dim, causal=causal, backward=backward),
                reference.io_bytes(batch, heads, seq, head_dim, dtype=dtype,
                                   materialized=implementation(name).materializes_scores, backward=backward))
    flops, nbytes = count(mode != FORWARD)
    if mode == BACKWARD:
        forward_flops, forward_bytes = count(False)
        flops, nbytes = flops - forward_flops, nbytes - forward_bytes
    return BenchResult(
        impl=name, device=device.type, dtype=dtype_name(dtype), batch=batch, heads=heads,
        seq=seq, head_dim=head_dim, causal=causal, mode=mode, flops=flops, bytes=nbytes)


@dataclass
class Comparison:
    """Interleaved timings of a few callables: medians and 10th/90th percentiles, in ms."""

    median_ms: dict
    p10_ms: dict
    p90_ms: dict
    rounds: int

    def faster(self) -> Optional[str]:
        """The name whose slowest decile beats every other's fastest decile, or None.

        That is the course's test for "this machine can tell them apart": with the two
        p10-p90 ranges apart, the order held in at least 80% of the interleaved rounds.
        """
        for name in self.median_ms:
            if all(self.p90_ms[name] < self.p10_ms[o] for o in self.median_ms if o != name):
                return name
        return None

    def verdict(self) -> str:
        ranges = ", ".join(f"{n} {self.median_ms[n]:.3g} ms (p10-p90 {self.p10_ms[n]:.3g}-{self.p90_ms[n]:.3g})"
                           for n in self.median_ms)
        winner = self.faster()
        if winner is None:
            return (f"{ranges}: the ranges overlap, so this machine was too noisy (or the difference too "
                    f"small) to say which is faster from {self.rounds} interleaved rounds")
        return f"{ranges}: {winner} is faster, its slowest decile below the others' fastest"


def compare(fns: dict, device="cpu", rounds: int = 15, warmup: int = 2) -> Comparison:
    """Time each of ``fns`` (name -> no-argument callable) in interleaved rounds, no profiler.

    Round r calls every function once, in an order that rotates each round, so a burst of
    load from elsewhere hits all of them alike instead of whichever happened to run then.
    """
    device = torch.device(device)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].extend(time_calls(fns[name], device, 1))

    def pct(values, q):
        return statistics.quantiles(values, n=10, method="inclusive")[q] if len(values) > 1 else values[0]

    return Comparison(median_ms={n: statistics.median(t) for n, t in times.items()},
                      p10_ms={n: pct(t, 0) for n, t in times.items()},
                      p90_ms={n: pct(t, 8) for n, t in times.items()}, rounds=rounds)


def warm_gpu(seconds: float, device="cuda") -> int:
    """Keep the GPU busy with bf16 matmuls for ``seconds``; returns the matmuls run.

    An idle GPU sits at a low clock (an idle H200 reads 345 MHz) and ramps up only under
    load, so the first points of a sweep would otherwise be timed at a lower clock.
    """
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize(device)
        done += 10
    return done


MODE_LABELS = {FORWARD: "fwd", FORWARD_BACKWARD: "fwd+bwd", BACKWARD: "bwd"}


def progress_line(i: int, total: int, r: BenchResult) -> str:
    where = (f"[{i:>{len(str(total))}}/{total}] {r.impl:<15} S={r.seq:<6} D={r.head_dim:<4} "
             f"{r.dtype:<8} {'causal' if r.causal else 'full':<6} {MODE_LABELS[r.mode]:<7}")
    if not r.ok:
        return f"{where} {r.status}: {r.reason}"
    mem = "" if r.peak_memory_bytes is None else f"  peak {r.peak_memory_bytes / 2**20:8.1f} MiB"
    return (f"{where} {r.median_ms:9.3f} ms (p10 {r.p10_ms:.3f}, p90 {r.p90_ms:.3f}, n={r.reps})"
            f"  {r.tflops:7.3f} TFLOP/s  {r.gbps:7.1f} GB/s{mem}")


def locals_for_command(impls, seqs, head_dims, dtypes, causal, modes, batch, heads, device, reps):
    return dict(impls=list(impls), seqs=list(seqs), head_dims=list(head_dims),
                dtypes=[dtype_name(d) for d in dtypes], causal=list(causal), modes=list(modes),
                batch=batch, heads=heads, device=str(device), reps=reps)


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
        "flops": "reference.flops: 4·B·H·S²·D per forward, halved when causal; backward 2.5x forward",
        "bytes": ("reference.io_bytes: q, k, v, o once (plus dO, dQ, dK, dV for backward); "
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
    rows = [dataclasses.asdict(r) for r in results]
    json_path.write_text(json.dumps({"meta": getattr(results, "meta", {}), "results": rows},
                                    indent=1, allow_nan=False) + "\n")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fl.name for fl in dataclasses.fields(BenchResult)])
        writer.writeheader()
        writer.writerows(rows)
    return json_path, csv_path


def load_results(path) -> BenchResults:
    """Read back a JSON (rows and meta) or CSV (rows only) file that save_results wrote."""
    path = Path(path)
    if path.suffix not in (".json", ".csv") and not path.exists():
        path = output_paths(path)[0]  # a stem, as --out was given
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            return BenchResults(row_from_text(row) for row in csv.DictReader(f))
    data = json.loads(path.read_text())
    return BenchResults((BenchResult(**row) for row in data["results"]), data.get("meta", {}))


def row_from_text(row: dict) -> BenchResult:
    """A CSV row (all strings) back into typed fields; empty cells are None."""
    values = {}
    for field in dataclasses.fields(BenchResult):
        text = row[field.name]
        kind = str(field.type)
        if text == "" and "Optional" in kind:
            values[field.name] = None
        elif "bool" in kind:
            values[field.name] = text == "True"
        elif "int" in kind:
            values[field.name] = int(text)
        elif "float" in kind:
            values[field.name] = float(text)
        else:
            values[field.name] = text
    return BenchResult(**values)


# --------------------------------------------------------------------------- CLI

# Defaults per device: the CPU sweep stays under two minutes on two cores; the GPU one
# follows the FlashAttention papers' scale (16-bit, long sequences).
PROFILES = {
    "cpu": dict(seq=[128, 256, 512, 1024, 2048], head_dim=[64], dtype=["fp32"], batch=1, heads=8),
    "cuda": dict(seq=[512, 1024, 2048, 4096, 8192], head_dim=[64, 128], dtype=["bf16"],
                 batch=4, heads=16),
}


def split_list(values, kind=str) -> list:
    """``--seq 128 256`` and ``--seq 128,256`` both mean [128, 256]."""
    if values is None:
        return None
    return [kind(v) for text in values for v in str(text).split(",") if v]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernels.bench",
        description="Benchmark attention implementations: latency, TFLOP/s, GB/s, peak memory.",
        epilog="Without options: the CPU sweep (S 128..2048, D 64, B 1, H 8, fp32, causal, forward).")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--impls", nargs="+", help=f"implementations (default: all; registered: {', '.join(names())})")
    p.add_argument("--seq", nargs="+", help="sequence lengths (default per device)")
    p.add_argument("--head-dim", nargs="+", help="head dims (default 64 on CPU)")
    p.add_argument("--dtype", nargs="+", help="fp32, fp16, bf16 (default fp32 on CPU, bf16 on GPU)")
    p.add_argument("--batch", type=int, help="batch size (default 1 on CPU)")
    p.add_argument("--heads", type=int, help="number of heads (default 8 on CPU)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal mask (default) or --no-causal")
    p.add_argument("--backward", action="store_true", help="also time forward+backward")
    p.add_argument("--backward-only", action="store_true",
                   help="also time the backward alone (FLOPs 2.5x the forward's)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the sweep this many times and record each point's spread (default 1)")
    p.add_argument("--crosscheck", action="store_true",
                   help="on a GPU, also time each point with triton.testing.do_bench and do_bench_cudagraph")
    p.add_argument("--reps", type=int, default=30, help="timed calls per point, at most (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per point (default 3)")
    p.add_argument("--max-seconds", type=float, default=2.0,
                   help="time budget of a point's timed calls (default 2 s; at least 5 calls)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--warm-gpu", type=float, default=0.0, metavar="SECONDS",
                   help="on a GPU, run matmuls this long first so the clocks leave their idle state")
    p.add_argument("--out", default=str(Path("_build") / "bench" / "bench_results"),
                   help="output stem: writes OUT.json and OUT.csv (default: _build/bench/bench_results)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cli = parser()
    args = cli.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        cli.error("--device cuda needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    profile = PROFILES["cuda" if device.type == "cuda" else "cpu"]
    unknown = [n for n in split_list(args.impls) or [] if n not in names()]
    if unknown:
        cli.error(f"unknown implementation(s) {', '.join(unknown)}; registered: {', '.join(names())}")
    if device.type == "cuda" and args.warm_gpu > 0:
        print(f"warming the GPU for {args.warm_gpu:g} s", file=sys.stderr, flush=True)
        warm_gpu(args.warm_gpu, device)
    results = sweep(
        impls=split_list(args.impls),
        seqs=split_list(args.seq, int) or profile["seq"],
        head_dims=split_list(args.head_dim, int) or profile["head_dim"],
        dtypes=split_list(args.dtype) or profile["dtype"],
        causal=(args.causal,),
        modes=(FORWARD,) + ((FORWARD_BACKWARD,) if args.backward else ()) + ((BACKWARD,) if args.backward_only else ()),
        repeats=args.repeats, crosscheck=args.crosscheck,
        batch=args.batch or profile["batch"], heads=args.heads or profile["heads"],
        device=device, reps=args.reps, warmup=args.warmup, max_seconds=args.max_seconds,
        memory=not args.no_memory,
        command=shlex.join(["python", "-m", "kernels.bench", *argv]))
    json_path, csv_path = save_results(results, args.out)
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    print(f"{len(results)} points ({summary}); wrote {json_path} and {csv_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

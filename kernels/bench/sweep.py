"""The benchmark sweep: every implementation x shape x dtype x causal x mode, one row each.

For each point: make rotating input sets (``InputPool``), build the call the mode times
(``make_timed_call``), time it with ``kernels.bench.timing`` (first call apart, warm-up, as
many timed calls as the budget allows), convert the median into TFLOP/s and GB/s with the
point's own FLOP and byte counts (``new_point``, from ``kernels.reference``; the modes are
``kernels.bench.results``'), and measure peak memory on one more call. ``kv_heads`` shares
K/V heads in every mode. Nothing stops the sweep: a point that cannot run records why
(``failure_status``).
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import statistics
import sys
from typing import Optional, Sequence

import torch

from kernels import reference
from kernels.bench.gpu_checks import chosen_configs
from kernels.dtypes import dtype_name, parse_dtype
from kernels.registry import CannotRun, available, implementation, is_out_of_memory, names
from kernels.bench.results import BACKWARD, DECODE, FORWARD, FORWARD_BACKWARD, MODE_LABELS, MODES, BenchResult, BenchResults, call_text, first_line, locals_for_command, run_meta
from kernels.bench.timing import peak_memory, spread, time_calls, warm_up

# Backward-only timing replays the backward of forwards made before the clock starts
# (retain_graph): at most this many graphs are kept, one per input set, in turn.
MAX_GRAPHS = 16

# Input sets are rotated until together they exceed this: more than the last-level cache
# (tens of MB on CPUs, 40-50 MB of L2 on A100/H100/H200), so each call reads cold data.
# At most MAX_SETS sets, so tiny shapes do not spend longer making inputs than timing.
ROTATE_BYTES = {"cpu": 64 * 2**20, "cuda": 256 * 2**20}
MAX_SETS = 256
# Drawing 64 MiB of normals takes a CPU a fifth of a second per point, longer than timing a
# small shape; so a pool draws this many fresh normals and repeats them to fill its buffer.
# A prime: set i starts at offset i·(set size) mod FRESH, so no two sets (nor q and k in one)
# hold the same numbers unless a set's size is a multiple of it. The caches see addresses,
# not values, so every set still reads cold memory.
FRESH = 2**20 + 7


# --------------------------------------------------------------------------- inputs

class InputPool:
    """Random input sets for one shape, carved out of one buffer and used in turn.

    ``shape`` is (B, Hq, Sk, D). q and the gradient fed to backward have ``seq_q`` rows per
    head (Sk unless given; 1 for decoding one token); k and v have ``kv_heads`` heads (Hq unless
    given; fewer when grouped-query attention shares them). Each set is (q, k, v, grad).
    """

    def __init__(self, shape, dtype, device, backward: bool, seed: int = 0, *,
                 seq_q: Optional[int] = None, kv_heads: Optional[int] = None):
        b, h, s_k, d = shape
        q_shape = (b, h, s_k if seq_q is None else seq_q, d)           # [B, Hq, Sq, D]
        kv_shape = (b, h if kv_heads is None else kv_heads, s_k, d)    # [B, Hkv, Sk, D]
        q_numel, kv_numel = math.prod(q_shape), math.prod(kv_shape)
        per_set = 2 * q_numel + 2 * kv_numel  # q, k, v and the gradient fed to backward
        budget = ROTATE_BYTES.get(torch.device(device).type, ROTATE_BYTES["cuda"])
        bytes_per_set = per_set * torch.empty((), dtype=dtype).element_size()
        count = min(MAX_SETS, max(2, budget // bytes_per_set))
        g = torch.Generator(device=device).manual_seed(seed)
        # Random, never zeros: some kernels are faster on zeros (and softmax of zeros is flat).
        total = count * per_set
        buffer = torch.randn(min(total, FRESH), generator=g, device=device, dtype=dtype)
        if total > FRESH:
            buffer = buffer.repeat(-(-total // FRESH))[:total]
        self.sets = []
        for i in range(count):
            q, k, v, grad = buffer[i * per_set:(i + 1) * per_set].split([q_numel, kv_numel, kv_numel, q_numel])
            q, grad = q.view(q_shape).detach(), grad.view(q_shape).detach()
            k, v = k.view(kv_shape).detach(), v.view(kv_shape).detach()
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


def make_timed_call(fn, pool: InputPool, causal: bool, backward):
    """One benchmarked call: a forward (under no_grad; decoding one token is one too), a forward
    and its backward, or (``backward`` = BACKWARD) a backward alone, replayed on forwards made
    here, before any timing."""
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
            if is_out_of_memory(err):
                raise
            raise NoBackward(f"its backward failed: {err}") from err

    def forward_backward():
        q, k, v, grad = pool.next()
        return differentiate(fn(q, k, v, causal=causal), (q, k, v), grad)

    if mode in (FORWARD, DECODE):
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


def failure_status(name: str, err: BaseException) -> tuple[str, str]:
    """(status, reason) for an exception raised while benchmarking ``name``."""
    if isinstance(err, MemoryError) or is_out_of_memory(err):   # Python's own, or an allocator's
        return "oom", first_line(err)
    if isinstance(err, EagerFallback):
        return "error", str(err)
    if type(err).__name__ == "FailOnRecompileLimitHit":   # raised inside the timed call (no_eager_fallback)
        return "error", (f"{name}: torch.compile reached its recompile limit and would run eagerly; "
                         f"not reported as a compiled timing ({first_line(err)})")
    if isinstance(err, NoBackward):
        return "no backward", str(err)
    # The implementation contract: "cannot run here" is CannotRun; input it refuses everywhere
    # is a ValueError/TypeError.
    if isinstance(err, CannotRun):
        return "unavailable", first_line(err)
    if isinstance(err, (ValueError, TypeError)):
        return "unsupported", first_line(err)
    return "error", f"{type(err).__name__}: {first_line(err)}"


def unsupported_input_reason(name: str, head_dim: int, dtype: torch.dtype) -> Optional[str]:
    """The registry's own head-dim/dtype limits, checked before any input is made."""
    impl = implementation(name)
    if impl.head_dims is not None and head_dim not in impl.head_dims:
        return f"{name}: head_dim {head_dim} is not supported; supported: {impl.head_dims}"
    if impl.dtypes is not None and dtype not in impl.dtypes:
        return f"{name}: dtype {dtype_name(dtype)} is not supported"
    return None


def rates(point: BenchResult) -> None:
    """TFLOP/s and GB/s from the point's median and its own FLOP and byte counts."""
    if point.median_ms is None:
        raise ValueError(f"{point.impl} at S={point.seq}: no median time to compute rates from; "
                         "time the point first")
    point.tflops = point.flops / (point.median_ms * 1e-3) / 1e12
    point.gbps = point.bytes / (point.median_ms * 1e-3) / 1e9


class EagerFallback(Exception):
    """A compiled implementation gave up compiling and would run eagerly under its compiled name."""


def _recompile_limit_hits() -> int:
    from torch._dynamo.utils import counters
    return sum(n for reason, n in counters["unimplemented"].items() if "recompile limit" in reason.lower())


@contextlib.contextmanager
def no_eager_fallback(name: str):
    """Run the body with Dynamo told to raise where it would silently fall back to eager.

    By default, a function that reaches ``torch._dynamo.config.recompile_limit`` compiles
    runs eagerly from then on, with only a logged warning: its timings would be eager code's
    under a compiled name. ``fail_on_recompile_limit_hit`` makes that an exception; a hit
    counted some other way while the body ran is refused too.
    """
    hits = _recompile_limit_hits()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    if _recompile_limit_hits() > hits:
        raise EagerFallback(f"{name}: torch.compile reached its recompile limit while timed and ran eagerly "
                            "(eager code under a compiled name); not reported")


def measure(point: BenchResult, device: torch.device, dtype: torch.dtype, *, reps: int,
            warmup: int, min_reps: int, max_seconds: float, memory: bool) -> BenchResult:
    """Fill in one point's timings, rates and memory, or its failure status (a compiled entry
    that falls back to eager is an error, see ``no_eager_fallback``)."""
    try:
        with no_eager_fallback(point.impl):
            return _measure(point, device, dtype, reps=reps, warmup=warmup, min_reps=min_reps,
                            max_seconds=max_seconds, memory=memory)
    except EagerFallback as err:
        if point.status == "ok":   # else the timed call's own FailOnRecompileLimitHit already said it
            point.status, point.reason = failure_status(point.impl, err)
        point.median_ms = point.p10_ms = point.p90_ms = point.tflops = point.gbps = None
        return point


def _measure(point: BenchResult, device: torch.device, dtype: torch.dtype, *, reps: int,
             warmup: int, min_reps: int, max_seconds: float, memory: bool) -> BenchResult:
    fn = implementation(point.impl).call
    shape = (point.batch, point.heads, point.seq, point.head_dim)
    pool = None
    try:
        pool = InputPool(shape, dtype, device, point.backward, seq_q=point.seq_q, kv_heads=point.kv_heads)
        timed_call = make_timed_call(fn, pool, point.causal, point.mode)
        # The first call autotunes and compiles (seconds for Triton): it is timed on its own,
        # so the warm-up that follows estimates the steady state and keeps its calls.
        point.first_call_ms = warm_up(timed_call, device, 1, budget_ms=0)
        estimate_ms = warm_up(timed_call, device, warmup, budget_ms=max_seconds * 1e3 / 2)
        # As many timed calls as fit the time budget, within [min_reps, reps].
        n = max(min_reps, min(reps, int(max_seconds * 1e3 / max(estimate_ms, 1e-3))))
        point.median_ms, point.p10_ms, point.p90_ms = spread(time_calls(timed_call, device, n))
        point.reps = n
        point.config = chosen_configs(point.impl)
        if memory:
            point.peak_memory_bytes, point.memory_method = peak_memory(timed_call, device)
    except Exception as err:  # the sweep goes on; the row says what happened
        point.status, point.reason = failure_status(point.impl, err)
    finally:
        del pool
        if device.type == "cuda" and point.status == "oom":
            gc.collect()
            torch.cuda.empty_cache()
    if point.ok:
        rates(point)
    return point


def new_point(name, device, dtype, batch, heads, seq, head_dim, causal, mode,
              kv_heads: Optional[int] = None) -> BenchResult:
    """A row with its FLOPs and bytes (``seq`` is Sk; Sq is 1 in decode, ``seq`` otherwise).

    Backward alone: forward+backward less the forward, so 2.5x the forward's FLOPs, and the
    bytes dO, dQ, dK, dV add. Decode: ``reference.decode_flops``, and ``reference.io_bytes`` with
    Sq = 1 (the K/V cache read once, q read, o written).
    """
    kv_heads = heads if kv_heads is None else kv_heads
    materialized = implementation(name).materializes_scores

    def count(backward):
        return (reference.flops(batch, heads, seq, head_dim, causal=causal, backward=backward),
                reference.io_bytes(batch, heads, seq, head_dim, dtype=dtype, materialized=materialized,
                                   backward=backward, kv_heads=kv_heads))

    if mode == DECODE:
        flops = reference.decode_flops(batch, heads, seq, head_dim)
        nbytes = reference.io_bytes(batch, heads, 1, head_dim, dtype=dtype, materialized=materialized,
                                    seq_k=seq, kv_heads=kv_heads)
    else:
        flops, nbytes = count(mode != FORWARD)
        if mode == BACKWARD:
            forward_flops, forward_bytes = count(False)
            flops, nbytes = flops - forward_flops, nbytes - forward_bytes
    return BenchResult(
        impl=name, device=device.type, dtype=dtype_name(dtype), batch=batch, heads=heads,
        seq=seq, head_dim=head_dim, causal=causal, mode=mode, flops=flops, bytes=nbytes,
        seq_q=1 if mode == DECODE else seq, kv_heads=kv_heads)


# --------------------------------------------------------------------------- the sweep

def sweep(impls: Optional[Sequence[str]] = None, seqs: Sequence[int] = (128, 256, 512, 1024, 2048),
          head_dims: Sequence[int] = (64,), dtypes: Sequence = (torch.float32,),
          causal: Sequence[bool] = (True,), modes: Sequence[str] = (FORWARD,), *,
          batch: int = 1, heads: int = 8, kv_heads: Optional[int] = None, device="cpu",
          reps: int = 30, warmup: int = 3, min_reps: int = 5, max_seconds: float = 2.0,
          memory: bool = True, repeats: int = 1,
          progress=sys.stderr, command: Optional[str] = None) -> BenchResults:
    """Benchmark implementations x seqs x head_dims x dtypes x causal x modes.

    ``seqs`` are the key lengths Sk: the sequence in forward and training modes, the KV
    cache's length in ``decode`` (one query against it). ``kv_heads`` (default ``heads``)
    shares K/V heads, Hq / Hkv query heads each. ``impls=None`` means every registered name;
    on a CPU the ``slow_on_cpu`` ones are then recorded as skipped (name them to include them).
    Each point takes at most about ``max_seconds`` of timed calls (at least ``min_reps``, at
    most ``reps`` of them). ``repeats`` > 1 runs the whole sweep that many times, so that drift
    (clocks, other load) shows as the spread of each point's round medians; the point's median
    is then the median of its rounds.
    A progress line per point goes to ``progress`` (None for silence).
    """
    device = torch.device(device)
    dtypes = [parse_dtype(d) for d in dtypes]
    check_sweep_args(seqs, head_dims, modes, batch, heads, reps, min_reps, kv_heads)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    chosen = list(impls) if impls is not None else names()
    unknown = [n for n in chosen if n not in names()]
    if unknown:
        raise KeyError(f"unknown implementation(s) {', '.join(unknown)}; registered: {', '.join(names())}")
    reasons = available(device)
    results = BenchResults(meta=run_meta(device, command or call_text(locals_for_command(
        chosen, seqs, head_dims, dtypes, causal, modes, batch, heads, kv_heads, device, reps))))
    points = [(n, s, d, t, c, m) for n in chosen for m in modes for t in dtypes for d in head_dims
              for c in causal for s in seqs]
    rounds: dict = {}
    for round_no in range(repeats):
        for i, (name, seq, head_dim, dtype, is_causal, mode) in enumerate(points, 1):
            point = new_point(name, device, dtype, batch, heads, seq, head_dim, is_causal, mode, kv_heads)
            why_not = reasons[name] or unsupported_input_reason(name, head_dim, dtype)
            if impls is None and device.type == "cpu" and implementation(name).slow_on_cpu:
                point.status, point.reason = "skipped", (
                    f"{name}: left out of CPU sweeps by default (the Triton interpreter takes seconds "
                    "per call); name it in impls / --impls to include it")
            elif why_not:
                point.status = "unavailable" if reasons[name] else "unsupported"
                point.reason = why_not
            else:
                measure(point, device, dtype, reps=reps, warmup=warmup, min_reps=min_reps,
                        max_seconds=max_seconds, memory=memory and round_no == 0)
            rounds.setdefault(i, []).append(point)
            if progress is not None:
                label = f"round {round_no + 1}/{repeats} " if repeats > 1 else ""
                print(label + progress_line(i, len(points), point), file=progress, flush=True)
    for i in range(1, len(points) + 1):
        results.append(merge_rounds(rounds[i]))
    return results


def merge_rounds(measured: list) -> BenchResult:
    """One row from the rounds of one point: the first round's row (its memory), with the
    median of the round medians, their spread, and the widest p10-p90."""
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
    rates(first)
    first.config = measured[-1].config or first.config
    return first


def check_sweep_args(seqs, head_dims, modes, batch, heads, reps, min_reps, kv_heads=None) -> None:
    for label, values in (("seqs", seqs), ("head_dims", head_dims), ("batch", [batch]),
                          ("heads", [heads]), ("reps", [reps]), ("min_reps", [min_reps])):
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{label} must be positive integers, got {values!r}")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be among {MODES!r}, got {modes!r}")
    if kv_heads is not None and (isinstance(kv_heads, bool) or not isinstance(kv_heads, int)
                                 or kv_heads < 1 or heads % kv_heads):
        raise ValueError(f"kv_heads must be a positive integer that divides heads={heads} "
                         f"(grouped-query attention), got {kv_heads!r}")


def progress_line(i: int, total: int, r: BenchResult) -> str:
    shape = f"Sk={r.seq:<6}" if r.mode == DECODE else f"S={r.seq:<7}"
    gqa = f" Hkv={r.kv_heads}" if r.kv_heads not in (None, r.heads) else ""
    where = (f"[{i:>{len(str(total))}}/{total}] {r.impl:<15} {shape} D={r.head_dim:<4}{gqa} "
             f"{r.dtype:<8} {'causal' if r.causal else 'full':<6} {MODE_LABELS[r.mode]:<7}")
    if not r.ok:
        return f"{where} {r.status}: {r.reason}"
    mem = "" if r.peak_memory_bytes is None else f"  peak {r.peak_memory_bytes / 2**20:8.1f} MiB"
    return (f"{where} {r.median_ms:9.3f} ms (p10 {r.p10_ms:.3f}, p90 {r.p90_ms:.3f}, n={r.reps})"
            f"  {r.tflops:7.3f} TFLOP/s  {r.gbps:7.1f} GB/s  {r.intensity:7.2f} FLOP/B{mem}")


def book_budget(on_gpu: bool) -> dict:
    """The short timing budget of a chapter's sweep (``sweep``'s reps, warmup, min_reps and
    max_seconds), so the book builds in minutes; ``python -m kernels.bench`` runs longer ones."""
    if on_gpu:
        return dict(reps=30, warmup=3, min_reps=5, max_seconds=0.5)
    return dict(reps=15, warmup=2, min_reps=5, max_seconds=0.3)

"""Timing one callable honestly: synchronise, warm up, time many calls, keep the spread.

The measuring core every benchmark of the course shares (the sweep, ``kernels.bench.comparison``,
``kernels.attention.decoding``, the appendix *Measuring honestly*). The callable timed is the
*timed call* (``timed_call``), never a "step": a step is one profiler step.

- ``synchronize``: wait for the GPU (a no-op on a CPU, where every op has finished on return);
- ``warm_up``: a few calls kept out of the record (first calls compile, tune, fill caches);
- ``time_calls``: milliseconds of each call, by CUDA events on a GPU, ``perf_counter`` on a CPU;
- ``spread``: the median with the 10th and 90th percentiles;
- ``peak_memory``: the peak a call allocated above what was allocated before it.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Sequence

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kernels.trace.reader import load_trace
from kernels.trace.record import quiet_kineto

MEMORY_METHODS = {
    "cuda.max_memory_allocated": (
        "torch.cuda.max_memory_allocated() during one call, minus torch.cuda.memory_allocated() "
        "before it: the peak of what the call itself allocated (caching allocator, GPU)"),
    "profiler memory events": (
        "torch.profiler with profile_memory=True around one call: the peak of 'Total Allocated' "
        "in the trace's [memory] events minus its value before the call's first allocation "
        "(CPU allocations made through PyTorch's allocator; kernels.trace.reader.Step.peak_bytes)"),
}
# The record_function label the CPU memory measurement puts around its one call.
PEAK_LABEL = "kernels.bench.timing.peak_memory"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(timed_call, device: torch.device, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls: CUDA events on a GPU, perf_counter on a CPU."""
    synchronize(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            start.record()
            timed_call()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        timed_call()
        synchronize(device)
        times.append((time.perf_counter() - began) * 1e3)
    return times


def warm_up(timed_call, device: torch.device, calls: int, budget_ms: float) -> float:
    """Up to ``calls`` calls kept out of the record (at least one, fewer once they have
    used ``budget_ms``: a slow call is warm after one run); return the fastest's ms."""
    best, spent = float("inf"), 0.0
    for _ in range(max(1, calls)):
        start = time.perf_counter()
        timed_call()
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


def peak_memory(timed_call, device: torch.device) -> tuple[int, str]:
    """Bytes allocated at the peak of one call, above what was allocated before it, and the
    method (a key of MEMORY_METHODS)."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        timed_call()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, "cuda.max_memory_allocated"
    return profiler_peak_memory(timed_call), "profiler memory events"


def profiler_peak_memory(timed_call) -> int:
    """One call profiled with memory events, inside a label; its peak is that labelled step's
    ``peak_bytes``, read by ``kernels.trace.reader`` as every chapter's traces are (one home for the rule)."""
    with quiet_kineto(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function(PEAK_LABEL):
            timed_call()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        return load_trace(path).steps(PEAK_LABEL)[0].peak_bytes


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

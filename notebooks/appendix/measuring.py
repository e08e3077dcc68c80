# %% [markdown]
# # Measuring honestly
#
# A benchmark number is a claim about a machine, and most wrong claims come from a handful of
# well-known traps. This appendix walks through the ones the course guards against, and
# shows where `kernels.bench` deals with each. Every demonstration runs on a CPU in a few
# seconds; the GPU-only effects are described, and demonstrated in the cells that run
# only when the book is built on a GPU.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import math
import statistics
import time

import torch

import kernels
from kernels import reference
from kernels.bench import plots, sweep, timing
from kernels.hw import devices
from kernels.notebook import glue, inputs, lesson, say, setup, show_lines

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
where = devices.describe_device(device)
print(f"Measured on {where['name']}, torch {where['versions']['torch']}")
# Small shapes: this page demonstrates effects, it does not benchmark.
small = dict(batch=1, heads=4, seq=256, head_dim=head_dim)

# %% [markdown]
# ## 1. Warm up first
#
# The first call of anything does work the later ones do not: the allocator asks the
# operating system for fresh pages and touches them, libraries pick an algorithm
# ([cuBLAS](../glossary.md#cublas) and cuDNN choose among kernels, Triton compiles), thread
# pools start, caches are cold. Timing the first call measures all of that. `kernels.bench` runs a few untimed calls first and
# uses the fastest of them to decide how many timed calls fit its time budget. Here are the
# first calls of a function this process has never run at this shape:

# %%
def timed(fn, *args):
    timing.synchronize(device)
    start = time.perf_counter()
    fn(*args)
    timing.synchronize(device)
    return (time.perf_counter() - start) * 1e3

q, k, v = inputs(2, 4, 384, head_dim, dtype=dtype, device=device, seed=1)
first_calls = [timed(kernels.get("sdpa_math"), q, k, v) for _ in range(6)]
print("first six calls (ms):", ", ".join(f"{t:.2f}" for t in first_calls))

# %% tags=["remove-cell"]
glue("first_call_ms", first_calls[0])
glue("later_call_ms", statistics.median(first_calls[1:]))
first_is_slowest = first_calls[0] > max(first_calls[1:])
glue("first_call_note", "the first call was the slowest of the six here; that is one sample of one run, "
     "and the next run's noise may hide it, so kernels.bench never relies on it and always warms up" if first_is_slowest else
     "the first call was not the slowest of the six on this run: the warm-up cost is within the noise "
     "of the later calls, which is exactly why one call proves nothing")

# %% [markdown]
# On this run the very first call took {glue:text}`first_call_ms:.2f` ms and the later ones
# {glue:text}`later_call_ms:.2f` ms (median): {glue:text}`first_call_note`. On a GPU the first
# call can also compile a kernel (Triton's first call of a kernel at a new shape includes its
# compilation) or pick one (cuBLAS), work that dwarfs a short kernel's run.
#
# ## 2. Asynchronous launches: synchronise before you read a clock
#
# A CUDA call returns as soon as the kernel is *queued*. The CPU runs ahead while the GPU
# works. So `perf_counter()` around a kernel launch measures the launch (microseconds), not
# the kernel, unless the code waits for the GPU with `torch.cuda.synchronize()` before
# reading the clock. A CPU op, by contrast, returns when its work is done: on a CPU the
# synchronisation is a no-op, which is why `timing.synchronize` only acts on a GPU.

# %%
show_lines(timing.synchronize)

# %% tags=["remove-input"]
if on_gpu:  # the book's own GPU build shows the gap; a CPU has none to show
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    torch.mm(a, a)  # warm up cuBLAS
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.mm(a, a)
    launch_ms = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.mm(a, a)
    torch.cuda.synchronize()
    synced_ms = (time.perf_counter() - start) * 1e3
    print(f"8192³ bf16 matmul: {launch_ms:.3f} ms without synchronising, {synced_ms:.3f} ms with")
    lesson(launch_ms < synced_ms, "without a synchronize, perf_counter times the launch, not the kernel",
           f"{launch_ms:.3f} vs {synced_ms:.3f} ms")

# %% [markdown]
# ## 3. Clocks: CUDA events or perf_counter
#
# On a CPU, `time.perf_counter()` is the right clock: monotonic (it never jumps back when the
# system clock is adjusted, unlike `time.time()`) and with sub-microsecond resolution.
# On a GPU, a pair of CUDA events recorded on the stream before and after the work time what
# the stream did between them, without a synchronize between every call: `kernels.bench`
# records all the event pairs, synchronises once, then reads them. That includes the time the
# GPU sat idle. While the CPU launches work faster than the GPU runs it, the queue stays full
# and the events time the kernels alone; a call too short for that (launch-bound: a few tiny
# kernels) leaves the GPU waiting for each launch, and its events time the launches too.

# %%
show_lines(timing.time_calls)

# %%
info = time.get_clock_info("perf_counter")
print(f"perf_counter: monotonic={info.monotonic}, resolution {info.resolution * 1e9:.0f} ns ({info.implementation})")

# %% tags=["remove-input"]
lesson(info.monotonic and info.resolution <= 1e-6, "perf_counter is monotonic with at most microsecond resolution",
       f"resolution {info.resolution * 1e9:.0f} ns")

# %% [markdown]
# ## 4. Medians and spread
#
# Timed calls are not all equal: another process wakes up, the operating system moves a
# thread, a GPU changes its clock. The distribution has a long tail on the slow side. The
# **mean** follows the tail; the **median** does not. The course quotes medians, with the
# 10th and 90th percentiles as the spread, and takes a median as a result only when the spread
# is tight: p90 within twice p10 (`kernels.bench.plots.NOISY_SPREAD`); beyond that the calls
# are noise, not a result. Here are 25 timed calls of in-place attention, and
# what one late call would do to each statistic: we add, by hand, a 26th call 50 times as slow
# as the slowest of them (a stalled process, a swap to disk) and compute both again. The calls
# are B=1, H=4, S=256, D=64 attention forwards.

# %%
pool = sweep.InputPool((small["batch"], small["heads"], small["seq"], small["head_dim"]), dtype, device, backward=False)
timed_call = sweep.make_timed_call(kernels.get("inplace"), pool, causal=True, backward=False)
timing.warm_up(timed_call, device, calls=2, budget_ms=500)
times = timing.time_calls(timed_call, device, reps=25)
median, p10, p90 = timing.spread(times)
with_outlier = times + [50 * max(times)]   # a late call, added by hand
print(f"25 calls: median {median:.1f} ms, p10 {p10:.1f}, p90 {p90:.1f}, mean {statistics.mean(times):.1f}")
print(f"with the late call: median {statistics.median(with_outlier):.1f} ms,",
      f"mean {statistics.mean(with_outlier):.1f}")

# %% tags=["remove-input"]
moved_mean = statistics.mean(with_outlier) / statistics.mean(times) - 1
moved_median = statistics.median(with_outlier) / median - 1
ordered = sorted(times)
# In ms, the mean moves by at least 49/26 of the slowest call, the median by at most half the
# gap between two neighbours: a late call moves the mean further, on any run.
lesson(ordered[12] <= statistics.median(with_outlier) <= ordered[13]
       and statistics.mean(with_outlier) - statistics.mean(times) > statistics.median(with_outlier) - median,
       "one slow call moves the mean, while the median stays between its two middle neighbours",
       f"mean {100 * moved_mean:+.0f}%, median {100 * moved_median:+.1f}%")
glue("mean_moved", 100 * moved_mean)
glue("median_moved", 100 * moved_median)

# %% tags=["remove-input"]
#| caption: The 25 timed calls of in-place attention (bars), zoomed to their range, with their median and mean (thick black lines), and the median once one late call of 50x the slowest is added by hand (thin red line, beside the black median). The mean with the late call, like the late call itself, lies off the chart to the right (its value is in the legend): the mean moves further than the median.
#| alt: Histogram of call times zoomed to the measured range, with thick black vertical lines for the median and the mean of the measured calls and a thin red line for the median with the added late call, next to the black median; an arrow at the right edge points to the mean with the late call, off the chart.
import matplotlib.pyplot as plt

late = with_outlier[-1]
fig, ax = plt.subplots(figsize=(4.8, 4.6), layout="constrained")   # narrow: legible on a phone
ax.hist(times, bins=12, color="tab:blue", alpha=0.7, label="25 timed calls")
for data, colour, width, which in ((times, "black", 3, "25 calls"), (with_outlier, "tab:red", 1.5, "with the late call")):
    ax.axvline(statistics.median(data), color=colour, linestyle="-", linewidth=width,
               label=f"median, {which}: {statistics.median(data):.3f} ms")
    ax.axvline(statistics.mean(data), color=colour, linestyle="--", linewidth=width,
               label=f"mean, {which}: {statistics.mean(data):.3f} ms")
pad = 0.25 * (max(times) - min(times)) + 0.01 * max(times)   # zoom on the 25 calls
ax.set_xlim(max(0.0, min(times) - pad), max(times) + pad)
ax.annotate(f"mean with the late call,\nand the late call ({late:.1f} ms) →", xy=(0.98, 0.92),
            xycoords="axes fraction", ha="right", va="top", color="tab:red")
ax.set_xlabel("time per call (ms)")
ax.set_ylabel("calls")
ax.set_title(f"25 calls of inplace, S={small['seq']}")
fig.legend(loc="outside lower center", ncols=1)   # one column: legible on a phone
say(f"These 25 calls themselves: p90 is {p90 / p10:.1f} times p10, "
    + ("within twice, so on this run their median is a result." if p90 <= plots.NOISY_SPREAD * p10 else
       "beyond twice: on this run they are too noisy to be a result (section 7's rule); they still show "
       "what a late call does to each statistic."))
# The caption says the late call and the mean with it lie off the chart, to the right, and the
# median with it on the chart: keep the drawing true to it.
assert max(ax.get_xlim()) < statistics.mean(with_outlier) < late, "the mean with the late call lies beyond the chart's edge"
assert min(ax.get_xlim()) < statistics.median(with_outlier) < max(ax.get_xlim()), "the median with the late call is on the chart"
lesson(statistics.mean(with_outlier) > p90,
       "with the late call, the mean lies beyond the 90th percentile of the measured calls: it describes no typical call",
       f"mean {statistics.mean(with_outlier):.3f} ms against p90 {p90:.3f} ms")

# %% [markdown]
# One slow call out of 26 moved the mean by {glue:text}`mean_moved:.0f`% and the median by
# {glue:text}`median_moved:.1f`%.
#
# ## 5. Zeros are not data
#
# Two separate reasons keep zeros out of every input the course makes.
#
# **Correctness.** Attention of all-zero inputs is all zeros: the scores are 0, the softmax is
# uniform, and the average of zero values is zero. So a kernel that writes *nothing* into a
# zero-initialised output passes a test on zeros perfectly. The same goes for a kernel that
# forgets the ragged last tile. That is why the course's inputs are random, and why its tests
# allocate outputs filled with NaN ("poisoned") before a kernel writes them: a region the
# kernel never wrote stays NaN and fails loudly. Here is such a kernel: it handles query
# rows in tiles of 64 and forgets the last, partial tile.

# %%
def forgetful_attention(q, k, v, out, tile=64):
    """Correct attention for every full tile of query rows; the ragged tail is never written."""
    full = (q.shape[-2] // tile) * tile
    out[..., :full, :] = reference.attention(q, k, v)[..., :full, :].to(out.dtype)
    return out

# %% tags=["remove-input"]
def passes(qkv, out):
    q, k, v = qkv
    got = forgetful_attention(q, k, v, out)
    return bool(torch.isfinite(got).all()) and reference.max_rel_error(got, reference.attention(q, k, v)) <= 1e-5

shape = (1, 2, 100, 16)  # S=100: one full tile of 64 rows, then 36 rows the kernel forgets
zeros = [torch.zeros(shape) for _ in range(3)]
rand = inputs(*shape, seed=2)
verdicts = {
    "zero inputs, zero-filled output": passes(zeros, torch.zeros(shape)),
    "zero inputs, NaN-poisoned output": passes(zeros, torch.full(shape, float("nan"))),
    "random inputs, zero-filled output": passes(rand, torch.zeros(shape)),
    "random inputs, NaN-poisoned output": passes(rand, torch.full(shape, float("nan"))),
}
for case, ok in verdicts.items():   # short lines, so each outcome stays beside its case on a phone
    print(f"{case}: {'passes' if ok else 'fails'}")
lesson(verdicts["zero inputs, zero-filled output"], "a kernel that skips its last tile passes a test on zeros")
lesson(not any(ok for case, ok in verdicts.items() if "random" in case or "NaN" in case),
       "random inputs or a NaN-poisoned output each expose the skipped tile")

# %% [markdown]
# **Speed.** On a GPU, zeros can also be *fast*. Horace He measured it in 2024
# (["Strangely, Matrix Multiplications on GPUs Run Faster When Given 'Predictable'
# Data!"](https://www.thonking.ai/p/strangely-matrix-multiplications)): the same 8192 x 8192 x
# 8192 matmul ran at 295 TFLOP/s on zeros and 257 on random values, because a multiply of zeros
# flips fewer transistors, draws less power and lets the chip hold a higher clock under its
# power limit.
# A benchmark on `torch.zeros` (or `torch.ones`, or one repeated value) can therefore flatter a
# kernel. `kernels.bench` fills every input set with `torch.randn`:

# %%
show_lines(sweep.InputPool, "g = torch.Generator", "buffer = torch.randn")

# %% tags=["remove-input"]
if on_gpu:  # the book's own GPU build measures it; a CPU has no such effect to show
    n = 8192
    rates = {}
    for label, make in (("zeros", torch.zeros), ("random", torch.randn)):
        a = make(n, n, device=device, dtype=torch.bfloat16)
        b = make(n, n, device=device, dtype=torch.bfloat16)
        mm = lambda: torch.mm(a, b)  # noqa: E731 (one call to time)
        timing.warm_up(mm, device, calls=3, budget_ms=2000)
        rates[label] = 2 * n**3 / (statistics.median(timing.time_calls(mm, device, reps=20)) * 1e-3) / 1e12
    print(", ".join(f"{k}: {v:.0f} TFLOP/s" for k, v in rates.items()), f"({where['name']}, {n}³ bf16 matmul)")

# %% [markdown]
# ## 6. Counting FLOPs: causal is half
#
# TFLOP/s is FLOPs divided by time, so it is only as right as the FLOP count. Causal attention
# counts half of full attention's FLOPs, $2BHS^2D$ rather than $4BHS^2D$: [chapter 6 explains
# why](../06_showdown.ipynb#counting-flops-causal-is-half). Count the full square instead and
# every TFLOP/s figure doubles, without the kernel getting any faster.
#
# This has happened in public: in July 2023, in the discussion of Triton's pull request
# #1849 (new benchmarks for its fused-attention tutorial), the FlashAttention baseline turned
# out to run causal attention while its FLOPs were counted as for the full matrix, inflating
# its TFLOP/s by 2x; the maintainers fixed the count.

# %%
S = 1024
causal = reference.flops(1, 8, S, 64, causal=True)
full = reference.flops(1, 8, S, 64, causal=False)
# Any measured time will do: the error is in the numerator, not in the clock.
print(f"a causal forward of 1 ms at B1 H8 S{S} D64: {causal / 1e-3 / 1e12:.3f} TFLOP/s counted right, "
      f"{full / 1e-3 / 1e12:.3f} TFLOP/s counted at full price")

# %% [markdown]
# ## 7. Rotate the inputs past the caches
#
# Calling a kernel on the same small tensors over and over serves them from cache: the last
# level cache of a CPU holds tens of MB, and an A100's L2 holds 40 MB (50 MB on an H100), as
# much as several full q, k, v sets at small shapes. A real model never reads the same
# activations twice in a row, so such a benchmark flatters small shapes. `kernels.bench`
# makes enough random input sets (carved from one buffer) that together they reach a
# rotation target at least as large as the caches, and uses them in turn:

# %%
shape = (small["batch"], small["heads"], small["seq"], small["head_dim"])
rotated = sweep.InputPool(shape, dtype, device, backward=False)
per_set = 4 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
total = per_set * len(rotated.sets)
print(f"{len(rotated.sets)} input sets of {per_set / 2**20:.2f} MiB: {total / 2**20:.0f} MiB in turn "
      f"(rotation target {sweep.ROTATE_BYTES[device.type] / 2**20:.0f} MiB)")

# %% tags=["remove-input"]
lesson(total >= sweep.ROTATE_BYTES[device.type] or len(rotated.sets) == sweep.MAX_SETS,
       "the input sets together reach the cache-busting target (or the set limit)")
sets_used = {id(rotated.next()[0]) for _ in range(2 * len(rotated.sets))}
lesson(len(sets_used) == len(rotated.sets), "consecutive calls cycle through every input set")

# %%
one_set = sweep.InputPool(shape, dtype, device, backward=False)
one_set.sets = one_set.sets[:1]  # the same q, k, v every call: always warm in cache
spreads = {}
for label, pool in (("same inputs every call", one_set), ("rotated inputs", rotated)):
    timed_call = sweep.make_timed_call(kernels.get("sdpa_flash"), pool, causal=True, backward=False)
    timing.warm_up(timed_call, device, calls=3, budget_ms=500)
    spreads[label] = timing.spread(timing.time_calls(timed_call, device, reps=40))

# %% tags=["remove-input"]
for label, (mid, low, high) in spreads.items():   # a time is a result only if it passes the spread check
    print(f"{label:<24} " + (f"median {mid:.3f} ms (p10 {low:.3f}, p90 {high:.3f})" if high <= 2 * low else
                             f"p90 {high:.3f} ms beyond twice p10 {low:.3f}: too noisy on this run to be a result"))

# %% tags=["remove-cell"]
def timing_comparison(same, rotated):
    """This run's two (median, p10, p90) in words, read with the spread rule: a result only where
    p90 is within twice p10, a difference only where the p10-p90 ranges do not overlap."""
    noisy = [label for label, (_, low, high) in (("same-input", same), ("rotated", rotated)) if high > 2 * low]
    if noisy:
        return f"the {' and '.join(noisy)} timings were too noisy to compare (p90 beyond twice p10)"
    change = 100 * (rotated[0] / same[0] - 1)
    ranges = f"{rotated[1]:.3f}-{rotated[2]:.3f} ms against {same[1]:.3f}-{same[2]:.3f}"
    said = f"rotated inputs took a median {rotated[0]:.3f} ms against {same[0]:.3f} ms with the same inputs ({change:+.0f}%)"
    if rotated[1] <= same[2] and same[1] <= rotated[2]:
        return f"{said}, but their p10-p90 ranges overlap ({ranges}), so this run cannot tell the two apart"
    return f"{said}, and their p10-p90 ranges do not overlap ({ranges}): a difference beyond the spread"

glue("rotation_reading", timing_comparison(spreads["same inputs every call"], spreads["rotated inputs"]))

# %% [markdown]
# On this run, {glue:text}`rotation_reading`. A difference counts only where the two 10th-90th
# percentile ranges do not overlap: within them, another run can reverse it. The rule matters
# most for small shapes on GPUs, where a whole input set fits in L2. The course rotates
# everywhere, so no number depends on whether it happened to matter.
#
# ## The checklist
#
# - Warm up; never time the first call.
# - On a GPU, synchronise before reading a CPU clock, or use CUDA events (which count the
#   GPU's idle time when the calls are launch-bound).
# - Quote the median and the spread of many calls, not the mean, and not one call.
# - Random inputs, never zeros; poison outputs in tests.
# - Count causal attention at half the FLOPs of full attention.
# - Rotate inputs past the caches.
# - Say where the number came from: device, versions, date, command (`kernels.bench` stores
#   all of it with every result).

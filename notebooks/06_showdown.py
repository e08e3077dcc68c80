# %% [markdown]
# # 6. Showdown
#
# Every implementation of the course, side by side, measured on the machine that built this
# page: what one forward runs (ops on a CPU, kernels on a GPU, read from traces recorded
# here), how long it takes (the median of many timed calls from `kernels.bench`, never a
# single profiled step), how much memory it needs at its peak, and where it sits under the
# device's roofline. Then the same numbers across sequence lengths, where the S² of
# attention shows itself, and the two other calls attention serves: a training step
# (forward and backward) and a decode token (one query against a KV cache).
#
# The source article closes with a table typed by hand from one A100. This chapter's table is
# regenerated on every build, so it can never disagree with the code; the article's numbers
# appear at the end, in a table of their own, labelled as recorded elsewhere.
#
# **You will learn to:**
#
# - read a benchmark table the build regenerates: the median per forward with its spread, peak
#   memory and TFLOP/s;
# - count causal FLOPs at half, and see what counting them in full does to TFLOP/s;
# - watch memory grow as S² or as S across sequence lengths, and place each implementation under
#   the device's roofline;
# - compare a forward with a training step and a decode token, and see why decoding is
#   memory-bound;
# - read a real model's attention calls on an H100 and an MI300X against each GPU's peak, and
#   tell from the grid and the SM count why short sequences leave most of a GPU idle.
#
# **Before you start:** Chapters [1. Attention by hand](01_naive.ipynb) to [5. FlashAttention in
# CUDA, by hand](05_cuda.ipynb): their implementations are the contenders. The training and
# decode tokens are taken apart later, in [9. The backward pass](09_backward.ipynb) and [10.
# Decoding](10_decoding.ipynb).
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import contextlib
import math

import pandas as pd
import torch

import kernels
from kernels import gpu_lessons, recorded, reference
from kernels.borrowed import TRACELENS
from kernels.bench import comparison, plots, sweep
from kernels.bench.results import BenchResults, DECODE, FORWARD_BACKWARD, GOAL_BASELINE, goal_ratios, GOALS, load_results
from kernels.dtypes import dtype_name
from kernels.hw import devices
from kernels.notebook import glue, inputs, lesson, mib, reveal, setup
from kernels.trace import reader, record
from kernels.trace.attention import find_attention
from kernels.trace.links import links

with contextlib.suppress(ImportError):
    import kernels.cuda.flash

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
where = devices.describe_device(device)
versions = ", ".join(f"{k} {v}" for k, v in where["versions"].items() if v)
run_label = f"{where['name']} ({device.type}), {versions}"
glue("run_label", run_label)
print("This run:", run_label)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)

# %% [markdown]
# Every number below was measured on: {glue:text}`run_label`.
#
# ## The contenders
#
# The registry says what runs on this device, and why not where it cannot. One exclusion is
# ours: entries flagged `slow_on_cpu` in the registry give no performance number on a CPU.
# `triton` runs there in Triton's *interpreter*, which executes the kernel program by
# program in NumPy to check that it is correct; `compiled_naive` and `flex` compile for every
# new shape. They stay out of this chapter on a CPU (chapters 4 and 7 run them there).

# %%
reasons = kernels.available(device)
for name in [n for n, why in reasons.items() if why is None and not on_gpu and kernels.implementation(n).slow_on_cpu]:
    reasons[name] = (f"{name}: correct on a CPU, but its time there is not a performance number "
                     "(interpreted, or compiled per shape); left out of the CPU showdown")
contenders = [name for name, why in reasons.items() if why is None]
left_out = {name: why for name, why in reasons.items() if why is not None}
print("measured here:", ", ".join(contenders))
pd.DataFrame({"why not here": left_out}).rename_axis("left out")

# %%
if not on_gpu:
    lesson(contenders == ["naive", "inplace", "sdpa_math", "sdpa_flash"],
           "on a CPU the showdown is naive, inplace, sdpa_math and sdpa_flash", ", ".join(contenders))

# %% [markdown]
# The lesson each chapter taught, one line per implementation:

# %%
LESSONS = {
    "naive": "Read one level below your code: out-of-place masked_fill copies the whole S×S score matrix.",
    "inplace": "masked_fill_ removes the copy and one S×S allocation, but not the peak: two S×S buffers stay alive.",
    "sdpa_math": "SDPA's math backend is reference code: it rebuilds the mask, guards softmax, and runs more ops than ours.",
    "sdpa_flash": "One fused op: the S×S scores live only in tiles, so memory grows with S, not S².",
    "sdpa_efficient": "One fused kernel (xFormers-derived CUTLASS); it also takes fp32 on a GPU.",
    "sdpa_cudnn": "One fused kernel with no transposes; its per-call setup (graph cached per shape) costs CPU time.",
    "triton": "FlashAttention-2 in Triton: a Q tile stays on chip while K and V stream past, softmax online.",
    "cuda_v1": "The same algorithm in plain CUDA on CUDA cores: correct, readable, and far from the roof.",
    "cuda_v2": "Tensor cores (mma.sync), 128-row query tiles, scores in registers, K/V tiles double-buffered, only diagonal tiles masked, tiles above the diagonal skipped.",
}
lessons = {name: LESSONS.get(name, "(no chapter lesson recorded for this implementation)") for name in contenders}

# %% [markdown]
# ## What one forward runs
#
# Each contender is profiled here with `kernels.trace.record`, at the chapter's shape
# (B={glue:text}`shape_b`, H={glue:text}`shape_h`, S={glue:text}`shape_s`,
# D={glue:text}`shape_d`). On a CPU we count the ops that do arithmetic themselves
# (`Step.work_ops`): not views or bare allocations, and either calling no other such op
# (`matmul` is not counted, the `bmm` under it is) or allocating their own result (`mul`). On a GPU the count that matters is the GPU track: kernels, copies and
# memsets launched by one forward.

# %%
glue("shape_b", batch); glue("shape_h", heads); glue("shape_s", seq); glue("shape_d", head_dim)

steps_of = {}
for name in list(contenders):
    try:
        run = record.profile(kernels.get(name), q, k, v, label=name, active=active_steps, trace_dir=trace_dir)
    except Exception as err:  # e.g. a CUDA extension that fails to build: say so, go on without it
        print(f"{name} could not run here and leaves the showdown: {type(err).__name__}: {err}")
        contenders.remove(name)
        continue
    steps_of[name] = reader.median_step(run.steps())
work = {name: s.work_ops() for name, s in steps_of.items()}
op_counts = {n: pd.Series([o.removeprefix("aten::") for o in w]).value_counts(sort=False) for n, w in work.items()}
pd.DataFrame({"work ops per forward": {n: len(w) for n, w in work.items()},
              "which": {n: ", ".join(o if k == 1 else f"{o} ×{k}" for o, k in c.items()) for n, c in op_counts.items()},
              **({"GPU activities per forward": {n: len(s.gpu_work) for n, s in steps_of.items()}} if on_gpu else {})})

# %%
# The traces behind these steps: download them, or open them in Perfetto (see the Perfetto appendix).
display(*(links(s) for s in steps_of.values()))

# %%
if not on_gpu:
    lesson(work["sdpa_flash"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"],
           "the fused CPU flash backend is one op per forward", ", ".join(work["sdpa_flash"]))
lesson(all(len(work[n]) > len(work["sdpa_flash"]) for n in ("naive", "inplace", "sdpa_math")),
       "every unfused implementation runs more ops than the fused one",
       ", ".join(f"{n} {len(work[n])}" for n in ("naive", "inplace", "sdpa_math")))
lesson(len(work["naive"]) > len(work["inplace"]), "the in-place forward runs fewer ops than the naive one",
       f"{len(work['naive'])} vs {len(work['inplace'])}")

# %% tags=["remove-input"]
if on_gpu:  # each fused backend is one kernel; the math backend launches more than in-place
    gpu_lessons.fused_one_kernel_math_more(steps_of)

# %% [markdown]
# ## Timing and memory: the sweep
#
# Times come from `kernels.bench`, which warms each implementation up, times many calls
# ({glue:text}`timing_method`) with fresh random inputs rotated among sets larger than the
# caches, and keeps the median and the 10th-90th percentile spread. Peak memory is measured
# on one more call, apart from the timed ones. The appendix *Measuring honestly* explains
# each of these choices. The sweep is kept short here so the book builds in minutes; the
# CLI (`python -m kernels.bench`) runs longer ones.

# %%
if on_gpu:
    sweep_seqs = sorted({512, 1024, 2048, 4096, seq})
    budget: dict = dict(reps=30, warmup=3, min_reps=5, max_seconds=0.5)
else:  # a 2-core CPU: small budgets keep the whole chapter under a minute
    sweep_seqs = sorted({128, 256, 512, 1024, seq})
    budget = dict(reps=7, warmup=1, min_reps=3, max_seconds=0.15)
results = sweep.sweep(contenders, seqs=sweep_seqs, head_dims=(head_dim,), dtypes=(dtype,),
                      batch=batch, heads=heads, device=device, progress=None, **budget)
frame = results.to_frame()
failed = frame[frame["status"] != "ok"]
if not failed.empty:
    display(failed[["impl", "seq", "status", "reason"]])
glue("timing_method", results.meta["timing"])
lesson(all(r.ok for r in results if r.seq == seq), "every contender was measured at the chapter's shape")

# %% [markdown]
# ## Everything at a glance
#
# The chapter's shape, every contender, one row each. Time is the median per forward, with
# the spread of the middle 80% of calls; TFLOP/s counts causal FLOPs halved (below).

# Before the table, rank the contenders by peak memory at the chapter's shape, smallest
# first (memory, unlike time, does not depend on how busy the machine is):

# %%
guess_memory_order = ["sdpa_flash", "inplace", "naive", "sdpa_math"]  # smallest peak first; edit me

# %%
peaks = devices.roofline_peaks(device)
at_seq = {r.impl: r for r in results if r.seq == seq and r.ok}
by_memory = sorted(at_seq, key=lambda n: at_seq[n].peak_memory_bytes)
display(reveal([g for g in guess_memory_order if g in at_seq], by_memory, "contenders, smallest peak first"))

glance = pd.DataFrame([{
    "implementation": name,
    ("GPU activities" if on_gpu else "work ops"): len(steps_of[name].gpu_work) if on_gpu else len(work[name]),
    "median ms": r.median_ms,
    "p10-p90 ms": f"{r.p10_ms:.3g}-{r.p90_ms:.3g}",
    "peak MiB": mib(r.peak_memory_bytes),
    "TFLOP/s": r.tflops,
    "FLOP/byte": r.intensity,
    "% of roof": 100 * r.tflops * 1e12 / peaks.attainable(r.intensity),
    "side of ridge": "memory-bound" if r.intensity < peaks.ridge else "compute-bound",
    "the lesson": lessons[name],
} for name, r in at_seq.items()]).set_index("implementation")
caption = (f"This run: {run_label}. {dtype_name(dtype)}, B={batch} H={heads} S={seq} D={head_dim}, "
           f"causal, forward. Roof: {peaks.source}.")
glance.style.format({"median ms": "{:.3g}", "peak MiB": "{:.3g}", "TFLOP/s": "{:.3g}",
                     "FLOP/byte": "{:.3g}", "% of roof": "{:.2g}"}).set_caption(caption)

# %%
fastest = min(at_seq, key=lambda n: at_seq[n].median_ms)
smallest = min(at_seq, key=lambda n: at_seq[n].peak_memory_bytes)
glue("fastest", fastest)
glue("fastest_ms", at_seq[fastest].median_ms)
glue("smallest", smallest)
glue("smallest_mib", mib(at_seq[smallest].peak_memory_bytes))
glue("naive_mib", mib(at_seq["naive"].peak_memory_bytes))
glue("naive_ms", at_seq["naive"].median_ms)
glue("flash_ms", at_seq["sdpa_flash"].median_ms)
glue("ridge", peaks.ridge)
if not on_gpu:
    lesson(smallest == "sdpa_flash", "sdpa_flash has the smallest peak memory on the CPU",
           f"{mib(at_seq['sdpa_flash'].peak_memory_bytes):.2f} MiB")
    lesson(peaks.source.startswith("CPU: measured"), "the CPU roof is measured on this machine", peaks.source)

# %% [markdown]
# On this run the fastest at S={glue:text}`shape_s` was **{glue:text}`fastest`**
# ({glue:text}`fastest_ms:.3g` ms per forward; naive took {glue:text}`naive_ms:.3g` ms,
# sdpa_flash {glue:text}`flash_ms:.3g` ms). The smallest peak belongs to
# **{glue:text}`smallest`**: {glue:text}`smallest_mib:.3g` MiB, against
# {glue:text}`naive_mib:.3g` MiB for naive. Timings are medians from a machine that may be
# busy, so the chapter quotes them and does not assert their order; memory is deterministic,
# and is asserted.
#
# ## Counting FLOPs: causal is half
#
# A forward does two matmuls of $2 \cdot S^2 \cdot D$ FLOPs per head, $4BHS^2D$ in all.
# With a causal mask, half of the score matrix is never needed, and a fused kernel skips it,
# so the course counts causal attention at **half** that: $2BHS^2D$. Counting it at full
# price doubles every TFLOP/s figure, a mistake that has shipped in real benchmarks (the
# appendix tells the story). Every row of this sweep is checked against the formula:

# %%
halved = [2 * r.batch * r.heads * r.seq**2 * r.head_dim for r in results]  # 4·B·H·S²·D, halved for causal
full = [reference.flops(r.batch, r.heads, r.seq, r.head_dim, causal=False) for r in results]
wrong = [(r.impl, r.seq) for r, half, whole in zip(results, halved, full) if not (r.causal and r.flops == half == whole / 2)]
lesson(not wrong, "every row counts causal FLOPs as half of full attention, 2·B·H·S²·D",
       f"{len(results)} rows checked against kernels.reference.flops" if not wrong else f"wrong: {wrong}")
flash = at_seq["sdpa_flash"]
glue("flash_tflops", flash.tflops)
_ = glue("flash_tflops_wrong", 2 * flash.tflops)

# %% [markdown]
# So sdpa_flash's {glue:text}`flash_tflops:.3g` TFLOP/s at S={glue:text}`shape_s` would have
# read {glue:text}`flash_tflops_wrong:.3g` TFLOP/s had the masked half been counted.
#
# ## Across sequence lengths
#
# Time first. On log-log axes a slope of 2 is the S² of attention; the shaded band is the
# spread of the timed calls.

# %%
#| caption: Median time per call against sequence length, log-log; the band is the 10th to 90th percentile of the timed calls, and a slope of 2 is attention's S². When the spread check fails, the figure says so on itself: it then shows the machine's noise, not the kernels.
#| alt: Log-log line chart of time per call against sequence length, one line per implementation with a shaded spread band.
plots.time_vs_seq(results)

# %% [markdown]
# Throughput, under the device's compute ceiling ({glue:text}`peak_label`):

# %%
#| caption: Achieved TFLOP/s against sequence length under the device's compute ceiling (dashed), causal FLOPs counted as half of full attention; marked on itself when the timings were too noisy.
#| alt: Line chart of achieved TFLOP/s against sequence length, one line per implementation, under a dashed horizontal peak line.
glue("peak_label", f"{peaks.flops / 1e12:.3g} TFLOP/s {peaks.flops_dtype}, {peaks.source}")
plots.tflops_vs_seq(results, peak=peaks)

# %% [markdown]
# ## Memory: S² against S
#
# The implementations that materialize the scores (naive, inplace, sdpa_math) hold
# $B \cdot H \cdot S^2$ numbers at once, so doubling S should multiply their peak by about 4.
# A fused kernel holds only its output ($B \cdot H \cdot S \cdot D$, doubling with S) plus
# small working tiles, so its peak should grow about 2x per doubling. On a CPU the flash
# kernel's tiles are per thread and sized from S (PyTorch picks larger query tiles from
# S = 768 on), so one doubling can jump by more than 2x; over the whole sweep its growth is
# measured as an average per doubling, and it must stay closer to S than to S² (below
# $\sqrt{2 \cdot 4} \approx 2.83$x, the midpoint of 2x and 4x on a log scale).

# %%
#| caption: Peak memory of one call against sequence length, log-log, with guides proportional to S and to S²: implementations that hold the S×S scores climb with the S² guide, the fused kernel with the S guide.
#| alt: Log-log line chart of peak memory against sequence length per implementation, with two dotted guide lines.
plots.memory_vs_seq(results)

# %%
peak_series = {n: {r.seq: r.peak_memory_bytes for r in results if r.impl == n and r.ok} for n in contenders}
doublings = {}
for name in contenders:
    mem = peak_series[name]
    doublings[name] = {f"{s}->{2 * s}": mem[2 * s] / mem[s] for s in sorted(mem) if 2 * s in mem}
growth = pd.DataFrame(doublings).T
growth["average per doubling"] = [math.prod(d.values()) ** (1 / len(d)) if d else float("nan")
                                  for d in doublings.values()]
display(growth.round(2))

materializing = [n for n in ("naive", "inplace", "sdpa_math") if n in doublings]
for name in materializing:
    ratios = doublings[name].values()
    lesson(all(3.3 <= x <= 4.5 for x in ratios), f"{name}'s peak memory grows ~4x per doubling of S",
           ", ".join(f"{x:.2f}x" for x in ratios))
flash_avg = float(growth.loc["sdpa_flash", "average per doubling"])
lesson(flash_avg <= math.sqrt(2 * 4), "sdpa_flash's peak memory grows ~2x per doubling of S, closer to S than to S²",
       f"{flash_avg:.2f}x on average; per doubling " + ", ".join(f"{x:.2f}x" for x in doublings["sdpa_flash"].values()))
s_max = max(peak_series["sdpa_flash"])
one_scores = batch * heads * s_max**2 * torch.empty((), dtype=dtype).element_size()
lesson(peak_series["sdpa_flash"][s_max] < one_scores,
       f"at S={s_max}, sdpa_flash's whole peak is smaller than one S×S score matrix",
       f"{mib(peak_series['sdpa_flash'][s_max]):.2f} MiB < {mib(one_scores):.0f} MiB")
if not on_gpu:
    lesson(all(peak_series["sdpa_flash"][s] == min(peak_series[n][s] for n in contenders) for s in sweep_seqs),
           "sdpa_flash has the smallest peak memory at every S of the sweep")
glue("flash_growth", flash_avg)
_ = glue("naive_growth", float(growth.loc["naive", "average per doubling"]))

# %% [markdown]
# Naive's peak grew {glue:text}`naive_growth:.2f`x per doubling on average, sdpa_flash's
# {glue:text}`flash_growth:.2f`x. At a GPU's sequence lengths that difference decides
# whether a forward fits in memory at all.
#
# ## The roofline
#
# Each point is one implementation at one S: its arithmetic intensity (FLOPs per byte that
# must cross memory at least once, from `kernels.reference.io_bytes`) against the FLOP/s it
# achieved. Below the ridge ({glue:text}`ridge:.3g` FLOP/byte here) a kernel can at best
# run at memory speed; above it, at compute speed. The materializing implementations are
# charged for writing and reading the S×S scores, which pins their intensity near a constant
# whatever S is; a fused kernel's intensity grows with S.
#
# A point above the roof is not a faster-than-possible kernel; it means the roof does not
# describe that point. On a CPU the roof's bandwidth is measured with a 32 MiB copy, larger
# than the caches, while a small fused forward moves a few MiB that stay in cache and are
# read faster than main memory. This run had {glue:text}`points_above_roof` point(s) above
# the roof; the cell checks that each of them moves less data than that copy.

# %%
#| caption: The roofline: each forward at its arithmetic intensity (FLOP per byte moved) and its achieved FLOP/s, under the device's two ceilings, memory bandwidth (the slope) and compute (the flat roof).
#| alt: Log-log scatter of achieved FLOP/s against arithmetic intensity per implementation and length, under a sloped bandwidth line and a flat compute line.
display(plots.roofline(results, device=peaks))
above = [r for r in results if r.ok and r.tflops * 1e12 > peaks.attainable(r.intensity)]
roof_copy_bytes = 2 * devices.COPY_MIB["cpu"] * 2**20  # what the copy that measured the CPU roof moved
if above:
    print("Above the roof:", "; ".join(f"{r.impl} at S={r.seq}: {r.bytes / 2**20:.1f} MiB moved, "
                                       f"{100 * r.tflops * 1e12 / peaks.attainable(r.intensity):.0f}% of the roof"
                                       for r in above))
if not on_gpu:
    lesson(all(r.bytes < roof_copy_bytes for r in above),
           "every point above the measured roof moves less data than the copy that measured the roof",
           f"{len(above)} point(s) above it")
glue("points_above_roof", len(above))

# %% [markdown]
# ## Beyond one forward: a training step and a decode token
#
# A forward at one length is one of three calls attention serves. **Training** runs the
# forward and then its backward (chapter 9): the backward does five matmuls to the forward's
# two, so a training step counts 3.5x the forward's FLOPs, and its bytes add what the
# backward reads (q, k, v, o, dO) and writes (dQ, dK, dV). **Generation** runs one **decode token** per new token (chapter 10): a
# single query (Sq = 1) against a KV cache of $S_k$ keys. Its FLOPs are
# $4 \cdot B \cdot H \cdot S_k \cdot D$ with nothing halved, because the causal mask hides no
# key from the newest query; its bytes are dominated by reading the cache,
# $2 \cdot B \cdot H_{kv} \cdot S_k \cdot D$ elements, which grouped-query attention (one K/V
# head shared by $H / H_{kv}$ query heads) divides. `kernels.bench` times both modes with
# their own counts (`reference.flops`, `reference.decode_flops`, `reference.decode_bytes`);
# its CLI runs them as `python -m kernels.bench --mode training decode --gqa 4`.
#
# Here, every contender decodes against a cache of S={glue:text}`shape_s` keys, with all
# {glue:text}`shape_h` K/V heads and with {glue:text}`gqa_kv_heads` shared ones. The two ends
# of the course, `naive` and `sdpa_flash`, also take a training step at that length (chapter 9
# profiles every implementation's) and decode against a cache {glue:text}`long_factor`x longer.

# %%
gqa_ratio = next(r for r in (4, 2, 1) if heads % r == 0)
kv_options = tuple(dict.fromkeys((heads, heads // gqa_ratio)))  # all K/V heads, then shared ones
long_factor = 8 if on_gpu else 4
shown = [n for n in ("naive", "sdpa_flash") if n in contenders]  # the two ends of the course
common: dict = dict(head_dims=(head_dim,), dtypes=(dtype,), batch=batch, heads=heads, device=device, progress=None)
# Time and counts only: chapter 9 measures what a training step holds in memory, and a
# decode token's peak is its one-row output (profiling memory would double this cell's time).
train_rows = sweep.sweep(shown, seqs=(seq,), modes=(FORWARD_BACKWARD,), memory=False, **common, **budget)
decode_rows = [r for kv in kv_options for names, seqs in ((contenders, (seq,)), (shown, (long_factor * seq,)))
               for r in sweep.sweep(names, seqs=seqs, modes=(DECODE,), kv_heads=kv, memory=False,
                                    **common, **budget)]
not_run = [r for r in train_rows + decode_rows if not r.ok]
if not_run:  # e.g. a kernel that takes no single-query call
    display(pd.DataFrame([{"implementation": r.impl, "mode": r.mode, "Sk": r.seq, "K/V heads": r.kv_heads,
                           "status": r.status, "reason": r.reason} for r in not_run]))
trained = {r.impl: r for r in train_rows if r.ok}
decoded = {(r.impl, r.seq, r.kv_heads): r for r in decode_rows if r.ok}
glue("long_factor", long_factor)
glue("gqa_kv_heads", heads // gqa_ratio)
taught = [n for n in ("naive", "inplace", "sdpa_math", "sdpa_flash") if n in contenders]
lesson(all((n, seq, kv) in decoded for n in taught for kv in kv_options) and all(n in trained for n in shown),
       f"{', '.join(taught)} were measured decoding with and without GQA, {' and '.join(shown)} in a training step too")

# %% [markdown]
# One row per implementation and call, at the chapter's length (the forward's row is the
# sweep's above). "MiB moved" is the least a call must read and write; the decode token
# reads the whole cache to produce one row of output.

# %%
CALLS = {"forward": lambda n: at_seq.get(n), "training step": lambda n: trained.get(n),
         "decode": lambda n: decoded.get((n, seq, heads)),
         f"decode, GQA {gqa_ratio}:1": lambda n: decoded.get((n, seq, heads // gqa_ratio))}
modes_table = pd.DataFrame([{
    "call": call, "implementation": name, "median ms": r.median_ms,
    "p10-p90 ms": f"{r.p10_ms:.3g}-{r.p90_ms:.3g}", "TFLOP/s": r.tflops, "GB/s": r.gbps,
    "FLOP/byte": r.intensity, "MiB moved": r.bytes / 2**20,
    "side of ridge": "memory-bound" if r.intensity < peaks.ridge else "compute-bound",
} for call, pick in CALLS.items() for name in contenders if (r := pick(name)) is not None]).set_index(["call", "implementation"])
modes_table.style.format({"median ms": "{:.3g}", "TFLOP/s": "{:.3g}", "GB/s": "{:.3g}", "FLOP/byte": "{:.3g}",
                          "MiB moved": "{:.3g}"}).set_caption(
    f"This run: {run_label}. {dtype_name(dtype)}, B={batch} H={heads} D={head_dim}, causal; S = Sk = {seq}; "
    f"GQA: {heads // gqa_ratio} K/V heads. Medians of many calls; ridge {peaks.ridge:.3g} FLOP/byte ({peaks.source}).")

# %% [markdown]
# The counts first: they do not depend on the machine, so they are asserted everywhere. A
# training step is 3.5 forwards of FLOPs; a decode token is $4BHS_kD$; sharing K/V heads
# removes exactly the cache of the heads no longer stored, and changes no FLOP.

# %%
elem = torch.empty((), dtype=dtype).element_size()
lesson(all(r.flops == 3.5 * at_seq[r.impl].flops for r in trained.values() if r.impl in at_seq),
       "a training step counts 3.5x the forward's FLOPs (the backward is 2.5x)", f"{len(trained)} rows")
lesson(all(r.flops == 4 * batch * heads * r.seq * head_dim for r in decoded.values()),
       "a decode token counts 4·B·H·Sk·D FLOPs: one query row, nothing halved by the causal mask",
       f"{len(decoded)} rows")
gqa_kv = heads // gqa_ratio
pairs = [(r, decoded[(n, s, gqa_kv)]) for (n, s, kv), r in decoded.items() if kv == heads and (n, s, gqa_kv) in decoded]
by_hand = {s: 2 * batch * (heads - gqa_kv) * s * head_dim * elem for s in (seq, long_factor * seq)}  # K, V of the heads dropped
lesson(bool(pairs) and all(mha.bytes - gqa.bytes == by_hand[mha.seq] and mha.flops == gqa.flops for mha, gqa in pairs),
       f"GQA {gqa_ratio}:1 removes exactly the K/V cache of the {heads - gqa_kv} heads it no longer stores, "
       "2·B·(H - Hkv)·Sk·D elements, and no FLOP", f"{len(pairs)} pairs")

# %% [markdown]
# Then the lesson of the roofline. In a decode token every cached number is read once and
# used in one multiply-add per query head that shares it: under $2 \cdot (H / H_{kv})$ FLOPs
# per element read, whatever $S_k$ is. A prefill (the forward with Sq = Sk) reuses each K/V
# tile for a whole block of queries, and its intensity grows with S. So at the same length a
# decode token's arithmetic intensity is far below the prefill's, and far below the ridge of
# any GPU: there decoding is memory-bound, and the time it takes is the time it takes to read
# the cache. (A CPU's measured ridge sits much lower; the table above says on which side of
# this one each call fell.)

# %%
decode_at_s = {n: decoded[(n, seq, heads)] for n in contenders if (n, seq, heads) in decoded}
factor = {n: at_seq[n].intensity / r.intensity for n, r in decode_at_s.items() if n in at_seq}
display(pd.DataFrame({"prefill FLOP/byte": {n: at_seq[n].intensity for n in factor},
                      "decode FLOP/byte": {n: decode_at_s[n].intensity for n in factor},
                      "prefill / decode": factor}).round(3))
lesson(all(r.intensity < 2 / elem for r in decode_at_s.values()),
       f"a decode token without shared heads does under 2 FLOPs per cached element read ({2 / elem:g} FLOP/byte "
       f"in {dtype_name(dtype)})", ", ".join(f"{n} {r.intensity:.3g}" for n, r in decode_at_s.items()))
lesson(all(f > 5 for f in factor.values()),
       f"at S = Sk = {seq}, a decode token's arithmetic intensity is more than 5x below the prefill's, for every "
       "implementation", ", ".join(f"{n} {f:.0f}x" for n, f in factor.items()))
longer = {(n, kv): decoded[(n, long_factor * seq, kv)].intensity / decoded[(n, seq, kv)].intensity
          for n in shown for kv in kv_options if (n, long_factor * seq, kv) in decoded and (n, seq, kv) in decoded}
lesson(bool(longer) and all(abs(x - 1) < 0.1 for x in longer.values()),
       f"a {long_factor}x longer cache leaves a decode token's intensity where it was (within 10%): it reads "
       "more and computes more in the same proportion", ", ".join(f"{n} Hkv={kv} {x:.3f}x" for (n, kv), x in longer.items()))
fused_factor = {n: f for n, f in factor.items() if not kernels.implementation(n).materializes_scores}
lesson(all(f > seq / 16 for f in fused_factor.values()),
       f"for the fused kernels the gap grows with S: more than S/16 = {seq / 16:g}x at S = {seq}",
       ", ".join(f"{n} {f:.0f}x" for n, f in fused_factor.items()))

# %% [markdown]
# On the roofline, each mode of `naive` and `sdpa_flash`: the forward across lengths, the
# training step, and decoding with and without shared K/V heads, far to the left, where a
# cache {glue:text}`long_factor`x longer does not move it.

# %%
#| caption: The roofline with every mode of naive and sdpa_flash: forwards across lengths, the training step, and decoding far to the left, where one query reads the whole K/V cache and does few FLOPs per byte.
#| alt: Log-log roofline scatter with forward, training and decode points of two implementations; the decode points sit far left under the bandwidth slope.
display(plots.roofline(BenchResults(
    [r for r in list(results) + list(trained.values()) + list(decoded.values()) if r.impl in shown and r.ok],
    results.meta), device=peaks))

# %% [markdown]
# Time, last, measured the careful way: a prefill and one decode token of `sdpa_flash` at the
# chapter's length, called in interleaved rounds (`kernels.bench.compare`). The decode token
# does far fewer FLOPs, but it reads the same K and V, so it is not faster by as much: per
# FLOP it is slower, bound by reading the cache (and, when it is this small, by the launch),
# not by arithmetic. The cell claims that only when the two rates' 10th-90th percentile ranges
# are apart, and says the machine was too noisy otherwise.

# %%
flash = kernels.get("sdpa_flash")
q_new = q[:, :, -1:]  # [B, H, 1, D]: the newest token's query alone, against the whole k, v
race = comparison.compare({"prefill": lambda: flash(q, k, v), "decode": lambda: flash(q_new, k, v)},
                     device=device, rounds=9 if on_gpu else 7)
print(race.verdict())
work_of = {"prefill": reference.flops(batch, heads, seq, head_dim, causal=True),
           "decode": reference.decode_flops(batch, heads, seq, head_dim)}
rate = {name: (work_of[name] / (race.p90_ms[name] * 1e-3), work_of[name] / (race.p10_ms[name] * 1e-3))
        for name in work_of}  # (slowest, fastest) FLOP/s of the middle 80% of rounds
span = ", ".join(f"{n} {lo / 1e9:.3g}-{hi / 1e9:.3g} GFLOP/s" for n, (lo, hi) in rate.items())
if rate["decode"][1] < rate["prefill"][0]:
    lesson(True, "per FLOP, a decode token runs slower than the prefill", span)
elif rate["decode"][0] > rate["prefill"][1]:
    lesson(False, "per FLOP, a decode token runs slower than the prefill", span)
else:
    print(f"Too noisy to compare the two rates on this run ({span}): the ranges overlap, so no claim is made.")
glue("flop_ratio", work_of["prefill"] / work_of["decode"])
_ = glue("time_ratio", race.median_ms["prefill"] / race.median_ms["decode"])

# %% [markdown]
# The prefill did {glue:text}`flop_ratio:.0f`x the decode token's FLOPs and took
# {glue:text}`time_ratio:.3g`x its time on this run. A model generating text spends most of
# its attention time in decode tokens like this one, which is why KV-cache size (and so GQA,
# and the cache's dtype) matters more there than FLOPs.

# %% [markdown]
# ## On real GPUs: one model's attention on an H100 and an MI300X
#
# The sweep above measured the course's kernels on the machine that built this page. What does
# the same kind of call reach on a datacenter GPU? Two real traces answer it: one forward of
# Qwen1.5-0.5B-Chat (16 prompts of 559 tokens, bfloat16, PyTorch's SDPA) profiled on an NVIDIA
# H100 and on an AMD MI300X by AMD's TraceLens project. Neither is this book's run: each is
# credited under its reading below. `kernels.trace.attention.find_attention` reads every SDPA
# call of the step: its kernel, shapes, GPU time and FLOPs, counted the way this chapter counts
# them ([causal is half](#counting-flops-causal-is-half)), so TFLOP/s here and in the sweep
# mean the same thing.
#
# Before the reveal: what share of the H100's dense bf16 peak do you think one of these calls
# reached?

# %%
guess_h100_percent_of_peak = 50  # edit me: % of the H100's dense bf16 peak, per call

# %%
qwen = {gpu: TRACELENS[f"{gpu}_qwen"] for gpu in ("h100", "mi300x")}
qwen_traces = {gpu: borrowed.trace() for gpu, borrowed in qwen.items()}
qwen_reports = {gpu: find_attention(borrowed.step(trace=qwen_traces[gpu])) for gpu, borrowed in qwen.items()}
calls = gpu_lessons.achieved_against_peak(qwen_reports)
per_gpu = calls.groupby("GPU", sort=False).agg(calls=("call", "size"), median_us=("GPU µs", "median"),
                                               median_tflops=("TFLOP/s", "median"), peak_tflops=("peak TFLOP/s", "first"),
                                               median_pct=("% of peak", "median"), best_pct=("% of peak", "max"))
display(per_gpu.round(1))
print("\n".join(borrowed.credit(qwen_traces[gpu]) for gpu, borrowed in qwen.items()))
h100_row, mi300x_row = (per_gpu.loc[qwen_reports[gpu].device] for gpu in ("h100", "mi300x"))
_ = reveal(guess_h100_percent_of_peak, round(h100_row["median_pct"], 1), "% of the H100's peak, median call")

# %%
#| caption: Every attention call of one Qwen1.5-0.5B forward (16 x 559 tokens, causal, bf16) on an H100 and on an MI300X, at its achieved TFLOP/s (causal FLOPs counted half), under each GPU's dense bf16 peak (dashed, datasheet). Recorded by AMD's TraceLens project, not this book's run.
#| alt: Scatter of 24 points per GPU near the bottom of the chart, far below two dashed horizontal peak lines at 989 and 1307 TFLOP/s.
plots.achieved_vs_peak(calls)

# %%
shapes = set(calls[["B·H", "Sq", "Sk", "D", "causal"]].itertuples(index=False))
lesson(len(shapes) == 1 and all(row.GFLOP * 1e9 == reference.flops(1, row[1], row.Sq, row.D, causal=True)
                                for row in calls[["GFLOP", "B·H", "Sq", "D"]].itertuples(index=False)),
       "every call on both GPUs is the same causal attention, counted by the course's formula (causal half)",
       f"B·H, Sq, Sk, D, causal = {shapes}")
lesson(calls["% of peak"].max() < 10, "no call reached a tenth of its GPU's dense bf16 peak",
       f"best {calls['% of peak'].max():.1f}%")
lesson(h100_row["median_tflops"] > mi300x_row["median_tflops"],
       "the H100 ran these calls at more TFLOP/s than the MI300X, whose datasheet peak is higher",
       f"{h100_row['median_tflops']:.1f} vs {mi300x_row['median_tflops']:.1f} TFLOP/s, median call")
glue("qwen_h100_tflops", h100_row["median_tflops"]); glue("qwen_h100_pct", h100_row["median_pct"])
glue("qwen_mi300x_tflops", mi300x_row["median_tflops"]); glue("qwen_mi300x_pct", mi300x_row["median_pct"])
glue("qwen_h100_peak", h100_row["peak_tflops"]); _ = glue("qwen_mi300x_peak", mi300x_row["peak_tflops"])

# %% [markdown]
# The median call ran at {glue:text}`qwen_h100_tflops:.0f` TFLOP/s on the H100, {glue:text}`qwen_h100_pct:.1f`%
# of its {glue:text}`qwen_h100_peak:.0f`, and at {glue:text}`qwen_mi300x_tflops:.0f` TFLOP/s on the MI300X,
# {glue:text}`qwen_mi300x_pct:.1f`% of its {glue:text}`qwen_mi300x_peak:.0f`. A datasheet peak is what every
# multiply unit of the chip, busy on every cycle, adds up to. So the question is how much of the
# chip these calls kept busy.
#
# ### Why: the grid against the SMs
#
# A kernel is launched as a grid of thread blocks (CTAs; *workgroups* on AMD), and each block
# runs whole on one SM (a *compute unit*, CU, on AMD). The trace records each kernel's grid and
# block, and the GPU's SM count (`deviceProperties`). An SM holds as many blocks at once as its
# registers, shared memory and warp slots allow (chapter 4's occupancy arithmetic, from the
# registers and shared memory the trace records); a grid larger than the SMs times that runs in
# *waves*, and the last wave may leave SMs idle. A third trace shows the short end: BERT-small,
# one sentence of 141 tokens, on the same H100.

# %%
bert = TRACELENS["h100_bert"]
bert_trace = bert.trace()
bert_report = find_attention(bert.step(trace=bert_trace))
grids = pd.concat({"Qwen1.5-0.5B, 16 x 559 tokens, H100": gpu_lessons.grid_against_sms(qwen_reports["h100"]),
                   "Qwen1.5-0.5B, 16 x 559 tokens, MI300X": gpu_lessons.grid_against_sms(qwen_reports["mi300x"]),
                   "BERT-small, 1 x 141 tokens, H100": gpu_lessons.grid_against_sms(bert_report)}, names=["trace", ""])
display(grids.droplevel(1).round(2))
print(bert.credit(bert_trace))

# %%
h100_grid, mi300x_grid, bert_grid = (g.iloc[0] for g in (gpu_lessons.grid_against_sms(r) for r in
                                                          (qwen_reports["h100"], qwen_reports["mi300x"], bert_report)))
qwen_call = calls.iloc[0]
bert_call = gpu_lessons.achieved_against_peak({"BERT-small, H100": bert_report}).iloc[0]
query_tiles = math.ceil(qwen_call["Sq"] / 128)
lesson(h100_grid["CTAs"] == query_tiles * qwen_call["B·H"],
       "on the H100, flash launches one CTA per 128 query rows of each (batch, head): "
       f"ceil({qwen_call['Sq']} / 128) x {qwen_call['B·H']} CTAs", f"grid {h100_grid['grid']} = {h100_grid['CTAs']} CTAs")
tail_idle = (math.ceil(h100_grid["waves"]) - h100_grid["waves"]) / math.ceil(h100_grid["waves"])
lesson(h100_grid["waves"] > 4 and tail_idle < 0.05,
       "those CTAs fill the H100's SMs in several waves, and the last wave's idle SMs cost under 5% of the call",
       f"{h100_grid['CTAs']} CTAs / ({h100_grid['SMs (CUs)']} SMs x {h100_grid['CTAs per SM at once']} at once) = "
       f"{h100_grid['waves']:.2f} waves")
h100_occ = h100_grid["occupancy % (ours)"]
lesson(abs(h100_occ - h100_grid["occupancy % (trace)"]) < 1,
       "each SM holds only a few CTAs (registers: 255 per thread), the occupancy Kineto estimated",
       f"{h100_occ:.1f}% of warp slots by our arithmetic, {h100_grid['occupancy % (trace)']:g}% in the trace")
lesson(bert_grid["CTAs"] < bert_grid["SMs (CUs)"] / 4,
       "BERT-small's 141 tokens launch fewer CTAs than a quarter of the H100's SMs: most SMs get no work at all",
       f"{bert_grid['CTAs']} CTAs on {bert_grid['SMs (CUs)']} SMs, {bert_call['TFLOP/s']:.1f} TFLOP/s")
cus, workgroups = mi300x_grid["SMs (CUs)"], mi300x_grid["CTAs"]
lesson(workgroups % cus == 0 and all(workgroups != math.ceil(qwen_call["Sq"] / m) * qwen_call["B·H"]
                                     for m in (16, 32, 64, 128, 256)),
       "on the MI300X the grid is a whole multiple of the CU count and no count of query tiles: "
       "sized to the chip, each workgroup loops over tiles (a persistent kernel)",
       f"{workgroups} workgroups = {workgroups // cus} x {cus} CUs")
glue("qwen_ctas", int(h100_grid["CTAs"])); glue("qwen_waves", h100_grid["waves"]); glue("h100_sms", int(h100_grid["SMs (CUs)"]))
glue("qwen_per_sm", int(h100_grid["CTAs per SM at once"])); glue("qwen_occ", h100_occ)
glue("qwen_padded", query_tiles * 128); glue("qwen_sq", int(qwen_call["Sq"]))
glue("bert_ctas", int(bert_grid["CTAs"])); glue("bert_tflops", bert_call["TFLOP/s"])
glue("mi300x_wg", int(workgroups)); _ = glue("mi300x_cus", int(cus))

# %% [markdown]
# On the H100, {glue:text}`qwen_ctas` CTAs met {glue:text}`h100_sms` SMs holding
# {glue:text}`qwen_per_sm` each: {glue:text}`qwen_waves:.2f` waves, so the half-empty last wave
# is not where the time went. Two things are. Each SM ran only {glue:text}`qwen_occ:.1f`% of its
# warp slots (FlashAttention keeps its tiles in registers, 255 per thread, and trades occupancy
# for them), and each CTA had little to do: at S = {glue:text}`qwen_sq` a query tile meets at
# most five key tiles, and {glue:text}`qwen_sq` rows are padded to {glue:text}`qwen_padded`, so
# loading Q, writing O and masking the diagonal tile weigh as much as the multiplies. Longer
# sequences amortise them: the FlashAttention-3 paper (arXiv 2407.08608, Fig. 5) measures
# FlashAttention-2, the kernel here, on an H100 at 191 TFLOP/s for causal S = 512 and 335 at
# S = 16k (D = 128); its own Hopper kernels, using instructions this one does not, reach more.
#
# Shorter still, BERT-small's 141 tokens launched {glue:text}`bert_ctas` CTAs per call: most of
# the H100's SMs had no block at all, and the call ran at {glue:text}`bert_tflops:.1f` TFLOP/s.
# The MI300X's kernel is launched differently: {glue:text}`mi300x_wg` workgroups for
# {glue:text}`mi300x_cus` CUs, a grid sized to the chip, each workgroup looping over tiles, so no
# wave is half empty; its calls were slower for other reasons the trace does not record (ROCm
# traces carry no register counts).
#
# ## The course's own goals
#
# The course's kernels aim at SDPA's flash backend on H100/H200 (causal, bf16, S 1k-16k,
# D 64 and 128, ratios of two medians of one run at the same shape, as
# `kernels.bench.results.GOALS` holds them): {glue:text}`goals_text`. A GPU run's benchmark
# measures them (`make gpu-run` on a GPU machine, then `make gpu-import`); each recording there
# is then appears below as a table of those ratios.

# %%
goals_text = "; ".join(f"{impl} {mode} at {goal:g}x {GOAL_BASELINE}'s speed or faster" for impl, mode, goal in GOALS)
_ = glue("goals_text", goals_text)

# %% tags=["remove-input"]
for path in sorted((recorded.default_root().parent / "bench").glob("*.json")):
    recorded_run = load_results(path)
    meta = recorded_run.meta
    print(f"{path.stem}: recorded on {meta['device']['name']}, torch {meta['versions']['torch']}, {meta['date']}")
    display(pd.DataFrame(goal_ratios(recorded_run)).set_index(["impl", "mode"]))

# %% [markdown]
# ## Recorded elsewhere: the source article's A100
#
# The numbers below were **not** measured by this build. They are quoted from the source
# article, *Profiling in PyTorch (Part 3): Attention is all you profile* (Hugging Face
# blog, 2026), measured on one NVIDIA A100-SXM4-80GB in bfloat16 under `torch.no_grad`.
# They are kept in their own table, never mixed with this run's.

# %%
article = pd.DataFrame([
    ("naive (masked_fill)", 6, None, None, "matmul, mul, Memcpy, mask, softmax, matmul"),
    ("in-place (masked_fill_)", 5, 1955.0, None, "the Memcpy is gone"),
    ("SDPA math", 20, 7239.0, None, "fp32 upcast, mask rebuilt per call, NaN guards"),
    ("SDPA efficient", 1, 277.9, 117.0, "fmha_cutlassF (xFormers-derived)"),
    ("SDPA flash", 1, 146.8, 138.0, "pytorch_flash (FlashAttention-2)"),
    ("SDPA cuDNN", 1, 186.3, 214.0, "cudnn flash_fprop; per-call setup on the CPU"),
], columns=["variant", "kernels per forward", "CUDA time per forward (µs)", "CPU time (µs)", "trace shows"])
article = article.set_index("variant")
display(article.style.format(na_rep="not reported", precision=1).set_caption(
    "Recorded elsewhere (source article, A100), not measured by this build: 'Profiling in PyTorch "
    "(Part 3): Attention is all you profile', Hugging Face blog, 2026; one NVIDIA A100-SXM4-80GB, bf16."))
math_over_inplace = article.loc["SDPA math", "CUDA time per forward (µs)"] / article.loc["in-place (masked_fill_)", "CUDA time per forward (µs)"]
glue("article_math_ratio", float(math_over_inplace))
_ = glue("article_fused_max_us", float(article.loc[["SDPA efficient", "SDPA flash", "SDPA cuDNN"], "CUDA time per forward (µs)"].max()))

# %% [markdown]
# On that A100, SDPA's math backend was {glue:text}`article_math_ratio:.1f`x slower than the
# hand-written in-place version, while each fused backend needed at most
# {glue:text}`article_fused_max_us:.0f` µs of GPU time per forward. The ranking of the fused
# backends (flash, then cuDNN, then efficient) is the article's, on its shapes and its GPU.
# When this book is built on a GPU, the tables above hold that GPU's own numbers; compare
# them with the article's, but do not expect them to match: different shapes, a different
# GPU and different library versions each move them.

# %% tags=["remove-input"]
if on_gpu:  # this run's fused medians, beside the article's
    print(gpu_lessons.fused_medians(at_seq))

# %% [markdown]
# ## What to remember
#
# - A table that a build regenerates cannot drift from the code; a typed one can.
# - Quote medians with their spread, from a benchmark harness, never from one profiled step.
# - Materializing the scores costs memory ∝ S²; the fused kernels' memory grows ∝ S.
# - Count causal FLOPs at half price, or every TFLOP/s is twice too high; but a decode token's
#   single query sees every key, so it is counted in full: $4BHS_kD$.
# - A training step is 3.5 forwards of FLOPs. A decode token reads the whole KV cache for one
#   row of output: its arithmetic intensity stays under $2 H / H_{kv}$ FLOPs per element read,
#   far below the prefill's and below any GPU's ridge, so there it is memory-bound, and GQA's
#   smaller cache is fewer bytes to wait for.
# - Numbers from another machine are quoted with their source, in a table of their own.
# - A datasheet peak needs every SM busy: a short sequence's attention launches few CTAs, each
#   with little work, and reaches a small fraction of it (under a tenth on the traces above).

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/06_showdown.ipynb), with automatic checks, hints and hidden solutions.

# %% [markdown]
# # 6. Showdown
#
# Every implementation of the course, side by side, measured on the machine that built this
# page: what one forward runs (ops on a CPU, kernels on a GPU, read from traces recorded
# here), how long it takes (the median of many timed calls from `kernels.bench`, never a
# single profiled step), how much memory it needs at its peak, and where it sits under the
# device's roofline. Then the same numbers across sequence lengths, where the S² of
# attention shows itself.
#
# The source article closes with a table typed by hand from one A100. This chapter's table is
# regenerated on every build, so it can never disagree with the code; the article's numbers
# appear at the end, in a table of their own, labelled as recorded elsewhere.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import contextlib
import math

import pandas as pd
import torch

import kernels
from kernels import bench, devices, plots, profiling, reference
from kernels.book import glue, inputs, lesson, mib, reveal, setup

with contextlib.suppress(ImportError):
    import kernels.cuda_flash  # registers cuda_v1/cuda_v2 where the library ships them

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
    "cuda_v2": "Tensor cores (mma.sync), scores kept in registers, tiles above the diagonal skipped.",
}
lessons = {name: LESSONS.get(name, "(no chapter lesson recorded for this implementation)") for name in contenders}

# %% [markdown]
# ## What one forward runs
#
# Each contender is profiled here with `kernels.profiling`, at the chapter's shape
# (B={glue:text}`shape_b`, H={glue:text}`shape_h`, S={glue:text}`shape_s`,
# D={glue:text}`shape_d`). On a CPU we count the ops that do arithmetic themselves
# (`Step.work_ops`): not views or bare allocations, and either calling no other such op
# (`matmul` is not counted, the `bmm` under it is) or allocating their own result (`mul`). On a GPU the count that matters is the GPU lane: kernels, copies and
# memsets launched by one forward.

# %%
glue("shape_b", batch); glue("shape_h", heads); glue("shape_s", seq); glue("shape_d", head_dim)

def ops_text(names):
    """'bmm ×2, mul, ...': each op once, in order of first appearance, with its count."""
    counted = pd.Series([n.removeprefix("aten::") for n in names]).value_counts(sort=False)
    return ", ".join(n if c == 1 else f"{n} ×{c}" for n, c in counted.items())

steps_of = {}
for name in list(contenders):
    try:
        run = profiling.profile(kernels.get(name), q, k, v, label=name, active=steps, trace_dir=trace_dir)
    except Exception as err:  # e.g. a CUDA extension that fails to build: say so, go on without it
        print(f"{name} could not run here and leaves the showdown: {type(err).__name__}: {err}")
        contenders.remove(name)
        continue
    steps_of[name] = profiling.median_step(run.steps())
work = {name: s.work_ops() for name, s in steps_of.items()}
pd.DataFrame({"work ops per forward": {n: len(w) for n, w in work.items()},
              "which": {n: ops_text(w) for n, w in work.items()},
              **({"GPU activities per forward": {n: len(s.kernels) for n, s in steps_of.items()}} if on_gpu else {})})

# %%
if not on_gpu:
    lesson(work["sdpa_flash"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"],
           "the fused CPU flash backend is one op per forward", ", ".join(work["sdpa_flash"]))
lesson(all(len(work[n]) > len(work["sdpa_flash"]) for n in ("naive", "inplace", "sdpa_math")),
       "every unfused implementation runs more ops than the fused one",
       ", ".join(f"{n} {len(work[n])}" for n in ("naive", "inplace", "sdpa_math")))
lesson(len(work["naive"]) > len(work["inplace"]), "the in-place forward runs fewer ops than the naive one",
       f"{len(work['naive'])} vs {len(work['inplace'])}")
if on_gpu:
    fused = [n for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn") if n in steps_of]
    for n in fused:
        launched = (steps_of[n].kernels["cat"] == "kernel").sum()
        lesson(launched == 1, f"{n} launches one kernel per forward", f"{launched} kernels")
    lesson(len(steps_of["sdpa_math"].kernels) > len(steps_of["inplace"].kernels),
           "SDPA's math backend launches more GPU work than the hand-written in-place version",
           f"{len(steps_of['sdpa_math'].kernels)} vs {len(steps_of['inplace'].kernels)}")

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
    budget = dict(reps=30, warmup=3, min_reps=5, max_seconds=0.5)
else:  # a 2-core CPU: small budgets keep the whole chapter under a minute
    sweep_seqs = sorted({128, 256, 512, 1024, seq})
    budget = dict(reps=7, warmup=1, min_reps=3, max_seconds=0.15)
results = bench.sweep(contenders, seqs=sweep_seqs, head_dims=(head_dim,), dtypes=(dtype,),
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
peaks = devices.peaks(device)
at_seq = {r.impl: r for r in results if r.seq == seq and r.ok}
by_memory = sorted(at_seq, key=lambda n: at_seq[n].peak_memory_bytes)
display(reveal([g for g in guess_memory_order if g in at_seq], by_memory, "contenders, smallest peak first"))

glance = pd.DataFrame([{
    "implementation": name,
    ("GPU activities" if on_gpu else "work ops"): len(steps_of[name].kernels) if on_gpu else len(work[name]),
    "median ms": r.median_ms,
    "p10-p90 ms": f"{r.p10_ms:.3g}-{r.p90_ms:.3g}",
    "peak MiB": mib(r.peak_memory_bytes),
    "TFLOP/s": r.tflops,
    "FLOP/byte": r.intensity,
    "% of roof": 100 * r.tflops * 1e12 / peaks.attainable(r.intensity),
    "side of ridge": "memory-bound" if r.intensity < peaks.ridge else "compute-bound",
    "the lesson": lessons[name],
} for name, r in at_seq.items()]).set_index("implementation")
caption = (f"This run: {run_label}. {bench.dtype_name(dtype)}, B={batch} H={heads} S={seq} D={head_dim}, "
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
def counted_right(r):
    by_hand = 2 * r.batch * r.heads * r.seq**2 * r.head_dim  # 4·B·H·S²·D, halved for causal
    full = reference.flops(r.batch, r.heads, r.seq, r.head_dim, causal=False)
    return r.causal and r.flops == by_hand == full / 2

wrong = [(r.impl, r.seq) for r in results if not counted_right(r)]
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
plots.time_vs_seq(results)

# %% [markdown]
# Throughput, under the device's compute ceiling ({glue:text}`peak_label`):

# %%
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
plots.memory_vs_seq(results)

# %%
def peak_series(name):
    return {r.seq: r.peak_memory_bytes for r in results if r.impl == name and r.ok}

doublings = {}
for name in contenders:
    mem = peak_series(name)
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
s_max = max(peak_series("sdpa_flash"))
one_scores = batch * heads * s_max**2 * torch.empty((), dtype=dtype).element_size()
lesson(peak_series("sdpa_flash")[s_max] < one_scores,
       f"at S={s_max}, sdpa_flash's whole peak is smaller than one S×S score matrix",
       f"{mib(peak_series('sdpa_flash')[s_max]):.2f} MiB < {mib(one_scores):.0f} MiB")
if not on_gpu:
    lesson(all(peak_series("sdpa_flash")[s] == min(peak_series(n)[s] for n in contenders) for s in sweep_seqs),
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

# %%
if on_gpu:
    for name in (n for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn") if n in at_seq):
        print(f"this run, {name}: {1e3 * at_seq[name].median_ms:.1f} µs median per forward "
              f"(B={batch} H={heads} S={seq} D={head_dim}, {dtype})")
else:
    print("This run is CPU-only: the GPU rows exist here only as the article recorded them.")

# %% [markdown]
# ## What to remember
#
# - A table that a build regenerates cannot drift from the code; a typed one can.
# - Quote medians with their spread, from a benchmark harness, never from one profiled step.
# - Materializing the scores costs memory ∝ S²; the fused kernels' memory grows ∝ S.
# - Count causal FLOPs at half price, or every TFLOP/s is twice too high.
# - Numbers from another machine are quoted with their source, in a table of their own.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/06_showdown.ipynb), with automatic checks, hints and hidden solutions.

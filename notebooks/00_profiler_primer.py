# %% [markdown]
# # 0. The profiler, in one page
#
# A profiler trace answers two questions a timer cannot: *what ran* and *in what order*.
# This chapter records one, reads it three ways, and sets up the course's habit:
#
# > **Guess what the trace will show, then look. Every mismatch is a lesson.**
#
# Everything here runs on a CPU; the chapter ends with a model step recorded on an H100.
#
# **You will learn to:**
#
# - record a trace with a schedule and a label;
# - read it three ways: a summary table, a per-step op table, a timeline;
# - tell a CPU track from a GPU track (launches against [kernels](glossary.md#kernel)) and
#   why a timer around GPU code must synchronise;
# - read a real model's GPU step: busy time, gaps, and when it is launch-bound;
# - open the trace in Perfetto.
#
# **Before you start:** No earlier chapter. Python and basic PyTorch (tensors, `@`); no GPU.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
from functools import partial

import torch

from kernels import borrowed, recorded
from kernels.bench import comparison
from kernels.book.ch00_profiler_primer import runtime_table_whole, summary_columns, synchronisations
from kernels.notebook import glue, glue_all, lesson, readable, reveal, setup, show_lines
from kernels.trace import reader, record, tables, timeline
from kernels.trace.links import links

device, dtype = setup(device, dtype)
print(f"device: {device}, dtype: {dtype}, torch {torch.__version__}")

# %% tags=["remove-input"]
borrowed.traces_box({"H100 BERT": borrowed.TRACELENS["h100_bert"]})

# %% [markdown]
# ## Recording: a schedule and a label
#
# Two habits make what `torch.profiler.profile` records readable:
#
# - **A schedule.** First calls are unusual (first allocations, cold caches). A schedule skips
#   `wait` steps, runs and discards `warmup` steps, then records `active` ones; `prof.step()`
#   ends each step.
# - **A label.** `torch.profiler.record_function("name")` wraps a call in a named range, so
#   the trace says which ops belong to it.
#
# The course's `kernels.trace.record.profile` does both. Its core:

# %% tags=["remove-input"]
show_lines(record.profile, "with quiet_kineto()", "prof.step()")

# %% [markdown]
# ## Guess first
#
# Our first subject is tiny on purpose: a matrix product then a ReLU, all of
# `record.mlp_step(x, w)`:

# %% tags=["remove-input"]
show_lines(record.mlp_step, "return torch.relu")

# %% [markdown]
# Which ops will the trace show at its top level, in order? Op names look like `aten::add`
# (`aten` is PyTorch's library of ops). Make the guess below yours, then run the next cell.

# %%
guess = ["aten::matmul", "aten::mm", "aten::relu"]  # edit me

# %%
x = torch.randn(4 * seq, 4 * head_dim, device=device, dtype=dtype)
w = torch.randn(4 * head_dim, 4 * head_dim, device=device, dtype=dtype)
run = record.profile(record.mlp_step, x, w, label="mlp_step", active=active_steps, trace_dir=trace_dir)
step = reader.median_step(run.steps())
reveal(guess, step.top_level()["name"].tolist(), "top-level ops", source="the top level")

# %% tags=["remove-input"]
seen = step.top_level()["name"].tolist()
lesson(seen == ["aten::matmul", "aten::relu"], "the top level is exactly mlp_step's two calls, in order",
       ", ".join(seen))
lesson(not step.find("aten::mm").empty, "matmul dispatched to aten::mm underneath")

# %% [markdown]
# The top level is what the code wrote; underneath, `matmul` dispatches to `mm` (for 2-D
# inputs): a trace has more levels than the code.
#
# ## Three ways to read the same trace
#
# **1. PyTorch's summary table** (`prof.key_averages().table()`) sums every op over all
# recorded steps: the quickest overview and the most lossy (order, nesting and steps are
# gone). Its printed form is folded here; below it, the columns we read, summed over every call:

# %% tags=["wide-text", "hide-output"]
print(run.averages.table(sort_by="cpu_time_total", row_limit=8))

# %%
summary_columns(run.averages)

# %% [markdown]
# - **CPU total** is an op's wall time, children included; **Self CPU** leaves them out.
#   `aten::matmul`'s self time is tiny: its child `aten::mm` does the work, as
#   `aten::clamp_min` does `aten::relu`'s (a ReLU is a clamp from below at 0).
# - Self times never overlap, so they add up to the outermost row, `ProfilerStep*`: every
#   recorded [profiler step](glossary.md#profiler-step), summed.
# - **CPU Mem** and **Self CPU Mem** (on a GPU, **CUDA Mem**) sum the bytes an op allocated
#   over all its calls, a free counting negative (the printed "MB" are MiB).
# - On a GPU the table adds **Self CUDA** and **CUDA total**: time in kernels an op launched.

# %% tags=["remove-input"]
rows = {e.key: e for e in run.averages}
matmul, mm, outer = rows["aten::matmul"], rows["aten::mm"], rows["ProfilerStep*"]
lesson(abs(matmul.cpu_time_total - (matmul.self_cpu_time_total + mm.cpu_time_total)) <= 0.01 * matmul.cpu_time_total,
       "matmul's CPU total is its self time plus mm's total",
       f"{matmul.cpu_time_total:,.0f} = {matmul.self_cpu_time_total:,.0f} + {mm.cpu_time_total:,.0f} µs")
lesson(matmul.count == active_steps, "# of Calls counts every recorded step", f"{matmul.count} calls over {active_steps} steps")
self_sum = sum(e.self_cpu_time_total for e in run.averages)
lesson(abs(self_sum - outer.cpu_time_total) <= 0.01 * outer.cpu_time_total,
       "the Self CPU column sums to the outermost row, ProfilerStep*",
       f"{self_sum:,.0f} vs {outer.cpu_time_total:,.0f} µs")
# Memory lands in the CPU columns on a CPU and in the CUDA ones on a GPU.
where = "device" if device.type == "cuda" else "cpu"
self_mem = lambda e: getattr(e, f"self_{where}_memory_usage")   # noqa: E731
out_bytes = (x @ w).nbytes
label = rows["mlp_step"]
lesson(self_mem(mm) == mm.count * out_bytes and self_mem(label) == -2 * label.count * out_bytes
       and getattr(label, f"{where}_memory_usage") == 0,
       "memory columns sum every call: each mm allocates its output, the label frees both",
       f"mm {mm.count} × {out_bytes / 2**20:,.0f} MiB; mlp_step {self_mem(label) / 2**20:,.0f} MiB self, 0 in all")
glue_all(primer_out_mib=f"{out_bytes / 2**20:,.0f}", primer_calls=mm.count,
         primer_mm_mem=f"{self_mem(mm) / 2**20:,.0f} MiB", primer_label_mem=f"{self_mem(label) / 2**20:,.0f} MiB")
if device.type == "cuda":
    text = run.averages.table(sort_by="cpu_time_total", row_limit=8)
    lesson("Self CUDA" in text and "CUDA total" in text and "Self CUDA time total" in text,
           "on a GPU the table has Self CUDA and CUDA total columns and a Self CUDA time total line")
    print(f"mlp_step's CUDA time avg in the table: {rows['mlp_step'].device_time_total / rows['mlp_step'].count:.1f} µs; "
          f"the GPU time of one recorded step's kernels in the trace: {step.gpu_time_us:.1f} µs")

# %% [markdown]
# **2. A per-step op table.** The course parses the exported trace into a table per labelled
# step: ops in call order, indented by depth, with input shapes and memory (views hidden).
# Its times are one profiled step's: read order and nesting.

# %%
tables.op_table(step)

# %% [markdown]
# Should the relu take a large share of the matmul's time? It does
# {glue:text}`primer_work_ratio` times less arithmetic ({glue:text}`primer_relu_elems`
# comparisons against {glue:text}`primer_mm_flops` multiply-adds) but reads and writes
# {glue:text}`primer_relu_mib` MiB each way, and moving bytes can cost more than computing
# ([chapter 1](01_naive.ipynb) shows a softmax outlasting two [GEMMs](glossary.md#gemm),
# matrix products). A profiled step is a poor clock, so we time the two ops apart
# ([measuring appendix](appendix/measuring.ipynb)) and call one faster only when its slowest
# tenth of calls beats the other's fastest tenth: the check every CPU time in this book passes.

# %%
y = x @ w
ops_timing = comparison.compare({"matmul": partial(torch.matmul, x, w), "relu": partial(torch.relu, y)},
                                device=device, rounds=15)

# %% tags=["remove-input"]
medians = ", ".join(f"{n} {readable(ms)} ms" for n, ms in ops_timing.median_ms.items())
lesson(ops_timing.faster() in (None, "relu"),
       "timed apart, the relu is faster: its slowest tenth of calls beats the matmul's fastest tenth"
       if ops_timing.faster() else "timed apart, the matmul is not faster; their ranges overlapped, so neither wins",
       medians if ops_timing.faster() else "no time shown")
glue_all(primer_mm_flops=f"{x.shape[0] * w.shape[0] * w.shape[1]:,}", primer_relu_elems=f"{y.numel():,}",
         primer_relu_mib=f"{y.nbytes / 2**20:,.0f}",
         primer_work_ratio=f"{x.shape[0] * w.shape[0] * w.shape[1] // y.numel():,}")
glue("primer_ops_reading", {
    "relu": f"Timed apart from the profiler, the relu is the faster op, "
            f"{ops_timing.median_ms['matmul'] / ops_timing.median_ms['relu']:.0f}x by the medians ({medians}): less than its "
            "arithmetic says, because a relu's time goes to reading and writing its elements, not to comparing them",
    None: "On this run the two ranges overlapped: call by call, the times varied too much on the machine that built "
          "this page for the check to tell the two ops apart, so this page shows no time for them and leaves the "
          "question open. Run the cell on your own machine and see which way it goes",
}[ops_timing.faster()])

# %% [markdown]
# {glue:text}`primer_ops_reading`.
#
# Every recorded step runs the same code, so its ops and memory should match; its CPU time
# need not:

# %%
per_step = tables.counts(run.steps())

# %% tags=["remove-input"]
lesson(len(per_step) == active_steps, f"the schedule recorded exactly {active_steps} active steps", f"{len(per_step)} steps in the trace")
lesson(per_step["ops"].nunique() == 1 and per_step["peak_MiB"].nunique() == 1,
       "every recorded step ran as many ops and peaked at the same memory",
       f"{per_step['ops'].iloc[0]} ops, {readable(per_step['peak_MiB'].iloc[0])} MiB")
display(per_step[["ops", "ops (no views)", "top-level ops", "cpu_time_ms", "peak_MiB"]].rename(
    columns={"cpu_time_ms": "CPU time (ms)", "peak_MiB": "peak (MiB)"}).assign(
    **{"CPU time (ms)": per_step["cpu_time_ms"].map(lambda ms: f"{ms:,.1f}")}))
spread = per_step["cpu_time_ms"].max() / per_step["cpu_time_ms"].min()
relu_profiled_ms = step.find("aten::relu")["dur_us"].iloc[0] / 1e3
relu_vs_timed = (f" (the relu's time in the op table above is {relu_profiled_ms / ops_timing.median_ms['relu']:.0f}× "
                 "its median timed apart)" if ops_timing.faster() == "relu" else "")
glue("primer_step_spread", (
    f"On this run the CPU times of these identical steps range from {per_step['cpu_time_ms'].min():,.1f} to "
    f"{per_step['cpu_time_ms'].max():,.1f} ms, {spread:,.0f}× apart: something outside the code (another process, "
    "a first-time allocation, a garbage collection: the trace does not say which) stretched some of them. Read "
    "the tables above for their ops, nesting and memory, not their times" if spread >= 2 else
    f"On this run the CPU times of these identical steps stay within {spread:.1f}× of each other: that spread, "
    "and the profiler's own cost inside each step, are why one profiled step is no clock") + relu_vs_timed)

# %% [markdown]
# {glue:text}`primer_step_spread`.
#
# **3. A timeline.** The same step as Perfetto draws it: time left to right, a bar per op,
# children under their parent.

# %%
#| caption: One recorded step of `mlp_step` on this run's device. Time runs left to right, one row per nesting depth under the label; any stretch of the label's bar with no op under it is the label's own time (how much, and what it is, below the figure).
#| alt: Timeline of one step of a small MLP: a label row on top, then rows of CPU ops by nesting depth, each op a bar as long as it ran.
timeline.timeline(step, title="mlp_step: one recorded step")

# %% tags=["remove-input"]
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
glue_all(primer_step_ms=readable(step.cpu_time_us / 1e3), primer_ops=len(step.ops))
links(run)
top_ops = step.top_level()
label_own_us = step.cpu_time_us - top_ops["dur_us"].sum()
own_share = 100 * label_own_us / step.cpu_time_us
own_share = f"{own_share:.0f}%" if own_share >= 1 else "under 1%"
glue("primer_label_own", (
    f"Of that, {readable(label_own_us / 1e3)} ms ({own_share}) is the label's own "
    "time, outside matmul and relu: not dispatch (microseconds here) but what the trace cannot give to any op: "
    "the Python between the calls, freeing the outputs, the profiler's bookkeeping and, on a busy machine, "
    "time spent waiting for a core"
    if label_own_us >= 0.1 * step.cpu_time_us else
    f"Only {readable(label_own_us / 1e3)} ms of it ({own_share}) is the label's "
    "own time, outside matmul and relu: the Python between the calls, freeing the outputs, the profiler's bookkeeping"))

# %% [markdown]
# That step took {glue:text}`primer_step_ms` ms of CPU time and dispatched
# {glue:text}`primer_ops` ops, views included. {glue:text}`primer_label_own`.
#
# ## CPU track, GPU track, and why GPU timings lie without care
#
# On a GPU, PyTorch does not wait for a kernel to finish: the CPU *launches* it (a
# `cudaLaunchKernel` call) and moves on while the GPU works through its queue. So a trace has
# two tracks: the CPU thread's, with ops and launches, and the GPU's, with kernels, each tied
# to its launch by a correlation id (an arrow in Perfetto). Hence:
#
# - an op's time on the CPU track is the time to *launch* its work, not to do it;
# - a timer around GPU code measures launches unless it synchronises
#   (`torch.cuda.synchronize()`, or CUDA events); `record.profile` synchronises after each step.
#
# Besides ops, the Hugging Face series this course follows ("Profiling in PyTorch", Part 1,
# torch-profiler.md) reads four kinds of rows in its matmul trace:
#
# - `cudaLaunchKernel`, one per kernel (or a sibling: see H100 BERT below);
# - `cudaOccupancyMaxActiveBlocksPerMultiprocessor`, [cuBLAS](glossary.md#cublas) (NVIDIA's
#   matrix-product library) asking inside `aten::mm` how many blocks fit one [SM](glossary.md#sm);
# - `cudaDeviceSynchronize`, the CPU waiting for everything queued;
# - `Activity Buffer Request`, the profiler's own work ([CUPTI](glossary.md#cupti) asking for
#   memory), on a track of its own.

# %% tags=["remove-input"]
lesson(run.trace.has_gpu == (device.type == "cuda"),
       "this GPU run recorded a GPU track of kernels" if device.type == "cuda" else
       "this CPU-only run recorded no GPU track; H100 BERT below has one",
       f"{len(step.gpu_work)} GPU activities")

# %% tags=["remove-input"]
# On a GPU (or with the book's recording), the same rows read off mlp_step's own GPU step; on a CPU build, nothing.
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, {"mlp_step": step}, "00_profiler_primer", ["mlp_step"])
if gpu_steps:
    gpu_step = gpu_steps["mlp_step"]
    outer = next(p for p in gpu_step.trace.profiler_steps()
                 if p.range["ts"] <= gpu_step.range["ts"] and p.range["end"] >= gpu_step.range["end"])
    print(f"GPU run: {gpu_source}")
    display(tables.kernel_table(gpu_step), runtime_table_whole(outer))
    calls = gpu_step.runtime_calls
    kernels_ = gpu_step.gpu_work[gpu_step.gpu_work["cat"] == "kernel"]
    lesson(calls["name"].str.contains("LaunchKernel").sum() >= len(kernels_) and gpu_step.gpu_work["launcher"].notna().all(),
           "each kernel on the GPU track has its launch call on the CPU thread's track")
    after = outer.runtime_calls[outer.runtime_calls["start_us"] >= float(gpu_step.range["end"] - outer.range["ts"])]
    lesson((after["name"] == "cudaDeviceSynchronize").any(), "the recorded step ends with a cudaDeviceSynchronize after the label")
    queries = calls[calls["name"].str.startswith("cudaOccupancyMaxActiveBlocksPerMultiprocessor")]
    mm_launch = gpu_step.gpu_work.loc[gpu_step.gpu_work["op"] == "aten::mm", "launch_start_us"].min()
    lesson(((queries["op"] == "aten::mm") & (queries["start_us"] < mm_launch)).all(),
           "every occupancy query (if cuBLAS made one) sits inside aten::mm, before the GEMM's launch", f"{len(queries)} queries")
    numbers = tables.gpu_summary(gpu_step)
    print(f"label's CPU time {numbers['step_us']:.0f} µs vs its kernels' GPU time {numbers['gpu_busy_us']:.0f} µs")

# %% [markdown]
# ### A whole model step on an H100
#
# A real model: one inference step of BERT-small on a single input text, in bfloat16, on an
# H100 (**H100 BERT** in the box at the top).
#
# Guess first. The model is tiny; the H100 is one of the fastest GPUs made. For what percentage
# of the step's CPU time was the GPU busy running kernels?

# %%
guess_busy_pct = 50  # edit me: GPU busy time, in % of the step's CPU time

# %%
#| caption: H100 BERT: one inference step of BERT-small (1 × 141 tokens, bfloat16). The CPU rows hold ops, with gaps, across the whole step; the GPU stream row at the bottom holds thin bars with white gaps between them.
#| alt: Timeline of one BERT-small step about 4.4 ms long. Rows of CPU ops by nesting depth span the whole step, with gaps; the single GPU stream row holds about sixty narrow kernel bars spread across it, mostly empty space between them.
# for a trace of your own: bert_step = reader.load_trace(path).steps(label)[0]
bert_step = borrowed.TRACELENS["h100_bert"].step()
timeline.timeline(bert_step, title="H100 BERT: one step")

# %% tags=["remove-input"]
# The borrowed trace itself, to follow its launches to their kernels in Perfetto.
links(bert_step, title="H100 BERT")

# %%
bert_gpu = tables.gpu_summary(bert_step)
busy = round(100 * bert_gpu["gpu_busy_us"] / bert_gpu["step_us"])
reveal(guess_busy_pct, busy, "the GPU's busy share of the step (%)");

# %% tags=["remove-input"]
busy_pct = 100 * bert_gpu["gpu_busy_us"] / bert_gpu["step_us"]
lesson(busy_pct < 50, "the GPU was busy for under half of BERT-small's step",
       f"{bert_gpu['gpu_busy_us']:,.0f} µs of kernels in a {bert_gpu['step_us']:,.0f} µs step")
lesson(bert_gpu["gaps"] > 0 and bert_gpu["cpu_late_gaps"] == bert_gpu["gaps"],
       "the CPU was late for every gap: each launch began after the GPU went idle",
       f"{bert_gpu['cpu_late_gaps']} of {bert_gpu['gaps']} gaps")
tokens = bert_step.find("aten::embedding")["input_dims"].iloc[0][1]   # the token ids: [batch, tokens]
glue_all(bert_tokens=" × ".join(map(str, tokens)), bert_layers=len(bert_step.find("aten::scaled_dot_product_attention")),
         bert_kernels=bert_gpu["kernels"], bert_other_work=bert_gpu["copies and memsets"],
         bert_busy_us=f"{bert_gpu['gpu_busy_us']:.0f}", bert_step_ms=f"{bert_gpu['step_us'] / 1e3:.1f}",
         bert_busy_pct=f"{busy_pct:.0f}", bert_gaps=bert_gpu["gaps"], bert_idle_ms=f"{bert_gpu['idle_us'] / 1e3:.1f}",
         bert_median_gap_us=f"{bert_gpu['median_gap_us']:.0f}",
         bert_launch_to_start_us=f"{bert_gpu['median_launch_to_start_us']:.1f}")

# %% [markdown]
# The model read {glue:text}`bert_tokens` token ids (the box's text_input_length 512 is a maximum) through
# {glue:text}`bert_layers` encoder layers: {glue:text}`bert_kernels` kernels and
# {glue:text}`bert_other_work` copy on one stream. The GPU sat idle {glue:text}`bert_gaps`
# times, {glue:text}`bert_idle_ms` ms in all, a median {glue:text}`bert_median_gap_us` µs each,
# while a typical kernel runs a few microseconds; each kernel started a median
# {glue:text}`bert_launch_to_start_us` µs after its launch call began: the GPU was waiting for
# the CPU to ask. The five longest gaps:

# %%
gaps = tables.gpu_gaps(bert_step)
gaps.nlargest(5, "gap_us")[["after", "before", "gap_us"]].rename(columns={"gap_us": "gap (µs)"})

# %% [markdown]
# `cutlass::Kernel2` is a GEMM kernel built with [CUTLASS](glossary.md#cutlass), NVIDIA's
# library of GEMM templates.
#
# This step is **launch-bound** (or overhead-bound): the CPU dispatching ops one by one through
# Python and PyTorch sets the pace, so a faster kernel would not shorten it. What helps is more
# work per launch (a larger batch) or fewer launches (fused kernels,
# [CUDA graphs](glossary.md#cuda-graph), `torch.compile`, in [chapter 7](07_compiled.ipynb)).
#
# Zoomed in on one encoder layer:

# %%
#| caption: H100 BERT, zoomed in on one encoder layer, from the first `scaled_dot_product_attention` call (the purple bars at the far left, one under the other) to the second. Each kernel (bottom row) has a short grey tick above it: its top end is the moment the kernel's launch call began, its bottom end the kernel's start, microseconds later. Read straight up from a tick's top end to find the op that launched that kernel. The kernels are short, and the white stretches between them are the GPU waiting.
#| alt: Zoomed timeline of one encoder layer of BERT-small: CPU op bars (scaled_dot_product_attention in purple, linear and addmm in blue, layer_norm, gelu) fill three rows above; the GPU row below holds a dozen short kernel bars, each with a short grey tick above it, with wide gaps between them.
layer = tuple(bert_step.find("aten::scaled_dot_product_attention")["start_us"].iloc[:2] / 1e3)
timeline.timeline(bert_step, window_ms=layer, title="H100 BERT: one layer")

# %% [markdown]
# The runtime calls that launch GPU work or wait for it, and the ops that made them:

# %%
bert_calls = tables.runtime_table(bert_step)

# %% tags=["remove-input"]
whole = runtime_table_whole(bert_step)    # the same table, its "made in" cells whole
shown = (whole["GPU work launched"] > 0) | whole["call"].str.endswith("Synchronize")
display(whole[shown].reset_index(drop=True).rename(columns={"GPU work launched": "GPU work"})
        .assign(**{"CPU µs": whole.loc[shown, "CPU µs"].map(lambda us: f"{us:,.0f}").values}))
memsets = bert_calls.loc[bert_calls["call"] == "cudaMemsetAsync", "calls"].sum()
lesson(not whole.loc[~shown, "call"].str.contains("Launch|Memcpy|Synchronize").any()
       and not bert_step.gpu_work["cat"].str.contains("memset").any(),
       "in this trace the calls left out queued no GPU work and waited for none: "
       "its cudaMemsetAsync calls left no Memset on the GPU row",
       f"{', '.join(whole.loc[~shown, 'call'])}; {memsets} cudaMemsetAsync calls, 0 Memsets")
launch_calls = bert_calls[bert_calls["call"].str.contains("LaunchKernel")]
lesson(bert_step.gpu_work["launcher"].notna().all() and launch_calls["calls"].sum() == bert_gpu["kernels"],
       "one launch call per kernel, each kernel tied to its launch",
       f"{launch_calls['calls'].sum()} launch calls, {bert_gpu['kernels']} kernels")
queries = bert_step.runtime_calls["name"].str.startswith("cudaOccupancyMaxActiveBlocksPerMultiprocessor")
lesson(not queries.any(), "no occupancy query: this cuBLAS planned its GEMMs without one", f"{int(queries.sum())} queries")
waits = synchronisations(bert_step)
harness, model = waits[~waits["in_module"]], waits[waits["in_module"]]
first_op_us = float(bert_step.ops["start_us"].min())
lesson(len(harness) == 1 and harness["call"].iloc[0] == "cudaDeviceSynchronize" and harness["op"].isna().all()
       and harness["python"].iloc[0].endswith(": synchronize") and not harness["after_first_launch"].iloc[0]
       and harness["start_us"].iloc[0] < first_op_us,
       "the cudaDeviceSynchronize is the harness's torch.cuda.synchronize(), before any launch",
       f"at {harness['start_us'].iloc[0] / 1e3:.2f} ms; first op at {first_op_us / 1e3:.2f} ms")
lesson(len(model) == 1 and model["call"].iloc[0] == "cudaStreamSynchronize" and model["op"].iloc[0] == "aten::_local_scalar_dense",
       "the model waits for the GPU once, reading a GPU value in aten::_local_scalar_dense",
       f"a cudaStreamSynchronize from {model['python'].iloc[0].rpartition(': ')[2]}")
glue_all(bert_harness_sync_ms=f"{harness['start_us'].iloc[0] / 1e3:.1f}", bert_harness_sync_us=f"{harness['dur_us'].iloc[0]:.0f}")

# %% [markdown]
# Three launch calls appear: `cudaLaunchKernel` for PyTorch's own kernels,
# `cuLaunchKernel` and `cudaLaunchKernelExC` for the GEMM libraries'; no
# [occupancy](glossary.md#occupancy) query. The model waits for the GPU once: a Python `if`
# asks whether its attention mask is all ones, so the CPU copies one value back (the
# `Memcpy DtoH` on the GPU row) and waits in a `cudaStreamSynchronize`. In a launch-bound step
# that costs little; where the GPU runs ahead of the CPU, such a read drains the queue.
#
# ## The trace file
#
# Every profile here is saved as a Chrome/Perfetto trace (compressed JSON). Drag it onto
# [ui.perfetto.dev](https://ui.perfetto.dev): click an op for its input shapes, press `W`/`S`
# to zoom, and on H100 BERT's trace (linked under its figure) follow the arrows from launches
# to kernels.

# %%
print(run.trace_path, run.trace.labels())

# %% [markdown]
# ## What to remember
#
# - Profile with a schedule and labels; read order and nesting in the per-step table and the
#   timeline, not only the summary.
# - On a GPU, set busy time against the step's and read the gaps: in a launch-bound step
#   faster kernels will not help.
# - Guess before you look, then let the trace correct you. Next, hand-written attention.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/00_profiler_primer.ipynb), with automatic checks, hints and hidden solutions.

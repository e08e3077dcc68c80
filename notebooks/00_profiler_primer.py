# %% [markdown]
# # 0. The profiler, in one page
#
# A profiler trace answers two questions a timer cannot: *what ran* and *in what order*.
# This chapter records one, reads it three ways (PyTorch's summary table, a per-step table of
# ops, and a timeline like Perfetto's), and sets up the habit the whole course runs on:
#
# > **Guess what the trace will show, then look. Every mismatch is a lesson.**
#
# Everything here runs on a CPU. On a GPU the same calls record a second lane, the GPU's,
# and we say below what changes.

# %% [install]

# %% [parameters]

# %%
import inspect

import torch

import kernels
from kernels import profiling, recorded, traces
from kernels.book import glue, inputs, lesson, reveal, setup

device, dtype = setup(device, dtype)
print(f"device: {device}, dtype: {dtype}, torch {torch.__version__}")

# %% [markdown]
# ## Recording: a schedule and a label
#
# `torch.profiler.profile` records what happens while it is active. Two habits make its
# output readable:
#
# - **A schedule.** The first calls of anything are unusual: memory is allocated for the
#   first time, libraries initialise, caches are cold. A schedule skips `wait` steps, runs
#   `warmup` steps with the profiler on but discards them, then records `active` steps.
#   You mark the end of each step with `prof.step()`.
# - **A label.** `torch.profiler.record_function("name")` wraps a call in a named range, so
#   the trace says which ops belong to which call.
#
# The course wraps both in one function, `kernels.profiling.profile`. Here is its core:

# %%
src = inspect.getsource(profiling.profile)
print(src[src.index("    with _quiet_kineto()"):src.index("    return Profile")])

# %% [markdown]
# ## Guess first
#
# Our first subject is tiny on purpose: a matrix product followed by a ReLU.
#
# ```python
# def mlp_step(x, w):
#     return torch.relu(x @ w)
# ```
#
# Before profiling, write your guess down in the cell below: which ops will the trace show
# at its top level, in order? (The list there is one reader's guess; make it yours.)

# %%
guess = ["aten::matmul", "aten::relu"]  # edit me before running the next cell

# %% [markdown]
# Now profile it, and compare:

# %%
def mlp_step(x, w):
    return torch.relu(x @ w)

x = torch.randn(4 * seq, 4 * head_dim, device=device, dtype=dtype)
w = torch.randn(4 * head_dim, 4 * head_dim, device=device, dtype=dtype)
run = profiling.profile(mlp_step, x, w, label="mlp_step", active=steps, trace_dir=trace_dir)
step = profiling.median_step(run.steps())

seen = step.top_level()["name"].tolist()
display(reveal(guess, seen, "top-level ops"))
lesson(seen == ["aten::matmul", "aten::relu"], "the top level of the trace is exactly the two ops mlp_step calls: matmul, then relu")
lesson(not step.find("aten::mm").empty, "matmul dispatched to the concrete kernel aten::mm underneath")

# %% [markdown]
# The top level is what the code wrote. Underneath, PyTorch's `matmul` is a dispatcher that
# picks a concrete kernel for the work (`mm` for 2-D inputs): a trace always has more
# levels than the code you read.

# %% [markdown]
# ## Three ways to read the same trace
#
# **1. PyTorch's summary table** (`prof.key_averages().table()`) aggregates every op over all
# recorded steps. It is the quickest overview and the most lossy: order, nesting and the
# step each op belonged to are gone.

# %%
print(run.table(sort_by="cpu_time_total", row_limit=8))

# %% [markdown]
# How to read its columns, checked on this table:
#
# - **CPU total** is the wall time from an op's start to its end, children included; **Self
#   CPU** leaves the children out. `aten::matmul` has a large total and a tiny self time: it
#   dispatches, and its child `aten::mm` does the work. Total = self + the children's totals.
# - **# of Calls** counts every recorded step: the averages divide by it.
# - Self times never overlap, so the Self CPU column adds up to the outermost row, the
#   `ProfilerStep*` that wraps each recorded step.
# - On a GPU the table grows **Self CUDA** and **CUDA total** columns (time the GPU spent in
#   kernels an op launched) and a "Self CUDA time total" line under it. The labelled op's
#   **CUDA time avg** is the GPU time of one forward, the number the source series quotes
#   for each variant. When a label's CPU time is far above its CUDA time, the GPU spent the
#   step waiting for launches: the code is overhead-bound, and a faster kernel will not help;
#   when CUDA time dominates, it is compute- or memory-bound, and kernels are what to work on.

# %%
rows = {e.key: e for e in run.averages}
matmul, mm, outer = rows["aten::matmul"], rows["aten::mm"], rows["ProfilerStep*"]
lesson(abs(matmul.cpu_time_total - (matmul.self_cpu_time_total + mm.cpu_time_total)) <= 0.01 * matmul.cpu_time_total,
       "matmul's CPU total is its self time plus its child mm's total",
       f"{matmul.cpu_time_total:.0f} = {matmul.self_cpu_time_total:.0f} + {mm.cpu_time_total:.0f} µs")
lesson(matmul.count == steps, "# of Calls counts every recorded step", f"{matmul.count} calls over {steps} steps")
self_sum = sum(e.self_cpu_time_total for e in run.averages)
lesson(abs(self_sum - outer.cpu_time_total) <= 0.01 * outer.cpu_time_total,
       "the Self CPU column adds up to the outermost row (ProfilerStep*)",
       f"{self_sum:.0f} vs {outer.cpu_time_total:.0f} µs")

# %% [markdown]
# **2. A per-step op table.** The course parses the exported trace file itself
# (`kernels.profiling`), so each labelled step comes back as a table in call order, indented
# by nesting depth, with input shapes and the memory each op allocated. View-only ops
# (reshape, transpose, ...) that compute nothing are hidden.

# %%
profiling.op_table(step)

# %% [markdown]
# Every recorded step should look alike; if one does not, something (a first-time
# allocation, a garbage collection, another process) disturbed it. The schedule recorded
# exactly the number of steps we asked for:

# %%
per_step = profiling.counts(run.steps())
lesson(len(per_step) == steps, f"the schedule recorded exactly {steps} active steps", f"{len(per_step)} steps in the trace")
lesson(per_step["ops"].nunique() == 1, "every recorded step dispatched the same number of ops",
       f"{per_step['ops'].iloc[0]} ops per step")
per_step

# %% [markdown]
# **3. A timeline.** The same step drawn as Perfetto draws it: time runs left to right, a
# bar per op, children under their parent. A wide bar with a narrow child means time spent
# in the parent itself (dispatch, checks, allocation).

# %%
fig = profiling.timeline(step, title="mlp_step: one recorded step")
glue("primer_step_ms", round(step.cpu_time_us / 1e3, 3))
glue("primer_ops", len(step.ops))

# %%
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
traces.links(run)

# %% [markdown]
# That step took {glue:text}`primer_step_ms` ms of CPU time and dispatched
# {glue:text}`primer_ops` ops, views included.
#
# ## CPU lane, GPU lane, and why GPU timings lie without care
#
# On a GPU, PyTorch does not wait for a kernel to finish: the CPU *launches* it (a
# `cudaLaunchKernel` call of a few microseconds) and moves on while the GPU works through
# its queue. A trace therefore has two lanes: the CPU lane with ops and launches, and the
# GPU lane with the kernels, joined by flow arrows from each launch to its kernel. Two
# consequences:
#
# - The time of an op on the CPU lane is the time to *launch* its work, not to do it.
# - A timer around GPU code measures launches unless it synchronises
#   (`torch.cuda.synchronize()`, or CUDA events). `kernels.profiling.profile` synchronises at
#   the end of each step so that steps do not bleed into each other.
#
# The trace we just recorded has no GPU lane, because this run's device is the CPU:

# %%
if device.type == "cuda":
    lesson(run.trace.has_gpu, "a GPU run records a GPU lane of kernels",
           f"{len(step.kernels)} GPU activities in one step")
else:
    lesson(not run.trace.has_gpu, "a CPU-only run records no GPU lane: ops run where they are dispatched")
lanes, lane_source, _ = recorded.gpu_lanes(device, {"mlp_step": step}, "00_profiler_primer", ["mlp_step"])
if lanes:
    gpu_step = lanes["mlp_step"]
    print(f"GPU lane: {lane_source}")
    display(profiling.kernel_table(gpu_step))
    spans = gpu_step.trace.spans
    runtime = spans[spans["cat"].isin(["cuda_runtime", "cuda_driver"]) & (spans["ts"] >= gpu_step.range["ts"])
                    & (spans["end"] <= gpu_step.range["end"])]
    display(runtime.groupby("name")["dur"].agg(["count", "sum"]).rename(
        columns={"count": "calls", "sum": "CPU µs"}).sort_values("CPU µs", ascending=False))
    bound = "overhead-bound" if gpu_step.cpu_time_us > gpu_step.gpu_time_us else "GPU-bound"
    print(f"CPU {gpu_step.cpu_time_us:.0f} µs vs GPU {gpu_step.gpu_time_us:.0f} µs for one step: {bound}")
    launches = int(runtime["name"].str.contains("LaunchKernel").sum())
    n_kernels = int((gpu_step.kernels["cat"] == "kernel").sum())
    lesson(launches >= n_kernels, "each kernel on the GPU lane has its launch call on the CPU lane",
           f"{launches} launch calls, {n_kernels} kernels")
else:
    print(lane_source)

# %% [markdown]
# On a GPU lane the CPU side holds more than launches: the runtime rows of a step typically
# include `cudaLaunchKernel` (or the driver's `cuLaunchKernelEx`) once per kernel, a
# `cudaOccupancyMaxActiveBlocksPerMultiprocessor` query that cuBLAS makes before some GEMMs,
# and the `cudaDeviceSynchronize` that ends each profiled step; outside the steps, the
# profiler's own requests for activity buffers. Where a lane is shown above, its table counts them.

# %% [markdown]
# ## The trace file
#
# Every profile in this course is also written to disk as a Chrome/Perfetto trace
# (compressed JSON). Open it at [ui.perfetto.dev](https://ui.perfetto.dev) (drag the file
# onto the page) to explore it yourself: click an op to see its input shapes, press `W`/`S`
# to zoom, and on GPU traces follow the arrows from launches to kernels.

# %%
size_kib = run.trace_path.stat().st_size / 1024
print(f"{run.trace_path}: {size_kib:.1f} KiB, labels: {run.trace.labels()}")
glue("primer_trace_kib", round(size_kib, 1))

# %% [markdown]
# ## What to remember
#
# - Profile with a schedule (skip the first calls) and label what you call.
# - Read the per-step table and the timeline, not only the summary: order and nesting
#   are where the stories are.
# - Guess before you look. In the next chapter the guess for hand-written attention will be
#   wrong by exactly one op, and that op costs a full copy of the attention scores.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/00_profiler_primer.ipynb), with automatic checks, hints and hidden solutions.

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
from kernels import profiling
from kernels.book import glue, inputs, lesson, setup

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
# Before profiling, write the guess down: **two ops, a matmul and a relu**. The trace will
# agree at the top level, and show more underneath: PyTorch's `matmul` is a dispatcher
# that picks a concrete kernel (`mm` for 2-D inputs) for the work.

# %%
def mlp_step(x, w):
    return torch.relu(x @ w)

x = torch.randn(4 * seq, 4 * head_dim, device=device, dtype=dtype)
w = torch.randn(4 * head_dim, 4 * head_dim, device=device, dtype=dtype)
run = profiling.profile(mlp_step, x, w, label="mlp_step", active=steps, trace_dir=trace_dir)
step = profiling.median_step(run.steps())

guess = ["aten::matmul", "aten::relu"]
seen = step.top_level()["name"].tolist()
print("guess:", guess)
print("trace:", seen)
lesson(seen == guess, "the top level of the trace is exactly the two ops we wrote: matmul, then relu")
lesson(not step.find("aten::mm").empty, "matmul dispatched to the concrete kernel aten::mm underneath")

# %% [markdown]
# ## Three ways to read the same trace
#
# **1. PyTorch's summary table** (`prof.key_averages().table()`) aggregates every op over all
# recorded steps. It is the quickest overview and the most lossy: order, nesting and the
# step each op belonged to are gone.

# %%
print(run.table(sort_by="cpu_time_total", row_limit=8))

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
    display(profiling.kernel_table(step))
else:
    lesson(not run.trace.has_gpu, "a CPU-only run records no GPU lane: ops run where they are dispatched")

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

# %% [markdown]
# # 0. The profiler, in one page
#
# A profiler trace answers two questions a timer cannot: *what ran* and *in what order*.
# This chapter records one, reads it three ways, and sets up the habit the whole course runs on:
#
# > **Guess what the trace will show, then look. Every mismatch is a lesson.**
#
# Everything here runs on a CPU. On a GPU the same calls record a second track, the GPU's,
# and we say below what changes.
#
# **You will learn to:**
#
# - record a trace with a schedule (`wait`, `warmup`, `active` steps) and a label on each call;
# - read one trace three ways: PyTorch's summary table (CPU total against Self CPU), a per-step
#   table of ops in call order, and a timeline;
# - tell a CPU track from a GPU track: launches against kernels, tied by correlation ids, and
#   why a timer around GPU code must synchronise;
# - open the trace file in Perfetto and follow a launch to its kernel.
#
# **Before you start:** No earlier chapter. Python and basic PyTorch (tensors, `@`, calling a
# function on them); no GPU.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import inspect

import torch

import kernels
from kernels import borrowed, recorded
from kernels.bench import comparison
from kernels.notebook import glue, inputs, lesson, reveal, say, setup
from kernels.trace import reader, record, tables, timeline
from kernels.trace.links import links

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
# The course wraps both in one function, `kernels.trace.record.profile`. Here is its core:

# %%
src = inspect.getsource(record.profile)
print(src[src.index("    with quiet_kineto()"):src.index("    return ProfiledRun")])

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
run = record.profile(mlp_step, x, w, label="mlp_step", active=active_steps, trace_dir=trace_dir)
step = reader.median_step(run.steps())

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

# %% tags=["wide-text"]
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
# - On a GPU run the table grows **Self CUDA** and **CUDA total** columns (time the GPU spent
#   in kernels an op launched, its children's included in the total) and a "Self CUDA time
#   total" line under it; the cell below checks they are there when this page ran on a GPU.
#   The labelled op's **CUDA time avg** is the number the source series quotes per forward.
#   When a label's CPU time is far above the GPU time of its kernels, the GPU spent the step
#   waiting for launches: the code is overhead-bound, and a faster kernel will not help; when
#   the GPU time dominates, it is compute- or memory-bound, and kernels are what to work on.
#   The GPU-track cell further down makes that comparison on a real GPU track when there is one.

# %%
rows = {e.key: e for e in run.averages}
matmul, mm, outer = rows["aten::matmul"], rows["aten::mm"], rows["ProfilerStep*"]
lesson(abs(matmul.cpu_time_total - (matmul.self_cpu_time_total + mm.cpu_time_total)) <= 0.01 * matmul.cpu_time_total,
       "matmul's CPU total is its self time plus its child mm's total",
       f"{matmul.cpu_time_total:.0f} = {matmul.self_cpu_time_total:.0f} + {mm.cpu_time_total:.0f} µs")
lesson(matmul.count == active_steps, "# of Calls counts every recorded step", f"{matmul.count} calls over {active_steps} steps")
self_sum = sum(e.self_cpu_time_total for e in run.averages)
lesson(abs(self_sum - outer.cpu_time_total) <= 0.01 * outer.cpu_time_total,
       "the Self CPU column adds up to the outermost row (ProfilerStep*)",
       f"{self_sum:.0f} vs {outer.cpu_time_total:.0f} µs")
if device.type == "cuda":
    text = run.table(sort_by="cpu_time_total", row_limit=8)
    lesson("Self CUDA" in text and "CUDA total" in text and "Self CUDA time total" in text,
           "on a GPU the table has Self CUDA and CUDA total columns and a Self CUDA time total line")
    print(f"mlp_step's CUDA time avg in the table: {rows['mlp_step'].device_time_total / rows['mlp_step'].count:.1f} µs; "
          f"the GPU time of one recorded step's kernels in the trace: {step.gpu_time_us:.1f} µs")

# %% [markdown]
# **2. A per-step op table.** The course parses the exported trace file itself
# (`kernels.trace.record`), so each labelled step comes back as a table in call order, indented
# by nesting depth, with input shapes and the memory each op allocated. View-only ops
# (reshape, transpose, ...) that compute nothing are hidden. Its times are one step's,
# profiler included: read the order and the nesting first, and the times only after the
# check below.

# %%
tables.op_table(step)

# %% [markdown]
# Should the relu take a large share of the matmul's time? The matmul does
# {glue:text}`primer_mm_flops` multiply-adds; the relu one comparison per element of its
# output, {glue:text}`primer_relu_elems` of them. A profiled step is a poor clock for that
# question: it is one sample, the profiler adds its own bookkeeping to every op, and on a
# busy machine a thread that loses its core can stretch any op by milliseconds. So the cell
# below times the two ops apart from the profiler, alternating them call by call, and calls
# one faster only when its slowest tenth of calls beats the other's fastest tenth
# (`kernels.bench.compare`; the [measuring appendix](appendix/measuring.ipynb) explains each
# precaution):

# %%
y = x @ w
ops_timing = comparison.compare({"matmul": lambda: x @ w, "relu": lambda: torch.relu(y)}, device=device, rounds=15)
print(ops_timing.verdict())
profiled_ms = {name: float(step.find(op)["dur_us"].sum()) / 1e3 for name, op in (("matmul", "aten::mm"), ("relu", "aten::clamp_min"))}
print("in the profiled step: " + ", ".join(f"{n} {t:.3f} ms" for n, t in profiled_ms.items()))
lesson(ops_timing.faster() in (None, "relu"), "timed apart from the profiler, the relu is never the slower of the two",
       ops_timing.verdict())
glue("primer_mm_flops", f"{x.shape[0] * w.shape[0] * w.shape[1]:,}")
glue("primer_relu_elems", f"{y.numel():,}")
glue("primer_ops_verdict", ops_timing.verdict())
glue("primer_ops_reading", {
    "relu": f"the relu is the cheaper op on this machine, {ops_timing.median_ms['matmul'] / ops_timing.median_ms['relu']:.0f}x "
            "faster by the medians, as its arithmetic says",
    None: "this machine was too noisy to separate even these two, so no time in the profiled table above says "
          "what an op costs here: read its order and nesting, not its times",
}[ops_timing.faster()])

# %% [markdown]
# On this run: {glue:text}`primer_ops_verdict`. So {glue:text}`primer_ops_reading`.

# %% [markdown]
# Every recorded step should look alike; if one does not, something (a first-time
# allocation, a garbage collection, another process) disturbed it. The schedule recorded
# exactly the number of steps we asked for:

# %%
per_step = tables.counts(run.steps())
lesson(len(per_step) == active_steps, f"the schedule recorded exactly {active_steps} active steps", f"{len(per_step)} steps in the trace")
lesson(per_step["ops"].nunique() == 1, "every recorded step dispatched the same number of ops",
       f"{per_step['ops'].iloc[0]} ops per step")
per_step

# %% [markdown]
# **3. A timeline.** The same step drawn as Perfetto draws it: time runs left to right, a
# bar per op, children under their parent. A wide bar with a narrow child means time spent
# in the parent itself (dispatch, checks, allocation).

# %%
#| caption: One recorded step of `mlp_step` on this run's device. Time runs left to right, one row per nesting depth under the label; a wide bar over a narrow child is time spent in the parent itself (dispatch, checks, allocation).
#| alt: Timeline of one step of a small MLP: a label row on top, then rows of CPU ops by nesting depth, each op a bar as long as it ran.
fig = timeline.timeline(step, title="mlp_step: one recorded step")
glue("primer_step_ms", round(step.cpu_time_us / 1e3, 3))
glue("primer_ops", len(step.ops))
fig

# %%
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
links(run)

# %% [markdown]
# That step took {glue:text}`primer_step_ms` ms of CPU time and dispatched
# {glue:text}`primer_ops` ops, views included.
#
# ## CPU track, GPU track, and why GPU timings lie without care
#
# On a GPU, PyTorch does not wait for a kernel to finish: the CPU *launches* it (a
# `cudaLaunchKernel` call) and moves on while the GPU works through its queue. A trace
# therefore has two tracks: the CPU thread's track with ops and launches, and the GPU track with the
# kernels, each kernel tied to its launch by a correlation id (Perfetto draws the tie as an
# arrow). Two consequences:
#
# - The time of an op on the CPU track is the time to *launch* its work, not to do it.
# - A timer around GPU code measures launches unless it synchronises
#   (`torch.cuda.synchronize()`, or CUDA events). `kernels.trace.record.profile` synchronises at
#   the end of each step so that steps do not bleed into each other.
#
# The CPU side of a GPU run holds more than ops. Part 1 of the source series
# (Hugging Face blog, torch-profiler.md) reads four kinds of runtime rows in its matmul
# trace, and this page's GPU run can be read for the same:
#
# - `cudaLaunchKernel` (or the driver's `cuLaunchKernel` / `cuLaunchKernelEx`): one per kernel.
# - `cudaOccupancyMaxActiveBlocksPerMultiprocessor`: a planning call, purely on the CPU, asking
#   how many blocks of a kernel fit one SM. In the series' trace cuBLAS made it inside
#   `aten::mm`, before the GEMM's launch, and the elementwise kernel had none; a different
#   cuBLAS may not make it at all.
# - `cudaDeviceSynchronize`: here the one `kernels.trace.record.profile` calls after each
#   labelled call, still inside the recorded step (`ProfilerStep#N`) but after the label.
# - `Activity Buffer Request`: the profiler's own row, CUPTI asking for memory to record GPU
#   activity into. The series found one leaving a gap in its GPU track; where it falls depends
#   on when the profiler's buffers run out.
#
# When this page has a GPU run (this run's own on a GPU, else a recording, labelled as
# such), the cell below counts those rows in one recorded step and checks what can be
# checked: every kernel has its launch, the step ends with the synchronize, and an occupancy
# query, where there is one, sits inside `aten::mm` before the GEMM's launch. It also sets
# the label's CPU time beside its kernels' GPU time (overhead-bound or not). The trace we just
# recorded has no GPU track when this run's device is the CPU:

# %%
if device.type == "cuda":
    lesson(run.trace.has_gpu, "a GPU run records a GPU track of kernels",
           f"{len(step.gpu_work)} GPU activities in one step")
else:
    lesson(not run.trace.has_gpu, "a CPU-only run records no GPU track: ops run where they are dispatched")
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, {"mlp_step": step}, "00_profiler_primer", ["mlp_step"])
if gpu_steps:
    gpu_step = gpu_steps["mlp_step"]
    label_ts, label_end = float(gpu_step.range["ts"]), float(gpu_step.range["end"])
    print(f"GPU run: {gpu_source}")
    display(tables.kernel_table(gpu_step))
    # The recorded step around this label: the label, then what the step does after it.
    outer = next(p for p in gpu_step.trace.profiler_steps()
                 if p.range["ts"] <= label_ts and p.range["end"] >= label_end)
    spans = gpu_step.trace.spans
    rows_ = spans[spans["cat"].isin(["cuda_runtime", "cuda_driver", "overhead"])
                  & (spans["ts"] >= outer.range["ts"]) & (spans["end"] <= outer.range["end"])].copy()
    rows_["where"] = ["in the label" if label_ts <= t and e <= label_end else "after the label" if t >= label_end
                      else "before the label" for t, e in zip(rows_["ts"], rows_["end"])]
    display(rows_.groupby(["name", "where"])["dur"].agg(["count", "sum"]).rename(
        columns={"count": "calls", "sum": "CPU µs"}).sort_values("CPU µs", ascending=False))
    kernels_ = gpu_step.gpu_work[gpu_step.gpu_work["cat"] == "kernel"]
    launches = rows_[rows_["name"].str.contains("LaunchKernel") & (rows_["where"] == "in the label")]
    lesson(len(launches) >= len(kernels_) and gpu_step.gpu_work["launcher"].notna().all(),
           "each kernel on the GPU track has its launch call on the CPU thread's track",
           f"{len(launches)} launch calls, {len(kernels_)} kernels")
    syncs = rows_[(rows_["name"] == "cudaDeviceSynchronize") & (rows_["where"] == "after the label")]
    lesson(len(syncs) >= 1, "the recorded step ends with a cudaDeviceSynchronize after the label",
           f"{len(syncs)} in {outer.label}")
    ops = gpu_step.ops

    def innermost_op(t):
        around = ops[(ops["ts"] <= t) & (ops["end"] >= t) & (ops["tid"] == str(gpu_step.range["tid"]))]
        return around.sort_values("depth").iloc[-1]["name"] if not around.empty else None

    queries = rows_[rows_["name"].str.startswith("cudaOccupancyMaxActiveBlocksPerMultiprocessor")]
    mm_launch = (gpu_step.gpu_work.loc[gpu_step.gpu_work["op"] == "aten::mm", "launch_start_us"] + label_ts).min()
    if queries.empty:
        print("no occupancy query in this GPU run's step: this GPU's cuBLAS planned its launch without one")
    else:
        inside = [innermost_op(t) for t in queries["ts"]]
        lesson(all(o == "aten::mm" for o in inside) and (queries["ts"] < mm_launch).all(),
               "every occupancy query sits inside aten::mm, before the GEMM's launch; the relu makes none",
               f"{len(queries)} queries, inside {sorted(set(map(str, inside)))}")
    requests = rows_[rows_["name"] == "Activity Buffer Request"]
    print(f"activity-buffer requests in {outer.label}: {len(requests)}"
          + (f", {requests['dur'].sum():.0f} µs" if len(requests) else ""))
    bound = ("overhead-bound: the GPU waited for launches" if gpu_step.cpu_time_us > gpu_step.gpu_time_us
             else "GPU-bound: the kernels, not the launches, set the pace")
    print(f"label's CPU time {gpu_step.cpu_time_us:.0f} µs vs its kernels' GPU time {gpu_step.gpu_time_us:.0f} µs: {bound}")
else:
    print(gpu_source)

# %% [markdown]
# ### A real GPU run, recorded by others
#
# Until this course's own GPU recording exists, here is a GPU run that other people recorded
# on a real GPU: one forward of AlexNet on an A100, from the test data of Meta's
# HolisticTraceAnalysis project (MIT licence). It is not attention and not this book's run,
# but it has everything the section above describes: the CPU tracks of ops, a GPU track per
# stream, and a grey arrow from each launch on the CPU to the kernel it queued on the GPU.

# %%
#| caption: A GPU run recorded by others (HolisticTraceAnalysis's test data, an A100). The CPU rows are busy across the whole label; the GPU work (the thin bars on the two GPU-stream rows at the bottom) takes a small part of it, each bar tied by a grey arrow to the launch that queued it.
#| alt: Timeline of one AlexNet forward on an A100. Rows of CPU ops (zeros, mul, conv2d, convolution, cudnn_convolution) span about 80 ms; the two GPU stream rows hold narrow kernel bars near the right edge only.
a100 = borrowed.ALEXNET_FORWARD
a100_trace = a100.trace()
a100_step = a100.step()
say(a100.credit(a100_trace))
timeline.timeline(a100_step, title="AlexNet, one forward on an A100 (recorded by HolisticTraceAnalysis)")

# %%
a100_kernels = a100_step.gpu_work
glue("a100_cpu_ms", round(a100_step.cpu_time_us / 1e3, 1))
glue("a100_gpu_ms", round(a100_step.gpu_time_us / 1e3, 1))
glue("a100_work", len(a100_kernels))
lesson(a100_kernels["launcher"].notna().all(),
       "every kernel and memset on the borrowed GPU tracks has its launch call on a CPU thread's track",
       f"{a100_kernels['launcher'].notna().sum()} of {len(a100_kernels)}")
lesson(a100_kernels["stream"].nunique() >= 2, "the borrowed GPU run has work on more than one stream's track",
       f"streams {sorted(a100_kernels['stream'].unique().tolist())}")
lesson(a100_step.gpu_time_us < a100_step.cpu_time_us,
       "in the borrowed forward the GPU was busy for less time than the CPU spent in the label",
       f"{a100_step.gpu_time_us / 1e3:.1f} ms of GPU work in {a100_step.cpu_time_us / 1e3:.1f} ms")

# %% [markdown]
# The GPU did {glue:text}`a100_work` pieces of work (kernels and a memset) in
# {glue:text}`a100_gpu_ms` ms, inside a label that held the CPU for {glue:text}`a100_cpu_ms` ms.
# Reading such a trace is the skill this course trains: the CPU tracks say what was asked and
# when, the GPU tracks say what ran and for how long, and the arrows say which is which.

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

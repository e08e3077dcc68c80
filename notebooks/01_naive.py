# %% [markdown]
# # 1. Attention by hand
#
# Causal self-attention in five steps, one PyTorch op each: scores $= QK^\top$, scale by
# $1/\sqrt{d}$, hide the future with $-\infty$, softmax, multiply by $V$. This is the version
# most of us write first, and the first trace we read. We will guess its ops, profile it,
# and find one op we did not write: a full copy of the attention scores.
#
# **You will learn to:**
#
# - guess a forward's top-level ops, then check the guess against the trace;
# - find the op you did not write: the `clone` and `copy_` under `masked_fill`, a full copy of
#   the attention scores;
# - count copies by the bytes they move, not by their names;
# - read a forward's peak and total memory from the trace's allocations, and see both grow with
#   S².
#
# **Before you start:** [0. The profiler, in one page](00_profiler_primer.ipynb). Causal
# self-attention as the formula above: softmax of $QK^\top/\sqrt{d}$ with the future masked,
# times $V$.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import torch

import kernels
from kernels import recorded, reference
from kernels.attention.naive import NaiveAttention
from kernels.notebook import glue, inputs, lesson, mib, reveal, setup, show_source
from kernels.trace import reader, record, tables, timeline
from kernels.trace.links import links

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}")

# %% [markdown]
# ## The module
#
# This is the course library's implementation, shown from its source. The causal mask is
# built once and cached, so what we profile is attention itself, not mask construction.
# Note the mask step: `masked_fill`, without a trailing underscore.

# %%
show_source(NaiveAttention)

# %% [markdown]
# First, is it right? Every implementation in the course is judged against the same
# float64 reference (`kernels.reference.attention`).

# %%
naive = kernels.get("naive")
out = naive(q, k, v, causal=True)
verdict = reference.judge(out, q, k, v, causal=True)  # fp32: 1e-5 relative; 16-bit: FlashAttention's rule
lesson(verdict.ok, "naive attention matches the float64 reference by the course's rule", str(verdict))
glue("naive_err", verdict["out"].error)

# %% [markdown]
# ## Guess, then profile
#
# Read `forward` above and write down, in the cell below, the ops you expect at the top of
# the trace, in order, before looking.

# %%
guess = ["aten::matmul", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::matmul"]  # edit me

# %%
run = record.profile(naive, q, k, v, label="naive", active=active_steps, trace_dir=trace_dir)
step = reader.median_step(run.steps())
top = step.top_level()["name"].tolist()
display(reveal(guess, top, "top-level ops"))
called = ["aten::matmul", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::matmul"]  # forward's five calls
lesson(top == called, "the ops forward calls appear at the top of the trace exactly as written", ", ".join(top))

# %% [markdown]
# The top level agrees. The story is one level down. Here is every op of one recorded
# forward that does work (views hidden), indented under the op that called it:

# %%
tables.op_table(step)

# %% [markdown]
# ## The op we did not write
#
# Under `masked_fill` sit `clone` and `copy_`. An out-of-place `masked_fill` must return a
# *new* tensor, so PyTorch clones the whole scores tensor, then fills the clone in place.
#
# Copies hide in plain sight: there is a second `copy_` in this trace, under `mul`. That one
# converts the Python float `scale` into a one-element tensor and moves 4 bytes. So we never
# count copies by name; we count them by **what they move**:

# %%
copies = step.copies()
display(tables.copy_table(step))
scores_shape = [batch, heads, seq, seq]
scores_bytes = batch * heads * seq * seq * q.element_size()
big = step.copies(min_bytes=scores_bytes)
lesson(len(big) == 1 and big.iloc[0]["input_dims"][0] == scores_shape,
       f"exactly one copy of the full {batch}×{heads}×{seq}×{seq} scores tensor per forward",
       f"{len(big)} copy of {mib(scores_bytes):.1f} MiB")
clone = step.find("aten::clone", shape=scores_shape)
lesson(len(clone) == 1 and step.ops.at[clone.index[0], "parent"] in step.find("aten::masked_fill").index,
       "the copy comes from aten::clone, called by the out-of-place aten::masked_fill")
copy_ms = float(big["dur_us"].iloc[0]) / 1e3
glue("naive_copy_mib", f"{mib(scores_bytes):.1f}")
glue("naive_copy_ms", f"{copy_ms:.2f}")
glue("naive_copy_share", f"{100 * copy_ms / (step.cpu_time_us / 1e3):.0f}")
glue("naive_step_ms", f"{step.cpu_time_us / 1e3:.2f}")

# %% [markdown]
# The copy moves {glue:text}`naive_copy_mib` MiB and took {glue:text}`naive_copy_ms` ms, about
# {glue:text}`naive_copy_share`% of this {glue:text}`naive_step_ms` ms forward. Here is the
# same step as a timeline; copies are drawn in red:

# %%
#| caption: One forward of hand-written attention. The red bars are the copy this chapter is about: the `clone` under `masked_fill` and its S×S `copy_`; the matmuls, the scale and the softmax around them do the work.
#| alt: Timeline of one naive attention forward: matmul, mul, masked_fill, softmax and matmul in a row, with clone and copy_ drawn in red beneath masked_fill.
timeline.timeline(step, title=f"naive attention, one forward ({device.type})")

# %%
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
links(run)

# %% [markdown]
# ## Memory
#
# The trace also records every allocation. The forward holds two S×S buffers at its peak
# (the scores and the softmax probabilities, or the scores and their clone), and allocates
# more than that in total, because the clone is one more S×S buffer:

# %%
peak, total = step.peak_bytes, step.allocated_bytes
print(f"peak {mib(peak):.1f} MiB, allocated in total {mib(total):.1f} MiB, one S×S buffer = {mib(scores_bytes):.1f} MiB")
lesson(peak >= 2 * scores_bytes, "at its peak the forward holds at least two S×S buffers")
glue("naive_peak_mib", f"{mib(peak):.1f}")
glue("naive_total_mib", f"{mib(total):.1f}")

# %% [markdown]
# Peak {glue:text}`naive_peak_mib` MiB, {glue:text}`naive_total_mib` MiB allocated in all.
# Both grow with $S^2$: double the sequence and the scores take four times the memory
# ([chapter 3b](03b_sdpa_fused.ipynb) measures that growth and checks it).
#
# ## On a GPU
#
# On a GPU the same forward becomes a row of kernels, one per op that does work. The
# source article (Hugging Face, "Profiling in PyTorch, Part 3", one A100, bfloat16) counts
# **6 kernels** per forward: matmul, mul, a **Memcpy** for the clone, the mask, softmax,
# matmul. The cell below reads a GPU run: this run's own when it ran on a GPU, else the
# newest recording (labelled as such), and checks both counts on it.

# %%
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, {"naive": step}, "01_naive", ["naive"])
if not gpu_steps:
    print(gpu_source)
else:
    print(f"GPU run: {gpu_source}")
    gpu = gpu_steps["naive"].gpu_work
    display(tables.kernel_table(gpu_steps["naive"]))
    copies = gpu[gpu["cat"] == "gpu_memcpy"]
    fills = gpu_steps["naive"].find("aten::masked_fill")
    in_fill = [any(f.start_us <= t <= f.start_us + f.dur_us for f in fills.itertuples())
               for t in copies["launch_start_us"]]
    lesson(len(gpu) == 6, "the naive forward runs six GPU activities, as on the article's A100",
           f"{len(gpu)} on the GPU track: {int((gpu['cat'] == 'kernel').sum())} kernels, {len(copies)} copies")
    lesson(len(copies) == 1 and all(in_fill), "exactly one of them is a copy, launched inside masked_fill (its clone)",
           ", ".join(copies["name"].str.slice(0, 40)))

# %% [markdown]
# ## What to remember
#
# - The top level of a trace is what you wrote; the lessons are one level down.
# - Out-of-place ops allocate an output; most copy nothing into it. `masked_fill` is the
#   exception here: it is `clone` followed by `masked_fill_`, so on a
#   {glue:text}`naive_copy_mib` MiB tensor it also makes a {glue:text}`naive_copy_mib` MiB copy.
# - Count copies by their shape and bytes, not by name.
#
# Next: make the mask in place, and prove the copy is gone.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/01_naive.ipynb), with automatic checks, hints and hidden solutions.

# %% [markdown]
# # 1. Attention by hand
#
# Causal self-attention in five steps, one PyTorch op each: scores $= QK^\top$, scale by
# $1/\sqrt{d}$, hide the future with $-\infty$, softmax, multiply by $V$. This is the version
# most of us write first, and the first attention trace we read. We will guess its ops, profile it,
# and find one op we did not write: a full copy of the attention scores.
#
# **You will learn to:**
#
# - guess a forward's top-level ops, then check the guess against the trace;
# - find the op you did not write: the `clone` and `copy_` under `masked_fill`, a full copy of
#   the attention scores;
# - count copies by the bytes they move, not by their names;
# - find the hand-written core in a real model's GPU step, size its S×S score tensor from the
#   recorded shapes, and see the [kernels](glossary.md#kernel) that only move it outlast the
#   [GEMMs](glossary.md#gemm);
# - read a forward's peak and total memory, and why both grow with S².
#
# **Before you start:** [0. The profiler, in one page](00_profiler_primer.ipynb). Causal
# self-attention as the formula above: softmax of $QK^\top/\sqrt{d}$ with the future masked,
# times $V$.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import math
import operator

import kernels
from kernels import borrowed, recorded, reference
from kernels.attention.naive import NaiveAttention
from kernels.book.ch01_naive import folded_note, naive_copy_on_gpu
from kernels.book.timesformer import timesformer_input
from kernels.notebook import glue_all, inputs, lesson, mib, reveal, say, setup, show_lines
from kernels.trace import reader, record, tables, timeline
from kernels.trace.attention import find_attention
from kernels.trace.links import links

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}")

# %% tags=["remove-input"]
borrowed.traces_box({"H100 TimeSformer": borrowed.TRACELENS["h100_timesformer"]})

# %% [markdown]
# ## The module
#
# The course library's `NaiveAttention` does the five steps in its method `attend`, shown here
# from its source. (Its `forward` also takes [grouped-query attention](glossary.md#gqa), fewer
# K/V heads than query heads: not here. The causal mask is cached, and the `no_key_rows`
# branch runs only with more queries than keys: not here either.) Note the mask step,
# `mask_scores`: `masked_fill`, without a trailing underscore.

# %%
show_lines(NaiveAttention.attend)

# %%
show_lines(NaiveAttention.mask_scores)

# %% [markdown]
# First, is it right? Every implementation in the course is judged against the same
# float64 reference (`kernels.reference.attention`): in float32 within 1e-5 of the output's
# largest value plus an allowance for rounding the scores (the bound printed below), in 16-bit dtypes within twice the error of plain PyTorch attention computed in that dtype
# (the rule of FlashAttention's own tests).

# %%
naive = kernels.get("naive")
verdict = reference.judge(naive(q, k, v, causal=True), q, k, v, causal=True)

# %% tags=["remove-input"]
lesson(verdict.ok, "naive attention matches the float64 reference within its dtype's tolerance",
       f"max error {verdict['out'].error:.1e}, bound {verdict['out'].bound:.1e}")

# %% [markdown]
# ## Guess, then profile
#
# Read `attend` and `mask_scores` above: which ops will the trace show at its top level, in
# order? The cell below holds a first guess (`@` on 4-D tensors is a batched matrix multiply,
# so it guesses `bmm`); make it yours before running the next one.

# %%
guess = ["aten::bmm", "aten::mul", "aten::masked_fill",   # edit me
         "aten::softmax", "aten::bmm"]

# %%
run = record.profile(naive, q, k, v, label="naive", active=active_steps,
                     trace_dir=trace_dir)
step = reader.median_step(run.steps())
top = step.top_level()["name"].tolist()
reveal(guess, top, "top-level ops", source="the top level")

# %% tags=["remove-input"]
called = ["aten::matmul", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::matmul"]  # attend's five steps
lesson(top == called, "the five ops attend calls appear at the top of the trace exactly as written, `@` as aten::matmul",
       ", ".join(top))
lesson(all(step.ops.at[i, "depth"] == 1 and step.ops.at[step.ops.at[i, "parent"], "name"] == "aten::matmul"
           for i in step.find("aten::bmm").index) and len(step.find("aten::bmm")) == 2,
       "each aten::bmm, the batched multiply that does the work, sits one level down, under an aten::matmul")

# %% [markdown]
# The top level is the five steps of `attend`, in order: `@` is `aten::matmul`, which hands
# the work to `bmm` one level down. The `transpose` is a view of `k` and computes nothing, so
# this book's tables leave it out (Perfetto shows it). The lessons are one level down: every op
# of one forward that does work, indented under its caller, without times (one profiled
# sample: chapter 0), to read the nesting and the allocations.

# %%
tables.op_table(step, times=False)

# %% [markdown]
# ## The op we did not write
#
# Under `masked_fill` sit `clone` and `copy_`. An out-of-place `masked_fill` must return a
# *new* tensor, so PyTorch clones the whole scores tensor, then fills the clone in place
# (`masked_fill_`, the fill any version of the mask needs). The clone is the work nobody
# asked for.
#
# Copies hide in plain sight: there is a second `copy_` in this trace, under `mul`. That one
# converts the Python float `scale` into a one-element tensor and moves 4 bytes. So we never
# count copies by name; we count them by **what they move**:

# %%
tables.copy_table(step, times=False)

# %% tags=["remove-input"]
scores_shape = [batch, heads, seq, seq]
scores_bytes = batch * heads * seq * seq * q.element_size()
big = step.copies(min_bytes=scores_bytes)
lesson(len(big) == 1 and big.iloc[0]["input_dims"][0] == scores_shape,
       f"exactly one copy of the full {batch}×{heads}×{seq}×{seq} scores tensor per forward",
       f"{len(big)} copy of {mib(scores_bytes):.1f} MiB")
clone = step.find("aten::clone", shape=scores_shape)
lesson(len(clone) == 1 and step.ops.at[clone.index[0], "parent"] in step.find("aten::masked_fill").index,
       "the copy comes from aten::clone, called by the out-of-place aten::masked_fill")
glue_all(naive_copy_mib=f"{mib(scores_bytes):.1f}")

# %% [markdown]
# The copy moves {glue:text}`naive_copy_mib` MiB, as much as the scores tensor itself. What it
# costs in time, a profiled forward cannot say (one sample, profiler included: chapter 0's
# rule): [chapter 2](02_inplace.ipynb) removes it and times both versions. On a GPU the clone
# is work of its own too: the source article (Hugging Face, "Profiling in PyTorch, Part 3", one
# A100, bfloat16) counts six GPU activities per forward, one of them a `Memcpy` for this clone.
# Here is our step as a timeline; copies are drawn in red:

# %%
#| caption: One forward of hand-written attention. The red bars are the copy this chapter is about: the `clone` under `masked_fill` and its S×S `copy_`; the matmuls, the scale and the softmax around them do the work. The bars' lengths are one CPU sample, profiler included: read the order and the nesting, not the widths.
#| alt: Timeline of one naive attention forward: matmul, mul, masked_fill, softmax and matmul in a row, with clone and copy_ drawn in red beneath masked_fill.
timeline.timeline(step, title=f"naive attention ({device.type})")

# %% tags=["remove-input"]
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
links(run)

# %% tags=["remove-input"]
# This run's own GPU forward (or the book's recording of it): the article's six activities and its one copy.
# On a CPU build without a recording it shows nothing.
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, {"naive": step}, "01_naive", ["naive"])
if gpu_steps:
    say(f"On a GPU, {gpu_source}: the same forward's GPU track, checked against the article's count.")
    display(naive_copy_on_gpu(gpu_steps["naive"]))

# %% [markdown]
# ## Memory
#
# The trace also records every allocation. The forward holds two S×S buffers at its peak
# (the scores and the softmax probabilities, or the scores and their clone), and allocates
# more in total: each step writes a new S×S tensor and frees the one before (the clone is one):

# %% tags=["remove-input"]
lesson(step.peak_bytes >= 2 * scores_bytes and 4 * scores_bytes <= step.allocated_bytes < 5 * scores_bytes,
       "at its peak the forward holds at least two S×S buffers; in all it allocates four (scores, scaled, clone, probabilities)",
       f"peak {mib(step.peak_bytes):.1f} MiB, allocated {mib(step.allocated_bytes):.1f} MiB, one S×S buffer {mib(scores_bytes):.1f} MiB")
glue_all(naive_peak_mib=f"{mib(step.peak_bytes):.1f}", naive_total_mib=f"{mib(step.allocated_bytes):.1f}")

# %% [markdown]
# Peak {glue:text}`naive_peak_mib` MiB, {glue:text}`naive_total_mib` MiB allocated in all.
# Both grow with $S^2$: double the sequence and the scores take four times the memory
# ([chapter 3b](03b_sdpa_fused.ipynb) measures that growth and checks it).
#
# ## A hand-written attention core in a real model
#
# Real models write attention by hand too. TimeSformer, a video classifier, computes its
# attention exactly as this chapter does, minus the mask: `q @ k^T`, times the scale,
# softmax, times `v`. **H100 TimeSformer** (in the box at the top of the page) is one
# inference step of it in bfloat16 on an H100, recorded by others.
# `kernels.trace.attention.find_attention` finds every matmul → softmax → matmul core in the
# step by its ops and shapes:

# %%
tf_step = borrowed.TRACELENS["h100_timesformer"].step()
tf_report = find_attention(tf_step)

# %% tags=["remove-input"]
longest_of_each = tf_report.table().sort_values("GPU µs", ascending=False).drop_duplicates(subset=["B·H x Sq x Sk x D"])
calls_shown = longest_of_each.sort_values("#")[["kernels", "B·H x Sq x Sk x D", "GPU µs"]].reset_index(drop=True)
display(calls_shown.assign(**{"GPU µs": calls_shown["GPU µs"].map(lambda us: f"{us:,.0f}")}))
lesson(len(tf_report.calls) > 0 and all(c.how == "hand-written" for c in tf_report.calls),
       "every attention call in TimeSformer's step is a hand-written matmul -> softmax -> matmul core",
       f"{len(tf_report.calls)} calls")
video = timesformer_input(tf_step)
frames_per_group = video["frames"] // video["trained_frames"]
longest = max(c.sq for c in tf_report.calls if c.sq is not None)   # a hand-written call's shapes are read off its GEMMs
long_calls = [c for c in tf_report.calls if c.sq == longest]
short_calls = [c for c in tf_report.calls if c.sq == video["trained_frames"]]
heads = long_calls[0].batch_heads // video["space_groups"]
lesson(len(short_calls) + len(long_calls) == len(tf_report.calls)
       and all(c.batch_heads == heads * (video["space_tokens"] - 1) for c in short_calls),
       "the calls come in two sizes: short \"time\" calls over 8 positions, one per patch and head, and long \"space\" calls",
       f"{len(short_calls)} time calls of {short_calls[0].batch_heads:,} = {video['space_tokens'] - 1:,} patches × {heads} heads; "
       f"{len(long_calls)} space calls of {long_calls[0].batch_heads} = {video['space_groups']} groups × {heads} heads")
glue_all(tf_calls=len(tf_report.calls), tf_tokens=f"{video['space_tokens']:,}", tf_frames=video["frames"],
         tf_trained_frames=video["trained_frames"], tf_heads=heads, tf_time_bh=f"{short_calls[0].batch_heads:,}",
         tf_patches_all=f"{video['space_tokens'] - 1:,}")

# %% [markdown]
# The step holds {glue:text}`tf_calls` attention calls in two sizes; the table shows the longest
# of each, with its shape. A short "time" call attends over
# {glue:text}`tf_trained_frames` positions, once per patch and head: {glue:text}`tf_time_bh` =
# {glue:text}`tf_patches_all` patches × {glue:text}`tf_heads` heads. A long "space" call attends
# over {glue:text}`tf_tokens` tokens: the recorded input is a video of {glue:text}`tf_frames`
# frames. (Why that many tokens, and what that input did to the step, is a detour: the note below.)

# %% tags=["remove-input"]
tf_share = 100 * tf_report.attention_gpu_us / tf_step.gpu_time_us
modeling = ("https://github.com/huggingface/transformers/blob/main/src/transformers/models/timesformer/"
            "modeling_timesformer.py")
folded_note(
    f"Why {video['space_tokens']:,} tokens? A {video['frames']}-frame video on an {video['trained_frames']}-frame checkpoint",
    [f"The attention calls took {tf_share:.0f}% of the step's GPU time, and that share says as much about the input "
     f"as about the model. The recorded video has {video['frames']} frames; the checkpoint was trained on "
     f"{video['trained_frames']} (the trace shows its time embedding stretched from {video['trained_frames']} positions "
     f"to {video['stretched_to']}, by <code>upsample_nearest1d</code>).",
     f"Hugging Face's divided attention (<a href=\"{modeling}\">modeling_timesformer.py</a>, "
     f"<code>TimesformerLayer</code>) splits the patches into <code>config.num_frames</code> groups, the checkpoint's "
     f"{video['trained_frames']}, not the video's. So its short \"time\" calls attend over {video['trained_frames']} positions, "
     f"and each long \"space\" call over {frames_per_group} frames' patches at once: 1 + {frames_per_group} × "
     f"{video['patches_per_frame']} = {video['space_tokens']:,} tokens, where a video of {video['trained_frames']} frames "
     f"would give {1 + video['patches_per_frame']:,}."],
    video["frames"] == video["stretched_to"] == 128 and video["trained_frames"] == video["space_groups"] == 8
    and video["space_tokens"] == 1 + frames_per_group * video["patches_per_frame"] == 3137
    and all(c.sq == c.sk == video["space_tokens"] for c in long_calls),
    "the recorded video has 128 frames for a checkpoint trained on 8, so each long \"space\" call attends over "
    "1 + 16 × 196 = 3,137 tokens, 16 frames' patches at once",
    f"patch embedding over {video['frames']} frames; time embedding stretched from {video['trained_frames']} to "
    f"{video['stretched_to']}; space attention's input {video['space_groups']} × {video['space_tokens']:,} tokens")
glue_all(tf_share=f"{tf_share:.0f}", tf_patches=video["patches_per_frame"], tf_frames_per_group=frames_per_group,
         tf_tokens_trained=f"{1 + video['patches_per_frame']:,}")

# %% [markdown]
# Take the longest call. Its score tensor, the S×S matrix this chapter's copy was made of:

# %%
call = max(tf_report.calls, key=operator.attrgetter("gpu_us"))
scores = tables.score_tensor(call)

# %% tags=["remove-input"]
lesson(scores["shape"][-2:] == [call.sq, call.sk] and scores["bytes"] == math.prod(scores["shape"]) * 2,
       "the score tensor is B·H × S × S bfloat16 elements, as this chapter's S×S lesson counts them",
       f"{tables.shape_text(scores['shape'])} {scores['dtype']} = {scores['bytes'] / 2**30:.2f} GiB")
glue_all(tf_scores_shape=tables.shape_text(scores["shape"]), tf_scores_gib=f"{scores['bytes'] / 2**30:.2f}",
         tf_scores_vs_ours=f"{scores['bytes'] / scores_bytes:,.0f}")

# %% [markdown]
# The trace recorded the softmax's input as {glue:text}`tf_scores_shape` in bfloat16 (the
# {glue:text}`tf_trained_frames` groups of frames × {glue:text}`tf_heads` heads, {glue:text}`tf_tokens` tokens
# each way): {glue:text}`tf_scores_gib` GiB for one call, {glue:text}`tf_scores_vs_ours` times
# this page's own S×S buffer above.
#
# Guess before the next table: the two GEMMs do all of this call's arithmetic. What
# percentage of the call's GPU time do they take?

# %%
guess_gemm_pct = 80  # edit me: the GEMMs' share of the GPU time, in %

# %%
by_op = call.kernels.groupby("op")["dur_us"].sum()
gemm_pct = round(100 * by_op["aten::bmm"] / call.gpu_us)
reveal(guess_gemm_pct, gemm_pct, "the GEMMs' share of the call's GPU time (%)");

# %% [markdown]
# Here are that call's kernels in the order the GPU ran them: the short name of each, the op
# whose launch queued it, how long it ran, and its grid (how many thread blocks it launched).

# %%
tables.work_table(call.kernels).drop(columns="starts at (µs)")

# %% tags=["remove-input"]
work = tables.work_table(call.kernels)
elementwise_us = float(by_op.get("aten::mul", 0) + by_op.get("aten::_softmax", 0))
lesson(by_op.index.tolist() == ["aten::_softmax", "aten::bmm", "aten::copy_", "aten::mul"] and work["launched by"].eq("aten::bmm").sum() == 2,
       "one call runs the two GEMMs (bmm), the scale (mul) and the softmax, plus copies of its inputs",
       f"{len(work)} kernels: " + ", ".join(f"{n} {op.removeprefix('aten::')}" for op, n in work["launched by"].value_counts().items()))
lesson(elementwise_us > by_op["aten::bmm"],
       "the scale and the softmax, which only read and write the score tensor, take longer on the GPU than the two GEMMs",
       f"mul + softmax {elementwise_us / 1e3:.2f} ms, the two bmm {by_op['aten::bmm'] / 1e3:.2f} ms")
blocks = call.kernels.assign(blocks=call.kernels["grid"].map(math.prod)).groupby("op")["blocks"]
lesson(blocks.min()[["aten::mul", "aten::_softmax"]].min() > 100_000 > blocks.max()["aten::bmm"],
       "the scale and the softmax each launch over 100,000 thread blocks, each GEMM fewer",
       f"mul {blocks.max()['aten::mul']:,}, softmax {blocks.max()['aten::_softmax']:,}; the two bmm "
       + " and ".join(f"{n:,}" for n in call.kernels.loc[call.kernels["op"] == "aten::bmm", "grid"].map(math.prod)))
bandwidth = tf_report.peaks.bandwidth if tf_report.peaks else math.nan   # the datasheet's, for the GPU the trace names
mul_share = 2 * scores["bytes"] / (by_op["aten::mul"] * 1e-6) / bandwidth   # the scale reads the scores once, writes them once
lesson(0.5 <= mul_share <= 1, "the scale streams the score tensor at more than half the GPU's memory bandwidth, never above it",
       f"{mul_share * bandwidth / 1e12:.2f} TB/s, {100 * mul_share:.0f}% of the {bandwidth / 1e12:.2f} TB/s datasheet peak")
glue_all(tf_elementwise_ms=f"{elementwise_us / 1e3:.1f}", tf_gemm_ms=f"{by_op['aten::bmm'] / 1e3:.1f}",
         tf_mul_tbps=f"{mul_share * bandwidth / 1e12:.1f}", tf_mul_pct=f"{100 * mul_share:.0f}")

# %% [markdown]
# The two GEMMs do the arithmetic in {glue:text}`tf_gemm_ms` ms; the scale and the softmax,
# which compute almost nothing, take {glue:text}`tf_elementwise_ms` ms, because each reads the
# whole score tensor from memory and writes it back (their grids launch blocks by the hundred
# thousand, in proportion to the score tensor's size; the GEMMs tile their output in far
# fewer, larger blocks). The scale alone streams it at {glue:text}`tf_mul_tbps` TB/s,
# {glue:text}`tf_mul_pct`% of the H100's [HBM](glossary.md#hbm) bandwidth: only fewer bytes
# would help. (The three `copy_` kernels copy `q`, `k` and `v` into contiguous buffers for
# `bmm`: more copies nobody wrote.) Chapter 3's fused kernels never write the S×S tensor to
# memory at all.
#
# Here the GPU, not the CPU, sets the pace: the opposite of chapter 0's BERT step. The figure
# shows the call from its first kernel to its last, and what the CPU did meanwhile:

# %% tags=["remove-input"]
launched_by, waited = call.kernels["launch_start_us"].agg(["min", "max"]), call.kernels["start_us"] - call.kernels["launch_start_us"]
lesson(launched_by["max"] - launched_by["min"] < call.gpu_us / 10 and waited.max() > 1000,
       "the CPU launched the whole call in under a tenth of the time the GPU took to run it, so kernels waited milliseconds in the queue",
       f"launched within {launched_by['max'] - launched_by['min']:.0f} µs, run in {call.gpu_us / 1e3:.1f} ms, longest wait {waited.max() / 1e3:.1f} ms")

# %%
#| caption: H100 TimeSformer: the longest hand-written attention call on the GPU, from its first kernel to its last. The GPU row runs its kernels back to back: two copies (red), a GEMM (blue), the scale (grey), the softmax (green), a copy and a GEMM. The CPU launched them milliseconds earlier; here it queues the model's last ops, then sits in `aten::to` (the long grey bar), whose copy of the model's output (red, below it) waits until the GPU has run everything queued.
#| alt: Zoomed timeline of one attention call, about 11 ms: at the left the CPU rows hold a few short op bars, then one long grey bar to the end with red copy bars under it; the GPU row holds a few long bars: small red copies, a blue GEMM, a grey scale, a long green softmax, a red copy and a blue GEMM.
ends = call.kernels["start_us"] + call.kernels["dur_us"]
call_ms = (call.kernels["start_us"].min() / 1e3, ends.max() / 1e3)
timeline.timeline(tf_step, window_ms=call_ms, title="H100 TimeSformer: one call")

# %% tags=["remove-input"]
tf_top = tf_step.top_level()
to_host = tf_top[tf_top["name"] == "aten::to"].iloc[-1]        # the step's last cast: the model's output
gpu_work = tf_step.gpu_work
lesson(call_ms[0] * 1e3 < to_host["start_us"] < call_ms[1] * 1e3
       and to_host["start_us"] + to_host["dur_us"] >= (gpu_work["start_us"] + gpu_work["dur_us"]).max()
       and not (gpu_work["launch_start_us"] > to_host["start_us"] + to_host["dur_us"]).any(),
       "while the GPU ran this call, the CPU finished queuing the model, then blocked in aten::to, copying the "
       "model's output, until the GPU had run everything queued; it launched nothing after that copy",
       f"aten::to of the {tables.shape_text(to_host['input_dims'][0])} logits, one score per class, from {to_host['start_us'] / 1e3:.0f} ms to "
       f"{(to_host['start_us'] + to_host['dur_us']) / 1e3:.0f} ms; the GPU's last work ends at "
       f"{(gpu_work['start_us'] + gpu_work['dur_us']).max() / 1e3:.0f} ms")

# %% [markdown]
# ## What to remember
#
# - The top level of a trace is what you wrote; the lessons are one level down.
# - Out-of-place ops allocate an output; most copy nothing into it. `masked_fill` is the
#   exception here: it is `clone` followed by `masked_fill_`, so on a tensor of
#   {glue:text}`naive_copy_mib` MiB it also makes a copy of {glue:text}`naive_copy_mib` MiB.
# - Count copies by their shape and bytes, not by name.
# - The S×S score tensor is what a hand-written core costs on a GPU too: in a real model it
#   runs to gigabytes, and the kernels that read and write it take longer than the GEMMs.
# - Read a real trace's shapes before its percentages: they say what input the numbers came from.
#
# Next: make the mask in place, and prove the copy is gone.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/01_naive.ipynb), with automatic checks, hints and hidden solutions.

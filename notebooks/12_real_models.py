# %% [markdown]
# # 12. Attention in a real model's trace
#
# Every chapter so far profiled attention on its own, on shapes the course chose. In a real
# model attention is one layer among many, written by someone else, run on whichever GPU the
# job landed on. This chapter reads the traces of real Hugging Face models that other people
# recorded on real GPUs: the same language model on an NVIDIA H100 and on an AMD MI300X, a
# video model whose attention is written by hand beside an image model that calls [SDPA](glossary.md#sdpa), and
# the share of each step that attention takes, with where the rest goes. Last, the command
# that does all of this for a trace of your own.
#
# **You will learn to:**
#
# - find every attention call in a model's step, fused or hand-written, with
#   `kernels.trace.attention.find_attention`;
# - compare one model's attention on two vendors: the [kernel](glossary.md#kernel) each runs, its time per call,
#   its [TFLOP/s](glossary.md#flops) against the datasheet peak, and what each vendor's trace records of it;
# - tell hand-written attention (a [GEMM](glossary.md#gemm), a scale, a softmax, a GEMM) from a fused kernel in a
#   trace, and see what writing it by hand costs a whole model;
# - split a step's GPU time into attention and the rest, by kind of kernel;
# - run `python -m kernels.trace.attention` on a trace of your own, recorded with shapes.
#
# **Before you start:** [3b. The fused backends](03b_sdpa_fused.ipynb) (a fused kernel's
# name and footprint), [6. Showdown](06_showdown.ipynb) (FLOPs and TFLOP/s) and
# [8. One transformer block](08_block.ipynb) (attention's share of a block).
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import pandas as pd
import torch

from kernels.attention.block import Block
from kernels.borrowed import TRACELENS, root
from kernels.notebook import glue, lesson, reveal, say, setup
from kernels.trace import attention, breakdown, record
from kernels.trace.attention import find_attention, short_kernel_name

device, dtype = setup(device, dtype)
shown = ["h100_qwen", "mi300x_qwen", "h100_timesformer", "mi300x_timesformer", "h100_vit", "mi300x_vit", "h100_bert"]
traces = {key: TRACELENS[key].trace() for key in shown}
reports = {key: find_attention(TRACELENS[key].step(trace=traces[key])) for key in shown}
gpus = {key: TRACELENS[key].gpu(traces[key]) for key in shown}        # the GPU each trace records
share = {key: breakdown.time_by_kind(r).loc["attention", "share"] for key, r in reports.items()}

# %% [markdown]
# The traces come from the test data of AMD's TraceLens project (MIT licence): Hugging Face
# models in bfloat16, one [profiler step](glossary.md#profiler-step) each, recorded with shapes and kernel footprints, on
# an H100 with torch 2.6 and on an MI300X with torch 2.7 for ROCm. They are not this book's
# runs; every table and figure below says which trace it read, and the GPU named is the one
# the trace records. `find_attention(step)` reads one step and returns an `AttentionReport`:
# one `AttentionCall` per attention forward, found by its op (SDPA and its backends, down to
# the kernel that ran), by kernel name when no op launched it, or as a hand-written
# `matmul -> softmax -> matmul` chain matched by shapes.
#
# ## One model, two vendors
#
# Qwen1.5-0.5B is a small decoder-only language model: 24 layers, 16 heads of 64 dimensions.
# Both traces ran the same forward over the same input, 16 sequences of 559 tokens (as the
# recorded shapes say), with causal attention through SDPA. On the H100, SDPA picks its
# FlashAttention-2 backend; on the MI300X, PyTorch for ROCm routes the same call to a kernel
# of AMD's. Before looking: which GPU's attention kernel takes less time per call?

# %%
guess_faster = "MI300X"  # edit me: "H100" or "MI300X"

# %%
h100, mi300x = reports["h100_qwen"], reports["mi300x_qwen"]
side_by_side = pd.DataFrame({gpus["h100_qwen"]: h100.summary(), gpus["mi300x_qwen"]: mi300x.summary()})
display(side_by_side)
for key in ("h100_qwen", "mi300x_qwen"):
    say(TRACELENS[key].credit(traces[key]))
per_call = side_by_side.loc["GPU µs per call (median)"].astype(float)
faster, slower = per_call.sort_values().index
print(f"you guessed the {guess_faster}; per call, the faster kernel ran on the {faster}")

# %% [markdown]
# The table is `AttentionReport.summary()` for each trace, side by side: how many calls, the
# kernel each ran, the median call's GPU time, its TFLOP/s and its share of the GPU's dense
# 16-bit datasheet peak, attention's share of the step, then the first call's footprint: the
# launch grid and block, and what the trace adds about the kernel's resources.

# %%
shapes = [{(c.batch_heads, c.sq, c.sk, c.d, c.causal) for c in r.calls} for r in (h100, mi300x)]
lesson(len(h100.calls) == len(mi300x.calls) and shapes[0] == shapes[1] and len(shapes[0]) == 1,
       "both vendors run the same attention calls: one per layer, all of one shape", f"{len(h100.calls)} of {shapes[0]}")
kernel_names = side_by_side.loc["main kernel"]   # each side's distinct main kernels, joined by ", "
lesson(kernel_names.nunique() == 2 and not kernel_names.str.contains(", ").any(),
       "each vendor runs one attention kernel of its own, a different one", ", ".join(kernel_names))
recorded = side_by_side.loc[["grid", "block", "registers per thread", "shared memory (KiB)", "occupancy (%)"]] != "not recorded"
lesson(recorded[gpus["h100_qwen"]].all() and recorded[gpus["mi300x_qwen"]].tolist() == [True, True, False, False, False],
       "the CUDA trace records the kernel's registers, shared memory and occupancy; the ROCm trace its grid and block only")
peak_pct = side_by_side.loc["% of dense 16-bit peak (median)"].astype(float)
lesson(bool((peak_pct < 20).all()), "at 559 tokens neither kernel reaches a fifth of its GPU's datasheet peak",
       ", ".join(f"{p}%" for p in peak_pct))
glue("qwen_calls", len(h100.calls))
glue("faster_gpu", faster)
glue("slower_gpu", slower)
glue("per_call_ratio", per_call[slower] / per_call[faster])
glue("mi300x_kernels_per_call", mi300x.summary()["kernels per call"])

# %% [markdown]
# Per call (the median of {glue:text}`qwen_calls`, in the table's `GPU µs per call` row), the
# kernel on the {glue:text}`slower_gpu` took {glue:text}`per_call_ratio:.2f` times as long as
# the one on the {glue:text}`faster_gpu`. Three things to take from the table:
#
# - **The names differ, the job does not.** The H100 runs `pytorch_flash::flash_fwd_kernel`,
#   the FlashAttention-2 kernel that PyTorch ships (chapter 3b); the MI300X runs `attn_fwd`,
#   AOTriton's kernel (Triton, compiled ahead of time), which PyTorch for ROCm runs behind the
#   same SDPA call. A search of a trace for "flash" finds no kernel on the MI300X: look for
#   the op, then for the kernel it launched.
#   Each MI300X call launched {glue:text}`mi300x_kernels_per_call` kernels: `attn_fwd` and a
#   small fill beforehand (an `aten::zeros` inside `aten::_flash_attention_forward`).
# - **Far below peak, on both**: the `% of dense 16-bit peak` row, against the datasheet
#   figures of `kernels.hw.devices` (the TFLOP/s count the two matrix products,
#   $2 \cdot B \cdot H \cdot S_q \cdot S_k \cdot (D + D_v)$, halved for causal). At 559 tokens a block of 128 queries walks at most 559 keys, fewer
#   under the causal mask, with a head dimension of 64: little arithmetic against the fixed
#   cost of loading its queries and writing its output. Fused kernels climb towards their
#   peak with the sequence length (chapter 6 measures it); a prefill this short does not.
# - **Each vendor's trace records a different footprint.** The CUDA trace carries the
#   kernel's [registers](glossary.md#registers) per thread, [shared memory](glossary.md#shared-memory) and [Kineto's](glossary.md#kineto) [occupancy](glossary.md#occupancy) estimate; the ROCm
#   trace carries the grid and the block, no more. Whatever you conclude about occupancy on
#   an AMD GPU has to come from elsewhere (the compiler's report, `rocprof`), not from this
#   file.
#
# The two GPUs are not a benchmark here: one step each, one input size, different torch
# versions and attention kernels. What the traces do show is the reading: the same calls,
# found the same way, on either vendor.
#
# ## Attention's share of the step, and where the rest goes
#
# A prefill of 16 x 559 tokens through 24 layers: before looking, what share of the step's GPU
# time is attention, on the H100?

# %%
guess_qwen_share = 0.5  # edit me: a fraction of the step's GPU time, 0 to 1

# %%
by_kind = pd.DataFrame({gpus[k]: breakdown.time_by_kind(reports[k])["share"] for k in ("h100_qwen", "mi300x_qwen")}).fillna(0.0)
by_kind = by_kind.reindex([kind for kind in breakdown.KINDS if kind in by_kind.index])
display((100 * by_kind).round(1).rename(index=breakdown.KIND_LABELS).rename_axis("% of the step's GPU time"))
reveal(guess_qwen_share, round(share["h100_qwen"], 3), "attention's share of the H100 step")
display(breakdown.rest_by_op(h100).round({"GPU µs": 0, "share": 3}))
for key in ("h100_qwen", "mi300x_qwen"):
    say(TRACELENS[key].credit(traces[key]))
lesson(share["h100_qwen"] < 0.25 and share["mi300x_qwen"] < 0.25,
       "attention is under a quarter of the Qwen prefill's GPU time, on both GPUs",
       f"{100 * share['h100_qwen']:.1f}% and {100 * share['mi300x_qwen']:.1f}%")
lesson(all(by_kind.loc["gemm", gpu] > by_kind.loc["attention", gpu] for gpu in by_kind),
       "the GEMMs of the projections and the MLP take more of the step than attention, on both GPUs",
       str(by_kind.loc[["attention", "gemm"]].round(3).to_dict()))
glue("qwen_h100_share", 100 * share["h100_qwen"])
glue("qwen_mi300x_share", 100 * share["mi300x_qwen"])
glue("qwen_elementwise_copy", 100 * (by_kind.loc["elementwise"] + by_kind.loc["copy"]).max())

# %% [markdown]
# Attention took {glue:text}`qwen_h100_share:.1f`% of the step on the H100 and
# {glue:text}`qwen_mi300x_share:.1f`% on the MI300X. The rest, by kind of kernel
# (`breakdown.time_by_kind`; a kernel's kind is read from its name, as in chapter 3b, with
# the ROCm GEMM names `Cijk_*` counted as GEMMs):
#
# - **GEMMs**: `aten::mm` and `aten::addmm`, the Q, K, V and output projections and the MLP.
#   At this size they are the largest single kind of arithmetic.
# - **Elementwise and copies**, up to {glue:text}`qwen_elementwise_copy:.0f`% of the step
#   together: `aten::mul`, `aten::add`, `aten::pow`, `aten::neg`, `aten::silu`, `aten::cat`,
#   `aten::copy_`. These are RMSNorm, the rotary embedding and the MLP's SiLU gate as eager
#   Hugging Face code writes them, op by op, each a pass over the activations, with casts to
#   float32 and back around the norms (`copy_` under `aten::_to_copy`) and `.contiguous()`
#   copies (`copy_` under `aten::clone`). Fusing such chains is what chapter 7's
#   `torch.compile` does; attention is not where this step's time would be won back.
#
# The second table names the ops behind the rest, on the H100: the innermost op that
# launched each kernel, its kind, and its share of the step.
#
# ## Hand-written attention beside a fused call
#
# TimeSformer is a video transformer from Hugging Face's library whose attention is written
# by hand: `q @ k.transpose(-2, -1)`, a scale, `softmax`, `@ v`. Each block attends twice, as
# its divided space-time attention does: once over time, in short sequences of 8 tokens, and
# once over space, in long sequences of 3137 tokens. The ViT image classifier next to it
# calls SDPA. Before looking: what share of TimeSformer's step on the H100 is attention?

# %%
guess_timesformer_share = 0.3  # edit me: a fraction of the step's GPU time, 0 to 1

# %%
timesformer, vit = reports["h100_timesformer"], reports["h100_vit"]
calls = timesformer.table()
display(calls.groupby("B·H x Sq x Sk x D", sort=False)
        .agg(calls=("#", "size"), kernels_per_call=("kernels", "median"), gpu_us=("GPU µs", "sum"),
             main_kernel=("main kernel", "first")).round(1))
reveal(guess_timesformer_share, round(share["h100_timesformer"], 3), "attention's share of TimeSformer's step")
longest = timesformer.calls[int(calls["GPU µs"].idxmax())]
display(longest.kernels.assign(kernel=longest.kernels["name"].map(short_kernel_name))[["kernel", "op", "dur_us"]]
        .rename(columns={"dur_us": "GPU µs"}).round(1).reset_index(drop=True))
for key in ("h100_timesformer", "h100_vit"):
    say(TRACELENS[key].credit(traces[key]))

# %% [markdown]
# Two kinds of calls, as many of each: the short ones of 8 tokens cost little; the long ones
# of 3137 tokens are almost all of it. The second table is the longest call's kernels in
# order: a copy of `q` and one of `k` transposed (`aten::matmul` reshapes 4-D inputs for a
# batched GEMM, and a view that is not contiguous gets copied), the GEMM for the scores, the
# scale (`aten::mul`) as a kernel of its own, the softmax, a copy of `v`, and the GEMM with
# `v`.

# %%
assert longest.batch_heads and longest.sq and longest.sk, "a hand-written call is found by its shapes"
scores_gb = longest.batch_heads * longest.sq * longest.sk * 2 / 1e9   # bfloat16 scores, 2 bytes each
softmax_us = float(longest.kernels.loc[longest.kernels["op"] == "aten::_softmax", "dur_us"].sum())
rows = ["device", "attention calls", "kernels per call", "main kernel", "attention's share of the step (%)"]
display(pd.DataFrame({"TimeSformer (hand-written)": timesformer.summary(), "ViT (SDPA)": vit.summary()}).loc[rows])
lesson(all(c.how == "hand-written" and len(c.kernels) > 1 for c in timesformer.calls),
       "TimeSformer's attention calls are hand-written, several kernels each", f"{len(timesformer.calls)} calls")
lesson(all(c.how == "fused" and len(c.kernels) == 1 for c in vit.calls),
       "ViT's attention calls are fused: one kernel each", f"{len(vit.calls)} calls")
lesson(share["h100_timesformer"] > 0.5 > share["h100_vit"],
       "hand-written attention is most of TimeSformer's step; fused attention is a small part of ViT's",
       f"{100 * share['h100_timesformer']:.1f}% against {100 * share['h100_vit']:.1f}%")
lesson(softmax_us == longest.kernels["dur_us"].max(),
       "the softmax is the longest kernel of the longest hand-written call", f"{softmax_us:.0f} µs")
glue("ts_share", 100 * share["h100_timesformer"])
glue("vit_share", 100 * share["h100_vit"])
glue("ts_scores_gb", scores_gb)
glue("ts_softmax_ms", softmax_us / 1e3)
glue("ts_call_ms", longest.gpu_us / 1e3)
glue("vit_step_ms", vit.step_gpu_us / 1e3)

# %% [markdown]
# Attention is {glue:text}`ts_share:.0f`% of TimeSformer's step and {glue:text}`vit_share:.0f`%
# of ViT's. The long calls are where the hand-written version pays: each one's scores,
# B·H x 3137 x 3137 in bfloat16, are {glue:text}`ts_scores_gb:.1f` GB, written by the first
# GEMM, read and written again by the scale and by the softmax, read by the second GEMM. The
# softmax kernel alone took {glue:text}`ts_softmax_ms:.1f` ms of the call's
# {glue:text}`ts_call_ms:.1f` ms, several times ViT's whole step
# ({glue:text}`vit_step_ms:.1f` ms). This is chapter 1's trace at a real model's scale: a
# fused kernel (chapters 3b, 4 and 5) never writes the scores to memory at all. The
# sequences are not causal here, so the fused call would do every score, the same FLOPs,
# without the four passes over gigabytes.
#
# The same reading on every step these traces hold, both GPUs:

# %%
#| caption: Attention's share of one step (red, with its percentage) and where the rest of the GPU time goes, by kind of kernel, for four Hugging Face models on an H100 and an MI300X. TimeSformer's hand-written attention is most of its step on both GPUs; in the models that call SDPA it is a minority, and GEMMs take the largest part.
#| alt: Horizontal stacked bars, one per model and GPU, from 0 to 100 percent. Qwen1.5-0.5B about 9 percent attention on the H100 and 14 on the MI300X, the rest GEMM, elementwise and copies; TimeSformer about 85 and 82 percent attention; ViT about 10 and 22 percent; BERT-small on the H100 about 12 percent, the rest mostly GEMM.
models = {"qwen": "Qwen1.5-0.5B", "timesformer": "TimeSformer", "vit": "ViT", "bert": "BERT-small"}
labels = {key: f"{models[key.split('_')[1]]}, {gpus[key]}" for key in shown}
share_table = breakdown.shares({labels[key]: reports[key] for key in shown})
figure = breakdown.share_bars(share_table, title="Attention's share of one step, and the rest by kind")
for key in shown:
    say(TRACELENS[key].credit(traces[key]))
display(figure)

# %%
lesson(all(share_table.loc[labels[k], "attention"] > 0.5 for k in shown if "timesformer" in k)
       and all(share_table.loc[labels[k], "attention"] < 0.5 for k in shown if "timesformer" not in k),
       "on both GPUs, attention is most of the step only where it is written by hand",
       str(share_table["attention"].round(3).to_dict()))
lesson(all(share_table.loc[labels[k], "gemm"] > share_table.loc[labels[k], "attention"]
           for k in shown if "timesformer" not in k),
       "where attention is fused, GEMMs take more of the step than attention", "")
glue("bert_share", 100 * share["h100_bert"])

# %% [markdown]
# Where attention is fused it is a tenth to a fifth of the step at these sizes, and the GEMMs
# of the projections and MLPs take more. Chapter 8 computed the same split for one block from
# FLOPs: attention's share grows with the sequence, and these are short ones (Qwen's 559
# tokens, BERT's 141). Between the vendors, compare shares with care: each bar is a share of
# its own GPU's step, so a kernel that is slower on one GPU raises its share there even if
# nothing else changed.
#
# ## On a trace of your own
#
# Everything above is one function and one command. From a shell, on any Kineto trace (a
# `.json` or `.json.gz` that `torch.profiler` exported), from either vendor:
#
# ```
# python -m kernels.trace.attention TRACE [--step N] [--json]
# ```
#
# `--step N` reads `ProfilerStep#N` (by default the first profiler step; a trace without
# steps is read whole), `--json` prints one JSON object instead of the table. Here it is on
# BERT-small on the H100, a step not read so far:

# %%
bert_path = root() / TRACELENS["h100_bert"].file
exit_code = attention.main([str(bert_path)])
say(TRACELENS["h100_bert"].credit(traces["h100_bert"]))
bert = reports["h100_bert"]
lesson(exit_code == 0 and len(bert.calls) > 0 and all(c.how == "fused" and c.causal is False for c in bert.calls),
       "BERT's attention calls are fused and not causal: an encoder lets every token see every other",
       f"{len(bert.calls)} calls")

# %% [markdown]
# BERT is an encoder: its SDPA calls are not causal, so each counts its full FLOPs, and at
# 141 tokens they are tiny. Attention is {glue:text}`bert_share:.0f`% of that step.
#
# To record a trace of your own model, profile a few steps with a schedule, and record the
# shapes: `find_attention` reads the sizes of each call from the recorded input shapes (and
# whether it is causal from its recorded arguments, which come with them); without them it
# still finds the calls but cannot count their FLOPs. On a GPU:
#
# ```python
# from torch.profiler import ProfilerActivity, profile, schedule
#
# with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],   # CUDA covers ROCm too
#              schedule=schedule(wait=1, warmup=1, active=1),
#              record_shapes=True) as prof:
#     for _ in range(3):
#         model(**inputs)
#         torch.cuda.synchronize()
#         prof.step()
# prof.export_chrome_trace("my_model.json")
# ```
#
# then `python -m kernels.trace.attention my_model.json`. The step it recorded is the third,
# `ProfilerStep#2`, the first in the file. Here is what `record_shapes` changes, on this
# course's transformer block (chapter 8), profiled on this page's device with and without it:

# %%
block = Block(heads * head_dim, heads, attention="sdpa_flash").to(device, dtype).eval()
x = torch.randn(batch, seq, heads * head_dim, device=device, dtype=dtype)
own = {shapes: find_attention(record.profile(block, x, label="block", wait=0, warmup=1, active=1, record_shapes=shapes,
                                             trace_dir=trace_dir, trace_name=f"block_shapes_{shapes}").step())
       for shapes in (True, False)}
display(pd.concat({f"record_shapes={s}": r.table()[["how", "B·H x Sq x Sk x D", "causal", "GFLOP", "GPU µs"]]
                   for s, r in own.items()}))
with_shapes, without = own[True].calls[0], own[False].calls[0]
lesson(with_shapes.batch_heads == batch * heads and with_shapes.sq == seq and with_shapes.flops is not None,
       "with record_shapes the call's sizes and FLOPs are read from the trace", str(with_shapes.shapes))
lesson(len(own[False].calls) == len(own[True].calls) and without.flops is without.batch_heads is without.causal is None,
       "without record_shapes the call is still found, but its sizes, causality and FLOPs are unknown")

# %% [markdown]
# On the CPU that builds this book the block has no GPU work, so the command, which reads
# GPU kernels, would refuse its trace; `find_attention` reads the CPU ops all the same. Run on
# a GPU, the same cell records the kernels too, and the table fills its GPU time.
#
# ## What to remember
#
# - `find_attention(step)` (or `python -m kernels.trace.attention TRACE`) finds attention in a
#   model's step however it was written: a fused op and the kernel it launched, a
#   hand-written `matmul -> softmax -> matmul`, or attention kernels replayed with no op.
# - One model on two vendors runs the same calls under different kernel names
#   (`flash_fwd_kernel`, `attn_fwd`); the CUDA trace records the kernel's registers, shared
#   memory and occupancy, the ROCm trace only its grid and block.
# - Fused attention was a tenth to a fifth of these models' steps; hand-written attention was
#   most of TimeSformer's, its softmax over gigabytes of scores the longest kernel.
# - Before optimising attention in a model, read its share: in a short prefill the GEMMs and
#   the eager elementwise ops take more.
# - Record with `record_shapes=True`, or the calls have no sizes and no FLOPs.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/12_real_models.ipynb), with automatic checks, hints and hidden solutions.

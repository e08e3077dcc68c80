# %% [markdown]
# # 12. Attention in a real model's trace
#
# In a real model attention is one layer among many, written by someone else, run on whichever
# GPU the job landed on. This chapter reads Hugging Face models' traces that others recorded: one
# language model on an NVIDIA H100 and an AMD MI300X, and a video model whose attention is written
# by hand beside an image model that calls [SDPA](glossary.md#sdpa).
#
# **You will learn to:**
#
# - find every attention call in a model's step, fused or hand-written, with `find_attention`;
# - compare one model's attention on two vendors (the [kernel](glossary.md#kernel), its time and
#   [TFLOP/s](glossary.md#flops), what each trace records) and place each call on its roofline;
# - tell hand-written attention (a [GEMM](glossary.md#gemm), a scale, a softmax, a GEMM) from a
#   fused kernel, and see what it costs a model;
# - split a step's GPU time into attention and the rest;
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
import contextlib
import io
import statistics

import pandas as pd
import torch

from kernels.attention.block import Block
from kernels.book import ch12_real_models as ch12
from kernels.book.timesformer import timesformer_input
from kernels.borrowed import TRACELENS, traces_box
from kernels.notebook import glue_all, lesson, readable, reveal, setup
from kernels.trace import attention, breakdown, record
from kernels.trace.attention import find_attention, short_kernel_name
from kernels.trace.side_by_side import side_by_side
from matplotlib.figure import Figure

device, dtype = setup(device, dtype)
reports = {ch12.SHORT[key]: find_attention(TRACELENS[key].step()) for key in ch12.SHORT}

# %% tags=["remove-input"]
traces_box({short: TRACELENS[key] for key, short in ch12.SHORT.items()})

# %% [markdown]
# Each trace is one [profiler step](glossary.md#profiler-step) of a model in bfloat16, recorded
# with shapes. `find_attention(step)` returns one `AttentionCall` per attention forward, found by
# its op (SDPA, down to the kernel that ran), by kernel name when no op launched it, or as a
# hand-written `matmul -> softmax -> matmul` chain matched by shapes.
#
# ## One model, two vendors
#
# Qwen1.5-0.5B (24 layers, 16 heads of 64) ran the same forward on both GPUs: 16 sequences of 559
# tokens, causal attention through SDPA. Which GPU's attention kernel takes less time per call?

# %%
guess_faster = "MI300X"  # edit me: "H100" or "MI300X"

# %%
h100, mi300x = reports["H100 Qwen"], reports["MI300X Qwen"]
matched = side_by_side(h100, mi300x)               # the two steps' calls, matched by shape
summaries = pd.DataFrame({"H100 Qwen": h100.summary(), "MI300X Qwen": mi300x.summary()})

# %% tags=["remove-input"]
display(summaries.drop(["device", "attention's share of the step (%)"]))   # the share is the next question's answer
ratio = matched.matched[0].as_dict()["time_ratio_b_over_a"] if len(matched.matched) == 1 else None
assert ratio is not None, "the two Qwen steps share one shape of call"
faster, slower = ("H100", "MI300X") if ratio > 1 else ("MI300X", "H100")
print(f"You guessed the {guess_faster}; per call, the faster kernel ran on the {faster}.")
call_shapes = [{(c.batch_heads, c.sq, c.sk, c.d, c.causal) for c in r.calls} for r in (h100, mi300x)]
lesson(len(h100.calls) == len(mi300x.calls) and call_shapes[0] == call_shapes[1] and len(call_shapes[0]) == 1
       and len(matched.groups) == 1,
       "both GPUs run the same calls: one per layer, one shape", ch12.calls_text(h100.calls))
mean_us = {name: sum(c.gpu_us for c in r.calls) / len(r.calls) for name, r in (("H100", h100), ("MI300X", mi300x))}
median_us = {name: statistics.median(c.gpu_us for c in r.calls) for name, r in (("H100", h100), ("MI300X", mi300x))}
median_ratio = median_us[slower] / median_us[faster]
lesson(median_ratio > 1 and abs(ratio - mean_us["MI300X"] / mean_us["H100"]) < 1e-9,
       f"matched by shape, the {slower} call takes {median_ratio:.2f} times the {faster}'s median time",
       f"{median_us[slower]:.1f} against {median_us[faster]:.1f} µs")
kernel_names = summaries.loc["main kernel"]   # each side's distinct main kernels, joined by ", "
lesson(kernel_names.nunique() == 2 and not kernel_names.str.contains(", ").any(),
       "each vendor runs its own attention kernel", ", ".join(kernel_names))
recorded = summaries.loc[["grid", "block", "registers per thread", "shared memory (KiB)", "occupancy (%)"]] != "not recorded"
lesson(recorded["H100 Qwen"].all() and recorded["MI300X Qwen"].tolist() == [True, True, False, False, False],
       "the ROCm trace records grid and block only; the CUDA trace adds registers, shared memory, occupancy")
peak_pct = summaries.loc["% of dense 16-bit peak (median)"].astype(float)
lesson(bool((peak_pct < 10).all()), "neither kernel reaches a tenth of its datasheet peak",
       ", ".join(f"{p:.1f}%" for p in peak_pct))
glue_all(qwen_calls=len(h100.calls), faster_gpu=faster, slower_gpu=slower, sbs_ratio=ratio,
         mi300x_kernels_per_call=mi300x.summary()["kernels per call"])

# %% [markdown]
# - **The names differ, the job does not.** The H100 runs `flash_fwd_kernel`, the
#   FlashAttention-2 kernel PyTorch ships (chapter 3b); the MI300X runs `attn_fwd`, AOTriton's
#   (Triton compiled ahead of time), behind the same SDPA call. Search for the op, then the kernel
#   it launched, not for "flash". Each MI300X call launched {glue:text}`mi300x_kernels_per_call`
#   kernels: `attn_fwd` and a small fill (`aten::zeros`).
# - **Far below peak** (the `% of dense 16-bit peak` row): FLOPs
#   $2 \cdot B \cdot H \cdot S_q \cdot S_k \cdot (D + D_v)$, halved for causal, against the
#   datasheet figures of `kernels.hw.devices`.
# - **Different footprints.** The CUDA trace carries [registers](glossary.md#registers) per
#   thread, [shared memory](glossary.md#shared-memory) and [Kineto's](glossary.md#kineto)
#   [occupancy](glossary.md#occupancy) estimate; on an AMD GPU occupancy must come from elsewhere
#   (the compiler's report, `rocprof`).
#
# Held back by memory or by arithmetic? `roof_table` puts each call under its GPU's
# [roofline](glossary.md#roofline): FLOPs over the bytes of Q, K, V and O moved once, against the
# ridge where the two roofs meet.

# %%
roof_tables = {"H100 Qwen": h100.roof_table(), "MI300X Qwen": mi300x.roof_table()}

# %% tags=["remove-input"]
display(pd.concat({name: table.drop(columns="kernel").head(1) for name, table in roof_tables.items()},
                  names=["first call of", "#"]))   # the kernels are named above
roofs = {name: ch12.placed_calls(reports[name]) for name in ("H100 Qwen", "MI300X Qwen")}
ridges = {name: found[0].ridge for name, found in roofs.items()}   # the datasheet's, as each Roof carries it
qwen_intensity = roofs["H100 Qwen"][0].intensity
lesson(all(r.bound == "memory" and r.intensity == qwen_intensity < ridges[name] for name in roofs for r in roofs[name]),
       "every Qwen call is memory-bound on both GPUs",
       f"{qwen_intensity:.1f} FLOP/byte, ridges {ridges['H100 Qwen']:.0f} and {ridges['MI300X Qwen']:.0f}")
roof_pct = {name: 100 * max(r.share for r in found) for name, found in roofs.items()}
lesson(all(pct < 25 for pct in roof_pct.values()), "yet no call reaches a quarter of its memory roof",
       "at most " + ", ".join(f"{pct:.1f}%" for pct in roof_pct.values()))
call_us = {name: [c.gpu_us for c in reports[name].calls] for name in roofs}
glue_all(qwen_intensity=qwen_intensity, h100_ridge=ridges["H100 Qwen"], mi300x_ridge=ridges["MI300X Qwen"],
         h100_roof_pct=roof_pct["H100 Qwen"], mi300x_roof_pct=roof_pct["MI300X Qwen"],
         h100_first_us=call_us["H100 Qwen"][0], mi300x_first_us=call_us["MI300X Qwen"][0],
         h100_mean_us=mean_us["H100"], mi300x_mean_us=mean_us["MI300X"],
         mi300x_min_us=min(call_us["MI300X Qwen"]), mi300x_max_us=max(call_us["MI300X Qwen"]))

# %% [markdown]
# The table shows each step's first call; the checks read all of them. Memory-bound yet far under
# that roof: at 559 tokens a block of 128 queries walks at most 559 keys, little work against the
# fixed cost of loading its queries and writing its output. One step each, different torch versions: not a
# benchmark of the two GPUs, but the same reading on either vendor.
#
# ## Attention's share of the step, and where the rest goes
#
# Chapter 8 split the H100 step by kind and found attention a small part of it. The MI300X ran the
# same prefill with other kernels and another torch: what share of *its* step's GPU time is
# attention?

# %%
guess_qwen_share = 0.5  # edit me: a fraction of the MI300X step's GPU time, 0 to 1

# %%
rest = breakdown.rest_by_op(h100, top=6)           # the ops behind the rest of the H100 step

# %% tags=["remove-input"]
display(ch12.rest_in_percent(rest))
by_kind = breakdown.shares({name: reports[name] for name in ("H100 Qwen", "MI300X Qwen")})   # fractions
share = ch12.attention_shares(reports)
reveal(guess_qwen_share, round(share["MI300X Qwen"], 3), "attention's share of the MI300X Qwen step")
lesson(share["H100 Qwen"] < 0.25 and share["MI300X Qwen"] < 0.25,
       "attention is under a quarter of the Qwen step on both GPUs",
       f"{100 * share['H100 Qwen']:.1f}%, {100 * share['MI300X Qwen']:.1f}%")
lesson(all(by_kind.loc[name, "gemm"] > by_kind.loc[name, "attention"] for name in by_kind.index),
       "GEMMs take more of the Qwen step than attention on both GPUs",
       ", ".join(f"{100 * by_kind.loc[name, 'gemm']:.1f}%" for name in by_kind.index))
qwen_largest = ch12.largest_kind(by_kind)
lesson(qwen_largest["H100 Qwen"] == "elementwise" and by_kind.loc["H100 Qwen", "elementwise"] > by_kind.loc["H100 Qwen", "gemm"],
       "on the H100 the Qwen step's largest kind is elementwise, not GEMM",
       f"{100 * by_kind.loc['H100 Qwen', 'elementwise']:.1f}% against {100 * by_kind.loc['H100 Qwen', 'gemm']:.1f}%")
glue_all(qwen_h100_share=100 * share["H100 Qwen"], qwen_mi300x_share=100 * share["MI300X Qwen"],
         qwen_h100_elementwise=100 * by_kind.loc["H100 Qwen", "elementwise"],
         qwen_h100_gemm=100 * by_kind.loc["H100 Qwen", "gemm"], qwen_h100_copy=100 * by_kind.loc["H100 Qwen", "copy"],
         qwen_mi300x_gemm=100 * by_kind.loc["MI300X Qwen", "gemm"],
         qwen_elementwise_copy=100 * (by_kind.loc["H100 Qwen", "elementwise"] + by_kind.loc["H100 Qwen", "copy"]),
         qwen_mi300x_elementwise_copy=100 * (by_kind.loc["MI300X Qwen", "elementwise"] + by_kind.loc["MI300X Qwen", "copy"]))

# %% [markdown]
# A kernel's kind is read from its name (`breakdown.time_by_kind`, as in chapter 8; ROCm's
# `Cijk_*` GEMMs count as GEMMs). The table names the ops behind the H100 step: the innermost op
# that launched each kernel, how many kernels it launched (cuBLAS's memset beside each GEMM
# included, chapter 8), its % of the step.
#
# - **GEMMs**: `aten::mm` and `aten::addmm`, the Q, K, V and output projections and the MLP; the
#   largest kind on the MI300X.
# - **Elementwise and copies**, {glue:text}`qwen_elementwise_copy:.0f`% of the H100 step
#   ({glue:text}`qwen_mi300x_elementwise_copy:.0f`% of the MI300X's): `aten::mul`, `aten::add`,
#   `aten::cat`, `aten::copy_`, the RMSNorm, rotary embedding and SiLU gate of eager Hugging Face
#   code, op by op, each a pass over the activations. Fusing such chains is chapter 7's
#   `torch.compile`; attention is not where this step's time would be won back.
#
# ## Hand-written attention beside a fused call
#
# TimeSformer, a video transformer in Hugging Face's library, writes attention by hand:
# `q @ k.transpose(-2, -1)`, a scale, `softmax`, `@ v`, twice a block: over time, in short
# sequences, and over space, in long ones. Chapter 1 read this trace's longest call; the ViT image
# classifier beside it calls SDPA on 197 tokens. What share of TimeSformer's step on the H100 is
# its hand-written attention?

# %%
guess_ts_share = 0.3  # edit me: a fraction of the TimeSformer step's GPU time, 0 to 1

# %%
timesformer, vit = reports["H100 TimeSformer"], reports["H100 ViT"]
calls = timesformer.table()                        # one row a call
longest = timesformer.calls[int(calls["GPU µs"].idxmax())]

# %% tags=["remove-input"]
display(ch12.calls_by_shape(calls), ch12.kernels_in_order(longest))
reveal(guess_ts_share, round(share["H100 TimeSformer"], 3), "attention's share of the H100 TimeSformer step")
assert longest.batch_heads and longest.sq and longest.sk, "a hand-written call is found by its shapes"
video = timesformer_input(timesformer.step)
lesson(video["frames"] == 128 and video["trained_frames"] == 8 and video["space_frames"] == 16
       and video["space_groups"] == video["trained_frames"] and longest.sq == video["space_tokens"]
       == 1 + video["space_frames"] * video["patches_per_frame"],
       "the 128 recorded frames are split into the checkpoint's 8 groups of 16: a space sequence is a CLS token and 16 frames' patches",
       f"1 + {video['space_frames']} x {video['patches_per_frame']} = {readable(longest.sq)} tokens")
glue_all(ts_frames=video["frames"], ts_trained=video["trained_frames"], ts_space_frames=video["space_frames"],
         ts_patches=video["patches_per_frame"], ts_tokens=readable(longest.sq), ts_own_tokens=1 + video["patches_per_frame"],
         ts_short=min(c.sq for c in timesformer.calls if c.sq is not None))

# %% [markdown]
# The short calls of {glue:text}`ts_short` tokens (time) cost little; the long ones of
# {glue:text}`ts_tokens` tokens (space) are almost all of it. That length comes from the input:
# {glue:text}`ts_frames` frames for a checkpoint trained on {glue:text}`ts_trained` (its time
# embedding interpolated), which Hugging Face's layer reshapes by the configuration's 8 frames, not
# the input's; on 8 frames a space sequence would hold {glue:text}`ts_own_tokens` tokens. The
# second table is the longest call's kernels in order: copies of `q` and of `k` transposed
# (`aten::matmul` copies a view that is not contiguous), the scores' GEMM, the scale, the softmax,
# a copy of `v`, the GEMM with `v`.

# %% tags=["remove-input"]
scores_gib = longest.batch_heads * longest.sq * longest.sk * 2 / 2**30   # bfloat16 scores, 2 bytes each
softmax_us = float(longest.kernels.loc[longest.kernels["op"] == "aten::_softmax", "dur_us"].sum())
passes = ch12.score_passes(longest, timesformer.step)
lesson(all(c.how == "hand-written" and len(c.kernels) > 1 for c in timesformer.calls),
       "TimeSformer's attention calls are hand-written, several kernels each", f"{len(timesformer.calls)} calls")
lesson(all(c.how == "fused" and len(c.kernels) == 1 for c in vit.calls),
       "ViT's attention calls are fused: one kernel each",
       f"{len(vit.calls)} calls of " + ", ".join(sorted({short_kernel_name(c.kernels["name"].iloc[0]) for c in vit.calls})))
lesson(share["H100 TimeSformer"] > 0.5 > share["H100 ViT"],
       "hand-written attention is most of TimeSformer's step, fused attention a small part of ViT's",
       f"{100 * share['H100 TimeSformer']:.1f}%, {100 * share['H100 ViT']:.1f}%")
lesson(softmax_us == longest.kernels["dur_us"].max() and 4.5 < softmax_us / vit.step_gpu_us < 5,
       "the softmax is the longest call's longest kernel, almost five times ViT's whole step",
       f"{softmax_us / 1e3:.1f} ms against {vit.step_gpu_us / 1e3:.1f} ms")
lesson(passes["between"] == ["aten::mul", "aten::_softmax"] and passes["writes"] == passes["reads"] == 3,
       "the scores are written three times and read three times: GEMM, scale, softmax, GEMM")
glue_all(ts_share=100 * share["H100 TimeSformer"], vit_share=100 * share["H100 ViT"], ts_scores_gib=scores_gib,
         ts_softmax_ms=softmax_us / 1e3, ts_call_ms=longest.gpu_us / 1e3, vit_step_ms=vit.step_gpu_us / 1e3,
         ts_passes=passes["writes"] + passes["reads"])

# %% [markdown]
# A long call's scores, B·H x 3,137 x 3,137 in bfloat16, are {glue:text}`ts_scores_gib:.2f` GiB,
# written by the first GEMM, read and written by the scale and the softmax, read by the second
# GEMM; the softmax took {glue:text}`ts_softmax_ms:.1f` ms of the call's
# {glue:text}`ts_call_ms:.1f`. This is chapter 1's trace at a real model's scale: a fused kernel
# (chapters 3b, 4 and 5) would do the same FLOPs without the {glue:text}`ts_passes` passes over
# gigabytes of scores.
#
# The same reading on every step of the box (BERT's on the H100 only; each trace's download and
# Perfetto links are folded under the figure):

# %%
share_table = breakdown.shares(reports)
fig = breakdown.share_bars(share_table, ax=Figure(figsize=(4.4, 4.6)).add_subplot(),
                           title="Attention's share of one step")

# %% tags=["remove-input"]
#| caption: Attention's share of one step (red, with its percentage) and where the rest of the GPU time goes, by kind of kernel, for the seven traces of the box above (BERT on the H100 only). TimeSformer's hand-written attention (over its 128-frame input, which makes its space sequences 3,137 tokens long) is most of its step on both GPUs; in the models that call SDPA it is a minority, and the largest kind is GEMM everywhere but the H100 Qwen step, where elementwise kernels lead.
#| alt: Horizontal stacked bars, one per trace, from 0 to 100 percent. H100 Qwen about 9 percent attention, elementwise the largest part; MI300X Qwen about 14, GEMM the largest; TimeSformer, on its 128-frame input, about 85 and 82 percent attention; ViT about 10 and 22 percent, GEMM the largest; H100 BERT about 12 percent, the rest mostly GEMM.
ch12.legend_in_two_columns(fig)

# %% tags=["remove-input", "hide-output"]
# The seven borrowed traces, to open in Perfetto and click an attention kernel.
display(*ch12.trace_links(ch12.SHORT))

# %% tags=["remove-input"]
fused = [name for name in share_table.index if "TimeSformer" not in name]
largest = ch12.largest_kind(share_table)
lesson(all(share_table.loc[name, "attention"] > 0.5 for name in share_table.index if name not in fused)
       and all(share_table.loc[name, "attention"] < 0.5 for name in fused),
       "attention is most of a step only where it is written by hand",
       "hand-written " + ", ".join(f"{100 * share_table.loc[name, 'attention']:.1f}%" for name in share_table.index
                                  if name not in fused) + f"; fused at most {100 * share_table.loc[fused, 'attention'].max():.1f}%")
lesson(all(share_table.loc[name, "gemm"] > share_table.loc[name, "attention"] for name in fused),
       "where attention is fused, GEMMs take more of the step than attention")
lesson(set(largest[fused]) == {"gemm", "elementwise"} and [n for n in fused if largest[n] != "gemm"] == ["H100 Qwen"],
       "where attention is fused, GEMM is every step's largest kind but H100 Qwen's (elementwise)")
glue_all(fused_min=100 * share_table.loc[fused, "attention"].min(), fused_max=100 * share_table.loc[fused, "attention"].max(),
         bert_share=100 * share["H100 BERT"], bert_tokens=reports["H100 BERT"].calls[0].sq)

# %% [markdown]
# Where attention is fused it is {glue:text}`fused_min:.1f`% to {glue:text}`fused_max:.1f`% of the
# step: these sequences are short, and attention's share grows with length (chapter 8). Each bar
# is a share of its own GPU's step, so a kernel slower on one GPU raises its share there.
#
# ## On a trace of your own
#
# Everything above is one function and one command, on any Kineto trace of either vendor:
#
# ```
# python -m kernels.trace.attention TRACE [--step N] [--json]
# python -m kernels.trace.attention TRACE --capture CAPTURE_TRACE   # a serving engine's graph replay (ch. 10)
# python -m kernels.trace.attention A B                             # two traces side by side
# ```
#
# `--step N` reads `ProfilerStep#N` (by default the first; a trace without steps is read whole),
# `--json` prints JSON. In a notebook `%run -m` runs it; here on H100 BERT (the book's
# `data/borrowed/` holds the traces). Its report, folded, gives the GPU and its roofs, the step,
# then each call's kernel, shape, time, footprint and place on the roofline:

# %% tags=["hide-output"]
bert_trace = "data/borrowed/tracelens_h100_gaunernst_bert-small-uncased__1016001.json.gz"
%run -m kernels.trace.attention $bert_trace

# %% tags=["remove-input"]
bert = reports["H100 BERT"]
with contextlib.redirect_stdout(io.StringIO()):    # the command again, for its exit status
    exit_code = attention.main([str(ch12.trace_links({"h100_bert": "H100 BERT"})[0].path)])
lesson(exit_code == 0 and len(bert.calls) > 0 and all(c.how == "fused" and c.causal is False for c in bert.calls),
       "BERT's attention calls are fused and not causal: an encoder lets every token see every other",
       f"{len(bert.calls)} calls")

# %% [markdown]
# Not being causal, each call counts its full FLOPs; at {glue:text}`bert_tokens` tokens they are
# tiny, {glue:text}`bert_share:.0f`% of the step's GPU time. More of TraceLens's MI300X traces are in
# `tests/data/real_traces/tracelens/` (its README names each), such as a vLLM step with its capture
# trace:
#
# ```
# T=tests/data/real_traces/tracelens
# python -m kernels.trace.attention \
#     $T/tracelens_inference_vllm_prefilldecode_piecewise_graph_execution.json.gz \
#     --capture $T/tracelens_inference_vllm_prefilldecode_piecewise_capture_rank_0.json.gz
# ```
#
# To record your own model, profile a few steps with a schedule and `record_shapes=True`, which
# gives each call its sizes and causality (without them its FLOPs cannot be counted). On a GPU:
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
# then `python -m kernels.trace.attention my_model.json` reads `ProfilerStep#2`, the one recorded.
# What `record_shapes` changes, on chapter 8's block profiled on this page's device:

# %%
block = Block(heads * head_dim, heads, attention="sdpa_flash").to(device, dtype).eval()
x = torch.randn(batch, seq, heads * head_dim, device=device, dtype=dtype)
own = {}
for shapes in (True, False):                       # one step of the block, with and without shapes
    trace = record.profile(block, x, label="block", wait=0, warmup=1, active=1,
                           record_shapes=shapes, trace_dir=trace_dir,
                           trace_name=f"block_shapes_{shapes}")
    own[shapes] = find_attention(trace.step())

# %% tags=["remove-input"]
tables = {f"record_shapes={s}": r.table()[["how", "B·H x Sq x Sk x D", "causal", "GFLOP", "GPU µs"]]
          for s, r in own.items()}
display(ch12.shapes_table(tables))
with_shapes, without = own[True].calls[0], own[False].calls[0]
lesson(with_shapes.batch_heads == batch * heads and with_shapes.sq == seq and with_shapes.flops is not None,
       "with record_shapes the call's sizes and FLOPs are read from the trace", ch12.tensors_text(with_shapes.shapes))
lesson(len(own[False].calls) == len(own[True].calls) and without.flops is without.batch_heads is without.causal is None,
       "without record_shapes the call is still found, but its sizes, causality and FLOPs are unknown")

# %% [markdown]
# On a CPU the block has no GPU work ("none" above, and the command would refuse its trace);
# `find_attention` reads its ops all the same.
#
# ## What to remember
#
# - `find_attention(step)` (or `python -m kernels.trace.attention TRACE`) finds attention however
#   it was written: a fused op and its kernel, a hand-written `matmul -> softmax -> matmul`, or
#   kernels replayed with no op; `side_by_side(a, b)` matches two steps' calls by shape.
# - One model on two vendors runs the same calls under different kernel names; only the CUDA
#   trace records registers, shared memory and occupancy.
# - Fused attention was {glue:text}`fused_min:.1f`% to {glue:text}`fused_max:.1f`% of these steps,
#   less than the GEMMs; hand-written attention was most of TimeSformer's, its softmax over
#   gigabytes of scores the longest kernel. Read the share before optimising attention.
# - Record with `record_shapes=True`, or the calls have no sizes and no FLOPs.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/12_real_models.ipynb), with automatic checks, hints and hidden solutions.

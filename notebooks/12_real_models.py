# %% [markdown]
# # 12. Attention in a real model's trace
#
# In a real model attention is one layer among many, written by someone else, run on whichever
# GPU the job landed on. This chapter reads real Hugging Face models' traces that others recorded:
# one language model on an NVIDIA H100 and an AMD MI300X, a video model whose attention is written by
# hand beside an image model that calls [SDPA](glossary.md#sdpa), and the share of each step that
# attention takes. Last, the command that does all of this for a trace of your own.
#
# **You will learn to:**
#
# - find every attention call in a model's step, fused or hand-written, with
#   `kernels.trace.attention.find_attention`;
# - set one model's attention on two vendors side by side (the [kernel](glossary.md#kernel), its time,
#   its [TFLOP/s](glossary.md#flops), what each trace records) and place each call on its roofline;
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
import contextlib
import io

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
reports = {ch12.SHORT[key]: find_attention(TRACELENS[key].step()) for key in ch12.SHORT}   # by short name

# %% tags=["remove-input"]
traces_box({short: TRACELENS[key] for key, short in ch12.SHORT.items()})

# %% [markdown]
# Hugging Face models in bfloat16, one [profiler step](glossary.md#profiler-step) each, recorded
# with shapes, named by their short names from the box above. `find_attention(step)` returns an
# `AttentionReport`: one `AttentionCall` per attention forward, found by its op (SDPA and its
# backends, down to the kernel that ran), by kernel name when no op launched it, or as a
# hand-written `matmul -> softmax -> matmul` chain matched by shapes.
#
# ## One model, two vendors
#
# Qwen1.5-0.5B (24 layers, 16 heads of 64) ran the same forward on both GPUs, 16 sequences of 559
# tokens, causal attention through SDPA: FlashAttention-2 on the H100, a kernel of AMD's on the
# MI300X. Before looking: which GPU's attention kernel takes less time per call?

# %%
guess_faster = "MI300X"  # edit me: "H100" or "MI300X"

# %%
h100, mi300x = reports["H100 Qwen"], reports["MI300X Qwen"]
matched = side_by_side(h100, mi300x)               # calls matched by shape; A is the H100, B the MI300X
display(matched.table().T.set_axis(["A: H100 Qwen, B: MI300X Qwen"], axis=1))
summaries = pd.DataFrame({"H100 Qwen": h100.summary(), "MI300X Qwen": mi300x.summary()})
display(summaries.drop("attention's share of the step (%)").tail(6))   # the share of the step: later

# %% tags=["remove-input"]
ratio = matched.matched[0].as_dict()["time_ratio_b_over_a"] if len(matched.matched) == 1 else None
assert ratio is not None, "the two Qwen steps share one shape of call"
faster, slower = ("H100", "MI300X") if ratio > 1 else ("MI300X", "H100")
print(f"You guessed the {guess_faster}; per call, the faster kernel ran on the {faster}.")
shapes = [{(c.batch_heads, c.sq, c.sk, c.d, c.causal) for c in r.calls} for r in (h100, mi300x)]
lesson(len(h100.calls) == len(mi300x.calls) and shapes[0] == shapes[1] and len(shapes[0]) == 1 and len(matched.groups) == 1,
       "both vendors run the same attention calls: one per layer, all of one shape", ch12.calls_text(h100.calls))
mean_us = {name: sum(c.gpu_us for c in r.calls) / len(r.calls) for name, r in (("H100", h100), ("MI300X", mi300x))}
lesson(abs(ratio - mean_us["MI300X"] / mean_us["H100"]) < 1e-9,
       f"side by side, the {slower} call took {ratio:.2f} times as long as the {faster}'s: the ratio of their mean GPU times",
       f"{mean_us['MI300X']:.1f} µs against {mean_us['H100']:.1f} µs")
kernel_names = summaries.loc["main kernel"]   # each side's distinct main kernels, joined by ", "
lesson(kernel_names.nunique() == 2 and not kernel_names.str.contains(", ").any(),
       "each vendor runs one attention kernel of its own, a different one", ", ".join(kernel_names))
recorded = summaries.loc[["grid", "block", "registers per thread", "shared memory (KiB)", "occupancy (%)"]] != "not recorded"
lesson(recorded["H100 Qwen"].all() and recorded["MI300X Qwen"].tolist() == [True, True, False, False, False],
       "the CUDA trace records the kernel's registers, shared memory and occupancy; the ROCm trace its grid and block only")
peak_pct = summaries.loc["% of dense 16-bit peak (median)"].astype(float)
lesson(bool((peak_pct < 20).all()), "at 559 tokens neither kernel reaches a fifth of its GPU's datasheet peak",
       ", ".join(f"{p:.1f}%" for p in peak_pct))
glue_all(qwen_calls=len(h100.calls), faster_gpu=faster, slower_gpu=slower, sbs_ratio=ratio,
         mi300x_kernels_per_call=mi300x.summary()["kernels per call"])

# %% [markdown]
# Matched by shape, the {glue:text}`qwen_calls` calls of each step are alike, and the kernel on the
# {glue:text}`slower_gpu` took {glue:text}`sbs_ratio:.2f` times as long as the one on the
# {glue:text}`faster_gpu` (the ratio of the means, the last row; `summary()` gives medians).
# Three things to take from the tables:
#
# - **The names differ, the job does not.** The H100 runs `pytorch_flash::flash_fwd_kernel`,
#   the FlashAttention-2 kernel that PyTorch ships (chapter 3b); the MI300X runs `attn_fwd`,
#   AOTriton's kernel (Triton, compiled ahead of time), which PyTorch for ROCm runs behind the
#   same SDPA call: search for the op, then for the kernel it launched, not for "flash". Each
#   MI300X call launched {glue:text}`mi300x_kernels_per_call` kernels: `attn_fwd` and a small fill
#   (an `aten::zeros` inside `aten::_flash_attention_forward`).
# - **Far below peak, on both**: the `% of dense 16-bit peak` row, against the datasheet
#   figures of `kernels.hw.devices` (the TFLOP/s count $2 \cdot B \cdot H \cdot S_q \cdot S_k \cdot (D + D_v)$,
#   halved for causal).
# - **Each vendor's trace records a different footprint.** The CUDA trace carries the
#   kernel's [registers](glossary.md#registers) per thread, [shared memory](glossary.md#shared-memory) and [Kineto's](glossary.md#kineto) [occupancy](glossary.md#occupancy) estimate; the ROCm
#   trace carries the grid and the block, no more: occupancy on an AMD GPU has to come from
#   elsewhere (the compiler's report, `rocprof`).
#
# Is either call held back by memory or by arithmetic? `roof_table` puts each call under its GPU's
# [roofline](glossary.md#roofline): FLOPs over the bytes of Q, K, V and O moved once, against the
# ridge where the two roofs meet.

# %%
first_calls = {name: reports[name].roof_table().drop(columns="kernel").head(1)   # the kernels: above
               for name in ("H100 Qwen", "MI300X Qwen")}
pd.concat(first_calls, names=["first call of", "#"])

# %% tags=["remove-input"]
roofs = {name: ch12.placed_calls(reports[name]) for name in ("H100 Qwen", "MI300X Qwen")}
ridges = {name: found[0].ridge for name, found in roofs.items()}   # the datasheet's, as each Roof carries it
qwen_intensity = roofs["H100 Qwen"][0].intensity
lesson(all(r.bound == "memory" and r.intensity == qwen_intensity < ridges[name] for name in roofs for r in roofs[name]),
       "every Qwen call is memory-bound by the byte count, on both GPUs: the same FLOPs per byte, under either ridge",
       f"{qwen_intensity:.1f} FLOP/byte against {ridges['H100 Qwen']:.0f} (H100) and {ridges['MI300X Qwen']:.0f} (MI300X)")
roof_pct = {name: 100 * max(r.share for r in found) for name, found in roofs.items()}
lesson(all(pct < 25 for pct in roof_pct.values()), "yet no call reaches a quarter of its memory roof",
       ", ".join(f"{name}: at most {pct:.1f}%" for name, pct in roof_pct.items()))
call_us = {name: [c.gpu_us for c in reports[name].calls] for name in roofs}
glue_all(qwen_intensity=qwen_intensity, h100_ridge=ridges["H100 Qwen"], mi300x_ridge=ridges["MI300X Qwen"],
         h100_roof_pct=roof_pct["H100 Qwen"], mi300x_roof_pct=roof_pct["MI300X Qwen"],
         h100_first_us=call_us["H100 Qwen"][0], mi300x_first_us=call_us["MI300X Qwen"][0],
         h100_mean_us=mean_us["H100"], mi300x_mean_us=mean_us["MI300X"],
         mi300x_min_us=min(call_us["MI300X Qwen"]), mi300x_max_us=max(call_us["MI300X Qwen"]))

# %% [markdown]
# The table shows each step's first call (#0): {glue:text}`h100_first_us:.1f` µs on the H100, near
# its mean of {glue:text}`h100_mean_us:.1f`, and {glue:text}`mi300x_first_us:.1f` µs on the MI300X,
# whose calls ranged from {glue:text}`mi300x_min_us:.1f` to {glue:text}`mi300x_max_us:.1f` µs around a
# mean of {glue:text}`mi300x_mean_us:.1f`; the checks above read all of them.
#
# Memory-bound by this count, both: {glue:text}`qwen_intensity:.1f` FLOPs a byte, under the H100's
# ridge of {glue:text}`h100_ridge:.0f` and the MI300X's {glue:text}`mi300x_ridge:.0f`. Yet no call
# reached more than {glue:text}`h100_roof_pct:.0f`% (H100) or {glue:text}`mi300x_roof_pct:.0f`%
# (MI300X) of that roof: at 559 tokens a block of 128 queries walks at most 559 keys, little work
# against the fixed cost of loading its queries and writing its output. One step each, different
# torch versions: not a benchmark of the two GPUs, but the same reading on either vendor.
#
# ## Attention's share of the step, and where the rest goes
#
# A prefill of 16 x 559 tokens through 24 layers. Chapter 8 split the H100 step by kind and found
# attention a small part of it. The MI300X ran the same model on the same input with other
# kernels and another torch: before looking, what share of *its* step's GPU time is attention?

# %%
guess_qwen_share = 0.5  # edit me: a fraction of the MI300X step's GPU time, 0 to 1

# %%
by_kind = breakdown.shares({name: reports[name] for name in ("H100 Qwen", "MI300X Qwen")})   # fractions
rest = breakdown.rest_by_op(h100, top=6)           # the ops behind the rest of the H100 step

# %% tags=["remove-input"]
display(ch12.percent_by_kind(by_kind), ch12.rest_in_percent(rest))
share = ch12.attention_shares(reports)
reveal(guess_qwen_share, round(share["MI300X Qwen"], 3), "attention's share of the MI300X Qwen step")
lesson(share["H100 Qwen"] < 0.25 and share["MI300X Qwen"] < 0.25,
       "attention is under a quarter of the Qwen prefill's GPU time, on both GPUs",
       f"{100 * share['H100 Qwen']:.1f}% and {100 * share['MI300X Qwen']:.1f}%")
lesson(all(by_kind.loc[name, "gemm"] > by_kind.loc[name, "attention"] for name in by_kind.index),
       "the GEMMs of the projections and the MLP take more of the step than attention, on both GPUs",
       ", ".join(f"{name}: {100 * by_kind.loc[name, 'gemm']:.1f}% against {100 * by_kind.loc[name, 'attention']:.1f}%"
                 for name in by_kind.index))
qwen_largest = ch12.largest_kind(by_kind)
lesson(qwen_largest["H100 Qwen"] == "elementwise" and by_kind.loc["H100 Qwen", "elementwise"] > by_kind.loc["H100 Qwen", "gemm"],
       "on the H100 the largest kind of the Qwen step is elementwise kernels, not GEMMs",
       f"elementwise {100 * by_kind.loc['H100 Qwen', 'elementwise']:.1f}%, GEMM {100 * by_kind.loc['H100 Qwen', 'gemm']:.1f}%")
glue_all(qwen_h100_share=100 * share["H100 Qwen"], qwen_mi300x_share=100 * share["MI300X Qwen"],
         qwen_h100_elementwise=100 * by_kind.loc["H100 Qwen", "elementwise"],
         qwen_h100_gemm=100 * by_kind.loc["H100 Qwen", "gemm"], qwen_h100_copy=100 * by_kind.loc["H100 Qwen", "copy"],
         qwen_mi300x_gemm=100 * by_kind.loc["MI300X Qwen", "gemm"],
         qwen_elementwise_copy=100 * (by_kind.loc["H100 Qwen", "elementwise"] + by_kind.loc["H100 Qwen", "copy"]),
         qwen_mi300x_elementwise_copy=100 * (by_kind.loc["MI300X Qwen", "elementwise"] + by_kind.loc["MI300X Qwen", "copy"]))

# %% [markdown]
# Attention took {glue:text}`qwen_h100_share:.1f`% of the step on the H100 and
# {glue:text}`qwen_mi300x_share:.1f`% on the MI300X. The rest, by kind of kernel
# (`breakdown.time_by_kind`; a kernel's kind is read from its name, as in chapter 3b, with
# the ROCm GEMM names `Cijk_*` counted as GEMMs):
#
# - **GEMMs**: `aten::mm` and `aten::addmm`, the Q, K, V and output projections and the MLP:
#   {glue:text}`qwen_h100_gemm:.1f`% of the H100 step and {glue:text}`qwen_mi300x_gemm:.1f`% of
#   the MI300X's, more than attention on both, and the largest kind on the MI300X.
# - **Elementwise and copies**, {glue:text}`qwen_elementwise_copy:.0f`% of the H100 step
#   ({glue:text}`qwen_mi300x_elementwise_copy:.0f`% of the MI300X's)
#   together: on the H100, elementwise kernels alone take {glue:text}`qwen_h100_elementwise:.1f`%,
#   more than the GEMMs, and copies {glue:text}`qwen_h100_copy:.1f`%: `aten::mul`, `aten::add`,
#   `aten::pow`, `aten::silu`, `aten::cat`, `aten::copy_`, the RMSNorm, rotary embedding and SiLU
#   gate of eager Hugging Face code, op by op, each a pass over the activations, with casts to
#   float32 around the norms and `.contiguous()` copies. Fusing such chains is chapter 7's
#   `torch.compile`; attention is not where this step's time would be won back.
#
# The second table names the ops behind the rest on the H100: the innermost op that launched each
# kernel, how many kernels it launched (a GEMM's count includes the memsets it launched too, which
# chapter 8 counts apart), and its % of the step.
#
# ## Hand-written attention beside a fused call
#
# TimeSformer is a video transformer from Hugging Face's library whose attention is written
# by hand: `q @ k.transpose(-2, -1)`, a scale, `softmax`, `@ v`. Each block attends twice, as
# its divided space-time attention does: once over time, in short sequences, and once over
# space, in long ones. Chapter 1 read this trace's longest call and the share of the step that
# attention took. The ViT image classifier next to it calls SDPA, one fused kernel a call, on
# 197 tokens: before looking, what share of the ViT's step on the H100 is attention?

# %%
guess_vit_share = 0.3  # edit me: a fraction of the ViT step's GPU time, 0 to 1

# %%
timesformer, vit = reports["H100 TimeSformer"], reports["H100 ViT"]
calls = timesformer.table()
display(calls.groupby("B·H x Sq x Sk x D", sort=False)
        .agg(**{"calls": ("#", "size"), "kernels a call": ("kernels", "max"),
                "GPU µs, all calls": ("GPU µs", "sum")}))
longest = timesformer.calls[int(calls["GPU µs"].idxmax())]
in_order = longest.kernels.assign(kernel=longest.kernels["name"].map(short_kernel_name))
display(in_order[["kernel", "op", "dur_us"]].rename(columns={"dur_us": "GPU µs"}).reset_index(drop=True))

# %% tags=["remove-input"]
reveal(guess_vit_share, round(share["H100 ViT"], 3), "attention's share of the H100 ViT step")
assert longest.batch_heads and longest.sq and longest.sk, "a hand-written call is found by its shapes"
video = timesformer_input(timesformer.step)
lesson(video["frames"] == 128 and video["trained_frames"] == 8 and video["space_frames"] == 16
       and video["space_groups"] == video["trained_frames"] and longest.sq == video["space_tokens"]
       == 1 + video["space_frames"] * video["patches_per_frame"],
       "the recorded input has 128 frames for a checkpoint trained on 8; the layer groups the frames by the "
       "checkpoint's 8, so each space sequence is one CLS token and 16 frames' patches",
       f"1 + {video['space_frames']} x {video['patches_per_frame']} = {readable(longest.sq)} tokens, "
       f"{video['space_groups']} such sequences")
glue_all(ts_frames=video["frames"], ts_trained=video["trained_frames"], ts_space_frames=video["space_frames"],
         ts_patches=video["patches_per_frame"], ts_tokens=readable(longest.sq), ts_own_tokens=1 + video["patches_per_frame"],
         ts_short=min(c.sq for c in timesformer.calls if c.sq is not None))

# %% [markdown]
# The short calls of {glue:text}`ts_short` tokens (time) cost little; the long ones of
# {glue:text}`ts_tokens` tokens (space) are almost all of it. That length comes from the input: the
# recorded video has {glue:text}`ts_frames` frames for a checkpoint trained on
# {glue:text}`ts_trained` (its time embedding is interpolated). Hugging Face's layer reshapes the
# tokens by the configuration's 8 frames, not the input's, so the 128 frames become 8 groups of
# {glue:text}`ts_space_frames`: each "space" sequence holds one CLS token and the
# {glue:text}`ts_patches` patches of {glue:text}`ts_space_frames` frames. On 8 frames it would
# hold {glue:text}`ts_own_tokens` tokens. The second table is the longest call's
# kernels in order: copies of `q` and of `k` transposed (`aten::matmul` copies a view that is not
# contiguous), the scores' GEMM, the scale (`aten::mul`), the softmax, a copy of `v`, the GEMM with `v`.

# %%
rows = ["attention calls", "kernels per call", "attention's share of the step (%)"]
pd.DataFrame({"H100 TimeSformer": timesformer.summary(), "H100 ViT": vit.summary()}).loc[rows]

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
       "hand-written attention is most of TimeSformer's step; fused attention is a small part of ViT's",
       f"{100 * share['H100 TimeSformer']:.1f}% against {100 * share['H100 ViT']:.1f}%")
lesson(softmax_us == longest.kernels["dur_us"].max() and softmax_us > 2 * vit.step_gpu_us,
       "the softmax is the longest kernel of the longest hand-written call, several times ViT's whole step",
       f"{softmax_us / 1e3:.1f} ms against {vit.step_gpu_us / 1e3:.1f} ms")
lesson(passes["between"] == ["aten::mul", "aten::_softmax"] and passes["writes"] == passes["reads"] == 3,
       "the score tensor is written three times and read three times: GEMM, scale, softmax, GEMM",
       " -> ".join(passes["between"]))
glue_all(ts_share=100 * share["H100 TimeSformer"], vit_share=100 * share["H100 ViT"], ts_scores_gib=scores_gib,
         ts_softmax_ms=softmax_us / 1e3, ts_call_ms=longest.gpu_us / 1e3, vit_step_ms=vit.step_gpu_us / 1e3,
         ts_passes=passes["writes"] + passes["reads"])

# %% [markdown]
# Attention is {glue:text}`ts_share:.0f`% of TimeSformer's step on that 128-frame input (its
# 3,137-token space sequences come from it) and {glue:text}`vit_share:.0f`% of ViT's. A long
# call's scores, B·H x 3,137 x 3,137 in bfloat16, are
# {glue:text}`ts_scores_gib:.2f` GiB, written by the first GEMM, read and written again by the
# scale and by the softmax, read by the second GEMM. The softmax alone took
# {glue:text}`ts_softmax_ms:.1f` ms of the call's {glue:text}`ts_call_ms:.1f` ms, several times
# ViT's whole step ({glue:text}`vit_step_ms:.1f` ms). This is chapter 1's trace at a real model's
# scale: a fused kernel (chapters 3b, 4 and 5) would do the same FLOPs (these sequences are not
# causal) without the {glue:text}`ts_passes` passes over gigabytes of scores.
#
# The same reading on every step these traces hold (BERT's on the H100 only):

# %%
share_table = breakdown.shares(reports)
ax = Figure(figsize=(4.4, 4.6)).add_subplot()      # narrow, so its labels stay legible on a phone
fig = breakdown.share_bars(share_table, ax=ax, title="Attention's share of one step")

# %% tags=["remove-input"]
#| caption: Attention's share of one step (red, with its percentage) and where the rest of the GPU time goes, by kind of kernel, for the seven traces of the box above (BERT on the H100 only). TimeSformer's hand-written attention (over its 128-frame input, which makes its space sequences 3,137 tokens long) is most of its step on both GPUs; in the models that call SDPA it is a minority, and the largest kind is GEMM everywhere but the H100 Qwen step, where elementwise kernels lead.
#| alt: Horizontal stacked bars, one per trace, from 0 to 100 percent. H100 Qwen about 9 percent attention, elementwise the largest part; MI300X Qwen about 14, GEMM the largest; TimeSformer, on its 128-frame input, about 85 and 82 percent attention; ViT about 10 and 22 percent, GEMM the largest; H100 BERT about 12 percent, the rest mostly GEMM.
ch12.legend_in_two_columns(fig)

# %% tags=["remove-input"]
# The seven borrowed traces, to open in Perfetto and click an attention kernel.
display(*ch12.trace_links(ch12.SHORT))

# %% tags=["remove-input"]
fused = [name for name in share_table.index if "TimeSformer" not in name]
largest = ch12.largest_kind(share_table)
lesson(all(share_table.loc[name, "attention"] > 0.5 for name in share_table.index if name not in fused)
       and all(share_table.loc[name, "attention"] < 0.5 for name in fused),
       "across the seven steps, attention is most of a step only where it is written by hand",
       ", ".join(f"{name} {100 * share_table.loc[name, 'attention']:.1f}%" for name in share_table.index))
lesson(all(share_table.loc[name, "gemm"] > share_table.loc[name, "attention"] for name in fused),
       "where attention is fused, GEMMs take more of the step than attention")
lesson(set(largest[fused]) == {"gemm", "elementwise"} and [n for n in fused if largest[n] != "gemm"] == ["H100 Qwen"],
       "where attention is fused, GEMM is the largest kind of every step but the H100 Qwen one (elementwise)",
       ", ".join(f"{name}: {largest[name]}" for name in fused))
glue_all(fused_min=100 * share_table.loc[fused, "attention"].min(), fused_max=100 * share_table.loc[fused, "attention"].max(),
         bert_share=100 * share["H100 BERT"])

# %% [markdown]
# Where attention is fused it is {glue:text}`fused_min:.1f`% to {glue:text}`fused_max:.1f`% of the
# step at these sizes, and the GEMMs take more; attention's share grows with the sequence (chapter
# 8), and these are short ones. Compare shares between vendors with care: each bar is a share of
# its own GPU's step, so a kernel slower on one GPU raises its share there.
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
# `--json` prints one JSON object. Here it is on H100 BERT, a step whose calls this page has not
# listed yet; in a notebook,
# `%run -m` runs the same command (the book's folder holds the borrowed traces in `data/borrowed/`):

# %%
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
# BERT is an encoder: its SDPA calls are not causal, so each counts its full FLOPs, and at
# 141 tokens they are tiny. Attention is {glue:text}`bert_share:.0f`% of that step.
#
# To try it further, the repository's `tests/data/real_traces/tracelens/` holds more of TraceLens's
# MI300X traces (its README names each): a vLLM step of prefill and decode requests with its capture
# trace, a Stable Diffusion 3.5 step served by xDiT, a `torch.compile`'d program:
#
# ```
# T=tests/data/real_traces/tracelens
# python -m kernels.trace.attention \
#     $T/tracelens_inference_vllm_prefilldecode_piecewise_graph_execution.json.gz \
#     --capture $T/tracelens_inference_vllm_prefilldecode_piecewise_capture_rank_0.json.gz
# ```
#
# To record your own model, profile a few steps with a schedule and record the shapes, which give
# each call its sizes and causality (without them its FLOPs cannot be counted). On a GPU:
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
# What `record_shapes` changes, on chapter 8's transformer block profiled on this page's device:

# %%
block = Block(heads * head_dim, heads, attention="sdpa_flash").to(device, dtype).eval()
x = torch.randn(batch, seq, heads * head_dim, device=device, dtype=dtype)
own = {shapes: find_attention(record.profile(block, x, label="block", wait=0, warmup=1, active=1, record_shapes=shapes,
                                            trace_dir=trace_dir, trace_name=f"block_shapes_{shapes}").step())
       for shapes in (True, False)}                # one step of the block, recorded with and without shapes
tables = {f"record_shapes={s}": r.table()[["how", "B·H x Sq x Sk x D", "causal", "GFLOP", "GPU µs"]]
          for s, r in own.items()}

# %% tags=["remove-input"]
display(ch12.shapes_table(tables))
with_shapes, without = own[True].calls[0], own[False].calls[0]
lesson(with_shapes.batch_heads == batch * heads and with_shapes.sq == seq and with_shapes.flops is not None,
       "with record_shapes the call's sizes and FLOPs are read from the trace", ch12.tensors_text(with_shapes.shapes))
lesson(len(own[False].calls) == len(own[True].calls) and without.flops is without.batch_heads is without.causal is None,
       "without record_shapes the call is still found, but its sizes, causality and FLOPs are unknown")

# %% [markdown]
# On a CPU the block has no GPU work ("none" above, and the command would refuse its trace);
# `find_attention` reads its ops all the same, and on a GPU the table fills its GPU time.
#
# ## What to remember
#
# - `find_attention(step)` (or `python -m kernels.trace.attention TRACE`) finds attention in a
#   model's step however it was written: a fused op and the kernel it launched, a
#   hand-written `matmul -> softmax -> matmul`, or attention kernels replayed with no op.
# - One model on two vendors runs the same calls under different kernel names
#   (`flash_fwd_kernel`, `attn_fwd`); the CUDA trace records the kernel's registers, shared
#   memory and occupancy, the ROCm trace only its grid and block.
# - `roof_table` puts each call under its GPU's roofline; `side_by_side(a, b)` (or the command with
#   two traces) matches two steps' calls by shape.
# - Fused attention was {glue:text}`fused_min:.1f`% to {glue:text}`fused_max:.1f`% of these
#   models' steps, less than the GEMMs; hand-written attention was most of TimeSformer's (on a
#   128-frame input that makes its space sequences 3,137 tokens long), its softmax over
#   gigabytes of scores the longest kernel. Read the share before optimising attention.
# - Record with `record_shapes=True`, or the calls have no sizes and no FLOPs.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/12_real_models.ipynb), with automatic checks, hints and hidden solutions.

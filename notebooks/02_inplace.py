# %% [markdown]
# # 2. In place
#
# The previous chapter found a full copy of the attention scores inside `masked_fill`.
# The fix is one character: `masked_fill_`, the in-place version, writes $-\infty$ into the
# scores tensor we already have. This chapter proves that the output is the same, that the
# copy is gone (and nothing else changed) and that one S×S allocation fewer is made, then
# shows when in-place is *not* allowed.
#
# **You will learn to:**
#
# - prove that a change did what it claims: the same output bit for bit, and `tracediff.diff`
#   listing exactly the ops that went;
# - tell total allocation from peak memory, and which of the two removing a copy lowers;
# - compare two forwards' times apart from the profiler, and when to call neither one faster;
# - see when an in-place op breaks autograd, and why `masked_fill_` does not;
# - find a real model's copies by their bytes and the call that made them, and judge from the
#   recorded strides whether each was needed.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb). What `backward()` does, for the
# section on autograd.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import functools

import pandas as pd
import torch

import kernels
from kernels import borrowed, recorded, reference
from kernels.attention.inplace import InplaceAttention, attention_with_inplace_dropout, backward_error
from kernels.bench import comparison
from kernels.book.ch02_inplace import copies_for_reading, inplace_drops_the_copy_on_gpu
from kernels.notebook import glue, glue_all, inputs, lesson, mib, readable, reveal, say, setup, show_lines
from kernels.trace import diff as tracediff, events, reader, record, tables
from kernels.trace.links import links

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)

# %% tags=["remove-input"]
borrowed.traces_box({"H100 Qwen": borrowed.TRACELENS["h100_qwen"]})

# %% [markdown]
# ## The change
#
# `InplaceAttention` is `NaiveAttention` with one method overridden. This is all of it:

# %%
show_lines(InplaceAttention)

# %% [markdown]
# ## Same output
#
# The in-place version runs the same arithmetic in the same order, so its output is not
# just close to the naive one: it is bit for bit the same.

# %% tags=["remove-input"]
lesson(torch.equal(kernels.get("naive")(q, k, v), kernels.get("inplace")(q, k, v)),
       "naive and in-place attention return bit-identical outputs")
verdict = reference.judge(kernels.get("inplace")(q, k, v), q, k, v)
lesson(verdict.ok, "in-place attention matches the float64 reference within its dtype's tolerance",
       f"max error {verdict['out'].error:.1e}, bound {verdict['out'].bound:.1e}")

# %% [markdown]
# ## The copy is gone
#
# Profile both with the same schedule and compare the ops of one forward each.

# %%
runs = {name: record.profile(kernels.get(name), q, k, v, label=name, active=active_steps,
                             trace_dir=trace_dir) for name in ("naive", "inplace")}
step = {name: reader.median_step(r.steps()) for name, r in runs.items()}

# %% tags=["remove-input"]
scores_bytes = batch * heads * seq * seq * q.element_size()
big_copies = {name: len(s.copies(min_bytes=scores_bytes)) for name, s in step.items()}
lesson(big_copies["naive"] == 1 and big_copies["inplace"] == 0,
       "the naive forward copies the S×S scores once; the in-place forward never does", str(big_copies))
lesson(step["inplace"].find("aten::clone").empty, "no aten::clone is left in the in-place trace")

# %% [markdown]
# What exactly changed? `tracediff.diff` matches every op of one forward with the other's by
# name *and* input shapes (a view or a bare allocation counts towards the op that called it)
# and keeps the rows whose count or allocated bytes differ (an input shown as `()` is a
# scalar argument: the fill value, a flag). Each row's self time is its median over every
# recorded forward, since any op in one profiled step can stall.

# %%
changes = tracediff.diff(runs["naive"].steps(), runs["inplace"].steps())
changes.table()[["name", "only in", "allocated change (KiB)", "input shapes"]]

# %% [markdown]
# The out-of-place `masked_fill`, its `clone` and the clone's S×S `copy_` are gone. Both
# forwards run one `masked_fill_` on the same shapes (the naive one runs it on the clone), so
# it is matched, not changed; so is the 4-byte `copy_` under `mul`. Every other op that does
# work is the same in both traces:

# %%
#| caption: What changed between the naive and the in-place forward. Only rows whose count or allocation differs are drawn, one bar per side that has them, each the row's median self time over the recorded forwards: here the naive step's out-of-place `masked_fill`, its `clone` and the clone's `copy_`. The bars say what changed; their lengths are one profile's times, as noisy as the note under the axis, which sums the self times of every row that matched (the same work in both forwards).
#| alt: Horizontal bar chart of self time per changed op; every bar belongs to the naive forward (copy_, masked_fill, clone), the copy_ the longest.
changes.figure()

# %% tags=["remove-input"]
changed = changes.changed().query("kind == 'op'")  # CPU ops here; a GPU run checks kernels below
lesson(set(changed["name"]) <= {"aten::masked_fill", "aten::clone", "aten::copy_", "aten::masked_fill_"},
       "the only ops that differ are the mask step and its clone", ", ".join(changed["name"]))
matched = changes.ops[~changes.ops["substance"]]
matched_views = int(matched["name"].isin(events.VIEW_OPS).sum())   # a view at the top level has no caller to count towards
glue_all(matched_rows=len(matched), matched_work=len(matched) - matched_views, matched_views=matched_views,
         matched_gap_ms=f"{abs(matched['time_us_a'].sum() - matched['time_us_b'].sum()) / 1e3:.1f}")
# The two traces behind this figure: download them, or open them in Perfetto.
display(links(runs["naive"]), links(runs["inplace"]))

# %% [markdown]
# The note under the axis is everything else: {glue:text}`matched_rows` rows of the same ops on
# the same shapes in both forwards ({glue:text}`matched_work` ops that are not views and
# {glue:text}`matched_views` top-level view, the `transpose` of `k`), yet their self times add up to totals
# {glue:text}`matched_gap_ms` ms apart. That gap is not the change, since none of that work
# changed: it is how much one profile's times move on this machine by themselves, which is why
# this page reads a speed-up only from the timing with a spread check below, never from a
# profile.
#
# On a GPU the copy is GPU work of its own: the source article's A100 trace goes from 6 GPU
# activities per forward to **5**, the Memcpy gone.

# %% tags=["remove-input"]
# This run's own GPU forwards (or the book's recording of them): 6 activities to 5, the copy gone.
# On a CPU build without a recording it shows nothing.
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, step, "02_inplace", ["naive", "inplace"])
if len(gpu_steps) == 2:
    say(f"On a GPU, {gpu_source}: the same two forwards' GPU tracks, checked against the article's count.")
    inplace_drops_the_copy_on_gpu(gpu_steps, gpu_source)

# %% [markdown]
# ## Total allocation and peak
#
# Removing the clone removes an allocation of exactly one scores tensor. Will the *peak*
# move too? The cell below holds a first guess, in S×S buffers; make it yours before reading on:

# %%
guess_peak_drop = 1  # edit me: how many S×S buffers lower will the in-place forward's peak be?

# %% [markdown]
# The trace's memory events give each forward's peak and its total allocation:

# %%
summary = pd.DataFrame([s.summary() for s in step.values()]).set_index("label")
summary[["peak_MiB", "allocated_MiB", "ops", "ops (no views)"]].set_axis(
    ["peak (MiB)", "allocated (MiB)", "ops", "ops (no views)"], axis=1)

# %% tags=["remove-input"]
reveal(guess_peak_drop, (step["naive"].peak_bytes - step["inplace"].peak_bytes) / scores_bytes, "the peak's drop, in S×S buffers")
saved = step["naive"].allocated_bytes - step["inplace"].allocated_bytes
lesson(saved == scores_bytes, "the in-place forward allocates exactly one S×S scores tensor less",
       f"{mib(saved):.2f} MiB = {batch}×{heads}×{seq}×{seq}×{q.element_size()} bytes")
lesson(step["naive"].peak_bytes == step["inplace"].peak_bytes, "the peak memory is the same for both")
alive = {name: s.most_alive(scores_bytes) for name, s in step.items()}   # S×S-sized tensors alive at once
lesson(alive == {"naive": 2, "inplace": 2}, "at most two S×S tensors are alive at once, in either version",
       f"most alive at once: naive {alive['naive']}, in-place {alive['inplace']}")
fewer = {col: int(summary.loc["naive", col] - summary.loc["inplace", col]) for col in ("ops", "ops (no views)")}
gone = -int(changed["count_change"].sum())   # the working ops the diff lists as gone
lesson(fewer["ops (no views)"] == gone and fewer["ops"] > gone,
       f"the in-place forward dispatches {fewer['ops']} ops fewer: the {gone} of the diff above and "
       f"{fewer['ops'] - gone} views and allocations they called",
       f"{fewer['ops']} fewer ops, {fewer['ops (no views)']} of them not views")
glue_all(inplace_saved_mib=mib(saved), inplace_ops_fewer=fewer["ops"], inplace_work_fewer=gone,
         inplace_views_fewer=fewer["ops"] - gone)

# %% [markdown]
# The peak did not move. Each step of the forward replaces the tensor before it: in the naive
# version the clone takes the place of the scaled scores (freed as soon as `scores` is
# rebound), and the softmax reads the clone and writes its own output. So at the busiest
# moment two S×S tensors are alive in either version, the softmax's input and its output,
# and removing the clone lowers the total allocated by {glue:text}`inplace_saved_mib:.1f` MiB,
# not the peak. It also dispatches {glue:text}`inplace_ops_fewer` fewer ops: the
# {glue:text}`inplace_work_fewer` the diff lists, and {glue:text}`inplace_views_fewer` views and
# allocations those called (the mask's broadcast `expand`s, the clone's `empty_like`), which the diff counts
# towards their callers and the summary's `ops (no views)` column leaves out.
#
# Is it faster? It skips one S×S copy ({glue:text}`inplace_saved_mib:.1f` MiB read and as many
# written) among the forward's several passes over S×S data. We time both apart from the
# profiler, call by call, with chapter 0's spread check:

# %%
forwards = {name: functools.partial(kernels.get(name), q, k, v) for name in ("naive", "inplace")}
timing = comparison.compare(forwards, device=device, rounds=15)

# %% tags=["remove-input"]
lesson(timing.faster() != "naive", "timed apart from the profiler, with the spread check, the naive forward does not come out faster",
       timing.medians() if timing.faster() else "the two ranges overlapped: neither is faster on this machine")
glue("timing_reading", {
    "inplace": f"Timed apart from the profiler the in-place forward is the faster one ({timing.medians()}, by the medians "
               f"{100 * (1 - timing.median_ms['inplace'] / timing.median_ms['naive']):.0f}% less)",
    None: "On this run the two ranges overlapped, so this page shows no time for them: one copy among the "
          "forward's S×S passes is a difference within this machine's spread"}[timing.faster()])

# %% [markdown]
# {glue:text}`timing_reading`. The showdown chapter benchmarks every variant.
#
# ## When in place breaks autograd
#
# In-place is safe here because nothing needs the old scores later: `mul` by a Python
# number saves nothing for the backward pass. Autograd keeps a version counter on every
# tensor it saved, and refuses to differentiate through a saved tensor that was modified
# afterwards. Softmax saves its *output*, so writing into the probabilities (say, an
# in-place dropout) breaks the backward pass:

# %%
show_lines(attention_with_inplace_dropout)

# %%
qg, kg, vg = inputs(1, 2, 16, 16, requires_grad=True)
error = backward_error(attention_with_inplace_dropout, qg, kg, vg)

# %% tags=["remove-input"]
lesson(error is not None and "modified by an inplace operation" in error,
       "autograd refuses to backpropagate through a saved tensor that was modified in place", str(error))

# %% [markdown]
# Our `masked_fill_` is not in that situation: the in-place attention trains, and its
# gradients equal the naive version's.

# %%
grads = {name: torch.autograd.grad(kernels.get(name)(qg, kg, vg).square().sum(), (qg, kg, vg))
         for name in ("naive", "inplace")}

# %% tags=["remove-input"]
lesson(all(torch.equal(a, b) for a, b in zip(grads["naive"], grads["inplace"])),
       "in-place masking gives the same gradients as the out-of-place version")

# %% [markdown]
# ## A copy a real model did not need
#
# Our copy came from one missing underscore. Real models carry copies too, and the way to find
# them is the one this chapter used: by the bytes they move, then by where they come from.
# **H100 Qwen** (in the box at the top of the page) is one forward of Qwen1.5-0.5B-Chat, a
# small language model, on {glue:text}`qwen_prompts` prompts of {glue:text}`qwen_tokens` tokens
# (the box's text_input_length 2048 is a maximum) in bfloat16 on an H100, recorded with input
# shapes, Python stacks and module names.
#
# Guess first: rotary position embeddings are a classic place for stray copies (casts of the
# cos and sin tables). Which module's copies move the most bytes in this step:
# Qwen2RotaryEmbedding, Qwen2Attention, Qwen2RMSNorm or Qwen2MLP?

# %%
guess_module = "Qwen2RotaryEmbedding"  # edit me

# %%
qwen_step = borrowed.TRACELENS["h100_qwen"].step()
groups = tables.copy_groups(qwen_step)
by_module = groups.groupby("module")["MiB total"].sum().sort_values(ascending=False)
by_module.to_frame()

# %% tags=["remove-input"]
top, yours = by_module.index[0], by_module.get(guess_module)
say(f"You guessed {guess_module} ({'no copies' if yours is None else f'{readable(yours)} MiB, #{list(by_module.index).index(guess_module) + 1} of {len(by_module)}'}); "
    f"the most bytes: {top}, {readable(by_module.iloc[0])} MiB.")

# %% [markdown]
# The copies of the H100 Qwen step grouped by the Python call and the module that made them,
# the most bytes first:

# %% tags=["remove-input"]
copies_for_reading(groups)

# %% tags=["remove-input"]
rotary = by_module.get("Qwen2RotaryEmbedding", 0.0)
lesson(rotary < 1, "the rotary embedding's copies are small casts, under 1 MiB in all", f"{rotary:.2f} MiB")
prompts, tokens = qwen_step.find("aten::embedding")["input_dims"].iloc[0][1]   # the token ids: [batch, tokens]
glue_all(qwen_prompts=prompts, qwen_tokens=tokens, qwen_copies=len(qwen_step.copies()),
         qwen_copied_gib=f"{groups['MiB total'].sum() / 1024:.1f}", qwen_rotary_mib=f"{rotary:.2f}")

# %% [markdown]
# The step makes {glue:text}`qwen_copies` copies, {glue:text}`qwen_copied_gib` GiB in all. The
# rotary embedding's are casts of its small tables ({glue:text}`qwen_rotary_mib` MiB): not
# worth a thought. The big ones come from two places. `Qwen2RMSNorm` casts the hidden state
# to float32 and back: that is deliberate, to compute the normalisation's variance in full
# precision, and the copies are the price. The other is `Tensor.contiguous` in transformers'
# `sdpa_attention_forward`, three copies per layer of `q`, `k` and `v`, and one of the output.
# Were they needed? Transformers calls torch's fused attention, `scaled_dot_product_attention`
# ([SDPA](glossary.md#sdpa), chapter 3), which picks a backend; here it ran FlashAttention, the
# op `aten::_flash_attention_forward` ("the flash op"). The trace recorded every input's
# **strides** as well as its shape, so it can say how each tensor lay in memory (B batch, H heads, S sequence, D head dimension, the
# outermost first), whatever shape it was viewed as. Here is `q` as the first `.contiguous()`
# got it and as the flash op got it, and the output as the last `.contiguous()` got it:

# %%
clone = qwen_step.find("aten::clone").iloc[0]          # q's copy, in the first layer
flash = qwen_step.find("aten::_flash_attention_forward").iloc[0]
out = qwen_step.find("aten::clone", shape=flash["input_dims"][0]).iloc[0]   # the output's copy
seen = {"q into .contiguous(), viewed BHSD": (clone, "BHSD"),      # (op, the view it was given)
        "q into the flash op, viewed BSHD": (flash, "BSHD"),
        "output into .contiguous(), viewed BSHD": (out, "BSHD")}
# how each op's first input lay in memory, in the letters of its view
layouts = pd.Series({name: events.memory_layout(op["input_dims"][0], op["input_strides"][0], view)
                     for name, (op, view) in seen.items()})
layouts.to_frame("in memory")

# %% tags=["remove-input"]
lesson(layouts.tolist() == ["BSHD", "BHSD", "BHSD"],
       "q was already laid out [B, S, H, D], the flash op's own view; after the copy, the flash op and the output were [B, H, S, D]")
sdpa = qwen_step.find("aten::scaled_dot_product_attention").iloc[0]
lesson(sdpa["input_dims"][3] == [] and sdpa["concrete_inputs"][5] == "True", "the model passed SDPA no mask, only is_causal=True",
       f"attn_mask dims {sdpa['input_dims'][3]}, is_causal {sdpa['concrete_inputs'][5]}")
sdpa_copies = groups[groups["frame"].str.endswith("sdpa_attention_forward")]
layers = len(qwen_step.find("aten::scaled_dot_product_attention"))
lesson(int(sdpa_copies["count"].sum()) == 4 * layers and set(sdpa_copies["call"]) == {"Tensor.contiguous"},
       "sdpa_attention_forward's .contiguous() makes four copies per layer: q, k, v and the output",
       f"{int(sdpa_copies['count'].sum())} copies in {layers} layers")
glue("qwen_sdpa_copies", int(sdpa_copies["count"].sum()))
glue("qwen_sdpa_cost", f"{sdpa_copies['MiB total'].sum() / 1024:.2f} GiB, {sdpa_copies['GPU µs'].sum() / 1e3:.1f} ms of GPU "
                       f"time, {100 * sdpa_copies['GPU µs'].sum() / qwen_step.gpu_time_us:.0f}% of the step's")

# %% [markdown]
# So: the projections (and the rotary embedding after them) left `q`, `k` and `v` laid out as
# [batch, seq, heads, head_dim], the layout FlashAttention reads, and the model viewed them as
# [batch, heads, seq, head_dim] for SDPA. `.contiguous()` rewrote each one
# in the viewed layout; SDPA's flash path then viewed the copy back as [batch, seq, heads,
# head_dim], now strided; its output came back in the copied layout, and one more
# `.contiguous()` copied it once more. Transformers' source gives the reason next to those
# calls: "SDPA with memory-efficient backend is bugged with non-contiguous inputs and custom
# attn_mask for some torch versions" (pytorch/pytorch issue 112577). This step passed no mask
# and ran the flash backend, so the workaround did not apply to it: for this run the
# {glue:text}`qwen_sdpa_copies` copies ({glue:text}`qwen_sdpa_cost`) were not needed. Where
# the workaround applies (a padding mask, an affected torch, the memory-efficient backend) they
# are, so a library cannot simply drop them; the trace tells you what they cost here.
#
# ## What to remember
#
# - An in-place op removes an allocation and a copy; check in the trace that it did.
# - A smaller total allocation is not a smaller peak: what matters for the peak is what is
#   alive at the same time.
# - In-place is unsafe on a tensor autograd saved; PyTorch tells you at backward time.
# - In a real model, group the copies by where they come from; the strides say whether a
#   `.contiguous()` changed anything the next [kernel](glossary.md#kernel) needed.
#
# Next: one call, `scaled_dot_product_attention`, whose fused backends never write the S×S tensor
# to memory.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/02_inplace.ipynb), with automatic checks, hints and hidden solutions.

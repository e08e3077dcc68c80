# %% [markdown]
# # 7. Compiled attention
#
# Every trace so far showed the ops we wrote, each reading and writing a whole tensor. Under
# `torch.compile`, [TorchDynamo](glossary.md#dynamo) captures the Python code as a graph and
# [Inductor](glossary.md#inductor) writes new code for it, fusing neighbouring ops into one loop
# (C++ on a CPU, [Triton kernels](glossary.md#kernel) on a GPU).
#
# **You will learn to:**
#
# - read a compiled forward's trace: the cache lookup, one region per graph, the library calls
#   Inductor kept and the kernels it wrote;
# - count compiles, and time them apart from steady calls;
# - see what fusion removes and keeps, and how a [graph break](glossary.md#graph-break) stops it;
# - use FlexAttention: a mask compiled into a kernel that skips causal tiles, and ALiBi at no
#   S×S memory.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb), [2. In place](02_inplace.ipynb)
# and [3b. The fused backends](03b_sdpa_fused.ipynb) ([SDPA's](glossary.md#sdpa) flash backend).
#
# **Time:** about {reading_minutes} min to read.
#
# Sources: the PyTorch docs of [`torch.compile`](https://pytorch.org/docs/stable/generated/torch.compile.html)
# and [FlexAttention](https://pytorch.org/docs/stable/nn.attention.flex_attention.html); the PyTorch
# blog, "FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention" (2024-08-07).

# %% [install]

# %% [parameters]

# %%
from functools import partial

import torch
import torch._inductor.config as inductor_config
from IPython.display import Markdown

import kernels
from kernels import reference
from kernels.attention import inplace, naive, torch_compile
from kernels.book import ch07_compiled as ch07
from kernels.borrowed import COMPILED_POINTWISE, traces_box
from kernels.bench.timing import spread
from kernels.notebook import glue_all, inputs, lesson, mib, readable, reveal, say, setup, show_lines
from kernels.trace import links, reader, record, tables, timeline

inductor_config.cpp.enable_kernel_profile = True  # name each generated C++ kernel in the trace
torch.set_grad_enabled(False)  # Dynamo guards on the grad mode: one mode, one compile

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
scores_bytes = batch * heads * seq * seq * q.element_size()

# %% tags=["remove-input"]
traces_box({"A100 compiled call": COMPILED_POINTWISE})

# %% [markdown]
# ## Compile the naive module
#
# `torch.compile(module)` returns a wrapper that compiles on its first call. We compile chapter
# 1's `NaiveAttention` and chapter 2's `InplaceAttention` for one fixed shape (`dynamic=False`).
# The first call generates code unless Inductor finds the graph in its cache; Dynamo's counters
# (`torch_compile.timed_compiles`) say which.

# %%
eager = {"naive": naive.NaiveAttention(causal=True), "inplace": inplace.InplaceAttention(causal=True)}
compiled_mod = {name: torch.compile(m, dynamic=False) for name, m in eager.items()}
paid = {name: torch_compile.timed_compiles(fn, q, k, v) for name, fn in compiled_mod.items()}
steady = ch07.rotated_turns({"compiled": compiled_mod["naive"], "eager": eager["naive"]},
                            (batch, heads, seq, head_dim), dtype, device)

# %% tags=["remove-input"]
for name in compiled_mod:
    verdict = reference.judge(compiled_mod[name](q, k, v), q, k, v, causal=True)
    lesson(verdict.ok, f"compiled {name} attention matches the float64 reference", ch07.error_text(verdict))
lesson(all(t.compiled_once for t in paid.values()), "each module compiles one graph on its first call only",
       ", ".join(f"{n} {t.first.graphs} then {t.steady.graphs}" for n, t in paid.items()))
# Against the steady median: a first call served from Inductor's cache is short, and a busy spell
# during the steady rounds swells their 90th percentile more than their median.
steady_s = 1e-3 * spread(steady["compiled"])[0]
lesson(all(t.first_s > 2 * steady_s for t in paid.values()),
       "a first call costs over two steady calls",
       ", ".join(f"{n} {t.first_s / steady_s:,.0f}×" for n, t in paid.items()) + " a steady median call")
glue_all(c_first_s=f"{paid['naive'].first_s:.2f}")
display(Markdown(f"The first call of the compiled naive module took {paid['naive'].first_s:.2f} s. "
                 + ch07.first_call_text(paid["naive"], paid["inplace"].first_s)
                 + f" After that, {ch07.steady_text(paid['naive'].first_s, steady)}. No steady time is quoted: "
                 "load moves it, but hits both calls of a round alike. A profile that holds the first call "
                 "measures the compiler, not the model."))

# %% [markdown]
# With `dynamic=False` Dynamo guards on the exact shapes, so a call at another length compiles
# again: a *recompile*. Half the length, through the same module:

# %%
q_half, k_half, v_half = inputs(batch, heads, seq // 2, head_dim, dtype=dtype, device=device)
again = torch_compile.timed_compiles(compiled_mod["naive"], q_half, k_half, v_half)
half_run = record.profile(compiled_mod["naive"], q_half, k_half, v_half,
                          label="naive_half", active=active_steps, trace_dir=trace_dir)
half_step = reader.median_step(half_run.steps())
list(torch_compile.regions(half_step)["name"])

# %% tags=["remove-input"]
half_regions = list(torch_compile.regions(half_step)["name"])
lesson(again.first.graphs == 1 and again.steady.graphs == 0 and not again.first.gave_up,
       "another length compiles the module once more; its later calls do not",
       f"S={seq // 2}: {ch07.compiles_text(again.first)}, then {again.steady.graphs}")
frame, _, compile_id = half_regions[0].removeprefix("Torch-Compiled Region: ").partition("/") if half_regions else ("", "", "")
lesson(len(half_regions) == 1 and frame == "0" and compile_id.isdigit() and int(compile_id) > 0,
       "the recompile keeps frame 0 with a later compile number",
       half_regions[0].removeprefix("Torch-Compiled Region: ") if half_regions else "no region")
glue_all(half_region=f"{frame}/{compile_id}")

# %% [markdown]
# A region's name reads *frame/compile*: `forward` is frame 0, and each compile of it counts up:
# `0/0` for the naive module, {glue:text}`inplace_region` for the in-place one,
# {glue:text}`half_region` for half the length. Dynamo guards on state a forward caches on its
# module too, so the compiled `NaiveAttention` builds its causal mask inside the graph (hence
# `ones_triu` in the fused kernel's name below); past
# `torch._dynamo.config.recompile_limit` (8) compiles of a frame, it runs the frame eagerly, with
# a logged warning only.
#
# ## Guess, then look
#
# Eager, the naive forward ran five top-level ops ([chapter 1](01_naive.ipynb)), and
# `masked_fill` cloned the scores. Which ATen ops will the compiled forward's trace still show by
# name, and how many times each?

# %%
guess_compiled_ops = ["aten::bmm", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::bmm"]  # edit me before running on

# %%
runs = {name: record.profile(fn, q, k, v, label=f"{name}_forward", active=active_steps, trace_dir=trace_dir)
        for name, fn in {**compiled_mod, "eager_naive": eager["naive"].forward}.items()}
step = {name: reader.median_step(r.steps()) for name, r in runs.items()}

# %% tags=["remove-input"]
seen_aten = [n for n in step["naive"].ops["name"] if n.startswith("aten::") and n != "aten::resolve_conj"]
region_of = {name: list(torch_compile.regions(step[name])["name"]) for name in compiled_mod}
lesson(region_of["naive"] == ["Torch-Compiled Region: 0/0"] and len(region_of["inplace"]) == 1
       and region_of["inplace"][0].startswith("Torch-Compiled Region: 0/"),
       "the compiled in-place module runs in frame 0 too: it inherits naive's forward",
       " vs ".join(r[0].removeprefix("Torch-Compiled Region: ") if r else "none" for r in region_of.values()))
glue_all(inplace_region=region_of["inplace"][0].removeprefix("Torch-Compiled Region: "))
say("ATen ops in the compiled forward: " + ch07.ops_present(guess_compiled_ops, seen_aten))

# %%
tables.op_table(step["naive"]).drop(columns="input shapes")

# %% [markdown]
# `TorchDynamo Cache Lookup` checks the guards (shapes, dtypes, grad mode...) that decide whether
# the compiled code fits this call; the `Torch-Compiled Region` runs the graph: two wrapper rows,
# two `aten::bmm` left to PyTorch's matmul library, and one kernel Inductor wrote, named after the
# ops it fused.

# %% tags=["remove-input"]
gen = {name: torch_compile.generated_kernels(step[name]) for name in compiled_mod}
lesson(len(torch_compile.regions(step["naive"])) == 1, "the compiled naive forward is one compiled region")
lesson(len(step["naive"].find("aten::bmm")) == 2, "the two matmuls stay: two aten::bmm a forward")
lesson(all(step["naive"].find(op).empty for op in ("aten::mul", "aten::masked_fill", "aten::softmax", "aten::clone")),
       "scale, mask and softmax no longer run as ATen ops; nothing is cloned")
lesson(len(gen["naive"]) == 1 and {"softmax", "masked_fill", "mul"} <= set(gen["naive"]["fused"].iloc[0]),
       "one generated kernel fuses scale, mask and softmax: one pass, not three",
       ", ".join(gen["naive"]["name"]))
glue_all(c_kernel=gen["naive"]["name"].iloc[0])

# %% [markdown]
# ## masked_fill or masked_fill_: the compiler does not care
#
# Chapter 2 removed a clone by writing `masked_fill_`. Under `torch.compile` both modules are
# *functionalized* first (in-place ops rewritten as out-of-place ones) and Inductor picks which
# buffers to reuse, so the two compile to the same code:

# %% tags=["remove-input"]
lesson(gen["naive"]["fused"].tolist() == gen["inplace"]["fused"].tolist()
       and len(step["naive"].ops) == len(step["inplace"].ops),
       "compiled naive and in-place run the same kernels and as many ops")

# %% [markdown]
# ## The S×S copy and memory
#
# Eager, the naive forward allocated four S×S buffers (scores, scaled scores, clone, softmax), two
# alive at once. Compiled, Inductor writes the softmax into the first matmul's output, which
# nothing else reads. The table (folded) counts each forward's S×S buffers; the ✔ lines state it:

# %% tags=["hide-output"]
ch07.memory_table({"eager naive": step["eager_naive"], "compiled naive": step["naive"],
                   "compiled in-place": step["inplace"]}, scores_bytes)

# %% tags=["remove-input"]
mem = ch07.memory_table({"eager naive": step["eager_naive"], "compiled naive": step["naive"],
                         "compiled in-place": step["inplace"]}, scores_bytes)
lesson(list(mem["S×S buffers allocated"]) == [4, 1, 1] and list(mem["copies of S×S"]) == [1, 0, 0],
       "eager naive allocates four S×S buffers and copies one; each compiled forward allocates one, copies none")
lesson(step["naive"].peak_bytes < 2 * scores_bytes <= step["eager_naive"].peak_bytes,
       "the compiled peak stays under two S×S buffers; eager reaches two",
       f"{mib(step['naive'].peak_bytes):.1f} vs {mib(step['eager_naive'].peak_bytes):.1f} MiB")
glue_all(c_peak_mib=f"{mib(step['naive'].peak_bytes):.1f}", e_peak_mib=f"{mib(step['eager_naive'].peak_bytes):.1f}")

# %% [markdown]
# Fusion removed the *extra* passes over the scores, not the scores: one S×S buffer stays.
# Removing it takes a kernel that never writes the scores out: FlexAttention, below.

# %%
#| caption: One forward of naive attention compiled by `torch.compile`: the matmuls remain, and one kernel Inductor generated (named after the ops it fused) stands where scale, mask and softmax ran as separate ops.
#| alt: Timeline of the compiled forward: the compiled graph's call with the matmuls and a single fused kernel beneath it.
timeline.timeline(step["naive"], title=f"compiled naive attention, one forward ({device.type})")

# %% tags=["remove-input"]
links.links(runs["naive"])

# %% [markdown]
# ## On a GPU
#
# On a GPU, Inductor writes Triton kernels named the same way: `triton_poi_fused_...` for a
# pointwise pass, `triton_per_fused_...` or `triton_red_fused_...` for a reduction such as softmax,
# next to the [GEMMs](glossary.md#gemm) it leaves to [cuBLAS](glossary.md#cublas). *A100 compiled
# call* is one call of a small compiled function. How many kernels did the GPU run for it, and for
# what share (%) of the compiled region's CPU time was the GPU busy?

# %%
guess_kernels, guess_gpu_busy_percent = 3, 50  # edit me before running on

# %% [markdown]
# *A100 compiled call*, its CPU ops, then the GPU work they launched:

# %%
call = torch_compile.compiled_call(COMPILED_POINTWISE)
ch07.call_table(call)

# %% tags=["remove-input"]
reveal(guess_kernels, len(call.kernels), "kernels", source="A100 compiled call")
reveal(guess_gpu_busy_percent, round(100 * call.busy_share, 2), "GPU busy share of the compiled region, %",
       source="A100 compiled call")
lesson(len(call.kernels) == 1 and call.kernel.family == "triton" and call.kernel.kind == "elementwise",
       "the call ran one kernel, a pointwise Triton kernel from Inductor",
       f"{call.kernel.name}: " + ", ".join(torch_compile.fused_ops(call.kernel.name)) + " in one pass")
lesson(call.names[:3] == ["TorchDynamo Cache Lookup", call.names[1], call.kernel.name] and "Compiled Region" in call.names[1],
       "Dynamo's guard check, then the compiled region holding an op named after the kernel")
lesson(set(call.kernels["launcher"]) == {"cuLaunchKernel"},
       "Inductor's kernel is launched by the driver API's cuLaunchKernel, not cudaLaunchKernel")
lesson(call.busy_share < 0.01, "the GPU was busy under 1% of the region's CPU time", f"{call.busy_share:.2%}")
glue_all(compiled_gpu_us=f"{call.gpu_us:.2f}", compiled_region_us=f"{call.region_us:,.0f}")
if device.type == "cuda":  # this run's own compiled forward
    display(ch07.compiled_forward(step["naive"].gpu_work))

# %% [markdown]
# So search a compiled trace for `cuLaunchKernel`, not only `cudaLaunchKernel`. The kernel ran {glue:text}`compiled_gpu_us` µs in a region of {glue:text}`compiled_region_us` µs
# on the CPU: for a call this small, what fusion leaves is the CPU's work around one launch.
#
# ## A graph break
#
# When Dynamo meets code it cannot trace (a `print`, an unsupported library call, Python
# branching on a tensor's value), it ends the graph, runs that code in Python and starts a new
# graph after it: a *graph break*. `BrokenAttention` is the naive module with a break before the
# mask:

# %% tags=["remove-input"]
show_lines(torch_compile.BrokenAttention, "def mask_scores", "return super")

# %%
broken = torch.compile(torch_compile.BrokenAttention(causal=True), dynamic=False)
explained = torch._dynamo.explain(torch_compile.BrokenAttention(causal=True))(q, k, v)
print("reason:", explained.break_reasons[0].reason.splitlines()[0] if explained.break_reasons else "none")
broken_step = reader.median_step(record.profile(broken, q, k, v, label="broken", active=active_steps,
                                                trace_dir=trace_dir).steps())

# %% tags=["hide-output"]
tables.op_table(broken_step).drop(columns="input shapes")

# %% tags=["remove-input"]
broken_gen = torch_compile.generated_kernels(broken_step)
lesson(len(explained.break_reasons) >= 1 and len(torch_compile.regions(broken_step)) > explained.graph_count - 1 > 0,
       "explain finds the break; the trace shows several compiled regions a forward",
       f"{explained.graph_count} graphs, {len(torch_compile.regions(broken_step))} regions")
lesson(not any(len({"mul", "masked_fill", "softmax"} & set(f)) > 1 for f in broken_gen["fused"]),
       "across the break, no kernel fuses two of scale, mask and softmax", ", ".join(broken_gen["name"]))
gb_allocs = torch_compile.score_buffers(broken_step, scores_bytes)
lesson(gb_allocs > 1, "the break costs S×S allocations the unbroken compile avoids", f"{gb_allocs} vs 1")
glue_all(gb_graphs=explained.graph_count, gb_breaks=explained.graph_break_count, gb_reasons=f"{len(explained.break_reasons)} break reason" + "s" * (len(explained.break_reasons) != 1),
         gb_regions=len(torch_compile.regions(broken_step)), gb_allocs=gb_allocs,
         gb_timing=ch07.break_timing(ch07.rotated_turns({"broken": broken, "unbroken": compiled_mod["naive"]},
                                                        (batch, heads, seq, head_dim), dtype, device)))

# %% [markdown]
# A break shows as more than one `Torch-Compiled Region` a forward (op table above, folded; `explain`
# reset Dynamo, so its numbering restarts at `0/0`), each
# behind its own `TorchDynamo Cache Lookup`, and fusion stops at it: every tensor crossing it must
# exist in memory. This one became {glue:text}`gb_graphs` graphs and {glue:text}`gb_regions`
# regions: it sits in `mask_scores`, called from `attend`, called from `forward`, and Dynamo
# splits every frame on that stack (a kernel's `graph_N_` prefix counts the graphs Inductor
# compiled in this process). {glue:text}`gb_timing` `explain` finds breaks without a profiler;
# the trace shows their cost.
#
# ## FlexAttention: a mask, compiled into the kernel
#
# FlexAttention takes attention's two customization points as Python functions:
# `score_mod(score, b, h, q_idx, kv_idx)` changes a score, `mask_mod(b, h, q_idx, kv_idx)` says
# whether a query may see a key. Compiled, it becomes one FlashAttention-style kernel (tiles of
# queries against tiles of keys, an online softmax, no S×S buffer). The library's `flex` builds a
# block mask from this causal `mask_mod` (offset Sk − Sq, 0 here) with `create_block_mask`:

# %% tags=["remove-input"]
show_lines(torch_compile.causal_mod, "def causal(b", "return kv_idx")

# %% [markdown]
# `create_block_mask` evaluates the `mask_mod` ahead of time and records, per tile of 128 queries
# × 128 keys, whether it is full (no masking), partial (mask each score) or empty (skip it). How
# many tiles per head will the causal mask let the kernel skip here?

# %%
guess_skipped_tiles = 8  # edit me before running on

# %%
block_mask = torch_compile.causal_block_mask(seq, seq, device)
counts = torch_compile.block_counts(block_mask)
counts.table()

# %% tags=["remove-input"]
n = -(-seq // counts.block[1])   # tiles per row of the score matrix
reveal(guess_skipped_tiles, counts.skipped, "tiles skipped per head", source="the block mask")
if seq % counts.block[1] == 0:
    lesson(counts.skipped == n * (n - 1) // 2 and counts.partial == n,
           "the causal mask skips the n(n−1)/2 tiles above the diagonal, masks the n on it",
           f"n = {n}: {counts.skipped} skipped, {counts.partial} masked")
glue_all(flex_tiles=counts.total, flex_skipped=counts.skipped, flex_skip_share=f"{100 * counts.skipped_share:.1f}")

# %% [markdown]
# The skipped share tends to one half as S grows; the diagonal's tiles keep it below. Compiled flex
# runs Inductor's FlexAttention template: on a GPU one Triton kernel a forward, named after the
# template (`triton_tem_fused_...`); on a CPU C++, named just `graph_N_kernel` (op table folded below).

# %% tags=["hide-output"]
flex = kernels.get("flex")
flex_timed = torch_compile.timed_compiles(flex, q, k, v)
flex_step = reader.median_step(record.profile(flex, q, k, v, label="flex", active=active_steps,
                                              trace_dir=trace_dir).steps())
tables.op_table(flex_step).drop(columns="input shapes")

# %% tags=["remove-input"]
lesson(flex_timed.first.graphs >= 1 and flex_timed.steady.graphs == 0 and not flex_timed.steady.gave_up,
       "flex compiles on its first call at this shape only",
       f"{ch07.compiles_text(flex_timed.first)}, then {flex_timed.steady.graphs}")
verdict = reference.judge(flex(q, k, v), q, k, v, causal=True)
lesson(verdict.ok, "flex with the causal block mask matches the float64 reference", ch07.error_text(verdict))
lesson(flex_step.find("aten::bmm").empty and flex_step.find("aten::softmax").empty,
       "flex runs no matmul or softmax op: all of attention is in the compiled region")
lesson(flex_step.allocated_bytes < scores_bytes,
       "a flex forward allocates under one S×S buffer in all",
       f"{mib(flex_step.allocated_bytes):.2f} MiB vs {mib(scores_bytes):.1f} MiB")
glue_all(flex_first_s=f"{flex_timed.first_s:.1f}", flex_alloc_mib=f"{mib(flex_step.allocated_bytes):.2f}",
         flex_out_mib=f"{mib(q.numel() * q.element_size()):.1f}",
         flex_work_mib=f"{mib(flex_step.allocated_bytes - q.numel() * q.element_size()):.1f}",
         flex_region=torch_compile.regions(flex_step)["name"].iloc[0].removeprefix("Torch-Compiled Region: "),
         scores_mib=f"{mib(scores_bytes):.0f}")
if device.type == "cuda":  # this run's own flex kernel
    display(Markdown("On this GPU run, the flex forward's kernels:"), ch07.flex_forward(flex_step.gpu_work))

# %% [markdown]
# A flex forward allocates {glue:text}`flex_alloc_mib` MiB in all: the output
# ({glue:text}`flex_out_mib` MiB) and {glue:text}`flex_work_mib` MiB of the kernel's own
# workspace, never an S×S score buffer ({glue:text}`scores_mib` MiB).
#
# For speed, the PyTorch blog reports FlexAttention at about 90% of FlashAttention-2's forward on
# an A100 (quoted, not measured here). What flex buys is the mask: any `mask_mod` or `score_mod`
# at a fused kernel's memory.
#
# ## A score_mod: ALiBi without an S×S bias
#
# ALiBi (Press et al., "Train Short, Test Long", 2021) adds a per-head linear penalty to each
# score, slope_h · (j − i), so distant keys weigh less. SDPA takes it only as an S×S float
# `attn_mask`: on a GPU the flash backend refuses a mask (`can_use_flash_attention` in PyTorch's
# `sdp_utils.cpp`), and the memory-efficient backend runs it fused but reads the S×S bias. With
# flex it is a function of the indices:

# %% tags=["remove-input"]
show_lines(torch_compile.alibi, "slopes = torch.tensor", "return score +")

# %%
alibi_mod = torch_compile.alibi(heads, device)
flex_alibi = partial(torch_compile.flex_call, block_mask=block_mask, score_mod=alibi_mod)
alibi_out = flex_alibi(q, k, v)

# %% tags=["remove-input"]
err, bound = torch_compile.alibi_error(alibi_out, q, k, v)
lesson(err <= bound, "flex with ALiBi matches a float64 ALiBi attention",
       f"max abs error {err:.1e} <= {bound:.1e}")
moved = reference.max_abs_error(alibi_out, reference.attention(q, k, v, causal=True))
lesson(moved > 100 * bound, "and the bias moves it far from causal attention",
       f"by {moved:.2f}, {readable(moved / bound)}× that bound")
alibi_step = reader.median_step(record.profile(flex_alibi, q, k, v, label="flex_alibi", active=active_steps,
                                               trace_dir=trace_dir).steps())
lesson(alibi_step.allocated_bytes < scores_bytes,
       "flex with ALiBi allocates under one S×S buffer: the kernel computes the bias",
       f"{mib(alibi_step.allocated_bytes):.2f} MiB")

# %% [markdown]
# ## What to remember
#
# - One `Torch-Compiled Region` per graph: the matmuls Inductor kept and the kernels it wrote,
#   named after what they fused; the S×S clone goes, in-place or not, the scores stay.
# - The first call compiles or loads from cache ({glue:text}`c_first_s` s here): keep it out of
#   timings and profiles.
# - A graph break shows as more regions, and fusion stops at it.
# - FlexAttention compiles the mask into a fused kernel that skips causal tiles
#   ({glue:text}`flex_skip_share`% here); ALiBi as a score_mod costs no S×S memory.
#
# Next: attention inside a whole transformer block.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/07_compiled.ipynb), with automatic checks, hints and hidden solutions.

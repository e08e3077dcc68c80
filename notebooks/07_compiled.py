# %% [markdown]
# # 7. Compiled attention
#
# So far every trace showed the ops we wrote, one after the other, each reading and writing
# a whole tensor. `torch.compile` changes that contract: [TorchDynamo](glossary.md#dynamo) captures
# the Python code as a graph, and [Inductor](glossary.md#inductor), its default backend, writes new
# code for that graph, fusing neighbouring ops into one loop (C++ on a CPU,
# [Triton kernels](glossary.md#kernel) on a GPU). This chapter reads the traces that leaves: the
# naive and in-place modules compiled, what a [graph break](glossary.md#graph-break) (a point where
# Dynamo must end its graph) does, and then FlexAttention, which
# compiles a whole attention with a mask of our choice into one kernel.
#
# **You will learn to:**
#
# - read a compiled forward's trace: `TorchDynamo Cache Lookup`, one `Torch-Compiled Region` per
#   graph, the library calls Inductor kept and the kernels it wrote, named after what they
#   fused;
# - count the compile time and the recompiles apart from steady-state time;
# - see what fusion removes (the S×S clone, the passes over the scores) and what it keeps, and
#   how a graph break shows and stops fusion;
# - use FlexAttention: a mask compiled into a fused kernel that skips causal tiles, and a
#   score_mod (ALiBi) at no S×S memory.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb), [2. In place](02_inplace.ipynb)
# and [3b. The fused backends](03b_sdpa_fused.ipynb) ([SDPA's](glossary.md#sdpa) flash backend, which FlexAttention
# is compared with).
#
# **Time:** about {reading_minutes} min to read.
#
# Sources: the PyTorch documentation of
# [`torch.compile`](https://pytorch.org/docs/stable/generated/torch.compile.html) and of
# [FlexAttention](https://pytorch.org/docs/stable/nn.attention.flex_attention.html), and the
# PyTorch blog post "FlexAttention: The Flexibility of PyTorch with the Performance of
# FlashAttention" (2024-08-07).

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
# `torch.compile(module)` returns a wrapper; nothing is compiled until the first call. We
# compile chapter 1's `NaiveAttention` and chapter 2's `InplaceAttention` with
# `dynamic=False` (one shape, compiled for exactly that shape) and time the first call apart
# from the calls after it: the first one pays for tracing, code generation and the C++ (or
# Triton) compiler, unless Inductor finds the same graph in its cache. A timing alone cannot
# tell whether a later call compiled again, so Dynamo's own counters count every graph each
# part compiled (`torch_compile.timed_compiles`). The steady calls are timed apart from the
# profiler, in turns with the eager module (one call of each per round, as in chapter 2), so a
# burst of load from elsewhere hits both alike.

# %%
eager = {"naive": naive.NaiveAttention(causal=True), "inplace": inplace.InplaceAttention(causal=True)}
compiled_mod = {name: torch.compile(m, dynamic=False) for name, m in eager.items()}
paid = {name: torch_compile.timed_compiles(fn, q, k, v) for name, fn in compiled_mod.items()}
steady = ch07.in_turns({"compiled": partial(compiled_mod["naive"], q, k, v),   # ms of every call
                        "eager": partial(eager["naive"], q, k, v)}, device)

# %% tags=["remove-input"]
for name in compiled_mod:
    verdict = reference.judge(compiled_mod[name](q, k, v), q, k, v, causal=True)
    lesson(verdict.ok, f"compiled {name} attention matches the float64 reference", str(verdict))
lesson(all(t.compiled_once for t in paid.values()), "each module compiles one graph, on its first call, and no later call compiles again",
       "; ".join(f"{n}: first call {ch07.compiles_text(t.first)}, later calls {ch07.compiles_text(t.steady)}"
                 for n, t in paid.items()))
steady_p90_s = 1e-3 * spread(steady["compiled"])[2]   # an upper bound that holds on a busy run
lesson(all(t.first_s > 2 * steady_p90_s for t in paid.values()),
       "the first call of a compiled module costs more than two steady-state calls (compile or cache load)",
       "first call: " + ", ".join(f"{n} {t.first_s:.2f} s" for n, t in paid.items())
       + f"; steady calls' 90th percentile {readable(1e3 * steady_p90_s)} ms")
glue_all(c_first_s=f"{paid['naive'].first_s:.2f}")
display(Markdown(f"The first call of the compiled naive module took {paid['naive'].first_s:.2f} s. "
                 + ch07.first_call_text(paid["naive"], paid["inplace"].first_s)
                 + f" After that, {ch07.steady_text(paid['naive'].first_s, steady)}. A compile pays off only "
                 "over many calls of the same shape, and a profiled window that holds the first call measures "
                 "the compiler, not the model."))

# %% [markdown]
# The shape matters: with `dynamic=False` Dynamo guards on the exact shapes, so a call at another
# length fails the guard and compiles again, a *recompile*. Half the length, through the same module:

# %%
q_half, k_half, v_half = inputs(batch, heads, seq // 2, head_dim, dtype=dtype, device=device)
again = torch_compile.timed_compiles(compiled_mod["naive"], q_half, k_half, v_half)
half_run = record.profile(compiled_mod["naive"], q_half, k_half, v_half, label="naive_half",
                          active=active_steps, trace_dir=trace_dir)
half_step = reader.median_step(half_run.steps())
list(torch_compile.regions(half_step)["name"])

# %% tags=["remove-input"]
half_regions = list(torch_compile.regions(half_step)["name"])
lesson(again.first.graphs == 1 and again.steady.graphs == 0 and not again.first.gave_up,
       "a call at another length compiles the module again, once, and its later calls do not",
       f"S={seq // 2}: first call {ch07.compiles_text(again.first)}, later calls {ch07.compiles_text(again.steady)}")
frame, _, compile_id = half_regions[0].removeprefix("Torch-Compiled Region: ").partition("/") if half_regions else ("", "", "")
lesson(len(half_regions) == 1 and frame == "0" and compile_id.isdigit() and int(compile_id) > 0,
       "the trace names the recompiled graph after the same frame as the first compile (0), with a later compile number",
       half_regions[0] if half_regions else "no region")
glue_all(half_region=f"{frame}/{compile_id}")

# %% [markdown]
# A region's name reads *frame/compile*: Dynamo numbers each function (frame) it captures, here
# `forward` as frame 0, and each compile of it. `0/0` was the naive module's first compile; the
# in-place module inherits the same `forward`, so its compile was {glue:text}`inplace_region`; the
# half-length call is {glue:text}`half_region`. A forward that writes to its module recompiles too (a
# cache filled on the first call makes Dynamo guard on what it wrote): the course's
# `NaiveAttention` builds its mask inside the graph when it is compiled, for that reason. After
# `torch._dynamo.config.recompile_limit` (8) compiles of one frame, Dynamo gives up and runs that
# function eagerly, with only a logged warning.
#
# ## Guess, then look
#
# Eager, the naive forward ran five ops at the top level ([chapter 1](01_naive.ipynb); chapter 6
# counts seven *work* ops, the ones beneath them included), and `masked_fill` cloned the scores.
# What will the compiled forward's trace hold? Write down which ATen ops you expect to still see
# by name, each as many times as it runs (the order does not count), before reading on.

# %%
guess_compiled_ops = ["aten::bmm", "aten::mul", "aten::masked_fill",  # edit me before running on
                      "aten::softmax", "aten::bmm"]

# %%
runs = {name: record.profile(fn, q, k, v, label=f"{name}_forward", active=active_steps, trace_dir=trace_dir)
        for name, fn in {**compiled_mod, "eager_naive": eager["naive"].forward}.items()}
step = {name: reader.median_step(r.steps()) for name, r in runs.items()}

# %% tags=["remove-input"]
seen_aten = [n for n in step["naive"].ops["name"] if n.startswith("aten::") and n != "aten::resolve_conj"]
region_of = {name: list(torch_compile.regions(step[name])["name"]) for name in compiled_mod}
lesson(region_of["naive"] == ["Torch-Compiled Region: 0/0"] and len(region_of["inplace"]) == 1
       and region_of["inplace"][0].startswith("Torch-Compiled Region: 0/"),
       "compiled, the in-place module runs in frame 0 too: it inherits the naive module's forward",
       f"naive {region_of['naive'][0]}, in-place {region_of['inplace'][0] if region_of['inplace'] else 'none'}")
glue_all(inplace_region=region_of["inplace"][0].removeprefix("Torch-Compiled Region: "))
say("ATen ops in the compiled forward: " + ch07.ops_present(guess_compiled_ops, seen_aten))

# %%
ch07.shown(tables.op_table(step["naive"]))

# %% [markdown]
# The top level is no longer our code. `TorchDynamo Cache Lookup` checks the guards (same
# shapes, dtypes, grad mode...) that decide whether the compiled code fits this call; the
# `Torch-Compiled Region` is the compiled graph running. Inside it, two short wrapper rows come
# first: `Pregraph bytecode` (Dynamo's Python that runs before the graph) and
# `AOTDispatcher Runtime Wrapper Prologue` (AOTAutograd, the layer between Dynamo and Inductor,
# preparing the inputs). Then two `aten::bmm` (the matmuls, which Inductor hands to the same
# library as eager PyTorch does) and one kernel Inductor wrote, named after the ops it fused. The times are those of one profiled step:
# they say where that step's time went, not which forward is faster (a benchmark's job; see the
# graph break below).

# %%
gen = {name: torch_compile.generated_kernels(step[name]) for name in compiled_mod}
ch07.kernels_table(gen["naive"])

# %% tags=["remove-input"]
lesson(len(torch_compile.regions(step["naive"])) == 1, "the compiled naive forward runs as one compiled region")
lesson(len(step["naive"].find("aten::bmm")) == 2, "the two matmuls stay: two aten::bmm calls per forward")
lesson(all(step["naive"].find(op).empty for op in ("aten::mul", "aten::masked_fill", "aten::softmax", "aten::clone")),
       "scale, mask and softmax no longer run as ATen ops, and nothing is cloned")
lesson(len(gen["naive"]) == 1 and {"softmax", "masked_fill", "mul"} <= set(gen["naive"]["fused"].iloc[0]),
       "one generated kernel fuses the scale (mul), the mask (masked_fill) and the softmax", ", ".join(gen["naive"]["name"]))
glue_all(c_kernel=gen["naive"]["name"].iloc[0])

# %% [markdown]
# The kernel Inductor wrote, {glue:text}`c_kernel`, is named after the ops it took over:
# scale, mask and softmax became one pass over the scores instead of three.
#
# ## masked_fill or masked_fill_: the compiler does not care
#
# Chapter 2 removed a clone by writing `masked_fill_`. Under `torch.compile`, both modules
# are *functionalized* first (in-place ops rewritten as out-of-place ones on a graph with no
# aliasing), and Inductor then decides itself which buffers to reuse. So the two modules
# should compile to the same code:

# %% tags=["remove-input"]
lesson(gen["naive"]["fused"].tolist() == gen["inplace"]["fused"].tolist()
       and len(step["naive"].ops) == len(step["inplace"].ops),
       "compiled, the naive and in-place modules run the same kernels and the same number of ops",
       "both: " + "; ".join(", ".join(f) for f in gen["naive"]["fused"]))

# %% [markdown]
# ## What happens to the S×S copy and to memory
#
# Eager, the naive forward allocated the scores, the scaled scores, the clone and the
# softmax output: four S×S buffers, two alive at once. Compiled, Inductor writes the softmax
# into the buffer the first matmul produced (it knows nothing else reads it), so one S×S
# buffer is all the forward allocates:

# %%
mem = ch07.memory_table({"eager naive": step["eager_naive"], "compiled naive": step["naive"],
                         "compiled in-place": step["inplace"]}, scores_bytes)
mem

# %% tags=["remove-input"]
lesson(list(mem["S×S buffers allocated"]) == [4, 1, 1] and list(mem["copies of S×S"]) == [1, 0, 0],
       "eager, the naive forward allocates four S×S buffers and copies one; compiled, each forward "
       "allocates one and copies none")
lesson(step["naive"].peak_bytes < 2 * scores_bytes <= step["eager_naive"].peak_bytes,
       "the compiled peak stays under two S×S buffers; the eager peak reaches two",
       f"{mib(step['naive'].peak_bytes):.1f} vs {mib(step['eager_naive'].peak_bytes):.1f} MiB")
glue_all(c_peak_mib=f"{mib(step['naive'].peak_bytes):.1f}", e_peak_mib=f"{mib(step['eager_naive'].peak_bytes):.1f}")

# %% [markdown]
# Peak memory falls from {glue:text}`e_peak_mib` MiB to {glue:text}`c_peak_mib` MiB. The S×S
# buffer is still there: fusion removed the *extra* passes over the scores, not the scores.
# Removing those takes a kernel that never writes them out, which is where the second half
# of this chapter goes.

# %%
#| caption: One forward of naive attention compiled by `torch.compile`: the matmuls remain, and one kernel Inductor generated (named after the ops it fused) stands where scale, mask and softmax ran as separate ops.
#| alt: Timeline of the compiled forward: the compiled graph's call with the matmuls and a single fused kernel beneath it.
timeline.timeline(step["naive"], title=f"compiled naive attention, one forward ({device.type})")

# %% tags=["remove-input"]
links.links(runs["naive"])

# %% [markdown]
# ## On a GPU
#
# On a GPU, Inductor writes Triton kernels instead of C++ loops, and names them the same
# way: `triton_poi_fused_...` for a pointwise pass, `triton_per_fused_...` or
# `triton_red_fused_...` for a softmax (`per` keeps a whole row in one block, `red` loops over
# it), next to the matmuls ([GEMMs](glossary.md#gemm)) it leaves to [cuBLAS](glossary.md#cublas).
#
# The trace *A100 compiled call* (see the box at the top) holds one call of a small compiled
# function on an A100. Before the reveal: how many kernels did the GPU run for it, and what share
# of the compiled region's CPU time (in %) was the GPU busy?

# %%
guess_kernels, guess_gpu_busy_percent = 3, 50  # edit me before running on

# %% [markdown]
# The A100 compiled call's ops, then its kernels:

# %%
call = torch_compile.compiled_call(COMPILED_POINTWISE)

# %% tags=["remove-input"]
display(ch07.shown(call.ops), ch07.shown(call.kernels))
reveal(guess_kernels, len(call.kernels), "kernels", source="A100 compiled call")
reveal(guess_gpu_busy_percent, round(100 * call.busy_share, 2), "GPU busy share of the compiled region, %",
       source="A100 compiled call")
lesson(len(call.kernels) == 1 and call.kernel.family == "triton" and call.kernel.kind == "elementwise",
       "the compiled call ran one kernel, a pointwise Triton kernel Inductor generated",
       f"{call.kernel.name}: " + ", ".join(torch_compile.fused_ops(call.kernel.name)) + " in one pass")
lesson(call.names[:3] == ["TorchDynamo Cache Lookup", call.names[1], call.kernel.name] and "Compiled Region" in call.names[1],
       "Dynamo's guard check, then the compiled region, and inside it an op named after the kernel", " > ".join(call.names))
lesson(set(call.kernels["launcher"]) == {"cuLaunchKernel"},
       "Inductor's kernel is launched through the driver API (cuLaunchKernel), not cudaLaunchKernel")
lesson(call.busy_share < 0.1, "the GPU was busy for under a tenth of the compiled region's CPU time", f"{call.busy_share:.2%}")
glue_all(compiled_gpu_us=f"{call.gpu_us:.2f}", compiled_region_us=f"{call.region_us:,.0f}")
if device.type == "cuda":  # this run's own compiled forward
    display(ch07.compiled_forward(step["naive"].gpu_work))

# %% [markdown]
# `cuLaunchKernel` is the driver call Triton uses: the row to look for when a search for
# `cudaLaunchKernel` finds nothing. The kernel's name lists what Inductor fused into one
# pass over memory: an add, a cos and a sin. It ran {glue:text}`compiled_gpu_us` µs
# against a region of {glue:text}`compiled_region_us` µs on the CPU: for a call this small,
# compiling removed the passes over memory, and what is left is the CPU's work around one
# launch.
#
# ## A graph break
#
# Dynamo captures what it can trace. When it meets something it cannot (a `print`, an
# unsupported library call, Python branching on a tensor's value), it ends the graph, runs
# that line in plain Python, and starts a new graph after it: a *graph break*.
# `BrokenAttention` is the naive module with an explicit break just before the mask:

# %%
show_lines(torch_compile.BrokenAttention, "def mask_scores", "return super")

# %%
broken = torch.compile(torch_compile.BrokenAttention(causal=True), dynamic=False)
explained = torch._dynamo.explain(torch_compile.BrokenAttention(causal=True))(q, k, v)
print("reason:", explained.break_reasons[0].reason.splitlines()[0] if explained.break_reasons else "none")
broken_step = reader.median_step(record.profile(broken, q, k, v, label="broken", active=active_steps,
                                                trace_dir=trace_dir).steps())

# %% tags=["hide-output"]
ch07.shown(tables.op_table(broken_step))

# %% [markdown]
# The trace (the op table above, folded) shows a break as more than one `Torch-Compiled
# Region` per forward (with a `TorchDynamo Cache Lookup` before each), and fusion stops at the break: every tensor that
# crosses it has to exist in memory, and the kernels on either side cannot be merged. (The broken
# module's regions are numbered from `0/0` again, not `0/3`: `explain`, called just before, resets Dynamo.)

# %%
broken_gen = torch_compile.generated_kernels(broken_step)
ch07.kernels_table(broken_gen)

# %% tags=["remove-input"]
lesson(len(explained.break_reasons) >= 1 and len(torch_compile.regions(broken_step)) > explained.graph_count - 1 > 0,
       "Dynamo's explain finds the break, and the trace shows it as more than one compiled region per forward",
       f"{explained.graph_count} graphs, {len(explained.break_reasons)} break reason, "
       f"{len(torch_compile.regions(broken_step))} regions in one forward")
lesson(not any(len({"mul", "masked_fill", "softmax"} & set(f)) > 1 for f in broken_gen["fused"]),
       "across the break, no generated kernel fuses two of scale, mask and softmax",
       ", ".join(broken_gen["name"]))
gb_allocs = torch_compile.score_buffers(broken_step, scores_bytes)
lesson(gb_allocs > 1, "the break costs S×S allocations the unbroken compile avoids", f"{gb_allocs} vs 1")
glue_all(gb_graphs=explained.graph_count, gb_breaks=explained.graph_break_count, gb_reasons=f"{len(explained.break_reasons)} break reason" + "s" * (len(explained.break_reasons) != 1),
         gb_regions=len(torch_compile.regions(broken_step)), gb_allocs=gb_allocs,
         gb_timing=ch07.break_timing(ch07.in_turns({"broken": partial(broken, q, k, v),
                                                    "unbroken": partial(compiled_mod["naive"], q, k, v)}, device)))

# %% [markdown]
# One break in our code (`explain` lists {glue:text}`gb_reasons`, the `graph_break()` call; it
# counts every graph after the first as a break, hence its {glue:text}`gb_breaks` breaks) became
# {glue:text}`gb_graphs` graphs and {glue:text}`gb_regions`
# compiled regions in the trace: the break sits in `mask_scores`, called from `attend`,
# called from `forward`, and Dynamo splits every frame on that call stack at the break (each
# resumes in a graph of its own). With the break the forward allocates
# {glue:text}`gb_allocs` S×S buffers instead of one. (A generated kernel's `graph_N_` prefix is
# Inductor's count of the graphs it has compiled in this process, so the broken module's kernels
# start at whatever number the graphs before them left.) The op tables' single steps rank neither
# forward ([*Measuring honestly*](appendix/measuring.ipynb)). {glue:text}`gb_timing`
# `torch._dynamo.explain(fn)(*args)` lists the breaks and their reasons without a profiler; the
# trace shows what they cost.
#
# ## FlexAttention: a mask, compiled into the kernel
#
# FlexAttention takes attention's two customization points as Python functions: a
# `score_mod(score, b, h, q_idx, kv_idx)` that changes a score, and a
# `mask_mod(b, h, q_idx, kv_idx)` that says whether a query may see a key. Compiled, it
# becomes one fused kernel in the style of FlashAttention (tiles of queries against tiles of
# keys, an online softmax, no S×S buffer). The library's `flex` calls it with a causal
# `mask_mod` (offset is Sk − Sq, 0 here), made into a block mask by `create_block_mask`
# (`kernels/attention/torch_compile.py`):

# %%
display(show_lines(torch_compile.causal_mod, "def causal(b", "return kv_idx"),
        show_lines(torch_compile.flex, "mask = causal_block_mask", "return flex_call"))

# %% [markdown]
# `create_block_mask` evaluates the `mask_mod` ahead of time and records, per tile of
# 128 queries × 128 keys, whether the tile is full (compute without masking), partial
# (compute and mask each score) or empty (skip it). Before looking: at this chapter's
# length, how many tiles per head will the causal mask let the kernel skip?

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
           f"with S a multiple of the tile size, the causal mask skips the n(n-1)/2 tiles above the "
           f"diagonal and masks only the n on it (n = {n})", f"{counts.skipped} skipped, {counts.partial} masked")
glue_all(flex_tiles=counts.total, flex_skipped=counts.skipped, flex_skip_share=f"{100 * counts.skipped_share:.1f}")

# %% [markdown]
# Of {glue:text}`flex_tiles` tiles, {glue:text}`flex_skipped`
# ({glue:text}`flex_skip_share`%) are never computed. The share tends to one half as S grows
# (the diagonal's tiles are a smaller and smaller part); at short lengths it is well below.
#
# Is it right, and what does its trace hold? On a GPU, compiled flex runs Inductor's
# FlexAttention template, one Triton kernel per forward whose name starts `triton_tem_fused_`,
# like SDPA's fused backends; on a CPU it is Inductor's C++ template, run inside the compiled
# region. A template's kernel is named after the template, not after ops it fused: on a CPU just
# `graph_N_kernel`.

# %%
flex = kernels.get("flex")
flex_timed = torch_compile.timed_compiles(flex, q, k, v)
flex_step = reader.median_step(record.profile(flex, q, k, v, label="flex", active=active_steps,
                                              trace_dir=trace_dir).steps())
ch07.shown(tables.op_table(flex_step))

# %% tags=["remove-input"]
lesson(flex_timed.first.graphs >= 1 and flex_timed.steady.graphs == 0 and not flex_timed.steady.gave_up,
       "flex compiles on its first call at this shape and never again at it",
       f"first call {ch07.compiles_text(flex_timed.first)}; later calls {ch07.compiles_text(flex_timed.steady)}")
verdict = reference.judge(flex(q, k, v), q, k, v, causal=True)
lesson(verdict.ok, "flex with the causal block mask matches the float64 reference", str(verdict))
lesson(flex_step.find("aten::bmm").empty and flex_step.find("aten::softmax").empty,
       "flex runs no matmul or softmax op of its own: the whole attention is inside the compiled region")
lesson(flex_step.allocated_bytes < scores_bytes,
       "a flex forward allocates less than one S×S buffer in total",
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
# ({glue:text}`flex_out_mib` MiB) and {glue:text}`flex_work_mib` MiB the generated kernel
# allocates for its own work (a layout this page does not take apart), never an S×S score buffer
# ({glue:text}`scores_mib` MiB). (Its first call here took {glue:text}`flex_first_s` s. Its region
# reads {glue:text}`flex_region`: the first compile of a frame Dynamo met after those above.)
#
# How fast is it against SDPA's flash backend? Both skip the work above the diagonal and keep the
# scores in tiles. A CPU timing of the two says little about GPUs; the PyTorch blog reports
# FlexAttention at about 90% of FlashAttention-2's forward speed on an A100 (a quoted figure, not
# measured here). What flex buys is the mask: any `mask_mod` or `score_mod`, at a fused kernel's
# memory.
#
# ## A score_mod: ALiBi without an S×S bias
#
# ALiBi (Press et al., "Train Short, Test Long", 2021) adds no position embedding; it adds
# a per-head linear penalty to each score, slope_h · (j − i), so distant keys weigh less.
# SDPA can only take that as an explicit `attn_mask` of S×S biases built in memory. On a GPU
# only the flash backend refuses a mask (`check_for_attn_mask` is among the constraints of
# `can_use_flash_attention` in PyTorch's `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`);
# the memory-efficient backend takes a float bias and cuDNN checks only the mask's shape, so
# SDPA can run ALiBi in a fused kernel, but it reads an S×S bias from memory to do it. With
# flex it is a short function of the indices, with the per-head slopes it captures:

# %%
show_lines(torch_compile.alibi, "slopes = torch.tensor", "return score +")

# %%
flex_alibi = partial(torch_compile.flex_call, block_mask=block_mask, score_mod=torch_compile.alibi(heads, device))
alibi_out = flex_alibi(q, k, v)

# %% tags=["remove-input"]
err, bound = torch_compile.alibi_error(alibi_out, q, k, v)
lesson(err <= bound, "flex with ALiBi matches the float64 ALiBi attention computed here",
       f"max abs error {err:.1e} <= {bound:.1e}")
moved = reference.max_abs_error(alibi_out, reference.attention(q, k, v, causal=True))
lesson(moved > 100 * bound, "and it is not plain causal attention: the bias moves the output far beyond that bound",
       f"max abs difference from plain causal attention {moved:.2f}")
alibi_step = reader.median_step(record.profile(flex_alibi, q, k, v, label="flex_alibi", active=active_steps,
                                               trace_dir=trace_dir).steps())
lesson(alibi_step.allocated_bytes < scores_bytes,
       "flex with ALiBi still allocates less than one S×S buffer: the bias is computed in the kernel",
       f"{mib(alibi_step.allocated_bytes):.2f} MiB")

# %% [markdown]
# ## What to remember
#
# - A compiled forward shows one `Torch-Compiled Region` per graph, holding the library calls
#   Inductor kept (the two matmuls) and the kernels it wrote, named after what they fused.
# - Fusion removed the S×S clone and the passes between the matmuls; the in-place trick
#   stops mattering, because the compiler picks buffers itself. The scores buffer stays.
# - The first call pays for compiling, or for loading the compiled code from Inductor's cache
#   ({glue:text}`c_first_s` s here); count it apart from steady-state time, and keep it out of
#   profiled windows. Count the compiles too (Dynamo's counters), not only the time: a new shape
#   or another module through the same `forward` compiles it again (`0/1`, `0/2` here); after
#   `recompile_limit` (8) compiles the function runs eagerly.
# - A graph break shows as a second region, and fusion stops at it.
# - FlexAttention compiles the mask into a fused kernel: causal tiles above the diagonal
#   are skipped ({glue:text}`flex_skip_share`% here), and score_mods like ALiBi cost no
#   S×S memory.
#
# Next: attention inside a whole transformer block, and how much of the block it is.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/07_compiled.ipynb), with automatic checks, hints and hidden solutions.

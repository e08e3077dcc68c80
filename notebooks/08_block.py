# %% [markdown]
# # 8. One transformer block
#
# Attention never runs alone. In a model it sits in a block: a layer norm, the projection
# that makes q, k and v, attention, an output projection, a residual add, a second norm, an
# MLP and a second residual add. This chapter profiles one such block and asks how much of
# it attention is: of the arithmetic, of the time, of the memory, and how that share moves
# as the sequence grows. Then it compiles the block and asks what a fused MLP would change.
#
# **You will learn to:**
#
# - count a block's FLOPs by part, and attention's share as the sequence grows;
# - split a profiled block by its labelled parts into time and memory, with each attention of
#   the registry plugged in;
# - see where the choice of attention shows first: S×S buffers inside the block, or none;
# - split a real model's GPU step by kind of work (GEMMs, attention, elementwise passes, copies);
# - read the compiled block: what Inductor fuses, what stays a library call, and what a fused
#   MLP would save.
#
# **Before you start:** [3b. The fused backends](03b_sdpa_fused.ipynb) and [7. Compiled
# attention](07_compiled.ipynb). A transformer block's parts (layer norm, MLP, residual add), as
# the paragraph above lists them.
#
# **Time:** about {reading_minutes} min to read.
#
# The block follows nanoGPT's `Block` (Andrej Karpathy, `model.py`): pre-norm, GELU MLP
# four times the width, biases on. Its attention is any implementation the registry holds.

# %% [install]

# %% [parameters]

# %%
from kernels.attention.torch_compile import keep_inductor_cache_in_build
from kernels.trace import reader, record, tables

print("Inductor cache:", keep_inductor_cache_in_build() or "Inductor's default folder")

import functools

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch._inductor.config as inductor_config

import kernels
from kernels import gpu_lessons
from kernels.borrowed import TRACELENS
from kernels.attention import block as blocks, torch_compile
from kernels.attention.block import Block
from kernels.notebook import glue, lesson, mib, reveal, setup, show_source
from kernels.trace.attention import find_attention
from kernels.trace.links import links

inductor_config.cpp.enable_kernel_profile = True   # name Inductor's C++ kernels in CPU traces
torch.set_grad_enabled(False)                      # inference only; one grad mode for Dynamo's guards

device, dtype = setup(device, dtype)
width = heads * head_dim
torch.manual_seed(0)
# tokens(S): the block's [batch, S, width] input, seeded by S; make_block(attention): the same weights for every attention
tokens = functools.partial(blocks.block_input, batch, width=width, device=device, dtype=dtype)
make_block = functools.partial(blocks.seeded_block, width, heads, device=device, dtype=dtype)
x = tokens(seq)
print(f"x: {tuple(x.shape)} [batch, seq, width], width = {heads} heads × {head_dim}, {dtype} on {device}")

# %% [markdown]
# ## The module
#
# Each part runs inside a `record_function` label, so a profiled forward can be split by
# part; the shape comments mark where tensors change shape.

# %%
show_source(Block)

# %% [markdown]
# Every attention in the registry takes the same q, k, v, so swapping it changes nothing
# else. First a check that they agree inside the block:

# %%
runnable = [n for n, why in kernels.available(device).items() if why is None]
# Left out: Triton's interpreter on a CPU (seconds per call, not a performance number) and
# the compiled entries, which compile once per shape (the compiled block below covers them).
plugged = [n for n in runnable if n not in ("compiled_naive", "flex")
           and not (n == "triton" and device.type == "cpu")]
outs = {name: make_block(name)(x) for name in plugged}
base = outs[plugged[0]]
worst = max((o - base).abs().max().item() for o in outs.values()) / base.abs().max().item()
lesson(worst <= 1e-4 if dtype == torch.float32 else worst <= 5e-2,
       f"the block gives the same output with every attention plugged in ({', '.join(plugged)})",
       f"largest relative difference {worst:.1e}")

# %% [markdown]
# ## Where the arithmetic goes
#
# The matmuls do nearly all of a block's arithmetic. Per token, the four linear layers cost
# 2·W·(3W + W + 4W + 4W) = 24·W² FLOPs; attention costs 4·S·W per token (q kᵀ and
# probs · v over all S keys), so its share is S / (S + 6W) for an attention that computes
# every score, and it grows with S at a fixed width. PyTorch's `FlopCounterMode` counts what
# actually ran; we count the block with hand-written `naive` attention (which computes the
# full S×S scores, masked or not) at a few lengths and compare with the formula.
#
# Before looking: at what sequence length do you think attention becomes half of this
# block's arithmetic (width {glue:text}`b_width`)?

# %%
guess_half_at_seq = 1024  # edit me before running on
glue("b_width", width)

# %%
seqs = [64, 128, 256, 512, 1024]
naive_block = make_block("naive")
rows = []
for s in seqs:
    counted = blocks.counted_flops(naive_block, tokens(s))
    formula = blocks.flops_by_part(s, width, batch)
    rows.append({"seq": s, "linear (GFLOP)": counted.get("addmm", 0) / 1e9, "attention (GFLOP)": counted.get("bmm", 0) / 1e9,
                 "formula linear": (formula["qkv"] + formula["proj"] + formula["mlp"]) / 1e9,
                 "formula attention": formula["attention"] / 1e9})
fl = pd.DataFrame(rows).set_index("seq")
fl["attention share"] = fl["attention (GFLOP)"] / (fl["attention (GFLOP)"] + fl["linear (GFLOP)"])
display(fl.round(4))
lesson(((fl["linear (GFLOP)"] - fl["formula linear"]).abs() < 1e-9).all()
       and ((fl["attention (GFLOP)"] - fl["formula attention"]).abs() < 1e-9).all(),
       "FlopCounterMode counts exactly the formula's FLOPs: 24·B·S·W² in the linear layers, 4·B·S²·W in attention")
lesson(fl["attention share"].is_monotonic_increasing and fl["attention share"].iloc[-1] > fl["attention share"].iloc[0],
       "attention's share of the block's FLOPs grows with the sequence length at fixed width",
       " -> ".join(f"{s:.1%}" for s in fl["attention share"]))
# Where attention (∝ S²) equals the rest (∝ S), from the counts at one length.
s0 = seqs[-1]
half_at = s0 * fl.loc[s0, "linear (GFLOP)"] / fl.loc[s0, "attention (GFLOP)"]
reveal(guess_half_at_seq, half_at, "the length where attention is half the FLOPs")
glue("b_half_at", f"{half_at:.0f}")
glue("b_share_first", f"{100 * fl['attention share'].iloc[0]:.1f}")
glue("b_share_last", f"{100 * fl['attention share'].iloc[-1]:.1f}")
glue("b_seq_first", seqs[0])
glue("b_seq_last", seqs[-1])

# %% [markdown]
# Attention's share of the arithmetic grows from {glue:text}`b_share_first`% at
# S={glue:text}`b_seq_first` to {glue:text}`b_share_last`% at S={glue:text}`b_seq_last`,
# and passes one half at S = {glue:text}`b_half_at` (6·W). A causal kernel that skips the
# tiles above the diagonal (SDPA flash, chapter 4's Triton kernel, flex) does about half of
# that attention work, which moves the crossing to about 12·W.

# %%
#| caption: Attention's share of one transformer block's FLOPs against sequence length: counted by FlopCounterMode (points) and by formula (line). It passes one half at S = 6·W, the model width times six.
#| alt: Line chart of attention's share of a block's FLOPs rising with sequence length on a log axis, counted points on the formula's curve, crossing one half.
grid = [32 * 2**i for i in range(9)]
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.plot(fl.index, fl["attention share"], "o", label="counted (FlopCounterMode, naive attention)")
ax.plot(grid, [blocks.attention_share(s, width) for s in grid], "-", label="S / (S + 6W): all scores computed")
ax.plot(grid, [blocks.attention_share(s, width, causal_skip=True) for s in grid], "--",
        label="S / (S + 12W): causal tiles skipped")
ax.axhline(0.5, color="grey", lw=0.6)
ax.set(xscale="log", xlabel="sequence length S", ylabel="attention's share of block FLOPs",
       title=f"one block, width {width}", ylim=(0, 1))
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Where the time and memory go
#
# Now the block as it runs, with each attention implementation that runs here plugged in.
# The profiler's labelled ranges give each part's time; the memory events give what each
# part allocates.

# %%
#| caption: Where one block's CPU time goes with each attention plugged in: the shares of norm1, qkv, attention, proj, norm2 and the MLP in one profiled step. One profiled step per bar: shares, not a benchmark.
#| alt: Stacked horizontal bars, one per attention implementation, splitting the block's CPU time into norm1, qkv, attention, proj, norm2 and mlp.
scores_bytes = batch * heads * seq * seq * x.element_size()
part_ms, memory, block_steps = {}, {}, {}
for name in plugged:
    run = record.profile(make_block(name), x, label="block", wait=0, warmup=1, active=min(active_steps, 3),
                            trace_dir=trace_dir, trace_name=f"block_{name}")
    block_steps[name] = reader.median_step(run.steps())
    part_ms[name] = {p: pd.Series([s.cpu_time_us for s in run.trace.steps(f"block.{p}")]).median() / 1e3
                     for p in blocks.PARTS}
    att = run.trace.steps("block.attention")[-1]
    memory[name] = {"block peak (MiB)": mib(block_steps[name].peak_bytes),
                    "block allocated (MiB)": mib(block_steps[name].allocated_bytes),
                    "attention allocated (MiB)": mib(att.allocated_bytes),
                    "largest allocation (MiB)": mib(block_steps[name].memory["bytes"].max())}
times = pd.DataFrame(part_ms).T
times["block (ms)"] = times.sum(axis=1)
shares = times[list(blocks.PARTS)].div(times["block (ms)"], axis=0)
display(times.round(2))
display(pd.DataFrame(memory).T.round(2))
ax = shares.plot.barh(stacked=True, figsize=(7, 0.5 + 0.45 * len(shares)), width=0.7)
ax.set(xlabel="share of the block's CPU time", title=f"one block at S={seq}, width {width}")
ax.legend(ncol=3, fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.3))  # 10 pt: read at the column's width
plt.show()

# %%
largest = {n: block_steps[n].memory["bytes"].max() for n in plugged}
hand = [n for n in plugged if n in ("naive", "inplace", "sdpa_math")]
fused = [n for n in plugged if n == "sdpa_flash"]
lesson(all(largest[n] >= scores_bytes for n in hand),
       "with hand-written or math attention, the block's largest allocation is an S×S buffer (or more)",
       ", ".join(f"{n}: {mib(largest[n]):.1f} MiB" for n in hand))
if fused:
    lesson(largest["sdpa_flash"] < scores_bytes,
           "with SDPA flash, no allocation in the whole block is as large as one S×S buffer",
           f"{mib(largest['sdpa_flash']):.2f} MiB < {mib(scores_bytes):.1f} MiB")
    lesson(block_steps["sdpa_flash"].peak_bytes < min(block_steps[n].peak_bytes for n in hand),
           "and the block's peak memory is lowest with SDPA flash")
glue("b_seq", seq)
glue("b_att_share_naive", f"{100 * shares.loc[plugged[0], 'attention']:.0f}")
glue("b_mlp_share_naive", f"{100 * shares.loc[plugged[0], 'mlp']:.0f}")

# %% [markdown]
# At S={glue:text}`b_seq`, attention took {glue:text}`b_att_share_naive`% of the block's CPU
# time with `naive` plugged in, and the MLP {glue:text}`b_mlp_share_naive`%. Memory is where
# attention's choice shows without any noise: the hand-written versions allocate S×S
# buffers inside the block, SDPA flash never does.
#
# ## Attention's share of the time as S grows
#
# The FLOP share was certain from the shapes. The time share is a measurement, on a shared
# two-core machine. We measure the naive block's attention share at three lengths, twice,
# and state the trend only if both repeats agree and the ranges do not overlap:

# %%
trend_seqs = [seq // 4, seq // 2, seq]
repeats = []
for r in range(2):
    share = {}
    for s in trend_seqs:
        run = record.profile(naive_block, tokens(s), label="block", wait=0, warmup=1, active=2,
                                trace_dir=trace_dir, trace_name=f"trend_{s}_{r}")
        attention_us = sum(st.cpu_time_us for st in run.trace.steps("block.attention"))
        share[s] = attention_us / sum(st.cpu_time_us for st in run.steps())
    repeats.append(share)
trend = pd.DataFrame(repeats, index=["repeat 1", "repeat 2"]).T
display(trend.style.format("{:.1%}"))
lo, hi = trend.min(axis=1), trend.max(axis=1)
robust = all(lo.iloc[i + 1] > hi.iloc[i] for i in range(len(trend_seqs) - 1))
if robust:
    lesson(robust, "attention's share of the block's time grows with S (both repeats agree, ranges apart)",
           " -> ".join(f"{v:.0%}" for v in trend.mean(axis=1)))
else:
    print("Too noisy to state a trend in time: at some length the two repeats' ranges overlap the next "
          "length's (the FLOP share above is the certain statement).")
glue("b_trend_verdict", "both repeats agree that it grows" if robust else "this run was too noisy to say")

# %% [markdown]
# Measured: {glue:text}`b_trend_verdict`. Whatever the timings say on a given day, the FLOP
# counts above fix the direction: at a fixed width the linear layers grow with S and
# attention with S², so a long enough sequence is dominated by attention.
#
# ## A real model's step on a GPU
#
# The block above is small and runs on a CPU. A real decoder on a GPU is the same parts in a
# different costume: Qwen1.5-0.5B-Chat has 24 layers of width 1024, each with RMSNorm instead of
# layer norm, rotary position embeddings, attention through SDPA and a SwiGLU MLP (three linear
# layers). AMD's TraceLens project profiled one forward of it, 16 prompts of 559 tokens in
# bfloat16 (559 tokens each in the attention calls' shapes), on an H100; it is not this book's run, and is credited under the table. Every piece
# of GPU work in that step is sorted here by what it is: the attention calls that
# `kernels.trace.attention.find_attention` finds, then every other kernel by its name's
# fingerprint (`kernels.trace.fingerprints`), with the ATen ops that launched most of each part's
# time.
#
# Before the reveal: rank four of those parts by the GPU time you think they took, most first.

# %%
guess_parts_order = ["GEMMs (the linear layers)", "attention", "elementwise passes", "copies and casts"]  # edit me

# %%
qwen = TRACELENS["h100_qwen"]
qwen_trace = qwen.trace()
qwen_report = find_attention(qwen.step(trace=qwen_trace))
parts = blocks.gpu_time_by_part(qwen_report)
layers = len(qwen_report.calls)   # one attention per decoder layer
display(parts.assign(**{"GPU ms": parts["GPU µs"] / 1e3, "per layer (µs)": parts["GPU µs"] / layers})
        .drop(columns="GPU µs").style.format({"GPU ms": "{:.2f}", "per layer (µs)": "{:.0f}", "share of the step": "{:.1%}"}))
print(qwen.credit(qwen_trace))
display(reveal(guess_parts_order, [p for p in parts.index if p in guess_parts_order], "parts, most GPU time first"))

# %%
#| caption: Where the GPU time of one Qwen1.5-0.5B forward (16 x 559 tokens, bf16, 24 layers) went on an H100, by kind of work: attention from its calls, the rest by kernel name. Recorded by AMD's TraceLens project, not this book's run.
#| alt: Horizontal bars of the share of the step's GPU time per part; elementwise passes longest, then GEMMs, copies, attention, reductions.
ax = parts["share of the step"].iloc[::-1].plot.barh(figsize=(7, 3), color="tab:blue")
ax.set(xlabel="share of the step's GPU time", ylabel="", title=f"{qwen_report.device}: one forward, {layers} layers")
plt.show()

# %%
gemms, elementwise, copies = (parts.loc[blocks.GPU_PARTS[k]] for k in ("gemm", "elementwise", "copy"))
attention_part = parts.loc[blocks.GPU_PARTS["attention"]]
lesson(abs(attention_part["share of the step"] - qwen_report.attention_share) < 1e-9 and attention_part["kernels"] == layers,
       "attention is one kernel per layer, and its share of the step is find_attention's",
       f"{layers} calls, {attention_part['share of the step']:.1%} of the step's GPU time")
lesson(gemms["kernels"] // layers == 7,
       "each layer runs seven GEMMs: the q, k, v and output projections and the MLP's three",
       f"{gemms['kernels']} GEMM kernels for {layers} layers")
lesson(elementwise["GPU µs"] + copies["GPU µs"] > gemms["GPU µs"] > attention_part["GPU µs"],
       "at this size the elementwise passes and copies take more GPU time than the GEMMs, and the GEMMs more "
       "than attention", f"{(elementwise['GPU µs'] + copies['GPU µs']) / 1e3:.1f} ms vs {gemms['GPU µs'] / 1e3:.1f} ms "
       f"vs {attention_part['GPU µs'] / 1e3:.1f} ms")
glue("q_att_share", 100 * attention_part["share of the step"]); glue("q_gemm_share", 100 * gemms["share of the step"])
glue("q_elem_share", 100 * (elementwise["share of the step"] + copies["share of the step"]))
glue("q_elem_kernels", int(elementwise["kernels"] + copies["kernels"])); _ = glue("q_layers", layers)

# %% [markdown]
# Attention took {glue:text}`q_att_share:.1f`% of this step's GPU time, the GEMMs
# {glue:text}`q_gemm_share:.0f`%, and elementwise passes, copies and casts together
# {glue:text}`q_elem_share:.0f`%: {glue:text}`q_elem_kernels` small kernels over
# {glue:text}`q_layers` layers, each reading and writing a whole activation tensor to do a few
# FLOPs per element (the `mul`, `pow` and `add` of an RMSNorm computed in float32, the casts back
# to bfloat16, the rotary embedding's `cat`). At 559 tokens attention's FLOPs are a small part
# of the layer's, as the formula above says; what the GPU spends its time on is memory traffic.
# That is what compiling the block attacks.
#
# ## The block compiled
#
# `torch.compile` takes the whole block, if Dynamo can trace all of it. Before compiling,
# `torch._dynamo.explain` says how many graphs it would make, and where and why it would
# break (it traces without compiling, so it is quick). The registry's pinned `sdpa_flash` and
# plain SDPA called directly:

# %%
show_source(blocks.sdpa_causal)

# %%
probe = torch.randn(1, 32, width, device=device, dtype=dtype)
explained = {label: torch._dynamo.explain(make_block(att, labels=False))(probe)
             for label, att in (("registry sdpa_flash", "sdpa_flash"), ("sdpa_causal", blocks.sdpa_causal))}
for label, e in explained.items():
    why = e.break_reasons[0].reason.splitlines()[0] if e.break_reasons else "no break"
    # The frames of the course's own code on the way to the break, innermost last.
    ours = [f for f in e.break_reasons[0].user_stack if "kernels" in f.filename] if e.break_reasons else []
    where = " -> ".join(f"{f.filename.rsplit('kernels', 1)[-1].strip('/')}:{f.name}" for f in ours)
    print(f"{label}: {e.graph_count} graph(s); {why}" + (f", reached from {where}" if where else ""))
lesson(all(e.graph_count == 1 for e in explained.values()),
       "the block is one graph either way: the registry's pinned entry skips its warning capture "
       "(a graph break) when torch.compile traces it", ", ".join(f"{l}: {e.graph_count}" for l, e in explained.items()))

# %%
compiled_block = torch.compile(make_block(blocks.sdpa_causal, labels=False), dynamic=False)
first, steady = torch_compile.first_and_steady(compiled_block, x, steady_calls=3)
eager_sdpa = make_block(blocks.sdpa_causal)
_, eager_steady = torch_compile.first_and_steady(eager_sdpa, x, steady_calls=3)
err = (compiled_block(x) - eager_sdpa(x)).abs().max().item() / eager_sdpa(x).abs().max().item()
lesson(err <= 1e-4 if dtype == torch.float32 else err <= 5e-2, "the compiled block computes what the eager block does",
       f"relative difference {err:.1e}")
crun = record.profile(compiled_block, x, label="compiled_block", wait=0, warmup=1, active=min(active_steps, 3),
                         trace_dir=trace_dir)
cstep = reader.median_step(crun.steps())
estep = reader.median_step(record.profile(eager_sdpa, x, label="block", wait=0, warmup=1, active=min(active_steps, 3),
                                                trace_dir=trace_dir, trace_name="block_sdpa_eager").steps())
tables.op_table(cstep)

# %%
gen = torch_compile.generated_kernels(cstep)
display(gen[["name", "fused", "dur_us"]])
matmuls = [n for n in cstep.ops["name"] if n in ("aten::addmm", "aten::mm")]
lesson(len(torch_compile.regions(cstep)) == 1, "the compiled block runs as one compiled region")
lesson(len(matmuls) == 4, "the four linear layers stay library matmuls (qkv, proj, fc_in, fc_out)",
       f"{len(matmuls)} × {sorted(set(matmuls))}")
lesson(cstep.find("aten::gelu").empty and cstep.find("aten::layer_norm").empty and cstep.find("aten::add").empty,
       "GELU, the layer norms and the residual adds no longer run as ATen ops")
fused_all = [set(f) for f in gen["fused"]]
lesson(any("gelu" in f for f in fused_all) and any({"add", "native_layer_norm"} <= f for f in fused_all),
       "Inductor wrote a GELU kernel and fused the first residual add into the second layer norm",
       ", ".join(gen["name"]))
table = pd.DataFrame({"eager": {"steady (ms)": 1e3 * eager_steady, "allocated (MiB)": mib(estep.allocated_bytes),
                                "peak (MiB)": mib(estep.peak_bytes), "ops": len(estep.ops)},
                      "compiled": {"steady (ms)": 1e3 * steady, "allocated (MiB)": mib(cstep.allocated_bytes),
                                   "peak (MiB)": mib(cstep.peak_bytes), "ops": len(cstep.ops)}}).T
display(table.round(2))
lesson(cstep.allocated_bytes < estep.allocated_bytes,
       "the compiled block allocates less than the eager one (fused ops write no intermediates)",
       f"{mib(cstep.allocated_bytes):.1f} vs {mib(estep.allocated_bytes):.1f} MiB")
glue("b_compile_s", f"{first:.1f}")
glue("b_c_alloc", f"{mib(cstep.allocated_bytes):.1f}")
glue("b_e_alloc", f"{mib(estep.allocated_bytes):.1f}")

# %% [markdown]
# Compiling took {glue:text}`b_compile_s` s on the first call (counted apart from the
# steady-state times above). The compiled block allocates {glue:text}`b_c_alloc` MiB per
# forward against {glue:text}`b_e_alloc` MiB eager: the fused kernels do not write the
# intermediates the eager ops did.
#
# ## What a fused MLP would change
#
# The MLP is the block's largest matmul work at these lengths. Eager, `fc_in` writes a
# [B, S, 4W] tensor, GELU reads it and writes another, and `fc_out` reads that. A fused MLP
# (the subject of Part 2 of the Hugging Face blog series "Profiling in PyTorch" that this
# course follows: GELU applied in the first GEMM's epilogue) writes the tensor once, already
# activated, and `fc_out` reads it once. Counting the [B, S, 4W] buffers each forward
# allocates, and finding where the GELU ran:

# %%
hidden_bytes = batch * seq * 4 * width * x.element_size()
hid = {name: int((st.memory["bytes"] == hidden_bytes).sum()) for name, st in (("eager", estep), ("compiled", cstep))}
display(pd.Series(hid, name="[B, S, 4W] buffers per forward").to_frame())
lesson(hid["eager"] == 2, "eager, the MLP allocates two [B, S, 4W] buffers: fc_in's output and GELU's")
lesson(hid["compiled"] < hid["eager"],
       "compiled, fewer: Inductor writes GELU's result into the buffer fc_in filled", f"{hid}")
# The order of matmuls and generated kernels: CPU ops on a CPU, the GPU track's kernels on a GPU.
# Matmuls are what kernels.trace.fingerprints says (cuBLAS's nvjet_* GEMMs on Hopper among them).
gpu_lessons.gelu_between_matmuls(cstep.gpu_work if len(cstep.gpu_work) else cstep.ops)
passes = {"eager or compiled": 4, "fused MLP": 2}   # writes + reads of the [B, S, 4W] tensor per forward
saved = (passes["eager or compiled"] - passes["fused MLP"]) * hidden_bytes
glue("b_hidden_mib", f"{mib(hidden_bytes):.1f}")
glue("b_saved_mib", f"{mib(saved):.1f}")

# %% [markdown]
# Each [B, S, 4W] buffer is {glue:text}`b_hidden_mib` MiB here. Eager, or compiled with
# `torch.compile`'s default settings (the matmuls stay library calls, as the lessons above
# check), it makes four trips through memory: written by `fc_in`, read and written again by
# the GELU pass, read by `fc_out`. With GELU in the first GEMM's epilogue it would make two,
# saving {glue:text}`b_saved_mib` MiB of memory traffic per forward. `mode="max-autotune"`
# can do that: it lets Inductor try its own GEMM templates against the library's, and a
# template it picks can take the GELU into its epilogue (Inductor's `epilogue_fusion`, on by
# default in `torch._inductor.config`). Attention is untouched by it:
# as S grows, attention's share of the block grows whatever the MLP does.
#
# ## What to remember
#
# - At a fixed width, attention's share of a block's arithmetic is S / (S + 6W) (or
#   S / (S + 12W) when causal tiles are skipped): small for short sequences, dominant for
#   long ones.
# - The choice of attention shows first in memory: hand-written attention allocates S×S
#   buffers inside the block; a fused kernel never does.
# - In a real model's eager step on a GPU, the small elementwise passes and copies can outweigh
#   the GEMMs: each moves a whole activation tensor for a few FLOPs.
# - Compiling the block fuses the norms, residual adds and GELU; the matmuls stay library
#   calls. A fused MLP is what would remove the [B, S, 4W] round trip.

# %%
links(crun)

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/08_block.ipynb), with automatic checks, hints and hidden solutions.

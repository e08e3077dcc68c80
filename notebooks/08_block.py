# %% [markdown]
# # 8. One transformer block
#
# Attention never runs alone. In a model it sits in a block: a layer norm, the projection that
# makes q, k and v, attention, an output projection, a residual add, a second norm, an MLP and a
# second residual add. This chapter profiles one block and asks how much of it attention is, and
# how that share moves as the sequence grows.
#
# **You will learn to:**
#
# - count a block's FLOPs by part, and attention's share as the sequence grows;
# - read a profiled block's memory by its labelled parts, with each attention plugged in;
# - split a real model's GPU step by kind of work ([GEMMs](glossary.md#gemm), attention,
#   elementwise passes, copies);
# - read the compiled block: what Inductor fuses, what stays a library call, and what a fused
#   MLP would save.
#
# **Before you start:** [3b. The fused backends](03b_sdpa_fused.ipynb) and [7. Compiled
# attention](07_compiled.ipynb).
#
# **Time:** about {reading_minutes} min to read.
#
# The block follows nanoGPT's `Block` (Andrej Karpathy, `model.py`): pre-norm, GELU MLP
# four times the width, biases on. Its attention is any implementation of this course's library.

# %% [install]

# %% [parameters]

# %%
import functools

import torch
import torch._inductor.config as inductor_config

from kernels import borrowed
from kernels.attention import block as blocks, torch_compile
from kernels.book import ch08_block
from kernels.notebook import glue, glue_all, lesson, mib, reveal, setup, show_lines
from kernels.trace import links

inductor_config.cpp.enable_kernel_profile = True   # name Inductor's C++ kernels in CPU traces
torch.set_grad_enabled(False)                      # inference only; one grad mode for Dynamo's guards

device, dtype = setup(device, dtype)
width = heads * head_dim
make_block = functools.partial(blocks.seeded_block, width, heads, device=device, dtype=dtype)
x = blocks.block_input(batch, seq, width, device=device, dtype=dtype)
# Three profiled steps give the memory events; the traces go to the book's trace folder.
memory_by_attention = functools.partial(blocks.memory_by_attention, active=min(active_steps, 3), trace_dir=trace_dir)
profile_blocks = functools.partial(blocks.profile_blocks, active=min(active_steps, 3), trace_dir=trace_dir)

# %% tags=["remove-input"]
borrowed.traces_box({"H100 Qwen": borrowed.TRACELENS["h100_qwen"]})

# %% [markdown]
# ## The module
#
# Each part runs inside a `record_function` label, so a profiled forward splits by part:

# %%
show_lines(blocks.Block, 'with self.part("norm1")', "return x")

# %% [markdown]
# Every attention takes the same q, k, v, so swapping it changes nothing else; they agree inside
# the block (the compiled ones wait: the whole block is compiled further down):

# %% tags=["remove-input"]
plugged = blocks.pluggable(device)
worst = blocks.largest_difference({name: make_block(name)(x) for name in plugged})
lesson(worst <= 1e-4 if dtype == torch.float32 else worst <= 5e-2,
       f"same block output with each attention plugged in ({', '.join(plugged)})",
       f"largest relative difference {worst:.1e}")

# %% [markdown]
# ## Where the arithmetic goes
#
# The linear layers' work grows with S (each token passes through them once), attention's with
# S² (each query meets every key). At what
# sequence length do you think attention becomes half of this block's arithmetic (width
# {glue:text}`b_width`)?

# %%
guess_half_at_seq = 1024  # edit me before running on

# %% tags=["remove-cell"]
glue("b_width", width)

# %% [markdown]
# PyTorch's `FlopCounterMode` counts the FLOPs of every op a forward dispatches. On the `meta`
# device tensors have shapes and no data, so lengths a CPU could not hold count in a moment. The
# block has `naive` attention, which computes all S×S scores, masked or not:

# %%
seqs = [128, 512, 2048, 8192]
on_meta = make_block("naive", device="meta")
fl = blocks.flop_shares(on_meta, batch, width, seqs, device="meta")
ch08_block.flop_table(fl)

# %% tags=["remove-input"]
lesson(blocks.formula_gap(fl) < 1e-9,
       "FlopCounterMode counts exactly the formula's FLOPs: 24·B·S·W² in the linear layers, 4·B·S²·W in attention")
lesson(fl["attention share"].is_monotonic_increasing and fl["attention share"].nunique() == len(seqs),
       "attention's share of the block's FLOPs grows with the sequence length at fixed width",
       " -> ".join(f"{s:.1%}" for s in fl["attention share"]))
half_at = seqs[-1] * fl["linear (GFLOP)"].iloc[-1] / fl["attention (GFLOP)"].iloc[-1]  # attention ∝ S², the rest ∝ S
reveal(guess_half_at_seq, half_at, "the length where attention is half the FLOPs", source="FlopCounterMode's counts")
glue("b_half_at", f"{half_at:,.0f}")
glue("b_share_range", f"{fl['attention share'].iloc[0]:.1%} at S={seqs[0]} to {fl['attention share'].iloc[-1]:.1%} at S={seqs[-1]}")

# %% [markdown]
# Attention's share grows from {glue:text}`b_share_range`. Per token, the four linear layers cost
# 2·W·(3W + W + 4W + 4W) = 24·W² FLOPs and attention 4·S·W (q kᵀ and probs · v over all S keys),
# so attention's share is S / (S + 6W): one half at S = 6·W = {glue:text}`b_half_at`. A causal
# [kernel](glossary.md#kernel) that skips the tiles above the diagonal does about half of that
# attention work ([chapter 6](06_showdown.ipynb)), which moves the crossing to about 12·W.

# %%
#| caption: Attention's share of one transformer block's FLOPs against sequence length: counted by FlopCounterMode (points) and by formula (solid line); dashed: a causal kernel that skips the masked tiles, which passes one half at 12·W. The count passes one half at S = 6·W, the model width times six.
#| alt: Line chart of attention's share of a block's FLOPs rising with sequence length on a log axis, counted points on the formula's curve, crossing one half.
blocks.share_figure(fl, width)

# %% [markdown]
# ## Where the memory goes
#
# Now the block as it runs, with each attention plugged in; the labelled ranges split the memory
# events by part (time is left to the GPU trace below: on a shared CPU it moves from run to run).
# With which of the attentions ({glue:text}`b_plugged`) will the block allocate an S×S buffer?

# %%
guess_scores_buffer = ["naive", "inplace"]  # edit me

# %% tags=["remove-cell"]
glue("b_plugged", ", ".join(plugged))

# %%
block_steps, memory = memory_by_attention({n: make_block(n) for n in plugged}, x)
memory

# %% tags=["remove-input"]
scores_bytes = batch * heads * seq * seq * x.element_size()
q_bytes = scores_bytes * head_dim // seq  # one [B, H, S, D] tensor, q's size
largest = {n: block_steps[n].memory["bytes"].max() for n in plugged}
hand = [n for n in plugged if n in ("naive", "inplace", "sdpa_math")]
ch08_block.reveal_set(guess_scores_buffer, [n for n in plugged if largest[n] >= scores_bytes],
                      "attentions whose block allocates an S×S buffer")
lesson(all(largest[n] >= scores_bytes for n in hand),  # the table's last column, in MiB
       "with hand-written or math attention, the block's largest allocation is an S×S buffer or more")
if "sdpa_flash" in plugged:
    lesson(largest["sdpa_flash"] < scores_bytes,  # the table's last column again
           "with SDPA flash, no allocation in the block is as large as one S×S buffer")
    lesson(block_steps["sdpa_flash"].peak_bytes < min(block_steps[n].peak_bytes for n in hand),
           "and the block's peak memory is lowest with SDPA flash")
glue("b_seq", seq)
glue("b_scores_mib", f"{mib(scores_bytes):.1f}")
flags = batch * heads * seq * seq  # one byte a score: a boolean S×S buffer, all heads
glue("b_flags_mib", f"{mib(flags):.1f}")
glue("b_q_mib", f"{mib(q_bytes):.1f}")
if "sdpa_math" in plugged and "naive" in plugged:
    at_peak = {n: ch08_block.alive_at_peak(block_steps[n]) for n in ("naive", "sdpa_math")}
    more = {size: n - at_peak["naive"].get(size, 0) for size, n in at_peak["sdpa_math"].items()
            if n != at_peak["naive"].get(size, 0)}
    lesson(block_steps["sdpa_math"].peak_bytes > block_steps["naive"].peak_bytes
           and at_peak["sdpa_math"].get(scores_bytes) == at_peak["naive"].get(scores_bytes)
           and more == {flags: 1, q_bytes: 1},
           "sdpa_math's block peaks above naive's: naive's S×S buffers plus a boolean S×S one and one of q's size",
           f"{mib(block_steps['sdpa_math'].peak_bytes):.1f} vs {mib(block_steps['naive'].peak_bytes):.1f} MiB")

# %% [markdown]
# `attention allocated` is what the `block.attention` range alone allocated; `largest allocation`
# is the biggest single buffer in the block. At S={glue:text}`b_seq` one S×S buffer (all heads) is
# {glue:text}`b_scores_mib` MiB, the largest allocation with hand-written attention.
# [SDPA](glossary.md#sdpa)'s math backend is the same algorithm in ATen ops, so it allocates S×S
# buffers too. Its higher peak also holds a boolean S×S buffer ({glue:text}`b_flags_mib` MiB)
# marking the masked scores, so that a fully masked row comes out as zeros rather than NaN, and a
# buffer of q's size ({glue:text}`b_q_mib` MiB: it scales copies of q and k rather than the
# scores; one of them is alive at the peak). Memory shows attention's choice without noise.
#
# ## A real model's step on a GPU
#
# A real decoder on a GPU has the same parts: Qwen1.5-0.5B-Chat has 24 layers of width 1024, with
# RMSNorm, rotary position embeddings, attention through SDPA and a SwiGLU MLP (three linear
# layers). The trace *H100 Qwen* is one forward of it: 16 prompts of 559 tokens in bfloat16 (the
# box's `text_input_length` 2048 is the harness's limit; the recorded shapes have 8,944 rows =
# 16 × 559). Attention calls are found as `kernels.trace.attention.find_attention` finds them,
# every other kernel is sorted by its name's fingerprint. Two rows need a word: the `memset`
# kernels are cuBLAS zero-filling a small buffer beside each GEMM of `mm`/`addmm`; under copies,
# `_local_scalar_dense` is an `.item()`, a device-to-host copy of one number that makes the CPU
# wait for the GPU.
#
# Before the reveal: rank four of those parts by GPU time, most first.

# %%
guess_parts_order = ["GEMM", "attention", "elementwise", "copy and layout"]  # edit me

# %%
qwen = blocks.forward_parts(borrowed.TRACELENS["h100_qwen"])
blocks.parts_table(qwen.parts, qwen.layers)

# %% tags=["remove-input"]
parts_seen = [p for p in qwen.parts.index if p in guess_parts_order]
reveal(guess_parts_order, parts_seen, "parts, most GPU time first")

# %%
#| caption: Where the GPU time of one Qwen1.5-0.5B forward (16 x 559 tokens, bf16, 24 layers) went on an H100, by kind of work: attention from its calls, the rest by kernel name (trace: H100 Qwen).
#| alt: Horizontal bars of the share of the step's GPU time per part; elementwise passes longest, then GEMMs, copies, attention, reductions.
blocks.parts_figure(qwen.parts, title=f"{qwen.device}: one forward, {qwen.layers} layers")

# %% tags=["remove-input"]
lesson(parts_seen[0] == "elementwise" and parts_seen.index("GEMM") < parts_seen.index("attention"),
       "by GPU time, elementwise passes rank above GEMMs, and GEMMs above attention",
       " > ".join(parts_seen))
gemms, elementwise, copies, attention_part = (qwen.part(k) for k in ("gemm", "elementwise", "copy", "attention"))
lesson(attention_part["kernels"] == qwen.layers, "attention is one kernel per layer (one call per layer)")
small = {"n": elementwise["kernels"] + copies["kernels"], "µs": elementwise["GPU µs"] + copies["GPU µs"]}
lesson(small["µs"] > gemms["GPU µs"] and small["n"] > gemms["kernels"]
       and small["µs"] / small["n"] < gemms["GPU µs"] / gemms["kernels"],
       "elementwise passes and copies outweigh the GEMMs by number, not size",
       f"{small['n']:.0f} kernels of {small['µs'] / small['n']:.1f} µs vs "
       f"{gemms['kernels']:.0f} of {gemms['GPU µs'] / gemms['kernels']:.1f} µs")
glue("q_att_share", 100 * attention_part["share of the step"]); glue("q_gemm_share", 100 * gemms["share of the step"])
glue("q_elem_share", 100 * (elementwise["share of the step"] + copies["share of the step"]))
glue("q_elem_kernels", int(elementwise["kernels"] + copies["kernels"])); _ = glue("q_layers", qwen.layers)

# %% [markdown]
# Attention took {glue:text}`q_att_share:.1f`% of this step's GPU time, the GEMMs
# {glue:text}`q_gemm_share:.0f`%, and elementwise passes, copies and casts together
# {glue:text}`q_elem_share:.0f`%: {glue:text}`q_elem_kernels` small kernels over
# {glue:text}`q_layers` layers, each reading and writing a whole activation tensor for a few FLOPs
# per element (an RMSNorm's `mul`, `pow` and `add` in float32, the casts back to bfloat16, the
# rotary embedding's `cat`): memory traffic, which compiling attacks.
#
# The GEMMs, read from the matmul ops that launched them, by shape:

# %%
ch08_block.gemm_shapes(borrowed.TRACELENS["h100_qwen"].step())

# %% tags=["remove-input"]
qshapes = ch08_block.gemm_shapes(borrowed.TRACELENS["h100_qwen"].step())
tokens = int(qshapes["A"].map(lambda a: a[0]).max())
ql = ch08_block.layer_flops(qshapes, qwen.layers, tokens)
extra = ql["outside the layers"]
in_layers = qshapes[~qshapes.index.isin(extra.index)]
lesson(ql["gemms per layer"] == 7 and len(extra) == 1 and len(in_layers) == 4
       and in_layers[["A", "B"]].drop_duplicates().shape[0] == 3 and extra["calls"].sum() + 7 * qwen.layers == gemms["kernels"]
       and extra["op"].iloc[0] == "bmm" and extra["type"].iloc[0] == "float",
       "seven GEMMs a layer in three shapes, plus one float32 bmm outside the layers",
       f"{gemms['kernels']} = 7 × {qwen.layers} + 1")
q_seq = extra["B"].iloc[0][-1]  # the bmm's last dimension: one per position
q_constant = ql["linear per token"] / (4 * ql["width"])  # attention 4·S·W a token against the linear FLOPs
lesson(abs(q_constant - (2 * ql["width"] + 1.5 * ql["intermediate"])) < 1e-6,
       "from the trace's shapes, attention's share of Qwen's FLOPs is S / (S + 2W + 1.5·I)",
       f"W = {ql['width']:,}, I = {ql['intermediate']:,}: S / (S + {q_constant:,.0f})")
glue_all(q_width=f"{ql['width']:,}", q_inter=f"{ql['intermediate']:,}", q_const=f"{q_constant:,.0f}",
         q_seq=q_seq, q_flop_share=f"{q_seq / (q_seq + q_constant):.1%}",
         q_flop_share_causal=f"{q_seq / (q_seq + 2 * q_constant):.1%}")

# %% [markdown]
# In each layer, q, k, v and the output projection share one shape (q, k and v carry a bias, so
# run as `addmm`; the output projection as `mm`), the MLP's gate and up another, its down
# projection the third. The extra GEMM is a float32 `bmm` over {glue:text}`q_seq` positions, once per
# forward: the rotary embedding's angles. With a SwiGLU MLP of intermediate size
# I = {glue:text}`q_inter`, Qwen's linear layers cost 2·(4W² + 3·W·I) FLOPs a token, so
# attention's share is S / (S + {glue:text}`q_const`) at W = {glue:text}`q_width`: at
# {glue:text}`q_seq` tokens, {glue:text}`q_flop_share` of the FLOPs (about
# {glue:text}`q_flop_share_causal` for a flash kernel that skips masked tiles), small like its
# share of the time.
#
# ## The block compiled
#
# `torch.compile` takes the whole block if Dynamo can trace all of it (no graph break,
# [chapter 7](07_compiled.ipynb)). Its attention, `blocks.sdpa_causal`, is one plain call of
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)`:

# %%
compiled_block = torch.compile(make_block(blocks.sdpa_causal, labels=False), dynamic=False)
eager_sdpa = make_block(blocks.sdpa_causal)

# %% tags=["remove-input"]
# The first call compiles (chapter 7 times it), here rather than in the profile's warm-up.
err = blocks.largest_difference({"eager": eager_sdpa(x), "compiled": compiled_block(x)})
lesson(err <= 1e-4 if dtype == torch.float32 else err <= 5e-2, "the compiled block computes what the eager block does",
       f"relative difference {err:.1e}")

# %%
cruns, csteps = profile_blocks({"sdpa_eager": eager_sdpa, "compiled": compiled_block}, x)
ch08_block.ops_and_allocations(csteps["compiled"])  # tables.op_table without one profile's noisy times

# %% tags=["remove-cell"]
cstep, estep = csteps["compiled"], csteps["sdpa_eager"]

# %% [markdown]
# The compiled block has no `block.*` labels, so read it by op: one compiled region, the linear
# layers' matmuls, the attention call, and between them the kernels Inductor generated, each named
# after the ops it fused. The table leaves time out: one profile's times on a shared CPU are noise.
# The matmuls and generated kernels show 0 KiB: Inductor's code allocates their buffers itself and
# hands each `addmm` one to write into through `out=` (its fourth shape); the row "(the region's
# own code)" holds them.

# %% tags=["remove-input"]
gen = torch_compile.generated_kernels(cstep)
matmuls = [n for n in cstep.ops["name"] if n in ("aten::addmm", "aten::mm")]
lesson(len(torch_compile.regions(cstep)) == 1, "the compiled block runs as one compiled region")
lesson(len(matmuls) == 4, "the four linear layers stay library matmuls (qkv, proj, fc_in, fc_out)",
       f"{len(matmuls)} " + " and ".join(sorted({n.removeprefix('aten::') for n in matmuls})))
lesson(cstep.find("aten::gelu").empty and cstep.find("aten::layer_norm").empty and cstep.find("aten::add").empty,
       "GELU, the layer norms and the residual adds no longer run as ATen ops")
lesson(any("gelu" in f for f in gen["fused"]) and any({"add", "native_layer_norm"} <= set(f) for f in gen["fused"]),
       "Inductor wrote a GELU kernel and fused the first residual add into the second norm",
       ", ".join(gen["name"]))
lesson(cstep.allocated_bytes < estep.allocated_bytes,  # the two numbers are glued in the sentence below
       "the compiled block allocates less than the eager one")
glue("b_c_alloc", f"{mib(cstep.allocated_bytes):.1f}")
glue("b_e_alloc", f"{mib(estep.allocated_bytes):.1f}")

# %% [markdown]
# The compiled block allocates
# {glue:text}`b_c_alloc` MiB per forward against {glue:text}`b_e_alloc` MiB eager: the fused
# kernels do not write the eager ops' intermediates.
#
# ## What a fused MLP would change
#
# Eager, `fc_in` writes a [B, S, 4W] tensor, GELU reads it and writes another, and `fc_out` reads
# that. A fused MLP (Part 2 of the
# Hugging Face blog series "Profiling in PyTorch" that this course follows) applies GELU in the
# first GEMM's epilogue, the last step of a GEMM kernel, while each tile of the result is still in
# registers: the tensor is written once, already activated, and read once. Where did the GELU run
# here?

# %% tags=["remove-input"]
hidden_bytes = batch * seq * 4 * width * x.element_size()
hid = {name: torch_compile.score_buffers(st, hidden_bytes) for name, st in csteps.items()}
lesson(hid["sdpa_eager"] == 2 > hid["compiled"], "eager, the MLP allocates two [B, S, 4W] buffers; compiled, "
       "fewer: GELU writes into fc_in's buffer",
       f"eager {hid['sdpa_eager']}, compiled {hid['compiled']}")
ch08_block.gelu_between_matmuls(cstep.gpu_work if len(cstep.gpu_work) else cstep.ops)
glue("b_hidden_mib", f"{mib(hidden_bytes):.1f}")
glue("b_saved_mib", f"{mib((4 - 2) * hidden_bytes):.1f}")  # trips of [B, S, 4W] through memory: 4 unfused, 2 fused

# %% [markdown]
# Each [B, S, 4W] buffer is {glue:text}`b_hidden_mib` MiB here. Eager, or compiled with default
# settings (the matmuls stay library calls), it makes four trips through memory: written by
# `fc_in`, read and written by the GELU pass, read by `fc_out`. With GELU in the GEMM's epilogue it
# would make two, saving {glue:text}`b_saved_mib` MiB of traffic per forward. The setting to try
# is `mode="max-autotune"`: Inductor then benchmarks its own GEMM templates against the library's,
# and a template it picks may take the GELU into its epilogue (`epilogue_fusion` in
# `torch._inductor.config`). This page does not run it: your own trace will show whether the GELU
# moves.
#
# ## What to remember
#
# - Attention's share of a block's arithmetic is S / (S + 6W) for a GELU MLP four times the width
#   (S / (S + 12W) with causal tiles skipped; S / (S + 2W + 1.5·I) for a SwiGLU MLP of size I):
#   small for short sequences, dominant for long ones.
# - The choice of attention shows first in memory: hand-written attention allocates S×S buffers
#   inside the block; a fused kernel never does.
# - In a real model's eager GPU step, the small elementwise passes and copies can outweigh the
#   GEMMs: each moves a whole activation tensor for a few FLOPs.
# - Compiling folds the first residual add into the second norm and writes a GELU kernel and an
#   add kernel; the matmuls stay library calls. A fused MLP would remove the [B, S, 4W] round trip.

# %% tags=["remove-input"]
links.links(cruns["compiled"])

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/08_block.ipynb), with automatic checks, hints and hidden solutions.

# %% [markdown]
# # 9. The backward pass: one training step
#
# Every chapter so far profiled a forward pass under `torch.no_grad()`. Training runs the
# forward *and* the backward, and the backward changes what the trace holds: ops the
# autograd engine runs for you, tensors the forward must keep alive until the backward
# reads them, and more arithmetic than the forward itself. This chapter profiles one
# training step of the hand-written module, of every SDPA backend that runs here, and of
# the Triton kernel, and reads four things out of the trace: what autograd records, what
# each forward saves for the backward, how FlashAttention avoids saving the S×S
# probabilities, and what a training step costs as the sequence grows.
#
# **You will learn to:**
#
# - read a training step's trace: autograd's `evaluate_function` nodes, in reverse order of the
#   forward, and the thread each runs on;
# - measure what each forward keeps for the backward, from the allocation events and from
#   autograd's saved-tensor hooks;
# - see why fused backwards recompute the probabilities from one log-sum-exp per row, and where
#   the 2.5x backward and 3.5x step FLOP counts come from;
# - watch a training step's peak memory grow with S for the math backend and for flash.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb), [3. One call:
# `scaled_dot_product_attention`](03_sdpa.ipynb), [3b. The fused backends](03b_sdpa_fused.ipynb)
# and [4. FlashAttention-2 in Triton](04_triton.ipynb) (the kernel whose backward is profiled
# here). What `backward()` computes.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import math

import pandas as pd
import torch

import kernels
import kernels.attention.sdpa
from kernels import gpu_lessons, recorded, reference
from kernels.bench import comparison
from kernels.notebook import glue, inputs, lesson, mib, reveal, setup
from kernels.trace import record, tables, timeline
from kernels.trace.links import links

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
grad_out = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device, seed=1)[0]
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}, requires_grad=True")

# %% [markdown]
# ## One training step
#
# A training step here is the attention forward, then `backward()` with a fixed gradient
# for the output (what the layers above would send back). Before each step the gradients of
# the last one are dropped, as `optimizer.zero_grad()` does, so every step records the same
# work. `record.profile` turns autograd on because the inputs require grad:

# %%
def training_step(name, grad_out):
    """One forward + backward of registry implementation ``name``."""
    attention = kernels.get(name)

    def step(q, k, v):
        for t in (q, k, v):
            t.grad = None                 # what optimizer.zero_grad() does
        out = attention(q, k, v, causal=True)
        out.backward(grad_out)

    return step


def backward_start(step):
    """When the backward began: the first op the autograd engine ran, on any thread."""
    ops = step.ops
    return float(ops.loc[ops["name"].str.startswith("autograd::engine"), "ts"].min())


avail = kernels.available(device)
variants = ["naive"] + [n for n in kernels.attention.sdpa.BACKENDS if avail[n] is None] + (["triton"] if avail["triton"] is None else [])
# Triton runs in its interpreter on a CPU (NumPy, one program at a time): give it a tiny shape there.
shapes = {n: (1, 2, 32, 16) if (n == "triton" and device.type == "cpu") else (batch, heads, seq, head_dim)
          for n in variants}
step_inputs = {}
for name, shape in shapes.items():
    if shape == tuple(q.shape):
        step_inputs[name] = (q, k, v, grad_out)
    else:
        q_, k_, v_ = inputs(*shape, dtype=dtype, device=device, requires_grad=True)
        step_inputs[name] = (q_, k_, v_, inputs(*shape, dtype=dtype, device=device, seed=1)[0])
print("shapes:", shapes)

# %% [markdown]
# ## What autograd records
#
# The forward of chapter 1's module calls five ops: matmul, mul, masked_fill, softmax,
# matmul. Each op that takes part in a gradient leaves a *node* in the autograd graph (its
# `grad_fn`), and `backward()` walks that graph from the output back to the inputs. Guess
# the backward's nodes that do arithmetic, in the order the engine runs them (PyTorch names
# them after the op: `SoftmaxBackward0`, ...; leave out the view and reshape nodes and the
# `AccumulateGrad` that stores each input's gradient):

# %%
guess_nodes = ["BmmBackward0", "MulBackward0", "MaskedFillBackward0", "SoftmaxBackward0", "BmmBackward0"]  # edit me

# %%
runs, steps = {}, {}
for name in variants:
    q_, k_, v_, g_ = step_inputs[name]
    runs[name] = record.profile(training_step(name, g_), q_, k_, v_, label=name, wait=0, warmup=1, active=1,
                                   trace_dir=trace_dir)
    steps[name] = runs[name].step()

PREFIX = "autograd::engine::evaluate_function: "
BOOKKEEPING = ("View", "Expand", "UnsafeView", "ReshapeAlias", "Transpose", "torch::autograd::AccumulateGrad")


def backward_nodes(step, bookkeeping=False):
    """The autograd nodes the engine ran, in order, by name."""
    ops = step.ops
    nodes = ops.loc[ops["name"].str.startswith(PREFIX), "name"].str.removeprefix(PREFIX).tolist()
    return nodes if bookkeeping else [n for n in nodes if not n.startswith(BOOKKEEPING)]


naive_nodes = backward_nodes(steps["naive"])
display(reveal(guess_nodes, naive_nodes, "backward nodes doing arithmetic"))
forward_top = [n for n in steps["naive"].top_level()["name"] if not n.startswith("autograd::")]
node_of = {"aten::matmul": "BmmBackward0", "aten::mul": "MulBackward0", "aten::masked_fill": "MaskedFillBackward0",
           "aten::softmax": "SoftmaxBackward0"}
lesson(naive_nodes == [node_of[n] for n in reversed(forward_top)],
       "the backward runs one node per forward op, in reverse order", " <- ".join(naive_nodes))
accumulate = backward_nodes(steps["naive"], bookkeeping=True).count("torch::autograd::AccumulateGrad")
lesson(accumulate == 3, "three AccumulateGrad nodes hand the gradients to q, k and v", f"{accumulate}")

# %% [markdown]
# In the trace each node is an op named `autograd::engine::evaluate_function: <node>`,
# with the node itself under it and the ATen ops that compute its gradient under that:
# the backward of a matmul is two matmuls (one per input), the softmax's backward is
# `_softmax_backward_data`, the mask's backward is another `masked_fill` (a masked key gets
# no gradient). Here is the whole step, forward then backward:

# %%
tables.op_table(steps["naive"], max_depth=2)

# %% [markdown]
# The same step as a timeline: the forward's five ops, then the engine's nodes, each a bar
# with its ATen ops below it.

# %%
#| caption: One training step of naive attention: the forward's five ops, then the autograd engine's nodes (`MmBackward0`, `SoftmaxBackward0`...), each a bar with the ATen ops it ran below it.
#| alt: Timeline of a training step: the forward's ops on the left, then a longer run of backward nodes, each with its ATen ops nested beneath.
timeline.timeline(steps["naive"], title=f"naive attention, one training step ({device.type})")

# %%
# The traces of every variant's training step: download them, or open them in Perfetto.
display(*(links(run) for run in runs.values()))

# %% [markdown]
# ### On which thread?
#
# PyTorch's autograd engine (`torch/csrc/autograd/engine.cpp`) keeps one worker thread per
# accelerator device. Work on CPU tensors runs on the thread that called `backward()`; work on
# CUDA tensors is handed to the device's own thread, and the caller waits for it. The trace reader
# keeps every thread's ops in a step, and `op_table` adds a `thread` column as soon as more
# than one thread took part.

# %%
threads = pd.DataFrame([{"variant": n, "label's thread": s.thread[1],
                         "forward ops' threads": sorted(set(s.ops.loc[s.ops["ts"] < backward_start(s), "tid"])),
                         "backward ops' threads": sorted(set(s.ops.loc[s.ops["ts"] >= backward_start(s), "tid"]))}
                        for n, s in steps.items()]).set_index("variant")
display(threads)
on_other = {n: set(t) - {threads.at[n, "label's thread"]} for n, t in threads["backward ops' threads"].items()}
if device.type == "cpu":
    lesson(not any(on_other.values()),
           "on a CPU every backward op runs on the thread that called backward()", "one thread per step")
else:
    lesson(all(on_other.values()),
           "on a GPU the backward's ops run on the autograd engine's device thread, not the caller's",
           "; ".join(f"{n}: {sorted(t)}" for n, t in on_other.items()))

# %% [markdown]
# ## What each forward saves for the backward
#
# The backward of softmax needs the softmax's output; the backward of `probs @ v` needs both
# `probs` and `v`. Whatever a backward needs, the forward must keep alive after it returns,
# and an S×S tensor kept per head is where training memory goes. The trace shows it without
# any help: every allocation and free is a `[memory]` event, so the S×S buffers still
# allocated when the backward begins are the ones the forward kept. Guess how many each
# variant keeps (naive, then the SDPA backends, then triton, in the order of the table
# below):

# %%
guess_kept = [2, 3, 1, 0]  # edit me: one number per variant

# %%
def square_sizes(name):
    """Bytes of one S×S tensor per head, in the dtype the variant computes it in (the math
    backend upcasts 16-bit inputs to float32)."""
    b, h, s, _ = shapes[name]
    return {b * h * s * s * e for e in {q.element_size(), 4 if name == "sdpa_math" else q.element_size()}}


def square_buffers_kept(step, name):
    """S×S buffers allocated in the forward and not freed when the backward begins."""
    m = step.memory[step.memory["ts"] < backward_start(step)]
    sizes = square_sizes(name)
    return int(m["bytes"].isin(sizes).sum() - (-m["bytes"]).isin(sizes).sum())


def saved_by_autograd(name):
    """What the forward hands autograd to keep: torch.autograd.graph.saved_tensors_hooks sees each one."""
    q_, k_, v_, _ = step_inputs[name]
    seen = []

    def pack(t):
        seen.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), t.untyped_storage().data_ptr(),
                     t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kernels.get(name)(q_, k_, v_, causal=True)
    return seen


rows = []
for name, s in steps.items():
    saved = saved_by_autograd(name)
    square = {(ptr, nb) for shape, dt, ptr, nb in saved if nb in square_sizes(name)}
    live = int(s.memory.loc[s.memory["ts"] < backward_start(s), "bytes"].sum())
    rows.append({"variant": name, "S×S kept (trace)": square_buffers_kept(s, name),
                 "S×S saved (hooks)": len(square), "alive at backward (MiB)": round(mib(live), 3),
                 "shapes saved": sorted({shape for shape, *_ in saved})})
kept = pd.DataFrame(rows).set_index("variant")
display(kept)
for name, guessed in zip(kept.index, guess_kept):
    reveal(guessed, int(kept.at[name, "S×S kept (trace)"]), f"S×S buffers {name} keeps for its backward")

# %% [markdown]
# Two independent readings agree: the trace's allocation events, and PyTorch's own hooks for
# saved tensors (`torch.autograd.graph.saved_tensors_hooks`, which sees every tensor a
# forward hands autograd to keep; several views of one buffer count once).

# %%
lesson((kept["S×S kept (trace)"] == kept["S×S saved (hooks)"]).all(),
       "the S×S buffers alive when the backward begins are exactly the ones autograd saved",
       ", ".join(f"{n}: {c}" for n, c in kept["S×S kept (trace)"].items()))
unfused = [n for n in ("naive", "sdpa_math") if n in kept.index]
fused = [n for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "triton") if n in kept.index]
lesson((kept.loc[unfused, "S×S kept (trace)"] == 1).all(),
       "the unfused forwards keep exactly one S×S buffer for the backward: the probabilities", ", ".join(unfused))
lesson((kept.loc[fused, "S×S kept (trace)"] == 0).all(),
       "the fused forwards keep no S×S buffer at all", ", ".join(fused))
glue("naive_kept_mib", float(kept.loc["naive", "alive at backward (MiB)"]))
glue("square_mib", mib(batch * heads * seq * seq * q.element_size()))

# %% [markdown]
# The hand-written module keeps the probabilities ({glue:text}`square_mib:.1f` MiB here, one
# S×S per head), which both the softmax's backward and the second matmul's backward read:
# {glue:text}`naive_kept_mib:.2f` MiB is alive when its backward starts. What do the fused
# kernels keep instead? The `shapes saved` column says: q, k, v, the output, and one number
# per query row, the **log-sum-exp** of its scores ($\log \sum_j e^{s_{ij}}$), an S-sized
# tensor instead of an S×S one.

# %%
def per_row(name):
    """Saved shapes with one value per query row or so: at least B·H·S elements, fewer than q."""
    b, h, s, d = shapes[name]
    return [shape for shape in kept.at[name, "shapes saved"] if b * h * s <= math.prod(shape) < b * h * s * d]


lse_shapes = {n: per_row(n) for n in fused}
print(lse_shapes)
lesson(all(lse_shapes.values()), "every fused forward saves a per-row tensor (the log-sum-exp) and nothing S×S",
       "; ".join(f"{n}: {s}" for n, s in lse_shapes.items()))

# %% [markdown]
# ## Recomputing instead of saving
#
# With the log-sum-exp $L_i$ of each row, the probabilities can be rebuilt exactly, tile by
# tile, from q and k: $P_{ij} = e^{s_{ij} - L_i}$. FlashAttention's backward does that
# (Dao, *FlashAttention-2*, arXiv 2307.08691, Algorithm 2): it computes $QK^\top$ again, one
# tile at a time, and never holds more than a tile. That is a fifth matmul in the backward.
# The hand-written module's backward has only four (two per matmul of the forward), because
# it reads the saved probabilities instead. The trace counts them, and shows the price of
# saving: the unfused backwards allocate S×S buffers of their own (the gradient of the
# probabilities, then of the scores), the fused ones none.

# %%
rows = []
for name, s in steps.items():
    t0 = backward_start(s)
    fwd, bwd = s.ops[s.ops["ts"] < t0], s.ops[s.ops["ts"] >= t0]
    m_bwd = s.memory[(s.memory["ts"] >= t0) & (s.memory["bytes"] > 0)]
    rows.append({"variant": name, "bmm in forward": int((fwd["name"] == "aten::bmm").sum()),
                 "bmm in backward": int((bwd["name"] == "aten::bmm").sum()),
                 "S×S allocations in backward": int(m_bwd["bytes"].isin(square_sizes(name)).sum()),
                 "largest backward allocation (KiB)": round(float(m_bwd["bytes"].max()) / 1024, 1)})
recompute = pd.DataFrame(rows).set_index("variant")
display(recompute)
lesson(recompute.at["naive", "bmm in forward"] == 2 and recompute.at["naive", "bmm in backward"] == 4,
       "the hand-written backward does two matmuls per forward matmul: four, reading the saved probabilities")
lesson((recompute.loc[unfused, "S×S allocations in backward"] > 0).all() and
       (recompute.loc[fused, "S×S allocations in backward"] == 0).all(),
       "only the unfused backwards allocate S×S buffers; the fused ones rebuild the probabilities tile by tile",
       ", ".join(f"{n}: {c}" for n, c in recompute["S×S allocations in backward"].items()))
glue("flash_bwd_largest_kib", float(recompute.loc[fused, "largest backward allocation (KiB)"].max()))

# %% [markdown]
# The largest buffer any fused backward allocated is {glue:text}`flash_bwd_largest_kib:.0f`
# KiB: the size of a gradient (q-, k- or v-shaped), not of the scores. This is also where the
# usual FLOP count for training comes from: the backward does five matmuls of the forward's
# size to the forward's two, so it costs 2.5x the forward and a training step 3.5x (the
# convention of FlashAttention's benchmarks, `kernels.reference.flops(..., backward=True)`).
# The hand-written module keeps the probabilities instead of recomputing them: its backward
# does four matmuls, twice the forward's FLOPs, so a training step with it costs 3x the
# forward (against 3.5x), and it pays in memory instead.
#
# ## The math backend in training
#
# SDPA's math backend is attention in ordinary ops, so autograd differentiates those ops.
# Its node list shows it: `SafeSoftmaxBackward0` for its NaN-guarded softmax, `AddBackward0`
# for the mask it adds, and two `MulBackward1` for the scale it splits over q and k.

# %%
if "sdpa_math" in steps:
    math_nodes = backward_nodes(steps["sdpa_math"])
    print(" <- ".join(math_nodes))
    lesson({"SafeSoftmaxBackward0", "AddBackward0"} <= set(math_nodes) and math_nodes.count("MulBackward1") == 2,
           "the math backend's backward differentiates its decomposed ops: safe softmax, mask add, two scalings")
    extra = kept.at["sdpa_math", "alive at backward (MiB)"] - kept.at["naive", "alive at backward (MiB)"]
    qk_mib = 2 * mib(batch * heads * seq * head_dim * 4)
    print(f"alive at the backward: math {kept.at['sdpa_math', 'alive at backward (MiB)']:.3f} MiB, "
          f"naive {kept.at['naive', 'alive at backward (MiB)']:.3f} MiB; the scaled q and k in float32: {qk_mib:.3f} MiB")
    lesson(extra > 0, "the math backend keeps more for its backward than the hand-written module",
           f"+{extra:.3f} MiB: its scaled copies of q and k")
    glue("math_extra_mib", float(extra))
else:
    glue("math_extra_mib", float("nan"))

# %% [markdown]
# Besides the probabilities, the math backend saves its scaled copies of q and k
# (+{glue:text}`math_extra_mib:.2f` MiB here): the matmul's backward needs the operands it
# was given, and those are the scaled copies, not your q and k. With 16-bit inputs the
# probabilities it keeps are float32 too, twice the bytes of the hand-written module's: the
# math backend converts 16-bit q, k and v to float32 first (the upcast of chapter 3), on a
# CPU as on a GPU (a bf16 call on a CPU profiles three `aten::_to_copy` of q's shape).
#
# ## The backward's kernels on a GPU run
#
# On a GPU, each backward node launches kernels, and they are launched from the engine's
# device thread. The trace reader assigns GPU work to a step by where its launch happened,
# on any thread, so the backward's kernels belong to the step that ran them: a GPU trace of
# this step would show the backward's kernels on the same stream as the forward's, queued
# from a second CPU thread. No borrowed trace holds a backward pass (all are inference), so
# the hidden cell below reads this run's own GPU trace, or the book's recording, where one exists.

# %% tags=["hide-input"]
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, steps, "09_backward", variants)
if gpu_steps:
    print(f"GPU run: {gpu_source}")
    display(gpu_lessons.backward_threads(gpu_steps, gpu_source))

# %% [markdown]
# ## Cost as the sequence grows
#
# FLOPs first. They come from the counts, not the clock: a training step is 3.5x the
# forward, and causal attention counts half the scores.

# %%
sweep_seqs = [128, 256, 512, 1024] if device.type == "cpu" else [512, 1024, 2048, 4096]
flop_rows = [{"seq": s, "forward GFLOP": reference.flops(batch, heads, s, head_dim) / 1e9,
              "training step GFLOP": reference.flops(batch, heads, s, head_dim, backward=True) / 1e9}
             for s in sweep_seqs]
display(pd.DataFrame(flop_rows).set_index("seq").round(3))
lesson(all(abs(r["training step GFLOP"] / r["forward GFLOP"] - 3.5) < 1e-9 for r in flop_rows),
       "a training step counts 3.5x the forward's FLOPs (backward = 2.5x forward)")

# %% [markdown]
# Memory is measured: one profiled training step per length, its peak above what was
# allocated before it (`Step.peak_bytes`). Guess first: per doubling of S, by how much does
# the math backend's training peak grow, and by how much flash's?

# %%
guess_growth = {"sdpa_math": 4.0, "sdpa_flash": 2.0}  # edit me

# %%
mem_variants = [n for n in ("sdpa_math", "sdpa_flash") if n in variants]  # the unfused and the fused extreme
mem_rows, mem_steps = [], {}
for s_len in sweep_seqs:
    qs, ks_, vs = inputs(batch, heads, s_len, head_dim, dtype=dtype, device=device, requires_grad=True)
    gs = inputs(batch, heads, s_len, head_dim, dtype=dtype, device=device, seed=1)[0]
    for name in mem_variants:
        st = record.profile(training_step(name, gs), qs, ks_, vs, label=name, wait=0, warmup=1, active=1,
                               trace_dir=trace_dir, trace_name=f"{name}_train_S{s_len}").step()
        mem_steps[name, s_len] = st
        mem_rows.append({"variant": name, "seq": s_len, "peak (MiB)": mib(st.peak_bytes)})
peaks = pd.DataFrame(mem_rows).pivot(index="seq", columns="variant", values="peak (MiB)")
growth = (peaks / peaks.shift(1)).rename(columns=lambda c: f"{c} x per doubling")
display(pd.concat([peaks.round(2), growth.round(2)], axis=1).astype(object).fillna("—"))  # no growth before the first length
for name in ("sdpa_math", "sdpa_flash"):
    if name in peaks:
        reveal(guess_growth[name], round(float(growth[f"{name} x per doubling"].iloc[-1]), 2),
               f"{name}'s growth at the last doubling")

# %%
#| caption: Peak memory of one training step against sequence length, log-log: the math backend's grows about 4x per doubling (it keeps the S×S probabilities for the backward), flash's far less.
#| alt: Log-log line chart of a training step's peak memory against sequence length for the math and flash backends; the math line is steeper.
ax = peaks.plot(marker="o", logx=True, logy=True, figsize=(7, 4.5),
                title=f"Peak memory of one training step, B={batch} H={heads} D={head_dim}")
ax.set(xlabel="sequence length S", ylabel="peak (MiB)")
ax.set_xticks(peaks.index, [str(s) for s in peaks.index])
ax.minorticks_off()

# %%
# The traces behind each point: download them, or open them in Perfetto.
display(*(links(st) for st in mem_steps.values()))

# %%
last = {n: float(growth[f"{n} x per doubling"].iloc[-1]) for n in mem_variants}
lesson(last.get("sdpa_math", 4.0) > 3.2,
       "the math backend's training peak grows about 4x per doubling of S: it keeps S×S buffers",
       ", ".join(f"{n}: {x:.2f}x" for n, x in last.items()))
if {"sdpa_flash", "sdpa_math"} <= set(last):
    ratio = peaks["sdpa_math"] / peaks["sdpa_flash"]
    # the shortest length is left out: there fixed-size allocations weigh as much as the S×S ones
    lesson(ratio.iloc[1:].is_monotonic_increasing and ratio.iloc[-1] > 4,
           "the math backend's training peak pulls away from flash's as S grows: flash keeps nothing S×S",
           "math / flash: " + ", ".join(f"{x:.1f}x" for x in ratio))
glue("mem_last_seq", sweep_seqs[-1])
glue("math_train_peak", float(peaks["sdpa_math"].iloc[-1]) if "sdpa_math" in peaks else float("nan"))
glue("flash_train_peak", float(peaks["sdpa_flash"].iloc[-1]) if "sdpa_flash" in peaks else float("nan"))

# %% [markdown]
# At S = {glue:text}`mem_last_seq` one training step of the math backend peaked at
# {glue:text}`math_train_peak:.1f` MiB, flash at {glue:text}`flash_train_peak:.1f` MiB. On a
# CPU flash's growth per doubling wanders around 2x: as chapter 3b found for its forward, the
# CPU kernel's scratch buffers follow the block sizes it picks for each length, not S itself.
#
# Time, last, because it is the least trustworthy number here: the machine that builds this
# book may be busy with other work. `kernels.bench.compare` runs the training steps in
# interleaved rounds, so a burst of load hits every variant alike, and only calls one faster
# when its slowest tenth of rounds beats the other's fastest tenth.

# %%
timed = [n for n in ("sdpa_math", "sdpa_flash") if n in variants]
s_time = sweep_seqs[1]  # a short length keeps the rounds quick
qt, kt, vt = inputs(batch, heads, s_time, head_dim, dtype=dtype, device=device, requires_grad=True)
gt = inputs(batch, heads, s_time, head_dim, dtype=dtype, device=device, seed=1)[0]
result = comparison.compare({n: (lambda f=training_step(n, gt): f(qt, kt, vt)) for n in timed}, device=device, rounds=7)
print(result.verdict())
glue("timing_verdict", result.verdict())

glue("time_seq", s_time)

# %% [markdown]
# On this run, one training step at S = {glue:text}`time_seq`: {glue:text}`timing_verdict`.
#
# ## What to remember
#
# - A training step's trace has a second half: `autograd::engine::evaluate_function` ops,
#   one per node of the graph, in reverse order of the forward, on the caller's thread for
#   CPU work and on the engine's device thread for GPU work.
# - What a forward saves is visible as memory still allocated when the backward begins.
#   Unfused attention keeps the S×S probabilities; fused kernels keep one log-sum-exp per row
#   and recompute the rest, which is a fifth matmul and the reason backward counts 2.5x.
# - The math backend is the unfused case with extras: it saves its scaled q and k too.
#
# Next: decoding, where the backward is gone and a different limit appears.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/09_backward.ipynb), with automatic checks, hints and hidden solutions.

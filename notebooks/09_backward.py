# %% [markdown]
# # 9. The backward pass: one training step
#
# Every chapter so far profiled a forward pass under `torch.no_grad()`. Training adds the
# backward, and with it ops the autograd engine runs for you, tensors the forward must keep
# alive until the backward reads them, and more arithmetic. This chapter profiles one training
# step of the hand-written module and of every [SDPA](glossary.md#sdpa) backend that runs here
# (on a GPU, of the Triton [kernel](glossary.md#kernel) too).
#
# **You will learn to:**
#
# - read a training step's trace: autograd's `evaluate_function` nodes, their order and thread;
# - measure what each forward keeps for the backward, from allocation events and saved-tensor hooks;
# - see why fused backwards recompute the probabilities from one
#   [log-sum-exp](glossary.md#log-sum-exp) per row, and where the 2.5x backward and 3.5x step
#   FLOP counts come from.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb), [3. One call:
# `scaled_dot_product_attention`](03_sdpa.ipynb), [3b. The fused backends](03b_sdpa_fused.ipynb)
# and [4. FlashAttention-2 in Triton](04_triton.ipynb); you should know what `backward()` computes.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import kernels
import kernels.attention.sdpa
from IPython.display import Markdown
from kernels import borrowed, recorded
from kernels.attention import backward
from kernels.book import ch09_backward
from kernels.notebook import glue, lesson, mib, reveal, setup, show_lines
from kernels.trace import record, timeline
from kernels.trace.phases import time_by_phase
from kernels.trace.links import links

device, dtype = setup(device, dtype)
avail = kernels.available(device)
variants = ["naive"] + [n for n in (*kernels.attention.sdpa.BACKENDS, "triton") if avail[n] is None]
# Triton runs in its interpreter on a CPU (NumPy, one program at a time): a tiny shape there.
step_inputs = {n: backward.step_inputs(*((1, 2, 32, 16) if n == "triton" and device.type == "cpu"
                                         else (batch, heads, seq, head_dim)), dtype=dtype, device=device)
               for n in variants}

# %% tags=["remove-input"]
borrowed.traces_box({"A100 training step": borrowed.TRAINING_STEP})

# %% [markdown]
# ## One training step
#
# A training step here is the attention forward, then `backward()` with a fixed output
# gradient (what the layers above would send back). Each step first drops the last one's
# gradients, as `optimizer.zero_grad()` does:

# %%
show_lines(backward.training_step)

# %% [markdown]
# ## What autograd records
#
# The forward of chapter 1's module calls five ops: matmul, mul, masked_fill, softmax,
# matmul. Each op that takes part in a gradient leaves a *node* in the autograd graph (its
# `grad_fn`), and `backward()` walks that graph. Guess the backward's nodes that do arithmetic,
# in the order the engine runs them (named after the op: `SoftmaxBackward0`, ...; leave out
# view and reshape nodes and the `AccumulateGrad` that stores each input's gradient):

# %%
guess_nodes = ["BmmBackward0", "MulBackward0", "MaskedFillBackward0", "SoftmaxBackward0", "BmmBackward0"]  # edit me

# %%
runs = {name: record.profile(backward.training_step(name, g), q_, k_, v_, label=name,
                             wait=0, warmup=1, active=1, trace_dir=trace_dir)
        for name, (q_, k_, v_, g) in step_inputs.items()}
steps = {name: run.step() for name, run in runs.items()}
naive_nodes = backward.backward_nodes(steps["naive"])

# %% tags=["remove-input"]
display(reveal(guess_nodes, naive_nodes, "backward nodes doing arithmetic"))
lesson(naive_nodes == backward.forward_grad_fns(steps["naive"]),
       "the backward runs one node per forward op, in reverse order", " <- ".join(naive_nodes))
accumulate = backward.backward_nodes(steps["naive"], bookkeeping=True).count("torch::autograd::AccumulateGrad")
lesson(accumulate == 3, "three AccumulateGrad nodes hand the gradients to q, k and v", f"{accumulate}")
lesson(naive_nodes.count("BmmBackward0") == 2 and "MmBackward0" not in naive_nodes,
       "each forward matmul has one `BmmBackward0`: a 4-D matmul runs as a batched `bmm`")

# %% [markdown]
# In the trace each node is an op `autograd::engine::evaluate_function: <node>`, with the
# node under it and the ATen ops that compute its gradient under that: a matmul's backward is
# two matmuls (one per input), the softmax's is `_softmax_backward_data`, the mask's another
# `masked_fill` (a masked key gets no gradient). The whole step, two levels deep, without the
# nodes that only reshape or store a gradient and without CPU times (one profile on a shared
# CPU is no clock):

# %%
ch09_backward.step_table(steps["naive"])

# %% [markdown]
# The same step as a timeline, all levels deep (the mask's backward, for one, copies its whole
# S×S input: `clone`, `copy_`). Read the order and the nesting, not which bar is widest.

# %%
#| caption: One training step of naive attention: the forward's five ops, then the autograd engine's nodes (`BmmBackward0`, `SoftmaxBackward0`...), each a bar with the ATen ops it ran below it.
#| alt: Timeline of a training step: the forward's ops on the left, then a longer run of backward nodes, each with its ATen ops nested beneath.
timeline.timeline(steps["naive"], title=f"naive attention, one training step ({device.type})")

# %% [markdown]
# Every variant's trace, to download or open in Perfetto (folded):

# %% tags=["remove-input", "hide-output"]
display(*(links(run) for run in runs.values()))

# %% [markdown]
# ### On which thread?
#
# PyTorch's autograd engine (`torch/csrc/autograd/engine.cpp`) keeps one worker thread per
# accelerator device: work on CPU tensors runs on the thread that called `backward()`, work on
# CUDA tensors on the device's thread while the caller waits. On a CPU there is one thread; a
# GPU step's threads are read at the end of the page.

# %% tags=["remove-input"]
threads = backward.threads_table(steps)
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
# The backward of softmax needs the softmax's output; the backward of `probs @ v` needs
# `probs` and `v`. Whatever a backward needs, the forward must keep alive, and an S×S tensor
# kept per head is where training memory goes. Every allocation and free is a `[memory]`
# event in the trace, so the S×S buffers still allocated when the backward begins are the
# ones the forward kept. An S×S buffer here is one tensor of the scores or probabilities of all
# heads, B·H·S·S elements ({glue:text}`square_mib:.1f` MiB); naive's S×S boolean mask is built
# once, outside the step, and is not one. Guess how many S×S buffers each keeps:

# %%
guess_kept = {"naive": 2, "sdpa_math": 3, "sdpa_flash": 1}  # edit me

# %% tags=["remove-cell"]
compared = [n for n in variants if step_inputs[n][0].shape == step_inputs["naive"][0].shape]
csteps = {n: steps[n] for n in compared}
glue("square_mib", mib(batch * heads * seq * seq * step_inputs["naive"][0].element_size()))

# %% tags=["remove-input"]
if len(compared) < len(variants):
    display(Markdown(f"The tables below compare the variants that trained at the shape of `q` above "
                     f"({', '.join(compared)}). On a CPU Triton's kernel runs in its interpreter, one program at "
                     f"a time, so its step ran at {tuple(step_inputs['triton'][0].shape)} and is left out of them "
                     f"(its trace is in the list above)."))

# %%
kept = backward.kept_table(csteps, step_inputs)
ch09_backward.kept_view(kept)

# %% tags=["remove-input"]
for name in kept.index:
    if name in guess_kept:
        reveal(guess_kept[name], int(kept.at[name, "S×S kept (trace)"]), f"S×S buffers {name} keeps for its backward")
    else:
        print(f"{name} (not in the guess): the trace shows {int(kept.at[name, 'S×S kept (trace)'])} S×S buffers kept")

# %% [markdown]
# A second, independent reading: PyTorch's hooks for saved tensors
# (`torch.autograd.graph.saved_tensors_hooks`) see every tensor a forward hands autograd to
# keep, and say what each one is:

# %%
ch09_backward.saved_storages({n: step_inputs[n] for n in ("naive", "sdpa_flash")})

# %% tags=["remove-input"]
lesson((kept["S×S kept (trace)"] == kept["S×S saved (hooks)"]).all(),
       "the S×S buffers alive when the backward begins are exactly the ones autograd saved",
       ", ".join(f"{n}: {c}" for n, c in kept["S×S kept (trace)"].items()))
unfused = [n for n in ("naive", "sdpa_math") if n in kept.index]
fused = [n for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "triton") if n in kept.index]
naive_square_shapes = [s for s in kept.at["naive", "shapes saved"] if s[-2:] == (seq, seq)]
lesson(len(naive_square_shapes) == 3 and kept.at["naive", "S×S saved (hooks)"] == 1,
       "naive saves three S×S-shaped tensors but keeps one S×S buffer: the probabilities (two views) "
       "and the causal mask, built once",
       ", ".join("[" + ", ".join(map(str, s)) + "]" for s in naive_square_shapes))
lesson((kept.loc[unfused, "S×S kept (trace)"] == 1).all(),
       "the unfused forwards keep exactly one S×S buffer for the backward: the probabilities", ", ".join(unfused))
lesson((kept.loc[fused, "S×S kept (trace)"] == 0).all(),
       "the fused forwards that trained here keep no S×S buffer at all", ", ".join(fused))
glue("naive_kept_mib", float(kept.loc["naive", "alive at backward (MiB)"]))
out_mib = mib(step_inputs["naive"][0].numel() * step_inputs["naive"][0].element_size())  # the output, q's shape
glue("out_mib", out_mib)
# The prose accounts for every MiB alive at naive's backward: the probabilities plus the output.
assert abs(kept.loc["naive", "alive at backward (MiB)"]
           - mib(batch * heads * seq * seq * step_inputs["naive"][0].element_size()) - out_mib) < 0.01

# %% [markdown]
# The hand-written module keeps the probabilities ({glue:text}`square_mib:.1f` MiB here, an
# S×S per head in one buffer), which the softmax's backward and the second matmul's backward
# both read: {glue:text}`naive_kept_mib:.2f` MiB is alive when its backward starts (with the
# {glue:text}`out_mib:.1f` MiB output). What do the
# fused kernels keep instead? q, k and v, the output, and one number per query row, the
# log-sum-exp of its scores ($\log \sum_j e^{s_{ij}}$): an S-sized tensor instead of an S×S one.

# %% tags=["remove-input"]
lse_shapes = {n: backward.per_row_shapes(kept.at[n, "shapes saved"], step_inputs[n][0].shape) for n in fused}
lesson(all(lse_shapes.values()), "each fused forward that trained here saves a per-row tensor (the log-sum-exp) "
       "and nothing S×S",
       "; ".join(f"{n}: " + ", ".join(str(list(shape)) for shape in s) for n, s in lse_shapes.items()))

# %% [markdown]
# ## Recomputing instead of saving
#
# With the log-sum-exp $L_i$ of each row, the probabilities can be rebuilt exactly, tile by
# tile, from q and k: $P_{ij} = e^{s_{ij} - L_i}$. FlashAttention's backward does that
# (Dao, *FlashAttention-2*, arXiv 2307.08691, Algorithm 2): it computes $QK^\top$ again, one
# tile at a time, never holding more than a tile: a fifth matmul. The hand-written backward
# has four (two per forward matmul), since it reads the saved probabilities; the trace counts
# them as `bmm` ops, while a fused backward does all its matmuls inside one op, so the fifth is
# the algorithm's, not something the trace can count. What the trace does show is the price of
# saving: the unfused backwards allocate S×S buffers of their own (the gradients of the
# probabilities and of the scores), the fused ones none. The hand-written one allocates more
# than the math backend's: its scale and mask act on the S×S scores, so `MulBackward0` and
# `MaskedFillBackward0` each write an S×S gradient, while the math backend scales q and k and
# adds its mask, and an add's backward passes the gradient on without a new buffer.

# %%
recompute = backward.recompute_table(csteps, step_inputs)
ch09_backward.recompute_view(recompute)

# %% tags=["remove-input"]
lesson(recompute.at["naive", "bmm in forward"] == 2 and recompute.at["naive", "bmm in backward"] == 4,
       "the hand-written backward does two matmuls per forward matmul: four, reading the saved probabilities")
lesson((recompute.loc[unfused, "S×S allocations in backward"] > 0).all() and
       (recompute.loc[fused, "S×S allocations in backward"] == 0).all(),
       "only the unfused backwards allocate S×S buffers",
       ", ".join(f"{n}: {c}" for n, c in recompute["S×S allocations in backward"].items()))
glue("flash_bwd_largest_kib", f'{recompute.loc[fused, "largest backward allocation (KiB)"].max():,.0f}')

# %% [markdown]
# The largest buffer any fused backward allocated is {glue:text}`flash_bwd_largest_kib`
# KiB: a gradient's size (q-, k- or v-shaped), not the scores'. This is where the usual
# training FLOP count comes from: the backward does five matmuls of the forward's size to the
# forward's two, so it costs 2.5x the forward and a step 3.5x (FlashAttention's benchmark
# convention, `kernels.reference.flops(..., backward=True)`). The hand-written backward does
# four, twice the forward's FLOPs, so a step with it costs 3x, paid for in memory.
#
# ## The math backend in training
#
# SDPA's math backend is attention in ordinary ops, so autograd differentiates those:
# `SafeSoftmaxBackward0` for its NaN-guarded softmax, `AddBackward0` for the mask it adds,
# two `MulBackward1` for the scale it splits over q and k.

# %%
math_nodes = backward.backward_nodes(steps["sdpa_math"])
math_nodes

# %% tags=["remove-input"]
lesson({"SafeSoftmaxBackward0", "AddBackward0"} <= set(math_nodes) and math_nodes.count("MulBackward1") == 2,
       "the math backend's backward differentiates its decomposed ops: safe softmax, mask add, two scalings")
extra = kept.at["sdpa_math", "alive at backward (MiB)"] - kept.at["naive", "alive at backward (MiB)"]
lesson(extra > 0, "the math backend keeps more for its backward than the hand-written module",
       f"+{extra:.2f} MiB; scaled q and k: {2 * mib(batch * heads * seq * head_dim * 4):.2f} MiB")
glue("math_extra_mib", float(extra))

# %% [markdown]
# Besides the probabilities, the math backend saves its scaled copies of q and k
# (+{glue:text}`math_extra_mib:.2f` MiB here): a matmul's backward needs the operands it was
# given. With 16-bit inputs on a GPU its probabilities are float32, twice the hand-written
# module's bytes: it upcasts 16-bit q, k and v first ([chapter 3](03_sdpa.ipynb); this page
# runs float32 only).

# %% tags=["remove-input"]
# The book's own GPU recording of this step, where there is one: shown only then.
gpu_steps, gpu_source, _ = recorded.gpu_steps(device, steps, "09_backward", variants)
if gpu_steps:
    display(Markdown("## The backward's kernels on a GPU run\n\nOn a GPU each backward node launches its "
                     "[kernels](glossary.md#kernel) from the engine's device thread, on the same stream as the "
                     f"forward's, queued from a second CPU thread. GPU run: {gpu_source}."))
    display(ch09_backward.backward_threads(gpu_steps, gpu_source))

# %% [markdown]
# ## A real training step on a GPU
#
# On a GPU each backward node launches its kernels from the engine's device thread. The
# **A100 training step** (the box at the top) is one data-parallel training step of a
# convolutional network: not attention, but the same engine at work. Its thread names say who
# launched each kernel: `pt_main_thread` the forward, `pt_autograd_0` (the engine's device
# thread) the backward; the gradients' all-reduce across the two ranks ran as NCCL kernels,
# counted apart (`kernels.trace.phases`). The main thread's two early NCCL broadcasts are
# most likely DistributedDataParallel sending rank 0's module buffers (the batch norms'
# running statistics) to the other rank, as it does by default. Its launches after the
# backward are the optimizer's `_foreach_` updates, which `phases` counts with the forward (the
# phase table below gives them a row of their own):

# %%
trained = borrowed.TRAINING_STEP.step()
ch09_backward.launch_threads(trained).round(1)

# %% tags=["remove-input"]
launched = ch09_backward.launch_threads(trained)
backward_span = launched.loc[("pt_autograd_0", "backward"), ["first launch (ms)", "last launch (ms)"]]
lesson(launched.loc[("pt_autograd_0", "backward"), "first launch (ms)"] > 0
       and ("pt_autograd_0", "communication") in launched.index
       and backward_span.iloc[0] <= launched.loc[("pt_autograd_0", "communication"), "first launch (ms)"] <= backward_span.iloc[1],
       "pt_autograd_0 launches the backward's kernels and, between them, the gradients' all-reduce",
       f"{launched.loc[('pt_autograd_0', 'communication'), 'kernels']} all-reduce kernels")
main = ch09_backward.main_thread_during_backward(trained)
lesson(main["during"] == 0 and main["before"] > 0 and main["after"] > 0
       and main["communication"] and all("Broadcast" in n for n in main["communication"]),
       "pt_main_thread launches nothing during the backward; its only NCCL kernels are the opening broadcasts",
       f"{main['before']} before, {main['during']} during, {main['after']} after; "
       f"{len(main['communication'])} broadcasts")
late_ops = ch09_backward.after_backward(trained)
lesson(bool(late_ops) and all(op.startswith("aten::_foreach_") for op in late_ops),
       "the main thread's launches after the backward are the optimizer's _foreach_ updates", ", ".join(late_ops))

# %% [markdown]
# Before the reveal: how many times the forward's GPU time did the backward's kernels take?

# %%
guess_backward_over_forward = 1.0  # edit me before running on

# %% [markdown]
# The A100 training step's GPU time, by phase:

# %%
phases = ch09_backward.optimizer_apart(time_by_phase(trained), trained)
ch09_backward.phase_table(phases)

# %% tags=["remove-input"]
backward_over_forward = phases.loc["backward", "GPU µs"] / phases.loc["forward", "GPU µs"]
glue("backward_over_forward", f"{backward_over_forward:.2f}")
glue("comm_share", f"{phases.loc['communication', 'share']:.0%}")
reveal(guess_backward_over_forward, round(backward_over_forward, 2), "backward GPU time / forward GPU time")
lesson(backward_over_forward > 1, "in this training step the backward's kernels took longer than the forward's",
       f"{backward_over_forward:.2f}x")

# %% [markdown]
# A convolution's or a matmul's backward is mostly two products the size of its forward (the
# input's gradient and the weights'), so about twice is what to expect; attention's fused
# backward does more (the recompute, above). The communication row (the all-reduce and the two
# broadcasts) is {glue:text}`comm_share` of this step's GPU time, which a single GPU would not spend.
#
# ## What to remember
#
# - A training step's trace has a second half: `autograd::engine::evaluate_function` ops, one
#   per graph node, in reverse order of the forward, on the caller's thread for CPU work and on
#   the engine's device thread for GPU work.
# - What a forward saves shows as memory still allocated when the backward begins. Unfused
#   attention keeps the S×S probabilities, which quadruple as S doubles; fused kernels keep one
#   log-sum-exp per row and recompute the rest: a fifth matmul, and why backward counts 2.5x.
# - The math backend is the unfused case with extras: it saves its scaled q and k too.
#
# Next: decoding, where the backward is gone and a different limit appears.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/09_backward.ipynb), with automatic checks, hints and hidden solutions.

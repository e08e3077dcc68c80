# %% [markdown]
# # Exercises 9: the backward pass
#
# Practice for [chapter 9, the backward pass](../09_backward.ipynb). Two tasks: read from a
# training step's trace what the forward kept for the backward, and count a training step's
# FLOPs. Each check runs your code on fresh traces or shapes (it prints the seed, so a
# failure can be replayed with `seed=`) and names the mistake when it recognizes one.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
from kernels.exercises import showing_solutions
from kernels.exercises.backward import check_kept_for_backward, check_training_flops
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: what did the forward keep?
#
# Write `kept_for_backward(step, nbytes)`: given one profiled training step (a
# `kernels.trace.reader.Step` holding forward and backward) and a buffer size in bytes, return how
# many buffers of exactly that size the forward left allocated when the backward began.
# `step.memory` has one row per allocation (`bytes` > 0) and per free (`bytes` < 0), with its
# time `ts`; `step.ops` has every op with its `name` and `ts`. The check asks about the S×S
# size, for the hand-written module, the math backend and the CPU flash kernel.

# %% tags=["stub"]
def kept_for_backward(step, nbytes):
    # your code here: return an int
    ...

# %% [markdown]
# :::{dropdown} Hint 1: where the backward begins
# Every op the autograd engine runs is named `autograd::engine::evaluate_function: ...`. The
# earliest `ts` among them is where the forward's work ends.
# :::
#
# :::{dropdown} Hint 2: alive, not allocated
# The forward allocates more S×S buffers than it keeps: the raw scores are freed once they
# are scaled. Which events of `step.memory` say that a buffer is gone?
# :::

# %% tags=["solution", "hide-input"]
# Solution: allocations minus frees of that size, up to the backward's first op.
def solution_kept_for_backward(step, nbytes):
    ops, memory = step.ops, step.memory
    start = ops.loc[ops["name"].str.startswith("autograd::engine"), "ts"].min()
    before = memory[memory["ts"] < start]
    return int((before["bytes"] == nbytes).sum() - (before["bytes"] == -nbytes).sum())

# %% tags=["check"]
check_kept_for_backward(solution_kept_for_backward if solutions else kept_for_backward)

# %% [markdown]
# ## Task 2: the FLOPs of a training step
#
# Write `training_flops(batch, heads, seq, head_dim, causal)`: the FLOPs of one forward and
# backward of attention, by the convention the course (and FlashAttention's benchmarks)
# count them with: the forward is two matmuls of 2·S²·D FLOPs per head, halved when causal,
# and the backward does 2.5x the forward's work.

# %% tags=["stub"]
def training_flops(batch, heads, seq, head_dim, causal):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# Count the forward for all batches and heads first (each multiply-add is 2 FLOPs). The
# backward's five matmuls (QKᵀ recomputed, then dV, dP, dQ, dK) are counted against it.
# :::

# %% tags=["solution", "hide-input"]
# Solution: forward x (1 + 2.5).
def solution_training_flops(batch, heads, seq, head_dim, causal):
    forward = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    return 3.5 * forward

# %% tags=["check"]
check_training_flops(solution_training_flops if solutions else training_flops)

# %% [markdown]
# Back to [chapter 9](../09_backward.ipynb), or on to the [exercises of chapter 10](10_decoding.ipynb).

# %% [markdown]
# # Exercises 6: counting FLOPs honestly
#
# Practice for [chapter 6, the showdown](../06_showdown.ipynb). A benchmark prints a
# time; what we compare across kernels and GPUs is TFLOP/s, and the conversion is where
# benchmarks go wrong. A causal kernel counted at full price looks twice as fast as it is;
# this mistake has been made in public (triton PR #1849). Two tasks: TFLOP/s, then
# arithmetic intensity, which says whether a kernel can hope to be limited by compute at all.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch

from kernels.bench import timing
from kernels.exercises import showing_solutions
from kernels.exercises.showdown import check_intensity, check_tflops
from kernels.notebook import inputs, setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: TFLOP/s
#
# Write `my_tflops(batch, heads, seq, head_dim, causal, backward, ms)`: the TFLOP/s of an
# attention call that took `ms` milliseconds. With `backward=True` the time covers the
# forward *and* the backward pass. The conventions (FlashAttention's benchmarks use them
# too): each of the two matmuls, $QK^\top$ and $PV$, costs $2 S^2 D$ FLOPs per head (a
# multiply-add is two FLOPs); a causal kernel skips the masked half ([chapter 6](../06_showdown.ipynb#counting-flops-causal-is-half)); the backward does 2.5
# times the forward's work.

# %% tags=["stub"]
def my_tflops(batch, heads, seq, head_dim, causal, backward, ms):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1
# Count one head first: two matmuls, each $2 S^2 D$. There are $B \cdot H$ heads. Causal keeps
# half of that; with the backward, the time covers the forward's work and the backward's.
# :::
#
# :::{dropdown} Hint 2
# A rate is work over *seconds*: turn `ms` into seconds before dividing, and remember that "tera"
# is $10^{12}$.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the formula of kernels.reference.flops, then units.
def solution_tflops(batch, heads, seq, head_dim, causal, backward, ms):
    flops = 4 * batch * heads * seq**2 * head_dim
    if causal:
        flops /= 2
    if backward:
        flops *= 3.5
    return flops / (ms * 1e-3) / 1e12

# %% tags=["check"]
tflops = solution_tflops if solutions else my_tflops
check_tflops(tflops)

# %% [markdown]
# Now use it on a real measurement: SDPA's default backend on this run's device and shapes,
# timed by the rule of the appendix [*Measuring honestly*](../appendix/measuring.ipynb): warm up,
# time many calls, quote the median with its 10th-90th percentile spread, and call it a result only
# if the 90th percentile is within twice the 10th.

# %%
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
timing.warm_up(call, device, calls=3, budget_ms=1000)
ms, p10, p90 = timing.spread(timing.time_calls(call, device, reps=21))
print(f"causal SDPA, B={batch} H={heads} S={seq} D={head_dim}, {dtype} on {device.type}: median {ms:.2f} ms "
      f"(p10 {p10:.2f}, p90 {p90:.2f}), {tflops(batch, heads, seq, head_dim, True, False, ms):.3f} TFLOP/s"
      + ("" if p90 <= 2 * p10 else ": the spread is over 2x, too noisy on this run to be a result"))

# %% [markdown]
# ## Task 2: arithmetic intensity
#
# A fused attention kernel reads q, k and v once and writes o once; everything else stays
# on-chip. Write `my_intensity(batch, heads, seq, head_dim, causal, bytes_per_element)`:
# its FLOPs per byte of memory traffic. A kernel whose intensity is below a GPU's *ridge
# point* (peak FLOP/s over memory bandwidth) cannot reach peak compute, however well it is written.

# %% tags=["stub"]
def my_intensity(batch, heads, seq, head_dim, causal, bytes_per_element):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# Bytes: count the elements of each tensor the kernel reads or writes (the task names them), then
# turn elements into bytes. FLOPs: task 1's forward count. Divide, and see which of B, H, S and D
# are left.
# :::

# %% tags=["solution", "hide-input"]
# Solution: forward FLOPs over the bytes of q, k, v and o.
def solution_intensity(batch, heads, seq, head_dim, causal, bytes_per_element):
    flops = 4 * batch * heads * seq**2 * head_dim / (2 if causal else 1)
    return flops / (4 * batch * heads * seq * head_dim * bytes_per_element)

# %% tags=["check"]
intensity = solution_intensity if solutions else my_intensity
check_intensity(intensity)
# The ridge point of an A100 (dense bf16 peak 312 TFLOP/s over 2.04 TB/s of HBM bandwidth,
# NVIDIA's data sheet): about 153 FLOP per byte.
ridge = 312e12 / 2.04e12
for s in (256, 1024, 4096):
    i = intensity(1, 1, s, 128, True, 2)
    print(f"causal, D=128, bf16, S={s:5d}: {i:6.1f} FLOP/byte -> "
          f"{'above' if i > ridge else 'below'} the A100's ridge of {ridge:.0f}")

# %% [markdown]
# Intensity grows with $S$ (here $S/4$ FLOP per byte for causal D=128 in bf16): a fused kernel
# at long sequences has the arithmetic to be compute-bound, one that writes the S×S scores
# to memory does not.
#
# Back to [chapter 6](../06_showdown.ipynb), or on to the [exercises of chapter 7](07_compiled.ipynb).

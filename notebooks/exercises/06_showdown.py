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
import time

import torch

import kernels
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
# Forward FLOPs: $4 \cdot B \cdot H \cdot S^2 \cdot D$, divided by 2 when causal.
# Forward + backward: 3.5 times the forward.
# :::
#
# :::{dropdown} Hint 2
# TFLOP/s = FLOPs / seconds / $10^{12}$, and `ms` is in milliseconds.
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
# timed over a few calls.

# %%
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
sdpa = torch.nn.functional.scaled_dot_product_attention
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
sdpa(q, k, v, is_causal=True)
sync()
start = time.perf_counter()
for _ in range(active_steps):
    sdpa(q, k, v, is_causal=True)
sync()
ms = (time.perf_counter() - start) / active_steps * 1e3
print(f"causal SDPA, B={batch} H={heads} S={seq} D={head_dim}, {dtype} on {device.type}: {ms:.2f} ms per call, "
      f"{tflops(batch, heads, seq, head_dim, True, False, ms):.3f} TFLOP/s")

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
# Bytes: four tensors of $B \cdot H \cdot S \cdot D$ elements, times `bytes_per_element`.
# FLOPs: as in task 1, forward only. Note how $S$ survives the division.
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

# %% [markdown]
# # Exercises 6: counting FLOPs honestly
#
# Practice for [chapter 6, the showdown](../06_showdown.ipynb). A benchmark prints a
# time; what we compare across kernels and GPUs is TFLOP/s, and the conversion is where
# benchmarks go wrong. A causal kernel counted at full price looks twice as fast as it is;
# this mistake has been made in public (triton PR #1849). Three tasks: TFLOP/s; arithmetic
# intensity, which says whether a kernel can hope to be limited by compute at all; and the
# grid against the SMs, which says how much of a GPU a launch can keep busy.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
from kernels.bench import sweep
from kernels.exercises import showing_solutions
from kernels.exercises.showdown import check_intensity, check_tflops, check_waves
from kernels.notebook import setup

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
# Now use it on a real measurement: SDPA's flash backend on this run's device and shapes, timed
# as chapter 6 times it, by the rule of the appendix [*Measuring honestly*](../appendix/measuring.ipynb):
# `kernels.bench` warms up, times many calls on fresh inputs rotated among sets larger than the
# caches, and quotes the median with its 10th-90th percentile spread, a result only if the 90th
# percentile is within twice the 10th. (One fixed q, k, v can read faster, since it stays in cache;
# the appendix shows when that matters.) The shape is this run's parameters: `batch`, `heads`,
# `seq`, `head_dim`.

# %%
point = sweep.sweep(["sdpa_flash"], seqs=(seq,), head_dims=(head_dim,), dtypes=(dtype,), batch=batch,
                    heads=heads, device=device, memory=False, progress=None)[0]
ms, p10, p90 = point.median_ms, point.p10_ms, point.p90_ms
gflops = 1e3 * tflops(batch, heads, seq, head_dim, True, False, ms)
print(f"causal sdpa_flash, B={batch} H={heads} S={seq} D={head_dim}, {dtype} on {device.type}:")
print(f"median {ms:.3g} ms (p10 {p10:.3g}, p90 {p90:.3g}), {gflops:.3g} GFLOP/s"
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
# Solution: forward FLOPs over the bytes of q, k, v and o. B, H and D cancel: S/4 FLOP per byte
# for causal attention in bf16 (S/2 dense), so a fused kernel at long S has the arithmetic to be
# compute-bound; one that also writes and reads the S×S scores does not.
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
# Which of B, H, S and D are left in your intensity, and what does that say about long sequences,
# and about a kernel that writes the S×S scores to memory? (The book's folded solution answers.)
#
# ## Task 3: the grid against the SMs
#
# A kernel launches a grid of CTAs (thread blocks); each SM holds as many at once as its registers
# and warp slots allow, and the grid runs in waves of (SMs × CTAs per SM). Write
# `my_waves(grid, threads, registers, sms)`: for a grid of `grid` = (x, y, z) CTAs of `threads`
# threads each, every thread holding `registers` registers, on a GPU of `sms` SMs, each SM with
# a register file of 65,536 registers and 64 warp slots (warps of 32 threads; ignore shared
# memory and the hardware's rounding), return `(ctas_per_sm, waves, occupancy_percent)`:
# the CTAs one SM holds at once, the waves the grid takes (a fraction: 4.5 means four full waves
# and a half-full one), and the share of an SM's warp slots its resident CTAs fill.

# %% tags=["stub"]
def my_waves(grid, threads, registers, sms):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1
# Two limits on the CTAs one SM holds: the registers (a CTA needs `threads × registers` of them)
# and the warp slots (a CTA needs `threads / 32` warps). Take the smaller, in whole CTAs.
# :::
#
# :::{dropdown} Hint 2
# The grid's CTAs are the product of its three numbers. How many CTAs make one wave? And how many
# warps sit on one SM at once, out of its 64 slots?
# :::

# %% tags=["solution", "hide-input"]
# Solution: the smaller of the two limits, then CTAs over a wave, then warps over slots.
def solution_waves(grid, threads, registers, sms):
    warps = threads // 32
    per_sm = min(65536 // (threads * registers), 64 // warps)
    ctas = grid[0] * grid[1] * grid[2]
    return per_sm, ctas / (sms * per_sm), 100 * per_sm * warps / 64

# %% tags=["check"]
waves = solution_waves if solutions else my_waves
check_waves(waves)

# %% [markdown]
# Chapter 6's H100 Qwen trace launched a 5×16×16 grid of 128-thread CTAs at 255 registers a
# thread on 132 SMs; yours gives its row of chapter 6's grid table:

# %%
per_sm, n_waves, occupancy = waves((5, 16, 16), 128, 255, 132)
print(f"{per_sm} CTAs per SM, {n_waves:.2f} waves, {occupancy:.1f}% occupancy")

# %% [markdown]
# Many waves, yet each SM fills only a small share of its warp slots: the registers, not the grid,
# limit it. A 16-CTA grid (chapter 6's H100 BERT) would be a small fraction of one wave.
#
# Back to [chapter 6](../06_showdown.ipynb), or on to the [exercises of chapter 7](07_compiled.ipynb).

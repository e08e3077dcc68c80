# %% [markdown]
# # Exercises 4: FlashAttention in Triton
#
# Practice for [chapter 4, FlashAttention in Triton](../04_triton.ipynb). Three pieces of
# the kernel, one at a time: the online-softmax update in plain PyTorch, a small Triton
# kernel with a planted bug to find and fix, and the occupancy arithmetic that decides how
# many copies of a kernel an SM can run at once.
#
# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors. `import kernels.triton`
# turns it on for the whole process where there is no GPU (it sets `TRITON_INTERPRET=1`
# before any kernel is defined), so your own kernels below are interpreted too; where there
# is a GPU it sets nothing.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import math
import os
import re

import torch

import kernels.triton  # first: without a GPU it turns Triton's interpreter on for the kernels defined below
import triton
import triton.language as tl

from kernels.exercises import showing_solutions
from kernels.exercises.occupancy import check_occupancy
from kernels.exercises.triton import check_causal_softmax, check_online_update
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)
print("Triton interpreter:", os.environ.get("TRITON_INTERPRET") == "1")

# %% [markdown]
# ## Task 1: one online-softmax step
#
# A FlashAttention program holds, for each of its query rows, a running maximum `m`, a
# running sum `l` of $e^{s - m}$, and an unnormalized output `acc`. Write
# `online_update(m, l, acc, s, v)` which takes one new tile (scores `s`: `[rows, cols]`,
# already scaled; values `v`: `[cols, d]`) and returns the new `(m, l, acc)`. Use base $e$
# (`torch.exp`); the kernel uses `exp2` only for speed. The check starts from
# `m = -inf, l = 0, acc = 0`, streams a row of scores tile by tile, and compares `acc / l`
# with `softmax(s) @ v`.

# %% tags=["stub"]
def online_update(m, l, acc, s, v):
    # your code here: return m_new, l_new, acc_new
    ...

# %% [markdown]
# :::{dropdown} Hint 1
# The new maximum must cover every tile seen so far, this one included; the new tile's weights
# are its exponentials taken relative to that new maximum.
# :::
#
# :::{dropdown} Hint 2
# `l` and `acc` were accumulated relative to the old maximum. Which factor turns
# $e^{x - m_\text{old}}$ into $e^{x - m_\text{new}}$? Apply it to both before adding the new
# tile's share; it must come out 0, not NaN, on the first tile, where `m = -inf`. Chapter 4's
# rescaling by hand, and `kernels.triton.flash.tiled_softmax` for the sum alone, show it.
# :::

# %% tags=["solution", "hide-input"]
# Solution: rescale what was accumulated under the old maximum, then add the new tile.
def solution_online_update(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    return m_new, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ v

# %% tags=["check"]
check_online_update(solution_online_update if solutions else online_update)

# %% [markdown]
# ## Task 2: fix the kernel
#
# The kernel below computes a causal softmax of an `[S, S]` score matrix, one program per
# row: load the row, hide the future, softmax, store. It has one planted bug. Run the check
# to see what it reports (on the kernel as given: row 0 comes out NaN), then fix the kernel in
# this cell and run the check again. The
# row is padded to a power of two (`BLOCK`), so the load is masked too.

# %% tags=["stub"]
@triton.jit
def causal_softmax_kernel(X, Y, S, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride + cols, mask=cols < S, other=float("-inf"))
    x = tl.where(cols < row, x, float("-inf"))  # hide the future
    x = x - tl.max(x, axis=0)
    p = tl.exp(x)
    tl.store(Y + row * stride + cols, p / tl.sum(p, axis=0), mask=cols < S)


def causal_softmax(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    s = x.shape[-1]
    causal_softmax_kernel[(s,)](x, y, s, x.stride(0), BLOCK=triton.next_power_of_2(s))
    return y

# %% [markdown]
# :::{dropdown} Hint 1
# Which row comes out NaN, and what would make a softmax of that row NaN?
# :::
#
# :::{dropdown} Hint 2
# Row 0 is query 0. Which keys may it see? Compare the condition in `tl.where` with
# `triu(1)` in chapter 1's mask.
# :::

# %% tags=["solution", "hide-input"]
# Solution: a query sees its own position, so keep cols <= row (the bug was cols < row).
@triton.jit
def solution_causal_softmax_kernel(X, Y, S, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride + cols, mask=cols < S, other=float("-inf"))
    x = tl.where(cols <= row, x, float("-inf"))
    x = x - tl.max(x, axis=0)
    p = tl.exp(x)
    tl.store(Y + row * stride + cols, p / tl.sum(p, axis=0), mask=cols < S)


def solution_causal_softmax(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    s = x.shape[-1]
    solution_causal_softmax_kernel[(s,)](x, y, s, x.stride(0), BLOCK=triton.next_power_of_2(s))
    return y

# %% tags=["check"]
check_causal_softmax(solution_causal_softmax if solutions else causal_softmax, device=device)

# %% [markdown]
# ## Task 3: occupancy from a compiler report
#
# Compile a CUDA kernel with `nvcc -Xptxas -v` and the assembler reports what each thread
# and block will use. Chapter 4 leaves registers to a compile; [chapter 3b](../03b_sdpa_fused.ipynb)
# works this arithmetic for PyTorch's flash kernel, and [chapter 5](../05_cuda.ipynb) reads
# real `ptxas` reports of its own kernels. Here is a report of the kind it prints, for an
# attention kernel launched with 128 threads per block (an example, not a measurement of this
# run):

# %% tags=["setup"]
report = """\
ptxas info    : Compiling entry function '_Z13flash_forwardPK6__halfS1_S1_PS_iif' for 'sm_80'
ptxas info    : Function properties for _Z13flash_forwardPK6__halfS1_S1_PS_iif
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 24576 bytes smem, 392 bytes cmem[0]
"""
used = re.search(r"Used (\d+) registers, .* (\d+) bytes smem", report)
assert used is not None, "the report above has its Used line"
registers, shared_bytes = int(used.group(1)), int(used.group(2))
threads = 128
print(f"{threads} threads per block, {registers} registers per thread, {shared_bytes:,} B shared memory per block")

# %% [markdown]
# Write `my_occupancy(threads, registers, shared_bytes)` for an A100 (sm_80) and return
# `(blocks_per_sm, fraction)`, where `fraction` is resident warps over the 64 warp slots.
# One SM of an A100 has 65,536 registers (split evenly between 4 warp schedulers), 167,936
# bytes of shared memory, 64 warp slots and 32 block slots. The scarcest of the four
# decides how many blocks fit. The check tries your function on several footprints, so
# that each limit gets its turn.

# %% tags=["stub"]
def my_occupancy(threads, registers, shared_bytes):
    # your code here: return blocks_per_sm, fraction
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the four limits
# Each of the four gives a number of whole blocks; the SM runs the smallest. Count in warps: a
# block of `threads` threads is a whole number of warps, even when `threads` is not a multiple
# of 32.
# :::
#
# :::{dropdown} Hint 2: registers are not handed out one by one
# Registers go to a warp, not a thread, in units of 256, and each warp takes them from one
# scheduler's quarter of the register file. Count the warps one scheduler can hold first.
# :::
#
# :::{dropdown} Hint 3: shared memory has a tax
# From Ampere on, the driver reserves 1 KB of shared memory for every block, and shared memory
# is allocated in units of 128 bytes.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the CUDA occupancy calculator's rules for sm_80.
def solution_occupancy(threads, registers, shared_bytes):
    def round_up(x, unit):
        return -(-x // unit) * unit

    warps = -(-threads // 32)
    by_registers = (16384 // round_up(registers * 32, 256)) * 4 // warps if registers else 32
    by_shared = 167936 // round_up(shared_bytes + 1024, 128)
    blocks = min(by_registers, by_shared, 64 // warps, 32)
    return blocks, blocks * warps / 64

# %% tags=["check"]
answer = solution_occupancy if solutions else my_occupancy
check_occupancy(answer)
blocks, fraction = answer(threads, registers, shared_bytes)
print(f"the reported kernel: {blocks} blocks per SM, {fraction:.1%} occupancy")

# %% [markdown]
# Low, a fraction of the SM's 64 warp slots, and on purpose: FlashAttention spends registers
# and shared memory on keeping its tiles on-chip rather than on more warps. Chapter 4 compares such numbers with the
# footprint a GPU trace reports.
#
# Back to [chapter 4](../04_triton.ipynb), or on to the [exercises of chapter 5](05_cuda.ipynb).

# %% [markdown]
# # Exercises 3: one call, many backends
#
# Practice for [chapter 3, scaled_dot_product_attention](../03_sdpa.ipynb). Three tasks:
# predict how much work each backend's trace holds and then count it, give SDPA your own
# mask (and meet its convention), and write the NaN-proof softmax SDPA's math backend uses.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch
import torch.nn.functional as F

from kernels.exercises import showing_solutions
from kernels.notebook import setup
from kernels.exercises.sdpa import (BACKEND_SCENARIOS, check_backend_predictions, check_safe_softmax, check_sdpa_mask,
                                    check_work_op_count)

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: guess the work, then count it
#
# An op **does work** when it is not a view or an allocation (`step.ops["is_view"]` is
# False) and either no such op runs under it, or it allocates its own result:
# `aten::matmul` dispatches to `aten::bmm`, and the work is the `bmm`; `aten::mul` computes
# into a buffer it allocates, even though a tiny `copy_` of the Python scale runs under it.
# The trace reader's `Step.work_ops()` applies the same rule in every chapter. First write down how many ops doing work you expect in one forward of
# two backends on this machine, before looking: `sdpa_math` (SDPA written with ordinary
# ops) and `sdpa_flash` (on a CPU: PyTorch's fused CPU kernel). Then write
# `count_work_ops(step)`, which the check runs on each backend's trace. A wrong guess
# passes; a missing guess does not. The difference is the lesson.

# %% tags=["stub"]
my_guesses = {"sdpa_math": None, "sdpa_flash": None}  # your numbers, before profiling


def count_work_ops(step):
    # your code here: return an int
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the guess
# Chapter 1's attention does five things: matmul, scale, mask, softmax, matmul. The math
# backend does them too, and more: it scales q and k separately, builds the causal mask
# on every call, and guards its softmax against NaN. A fused backend does everything in one op.
# :::
#
# :::{dropdown} Hint 2: the count
# Three columns of `step.ops` carry the rule: `is_view`, `parent` (the row index of the op a
# row runs under) and `self_alloc_bytes`. An op is some other op's parent exactly when its
# index appears in the `parent` column.
# :::

# %% tags=["solution", "hide-input"]
# Solution. The guesses, reasoned before profiling: math = 2 matmuls + 2 scalings + mask
# (ones, tril, where) + add + softmax with its guard (softmax, isneginf, all, where) ≈ 13;
# flash = 1 fused op. The check prints how far off these were.
solution_guesses = {"sdpa_math": 13, "sdpa_flash": 1}


def solution_count_work_ops(step):
    work = step.ops[~step.ops["is_view"]]
    wraps_work = work.index.isin(work["parent"])
    return int((~wraps_work | (work["self_alloc_bytes"] > 0)).sum())

# %% tags=["check"]
check_work_op_count(solution_count_work_ops if solutions else count_work_ops,
                    solution_guesses if solutions else my_guesses, device=device)

# %% [markdown]
# ## Task 2: SDPA with your own mask
#
# `is_causal=True` covers the causal case, but real models pass masks (padding, sliding
# windows). Write `sdpa_with_mask(q, k, v, future)` that calls
# `F.scaled_dot_product_attention` with an explicit boolean `attn_mask` built from
# chapter 1's `future` mask (True = a key in the query's future, to be hidden), and returns
# causal attention.

# %% tags=["stub"]
def sdpa_with_mask(q, k, v, future):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# Read the `attn_mask` entry of `help(F.scaled_dot_product_attention)`: for a boolean
# mask, does True mean "hide" or "take part in attention"? `masked_fill` and SDPA disagree.
# :::

# %% tags=["solution", "hide-input"]
# Solution: SDPA's boolean mask marks the keys a query may attend to, so invert `future`.
def solution_sdpa_with_mask(q, k, v, future):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~future)

# %% tags=["check"]
check_sdpa_mask(solution_sdpa_with_mask if solutions else sdpa_with_mask, device=device)

# %% [markdown]
# ## Task 3: a softmax that survives a fully masked row
#
# With padding, a query can have **every** key masked. A plain softmax over a row of
# $-\infty$ computes $0/0$: NaN, which then spreads through every later layer. SDPA's math
# backend calls `_safe_softmax`, which returns zeros for such rows. Write
# `safe_softmax(x)` (softmax over the last dimension) that does the same, without
# changing `x`.

# %% tags=["stub"]
def safe_softmax(x):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# Two steps: find the rows where every score is $-\infty$ (an element-wise test, then a
# reduction along the last dimension), and zero those rows of the softmax's output with an
# op that returns a new tensor rather than writing into one.
# :::

# %% tags=["solution", "hide-input"]
# Solution: an ordinary softmax, then zeros where every score was -inf.
def solution_safe_softmax(x):
    dead = torch.isneginf(x).all(dim=-1, keepdim=True)
    return torch.softmax(x, dim=-1).masked_fill(dead, 0.0)

# %% tags=["check"]
check_safe_softmax(solution_safe_softmax if solutions else safe_softmax, device=device)

# %% [markdown]
# Those extra ops (`isneginf`, `all`, `where`) are the NaN-guard kernels the chapter found
# in the math backend's trace.
#
# ## Task 4: predict the backend
#
# Chapter 3 gave SDPA's rules (torch 2.13): a priority order (flash, memory-efficient, math,
# cuDNN by default; cuDNN first on compute capability 9.x and 10.x with a cuDNN newer than
# 9.15, unless `TORCH_CUDNN_SDPA_DEPRIORITIZED=1`), and each backend's own checks (dtype, head
# dim, GPU, and for cuDNN deterministic mode). For each unpinned, causal call below (runtime
# cuDNN 9.20), which backend runs? Write one of `sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`,
# `sdpa_math`.

# %%
print("\n".join(BACKEND_SCENARIOS))

# %% tags=["stub"]
my_predictions = {name: None for name in BACKEND_SCENARIOS}  # fill in each

# %% [markdown]
# :::{dropdown} Hint
# Walk the order for that GPU and stop at the first backend that accepts the call; math
# accepts everything. To ask whether one accepts, call the rules chapter 3 used:
# `kernels.attention.sdpa.gpu_input_reason(backend, capability, dtype, head_dim,
# cudnn_version=92000, deterministic=False)` returns why that backend refuses the call, and nothing when it accepts it.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the order first, then each backend's checks.
solution_predictions = {
    "A100, bf16, D=64": "sdpa_flash",
    "H200, bf16, D=64": "sdpa_cudnn",
    "H200, bf16, D=64, TORCH_CUDNN_SDPA_DEPRIORITIZED=1": "sdpa_flash",
    "H200, bf16, D=64, deterministic algorithms on": "sdpa_flash",
    "H200, fp32, D=64": "sdpa_efficient",
    "T4, fp16, D=64": "sdpa_efficient",
    "T4, fp16, D=60": "sdpa_math",
}

# %% tags=["check"]
check_backend_predictions(solution_predictions if solutions else my_predictions)

# %% [markdown]
# Back to [chapter 3](../03_sdpa.ipynb), or on to the [exercises of chapter 4](04_triton.ipynb).

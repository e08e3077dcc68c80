# %% [markdown]
# # Exercises 2: in place
#
# Practice for [chapter 2, in place](../02_inplace.ipynb). First the one-character fix, then
# the same idea pushed as far as it goes: attention that allocates a single S×S buffer. The
# second check profiles your function and counts what it allocates.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch

from kernels.exercises import showing_solutions
from kernels.exercises.inplace import check_inplace_mask, check_lean_attention
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: mask in place
#
# Write `my_mask_(scores, future)`: set `scores` to $-\infty$ where the boolean mask `future`
# is True, **in the scores tensor itself**, and return it. (The trailing underscore is
# PyTorch's naming for in-place functions.) The check verifies that the returned tensor
# shares the storage of `scores`.

# %% tags=["stub"]
def my_mask_(scores, future):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# `masked_fill` returns a new tensor (a clone, then a fill). Its in-place twin writes into
# the tensor it is called on and returns that same tensor.
# :::

# %% tags=["solution", "hide-input"]
# Solution: masked_fill_ fills in place and returns the tensor it filled.
def solution_mask_(scores, future):
    return scores.masked_fill_(future, float("-inf"))

# %% tags=["check"]
check_inplace_mask(solution_mask_ if solutions else my_mask_, device=device)

# %% [markdown]
# ## Task 2: one S×S buffer
#
# Naive attention allocates four S×S buffers per call (scores, scaled scores, the clone,
# the probabilities), the in-place version three. Write `lean_attention(q, k, v)` (causal,
# scale $1/\sqrt{d}$) that allocates **one**: the matmul's output, which every later step
# overwrites. The check first compares your result with the float64 reference, then
# profiles one call and adds up the memory it allocated.

# %% tags=["stub"]
def lean_attention(q, k, v):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1
# Every out-of-place op (`x * s`, `masked_fill`, `softmax`) allocates its output. Most have an
# in-place twin, named with a trailing underscore, that writes into the tensor it is called on.
# :::
#
# :::{dropdown} Hint 2: a softmax in place
# `torch.softmax` always allocates, so write the softmax from its definition,
# $e^{x - \max x} / \sum e^{x - \max x}$ row by row, each step in place. The row maximum and
# the row sum (kept as `[..., S, 1]`) are small enough to allocate.
# :::
#
# :::{dropdown} Hint 3
# If the check names an op that allocated a large buffer, find it in
# `kernels.trace.tables.op_table(run.steps()[0])` for a
# `run = kernels.trace.record.profile(lean_attention, q, k, v, label="lean")` of your own.
# :::

# %% tags=["solution", "hide-input"]
# Solution: every step after the first matmul writes into `scores`.
def solution_lean_attention(q, k, v):
    s = q.shape[-2]
    scores = q @ k.transpose(-2, -1)                    # the one S×S buffer
    scores.mul_(q.shape[-1] ** -0.5)
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
    scores.masked_fill_(future, float("-inf"))
    scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    scores.div_(scores.sum(dim=-1, keepdim=True))
    return scores @ v

# %% tags=["check"]
check_lean_attention(solution_lean_attention if solutions else lean_attention, device=device)

# %% [markdown]
# Why does PyTorch not do this for you? Autograd: the softmax's backward needs its output,
# so overwriting it in place (as the division above does) breaks training, while the
# in-place mask of chapter 2 is safe because nothing saved the scores it overwrites. Whether an
# in-place op is safe depends on what autograd saved, which is why PyTorch leaves the choice
# to you; tricks like these belong in inference code, or inside one fused kernel, which is
# where chapters 3 and 4 go.
#
# Back to [chapter 2](../02_inplace.ipynb), or on to the [exercises of chapter 3](03_sdpa.ipynb).

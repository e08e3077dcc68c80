# %% [markdown]
# # Exercises 1: attention by hand
#
# Practice for [chapter 1, attention by hand](../01_naive.ipynb). You will write causal
# attention from PyTorch primitives, then hunt the hidden copy in a trace with code instead
# of eyes. The first check runs your attention on inputs it has never seen (odd lengths,
# non-contiguous views, both causal modes) against the float64 reference; the second runs
# your finder on three traces, one of them new to you. Each names the mistake when it
# recognizes one.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch

from kernels.exercises import showing_solutions
from kernels.exercises.naive import check_attention, check_hidden_copy
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: causal attention from primitives
#
# Write `my_attention(q, k, v, causal=True, scale=None)` for inputs of shape
# `[batch, heads, seq, head_dim]`:
#
# $$\operatorname{softmax}\!\left(\operatorname{mask}\!\left(q k^\top \cdot \text{scale}\right)\right) v,
# \qquad \text{scale} = 1/\sqrt{d} \text{ unless given.}$$
#
# With `causal=True`, query $i$ may look at keys $j \le i$ only. Build it from PyTorch's basic
# ops, as the chapter's `attend` does; no `scaled_dot_product_attention`.

# %% tags=["stub"]
def my_attention(q, k, v, causal=True, scale=None):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the scores
# The scores are `[batch, heads, seq, seq]`: row $i$ holds query $i$'s score for every key, so
# `k`'s last two dimensions must swap before the product. The default scale is $1/\sqrt{d}$,
# with $d$ the head dimension: the last dimension of `q`.
# :::
#
# :::{dropdown} Hint 2: the mask
# Query $i$'s future is the keys $j > i$: the part of an S×S boolean matrix strictly above the
# diagonal. `triu` takes a `diagonal` argument: which value leaves the diagonal itself visible
# (a query may look at its own position)? Fill the hidden scores with a value whose `exp` is
# exactly 0, and build the mask on `q`'s device.
# :::
#
# :::{dropdown} Hint 3: the softmax
# Each query's weights over the keys must sum to 1: over which dimension of the scores does
# the softmax run?
# :::

# %% tags=["solution", "hide-input"]
# Solution: the chapter's five steps, one op each.
def solution_attention(q, k, v, causal=True, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        s_q, s_k = scores.shape[-2:]
        future = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v

# %% tags=["check"]
check_attention(solution_attention if solutions else my_attention, device=device)

# %% [markdown]
# ## Task 2: find the hidden copy with code
#
# In the chapter we found the copy by reading the op table. Now make it a function, so it
# works on traces you have not read. Write `find_hidden_copy(step, min_bytes)`: among the
# copies in `step` that move at least `min_bytes`, take the largest, and return the name of
# the **top-level op** (depth 0, a line of your code) that caused it. Return `None` if no
# copy is that large.
#
# `step` is one recorded forward (`kernels.trace.reader.Step`, as in the chapter). Two of its
# members are all you need:
#
# - `step.ops`: a DataFrame, one row per op in call order, with columns `name`, `depth` (0 at
#   the top level) and `parent` (the row label of the op that called it, -1 at the top level);
# - `step.copies(min_bytes=n)`: the `aten::copy_` rows of `step.ops` that move at least `n`
#   bytes, with the same row labels and a `bytes` column.
#
# The check runs it on three traces: naive attention, in-place attention, and a third
# variant you have not seen.

# %% tags=["stub"]
def find_hidden_copy(step, min_bytes):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the copies
# Filter by what a copy moves, not by its name: naive attention also has a 4-byte copy, under
# `aten::mul`. Which row label holds the largest value of a column?
# :::
#
# :::{dropdown} Hint 2: up to the top
# From the copy's row, follow `parent` upwards. How many levels up is the top? Print a few
# rows of `step.ops` (the naive trace's copy sits two levels down, but another trace's may not).
# :::

# %% tags=["solution", "hide-input"]
# Solution: the largest copy by bytes, then up the parent chain to depth 0.
def solution_hidden_copy(step, min_bytes):
    copies = step.copies(min_bytes=min_bytes)
    if copies.empty:
        return None
    row = copies["bytes"].idxmax()
    while step.ops.at[row, "parent"] >= 0:
        row = step.ops.at[row, "parent"]
    return step.ops.at[row, "name"]

# %% tags=["check"]
check_hidden_copy(solution_hidden_copy if solutions else find_hidden_copy, device=device)

# %% [markdown]
# :::{dropdown} What was the third trace?
# Attention that masks a copy of its scores in place, keeping the raw scores for a look later, a
# debugging habit. In the source the copy is a few characters on a line; in the trace it is what
# it costs, a full-size copy of the scores, one level below the top rather than two.
# :::
#
# Back to [chapter 1](../01_naive.ipynb), or on to the [exercises of chapter 2](02_inplace.ipynb).

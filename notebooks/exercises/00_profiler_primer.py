# %% [markdown]
# # Exercises 0: reading a trace
#
# Practice for [chapter 0, the profiler in one page](../00_profiler_primer.ipynb). Each task
# has a cell for your answer, hints that open when you click them, and a check that runs your
# code on fresh inputs and tells you in words what is wrong. A hidden solution follows each
# task: try first, then compare.
#
# Run the cells from the top. If a check says what is wrong, fix your cell and run the check again.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch
import torch.nn.functional as F

from kernels.exercises import showing_solutions
from kernels.exercises.primer import check_hottest_op, check_top_level_guess
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)


def layer(x, w, b):
    """The subject of this page: one linear layer and its activation."""
    return F.gelu(x @ w + b)


x = torch.randn(4 * seq, 4 * head_dim, device=device, dtype=dtype)
w = torch.randn(4 * head_dim, 4 * head_dim, device=device, dtype=dtype)
b = torch.randn(4 * head_dim, device=device, dtype=dtype)

# %% [markdown]
# ## Task 1: guess the top level, then look
#
# Read `layer` above. Before profiling it, write down the ops you expect at the **top level**
# of its trace (depth 0: the ops your code called), in order, with their `aten::` names.

# %% tags=["stub"]
my_guess: list[str] = []  # your guess: op names in order, e.g. ["aten::sin", ...]

# %% [markdown]
# :::{dropdown} Hint 1
# Each tensor operation your code calls is one op at the top level, named after it:
# `torch.sin(x)` shows as `aten::sin`, `x * y` as `aten::mul`.
# :::
#
# :::{dropdown} Hint 2
# An op can call others: `aten::matmul` dispatches to a concrete kernel (`aten::mm`,
# `aten::addmm`...) that runs one level *under* it, so the kernel is not part of the top level.
# :::

# %% tags=["solution", "hide-input"]
# Solution: one op per Python operation, in the order they run.
solution_guess = ["aten::matmul", "aten::add", "aten::gelu"]

# %% tags=["check"]
check_top_level_guess(solution_guess if solutions else my_guess, layer, x, w, b)

# %% [markdown]
# ## Task 2: where did the time go?
#
# Write `hottest_op(step)`: the name of the op that spent the most time **in itself** in
# one profiled step. `step.ops` is a pandas DataFrame with one row per op: `name`, `depth`,
# `parent`, `dur_us` (the op's whole duration, children included), `self_us` (its duration
# minus its children's).

# %% tags=["stub"]
def hottest_op(step):
    # your code here: return an op's name, a string such as "aten::relu"
    ...

# %% [markdown]
# :::{dropdown} Hint 1
# `aten::matmul` lasts as long as the `aten::mm` inside it, plus a little. Which column
# tells them apart?
# :::
#
# :::{dropdown} Hint 2
# Find the row with the largest value in that column (pandas has a method that returns the
# row's label rather than the value), then read that row's name.
# :::

# %% tags=["solution", "hide-input"]
# Solution: self time, not total time; a parent's total always includes its children.
def solution_hottest_op(step):
    ops = step.ops
    return ops.loc[ops["self_us"].idxmax(), "name"]

# %% tags=["check"]
check_hottest_op(solution_hottest_op if solutions else hottest_op, layer, x, w, b)

# %% [markdown]
# Back to [chapter 0](../00_profiler_primer.ipynb), or on to the
# [exercises of chapter 1](01_naive.ipynb).

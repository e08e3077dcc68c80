# %% [markdown]
# # Exercises 11: attention across devices
#
# Practice for [chapter 11, attention across devices](../11_context_parallel.ipynb). Two tasks:
# merge two partial attentions by their [log-sum-exp](../glossary.md#log-sum-exp) (what every
# step of the ring does), and find the slow rank in a folder of rank traces. Each check runs
# your code on fresh inputs (it prints the seed, so a failure can be replayed with `seed=`) and
# names the mistake when it recognizes one.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch

from kernels.exercises import showing_solutions
from kernels.exercises.context_parallel import check_merge, check_slow_rank
from kernels.notebook import setup
from kernels.parallel import rank_traces

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: merge two partial attentions
#
# Write `merge(out_a, lse_a, out_b, lse_b)`. The same queries attended to two disjoint sets of
# keys: `out_a` `[B, H, S, D]` is the softmax-weighted sum over set A's keys only, and `lse_a`
# `[B, H, S]` the log of that softmax's denominator, log Σ exp(score) over A; the same for B.
# Return `(out, lse)`: attention over all the keys, and its log-sum-exp. A row that saw no key
# of a set has that set's lse equal to −inf (and output 0).

# %% tags=["stub"]
def merge(out_a, lse_a, out_b, lse_b):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the weights
# The whole denominator is e^{lse_a} + e^{lse_b}. Each part's output was divided by its own
# denominator only, so it must be scaled by its share: e^{lse_a} / (e^{lse_a} + e^{lse_b}).
# :::
#
# :::{dropdown} Hint 2: without overflow, without NaN
# Scores can be large: never exponentiate an lse alone. torch has a function for the log of
# a sum of two exponentials, computed safely. And a row where neither part saw a key has
# −inf − (−inf) = NaN somewhere: such a row must get weight 0.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the log of the summed denominators, then each part weighed by its share of it.
def solution_merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    seen = torch.isfinite(lse)
    weight_a = torch.where(seen, torch.exp(lse_a - lse), 0.0)
    weight_b = torch.where(seen, torch.exp(lse_b - lse), 0.0)
    return out_a * weight_a[..., None] + out_b * weight_b[..., None], lse

# %% tags=["check"]
check_merge(solution_merge if solutions else merge)

# %% [markdown]
# ## Task 2: find the slow rank
#
# Write `slow_rank(folder)`: `folder` holds one profiler trace per rank of a job (the file
# names need not say which rank is which). Return the rank the others waited for in the first
# profiler step: the one that computed longest. `kernels.parallel.rank_traces` reads such a folder.

# %% tags=["stub"]
def slow_rank(folder):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# `rank_traces.load_ranks(folder)` orders the traces by the rank each one records, and a step
# read from it summarises what each rank did. A rank that finished its share early spends the
# rest of the step waiting: which measure tells the slow rank apart?
# :::

# %% tags=["solution", "hide-input"]
# Solution: the rank with the most compute; the others spent the difference waiting.
def solution_slow_rank(folder):
    summary = rank_traces.load_ranks(folder).step().summary()
    return int(summary["compute_us"].idxmax())

# %% tags=["check"]
check_slow_rank(solution_slow_rank if solutions else slow_rank)

# %% [markdown]
# The rank that waits longest is the fastest one: waiting is what a rank does when it has
# finished its share early.
#
# Back to [chapter 11](../11_context_parallel.ipynb), or on to the [exercises of chapter 12](12_real_models.ipynb).

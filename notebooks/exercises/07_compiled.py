# %% [markdown]
# # Exercises 7: compiled attention and FlexAttention
#
# Practice for [chapter 7, compiled attention](../07_compiled.ipynb). You will write a
# FlexAttention mask, count the tiles a block mask skips, and write a score_mod. Each check
# runs your code on fresh cases (it prints the seed, so a failure can be replayed) against a
# judge it computes, and names the mistake when it recognizes one. Nothing here compiles:
# masks are evaluated directly, and score_mods run through FlexAttention's exact, slow path.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import math

import torch

from kernels.exercises import showing_solutions
from kernels.exercises.compiled import check_skipped_tiles, check_softcap, check_window_mask
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: a sliding-window mask
#
# A `mask_mod(b, h, q_idx, kv_idx)` returns True where query `q_idx` may see key `kv_idx`
# (the indices arrive as tensors; use comparisons and `&`, not Python's `and`). Write
# `sliding_window(window)` returning the mask_mod of causal attention over the last
# `window` keys: each query sees itself and the `window - 1` keys before it.

# %% tags=["stub"]
def sliding_window(window):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: two conditions
# A key is visible when it is not in the query's future *and* not too far in its past. Write each
# as a comparison between `kv_idx` and `q_idx` (the second one involves `window`; count how many
# keys a query sees, itself included), and combine the two boolean tensors with `&`.
# :::
#
# :::{dropdown} Hint 2: returning a function
# `def mask_mod(b, h, q_idx, kv_idx): return ...`, defined inside `sliding_window`, then
# `return mask_mod`: the inner function remembers `window`.
# :::

# %% tags=["solution", "hide-input"]
# Solution: causal and at most window - 1 keys back.
def solution_window(window):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx > q_idx - window)
    return mask_mod

# %% tags=["check"]
check_window_mask(solution_window if solutions else sliding_window)

# %% [markdown]
# ## Task 2: how many tiles does causal skip?
#
# `create_block_mask` cuts the S×S score matrix into `block × block` tiles and skips the
# tiles in which the mask hides every score. Write `skipped_tiles(seq, block)`: how many
# tiles a causal mask (query i sees keys j <= i) skips, for a sequence of length `seq`.
# The check compares with `create_block_mask` itself, including lengths that are not a
# multiple of the tile size.

# %% tags=["stub"]
def skipped_tiles(seq, block):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the grid
# The matrix has `n = ceil(seq / block)` tiles per row (the last one may be short). A tile
# in row r and column c holds queries r·block... and keys c·block...: when is every key in
# it after every query?
# :::
#
# :::{dropdown} Hint 2: the diagonal
# Tiles with c > r are entirely in the future: skipped. Tiles with c == r hold the diagonal
# (a query sees itself): computed, with the mask. Count the tiles strictly above the
# diagonal of an n × n grid.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the n(n-1)/2 tiles strictly above the diagonal of an n × n grid, n = ceil(S / block).
def solution_skipped_tiles(seq, block):
    n = math.ceil(seq / block)
    return n * (n - 1) // 2

# %% tags=["check"]
check_skipped_tiles(solution_skipped_tiles if solutions else skipped_tiles)

# %% [markdown]
# ## Task 3: a score_mod, soft-capping
#
# Some models (Gemma 2, for one) soft-cap attention scores so that no single score can
# dominate: `score -> cap · tanh(score / cap)`, close to the score when it is small, never
# beyond ±cap. No SDPA backend does this; with FlexAttention it is a `score_mod(score, b,
# h, q_idx, kv_idx)` returning the new score. Write `softcap(cap)` returning that score_mod.

# %% tags=["stub"]
def softcap(cap):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# Define the score_mod inside `softcap`, so it remembers `cap`, and return it. The score is a
# tensor: use `torch.tanh`, not `math.tanh`. It arrives already multiplied by the scale 1/sqrt(d).
# :::

# %% tags=["solution", "hide-input"]
# Solution: cap · tanh(score / cap).
def solution_softcap(cap):
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod

# %% tags=["check"]
check_softcap(solution_softcap if solutions else softcap)

# %% [markdown]
# In the chapter's terms: a mask_mod decides which tiles run at all (the block mask), a
# score_mod changes scores inside the tiles that run; compiled, both become part of one
# fused kernel.
#
# Back to [chapter 7](../07_compiled.ipynb), or on to the [exercises of chapter 8](08_block.ipynb).

# %% [markdown]
# # Exercises 10: decoding
#
# Practice for [chapter 10, decoding](../10_decoding.ipynb). Two tasks: one decode token
# through a KV cache, and the arithmetic intensity of a decode token with shared K/V heads.
# Each check runs your code on fresh shapes (it prints the seed, so a failure can be replayed
# with `seed=`) and names the mistake when it recognizes one.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch
import torch.nn.functional as F

import kernels
from kernels.exercises import showing_solutions
from kernels.exercises.decoding import check_decode_intensity, check_decode_token
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: one decode token
#
# Write `decode_token(cache, q, k_new, v_new)`: `cache` is a `kernels.attention.decoding.KVCache`
# already holding some tokens, `q` the new token's query `[B, H, 1, D]`, `k_new` and `v_new`
# its key and value `[B, Hkv, 1, D]` (Hkv may be smaller than H). Add the new token to the
# cache, then return the query's attention over every cached token, `[B, H, 1, D]`.

# %% tags=["stub"]
def decode_token(cache, q, k_new, v_new):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the cache
# `cache.append(k_new, v_new)` writes the token and returns the filled keys and values.
# `cache.k` is the whole preallocated buffer, empty slots included.
# :::
#
# :::{dropdown} Hint 2: the mask
# Which cached keys may the new token's query see? Before you pass `is_causal=True` to
# `F.scaled_dot_product_attention`, check which keys its mask lets a single query see (chapter 10
# shows it).
# :::
#
# :::{dropdown} Hint 3: fewer K/V heads than query heads
# `F.scaled_dot_product_attention` pairs query head h with K/V head h unless you pass
# `enable_gqa=True`; with Hkv < H and no such flag the head counts do not match. The library's
# `kernels.get(name)(q, k, v, causal=True)` takes shared K/V heads as they are.
# :::

# %% tags=["solution", "hide-input"]
# Solution: append first (the new query sees its own key), then bottom-right causal attention.
def solution_decode_token(cache, q, k_new, v_new):
    keys, values = cache.append(k_new, v_new)
    return kernels.get("sdpa_math")(q, keys, values, causal=True)

# %% tags=["check"]
check_decode_token(solution_decode_token if solutions else decode_token)

# %% [markdown]
# ## Task 2: FLOPs per byte of a decode token
#
# Write `decode_intensity(heads, kv_heads, cache_len, head_dim, bytes_per_element)`: the
# FLOPs of one decode token (batch 1, one query, causal) divided by the bytes a fused kernel
# must move for it (read q, the cached K and V, write o).

# %% tags=["stub"]
def decode_intensity(heads, kv_heads, cache_len, head_dim, bytes_per_element):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the FLOPs
# Each query head does two matrix products with the cache: its scores against every cached key,
# then the weighted sum of the values. A multiply-add is two FLOPs. Does one query against its own
# cache hide any keys?
# :::
#
# :::{dropdown} Hint 2: the bytes
# A fused kernel reads each input once and writes its output once. Which tensors are those, and
# how many heads does each have? A K/V head shared by a group of query heads is read once.
# :::

# %% tags=["solution", "hide-input"]
# Solution: 4·H·Sk·D over (2·H·D + 2·Hkv·Sk·D) elements.
def solution_decode_intensity(heads, kv_heads, cache_len, head_dim, bytes_per_element):
    flops = 4 * heads * cache_len * head_dim
    moved = (2 * heads * head_dim + 2 * kv_heads * cache_len * head_dim) * bytes_per_element
    return flops / moved

# %% tags=["check"]
check_decode_intensity(solution_decode_intensity if solutions else decode_intensity)

# %% [markdown]
# Try your function on 32 query heads against 8 K/V heads, then against 32, in bfloat16: how many
# times closer to a GPU's ridge does sharing K/V heads bring a decode token, and is it close?
#
# :::{dropdown} Answer
# About 4 times: with a long cache the bytes are almost all K and V, and 8 K/V heads instead of 32
# read a quarter of them for the same FLOPs, so the token goes from about 1 FLOP per byte to about
# 4 (a little under, since q and o are not shared). Not close: an H200 needs about 206 FLOPs per
# byte to keep its tensor cores busy (chapter 10), so a decode token with GQA is still about 50
# times below its ridge, and memory-bound.
# :::
#
# Back to [chapter 10](../10_decoding.ipynb), or on to the [exercises of chapter 11](11_context_parallel.ipynb).

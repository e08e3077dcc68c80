# %% [markdown]
# # Exercises 8: one transformer block
#
# Practice for [chapter 8, one transformer block](../08_block.ipynb). You will count a
# block's FLOPs by part, find the length where attention becomes half of them, and write the
# block's forward from its parts. Each check runs your code on fresh shapes (it prints the
# seed, so a failure can be replayed) and names the mistake when it recognizes one.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import torch
from torch.nn import functional as F

from kernels.exercises import showing_solutions
from kernels.exercises.block import check_block_flops, check_block_forward, check_crossover
from kernels.notebook import setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: FLOPs by part
#
# Write `block_flops(seq, width, batch, mlp_ratio)` returning a dict with the matmul FLOPs of
# one forward of the chapter's block: `"qkv"` (the [W, 3W] projection), `"attention"` (q kᵀ
# and probs · v, every S×S score computed, as the block's hand-written attention does),
# `"proj"` ([W, W]) and `"mlp"` (W -> mlp_ratio·W -> W). Count 2 FLOPs per multiply-add.

# %% tags=["stub"]
def block_flops(seq, width, batch, mlp_ratio):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: one linear layer
# A [tokens, K] × [K, N] matmul does tokens·K·N multiply-adds: 2·tokens·K·N FLOPs, with
# tokens = batch · seq.
# :::
#
# :::{dropdown} Hint 2: attention
# Per head, q kᵀ is [S, D] × [D, S]: 2·S²·D FLOPs; probs · v the same. Summed over heads,
# D × heads = W.
# :::

# %% tags=["solution", "hide-input"]
# Solution: 2·M·K·N per matmul.
def solution_block_flops(seq, width, batch, mlp_ratio):
    tokens = batch * seq
    return {"qkv": 2 * tokens * width * 3 * width,
            "attention": 2 * 2 * batch * seq * seq * width,
            "proj": 2 * tokens * width * width,
            "mlp": 2 * 2 * tokens * width * mlp_ratio * width}

# %% tags=["check"]
check_block_flops(solution_block_flops if solutions else block_flops)

# %% [markdown]
# ## Task 2: where attention is half the block
#
# Write `crossover(width, mlp_ratio, causal_skip)`: the sequence length S at which
# attention's FLOPs equal those of the four linear layers together. With
# `causal_skip=True`, attention is a kernel that skips the masked half of the scores.

# %% tags=["stub"]
def crossover(width, mlp_ratio, causal_skip):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint
# Task 1's counts, per sequence: the linear layers' FLOPs grow with S, attention's with S².
# Set the two equal and solve for S: one factor of S cancels.
# :::

# %% tags=["solution", "hide-input"]
# Solution: 2·S·W²·(4 + 2r) = c·S²·W  =>  S = 2·W·(4 + 2r) / c, with c = 4 (or 2 when skipping half).
def solution_crossover(width, mlp_ratio, causal_skip):
    return 2 * width * (4 + 2 * mlp_ratio) / (2 if causal_skip else 4)

# %% tags=["check"]
check_crossover(solution_crossover if solutions else crossover)

# %% [markdown]
# ## Task 3: the block's forward
#
# Write `block_forward(block, x)` for a `kernels.attention.block.Block` and x of shape
# [batch, seq, width], using only the block's parts: `block.norm1`, `block.qkv`,
# `block.attend(q, k, v, causal=True)` (q, k, v of shape [batch, heads, seq, head_dim]),
# `block.proj`, `block.norm2`, `block.fc_in`, `block.fc_out`, with `F.gelu` between the
# MLP's layers and `block.heads` heads. It is a pre-norm block: each part reads a
# normalized copy of x and adds its result to x.

# %% tags=["stub"]
def block_forward(block, x):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the heads
# `block.qkv(y)` is [B, S, 3W]; `.split(W, dim=-1)` gives q, k, v of [B, S, W]. View each as
# [B, S, H, D] and transpose to [B, H, S, D]. After attention, undo it: transpose back and
# reshape to [B, S, W].
# :::
#
# :::{dropdown} Hint 2: the residuals
# Each part adds its result to x rather than replacing it, and the MLP reads x as it is after
# the first residual, normalized by its own layer norm.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the pre-norm block, step by step.
def solution_block_forward(block, x):
    b, s, w = x.shape
    h = block.heads
    q, k, v = block.qkv(block.norm1(x)).split(w, dim=-1)
    q, k, v = (t.view(b, s, h, w // h).transpose(1, 2) for t in (q, k, v))
    a = block.attend(q, k, v, causal=True).transpose(1, 2).reshape(b, s, w)
    x = x + block.proj(a)
    return x + block.fc_out(F.gelu(block.fc_in(block.norm2(x))))

# %% tags=["check"]
check_block_forward(solution_block_forward if solutions else block_forward)

# %% [markdown]
# Back to [chapter 8](../08_block.ipynb), or on to the [exercises of chapter 9](09_backward.ipynb).

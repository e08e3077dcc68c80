# %% [markdown]
# # Exercises 8: one transformer block
#
# Practice for [chapter 8, one transformer block](../08_block.ipynb). You will count a
# block's FLOPs by part, find the length where attention becomes half of them, and find the
# S×S buffers in a trace of the block that you record. Each check runs your code on fresh
# shapes and names the mistake when it recognizes one; when your code fails, the message gives
# the seed, so that failure can be replayed.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
from kernels.attention import block as blocks
from kernels.exercises import showing_solutions
from kernels.exercises.block import check_block_flops, check_crossover, check_scores_buffers
from kernels.notebook import setup
from kernels.trace import record

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
# Attention's two matmuls run once per batch element and head. Write each one's [M, K] × [K, N]
# from q, k and v's shape [B, H, S, D], apply Hint 1's rule, and use H·D = W.
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
# Task 1's function gives every part's FLOPs at any S. At the crossover, attention's equal
# the other three parts' together. Test your answer on the chapter's case: mlp_ratio 4 and
# every score computed.
# :::

# %% tags=["solution", "hide-input"]
# Solution: 2·S·W²·(4 + 2r) = c·S²·W  =>  S = 2·W·(4 + 2r) / c, with c = 4 (or 2 when skipping half).
def solution_crossover(width, mlp_ratio, causal_skip):
    return 2 * width * (4 + 2 * mlp_ratio) / (2 if causal_skip else 4)

# %% tags=["check"]
check_crossover(solution_crossover if solutions else crossover)

# %% [markdown]
# ## Task 3: the S×S buffers in a block's trace
#
# The chapter read how much the `block.attention` range allocated. Now read, from a trace you
# record, how many of its allocations are one S×S buffer: the scores (or a copy of them) of
# all heads, B·H·S·S elements. Record one forward of the chapter's block on the CPU and
# explore the trace: `trace.labels()` lists the labelled ranges, `trace.steps(label)` returns
# a list of steps, one per time the range ran, and a step's `memory` has one row per
# `[memory]` event (`ts`, `bytes`).

# %%
x = blocks.block_input(batch=1, seq=64, width=32)
block = blocks.seeded_block(width=32, heads=2, attention="naive")
run = record.profile(block, x, label="block", wait=0, warmup=1, active=1)
trace = run.trace
q_shape = (1, 2, 64, 16)  # this block's q: (batch, heads, seq, width // heads)
trace.labels()

# %% [markdown]
# Write `scores_buffers(trace, q_shape, element_size)`: the number of S×S buffers (all heads)
# allocated inside the `block.attention` range of a trace of one forward, for q of shape
# `q_shape` = (B, H, S, D) and elements of `element_size` bytes. The check records fresh
# traces of the block with each attention that runs on a CPU, at shapes of its own. Try yours
# on the trace above first: `scores_buffers(trace, q_shape, 4)` (float32: 4 bytes an element).

# %% tags=["stub"]
def scores_buffers(trace, q_shape, element_size):
    # your code here
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the range
# The range's own step holds only the events that happened inside it; the block's step (label
# `"block"`) holds the MLP's too, and at some shapes the MLP's buffers are as large as the
# scores.
# :::
#
# :::{dropdown} Hint 2: the events
# A `[memory]` event with positive bytes is an allocation, one with negative bytes a free. A
# buffer's bytes are its number of elements times the element size.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the allocations of the range's own step that are one S×S buffer for all heads.
def solution_scores_buffers(trace, q_shape, element_size):
    b, h, s, _ = q_shape
    memory = trace.steps("block.attention")[0].memory
    return int((memory["bytes"] == b * h * s * s * element_size).sum())

# %% tags=["check"]
check_scores_buffers(solution_scores_buffers if solutions else scores_buffers)

# %% [markdown]
# The example's shape was a trap: at S = 64 and W = 32 the MLP's hidden buffer, [1, 64, 128],
# has as many elements as the scores of both heads, [1, 2, 64, 64]. Counted over the whole
# block's step instead of the `block.attention` range, the MLP's buffers pass for S×S ones.
#
# Back to [chapter 8](../08_block.ipynb), or on to the [exercises of chapter 9](09_backward.ipynb).

# %% [markdown]
# # 4. FlashAttention-2 in Triton
#
# The SDPA chapter ended on a single fused kernel, `pytorch_flash`, that beats the hand-written
# ops while keeping the S×S scores out of memory. This chapter writes that kind of kernel
# ourselves, in Triton, and reads it like any other trace. We go from the math to the kernel:
# the *online softmax* that makes tiling possible, the tiles one program touches (and the ones
# causal attention never touches), the kernel's source line by line, a check against the
# float64 reference, and finally its profile next to SDPA's flash backend.
#
# **You will learn to:**
#
# - work the online softmax by hand: a running max and sum, rescaled whenever the max rises, and
#   the log-sum-exp the backward needs;
# - count the tiles a causal program computes, masks and skips, and what that does to the FLOPs;
# - read a FlashAttention-2 forward in Triton line by line, and its backward in three kernels
#   without atomics, both checked against the float64 reference;
# - read its profile: one opaque span in Triton's interpreter on a CPU, one kernel with its
#   footprint and occupancy on a GPU.
#
# **Before you start:** [3b. The fused backends](03b_sdpa_fused.ipynb): the fused kernel this
# chapter writes. Softmax and matrix products; no Triton, the kernel is read line by line.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import math
import os
import warnings

import pandas as pd
import torch
from matplotlib.figure import Figure

import kernels
import kernels.triton.flash as tf
from kernels import gpu_lessons, reference
from kernels.attention import sdpa
from kernels.bench import plots, sweep
from kernels.bench.results import FORWARD, FORWARD_BACKWARD, points_table
from kernels.borrowed import TRACELENS
from kernels.dtypes import TORCH_DTYPES
from kernels.hw import occupancy
from kernels.notebook import glue, inputs, lesson, reveal, say, setup, show_source
from kernels.trace import reader, record, tables
from kernels.trace.attention import find_attention
from kernels.trace.links import links
from kernels.triton import backward as triton_backward, configs, launch, tiling

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
triton_attention = kernels.get("triton")

# The interpreter runs every tile operation as a NumPy call: seconds per forward at the
# preset's size. On the CPU we keep the chapter's shapes small; on a GPU we use the preset's.
INTERPRETER_MAX_HEADS, INTERPRETER_MAX_SEQ = 2, 256
run_batch, run_heads, run_seq = batch, heads, seq
if not on_gpu:
    run_batch, run_heads, run_seq = 1, min(heads, INTERPRETER_MAX_HEADS), min(seq, INTERPRETER_MAX_SEQ)
q, k, v = inputs(run_batch, run_heads, run_seq, head_dim, dtype=dtype, device=device)
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}")
glue("run_shape", f"B={run_batch} H={run_heads} S={run_seq} D={head_dim}")
glue("profile_shape", f"B={batch} H={heads} S={seq} D={head_dim}")
glue("dtype", str(dtype).replace("torch.", ""))
glue("max_heads", INTERPRETER_MAX_HEADS)
glue("max_seq", INTERPRETER_MAX_SEQ)

# %% [markdown]
# This run uses {glue:text}`run_shape` in {glue:text}`dtype`. The preset asked for
# {glue:text}`profile_shape`; on a CPU the chapter keeps a single batch element, at most
# {glue:text}`max_heads` heads and at most {glue:text}`max_seq` tokens, because there the
# kernel runs in Triton's *interpreter* (more on that below), which is far slower than a
# compiled kernel. On a GPU the two shapes are the same.
#
# ## The online softmax
#
# Softmax needs the whole row before it can write anything: the maximum (for numerical
# safety, $e^{x - m}$ never overflows) and the sum of exponentials (the denominator). A
# FlashAttention program sees the row one tile of keys at a time, so it keeps two running
# numbers per row instead, the maximum $m$ and the sum $\ell$ so far, and corrects $\ell$
# whenever a new tile raises the maximum:
#
# $$m_{\text{new}} = \max(m, \max_j x_j), \qquad
#   \ell_{\text{new}} = \ell \cdot e^{m - m_{\text{new}}} + \sum_j e^{x_j - m_{\text{new}}}.$$
#
# `kernels.triton.flash.tiled_softmax` is exactly this, in plain PyTorch, and it records
# $(m, \ell)$ after every tile so that we can watch it:

# %%
show_source(tf.tiled_softmax)

# %% [markdown]
# Run it on a real row: the scaled scores of the last query of head 0 against its first keys,
# read in {glue:text}`softmax_tiles` tiles of {glue:text}`softmax_block` keys.

# %%
softmax_block = configs.INTERPRETER_BLOCKS["BLOCK_N"]
demo_keys = min(run_seq, 8 * softmax_block)  # at most eight tiles: a table, not a wall
row = (q[0, 0, -1].double() @ k[0, 0, :demo_keys].double().T) / math.sqrt(head_dim)
soft, history = tf.tiled_softmax(row, softmax_block)
pd.DataFrame([{"tile": i, "keys": f"{i * softmax_block}..{min((i + 1) * softmax_block, demo_keys) - 1}",
               "tile max": float(row[i * softmax_block:(i + 1) * softmax_block].max()),
               "running max m": float(m), "running sum ℓ": float(l)}
              for i, (m, l) in enumerate(history)]).round(4)

# %%
err = (soft - torch.softmax(row, dim=-1)).abs().max().item()
lesson(err < 1e-12, "the tiled softmax equals torch.softmax", f"max abs difference {err:.1e} in float64")
lesson(float(history[-1][0]) == float(row.max()), "the final running max is the row's max")
glue("softmax_block", softmax_block)
glue("softmax_tiles", len(history))

# %% [markdown]
# Whenever the running max rises, the sum so far is first multiplied by
# $e^{m - m_\text{new}} < 1$ and only then are the new tile's terms added: the old terms were
# counted relative to a smaller maximum, so they shrink when re-expressed relative to the new one.
#
# ### The rescaling step, by hand
#
# Take the row $x = [1, 2, 5, 0]$ in two tiles of two.
#
# - Tile 1, $[1, 2]$: $m = 2$ and $\ell = e^{1-2} + e^{2-2}$ = {glue:text}`hand_l1:.4f`.
# - Tile 2, $[5, 0]$: the maximum rises to $m = 5$. The old sum was relative to 2, so it is
#   multiplied by $e^{2-5}$, giving {glue:text}`hand_rescaled:.4f`; the new terms add
#   $e^{5-5} + e^{0-5}$ = {glue:text}`hand_new:.4f`; $\ell$ = {glue:text}`hand_l2:.4f`.
#
# That is the sum of $e^{x_j - 5}$ over the whole row, as if we had known the maximum from the start:

# %%
x = torch.tensor([1.0, 2.0, 5.0, 0.0], dtype=torch.float64)
_, ((m1, l1), (m2, l2)) = tf.tiled_softmax(x, 2)
rescaled = l1 * torch.exp(m1 - m2)
new_terms = torch.exp(x[2:] - m2).sum()
lesson(float(m1) == 2.0 and float(m2) == 5.0, "the running max goes 2, then 5")
lesson(bool(torch.isclose(l2, rescaled + new_terms)) and bool(torch.isclose(l2, torch.exp(x - 5).sum())),
       "rescaled old sum + new terms = the sum over the whole row relative to its max",
       f"{float(rescaled):.4f} + {float(new_terms):.4f} = {float(l2):.4f}")
glue("hand_l1", float(l1))
glue("hand_rescaled", float(rescaled))
glue("hand_new", float(new_terms))
glue("hand_l2", float(l2))

# %% [markdown]
# ### From softmax to attention
#
# Attention needs $\sum_j \mathrm{softmax}(s)_j\, v_j$, not the probabilities themselves. The
# same trick carries over: keep an unnormalized output `acc` $=\sum_j e^{s_j - m} v_j$,
# rescale it by the same factor $\alpha = e^{m - m_\text{new}}$ when the maximum moves, and
# divide by $\ell$ once at the very end. Here it is for one query row, in a few lines of
# PyTorch; this loop *is* the kernel's inner loop, minus the tiles of queries:

# %%
def online_attention_row(q_row, k, v, block):
    """One query row against all keys, reading `block` keys at a time (causal not applied)."""
    m, l = torch.tensor(float("-inf"), dtype=q_row.dtype), torch.tensor(0.0, dtype=q_row.dtype)
    acc = torch.zeros(v.shape[-1], dtype=q_row.dtype)
    for start in range(0, k.shape[0], block):
        s = k[start:start + block] @ q_row / math.sqrt(q_row.shape[-1])
        m_new = torch.maximum(m, s.max())
        alpha = torch.exp(m - m_new)          # how much the old max overstated the new one
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum()
        acc = acc * alpha + p @ v[start:start + block]
        m = m_new
    return acc / l

q64, k64, v64 = (t[0, 0].detach().to("cpu", torch.float64) for t in (q, k, v))
online = online_attention_row(q64[-1], k64, v64, softmax_block)
exact = reference.attention(q64[None, None, -1:], k64[None, None], v64[None, None], causal=False)[0, 0, 0]
lesson(torch.allclose(online, exact, rtol=1e-12, atol=1e-12),
       "online attention of one row equals the float64 reference row")

# %% [markdown]
# Two more details before the kernel. **exp2**: GPUs compute $2^x$ natively, and
# $e^x = 2^{x \log_2 e}$. The kernel multiplies the softmax scale $1/\sqrt{d}$ by
# $\log_2 e$ = {glue:text}`log2e:.6f` once, on the host, and then works in base 2
# throughout, so the change of base costs nothing per score:

# %%
s = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 10
scale = 1 / math.sqrt(head_dim)
base_e = torch.exp(s * scale - (s * scale).max())
base_2 = torch.exp2(s * (scale * launch.LOG2E) - (s * (scale * launch.LOG2E)).max())
lesson(torch.allclose(base_e, base_2, rtol=1e-12), "exp(s·scale - m) = exp2(s·scale·log2 e - m·log2 e)")
glue("log2e", launch.LOG2E)

# %% [markdown]
# **The log-sum-exp**: at the end of a row the forward knows $m$ and $\ell$, and
# $\mathrm{LSE} = m + \log \ell$ (in base 2 in the kernel) is all the backward pass needs to
# rebuild any probability, $P_{ij} = 2^{s_{ij} - \mathrm{LSE}_i}$, without storing $P$. The
# forward saves one float per row for that, S numbers per head instead of S².
#
# ## Tiles: what one program touches
#
# One *program* (a CUDA block, on a GPU) owns `BLOCK_M` query rows. It loads its Q tile once,
# then streams the K and V tiles past it, `BLOCK_N` keys at a time. Each tile of the score
# matrix is then **full** (no mask needed), **masked** (crosses the causal diagonal, or hangs
# past the end of the sequence) or, with a causal mask, **skipped** (entirely in the
# future: the program never loads it). `kernels.triton.tiling` classifies the tiles from the geometry:

# %%
show_source(tiling.tile_map)

# %% [markdown]
# Drawn for a {glue:text}`fig_seq`-token sequence (not a multiple of the tile sizes, so the
# last tiles are ragged) with the interpreter's tiles, `BLOCK_M` = {glue:text}`block_m` and
# `BLOCK_N` = {glue:text}`block_n`, with program {glue:text}`fig_program` picked out: its Q
# tile on the right, the K/V tiles it streams along the top.

# %%
#| caption: Which tiles each program computes, causal (left) and full (right), for a ragged sequence. Blue tiles need no mask, orange ones are masked (on the diagonal, at the ragged edge), grey ones are skipped; the green box is one program's Q tile, the strip on top the K, V tiles it streams.
#| alt: Two grids of tiles over query and key positions. Left, causal: blue tiles below the diagonal, orange on it, grey above it. Right, full: all blue but an orange ragged last column.
block_m, block_n = configs.INTERPRETER_BLOCKS["BLOCK_M"], configs.INTERPRETER_BLOCKS["BLOCK_N"]
fig_seq, fig_program = 200, 2
fig = Figure(figsize=(12, 5.8), layout="constrained")
left, right = fig.subplots(1, 2)
tiling.draw_tiles(fig_seq, block_m, block_n, causal=True, program=fig_program, ax=left)
tiling.draw_tiles(fig_seq, block_m, block_n, causal=False, program=fig_program, ax=right)
glue("fig_seq", fig_seq)
glue("fig_program", fig_program)
glue("block_m", block_m)
glue("block_n", block_n)
fig

# %% [markdown]
# In the causal panel each program walks left to right: full tiles first, with no mask to
# compute, then the tiles on the diagonal, with a mask, then it stops. Everything right of
# its diagonal is skipped. Without the mask (right panel) every program reads every K/V tile
# and only the ragged last column needs a mask. Because `BLOCK_M` = 2 × `BLOCK_N` here, the
# diagonal of a Q tile crosses two key tiles, and both need a mask.
#
# ### Causal does half the work, plus the diagonal
#
# With `seq` $= n \cdot$ `BLOCK_M`, query tile $i$ computes all tiles left of its diagonal and
# its diagonal tiles: summed over the $n$ query tiles, that is a fraction $(n+1)/(2n)$ of what
# the non-causal kernel computes. It approaches one half from above. The FLOP count the
# course uses (`kernels.reference.flops`) counts causal as exactly half, the useful work; the
# gap is the masked half of the diagonal tiles, computed and thrown away. Before the table:
# what share of the non-causal kernel's tiles do you expect a causal kernel to compute at
# S = 256 (a handful of query tiles)?

# %%
guess_causal_share_at_256 = 0.5  # edit me before running on

# %% [markdown]
# Here for the first GPU tile configuration, `BLOCK_M` = {glue:text}`gpu_block_m` and
# `BLOCK_N` = {glue:text}`gpu_block_n`:

# %%
gpu_block_m, gpu_block_n = configs.GPU_CONFIGS[0][:2]
lengths = [256, 512, 1024, 2048, 4096, 8192, 16384]
fractions = pd.DataFrame([{
    "S": s,
    "n (query tiles)": math.ceil(s / gpu_block_m),
    "tiles: causal / full": tiling.computed_fraction(s, gpu_block_m, gpu_block_n),
    "(n+1)/(2n)": tiling.expected_fraction(math.ceil(s / gpu_block_m)),
    "flops(): causal / full": reference.flops(1, 1, s, 64, causal=True) / reference.flops(1, 1, s, 64, causal=False),
    "tiles done / causal FLOPs": tiling.diagonal_overhead(s, gpu_block_m, gpu_block_n),
} for s in lengths]).set_index("S")
display(fractions.round(4))
col = fractions["tiles: causal / full"]
reveal(guess_causal_share_at_256, float(col.loc[256]), "the causal share of tiles at S=256")
lesson(bool((col.diff().dropna() < 0).all()) and col.iloc[-1] - 0.5 < 0.005,
       "the causal share of tiles falls towards one half as S grows",
       f"{col.iloc[0]:.3f} at S={lengths[0]}, {col.iloc[-1]:.4f} at S={lengths[-1]}")
lesson(bool(((col - fractions["(n+1)/(2n)"]).abs() < 1e-12).all()), "it equals (n+1)/(2n) at every S")
lesson(bool((fractions["flops(): causal / full"] == 0.5).all()),
       "kernels.reference.flops counts causal attention as exactly half the FLOPs")
overhead_here = tiling.diagonal_overhead(seq, gpu_block_m, gpu_block_n)
glue("gpu_block_m", gpu_block_m)
glue("gpu_block_n", gpu_block_n)
glue("preset_seq", seq)
glue("overhead_pct", 100 * (overhead_here - 1))

# %% [markdown]
# At the preset's {glue:text}`preset_seq` tokens, a causal kernel with these tiles computes
# {glue:text}`overhead_pct:.1f`% more than the causal FLOP count. TFLOP/s figures in this
# course divide the *useful* FLOPs (causal halved) by the time, so that waste shows up as a
# lower TFLOP/s, not as extra credit.
#
# ### The skipping is real: a poison test
#
# A claim about which tiles a kernel loads can be checked from the outside. Fill V with NaN
# for every key from position {glue:text}`poison_from` on (a multiple of every `BLOCK_M` the
# kernel may use). A kernel that skips the tiles above the diagonal never reads those rows
# for queries before {glue:text}`poison_from`, so their outputs stay finite. A kernel that
# reads everything and masks afterwards multiplies a probability of exactly 0 by NaN, and
# $0 \times \text{NaN} = \text{NaN}$: the naive attention of chapter 1 is such a kernel.

# %%
unit = max(c[0] for c in configs.GPU_CONFIGS) if on_gpu else configs.INTERPRETER_BLOCKS["BLOCK_M"]
poison_from = unit * max(1, (run_seq // unit) // 2)
if poison_from < run_seq:
    v_poisoned = v.clone()
    v_poisoned[:, :, poison_from:] = float("nan")
    rows_nan = {name: kernels.get(name)(q, k, v_poisoned, causal=True).isnan().any(dim=-1)[0, 0]
                for name in ("triton", "naive")}
    lesson(not rows_nan["triton"][:poison_from].any() and bool(rows_nan["triton"][poison_from:].all()),
           f"Triton: rows before {poison_from} stay finite, so no tile holding a later key was loaded for them")
    lesson(bool(rows_nan["naive"].all()), "naive attention reads every key for every row: all rows are NaN")
else:
    print(f"S={run_seq} is too short for this demo (it needs more than {unit} tokens)")
glue("poison_from", poison_from)

# %% [markdown]
# ## The kernel
#
# Here is the forward kernel, shown from the library's source (`@triton.jit` wraps the
# function; `.fn` is the Python function underneath). One *program* computes `BLOCK_M` rows
# of the output of one (batch, head); its pointers come from `kernels.triton.launch.tile_ptrs`:

# %%
show_source(tf.attn_fwd.fn)

# %% [markdown]
# Reading it top to bottom:
#
# - **Program ids.** The launch grid is `(B·H, cdiv(S, BLOCK_M))`: `tl.program_id(0)` says
#   which (batch, head) this program works on (integer division and remainder by `H` split
#   it), `tl.program_id(1)` which query tile it owns. B·H goes on the first axis because a
#   grid's second and third axes stop at 65,535 programs. With a causal mask the tiles are
#   taken in reverse: the last query tiles see the most keys, and launching them first keeps
#   the longest programs from starting last, when the GPU would otherwise sit mostly idle
#   waiting for them (longest job first, a classic scheduling rule; this is the course's own
#   reasoning, not a FlashAttention paper's). Every program runs the same code on different
#   data, and nothing is shared.
# - **Pointer arithmetic with strides.** Triton has no tensors in the kernel, only pointers.
#   `tile_ptrs` builds a `[rows, cols]` block of addresses: the base pointer plus
#   `b·stride_b + h·stride_h + row·stride_s + col·stride_d`. Because every stride is passed
#   in (`*q.stride()` in the launcher), a transposed `[B, S, H, D]` view works without a copy.
#   The offsets are cast to int64 first: `b·stride_b` passes $2^{31}$ on large inputs.
# - **Masks on loads.** `row_ok = offs_m < S` keeps the ragged last tile from reading past the
#   end; masked-off lanes read 0 and are never stored.
# - **Two causal stages.** Causal is aligned bottom-right: query $i$ sees keys
#   $j \le i + (S_k - S_q)$, `SK - SQ` in the kernel (0 when the lengths are equal; a decoding
#   step's single query sees the whole cache). Stage 1 loops over the key tiles that every row
#   of this query tile sees in full (`0 .. full_hi`) with `MASKED=False`: no comparison is
#   computed at all. Stage 2 covers the tiles the diagonal crosses (`full_hi .. masked_hi`)
#   with the mask. The loop never goes further, which is the skipping of the figure above.
#   `CAUSAL`, `MASKED` and the block sizes are `tl.constexpr`: Triton compiles a separate,
#   branch-free version for each value.
# - **Any head dim, shared K/V heads.** `HEAD_DIM` is the head dim padded to a power of two:
#   `tl.arange` and every block shape must be powers of two (Triton 3.7 raises "arange's range
#   must be a power of 2" and "Shape element ... must be a power of 2"), while `tl.dot` asks
#   for an inner dimension of at least 16 (Triton 3.7's check on NVIDIA targets: M >= 1,
#   N >= 1, K >= 16 for 16- and 32-bit inputs). `D`, the real head dim, is a `tl.constexpr`
#   too: the loop's unmasked stage masks the padded lanes only where `D < HEAD_DIM`. With
#   grouped-query attention, query head `h` reads key/value head `h // GROUP`
#   through its pointers, so K and V are never repeated in memory.
# - **exp2 with the scale folded in.** The launcher passes `qk_scale = scale · log2 e`, so
#   the scores `tl.dot(q, kt) · qk_scale` are in log2 units and each probability is
#   `exp2(s − m)` ($e^x = 2^{x \log_2 e}$, and `exp2` is the cheaper instruction). Scaling
#   before the row maximum keeps any scale right, a negative or zero one included.
#   `input_precision="ieee"` asks for exact float32 products: by default Triton multiplies
#   float32 inputs in TF32 (about 1e-3 relative error); 16-bit inputs use the tensor cores
#   either way.
# - **The saved log-sum-exp.** After the loop, `acc / l_i` normalizes once, and
#   `m_i + log2(l_i)` is stored per row for the backward.
#
# The loop itself lives in `attn_fwd_inner`. Compare it with `online_attention_row` above:
# the same four lines, on a `[BLOCK_M, BLOCK_N]` tile instead of one row. (Its `TMA` branch
# loads the tiles another way, on Hopper: the next section.)

# %%
show_source(tf.attn_fwd_inner.fn)

# %% [markdown]
# The launcher and the autograd wrapper are ordinary Python (`kernels.triton.flash.flash_forward`
# and `FlashAttention`). The forward allocates the output and the LSE, builds the grid
# `(B·H, cdiv(S, BLOCK_M))`, passes every stride, and returns both; the
# `torch.autograd.Function` saves Q, K, V, O and the LSE (not the S×S probabilities).

# %% [markdown]
# ### On Hopper: the same kernel, its tiles moved by the TMA
#
# An H100 or H200 (sm_90) has a copy engine in every SM, the *Tensor Memory Accelerator*. A
# program gives it a *tensor descriptor* (the tensor's base, shape and strides, and the shape
# of a tile, made once on the host) and the coordinates of a tile, and the TMA copies the
# whole tile between global and shared memory while the warps compute. There is no address
# per element to compute and hold in registers, and what lies past the tensor's edge reads
# as zeros (and is not written by a store): the masks on ragged tails and padded head dims
# are done by the hardware (CUDA Driver API, "Tensor Map Object Management",
# `cuTensorMapEncodeTiled` and its out-of-bounds fill). Only the scores still need their mask, because a key of zeros
# scores 0, not −∞. The Hopper forward, `attn_fwd_tma`, is `attn_fwd` with its
# loads and stores through descriptors, and it runs the same `attn_fwd_inner` with `TMA=True`.
#
# The descriptors are 4-D, `[B, H, S, D]` with the tensor's own strides, so a transposed
# `[B, S, H, D]` view still needs no copy and a tile never runs into the next head. A
# descriptor needs its tensor 16-byte aligned, contiguous along D and every other stride a
# multiple of 16 bytes (the same page of the Driver API); the launcher asks `tma_reason`, a function of the
# GPU and the tensors only, and takes the pointer kernel whenever it gives a reason.

# %%
fwd_name, why_not_tma = tf.forward_variant(q, k, v)
on_hopper = on_gpu and torch.cuda.get_device_capability(device)[0] == 9
print(f"the forward here: {fwd_name}" + (f" ({why_not_tma})" if why_not_tma else ""))
lesson((fwd_name == "attn_fwd_tma") == on_hopper, "the forward takes the TMA variant exactly on a Hopper GPU",
       why_not_tma or fwd_name)
# Triton's interpreter runs descriptors too, so on a CPU the variant's arithmetic is checked
# here: on a ragged slice (one head, 81 tokens: not a multiple of a tile), both kernels, bit for bit.
# (On a GPU the autotuner may pick other tiles for each, so there the judge under "Run it"
# below checks whichever forward ran.)
part = q[:1, :1, :81], k[:1, :1, :81], v[:1, :1, :81]
if on_gpu:
    print('compiled kernels: the judge under "Run it" below checks the forward that ran')
elif launch.TensorDescriptor is not None and tf.tma_reason(dict(zip("qkv", part)), (9, 0)) is None:
    by_tma, by_pointers = (tf.flash_forward(*part, True, 1 / math.sqrt(head_dim), tma=use)[0] for use in (True, False))
    lesson(torch.equal(by_tma, by_pointers), "the TMA forward gives the pointer forward's output, bit for bit",
           "the same arithmetic in the same order; only the loads and stores differ")
else:
    print("this Triton or these inputs do not take tensor descriptors:",
          "no TensorDescriptor" if launch.TensorDescriptor is None else tf.tma_reason(dict(zip("qkv", part)), (9, 0)))
glue("fwd_name", fwd_name)

# %% [markdown]
# This run's forward is {glue:text}`fwd_name`. `python -m kernels.triton.compile_sweep --target
# sm_90` compiles the TMA forward for an H100 on a machine without a GPU and counts its TMA
# copies (`cp.async.bulk.tensor` in the PTX), next to the registers and shared memory of every
# kernel.
#
# ### The backward pass: three kernels, no atomics
#
# With $P = \mathrm{softmax}(S)$ rebuilt from the LSE, the gradients are
# $dV = P^\top dO$, $dP = dO\,V^\top$, $dS = P \circ (dP - \Delta)$ with
# $\Delta_i = \sum_d O_{id}\, dO_{id}$, then $dK = \text{scale}\cdot dS^\top Q$ and
# $dQ = \text{scale}\cdot dS\,K$. The launcher runs three kernels:

# %%
show_source(triton_backward.flash_backward)

# %% [markdown]
# 1. **`attn_bwd_preprocess`** computes $\Delta$, one number per row, from O and dO. It is
#    the row sum of $P \circ dP$ computed the cheap way (O already holds $P V$), so the main
#    kernels need not form a whole row of $P$ to get it.
# 2. **`attn_bwd_dkdv`**: one program per *key* tile (up to 128 keys on a GPU, where the
#    compiler says it fits). It holds its K and V tiles and loops over the query tiles that
#    can see them (causal: from its diagonal downwards, the mirror image of the forward's
#    skipping), rebuilding $P$ tile by tile and accumulating $dK$ and $dV$ in registers.
# 3. **`attn_bwd_dq`**: one program per *query* tile, looping over key tiles up to its diagonal.
#
# Why two passes, when one loop over key tiles could produce $dK$, $dV$ and $dQ$ together?
# $dK$ and $dV$ are sums over query rows, $dQ$ is a sum over key columns. In a single pass
# over key tiles, a program that owns a key tile contributes only part of the sum for every
# $dQ$ row, so the programs would have to add partial $dQ$ rows into the same memory with
# atomic adds (FlashAttention-2's CUDA backward does this): a zero-filled float32 buffer, a
# conversion at the end, and last bits that change from run to run because the order of the
# additions varies. It is the single *pass* that needs atomics, not the single kernel: the
# Triton tutorial runs the dK/dV loop and then the dQ loop inside one kernel, without atomics.
# We use two kernels for the two passes, so that every program owns what it writes; it costs
# a second pass over $P$ and buys determinism and simpler code. The dK/dV kernel,
# `attn_bwd_dkdv`, and the loop it runs twice, `bwd_dkdv_steps`, are in
# `kernels/triton/backward.py`.
#
# Two ideas from Triton's tutorial shape them.
#
# - **The transposed form.** A dK/dV program needs $P^\top$ and $dS^\top$ (for
#   $dV = P^\top dO$ and $dK = dS^\top Q$). Instead of computing $S = Q K^\top$ and
#   transposing the tile, it computes $S^\top = K Q^\top$ directly, reading Q transposed
#   straight from memory (only the pointers differ), so every product comes out of the tensor
#   cores in the orientation the next one takes. The dQ kernel reads $K^\top$ and $V^\top$ the
#   same way.
# - **Masks only on the diagonal.** As in the forward, the steps come in two kinds, a `MASK`
#   constexpr apart, so Triton compiles one loop with the comparisons and one without any.
#   For a key tile, the query rows before `lo` see none of its keys and are skipped; the rows
#   from `full` on see all of them; only the (at most `BLOCK_N − 1`) rows between cross the
#   diagonal. The masked loop takes those rows, in query tiles of half the height (a masked
#   step holds the mask besides the tiles, and the smaller tile keeps it within the
#   registers), then jumps to the ragged tail after the last whole unmasked step; the
#   unmasked loop takes everything in between. One loop walks all (query head, query tile)
#   pairs of a GQA group, rather than a loop over heads around a loop over tiles, which kept
#   more registers live (`python -m kernels.triton.compile_sweep` shows what the compiler
#   makes of each config: registers, spills, shared memory).

# %% [markdown]
# ## Run it
#
# Without a CUDA GPU the same kernels run in Triton's interpreter, on CPU tensors, with NumPy
# doing the arithmetic tile by tile. Nothing in the notebook changes. Triton's switch is the
# variable `TRITON_INTERPRET`, read when `@triton.jit` decorates a function, so `import
# kernels` sets `TRITON_INTERPRET=1` where no GPU is visible, before any kernel of the course
# is defined. It is set for the whole process: a kernel you define afterwards is interpreted
# too. Where Triton was imported before (torch 2.13's profiler imports it), its own library
# functions (`tl.max`, `tl.sum`) were already compiled, and the library swaps them once for
# interpreted copies (`kernels.triton.interpreter`). A value you set yourself is kept, and
# where a GPU is visible nothing is set.

# %%
print("TRITON_INTERPRET =", os.environ.get("TRITON_INTERPRET"), "| interpreted:", launch.INTERPRETED,
      "| the kernel object:", type(tf.attn_fwd).__name__)
print("triton on", device, "->", kernels.available(device)["triton"] or "runs here")
lesson(kernels.available(device)["triton"] is None, f"the triton kernels run on {device.type}")
if not on_gpu:
    lesson(launch.INTERPRETED, "on a machine without a GPU, the kernels run in Triton's interpreter")
    lesson(type(tf.attn_fwd).__name__ == "InterpretedFunction" and os.environ.get("TRITON_INTERPRET") == "1",
           "TRITON_INTERPRET=1 in this process, so @triton.jit made the kernel an interpreted one")

# %% [markdown]
# Forward and backward against the float64 reference, in both causal modes. The non-causal
# case uses a ragged length, {glue:text}`ragged_seq` tokens, so the last tiles hang past the
# end. The reference judges batch 0 and the first two heads (every (batch, head) is
# independent, so a slice is a fair sample and keeps the float64 work small on a GPU). The
# rule is the course's (`kernels.reference.judge`): in float32 a relative error of 1e-5, widened
# at large scales, whose scores round by more, by six standard deviations of what float32's
# rounding of the scores does to each tensor, computed from the inputs (not from a float32 run
# on this machine, whose rounding depends on its BLAS); in 16 bits FlashAttention's test
# rule, at most twice the error of plain attention computed in the same dtype (three times for
# gradients, whose sums run over S terms) plus 1e-5.

# %%
def judged_against_reference(causal: bool, seq_len: int) -> reference.Judgement:
    """Forward and backward of the Triton kernels, judged on a slice (one batch, two heads)."""
    qg, kg, vg = inputs(run_batch, run_heads, seq_len, head_dim, dtype=dtype, device=device,
                        seed=seq_len, requires_grad=True)
    grad_out = torch.randn(qg.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out = triton_attention(qg, kg, vg, causal=causal)
    out.backward(grad_out)
    part = (slice(0, 1), slice(0, 2))
    q_, k_, v_ = (t.detach()[part] for t in (qg, kg, vg))
    return reference.judge(out.detach()[part], q_, k_, v_, causal,
                           grads=tuple(t.grad[part] for t in (qg, kg, vg)), grad_out=grad_out[part])

ragged_seq = run_seq // 2 - 15 if run_seq > 64 else run_seq   # e.g. 113: not a multiple of any tile
verdicts = {f"causal, S={run_seq}": judged_against_reference(True, run_seq),
            f"full, S={ragged_seq}": judged_against_reference(False, ragged_seq)}
errors = pd.DataFrame({case: {v.tensor: v.error for v in j.values()} for case, j in verdicts.items()}).T
display(errors.map(lambda e: f"{e:.1e}"))
lesson(all(j["out"].ok for j in verdicts.values()), "the forward matches the float64 reference by the course's rule",
       "; ".join(str(j["out"]) for j in verdicts.values()))
lesson(all(j.ok for j in verdicts.values()), "dQ, dK and dV match it too (gradients get 3x in 16 bits)",
       "; ".join(str(v) for j in verdicts.values() for v in j.values() if v.tensor != "out"))
glue("ragged_seq", ragged_seq)
glue("worst_err", float(errors.max().max()))

# %% [markdown]
# The worst error over the output and the three gradients (relative in float32, absolute
# in 16 bits, as the rule measures it) is {glue:text}`worst_err:.1e`.
#
# ## Profile it
#
# Guess first. On a GPU the forward should be **one kernel**, `attn_fwd`: the launcher
# allocates O and the LSE (no kernel for that) and launches once. On a CPU there is no
# kernel at all; the interesting question is what the profiler sees of the interpreter.

# %%
# On the CPU one interpreted forward is enough: there is nothing to warm up (no compilation,
# no autotuning), and each call takes a while. Torch warns about a schedule without warm-up.
profile_args: dict = dict(active=active_steps) if on_gpu else dict(wait=0, warmup=0, active=1)
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
def runs_here(name: str) -> bool:
    """The registry's device check, plus SDPA's own rules for these inputs (dtype, head dim)."""
    return kernels.available(device)[name] is None and (name == "triton" or sdpa.input_reason(name, q) is None)

runs = {name: record.profile(kernels.get(name), q, k, v, label=name, trace_dir=trace_dir, **profile_args)
        for name in ("triton", "sdpa_flash") if runs_here(name)}
step = {name: reader.median_step(run.steps()) for name, run in runs.items()}
tables.op_table(step["triton"], views=True)

# %%
# The traces behind these steps: download them, or open them in Perfetto (see the Perfetto appendix).
display(*(links(run) for run in runs.values()))

# %%
ops = step["triton"].ops
top = step["triton"].top_level()
# Any aten op that could be doing attention's arithmetic (exp, not expand; mm, not empty).
compute_pattern = r"aten::(.*attention.*|matmul|mm|bmm|addmm|baddbmm|_?softmax|_softmax_backward_data|exp2?_?)"
aten_compute = ops[ops["name"].str.fullmatch(compute_pattern)]
lesson(top["name"].tolist() == ["FlashAttention"], "one op at the top of the triton step: our autograd Function")
lesson(aten_compute.empty, "no aten attention, matmul or softmax op runs inside the triton label",
       "the work is not done by PyTorch")
glue("triton_ops", len(ops))

# %% [markdown]
# The trace holds {glue:text}`triton_ops` ops, and none of them computes anything. The
# `FlashAttention` span (the name of our `torch.autograd.Function`) wraps the allocations of
# O and the LSE and, on a GPU, one kernel launch. In the interpreter it also wraps the
# interpreter's bookkeeping: a `new_empty` + `set_` host view of every tensor argument, and
# one `copy_` per storage when a kernel returns. That copy is how the interpreter hands
# results back to device memory; on a CPU "device" and host are the same memory, so it
# copies a buffer onto itself (its input shape is the storage's size in bytes). The
# arithmetic happens in NumPy, which the profiler does not see: in the interpreter nearly all
# of the time is the span's *self* time.

# %%
if not on_gpu:
    flash_span = top.iloc[0]
    self_share = float(ops.loc[top.index[0], "self_us"] / flash_span["dur_us"])
    lesson(self_share > 0.9, "almost all of the FlashAttention span is its own time: NumPy work the profiler cannot see",
           f"{100 * self_share:.1f}% self time")
    display(tables.copy_table(step["triton"]))

# %% [markdown]
# Compare SDPA's flash backend on the same inputs. On the CPU it is one op as well,
# `aten::_scaled_dot_product_flash_attention_for_cpu`, PyTorch's own C++ FlashAttention, and
# it gives the same numbers:

# %%
sdpa_ok = "sdpa_flash" in step
if sdpa_ok:
    display(tables.op_table(step["sdpa_flash"]))
    out_triton = triton_attention(q, k, v, causal=True)
    out_sdpa = kernels.get("sdpa_flash")(q, k, v, causal=True)
    judged = {name: reference.judge(out, q, k, v, causal=True)["out"]
              for name, out in (("triton", out_triton), ("sdpa_flash", out_sdpa))}
    lesson(all(v.ok for v in judged.values()), "Triton and SDPA flash both meet the course's rule against float64",
           "; ".join(f"{n}: {v}" for n, v in judged.items()))
    if not on_gpu:
        flash_ops = step["sdpa_flash"].find("aten::_scaled_dot_product_flash_attention_for_cpu")
        lesson(len(flash_ops) == 1, "SDPA flash on the CPU is one fused op")
else:
    print("sdpa_flash cannot run here:", kernels.available(device)["sdpa_flash"] or sdpa.input_reason("sdpa_flash", q))

# %% [markdown]
# {glue:text}`speed_note` On a CPU we do not benchmark Triton: the interpreter's time
# measures Python walking over tiles, one NumPy call per tile operation, not the kernel. The
# bench CLI leaves Triton out of CPU sweeps for the same reason.

# %%
triton_ms = step["triton"].cpu_time_us / 1e3
if on_gpu:
    speed_note = gpu_lessons.compiled_speed_note(triton_ms)
else:
    speed_note = (f"This run's profiled forward took {triton_ms:.0f} ms in the interpreter, for "
                  f"{run_heads} heads of {run_seq} tokens.")
glue("speed_note", speed_note)

# %% [markdown]
# ### On a GPU: the grid, the block, the occupancy
#
# On a GPU the forward is one kernel, `attn_fwd` (`attn_fwd_tma` on Hopper), launched with
# the grid and block of the config the autotuner picks. What would it launch for a real
# model's attention? The trace below was recorded by others: Qwen1.5-0.5B's forward on an
# H100, where SDPA ran PyTorch's own `flash_fwd_kernel`, and the trace records that kernel's
# grid, block, registers and shared memory. Beside it, what our forward would launch for the
# same shape on the same GPU: one row per tile the pruning (`kernels.triton.configs.keep`)
# keeps there; the autotuner times them and runs one. Registers need a compile
# (`python -m kernels.triton.compile_sweep --target sm_90`), so for those rows the occupancy
# is an upper bound from shared memory and warps alone. Guess first: torch's kernel spends
# 255 registers per thread, on 128 threads; how many of its blocks fit one SM?

# %%
guess_torch_ctas_per_sm = 8  # edit me before running on

# %%
qwen = TRACELENS["h100_qwen"]
qwen_trace = qwen.trace()
qwen_call = find_attention(qwen.step(trace=qwen_trace)).calls[0]
gpu = qwen_trace.device_properties[0]
capability = (gpu["computeMajor"], gpu["computeMinor"])
qwen_arch = occupancy.arch_of(capability)
torch_launch = occupancy.launch_from_footprint("flash_fwd_kernel (torch)", qwen_call.footprint(), "the trace")
triton_launches = configs.forward_launches(qwen_call.batch_heads, qwen_call.sq, qwen_call.d,
                                           TORCH_DTYPES[str(qwen_call.dtype)].itemsize, capability,
                                           gpu["sharedMemPerBlockOptin"])
say(qwen.credit(qwen_trace))
print(f"{qwen_call.op}: B·H={qwen_call.batch_heads}, S={qwen_call.sq}, D={qwen_call.d}, {qwen_call.dtype}, "
      f"causal={qwen_call.causal}; {gpu['name']}, {gpu['numSms']} SMs ({qwen_arch})")
occupancy.launch_table([torch_launch, *triton_launches], qwen_arch, gpu["numSms"])

# %%
torch_occ = torch_launch.occupancy(qwen_arch)
reveal(guess_torch_ctas_per_sm, torch_occ.blocks_per_sm, "CTAs of torch's flash kernel per SM", source="the trace's footprint")
lesson(torch_occ.limited_by == "registers", "torch's flash kernel is limited by its registers",
       f"{torch_occ.blocks_per_sm} CTAs x {torch_occ.warps_per_block} warps per SM = {torch_occ.percent:g}%")
kineto = occupancy.kineto_estimate(torch_launch.threads_per_block, torch_launch.registers_per_thread or 0,
                                   torch_launch.shared_mem_per_block, torch_launch.blocks, gpu["numSms"], qwen_arch)
lesson(abs(kineto - qwen_call.footprint()["occupancy_pct"]) < 1,
       "the trace's 'est. achieved occupancy' is Kineto's arithmetic on the same footprint",
       f"recomputed {kineto:.1f}%, recorded {qwen_call.footprint()['occupancy_pct']}%")
same_rows = [t for t in triton_launches if t.blocks == torch_launch.blocks]
lesson(bool(same_rows) and all(t.grid[0] == qwen_call.batch_heads for t in triton_launches),
       "our 128-row tiles launch as many programs as torch's kernel, with B·H on the grid's x axis where torch puts "
       "the query tiles", f"{torch_launch.blocks} CTAs: torch {torch_launch.grid}, ours {same_rows[0].grid if same_rows else None}")
glue("torch_ctas", torch_occ.blocks_per_sm)
glue("torch_occ", torch_occ.percent)
glue("torch_waves", torch_launch.waves(qwen_arch, gpu["numSms"]))
glue("torch_blocks", torch_launch.blocks)
glue("gpu_sms", gpu["numSms"])

# %% [markdown]
# On this {glue:text}`gpu_sms`-SM GPU, torch's kernel fits {glue:text}`torch_ctas` CTAs per
# SM ({glue:text}`torch_occ:.1f`% occupancy, limited by registers), so its
# {glue:text}`torch_blocks` CTAs run in {glue:text}`torch_waves:.2f` waves: the last wave
# leaves most SMs idle, the tail that launching the longest causal tiles first shortens.
# The trace's own "est. achieved occupancy %" is not a measurement: Kineto computes it from
# the same footprint, assuming the 48 KiB default limit of shared memory per block, so a
# Triton config that uses more (the deeper tiles above) would read 0% whatever its real
# occupancy. When this page is built on a GPU, the hidden cell below reads this run's own
# `attn_fwd` and SDPA's kernel from its trace the same way.

# %% tags=["hide-input"]
if on_gpu:
    arch = occupancy.arch_of(torch.cuda.get_device_properties(device))
    gpu_lessons.triton_forward_footprints(step, fwd_name, tf.FORWARD_KERNELS[fwd_name].best_config,
                                          (run_batch, run_heads, run_seq), arch, show=display)

# %% [markdown]
# The backward, on a GPU, is three more kernels: the Δ preprocessing, dK/dV and dQ, and no
# memset, because nothing is accumulated with atomics into a zero-filled buffer. No borrowed
# trace holds a backward pass (all are inference), so the hidden cell below checks that only
# when this page runs on a GPU.

# %% tags=["hide-input"]
if on_gpu:
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn_like(q)
    fb = reader.median_step(record.profile(lambda *qkv: torch.autograd.grad(
        triton_attention(*qkv, causal=True), qkv, grad_out), qg, kg, vg,
        label="triton_fwd_bwd", active=active_steps, trace_dir=trace_dir).steps())
    gpu_lessons.triton_backward(fb, fwd_name, show=display)

# %% [markdown]
# ## Speed
#
# On a GPU, `kernels.bench` times Triton against SDPA's flash backend, forward and
# forward+backward, over sequence lengths around the preset's, and converts each median time
# into TFLOP/s with the causal FLOP count halved (`kernels.reference.flops`); the hidden cell
# below does that when this page runs on a GPU. For published
# H100 numbers of the Triton tutorial's kernel next to FlashAttention-2, cuDNN and
# FlashAttention-3, see the FlashAttention-3 paper's forward-speed benchmarks (arXiv
# 2407.08608, section 4.1), which state their head dims, masks and batch sizes. Our kernel
# takes the tutorial's main ideas (two causal stages, exp2 with the scale folded in, the
# transposed backward with masks only on the diagonal, TMA descriptors for the forward on
# Hopper), but runs the backward's two passes as two kernels (three launches with the Δ
# preprocessing) and prunes its autotune list by a rule on each config's footprint
# (`kernels.triton.configs.keep`: shared memory and registers), and its numbers come from our
# own runs: read them next to SDPA's on the same GPU rather than against the paper's.

# %% tags=["hide-input"]
if on_gpu:
    sweep_seqs = sorted({max(128, seq // 2), seq, 2 * seq})   # small: each new length re-runs the autotuner
    results = sweep.sweep(["triton", "sdpa_flash"], seqs=sweep_seqs, head_dims=(head_dim,), dtypes=(dtype,),
                          causal=(True,), modes=(FORWARD, FORWARD_BACKWARD),
                          batch=batch, heads=heads, device=device, max_seconds=0.5, memory=False, progress=None)
    display(points_table(results, ["impl", "mode", "seq", "status", "median_ms", "tflops"]))
    gpu_lessons.ran_at_every_point(results, "triton",
                                   "the Triton kernel ran at every point of the sweep, forward and forward+backward")
    display(plots.tflops_vs_seq(results))

# %% [markdown]
# ## What to remember
#
# - The online softmax keeps a running max and sum per row and rescales what it has summed
#   whenever the max rises; that is what lets a program see the keys one tile at a time.
# - One program owns a Q tile and streams K/V tiles past it. Causal programs skip every tile
#   above the diagonal and mask only the diagonal ones, so they do $(n+1)/(2n)$ of the
#   non-causal work, which tends to one half; the FLOP count we divide by is exactly one half.
# - The forward saves one log-sum-exp per row; the backward rebuilds P from it in three
#   kernels, arranged so that every program owns what it writes: no atomics, no memset. In
#   the transposed form, $S^\top = K Q^\top$, its products need no transposed tiles, and
#   only the steps that cross the diagonal (or the ragged end) compute a mask.
# - On Hopper the forward moves its tiles with the TMA, from tensor descriptors; elsewhere,
#   and for tensors a descriptor cannot describe, it keeps plain pointers.
# - In the interpreter the profiler sees a single opaque span: the work is NumPy, not
#   PyTorch. On a GPU the same code is one kernel per forward, like SDPA's flash backend, and
#   its footprint (grid, block, registers, shared memory) decides its occupancy.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/04_triton.ipynb), with automatic checks, hints and hidden solutions.

"""Chapter 4: FlashAttention-2 in Triton, forward and backward.

FlashAttention never writes the S×S scores: one program keeps a tile of queries on-chip and
streams the keys and values past it, with an *online* softmax (a running row max ``m`` and sum
``l``, rescaled by ``exp(m_old - m_new)`` when the max rises; ``tiled_softmax`` shows it in
PyTorch, ``online_attention_row`` the same for one row of attention). The file reads top to
bottom like the Triton tutorials: ``tiled_softmax``, the forward kernel ``attn_fwd`` (causal
programs skip the tiles above the diagonal), the launcher (every stride passed, so
non-contiguous inputs need no copy),
the autograd Function (backward in ``kernels.triton.backward``), the registry entry ``triton``
and ``forward_backward``, one training step's attention. The kernels take the whole registry
contract: head dims to 256 (padded inside), Sq != Sk bottom-right, GQA without repeating K/V.
Without a GPU they run in Triton's interpreter (``kernels.triton`` turns it on).
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations, and
# keeping them real objects rather than strings is the form every Triton version expects.
import math

import torch

from kernels.triton import configs, interpreter, launch
from kernels.triton.backward import flash_backward
from kernels.triton.launch import INTERPRETED, LOG2E, TRITON_MISSING, tile_ptrs, tl, triton
from kernels.registry import Reason, Span, cuda_reason, refuse_double_backward, register

HEAD_DIMS = Span(1, 256)       # any head dim up to 256, padded to a power of two inside


# --------------------------------------------------------------------------------------
# 1. The online softmax, in PyTorch
# --------------------------------------------------------------------------------------

def tiled_softmax(x: torch.Tensor, block: int):
    """Softmax over the last dimension of ``x``, reading ``block`` columns at a time.

    Returns ``(softmax, history)``. ``history[i]`` is the pair ``(running_max, running_sum)``
    after tile ``i``. The kernel keeps the same two numbers per row, but never stores
    its history.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    history = []
    for start in range(0, x.shape[-1], block):
        tile = x[..., start:start + block]
        new_max = torch.maximum(running_max, tile.amax(dim=-1))
        # The old sum was taken relative to the old maximum: rescale it to the new one.
        running_sum = running_sum * torch.exp(running_max - new_max) \
            + torch.exp(tile - new_max[..., None]).sum(dim=-1)
        running_max = new_max
        history.append((running_max.clone(), running_sum.clone()))
    softmax = torch.exp(x - running_max[..., None]) / running_sum[..., None]
    return softmax, history


def online_attention_row(q_row: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """One query row ``[D]`` attending to every key of ``k``, ``v`` (``[S, D]``; no causal mask),
    reading ``block`` keys at a time: ``tiled_softmax``'s running max and sum, plus the running
    unnormalized output ``acc``, rescaled by the same factor and divided by the sum once at the
    end. It is the forward kernel's inner loop for a single row, in PyTorch and base e.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    m = torch.tensor(float("-inf"), dtype=q_row.dtype)
    l = torch.tensor(0.0, dtype=q_row.dtype)
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


# --------------------------------------------------------------------------------------
# 2. The forward kernel
# --------------------------------------------------------------------------------------
# Shapes the kernels take: q [B, H, SQ, D], k and v [B, H // GROUP, SK, D]. Query head h reads
# key/value head h // GROUP (grouped-query attention), through its pointers: K and V are never
# copied per query head. Causal is aligned bottom-right: query row r sees key columns
# c <= r + SK - SQ. The head dim D is padded to HEAD_DIM, a power of two (tl.arange needs one,
# tl.dot at least 16): the padded lanes load as 0 and are never stored, and zeros add nothing
# to q·k or to p·v. Every tile is addressed through ``tile_ptrs`` (``kernels/triton/launch.py``):
# its first row in int64, the offsets inside it in int32. Every tl.dot asks for "ieee"
# products: float32 inputs would otherwise be multiplied in TF32 (about 1e-3 relative error,
# where the course holds float32 to 1e-5); 16-bit inputs use the tensor cores either way.
#
@triton.jit
def fwd_stages(first_row, SQ, SK, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full_hi, masked_hi): stage 1 takes the key tiles [0, full_hi) that every row of the
    query tile from ``first_row`` sees in full, unmasked; stage 2 the rest, [full_hi, masked_hi), masked."""
    if CAUSAL:
        # The tile's first row sees keys c <= first row + SK - SQ; its last row one more per row.
        full_hi = tl.maximum(tl.minimum(first_row + SK - SQ + 1, SK), 0) // BLOCK_N * BLOCK_N
        masked_hi = tl.maximum(tl.minimum(first_row + BLOCK_M + SK - SQ, SK), full_hi)
    else:
        full_hi = (SK // BLOCK_N) * BLOCK_N                  # tiles inside the sequence
        masked_hi = SK                                       # the ragged tail, if any
    return full_hi, masked_hi


@triton.jit
def attn_fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_ks, stride_kd, stride_vs, stride_vd,
                    offs_m, lo, hi, SQ, SK, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    BLOCK_N: tl.constexpr, D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Stream the key/value tiles [lo, hi) past one query tile, updating (acc, l_i, m_i).

    ``k_src``, ``v_src``: pointers to this head's K and V.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < D
    # K is read transposed ([D, BLOCK_N]) straight from memory: only the pointers differ.
    kt_tile = k_src + (offs_n[None, :] * stride_ks + offs_d[:, None] * stride_kd)
    v_tile = v_src + (offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        first = tl.cast(start_n, tl.int64)
        kt_ptrs = kt_tile + first * stride_ks
        v_ptrs = v_tile + first * stride_vs
        if MASKED:    # the diagonal tiles or the ragged tail: columns past SK read as zeros
            kt = tl.load(kt_ptrs, mask=(cols[None, :] < SK) & d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=(cols[:, None] < SK) & d_ok[None, :], other=0.0)
        elif D < HEAD_DIM:   # a tile inside the sequence, but the head dim is padded
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:         # a tile known to be fully inside: no mask to compute
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)

        # The scores in log2 units (exp(x) = exp2(x·log2 e); the scale carries the log2 e).
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale
        if MASKED:
            keep = cols[None, :] < SK
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + SK - SQ)
            s = tl.where(keep, s, float("-inf"))

        # The online softmax. A row that has seen no key yet (all its scores -inf: a query
        # before the first key when SQ > SK, or a padded row) takes 0 as its reference
        # instead of -inf, so that exp2(-inf - -inf) = NaN cannot happen.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)          # rescales what was summed under the old max
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd(Q, K, V, O, LSE, qk_scale,
              sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd, sob, soh, sos, sod,
              H, GROUP, SQ, SK, D: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head). Grid: (B*H, cdiv(SQ, BLOCK_M))."""
    bh = tl.program_id(0)
    if CAUSAL:
        # The last query tiles see the most keys: launch them first, so that the longest
        # programs do not start last and leave the GPU idle at the end (longest job first:
        # our own reasoning, not a rule from the FlashAttention papers).
        start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        start_m = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: b * stride can pass 2**31 on large inputs
    h = (bh % H).to(tl.int64)
    kvh = h // GROUP            # the key/value head this query head shares
    first_row = start_m * BLOCK_M
    offs_t = tl.arange(0, BLOCK_M)
    offs_m = first_row + offs_t
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < SQ
    tile_ok = row_ok[:, None] & (offs_d < D)[None, :]

    # The query tile is loaded once and stays on-chip for the whole loop.
    q = tl.load(tile_ptrs(Q, b, h, first_row, offs_t, offs_d, sqb, sqh, sqs, sqd), mask=tile_ok, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # running row max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                 # running row sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)       # unnormalized output

    # Stage 1 covers key tiles every row of this tile may see in full. Stage 2 the rest, masked.
    full_hi, masked_hi = fwd_stages(first_row, SQ, SK, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, sks, skd, svs, svd,
                                    offs_m, 0, full_hi, SQ, SK, qk_scale,
                                    MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, D=D, HEAD_DIM=HEAD_DIM)
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, sks, skd, svs, svd,
                                    offs_m, full_hi, masked_hi, SQ, SK, qk_scale,
                                    MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, D=D, HEAD_DIM=HEAD_DIM)

    # Normalize once at the end, not once per tile. A query that saw no key outputs 0.
    seen = l_i > 0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    tl.store(tile_ptrs(O, b, h, first_row, offs_t, offs_d, sob, soh, sos, sod), acc.to(O.dtype.element_ty),
             mask=tile_ok)
    # log2 of each row's softmax denominator: the backward rebuilds P = exp2(s - lse) from it.
    # +inf for a row that saw no key, so that its P is exp2(-inf) = 0 there too.
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    tl.store(LSE + bh.to(tl.int64) * SQ + offs_m, lse, mask=row_ok)


attn_fwd_tuned = configs.autotuned(attn_fwd, "fwd")


# --------------------------------------------------------------------------------------
# 3. The forward's launcher
# --------------------------------------------------------------------------------------

def flash_forward(q, k, v, causal: bool, scale: float, keep_fp32_o: bool = False):
    """Launch the forward kernel. Returns (O, LSE, O32).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]. LSE is [B·Hq, Sq] float32, in log2 units. O32 is
    O in float32 before rounding, kept when ``keep_fp32_o`` (for the backward), else None.
    """
    batch, heads, s_q, head_dim = q.shape
    q_in, k_in, v_in = launch.kernel_inputs(q, k, v)
    # Training in 16 bits: the backward's Delta needs O before it was rounded, so the kernel
    # writes float32 and PyTorch rounds it (one more pass over O, and no second store in the kernel).
    o_written = launch.new_output(q_in, torch.float32 if keep_fp32_o else None)
    lse = torch.empty(batch * heads, s_q, device=q.device, dtype=torch.float32)
    pad = launch.padded_head_dim(head_dim)
    grid = lambda meta: (batch * heads, triton.cdiv(s_q, meta["BLOCK_M"]))  # noqa: E731
    tiles = configs.INTERPRETER_BLOCKS if INTERPRETED else {}
    attn_fwd_tuned[grid](q_in, k_in, v_in, o_written, lse, scale * LOG2E,
                   *q_in.stride(), *k_in.stride(), *v_in.stride(), *o_written.stride(),
                   **launch.sizes(q, k), HEAD_DIM=pad, CAUSAL=causal, **tiles)
    o32 = o_written if keep_fp32_o else None
    return launch.rounded(o_written, q.dtype), lse, o32


# --------------------------------------------------------------------------------------
# 4. Autograd, and the registry entry
# --------------------------------------------------------------------------------------

class FlashAttention(torch.autograd.Function):
    """Autograd wrapper: the forward saves O and the log-sum-exp, not the S×S probabilities.

    In 16 bits it saves O in float32 (the value before rounding), so that the backward's
    Delta = rowsum(dO·O) is exact; ``for_backward`` is False when no gradient will be asked
    for (no_grad, inference), and then nothing extra is written or kept.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, for_backward: bool = True):
        o, lse, o32 = flash_forward(q, k, v, causal, scale, keep_fp32_o=for_backward)
        if for_backward:
            ctx.save_for_backward(q, k, v, o32, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        refuse_double_backward("triton", "the backward kernels' dQ, dK, dV are not differentiable themselves")
        q, k, v, o32, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o32, lse, do, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def triton_reason(device: torch.device) -> Reason:
    """Why the Triton kernels cannot run on ``device`` (None if they can)."""
    if TRITON_MISSING:
        return TRITON_MISSING
    if device.type == "cpu":
        if INTERPRETED:
            return interpreter.unfixable_reason()
        why = ("TRITON_INTERPRET=0 turned off" if interpreter.asked() is False
               else "is off where a GPU is visible")
        return (f"runs CPU tensors only in Triton's interpreter, which {why} "
                "(set TRITON_INTERPRET=1 before importing kernels to use it)")
    if device.type == "cuda":
        return cuda_reason(device)
    return f"runs on CUDA GPUs (or on the CPU in Triton's interpreter), not on {device.type}"


@register("triton", order=60, requires=triton_reason, slow_on_cpu=True, head_dims=HEAD_DIMS,
          dtypes=(torch.float16, torch.bfloat16, torch.float32))
def triton_attention(q, k, v, causal: bool = True, scale: float | None = None):
    """FlashAttention-2 written in Triton (forward and backward; the interpreter on CPU)."""
    if scale is None:  # the registry always passes a float; this is for direct calls
        scale = 1.0 / math.sqrt(q.shape[-1])
    for_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return FlashAttention.apply(q, k, v, causal, scale, for_backward)


def forward_backward(q, k, v, grad_out, causal: bool = True):
    """One training step's attention with the Triton kernels: the forward, then (dQ, dK, dV) for
    ``grad_out``. The inputs are left as they are (their detached copies take the gradients), and
    gradients are on even where the caller turned them off (a profiler session does)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        return torch.autograd.grad(triton_attention(*leaves, causal=causal), leaves, grad_out)

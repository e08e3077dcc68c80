"""Chapter 4: FlashAttention-2 in Triton, forward and backward.

Naive attention writes the S×S score matrix to memory, reads it back for the softmax,
writes the probabilities, and reads them again for the second matmul. FlashAttention
never materializes it. One program owns a tile of queries, keeps it on-chip, and
streams the keys and values past it in tiles. The softmax is computed *online*: the
program keeps a running row maximum ``m`` and a running row sum ``l``. When a new tile
raises the maximum, what has been accumulated so far is rescaled by
``exp(m_old - m_new)``. ``tiled_softmax`` below shows the idea in plain PyTorch.

The file reads top to bottom like the Triton tutorials:

1. ``tiled_softmax``: the online softmax in PyTorch, one tile at a time.
2. The forward kernel ``_attn_fwd``: the output is written once, and the log-sum-exp of
   each row is saved for the backward pass. A causal program first visits the key tiles
   that lie entirely left of the diagonal, with no mask, and then the diagonal tiles,
   with a mask. It skips the tiles above the diagonal, so causal attention does about
   half the work. (2b) ``_attn_fwd_tma``, the same kernel with its tiles moved by Hopper's
   TMA from tensor descriptors, which the launcher takes on sm_90 (``tma_reason``).
3. The backward kernels: ``_attn_bwd_preprocess`` (Delta = rowsum(O·dO)),
   ``_attn_bwd_dkdv`` (one program per key tile) and ``_attn_bwd_dq`` (one program per
   query tile), in the transposed form of Triton's tutorial 06-fused-attention, with masks
   only on the steps that cross the diagonal or the ragged end.
4. Tile sizes: ``@triton.autotune`` picks them on a GPU; the interpreter uses fixed ones.
5. The launchers, which pass every tensor's strides to the kernels, so that
   non-contiguous inputs (a transposed [B, S, H, D] view) need no copy.
6. The ``torch.autograd.Function`` and the registry entry ``triton``.

The kernels take the whole contract of the registry: any head dim up to 256 (padded to a
power of two inside, with masked loads), Sq != Sk with causal aligned bottom-right (query i
sees keys j <= i + Sk - Sq; a query that sees no key outputs 0), and grouped-query attention
(query head h reads key/value head h // (Hq // Hkv) through its pointers, so K and V are
never repeated in memory).

Without a CUDA GPU, the same kernels run in Triton's interpreter on CPU tensors: they are
defined once, compiled, and each launch borrows interpreted copies of them
(``kernels.triton_interpreter``; nothing sets ``TRITON_INTERPRET``). The interpreter gives
the same numbers, only slower, so the chapter can be read and tested on a laptop.
Exponentials are base 2 (``exp2``): ``exp(x) = exp2(x · log2 e)``, and the factor
``log2 e`` is folded into the softmax scale once, so the kernel pays no extra multiply.
"""
# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations, and
# keeping them real objects rather than strings is the form every Triton version expects.
import contextlib
import math
import os

import torch

from . import triton_interpreter
from .registry import Reason, Span, needs_cuda, register

# Whether launches here go through Triton's interpreter: TRITON_INTERPRET when it is set,
# else exactly when there is no GPU. Deciding it changes nothing in the process.
INTERPRETED = triton_interpreter.wanted()


class _NoTriton:
    """Stands in for ``triton`` and ``triton.language`` when Triton is missing.

    The kernel definitions below still execute (as plain, never-called Python functions),
    so ``import kernels`` works and ``available()`` can say what is missing.
    """

    constexpr = None

    @staticmethod
    def jit(fn):
        return fn


try:
    import triton
    import triton.language as tl
    TRITON_MISSING: Reason = None
except Exception as err:  # ImportError, or a broken install failing in its own way
    triton = tl = _NoTriton()
    TRITON_MISSING = f"needs the triton package, which failed to import ({type(err).__name__}: {err})"
try:
    # Host-side tensor descriptors (Triton >= 3.4; the TMA forward's arguments). Without them
    # the forward keeps its pointer kernel everywhere.
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:
    TensorDescriptor = None

HEAD_DIMS = Span(1, 256)       # any head dim up to 256, padded to a power of two inside
LOG2E = 1.4426950408889634     # log2(e): exp(x) == exp2(x * LOG2E)


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


# --------------------------------------------------------------------------------------
# 2. The forward kernel
# --------------------------------------------------------------------------------------
# Shapes the kernels take: q [B, H, SQ, D], k and v [B, H // GROUP, SK, D]. Query head h reads
# key/value head h // GROUP (grouped-query attention), through its pointers: K and V are never
# copied per query head. Causal is aligned bottom-right: query row r sees key columns
# c <= r + OFFSET with OFFSET = SK - SQ. The head dim D is padded to HEAD_DIM, a power of two
# (tl.arange needs one, tl.dot at least 16): the padded lanes load as 0 and are never stored,
# and zeros add nothing to q·k or to p·v.
#
# Offsets: a tile's first row is added to the base pointer in int64 (``_tile``), because
# row · stride reaches 2**31 elements on long sequences (S = 128k in a [B, S, H, D] layout
# with H·D = 16384 does); offsets inside a tile stay int32, which is cheaper.
# The grid puts the B·H programs on axis 0, which may be 2**31 - 1 long, and the tiles of one
# head on axis 1 (at most 65,535): B·H passes 65,535 sooner than the tiles of one sequence.

@triton.jit
def _tile(base, b, h, start, offs, cols, stride_b, stride_h, stride_s, stride_d):
    """Pointers to rows start + offs, columns cols of head (b, h) of a [B, H, S, D] tensor with
    any strides. b, h and start are scaled in int64, the in-tile offsets in int32."""
    return (base + b * stride_b + h * stride_h + tl.cast(start, tl.int64) * stride_s
            + (offs[:, None] * stride_s + cols[None, :] * stride_d))


@triton.jit
def _fwd_stages(first_row, SK, OFFSET, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full_hi, masked_hi): stage 1 takes the key tiles [0, full_hi) that every row of the
    query tile from ``first_row`` sees in full, unmasked; stage 2 the rest, [full_hi, masked_hi), masked."""
    if CAUSAL:
        # The tile's first row sees keys c <= first row + OFFSET; its last row one more per row.
        full_hi = tl.maximum(tl.minimum(first_row + OFFSET + 1, SK), 0) // BLOCK_N * BLOCK_N
        masked_hi = tl.maximum(tl.minimum(first_row + BLOCK_M + OFFSET, SK), full_hi)
    else:
        full_hi = (SK // BLOCK_N) * BLOCK_N                  # tiles inside the sequence
        masked_hi = SK                                       # the ragged tail, if any
    return full_hi, masked_hi


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_src, v_src, b, kvh, stride_ks, stride_kd, stride_vs, stride_vd,
                    offs_m, offs_d, d_ok, lo, hi, SK, OFFSET, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAD_D: tl.constexpr, TMA: tl.constexpr,
                    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Stream the key/value tiles [lo, hi) past one query tile, updating (acc, l_i, m_i).

    ``k_src``, ``v_src``: pointers to this head's K and V; with ``TMA``, tensor descriptors of
    the whole K and V (section 2b), in which (b, kvh) is the head. Only the loads differ.
    """
    offs_n = tl.arange(0, BLOCK_N)
    if not TMA:
        # K is read transposed ([D, BLOCK_N]) straight from memory: only the pointers differ.
        kt_tile = k_src + (offs_n[None, :] * stride_ks + offs_d[:, None] * stride_kd)
        v_tile = v_src + (offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if TMA:       # [1, 1, BLOCK_N, HEAD_DIM] -> [BLOCK_N, HEAD_DIM]; past SK and D: zeros
            kt = tl.trans(k_src.load([b, kvh, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))
            v = v_src.load([b, kvh, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        else:
            first = tl.cast(start_n, tl.int64)
            kt_ptrs = kt_tile + first * stride_ks
            v_ptrs = v_tile + first * stride_vs
            if MASKED:    # the diagonal tiles or the ragged tail: columns past SK read as zeros
                kt = tl.load(kt_ptrs, mask=(cols[None, :] < SK) & d_ok[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=(cols[:, None] < SK) & d_ok[None, :], other=0.0)
            elif PAD_D:   # a tile inside the sequence, but the head dim is padded
                kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
            else:         # a tile known to be fully inside: no mask to compute
                kt = tl.load(kt_ptrs)
                v = tl.load(v_ptrs)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)

        s = tl.dot(q, kt, input_precision=DOT_PRECISION)   # raw scores q·k, not yet scaled
        if MASKED:
            keep = cols[None, :] < SK
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + OFFSET)
            # A hidden score must end as -inf once scaled: -inf for a positive scale, +inf
            # for a negative one.
            s = tl.where(keep, s, float("inf") if NEG_SCALE else float("-inf"))

        # The online softmax, in log2 units: the row max of the scaled scores is the row max
        # of the raw ones times the scale (the min, for a negative scale), so the scale meets
        # each score once, inside exp2's argument: s·scale - m is one fused multiply-add
        # (as in Triton's tutorial 06-fused-attention). A row that has seen no key yet (all its
        # scores -inf: a query before the first key when SQ > SK, or a padded row) takes 0 as
        # its reference instead of -inf, so that exp2(-inf - -inf) = NaN cannot happen.
        if NEG_SCALE:
            m_tile = tl.min(s, 1) * qk_scale
        else:
            m_tile = tl.max(s, 1) * qk_scale
        m_new = tl.maximum(m_i, m_tile)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)          # rescales what was summed under the old max
        p = tl.exp2(s * qk_scale - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, O32, LSE, qk_scale,
              sqb, sqh, sqs, sqd, skb, skh, sks, skd,
              svb, svh, svs, svd, sob, soh, sos, sod, s32b, s32h, s32s, s32d,
              H, GROUP, SQ, SK, D, OFFSET, SQ_BUCKET, SK_BUCKET,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr, PAD_D: tl.constexpr,
              STORE_O32: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head). Grid: (B*H, cdiv(SQ, BLOCK_M)).

    SQ_BUCKET and SK_BUCKET (the lengths rounded up to powers of two) are not used here: they
    are the autotuner's key, so that decoding step by step does not re-tune at every length.
    """
    bh = tl.program_id(0)
    if CAUSAL:
        # The last query tiles see the most keys: launch them first, so that the longest
        # programs do not start last and leave the GPU idle at the end (the FlashAttention-2
        # paper's scheduling advice, arXiv 2307.08691, section 3.2).
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
    d_ok = offs_d < D

    # The query tile is loaded once and stays on-chip for the whole loop.
    q = tl.load(_tile(Q, b, h, first_row, offs_t, offs_d, sqb, sqh, sqs, sqd),
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # running row max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                 # running row sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)       # unnormalized output

    # Stage 1 covers key tiles every row of this tile may see in full. Stage 2 the rest, masked.
    full_hi, masked_hi = _fwd_stages(first_row, SK, OFFSET, CAUSAL, BLOCK_M, BLOCK_N)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, b, kvh, sks, skd, svs, svd,
                                    offs_m, offs_d, d_ok, 0, full_hi, SK, OFFSET, qk_scale, False, CAUSAL,
                                    NEG_SCALE, BLOCK_N, HEAD_DIM, PAD_D, False, UPCAST, DOT_PRECISION)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, b, kvh, sks, skd, svs, svd,
                                    offs_m, offs_d, d_ok, full_hi, masked_hi, SK, OFFSET, qk_scale, True, CAUSAL,
                                    NEG_SCALE, BLOCK_N, HEAD_DIM, PAD_D, False, UPCAST, DOT_PRECISION)

    # Normalize once at the end, not once per tile. A query that saw no key outputs 0.
    seen = l_i > 0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    out_ok = row_ok[:, None] & d_ok[None, :]
    tl.store(_tile(O, b, h, first_row, offs_t, offs_d, sob, soh, sos, sod), acc.to(O.dtype.element_ty),
             mask=out_ok)
    if STORE_O32:  # training in 16 bits: the backward's Delta needs O before it was rounded
        tl.store(_tile(O32, b, h, first_row, offs_t, offs_d, s32b, s32h, s32s, s32d), acc, mask=out_ok)
    # log2 of each row's softmax denominator: the backward rebuilds P = exp2(s - lse) from it.
    # +inf for a row that saw no key, so that its P is exp2(-inf) = 0 there too.
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    tl.store(LSE + bh.to(tl.int64) * SQ + offs_m, lse, mask=row_ok)


# --------------------------------------------------------------------------------------
# 2b. The forward on Hopper: the same kernel, its tiles moved by the TMA
# --------------------------------------------------------------------------------------
# Hopper (sm_90) gives each SM a copy engine, the Tensor Memory Accelerator (TMA), that moves
# a whole tile between global and shared memory from a *tensor descriptor*: the tensor's
# base, shape and strides and the tile's shape, made once on the host. A program asks for
# "the tile at (b, h, row, 0)" instead of computing an address per element, the copy runs
# while the warps compute, and what lies past the tensor's edge reads as zeros (and is not
# written on a store): the hardware does the masking of ragged tails and padded head dims.
# Only the scores still need a mask, because a key of zeros scores 0, not -inf.
# The descriptors are 4-D, [B, H, S, D] with the tensor's own strides, so a transposed
# [B, S, H, D] view needs no copy and a tile never runs into the next head. Everything else
# (stages, online softmax, scale, launch order) is `_attn_fwd`'s: the inner loop is the same
# function, `_attn_fwd_inner` with TMA=True, which differs only in its loads.

@triton.jit
def _attn_fwd_tma(Q, K, V, O, O32, LSE, qk_scale, H, GROUP, SQ, SK, OFFSET, SQ_BUCKET, SK_BUCKET, ELEMENT_BYTES,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr, STORE_O32: tl.constexpr,
                  UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """`_attn_fwd` with Q, K, V, O (and O32) as tensor descriptors with tiles [1, 1, rows, HEAD_DIM].
    Grid: (B*H, cdiv(SQ, BLOCK_M)), heaviest causal tiles first.

    ELEMENT_BYTES (unused here) is in the autotuner's key: it adds the dtypes of tensor
    arguments to its key by itself, but a descriptor is not a tensor.
    """
    bh = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        start_m = tl.program_id(1)
    b = bh // H                 # descriptor coordinates are int32, and so are these
    h = bh % H
    kvh = h // GROUP
    first_row = start_m * BLOCK_M
    offs_m = first_row + tl.arange(0, BLOCK_M)

    q = Q.load([b, h, first_row, 0]).reshape(BLOCK_M, HEAD_DIM)   # rows past SQ read as zeros
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    offs_d = tl.arange(0, HEAD_DIM)   # unused with TMA: the descriptors mask D themselves
    full_hi, masked_hi = _fwd_stages(first_row, SK, OFFSET, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, b, kvh, 0, 0, 0, 0,
                                    offs_m, offs_d, offs_d < HEAD_DIM, 0, full_hi, SK, OFFSET, qk_scale, False,
                                    CAUSAL, NEG_SCALE, BLOCK_N, HEAD_DIM, False, True, UPCAST, DOT_PRECISION)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, b, kvh, 0, 0, 0, 0,
                                    offs_m, offs_d, offs_d < HEAD_DIM, full_hi, masked_hi, SK, OFFSET, qk_scale, True,
                                    CAUSAL, NEG_SCALE, BLOCK_N, HEAD_DIM, False, True, UPCAST, DOT_PRECISION)

    seen = l_i > 0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    # [BLOCK_M, HEAD_DIM] -> [1, 1, BLOCK_M, HEAD_DIM]; rows past SQ and lanes past D are not written.
    O.store([b, h, first_row, 0], acc.to(O.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    if STORE_O32:
        O32.store([b, h, first_row, 0], acc.reshape(1, 1, BLOCK_M, HEAD_DIM))
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    tl.store(LSE + bh.to(tl.int64) * SQ + offs_m, lse, mask=offs_m < SQ)


# --------------------------------------------------------------------------------------
# 3. The backward kernels
# --------------------------------------------------------------------------------------
# With P = softmax(S), dP = dO·Vᵀ and dS = P ∘ (dP - Delta) where Delta = rowsum(dO ∘ O):
#     dV = Pᵀ·dO,   dK = scale · dSᵀ·Q,   dQ = scale · dS·K.
# P is rebuilt from the saved log-sum-exp, never stored. dK/dV and dQ run as two kernels:
# dK/dV sums over query rows and dQ sums over key columns, so one program per key tile
# and one per query tile each own what they write. A single kernel would have to add
# dQ from many programs with atomics, which is harder to follow and gives results that
# change in the last bits from run to run (the order of the additions varies).
# With grouped-query attention a key/value head serves GROUP query heads, so its dK/dV
# program also loops over those heads: it still owns what it writes, and K/V stay shared.
#
# The transposed form (Triton's tutorial 06-fused-attention): the dK/dV program computes
# the scores of its keys against a query tile as Sᵀ = K·Qᵀ, [BLOCK_N, BLOCK_M], reading Q
# transposed straight from memory (only the pointers differ), so Pᵀ and dSᵀ come out of
# the tensor cores already in the orientation dV += Pᵀ·dO and dK += dSᵀ·Q take: no
# transpose of a [BLOCK_M, BLOCK_N] tile per step. The dQ program reads Kᵀ and Vᵀ the same way.
#
# Masks only where they change something, as in the forward: each kernel walks its tiles in
# two kinds of steps, a `MASK` constexpr apart, so Triton compiles two loops, one with no
# compare or select at all. The dK/dV program's masked loop takes the query rows that cross
# its key tile's diagonal (causal), in query tiles of half height (as the tutorial does: a
# masked step holds the mask besides the tiles, and the smaller tile keeps it within the
# registers), and then jumps to the ragged tail past the last whole query tile; its unmasked
# loop takes the rows between, which see every key of the tile. The dQ program takes the
# key tiles every one of its rows sees, unmasked, then the diagonal and the ragged key
# tail, masked, in key tiles of half width. Tiles above the diagonal are skipped, so
# causal does half the work here too. The scale meets each score inside exp2's argument
# (s·scale - lse, one fused multiply-add). What spills is the compiler's to say:
# ``python -m kernels.compile_report`` compiles every config for sm_80 and sm_90, and the
# loop structure here is the one that spilled least (a third loop for the tail, or a loop
# over the GQA group's heads around the tile loops, each cost registers and spilled).
# Delta must come from O as the forward computed it, before rounding to 16 bits: dP - Delta
# is a small difference of two large numbers when a row's P is nearly uniform (short rows),
# and the rounding of O would dominate it. The forward keeps an fp32 O for this (STORE_O32).

@triton.jit
def _attn_bwd_preprocess(O, DO, DELTA, sob, soh, sos, sod, sdb, sdh, sds, sdd, H, SQ, D,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta = rowsum(O ∘ dO), in float32. Grid: (B*H, cdiv(SQ, BLOCK_M))."""
    bh = tl.program_id(0)
    start_m = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    first_row = start_m * BLOCK_M
    offs_t = tl.arange(0, BLOCK_M)
    rows = first_row + offs_t
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < SQ
    ok = row_ok[:, None] & (offs_d[None, :] < D)
    o = tl.load(_tile(O, b, h, first_row, offs_t, offs_d, sob, soh, sos, sod), mask=ok, other=0.0)
    do = tl.load(_tile(DO, b, h, first_row, offs_t, offs_d, sdb, sdh, sds, sdd), mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * SQ + rows, delta, mask=row_ok)


@triton.jit
def _bwd_dkdv_steps(dk, dv, k, v, Q, DO, LSE, DELTA, b, kvh, sqb, sqh, sqs, sqd, sdob, sdoh, sdos, sdod,
                    cols, offs_d, d_ok, start_m, num_steps, jump_from, jump_to, H, GROUP, SQ, OFFSET, qk_scale,
                    MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, PAD_D: tl.constexpr,
                    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Add ``num_steps`` query tiles of BLOCK_M rows, from row ``start_m``, of each of the
    GROUP query heads of key/value head ``kvh``, to one key tile's dK and dV ([BLOCK_N,
    HEAD_DIM] each). ``MASK``: hide rows past SQ and, when causal, (row, key) pairs above the
    diagonal; the masked steps jump from row ``jump_from`` to ``jump_to``, over the rows the
    unmasked steps take.

    One loop runs over (head, query tile) pairs rather than a loop over heads around a loop
    over tiles: the outer loop made the compiler keep more registers live, and spill."""
    offs_m = tl.arange(0, BLOCK_M)
    for step in range(0, num_steps * GROUP):
        g = step // num_steps
        first = start_m + (step - g * num_steps) * BLOCK_M
        if MASK:
            first = tl.where(first >= jump_from, first + (jump_to - jump_from), first)
        h = kvh * GROUP + g
        rows = first + offs_m
        # Qᵀ is read transposed ([HEAD_DIM, BLOCK_M]) straight from memory: only the pointers
        # differ. (Written out rather than through `_tile`: in the interpreter every call of a
        # jit function inside a loop costs a re-patching of triton.language.)
        qt_ptrs = (Q + b * sqb + h * sqh + tl.cast(first, tl.int64) * sqs
                   + (offs_m[None, :] * sqs + offs_d[:, None] * sqd))
        do_ptrs = (DO + b * sdob + h * sdoh + tl.cast(first, tl.int64) * sdos
                   + (offs_m[:, None] * sdos + offs_d[None, :] * sdod))
        lse_ptrs = LSE + (b * H + h) * SQ + rows
        delta_ptrs = DELTA + (b * H + h) * SQ + rows
        if MASK:    # rows past SQ read as zeros, their LSE as +inf (so their P is 0)
            row_ok = rows < SQ
            qt = tl.load(qt_ptrs, mask=row_ok[None, :] & d_ok[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            lse = tl.load(lse_ptrs, mask=row_ok, other=float("inf"))
            delta = tl.load(delta_ptrs, mask=row_ok, other=0.0)
        elif PAD_D:
            qt = tl.load(qt_ptrs, mask=d_ok[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=d_ok[None, :], other=0.0)
            lse = tl.load(lse_ptrs)
            delta = tl.load(delta_ptrs)
        else:       # a query tile known to be inside the sequence: no mask to compute
            qt = tl.load(qt_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_ptrs)
            delta = tl.load(delta_ptrs)
        if UPCAST:
            qt = qt.to(tl.float32)
            do = do.to(tl.float32)

        st = tl.dot(k, qt, input_precision=DOT_PRECISION)          # Sᵀ [BLOCK_N, BLOCK_M], raw
        pt = tl.exp2(st * qk_scale - lse[None, :])
        if MASK:
            if CAUSAL:  # key c is hidden from row r when c > r + OFFSET
                pt = tl.where(cols[:, None] <= rows[None, :] + OFFSET, pt, 0.0)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=DOT_PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)   # dPᵀ = V·dOᵀ
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, qk_scale,
                   sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                   sdob, sdoh, sdos, sdod, sdkb, sdkh, sdks, sdkd, sdvb, sdvh, sdvs, sdvd,
                   H, GROUP, SQ, SK, D, OFFSET, SQ_BUCKET, SK_BUCKET,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, PAD_D: tl.constexpr, UPCAST: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """One program: BLOCK_N key rows of one (batch, key/value head); loops over its query
    heads and their query tiles. Grid: (B*H // GROUP, cdiv(SK, BLOCK_N)). The first key tiles
    are seen by the most query rows when causal, so the heaviest programs already come first."""
    bkv = tl.program_id(0)
    start_n = tl.program_id(1)
    kv_heads = H // GROUP
    b = (bkv // kv_heads).to(tl.int64)
    kvh = (bkv % kv_heads).to(tl.int64)
    first_col = start_n * BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    cols = first_col + offs_n
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < D
    # Keys past SK load as zeros. Their dK/dV rows come out as garbage and are never stored;
    # they add nothing to the real keys' rows, so the steps need no key mask.
    kv_ok = (cols < SK)[:, None] & d_ok[None, :]
    k = tl.load(_tile(K, b, kvh, first_col, offs_n, offs_d, skb, skh, sks, skd), mask=kv_ok, other=0.0)
    v = tl.load(_tile(V, b, kvh, first_col, offs_n, offs_d, svb, svh, svs, svd), mask=kv_ok, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    MASK_M: tl.constexpr = BLOCK_M // 2 if BLOCK_M >= 32 else BLOCK_M   # tl.dot needs >= 16

    # Causal: row r sees key c when c <= r + OFFSET. Rows before `lo` see none of this tile's
    # keys (skipped); rows from `full` on see all of them (no mask); the rows between cross
    # the diagonal (at most BLOCK_N - 1 of them). The masked steps take those rows and the
    # ragged tail after the last whole unmasked step, in one loop: Triton then compiles one
    # masked loop and one unmasked, which holds fewer registers than a third loop would.
    if CAUSAL:
        lo = tl.minimum(tl.maximum(first_col - OFFSET, 0), SQ)
        full = tl.minimum(tl.maximum(first_col + BLOCK_N - 1 - OFFSET, 0), SQ)
        n_diag = tl.cdiv(full - lo, MASK_M)
    else:
        lo = 0
        n_diag = 0
    mid = lo + n_diag * MASK_M                       # the first row of the unmasked steps
    n_full = tl.maximum(SQ - mid, 0) // BLOCK_M
    tail = mid + n_full * BLOCK_M                    # the ragged tail past the last whole tile
    n_masked = n_diag + tl.cdiv(tl.maximum(SQ - tail, 0), MASK_M)
    dk, dv = _bwd_dkdv_steps(dk, dv, k, v, Q, DO, LSE, DELTA, b, kvh, sqb, sqh, sqs, sqd, sdob, sdoh, sdos, sdod,
                             cols, offs_d, d_ok, lo, n_masked, mid, tail, H, GROUP, SQ, OFFSET, qk_scale,
                             True, CAUSAL, MASK_M, PAD_D, UPCAST, DOT_PRECISION)
    dk, dv = _bwd_dkdv_steps(dk, dv, k, v, Q, DO, LSE, DELTA, b, kvh, sqb, sqh, sqs, sqd, sdob, sdoh, sdos, sdod,
                             cols, offs_d, d_ok, mid, n_full, SQ, SQ, H, GROUP, SQ, OFFSET, qk_scale,
                             False, CAUSAL, BLOCK_M, PAD_D, UPCAST, DOT_PRECISION)

    dk = dk * sm_scale   # the scores were q·kᵀ·scale, so the chain rule brings the scale out
    tl.store(_tile(DK, b, kvh, first_col, offs_n, offs_d, sdkb, sdkh, sdks, sdkd), dk.to(DK.dtype.element_ty),
             mask=kv_ok)
    tl.store(_tile(DV, b, kvh, first_col, offs_n, offs_d, sdvb, sdvh, sdvs, sdvd), dv.to(DV.dtype.element_ty),
             mask=kv_ok)


@triton.jit
def _bwd_dq_steps(dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
                  rows, offs_d, d_ok, start_n, num_steps, SK, OFFSET, qk_scale,
                  MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                  UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Add ``num_steps`` key tiles of BLOCK_N keys, from key ``start_n``, to one query tile's
    dQ ([BLOCK_M, HEAD_DIM]). ``MASK``: hide keys past SK and, when causal, keys above the diagonal."""
    offs_n = tl.arange(0, BLOCK_N)
    # Kᵀ and Vᵀ are read transposed ([HEAD_DIM, BLOCK_N]) straight from memory.
    kt_tile = k_base + (offs_n[None, :] * stride_ks + offs_d[:, None] * stride_kd)
    vt_tile = v_base + (offs_n[None, :] * stride_vs + offs_d[:, None] * stride_vd)
    for step in range(0, num_steps):
        first = start_n + step * BLOCK_N
        cols = first + offs_n
        kt_ptrs = kt_tile + tl.cast(first, tl.int64) * stride_ks
        vt_ptrs = vt_tile + tl.cast(first, tl.int64) * stride_vs
        if MASK:
            kt = tl.load(kt_ptrs, mask=(cols[None, :] < SK) & d_ok[:, None], other=0.0)
            vt = tl.load(vt_ptrs, mask=(cols[None, :] < SK) & d_ok[:, None], other=0.0)
        elif PAD_D:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
            vt = tl.load(vt_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            vt = tl.load(vt_ptrs)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION)               # [BLOCK_M, BLOCK_N], raw
        p = tl.exp2(s * qk_scale - lse[:, None])
        if MASK:
            keep = cols[None, :] < SK
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + OFFSET)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, sm_scale, qk_scale,
                 sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                 sdob, sdoh, sdos, sdod, sdqb, sdqh, sdqs, sdqd,
                 H, GROUP, SQ, SK, D, OFFSET, SQ_BUCKET, SK_BUCKET,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, PAD_D: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head); loops over key tiles.
    Grid: (B*H, cdiv(SQ, BLOCK_M)); causal launches the last (heaviest) query tiles first."""
    bh = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        start_m = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    kvh = h // GROUP
    first_row = start_m * BLOCK_M
    offs_t = tl.arange(0, BLOCK_M)
    rows = first_row + offs_t
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < SQ
    d_ok = offs_d < D
    q_ok = row_ok[:, None] & d_ok[None, :]
    # Rows past SQ load as zeros with an LSE of +inf, so their P is 0 in every step: the
    # steps need no row mask, and those rows are never stored.
    q = tl.load(_tile(Q, b, h, first_row, offs_t, offs_d, sqb, sqh, sqs, sqd), mask=q_ok, other=0.0)
    do = tl.load(_tile(DO, b, h, first_row, offs_t, offs_d, sdob, sdoh, sdos, sdod), mask=q_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + bh.to(tl.int64) * SQ + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * SQ + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    MASK_N: tl.constexpr = BLOCK_N // 2 if BLOCK_N >= 32 else BLOCK_N

    # Causal: every row of the tile sees keys c <= first_row + OFFSET (whole tiles of them are
    # unmasked); its last real row sees up to `hi` (exclusive); keys past `hi` are skipped.
    if CAUSAL:
        n_full = tl.minimum(tl.maximum(first_row + OFFSET + 1, 0), SK) // BLOCK_N
        hi = tl.minimum(tl.maximum(tl.minimum(first_row + BLOCK_M, SQ) + OFFSET, 0), SK)
    else:
        n_full = SK // BLOCK_N
        hi = SK
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    dq = _bwd_dq_steps(dq, q, do, lse, delta, k_base, v_base, sks, skd, svs, svd, rows, offs_d, d_ok,
                       0, n_full, SK, OFFSET, qk_scale, False, CAUSAL, BLOCK_N, PAD_D, UPCAST, DOT_PRECISION)
    masked_lo = n_full * BLOCK_N
    dq = _bwd_dq_steps(dq, q, do, lse, delta, k_base, v_base, sks, skd, svs, svd, rows, offs_d, d_ok,
                       masked_lo, tl.cdiv(tl.maximum(hi - masked_lo, 0), MASK_N), SK, OFFSET, qk_scale,
                       True, CAUSAL, MASK_N, PAD_D, UPCAST, DOT_PRECISION)

    dq = dq * sm_scale
    tl.store(_tile(DQ, b, h, first_row, offs_t, offs_d, sdqb, sdqh, sdqs, sdqd), dq.to(DQ.dtype.element_ty),
             mask=q_ok)


# --------------------------------------------------------------------------------------
# 4. Tile sizes: autotuned on a GPU, fixed in the interpreter
# --------------------------------------------------------------------------------------
# A config is (BLOCK_M, BLOCK_N, num_warps, num_stages). Any pair of powers of two works:
# the causal stages are computed from the tile sizes, rounding down to a key-tile boundary.
# What fits depends on the head dim: the tiles held on-chip grow with it. So each kernel
# has a space per padded head dim, in the spirit of the autotune space of Triton's tutorial
# 06-fused-attention (BLOCK_M {64, 128} x BLOCK_N {32, 64, 128} x stages x warps), narrowed
# to configs that the compiler says fit and do not spill on sm_80 and sm_90
# (``python -m kernels.compile_report`` compiles them all; tests/test_compile_report.py
# checks the pruning against the compiler). Fewer configs also mean a shorter autotuning:
# each is compiled and timed on first use of every new key.
PADDED_HEAD_DIMS = (16, 32, 64, 128, 256)
_FWD_SMALL_D = [(128, 128, 8, 3), (128, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
FORWARD_SPACE = {
    16: _FWD_SMALL_D,
    32: _FWD_SMALL_D,
    64: [(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3),
         (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 2)],
    128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3),
          (64, 128, 8, 2), (64, 64, 8, 3), (128, 32, 8, 2), (64, 32, 4, 2)],
    256: [(128, 64, 8, 2), (64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 4, 3), (32, 32, 4, 2)],
}
# The backward kernels hold more per program. dK/dV keeps K, V and two fp32 accumulators of
# its BLOCK_N keys and streams query tiles of BLOCK_M past them: 128-key tiles, as in Triton's
# tutorial, with 8 warps from D = 64 on (with 4, the tutorial's count, ptxas spills there on
# both targets), and at D = 256 only 32-key tiles hold without spilling. dQ keeps Q, dO and
# one accumulator of its BLOCK_M rows and streams key tiles of BLOCK_N: 128-row tiles where
# they fit.
_DKDV_SMALL_D = [(64, 128, 8, 2), (32, 128, 4, 2), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3), (32, 32, 4, 2)]
DKDV_SPACE = {
    16: _DKDV_SMALL_D,
    32: _DKDV_SMALL_D,
    64: [(64, 128, 8, 2), (32, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3),
         (32, 32, 4, 2)],
    128: [(32, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 2), (32, 64, 8, 2), (32, 64, 4, 2), (32, 32, 8, 2)],
    256: [(32, 32, 8, 2), (32, 32, 8, 1), (16, 32, 4, 1)],
}
_DQ_SMALL_D = [(128, 128, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
DQ_SPACE = {
    16: _DQ_SMALL_D,
    32: _DQ_SMALL_D,
    64: [(128, 64, 8, 3), (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2)],
    128: [(128, 64, 8, 2), (128, 32, 8, 3), (128, 32, 8, 2), (64, 128, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2)],
    256: [(128, 32, 8, 2), (64, 32, 8, 2), (32, 64, 4, 2), (32, 32, 4, 2)],
}
# The TMA forward tries the forward's configs (its tiles are the same; only the loads differ).
_SPACES = {"fwd": FORWARD_SPACE, "fwd_tma": FORWARD_SPACE, "bwd_dkdv": DKDV_SPACE, "bwd_dq": DQ_SPACE}
KERNELS = ("fwd", "fwd_tma", "bwd_dkdv", "bwd_dq")
TMA_KERNELS = ("fwd_tma",)


def kernels_for(capability) -> tuple:
    """The kernels a GPU of ``capability`` (major, minor) may launch: the TMA forward on sm_90 only."""
    hopper = capability is not None and tuple(capability)[0] == 9
    return tuple(k for k in KERNELS if hopper or k not in TMA_KERNELS)

# Configs that fit an architecture's shared memory but that ptxas spills there, by compute
# capability major (``python -m kernels.compile_report --target sm_80|sm_90``, Triton 3.7.1,
# bf16); the pruning drops them on that architecture. Ampere's mma.sync takes both operands
# from registers, where Hopper's wgmma reads one from shared memory, so sm_80 runs out of
# registers on tiles that sm_90 holds: every config of the pointer kernels' spaces compiles
# without spills for sm_90, and one of the TMA forward's spills there (it holds no addresses
# but its tiles take other layouts). tests/test_compile_report.py fails when a kept config spills.
SPILLS = {
    8: {
        ("fwd", 64): {(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3)},
        ("fwd", 128): {(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)},
        ("fwd", 256): {(128, 64, 8, 2), (64, 32, 4, 3)},
        ("bwd_dkdv", 64): {(64, 128, 8, 3), (64, 64, 4, 3)},
        ("bwd_dkdv", 128): {(32, 128, 8, 2), (32, 128, 8, 3)},
        ("bwd_dq", 64): {(128, 64, 8, 3), (64, 64, 4, 3)},
        ("bwd_dq", 128): {(128, 64, 8, 2)},
        ("bwd_dq", 256): {(128, 32, 8, 2)},
    },
    9: {
        ("fwd_tma", 256): {(32, 32, 4, 2)},
    },
}


def config_space(kernel: str, head_dim: int) -> list:
    """The configs the autotuner may try for ``kernel`` at padded ``head_dim``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if head_dim not in PADDED_HEAD_DIMS:
        raise ValueError(f"head_dim must be a padded one, {PADDED_HEAD_DIMS}, got {head_dim}")
    return list(_SPACES[kernel][head_dim])


# Every config of every space, the list handed to @triton.autotune; the prune hook narrows it
# to the space of the call's head dim. The first is the forward's largest tile.
GPU_CONFIGS = list(dict.fromkeys(c for space in _SPACES.values() for d in PADDED_HEAD_DIMS for c in space[d]))
# The interpreter runs one program at a time, each tile operation one NumPy call, so fewer,
# larger tiles run faster (64x32 is about 3x quicker than 32x16). BLOCK_M = 2·BLOCK_N
# makes the causal diagonal span two key tiles, the case that needs care.
INTERPRETER_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 32}
# The backward's masked steps are half as tall (dK/dV) or wide (dQ) as its tiles, so 64x64
# tiles in the interpreter still take two masked steps per diagonal, the case that needs
# care, in half the steps of 64x32.
INTERPRETER_BACKWARD_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 64}
PREPROCESS_BLOCK_M = 64


def shared_memory_estimate(block_m: int, block_n: int, num_stages: int, head_dim: int,
                           element_size: int, kernel: str = "fwd") -> int:
    """Bytes of shared memory a config needs, an upper bound of what Triton allocates.

    Written from what each kernel keeps in shared memory, and checked against the
    compiler's ``metadata.shared`` (tests/test_compile_report.py: never below it):

    * forward: the Q tile, plus ``num_stages`` buffered K and V tiles for the pipelined loads.
      The TMA forward adds 1 KiB: its copies' barriers, in an allocation aligned to the
      1 KiB that 128-byte-swizzled tiles need.
    * dK/dV: K and V of its key tile; ``num_stages`` buffered Q and dO tiles with their rows'
      LSE and Delta (fp32), and at least two even for ``num_stages`` = 1 (the loop is not
      pipelined then, and its loads change layout through shared memory instead); one
      [BLOCK_M, BLOCK_N] tile on the way to the tensor cores.
    * dQ: Q and dO of its rows, plus ``num_stages`` buffered K and V tiles.
    """
    if kernel in ("fwd", "fwd_tma"):
        return (block_m + 2 * num_stages * block_n) * head_dim * element_size + (1024 if kernel == "fwd_tma" else 0)
    if kernel == "bwd_dkdv":
        buffered = max(num_stages, 2)
        return ((2 * block_n + 2 * buffered * block_m) * head_dim * element_size
                + 2 * buffered * block_m * 4 + block_m * block_n * element_size)
    if kernel == "bwd_dq":
        return (2 * block_m + 2 * num_stages * block_n) * head_dim * element_size
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def hopper_pruned(config, capability) -> bool:
    """On sm_90, 8 warps on a tile smaller than 128x128 leave warps idle (Triton's tutorial
    06-fused-attention prunes these configs on Hopper the same way)."""
    block_m, block_n, warps, _ = config
    return capability is not None and tuple(capability)[0] == 9 and warps == 8 and block_m * block_n < 128 * 128


def fitting_configs(configs, seq: int, head_dim: int, element_size: int, smem_limit: int,
                    kernel: str = "fwd", capability=None, seq_k=None):
    """The configs whose tiles fit in shared memory and are not much longer than the sequence
    (BLOCK_M than the queries, ``seq``; BLOCK_N than the keys, ``seq_k``, by default ``seq``),
    less the configs the compiler spills on ``capability`` (SPILLS), less, for the forward,
    those Hopper pruning drops when ``capability`` is (9, x). (The
    backward's tiles are smaller than 128x128 and need their 8 warps to hold the dK/dV
    accumulators, so the rule is not applied to them, as the tutorial applies it to its
    forward only.)

    Always returns at least one config: if nothing passes, the smallest one.
    """
    longest_m = max(16, _next_power_of_2(seq))
    longest_n = max(16, _next_power_of_2(seq if seq_k is None else seq_k))

    def estimate(c):
        return shared_memory_estimate(c[0], c[1], c[3], head_dim, element_size, kernel)

    spills = SPILLS.get(tuple(capability)[0], {}).get((kernel, head_dim), set()) if capability else set()
    kept = [c for c in configs
            if estimate(c) <= smem_limit and c[0] <= longest_m and c[1] <= longest_n
            and not (kernel in ("fwd", "fwd_tma") and hopper_pruned(c, capability)) and tuple(c) not in spills]
    if kept:
        return kept
    return [min(configs, key=estimate)]


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pruner(kernel: str):
    def prune(configs, named_args, **kwargs):
        """early_config_prune hook: the head dim's space, less what `fitting_configs` drops."""
        args = {**named_args, **kwargs}
        q = getattr(args["Q"], "base", args["Q"])   # the TMA forward's Q is a descriptor
        props = torch.cuda.get_device_properties(q.device)
        limit = getattr(props, "shared_memory_per_block_optin", 48 * 1024)
        as_tuple = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages): c for c in configs}
        space = set(config_space(kernel, args["HEAD_DIM"]))
        # A caller (a test) may have narrowed kernel.configs to configs outside the space: keep those.
        candidates = [t for t in as_tuple if t in space] or list(as_tuple)
        kept = fitting_configs(candidates, args["SQ"], args["HEAD_DIM"], q.element_size(), limit,
                               kernel=kernel, capability=(props.major, props.minor), seq_k=args["SK"])
        return [as_tuple[t] for t in kept]
    return prune


def _autotuned(kernel, name: str):
    """On a GPU, wrap ``kernel`` in @triton.autotune; in the interpreter (where autotune
    fails) return it unchanged and launch it with INTERPRETER_BLOCKS (the backward with
    INTERPRETER_BACKWARD_BLOCKS).

    The key holds the lengths rounded up to powers of two (SQ_BUCKET, SK_BUCKET), not the
    lengths themselves: a new length re-tunes only when it crosses a power of two.
    """
    if INTERPRETED or TRITON_MISSING:
        return kernel
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in GPU_CONFIGS]
    return triton.autotune(configs=configs, key=["SQ_BUCKET", "SK_BUCKET", "GROUP", "HEAD_DIM", "CAUSAL"],
                           prune_configs_by={"early_config_prune": _pruner(name)})(kernel)


def _descriptor_tiles(args):
    """Autotuner pre-hook of the TMA forward: a descriptor carries its tile's shape, so each
    config sets the shape it tiles with before it runs."""
    m, n, d = args["BLOCK_M"], args["BLOCK_N"], args["HEAD_DIM"]
    for name, rows in (("Q", m), ("O", m), ("O32", m), ("K", n), ("V", n)):
        args[name].block_shape = [1, 1, rows, d]


def _autotuned_tma(kernel):
    """`_autotuned` for the TMA forward: the forward's configs, each with `_descriptor_tiles`."""
    if INTERPRETED or TRITON_MISSING:
        return kernel
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=_descriptor_tiles)
               for m, n, w, s in GPU_CONFIGS]
    return triton.autotune(configs=configs,
                           key=["SQ_BUCKET", "SK_BUCKET", "GROUP", "HEAD_DIM", "CAUSAL", "ELEMENT_BYTES"],
                           prune_configs_by={"early_config_prune": _pruner("fwd_tma")})(kernel)


attn_fwd = _autotuned(_attn_fwd, "fwd")
attn_fwd_tma = _autotuned_tma(_attn_fwd_tma)
attn_bwd_dkdv = _autotuned(_attn_bwd_dkdv, "bwd_dkdv")
attn_bwd_dq = _autotuned(_attn_bwd_dq, "bwd_dq")
FORWARD_KERNELS = {"_attn_fwd": attn_fwd, "_attn_fwd_tma": attn_fwd_tma}   # by the names forward_variant gives
_FIXED_BLOCKS = INTERPRETER_BLOCKS if INTERPRETED else {}
_FIXED_BACKWARD_BLOCKS = INTERPRETER_BACKWARD_BLOCKS if INTERPRETED else {}


def _launching():
    """Where the launches of a call happen: in the interpreter, this module's kernels and
    Triton's standard library are seen as interpreted copies until the block ends."""
    if INTERPRETED and not TRITON_MISSING:
        return triton_interpreter.interpreting(globals())
    return contextlib.nullcontext()


# --------------------------------------------------------------------------------------
# 5. Launchers
# --------------------------------------------------------------------------------------

def _new_output(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Memory for O, dQ, dK or dV, with ``like``'s shape and (when dense) strides.

    Uninitialized, because the kernels write every element. Tests replace this function
    with one that fills NaN, to prove it.
    """
    return torch.empty_like(like, dtype=dtype)


def _kernel_target(out: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel should write ``out`` through.

    Usually ``out`` itself. The exception is bfloat16 in the interpreter: its float32 to
    bfloat16 conversion truncates instead of rounding to nearest, so there the kernel
    writes float32 and PyTorch rounds it into ``out`` (see `_finish`).
    """
    if INTERPRETED and out.dtype == torch.bfloat16:
        return _new_output(out, torch.float32)
    return out


def _finish(out: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    if written is not out:
        out.copy_(written)
    return out


def _kernel_options(q: torch.Tensor) -> dict:
    # The interpreter does bfloat16 arithmetic on raw bits (silently wrong), so there
    # every tile is upcast to float32 right after its load. On a GPU, float32 matmuls
    # would default to TF32 (about 1e-3 error). "ieee" keeps them exact to the course's
    # 1e-5 tolerance, at the price of not using tensor cores.
    return dict(UPCAST=INTERPRETED,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 or INTERPRETED else "tf32")


def padded_head_dim(head_dim: int) -> int:
    """The power of two >= head_dim (and >= 16, tl.dot's smallest size) the kernels work in."""
    return max(16, _next_power_of_2(head_dim))


def _sizes(q, k) -> dict:
    """The size arguments every kernel takes, after its tensors and strides."""
    s_q, s_k = q.shape[2], k.shape[2]
    return dict(H=q.shape[1], GROUP=q.shape[1] // k.shape[1], SQ=s_q, SK=s_k, D=q.shape[3],
                OFFSET=s_k - s_q, SQ_BUCKET=_next_power_of_2(s_q), SK_BUCKET=_next_power_of_2(s_k))


# The forward multiplies raw scores by the scale inside exp2 and takes the row max before
# scaling, so a score hidden as -inf would meet a zero scale as -inf·0 = NaN. A zero scale
# (every score 0, the softmax uniform) is run as 2**-120 instead: |s|·2**-120 stays far below
# float32's rounding of exp2's argument for any finite score, so the result is the same.
_ZERO_SCALE_STANDIN = 2.0 ** -120


def _forward_qk_scale(scale: float) -> float:
    """The forward's scale in log2 units (exp(x) = exp2(x·log2 e))."""
    return (scale if scale != 0 else _ZERO_SCALE_STANDIN) * LOG2E


def tma_reason(tensors, capability, interpreted: bool = False, descriptors: bool = True) -> Reason:
    """Why the forward does not take its TMA variant (None when it does). Reads only its arguments.

    ``tensors``: {name: tensor} of what the kernel reads and writes through descriptors;
    ``capability``: the GPU's (major, minor), None on a CPU; ``descriptors``: whether this
    Triton has host-side tensor descriptors. The variant is for Hopper (sm_90) only, and a TMA
    descriptor needs its tensor 16-byte aligned, contiguous along D, and every other stride a
    multiple of 16 bytes (a head dim of 80 in bf16: 160 bytes a row, fine; 59: not).
    """
    if not descriptors:
        return "this Triton has no host-side tensor descriptors (triton.tools.tensor_descriptor)"
    if interpreted:
        return "Triton's interpreter runs the pointer kernel (the TMA variant is chosen on sm_90 GPUs)"
    if capability is None:
        return "the TMA variant runs on Hopper GPUs (sm_90), not on a CPU"
    if tuple(capability)[0] != 9:
        return f"the TMA variant is for Hopper (sm_90); this GPU is sm_{capability[0]}{capability[1]}"
    for name, t in tensors.items():
        size = t.element_size()
        if t.stride(-1) != 1:
            return f"{name} is not contiguous along the head dim (stride {t.stride(-1)})"
        if any(st * size % 16 for st in t.stride()[:-1]):
            return f"{name}'s strides {tuple(t.stride())} are not all multiples of 16 bytes"
        if t.data_ptr() % 16:
            return f"{name} does not start on a 16-byte boundary"
    return None


def forward_variant(q, k, v) -> tuple:
    """(the forward kernel the launcher takes for q, k, v, why not the TMA one: None if it is
    the TMA one). O and its fp32 copy are allocated with q's strides (or contiguous ones),
    which a descriptor takes whenever q's do; the launcher checks them too."""
    reason = tma_reason(dict(q=q, k=k, v=v), _capability(q), INTERPRETED, TensorDescriptor is not None)
    return ("_attn_fwd" if reason else "_attn_fwd_tma"), reason


def _capability(t: torch.Tensor):
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else None


def _descriptor(t: torch.Tensor, rows: int, head_dim: int):
    """A 4-D TMA descriptor of a [B, H, S, D] tensor, tiled [1, 1, rows, head_dim].
    On a GPU the autotuner's pre-hook sets the tile shape of the config it runs."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, head_dim])


def flash_forward(q, k, v, causal: bool, scale: float, keep_fp32_o: bool = False, tma: bool | None = None):
    """Launch the forward kernel. Returns (O, LSE, O32).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]. LSE is [B·Hq, Sq] float32, in log2 units. O32 is
    O in float32 before rounding, kept when ``keep_fp32_o`` (for the backward), else None.
    ``tma``: take the TMA variant (True), the pointer kernel (False), or decide by
    `tma_reason` (None: TMA on Hopper when the tensors allow it).
    """
    batch, heads, s_q, head_dim = q.shape
    o = _new_output(q)
    o_target = _kernel_target(o)
    o32 = None
    if keep_fp32_o:
        o32 = o_target if o_target.dtype == torch.float32 else _new_output(q, torch.float32)
    store_o32 = o32 is not None and o32 is not o_target
    o32_ptr = o32 if store_o32 else o_target   # not written unless STORE_O32
    lse = torch.empty(batch * heads, s_q, device=q.device, dtype=torch.float32)
    pad = padded_head_dim(head_dim)
    grid = lambda meta: (batch * heads, triton.cdiv(s_q, meta["BLOCK_M"]))  # noqa: E731
    options = dict(HEAD_DIM=pad, CAUSAL=causal, NEG_SCALE=scale < 0, STORE_O32=store_o32,
                   **_kernel_options(q), **_FIXED_BLOCKS)
    if tma is None:
        tma = tma_reason(dict(q=q, k=k, v=v, o=o_target, o32=o32_ptr), _capability(q), INTERPRETED,
                         TensorDescriptor is not None) is None
    if tma:
        block_m, block_n = _FIXED_BLOCKS.get("BLOCK_M", 16), _FIXED_BLOCKS.get("BLOCK_N", 16)
        descriptors = [_descriptor(t, rows, pad) for t, rows in
                       ((q, block_m), (k, block_n), (v, block_n), (o_target, block_m), (o32_ptr, block_m))]
        sizes = {name: value for name, value in _sizes(q, k).items() if name != "D"}
        with _launching():
            attn_fwd_tma[grid](*descriptors, lse, _forward_qk_scale(scale), **sizes,
                               ELEMENT_BYTES=q.element_size(), **options)
    else:
        with _launching():
            attn_fwd[grid](q, k, v, o_target, o32_ptr, lse, _forward_qk_scale(scale),
                           *q.stride(), *k.stride(), *v.stride(), *o_target.stride(), *o32_ptr.stride(),
                           **_sizes(q, k), PAD_D=pad != head_dim, **options)
    return _finish(o, o_target), lse, o32


def flash_backward(q, k, v, o32, lse, do, causal: bool, scale: float):
    """Launch the three backward kernels. Returns (dQ, dK, dV); dK, dV have k's and v's shape.

    ``o32`` is the forward's output before rounding (float32), from which Delta is exact.
    """
    batch, heads, s_q, head_dim = q.shape
    kv_heads, s_k = k.shape[1], k.shape[2]
    pad = padded_head_dim(head_dim)
    sizes = _sizes(q, k)
    delta = torch.empty_like(lse)
    pre_grid = (batch * heads, triton.cdiv(s_q, PREPROCESS_BLOCK_M))
    dq, dk, dv = _new_output(q), _new_output(k), _new_output(v)
    dq_t, dk_t, dv_t = _kernel_target(dq), _kernel_target(dk), _kernel_target(dv)
    options = dict(HEAD_DIM=pad, CAUSAL=causal, PAD_D=pad != head_dim, **_kernel_options(q),
                   **_FIXED_BACKWARD_BLOCKS)
    kv_grid = lambda meta: (batch * kv_heads, triton.cdiv(s_k, meta["BLOCK_N"]))  # noqa: E731
    q_grid = lambda meta: (batch * heads, triton.cdiv(s_q, meta["BLOCK_M"]))  # noqa: E731
    with _launching():
        _attn_bwd_preprocess[pre_grid](o32, do, delta, *o32.stride(), *do.stride(), heads, s_q, head_dim,
                                       HEAD_DIM=pad, BLOCK_M=PREPROCESS_BLOCK_M)
        attn_bwd_dkdv[kv_grid](q, k, v, do, dk_t, dv_t, lse, delta, scale, scale * LOG2E,
                               *q.stride(), *k.stride(), *v.stride(),
                               *do.stride(), *dk_t.stride(), *dv_t.stride(), **sizes, **options)
        attn_bwd_dq[q_grid](q, k, v, do, dq_t, lse, delta, scale, scale * LOG2E,
                            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq_t.stride(),
                            **sizes, **options)
    return _finish(dq, dq_t), _finish(dk, dk_t), _finish(dv, dv_t)


# --------------------------------------------------------------------------------------
# 6. Autograd, and the registry entry
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
        q, k, v, o32, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o32, lse, do, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def requirement(device: torch.device) -> Reason:
    """Why the Triton kernels cannot run on ``device`` (None if they can)."""
    if TRITON_MISSING:
        return TRITON_MISSING
    if device.type == "cpu":
        if INTERPRETED:
            return None
        why = ("TRITON_INTERPRET=0 turned off" if triton_interpreter.ENV_VAR in os.environ
               else "is off where a GPU is visible")
        return (f"runs CPU tensors only in Triton's interpreter, which {why} "
                "(set TRITON_INTERPRET=1 before importing kernels to use it)")
    if device.type == "cuda":
        return needs_cuda(device)
    return f"runs on CUDA GPUs (or on the CPU in Triton's interpreter), not on {device.type}"


@register("triton", order=60, requires=requirement, slow_on_cpu=True, head_dims=HEAD_DIMS,
          dtypes=(torch.float16, torch.bfloat16, torch.float32))
def triton_attention(q, k, v, causal: bool = True, scale: float | None = None):
    """FlashAttention-2 written in Triton (forward and backward; the interpreter on CPU)."""
    if scale is None:  # the registry always passes a float; this is for direct calls
        scale = 1.0 / math.sqrt(q.shape[-1])
    for_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return FlashAttention.apply(q, k, v, causal, scale, for_backward)


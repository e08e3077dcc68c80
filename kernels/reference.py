"""The judge: attention in float64, and the FLOP and byte counts every benchmark uses."""
from __future__ import annotations

import math

import torch


def attention(q, k, v, causal: bool = True, scale=None) -> torch.Tensor:
    """Softmax(q kᵀ · scale, causal-masked) v, computed in float64 on the CPU.

    Slow and memory-hungry on purpose: nothing here is clever, so it can judge the rest.
    """
    q, k, v = (t.to("cpu", torch.float64) for t in (q, k, v))  # differentiable, for gradient checks
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        s_q, s_k = scores.shape[-2:]
        future = torch.ones(s_q, s_k, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v


def max_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: one number that is scale-free and shape-free."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def tolerance(dtype: torch.dtype) -> float:
    """The error the course accepts against the float64 reference (DESIGN.md)."""
    return {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 1e-2)


def flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True,
          backward: bool = False) -> float:
    """FLOPs of attention: 2 matmuls of 2·S²·D each per head, halved when causal.

    Backward does 2.5x the forward's work (five matmuls to the forward's two), so
    forward+backward is 3.5x. The convention of FlashAttention's benchmarks; counting
    causal at full price would report TFLOP/s twice too high.
    """
    f = 4.0 * batch * heads * seq * seq * head_dim
    if causal:
        f /= 2
    return f * 3.5 if backward else f


def io_bytes(batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype = torch.float32,
             materialized: bool = False, backward: bool = False) -> float:
    """Bytes that must cross HBM at least once.

    A fused kernel reads q, k, v and writes o (4·B·H·S·D elements). An implementation
    that materializes the S×S scores also writes them and reads them back for each of
    its passes (scale, mask, softmax, second matmul): we count one write and one read of
    the scores and probabilities (4·B·H·S² more elements), a lower bound for it.
    Backward reads q, k, v, o, dO and writes dQ, dK, dV (8·B·H·S·D more).
    """
    elem = torch.empty((), dtype=dtype).element_size()
    n = 4 * batch * heads * seq * head_dim
    if materialized:
        n += 4 * batch * heads * seq * seq
    if backward:
        n += 8 * batch * heads * seq * head_dim
    return float(n * elem)

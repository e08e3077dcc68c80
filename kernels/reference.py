"""The judge: attention in float64, the rule it judges by, and the FLOP and byte counts.

``attention`` is the float64 reference every implementation is compared with. ``judge``
applies the course's rule (the registry's contract, ``kernels/registry.py``):

* float32 (and float64): max |out - ref| within ``tolerance(dtype)`` x max |ref|, plus a tiny
  absolute floor (1e-6; 1e-12 for float64) so that a reference that is exactly zero (the dQ of
  a query that sees one key) does not demand an exactly-zero answer. Where float32 misses
  that, the bound adds what float32's rounding of the scores does, computed from the inputs
  (``score_rounding_bounds``), never from a float32 computation on this machine (whose error
  depends on the BLAS kernel it picks: OpenBLAS's Haswell kernels on AMD round NumPy's matmul,
  and so Triton's interpreter, differently). The derivation, with u = 2^-24 float32's unit
  roundoff and a_ij = scale·q_i·k_j the scores, each rounding modelled as an independent
  relative error of standard deviation u/√3 (Higham and Mary's probabilistic analysis, 2019:
  the worst case, D·u·Σ|q||k| for a dot product, is far from what happens and would let a real
  precision bug pass):
    - exp's argument errs with variance σ²_ij = (u²/3)·(scale²·(D+1)/2·Σ_d q_id²k_jd² + a_ij²):
      the length-D dot product (one rounding a step, on partial sums) and the scaling. The
      row's normalizer (the softmax's sum, or the log-sum-exp a FlashAttention forward saves)
      adds Σ_k P_ik²σ²_ik + (u²/3)·lse_i². A FlashAttention backward rebuilds P from fresh
      scores and the forward's lse, which cancel only where both round each score bit for bit
      alike: they need not (another tile shape, Sᵀ = K·Qᵀ against the forward's Q·Kᵀ, another
      BLAS kernel in the interpreter), so the two are taken as independent;
    - carried linearly, Var(δP_ij) = P_ij²·(σ²_ij + the normalizer's), to out = P·V, dV = Pᵀ·dO,
      Δ = rowsum(dO∘O), dS = P∘(dP - Δ), dQ = scale·dS·K and dK = scale·dSᵀ·Q (summed over a
      GQA group's heads for dK, dV), each a sum of independent terms whose variances add;
    - the bound is ``tolerance`` x max|ref| + floor + ``SCORE_FACTOR`` (6) standard deviations
      of the largest of these, for the tensor judged (the fixed part covers every other
      rounding, as it does at the usual scales). At scale 10 on unit-variance inputs, D = 64,
      S = 113, it is 1.1e-3 for a dV of max|ref| 12.7: a FlashAttention backward is off by 3e-4
      there when its scores round unlike its forward's, plain float32 by 4e-5, and a dV from
      probabilities rounded to bfloat16 (8e-3) or from TF32 scores (5e-2) fails
      (tests/attention/test_registry.py);
* float16 and bfloat16, FlashAttention's rule (flash-attention ``tests/test_flash_attn.py``):
  max |out - ref| at most 2x (gradients 3x) the same error of *plain* PyTorch attention
  computed in that dtype (``plain_attention``; the less exact of its two usual orders, scale
  after or before q·kᵀ), + 1e-5. A fixed bound cannot do both jobs:
  at some shapes hand-written bf16 attention is legitimately off by 2e-2, and at others a
  real kernel bug hides under 1e-2. The plain computation's own error sets the bar per shape.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

HALF = (torch.float16, torch.bfloat16)
# FlashAttention's factors: an output within 2x plain attention's error, gradients within 3x.
OUTPUT_FACTOR, GRAD_FACTOR, FLOOR = 2.0, 3.0, 1e-5
# The absolute floor added to the relative bound of float32 and float64.
ABS_FLOOR = {torch.float32: 1e-6, torch.float64: 1e-12}
# float32's unit roundoff (half the gap from 1 to the next float32), and how many standard
# deviations of the scores' rounding, carried to a tensor, the float32 bound allows (module docstring).
UNIT_ROUNDOFF = 2.0 ** -24
SCORE_FACTOR = 6.0


# --------------------------------------------------------------------------- the reference

def future_mask(s_q: int, s_k: int, device: Union[torch.device, str, None] = None) -> torch.Tensor:
    """[s_q, s_k] bool, True where query i may NOT see key j: j > i + (s_k - s_q).

    Bottom-right alignment (FlashAttention's, SDPA's ``causal_lower_right``): the last query
    sees every key. For s_q == s_k it is the usual strict upper triangle. When s_q > s_k the
    first s_q - s_k queries see no key at all.
    """
    return torch.ones(s_q, s_k, dtype=torch.bool, device=device).triu(s_k - s_q + 1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, scale: Optional[float] = None) -> torch.Tensor:
    """Softmax(q kᵀ · scale, causal-masked) v, computed in float64 on the CPU.

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D] with Hq a multiple of Hkv (query head h reads
    key/value head h // (Hq // Hkv)). A query that sees no key (causal with Sq > Sk) outputs
    zeros, as FlashAttention and SDPA's math backend do. Slow and memory-hungry on purpose:
    nothing here is clever, so it can judge the rest. Differentiable, for gradient checks.
    """
    q, k, v = (t.to("cpu", torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, Hq, Sk, D]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q @ k.transpose(-2, -1)) * scale                                    # [B, Hq, Sq, Sk]
    if not causal:
        return scores.softmax(dim=-1) @ v
    hidden = future_mask(scores.shape[-2], scores.shape[-1])
    nothing_seen = hidden.all(dim=-1, keepdim=True)                               # [Sq, 1]
    # Fill such rows with 0 before the softmax (no 0/0, no NaN gradient), zero them after it.
    scores = scores.masked_fill(hidden, float("-inf")).masked_fill(nothing_seen, 0.0)
    return scores.softmax(dim=-1).masked_fill(nothing_seen, 0.0) @ v


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, scale: Optional[float] = None,
                    scale_first: bool = False) -> torch.Tensor:
    """The same attention as plain PyTorch computes it in the inputs' dtype, on their device.

    Matmul, scale, mask, softmax, the probabilities rounded to the dtype, matmul: the textbook
    formula, as chapter 1 and the source article write it. ``scale_first=True`` scales q
    before the matmul instead, as FlashAttention's ``attention_ref`` does. The judge's
    baseline is the less exact of the two (see ``judge``).
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q * scale) @ k.transpose(-2, -1) if scale_first else (q @ k.transpose(-2, -1)) * scale
    if causal:
        hidden = future_mask(scores.shape[-2], scores.shape[-1], scores.device)
        nothing_seen = hidden.all(dim=-1, keepdim=True)
        scores = scores.masked_fill(hidden, float("-inf")).masked_fill(nothing_seen, 0.0)
        probs = scores.softmax(dim=-1).masked_fill(nothing_seen, 0.0)
    else:
        probs = scores.softmax(dim=-1)
    return probs.to(v.dtype) @ v


def max_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: one number that is scale-free and shape-free."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def max_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| (NaN if either holds a NaN, so a NaN never passes)."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    return float((out - ref).abs().max())


def tolerance(dtype: torch.dtype) -> float:
    """The relative error the course accepts against the float64 reference for fp32 and fp64.

    For float16/bfloat16 this returns a loose 1e-2, kept for callers of the first version;
    judge 16-bit results with ``judge`` (FlashAttention's rule) instead.
    """
    return {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 1e-2)


# --------------------------------------------------------------------------- the judge

@dataclass(frozen=True)
class Verdict:
    """One tensor judged: its error, the bound it had to meet, and the rule that set the bound."""

    tensor: str    # "out", "dq", "dk" or "dv"
    error: float   # relative error (fp32/fp64) or max absolute error (16-bit)
    bound: float
    rule: str

    @property
    def ok(self) -> bool:
        return self.error <= self.bound   # False for NaN

    def __str__(self) -> str:
        return (f"{self.tensor}: {number(self.error)} {'<=' if self.ok else 'exceeds'} {number(self.bound)} "
                f"({self.rule})")


class Judgement(dict):
    """``{tensor: Verdict}`` for one call, with ``ok`` and the failures in words."""

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.values())

    @property
    def failures(self) -> list:
        return [v for v in self.values() if not v.ok]

    def __str__(self) -> str:
        return "; ".join(map(str, self.values()))

    def assert_ok(self, label: str = "") -> "Judgement":
        if not self.ok:
            raise AssertionError(f"{label + ': ' if label else ''}does not match the float64 reference "
                                 f"within the course's rule: {'; '.join(map(str, self.failures))}")
        return self


def judge(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, scale: Optional[float] = None, *,
          grads: Optional[Sequence[torch.Tensor]] = None, grad_out: Optional[torch.Tensor] = None) -> Judgement:
    """Judge ``out`` (and ``grads`` = (dq, dk, dv) for ``grad_out``) against the float64 reference.

    fp32/fp64: within ``tolerance(dtype)`` of max|ref| (+ ``ABS_FLOOR``); fp32 where that fails,
    plus ``SCORE_FACTOR`` standard deviations of what float32's rounding of the scores does
    (``score_rounding_bounds``).
    fp16/bf16: FlashAttention's rule, max |err| <= 2x (gradients 3x) plain same-dtype attention's
    max |err|, + 1e-5.
    """
    names = ("out",) + (("dq", "dk", "dv") if grads is not None else ())
    got = (out,) + (tuple(grads) if grads is not None else ())
    grad_out = grad_out if grads is not None else None
    want = with_grads(attention, q, k, v, causal, scale, grad_out, torch.float64)
    dtype = q.dtype
    if dtype not in HALF:
        scores = functools.partial(score_rounding_bounds, q, k, v, causal, scale, grad_out)
        return _judge_fixed(names, got, want, dtype, scores)
    baselines = plain_errors(q, k, v, causal, scale, grad_out, want)
    verdicts = {}
    for n, g, w, baseline in zip(names, got, want, baselines):
        factor = OUTPUT_FACTOR if n == "out" else GRAD_FACTOR
        verdicts[n] = Verdict(n, max_abs_error(g, w), factor * baseline + FLOOR,
                              f"max abs error <= {factor:g} x {number(baseline)} of plain {_dt(dtype)} "
                              f"attention + {FLOOR:g}")
    return Judgement(verdicts)


def _judge_fixed(names, got, want, dtype, scores: Callable[[], tuple]) -> Judgement:
    """float32/float64: ``tolerance(dtype)`` x max|ref| + floor; for float32, where that fails,
    plus ``SCORE_FACTOR`` standard deviations of the scores' rounding carried to the tensor (``scores()``)."""
    tol, floor = tolerance(dtype), ABS_FLOOR[dtype]
    verdicts, carried = {}, None
    for i, (n, g, w) in enumerate(zip(names, got, want)):
        error, fixed = max_abs_error(g, w), tol * _max_abs(w) + floor
        rule = f"max abs error <= {tol:g} x max|ref| {number(_max_abs(w))} + {floor:g}, {_dt(dtype)}"
        if not error <= fixed and dtype == torch.float32:   # `not <=`: a NaN error goes on to fail
            carried = carried if carried is not None else scores()
            fixed += SCORE_FACTOR * carried[i]
            rule += (f" + {SCORE_FACTOR:g} x {number(carried[i])}, the standard deviation of what float32's "
                     f"rounding of the scores puts in {n}")
        verdicts[n] = Verdict(n, error, fixed, rule)
    return Judgement(verdicts)


def check(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
          scale: Optional[float] = None, *, backward: bool = False, seed: int = 0) -> Judgement:
    """Call ``fn(q, k, v, causal=, scale=)`` (and its backward for a random dO) and judge it.

    The inputs are not modified: the call sees detached copies with the same strides.
    """
    if not backward:
        with torch.no_grad():
            return judge(fn(q, k, v, causal=causal, scale=scale), q, k, v, causal, scale)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]   # same strides as the inputs
    out = fn(*leaves, causal=causal, scale=scale)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device, out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    return judge(out.detach(), q, k, v, causal, scale, grads=grads, grad_out=grad_out)


def score_rounding_bounds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                          scale: Optional[float] = None, grad_out: Optional[torch.Tensor] = None) -> tuple:
    """(out,) or (out, dq, dk, dv): the largest standard deviation, over each tensor's elements,
    of the error float32's rounding of the scores puts there, to first order (the module
    docstring derives it). Computed in float64 from the inputs alone: the same on every
    machine, whatever BLAS it has."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    u, s_k = UNIT_ROUNDOFF, k.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * scale
    hidden = future_mask(scores.shape[-2], s_k) if causal else torch.zeros(scores.shape[-2:], dtype=torch.bool)
    # Variance of the error of exp's argument, per score: the dot product's (random rounding,
    # u/√3 a step on partial sums of mean square (D+1)/2·Σ_d (q_d k_d)²) and the scaling's.
    prods_sq = (q * q) @ (k * k).transpose(-2, -1)
    var_a = (u * u / 3) * (scale * scale * (q.shape[-1] + 1) / 2 * prods_sq + scores * scores)
    var_a = var_a.masked_fill(hidden, 0.0)
    p = _probabilities(scores, hidden)
    lse = scores.masked_fill(hidden, float("-inf")).logsumexp(-1, keepdim=True).nan_to_num(0.0, 0.0, 0.0)
    # The normalizer's: what it sums (computed apart, so independent) and its own rounding.
    var_norm = (p * p * var_a).sum(-1, keepdim=True) + (u * u / 3) * lse * lse
    var_p = p * p * (var_a + var_norm)                                       # Var(δP_ij)
    variances = [var_p @ (v * v)]
    if grad_out is not None:
        grad_out = grad_out.detach().to("cpu", torch.float64)
        d_probs = grad_out @ v.transpose(-2, -1)
        delta = (p * d_probs).sum(-1, keepdim=True)
        var_delta = (var_p * d_probs * d_probs).sum(-1, keepdim=True)          # Δ = rowsum(dO∘O)
        var_ds = 2 * (var_p * (d_probs - delta) ** 2 + p * p * var_delta)     # dS = P∘(dP - Δ)
        var_dq = 2 * scale * scale * (var_ds @ (k * k) + var_delta * (p @ k) ** 2)
        per_head_dk = scale * scale * var_ds.transpose(-2, -1) @ (q * q)
        per_head_dv = var_p.transpose(-2, -1) @ (grad_out * grad_out)
        variances += [var_dq, _group_sum(per_head_dk, group), _group_sum(per_head_dv, group)]
    bounds = [var.sqrt() for var in variances]
    return tuple(float(b.max()) if b.numel() else 0.0 for b in bounds)


def _probabilities(scores: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """softmax(scores) with ``hidden`` entries 0; a row that sees no key is all 0."""
    nothing_seen = hidden.all(dim=-1, keepdim=True)
    masked = scores.masked_fill(hidden, float("-inf")).masked_fill(nothing_seen, 0.0)
    return masked.softmax(dim=-1).masked_fill(hidden | nothing_seen, 0.0)


def _group_sum(per_query_head: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hq, S, D] -> [B, Hq // group, S, D]: what the query heads sharing a K/V head add up."""
    b, h, s, d = per_query_head.shape
    return per_query_head.reshape(b, h // group, group, s, d).sum(2)


def plain_errors(q, k, v, causal, scale, grad_out, want) -> list:
    """Max |error| of plain same-dtype attention per tensor: the larger of its two usual orders.

    Scaling after q·kᵀ (the textbook, and chapter 1) rounds the scores twice; scaling first
    (FlashAttention's reference) once. A hand-written kernel in either order is "plain
    attention", so the bound is set by the less exact one (a NaN, from fp16 overflow in one
    order, falls back to the other).
    """
    per_order = []
    for scale_first in (False, True):
        attn = functools.partial(plain_attention, scale_first=scale_first)
        plain = with_grads(attn, q, k, v, causal, scale, grad_out, q.dtype)
        per_order.append([max_abs_error(p, w) for p, w in zip(plain, want)])
    return [max((e for e in errors if not math.isnan(e)), default=float("nan")) for errors in zip(*per_order)]


def with_grads(attn: Callable, q, k, v, causal, scale, grad_out, dtype) -> tuple:
    """(out,) or (out, dq, dk, dv) of ``attn`` on copies of q, k, v cast to ``dtype``."""
    device = "cpu" if dtype == torch.float64 else q.device
    leaves = [t.detach().to(device, dtype).requires_grad_(grad_out is not None) for t in (q, k, v)]
    if grad_out is None:
        with torch.no_grad():
            return (attn(*leaves, causal, scale),)
    out = attn(*leaves, causal, scale)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad_out.to(device, dtype)))


def number(x: float) -> str:
    """An error or a bound as the verdicts print it: small ones with their exponent ("5.30e-07"),
    the rest to 3 significant digits without one ("3.18", "12.7", "1,234")."""
    if not math.isfinite(x) or abs(x) < 1e-3:
        return f"{x:.2e}" if x else "0"
    return f"{x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def _max_abs(t: torch.Tensor) -> float:
    return float(t.detach().abs().max())


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------- counts

def flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True,
          backward: bool = False, *, seq_k: int | None = None) -> float:
    """FLOPs of attention: 2 matmuls of 2·Sq·Sk·D each per query head, causal counting only
    what is seen.

    Backward does 2.5x the forward's work (five matmuls to the forward's two), so
    forward+backward is 3.5x. With Sq == Sk (``seq_k`` None or equal), causal is halved: the
    convention of FlashAttention's benchmarks; counting causal at full price would report
    TFLOP/s twice too high. With Sq != Sk, causal counts the (query, key) pairs the bottom-right
    mask leaves visible, so decoding one token (Sq = 1) costs its full Sk. K/V heads shared by
    grouped-query attention do not change the count: every query head does its own matmuls.
    """
    seq_k = seq if seq_k is None else seq_k
    pairs = float(seq * seq_k)
    if causal:
        pairs = pairs / 2 if seq_k == seq else float(visible_pairs(seq, seq_k))
    f = 4.0 * batch * heads * pairs * head_dim
    return f * 3.5 if backward else f


def decode_flops(batch: int, heads: int, seq_k: int, head_dim: int) -> float:
    """FLOPs of one decode token: one new query per head against ``seq_k`` cached keys,
    4·B·Hq·Sk·D.

    Causal or not, nothing is halved: bottom-right alignment lets the newest query see every
    key, so the mask hides nothing from a single query row (and at Sk = 1 too, where
    ``flops``' Sq == Sk convention would halve). Shared K/V heads do not change the count.
    """
    return flops(batch, heads, 1, head_dim, causal=False, seq_k=seq_k)


def visible_pairs(s_q: int, s_k: int) -> int:
    """(query, key) pairs bottom-right causal attention computes: sum over i of min(Sk, max(0, i + Sk - Sq + 1))."""
    return int((~future_mask(s_q, s_k)).sum())


def io_bytes(batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype = torch.float32,
             materialized: bool = False, backward: bool = False, *, seq_k: int | None = None,
             kv_heads: int | None = None) -> float:
    """Bytes that must cross HBM at least once.

    A fused kernel reads q, k, v and writes o: 2·B·Hq·Sq·D + 2·B·Hkv·Sk·D elements (4·B·H·S·D
    when the shapes agree; grouped-query attention reads each shared K/V head once). An
    implementation that materializes the scores also writes them and reads them back for
    each of its passes (scale, mask, softmax, second matmul): we count one write and one read
    of the scores and probabilities (4·B·Hq·Sq·Sk more elements), a lower bound for it.
    Backward reads q, k, v, o, dO and writes dQ, dK, dV (4 q-sized and 4 k-sized more).
    """
    elem = torch.empty((), dtype=dtype).element_size()
    seq_k = seq if seq_k is None else seq_k
    kv_heads = heads if kv_heads is None else kv_heads
    q_side = batch * heads * seq * head_dim
    kv_side = batch * kv_heads * seq_k * head_dim
    n = 2 * q_side + 2 * kv_side
    if materialized:
        n += 4 * batch * heads * seq * seq_k
    if backward:
        n += 4 * q_side + 4 * kv_side
    return float(n * elem)

"""The judge: attention in float64, the rule it judges by, and the FLOP and byte counts.

``attention`` is the float64 reference every implementation is compared with. ``judge``
applies the course's rule (the registry's contract, ``kernels/registry.py``):

* float32 (and float64): max |out - ref| within ``tolerance(dtype)`` x max |ref|, plus a tiny
  absolute floor (1e-6; 1e-12 for float64) so that a reference that is exactly zero (the dQ of
  a query that sees one key) does not demand an exactly-zero answer. For float32 the bound is
  the larger of that and FlashAttention's factors (below) times plain float32 attention's own
  error: the scores q·kᵀ·scale carry float32's rounding, an absolute error that grows with
  their size, and exp turns it into a relative error of every probability. At scale 10 on
  unit-variance inputs plain float32 attention itself is off by 1e-5 to 3e-5 of max |ref|, so
  a fixed 1e-5 would fail the computation it stands for; where 1e-5 holds (the usual scales)
  it is the bound, and plain attention is only computed when it does not;
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
        return (f"{self.tensor}: {self.error:.2e} {'<=' if self.ok else 'exceeds'} {self.bound:.2e} "
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
    within 2x (gradients 3x) plain fp32 attention's max |err| (+ ``ABS_FLOOR``) if that is larger.
    fp16/bf16: FlashAttention's rule, max |err| <= 2x (gradients 3x) plain same-dtype attention's
    max |err|, + 1e-5.
    """
    names = ("out",) + (("dq", "dk", "dv") if grads is not None else ())
    got = (out,) + (tuple(grads) if grads is not None else ())
    want = _with_grads(attention, q, k, v, causal, scale, grad_out if grads is not None else None,
                       torch.float64)
    dtype = q.dtype
    plain = functools.partial(_plain_errors, q, k, v, causal, scale, grad_out if grads is not None else None, want)
    if dtype not in HALF:
        return _judge_fixed(names, got, want, dtype, plain)
    baselines = plain()
    verdicts = {}
    for n, g, w, baseline in zip(names, got, want, baselines):
        factor = OUTPUT_FACTOR if n == "out" else GRAD_FACTOR
        verdicts[n] = Verdict(n, max_abs_error(g, w), factor * baseline + FLOOR,
                              f"max abs error <= {factor:g} x {baseline:.2e} of plain {_dt(dtype)} "
                              f"attention + {FLOOR:g}")
    return Judgement(verdicts)


def _judge_fixed(names, got, want, dtype, plain: Callable[[], list]) -> Judgement:
    """float32/float64: ``tolerance(dtype)`` x max|ref| + floor; for float32, where that fails,
    the bound widens to FlashAttention's factors times plain float32 attention's error."""
    tol, floor = tolerance(dtype), ABS_FLOOR[dtype]
    verdicts, baselines = {}, None
    for i, (n, g, w) in enumerate(zip(names, got, want)):
        error, fixed = max_abs_error(g, w), tol * _max_abs(w) + floor
        rule = f"max abs error <= {tol:g} x max|ref| {_max_abs(w):.2e} + {floor:g}, {_dt(dtype)}"
        if not error <= fixed and dtype == torch.float32:   # `not <=`: a NaN error goes on to fail
            baselines = baselines if baselines is not None else plain()
            factor = OUTPUT_FACTOR if n == "out" else GRAD_FACTOR
            if factor * baselines[i] + floor > fixed:
                fixed = factor * baselines[i] + floor
                rule = (f"max abs error <= {factor:g} x {baselines[i]:.2e} of plain float32 attention + {floor:g} "
                        f"(above {tol:g} x max|ref|: float32 scores this large round that much)")
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


def _plain_errors(q, k, v, causal, scale, grad_out, want) -> list:
    """Max |error| of plain same-dtype attention per tensor: the larger of its two usual orders.

    Scaling after q·kᵀ (the textbook, and chapter 1) rounds the scores twice; scaling first
    (FlashAttention's reference) once. A hand-written kernel in either order is "plain
    attention", so the bound is set by the less exact one (a NaN, from fp16 overflow in one
    order, falls back to the other).
    """
    per_order = []
    for scale_first in (False, True):
        attn = functools.partial(plain_attention, scale_first=scale_first)
        plain = _with_grads(attn, q, k, v, causal, scale, grad_out, q.dtype)
        per_order.append([max_abs_error(p, w) for p, w in zip(plain, want)])
    return [max((e for e in errors if not math.isnan(e)), default=float("nan")) for errors in zip(*per_order)]


def _with_grads(attn: Callable, q, k, v, causal, scale, grad_out, dtype) -> tuple:
    """(out,) or (out, dq, dk, dv) of ``attn`` on copies of q, k, v cast to ``dtype``."""
    device = "cpu" if dtype == torch.float64 else q.device
    leaves = [t.detach().to(device, dtype).requires_grad_(grad_out is not None) for t in (q, k, v)]
    if grad_out is None:
        with torch.no_grad():
            return (attn(*leaves, causal, scale),)
    out = attn(*leaves, causal, scale)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad_out.to(device, dtype)))


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


def decode_bytes(batch: int, heads: int, seq_k: int, head_dim: int, dtype: torch.dtype = torch.float32,
                 kv_heads: int | None = None, materialized: bool = False) -> float:
    """Bytes one decode token must move (``io_bytes`` with Sq = 1): the K/V cache,
    2·B·Hkv·Sk·D elements, read once, plus q read and o written, 2·B·Hq·D; an implementation
    that materializes the scores adds 4·B·Hq·Sk. The cache dominates as Sk grows, and
    grouped-query attention divides it by Hq / Hkv."""
    return io_bytes(batch, heads, 1, head_dim, dtype=dtype, materialized=materialized,
                    seq_k=seq_k, kv_heads=kv_heads)


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

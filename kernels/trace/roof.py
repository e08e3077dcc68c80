"""What one attention call costs, and the roof it sits under.

The conventions (TraceLens's, and the FlashAttention benchmarks'):

- **FLOPs**, forward, the two matrix products only (softmax and scaling are not counted):
  ``2·B·H_Q·Sq·Sk·(D + Dv)`` for a full call, half of it for a causal one with Sq = Sk. A serving
  engine's step mixes prefill ("context") and decode ("generation") requests of different lengths;
  per step it records Σsq, Σsk, Σsq² and Σsq·sk of each (``kernels.trace.serving``), and a call
  counts ``2·H_Q·(D + Dv)·(Σ_ctx sq·sk − Σ_ctx sq²/2 + Σ_gen sq·sk)``: causal prefill over a cached
  prefix is the rectangle minus the triangle above the diagonal; decode is the full rectangle.
  With one request and sq = sk it is the causal half again.
- **Bytes**: Q, K and V read once, O written once, at the inputs' element size:
  ``e·(queries·H_Q·(D + Dv) + keys·H_KV·(D + Dv))``. For decode, "keys" is every cached token the
  call reads, so the bytes are almost all KV cache. A kernel moves at least this much (a
  hand-written core moves its score matrix too: its TB/s on this count is a lower bound).
- **The roof**: a call's arithmetic intensity (FLOPs per byte) against the device's ridge point
  (dense 16-bit peak over memory bandwidth, ``kernels.hw.devices``): below the ridge the memory
  roof binds ("memory"), above it the compute roof ("compute"). The share of that roof achieved is
  TB/s over bandwidth, or TFLOP/s over peak: the same number as achieved over attainable FLOP/s.
"""
from __future__ import annotations

from dataclasses import dataclass
from kernels.hw.devices import Peaks

# Bytes an element of each dtype takes (the names kernels.trace.attention gives dtypes).
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4, "fp64": 8}
SIXTEEN_BIT_NAMES = ("bf16", "fp16")


def full_flops(batch_heads: int, sq: int, sk: int, d: int, dv: int) -> float:
    """The two products of every (query, key) pair: 2·B·H·Sq·Sk·(D + Dv)."""
    return 2.0 * batch_heads * sq * sk * (d + dv)


def serving_flops(heads: int, d: int, dv: int, causal_pairs: float) -> float:
    """2·H_Q·(D + Dv)·(query, key) pairs computed (``TokenCounts.pairs``)."""
    return 2.0 * heads * (d + dv) * causal_pairs


def io_bytes(q_rows: int, kv_rows: int, d: int, dv: int, element: int) -> int:
    """Q and O (``q_rows`` rows of one head each: tokens x query heads), K and V (``kv_rows``:
    tokens x KV heads), each read or written once."""
    return element * (q_rows + kv_rows) * (d + dv)


@dataclass(frozen=True)
class Roof:
    """Where one call sits under a device's roofline."""

    intensity: float        # FLOPs per byte
    ridge: float            # the device's, FLOPs per byte
    bound: str              # "memory" or "compute"
    share: float            # achieved over the binding roof (0..1, above 1 means the count is wrong)


def place(flops: float, nbytes: float, seconds: float, peaks: Peaks) -> Roof:
    """The roof a call with these counts sits under, and the share of it achieved in ``seconds``."""
    intensity = flops / nbytes
    if intensity < peaks.ridge:
        return Roof(intensity, peaks.ridge, "memory", nbytes / seconds / peaks.bandwidth)
    return Roof(intensity, peaks.ridge, "compute", flops / seconds / peaks.flops)


__all__ = ["ELEMENT_BYTES", "Roof", "SIXTEEN_BIT_NAMES", "full_flops", "io_bytes", "place", "serving_flops"]

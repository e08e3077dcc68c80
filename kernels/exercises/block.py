"""Checks for the exercises of chapter 8 (one transformer block).

The contract of ``kernels.exercises.judge``: fresh cases (a failure names their seed, so it can be
replayed with ``seed=``), a judge computed here, one ``✔`` line or an ``ExerciseFailed`` that
says what is wrong in words.
"""
from __future__ import annotations

import numbers
from typing import Callable, Optional

import pandas as pd
import torch

from kernels.attention import block as blocks
from kernels.exercises.judge import Passed, as_number, draw_int, fail, is_blank, passed, run_learner, seeded_generator

__all__ = ["check_block_flops", "check_crossover", "check_scores_buffers"]

_PARTS = ("qkv", "attention", "proj", "mlp")


def _configs(g):
    """(seq, width, batch, mlp_ratio) cases: odd lengths, widths that are not powers of two."""
    return [(draw_int(g, 17, 900), 64 * draw_int(g, 2, 12), draw_int(g, 1, 4), 4),
            (draw_int(g, 100, 3000), 96 * draw_int(g, 1, 8), 1, draw_int(g, 2, 6))]


# ============================================================================ task 1: FLOPs by part

def check_block_flops(block_flops: Callable, seed: Optional[int] = None) -> Passed:
    """``block_flops(seq, width, batch, mlp_ratio)`` -> {"qkv", "attention", "proj", "mlp"}: matmul
    FLOPs of one forward, attention computing every S×S score (what FlopCounterMode counts)."""
    g = seeded_generator(seed)
    for seq, width, batch, ratio in _configs(g):
        want = blocks.flops_by_part(seq, width, batch, ratio)
        got = run_learner(block_flops, seq, width, batch, ratio, what=f"block_flops({seq}, {width}, {batch}, {ratio})")
        case = f"[S={seq}, W={width}, B={batch}, mlp_ratio={ratio}]"
        if is_blank(got) or not isinstance(got, dict):
            fail(f"block_flops must return a dict with keys {list(_PARTS)}; it returned {got!r}.")
        missing = [p for p in _PARTS if p not in got]
        if missing:
            fail(f"the dict is missing {missing}: give every part its FLOPs.")
        off = {p: float(got[p]) / want[p] for p in _PARTS}
        if all(abs(r - 0.5) < 1e-9 for r in off.values()):
            fail(f"{case} every part is half the right count: a multiply-add is 2 FLOPs (one multiply, one "
                  "add), so an [M, K] × [K, N] matmul costs 2·M·K·N.")
        for part in _PARTS:
            r = off[part]
            if abs(r - 1) <= 1e-9:
                continue
            if part == "attention" and abs(r - 0.5) < 1e-9:
                words = ("half: a causal *kernel* may skip the masked half, but the block's naive attention "
                         "computes all S×S scores (4·B·S²·W), and FlopCounterMode counts what runs.")
            elif part == "mlp" and abs(r - 0.5) < 1e-9:
                words = "half: the MLP has two matmuls, W -> r·W and r·W -> W."
            elif part == "mlp" and abs(float(got[part]) - 16.0 * batch * seq * width * width) < 1e-9 * want[part]:
                words = f"the MLP's hidden width is mlp_ratio × W = {ratio}·W here, not 4·W."
            elif part == "qkv" and abs(r - 1 / 3) < 1e-9:
                words = "qkv makes q, k and v: one [W, 3W] matmul, three times a [W, W] one."
            else:  # the direction only: the size of the miss would give the count away
                words = (f"{float(got[part]):.4g} FLOPs is too {'high' if r > 1 else 'low'}: count its matmuls' "
                         "shapes again, 2 FLOPs per multiply-add.")
            fail(f"{case} {part}: {words}")
    return passed("block_flops counts every part's matmul FLOPs right on fresh shapes and MLP ratios")


# ============================================================================ task 2: the crossover

def _crossover(width: int, mlp_ratio: int = 4, causal_skip: bool = False) -> float:
    """The S at which attention's FLOPs equal the linear layers': 4S²W (or 2S²W) = 2·S·W²·(4 + 2r)."""
    per = 2.0 if causal_skip else 4.0
    return 2.0 * width * (4 + 2 * mlp_ratio) / per


def check_crossover(crossover: Callable, seed: Optional[int] = None) -> Passed:
    """``crossover(width, mlp_ratio, causal_skip)``: the sequence length at which attention is half
    the block's matmul FLOPs."""
    g = seeded_generator(seed)
    cases = [(64 * draw_int(g, 2, 20), r, c) for r, c in ((4, False), (draw_int(g, 2, 8), False), (4, True))]
    for width, ratio, skip in cases:
        want = _crossover(width, ratio, skip)
        got = run_learner(crossover, width, ratio, skip, what=f"crossover({width}, {ratio}, {skip})")
        case = f"[W={width}, mlp_ratio={ratio}, causal_skip={skip}]"
        got = as_number(got, "crossover")
        if abs(got - want) <= 1e-6 * want:
            continue
        if abs(got - 6 * width) < 1e-6 * want:
            fail(f"{case} 6·W is the chapter's crossover for one MLP ratio with every score computed; derive "
                  "yours from the FLOP counts of task 1, for this mlp_ratio and causal_skip.")
        if abs(got - _crossover(width, ratio, not skip)) < 1e-6 * want:
            fail(f"{case} causal_skip halves attention's FLOPs, which doubles the crossover length "
                  "(or you halved it where nothing is skipped).")
        fail(f"{case} at S = {got:g} attention's FLOPs are {'more' if got > want else 'less'} than the linear "
             "layers': not the crossover.")
    return passed(f"crossover finds where attention is half the block on {len(cases)} fresh configurations")


# ============================================================================ task 3: S×S buffers in a trace

def _in_attention(trace) -> tuple[pd.DataFrame, int]:
    """The trace's [memory] events inside its ``block.attention`` ranges, and how many ranges."""
    spans = trace.spans[trace.spans["name"] == "block.attention"]
    memory = trace.memory
    inside = pd.Series(False, index=memory.index)
    for start, end in zip(spans["ts"], spans["end"]):
        inside |= (memory["ts"] >= start) & (memory["ts"] <= end)
    return memory[inside], len(spans)


def _traced_block(attention: str, batch: int, heads: int, seq: int, width: int, trace_dir):
    """One recorded forward (after a warm-up) of the chapter's block with ``attention``, on the CPU."""
    from kernels.trace import record

    torch.manual_seed(0)
    blk = blocks.Block(width, heads, attention).eval()
    x = blocks.block_input(batch, seq, width)
    return record.profile(blk, x, label="block", wait=0, warmup=1, active=1, trace_dir=trace_dir,
                          trace_name=f"exercise_block_{attention}").trace


def check_scores_buffers(scores_buffers: Callable, seed: Optional[int] = None, trace_dir=None) -> Passed:
    """``scores_buffers(trace, q_shape, element_size)``: how many buffers of one S×S per head (all
    heads, B·H·S·S elements) the ``block.attention`` range of a one-forward trace allocated. The
    traces are recorded here, of the chapter's block with each attention that runs on a CPU, at
    fresh shapes; one shape makes the MLP's [B, S, 4W] buffer exactly as large as the scores."""
    import tempfile

    g = seeded_generator(seed)
    width = 16 * draw_int(g, 2, 5)
    seq = draw_int(g, 20, 90)
    seq += seq == 2 * width  # the coincidence is the second case's, not this one's
    cases = [(1, 2, seq, 32), (draw_int(g, 1, 3), 2, 2 * width, width)]  # (B, H, S, W); 4W = H·S in the second
    names = [n for n in ("naive", "inplace", "sdpa_math", "sdpa_flash") if n in blocks.pluggable("cpu")]
    with tempfile.TemporaryDirectory() as scratch:
        for batch, heads, s, w in cases:
            for name in names:
                trace = _traced_block(name, batch, heads, s, w, trace_dir or scratch)
                q_shape, size = (batch, heads, s, w // heads), batch * heads * s * s * 4
                inside, ranges = _in_attention(trace)
                want = int((inside["bytes"] == size).sum()) // max(ranges, 1)
                got = run_learner(scores_buffers, trace, q_shape, 4, what=f"scores_buffers(trace, {q_shape}, 4)")
                if is_blank(got) or isinstance(got, bool) or not isinstance(got, numbers.Integral):
                    fail(f"scores_buffers returned {got!r}; return a count (an int).")
                got = int(got)
                if got == want:
                    continue
                case = f"[{name}, B={batch}, H={heads}, S={s}, W={w}]"
                near = {"frees": int((inside["bytes"].abs() == size).sum()),
                        "whole": int((trace.memory["bytes"] == size).sum()),
                        "every size": int((inside["bytes"] > 0).sum()),
                        "per head": int((inside["bytes"] == s * s * 4).sum())}
                if got == near["frees"] != want:
                    fail(f"{case} you counted the frees too: a [memory] event with negative bytes gives a buffer "
                         "back; count the allocations (bytes > 0).")
                if got == near["whole"] != want:
                    fail(f"{case} you counted buffers of that size outside block.attention: at this shape the MLP's "
                         "[B, S, 4W] buffers hold as many bytes as the scores. Keep the events inside the "
                         "block.attention range.")
                if got == near["every size"] != want:
                    fail(f"{case} you counted allocations of every size inside block.attention; keep those of "
                         "one S×S buffer for all heads (B·H·S·S elements).")
                if got == near["per head"] != want:
                    fail(f"{case} that counts buffers of one head's S×S; the scores of all heads are one buffer, "
                         "B·H·S·S elements.")
                fail(f"{case} that is too {'many' if got > want else 'few'}: look again at which [memory] events "
                     "lie inside the block.attention range, and at their size.")
    return passed(f"scores_buffers finds the S×S allocations inside block.attention in fresh traces of "
                  f"{', '.join(names)}, one shape where the MLP's buffers are as large")


# ============================================================================ the forward (from the
# exercise's first version; kept for the tests of kernels.attention.block that call it)

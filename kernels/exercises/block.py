"""Checks for the exercises of chapter 8 (one transformer block).

The contract of ``kernels.exercises.judge``: fresh cases (the seed is printed, so a failure can be
replayed with ``seed=``), a judge computed here, one ``✔`` line or an ``ExerciseFailed`` that
says what is wrong in words.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.nn import functional as F

from kernels.attention import block as blocks
from kernels.exercises.judge import Passed, as_number, draw_int, fail, is_blank, matches, passed, require_tensor, run_learner, seeded_generator

__all__ = ["check_block_flops", "check_crossover", "check_block_forward"]

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


# ============================================================================ task 3: the forward

def _variants(blk, x):
    """What the usual mistakes in a pre-norm block's forward return (message, output)."""
    b, s, w = x.shape
    h, d = blk.heads, w // blk.heads

    def run(pre=True, res1=True, res2=True, gelu=True, split="bshd"):
        y = blk.norm1(x) if pre else x
        q, k, v = blk.qkv(y).split(w, dim=-1)
        if split == "bshd":
            q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in (q, k, v))
        else:  # heads taken as the fast axis: view(b, s, d, h)
            q, k, v = (t.view(b, s, d, h).permute(0, 3, 1, 2) for t in (q, k, v))
        a = blk.attend(q, k, v, causal=True).transpose(1, 2).reshape(b, s, w)
        x1 = (x if res1 else 0) + blk.proj(a)
        if not pre:
            x1 = blk.norm1(x1)
        y2 = blk.norm2(x1) if pre else x1
        m = blk.fc_out(F.gelu(blk.fc_in(y2)) if gelu else blk.fc_in(y2))
        out = (x1 if res2 else 0) + m
        return out if pre else blk.norm2(out)

    return [("this is a post-norm block (norm after each residual add); the course's block is pre-norm: "
             "x + proj(attention(norm1(x))), then x + mlp(norm2(x)).", run(pre=False)),
            ("the first residual is missing: add the attention's projection to x, do not replace x.", run(res1=False)),
            ("the second residual is missing: x + mlp(norm2(x)).", run(res2=False)),
            ("the GELU between fc_in and fc_out is missing.", run(gelu=False)),
            ("the heads are split the wrong way: view the last dim as [heads, head_dim] (view(b, s, h, d)), "
             "then move heads before seq.", run(split="bsdh"))]


def check_block_forward(block_forward: Callable, seed: Optional[int] = None) -> Passed:
    """``block_forward(block, x)`` must compute the block's forward from its parts."""
    g = seeded_generator(seed)
    torch.manual_seed(draw_int(g, 0, 2**31 - 1))  # the blocks' weights, from the printed seed too
    for width, heads, seq in ((48, 3, draw_int(g, 5, 30)), (64, 4, 17)):
        blk = blocks.Block(width, heads, "naive", labels=False).eval()
        x = torch.randn(2, seq, width, generator=g)
        with torch.no_grad():
            want = blk(x)
            got = run_learner(block_forward, blk, x, what="block_forward(block, x)")
        case = f"[B=2, S={seq}, W={width}, H={heads}]"
        require_tensor(got, "block_forward", x.shape)  # a block keeps x's shape
        if matches(got, want):
            continue
        with torch.no_grad():
            for words, out in _variants(blk, x):
                if matches(got, out):
                    fail(f"{case} {words}")
        err = float((got - want).abs().max())
        fail(f"{case} the output differs from block(x) by up to {err:.2e}, and not in a way the check "
              "recognizes: compare your steps one by one with Block.forward.")
    return passed("block_forward computes the pre-norm block's forward from its parts")

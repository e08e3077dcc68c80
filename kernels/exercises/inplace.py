"""Checks for the exercises of chapter 2, in-place attention: mask in place, then allocate less.

``check_inplace_mask`` runs your ``my_mask_(scores, future)`` and checks it wrote -inf into
``scores`` itself; ``check_lean_attention`` profiles your attention and checks it allocates
less. Both judge the attention with the float64 judge the exercises share (``kernels.exercises.judge``).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from kernels.attention.naive import grouped_future_mask
from kernels.exercises.judge import Passed, fail, matches, mistake_matched, passed, check_seed, profile_step, require_tensor, run_learner, top_level_ancestor
from kernels.exercises.judge import attention_cases, judge_attention

__all__ = ["check_inplace_mask", "check_lean_attention"]


def check_inplace_mask(my_mask_: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``my_mask_(scores, future)`` must write -inf where ``future`` is True, into ``scores`` itself."""
    g = torch.Generator().manual_seed(check_seed(seed))
    s = 19
    original = torch.randn(2, 3, s, s, generator=g).to(device)  # [B, H, S, S] scores
    scores = original.clone()
    future = grouped_future_mask(s, device)
    ptr = scores.data_ptr()
    out = run_learner(my_mask_, scores, future, what="my_mask_(scores, future)")
    want = original.masked_fill(future, -math.inf)
    changed = not torch.equal(scores, original)
    if out is None and changed:
        fail("scores were filled in place, but my_mask_ returned None: return the filled tensor "
              "(PyTorch's in-place methods return the tensor they were called on).")
    require_tensor(out, "my_mask_", original.shape, original.dtype, original.device)
    if out.data_ptr() != ptr or not changed:
        if matches(out, want):
            fail("not in place: the result is right, but it is a new tensor and `scores` was left as it "
                  "was. That is what an out-of-place op does (a clone, then a fill); its in-place twin "
                  "writes into the tensor it is called on.")
        fail("not in place: `scores` was left unchanged and a different tensor came back.")
    mistakes = [
        ("the mask is off by one: it hides the diagonal too. A query may see itself.",
         original.masked_fill(torch.ones_like(future).triu(0), -math.inf), None),
        ("the mask points the wrong way: it hides the past (keys before the query) instead of the future.",
         original.masked_fill(future.T, -math.inf), None),
        ("the hidden scores are 0, not -inf: after the softmax, exp(0) = 1 gives the future weight.",
         original.masked_fill(future, 0.0), None),
        ("the mask was not applied: the scores came back unchanged.", original, None),
    ]
    if not matches(scores, want):
        known = mistake_matched(scores, mistakes)
        hidden = scores[..., future]
        if not known and torch.isfinite(hidden).all() and (hidden < -1e3).all():
            known = ("the hidden scores are a large negative number, not -inf. It happens to work here, "
                     "but a fixed number breaks when dtype or score range change (-1e9 is -inf in "
                     "float16 anyway). Use float('-inf').")
        fail(known or "the scores are not masked as expected: -inf exactly where `future` is True, "
                       "untouched elsewhere.")
    return passed("my_mask_ fills -inf into the scores tensor itself: same storage, no copy")


def check_lean_attention(lean_attention: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """Causal attention, right, that allocates at most one S×S buffer's worth of memory per call."""
    seed = check_seed(seed)
    for case, (q, k, v), causal, scale in attention_cases(device, seed):
        if not causal or scale is not None:
            continue
        out = run_learner(lean_attention, q, k, v, what="lean_attention(q, k, v)")
        judge_attention(out, q, k, v, True, None, case, "lean_attention")
    # Large enough that the S×S buffers dwarf everything else the call allocates.
    b, h, s, d = 1, 4, 256, 32
    g = torch.Generator().manual_seed(seed + 1)
    q, k, v = torch.randn(3, b, h, s, d, generator=g).to(device).unbind(0)
    step = profile_step(lean_attention, q, k, v, label="lean")
    buffer = b * h * s * s * 4
    total = step.allocated_bytes
    budget = 1.5 * buffer  # one S×S float buffer, plus slack for the mask and row statistics
    if total > budget:
        ops = step.ops
        big = ops[ops["self_alloc_bytes"] >= buffer // 2]
        culprits = sorted({top_level_ancestor(step, int(i)) for i in big.index})
        fail(f"right values, but one call allocated {total / buffer:.1f} S×S buffers in total "
              f"({total / 2**20:.1f} MiB; one buffer is {buffer / 2**20:.1f} MiB at B={b}, H={h}, S={s}). "
              f"The top-level ops that allocated a large buffer: {', '.join(culprits)}. Each out-of-place "
              "op (x * s, masked_fill, softmax) makes a new one: make every step after the first matmul "
              "write into the buffer that matmul made.")
    return passed(f"lean_attention is right and allocated {total / buffer:.2f} S×S buffers per call "
                   f"(naive attention allocates 4)")

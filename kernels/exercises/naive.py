"""Checks for the exercises of chapter 1, naive attention: write it, then find its hidden copy.

``check_attention`` judges your attention against the float64 reference on fresh
inputs and names the known mistakes; ``check_hidden_copy`` checks that your
``find_hidden_copy(step, min_bytes)`` names the top-level op that made the largest copy in a
profiler step. The attention judge here also judges the attention of chapters 2 and 3.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from kernels.registry import get
from kernels import reference
from kernels.exercises.judge import FP32_TOL, Passed, fail, matches, mistake_matched, not_finite, passed, printed_seed, profile_step, require_tensor, run_learner, top_level_ancestor

__all__ = ["check_attention", "check_hidden_copy"]


def attention64(q, k, v, causal=True, scale=None, diagonal=1, hide="future", fill=-math.inf,
                 dim=-1, keep_mask=None, add_mask=None, cap=None):
    """Attention in float64, with the knobs that reproduce the usual mistakes (and ``cap``, the
    soft-capping cap · tanh(score / cap) of chapter 7's score_mod)."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale  # [B, H, Sq, D] @ [B, H, D, Sk] -> [B, H, Sq, Sk]
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    n_q, n_k = s.shape[-2:]
    if causal:
        ones = torch.ones(n_q, n_k, dtype=torch.bool)
        hidden = ones.triu(diagonal) if hide == "future" else ones.tril(-diagonal)
        s = s.masked_fill(hidden, fill)
    if keep_mask is not None:
        s = s.masked_fill(~keep_mask.cpu(), -math.inf)
    if add_mask is not None:
        s = s + add_mask.cpu().to(torch.float64)
    return s.softmax(dim=dim) @ v


def attention_mistakes(q, k, v, causal, scale):
    """(message, what that mistake returns, rows to compare or None) for each known mistake."""
    d = q.shape[-1]
    a = lambda **kw: attention64(q, k, v, **{"causal": causal, "scale": scale, **kw})  # noqa: E731
    default = 1.0 / math.sqrt(d)
    m = []
    if scale is not None:
        m.append(("you ignored the `scale` argument: when it is given, use it instead of 1/sqrt(head_dim).",
                  a(scale=default), None))
    else:
        m += [("the scale is missing: multiply the scores q·kᵀ by 1/sqrt(head_dim) before the softmax.",
               a(scale=1.0), None),
              ("the scale is upside down: you multiplied by sqrt(head_dim); divide by it instead.",
               a(scale=math.sqrt(d)), None),
              ("the scale is 1/head_dim; it should be 1/sqrt(head_dim).", a(scale=1.0 / d), None)]
    if causal:
        m += [("the causal mask is off by one: it hides the diagonal too, so query 0 sees no key at all "
               "(its row is NaN). A query may look at its own position: hide only keys j > i (triu(1)).",
               a(diagonal=0), None),
              ("the causal mask is off by one: each query also sees the next key. Hide every key j > i "
               "(triu(diagonal=1)).", a(diagonal=2), None),
              ("the mask points the wrong way: it hides the past instead of the future. Hide keys j > i "
               "(the upper triangle, triu(1)).", a(hide="past"), None),
              ("the causal mask is missing: with causal=True, hide every key after the query.",
               a(causal=False), None),
              ("the masked scores are set to 0 instead of -inf: exp(0) = 1, so the future still gets "
               "weight. Fill with float('-inf').", a(fill=0.0), None)]
    else:
        m.append(("you applied the causal mask although causal=False: mask only when asked.",
                  a(causal=True), None))
    m.append(("the softmax runs over the wrong dimension: normalize each query's row of scores, dim=-1 "
              "(over keys), not dim=-2.", a(dim=-2), None))
    return m


def attention_cases(device, seed: int):
    """Random inputs: odd sizes, a non-contiguous layout, both causal modes, a given scale."""
    g = torch.Generator().manual_seed(seed)

    def qkv(b, h, s, d, bshd=False):
        shape = (3, b, s, h, d) if bshd else (3, b, h, s, d)
        t = torch.randn(*shape, generator=g).to(device)
        # [B, S, H, D] -> a [B, H, S, D] view whose strides are not contiguous
        return tuple((x.transpose(1, 2) if bshd else x) for x in t.unbind(0))

    return [
        ("B=2, H=3, S=17, D=16, causal", qkv(2, 3, 17, 16), True, None),
        ("B=1, H=2, S=33, D=32, causal, non-contiguous [B,S,H,D] views", qkv(1, 2, 33, 32, bshd=True), True, None),
        ("B=1, H=2, S=9, D=8, causal=False", qkv(1, 2, 9, 8), False, None),
        ("B=1, H=1, S=12, D=16, causal, scale=0.3", qkv(1, 1, 12, 16), True, 0.3),
    ]


def judge_attention(out, q, k, v, causal, scale, case, what, mistakes=None):
    require_tensor(out, what, q.shape, q.dtype, q.device)
    ref = reference.attention(q, k, v, causal=causal, scale=scale)
    if matches(out, ref):
        return
    known = mistake_matched(out, mistakes if mistakes is not None else attention_mistakes(q, k, v, causal, scale))
    if known:
        fail(f"[{case}] {known}")
    bad = not_finite(out, what)
    if bad:
        fail(f"[{case}] {bad} Look for a row whose every score is -inf, or an overflow.")
    err = reference.max_rel_error(out, ref)
    fail(f"[{case}] values differ from the float64 reference (max relative error {err:.2e}, "
          f"tolerance {FP32_TOL:g}), and not in a way the check recognizes: print your output next "
          f"to reference.attention(q, k, v) on a small input (S=4) and compare row by row.")


def check_attention(my_attention: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``my_attention(q, k, v, causal=True, scale=None)`` against the float64 reference."""
    cases = attention_cases(device, printed_seed(seed))
    for case, (q, k, v), causal, scale in cases:
        out = run_learner(my_attention, q, k, v, causal=causal, scale=scale,
                   what="my_attention(q, k, v, causal, scale)")
        judge_attention(out, q, k, v, causal, scale, case, "my_attention")
    return passed(f"my_attention matches the float64 reference on {len(cases)} fresh cases "
                   "(odd lengths, a non-contiguous layout, causal on and off, a given scale)")


def _hidden_copy(step, min_bytes: int) -> Optional[str]:
    copies = step.copies(min_bytes=min_bytes)
    if copies.empty:
        return None
    return top_level_ancestor(step, int(copies["bytes"].idxmax()))


def _upcast_attention(q, k, v):
    """Attention whose scores are upcast to float64 before the softmax (a mixed-precision habit)."""
    scores = (q @ k.transpose(-2, -1)).to(torch.float64) * q.shape[-1] ** -0.5
    return (scores.softmax(-1).to(q.dtype)) @ v


def check_hidden_copy(find_hidden_copy: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``find_hidden_copy(step, min_bytes)`` names the top-level op that made the largest copy."""
    g = torch.Generator().manual_seed(printed_seed(seed))
    b, h, s, d = 1, 2, 96 + int(torch.randint(0, 32, (), generator=g)), 16
    q, k, v = torch.randn(3, b, h, s, d, generator=g).to(device).unbind(0)
    scores_bytes = b * h * s * s * 4  # one float32 S×S buffer
    subjects = [("naive attention", get("naive")), ("in-place attention", get("inplace")),
                ("attention with a float64 upcast", _upcast_attention)]
    for name, fn in subjects:
        step = profile_step(fn, q, k, v, label="subject")
        want = _hidden_copy(step, scores_bytes)
        got = run_learner(find_hidden_copy, step, scores_bytes, what="find_hidden_copy(step, min_bytes)")
        if got == want:
            continue
        if want is None:
            fail(f"on the trace of {name}, no copy moves {scores_bytes:,} bytes or more, so (as the task says) "
                  f"the answer is None; you said {got!r}. Filter copies by what they move "
                  f"(step.copies(min_bytes=...)), and return None when none is left.")
        if got is None:
            fail(f"you returned None, but the trace of {name} has a copy of at least {scores_bytes:,} "
                  "bytes (one S×S float32 buffer).")
        if got in ("aten::copy_", "aten::clone", "aten::_to_copy"):
            fail(f"{got} does the copying, but your code never called it: walk up the `parent` "
                  f"column to the op at depth 0, the line of your code that caused it.")
        small = step.copies(min_bytes=1)
        small = small[small["bytes"] < scores_bytes]
        if any(top_level_ancestor(step, int(i)) == got for i in small.index):
            fail(f"on the trace of {name}, you named {got}, which only made a small copy (a few bytes: "
                  f"the Python scalar turned into a tensor). Count copies by the bytes they move, not "
                  "by their name.")
        fail(f"on the trace of {name}, you said {got!r}, which is not the top-level op above the largest copy: "
             "take the copy that moves the most bytes, then walk up to depth 0.")
    return passed(f"find_hidden_copy names the op behind the S×S copy in all {len(subjects)} traces "
                   "(and names no op where there is none)")

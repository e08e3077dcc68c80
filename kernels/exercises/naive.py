"""Checks for the exercises of chapter 1, naive attention: write it, then find its hidden copy.

``check_attention`` judges your attention against the float64 reference on fresh
inputs and names the known mistakes; ``check_hidden_copy`` checks that your
``find_hidden_copy(step, min_bytes)`` names the top-level op that made the largest copy in a
profiler step. The attention judge here also judges the attention of chapters 2 and 3.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from kernels.registry import get
from kernels.exercises.judge import (ExerciseFailed, Passed, attention_cases, fail, judge_attention, passed, check_seed,
                                     profile_step, run_learner, top_level_ancestor)

__all__ = ["check_attention", "check_hidden_copy"]


def check_attention(my_attention: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``my_attention(q, k, v, causal=True, scale=None)`` against the float64 reference."""
    cases = attention_cases(device, check_seed(seed))
    for case, (q, k, v), causal, scale in cases:
        out = run_learner(my_attention, q, k, v, causal=causal, scale=scale,
                   what="my_attention(q, k, v, causal, scale)")
        judge_attention(out, q, k, v, causal, scale, case, "my_attention")
    return passed(f"{_checked_name(my_attention, 'my_attention')} matches the float64 reference on {len(cases)} "
                  "fresh cases (odd lengths, a non-contiguous layout, causal on and off, a given scale)")


def _checked_name(fn: Callable, task_name: str) -> str:
    """The name of the function a check passed, as its pass line says it: the course's solution
    is checked under its own name; a lambda or other unnamed callable under the task's."""
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else task_name


def _that_make(count: int, what: str) -> str:
    """"2 that make one", "1 that makes none": a count of traces and what they make, in agreement."""
    return f"{count} that make{'s' if count == 1 else ''} {what}"


def _hidden_copy(step, min_bytes: int) -> Optional[str]:
    copies = step.copies(min_bytes=min_bytes)
    if copies.empty:
        return None
    return top_level_ancestor(step, int(copies["bytes"].idxmax()))


def _raw_scores_attention(q, k, v):
    """Attention that masks a copy of its scores in place, keeping the raw scores for a look later
    (a debugging habit): its largest copy sits one level below the top, not two as in naive's."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    masked = scores.clone()
    future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
    masked.masked_fill_(future, float("-inf"))
    return masked.softmax(-1) @ v


def _answer_on(name: str, find_hidden_copy: Callable, step, min_bytes: int):
    """The learner's answer on one trace. An error names the trace: a walk up a fixed number of
    levels runs past the top on a trace whose copy sits higher, and only there."""
    try:
        return find_hidden_copy(step, min_bytes)
    except (NotImplementedError, ExerciseFailed):
        return run_learner(find_hidden_copy, step, min_bytes, what="find_hidden_copy(step, min_bytes)")
    except Exception as err:  # any bug in learner code is a finding, not a crash of the check
        fail(f"on the trace of {name}, find_hidden_copy(step, min_bytes) raised {type(err).__name__}: {err}. "
             "Does your walk stop at depth 0 whatever depth the copy sits at?")


def check_hidden_copy(find_hidden_copy: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``find_hidden_copy(step, min_bytes)`` names the top-level op that made the largest copy."""
    g = torch.Generator().manual_seed(check_seed(seed))
    b, h, s, d = 1, 2, 96 + int(torch.randint(0, 32, (), generator=g)), 16
    q, k, v = torch.randn(3, b, h, s, d, generator=g).to(device).unbind(0)
    scores_bytes = b * h * s * s * 4  # one float32 S×S buffer
    subjects = [("naive attention", get("naive")), ("in-place attention", get("inplace")),
                ("the unseen attention", _raw_scores_attention)]
    without_copy = 0
    for name, fn in subjects:
        step = profile_step(fn, q, k, v, label="subject")
        want = _hidden_copy(step, scores_bytes)
        got = _answer_on(name, find_hidden_copy, step, scores_bytes)
        if got == want:
            without_copy += want is None
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
    return passed(f"{_checked_name(find_hidden_copy, 'find_hidden_copy')} answers right on all {len(subjects)} "
                  f"traces: the top-level op behind the largest S×S copy in the "
                  f"{_that_make(len(subjects) - without_copy, 'one')}, and no op for the {_that_make(without_copy, 'none')}")

"""Checks for the exercises of chapter 0, the profiler primer: guess a trace, then read it.

Both checks profile the function and inputs you give them, so they draw nothing at random:
``check_top_level_guess`` compares your guess of the trace's top-level ops with what the
profiler recorded, ``check_hottest_op`` your answer with the op of most self time.
"""
from __future__ import annotations

from typing import Callable

from kernels.exercises.judge import Passed, fail, is_blank, passed, profile_step, profile_trace, run_learner

__all__ = ["check_top_level_guess", "check_hottest_op"]

_ONE_LEVEL_DOWN = ("aten::mm", "aten::bmm", "aten::addmm")  # what aten::matmul and aten::linear call


def check_top_level_guess(guess, fn: Callable, *args) -> Passed:
    """Your guess of the ops at the top level of ``fn(*args)``'s trace, then the trace."""
    if is_blank(guess):
        fail("write your guess first: a list of op names such as [\"aten::sin\", ...]. "
              "Guessing before looking is the habit; the trace is the answer key.")
    guess = list(guess)
    seen = profile_step(fn, *args, label="guess").top_level()["name"].tolist()
    if guess == seen:
        return passed(f"your guess matches the trace: {seen}")
    # What is wrong, in words that do not hand over the answer: the ops that are not at the top
    # level by name (they are the learner's own words), the rest by count only.
    if sorted(guess) == sorted(seen):
        fail("right ops, wrong order: read the function again in the order its operations run.")
    hint = []
    for name in (g for g in guess if g not in seen):
        hint.append(f"{name} is not at the top level"
                    + (" (it is one level down: the top level shows what your code called, and the "
                       "concrete kernel it dispatches to runs under it)" if name in _ONE_LEVEL_DOWN else ""))
    missing = sum(1 for s in seen if s not in guess)
    if missing:
        hint.append(f"{missing} op(s) of the top level are missing from your guess")
    fail(f"the trace's top level has {len(seen)} ops; you guessed {len(guess)}. " + "; ".join(hint)
         + ". Each tensor operation your code calls is one op at the top level.")


def _hottest_op(step) -> str:
    ops = step.ops
    return str(ops.loc[ops["self_us"].idxmax(), "name"])


def check_hottest_op(hottest_op: Callable, fn: Callable, *args) -> Passed:
    """``hottest_op(step)`` must name the op with the most *self* time in a profiled step."""
    run = profile_trace(fn, *args, label="hot", active=3)
    for step in run.steps():
        got = run_learner(hottest_op, step, what="hottest_op(step)")
        if is_blank(got):
            fail("hottest_op(step) returned nothing: return the name of an op, a string such as \"aten::relu\".")
        want = _hottest_op(step)
        if got == want:
            continue
        by_total = str(step.ops.loc[step.ops["dur_us"].idxmax(), "name"])
        if got == by_total:
            fail(f"you picked {got}, the op with the longest *total* time (dur_us). That time "
                  "includes its children, so a parent always wins. Self time (self_us) is the "
                  "time spent in the op itself: another op has more of it.")
        ops = step.ops
        mine = ops.loc[ops["name"] == got, "self_us"]
        said = (f"{got} spent {mine.max():.0f} µs in itself" if len(mine)
                else f"{got!r} is not an op of this step")
        fail(f"step {step.index}: {said}, and one op spent {ops['self_us'].max():.0f} µs in itself: "
             "return the name of that one.")
    return passed(f"hottest_op finds where the time went in all {len(run.steps())} steps "
                   f"({_hottest_op(run.steps()[0])})")

"""Checks for the exercises of chapter 9, the backward pass: what the forward keeps for the
backward, read from a trace, and a training step's FLOPs.

The contract of ``kernels.exercises.judge``: fresh cases (a failure names their seed, so it can be
replayed with ``seed=``), a judge computed here, one ``✔`` line or an ``ExerciseFailed`` that
says in words what is wrong.
"""
from __future__ import annotations

import tempfile
from typing import Callable, Optional

import torch

from kernels.trace import record
from kernels import reference
from kernels.attention.backward import backward_start
from kernels.registry import get
from kernels.exercises.judge import Passed, as_number, draw_int, fail, is_blank, passed, run_learner, seeded_generator

__all__ = ["check_kept_for_backward", "check_training_flops", "training_step_traces"]


# ============================================================================ task 1

def _kept(step, nbytes: int) -> int:
    """Buffers of exactly ``nbytes`` allocated before the backward began and not freed by then."""
    m = step.memory[step.memory["ts"] < backward_start(step)]
    return int((m["bytes"] == nbytes).sum() - (m["bytes"] == -nbytes).sum())


def training_step_traces(cases: dict, seed: int) -> dict:
    """One profiled training step (forward + backward) per ``{name: shape}``, all in one profiler
    session (each under its own ``record_function`` label): ``{name: Step}``."""
    from torch.profiler import record_function


    g = torch.Generator().manual_seed(seed)
    made = {}
    for name, shape in cases.items():
        q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
        made[name] = (get(name), q, k, v, torch.randn(shape, generator=g))

    def steps():
        for name, (attention, q, k, v, grad_out) in made.items():
            with torch.enable_grad(), record_function(f"{name}_train"):  # profile() turns grad off: no tensor args
                attention(q, k, v, causal=True).backward(grad_out)

    with tempfile.TemporaryDirectory() as folder:
        run = record.profile(steps, label="training_steps", wait=0, warmup=1, active=1, trace_dir=folder)
    return {name: run.trace.steps(f"{name}_train")[-1] for name in cases}


def check_kept_for_backward(kept_for_backward: Callable, seed: Optional[int] = None) -> Passed:
    """``kept_for_backward(step, nbytes)`` -> how many buffers of ``nbytes`` bytes the forward of a
    profiled training step left allocated for its backward."""
    g = seeded_generator(seed)
    asked = []
    shapes = {name: (1, draw_int(g, 1, 4), draw_int(g, 40, 97), (16, 32)[draw_int(g, 0, 2)]) for name in ("naive", "sdpa_math", "sdpa_flash")}
    traced = training_step_traces(shapes, draw_int(g, 0, 2**30))
    for name, shape in shapes.items():
        step = traced[name]
        b, h, s, _ = shape
        nbytes = b * h * s * s * 4
        got = run_learner(kept_for_backward, step, nbytes, what="kept_for_backward(step, nbytes)")
        if is_blank(got) or isinstance(got, bool) or not isinstance(got, int):
            fail(f"kept_for_backward returned {got!r}; return a count (an int).")
        want = _kept(step, nbytes)
        case = f"[{name}, shape {shape}, one S×S buffer = {nbytes} bytes]"
        asked.append(name)
        if got == want:
            continue
        m = step.memory
        t0 = backward_start(step)
        before = m[m["ts"] < t0]
        if got == int((before["bytes"] == nbytes).sum()):
            fail(f"{case} you counted every S×S allocation of the forward ({got}); some were freed before the "
                  "backward began (the raw scores, a clone): count what is still alive.")
        if got == int((m["bytes"] == nbytes).sum()) or got == int((m["bytes"] == nbytes).sum() - (m["bytes"] == -nbytes).sum()):
            fail(f"{case} you counted over the whole step, backward included. Stop where the backward begins: "
                  "what is alive then is what the forward kept.")
        if got == int((before["bytes"] > 0).sum() - (before["bytes"] < 0).sum()):
            fail(f"{case} you counted buffers of every size; count only those of exactly nbytes bytes.")
        fail(f"{case} you said {got}: that is not how many buffers of {nbytes} bytes are alive when the backward "
             "begins.")
    return passed(f"kept_for_backward reads what each forward keeps ({', '.join(asked)}) from fresh traces")


# ============================================================================ task 2

def check_training_flops(training_flops: Callable, seed: Optional[int] = None) -> Passed:
    """``training_flops(batch, heads, seq, head_dim, causal)`` -> FLOPs of one forward + backward."""
    g = seeded_generator(seed)
    cases = [(draw_int(g, 1, 5), draw_int(g, 1, 33), draw_int(g, 100, 8193), (64, 128)[draw_int(g, 0, 2)], causal) for causal in (True, False, True)]
    for b, h, s, d, causal in cases:
        got = as_number(run_learner(training_flops, b, h, s, d, causal, what="training_flops(...)"), "training_flops")
        want = reference.flops(b, h, s, d, causal=causal, backward=True)
        case = f"[B={b} H={h} S={s} D={d} causal={causal}]"
        if abs(got - want) <= 1e-9 * want:
            continue
        r = got / want
        words = {1 / 3.5: "that is the forward only: a training step adds the backward, 2.5x the forward, so 3.5x in all.",
                 2.5 / 3.5: "that is the backward only (2.5x the forward); the step is forward + backward = 3.5x.",
                 3.0 / 3.5: ("3x the forward is what a backward that reads saved probabilities does (four matmuls). "
                             "The convention (FlashAttention's benchmarks) counts the backward's five matmuls, with "
                             "QKᵀ recomputed: 2.5x, so 3.5x for the step."),
                 2.0: "causal attention computes half the scores: halve the FLOPs when causal.",
                 0.5: "each multiply-add is 2 FLOPs: the forward is 4·B·H·S²·D (halved when causal)."}
        for factor, message in words.items():
            if abs(r / factor - 1) < 1e-6 and not (factor == 2.0 and not causal):
                fail(f"{case} {message}")
        fail(f"{case} you said {got:.4g} FLOPs, too {'many' if r > 1 else 'few'} for one forward and backward.")
    return passed(f"training_flops counts forward + backward (3.5x the forward, causal halved) on {len(cases)} fresh shapes")

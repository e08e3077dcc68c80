"""Checks for the exercises of chapter 11, attention across devices: merging two partial
attentions by their log-sum-exp, and finding the slow rank in a folder of rank traces.

The contract of ``kernels.exercises.judge``: fresh cases (a failure names their seed, so it can be
replayed with ``seed=``), a judge computed here, one ``✔`` line or an ``ExerciseFailed`` that
says in words what is wrong.
"""
from __future__ import annotations

import gzip
import json
import math
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch

from kernels.exercises.judge import Passed, draw_int, fail, passed, require_tensor, run_learner, seeded_generator

__all__ = ["check_merge", "check_slow_rank", "write_rank_folder"]


# ============================================================================ task 1

def _partial(q, k, v, keys: torch.Tensor, scale: float, causal_rows=None):
    """float64 attention of q over the keys where ``keys`` is True, and its log-sum-exp; rows
    that see none of them get output 0 and lse -inf."""
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale               # [B, H, Sq, Sk]
    hidden = ~keys if causal_rows is None else ~keys | causal_rows
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                      # [B, H, Sq]
    weights = torch.where(torch.isfinite(lse)[..., None], torch.exp(scores - lse[..., None]), 0.0)
    return weights @ v.double(), lse


def check_merge(merge: Callable, seed: Optional[int] = None) -> Passed:
    """``merge(out_a, lse_a, out_b, lse_b) -> (out, lse)``: two partial attentions of the same
    queries over disjoint sets of keys, made one (out [..., S, D], lse [..., S])."""
    g = seeded_generator(seed)
    cases = 0
    for big_scores, causal in ((False, False), (True, False), (False, True)):
        b, h, s, d = draw_int(g, 1, 3), draw_int(g, 1, 4), draw_int(g, 5, 40), (8, 16, 24)[draw_int(g, 0, 3)]
        q, k, v = (torch.randn(b, h, s, d, generator=g, dtype=torch.float64) for _ in range(3))
        scale = 200.0 if big_scores else 1 / math.sqrt(d)  # scores in the thousands: exp() overflows unless shifted
        split = draw_int(g, 1, s)
        in_a = torch.zeros(s, dtype=torch.bool)
        in_a[:split] = True
        future = torch.ones(s, s, dtype=torch.bool).triu(1) if causal else None  # early queries see no key of b
        out_a, lse_a = _partial(q, k, v, in_a, scale, future)
        out_b, lse_b = _partial(q, k, v, ~in_a, scale, future)
        want, want_lse = _partial(q, k, v, torch.ones(s, dtype=torch.bool), scale, future)
        case = (f"[B={b}, H={h}, {s} queries, keys split at {split}{', causal: the first queries see no key of the second part' if causal else ''}"
                f"{', scores in the thousands' if big_scores else ''}]")
        got = run_learner(merge, out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone(), what="merge(out_a, lse_a, out_b, lse_b)")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{case} merge must return two tensors, (out, lse); it returned "
                  f"{type(got).__name__ if not isinstance(got, (tuple, list)) else f'{len(got)} values'}.")
        out, lse = got
        require_tensor(out, "merge's out", want.shape)
        require_tensor(lse, "merge's lse", want_lse.shape)
        out, lse = out.double(), lse.double()
        if not torch.isfinite(out).all():
            bad = "NaN" if torch.isnan(out).any() else "inf"
            if causal:
                fail(f"{case} the output has {bad}: where one part saw no key its lse is -inf, and exp(-inf - (-inf)) is "
                      "NaN. Weigh such a part by 0 (torch.where on torch.isfinite).")
            fail(f"{case} the output has {bad}: exp(lse) overflows when scores are large. Never exponentiate an lse "
                  "alone: exponentiate differences of logs.")
        if (out - want).abs().max() <= 1e-9 * max(1.0, want.abs().max().item()) and torch.allclose(lse, want_lse, atol=1e-9):
            cases += 1
            continue
        if torch.allclose(out, (out_a + out_b) / 2, atol=1e-9):
            fail(f"{case} you averaged the two outputs: each part must weigh by its share of the softmax "
                  "denominator, exp(lse_part - lse_total), not by one half.")
        if torch.allclose(lse, torch.maximum(lse_a, lse_b), atol=1e-9):
            fail(f"{case} the merged lse is the larger of the two: it is the log of the SUM of the two denominators.")
        if torch.allclose(out, want, atol=1e-9):
            fail(f"{case} the output is right but the lse is not: return the log of the whole denominator, so a "
                  "third part can be merged later.")
        fail(f"{case} the merged output is off by {(out - want).abs().max().item():.2e} (max abs) from attention over all "
              "the keys, and not in a way the check recognizes.")
    return passed(f"merge combines two partial attentions exactly on {cases} fresh cases (large scores, a part "
                   "that saw no key)")


# ============================================================================ task 2

def _event(name, cat, ts, dur, pid, tid, args=None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args or {}}


def write_rank_folder(folder, compute_ms: list[float], step_ms: float, steps: int = 2) -> Path:
    """A folder of synthetic rank traces, one per rank, shaped as torch.profiler writes them on
    gloo: per step a ``ProfilerStep#N`` with the rank's ``aten::mm`` compute (``compute_ms[r]``),
    then a ``gloo:recv`` in flight until the step's common end (the rank waits for the others)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    world = len(compute_ms)
    for rank, compute in enumerate(compute_ms):
        pid = tid = 1000 + rank
        events = []
        for n in range(steps):
            t0 = 1_000_000.0 + n * (step_ms + 1) * 1e3
            events.append(_event(f"ProfilerStep#{n + 1}", "user_annotation", t0, step_ms * 1e3, pid, tid))
            events.append(_event("aten::mm", "cpu_op", t0 + 10, compute * 1e3, pid, tid,
                                 {"Input Dims": [[512, 64], [64, 512]], "Input type": ["float", "float"]}))
            send_at = t0 + 20 + compute * 1e3
            events.append(_event("gloo:send", "user_annotation", send_at, 50.0, pid, tid,
                                 {"Input Dims": [[1024, 64]], "Input type": ["float"]}))
            events.append(_event("gloo:recv", "user_annotation", send_at, t0 + step_ms * 1e3 - 5 - send_at, pid, tid,
                                 {"Input Dims": [[1024, 64]], "Input type": ["float"]}))
        raw = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
               "traceEvents": events}
        with gzip.open(folder / f"worker-{(rank * 7919) % 1000:03d}.json.gz", "wt") as f:
            json.dump(raw, f)
    return folder


def check_slow_rank(slow_rank: Callable, seed: Optional[int] = None) -> Passed:
    """``slow_rank(folder) -> int``: the rank the others wait for in the folder's first profiler
    step (the one that computed longest), for folders of rank traces it has never seen."""
    g = seeded_generator(seed)
    folders = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, world in enumerate((2, draw_int(g, 3, 7), draw_int(g, 4, 9))):
            slow = draw_int(g, 0, world)
            compute = [float(draw_int(g, 5, 20)) for _ in range(world)]
            compute[slow] = max(compute) + float(draw_int(g, 10, 30))
            step_ms = compute[slow] + 5
            folder = write_rank_folder(Path(tmp) / f"job{i}", compute, step_ms)
            got = run_learner(slow_rank, str(folder), what="slow_rank(folder)")
            case = f"[{world} ranks, files named worker-NNN.json.gz]"
            if isinstance(got, bool) or not isinstance(got, int):
                fail(f"{case} slow_rank must return a rank (an int), got {got!r}.")
            if got == slow:
                folders += 1
                continue
            waits = [step_ms - c for c in compute]
            if got == max(range(world), key=lambda r: waits[r]):
                fail(f"{case} you returned rank {got}, the rank that waited longest: it is the fastest one, waiting "
                      "for the slow rank. The slow rank computed longest.")
            if got not in range(world):
                fail(f"{case} rank {got} is not in this job of {world} ranks; read the rank from each trace "
                      "(distributedInfo), not from the file's position or name.")
            files = sorted(p.name for p in folder.iterdir())
            file_of = {r: f"worker-{(r * 7919) % 1000:03d}.json.gz" for r in range(world)}
            if files.index(file_of[slow]) == got:
                fail(f"{case} you returned the slow rank's position in the sorted file list ({got}); file names need not "
                      "say the rank: read it from each trace's distributedInfo.")
            fail(f"{case} you returned rank {got}, which is not the rank that computed longest in the first step.")
    return passed(f"slow_rank finds the rank the others waited for in {folders} fresh trace folders")

"""Checks for the exercises of chapter 9 (the backward pass) and chapter 10 (decoding).

Same contract as ``kernels.exercises``: fresh cases (the seed is printed, so a failure can be
replayed with ``seed=``), a judge computed here, one ``✔`` line or an ``ExerciseFailed`` that
says in words what is wrong.
"""
from __future__ import annotations

import tempfile
from typing import Callable, Optional

import torch

from . import decoding, reference
from .exercises import ExerciseFailed, Passed, _blank, _fail, _passed, _run, _seed
from .registry import get

__all__ = ["ExerciseFailed", "check_kept_for_backward", "check_training_flops", "check_decode_step",
           "check_decode_intensity", "kept_reference", "training_step_traces"]

PREFIX = "autograd::engine"


def _number(got, what: str) -> float:
    if _blank(got) or isinstance(got, bool) or not isinstance(got, (int, float)):
        _fail(f"{what} returned {got!r}; return a number.")
    return float(got)


# ============================================================================ chapter 9, task 1

def backward_start(step) -> float:
    ops = step.ops
    return float(ops.loc[ops["name"].str.startswith(PREFIX), "ts"].min())


def kept_reference(step, nbytes: int) -> int:
    """Buffers of exactly ``nbytes`` allocated before the backward began and not freed by then."""
    m = step.memory[step.memory["ts"] < backward_start(step)]
    return int((m["bytes"] == nbytes).sum() - (m["bytes"] == -nbytes).sum())


def training_step_traces(cases: dict, seed: int) -> dict:
    """One profiled training step (forward + backward) per ``{name: shape}``, all in one profiler
    session (each under its own ``record_function`` label): ``{name: Step}``."""
    from torch.profiler import record_function

    from . import profiling

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
        run = profiling.profile(steps, label="training_steps", wait=0, warmup=1, active=1, trace_dir=folder)
    return {name: run.trace.steps(f"{name}_train")[-1] for name in cases}


def check_kept_for_backward(kept_for_backward: Callable, seed: Optional[int] = None) -> Passed:
    """``kept_for_backward(step, nbytes)`` -> how many buffers of ``nbytes`` bytes the forward of a
    profiled training step left allocated for its backward."""
    g = torch.Generator().manual_seed(_seed(seed))
    pick = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))  # noqa: E731
    asked = []
    shapes = {name: (1, pick(1, 4), pick(40, 97), (16, 32)[pick(0, 2)]) for name in ("naive", "sdpa_math", "sdpa_flash")}
    traced = training_step_traces(shapes, pick(0, 2**30))
    for name, shape in shapes.items():
        step = traced[name]
        b, h, s, _ = shape
        nbytes = b * h * s * s * 4
        got = _run(kept_for_backward, step, nbytes, what="kept_for_backward(step, nbytes)")
        if _blank(got) or isinstance(got, bool) or not isinstance(got, int):
            _fail(f"kept_for_backward returned {got!r}; return a count (an int).")
        want = kept_reference(step, nbytes)
        case = f"[{name}, shape {shape}, one S×S buffer = {nbytes} bytes]"
        asked.append(name)
        if got == want:
            continue
        m = step.memory
        t0 = backward_start(step)
        before = m[m["ts"] < t0]
        if got == int((before["bytes"] == nbytes).sum()):
            _fail(f"{case} you counted every S×S allocation of the forward ({got}); some were freed before the "
                  f"backward began (the raw scores, a clone). Subtract the frees (events with bytes == -nbytes): "
                  f"{want} are still alive.")
        if got == int((m["bytes"] == nbytes).sum()) or got == int((m["bytes"] == nbytes).sum() - (m["bytes"] == -nbytes).sum()):
            _fail(f"{case} you counted over the whole step, backward included. Stop at the backward's first op "
                  "(the first op whose name starts with 'autograd::engine'): what is alive then is what the "
                  f"forward kept, {want} here.")
        if got == int((before["bytes"] > 0).sum() - (before["bytes"] < 0).sum()):
            _fail(f"{case} you counted buffers of every size; count only those of exactly nbytes bytes.")
        _fail(f"{case} the forward left {want} buffer(s) of {nbytes} bytes for the backward; you said {got}.")
    return _passed(f"kept_for_backward reads what each forward keeps ({', '.join(asked)}) from fresh traces")


# ============================================================================ chapter 9, task 2

def check_training_flops(training_flops: Callable, seed: Optional[int] = None) -> Passed:
    """``training_flops(batch, heads, seq, head_dim, causal)`` -> FLOPs of one forward + backward."""
    g = torch.Generator().manual_seed(_seed(seed))
    pick = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))  # noqa: E731
    cases = [(pick(1, 5), pick(1, 33), pick(100, 8193), (64, 128)[pick(0, 2)], causal) for causal in (True, False, True)]
    for b, h, s, d, causal in cases:
        got = _number(_run(training_flops, b, h, s, d, causal, what="training_flops(...)"), "training_flops")
        want = reference.flops(b, h, s, d, causal=causal, backward=True)
        case = f"[B={b} H={h} S={s} D={d} causal={causal}]"
        if abs(got - want) <= 1e-9 * want:
            continue
        r = got / want
        forward = reference.flops(b, h, s, d, causal=causal)
        words = {1 / 3.5: "that is the forward only: a training step adds the backward, 2.5x the forward, so 3.5x in all.",
                 2.5 / 3.5: "that is the backward only (2.5x the forward); the step is forward + backward = 3.5x.",
                 3.0 / 3.5: ("3x the forward is what a backward that reads saved probabilities does (four matmuls). "
                             "The convention (FlashAttention's benchmarks) counts the backward's five matmuls, with "
                             "QKᵀ recomputed: 2.5x, so 3.5x for the step."),
                 2.0: "causal attention computes half the scores: halve the FLOPs when causal.",
                 0.5: "each multiply-add is 2 FLOPs: the forward is 4·B·H·S²·D (halved when causal), you are 2x low."}
        for factor, message in words.items():
            if abs(r / factor - 1) < 1e-6 and not (factor == 2.0 and not causal):
                _fail(f"{case} {message}")
        _fail(f"{case} the step does {want:.4g} FLOPs (forward {forward:.4g} × 3.5); you said {got:.4g} ({r:.3g}x).")
    return _passed(f"training_flops counts forward + backward (3.5x the forward, causal halved) on {len(cases)} fresh shapes")


# ============================================================================ chapter 10, task 1

def _top_left(q, k, v):
    """What SDPA's is_causal=True gives a single query: only key 0."""
    group = q.shape[1] // k.shape[1]
    return v[:, :, :1].repeat_interleave(group, dim=1).expand(q.shape).to(torch.float64)


def check_decode_step(decode_step: Callable, seed: Optional[int] = None) -> Passed:
    """``decode_step(cache, q, k_new, v_new)``: append one token to a ``KVCache`` and return the
    new query's attention over every cached token, [B, H, 1, D]."""
    g = torch.Generator().manual_seed(_seed(seed))
    pick = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))  # noqa: E731
    steps = 0
    for hq, hkv in ((4, 4), (pick(2, 4) * 2, 2)):
        b, d, prompt, extra = pick(1, 3), (16, 32)[pick(0, 2)], pick(5, 40), 3
        cache = decoding.KVCache(b, hkv, prompt + extra + 4, d)
        k_all, v_all = (torch.randn(b, hkv, prompt + extra, d, generator=g) for _ in range(2))
        cache.append(k_all[:, :, :prompt], v_all[:, :, :prompt])
        for t in range(prompt, prompt + extra):
            q = torch.randn(b, hq, 1, d, generator=g)
            k_new, v_new = k_all[:, :, t:t + 1], v_all[:, :, t:t + 1]
            before = cache.length
            case = f"[B={b}, {hq} query heads, {hkv} K/V heads, D={d}, {before} tokens cached before this step]"
            out = _run(decode_step, cache, q, k_new, v_new, what="decode_step(cache, q, k_new, v_new)")
            steps += 1
            if out is None:
                _fail("decode_step returned None: return the attention output, shape [B, H, 1, D].")
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
                _fail(f"{case} decode_step must return a tensor of q's shape {tuple(q.shape)}, got "
                      f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}.")
            if cache.length == before:
                _fail(f"{case} the cache still holds {before} tokens: append the new token's k and v "
                      "(cache.append) before attending.")
            if cache.length != before + 1:
                _fail(f"{case} the cache went from {before} to {cache.length} tokens: append the new token once.")
            if not torch.equal(cache.keys()[:, :, -1:], k_new):
                _fail(f"{case} the last cached key is not the new token's k: append k_new and v_new, in that order.")
            want = reference.attention(q, k_all[:, :, :t + 1], v_all[:, :, :t + 1], causal=True)
            if reference.max_rel_error(out, want) <= 1e-4:
                continue
            mistakes = [
                ("you attended to the cache as it was before this token: append first, so the new query sees "
                 "its own key too", reference.attention(q, k_all[:, :, :t], v_all[:, :, :t], causal=True)),
                ("you attended to the whole buffer (cache.k / cache.v), zeros of the empty slots included; use "
                 "the filled part, cache.keys() and cache.values()", reference.attention(q, cache.k, cache.v, causal=True)),
                ("F.scaled_dot_product_attention(..., is_causal=True) aligns its mask top-left, so a single query "
                 "sees key 0 only. One query needs no mask (it may see every cached key): pass is_causal=False, or "
                 "use kernels.get(name)(q, k, v, causal=True), which aligns bottom-right",
                 _top_left(q, k_all[:, :, :t + 1], v_all[:, :, :t + 1])),
            ]
            for words, wrong in mistakes:
                if reference.max_rel_error(out, wrong) <= 1e-4:
                    _fail(f"{case} {words}.")
            _fail(f"{case} the output differs from attention over the {t + 1} cached tokens by "
                  f"{reference.max_rel_error(out, want):.2e} (relative), and not in a way the check recognizes.")
    return _passed(f"decode_step appends and attends right on {steps} fresh steps, GQA included")


# ============================================================================ chapter 10, task 2

ELEMENT_DTYPES = {2: torch.bfloat16, 4: torch.float32}


def check_decode_intensity(decode_intensity: Callable, seed: Optional[int] = None) -> Passed:
    """``decode_intensity(heads, kv_heads, cache_len, head_dim, bytes_per_element)`` -> FLOP per byte
    of one decode step (batch 1, one query, a fused kernel reading q, K, V once and writing o)."""
    g = torch.Generator().manual_seed(_seed(seed))
    pick = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))  # noqa: E731
    cases = [(32, 8, pick(500, 9000), 128, 2), (16, 16, pick(100, 3000), 64, 4), (8 * pick(1, 5), 1, pick(64, 4096), 64, 2)]
    for hq, hkv, sk, d, elem in cases:
        dtype = ELEMENT_DTYPES[elem]
        got = _number(_run(decode_intensity, hq, hkv, sk, d, elem, what="decode_intensity(...)"), "decode_intensity")
        want = decoding.intensity(1, hq, 1, sk, d, hkv, dtype)
        case = f"[{hq} query heads, {hkv} K/V heads, {sk} cached tokens, D={d}, {elem} bytes per element]"
        if abs(got - want) <= 1e-9 * want:
            continue
        flops = decoding.step_flops(1, hq, 1, sk, d)
        alternatives = {
            "K and V are shared by each group of query heads: the cache has kv_heads heads, read once each, "
            "not one per query head": flops / decoding.step_bytes(1, hq, 1, sk, d, hq, dtype),
            "a decode step's single query sees every cached key (bottom-right causal): no causal half":
                flops / 2 / decoding.step_bytes(1, hq, 1, sk, d, hkv, dtype),
            "the step also reads q and writes o (2·H·D elements); you counted the cache only":
                flops / (2 * hkv * sk * d * elem),
            "divide by bytes, not elements: multiply the element count by bytes_per_element":
                flops / (decoding.step_bytes(1, hq, 1, sk, d, hkv, dtype) / elem),
            "the cache holds two tensors, K and V: count both": flops / ((2 * hq * d + hkv * sk * d) * elem),
        }
        for words, value in alternatives.items():
            if abs(got - value) <= 1e-6 * value and abs(value - want) > 1e-9 * want:
                _fail(f"{case} {words}.")
        _fail(f"{case} the step does {flops:.4g} FLOPs over {decoding.step_bytes(1, hq, 1, sk, d, hkv, dtype):.4g} "
              f"bytes: {want:.4g} FLOP/byte; you said {got:.4g}.")
    return _passed(f"decode_intensity counts FLOPs over bytes moved on {len(cases)} fresh configurations (MHA, GQA, MQA)")


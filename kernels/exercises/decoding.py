"""Checks for the exercises of chapter 10, decoding: decoding one token against a KV cache, and the
arithmetic intensity of that call.

The contract of ``kernels.exercises.judge``: fresh cases (a failure names their seed, so it can be
replayed with ``seed=``), a judge computed here, one ``✔`` line or an ``ExerciseFailed`` that
says in words what is wrong.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from kernels import reference
from kernels.attention import decoding
from kernels.exercises.judge import Passed, as_number, draw_int, fail, matches, mistake_matched, passed, require_tensor, run_learner, seeded_generator

__all__ = ["check_decode_token", "check_decode_intensity"]


# ============================================================================ task 1

def _top_left(q, k, v):
    """What SDPA's is_causal=True gives a single query: only key 0."""
    group = q.shape[1] // k.shape[1]
    # v [B, Hkv, Sk, D] -> key 0's value [B, Hkv, 1, D] -> one per query head [B, Hq, 1, D]
    return v[:, :, :1].repeat_interleave(group, dim=1).expand(q.shape).to(torch.float64)


def check_decode_token(decode_token: Callable, seed: Optional[int] = None) -> Passed:
    """``decode_token(cache, q, k_new, v_new)``: append one token to a ``KVCache`` and return the
    new query's attention over every cached token, [B, H, 1, D]."""
    g = seeded_generator(seed)
    tokens = 0
    for hq, hkv in ((4, 4), (draw_int(g, 2, 4) * 2, 2)):
        b, d, prompt, extra = draw_int(g, 1, 3), (16, 32)[draw_int(g, 0, 2)], draw_int(g, 5, 40), 3
        cache = decoding.KVCache(b, hkv, prompt + extra + 4, d)
        k_all, v_all = (torch.randn(b, hkv, prompt + extra, d, generator=g) for _ in range(2))
        cache.append(k_all[:, :, :prompt], v_all[:, :, :prompt])
        for t in range(prompt, prompt + extra):
            q = torch.randn(b, hq, 1, d, generator=g)
            k_new, v_new = k_all[:, :, t:t + 1], v_all[:, :, t:t + 1]
            before = cache.length
            case = f"[B={b}, {hq} query heads, {hkv} K/V heads, D={d}, {before} tokens cached before this token]"
            out = run_learner(decode_token, cache, q, k_new, v_new, what="decode_token(cache, q, k_new, v_new)")
            tokens += 1
            require_tensor(out, "decode_token", q.shape)
            if cache.length == before:
                fail(f"{case} the cache still holds {before} tokens: append the new token's k and v "
                      "(cache.append) before attending.")
            if cache.length != before + 1:
                fail(f"{case} the cache went from {before} to {cache.length} tokens: append the new token once.")
            if not torch.equal(cache.keys()[:, :, -1:], k_new):
                fail(f"{case} the last cached key is not the new token's k: append k_new and v_new, in that order.")
            want = reference.attention(q, k_all[:, :, :t + 1], v_all[:, :, :t + 1], causal=True)
            if matches(out, want):
                continue
            known = mistake_matched(out, [
                ("you attended to the cache as it was before this token: append first, so the new query sees "
                 "its own key too", reference.attention(q, k_all[:, :, :t], v_all[:, :, :t], causal=True), None),
                ("you attended to the whole buffer (cache.k / cache.v), zeros of the empty slots included; use "
                 "the filled part, cache.keys() and cache.values()", reference.attention(q, cache.k, cache.v, causal=True), None),
                ("F.scaled_dot_product_attention(..., is_causal=True) aligns its mask top-left, so a single query "
                 "sees key 0 only. One query needs no mask (it may see every cached key): pass is_causal=False, or "
                 "use kernels.get(name)(q, k, v, causal=True), which aligns bottom-right",
                 _top_left(q, k_all[:, :, :t + 1], v_all[:, :, :t + 1]), None),
            ])
            if known:
                fail(f"{case} {known}.")
            fail(f"{case} the output differs from attention over the {t + 1} cached tokens by "
                  f"{reference.max_rel_error(out, want):.2e} (relative), and not in a way the check recognizes.")
    return passed(f"decode_token appends and attends right on {tokens} fresh tokens, GQA included")


# ============================================================================ task 2

_ELEMENT_DTYPES = {2: torch.bfloat16, 4: torch.float32}


def check_decode_intensity(decode_intensity: Callable, seed: Optional[int] = None) -> Passed:
    """``decode_intensity(heads, kv_heads, cache_len, head_dim, bytes_per_element)`` -> FLOP per byte
    of decoding one token (batch 1, one query, a fused kernel reading q, K, V once and writing o)."""
    g = seeded_generator(seed)
    cases = [(32, 8, draw_int(g, 500, 9000), 128, 2), (16, 16, draw_int(g, 100, 3000), 64, 4), (8 * draw_int(g, 1, 5), 1, draw_int(g, 64, 4096), 64, 2)]
    for hq, hkv, sk, d, elem in cases:
        dtype = _ELEMENT_DTYPES[elem]
        got = as_number(run_learner(decode_intensity, hq, hkv, sk, d, elem, what="decode_intensity(...)"), "decode_intensity")
        want = decoding.intensity(1, hq, 1, sk, d, hkv, dtype)
        case = f"[{hq} query heads, {hkv} K/V heads, {sk} cached tokens, D={d}, {elem} bytes per element]"
        if abs(got - want) <= 1e-9 * want:
            continue
        flops = decoding.call_flops(1, hq, 1, sk, d)
        alternatives = {
            "K and V are shared by each group of query heads: the cache has kv_heads heads, read once each, "
            "not one per query head": flops / decoding.call_bytes(1, hq, 1, sk, d, hq, dtype),
            "one token's single query sees every cached key (bottom-right causal): no causal half":
                flops / 2 / decoding.call_bytes(1, hq, 1, sk, d, hkv, dtype),
            "the call also reads q and writes o (2·H·D elements); you counted the cache only":
                flops / (2 * hkv * sk * d * elem),
            "divide by bytes, not elements: multiply the element count by bytes_per_element":
                flops / (decoding.call_bytes(1, hq, 1, sk, d, hkv, dtype) / elem),
            "the cache holds two tensors, K and V: count both": flops / ((2 * hq * d + hkv * sk * d) * elem),
        }
        for words, value in alternatives.items():
            if abs(got - value) <= 1e-6 * value and abs(value - want) > 1e-9 * want:
                fail(f"{case} {words}.")
        fail(f"{case} {got:.4g} FLOP/byte is not what a fused kernel does for one decode token, and not a mistake "
             "the check recognizes: count the FLOPs of the two matrix products, the bytes it reads and writes once "
             "each, and divide.")
    return passed(f"decode_intensity counts FLOPs over bytes moved on {len(cases)} fresh configurations (MHA, GQA, MQA)")

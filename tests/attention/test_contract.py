"""The implementation contract (kernels/registry.py's docstring): every implementation that runs
here, against the float64 reference, on one grid.

q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D]; Hq a multiple of Hkv; causal aligned bottom-right;
head dims 1..256; any layout. Every output (and gradient) is judged by ``reference.judge``:
fp32 within 1e-5 of the float64 reference, 16-bit by FlashAttention's rule. Each grid is a
covering set of rows, not the product: odd lengths with Sq != Sk both ways, a single row,
every peer head dim, GQA ratios 1, 2 and 8, both causal modes, every layout (non-contiguous
views too), forward and backward. Implementations flagged ``slow_on_cpu`` take smaller rows:
Triton's interpreter (keep S <= ~256), torch.compile (a compile, seconds, per new shape).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
from kernels import reference
from tests.helpers import LAYOUTS, covering, make_attention_inputs

CPU_NAMES = [n for n, why in kernels.available("cpu").items() if why is None]
FAST_CPU = [n for n in CPU_NAMES if not kernels.implementation(n).slow_on_cpu]
COMPILED = ("compiled_naive", "flex")
GQA = [(2, 2), (4, 2), (8, 1), (16, 2)]

# ------------------------------------------------------------------------------ forward
# A row: (sq, sk, d, hq, hkv, causal, layout, scale).
# The peers' lengths ((113, 203), (128, 217), (1, 239), (3, 799), (1023, 1024)), their head dims.
FORWARD = [(sq, sk, d, hq, hkv, causal, layout, None) for (sq, sk), d, (hq, hkv), causal, layout in covering(
    [(1, 1), (113, 203), (128, 217), (1, 239), (3, 799), (203, 113), (17, 17), (1023, 1024)],
    [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256], GQA, [True, False, True], LAYOUTS)]
# The interpreter's rows: every peer head dim and 1 and 16 (padded to tl.dot's 16); (200, 50)
# causal has whole query tiles that see no key (their programs loop over nothing).
INTERPRETED_FORWARD = [(sq, sk, d, hq, hkv, causal, layout, None)
                       for (sq, sk), d, (hq, hkv), causal, layout in covering(
    [(1, 1), (17, 17), (113, 203), (200, 50), (40, 7), (203, 113), (1, 239)],
    [1, 16, 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256], GQA[:3], [True, False, True], LAYOUTS)]
# Each new shape is a compile: two rows that between them take S = 1, 17 and 113, both causal
# modes, GQA, Sq < Sk, a given scale and non-contiguous views; two slow rows add S = 1 against 1,
# Sq > Sk (the first 96 queries see no key), GQA 4:1, a head dim that is no power of two, mixed layouts.
COMPILED_FORWARD = [(17, 113, 16, 4, 2, True, "bshd", None), (1, 17, 16, 2, 2, False, "bhsd", 0.3),
                    pytest.param((113, 17, 80, 4, 1, True, ("bhsd", "bshd", "bshd"), None), marks=pytest.mark.slow),
                    pytest.param((1, 1, 8, 2, 2, True, "bhsd", None), marks=pytest.mark.slow)]


def _rows_for(name, fast, interpreted, compiled):
    if name == "triton":
        return interpreted
    return compiled if name in COMPILED else fast


def _row_id(row):
    sq, sk, d, hq, hkv, causal = row[:6]
    tail = "".join(f"-{x}" for x in row[6:] if x is not None)
    return f"q{sq}k{sk}-d{d}-h{hq}/{hkv}-{'causal' if causal else 'full'}{tail}"


def _cases(fast, interpreted, compiled=()):
    cases = []
    for name in CPU_NAMES:
        for row in _rows_for(name, fast, interpreted, compiled):
            marks = getattr(row, "marks", ())   # a pytest.param (itself a tuple) carrying marks
            row = row.values[0] if marks else row
            cases.append(pytest.param(name, row, marks=marks, id=f"{name}-{_row_id(row)}"))
    return cases


@pytest.mark.parametrize("name, row", _cases(FORWARD, INTERPRETED_FORWARD, COMPILED_FORWARD))
def test_forward_matches_the_float64_reference(name, row):
    sq, sk, d, hq, hkv, causal, layout, scale = row
    heads = (hq, hkv) if sq * sk < 500_000 else (hkv, hkv // 2 or 1)  # keep (1023, 1024) small
    q, k, v = make_attention_inputs(1, *heads, sq, sk, d, layouts=layout, seed=sq + d)
    with torch.no_grad():  # one grad mode for every call, as Dynamo guards on it
        out = kernels.get(name)(q, k, v, causal=causal, scale=scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device, \
        f"{name}: the output has q's shape, dtype and device"
    reference.judge(out, q, k, v, causal, scale).assert_ok(f"{name} {_row_id(row)}")
    if causal and sq > sk:
        blind = sq - sk
        assert torch.equal(out[..., :blind, :], torch.zeros_like(out[..., :blind, :])), \
            f"{name}: queries that see no key output zeros"


# ------------------------------------------------------------------------------ backward
# A row: (sq, sk, d, hq, hkv, causal, layout).
BACKWARD = [(sq, sk, d, hq, hkv, causal, "bshd") for (sq, sk), d, (hq, hkv), causal in covering(
    [(1, 1), (17, 17), (113, 203), (3, 99), (40, 7), (1, 64)], [16, 40, 59, 80, 128, 256], GQA, [True, False, True])]
INTERPRETED_BACKWARD = [(sq, sk, d, hq, hkv, causal, layout) for (sq, sk), d, (hq, hkv), causal, layout in covering(
    [(17, 17), (50, 90), (40, 7), (1, 64), (90, 90)], [32, 40, 96, 160, 16, 64], GQA[:3], [True, False],
    ["bshd", "bhsd", "dstride"])]


@pytest.mark.parametrize("name, row", _cases(BACKWARD, INTERPRETED_BACKWARD))
def test_backward_matches_the_float64_reference(name, row):
    sq, sk, d, hq, hkv, causal, layout = row
    q, k, v = make_attention_inputs(1, hq, hkv, sq, sk, d, layouts=layout, seed=sq * d)
    judgement = reference.check(kernels.get(name), q, k, v, causal=causal, backward=True, seed=sq)
    judgement.assert_ok(f"{name} backward {_row_id(row)}")


# ------------------------------------------------------------------------------ 16-bit
# A row: (sq, sk, d, hq, hkv, causal, dtype), forward and backward.
HALF = [(sq, sk, d, hq, hkv, causal, dtype) for dtype, (sq, sk), d, causal, (hq, hkv) in covering(
    [torch.bfloat16, torch.float16], [(33, 33), (113, 203), (1, 239), (77, 31)],
    [64, 59, 128, 96], [True, False, True], [(2, 2), (4, 1), (8, 2)])]
INTERPRETED_HALF = [
    (2, 2, 128, 2, 2, True, torch.bfloat16),     # the tiny causal rows where a rounded Delta hurt dQ
    (113, 113, 64, 2, 1, True, torch.float16),
    (17, 40, 80, 8, 1, False, torch.bfloat16),
    (33, 9, 59, 2, 1, True, torch.float16),      # Sq > Sk: queries that see no key
]


@pytest.mark.parametrize("name, row", _cases(HALF, INTERPRETED_HALF))
def test_16bit_by_flashattentions_rule(name, row):
    sq, sk, d, hq, hkv, causal, dtype = row
    q, k, v = make_attention_inputs(1, hq, hkv, sq, sk, d, dtype=dtype, layouts="bshd", seed=d)
    judgement = reference.check(kernels.get(name), q, k, v, causal=causal, backward=True, seed=d)
    assert judgement["out"].rule.startswith("max abs error <= 2 x"), "16-bit outputs are judged by FlashAttention's rule"
    judgement.assert_ok(f"{name} {_row_id(row)}")


@pytest.mark.parametrize("name", ["naive", "inplace", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize("hq, hkv, sq, sk", [(2, 2, 23, 23), (4, 2, 5, 23), (8, 1, 23, 5)])
def test_backward_in_float64_matches_reference(name, hq, hkv, sq, sk):
    q, k, v = make_attention_inputs(1, hq, hkv, sq, sk, 16, dtype=torch.float64, seed=4)
    reference.check(kernels.get(name), q, k, v, backward=True, seed=9).assert_ok(name)


# ------------------------------------------------------------------------------ layouts, scale, causal
# Every pair of layouts meets on some two of q, k, v (a Latin square: 16 mixes, not 64).
LAYOUT_MIXES = [(lq, lk, LAYOUTS[(i + j) % 4]) for i, lq in enumerate(LAYOUTS) for j, lk in enumerate(LAYOUTS)]


@pytest.mark.parametrize("name", FAST_CPU)
def test_every_pair_of_layouts(name):
    """q, k, v each in its own layout, contiguous or not, at a tiny size."""
    for layouts in LAYOUT_MIXES:
        q, k, v = make_attention_inputs(1, 4, 2, 7, 11, 16, layouts=layouts, seed=1)
        out = kernels.get(name)(q, k, v, causal=True)
        reference.judge(out, q, k, v).assert_ok(f"{name} layouts q, k, v = {layouts}")


@pytest.mark.parametrize("name", FAST_CPU)
@pytest.mark.parametrize("scale", [0.3, 0.0, -0.5, np.float32(0.25), np.float64(0.7), 2])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_explicit_scale_any_sign_and_type(name, scale, causal):
    # scale <= 0 with causal is where PyTorch's CPU flash kernel returned NaN: it must not now.
    q, k, v = make_attention_inputs(1, 2, 2, 31, 31, 64, seed=6)
    out = kernels.get(name)(q, k, v, causal=causal, scale=scale)
    reference.judge(out, q, k, v, causal, float(scale)).assert_ok(f"{name} scale={scale!r}")
    if float(scale) != 1 / 8:  # and the scale really is used: the default gives another answer
        assert not reference.judge(out, q, k, v, causal).ok, f"{name}: a given scale changes the answer"


@pytest.mark.parametrize("name", FAST_CPU)
@pytest.mark.parametrize("sq, sk", [(29, 29), (7, 29), (29, 7)])
def test_causal_ignores_the_future(name, sq, sk):
    """Bottom-right: query i sees keys j <= i + sk - sq; changing later keys changes nothing before."""
    q, k, v = make_attention_inputs(1, 2, 1, sq, sk, 16, seed=11)
    cut = sk - 9                      # keys from here on are changed
    first_blind = cut - (sk - sq)     # the first query that sees key `cut`
    k2, v2 = k.clone(), v.clone()
    k2[:, :, cut:] = torch.randn_like(k2[:, :, cut:]) * 5
    v2[:, :, cut:] = torch.randn_like(v2[:, :, cut:]) * 5
    a = kernels.get(name)(q, k, v, causal=True)
    b = kernels.get(name)(q, k2, v2, causal=True)
    torch.testing.assert_close(a[:, :, :max(first_blind, 0)], b[:, :, :max(first_blind, 0)])
    assert not torch.allclose(a[:, :, first_blind:], b[:, :, first_blind:]), \
        f"{name}: queries that see the changed keys change"

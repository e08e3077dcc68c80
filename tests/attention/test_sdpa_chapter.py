"""The helpers chapter 3 shows (03_sdpa and 03b_sdpa_fused): the math backend written out, its
safe softmax, the article's kernels."""
from __future__ import annotations


import pytest
import torch

import kernels
from kernels.trace.fingerprints import fingerprint
from kernels.attention.sdpa import ARTICLE_A100_KERNELS, math_decomposed, safe_softmax

from tests.helpers import make_attention_inputs

NEG_INF = float("-inf")


# Square and not (bottom-right causal), grouped-query heads (repeated per query head, as the math
# backend does), non-contiguous views, a given scale and a negative one (its sign kept on q's root).
SHAPES = [(3, 3, 1, 1, "bhsd", None), (3, 3, 17, 17, "bshd", 0.3), (3, 3, 113, 113, "bhsd", None),
          (3, 3, 203, 203, "bshd", None), (4, 2, 5, 9, "bhsd", -0.3), (8, 1, 9, 5, "bshd", None),
          (2, 2, 1, 7, "bhsd", None)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("hq, hkv, sq, sk, layout, scale", SHAPES)
def test_math_decomposed_is_the_math_backend_bit_for_bit(dtype, causal, hq, hkv, sq, sk, layout, scale):
    q, k, v = make_attention_inputs(2, hq, hkv, sq, sk, 16, dtype=dtype, layouts=layout, seed=sq)
    ours = math_decomposed(q, k, v, causal=causal, scale=scale)
    assert ours.dtype == dtype and ours.shape == q.shape
    assert torch.equal(ours, kernels.get("sdpa_math")(q, k, v, causal=causal, scale=scale))
    if scale is not None and sk > 1:   # a given scale is used, not ignored silently
        assert not torch.equal(ours, math_decomposed(q, k, v, causal=causal))


def test_safe_softmax_is_atens_safe_softmax():
    # Zeros on a fully masked row where softmax gives NaN, the plain softmax on every other
    # row: chapter 3's lessons, asserted when it executes.
    scores = torch.randn(2, 3, 5)
    scores[0, 1] = NEG_INF                  # a fully masked row
    scores[1, 2, 3:] = NEG_INF              # a partly masked row
    assert torch.equal(safe_softmax(scores), torch._safe_softmax(scores, -1))


def test_the_articles_kernels_decode_as_one_fused_attention_each():
    families = {"sdpa_efficient": "cutlass_fmha", "sdpa_flash": "flash", "sdpa_cudnn": "cudnn"}
    assert set(ARTICLE_A100_KERNELS) == set(families)
    for backend, name in ARTICLE_A100_KERNELS.items():
        fp = fingerprint(name)
        assert fp.kind == "fused_attention" and fp.family == families[backend], (backend, fp)
        assert fp.tensor_cores is True

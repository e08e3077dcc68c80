"""Chapter 3 in its two parts (03_sdpa: the call and the math backend; 03b_sdpa_fused: the fused
backends and occupancy), and the helpers they show: the math backend written out, its safe
softmax, the article's kernels."""
from __future__ import annotations

import re

import pytest
import torch

import kernels
from kernels import reference
from kernels.trace.fingerprints import fingerprint
from kernels.attention.sdpa import ARTICLE_A100_KERNELS, math_decomposed, safe_softmax

from tests.gpu_trace import CHAPTER_VARIANTS
from tests.helpers import ROOT, make_qkv

NEG_INF = float("-inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("s, layout", [(1, "bhsd"), (17, "bshd"), (113, "bhsd"), (203, "bshd")])
def test_math_decomposed_is_the_math_backend_bit_for_bit(dtype, causal, s, layout):
    q, k, v = make_qkv(2, 3, s, 16, dtype=dtype, layout=layout, seed=s)
    ours = math_decomposed(q, k, v, causal=causal)
    theirs = kernels.get("sdpa_math")(q, k, v, causal=causal)
    assert ours.dtype == dtype and ours.shape == q.shape
    assert torch.equal(ours, theirs)
    err = reference.max_rel_error(ours, reference.attention(q, k, v, causal=causal))
    assert err <= reference.tolerance(dtype)


def test_math_decomposed_honours_an_explicit_scale():
    q, k, v = make_qkv(1, 2, 17, 16, seed=3)
    ours = math_decomposed(q, k, v, causal=True, scale=0.3)
    assert torch.equal(ours, kernels.get("sdpa_math")(q, k, v, causal=True, scale=0.3))
    # A different scale must change the result, or the argument would be ignored silently.
    assert not torch.equal(ours, math_decomposed(q, k, v, causal=True))


def test_math_decomposed_rejects_bad_input():
    q, k, v = make_qkv(1, 2, 8, 16)
    with pytest.raises(ValueError, match="rank 4"):
        math_decomposed(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="dtype"):
        math_decomposed(q, k.double(), v)


def test_safe_softmax_zeroes_fully_masked_rows_where_softmax_gives_nan():
    scores = torch.randn(2, 3, 5)
    scores[0, 1] = NEG_INF                  # a fully masked row
    scores[1, 2, 3:] = NEG_INF              # a partly masked row
    plain, safe = torch.softmax(scores, -1), safe_softmax(scores)
    assert torch.isnan(plain[0, 1]).all()   # 0 / 0: the case the guard exists for
    assert torch.equal(safe[0, 1], torch.zeros(5))
    rows = torch.ones(2, 3, dtype=torch.bool)
    rows[0, 1] = False
    assert torch.equal(safe[rows], plain[rows])  # every other row is the plain softmax
    assert torch.equal(safe, torch._safe_softmax(scores, -1))


def test_the_articles_kernels_decode_as_one_fused_attention_each():
    families = {"sdpa_efficient": "cutlass_fmha", "sdpa_flash": "flash", "sdpa_cudnn": "cudnn"}
    assert set(ARTICLE_A100_KERNELS) == set(families)
    for backend, name in ARTICLE_A100_KERNELS.items():
        fp = fingerprint(name)
        assert fp.kind == "fused_attention" and fp.family == families[backend], (backend, fp)
        assert fp.tensor_cores is True


PARTS = ("03_sdpa", "03b_sdpa_fused")


def test_the_two_parts_follow_each_other_in_the_book():
    from tools.book import execute

    stems = [p.stem for p in execute.notebooks(ROOT)]
    i = stems.index("03_sdpa")
    assert stems[i - 1:i + 3] == ["02_inplace", "03_sdpa", "03b_sdpa_fused", "04_triton"]
    assert sorted(["02_inplace", "03b_sdpa_fused", "03_sdpa", "04_triton"]) == \
        ["02_inplace", "03_sdpa", "03b_sdpa_fused", "04_triton"], "the sources sort in reading order too"


@pytest.mark.parametrize("part", PARTS)
def test_each_part_has_a_guess_before_its_reveal(part):
    source = (ROOT / "notebooks" / f"{part}.py").read_text()
    guesses = [m.start() for m in re.finditer(r"^guess\w* = .*# edit me", source, re.M)]
    reveals = [m.start() for m in re.finditer(r"\breveal\(guess", source)]
    assert guesses and reveals and min(guesses) < min(reveals), f"{part}: a guess cell the reader edits, then a reveal"


@pytest.mark.parametrize("part", PARTS)
def test_each_part_reads_its_own_gpu_steps(part):
    """A part asks for the steps a GPU run records under its own name, the ones the fixtures plant."""
    source = (ROOT / "notebooks" / f"{part}.py").read_text()
    assert f'recorded.gpu_steps(device, step, "{part}"' in source
    other = {"03_sdpa": "03b_sdpa_fused", "03b_sdpa_fused": "03_sdpa"}[part]
    assert f'"{other}"' not in source, f"{part} reads no steps recorded under {other}"
    assert part in CHAPTER_VARIANTS, "tests/gpu_trace.py plants this part's steps in the fixture recording"


def test_the_parts_split_the_variants_between_them():
    assert CHAPTER_VARIANTS["03_sdpa"] == ["inplace", "sdpa_math"]
    assert CHAPTER_VARIANTS["03b_sdpa_fused"] == ["sdpa_efficient", "sdpa_flash", "sdpa_cudnn"]
    fused = (ROOT / "notebooks" / "03b_sdpa_fused.py").read_text()
    assert 'FUSED = ("sdpa_efficient", "sdpa_flash", "sdpa_cudnn")' in fused


def test_each_part_links_to_the_other():
    first = (ROOT / "notebooks" / "03_sdpa.py").read_text()
    second = (ROOT / "notebooks" / "03b_sdpa_fused.py").read_text()
    assert "(03b_sdpa_fused.ipynb)" in first and "(03_sdpa.ipynb)" in second
    intro = (ROOT / "book" / "intro.md").read_text()
    assert "(03_sdpa.ipynb)" in intro and "(03b_sdpa_fused.ipynb)" in intro


def test_first_call_cpu_ms_separates_a_slow_first_call_from_the_median_after_it():
    import time

    from kernels.attention.sdpa import first_call_cpu_ms

    seen = []

    def builds_once(x):
        if not seen:
            time.sleep(0.05)   # the first call at a new shape builds a plan
        seen.append(x)

    first, steady = first_call_cpu_ms(builds_once, (torch.zeros(1),), calls=5)
    assert len(seen) == 5 and first >= 50 and steady < first / 5
    with pytest.raises(ValueError, match="at least 2"):
        first_call_cpu_ms(builds_once, (), calls=1)

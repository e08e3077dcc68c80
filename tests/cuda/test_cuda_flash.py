"""cuda_v1 and cuda_v2: what they say without a GPU, and (on a GPU) that they are right.

The GPU tests judge every output against the float64 reference on odd lengths (ragged
tiles), both causal modes, Sq != Sk both ways (decoding, and more queries than keys, whose
first rows see nothing), grouped-query K/V heads, negative and zero scales, non-contiguous
and misaligned inputs (v2's scalar fallback), with the output buffer poisoned with NaN
first, so an element the kernel forgot to write cannot pass. Without a GPU they skip; what
can be checked without one (what the launchers launch, the tile schedule, the kernels'
resources) is in tests/cuda/test_cuda_compile.py and tests/cuda/test_cuda_resources.py.
"""
from __future__ import annotations

import pytest
import torch

import kernels
import kernels.cuda.flash as cf
from kernels import reference
from tests.helpers import make_attention_inputs, make_qkv

NAMES = ("cuda_v1", "cuda_v2")


# ---- everywhere ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_gqa_heads_that_do_not_divide_are_refused_in_words_before_any_build(name):
    q, k, v = make_attention_inputs(1, 4, 3, 8, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="must be a multiple of") as err:
        kernels.get(name)(q, k, v)
    assert str(err.value).startswith(f"{name}: ")
    if not torch.cuda.is_available():
        assert cf.extension.cache_info().currsize == 0


@pytest.mark.parametrize("name", NAMES)
def test_on_cpu_available_gives_the_reason_and_calling_raises_it(name):
    reason = kernels.available("cpu")[name]
    assert reason is not None and "needs a CUDA GPU" in reason
    dtype = torch.float16 if name == "cuda_v2" else torch.float32
    q, k, v = make_qkv(1, 2, 17, 64, dtype=dtype)
    with pytest.raises(RuntimeError) as err:
        kernels.get(name)(q, k, v)
    assert str(err.value) == reason


def test_cpu_only_torch_is_named(monkeypatch):
    # Pretend a GPU is visible, but torch has no CUDA build: the reason must say so.
    monkeypatch.setattr(cf, "cuda_reason", lambda device: None)
    monkeypatch.setattr(torch.version, "cuda", None)
    for requires in (cf.requires_v1, cf.requires_v2):
        reason = requires(torch.device("cuda"))
        assert reason is not None and "CPU-only" in reason


def test_v2_refuses_pre_ampere_gpus(monkeypatch):
    monkeypatch.setattr(cf, "_toolchain_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    reason = cf.requires_v2(torch.device("cuda"))
    assert reason is not None and "sm_75" in reason and "8.0" in reason
    assert cf.requires_v1(torch.device("cuda")) is None  # v1 has no tensor-core requirement


def test_build_errors_carry_the_compiler_message(monkeypatch):
    import torch.utils.cpp_extension as cpp

    def failing_load(**kwargs):
        raise RuntimeError("Error building extension 'x': flash_v2.cu(12): error: identifier \"oops\" is undefined")

    monkeypatch.setattr(cpp, "load", failing_load)
    cf.extension.cache_clear()
    try:
        with pytest.raises(RuntimeError, match='identifier "oops" is undefined') as err:
            cf.extension()
        assert "building the CUDA attention extension" in str(err.value)
    finally:
        cf.extension.cache_clear()  # the next caller must try for real


def test_build_uses_the_binding_and_every_kernel_source(monkeypatch):
    import torch.utils.cpp_extension as cpp

    seen = {}
    monkeypatch.setattr(cpp, "load", lambda **kwargs: seen.update(kwargs) or "module")
    cf.extension.cache_clear()
    try:
        assert cf.extension() == "module"
    finally:
        cf.extension.cache_clear()
    names = sorted(s.rsplit("/", 1)[-1] for s in seen["sources"])
    assert names == sorted(["binding.cpp", *cf.KERNEL_SOURCES])


@pytest.mark.parametrize("name", NAMES)
def test_bad_inputs_are_refused_before_any_build(name):
    q, k, v = make_qkv(1, 1, 8, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim 32"):
        kernels.get(name)(q, k, v)


def test_v2_refuses_fp32():
    q, k, v = make_qkv(1, 1, 8, 64, dtype=torch.float32)
    with pytest.raises(TypeError, match="float32"):
        kernels.get("cuda_v2")(q, k, v)


# ---- on a GPU --------------------------------------------------------------------------------

LENGTHS = (1, 17, 113, 203, 1024 + 7)


def gpu_inputs(s, d, dtype, layout, seed=0):
    """q, k, v on the GPU in one of four memory layouts.

    bhsd: contiguous; bshd: a transposed [B, S, H, D] view (vectorised loads still apply);
    offset: storage starting one element in (not 16-byte aligned: v2's scalar path);
    dstride: head_dim not the fastest axis (column stride != 1: scalar path again).
    """
    b, h = 2, 3
    if layout in ("bhsd", "bshd"):
        return tuple(t.cuda() for t in make_qkv(b, h, s, d, dtype=dtype, layout=layout, seed=seed))
    g = torch.Generator().manual_seed(seed)
    if layout == "offset":
        n = b * h * s * d
        flat = torch.randn(3, n + 1, generator=g).to("cuda", dtype)
        return tuple(flat[i, 1:].view(b, h, s, d) for i in range(3))
    if layout == "dstride":
        full = torch.randn(3, b, h, d, s, generator=g).to("cuda", dtype)
        return tuple(full[i].transpose(-1, -2) for i in range(3))
    raise ValueError(layout)


@pytest.fixture
def poisoned(monkeypatch):
    """Make the kernels write into a NaN-filled buffer; returns the buffers handed out."""
    handed_out = []

    def allocate(q):
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
        handed_out.append(out)
        return out

    monkeypatch.setattr(cf, "allocate_output", allocate)
    return handed_out


def check_against_reference(name, s, d, dtype, layout, causal, poisoned, scale=None):
    q, k, v = gpu_inputs(s, d, dtype, layout)
    out = kernels.get(name)(q, k, v, causal=causal, scale=scale)
    torch.cuda.synchronize()
    assert out is poisoned[-1], "the output must be the buffer allocate_output returned"
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert not torch.isnan(out).any(), "some output elements were never written"
    reference.judge(out, q, k, v, causal, scale).assert_ok(f"{name} S={s} D={d} {dtype} {layout} causal={causal}")


# Every (dtype, head dim, causal) once, with the lengths and layouts cycling through them: a
# covering set, small enough for a GPU run's time budget.
V1_CASES = [(dtype, d, causal, LENGTHS[i % len(LENGTHS)], ("bhsd", "bshd", "dstride")[i % 3])
            for i, (dtype, d, causal) in enumerate(
                (t, d, c) for t in (torch.float32, torch.float16, torch.bfloat16) for d in (64, 128)
                for c in (True, False))]
V2_CASES = [(dtype, d, causal, LENGTHS[(i + 2) % len(LENGTHS)], ("bhsd", "bshd", "offset", "dstride")[i % 4])
            for i, (dtype, d, causal) in enumerate(
                (t, d, c) for t in (torch.float16, torch.bfloat16) for d in (64, 128) for c in (True, False))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,causal,s,layout", V1_CASES, ids=str)
def test_v1_matches_reference(layout, dtype, d, s, causal, poisoned):
    check_against_reference("cuda_v1", s, d, dtype, layout, causal, poisoned)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,causal,s,layout", V2_CASES, ids=str)
def test_v2_matches_reference(layout, dtype, d, s, causal, poisoned):
    if kernels.available("cuda")["cuda_v2"]:
        pytest.skip(kernels.available("cuda")["cuda_v2"])
    check_against_reference("cuda_v2", s, d, dtype, layout, causal, poisoned)


# Sq != Sk and grouped-query heads: (Hq, Hkv, Sq, Sk). Sq < Sk is a query chunk against a
# longer cache (Sq = 1 decoding); Sq > Sk leaves the first Sq - Sk causal rows with no key at
# all (their output is 0, as in the reference), in whole query tiles (300 vs 77) and in part
# of one (129 vs 100). Lengths are chosen so Sk - Sq falls on, before and after tile edges.
SHAPES = [(4, 4, 1, 1031), (4, 2, 1, 300), (6, 2, 77, 333), (4, 1, 129, 200), (2, 2, 300, 77),
          (4, 2, 129, 100), (3, 3, 64, 127), (8, 2, 203, 203)]


def general_cases():
    """Every (kernel, dtype, head dim, causal) twice, the shapes cycling through them: the second
    pass runs backwards, so every shape meets both causal modes."""
    combos = [(n, t, d, c) for n in NAMES for t in (torch.float16, torch.bfloat16) for d in (64, 128) for c in (True, False)]
    return [(*combo, SHAPES[i % len(SHAPES)]) for i, combo in enumerate(combos + combos[::-1])]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,d,causal,shape", general_cases(), ids=str)
def test_unequal_lengths_and_grouped_heads_match_reference(name, dtype, d, causal, shape, poisoned):
    if kernels.available("cuda")[name]:
        pytest.skip(kernels.available("cuda")[name])
    hq, hkv, sq, sk = shape
    q, k, v = (t.cuda() for t in make_attention_inputs(2, hq, hkv, sq, sk, d, dtype=dtype, seed=sq + sk))
    out = kernels.get(name)(q, k, v, causal=causal)
    torch.cuda.synchronize()
    assert out is poisoned[-1] and out.shape == q.shape
    assert not torch.isnan(out).any(), "some output elements were never written"
    if causal and sq > sk:
        # Query i sees keys j <= i + Sk - Sq: the first Sq - Sk rows see none, and are 0.
        assert (out[:, :, :sq - sk] == 0).all(), "rows that see no key must be 0"
    reference.judge(out, q, k, v, causal).assert_ok(f"{name} Hq={hq} Hkv={hkv} Sq={sq} Sk={sk} D={d} {dtype} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.3, -0.2, 0.0])
def test_explicit_scale_is_used(name, scale, poisoned):
    if kernels.available("cuda")[name]:
        pytest.skip(kernels.available("cuda")[name])
    # 0.3 is far from 1/sqrt(64) = 0.125: a kernel ignoring scale fails the comparison. A
    # negative scale (v2 negates q instead) and 0 (uniform attention over the visible keys)
    # are real numbers the contract takes too.
    check_against_reference(name, 203, 64, torch.float16, "bhsd", True, poisoned, scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_runs_on_the_current_stream(name):
    if kernels.available("cuda")[name]:
        pytest.skip(kernels.available("cuda")[name])
    q, k, v = gpu_inputs(300, 64, torch.bfloat16, "bhsd")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = kernels.get(name)(q, k, v, causal=True)
    stream.synchronize()
    reference.judge(out, q, k, v, True).assert_ok(f"{name} on a side stream")


@pytest.mark.gpu
def test_v2_first_row_of_causal_attention_is_v0():
    # Causal query 0 sees only key 0: softmax over one score is 1, so out[..., 0, :] = v[..., 0, :]
    # exactly (up to the bf16 rounding of v itself, which the output shares).
    if kernels.available("cuda")["cuda_v2"]:
        pytest.skip(kernels.available("cuda")["cuda_v2"])
    q, k, v = gpu_inputs(129, 128, torch.bfloat16, "bshd")
    out = kernels.get("cuda_v2")(q, k, v, causal=True)
    assert torch.equal(out[:, :, 0], v[:, :, 0])


def test_a_machine_without_the_build_tools_is_told_which_one(monkeypatch):
    """Colab has CUDA torch and nvcc but no ninja: available() says so instead of "runs here"."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(cf, "nvcc_available", lambda: True)
    monkeypatch.setattr(ext, "is_ninja_available", lambda: False)
    assert "ninja is not installed" in cf.build_tools_reason()
    monkeypatch.setattr(cf, "nvcc_available", lambda: False)
    assert "no nvcc" in cf.build_tools_reason()

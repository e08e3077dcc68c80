"""The implementation contract (DESIGN.md), checked for every implementation that runs here."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference
from tests.conftest import make_qkv

CPU_NAMES = [n for n, why in kernels.available("cpu").items() if why is None]
# Triton's interpreter is slow; its own test file covers it at small sizes.
FAST_CPU = [n for n in CPU_NAMES if n not in ("triton",)]


def test_names_in_teaching_order_and_complete():
    names = kernels.names()
    assert names[:6] == ["naive", "inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn"]
    assert len(names) == len(set(names))


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(KeyError) as err:
        kernels.get("flash3")
    assert "flash3" in str(err.value) and "naive" in str(err.value)


def test_cpu_availability_says_why_not():
    avail = kernels.available("cpu")
    for name in ("naive", "inplace", "sdpa_math", "sdpa_flash"):
        assert avail[name] is None, avail[name]
    for name in ("sdpa_efficient", "sdpa_cudnn"):
        assert avail[name] and "CUDA GPU" in avail[name]


@pytest.mark.parametrize("name", ["sdpa_efficient", "sdpa_cudnn"])
def test_calling_unavailable_raises_the_same_words(name):
    q, k, v = make_qkv(1, 2, 17, 16)
    with pytest.raises(RuntimeError) as err:
        kernels.get(name)(q, k, v)
    assert str(err.value) == kernels.available("cpu")[name]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_availability_without_a_gpu():
    assert all("none is visible" in why for why in kernels.available("cuda").values())


# Odd shapes on purpose: S=1 (one key), primes, a length no tile size divides.
SHAPES = [(1, 1, 1, 16), (2, 3, 17, 32), (1, 2, 113, 64), (1, 1, 203, 128), (2, 2, 64, 80)]


@pytest.mark.parametrize("name", FAST_CPU)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_matches_float64_reference(name, shape, causal):
    q, k, v = make_qkv(*shape, seed=sum(shape))
    out = kernels.get(name)(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert torch.isfinite(out).all()
    err = reference.max_rel_error(out, reference.attention(q, k, v, causal=causal))
    assert err <= reference.tolerance(q.dtype), f"{name}: max relative error {err:.2e}"


@pytest.mark.parametrize("name", FAST_CPU)
def test_noncontiguous_inputs(name):
    q, k, v = make_qkv(2, 3, 37, 32, layout="bshd", seed=5)
    out = kernels.get(name)(q, k, v, causal=True)
    assert reference.max_rel_error(out, reference.attention(q, k, v)) <= 1e-5


@pytest.mark.parametrize("name", FAST_CPU)
def test_explicit_scale(name):
    q, k, v = make_qkv(1, 2, 19, 16, seed=3)
    out = kernels.get(name)(q, k, v, causal=True, scale=0.3)
    assert reference.max_rel_error(out, reference.attention(q, k, v, scale=0.3)) <= 1e-5
    # and the scale really is used: the default scale gives a different answer
    assert reference.max_rel_error(out, reference.attention(q, k, v)) > 1e-3


@pytest.mark.parametrize("name", FAST_CPU)
def test_causal_ignores_the_future(name):
    """Changing keys/values after position t must not change outputs up to t."""
    q, k, v = make_qkv(1, 2, 29, 16, seed=11)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 20:] = torch.randn_like(k2[:, :, 20:]) * 5
    v2[:, :, 20:] = torch.randn_like(v2[:, :, 20:]) * 5
    a = kernels.get(name)(q, k, v, causal=True)
    b = kernels.get(name)(q, k2, v2, causal=True)
    torch.testing.assert_close(a[:, :, :20], b[:, :, :20])
    assert not torch.allclose(a[:, :, 20:], b[:, :, 20:])


@pytest.mark.parametrize("name", FAST_CPU)
def test_bfloat16_within_tolerance(name):
    q, k, v = make_qkv(1, 2, 33, 64, dtype=torch.bfloat16, seed=2)
    out = kernels.get(name)(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    assert reference.max_rel_error(out, reference.attention(q, k, v)) <= reference.tolerance(torch.bfloat16)


@pytest.mark.parametrize("name", ["naive", "inplace", "sdpa_math"])
def test_backward_matches_reference(name):
    q, k, v = make_qkv(1, 2, 23, 16, dtype=torch.float64, seed=4, requires_grad=True)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad(kernels.get(name)(q, k, v), (q, k, v), dout)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = torch.autograd.grad(reference.attention(qr, kr, vr), (qr, kr, vr), dout)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r)


# ------------------------------------------------------------------------------ bad input

def _bad(**change):
    q, k, v = make_qkv(1, 2, 8, 16)
    args = {"q": q, "k": k, "v": v}
    args.update(change)
    return args


BAD = {
    "rank": (_bad(q=torch.randn(2, 8, 16)), ValueError, "rank 4"),
    "shape": (_bad(k=torch.randn(1, 2, 9, 16)), ValueError, "same shape"),
    "dtype": (_bad(v=torch.randn(1, 2, 8, 16, dtype=torch.float64)), TypeError, "one dtype"),
    "integer": (_bad(q=torch.ones(1, 2, 8, 16, dtype=torch.int64), k=torch.ones(1, 2, 8, 16, dtype=torch.int64),
                     v=torch.ones(1, 2, 8, 16, dtype=torch.int64)), TypeError, "floating-point"),
    "not a tensor": (_bad(q=[[1.0]]), TypeError, "torch.Tensor"),
    "empty": (_bad(q=torch.randn(1, 2, 0, 16), k=torch.randn(1, 2, 0, 16), v=torch.randn(1, 2, 0, 16)),
              ValueError, ">= 1"),
    "device": (_bad(k=torch.randn(1, 2, 8, 16, device="meta")), ValueError, "one device"),
}


@pytest.mark.parametrize("name", CPU_NAMES)  # validation runs before any kernel: cheap for all
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_gets_a_clear_error(name, case):
    args, exc, words = BAD[case]
    with pytest.raises(exc) as err:
        kernels.get(name)(**args)
    assert words in str(err.value) and name in str(err.value)


def test_bad_scale_and_causal():
    q, k, v = make_qkv(1, 1, 4, 8)
    with pytest.raises(TypeError, match="scale"):
        kernels.get("naive")(q, k, v, scale="0.1")
    with pytest.raises(ValueError, match="finite"):
        kernels.get("naive")(q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match="causal"):
        kernels.get("naive")(q, k, v, causal=1)


def test_unsupported_head_dim_names_the_problem():
    @kernels.register("_test_only_d64", order=999, head_dims=(64,))
    def _d64(q, k, v, causal=True, scale=None):
        return q

    try:
        q, k, v = make_qkv(1, 1, 4, 32)
        with pytest.raises(ValueError, match="head_dim 32 is not supported; supported: 64"):
            kernels.get("_test_only_d64")(q, k, v)
    finally:
        from kernels import registry
        registry._REGISTRY.pop("_test_only_d64")


def test_flop_and_byte_counts_by_hand():
    # B1 H8 S1024 D64: 4*1*8*1024^2*64 = 2,147,483,648 dense; causal halves it.
    assert reference.flops(1, 8, 1024, 64, causal=False) == 2_147_483_648
    assert reference.flops(1, 8, 1024, 64, causal=True) == 1_073_741_824
    # backward is 2.5x forward, so forward+backward is 3.5x
    assert reference.flops(1, 8, 1024, 64, causal=True, backward=True) == 3.5 * 1_073_741_824
    # fused fp16: q, k, v, o = 4 * 8*1024*64 elements * 2 bytes = 4,194,304
    assert reference.io_bytes(1, 8, 1024, 64, torch.float16) == 4_194_304
    # materialized adds 4 * 8 * 1024^2 elements
    assert reference.io_bytes(1, 8, 1024, 64, torch.float16, materialized=True) == 4_194_304 + 4 * 8 * 1024**2 * 2

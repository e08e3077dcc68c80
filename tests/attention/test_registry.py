"""The registry (kernels/registry.py) and the float64 reference it judges by.

Names in teaching order, "can this run here?" in words, refusals of bad input naming the
implementation, the reference's own cases by hand, naive's mask caches, and the flop and
byte counts. Whether each implementation's numbers are right is tests/attention/test_contract.py.
"""
from __future__ import annotations

import contextlib

import warnings

import numpy as np
import pytest
import torch

import kernels
from kernels.attention import naive as naive_module
from kernels import reference
from kernels.registry import CannotRun
from tests.helpers import make_attention_inputs, make_qkv

CPU_NAMES = [n for n, why in kernels.available("cpu").items() if why is None]
# Entries flagged slow_on_cpu (Triton's interpreter; torch.compile, a compile per shape) are
# left out of the input checks that need no kernel to tell them apart.
FAST_CPU = [n for n in CPU_NAMES if not kernels.implementation(n).slow_on_cpu]


def test_names_in_teaching_order_and_complete():
    names = kernels.names()
    assert names == ["naive", "inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "triton",
                     "cuda_v1", "cuda_v2", "compiled_naive", "flex"], \
        f"import kernels registers every implementation of the course, in chapter order: {names}"


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
    with pytest.raises(CannotRun) as err:
        kernels.get(name)(q, k, v)
    assert str(err.value) == kernels.available("cpu")[name]
    assert isinstance(err.value, RuntimeError), "CannotRun stays a RuntimeError for older callers"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_availability_without_a_gpu():
    assert all("none is visible" in why for why in kernels.available("cuda").values())


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the no-MPS message")
def test_mps_availability_without_an_mps_device():
    # Even implementations that "run anywhere" cannot run on a device the machine lacks.
    avail = kernels.available("mps")
    assert all(why and "MPS" in why for why in avail.values()), avail


@pytest.mark.parametrize("device", ["xpu", "hpu"])
def test_other_accelerators_are_not_claimed_blindly(device):
    if getattr(getattr(torch, device, None), "is_available", lambda: False)():
        pytest.skip(f"this machine has a {device} device")
    assert all(why for why in kernels.available(device).values())


# ------------------------------------------------------------------------------ the reference

def test_future_mask_is_bottom_right_by_hand():
    # Sq=2 queries, Sk=5 keys: the last query sees all 5 keys, the one before it 4.
    assert reference.future_mask(2, 5).tolist() == [[False, False, False, False, True],
                                                    [False, False, False, False, False]]
    # Sq=4 > Sk=2: queries 0 and 1 see nothing, query 2 sees key 0, query 3 both keys.
    assert reference.future_mask(4, 2).tolist() == [[True, True], [True, True], [False, True], [False, False]]
    assert torch.equal(reference.future_mask(6, 6), torch.ones(6, 6, dtype=torch.bool).triu(1))


def test_reference_gqa_equals_one_head_at_a_time():
    # An independent computation: each query head against its own K/V head, by loop.
    q, k, v = make_attention_inputs(2, 6, 2, 5, 9, 8, dtype=torch.float64, seed=1)
    got = reference.attention(q, k, v, causal=True)
    for h in range(6):
        one = reference.attention(q[:, h:h + 1], k[:, h // 3:h // 3 + 1], v[:, h // 3:h // 3 + 1], causal=True)
        torch.testing.assert_close(got[:, h:h + 1], one, rtol=0, atol=0)


def test_reference_decoding_step_sees_every_key():
    # One query against a cache: bottom-right causal hides nothing, so it equals non-causal.
    q, k, v = make_attention_inputs(1, 2, 2, 1, 33, 16, dtype=torch.float64, seed=2)
    torch.testing.assert_close(reference.attention(q, k, v, causal=True), reference.attention(q, k, v, causal=False))


def test_reference_queries_that_see_no_key_give_zero_and_finite_gradients():
    q, k, v = (t.requires_grad_() for t in make_attention_inputs(1, 1, 1, 6, 3, 4, dtype=torch.float64))
    out = reference.attention(q, k, v, causal=True)
    assert torch.equal(out[0, 0, :3], torch.zeros(3, 4, dtype=torch.float64))
    assert out[0, 0, 3:].abs().min() > 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# ------------------------------------------------------------------------------ the judge

def test_judge_fails_nan_and_a_wrong_answer_and_passes_the_right_one():
    q, k, v = make_attention_inputs(1, 2, 2, 9, 9, 16, seed=3)
    ref = reference.attention(q, k, v).float()
    assert reference.judge(ref, q, k, v).ok
    assert not reference.judge(ref * (1 + 1e-4), q, k, v).ok, "1e-4 relative is outside fp32's 1e-5"
    poisoned = ref.clone()
    poisoned[0, 1, 4, 2] = float("nan")
    assert not reference.judge(poisoned, q, k, v).ok, "a NaN must never pass"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_judge_16bit_bound_is_twice_plain_attentions_error(dtype):
    q, k, v = make_attention_inputs(1, 2, 2, 37, 37, 64, dtype=dtype, seed=4)
    ref = reference.attention(q, k, v)
    # "Plain" attention is written two ways (scale after or before q·kᵀ): the less exact sets the bar.
    plain_err = max(reference.max_abs_error(reference.plain_attention(q, k, v, scale_first=first), ref)
                    for first in (False, True))
    verdict = reference.judge(reference.plain_attention(q, k, v), q, k, v)["out"]
    assert verdict.bound == pytest.approx(2 * plain_err + 1e-5)
    assert verdict.ok, "plain attention itself is within its own rule"
    # An output off by 3x plain attention's error (in one place) must fail; 1.5x must pass.
    for factor, ok in ((3.0, False), (1.5, True)):
        off = ref.clone()
        off[0, 0, 5, 7] += factor * plain_err + 1e-5
        assert reference.judge(off, q, k, v).ok is ok, factor


def _fp32_with_grads(q, k, v, scale, grad_out, planted=None):
    """Plain float32 attention (causal) and its gradients; ``planted`` makes it worse on purpose:
    "bf16 probabilities" rounds P to bfloat16 (what a kernel that casts P for its Pᵀ·dO matmul
    does), "tf32 scores" rounds q and k to TF32's 10-bit mantissa before q·kᵀ (a tl.dot without
    input_precision="ieee" on a GPU). Both roundings pass gradients through unchanged."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    qq, kk, vv = leaves

    def tf32(t):
        return t + (t.detach().view(torch.int32).bitwise_and(~0x1FFF).view(torch.float32) - t.detach())

    if planted == "tf32 scores":
        qq, kk = tf32(qq), tf32(kk)
    scores = (qq @ kk.transpose(-2, -1)) * scale
    probs = scores.masked_fill(reference.future_mask(*scores.shape[-2:]), float("-inf")).softmax(-1)
    if planted == "bf16 probabilities":
        probs = probs + (probs.detach().to(torch.bfloat16).float() - probs.detach())
    out = probs @ vv
    return out.detach(), torch.autograd.grad(out, leaves, grad_out)


def test_judge_fp32_bound_at_a_large_scale_comes_from_float32s_roundoff(monkeypatch):
    # At scale 10 the scores q·kᵀ·scale reach hundreds, and float32's rounding of them (an
    # absolute error in exp's argument) is a relative error of every probability: plain float32
    # attention itself misses 1e-5 of max|ref|. The judge widens the bound by what that rounding
    # does, computed from u = 2^-24 and the inputs in float64, never by running float32 here
    # (whose error depends on the machine's BLAS kernel), and stays tight enough that a real
    # precision bug fails.
    monkeypatch.setattr(reference, "plain_errors", lambda *args: pytest.fail("float32 is judged without "
                                                                              "a float32 computation"))
    q, k, v = make_attention_inputs(1, 2, 2, 113, 113, 64, seed=12)
    grad_out = torch.randn(1, 2, 113, 64, generator=torch.Generator().manual_seed(2))
    out, grads = _fp32_with_grads(q, k, v, 10.0, grad_out)
    want = reference.with_grads(reference.attention, q, k, v, True, 10.0, grad_out, torch.float64)
    relative = [reference.max_abs_error(g, w) / float(w.abs().max()) for g, w in zip((out, *grads), want)]
    assert max(relative) > 1e-5, f"plain float32 at scale 10 should miss a fixed 1e-5 here: {relative}"
    judgement = reference.judge(out, q, k, v, True, 10.0, grads=grads, grad_out=grad_out)
    assert judgement.ok, f"plain float32 attention must meet the float32 rule at scale 10: {judgement}"
    assert any("rounding of the scores" in verdict.rule for verdict in judgement.values()), judgement
    for planted, failing in (("bf16 probabilities", ("out", "dv")), ("tf32 scores", ("out", "dq", "dk", "dv"))):
        worse_out, worse_grads = _fp32_with_grads(q, k, v, 10.0, grad_out, planted)
        worse = reference.judge(worse_out, q, k, v, True, 10.0, grads=worse_grads, grad_out=grad_out)
        assert [n for n in failing if worse[n].ok] == [], f"{planted} must fail {failing}: {worse}"
    # At the default scale plain float32 is far inside 1e-5, and the fixed bound is the rule.
    default = reference.judge(reference.plain_attention(q, k, v), q, k, v)["out"]
    assert default.ok and "rounding" not in default.rule, default


def test_score_rounding_bounds_grow_with_the_scale_and_count_gqa_heads():
    q, k, v = make_attention_inputs(1, 4, 2, 40, 40, 32, seed=3)
    grad_out = torch.randn(1, 4, 40, 32, generator=torch.Generator().manual_seed(1))
    small, large = (reference.score_rounding_bounds(q, k, v, True, s, grad_out) for s in (0.1, 10.0))
    assert all(0 < a < b for a, b in zip(small, large)), (small, large)
    # Two query heads share each K/V head: dK and dV add both heads' errors (variances).
    single = reference.score_rounding_bounds(q[:, ::2], k, v, True, 10.0, grad_out[:, ::2])
    assert single[3] < large[3], (single, large)


def test_judge_assert_names_the_failing_tensor_and_the_rule():
    q, k, v = make_attention_inputs(1, 1, 1, 5, 5, 8, seed=5)
    with pytest.raises(AssertionError, match=r"^mine: does not match the float64 reference.*out: .* exceeds"):
        reference.judge(q.clone(), q, k, v).assert_ok("mine")


# ------------------------------------------------------------------------------ naive's caches

def test_naive_masks_survive_inference_mode_then_training():
    q, k, v = make_qkv(1, 2, 41, 16, seed=1)
    for name in ("naive", "inplace"):
        with torch.inference_mode():
            kernels.get(name)(q, k, v)             # builds and caches the mask for S=41
        qg = q.clone().requires_grad_()
        kernels.get(name)(qg, k, v).sum().backward()   # must not fail on an inference tensor
        assert torch.isfinite(qg.grad).all()


def test_naive_caches_are_bounded():
    module = naive_module.NaiveAttention(causal=True)
    for s in range(1, 61):
        q, k, v = make_qkv(1, 1, s, 8, seed=s)
        module(q, k, v)
    assert len(module.masks) <= naive_module.MASKS_PER_MODULE
    for i in range(40):
        q, k, v = make_qkv(1, 1, 4, 8)
        kernels.get("naive")(q, k, v, scale=0.1 + i / 100)
    assert len(naive_module.module_cache) <= naive_module.MODULES


def test_naive_float16_overflow_is_the_articles_trap():
    # Documented in naive's docstring: the scale comes after the fp16 q @ kᵀ, so large scores
    # overflow to inf and rows become NaN; SDPA's math backend scales first and stays finite.
    q, k, v = make_attention_inputs(1, 1, 1, 32, 32, 256, scale=40.0, seed=2)
    q, k, v = q.half(), k.half(), v.half()
    assert torch.isnan(kernels.get("naive")(q, k, v, causal=False)).all(dim=-1).any()
    assert torch.isfinite(kernels.get("sdpa_math")(q, k, v, causal=False)).all()


# ------------------------------------------------------------------------------ bad input

def _bad(**change):
    q, k, v = make_qkv(1, 2, 8, 16)
    args = {"q": q, "k": k, "v": v}
    args.update(change)
    return args


def _nested():
    with warnings.catch_warnings():  # "the nested tensor API is in prototype stage"
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(2, 8, 16), torch.randn(2, 5, 16)])


BAD = {
    "rank": (_bad(q=torch.randn(2, 8, 16)), ValueError, "rank 4"),
    "k, v shapes": (_bad(k=torch.randn(1, 2, 9, 16)), ValueError, "k and v must have the same shape"),
    "heads": (_bad(q=torch.randn(1, 3, 8, 16)), ValueError, "multiple of the number of key/value heads"),
    "batch": (_bad(q=torch.randn(2, 2, 8, 16)), ValueError, "same batch size"),
    "head_dim": (_bad(q=torch.randn(1, 2, 8, 32)), ValueError, "same head_dim"),
    "dtype": (_bad(v=torch.randn(1, 2, 8, 16, dtype=torch.float64)), TypeError, "one dtype"),
    "integer": (_bad(q=torch.ones(1, 2, 8, 16, dtype=torch.int64), k=torch.ones(1, 2, 8, 16, dtype=torch.int64),
                     v=torch.ones(1, 2, 8, 16, dtype=torch.int64)), TypeError, "floating-point"),
    "not a tensor": (_bad(q=[[1.0]]), TypeError, "torch.Tensor"),
    "empty": (_bad(q=torch.randn(1, 2, 0, 16)), ValueError, ">= 1"),
    "device": (_bad(k=torch.randn(1, 2, 8, 16, device="meta")), ValueError, "one device"),
    "nested": (_bad(q=_nested()), TypeError, "nested tensor"),
    "sparse": (_bad(q=torch.randn(1, 2, 8, 16).to_sparse()), TypeError, "dense"),
}


@pytest.mark.parametrize("name", CPU_NAMES)  # validation runs before any kernel: cheap for all
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_gets_a_clear_error(name, case):
    args, exc, words = BAD[case]
    with pytest.raises(exc) as err:
        kernels.get(name)(**args)
    assert words in str(err.value) and name in str(err.value)


@pytest.mark.parametrize("name", FAST_CPU)
def test_bad_scale_and_causal_name_the_implementation(name):
    q, k, v = make_qkv(1, 1, 4, 8)
    for scale, exc, words in (("0.1", TypeError, "scale must be a real number"), (True, TypeError, "scale"),
                              (float("nan"), ValueError, "finite"), (torch.tensor(0.5), TypeError, "scale")):
        with pytest.raises(exc, match=words) as err:
            kernels.get(name)(q, k, v, scale=scale)
        assert str(err.value).startswith(f"{name}: ")
    with pytest.raises(TypeError, match=r"causal must be True or False, got int 1") as err:
        kernels.get(name)(q, k, v, causal=1)
    assert str(err.value).startswith(f"{name}: ")


@pytest.mark.parametrize("name", FAST_CPU)
def test_numpy_bool_causal_is_a_bool(name):
    q, k, v = make_qkv(1, 1, 6, 8, seed=3)
    torch.testing.assert_close(kernels.get(name)(q, k, v, causal=np.bool_(True)), kernels.get(name)(q, k, v))
    torch.testing.assert_close(kernels.get(name)(q, k, v, causal=np.bool_(False)),
                               kernels.get(name)(q, k, v, causal=False))


def returns_q(q, k, v, causal=True, scale=None):
    return q


@pytest.fixture
def test_only():
    """Registers a stand-in as "_test_only" with the given limits, for the length of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda fn=returns_q, **limits: stack.enter_context(
            kernels.registered("_test_only", fn, order=999, **limits))


def test_registered_frees_its_name_after_the_block_and_refuses_a_taken_one():
    with kernels.registered("_test_only", returns_q, order=999) as fn:
        assert "_test_only" in kernels.names() and fn is kernels.get("_test_only")
        with pytest.raises(ValueError, match="already registered"):
            with kernels.registered("_test_only", returns_q, order=999):
                pass
    assert "_test_only" not in kernels.names(), "the name is free again after the block"


def test_unsupported_head_dim_names_the_problem(test_only):
    fn = test_only(head_dims=(64,))
    q, k, v = make_qkv(1, 1, 4, 32)
    with pytest.raises(ValueError, match="head_dim 32 is not supported; supported: 64"):
        fn(q, k, v)


def test_head_dim_span_says_its_range(test_only):
    fn = test_only(head_dims=kernels.registry.Span(1, 256))
    fn(*make_qkv(1, 1, 4, 256))
    with pytest.raises(ValueError, match="head_dim 257 is not supported; supported: 1..256"):
        fn(*make_qkv(1, 1, 4, 257))


def test_gqa_and_unequal_lengths_refused_in_words_where_declared(test_only):
    fn = test_only(gqa=False, unequal_lengths=False)
    q, k, v = make_attention_inputs(1, 4, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="grouped-query attention is not supported.*4 heads.*2"):
        fn(q, k, v)
    q, k, v = make_attention_inputs(1, 2, 2, 1, 8, 16)
    with pytest.raises(ValueError, match="Sq != Sk is not supported.*1 positions.*8"):
        fn(q, k, v)


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


def test_flops_and_bytes_for_decoding_and_gqa_by_hand():
    # Sq = Sk: the arguments default to the square case, exactly as before.
    assert reference.flops(1, 8, 1024, 64, seq_k=1024) == reference.flops(1, 8, 1024, 64)
    # A decode token, Sq = 1 against Sk = 4096: the one query sees every key, causal or not.
    # 4 * 1 * 32 heads * 1 * 4096 * 128 = 67,108,864.
    assert reference.flops(1, 32, 1, 128, causal=True, seq_k=4096) == 67_108_864
    assert reference.flops(1, 32, 1, 128, causal=False, seq_k=4096) == 67_108_864
    # Sk = 1: 4 * 1 * 2 * 1 * 16 = 128 (the Sq == Sk halving convention must not apply to a decode)
    assert reference.decode_flops(1, 2, 1, 16) == 128
    # Sq = 2, Sk = 5 causal: the queries see 4 and 5 keys, 9 pairs of 10.
    assert reference.visible_pairs(2, 5) == 9
    assert reference.flops(1, 1, 2, 1, causal=True, seq_k=5) == 4 * 9
    # Sq = 4 > Sk = 2: queries see 0, 0, 1 and 2 keys.
    assert reference.visible_pairs(4, 2) == 3
    # GQA bytes, fp16 decode, 32 query heads sharing 8 K/V heads, D 128, Sk 4096:
    # q and o: 2 * 32 * 1 * 128 = 8,192; k and v: 2 * 8 * 4096 * 128 = 8,388,608 elements.
    assert reference.io_bytes(1, 32, 1, 128, torch.float16, seq_k=4096, kv_heads=8) == (8_192 + 8_388_608) * 2
    assert reference.io_bytes(1, 8, 1024, 64, torch.float16, backward=True) == 12 * 8 * 1024 * 64 * 2


def test_a_list_of_names_gets_the_key_error_that_lists_them():
    with pytest.raises(KeyError, match="one name, a str.*registered: naive, inplace"):
        kernels.get(["naive"])


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 3.5])
def test_a_device_torch_does_not_know_is_refused_in_words(device):
    with pytest.raises(ValueError, match="is not a device torch knows"):
        kernels.available(device)


def _raises(error):
    def impl(q, k, v, causal=True, scale=None):
        raise error
    return impl


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.31 GiB"),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                                                "allocate memory: you tried to allocate 10000000000 bytes")])
@pytest.mark.parametrize("materializes", [True, False])
def test_out_of_memory_names_the_implementation_and_the_scores_size(test_only, error, materializes):
    test_only(_raises(error), materializes_scores=materializes)  # runs out of memory at S = 50,000
    q = torch.zeros(1, 1, 50_000, 1)  # 1 x 1 x 50,000 x 50,000 float32 scores: 9.3 GiB, never allocated
    with pytest.raises(type(error)) as caught:
        kernels.get("_test_only")(q, q, q)
    message = str(caught.value)
    assert message.startswith("_test_only: out of memory") and "Sq=50000, Sk=50000" in message
    assert "S x S scores" in message and "9.3 GiB" in message and str(error) in message
    assert ("materialise" in message) == materializes
    assert caught.value.__cause__ is error


def test_other_runtime_errors_pass_through_unchanged(test_only):
    error = RuntimeError("a kernel's own failure")
    test_only(_raises(error))
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(RuntimeError) as caught:
        kernels.get("_test_only")(q, q, q)
    assert caught.value is error

"""SDPA's backend rules (torch 2.11-2.15, aten sdp_utils), asked about GPUs this CI never sees.

The rules are pure functions of a capability tuple, a dtype, a head dim and a torch release, so
each row of PyTorch's backend rules (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) is
checked here on a CPU; a GPU test checks them against what PyTorch itself does on the GPU at hand.
"""
from __future__ import annotations

import functools

import pytest
import torch

import kernels
from kernels import reference
from kernels.attention import sdpa
from kernels.attention.sdpa import capability_reason, gpu_input_reason
from tests.helpers import make_attention_inputs

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
T4, V100, A100, H100, B200, RTX5090, NEXT = (7, 5), (7, 0), (8, 0), (9, 0), (10, 0), (12, 0), (13, 0)


@pytest.mark.parametrize("cap, ok", [(T4, False), (A100, True), ((8, 6), True), (H100, True),
                                     (B200, True), (RTX5090, True), ((12, 1), True), (NEXT, False)])
def test_flash_runs_on_sm80_to_sm121(cap, ok):
    reason = capability_reason("sdpa_flash", cap)
    assert (reason is None) is ok, reason
    if not ok:
        assert f"sm_{cap[0]}{cap[1]}" in reason


def test_flash_inputs():
    assert gpu_input_reason("sdpa_flash", A100, BF16, 256) is None
    assert gpu_input_reason("sdpa_flash", A100, FP16, 59) is None     # odd head dims are padded by PyTorch
    assert "head_dim <= 256" in gpu_input_reason("sdpa_flash", H100, BF16, 264)
    assert "float16 or bfloat16" in gpu_input_reason("sdpa_flash", H100, FP32, 64)


def test_efficient_dtypes_and_alignment():
    assert gpu_input_reason("sdpa_efficient", A100, BF16, 64) is None
    assert "bfloat16 only on compute capability 8.0" in gpu_input_reason("sdpa_efficient", T4, BF16, 64)
    assert gpu_input_reason("sdpa_efficient", T4, FP16, 64) is None
    # 16-bit on tensor cores (sm_70+): a multiple of 8; fp32 on sm_80+: a multiple of 4.
    assert "multiple of 8" in gpu_input_reason("sdpa_efficient", V100, FP16, 60)
    assert "multiple of 4" in gpu_input_reason("sdpa_efficient", A100, FP32, 62)
    assert gpu_input_reason("sdpa_efficient", A100, FP32, 60) is None
    assert gpu_input_reason("sdpa_efficient", T4, FP32, 62) is None    # fp32 before sm_80: any
    assert gpu_input_reason("sdpa_efficient", H100, FP16, 512) is None  # no upper bound
    assert "float32, float16 or bfloat16" in gpu_input_reason("sdpa_efficient", H100, FP64, 64)
    assert "5.0" in capability_reason("sdpa_efficient", (3, 7))


def test_cudnn_head_dims_depend_on_capability_and_cudnn_version():
    cudnn = functools.partial(gpu_input_reason, "sdpa_cudnn", torch_version="2.13.0")
    assert cudnn(A100, BF16, 128) is None
    assert "multiple of 8" in cudnn(H100, BF16, 100)
    assert "<= 128" in cudnn(A100, BF16, 256, cudnn_version=91002)
    # torch 2.11-2.13: 256 only on capability 9.0 with cuDNN >= 9.10 (sdp_utils.cpp: major == 9 &&
    # !minor): not on sm_100 or sm_120 (the first version's bug), nor on a 9.x with another minor.
    assert cudnn(H100, BF16, 256, cudnn_version=91002) is None
    assert "9.0" in cudnn((9, 1), BF16, 256, cudnn_version=92000)
    assert "<= 128" in cudnn(H100, BF16, 256, cudnn_version=90800)
    assert "<= 128" in cudnn(B200, BF16, 256, cudnn_version=92000)
    assert "<= 128" in cudnn(RTX5090, BF16, 192, cudnn_version=92000)
    assert cudnn(H100, BF16, 192, cudnn_version=92000, requires_grad=True) is None, "2.13 has no backward gap"
    assert "float16 or bfloat16" in cudnn(H100, FP32, 64)
    assert "deterministic" in cudnn(H100, BF16, 64, deterministic=True)
    assert "8.0" in capability_reason("sdpa_cudnn", T4)


@pytest.mark.parametrize("release", ["2.14.1+cu130", "2.15.0"])
def test_cudnn_from_torch_2_14_takes_256_on_sm90_and_sm10x_after_cudnn_9_22(release):
    def cudnn(cap, d, **kw):
        return gpu_input_reason("sdpa_cudnn", cap, BF16, d, torch_version=release, **kw)

    assert cudnn(H100, 256, cudnn_version=92600) is None and cudnn(B200, 256, cudnn_version=92600) is None
    assert "<= 128" in cudnn(H100, 256, cudnn_version=92200), "cuDNN 9.22 itself is not newer than 9.22"
    assert "9.22" in cudnn(H100, 256, cudnn_version=92000), "the reason names the cuDNN it needs"
    assert "<= 128" in cudnn((10, 7), 256, cudnn_version=92500) and cudnn((10, 7), 256, cudnn_version=92600) is None
    assert "<= 128" in cudnn((9, 1), 256, cudnn_version=92600) and "<= 128" in cudnn(RTX5090, 256, cudnn_version=92600)
    # check_cudnn_d256_bprop_head_dim: with gradients, only <= 128 or exactly 256 where 256 is taken.
    assert "gradients" in cudnn(H100, 192, cudnn_version=92600, requires_grad=True)
    assert cudnn(H100, 192, cudnn_version=92600) is None, "the forward alone takes 192"
    assert cudnn(H100, 256, cudnn_version=92600, requires_grad=True) is None
    assert cudnn(H100, 128, cudnn_version=92600, requires_grad=True) is None


def test_the_rules_follow_the_installed_torch_by_default():
    installed = gpu_input_reason("sdpa_cudnn", H100, BF16, 256, cudnn_version=92000)
    assert installed == gpu_input_reason("sdpa_cudnn", H100, BF16, 256, cudnn_version=92000,
                                         torch_version=torch.__version__)
    assert sdpa.cudnn_d256_rule("2.12.0") is sdpa.CUDNN_D256_RULES[(2, 11)]
    assert sdpa.cudnn_d256_rule("2.16.0.dev20261201") is sdpa.CUDNN_D256_RULES[(2, 14)]
    assert sdpa.cudnn_d256_rule("2.15.0a0+git1234") is sdpa.CUDNN_D256_RULES[(2, 14)], "a source build's pre-release"
    assert "with torch 2.13.0," in gpu_input_reason("sdpa_cudnn", A100, BF16, 256, cudnn_version=92000,
                                                    torch_version="2.13.0+cu130"), "the build's local tag is not shown"
    with pytest.raises(ValueError, match="2.x"):
        sdpa.cudnn_d256_rule("2.x")


def test_math_has_no_rules():
    for cap in (T4, A100, NEXT):
        assert gpu_input_reason("sdpa_math", cap, FP64, 1000) is None


def test_cpu_flash_refusal_keeps_pytorchs_reasons(monkeypatch):
    # If PyTorch refuses, the error names the pinned backend and PyTorch's own reasons.
    def refuse(*args, **kwargs):
        import warnings
        warnings.warn("Flash attention kernel not used because: (Triggered internally at x.cpp)")
        warnings.warn("Because of a made-up reason")
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", refuse)
    q, k, v = make_attention_inputs(1, 2, 2, 5, 5, 8)
    with pytest.raises(kernels.CannotRun, match=r"^sdpa_flash: PyTorch refused these inputs: No available "
                                                r"kernel.*Because of a made-up reason"):
        kernels.get("sdpa_flash")(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"])
@pytest.mark.parametrize("dtype, d", [(BF16, 64), (FP16, 96), (FP32, 64), (BF16, 256), (FP16, 60)])
def test_rules_agree_with_pytorch_on_this_gpu(name, dtype, d):
    """Where the rules say a backend runs, it runs and is right; where they refuse, PyTorch does too."""
    q, k, v = make_attention_inputs(1, 2, 2, 65, 65, d, dtype=dtype, device="cuda")
    reason = sdpa.input_reason(name, q) or kernels.available("cuda")[name]
    with torch.nn.attention.sdpa_kernel(sdpa.BACKENDS[name]):
        try:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            pytorch_ran = True
        except RuntimeError:
            pytorch_ran = False
    assert pytorch_ran is (reason is None), f"{name} {dtype} d={d}: rules say {reason!r}"
    if reason is None:
        reference.judge(kernels.get(name)(q, k, v), q, k, v).assert_ok(name)


def test_default_backend_is_asked_with_the_registrys_arguments():
    # Without enable_gqa, SDPA would answer "math" for grouped-query inputs on a CPU.
    q, k, v = make_attention_inputs(1, 4, 2, 5, 5, 8)
    assert sdpa.default_backend_name(q, k, v) == "sdpa_flash"
    q1, k9, v9 = make_attention_inputs(1, 4, 2, 1, 9, 8)
    assert sdpa.default_backend_name(q1, k9, v9) == "sdpa_flash"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"])
@pytest.mark.parametrize("hq, hkv, sq, sk", [(8, 2, 128, 128), (8, 8, 1, 239), (8, 1, 113, 203), (8, 8, 203, 113)])
def test_every_backend_is_right_or_refuses_in_words(name, hq, hkv, sq, sk):
    """GQA, decoding and Sq != Sk both ways on each backend: a right answer, or CannotRun, never a wrong one."""
    q, k, v = make_attention_inputs(1, hq, hkv, sq, sk, 64, dtype=BF16, device="cuda", seed=sq)
    try:
        judgement = reference.check(kernels.get(name), q, k, v, causal=True, backward=True)
    except kernels.CannotRun as err:
        assert str(err).startswith(f"{name}: ") and len(str(err)) > len(name) + 10
        return
    judgement.assert_ok(f"{name} q{sq} k{sk} h{hq}/{hkv}")

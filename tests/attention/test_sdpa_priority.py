"""Which backend unpinned SDPA picks: the priority order and its exceptions (torch 2.11-2.15).

Checked as a table on capability tuples here; a GPU test checks the prediction against what
PyTorch itself chooses on the machine it runs on.
"""
from __future__ import annotations

import pytest
import torch

from kernels.attention import sdpa
from tests.helpers import make_qkv

A100, H200, T4, B200 = (8, 0), (9, 0), (7, 5), (10, 0)
CUDNN_9_20, CUDNN_9_8 = 92000, 90800


@pytest.mark.parametrize("cap, dtype, d, cudnn, extra, want", [
    (A100, torch.bfloat16, 64, CUDNN_9_20, {}, "sdpa_flash"),          # the default order: flash first
    (H200, torch.bfloat16, 64, CUDNN_9_20, {}, "sdpa_cudnn"),          # sm_90 with cuDNN > 9.15: cuDNN first
    (B200, torch.bfloat16, 128, CUDNN_9_20, {}, "sdpa_cudnn"),         # sm_100 too
    (H200, torch.bfloat16, 64, CUDNN_9_8, {}, "sdpa_flash"),           # an older cuDNN keeps the default
    (H200, torch.bfloat16, 64, CUDNN_9_20, {"deprioritized": True}, "sdpa_flash"),   # TORCH_CUDNN_SDPA_DEPRIORITIZED=1
    (H200, torch.bfloat16, 64, CUDNN_9_20, {"deterministic": True}, "sdpa_flash"),   # deterministic algorithms
    (H200, torch.float32, 64, CUDNN_9_20, {}, "sdpa_efficient"),       # 16-bit only for flash and cuDNN
    (T4, torch.float16, 64, CUDNN_9_20, {}, "sdpa_efficient"),         # no flash before sm_80
    (T4, torch.float16, 60, CUDNN_9_20, {}, "sdpa_math"),              # efficient needs head_dim % 8 in 16 bits
    (H200, torch.bfloat16, 200, CUDNN_9_20, {}, "sdpa_cudnn"),         # torch 2.13, sm_90 + cuDNN >= 9.10: up to 256
    (B200, torch.bfloat16, 256, CUDNN_9_20, {}, "sdpa_flash"),         # torch 2.13, sm_100: cuDNN stops at 128
    (H200, torch.bfloat16, 200, CUDNN_9_20, {"torch_version": "2.15.0"}, "sdpa_flash"),   # 2.14 on: 256 after 9.22
    (H200, torch.bfloat16, 256, 92600, {"torch_version": "2.15.0"}, "sdpa_cudnn"),        # torch 2.15's own cuDNN
    (B200, torch.bfloat16, 256, 92600, {"torch_version": "2.14.1+cu130"}, "sdpa_cudnn"),  # and sm_100 too
    (H200, torch.bfloat16, 100, CUDNN_9_20, {}, "sdpa_flash"),         # cuDNN needs a multiple of 8
], ids=["a100", "h200", "b200", "old-cudnn", "deprioritized", "deterministic", "fp32", "t4", "t4-d60", "h200-d200",
        "b200-d256", "h200-d200-torch2.15", "h200-d256-torch2.15", "b200-d256-torch2.14", "h200-d100"])
def test_predicted_backend(cap, dtype, d, cudnn, extra, want):
    extra = {"torch_version": "2.13.0", **extra}   # the rules of one release, whatever torch runs the test
    assert sdpa.predicted_backend(cap, dtype, d, cudnn_version=cudnn, **extra) == want


def test_cudnn_first_only_moves_cudnn():
    assert sdpa.priority(H200, CUDNN_9_20) == ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math"]
    assert sdpa.priority(A100, CUDNN_9_20) == list(sdpa.DEFAULT_PRIORITY)
    custom = ("sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")   # sdpa_kernel(..., set_priority=True)
    assert sdpa.priority(A100, CUDNN_9_20, order=custom) == list(custom)


def test_before_cuda_13_only_minor_0_and_3_put_cudnn_first():
    # sdp_utils.cpp's check_prefer_cudnn_attention: (!minor || minor == 3) when CUDA_VERSION < 13000.
    cudnn_first = lambda cap, cuda: sdpa.priority(cap, CUDNN_9_20, cuda_version=cuda)[0] == "sdpa_cudnn"  # noqa: E731
    assert cudnn_first((10, 3), "12.9") and cudnn_first(B200, "12.9") and cudnn_first(H200, "12.8")
    assert not cudnn_first((10, 1), "12.9"), "sm_101 on a CUDA 12 build keeps flash first"
    assert cudnn_first((10, 1), "13.0") and cudnn_first((10, 1), None), "a CUDA 13 build checks the major only"


@pytest.mark.gpu
def test_the_prediction_is_what_pytorch_picks_on_this_gpu():
    cap = torch.cuda.get_device_capability()
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            q, k, v = make_qkv(2, 4, 256, d, dtype=dtype, device="cuda")
            want = sdpa.predicted_backend_here(torch.device("cuda"), dtype, d)
            assert sdpa.default_backend_name(q, k, v) == want, f"{dtype}, D={d} on sm_{cap[0]}{cap[1]}"


def test_deterministic_mode_keeps_cudnn_first():
    # sdp_utils.cpp: deterministic algorithms do not reorder the backends; cuDNN keeps its place
    # and fails check_cudnn_deterministic (test_sdpa_rules.py), so the next in line runs.
    order = sdpa.priority(H200, CUDNN_9_20, deterministic=True, torch_version="2.13.0")
    assert order[0] == "sdpa_cudnn"


def test_predictions_reads_each_case_through_the_rules():
    from kernels.attention import sdpa as rules

    table = rules.predictions()
    assert list(table.index) == [case[0] for case in rules.PREDICTION_CASES]
    assert table["unpinned SDPA picks"].tolist() == ["sdpa_flash", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient",
                                                     "sdpa_efficient"]
    t4_fp32 = rules.predictions([("T4", (7, 5), torch.float32, False, "fp32")])
    assert t4_fp32["unpinned SDPA picks"].tolist() == ["sdpa_efficient"]


def test_rule_reasons_on_a_cpu_refuse_the_gpu_backends_and_the_table_says_why():
    q, k, _ = make_qkv(1, 2, 16, 16)
    reasons = sdpa.rule_reasons(("sdpa_math", "sdpa_flash", "sdpa_cudnn"), torch.device("cpu"), q, k)
    assert reasons["sdpa_math"] is None and reasons["sdpa_flash"] is None and reasons["sdpa_cudnn"]
    table = sdpa.reasons_table(reasons)
    assert table["runs on these inputs"].tolist() == [True, True, False]
    assert table.loc["sdpa_cudnn", "why not"] == reasons["sdpa_cudnn"] and table.loc["sdpa_math", "why not"] == ""

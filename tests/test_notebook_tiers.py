"""The hardware-tier logic, fed device descriptions (it must work for GPUs this CI never sees)."""
import pytest

from kernels.notebook import GPU, plan

T4 = GPU("Tesla T4", (7, 5))
A100 = GPU("NVIDIA A100-SXM4-80GB", (8, 0))
H100 = GPU("NVIDIA H100 80GB HBM3", (9, 0))


def test_cpu_runs_as_asked():
    p = plan("cpu", "float32", None)
    assert (p.device, p.dtype, p.tier, p.notes) == ("cpu", "float32", "cpu", ())


def test_cuda_profile_without_a_gpu_falls_back_and_says_so():
    p = plan("cuda", "bfloat16", None)
    assert (p.device, p.dtype) == ("cpu", "float32") and "none is visible" in p.notes[0]


def test_t4_gets_float16_and_the_reasons():
    p = plan("cuda", "bfloat16", T4)
    assert (p.device, p.dtype, p.tier) == ("cuda", "float16", "t4-class")
    assert any("no bfloat16 tensor cores" in n for n in p.notes)
    assert any("flash and cuDNN" in n and "sm_75" in n for n in p.notes)


def test_t4_keeps_float16_and_float32_as_asked():
    assert plan("cuda", "float16", T4).dtype == "float16"
    assert plan("cuda", "float32", T4).dtype == "float32"


@pytest.mark.parametrize("gpu", [A100, H100], ids=["A100", "H100"])
def test_ampere_and_newer_run_everything_in_bfloat16(gpu):
    p = plan("cuda", "bfloat16", gpu)
    assert (p.device, p.dtype, p.tier, p.notes) == ("cuda", "bfloat16", "ampere+", ())


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype must be one of"):
        plan("cpu", "float8", None)


def test_auto_takes_the_gpu_when_there_is_one():
    a100 = GPU("NVIDIA A100-SXM4-80GB", (8, 0))
    assert (plan("auto", "auto", a100).device, plan("auto", "auto", a100).dtype) == ("cuda", "bfloat16")
    assert (plan("auto", "auto", None).device, plan("auto", "auto", None).dtype) == ("cpu", "float32")
    assert plan("auto", "auto", T4).dtype == "float16", "a T4 has no bfloat16 tensor cores"


def test_the_setup_box_names_the_parameters_the_page_ran_with_in_one_short_line():
    import torch

    from kernels.notebook import ran_with

    line = ran_with(device=torch.device("cpu"), dtype=torch.float32, batch=1, heads=8, seq=512, head_dim=64,
                    active_steps=5)
    assert line == "Parameters: device cpu, dtype float32, batch 1, heads 8, seq 512, head_dim 64, active_steps 5"
    assert ran_with(seq=8192, dtype=torch.bfloat16) == "Parameters: seq 8,192, dtype bfloat16"

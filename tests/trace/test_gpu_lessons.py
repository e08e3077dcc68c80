"""The reading half of every GPU branch of chapters 04-10, run on Hopper-shaped fixture steps.

Each chapter's GPU branch profiles or benchmarks on the GPU, then calls a function of
kernels.gpu_lessons on what it recorded. These tests call the same functions on steps and
benchmark points built by tests/hopper_trace.py (what an H100 launches, names sourced there;
what its sweep returns), and check that each lesson holds on a right run and fails on a run
that breaks it. Chapters 00-03 read their GPU steps from a recording
(tests/trace/test_recorded.py).
"""
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from kernels import gpu_lessons
from kernels.cuda import flash as cuda_flash
from kernels.attention import sdpa
from kernels.bench.results import FORWARD, FORWARD_BACKWARD
from kernels.notebook import LessonFailed
from kernels.trace import reader
from tests import hopper_trace as hop
from tests.gpu_trace import forward_trace

pytestmark = pytest.mark.book  # `make test-book`, beside the executed chapters
B, H, S = 2, 16, 1024


# ---- chapter 4 -----------------------------------------------------------------------------

def autotuned(block_m: int, warps: int):
    """What the autotuner's best_config exposes to the lesson (a triton.Config's kwargs and num_warps)."""
    return SimpleNamespace(kwargs={"BLOCK_M": block_m, "BLOCK_N": 64}, num_warps=warps, num_stages=3)


def on_an_unknown_gpu(label: str, rows):
    data = hop.trace(label, rows)
    data["deviceProperties"] = [{**hop.H100, "computeMinor": 9}]   # sm_99: no occupancy table knows it
    return reader.median_step(reader.load_trace(data).steps(label))


def test_chapter4_forward_cell_on_its_steps(capsys):
    block_m, warps = 64, 4
    rows = {"triton": hop.triton_forward(B, H, S, block_m, warps), "sdpa_flash": hop.FUSED["sdpa_flash"]}
    steps = {name: hop.step(name, r) for name, r in rows.items()}
    shown = []
    table = gpu_lessons.triton_forward_footprints(steps, "attn_fwd", autotuned(block_m, warps), (B, H, S),
                                                  show=shown.append)
    assert list(table.columns) == ["triton", "sdpa_flash"] and len(shown) == 3, "two kernel tables and the footprints"
    assert table.loc["est. achieved occupancy % (the trace's)", "triton"] == 0, "114688 B of shared memory: Kineto reads 0%"
    assert table.loc["resident blocks per SM", "triton"] > 0, "while the real limit (227 KiB on sm_90) lets it run"
    unknown = {name: on_an_unknown_gpu(name, r) for name, r in rows.items()}
    assert gpu_lessons.triton_forward_footprints(unknown, "attn_fwd", autotuned(block_m, warps), (B, H, S),
                                                 show=shown.append).empty
    assert "occupancy not computed" in capsys.readouterr().out, "a GPU the tables do not know: said, not a crash"
    with pytest.raises(LessonFailed, match="grid is"):
        gpu_lessons.triton_forward_footprints(steps, "attn_fwd", autotuned(128, warps), (B, H, S),
                                              show=shown.append)


def test_chapter4_forward_fails_on_a_copy_or_a_second_kernel():
    step = hop.step("triton", hop.triton_forward(B, H, S, 128, 8))
    ks = step.gpu_work
    with pytest.raises(LessonFailed, match="no copy or memset"):
        copied = hop.triton_forward(B, H, S, 128, 8) + [hop.copy("aten::copy_", hop.HTOD)]
        gpu_lessons.triton_forward(hop.step("triton", copied).gpu_work, "attn_fwd", [B * H, 8, 1], [256, 1, 1])
    with pytest.raises(LessonFailed, match="exactly one GPU kernel"):
        gpu_lessons.triton_forward(pd.concat([ks, ks]), "attn_fwd", [B * H, 8, 1], [256, 1, 1])
    with pytest.raises(LessonFailed, match="exactly one GPU kernel"):
        gpu_lessons.triton_forward(ks, "attn_bwd_dq", [B * H, 8, 1], [256, 1, 1])  # another kernel ran, not this


def test_chapter4_kineto_rule_fails_on_a_trace_that_breaks_it():
    with pytest.raises(LessonFailed, match="reads 0%"):
        gpu_lessons.kineto_zero_rule("k", 100_000, 25.0)
    with pytest.raises(LessonFailed, match="reads 0%"):
        gpu_lessons.kineto_zero_rule("k", 40_000, 0.0)


def test_chapter4_backward():
    step = hop.step("triton_fwd_bwd", hop.triton_forward_backward(B, H, S))
    names = gpu_lessons.triton_backward(step, "attn_fwd")
    assert len(names) == 4
    zeroed = hop.triton_forward_backward(B, H, S) + [hop.copy("aten::zero_", hop.MEMSET, cat="gpu_memset")]
    with pytest.raises(LessonFailed, match="no memset"):
        gpu_lessons.triton_backward(hop.step("triton_fwd_bwd", zeroed), "attn_fwd")


def test_chapter4_sweep_lesson():
    modes = (FORWARD, FORWARD_BACKWARD)
    results = hop.sweep_points(["triton", "sdpa_flash"], seqs=(1024, 2048, 4096), modes=modes,
                               failed={("sdpa_flash", 4096, FORWARD_BACKWARD): "oom"})
    gpu_lessons.ran_at_every_point(results, "triton", "triton ran everywhere")
    with pytest.raises(LessonFailed, match="S=4096 forward\\+backward: oom"):
        gpu_lessons.ran_at_every_point(results, "sdpa_flash", "flash ran everywhere")
    with pytest.raises(LessonFailed):
        gpu_lessons.ran_at_every_point(results, "cuda_v2", "a contender that never ran did not run everywhere")


# ---- chapter 5 -----------------------------------------------------------------------------

def test_chapter5_forwards_table_has_one_column_per_kernel():
    steps = {f"cuda_{v}": hop.step(f"cuda_{v}", hop.cuda_forward(v, cuda_flash.launch_config(v, 64), B, H, S))
             for v in ("v1", "v2")}
    table = gpu_lessons.cuda_forwards(steps, 64, B, H, S)
    assert list(table.columns) == ["cuda_v1", "cuda_v2"]
    assert table.loc["shared memory (trace, B)", "cuda_v2"] == cuda_flash.launch_config("v2", 64).dynamic_shared_bytes
    with pytest.raises(LessonFailed):  # v1's trace read against v2's launcher
        gpu_lessons.cuda_forwards({"cuda_v2": steps["cuda_v1"]}, 64, B, H, S)


def test_chapter5_tensor_cores_win():
    results = hop.sweep_points(["sdpa_flash", "triton", "cuda_v1", "cuda_v2"], seqs=(S,))
    assert gpu_lessons.tensor_cores_win(results) is True
    slower = hop.sweep_points(["cuda_v1", "cuda_v2"], seqs=(S,))
    slower[0].median_ms, slower[1].median_ms = slower[1].median_ms, slower[0].median_ms
    with pytest.raises(LessonFailed, match="tensor cores win"):
        gpu_lessons.tensor_cores_win(slower)
    with pytest.raises(LessonFailed, match="not both timed: v1 ok, v2 error"):
        gpu_lessons.tensor_cores_win(hop.sweep_points(["cuda_v1", "cuda_v2"], seqs=(S,),
                                                      failed={("cuda_v2", S, FORWARD): "error"}))
    assert gpu_lessons.tensor_cores_win(hop.sweep_points(["cuda_v2"], seqs=(S,))) is False, \
        "v1 not in the sweep (it could not run): nothing to compare, nothing asserted"


# ---- chapter 6 -----------------------------------------------------------------------------

def steps_of(**replace):
    rows = {**hop.FUSED, **replace}
    return {name: hop.step(name, r) for name, r in rows.items()}


def test_chapter3b_fused_kernels_read_one_kernel_each_and_kinetos_zero_rule():
    table = gpu_lessons.fused_kernels_read(steps_of())
    assert list(table.columns) == [n for n in gpu_lessons.FUSED if n in hop.FUSED]
    with pytest.raises(LessonFailed, match="sdpa_efficient launches exactly one kernel"):
        gpu_lessons.fused_kernels_read(steps_of(sdpa_efficient=hop.FUSED["sdpa_efficient"] * 2))


def test_chapter6_fused_medians_one_line_per_backend_measured():
    at_seq = {r.impl: r for r in hop.sweep_points(["naive", "sdpa_flash", "sdpa_cudnn"], seqs=(2048,))
              if r.seq == 2048}
    lines = gpu_lessons.fused_medians(at_seq).splitlines()
    flash_us = 1e3 * at_seq["sdpa_flash"].median_ms
    assert lines == [f"this run, sdpa_flash: {flash_us:.1f} µs median per forward (B=4 H=16 S=2048 D=64, bfloat16)",
                     lines[1]] and lines[1].startswith("this run, sdpa_cudnn: "), "fused backends only, in FUSED's order"


# ---- chapter 7 -----------------------------------------------------------------------------

def test_chapter7_compiled_and_flex_forwards():
    table = gpu_lessons.compiled_forward(hop.step("compiled_naive", hop.COMPILED_NAIVE).gpu_work)
    assert list(table["kind"]) == ["gemm", "softmax", "gemm"], "nvjet GEMMs around Inductor's softmax"
    gpu_lessons.flex_forward(hop.step("flex", hop.COMPILED_FLEX).gpu_work)
    with pytest.raises(LessonFailed, match="no copy"):
        gpu_lessons.compiled_forward(hop.step("c", hop.COMPILED_NAIVE + [hop.copy("aten::clone")]).gpu_work)
    with pytest.raises(LessonFailed, match="Triton kernels"):
        gpu_lessons.compiled_forward(hop.step("eager", hop.INPLACE).gpu_work)
    with pytest.raises(LessonFailed, match="one FlexAttention template"):
        gpu_lessons.flex_forward(hop.step("flex", hop.COMPILED_NAIVE).gpu_work)


# ---- chapter 8 -----------------------------------------------------------------------------

def test_chapter8_gelu_between_two_hopper_gemms():
    names = gpu_lessons.gelu_between_matmuls(hop.step("compiled_block", hop.COMPILED_BLOCK).gpu_work)
    assert names.count("triton_poi_fused_gelu_view_2") == 1 and len(names) == 5, names
    gpu_lessons.gelu_between_matmuls(hop.step("block", hop.EAGER_BLOCK_MLP).gpu_work)


def test_chapter8_on_cpu_ops():
    ops = pd.DataFrame({"name": ["aten::layer_norm", "aten::addmm", "aten::gelu", "aten::addmm"],
                        "start_us": [0.0, 1.0, 2.0, 3.0]})
    gpu_lessons.gelu_between_matmuls(ops)
    with pytest.raises(LessonFailed):
        gpu_lessons.gelu_between_matmuls(ops.iloc[[0, 1, 3, 2]].assign(start_us=[0.0, 1.0, 2.0, 3.0]))


# ---- chapter 9 -----------------------------------------------------------------------------

def test_chapter9_backward_kernels_come_from_the_engine_thread():
    steps = {name: hop.step(name, rows) for name, rows in hop.BACKWARD.items()}
    table = gpu_lessons.backward_threads(steps, "fixture")
    assert table.loc["sdpa_flash", "backward kernels (engine's thread)"] == 1
    with pytest.raises(LessonFailed):
        gpu_lessons.backward_threads({"naive": hop.step("naive", hop.NAIVE)}, "a forward only")


# ---- chapter 10 ----------------------------------------------------------------------------

def test_chapter10_decode_backend_on_hopper(monkeypatch):
    predicted = sdpa.predicted_backend((9, 0), torch.bfloat16, 64)
    monkeypatch.setattr(sdpa, "predicted_backend_here", lambda device, dtype, head_dim: predicted)
    gpu_lessons.decode_backend_here(predicted, "sdpa_math", "cuda", torch.bfloat16, 64)
    with pytest.raises(LessonFailed, match="backend the priority rules predict"):
        gpu_lessons.decode_backend_here("sdpa_math", "sdpa_math", "cuda", torch.bfloat16, 64)


def a100_step(label: str):
    return reader.load_trace(forward_trace(label)).steps(label)[0]


def test_the_naive_copy_fails_on_a_forward_without_it():
    """Chapters 1 and 2 assert it holds on a recording (tests/trace/test_recorded.py, which also
    plants an in-place run that still copies)."""
    with pytest.raises(LessonFailed, match="six GPU activities"):
        gpu_lessons.naive_copy_on_gpu(a100_step("inplace"))


def test_the_math_backends_gemms_read_fp32_and_a_16_bit_gemm_fails():
    table = gpu_lessons.math_gemms_not_16bit(a100_step("sdpa_math"), "fixture A100")
    assert "gemm" in set(table["kind"]) and table["name"].str.len().max() <= 70
    with pytest.raises(LessonFailed, match="16 bits"):
        gpu_lessons.math_gemms_not_16bit(a100_step("naive"), "fixture A100")

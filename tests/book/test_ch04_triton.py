"""kernels.book.ch04_triton: the reading half of chapter 4's GPU branch, run on Hopper-shaped
fixture steps (tests/hopper_trace.py): each lesson holds on a right run and fails on a run that
breaks it."""
from types import SimpleNamespace

import pandas as pd
import pytest

from kernels.bench.results import FORWARD, FORWARD_BACKWARD
from kernels.book import ch04_triton as ch04
from kernels.book import gpu_kernels
from kernels.notebook import LessonFailed
from kernels.trace import reader
from tests import hopper_trace as hop

B, H, S = 2, 16, 1024


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
    table = ch04.triton_forward_footprints(steps, "attn_fwd", autotuned(block_m, warps), (B, H, S),
                                           show=shown.append)
    assert list(table.columns) == ["triton", "sdpa_flash"] and len(shown) == 3, "two kernel tables and the footprints"
    assert table.loc["est. achieved occupancy % (the trace's)", "triton"] == 0, "114688 B of shared memory: Kineto reads 0%"
    assert table.loc["resident blocks per SM", "triton"] > 0, "while the real limit (227 KiB on sm_90) lets it run"
    unknown = {name: on_an_unknown_gpu(name, r) for name, r in rows.items()}
    assert ch04.triton_forward_footprints(unknown, "attn_fwd", autotuned(block_m, warps), (B, H, S),
                                          show=shown.append).empty
    assert "occupancy not computed" in capsys.readouterr().out, "a GPU the tables do not know: said, not a crash"
    with pytest.raises(LessonFailed, match="grid is"):
        ch04.triton_forward_footprints(steps, "attn_fwd", autotuned(128, warps), (B, H, S),
                                       show=shown.append)


def test_chapter4_forward_fails_on_a_copy_or_a_second_kernel():
    step = hop.step("triton", hop.triton_forward(B, H, S, 128, 8))
    ks = step.gpu_work
    with pytest.raises(LessonFailed, match="no copy or memset"):
        copied = hop.triton_forward(B, H, S, 128, 8) + [hop.copy("aten::copy_", hop.HTOD)]
        ch04.triton_forward(hop.step("triton", copied).gpu_work, "attn_fwd", [B * H, 8, 1], [256, 1, 1])
    with pytest.raises(LessonFailed, match="exactly one GPU kernel"):
        ch04.triton_forward(pd.concat([ks, ks]), "attn_fwd", [B * H, 8, 1], [256, 1, 1])
    with pytest.raises(LessonFailed, match="exactly one GPU kernel"):
        ch04.triton_forward(ks, "attn_bwd_dq", [B * H, 8, 1], [256, 1, 1])  # another kernel ran, not this


def test_the_kineto_rule_fails_on_a_trace_that_breaks_it():
    with pytest.raises(LessonFailed, match="reads 0%"):
        gpu_kernels.kineto_zero_rule("k", 100_000, 25.0)
    with pytest.raises(LessonFailed, match="reads 0%"):
        gpu_kernels.kineto_zero_rule("k", 40_000, 0.0)


def test_chapter4_backward():
    step = hop.step("triton_fwd_bwd", hop.triton_forward_backward(B, H, S))
    names = ch04.triton_backward(step, "attn_fwd")
    assert len(names) == 4
    zeroed = hop.triton_forward_backward(B, H, S) + [hop.copy("aten::zero_", hop.MEMSET, cat="gpu_memset")]
    with pytest.raises(LessonFailed, match="no memset"):
        ch04.triton_backward(hop.step("triton_fwd_bwd", zeroed), "attn_fwd")


def test_chapter4_sweep_lesson():
    modes = (FORWARD, FORWARD_BACKWARD)
    results = hop.sweep_points(["triton", "sdpa_flash"], seqs=(1024, 2048, 4096), modes=modes,
                               failed={("sdpa_flash", 4096, FORWARD_BACKWARD): "oom"})
    ch04.ran_at_every_point(results, "triton", "triton ran everywhere")
    with pytest.raises(LessonFailed, match="S=4096 forward\\+backward: oom"):
        ch04.ran_at_every_point(results, "sdpa_flash", "flash ran everywhere")
    with pytest.raises(LessonFailed):
        ch04.ran_at_every_point(results, "cuda_v2", "a contender that never ran did not run everywhere")

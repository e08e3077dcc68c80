"""Chapter 3b's own reading (kernels.book.ch03b_sdpa_fused): the peak-memory sweep and the CPU
flash kernel's allocations on real CPU profiles, the CPU time of a first call, the reveal of the
page's occupancy question, and the fused kernels of a GPU run on Hopper-shaped fixture steps."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from kernels.book import ch03b_sdpa_fused as ch03b
from kernels.hw.occupancy import occupancy
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop


# ---- the CPU readings chapter 3 shows, on real CPU profiles -------------------------------------

def _profile(name: str, seq: int, tmp_path):
    from kernels.trace import record
    from tests.helpers import make_qkv
    import kernels

    q, k, v = make_qkv(1, 2, seq, 16, seed=1)
    run = record.profile(kernels.get(name), q, k, v, label=name, wait=0, warmup=1, active=1, trace_dir=tmp_path)
    return run.step(), q


def test_the_peak_memory_sweep_grows_4x_for_math_and_says_where_a_backend_did_not_run(tmp_path):
    lengths = {"sdpa_math": [64, 128], "sdpa_flash": [64, 128, 256]}
    peaks, steps = ch03b.peak_memory_sweep(lengths, 1, 2, 16, dtype=torch.float32, device=torch.device("cpu"),
                                          trace_dir=str(tmp_path))
    assert sorted(steps) == sorted((n, s) for n, seqs in lengths.items() for s in seqs)
    assert peaks.index.tolist() == [64, 128, 256] and pd.isna(peaks.loc[256, "sdpa_math"])
    growth = ch03b.growth_per_doubling(peaks)["sdpa_math x per doubling"].dropna()
    assert 3 < growth.iloc[-1] < 4.5                     # the S x S buffers
    shown = ch03b.peaks_and_growth(peaks)
    assert not shown.isna().any().any()
    assert shown.loc[64, "math growth"] == "—" and shown.loc[256, "math (MiB)"] == "—"
    assert shown.loc[128, "math growth"] == f"{growth.loc[128]:.2f}x"
    assert shown.loc[128, "math (MiB)"] == f"{peaks.loc[128, 'sdpa_math']:,.2f}"
    assert len(ch03b.peak_memory_figure(peaks, "t").axes[0].lines) == 4   # two backends, two guides
    with pytest.raises(ValueError, match="at least one sequence length"):
        ch03b.peak_memory_sweep({"sdpa_math": []}, 1, 2, 16, dtype=torch.float32, device=torch.device("cpu"),
                               trace_dir=str(tmp_path))


def test_cpu_flash_allocations_name_the_output_and_the_log_sum_exp(tmp_path):
    step, q = _profile("sdpa_flash", 128, tmp_path)
    got = ch03b.cpu_flash_allocations(step, 1, 2, 128, 16, q.element_size())
    sizes = step.memory.loc[step.memory["bytes"] > 0, "bytes"].tolist()
    assert got["allocations"] == len(sizes) >= 2
    assert got["output"] and got["log-sum-exp"]
    assert got["scratch (KiB)"] * 1024 == sum(sizes) - 1 * 2 * 128 * 16 * 4 - 1 * 2 * 128 * 4


def test_cpu_flash_allocation_table_refuses_a_sweep_without_flash():
    """Its rows over a sweep's flash steps are chapter 3b's lessons (every row three buffers, the
    math backend's steps beside them), asserted when the chapter executes."""
    with pytest.raises(ValueError, match="no sdpa_flash step"):
        ch03b.cpu_flash_allocation_table({("sdpa_math", 128): None}, 1, 2, 16, 4)



def test_first_call_cpu_ms_separates_a_slow_first_call_from_the_median_after_it():
    import time

    seen = []

    def builds_once(x):
        if not seen:
            time.sleep(0.05)   # the first call at a new shape builds a plan
        seen.append(x)

    first, steady = ch03b.first_call_cpu_ms(builds_once, (torch.zeros(1),), calls=5)
    assert len(seen) == 5 and first >= 50 and steady < first / 5
    with pytest.raises(ValueError, match="at least 2"):
        ch03b.first_call_cpu_ms(builds_once, (), calls=1)



def test_reveal_limit_names_the_resource_that_runs_out_first_and_every_limit(capsys):
    occ = occupancy(threads_per_block=128, registers_per_thread=255, arch="sm_90")
    text = ch03b.reveal_limit("shared memory", occ)
    assert text.startswith("The resource that runs out first is registers (you guessed shared memory)")
    assert "registers 2" in text and f"shared memory {occ.blocks_by_shared_memory}" in text
    assert capsys.readouterr().out.strip() == text
    assert "(as you guessed)" in ch03b.reveal_limit("registers", occ)
    with pytest.raises(ValueError, match="guess one of"):
        ch03b.reveal_limit("L2", occ)


def steps_of(**replace):
    rows = {**hop.FUSED, **replace}
    return {name: hop.step(name, r) for name, r in rows.items()}


def test_chapter3b_fused_kernels_read_one_kernel_each_and_kinetos_zero_rule():
    table = ch03b.fused_kernels_read(steps_of())
    assert list(table.columns) == [n for n in ch03b.FUSED if n in hop.FUSED]
    with pytest.raises(LessonFailed, match="sdpa_efficient launches exactly one kernel"):
        ch03b.fused_kernels_read(steps_of(sdpa_efficient=hop.FUSED["sdpa_efficient"] * 2))

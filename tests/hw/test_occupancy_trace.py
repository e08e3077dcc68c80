"""Occupancy of a kernel as a real trace recorded it (book/data/borrowed: Qwen1.5-0.5B on an H100).

The trace's own fields are the judge: Kineto wrote "est. achieved occupancy %" and "blocks per SM"
itself, from the footprint; the recomputation here must land on them.
"""
from __future__ import annotations

import gzip
import json

import pytest

from kernels import borrowed
from kernels.hw import occupancy


def raw_flash_kernels() -> tuple[list, dict]:
    with gzip.open(borrowed.root() / borrowed.TRACELENS["h100_qwen"].file, "rt") as f:
        data = json.load(f)
    kernels = [e for e in data["traceEvents"] if e.get("cat") == "kernel" and "flash_fwd_kernel" in e["name"]]
    return kernels, data["deviceProperties"][0]


def test_recomputed_kineto_estimate_equals_every_recorded_flash_kernel_field():
    kernels, props = raw_flash_kernels()
    assert len(kernels) >= 24
    for e in kernels:
        k = occupancy.trace_kernel(e, [props])
        assert k.kineto_rounded == e["args"]["est. achieved occupancy %"]
        # Kineto's "blocks per SM" is the grid's average over the SMs, not resident blocks
        assert k.grid_blocks / k.sm_count == pytest.approx(e["args"]["blocks per SM"], rel=1e-5)
        assert k.occupancy.blocks_per_sm < e["args"]["blocks per SM"]


def test_a_rocm_kernel_without_registers_is_refused_in_words():
    entry = borrowed.TRACELENS["mi300x_qwen"]
    trace = entry.trace()
    work = entry.step(trace=trace).gpu_work
    attn = work[work["name"] == "attn_fwd"].iloc[0]
    with pytest.raises(ValueError, match="registers_per_thread"):
        occupancy.trace_kernel(attn, trace.device_properties)


def test_summary_carries_the_trace_fields_and_the_recomputation():
    kernels, props = raw_flash_kernels()
    k = occupancy.trace_kernel(kernels[0], [props])
    row = k.summary()
    assert row["kernel"] == "pytorch_flash::flash_fwd_kernel"
    assert row["grid"] == kernels[0]["args"]["grid"] and row["block (threads)"] == kernels[0]["args"]["block"]
    assert row["shared memory (KiB)"] * 1024 == kernels[0]["args"]["shared memory"]
    assert row["est. achieved occupancy % (the trace's)"] == kernels[0]["args"]["est. achieved occupancy %"]
    assert row["limited by"] == "registers" and row["SMs (numSms)"] == props["numSms"]

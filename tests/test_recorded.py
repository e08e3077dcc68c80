"""The recorded-GPU-run format: made from an executed book, loaded back, never faked."""
from __future__ import annotations

import gzip
import json

import pytest

from kernels import recorded
from tests.gpu_trace import naive_a100_trace


def executed_book(tmp_path, device="NVIDIA A100-SXM4-80GB", cuda="12.8"):
    out = tmp_path / "executed"
    traces = out / "book" / "traces" / "01_naive"
    traces.mkdir(parents=True)
    with gzip.open(traces / "naive.json.gz", "wt") as f:
        json.dump(naive_a100_trace(steps=2), f)
    env = {"device": device, "cuda": cuda, "capability": [8, 0], "torch": "2.13.0", "triton": "3.7.1",
           "date": "2026-11-30 04:00 UTC"}
    (out / "report.json").write_text(json.dumps({"profile": "cuda", "parameters": {"seq": 2048},
                                                 "environment": env, "notebooks": []}))
    return out


def test_record_then_load(tmp_path):
    folder = recorded.record(executed_book(tmp_path), tmp_path / "recorded")
    assert folder.name == "nvidia-a100-sxm4-80gb"
    rec = recorded.latest(tmp_path / "recorded")
    assert rec.meta["gpu"] == "NVIDIA A100-SXM4-80GB" and rec.meta["capability"] == [8, 0]
    assert rec.label.startswith("recorded on NVIDIA A100-SXM4-80GB on 2026-11-30")
    step = rec.trace("01_naive", "naive").steps("naive")[0]
    assert len(step.kernels) == 6 and step.kernels["cat"].eq("gpu_memcpy").sum() == 1


def test_missing_variant_names_what_is_there(tmp_path):
    recorded.record(executed_book(tmp_path), tmp_path / "recorded")
    with pytest.raises(FileNotFoundError, match="01_naive/naive.json.gz"):
        recorded.latest(tmp_path / "recorded").trace("03_sdpa", "sdpa_flash")


def test_a_cpu_run_is_not_recorded(tmp_path):
    with pytest.raises(ValueError, match="not on a GPU"):
        recorded.record(executed_book(tmp_path, device="CPU (x86_64, 2 cores)", cuda=None), tmp_path / "r")


def test_no_recording_means_none(tmp_path):
    assert recorded.latest(tmp_path) is None and recorded.recordings(tmp_path) == []


def test_recordings_in_the_repository_are_well_formed():
    for rec in recorded.recordings():
        assert {"gpu", "torch", "cuda", "date"} <= set(rec.meta)
        assert list(rec.folder.rglob("*.json.gz")), f"{rec.folder} holds no traces"

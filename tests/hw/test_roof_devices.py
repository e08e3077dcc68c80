"""The roof a call sits under (kernels.trace.roof) and naming a GPU by its recorded properties
(kernels.hw.devices): the arithmetic on numbers worked by hand, the device rows on real traces."""
from __future__ import annotations

import gzip
import json

import pytest

from kernels import borrowed
from kernels.hw import devices
from kernels.trace import roof, serving
from tests.helpers import ROOT

MI300X = devices.match_gpu("AMD Instinct MI300X")


def test_the_datasheet_rows_of_the_issue():
    for name, tflops, tbps in (("NVIDIA H100 80GB HBM3", 989, 3.35), ("NVIDIA H200", 989, 4.8),
                               ("NVIDIA A100-SXM4-80GB", 312, 2.04), ("AMD Instinct MI300X", 1307.4, 5.3),
                               ("NVIDIA B200", 2250, 8.0)):
        peaks = devices.match_gpu(name)
        assert peaks.flops == pytest.approx(tflops * 1e12) and peaks.bandwidth == pytest.approx(tbps * 1e12), name


def test_a_nameless_mi300x_is_named_by_its_recorded_properties():
    path = ROOT / "tests" / "data" / "real_traces" / "tracelens" / "tracelens_inference_vllm_prefilldecode_piecewise_graph_execution.json.gz"
    with gzip.open(path, "rt") as f:
        props = json.load(f)["deviceProperties"]
    assert props and all(p["name"] == "" for p in props)
    assert {devices.match_properties(p) for p in props} == {"AMD Instinct MI300X"}
    assert "304 compute units, 192 GiB" in devices.properties_text(props[0])


def test_a_named_h100_is_not_matched_by_properties_it_shares_with_the_h800():
    with gzip.open(borrowed.root() / borrowed.TRACELENS["h100_qwen"].file, "rt") as f:
        props = json.load(f)["deviceProperties"][0]
    assert devices.match_properties({**props, "name": ""}) is None
    assert devices.match_properties({"name": ""}) is None, "missing properties match nothing"


def test_the_roof_binds_below_and_above_the_ridge():
    # 0.537 GFLOP over 134.8 MB in 59.1 µs: 4 FLOP a byte, 2.28 TB/s of 5.3 (43%).
    low = roof.place(0.53714944e9, 134811648, 59.107e-6, MI300X)
    assert low.bound == "memory" and low.intensity == pytest.approx(0.53714944e9 / 134811648)
    assert low.share == pytest.approx(134811648 / 59.107e-6 / 5.3e12)
    high = roof.place(1099.511627776e9, 512 * 2**20, 3683.5e-6, MI300X)
    assert high.bound == "compute" and high.share == pytest.approx(1099.511627776e9 / 3683.5e-6 / 1307.4e12)
    assert low.ridge == high.ridge == pytest.approx(1307.4 / 5.3)


def test_the_serving_count_is_the_causal_half_for_one_square_prefill():
    one = serving.parse_step_annotation("execute_8_context_1(sq8sk8sqsq64sqsk64)_generation_0(sq0sk0sqsq0sqsk0)")
    assert one.pairs == 32 and one.kind == "prefill"
    assert roof.serving_flops(2, 16, 16, one.pairs) == pytest.approx(roof.full_flops(2, 8, 8, 16, 16) / 2)
    assert roof.io_bytes(8 * 2, 8 * 2, 16, 16, 2) == 4 * 2 * 8 * 16 * 2
    assert serving.parse_step_annotation("ProfilerStep#3") is None


def test_two_measurements_of_a_roof_keep_the_higher_of_each_ceiling():
    from kernels.hw.devices import Peaks

    busy = Peaks("CPU: x", 100e9, 20e9, "float32", "measured")
    quiet = Peaks("CPU: x", 80e9, 30e9, "float32", "measured")
    best = busy.best_with(quiet)
    assert (best.flops, best.bandwidth) == (100e9, 30e9), "a roof is the best the device did: the higher of each"
    assert best.ridge == 100e9 / 30e9 and best.source == "measured; the best of 2 measurements"
    assert best.best_with(quiet).source == "measured; the best of 3 measurements", "a third counts on, not again"
    with pytest.raises(ValueError, match="do not combine"):
        busy.best_with(Peaks("CPU: y", 1e9, 1e9, "float32", "measured"))


def test_a_point_above_a_cpu_roof_gets_the_roof_measured_again():
    from types import SimpleNamespace

    # A roof of 1 FLOP/s and 1 byte/s, as a measurement taken while the machine was swamped would
    # read: a real point sits above it, so the roof is measured again and the higher ceilings kept.
    swamped = devices.Peaks(devices.cpu_name(), 1.0, 1.0, "float32", "measured")
    point = SimpleNamespace(tflops=1e-3, intensity=0.5)          # 1 GFLOP/s at half a FLOP a byte
    roof, above = devices.roof_for_points([point], swamped, "cpu")
    assert roof.flops > swamped.flops and roof.bandwidth > swamped.bandwidth and "best of 2" in roof.source
    assert above == [], "any CPU does over a GFLOP/s of matmul and 2 GB/s of copy"
    assert devices.roof_for_points([point], roof, "cpu") == (roof, []), "a point under its roof measures nothing"


def test_a_point_above_a_datasheet_roof_stays_above_it():
    from types import SimpleNamespace

    h200 = devices.match_gpu("NVIDIA H200")
    beyond = SimpleNamespace(tflops=2000.0, intensity=1000.0)     # twice the H200's dense bf16 peak
    assert devices.roof_for_points([beyond], h200, "cuda") == (h200, [beyond])


def test_a_point_no_cpu_reaches_stays_above_after_every_try():
    from types import SimpleNamespace

    measured = devices.measured_peaks("cpu")
    exaflop = SimpleNamespace(tflops=1e6, intensity=1e6)          # no CPU does 10^18 FLOP/s
    roof, above = devices.roof_for_points([exaflop], measured, "cpu", tries=2)
    assert above == [exaflop], "measuring again raises a roof read low; it never hides a point no roof explains"
    assert roof.source.endswith("the best of 3 measurements"), "the first roof and one for each try"

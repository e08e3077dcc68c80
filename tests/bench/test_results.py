"""kernels.bench.results read as tables: a sweep's points on an H100 (tests/hopper_trace.py)."""
import pytest

from kernels.bench.results import FORWARD, FORWARD_BACKWARD, points_table
from tests import hopper_trace as hop


def test_points_table_keeps_the_columns_asked_for_rounded():
    results = hop.sweep_points(["triton", "sdpa_flash"], seqs=(1024, 2048), modes=(FORWARD, FORWARD_BACKWARD),
                               failed={("sdpa_flash", 2048, FORWARD_BACKWARD): "oom"})
    table = points_table(results, ["impl", "mode", "seq", "status", "median_ms", "tflops"])
    assert list(table.columns) == ["impl", "mode", "seq", "status", "median_ms", "tflops"] and len(table) == 8
    assert table["tflops"].iloc[0] == 300.0 and table["median_ms"].iloc[0] == round(results[0].median_ms, 3)
    failed = table[table["status"] == "oom"]
    assert len(failed) == 1 and failed["median_ms"].isna().all(), "a point that did not run shows no time"


def test_points_table_by_implementation():
    results = hop.sweep_points(["sdpa_flash", "cuda_v1", "cuda_v2"], seqs=(2048,))
    table = points_table(results, ["status", "median_ms", "p10_ms", "p90_ms", "tflops", "reason"], index="impl")
    assert list(table.index) == ["sdpa_flash", "cuda_v1", "cuda_v2"]
    assert table.loc["cuda_v2", "median_ms"] < table.loc["cuda_v1", "median_ms"]


def test_points_table_names_an_unknown_column():
    with pytest.raises(ValueError, match="no such column 'ms'; the columns are: impl, device"):
        points_table(hop.sweep_points(["triton"]), ["impl", "ms"])

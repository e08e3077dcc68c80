"""Chapter 8's own reading (kernels.book.ch08_block) on Hopper-shaped fixture steps and on CPU ops."""
from types import SimpleNamespace

import pandas as pd
import pytest

from kernels.book import ch08_block
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop

pytestmark = pytest.mark.book


def test_gelu_between_two_hopper_gemms():
    names = ch08_block.gelu_between_matmuls(hop.step("compiled_block", hop.COMPILED_BLOCK).gpu_work)
    assert names.count("triton_poi_fused_gelu_view_2") == 1 and len(names) == 5, names
    ch08_block.gelu_between_matmuls(hop.step("block", hop.EAGER_BLOCK_MLP).gpu_work)


def test_gelu_between_matmuls_on_cpu_ops():
    ops = pd.DataFrame({"name": ["aten::layer_norm", "aten::addmm", "aten::gelu", "aten::addmm"],
                        "start_us": [0.0, 1.0, 2.0, 3.0]})
    ch08_block.gelu_between_matmuls(ops)
    with pytest.raises(LessonFailed):
        ch08_block.gelu_between_matmuls(ops.iloc[[0, 1, 3, 2]].assign(start_us=[0.0, 1.0, 2.0, 3.0]))


def test_flop_table_shows_the_counted_columns_and_a_percent_share():
    shares = pd.DataFrame({"linear (GFLOP)": [3.0], "attention (GFLOP)": [1.0], "formula linear": [3.0],
                           "formula attention": [1.0], "attention share": [0.25]}, index=pd.Index([512], name="seq"))
    shown = ch08_block.flop_table(shares)
    assert list(shown.data.columns) == ["linear (GFLOP)", "attention (GFLOP)", "attention's share"]
    assert "25.0%" in shown.to_html()


def test_reveal_set_ignores_order_and_names_what_was_missed(capsys):
    ch08_block.reveal_set(["inplace", "naive"], ["naive", "inplace", "sdpa_math"], "S×S")
    said = capsys.readouterr().out
    assert "you named 2 of them" in said and "not named: sdpa_math" in said
    ch08_block.reveal_set(["sdpa_flash"], ["naive"], "S×S")
    assert "named but without one: sdpa_flash" in capsys.readouterr().out


def _matmuls(rows):
    names, dims, types = zip(*rows)
    return SimpleNamespace(ops=pd.DataFrame({"name": names, "input_dims": dims, "input_types": types}))


def test_gemm_shapes_and_layer_flops_split_the_layers_from_the_rest():
    bf16 = ["c10::BFloat16"] * 2
    layer = [("aten::addmm", [[8], [6, 4], [4, 8], [], []], ["c10::BFloat16"] * 3 + ["Scalar"] * 2),
             ("aten::mm", [[6, 8], [8, 4]], bf16)]
    rows = layer * 2 + [("aten::bmm", [[1, 2, 1], [1, 1, 3]], ["float", "float"])]
    shapes = ch08_block.gemm_shapes(_matmuls(rows))
    assert shapes["calls"].sum() == 5 and set(shapes["type"]) == {"BFloat16", "float"}
    flops = ch08_block.layer_flops(shapes, layers=2, tokens=6)
    assert flops["gemms per layer"] == 2 and flops["width"] == 4 and flops["intermediate"] == 8
    assert flops["linear per token"] == 2 * 4 * 8 + 2 * 8 * 4
    assert flops["outside the layers"]["op"].tolist() == ["bmm"]


def test_alive_at_peak_counts_the_buffers_still_allocated_when_memory_peaks():
    mib = 2**20
    # alloc 8, alloc 2, free 2, alloc 1, alloc 8 (the peak: 17 MiB), free 8, free 1
    sizes = [8 * mib, 2 * mib, -2 * mib, mib, 8 * mib, -8 * mib, -mib, 100]
    totals = pd.Series(sizes).cumsum()
    memory = pd.DataFrame({"ts": range(len(sizes)), "bytes": sizes, "total_allocated": totals})
    assert ch08_block.alive_at_peak(SimpleNamespace(memory=memory)) == {8 * mib: 2, mib: 1}


def test_ops_and_allocations_drops_the_cpu_times():
    from unittest.mock import patch

    table = pd.DataFrame({"op": ["aten::addmm"], "input shapes": ["(2, 2)"],
                          "allocated (KiB, incl. children)": [4.0]})
    ops = pd.DataFrame({"name": ["aten::addmm"], "depth": [0], "is_view": [False], "alloc_bytes": [4096]})
    with patch("kernels.trace.tables.op_table", return_value=table) as op_table:
        shown = ch08_block.ops_and_allocations(SimpleNamespace(ops=ops))
    assert op_table.call_args.kwargs["times"] is False, "one profile's CPU times are not shown"
    assert list(shown.columns) == ["op", "input shapes", "allocated (KiB)"]
    assert len(shown) == 1, "no compiled region: no row added"


def test_ops_and_allocations_shows_what_a_compiled_region_allocated_itself():
    from unittest.mock import patch

    kib = 1024
    ops = pd.DataFrame({"name": ["TorchDynamo Cache Lookup", "Torch-Compiled Region: 0/0", "aten::addmm", "aten::copy_",
                                 "aten::t", "aten::sdpa", "aten::add"],
                        "depth": [0, 0, 1, 2, 1, 1, 0], "is_view": [False, False, False, False, True, False, False],
                        "alloc_bytes": [0, 10 * kib, 0, 0, 0, 3 * kib, 2 * kib]})
    kept = ops[~ops["is_view"]]
    table = pd.DataFrame({"op": kept["name"].tolist(), "input shapes": [""] * len(kept),
                          "allocated (KiB, incl. children)": (kept["alloc_bytes"] / kib).tolist()})
    with patch("kernels.trace.tables.op_table", return_value=table):
        shown = ch08_block.ops_and_allocations(SimpleNamespace(ops=ops))
    assert shown["op"].iloc[2].endswith("(the region's own code)"), shown
    assert shown["allocated (KiB)"].tolist() == [0, 10, 7, 0, 0, 3, 2], "the region's own 7 KiB sit under it"

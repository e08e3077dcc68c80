"""Chapter 12's own reading (kernels.book.ch12_real_models) on the TraceLens traces it shows:
TimeSformer's input from its recorded shapes, the passes over its scores, each step's largest kind."""
import pandas as pd
import pytest

from kernels.book import ch12_real_models as ch12
from kernels.borrowed import TRACELENS
from kernels.trace import breakdown
from kernels.trace.attention import find_attention


@pytest.fixture(scope="module")
def timesformer():
    report = find_attention(TRACELENS["h100_timesformer"].step())
    return report, max(report.calls, key=lambda c: c.gpu_us)


def test_every_short_name_is_a_borrowed_trace():
    assert set(ch12.SHORT) <= set(TRACELENS) and len(set(ch12.SHORT.values())) == len(ch12.SHORT)


def test_the_scores_are_written_three_times_and_read_three_times(timesformer):
    report, longest = timesformer
    passes = ch12.score_passes(longest, report.step)
    assert passes == {"between": ["aten::mul", "aten::_softmax"], "writes": 3, "reads": 3}
    short = min(report.calls, key=lambda c: c.sq)
    assert ch12.score_passes(short, report.step)["between"] == ["aten::mul", "aten::_softmax"]


def test_largest_kind_leaves_attention_out():
    reports = {name: find_attention(TRACELENS[key].step()) for key, name in ch12.SHORT.items() if "qwen" in key}
    largest = ch12.largest_kind(breakdown.shares(reports))
    assert largest.to_dict() == {"H100 Qwen": "elementwise", "MI300X Qwen": "gemm"}
    planted = pd.DataFrame({"attention": [0.9], "gemm": [0.05], "copy": [0.05]}, index=["hand-written"])
    assert ch12.largest_kind(planted)["hand-written"] == "gemm"


def test_calls_and_tensors_in_words():
    report = find_attention(TRACELENS["h100_qwen"].step())
    assert ch12.calls_text(report.calls) == "24 calls, all B·H 256 x 559 x 559 x 64, causal"
    mixed = find_attention(TRACELENS["h100_timesformer"].step()).calls
    with pytest.raises(ValueError, match="2 shapes"):
        ch12.calls_text(mixed)
    assert ch12.tensors_text({"q": [1, 8, 512, 64], "k": [1, 8, 512, 64], "v": [1, 8, 512, 64], "layout": "BHSD"}) \
        == "q, k, v [1, 8, 512, 64]"
    assert ch12.tensors_text({"q": [1, 8, 1, 64], "k": [1, 2, 9, 64], "v": [1, 2, 9, 64]}) \
        == "q [1, 8, 1, 64], k [1, 2, 9, 64], v [1, 2, 9, 64]"


def test_rest_in_percent_and_words():
    rest = pd.DataFrame({"kind": ["gemm"], "work": [3], "GPU µs": [10.0], "share": [0.21168]}, index=["aten::mm"])
    shown = ch12.rest_in_percent(rest)
    assert list(shown.columns) == ["kind", "kernels launched", "GPU µs", "% of the step"] and shown["% of the step"].iloc[0] == 21.2
    assert shown["kind"].iloc[0] == "GEMM"   # the name the share bars give the kind


def test_shapes_table_says_none_only_without_gpu_work():
    cpu = {"a": pd.DataFrame({"GFLOP": ["0.27"], "GPU µs": [0.0]}), "b": pd.DataFrame({"GFLOP": [""], "GPU µs": [0.0]})}
    joined = ch12.shapes_table(cpu)
    assert joined["GFLOP"].tolist() == ["0.27", "?"] and joined["GPU µs"].tolist() == ["none", "none"]
    gpu = {"a": pd.DataFrame({"GFLOP": ["0.27"], "GPU µs": [12.5]})}
    assert ch12.shapes_table(gpu)["GPU µs"].tolist() == [12.5]


def test_trace_links_prefer_the_copy_beside_the_notebook(tmp_path):
    found = ch12.trace_links({"h100_bert": "H100 BERT"}, here=tmp_path)
    assert found[0].path.exists() and found[0].title == "H100 BERT"
    beside = tmp_path / "data" / "borrowed"
    beside.mkdir(parents=True)
    (beside / TRACELENS["h100_bert"].file).write_bytes(found[0].path.read_bytes())
    assert ch12.trace_links({"h100_bert": "H100 BERT"}, here=tmp_path)[0].path == beside / TRACELENS["h100_bert"].file


def test_the_share_figure_keeps_every_kind_in_its_legend():
    reports = {name: find_attention(TRACELENS[key].step()) for key, name in ch12.SHORT.items() if "qwen" in key}
    fig = ch12.legend_in_two_columns(breakdown.share_bars(breakdown.shares(reports)))
    legend = fig.axes[0].get_legend()
    assert legend._ncols == 2 and "attention" in [t.get_text() for t in legend.get_texts()]


def test_calls_by_shape_and_kernels_in_order(timesformer):
    report, longest = timesformer
    by_shape = ch12.calls_by_shape(report.table())
    assert list(by_shape.columns) == ["calls", "kernels a call", "GPU µs, all calls"]
    assert by_shape["calls"].sum() == len(report.calls) and len(by_shape) == 2
    assert by_shape["GPU µs, all calls"].sum() == pytest.approx(sum(c.gpu_us for c in report.calls), rel=1e-3)
    kernels = ch12.kernels_in_order(longest)
    assert list(kernels.columns) == ["kernel", "op", "GPU µs"] and list(kernels.index) == list(range(len(longest.kernels)))
    assert kernels["op"].tolist() == longest.kernels["op"].tolist()
    assert kernels.loc[kernels["GPU µs"].idxmax(), "op"] == "aten::_softmax"

"""kernels.trace.record on real CPU traces. (The reader on GPU traces: test_trace_real.py and
test_model_steps_real.py, on real ones, each number recounted from the raw JSON.)"""
from __future__ import annotations

import matplotlib
import pytest
import torch

from kernels.trace import reader
from kernels.trace import record
from kernels.trace import tables
from kernels.trace import timeline
import kernels
from tests.helpers import make_qkv

matplotlib.use("Agg")
B, H, S, D = 1, 4, 96, 32


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    q, k, v = make_qkv(B, H, S, D)
    out = tmp_path_factory.mktemp("traces")
    return {name: record.profile(kernels.get(name), q, k, v, label=name, active=3, trace_dir=out)
            for name in ("naive", "inplace", "sdpa_flash")}


def test_ops_are_nested_in_call_order(cpu_runs):
    step = cpu_runs["naive"].step(0)
    top = step.top_level()["name"].tolist()
    assert top == ["aten::matmul", "aten::mul", "aten::masked_fill", "aten::softmax", "aten::matmul"]
    bmm = step.find("aten::bmm")
    assert len(bmm) == 2 and all(step.ops.at[p, "name"] == "aten::matmul" for p in bmm["parent"])
    assert (step.ops["start_us"].diff().dropna() >= 0).all()
    # children lie inside their parents
    for i, p in enumerate(step.ops["parent"]):
        if p >= 0:
            assert step.ops.at[p, "ts"] <= step.ops.at[i, "ts"] and step.ops.at[i, "end"] <= step.ops.at[p, "end"]


def test_tables_counts_and_timeline(cpu_runs):
    steps = cpu_runs["naive"].steps()
    counts = tables.counts(steps)
    assert len(counts) == 3 and counts["ops"].nunique() == 1
    table = tables.op_table(steps[0])
    assert table["op"].str.contains("clone").any()
    fig = timeline.timeline(reader.median_step(steps))
    ax = fig.axes[0]
    assert "CPU depth 0" in [t.get_text() for t in ax.get_yticklabels()]
    bars = sum(len(c.get_paths()) for c in ax.collections)  # one collection per track and colour
    assert bars >= len(steps[0].ops[~steps[0].ops["is_view"]]) + 1, "a bar per working op, and the label's"


def test_unknown_label_is_a_clear_error(cpu_runs):
    with pytest.raises(KeyError, match="labels: \\['naive'\\]"):
        cpu_runs["naive"].trace.steps("nope")


def test_profile_keeps_kineto_noise_out_of_stderr(capfd, tmp_path):
    record.profile(torch.relu, torch.randn(8), trace_dir=tmp_path, active=1)
    assert "USDT" not in capfd.readouterr().err


def test_work_ops_are_the_ops_that_compute(cpu_runs):
    from collections import Counter
    naive = Counter(cpu_runs["naive"].step().work_ops())
    inplace = Counter(cpu_runs["inplace"].step().work_ops())
    # naive: two bmm (under matmul), the scale mul, the scalar's copy_ and the clone's copy_,
    # the fill on the clone, and softmax's _softmax; matmul/softmax/clone only wrap work
    assert naive == Counter({"aten::bmm": 2, "aten::mul": 1, "aten::copy_": 2, "aten::masked_fill_": 1,
                             "aten::_softmax": 1})
    assert naive - inplace == Counter({"aten::copy_": 1})
    assert cpu_runs["sdpa_flash"].step().work_ops() == ["aten::_scaled_dot_product_flash_attention_for_cpu"]

"""The readers chapters 6, 8 and 10 use on real GPU traces (book/data/borrowed), run on those
traces: what each returns, and that bad input is refused in words. (What only one page uses
is tested beside that page's module, in tests/book/.)"""
import math

import pytest

from kernels.attention import decoding
from kernels.borrowed import TRACELENS
from kernels.hw import devices
from kernels.trace.attention import find_attention


@pytest.fixture(scope="module")
def reports():
    return {key: find_attention(TRACELENS[key].step()) for key in ("h100_qwen", "mi300x_qwen", "h100_bert",
                                                                   "sglang_decode")}


def test_multiprocessors_reads_the_sm_count_of_each_vendor(reports):
    assert devices.multiprocessors(reports["h100_qwen"].step.trace.device_properties[0]) == 132
    assert devices.multiprocessors(reports["mi300x_qwen"].step.trace.device_properties[0]) == 304
    assert devices.multiprocessors({"multiProcessorCount": 108}) == 108
    with pytest.raises(ValueError, match="no SM or CU count"):
        devices.multiprocessors({"name": "a GPU", "warpSize": 32})


def test_split_and_reduce_pairs_each_decode_call(reports):
    pairs = decoding.split_and_reduce(reports["sglang_decode"])
    assert len(pairs) == 36 and (pairs["kernels"] == 2).all()
    assert set(pairs["main kernel"]) == {"paged_attention_ll4mi_QKV_mfma16_kernel"}
    assert set(pairs["reduce kernel"]) == {"paged_attention_ll4mi_reduce_kernel"}
    assert set(pairs["launched by"]) == {"hipGraphLaunch"}
    assert math.isclose((pairs["main µs"] + pairs["reduce µs"]).sum(), reports["sglang_decode"].attention_gpu_us)
    assert (pairs["reduce share"] < 0.15).all() and (pairs["reduce µs"] > 0).all()
    with pytest.raises(ValueError, match="no attention call found by kernel name"):
        decoding.split_and_reduce(reports["h100_qwen"])   # fused SDPA calls, not kernels by name


def test_split_summary_sums_up_the_decode_calls(reports):
    pairs = decoding.split_and_reduce(reports["sglang_decode"])
    summary = decoding.split_summary(pairs)
    assert list(summary.index) == ["calls", "min", "median", "max"]
    assert summary.loc["calls", "main µs"] == len(pairs) == 36
    assert summary.loc["median", "reduce share"] == pairs["reduce share"].median()

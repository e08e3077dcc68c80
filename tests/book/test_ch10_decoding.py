"""Chapter 10's own reading (kernels.book.ch10_decoding): where SDPA sent its decode tokens, and
the SGLang decode step borrowed from TraceLens, read from the raw trace."""
import gzip
import json
import re

import pytest
import torch

from kernels.attention import decoding, sdpa
from kernels.book import ch10_decoding as ch10
from kernels.borrowed import TRACELENS, root
from kernels.hw import devices
from kernels.notebook import LessonFailed
from kernels.trace.attention import find_attention

QWEN3_8B = {"layers": 36, "heads": 32, "kv_heads": 8, "head_dim": 128}


@pytest.fixture(scope="module")
def sglang():
    step = TRACELENS["sglang_decode"].step()
    return step, find_attention(step)


def test_decode_backend_here_on_a_cpu_is_the_cpu_flash_kernel_for_both_calls():
    ch10.decode_backend_here("sdpa_flash", "sdpa_flash", "cpu", torch.float32, 64)
    with pytest.raises(LessonFailed):
        ch10.decode_backend_here("sdpa_flash", "sdpa_math", "cpu", torch.float32, 64)


def test_decode_backend_here_on_hopper_is_what_the_rules_predict(monkeypatch):
    predicted = sdpa.predicted_backend((9, 0), torch.bfloat16, 64)
    monkeypatch.setattr(sdpa, "predicted_backend_here", lambda device, dtype, head_dim: predicted)
    ch10.decode_backend_here(predicted, "sdpa_math", "cuda", torch.bfloat16, 64)
    with pytest.raises(LessonFailed, match="backend the priority rules predict"):
        ch10.decode_backend_here("sdpa_math", "sdpa_math", "cuda", torch.bfloat16, 64)


def test_engine_step_is_the_annotation_in_the_raw_trace(sglang):
    step, _ = sglang
    raw = json.load(gzip.open(root() / TRACELENS["sglang_decode"].file))
    names = [e["name"] for e in raw["traceEvents"] if e.get("cat") == "user_annotation"]
    assert any("_generation_32(sq32sk32785" in n for n in names), names
    assert ch10.engine_step(step.trace) == {"requests": 32, "queries": 32, "cached_tokens": 32785}
    with pytest.raises(ValueError, match="engine step annotation"):
        ch10.engine_step(TRACELENS["h100_qwen"].trace())


def test_call_traffic_is_the_cache_read_once(sglang):
    step, report = sglang
    traffic = ch10.call_traffic({"requests": 32, "queries": 32, "cached_tokens": 32785}, QWEN3_8B, report.peaks, 58.9)
    assert traffic["cache_bytes"] == 2 * 32785 * 8 * 128 * 2
    assert traffic["bytes"] == traffic["cache_bytes"] + 2 * 32 * 32 * 128 * 2
    assert round(traffic["bytes"] / 2**20, 1) == 128.6                     # TraceLens's report: 128.6 MiB
    assert round(traffic["flops"] / 1e9, 3) == 0.537                       # and 0.537 GFLOP
    assert traffic["intensity"] == pytest.approx(4, rel=0.01)              # GQA's group of 4
    assert traffic["bandwidth"] == pytest.approx(2.29e12, rel=0.01)
    assert traffic["floor_us"] == pytest.approx(traffic["bytes"] / 5.3e12 * 1e6)
    # the library's count for one query seeing every one of those keys (nothing hidden)
    assert traffic["flops"] == pytest.approx(decoding.call_flops(1, 32, 1, 32785, 128, causal=False))


def test_split_table_gives_the_reduce_share_both_ways(sglang):
    _, report = sglang
    pairs = decoding.split_and_reduce(report)
    table = ch10.split_table(pairs)
    assert list(table.columns) == ["min", "median", "max"]
    of_call, of_main = table.loc["reduce, % of the call", "median"], table.loc["reduce, % of the main kernel", "median"]
    assert round(of_call, 1) == 8.4 and round(of_main, 1) == 9.2
    assert of_main == pytest.approx(100 * (pairs["reduce µs"] / pairs["main µs"]).median())


def test_graph_replay_runs_back_to_back(sglang):
    step, _ = sglang
    replay = ch10.graph_replay(step)
    assert replay["launch_calls"] == 1 and replay["kernels"] == 544
    assert replay["median_gap_us"] < 0.01 and 0.95 < replay["busy_us"] / replay["span_us"] < 1
    eager = ch10.graph_replay(TRACELENS["h100_qwen"].step())
    assert eager["kernels"] == 0 and eager["launch_calls"] == 0


def test_the_sglang_kernels_are_aiters(sglang):
    _, report = sglang
    pairs = decoding.split_and_reduce(report)
    assert set(pairs["main kernel"]) == {"paged_attention_ll4mi_QKV_mfma16_kernel"}
    assert report.peaks == devices.match_gpu("AMD Instinct MI300X")
    assert re.match(r"paged_attention_ll4mi_", pairs["reduce kernel"].iloc[0])


def test_the_intensity_exercise_never_prints_its_answer():
    """Exercise 10's check names a wrong answer's mistake, never the number it wanted (issue #42)."""
    from kernels.exercises.decoding import check_decode_intensity
    from kernels.exercises.judge import ExerciseFailed

    def off(h, hkv, sk, d, elem):
        return 1.37 * 4 * h * sk * d / ((2 * h * d + 2 * hkv * sk * d) * elem)

    with pytest.raises(ExerciseFailed) as failed:
        check_decode_intensity(off, seed=5)
    words = str(failed.value)
    h, hkv, sk, d, elem = map(int, re.search(r"\[(\d+) query heads, (\d+) K/V heads, (\d+) cached tokens, D=(\d+), "
                                             r"(\d+) bytes", words).groups())
    want = decoding.intensity(1, h, 1, sk, d, hkv, {2: torch.bfloat16, 4: torch.float32}[elem])
    assert "not a mistake the check recognizes" in words
    printed = set(re.findall(r"\d+\.\d+", words))
    assert not printed & {f"{want:.{digits}g}" for digits in (3, 4, 5)}, words

"""Chapter 10's own reading (kernels.book.ch10_decoding): where SDPA sent its decode tokens, and
the SGLang decode step borrowed from TraceLens: its graph replay, and the library's reading of it
with the capture trace that ships beside it."""
import re
from pathlib import Path

import pytest
import torch

from kernels.attention import decoding, sdpa
from kernels.book import ch10_decoding as ch10
from kernels.borrowed import SGLANG_DECODE_CAPTURE, TRACELENS, root
from kernels.hw import devices
from kernels.notebook import LessonFailed
from kernels.trace.attention import find_attention


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


def test_the_library_reads_the_decode_step_with_its_capture_trace():
    """Chapter 10's numbers are the library's, given the capture trace that ships with the book."""
    step = TRACELENS["sglang_decode"].step()
    report = find_attention(step, capture=SGLANG_DECODE_CAPTURE.trace())
    engine = report.engine_steps[0]
    assert (engine.generation_requests, engine.g_sq, engine.g_sk, engine.context_requests) == (32, 32, 32785, 0)
    call = report.calls[0]
    assert (call.heads, call.kv_heads, call.d, call.dv) == (32, 8, 128, 128)
    assert SGLANG_DECODE_CAPTURE.file in call.heads_source
    assert call.bytes == 2 * (32 * 32 + 32785 * 8) * 128 * 2        # q and o, then the KV cache, bf16
    assert round(call.bytes / 2**20, 1) == 128.6                     # TraceLens's report: 128.6 MiB
    assert round(call.flops / 1e9, 3) == 0.537                       # and 0.537 GFLOP
    assert call.flops == pytest.approx(decoding.call_flops(1, 32, 1, 32785, 128, causal=False))
    assert call.roof().intensity == pytest.approx(4, rel=0.01) and call.bound == "memory"
    # without the capture trace nothing gives the heads: no bytes, no roof, and the reason says so
    bare = find_attention(step).calls[0]
    assert bare.bytes is None and bare.roof() is None and "--capture" in bare.why()["bytes"]


def test_the_capture_trace_ships_byte_for_byte_and_is_credited():
    shipped = root() / SGLANG_DECODE_CAPTURE.file
    original = Path(__file__).parents[1] / "data" / "real_traces" / "tracelens" / SGLANG_DECODE_CAPTURE.file
    assert shipped.read_bytes() == original.read_bytes()
    credit = SGLANG_DECODE_CAPTURE.credit()
    assert "AMD's TraceLens" in credit and "171dd747" in credit and "MIT" in credit and "AMD Instinct MI300X" in credit
    assert SGLANG_DECODE_CAPTURE.file in (root() / "README.md").read_text()


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


def test_the_counts_table_in_units_keeps_every_number_in_flop_units_and_mib():
    counts = decoding.counts_table((512, 4096), heads=32, head_dim=128, dtype=torch.bfloat16)
    shown = ch10.counts_in_units(counts)
    assert list(shown.columns) == ["decode MFLOP", "decode MiB", "decode FLOP/byte",
                                   "prefill GFLOP", "prefill MiB", "prefill FLOP/byte"]
    assert shown.index.name == "S (keys)" and shown.index.tolist() == [512, 4096]
    assert shown.loc[4096, "decode MFLOP"] == f"{4 * 32 * 4096 * 128 / 1e6:,.1f}"  # 67.1
    assert shown.loc[4096, "decode MiB"] == f"{(2 * 32 * 4096 * 128 + 2 * 32 * 128) * 2 / 2**20:.1f}"
    assert shown["decode FLOP/byte"].tolist() == [f"{x:.2f}" for x in counts[("FLOP/byte", "decode")]]
    assert shown.loc[4096, "prefill MiB"] == "128.0"


def test_shown_tables_round_and_shorten_their_headers():
    import pandas as pd

    rows = pd.DataFrame({"KV cache (MiB)": [4096.0, 1024.0], "bytes per decode token, one layer (MiB)": [128.0, 32.0156],
                         "FLOP/byte": [0.99994, 3.998]})
    shown = ch10.sharing_shown(rows)
    assert list(shown.columns) == ["KV cache (MiB)", "MiB read per token, one layer", "FLOP/byte"]
    assert shown["MiB read per token, one layer"].tolist() == ["128.0", "32.0"] and shown["FLOP/byte"].tolist() == ["1.00", "4.00"]
    copies = ch10.copies_shown(pd.DataFrame({"allocated (KiB)": [6.547, 2067.0], "aten::cat calls": [0, 2]}))
    assert copies["allocated (KiB)"].tolist() == ["6.5", "2,067.0"] and copies["aten::cat calls"].tolist() == [0, 2]


def test_the_decode_gap_says_how_far_under_the_slope_and_nothing_without_points():
    from types import SimpleNamespace

    peaks = SimpleNamespace(attainable=lambda intensity: intensity * 2.8e9)  # 2.8 GB/s slope
    points = [SimpleNamespace(intensity=0.5, tflops=1.4e-3 / 40), SimpleNamespace(intensity=0.5, tflops=1.4e-3 / 80)]
    gap = ch10.decode_gap(points, peaks)
    assert "reach only 1% to 2% of their memory slope" in gap and "fixed cost per call" in gap and "SGLang" in gap
    near = ch10.decode_gap([SimpleNamespace(intensity=0.5, tflops=1.4e-3 * 0.9)], peaks)
    assert near.startswith("The decode point drawn reaches 90%") and "fixed cost" not in near
    assert "No decode point passed the spread check" in ch10.decode_gap([], peaks)


def test_reduce_shares_name_median_and_maximum_of_call_and_main():
    import pandas as pd

    pairs = pd.DataFrame({"main µs": [90.0, 80.0, 100.0], "reduce µs": [10.0, 20.0, 5.0]})
    pairs["reduce share"] = pairs["reduce µs"] / (pairs["main µs"] + pairs["reduce µs"])
    shares = ch10.reduce_shares(pairs)
    assert shares["call_median"] == pytest.approx(0.1) and shares["call_max"] == pytest.approx(0.2)
    assert shares["main_median"] == pytest.approx(10 / 90) and shares["main_max"] == pytest.approx(0.25)


def test_prefill_and_decode_are_timed_in_the_same_rounds():
    times = ch10.phase_turns("sdpa_math", 64, batch=1, heads=2, head_dim=16, dtype=torch.float32, device="cpu", rounds=5)
    assert set(times) == {"prefill", "decode"} and [len(t) for t in times.values()] == [5, 5], \
        "one prefill and one decode call a round, every round kept"


def test_phase_claims_hold_round_by_round():
    from types import SimpleNamespace

    prefill, decode = SimpleNamespace(seq=100, flops=1e9), SimpleNamespace(seq=100, flops=1e6)
    # round 3: a burst slowed the prefill alone; decode per token is still 10x or more
    times = {"prefill": [10.0, 10.0, 40.0, 10.0], "decode": [1.0, 2.0, 1.0, 1.0]}
    (rates, rate_claim, _), (tokens, token_claim, evidence) = ch10.phase_claims(times, prefill, decode)
    assert rates == [True] * 4 and "fewer FLOP/s" in rate_claim, "decode's FLOP/s: 1e6/1 against 1e9/10, each round"
    assert tokens == [True, True, False, True] and "five times" in token_claim, \
        "a decode token against a prefill token, round by round: 10x, 20x, 2.5x, 10x"
    assert evidence.startswith("10×"), f"the median of the rounds' ratios first: {evidence}"

"""The benchmark harness (kernels.bench) and the device ceilings it reports (kernels.hw.devices)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from kernels.bench import cli
from kernels.bench import comparison
from kernels.bench import gpu_checks
from kernels.bench import results
from kernels.bench import sweep
from kernels.bench import timing
from kernels.trace import record
import kernels
from kernels.hw import devices
from kernels.bench.results import FORWARD, FORWARD_BACKWARD
from tests.helpers import ROOT

CPU = torch.device("cpu")


def point(name, b, h, s, d, causal, backward, dtype=torch.float32):
    mode = FORWARD_BACKWARD if backward else FORWARD
    return sweep.new_point(name, CPU, dtype, b, h, s, d, causal, mode)


# ----------------------------------------------------------------------------- counts


def test_bytes_fused_vs_materialized_by_hand():
    # fused (sdpa_flash): q, k, v, o once = 4 * B*H*S*D elements * 4 bytes (fp32)
    #   = 4 * 1*8*1024*64 * 4 = 8,388,608 bytes
    assert point("sdpa_flash", 1, 8, 1024, 64, True, False).bytes == 8_388_608
    # naive writes and reads the S×S scores: + 4 * B*H*S² elements * 4 bytes
    #   = 4 * 8 * 1024**2 * 4 = 134,217,728; total 142,606,336
    for name in ("naive", "inplace", "sdpa_math"):
        assert point(name, 1, 8, 1024, 64, True, False).bytes == 142_606_336


# ----------------------------------------------------------------------------- devices

@pytest.mark.parametrize("reported, table_name, tflops, tbps", [
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 312, 2.04),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 989, 3.35),
    ("NVIDIA H200", "NVIDIA H200", 989, 4.8),
    ("Tesla T4", "NVIDIA T4", 65, 0.32),
    ("NVIDIA B200", "NVIDIA B200", 2250, 8.0),
    ("AMD Instinct MI300X", "AMD Instinct MI300X", 1307.4, 5.3),
    ("AMD Instinct MI300X VF", "AMD Instinct MI300X", 1307.4, 5.3),   # a VM's view of the same chip
])
def test_gpu_names_match_their_peaks(reported, table_name, tflops, tbps):
    found = devices.match_gpu(reported)
    assert found.name == table_name
    assert found.flops == pytest.approx(tflops * 1e12)
    assert found.bandwidth == pytest.approx(tbps * 1e12)


@pytest.mark.parametrize("other", ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 PCIe", "NVIDIA GH200 480GB",
                                   "NVIDIA GeForce RTX 4090", "NVIDIA GB200", "AMD Instinct MI300A"])
def test_gpus_not_in_table_are_not_guessed(other):
    assert devices.match_gpu(other) is None


def test_cpu_is_measured_once_and_described():
    first = devices.peaks("cpu")
    assert first is devices.peaks("cpu")  # cached per process
    assert first.source.startswith("CPU: measured")
    assert first.flops > 1e8 and first.bandwidth > 1e8
    info = devices.describe_device("cpu")
    assert info["kind"] == "cpu"
    assert info["peaks"]["flops"] == first.flops
    assert info["versions"]["torch"] == torch.__version__
    label = devices.run_label("cpu")
    assert label.startswith(f"{devices.device_name('cpu')} (cpu), ") and f"torch {torch.__version__}" in label


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_describe_cuda_without_gpu_says_what_it_needs():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        devices.describe_device("cuda")


# ----------------------------------------------------------------------------- sweeps

QUICK = dict(batch=1, heads=2, warmup=1, reps=5, min_reps=3, max_seconds=0.2, progress=None)


def test_book_budget_is_sweep_arguments_and_shorter_on_a_cpu():
    import inspect

    cpu, gpu = sweep.book_budget(False), sweep.book_budget(True)
    inspect.signature(sweep.sweep).bind(**cpu)   # a TypeError if a key is not one of sweep's
    assert cpu["reps"] < gpu["reps"] and cpu["max_seconds"] < gpu["max_seconds"]


@pytest.fixture(scope="module")
def small_sweep():
    """A real CPU sweep: 2 implementations x 2 sequence lengths, memory measured."""
    return sweep.sweep(["inplace", "sdpa_flash"], seqs=(32, 128), head_dims=(16,), **QUICK)


def test_small_sweep_measures_every_point(small_sweep):
    assert [(r.impl, r.seq) for r in small_sweep] == [
        ("inplace", 32), ("inplace", 128), ("sdpa_flash", 32), ("sdpa_flash", 128)]
    for r in small_sweep:
        assert r.status == "ok", r.reason
        assert 3 <= r.reps <= 5
        assert 0 < r.p10_ms <= r.median_ms <= r.p90_ms
        assert r.tflops == pytest.approx(r.flops / (r.median_ms * 1e-3) / 1e12)
        assert r.gbps == pytest.approx(r.bytes / (r.median_ms * 1e-3) / 1e9)
        assert r.memory_method == "profiler memory events"


def test_materializing_implementation_peaks_above_its_scores(small_sweep):
    # inplace holds the S×S scores: B*H*S*S*4 bytes = 1*2*128*128*4 = 131,072 at least
    inplace_128 = next(r for r in small_sweep if r.impl == "inplace" and r.seq == 128)
    assert inplace_128.peak_memory_bytes >= 131_072
    inplace_32 = next(r for r in small_sweep if r.impl == "inplace" and r.seq == 32)
    assert inplace_32.peak_memory_bytes < inplace_128.peak_memory_bytes


def test_results_round_trip_through_json_and_csv(small_sweep, tmp_path):
    json_path, csv_path = results.save_results(small_sweep, tmp_path / "run")
    assert (json_path.name, csv_path.name) == ("run.json", "run.csv")
    data = json.loads(json_path.read_text())  # valid JSON, no NaN
    assert {"device", "versions", "date", "command", "memory_methods"} <= set(data["meta"])
    table = pd.read_csv(csv_path)
    assert list(table.columns) == results.COLUMNS and table["median_ms"].tolist() == [r.median_ms for r in small_sweep]
    for path in (json_path, csv_path, tmp_path / "run"):   # the CSV's name or the stem finds the JSON
        back = results.load_results(path)
        assert list(back) == list(small_sweep)
    assert results.load_results(json_path).meta["device"]["kind"] == "cpu"


def test_unavailable_implementation_is_recorded_and_sweep_goes_on():
    rows = sweep.sweep(["sdpa_efficient", "inplace"], seqs=(16,), head_dims=(16,), memory=False, **QUICK)
    assert rows[0].status == "unavailable"
    assert rows[0].reason == kernels.available("cpu")["sdpa_efficient"]
    assert "CUDA" in rows[0].reason
    assert rows[0].median_ms is None and rows[0].tflops is None
    assert rows[1].status == "ok"


def test_slow_cpu_implementations_skipped_unless_named(monkeypatch):
    monkeypatch.setattr(kernels.implementation("sdpa_math"), "slow_on_cpu", True)
    by_default = sweep.sweep(None, seqs=(16,), head_dims=(16,), memory=False, **QUICK)
    status = {r.impl: r.status for r in by_default}
    assert status["sdpa_math"] == "skipped"
    assert set(status) == set(kernels.names())
    named = sweep.sweep(["sdpa_math"], seqs=(16,), head_dims=(16,), memory=False, **QUICK)
    assert named[0].status == "ok"


def failing_at(min_seq, error):
    """An implementation that runs below ``min_seq`` and raises ``error`` from there on."""
    real = kernels.get("inplace")

    def fn(q, k, v, causal=True, scale=None):
        if q.shape[-2] >= min_seq:
            raise error
        return real(q, k, v, causal=causal, scale=scale)

    return fn


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 68719476736 bytes"),
    MemoryError(),
])
def test_out_of_memory_is_recorded_and_sweep_goes_on(monkeypatch, error):
    monkeypatch.setattr(kernels.implementation("inplace"), "call", failing_at(64, error))
    rows = sweep.sweep(["inplace", "sdpa_flash"], seqs=(32, 64), head_dims=(16,), memory=False, **QUICK)
    assert [r.status for r in rows] == ["ok", "oom", "ok", "ok"]
    assert rows[1].median_ms is None and rows[1].tflops is None and rows[1].reason


def test_other_failures_are_classified(monkeypatch):
    cases = {"inplace": kernels.CannotRun("inplace: needs something this machine lacks"),
             "naive": ValueError("naive: head_dim 7 is not supported"),
             "sdpa_flash": ZeroDivisionError("a bug")}
    for name, error in cases.items():
        monkeypatch.setattr(kernels.implementation(name), "call", failing_at(1, error))
    rows = sweep.sweep(["inplace", "naive", "sdpa_flash", "sdpa_math"], seqs=(16,), head_dims=(16,),
                       memory=False, **QUICK)
    assert [r.status for r in rows] == ["unavailable", "unsupported", "error", "ok"], \
        "cannot run here is CannotRun, refused input a ValueError/TypeError, anything else an error"
    assert rows[2].reason == "ZeroDivisionError: a bug"


def test_implementation_without_autograd_records_no_backward(monkeypatch):
    real = kernels.get("sdpa_flash")

    def detached(q, k, v, causal=True, scale=None):
        return real(q, k, v, causal=causal, scale=scale).detach()  # like a kernel with no backward

    monkeypatch.setattr(kernels.implementation("sdpa_flash"), "call", detached)
    rows = sweep.sweep(["sdpa_flash"], seqs=(16,), head_dims=(16,), modes=(FORWARD, FORWARD_BACKWARD),
                       memory=False, **QUICK)
    assert [r.status for r in rows] == ["ok", "no backward"]
    assert "autograd" in rows[1].reason


def test_inputs_rotate_through_sets_larger_than_the_cache():
    pool = sweep.InputPool((1, 2, 64, 16), torch.float32, CPU, backward=False)
    # one set: 4 tensors (q, k, v, grad) of 1*2*64*16 fp32 = 4 * 2048 * 4 = 32,768 bytes
    # 64 MiB / 32,768 bytes = 2048 sets would beat the cache; capped at MAX_SETS
    assert len(pool.sets) == min(sweep.MAX_SETS, sweep.ROTATE_BYTES["cpu"] // 32_768)
    big = sweep.InputPool((1, 8, 1024, 64), torch.float32, CPU, backward=True)
    # one set: 4 * 1*8*1024*64 * 4 bytes = 8 MiB -> 64 MiB / 8 MiB = 8 sets
    assert len(big.sets) == sweep.ROTATE_BYTES["cpu"] // (8 * 2**20)
    assert big.sets[0][0].requires_grad and not big.sets[0][3].requires_grad
    seen = {id(pool.next()[0]) for _ in range(len(pool.sets))}
    assert len(seen) == len(pool.sets)
    assert all(not torch.equal(pool.sets[0][0], s[0]) for s in pool.sets[1:3])


def test_bad_sweep_arguments_are_refused():
    with pytest.raises(KeyError, match="registered"):
        sweep.sweep(["no_such_impl"], progress=None)
    with pytest.raises(ValueError, match="seqs"):
        sweep.sweep(["inplace"], seqs=(0,), progress=None)
    with pytest.raises(ValueError, match="modes"):
        sweep.sweep(["inplace"], modes=("sideways",), progress=None)
    with pytest.raises(ValueError, match="dtype"):
        sweep.sweep(["inplace"], dtypes=("fp8",), progress=None)


def test_output_paths():
    assert results.output_paths("out/run") == (Path("out/run.json"), Path("out/run.csv"))
    assert results.output_paths("out/run.json") == (Path("out/run.json"), Path("out/run.csv"))


# ----------------------------------------------------------------------------- CLI

def test_roofline_is_bandwidth_bound_below_the_ridge():
    from kernels.hw.devices import Peaks
    p = Peaks("toy", flops=100.0, bandwidth=10.0, flops_dtype="fp32", source="by hand")
    assert p.ridge == 10.0
    assert p.attainable(5.0) == 50.0      # 10 bytes/s x 5 FLOP/byte, under the ridge
    assert p.attainable(20.0) == 100.0    # past the ridge: the compute ceiling


def test_compare_names_the_faster_only_when_the_ranges_are_apart():
    import time

    calls = {"fast": 0, "slow": 0}

    def sleeper(name, seconds):
        def call():
            calls[name] += 1
            time.sleep(seconds)
        return call

    result = comparison.compare({"fast": sleeper("fast", 0.001), "slow": sleeper("slow", 0.03)}, rounds=7, warmup=1)
    assert result.faster() == "fast" and "fast is faster" in result.verdict()
    assert calls == {"fast": 8, "slow": 8}, "every function is called once per round, after the warm-up"
    tied = comparison.Comparison(median_ms={"a": 1.0, "b": 1.1}, p10_ms={"a": 0.9, "b": 0.95},
                            p90_ms={"a": 1.2, "b": 1.3}, rounds=7)
    assert tied.faster() is None and "too noisy" in tied.verdict(), "overlapping ranges name no winner"


def test_in_turns_keeps_every_round_and_rotates_the_order():
    order = []
    times = comparison.in_turns({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=4, warmup=0)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"], "one call each a round, the first place rotating"
    assert [len(t) for t in times.values()] == [4, 4] and all(ms >= 0 for t in times.values() for ms in t)
    with pytest.raises(ValueError, match="at least one callable and one round"):
        comparison.in_turns({}, rounds=3)


def test_ratio_spread_divides_round_by_round():
    times = {"x": [2.0, 4.0, 6.0, 8.0, 10.0], "y": [1.0, 1.0, 2.0, 2.0, 100.0]}   # a burst in the last round hit y only
    median, p10, p90 = comparison.ratio_spread(times, "x", "y")
    assert median == 3.0 and p10 < 2.0 < p90 <= 4.0, "ratios 2, 4, 3, 4, 0.1: the median and deciles of those"
    assert comparison.ratio_spread({"x": [3.0], "y": [1.5]}, "x", "y") == (2.0, 2.0, 2.0)


def refusal(capsys, *args) -> str:
    """What ``python -m kernels.bench ARGS`` says when it refuses: exit 2 and one error line."""
    with pytest.raises(SystemExit) as refused:
        cli.main(list(args))
    assert refused.value.code == 2, "a refusal exits 2, as argparse does"
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1, "a bad argument gets one sentence, not a traceback"
    return errors[0]


def test_cli_names_an_unknown_implementation_in_one_line(capsys):
    assert "unknown implementation(s) naiv; registered: naive" in refusal(capsys, "--impls", "naiv")


# ----------------------------------------------------------------------------- issue 18: modes, warm-up, spread

def test_backward_only_is_timed_with_two_and_a_half_forwards():
    rows = sweep.sweep(["inplace"], seqs=(32,), head_dims=(16,), modes=(FORWARD, results.BACKWARD),
                       memory=False, **QUICK)
    fwd, bwd = rows
    assert (fwd.status, bwd.status) == ("ok", "ok"), bwd.reason
    assert bwd.flops == 2.5 * fwd.flops, "backward alone is 2.5x the forward's FLOPs (reference.flops)"
    assert bwd.backward and bwd.mode == "backward"
    # dO, dQ, dK, dV: 4 more tensors of B*H*S*D fp32 = 4 * 1*2*32*16 * 4 bytes
    assert bwd.bytes == 4 * 2 * 32 * 16 * 4 * 2


def test_backward_only_never_runs_the_forward_while_timed(monkeypatch):
    calls = {"forward": 0}
    real = kernels.get("sdpa_flash")

    def counted(q, k, v, causal=True, scale=None):
        calls["forward"] += 1
        return real(q, k, v, causal=causal, scale=scale)

    monkeypatch.setattr(kernels.implementation("sdpa_flash"), "call", counted)
    pool = sweep.InputPool((1, 2, 16, 16), torch.float32, CPU, backward=True)
    timed_call = sweep.make_timed_call(counted, pool, True, results.BACKWARD)
    made = calls["forward"]
    assert made == min(len(pool.sets), sweep.MAX_GRAPHS), "one forward per replayed graph, made up front"
    for _ in range(3 * made):
        grads = timed_call()
    assert calls["forward"] == made, "the timed backward call must not call the forward"
    assert len(grads) == 3


def test_a_slow_first_call_does_not_shorten_the_warm_up_or_the_timing(monkeypatch):
    # The first call autotunes (seconds, on a GPU); the old warm-up took it as the per-call
    # estimate and timed only min_reps calls.
    real = kernels.get("sdpa_flash")
    state = {"first": True}

    def tuning_first(q, k, v, causal=True, scale=None):
        if state["first"]:
            state["first"] = False
            import time
            time.sleep(0.6)
        return real(q, k, v, causal=causal, scale=scale)

    monkeypatch.setattr(kernels.implementation("sdpa_flash"), "call", tuning_first)
    row, = sweep.sweep(["sdpa_flash"], seqs=(16,), head_dims=(16,), memory=False,
                       **{**QUICK, "reps": 12, "min_reps": 3, "max_seconds": 0.5})
    assert row.first_call_ms >= 600, "the first call is timed on its own"
    assert row.reps == 12, "the steady-state estimate, not the first call, sizes the timed calls"
    assert row.p90_ms < 100


def test_repeated_sweeps_record_their_spread():
    row, = sweep.sweep(["sdpa_flash"], seqs=(32,), head_dims=(16,), memory=False, repeats=3, **QUICK)
    medians = json.loads(row.round_medians_ms)
    assert len(medians) == 3 and all(m > 0 for m in medians)
    assert row.median_ms == pytest.approx(sorted(medians)[1], rel=1e-4)
    assert row.round_spread == pytest.approx((max(medians) - min(medians)) / row.median_ms, rel=1e-3)
    with pytest.raises(ValueError, match="repeats"):
        sweep.sweep(["sdpa_flash"], seqs=(32,), head_dims=(16,), repeats=0, **QUICK)


def test_triton_config_is_recorded_when_autotuned(monkeypatch):
    import kernels.triton.backward as tb
    import kernels.triton.flash as tf

    class Tuned:
        def __init__(self, m, n, w, s):
            self.best_config = type("Config", (), {"kwargs": {"BLOCK_M": m, "BLOCK_N": n},
                                                   "num_warps": w, "num_stages": s})()

    monkeypatch.setattr(tf, "attn_fwd_tuned", Tuned(128, 64, 8, 3))
    monkeypatch.setattr(tb, "attn_bwd_dq_tuned", Tuned(64, 64, 4, 3))
    chosen = json.loads(gpu_checks.chosen_configs("triton"))
    assert chosen["fwd"] == {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    assert set(chosen) == {"fwd", "bwd_dq"}, "kernels without best_config (not yet tuned) are left out"
    assert gpu_checks.chosen_configs("sdpa_flash") is None


def test_triton_in_the_interpreter_records_no_config():
    reason = kernels.available("cpu")["triton"]
    if reason:
        pytest.skip(reason)
    row, = sweep.sweep(["triton"], seqs=(32,), head_dims=(16,), memory=False, batch=1, heads=2,
                       warmup=1, reps=2, min_reps=1, max_seconds=0.2, progress=None)
    assert row.status == "ok", row.reason
    assert row.config is None, "the interpreter does not autotune: there is no chosen config"


def test_meta_has_measured_peaks_beside_the_datasheet():
    peaks = results.run_meta(CPU, "test")["peaks"]
    assert peaks["datasheet"] is None, "a CPU has no datasheet row"
    assert peaks["measured"]["flops"] > 0 and peaks["measured"]["bandwidth"] > 0
    assert "measured" in peaks["measured"]["source"]


def test_maintaining_states_the_goals_of_results_as_unmeasured():
    readme = (ROOT / "MAINTAINING.md").read_text()
    goals = readme[readme.index("## Performance goals"):]
    for impl, mode, ratio in results.GOALS:
        assert f">= {ratio}x `{results.GOAL_BASELINE}`" in goals, f"MAINTAINING.md states {impl} {mode}'s goal {ratio}x"
    assert "Unmeasured so far" in goals and "make gpu-run" in goals, "MAINTAINING.md says the goals are not yet measured"


# ----------------------------------------------------------------------------- issue 19: decode and training modes

def decode_point(name, b, h, sk, d, kv_heads=None, dtype=torch.float32, causal=True):
    return sweep.new_point(name, CPU, dtype, b, h, sk, d, causal, results.DECODE, kv_heads)


def test_decode_bytes_by_hand_are_the_cache_plus_q_and_o():
    # fused, fp32: q and o 2·B·Hq·D = 2*2*8*64 = 2,048 elements; the K/V cache 2·B·Hkv·Sk·D
    #   = 2*2*8*1024*64 = 2,097,152 elements; (2,048 + 2,097,152) * 4 bytes = 8,396,800
    assert decode_point("sdpa_flash", 2, 8, 1024, 64).bytes == 8_396_800
    # naive writes and reads the [B, H, 1, Sk] scores too: + 4*2*8*1024 = 65,536 elements
    #   = 262,144 bytes; 8,658,944 in all
    assert decode_point("naive", 2, 8, 1024, 64).bytes == 8_658_944
    # bf16 halves every byte: 4,198,400
    assert decode_point("sdpa_flash", 2, 8, 1024, 64, dtype=torch.bfloat16).bytes == 4_198_400


def test_training_step_counts_three_and_a_half_forwards_with_gqa_bytes():
    fwd = point("sdpa_flash", 1, 8, 256, 32, True, False)
    train = point("sdpa_flash", 1, 8, 256, 32, True, True)
    assert train.flops == 3.5 * fwd.flops, "forward + backward (2.5x) = 3.5x the forward's FLOPs"
    shared = sweep.new_point("sdpa_flash", CPU, torch.float32, 1, 8, 256, 32, True, FORWARD_BACKWARD, 2)
    # training reads q, k, v, o, dO and writes dQ, dK, dV: q-sized 6 + k-sized 6 tensors (fp32)
    #   MHA: (6 + 6) * 8*256*32 * 4 = 3,145,728; Hkv = 2: (6 * 8 + 6 * 2) * 256*32 * 4 = 1,966,080
    assert train.bytes == 3_145_728 and shared.bytes == 1_966_080
    assert shared.flops == train.flops


def test_decode_sweep_times_one_query_against_the_cache():
    rows = sweep.sweep(["inplace", "sdpa_flash"], seqs=(64, 256), head_dims=(16,), modes=(results.DECODE,),
                       kv_heads=1, **QUICK)
    for r in rows:
        assert r.status == "ok", r.reason
        assert (r.mode, r.seq_q, r.kv_heads, r.heads) == ("decode", 1, 1, 2)
        assert r.flops == 4 * 1 * 2 * r.seq * 16
        assert r.gbps == pytest.approx(r.bytes / (r.median_ms * 1e-3) / 1e9), "the rate is the median's"
    pool = sweep.InputPool((1, 2, 256, 16), torch.float32, CPU, backward=False, seq_q=1, kv_heads=1)
    q, k, v, grad = pool.next()
    assert (q.shape, k.shape, v.shape, grad.shape) == ((1, 2, 1, 16), (1, 1, 256, 16), (1, 1, 256, 16), (1, 2, 1, 16))
    with pytest.raises(ValueError, match="kv_heads"):
        sweep.sweep(["inplace"], seqs=(16,), modes=(results.DECODE,), heads=4, kv_heads=3, progress=None)


def test_cli_decode_and_training_rows_have_their_columns(tmp_path, capsys):
    out = tmp_path / "modes"
    args = ["--impls", "sdpa_flash", "--mode", "decode", "training", "--seq", "64", "--head-dim", "16",
            "--heads", "4", "--gqa", "2", "--reps", "3", "--warmup", "1", "--max-seconds", "0.1",
            "--no-memory", "--out", str(out)]
    assert cli.main(args) == 0
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert len(progress) == 2 and "decode" in progress[0] and "fwd+bwd" in progress[1], progress
    assert all("GB/s" in line and "FLOP/B" in line and "Hkv=2" in line for line in progress), progress
    header = out.with_suffix(".csv").read_text().splitlines()[0].split(",")
    assert {"mode", "seq", "seq_q", "kv_heads", "median_ms", "tflops", "gbps", "intensity"} <= set(header)
    decode, train = results.load_results(out.with_suffix(".csv"))
    assert (decode.mode, decode.seq_q, decode.kv_heads) == ("decode", 1, 2)
    assert decode.flops == 4 * 1 * 4 * 64 * 16, "4·B·Hq·Sk·D"
    assert train.mode == "forward+backward" and train.flops == 3.5 * (4 * 1 * 4 * 64**2 * 16 / 2)
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["results"][0]["intensity"] == pytest.approx(decode.flops / decode.bytes)
    command = data["meta"]["command"]
    assert command.split()[:3] == ["python", "-m", "kernels.bench"] and command.endswith(str(out))


def test_cli_refuses_a_bad_mode_or_gqa_in_one_line(capsys):
    for args, words in ((["--mode", "sideways"], "unknown mode(s) sideways"),
                        (["--heads", "8", "--gqa", "3"], "--gqa 3 must be a positive divisor of the 8")):
        assert words in refusal(capsys, *args)


def test_files_from_before_the_decode_columns_still_load(small_sweep, tmp_path):
    json_path, _ = results.save_results(small_sweep, tmp_path / "old")
    data = json.loads(json_path.read_text())
    for row in data["results"]:
        for column in ("seq_q", "kv_heads", "intensity"):
            del row[column]
    json_path.write_text(json.dumps(data))
    back = results.load_results(json_path)
    assert [(r.impl, r.seq, r.median_ms) for r in back] == [(r.impl, r.seq, r.median_ms) for r in small_sweep]
    assert all(r.seq_q is None and r.kv_heads is None for r in back), "absent columns take their default"


def test_cpu_peak_memory_is_the_trace_readers_step_peak(tmp_path, capfd):
    # One rule for "peak above the start": kernels.trace.reader.Step.peak_bytes; the benchmark reads it.

    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    run = record.profile(kernels.get("inplace"), q, k, v, label="inplace", wait=0, warmup=1, active=1,
                            trace_dir=tmp_path)
    capfd.readouterr()
    peak, _ = timing.peak_memory(lambda: kernels.get("inplace")(q, k, v), CPU)
    assert peak == run.step().peak_bytes, "the benchmark's peak and the trace's step peak are one number"
    # Kineto prints start/stop lines ("USDT: ... SyncActivityProfilerHandler") straight to
    # file descriptor 2; a notebook calling the sweep would show them in every cell.
    assert "SyncActivityProfilerHandler" not in capfd.readouterr().err


def test_a_compiled_entry_that_falls_back_to_eager_is_not_reported(monkeypatch):
    # Past torch._dynamo.config.recompile_limit, Dynamo runs a function eagerly with only a
    # logged warning; the sweep must not time that under a compiled name.
    import torch._dynamo

    real = kernels.get("sdpa_math")
    compiled = torch.compile(lambda q, k, v: real(q, k, v, causal=True), backend="eager", dynamic=False)
    monkeypatch.setattr(kernels.implementation("sdpa_math"), "call",
                        lambda q, k, v, causal=True, scale=None: compiled(q, k, v))
    with torch._dynamo.config.patch(recompile_limit=1):
        rows = sweep.sweep(["sdpa_math"], seqs=(16, 32), head_dims=(16,), memory=False, **QUICK)
    assert [r.status for r in rows] == ["ok", "error"], "the second length is past the limit of one compile"
    assert "recompile limit" in rows[1].reason and "eagerly" in rows[1].reason and rows[1].median_ms is None


def test_a_roofline_needs_a_device_the_table_or_a_measurement_knows():
    assert devices.roofline_peaks("cpu") is devices.peaks("cpu")
    with pytest.raises(ValueError, match="no roofline for meta"):
        devices.roofline_peaks("meta")


def test_medians_reads_each_median_in_call_order():
    result = comparison.Comparison(median_ms={"naive": 1.234, "inplace": 0.5}, p10_ms={"naive": 1.0, "inplace": 0.4},
                                   p90_ms={"naive": 1.5, "inplace": 0.6}, rounds=5)
    assert result.medians() == "naive 1.23 ms, inplace 0.5 ms"

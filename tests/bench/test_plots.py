"""Figures of kernels.bench.plots, drawn from a synthetic result set whose numbers follow formulas."""
from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from kernels.bench import plots
from kernels.bench.results import FORWARD, FORWARD_BACKWARD, BenchResult, BenchResults
from kernels.hw.devices import Peaks

SEQS = (256, 512, 1024)
# A made-up device: 100 TFLOP/s and 1 TB/s, so the ridge is 100e12 / 1e12 = 100 FLOP/byte.
DEVICE = Peaks("Test GPU", 100e12, 1e12, "bfloat16", "made up for the test")


def row(impl, seq, mode, status="ok"):
    """A measured point: time ∝ S² for 'naive', ∝ S for 'fused'; memory ∝ S² and ∝ S."""
    quadratic = impl == "naive"
    ms = (1e-5 * seq**2 if quadratic else 1e-3 * seq) * (3.5 if mode == FORWARD_BACKWARD else 1)
    flops = 4.0 * 8 * seq**2 * 64 / 2 * (3.5 if mode == FORWARD_BACKWARD else 1)
    nbytes = 4.0 * 8 * seq * 64 * 2 + (4.0 * 8 * seq**2 * 2 if quadratic else 0)
    ok = status == "ok"
    return BenchResult(
        impl=impl, device="cuda", dtype="bfloat16", batch=1, heads=8, seq=seq, head_dim=64,
        causal=True, mode=mode, status=status, reps=10 if ok else 0,
        median_ms=ms if ok else None, p10_ms=0.9 * ms if ok else None, p90_ms=1.2 * ms if ok else None,
        flops=flops, bytes=nbytes, tflops=flops / (ms * 1e-3) / 1e12 if ok else None,
        gbps=nbytes / (ms * 1e-3) / 1e9 if ok else None,
        peak_memory_bytes=(8 * seq**2 * 2 if quadratic else 8 * seq * 64 * 2 * 4) if ok else None,
        memory_method="cuda.max_memory_allocated" if ok else "")


@pytest.fixture
def results():
    rows = [row(impl, s, mode) for impl in ("naive", "fused") for mode in (FORWARD, FORWARD_BACKWARD)
            for s in SEQS]
    rows.append(row("naive", 2048, FORWARD, status="oom"))  # failed points are not drawn
    rows.append(row("cuda_v1", 256, FORWARD, status="unavailable"))
    return BenchResults(rows, meta={"device": {"kind": "cuda", "peaks": DEVICE.as_dict()}})


def only_axes(fig):
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    return ax


def labels(ax):
    return [line.get_label() for line in ax.lines]


def test_series_are_labelled_by_what_varies(results):
    groups = plots.series(results)
    assert sorted(groups) == ["fused fwd", "fused fwd+bwd", "naive fwd", "naive fwd+bwd"]
    assert all([r.seq for r in rs] == list(SEQS) for rs in groups.values())


def test_time_vs_seq(results):
    ax = only_axes(plots.time_vs_seq(results))
    assert sorted(labels(ax)) == sorted(plots.series(results)), "one line per series; failed points draw none"
    assert ax.get_xscale() == ax.get_yscale() == "log"
    naive = ax.lines[labels(ax).index("naive fwd")]
    assert list(naive.get_xdata()) == list(SEQS)
    assert list(naive.get_ydata()) == pytest.approx([1e-5 * s**2 for s in SEQS])


def test_tflops_vs_seq_with_a_given_peak(results):
    ax = only_axes(plots.tflops_vs_seq(results, peak=312))
    (peak,) = [line for line in ax.lines if line.get_label() not in plots.series(results)]
    assert set(peak.get_ydata()) == {312}
    assert "312" in peak.get_label()


def test_tflops_vs_seq_takes_the_peak_stored_with_the_results(results):
    ax = only_axes(plots.tflops_vs_seq(results))
    assert set(ax.lines[-1].get_ydata()) == {100}  # DEVICE: 100e12 FLOP/s = 100 TFLOP/s


def test_roofline_has_both_ceilings_and_the_ridge(results):
    ax = only_axes(plots.roofline(results, DEVICE))
    (roof,) = [line for line in ax.lines if line.get_label() not in plots.series(results)]
    xs, ys = roof.get_xdata(), roof.get_ydata()
    assert xs[1] == pytest.approx(100)           # the ridge: 100e12 / 1e12 FLOP/byte
    assert ys[1] == ys[2] == pytest.approx(100)  # flat at 100 TFLOP/s from the ridge on
    assert ys[0] == pytest.approx(1e12 * xs[0] / 1e12)  # bandwidth slope: 1 TB/s x intensity
    (note,) = ax.texts
    assert "ridge 100 FLOP/byte" in note.get_text()
    fused = ax.lines[labels(ax).index("fused fwd")]
    # fused, S=256: flops 4*8*256²*64/2 = 67,108,864; bytes 4*8*256*64*2 = 1,048,576 -> 64 FLOP/byte
    assert fused.get_xdata()[0] == pytest.approx(64)


def test_a_cpu_roofline_reads_in_gflops(results):
    cpu = Peaks("Test CPU", 242e9, 32.3e9, "float32", "measured for the test")
    ax = only_axes(plots.roofline(results, cpu))
    (roof,) = [line for line in ax.lines if line.get_label() not in plots.series(results)]
    assert ax.get_ylabel() == "achieved GFLOP/s" and roof.get_ydata()[-1] == pytest.approx(242), \
        "a roof under 1 TFLOP/s is drawn in GFLOP/s, its label too"
    assert "242 GFLOP/s" in roof.get_label()
    fused = ax.lines[labels(ax).index("fused fwd")]
    assert fused.get_ydata()[0] == pytest.approx(results_tflops(results, "fused fwd")[0] * 1e3)


def results_tflops(results, label):
    return [r.tflops for r in plots.series(results)[label]]


def test_roofline_accepts_a_device_description(results):
    # (and the device stored with the results: test_tflops_vs_seq_takes_the_peak_stored_with_the_results)
    ax = only_axes(plots.roofline(results, {"peaks": DEVICE.as_dict()}))
    assert ax.lines[-1].get_xdata()[1] == pytest.approx(100)


def test_roofline_without_peaks_says_so():
    with pytest.raises(ValueError, match="no peaks"):
        plots.roofline([row("naive", 256, FORWARD)], {"peaks": None})


def test_nothing_measured_still_gives_a_figure():
    ax = only_axes(plots.time_vs_seq([row("naive", 256, FORWARD, status="oom")]))
    assert len(ax.lines) == 0
    assert "no successful" in ax.texts[0].get_text()


def test_bench_figures_keep_the_floor():
    from tests.helpers import too_small
    from kernels.bench.results import FORWARD, BenchResults
    results = BenchResults([row(i, s, FORWARD) for i in ("naive", "fused") for s in SEQS],
                           meta={"device": {"kind": "cuda", "peaks": DEVICE.as_dict()}})
    for fig in (plots.time_vs_seq(results), plots.tflops_vs_seq(results), plots.roofline(results)):
        assert not too_small(fig), f"{fig.axes[0].get_title()}: {too_small(fig)}"


def test_steady_keeps_only_the_rows_that_pass_the_spread_check(results):
    noisy = results[0]
    noisy.p90_ms = noisy.p10_ms * (plots.NOISY_SPREAD + 0.5)
    kept = plots.steady(results)
    assert isinstance(kept, BenchResults) and kept.meta == results.meta
    assert noisy not in kept and all(r.ok for r in kept)
    assert len(kept) == len([r for r in results if r.ok]) - 1
    assert plots.mark_noise(only_axes(plots.time_vs_seq(kept)), kept) is None


def test_split_kv_bars_stack_the_reduce_on_the_main_kernel():
    import pandas as pd

    pairs = pd.DataFrame({"main µs": [50.0, 52.0], "reduce µs": [5.0, 4.0]})
    ax = only_axes(plots.split_kv_bars(pairs, "one decode step"))
    tops = sorted(p.get_y() + p.get_height() for p in ax.patches)
    assert tops == pytest.approx([50.0, 52.0, 55.0, 56.0])

"""Figures from benchmark results: how time, throughput and memory scale, and the roofline.

Each function takes a sweep's rows and returns a ``matplotlib.figure.Figure`` (no pyplot:
no GUI backend, no global state). Only rows with status "ok" are drawn, one line per
*series* (an implementation plus whatever else varies: mode, dtype, head dim, causal, K/V
heads), so a line never joins points that are not comparable: ``time_vs_seq`` (log-log, the
p10-p90 spread shaded), ``tflops_vs_seq`` (under the device's peak) and ``roofline`` (FLOP/s
against FLOP/byte under the two ceilings).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

from matplotlib.figure import Figure

from kernels.hw import devices
from kernels.bench.results import MODE_LABELS, BenchResults

# What a series may differ by besides the implementation, with how to print it.
SERIES_KEYS = {
    "mode": lambda r: MODE_LABELS.get(r.mode, r.mode),
    "dtype": lambda r: r.dtype,
    "head_dim": lambda r: f"D={r.head_dim}",
    "causal": lambda r: "causal" if r.causal else "non-causal",
    "batch": lambda r: f"B={r.batch}",
    "heads": lambda r: f"H={r.heads}",
    "kv_heads": lambda r: f"Hkv={r.kv_heads or r.heads}",
    "device": lambda r: r.device,
}


def as_rows(results):
    """A list we can walk twice; BenchResults keep their ``meta`` (device, peaks)."""
    return results if hasattr(results, "meta") else list(results)


def series(results: Iterable) -> dict[str, list]:
    """Successful rows grouped into labelled series, each sorted by sequence length."""
    rows = [r for r in results if r.status == "ok"]
    varying = [k for k, show in SERIES_KEYS.items() if len({show(r) for r in rows}) > 1]
    groups: dict[str, list] = defaultdict(list)
    for r in rows:
        label = " ".join([r.impl] + [SERIES_KEYS[k](r) for k in varying])
        groups[label].append(r)
    return {label: sorted(rs, key=lambda r: r.seq) for label, rs in groups.items()}


def new_axes(title: str, xlabel: str, ylabel: str, size=(7, 4.5)):
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def seq_axis(ax, groups: dict) -> None:
    """Log2 x axis whose ticks are exactly the measured sequence lengths."""
    seqs = sorted({r.seq for rs in groups.values() for r in rs})
    ax.set_xscale("log", base=2)
    if seqs:
        ax.set_xticks(seqs, [str(s) for s in seqs])
        ax.minorticks_off()


def finish_figure(fig, ax, groups: dict) -> Figure:
    if groups:
        ax.legend(fontsize=10)   # 10 points, as the ticks: a phone's copy shows it at 7.5 px or more
    else:
        ax.text(0.5, 0.5, "no successful measurements", transform=ax.transAxes, ha="center")
    return fig


# A point whose timed calls spread wider than this (90th over 10th percentile) measured the
# machine's other work, not the kernel: a quiet machine keeps it near 1.1x.
NOISY_SPREAD = 2.0


def noisy_points(results: Iterable) -> list:
    """The successful rows whose p10-p90 spread is wider than ``NOISY_SPREAD``."""
    return [r for r in results if r.status == "ok" and r.p10_ms and r.p90_ms
            and r.p90_ms / r.p10_ms > NOISY_SPREAD]


def steady(results: Iterable):
    """The successful rows that pass the spread check (p90 / p10 within ``NOISY_SPREAD``): the
    ones a page may show as timings, as BenchResults (with the rows' ``meta``, if they had one)."""
    meta = getattr(results, "meta", None)
    results = list(results)   # read twice below: a generator would be empty the second time
    noisy = {id(r) for r in noisy_points(results)}
    kept = [r for r in results if r.status == "ok" and id(r) not in noisy]
    return BenchResults(kept, meta)


def mark_noise(ax, results: Iterable) -> Optional[str]:
    """When the spread check fails, say so on the figure itself (over the data, which then is
    the machine's noise), and in its title; returns the warning, or None for a quiet run."""
    import textwrap

    rows = [r for r in results if r.status == "ok"]
    noisy = noisy_points(rows)
    if not noisy:
        return None
    worst = max(noisy, key=lambda r: r.p90_ms / r.p10_ms)
    warning = (f"Too noisy to read as results: {len(noisy)} of {len(rows)} points spread more than "
               f"{NOISY_SPREAD:g}x between their 10th and 90th percentile (worst: {worst.impl} at "
               f"S={worst.seq}, {worst.p10_ms:.3g} to {worst.p90_ms:.3g} ms). The machine was busy: "
               "compare the lines' shapes at most, not their values.")
    ax.text(0.5, 0.5, textwrap.fill(warning, 52), transform=ax.transAxes, ha="center", va="center",
            color="#b71c1c", zorder=10,
            bbox={"facecolor": "white", "alpha": 0.92, "edgecolor": "#b71c1c", "boxstyle": "round"})
    ax.set_title(f"{ax.get_title()}: NOISY RUN")
    return warning


def time_vs_seq(results: Iterable) -> Figure:
    """Median time per call against sequence length (log-log), p10-p90 shaded; marked when
    the run was too noisy (``mark_noise``)."""
    results = as_rows(results)
    groups = series(results)
    fig, ax = new_axes("Time per call", "sequence length S (tokens)", "time per call (ms)")
    for label, rs in groups.items():
        seqs = [r.seq for r in rs]
        (line,) = ax.plot(seqs, [r.median_ms for r in rs], marker="o", label=label)
        ax.fill_between(seqs, [r.p10_ms for r in rs], [r.p90_ms for r in rs],
                        color=line.get_color(), alpha=0.2, linewidth=0)
    seq_axis(ax, groups)
    ax.set_yscale("log")
    mark_noise(ax, results)
    return finish_figure(fig, ax, groups)


def peak_of(results, peak) -> Optional[devices.Peaks]:
    """``peak`` as Peaks: given as Peaks, a describe_device dict, a device, or from the results."""
    if isinstance(peak, devices.Peaks):
        return peak
    if isinstance(peak, dict):
        return devices.peaks_from_description(peak)
    if peak is not None:
        return devices.peaks(peak)
    return devices.peaks_from_description(getattr(results, "meta", {}).get("device"))


def tflops_vs_seq(results: Iterable, peak=None) -> Figure:
    """Achieved TFLOP/s against sequence length, under the device's peak.

    ``peak``: a number in TFLOP/s, a ``devices.Peaks``, a ``describe_device`` dict or a
    device; by default the peaks stored with the results (if any).
    """
    results = as_rows(results)
    groups = series(results)
    fig, ax = new_axes("Achieved throughput", "sequence length S (tokens)", "achieved TFLOP/s")
    for label, rs in groups.items():
        ax.plot([r.seq for r in rs], [r.tflops for r in rs], marker="o", label=label)
    ceiling: Optional[float]  # None: no peak given or stored, so no line
    if isinstance(peak, (int, float)) and not isinstance(peak, bool):
        ceiling, text = float(peak), f"peak {float(peak):g} TFLOP/s"
    else:
        found = peak_of(results, peak)
        ceiling = found.flops / 1e12 if found else None
        text = f"peak {ceiling:.3g} TFLOP/s ({found.flops_dtype}, {found.name})" if found else ""
    if ceiling is not None:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1, label=text)
    seq_axis(ax, groups)
    ax.set_ylim(bottom=0)
    mark_noise(ax, results)  # throughput is FLOPs over the same noisy times
    return finish_figure(fig, ax, groups)


def device_peaks(device, results=None) -> devices.Peaks:
    found = peak_of(results if results is not None else [], device)
    if found is None:
        raise ValueError(f"no peaks known for {device!r}: pass a devices.Peaks, a describe_device "
                         "dict with peaks, or a device this machine can measure")
    return found


def bandwidth_text(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e12:.3g} TB/s" if bytes_per_s >= 1e12 else f"{bytes_per_s / 1e9:.3g} GB/s"


def roofline(results: Iterable, device=None) -> Figure:
    """Achieved FLOP/s against arithmetic intensity, under the device's two ceilings.

    ``device``: a ``devices.Peaks``, a ``describe_device`` dict, a device ("cpu", "cuda"),
    or None for the device stored with the results. Each series is one line through its
    sequence lengths (intensity grows with S for the fused kernels).
    """
    results = as_rows(results)
    found = device_peaks(device, results)
    groups = series(results)
    # A CPU's roof is a fraction of a TFLOP/s: its axis reads in GFLOP/s (0.24 TFLOP/s is 242 GFLOP/s).
    scale, unit = (1e12, "TFLOP/s") if found.flops >= 1e12 else (1e9, "GFLOP/s")
    fig, ax = new_axes(f"Roofline: {found.name}", "arithmetic intensity (FLOP/byte)", f"achieved {unit}")
    points = [r for rs in groups.values() for r in rs]
    for label, rs in groups.items():
        ax.plot([r.intensity for r in rs], [r.tflops * 1e12 / scale for r in rs], marker="o", label=label)
    # The roof: bandwidth · intensity until the ridge, then the compute peak.
    ridge = found.ridge
    xs = [r.intensity for r in points] + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    roof_x = [lo, ridge, hi]
    ax.plot(roof_x, [found.bandwidth * x / scale for x in (lo, ridge)] + [found.flops / scale],
            color="black", linewidth=1.5,
            label=f"roof: {found.flops / scale:.3g} {unit}, {bandwidth_text(found.bandwidth)}")
    ax.annotate(f"ridge {ridge:.3g} FLOP/byte", xy=(ridge, found.flops / scale),
                xytext=(0.5, -24), textcoords="offset points", fontsize=10,
                arrowprops=dict(arrowstyle="->"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    return finish_figure(fig, ax, groups)


def achieved_vs_peak(calls) -> Figure:
    """Each attention call's achieved TFLOP/s as a point, one colour per GPU, under that GPU's
    dense 16-bit peak (dashed): the table of chapter 6's ``achieved_against_peak`` (kernels/book/ch06_showdown.py)."""
    fig, ax = new_axes("Attention calls of one step against the GPU's peak", "call (in the step's order)",
                       "TFLOP/s (causal FLOPs counted half)")
    for gpu, rows in calls.groupby("GPU", sort=False):
        dots = ax.plot(rows["call"], rows["TFLOP/s"], "o", label=f"{gpu}: each call")[0]
        peak = float(rows["peak TFLOP/s"].iloc[0])
        ax.axhline(peak, ls="--", color=dots.get_color(), label=f"{gpu}: dense bf16 peak, {peak:g} TFLOP/s")
    ax.set_ylim(0, 1.1 * float(calls["peak TFLOP/s"].max()))
    # under the axes, one entry a line: its labels are long, and a phone's copy of the figure
    # keeps them whole without widening it
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    return fig


def split_kv_bars(pairs, title: str) -> Figure:
    """One stacked bar per attention call of a decode step: the split-KV main kernel's GPU time,
    the reduce kernel's on top (the table of ``kernels.attention.decoding.split_and_reduce``)."""
    fig, ax = new_axes(title, "attention call (one per layer)", "GPU µs", size=(8, 3))
    calls = list(range(len(pairs)))
    ax.bar(calls, pairs["main µs"], width=0.8, label="main (split over the cache)")
    ax.bar(calls, pairs["reduce µs"], width=0.8, bottom=pairs["main µs"], label="reduce")
    ax.set_xticks(calls[::5], [str(c) for c in calls[::5]])
    ax.grid(False)
    ax.legend(fontsize=10)
    return fig

"""What only chapter 6 (the showdown) needs: its reading of real models' attention calls against
each GPU's peak and of their grids against the SMs (borrowed traces), the one sentence that says
which of its CPU timings rank nothing, and the GPU run's fused medians beside the article's."""
from __future__ import annotations

import math
from typing import Mapping

import pandas as pd

from kernels.bench.results import BenchResult
from kernels.hw import devices, occupancy
from kernels.trace.attention import AttentionReport, dims_text, short_kernel_name

FUSED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")


def achieved_against_peak(reports: Mapping[str, AttentionReport]) -> pd.DataFrame:
    """One row per attention call of each report ({label: find_attention(step)}): the GPU the
    trace names, the call's achieved TFLOP/s and the GPU's dense 16-bit peak (datasheet). A
    report whose trace names no GPU the datasheet table knows, or a call without FLOPs (shapes
    or causality not recorded) or not in 16 bits, is a ValueError: the comparison would be empty
    or against the wrong peak."""
    rows = []
    for label, report in reports.items():
        if report.peaks is None:
            raise ValueError(f"{label}: no datasheet peak for its GPU ({report.device or 'no deviceProperties'})")
        for i, call in enumerate(report.calls):
            main, share = call.main_kernel(), call.peak_share(report.peaks.flops)
            if share is None or main is None or call.flops is None:
                raise ValueError(f"{label}, call {i}: no FLOPs (shapes or is_causal not recorded), inputs not "
                                 "16-bit, or no kernel")
            rows.append({"trace": label, "GPU": report.device, "call": i, "kernel": short_kernel_name(main["name"]),
                         "B·H": call.batch_heads, "Sq": call.sq, "Sk": call.sk, "D": call.d, "causal": call.causal,
                         "GFLOP": call.flops / 1e9, "GPU µs": call.gpu_us, "TFLOP/s": call.tflops,
                         "peak TFLOP/s": report.peaks.flops / 1e12,
                         "% of peak": 100 * share})
    return pd.DataFrame(rows)


def per_gpu(calls: pd.DataFrame) -> pd.DataFrame:
    """``achieved_against_peak``'s calls summed up per trace, in the columns the page shows."""
    return calls.groupby("trace", sort=False).agg(**{
        "calls": ("call", "size"), "median µs": ("GPU µs", "median"), "median TFLOP/s": ("TFLOP/s", "median"),
        "peak TFLOP/s": ("peak TFLOP/s", "first"), "median % of peak": ("% of peak", "median"),
        "best % of peak": ("% of peak", "max")})


def grid_against_sms(report: AttentionReport) -> pd.DataFrame:
    """The launch of each distinct attention kernel of ``report`` against the GPU it ran on: its
    grid in CTAs (workgroups on AMD), the SMs (CUs) the trace's deviceProperties count, how many
    CTAs fit on one SM at once (the occupancy arithmetic of ``kernels.hw.occupancy``, where the
    trace records registers and shared memory: CUDA traces do, ROCm traces do not), the waves
    that makes (CTAs over SMs x CTAs per SM), the share of SMs the grid can keep busy at all, and the
    occupancy (resident warps over warp slots) by that arithmetic beside Kineto's estimate."""
    props = report.step.trace.device_properties
    if not props:
        raise ValueError("the trace has no deviceProperties: its SM count is unknown")
    sms = devices.multiprocessors(props[0])
    arch = f"sm_{props[0].get('computeMajor')}{props[0].get('computeMinor')}"
    rows: dict = {}
    for call in report.calls:
        main = call.main_kernel()
        if main is None or main["grid"] is None:
            continue
        key = (short_kernel_name(main["name"]), tuple(main["grid"]), tuple(main["block"]))
        if key in rows:
            rows[key]["calls"] += 1
            continue
        ctas, threads = math.prod(main["grid"]), math.prod(main["block"])
        occ = None
        if pd.notna(main["registers_per_thread"]) and pd.notna(main["shared_memory"]):
            occ = occupancy.occupancy(threads, int(main["registers_per_thread"]), int(main["shared_memory"]), arch)
        per_sm = occ.blocks_per_sm if occ else None
        rows[key] = {"kernel": key[0], "calls": 1, "grid": dims_text(key[1]), "CTAs": ctas,
                     "threads per CTA": threads, "SMs (CUs)": sms, "CTAs per SM at once": per_sm,
                     "waves": ctas / (sms * per_sm) if per_sm else None,
                     "% of SMs the grid can fill": 100 * min(ctas, sms) / sms,
                     "occupancy % (ours)": occ.percent if occ else None,
                     "occupancy % (trace)": None if pd.isna(main["occupancy_pct"]) else float(main["occupancy_pct"])}
    if not rows:
        raise ValueError("no attention kernel of this report recorded its grid")
    return pd.DataFrame(list(rows.values()))


GRID_COLUMNS = ["grid", "CTAs", "SMs (CUs)", "CTAs per SM at once", "waves", "occupancy % (ours)",
                "occupancy % (trace)"]


def grids_table(reports: Mapping[str, AttentionReport]) -> pd.DataFrame:
    """``grid_against_sms`` of each report ({short name: report}), one row a trace, in the seven
    columns the page shows (the kernel's name and block are the trace's; the waves say the rest)."""
    return pd.concat({name: grid_against_sms(report) for name, report in reports.items()},
                     names=["trace", ""]).droplevel(1)[GRID_COLUMNS]


def tail_estimate(waves: float) -> float:
    """The share of a call the last wave's idle SMs cost, ESTIMATED as if every CTA did the same
    work: (ceil(waves) - waves) / ceil(waves). Causal CTAs do not (the first query tile meets one
    key tile, the last meets all of them), so this is an estimate, not a measurement."""
    whole = math.ceil(waves)
    return (whole - waves) / whole


def overlapping(points: Mapping[str, BenchResult]) -> list[tuple[str, str]]:
    """The pairs of ``points`` ({impl: point}) whose p10-p90 spreads overlap: timings that rank
    nothing on this run, whichever median is lower."""
    timed = [(n, r.p10_ms, r.p90_ms) for n, r in points.items()
             if r.median_ms is not None and r.p10_ms is not None and r.p90_ms is not None]
    return [(a, b) for i, (a, a10, a90) in enumerate(timed) for b, b10, b90 in timed[i + 1:]
            if a10 <= b90 and b10 <= a90]


def fused_medians(points: Mapping[str, BenchResult]) -> str:
    """This run's median per forward of each fused SDPA backend ``points`` ({impl: point at the
    chapter's shape}) holds, one line each, to read beside the article's A100 table."""
    return "\n".join(f"this run, {r.impl}: {1e3 * r.median_ms:.1f} µs median per forward "
                     f"(B={r.batch} H={r.heads} S={r.seq} D={r.head_dim}, {r.dtype})"
                     for r in (points[n] for n in FUSED if n in points) if r.median_ms is not None)

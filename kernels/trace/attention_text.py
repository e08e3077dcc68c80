"""The attention report (``kernels.trace.attention.AttentionReport``) as a reader sees it in a terminal."""
from __future__ import annotations

# A call's launch footprint (its main kernel's grid, block, registers, shared memory, occupancy).
LAUNCH_COLUMNS = ("grid", "block", "regs", "smem KiB", "occ %")


def report_text(report) -> str:
    """The report as a reader sees it in a terminal: the device and its roofs, the step, what the
    calls are (``table``), what they cost and the roof each sits under (``roof_table``), and why
    any cell is blank."""
    p = report.peaks
    how = f" ({report.device_how})" if report.device_how else ""
    lines = [f"device: {report.device or 'not recorded (no deviceProperties name)'}{how}",
             (f"roofs: dense 16-bit {p.flops / 1e12:g} TFLOP/s, memory {p.bandwidth / 1e12:g} TB/s, ridge "
              f"{p.ridge:.0f} FLOP/byte ({p.name}, {p.source})") if p else
             "roofs: no datasheet peaks known for it (give --device NAME)",
             f"step: {report.step.label}, GPU time {report.step_gpu_us / 1e3:.3f} ms"]
    for counts in report.engine_steps:
        lines.append(f"engine step: {counts.label}: {counts.context_requests} prefill requests "
                     f"({counts.c_sq:,} queries, {counts.c_sk:,} keys), {counts.generation_requests} decode "
                     f"requests ({counts.g_sq:,} queries, {counts.g_sk:,} keys)")
    if not report.calls:
        lines.append("no attention in this step: no attention op, no attention kernel by name, "
                     "no matmul -> softmax -> matmul core")
        return "\n".join(lines)
    share = report.attention_share
    lines.append(f"attention: {len(report.calls)} calls, {report.attention_gpu_us / 1e3:.3f} ms of GPU time"
                 + (f" ({100 * share:.1f}% of the step's)" if share is not None else ""))
    libraries = sorted({f"{c.how}: {c.library}" + (f" ({c.op})" if c.op else "")
                        + (", from a torch.compile'd graph" if c.compiled else "") for c in report.calls})
    lines += [f"  {x}" for x in libraries]
    sources = sorted({c.heads_source for c in report.calls if c.heads_source})
    lines += [f"  heads and head dims read from {s}" for s in sources]
    calls = report.table().drop(columns=["GFLOP"])     # the roof table below has the costs
    calls = calls[[c for c in calls.columns if (calls[c].astype(str) != "").any()]]
    # Two narrower tables, not one that wraps in a terminal: what each call is and took, then
    # how its main kernel was launched.
    launch = [c for c in LAUNCH_COLUMNS if c in calls.columns]
    lines.append(calls.drop(columns=launch).to_string(index=False))
    lines.append("")
    if launch:
        lines.append(calls[["#", "main kernel", *launch]].to_string(index=False))
        lines.append("")
    lines.append(report.roof_table().reset_index().to_string(index=False))
    lines.append("FLOPs: 2·B·H·Sq·Sk·(D + Dv), forward, causal fused calls count half; a serving call "
                 "2·H_Q·(D + Dv)·(Σ prefill sq·sk − Σ prefill sq²/2 + Σ decode sq·sk) (TraceLens's convention). "
                 "Bytes: Q, K, V read once, O written once (for decode, the KV cache read). "
                 "TFLOP/s and TB/s over the call's GPU time; MiB = 2^20 bytes")
    lines += [f"note: {x}" for x in report.footnotes()]
    return "\n".join(lines)


__all__ = ["report_text"]

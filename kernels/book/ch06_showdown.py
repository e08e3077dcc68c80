"""What only chapter 6 (the showdown) needs: who runs here and what each forward runs (the
registry split into what is measured on this device and why the rest is not, each
implementation's lesson in one line, the ops of each profiled forward), one row per contender at
one shape (its time shown only where the timed calls pass the spread check), the source
article's A100 numbers (quoted, never measured here), its reading of real models' attention
calls against each GPU's peak and of their grids against the SMs (borrowed traces), the one
sentence that says which of its CPU timings rank nothing, the one line that answers the reader's
memory ranking (ties credited either way), and the GPU run's fused medians beside the article's."""
from __future__ import annotations

import math
from typing import Mapping

import pandas as pd
import torch

import kernels
from kernels.bench import plots
from kernels.bench.results import BenchResult
from kernels.hw import devices, occupancy
from kernels.hw.devices import Peaks
from kernels.notebook import readable, short_number
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
        "calls": ("call", "size"), "median TFLOP/s": ("TFLOP/s", "median"),
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

# The page's headers for the two occupancy columns: ours is the occupancy of an SM that holds
# blocks; Kineto's estimate spreads the grid over every SM (blocks per SM = CTAs / SMs), so a grid
# smaller than the SM count reads far lower there.
SHOWN_GRID_COLUMNS = {"SMs (CUs)": "SMs", "CTAs per SM at once": "CTAs/SM", "occupancy % (ours)": "busy-SM occupancy %",
                      "occupancy % (trace)": "Kineto occupancy %"}

NOT_RECORDED = "—"


def grids_table(reports: Mapping[str, AttentionReport]) -> pd.DataFrame:
    """``grid_against_sms`` of each report ({short name: report}), one row a trace, in the seven
    columns the page shows (the kernel's name and block are the trace's; the waves say the rest),
    formatted to read: waves to two decimals, and "—" where the trace records nothing to compute
    from (ROCm traces carry no register counts)."""
    table = pd.concat({name: grid_against_sms(report) for name, report in reports.items()},
                      names=["trace", ""]).droplevel(1)[GRID_COLUMNS]
    formats = {"CTAs per SM at once": lambda x: f"{int(x)}", "waves": lambda x: f"{x:.2f}",
               "occupancy % (ours)": readable, "occupancy % (trace)": readable}
    for column, write in formats.items():
        table[column] = [NOT_RECORDED if x is None or pd.isna(x) else write(x) for x in table[column]]
    return table.rename(columns=SHOWN_GRID_COLUMNS)


def count_of(n: int, thing: str) -> str:
    """``n`` things in words a reader reads: "1 key tile", "5 key tiles"."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


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

LESSONS = {
    "naive": "Read one level below your code: out-of-place masked_fill copies the S×S scores.",
    "inplace": "masked_fill_ removes the copy and one S×S allocation, not the peak: two S×S buffers stay.",
    "sdpa_math": "Reference code: it rebuilds the mask, guards softmax, runs more ops than ours.",
    "sdpa_flash": "One fused op: the scores live only in tiles, so memory grows with S, not S².",
    "sdpa_efficient": "One fused kernel (xFormers-derived CUTLASS); it also takes fp32 on a GPU.",
    "sdpa_cudnn": "One fused kernel with no transposes; its per-call setup (graph cached per shape) costs CPU time.",
    "triton": "FlashAttention-2 in Triton: a Q tile stays on chip, K and V stream past, softmax online.",
    "cuda_v1": "The same algorithm in plain CUDA on CUDA cores: correct, readable, far from the roof.",
    "cuda_v2": "Tensor cores (mma.sync), 128-row Q tiles, scores in registers, K/V double-buffered, "
               "only diagonal tiles masked, those above skipped.",
}

# The source article's A100 table (REFERENCE.md): kernels per forward, the profiler's average CUDA
# time per forward, and CPU time where the article gives it (the fused backends only).
ARTICLE_A100 = pd.DataFrame([
    ("naive (masked_fill)", 6, None, None, "matmul, mul, Memcpy, mask, softmax, matmul"),
    ("in-place (masked_fill_)", 5, 1955.0, None, "the Memcpy is gone"),
    ("SDPA math", 20, 7239.0, None, "fp32 upcast, mask rebuilt per call, NaN guards"),
    ("SDPA efficient", 1, 277.9, 117.0, "fmha_cutlassF (xFormers-derived)"),
    ("SDPA flash", 1, 146.8, 138.0, "pytorch_flash (FlashAttention-2)"),
    ("SDPA cuDNN", 1, 186.3, 214.0, "cudnn flash_fprop; per-call setup on the CPU"),
], columns=["variant", "kernels per forward", "CUDA time per forward (µs)", "CPU time (µs)",
            "trace shows"]).set_index("variant")


# Why an entry flagged ``slow_on_cpu`` is left out of the CPU showdown, in its own words: the
# interpreter's time measures NumPy, not the kernel; a compiled entry's time would be a number,
# but the book's short sweep would compile it once per length, seconds each.
NOT_TIMED_ON_CPU = {
    "triton": "correct, but interpreted on a CPU; its time there is not a performance number",
    "compiled": "compiles once per length, seconds each: not in this short sweep; chapter 7 times it at one shape",
}


def contenders(device) -> tuple[list[str], dict[str, str]]:
    """The implementations measured on ``device``, and {name: why not} for the others. On a CPU,
    entries flagged ``slow_on_cpu`` are left out too: Triton's interpreter (its time is not a
    performance number) and the compiled ones (a compile per length would outlast the book's
    short sweep)."""
    on_gpu = torch.device(device).type == "cuda"
    reasons = kernels.available(device)
    for name, why in reasons.items():
        if why is None and not on_gpu and kernels.implementation(name).slow_on_cpu:
            reasons[name] = f"{name}: " + NOT_TIMED_ON_CPU.get(name, NOT_TIMED_ON_CPU["compiled"])
    return ([name for name, why in reasons.items() if why is None],
            {name: why for name, why in reasons.items() if why is not None})


def smallest_first(amounts: Mapping[str, float], guess=()) -> list[str]:
    """The names of ``amounts`` from the smallest amount up; names that tie keep the order the
    reader's ``guess`` gave them, so a tie never counts against a guess in the reveal."""
    rank = {name: i for i, name in enumerate(guess or ())}
    return sorted(amounts, key=lambda name: (amounts[name], rank.get(name, len(rank))))


def ops_table(steps: Mapping, on_gpu: bool | None = None) -> pd.DataFrame:
    """Per profiled forward (name -> ``kernels.trace.reader.Step``): how many ops do arithmetic
    themselves (``Step.work_ops``) and which, and on a GPU the kernels, copies and memsets (by
    default where any step recorded GPU work)."""
    if on_gpu is None:
        on_gpu = any(len(s.gpu_work) for s in steps.values())
    table = pd.DataFrame({
        "work ops per forward": {n: len(s.work_ops()) for n, s in steps.items()},
        "which": {n: ", ".join(op if count == 1 else f"{op} ×{count}" for op, count in
                               pd.Series([o.removeprefix("aten::") for o in s.work_ops()])
                               .value_counts(sort=False).items())
                  for n, s in steps.items()}})
    if on_gpu:
        table["GPU activities per forward"] = pd.Series({n: len(s.gpu_work) for n, s in steps.items()})
    return table


def glance(points: Mapping[str, BenchResult], peaks: Peaks) -> pd.DataFrame:
    """One row per contender (name -> its sweep row at one shape), peak memory first (it does not
    depend on the machine's load): median and p10-p90 time (empty where the spread check fails),
    the FLOP rate (GFLOP/s where the roof is under a TFLOP/s, as a CPU's is, so it never reads
    0.01515), % of the roof at its intensity and the "side of ridge" its intensity puts it on (memory
    or compute: where its roof is, not what limits it, since a point far under its roof is limited
    by neither). Six columns, so the table
    fits a page; each implementation's lesson is ``lineup``'s."""
    steady = {id(r) for r in plots.steady(list(points.values()))}
    unit, scale = ("GFLOP/s", 1e3) if peaks.flops < 1e12 else ("TFLOP/s", 1.0)
    rows = []
    for name, r in points.items():
        timed, rate = id(r) in steady, r.tflops or 0.0
        rows.append({
            "implementation": name,
            "peak (MiB)": r.peak_memory_bytes / 2**20 if r.peak_memory_bytes is not None else None,
            "time (ms)": r.median_ms if timed else None,
            "p10-p90 (ms)": (f"{short_number(three_figures(r.p10_ms))}-{short_number(three_figures(r.p90_ms))}"
                             if timed else None),
            unit: rate * scale if timed else None,
            "% of roof": 100 * rate * 1e12 / peaks.attainable(r.intensity) if timed else None,
            "side of ridge": "memory" if r.intensity < peaks.ridge else "compute",
        })
    return pd.DataFrame(rows).set_index("implementation")


def lineup(device) -> pd.DataFrame:
    """Every implementation of the registry: measured on ``device`` or why not (``contenders``, in
    its shortest words), and the lesson of the chapter that built it."""
    measured, left_out = contenders(device)
    return pd.DataFrame({
        "here": {n: "measured" if n in measured else short_reason(left_out[n].removeprefix(f"{n}: "))
                 for n in kernels.names()},
        "its lesson": {n: LESSONS.get(n, "") for n in kernels.names()}}).rename_axis("implementation")


def short_reason(why: str) -> str:
    """The clause of a reason that says what is needed ("needs a CUDA GPU"), else its first clause,
    so that a table of eleven rows stays short."""
    clauses = [part.strip().removeprefix("it ") for part in why.split(";")]
    return next((c for c in clauses if c.startswith("needs")), clauses[0])


def profile_forwards(names, q, k, v, active: int, trace_dir) -> dict:
    """Profile one forward of each implementation in ``names`` (``kernels.trace.record``) and
    keep its median step: {name: Step}. One that cannot run here (a CUDA extension that fails to
    build, say) is reported with its error and left out, so the showdown goes on without it."""
    from kernels.trace import reader, record  # here: the trace recorder is heavy, the tables are not

    steps = {}
    for name in names:
        try:
            run = record.profile(kernels.get(name), q, k, v, label=name, active=active, trace_dir=trace_dir)
        except Exception as err:  # any failure to build or run: say so, go on without it
            print(f"{name} could not run here and leaves the showdown: {type(err).__name__}: {err}")
            continue
        steps[name] = reader.median_step(run.steps())
    return steps


def styled(table: pd.DataFrame, caption: str | None = None, empty: str = ""):
    """``table`` as the page shows it: numbers as ``readable`` writes them ("1,955", never
    "1955.0"), missing cells as ``empty``, the index's name in the header row (no row of its own),
    and ``caption`` above it."""
    shown = table.rename_axis(index=None, columns=table.index.name) if table.index.name else table
    shown = shown.style.format(readable, na_rep=empty)
    return shown.set_caption(caption) if caption else shown


def three_figures(x):
    """``x`` rounded to three significant figures (missing values kept), the precision every number
    of the glance table, and the prose and lines that quote it, shows."""
    return float(f"{x:.3g}") if pd.notna(x) else x


def glance_styled(table: pd.DataFrame, caption: str):
    """``glance``'s table as the page shows it: numbers to three significant figures (so one column
    never mixes 124 with 160.4 and 32.81), empty cells blank, and ``caption`` (where and at which
    shape it was measured)."""
    return styled(table.apply(lambda col: col.map(three_figures) if col.dtype.kind == "f" else col), caption)


def untimed_text(glance: pd.DataFrame) -> str:
    """The clause that says which rows of ``glance``'s table show no time (they failed the spread
    check), or that every row passed it."""
    untimed = list(glance.index[glance["time (ms)"].isna()])
    return (f"rows that failed the spread check show no time: {', '.join(untimed)}" if untimed
            else "every row passed the spread check on this run")


def smallest_first_verdict(guess, amounts: Mapping[str, float], unit: str = "MiB") -> str:
    """One line that answers a guessed ranking (``guess``: names, smallest first) against the
    measured ``amounts`` ({name: amount}): the measured order with its amounts, equal amounts
    told as a tie, and how many guessed names sit at a place the measurement gives them (a tie's
    places belong to each of its names, so either order of a tie is right)."""
    order = sorted(amounts, key=amounts.__getitem__)
    groups: list[list[str]] = []
    for name in order:
        if groups and amounts[groups[-1][0]] == amounts[name]:
            groups[-1].append(name)
        else:
            groups.append([name])
    said = "; ".join(f"{g[0]} {readable(amounts[g[0]])} {unit}" if len(g) == 1
                     else f"{' and '.join(g)} tied at {readable(amounts[g[0]])} {unit}" for g in groups)
    right = sum(1 for i, name in enumerate(guess) if name in amounts and i < len(order)
                and amounts[name] == amounts[order[i]])
    return f"Measured, smallest first: {said}. Your order has {right} of {len(order)} at a right place."


def article_styled():
    """``ARTICLE_A100`` as the page shows it, in short headers so it fits the column, captioned as
    recorded elsewhere, never by this build ("—" where the article reports nothing)."""
    shown = ARTICLE_A100.rename(columns={"kernels per forward": "kernels", "CUDA time per forward (µs)":
                                         "CUDA µs per forward", "CPU time (µs)": "CPU µs"})
    return styled(shown, empty=NOT_RECORDED).set_caption(
        "Recorded elsewhere, not measured by this build: 'Profiling in PyTorch (Part 3): Attention is all "
        "you profile', Hugging Face blog, 2026; one NVIDIA A100-SXM4-80GB, bf16. —: not reported.")


def slopes(results) -> dict[str, float]:
    """Each implementation's log-log slope of time against S, fitted through its points that pass
    the spread check (implementations with fewer than two such points have none)."""
    by_impl: dict[str, list] = {}
    for r in plots.steady(results):
        by_impl.setdefault(r.impl, []).append((math.log(r.seq), math.log(r.median_ms)))
    fitted = {}
    for impl, pts in by_impl.items():
        if len({x for x, _ in pts}) < 2:
            continue
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        fitted[impl] = (sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts))
    return fitted


def longest_slopes(results) -> dict[str, tuple[int, int, float]]:
    """Each implementation's log-log slope between its two longest lengths that pass the spread
    check: (shorter S, longer S, slope)."""
    by_impl: dict[str, dict[int, float]] = {}
    for r in plots.steady(results):
        by_impl.setdefault(r.impl, {})[r.seq] = r.median_ms
    slopes_at = {}
    for impl, times in by_impl.items():
        if len(times) >= 2:
            a, b = sorted(times)[-2:]
            slopes_at[impl] = (a, b, math.log(times[b] / times[a]) / math.log(b / a))
    return slopes_at


def flatter_text(fitted: dict[str, float], longest: dict[str, tuple[int, int, float]]) -> str:
    """The clause that explains a fitted slope under 1.8: where the slope between the two longest
    lengths is steeper, a fixed per-call cost that weighs most at the shortest S (quoted with that
    slope); otherwise the figure does not say why."""
    said = []
    for impl, k in fitted.items():
        if k >= 1.8:
            continue
        if impl in longest and longest[impl][2] > k:
            a, b, tail = longest[impl]
            said.append(f"{impl}'s {k:.1f} is flatter because a fixed per-call cost weighs most at the shortest "
                        f"S (from S={a} to {b} its slope is {tail:.1f})")
        else:
            said.append(f"{impl}'s {k:.1f} is flatter, and this run does not say why")
    return "; " + "; ".join(said) if said else ""


def sweep_reading(results) -> str:
    """What the time-against-S figure can show on this run: how many points passed the spread
    check, each line's fitted slope, and, where a slope strays from attention's 2 (beyond 1.5 to
    2.5) or too few points passed, that the run cannot show the S² (never that a forward escapes it)."""
    results = list(results)
    drawn, measured = len(plots.steady(results)), sum(r.ok for r in results)
    fitted = slopes(results)
    said = f"On this run {drawn} of {measured} points passed the spread check"
    if fitted:
        said += "; the fitted slopes are " + ", ".join(f"{n} {k:.1f}" for n, k in fitted.items())
    if fitted and all(1.5 <= k <= 2.5 for k in fitted.values()) and 2 * drawn >= measured:
        return said + ": the S² of attention shows" + flatter_text(fitted, longest_slopes(results)) + "."
    why = ("Too few points passed to read attention's S² from this figure" if 2 * drawn < measured or not fitted
           else "Some slopes stray from 2, so this figure does not show attention's S² on this run")
    return (said + f". {why}: a slope far from 2 is the machine's load or, at these short lengths, fixed "
            "per-call costs, not a forward escaping its S² FLOPs.")


def book_sweep(on_gpu: bool, seq: int) -> tuple[list[int], dict]:
    """The book's own sweep: the lengths it times besides the chapter's ``seq`` (longer on a GPU)
    and ``sweep.book_budget``'s short timing budget, so that a build takes minutes."""
    from kernels.bench import sweep

    lengths = {512, 1024, 2048, 4096} if on_gpu else {128, 256, 512, 1024}
    return sorted(lengths - {seq}), sweep.book_budget(on_gpu)

"""What only chapter 3b's page (notebooks/03b_sdpa_fused.py) needs: the CPU flash kernel's
allocations, the CPU time of a first call against the calls after it, the peak-memory sweep
and its figure, the reveal of the page's occupancy question, the article's kernel table, the
timing table and its reading, and the reading of the fused backends' kernels on a GPU run."""
from __future__ import annotations

from typing import Mapping

import pandas as pd
import torch

from kernels.book.gpu_kernels import kernel_footprints, launched
from kernels.hw import occupancy
from kernels.notebook import lesson, readable
from kernels.registry import get
from kernels.trace import fingerprints
from kernels.trace.reader import Step

FUSED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
# How a reader names each of the calculator's limits (kernels.hw.occupancy.LIMITS).
LIMIT_WORDS = {"registers": "registers", "shared_memory": "shared memory", "warps": "warp slots", "blocks": "blocks"}


def reveal_limit(guess: str, occ: occupancy.Occupancy) -> str:
    """Say which resource runs out first for ``occ`` against the reader's ``guess`` (one of
    ``LIMIT_WORDS``' values), with how many blocks each resource alone would let in: the
    comparison is the lesson, whichever the guess. Returns the sentence it prints."""
    if guess not in LIMIT_WORDS.values():
        raise ValueError(f"guess one of {', '.join(LIMIT_WORDS.values())}, got {guess!r}")
    first = LIMIT_WORDS[occ.limited_by]
    each = ", ".join(f"{LIMIT_WORDS[name]} {blocks}" for name, blocks in occ.blocks_by.items() if blocks is not None)
    verdict = "as you guessed" if guess == first else f"you guessed {guess}"
    text = f"The resource that runs out first is {first} ({verdict}). Blocks per SM each allows on its own: {each}."
    print(text)
    return text


def article_kernel_table(decoded: pd.DataFrame, backends: list) -> pd.DataFrame:
    """The article's kernels as ``fingerprints.classify_many`` decodes them, one row per backend
    (``backends``, in the order of the names), narrow enough for the page: the full names go
    under the table (``kernel_name_list``). A dtype the name does not carry (the flash name is
    shortened to ``flash_fwd_kernel<...>``) says so instead of reading as a blank."""
    table = decoded.assign(backend=list(backends)).set_index("backend")
    dtype = table["dtype"].where(table["dtype"].notna(), "not in the shortened name")
    return pd.DataFrame({"family": table["family"], "dtype": dtype,
                         "tensor cores": table["tensor_cores"].map({True: "yes", False: "no"})})


def kernel_name_list(names: Mapping[str, str]) -> str:
    """Each backend's full kernel name as a Markdown list (long names wrap there, not in a table)."""
    return "\n".join(f"- {backend}: `{name}`" for backend, name in names.items())


def timing_table(timing) -> pd.DataFrame:
    """A ``kernels.bench.comparison.Comparison`` as a table: each variant's fastest tenth of
    calls (p10), median and slowest tenth (p90), in ms, in the order it was timed."""
    return pd.DataFrame({"p10 (ms)": timing.p10_ms, "median (ms)": timing.median_ms, "p90 (ms)": timing.p90_ms}
                        ).rename_axis(index="variant")


def pair_verdict(timing, a: str, b: str) -> str:
    """The spread check on ``a`` against ``b`` alone, in a few words: "a faster than b" only when
    a's slowest tenth of calls (p90) is below b's fastest tenth (p10), else "not ranked"."""
    for fast, slow in ((a, b), (b, a)):
        if timing.p90_ms[fast] < timing.p10_ms[slow]:
            return f"{fast} faster than {slow}"
    return f"{a} and {b} overlap: not ranked"


def pair_reading(timing, a: str, b: str) -> str:
    """What the spread check says about ``a`` against ``b`` alone, as a sentence: one ranked
    above the other only when its slowest tenth (p90) is below the other's fastest tenth (p10)."""
    for fast, slow in ((a, b), (b, a)):
        if timing.p90_ms[fast] < timing.p10_ms[slow]:
            return (f"Between {a} and {b} the check ranks {fast} faster: its slowest tenth of calls, "
                    f"{readable(timing.p90_ms[fast])} ms, is below {slow}'s fastest, {readable(timing.p10_ms[slow])} ms.")
    return (f"Between {a} and {b} the ranges overlap ({readable(timing.p10_ms[a])}-{readable(timing.p90_ms[a])} ms against "
            f"{readable(timing.p10_ms[b])}-{readable(timing.p90_ms[b])} ms), so they are not ranked against each other, "
            "whatever their medians say.")


def fused_kernels_read(steps_of: Mapping[str, Step]) -> pd.DataFrame:
    """Chapter 3b on a GPU run: each fused SDPA backend in ``steps_of`` runs one kernel per
    forward that decodes as fused attention (cuDNN's launched through the driver, not
    ``cudaLaunchKernel``); the trace's occupancy is Kineto's estimate, which the kernel's
    footprint and grid reproduce, and it reads 0% exactly where the kernel asks for more than
    48 KiB of shared memory per block. Returns each kernel's footprint, a column per backend."""
    read = {}
    for name in (n for n in FUSED if n in steps_of):
        ks = launched(steps_of[name].gpu_work)
        lesson(len(ks) == 1, f"{name} launches exactly one kernel per forward", ", ".join(n[:60] for n in ks["name"]))
        lesson(fingerprints.fingerprint(ks["name"].iloc[0]).kind == "fused_attention", f"{name}'s kernel decodes as fused attention")
        if name == "sdpa_cudnn":
            lesson(ks["launcher"].iloc[0] != "cudaLaunchKernel", "cuDNN does not launch through cudaLaunchKernel",
                   str(ks["launcher"].iloc[0]))
        read[name] = occupancy.trace_kernel(ks.iloc[0], steps_of[name].trace.device_properties)
    return kernel_footprints(read)


# ---- memory and CPU time (the page's CPU measurements) ----------------------------------------

def cpu_flash_allocations(step: Step, batch: int, heads: int, seq: int, head_dim: int, element_size: int) -> dict:
    """The buffers one forward of PyTorch's CPU flash kernel allocated in ``step``: how many, whether
    the output ([B, H, S, D]) and the float32 log-sum-exp ([B, H, S]) are among them, and the KiB of
    the rest (the scratch buffer, a slice of it for each thread)."""
    sizes = step.memory.loc[step.memory["bytes"] > 0, "bytes"].tolist()
    out_bytes = batch * heads * seq * head_dim * element_size
    lse_bytes = batch * heads * seq * 4
    scratch = [b for b in sizes if b not in (out_bytes, lse_bytes)]
    return {"seq": seq, "allocations": len(sizes), "output": out_bytes in sizes, "log-sum-exp": lse_bytes in sizes,
            "scratch (KiB)": sum(scratch) / 1024}


def cpu_flash_allocation_table(sweep_steps: Mapping, batch: int, heads: int, head_dim: int,
                               element_size: int) -> pd.DataFrame:
    """``cpu_flash_allocations`` of every flash step in ``sweep_steps`` ({(backend, seq): step},
    as ``peak_memory_sweep`` returns them), one row per sequence length, indexed by it."""
    rows = [cpu_flash_allocations(step, batch, heads, seq, head_dim, element_size)
            for (name, seq), step in sweep_steps.items() if name == "sdpa_flash"]
    if not rows:
        raise ValueError("sweep_steps holds no sdpa_flash step: the sweep did not run the flash backend")
    return pd.DataFrame(rows).set_index("seq").sort_index()


def first_call_cpu_ms(fn, args, calls: int = 21) -> tuple[float, float]:
    """CPU time of ``fn(*args)``: its first call, and the median of the ``calls - 1`` after it,
    in ms (chapter 3b times cuDNN's first call at a shape it has not seen). On a GPU the time is
    the launch, not the kernel: the stream is synchronised before each call, not inside it."""
    if calls < 2:
        raise ValueError(f"calls must be at least 2 (a first call and one after it), got {calls}")
    import statistics
    import time

    sync = torch.cuda.synchronize if any(getattr(a, "is_cuda", False) for a in args) else (lambda: None)
    spent = []
    for _ in range(calls):
        sync()
        start = time.perf_counter()
        fn(*args)
        spent.append((time.perf_counter() - start) * 1e3)
    sync()
    return spent[0], statistics.median(spent[1:])


# ---- peak memory against sequence length (chapter 3b) -----------------------------------------

def peak_memory_sweep(lengths: dict, batch: int, heads: int, head_dim: int, *, dtype: torch.dtype,
                      device: torch.device, trace_dir: str) -> tuple[pd.DataFrame, dict]:
    """Profile one forward of each backend at each of its sequence lengths (``lengths``: name ->
    list of S) and read its peak memory. Returns the peaks in MiB (index: S, a column per
    backend, NaN where a backend did not run at that S) and the steps, keyed (name, S)."""
    from kernels.notebook import inputs
    from kernels.trace import record

    if not lengths or not all(lengths.values()):
        raise ValueError(f"peak_memory_sweep needs at least one sequence length per backend, got {lengths}")
    rows, steps = [], {}
    for s_len in sorted({s for seqs in lengths.values() for s in seqs}):
        q, k, v = inputs(batch, heads, s_len, head_dim, dtype=dtype, device=device)
        for name in [n for n, seqs in lengths.items() if s_len in seqs]:
            step = record.profile(get(name), q, k, v, label=name, wait=0, warmup=1, active=1,
                                  trace_dir=trace_dir, trace_name=f"{name}_S{s_len}").step()
            steps[name, s_len] = step
            rows.append({"backend": name, "seq": s_len, "peak (MiB)": step.peak_bytes / 2**20})
    return pd.DataFrame(rows).pivot(index="seq", columns="backend", values="peak (MiB)"), steps


def growth_per_doubling(peaks: pd.DataFrame) -> pd.DataFrame:
    """Each backend's peak over its peak at the length before (the sweep doubles S each time)."""
    return (peaks / peaks.shift(1)).rename(columns=lambda c: f"{c} x per doubling")


def peaks_and_growth(peaks: pd.DataFrame) -> pd.DataFrame:
    """The peaks and their growth per doubling side by side, written for reading, one column
    each named by the backend without "sdpa_": MiB to two decimals ("0.59", "78.01"), growth as
    "3.90x", and "—" where a backend did not run at that length or has no shorter length to
    compare with (never a NaN cell)."""
    def text(x: float, unit: str = "") -> str:
        return "—" if pd.isna(x) else f"{x:,.2f}{unit}"

    short = {name: name.removeprefix("sdpa_") for name in peaks.columns}   # narrow headers: the table fits the page
    growth = (peaks / peaks.shift(1)).rename(columns=lambda c: f"{short[c]} growth")
    return pd.concat([peaks.rename(columns=lambda c: f"{short[c]} (MiB)").map(text), growth.map(lambda x: text(x, "x"))],
                     axis=1).rename_axis(index="S", columns=None)


# A flash doubling above this factor is marked on the figure with its factor: more than the
# output's 2x, so something besides the S-sized buffers grew (on a CPU, the scratch buffer).
BUMP_FACTOR = 2.1


def peak_memory_figure(peaks: pd.DataFrame, title: str = "Peak memory of one forward"):
    """Peak memory against S, log-log, with guides through the first point of the math backend
    (∝ S²) and of the flash backend (∝ S), and each flash doubling above ``BUMP_FACTOR``
    marked with its factor. Returns the Figure."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    fig = Figure(figsize=(6, 4.5))  # narrow: its text stays legible on a phone
    ax = fig.add_subplot()
    for name in peaks.columns:
        measured = peaks[name].dropna()
        ax.plot(measured.index, measured, "o-", label=name)
    for power, style, anchor in ((2, ":", "sdpa_math"), (1, "--", "sdpa_flash")):
        if anchor in peaks:
            first = peaks[anchor].dropna()
            guide = first.iloc[0] * (peaks.index / first.index[0]) ** power
            ax.plot(peaks.index, guide, style, color="grey", label=f"∝ S{'²' if power == 2 else ''} (from the first point)")
    if "sdpa_flash" in peaks:
        flash = peaks["sdpa_flash"].dropna()
        for s_len, factor in (flash / flash.shift(1)).dropna().items():
            if factor > BUMP_FACTOR:
                ax.annotate(f"{factor:.2f}x", (s_len, flash[s_len]), textcoords="offset points", xytext=(-10, 8),
                            ha="right", fontsize=11)
    ax.set(xscale="log", yscale="log", xlabel="sequence length S", ylabel="peak memory of one forward (MiB)")
    ax.xaxis.set_minor_locator(NullLocator())  # log axes would label the minor ticks too
    ax.set_xticks(peaks.index, [str(s) for s in peaks.index])
    # Above the axes, the title above it: inside, some corner of a phone's narrower copy covers a point.
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, borderaxespad=0.3)
    ax.set_title(title, pad=46)
    fig.tight_layout()
    return fig

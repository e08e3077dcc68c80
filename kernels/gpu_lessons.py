"""What the chapters read off a GPU run, and assert: the second half of every GPU branch.

Each GPU branch of chapters 04-10 is two parts. The chapter runs the work on the GPU and
profiles or benchmarks it (that part needs a GPU); it then hands the step, its kernels table
or the benchmark's points to one function here, which reads it, shows it and states the
chapter's lesson with ``kernels.notebook.lesson`` (failing loudly when the run disagrees). The
tests hand the same functions fixture steps and points shaped like an H100's
(``tests/hopper_trace.py``) and recordings, so the reading half of every GPU branch runs
without a GPU.

Chapter 6 also reads real traces recorded by others (``kernels.borrowed``) through
``achieved_against_peak`` and ``grid_against_sms``: what a model's attention calls reached
against the GPU's peak, and how their grids met the GPU's SMs; the tests run them on those
traces (tests/trace/test_borrowed_lessons.py).

Kernels are classified by ``kernels.trace.fingerprints`` only (never a regex of a chapter's own):
a Hopper GEMM is ``nvjet_tst_*`` or ``sm90_xmma_gemm_*``, names no ``gemm|cutlass`` pattern
of the Ampere era is sure to cover.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

import pandas as pd
import torch

from kernels.attention import sdpa
from kernels.bench.results import BenchResult
from kernels.cuda import flash as cuda_flash
from kernels.hw import devices, occupancy
from kernels.notebook import lesson
from kernels.trace import fingerprints
from kernels.trace.attention import AttentionReport, dims_text, short_kernel_name
from kernels.trace.reader import Step
from kernels.trace.tables import kernel_table


def launched(kernels: pd.DataFrame) -> pd.DataFrame:
    """The rows of a step's GPU work that are kernels (no memcpy, no memset)."""
    return kernels[kernels["cat"] == "kernel"]


def names_text(kernels: pd.DataFrame, width: int = 50) -> str:
    return ", ".join(n[:width] for n in kernels["name"])


# ---- chapter 4: the Triton kernel ------------------------------------------------------------

def triton_forward(kernels: pd.DataFrame, fwd_name: str, want_grid: Sequence[int], want_block: Sequence[int]):
    """One Triton forward is one kernel, ``fwd_name``, launched with the grid and block the
    autotuner's config implies; returns that kernel's row."""
    first = kernels["name"].iloc[0] if len(kernels) else ""
    lesson(len(kernels) == 1 and first == fwd_name,
           f"one Triton forward is exactly one GPU kernel, {fwd_name}, and no copy or memset", names_text(kernels))
    row = kernels.iloc[0]
    lesson(list(row["grid"]) == list(want_grid) and list(row["block"]) == list(want_block),
           "the trace's grid is (B·H, cdiv(S, BLOCK_M)) and its block is num_warps × 32 threads",
           f"grid {row['grid']} (want {list(want_grid)}), block {row['block']} (want {list(want_block)})")
    return row


def triton_grid(batch: int, heads: int, seq: int, block_m: int) -> list[int]:
    """The forward's launch grid: one program per (batch·head, query tile)."""
    return [batch * heads, math.ceil(seq / block_m), 1]


def kineto_zero_rule(name: str, shared_bytes: int, reported: float) -> None:
    """Kineto's estimate assumes the 48 KiB default per-block limit: over it, the trace reads 0%."""
    lesson((reported == 0) == (shared_bytes > occupancy.KINETO_SHARED_MEM_LIMIT),
           f"{name}: the trace reads 0% exactly when the kernel uses more than 48 KiB of shared memory",
           f"{shared_bytes:,} B, trace {reported}%")


def kernel_footprints(read: Mapping[str, occupancy.TraceKernel]) -> pd.DataFrame:
    """Kernels read from their traces (``occupancy.trace_kernel``), one column each: the trace's
    occupancy is Kineto's estimate, which each kernel's footprint and grid reproduce, and it
    reads 0% exactly where the kernel asks for more than 48 KiB of shared memory per block."""
    lesson(all(k.recorded_percent is None or abs(k.kineto_rounded - k.recorded_percent) <= 1 for k in read.values()),
           "the trace's occupancy is Kineto's estimate: recomputed from each kernel's footprint and grid, it matches",
           "; ".join(f"{n}: {k.kineto_percent:.1f}% vs {k.recorded_percent}%" for n, k in read.items()))
    for name, k in read.items():
        if k.recorded_percent is not None:
            kineto_zero_rule(name, k.shared_mem_per_block, k.recorded_percent)
    return pd.DataFrame({n: k.summary() for n, k in read.items()})


def triton_forward_footprints(steps: Mapping[str, Step], fwd_name: str, config, shape: Sequence[int],
                              show: Callable = print) -> pd.DataFrame:
    """Chapter 4's forward cell on a GPU run: the Triton forward's kernel, launched as the
    autotuner's ``config`` (a ``triton.Config``: its BLOCK_M and num_warps) implies at ``shape``
    (batch, heads, seq), and SDPA flash's kernel when ``steps`` has it, their occupancy on the
    GPU their traces name, and Kineto's rules (``kernel_footprints``); ``show`` displays the
    tables (the notebook's ``display``). Returns the footprint table (empty for a GPU the
    occupancy tables do not know)."""
    batch, heads, seq = shape
    show(kernel_table(steps["triton"]))
    grid = triton_grid(batch, heads, seq, config.kwargs["BLOCK_M"])
    rows = {"triton": triton_forward(steps["triton"].gpu_work, fwd_name, grid, [32 * config.num_warps, 1, 1])}
    if "sdpa_flash" in steps:
        show(kernel_table(steps["sdpa_flash"]))
        flash = launched(steps["sdpa_flash"].gpu_work)
        lesson(len(flash) == 1, "SDPA's flash forward is one kernel", names_text(flash))
        rows["sdpa_flash"] = flash.iloc[0]
    try:
        read = {name: occupancy.trace_kernel(row, steps[name].trace.device_properties) for name, row in rows.items()}
    except ValueError as err:  # a GPU the occupancy tables do not know yet
        print("occupancy not computed:", err)
        return pd.DataFrame()
    for name, k in read.items():
        print(f"{name}:\n{k.occupancy.explain()}\n")
    table = kernel_footprints(read)
    show(table)
    return table


TRITON_BACKWARD = ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq")


def triton_backward(step: Step, fwd_name: str, show: Callable = print) -> list[str]:
    """Forward + backward of the Triton kernel: four kernels and no memset."""
    show(kernel_table(step))
    kernels = step.gpu_work
    names = list(launched(kernels)["name"])
    lesson(sorted(names) == sorted([fwd_name, *TRITON_BACKWARD]),
           "forward + backward is four kernels: forward, Δ, dK/dV, dQ", ", ".join(names))
    lesson(not (kernels["cat"] == "gpu_memset").any(), "no memset: no buffer is zeroed for atomic adds")
    return names


def ran_at_every_point(results: Iterable[BenchResult], impl: str, what: str) -> None:
    """A benchmark sweep's points of ``impl`` all ran (status ok)."""
    points = [r for r in results if r.impl == impl]
    lesson(len(points) > 0 and all(r.ok for r in points), what,
           ", ".join(f"S={r.seq} {r.mode}: {r.status}" for r in points))


# ---- chapter 5: the CUDA kernels -------------------------------------------------------------

def cuda_forward(step: Step, name: str, cfg, batch: int, heads: int, seq: int) -> dict:
    """One forward of ``cuda_v1``/``cuda_v2`` on the GPU track: one kernel, with its launcher's
    grid, block and dynamic shared memory; returns its footprint as the trace recorded it."""
    ks = launched(step.gpu_work)
    version = name.removeprefix("cuda_")
    lesson(len(ks) == 1 and f"flash_{version}_kernel" in ks["name"].iloc[0],
           f"one forward of {name} is one kernel on the GPU track", names_text(ks))
    row = ks.iloc[0]
    lesson(list(row["block"]) == [cfg.threads, 1, 1] and list(row["grid"]) == list(cfg.grid(batch, heads, seq)),
           f"{name}'s trace shows the grid and block of its launcher", f"grid {row['grid']}, block {row['block']}")
    lesson(int(row["shared_memory"]) == cfg.dynamic_shared_bytes,
           f"{name}'s shared memory in the trace is the launcher's dynamic shared memory",
           f"{int(row['shared_memory']):,} B")
    if pd.notna(row["occupancy_pct"]):
        kineto_zero_rule(name, int(row["shared_memory"]), row["occupancy_pct"])
    return {"kernel": row["name"][:60], "registers (trace)": row["registers_per_thread"],
            "shared memory (trace, B)": row["shared_memory"],
            "est. achieved occupancy % (trace)": row["occupancy_pct"],
            "GPU time per forward (us)": round(step.gpu_time_us, 1)}


def cuda_forwards(steps: Mapping[str, Step], head_dim: int, batch: int, heads: int, seq: int) -> pd.DataFrame:
    """Each profiled forward of ``steps`` ({"cuda_v1": step, ...}) checked against its launcher
    (``cuda_forward``); their footprints as the traces recorded them, one column per kernel."""
    return pd.DataFrame({name: cuda_forward(step, name, cuda_flash.launch_config(name.removeprefix("cuda_"), head_dim),
                                            batch, heads, seq)
                         for name, step in steps.items()})


def tensor_cores_win(results: Iterable[BenchResult]) -> bool:
    """v2 (tensor cores) is faster than v1 (CUDA cores), by the benchmark's medians. Asserted
    where the sweep timed both; returns whether it was (False: one of them was not in it)."""
    points = {r.impl: r for r in results if r.impl in ("cuda_v1", "cuda_v2")}
    if len(points) < 2:
        return False
    v1, v2 = points["cuda_v1"], points["cuda_v2"]
    claim = "tensor cores win: v2 is faster than v1"
    if v1.median_ms is None or v2.median_ms is None:
        lesson(False, claim, f"not both timed: v1 {v1.status}, v2 {v2.status}")
    else:
        lesson(v2.median_ms < v1.median_ms, claim,
               f"{v1.median_ms:.3f} ms vs {v2.median_ms:.3f} ms, {v1.median_ms / v2.median_ms:.1f}x")
    return True


# ---- chapter 6: the showdown -----------------------------------------------------------------

FUSED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")


def fused_kernels_read(steps_of: Mapping[str, Step]) -> pd.DataFrame:
    """Chapter 3b on a GPU run: each fused SDPA backend in ``steps_of`` runs one kernel per
    forward that decodes as fused attention (cuDNN's launched through the driver, not
    ``cudaLaunchKernel``); the trace's occupancy is Kineto's estimate, which the kernel's
    footprint and grid reproduce, and it reads 0% exactly where the kernel asks for more than
    48 KiB of shared memory per block. Returns each kernel's footprint, a column per backend."""
    read = {}
    for name in (n for n in FUSED if n in steps_of):
        ks = launched(steps_of[name].gpu_work)
        lesson(len(ks) == 1, f"{name} launches exactly one kernel per forward", names_text(ks, 60))
        lesson(fingerprints.fingerprint(ks["name"].iloc[0]).kind == "fused_attention", f"{name}'s kernel decodes as fused attention")
        if name == "sdpa_cudnn":
            lesson(ks["launcher"].iloc[0] != "cudaLaunchKernel", "cuDNN does not launch through cudaLaunchKernel",
                   str(ks["launcher"].iloc[0]))
        read[name] = occupancy.trace_kernel(ks.iloc[0], steps_of[name].trace.device_properties)
    return kernel_footprints(read)


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


def fused_medians(points: Mapping[str, BenchResult]) -> str:
    """This run's median per forward of each fused SDPA backend ``points`` ({impl: point at the
    chapter's shape}) holds, one line each, to read beside the article's A100 table."""
    return "\n".join(f"this run, {r.impl}: {1e3 * r.median_ms:.1f} µs median per forward "
                     f"(B={r.batch} H={r.heads} S={r.seq} D={r.head_dim}, {r.dtype})"
                     for r in (points[n] for n in FUSED if n in points) if r.median_ms is not None)


# ---- chapter 7: torch.compile and flex -------------------------------------------------------

def compiled_forward(kernels: pd.DataFrame) -> pd.DataFrame:
    """The compiled naive forward runs Inductor's Triton kernels and no copy; returns the
    kernels' fingerprints."""
    styles = [fingerprints.inductor_style(n) for n in kernels["name"]]
    lesson(any(s is not None for s in styles) and (kernels["cat"] != "gpu_memcpy").all(),
           "on the GPU the compiled forward runs Inductor's Triton kernels and no copy", names_text(kernels))
    return fingerprints.classify_many(kernels["name"])


def flex_forward(kernels: pd.DataFrame) -> pd.DataFrame:
    """A compiled flex forward is one FlexAttention template kernel (Inductor's triton_tem_)."""
    templates = sum(fingerprints.inductor_style(n) == "tem" for n in kernels["name"])
    lesson(templates == 1, "on the GPU, a flex forward runs one FlexAttention template kernel", names_text(kernels))
    return fingerprints.classify_many(kernels["name"])[["name", "kind", "family", "note"]]


# ---- chapter 8: the block --------------------------------------------------------------------

def gelu_between_matmuls(work: pd.DataFrame) -> list[str]:
    """GELU is a pass of its own between two library matmuls (fc_in's and fc_out's).

    ``work`` is a step's GPU kernels, or its CPU ops where there is no GPU track; matmuls are
    what ``fingerprints.is_gemm`` says (cuBLAS's nvjet_* on Hopper included). Returns the
    matmul and GELU rows' names in launch order."""
    keep = [fingerprints.is_gemm(n) or fingerprints.mentions_op(n, "gelu") for n in work["name"]]
    names = work[keep].sort_values("start_us")["name"].tolist()
    gelu = [fingerprints.mentions_op(n, "gelu") for n in names]
    at = gelu.index(True) if any(gelu) else None
    lesson(at is not None and 0 < at < len(names) - 1 and not gelu[at - 1] and not gelu[at + 1],
           "but GELU is still a pass of its own between two library matmuls (fc_in's and fc_out's)",
           " -> ".join(n.removeprefix("aten::")[:40] for n in names))
    return names


# ---- chapter 9: the backward -----------------------------------------------------------------

def backward_threads(steps: Mapping[str, Step], source: str) -> pd.DataFrame:
    """Every variant's backward kernels are launched from a thread other than the caller's."""
    rows = []
    for name, s in steps.items():
        ks = s.gpu_work
        own = ks["thread"] == s.thread[1]
        rows.append({"variant": name, "forward kernels (caller's thread)": int(own.sum()),
                     "backward kernels (engine's thread)": int((~own).sum()),
                     "backward kernels": ", ".join(sorted(set(ks.loc[~own, "name"].str.slice(0, 50))))[:200]})
    table = pd.DataFrame(rows).set_index("variant")
    lesson(bool((table["backward kernels (engine's thread)"] > 0).all()),
           "every variant's backward kernels are launched from a thread other than the caller's", source)
    return table


# ---- chapter 10: decoding --------------------------------------------------------------------

def decode_backend_here(chosen: str, chosen_gqa: str, device, dtype: torch.dtype, head_dim: int) -> None:
    """Where unpinned SDPA sent chapter 10's decode tokens (``chosen``: multi-head, ``chosen_gqa``:
    shared K/V heads) on this machine: on a GPU, the backend PyTorch's priority rules predict for
    it; on a CPU, PyTorch's CPU flash kernel for both, as for prefill."""
    device = torch.device(device)
    if device.type == "cuda":
        predicted = sdpa.predicted_backend_here(device, dtype, head_dim)
        lesson(chosen == predicted, "on this GPU the decode token goes to the backend the priority rules predict",
               f"chose {chosen}, rules predict {predicted}")
    else:
        lesson(chosen == chosen_gqa == "sdpa_flash", "on a CPU a decode token goes to PyTorch's CPU flash kernel, "
               "as prefill does", f"multi-head: {chosen}, GQA: {chosen_gqa}")


def naive_copy_on_gpu(step: Step) -> pd.DataFrame:
    """Chapter 1 on a GPU run: the naive forward runs the article's six GPU activities, one of
    them a copy launched inside ``masked_fill`` (its clone). Returns the step's kernel table."""
    gpu = step.gpu_work
    copies = gpu[gpu["cat"] == "gpu_memcpy"]
    lesson(len(gpu) == 6, "the naive forward runs six GPU activities, as on the article's A100", f"{len(gpu)} on the GPU track")
    fill = step.find("aten::masked_fill").iloc[0]
    lesson(len(copies) == 1 and fill["start_us"] <= copies["launch_start_us"].iloc[0] <= fill["start_us"] + fill["dur_us"],
           "exactly one of them is a copy, launched inside masked_fill (its clone)")
    return kernel_table(step)


def inplace_drops_the_copy_on_gpu(steps_of: Mapping[str, Step], source: str = "") -> None:
    """Chapter 2 on a GPU run (``source`` names it in the evidence): the naive forward's six GPU
    activities become five in place, and the one that went is the copy."""
    counts = {n: (len(steps_of[n].gpu_work), int((steps_of[n].gpu_work["cat"] == "gpu_memcpy").sum()))
              for n in ("naive", "inplace")}
    lesson(counts == {"naive": (6, 1), "inplace": (5, 0)}, "the GPU track goes from 6 activities to 5, as on the "
           "article's A100, and the one that went is the copy", f"(activities, copies): {counts}" + (f", {source}" if source else ""))


def math_gemms_not_16bit(step: Step, source: str) -> pd.DataFrame:
    """Chapter 3 on a GPU run (``source`` names it): no GEMM the math backend launched runs in 16
    bits, read from the kernel names. Returns each kernel's name (cut to 70 characters), kind,
    tensor-core use and dtype."""
    fps = fingerprints.classify_many(step.gpu_work["name"])
    gemm_dtypes = set(fps.loc[fps["kind"] == "gemm", "dtype"])
    lesson(bool(gemm_dtypes) and not gemm_dtypes & {"bf16", "fp16"},
           "no GEMM of the math backend runs in 16 bits on the GPU track",
           f"GEMM dtypes from the names: {gemm_dtypes}, {source}")
    return fps[["name", "kind", "tensor_cores", "dtype"]].assign(name=fps["name"].str.slice(0, 70))

"""What the chapters read off a GPU run, and assert: the second half of every GPU branch.

Each GPU branch of chapters 04-10 is two parts. The chapter runs the work on the GPU and
profiles it (that part needs a GPU); it then hands the step, its kernels table or a result
table to one function here, which reads it and states the chapter's lesson with
``kernels.notebook.lesson`` (failing loudly when the trace disagrees). The tests hand the same
functions fixture steps shaped like an H100's (``tests/hopper_trace.py``) and recordings,
so the reading half of every GPU branch runs without a GPU.

Kernels are classified by ``kernels.trace.fingerprints`` only (never a regex of a chapter's own):
a Hopper GEMM is ``nvjet_tst_*`` or ``sm90_xmma_gemm_*``, names no ``gemm|cutlass`` pattern
of the Ampere era is sure to cover.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import pandas as pd

from kernels.trace import fingerprints
from kernels.hw import occupancy
from kernels.notebook import lesson
from kernels.trace.reader import Step
from kernels.trace.tables import kernel_table


def launched(kernels: pd.DataFrame) -> pd.DataFrame:
    """The rows of a step's GPU work that are kernels (no memcpy, no memset)."""
    return kernels[kernels["cat"] == "kernel"]


def names_text(kernels: pd.DataFrame, width: int = 50) -> str:
    return ", ".join(n[:width] for n in kernels["name"])


# ---- chapter 4: the Triton kernel ------------------------------------------------------------

def footprint(kernel_row: Mapping, arch: str) -> dict:
    """The launch footprint of one trace kernel, and the occupancy it allows on ``arch``."""
    event = {"block": kernel_row["block"], "registers per thread": kernel_row["registers_per_thread"],
             "shared memory": kernel_row["shared_memory"]}
    occ = occupancy.occupancy_from_trace(event, arch)
    return {"kernel": kernel_row["name"][:60], "grid": kernel_row["grid"], "block": kernel_row["block"],
            "registers/thread": kernel_row["registers_per_thread"], "shared memory (B)": kernel_row["shared_memory"],
            "occupancy (ours) %": round(occ.percent, 1), "limited by": occ.limited_by,
            "trace's estimate %": kernel_row["occupancy_pct"], "explain": occ.explain()}


def triton_forward(kernels: pd.DataFrame, fwd_name: str, want_grid: Sequence[int], want_block: Sequence[int]):
    """One Triton forward is one kernel, ``fwd_name``, launched with the grid and block the
    autotuner's config implies; returns that kernel's row."""
    first = kernels["name"].iloc[0] if len(kernels) else ""
    lesson(len(kernels) == 1 and fwd_name in first and ("_tma" in first) == fwd_name.endswith("_tma"),
           f"one Triton forward is exactly one GPU kernel, {fwd_name}, and no copy or memset", names_text(kernels))
    row = kernels.iloc[0]
    lesson(list(row["grid"]) == list(want_grid) and list(row["block"]) == list(want_block),
           "the trace's grid is (B·H, cdiv(S, BLOCK_M)) and its block is num_warps × 32 threads",
           f"grid {row['grid']} (want {list(want_grid)}), block {row['block']} (want {list(want_block)})")
    return row


def triton_grid(batch: int, heads: int, seq: int, block_m: int) -> list[int]:
    """The forward's launch grid: one program per (batch·head, query tile)."""
    return [batch * heads, math.ceil(seq / block_m), 1]


def single_kernel(kernels: pd.DataFrame, name: str):
    """A fused backend's forward is one kernel; returns its row."""
    ks = launched(kernels)
    lesson(len(ks) == 1, f"{name} is also a single kernel per forward: the same shape of trace", names_text(kernels))
    return ks.iloc[0]


def kineto_zero_rule(table: Mapping[str, Mapping]) -> None:
    """Kineto's estimate assumes the 48 KiB default per-block limit: over it, the trace reads 0%."""
    for name, f in table.items():
        smem, reported, ours = int(f["shared memory (B)"]), f["trace's estimate %"], f["occupancy (ours) %"]
        lesson((reported == 0) == (smem > occupancy.KINETO_SHARED_MEM_LIMIT),
               f"{name}: the trace reads 0% exactly when the kernel uses more than 48 KiB of shared memory",
               f"{smem:,} B, trace {reported}%, ours {ours}%")


def triton_forward_footprints(steps: Mapping[str, Step], fwd_name: str, want_grid: Sequence[int],
                              want_block: Sequence[int], arch: str, show: Callable = print) -> dict:
    """Chapter 4's forward cell on a GPU run: the Triton forward's kernel and launch, SDPA
    flash's single kernel when ``steps`` has it, their footprints and occupancy on ``arch``,
    and Kineto's 48 KiB rule; ``show`` displays the tables (the notebook's ``display``).
    Returns the footprint table ({} for a GPU the occupancy tables do not know)."""
    show(kernel_table(steps["triton"]))
    row = triton_forward(steps["triton"].gpu_work, fwd_name, want_grid, want_block)
    try:
        table = {"triton": footprint(row, arch)}
        if "sdpa_flash" in steps:
            show(kernel_table(steps["sdpa_flash"]))
            table["sdpa_flash"] = footprint(single_kernel(steps["sdpa_flash"].gpu_work, "SDPA flash"), arch)
    except ValueError as err:  # a GPU the occupancy tables do not know yet
        print("occupancy not computed:", err)
        return {}
    for name, f in table.items():
        print(f"{name}:\n{f['explain']}\n")
    show(pd.DataFrame(table).drop(index="explain"))
    kineto_zero_rule(table)
    return table


TRITON_BACKWARD = ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq")


def triton_backward(step: Step, fwd_name: str, show: Callable = print) -> list[str]:
    """Forward + backward of the Triton kernel: four kernels and no memset."""
    show(kernel_table(step))
    kernels = step.gpu_work
    names = list(launched(kernels)["name"])
    lesson(sorted(names) == sorted([fwd_name, *TRITON_BACKWARD]),
           "forward + backward is four kernels: forward, Δ, dK/dV, dQ", ", ".join(names))
    lesson(not (kernels["cat"] == "gpu_memset").any(), "no memset: no buffer is zeroed for atomic adds")
    return names


def ran_at_every_point(frame: pd.DataFrame, impl: str, what: str) -> None:
    """A benchmark sweep's rows of ``impl`` all ran (status ok)."""
    rows = frame[frame["impl"] == impl]
    lesson(len(rows) > 0 and bool((rows["status"] == "ok").all()), what,
           ", ".join(f"S={s}: {st}" for s, st in zip(rows["seq"], rows["status"])))


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
    smem, reported = int(row["shared_memory"]), row["occupancy_pct"]
    if reported is not None and pd.notna(reported):
        lesson((reported == 0) == (smem > occupancy.KINETO_SHARED_MEM_LIMIT),
               f"{name}: the trace reads 0% occupancy exactly when its shared memory passes 48 KiB",
               f"{smem:,} B, trace {reported}%")
    return {"kernel": row["name"][:60], "registers (trace)": row["registers_per_thread"],
            "shared memory (trace, B)": row["shared_memory"],
            "est. achieved occupancy % (trace)": row["occupancy_pct"],
            "GPU time per forward (us)": round(step.gpu_time_us, 1)}


def tensor_cores_win(timing: pd.DataFrame) -> None:
    """v2 (tensor cores) is faster than v1 (CUDA cores), by the benchmark's medians."""
    t1, t2 = timing.loc["cuda_v1", "median_ms"], timing.loc["cuda_v2", "median_ms"]
    lesson(t2 < t1, "tensor cores win: v2 is faster than v1", f"{t1:.3f} ms vs {t2:.3f} ms, {t1 / t2:.1f}x")


# ---- chapter 6: the showdown -----------------------------------------------------------------

FUSED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")


def fused_one_kernel_math_more(steps_of: Mapping[str, Step]) -> None:
    """Each fused SDPA backend launches one kernel per forward; the math backend launches more
    GPU work than the hand-written in-place forward."""
    for n in (n for n in FUSED if n in steps_of):
        count = len(launched(steps_of[n].gpu_work))
        lesson(count == 1, f"{n} launches one kernel per forward", f"{count} kernels")
    math_n, inplace_n = len(steps_of["sdpa_math"].gpu_work), len(steps_of["inplace"].gpu_work)
    lesson(math_n > inplace_n, "SDPA's math backend launches more GPU work than the hand-written in-place version",
           f"{math_n} vs {inplace_n}")


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

def decode_backend(chosen: str, predicted: str) -> None:
    """On a GPU, SDPA sends the decode token to the backend its priority rules predict."""
    lesson(chosen == predicted, "on this GPU the decode token goes to the backend the priority rules predict",
           f"chose {chosen}, rules predict {predicted}")

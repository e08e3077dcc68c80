"""What only chapter 4 (FlashAttention-2 in Triton) needs: the reading of the book's own GPU
recording (the forward's one kernel, its grid, block and footprint beside SDPA flash's, Kineto's
48 KiB rule, the backward's four kernels and no memset) and the check that the Triton kernel ran
at every point of the GPU sweep. Each function states its lesson with ``kernels.notebook.lesson``;
the tests hand them Hopper-shaped fixture steps, so this branch runs without a GPU."""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

import pandas as pd

from kernels.bench.results import BenchResult
from kernels.book.gpu_kernels import kernel_footprints, launched, names_text
from kernels.hw import occupancy
from kernels.notebook import lesson
from kernels.trace.reader import Step
from kernels.trace.tables import kernel_table

TRITON_BACKWARD = ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq")


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


def triton_forward_footprints(steps: Mapping[str, Step], fwd_name: str, config, shape: Sequence[int],
                              show: Callable = print) -> pd.DataFrame:
    """The chapter's forward on a GPU run: the Triton forward's kernel, launched as the
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

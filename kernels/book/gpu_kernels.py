"""The checks several pages make of a GPU step's kernels (chapters 3b, 4, 5 and 7): which rows are
kernels, their names in a lesson's evidence, and Kineto's occupancy estimate recomputed from each
kernel's footprint. One home for them, so the pages that read the book's own GPU recording (or a
borrowed trace) say the same thing the same way."""
from __future__ import annotations

from typing import Mapping

import pandas as pd

from kernels.hw import occupancy
from kernels.notebook import lesson


def launched(kernels: pd.DataFrame) -> pd.DataFrame:
    """The rows of a step's GPU work that are kernels (no memcpy, no memset)."""
    return kernels[kernels["cat"] == "kernel"]


def names_text(kernels: pd.DataFrame, width: int = 50) -> str:
    """The kernels' names, each cut to ``width`` characters, for a lesson's evidence."""
    return ", ".join(n[:width] for n in kernels["name"])


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

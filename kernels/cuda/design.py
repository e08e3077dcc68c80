"""Chapter 5's design steps: cuda_v2 compiled once per step of its design, from its first
version to the kernel that runs, one change at a time, all from the one source.

``flash_v2.cu`` writes the choices that separate the kernel from its first version as
compile-time switches (its ``Design`` template); compiled with ``-DFLASH_V2_DESIGN_STEPS``
it instantiates the kernel once per step of ``DESIGN_STEPS``. Read without running anything:

* ``design_steps(head_dim)``: each step's compiler report (registers, shared memory,
  spills) and its PTX's counts of the instructions that carry the changes
  (``STEP_OPCODES``); compiled now where nvcc is, else as ``kernels.cuda.resources.RECORDED_REPORT``
  holds them.
* ``design_table(reports)``: those, with the occupancy each step allows and what a
  PyTorch trace would read (Kineto's estimate); ``tile_bodies`` and ``barriers_per_tile``
  read the unrolled tile steps and their barriers out of the counts.
* ``tile_census(...)``: which (query block, key tile) pairs of a launch take the step
  without the mask, the masked one, or none, which is what the split-mask step is for.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from kernels.cuda import flash as cuda_flash
from kernels.cuda.resources import MMA_M, RECORDED_REPORT, WARP, compile_device_code, instruction_counts, mma_per_key_tile, occupancy_of
from kernels.hw.occupancy import kineto_estimate
from kernels.cuda.ptxas import KernelResources, nvcc_path, with_launch


@dataclass(frozen=True)
class DesignStep:
    """One set of flash_v2.cu's ``Design`` switches (its template arguments, in order)."""
    change: str            # what this step adds to the one before it
    block_m: int           # query rows per block (16 per warp)
    split_mask: bool       # fully visible key tiles go through an instantiation without the mask
    fast_exp2: bool        # ex2.approx.ftz, the scale folded into the FMA that subtracts the max
    double_buffer: bool    # key tile j + 1 loads into a second buffer while tile j computes

    @property
    def threads(self) -> int:
        return WARP * self.block_m // MMA_M

    def dynamic_shared_bytes(self, head_dim: int) -> int:
        return cuda_flash.v2_shared_bytes(head_dim, self.block_m, self.double_buffer)


# The explicit instantiations at the end of flash_v2.cu (FLASH_V2_DESIGN_STEPS), in order:
# each step turns on one more change; the last is the kernel the launcher runs.
DESIGN_STEPS = (
    DesignStep("the first version: 64 query rows (4 warps), mask on every tile, exp2f, one K/V buffer",
               64, False, False, False),
    DesignStep("128 query rows per block (8 warps of 16 rows)", 128, False, False, False),
    DesignStep("masked and unmasked tile steps as two instantiations", 128, True, False, False),
    DesignStep("fast exp2 (ex2.approx.ftz), scale folded into one FMA", 128, True, True, False),
    DesignStep("K/V double-buffered, one barrier per tile (the kernel that runs)", 128, True, True, True),
)
# The instructions that carry the changes, counted in each step's PTX.
STEP_OPCODES = ("mma.sync", "ex2.approx.f32", "ex2.approx.ftz.f32", "bar.sync")
_DESIGN = re.compile(r"flash_v2_design_kernel<\s*([\w:]+)\s*,\s*(\d+)\s*,[^<]*Design<\s*(\d+)\s*,"
                     r"\s*(true|false)\s*,\s*(true|false)\s*,\s*(true|false)\s*>")


def parse_design(name: str) -> tuple[int, DesignStep]:
    """(head_dim, step) of a ``flash_v2_design_kernel<__nv_bfloat16, 64, Design<...>>`` name."""
    m = _DESIGN.search(name)
    if m is None:
        raise ValueError(f"not a flash_v2_design_kernel instantiation: {name!r}")
    switches = (int(m.group(3)), *(g == "true" for g in m.group(4, 5, 6)))
    for step in DESIGN_STEPS:
        if (step.block_m, step.split_mask, step.fast_exp2, step.double_buffer) == switches:
            return int(m.group(2)), step
    raise ValueError(f"{name!r} is no step of DESIGN_STEPS (flash_v2.cu and cuda_design disagree)")


@dataclass(frozen=True)
class StepReport:
    head_dim: int
    step: DesignStep
    kernel: KernelResources   # what ptxas reported, completed with the step's launch
    counts: dict              # {opcode of STEP_OPCODES: how often it occurs in the kernel's PTX}

    @property
    def index(self) -> int:
        return DESIGN_STEPS.index(self.step)


def design_steps(head_dim: int, archs: Iterable[str] = ("sm_80", "sm_90"),
                 live: Optional[bool] = None) -> list[StepReport]:
    """cuda_v2 (bf16) at every step of DESIGN_STEPS: compiled now (``live``, needs nvcc), or
    RECORDED_REPORT (``live=False``); ``None`` compiles where nvcc is found."""
    archs = list(archs)
    if live is None:
        live = nvcc_path() is not None
    if not live:
        return [report for report in recorded_steps() if report.head_dim == head_dim and report.kernel.arch in archs]
    defines = (f"-DFLASH_V2_DESIGN_STEPS={head_dim}", "-diag-suppress=177")  # 177: fp16 helpers unused here
    jobs = [(arch, defines) for arch in archs]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        compiled = list(pool.map(lambda job: compile_device_code(cuda_flash.CSRC / "flash_v2.cu", *job), jobs))
    out = []
    for ptx, kernels in compiled:
        counts = {op: instruction_counts(ptx, op) for op in STEP_OPCODES}
        for k in kernels:
            d, step = parse_design(k.name)
            out.append(StepReport(d, step, with_launch(k, step.threads, step.dynamic_shared_bytes(d)),
                                  {op: next(n for name, n in counts[op].items() if name == k.name) for op in STEP_OPCODES}))
    return sorted(out, key=lambda r: (r.kernel.arch, r.index))


def as_recorded_steps(reports: Iterable[StepReport]) -> list[tuple]:
    """Step reports in RECORDED_REPORT["design_steps"]'s row format."""
    return [(r.kernel.arch, r.head_dim, r.index, r.kernel.registers, r.kernel.shared_bytes, r.kernel.spill_store_bytes,
             r.kernel.spill_load_bytes, r.kernel.stack_frame_bytes, *(r.counts[op] for op in STEP_OPCODES))
            for r in reports]


def recorded_steps() -> list[StepReport]:
    out = []
    for arch, d, index, regs, smem, st, ld, stack, *counts in RECORDED_REPORT["design_steps"]:
        step = DESIGN_STEPS[index]
        switches = ", ".join(str(x).lower() for x in (step.block_m, step.split_mask, step.fast_exp2, step.double_buffer))
        kernel = KernelResources(
            name=f"void (anonymous namespace)::flash_v2_design_kernel<__nv_bfloat16, {d}, "
                 f"(anonymous namespace)::Design<{switches}>>(flash::Problem, bool)",
            mangled="(recorded)", arch=arch, registers=regs, shared_bytes=smem, spill_store_bytes=st,
            spill_load_bytes=ld, stack_frame_bytes=stack, barriers=1)
        out.append(StepReport(d, step, with_launch(kernel, step.threads, step.dynamic_shared_bytes(d)),
                              dict(zip(STEP_OPCODES, counts))))
    return sorted(out, key=lambda r: (r.kernel.arch, r.head_dim, r.index))


def tile_bodies(report: StepReport) -> int:
    """Copies of the tile step in the kernel: its mma.sync count over one tile's worth (each
    body is unrolled, so one copy holds exactly one key tile's mma instructions)."""
    return report.counts["mma.sync"] // mma_per_key_tile(report.head_dim)


def barriers_per_tile(report: StepReport) -> float:
    """bar.sync in each tile step: all of the kernel's but the prologue's one, over the bodies."""
    return (report.counts["bar.sync"] - 1) / tile_bodies(report)


def design_table(reports: Iterable[StepReport]):
    """One row per (arch, step): the compiler's report, the occupancy it allows, what a
    PyTorch trace would read (Kineto's estimate, 0% above 48 KiB of shared memory), and the
    instructions that carry each change."""
    import pandas as pd

    rows = []
    for r in reports:
        k, occ = r.kernel, occupancy_of(r.kernel)
        rows.append({"arch": k.arch, "step": r.index, "change": r.step.change, "threads": k.threads_per_block,
                     "registers": k.registers, "shared memory (B)": k.total_shared_bytes,
                     "spilled (B)": k.spill_store_bytes + k.spill_load_bytes,
                     "blocks/SM": occ.blocks_per_sm, "warps/SM": occ.warps_per_sm,
                     "occupancy %": round(occ.percent, 2), "limited by": " and ".join(occ.limiters),
                     "a trace reads %": round(kineto_estimate(k.threads_per_block, k.registers, k.total_shared_bytes,
                                                              grid_blocks=10**6, sm_count=1, arch=k.arch), 2),
                     "mma.sync": r.counts["mma.sync"], "tile-step bodies": tile_bodies(r),
                     "ex2.approx.f32": r.counts["ex2.approx.f32"], "ex2.approx.ftz.f32": r.counts["ex2.approx.ftz.f32"],
                     "barriers per tile": barriers_per_tile(r)})
    return pd.DataFrame(rows).sort_values(["arch", "step"]).reset_index(drop=True)


def tile_census(seq_q: int, seq_k: int, block_m: int, block_n: int, causal: bool = True) -> dict:
    """What a launch does with each (query block, key tile) pair, from the reference's mask:
    "unmasked" (every real row of the block sees every key of the tile: the step without the
    mask), "masked" (some rows see some keys, or the tile runs past Sk), "skipped" (no row sees
    any key: never loaded). flash_api.h's key_tiles() makes the same split (a test checks it)."""
    from kernels.reference import future_mask

    seen = ~future_mask(seq_q, seq_k).numpy() if causal else np.ones((seq_q, seq_k), bool)
    counts = {"unmasked": 0, "masked": 0, "skipped": 0}
    for first in range(0, seq_q, block_m):
        rows = seen[first:first + block_m]                                   # [<= block_m, seq_k]
        for j in range(-(-seq_k // block_n)):
            tile = rows[:, j * block_n:(j + 1) * block_n]                    # [<= block_m, <= block_n]
            kind = ("unmasked" if (j + 1) * block_n <= seq_k and tile.all() else
                    "masked" if tile.any() else "skipped")
            counts[kind] += 1
    return counts


__all__ = ["DESIGN_STEPS", "STEP_OPCODES", "DesignStep", "StepReport", "as_recorded_steps", "barriers_per_tile",
           "design_steps", "design_table", "parse_design", "recorded_steps", "tile_bodies", "tile_census"]

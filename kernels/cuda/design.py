"""cuda_v2's design revisions: the kernel compiled once per revision of its design, from its
first version to the kernel that runs, one change at a time, all from the one source.

``flash_v2.cu`` writes the choices that separate the kernel from its first version as
compile-time switches (its ``Design`` template); compiled with ``-DFLASH_V2_DESIGN_REVISIONS``
it instantiates the kernel once per revision of ``DESIGN_REVISIONS``.

* ``design_revisions(head_dim)``: each revision's resources and its PTX's counts of the
  instructions that carry the changes (``REVISION_OPCODES``): compiled now (``live=True``) or
  read from the nvcc snapshot (``live=False``); ``read_revisions`` chooses, as
  ``kernels.cuda.resources.read_compiled`` does for every reader of nvcc's output.
* ``design_table(revisions)``: those, with the occupancy each allows and Kineto's estimate;
  ``tile_bodies`` and ``barriers_per_tile`` read the unrolled tile passes out of the counts.
* ``read_revisions(head_dim)``: ``design_revisions`` falling back on the snapshot, and where
  the rows came from in words; ``register_cost(revisions)``: registers each change added.
* ``tile_census(...)``: which (query block, key tile) pairs of a launch need the mask;
  ``unmasked_percent(census)``: the share of the tiles read that skip it.
"""
from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass
from typing import Any, Iterable, Union

import numpy as np

from kernels.cuda import flash as cuda_flash
from kernels.cuda.resources import (MMA_M, WARP, instruction_counts, kineto_reads, load_snapshot,
                                    mma_per_key_tile, occupancy_of, read_compiled)
from kernels.reference import future_mask
from kernels.cuda.ptxas import KernelResources, with_launch


@dataclass(frozen=True)
class DesignRevision:
    """One set of flash_v2.cu's ``Design`` switches (its template arguments, in order), each
    named where a revision is written: a row of bare booleans reads as nothing."""
    change: str            # what this revision adds to the one before it
    _: KW_ONLY
    block_m: int           # query rows per block (16 per warp)
    split_mask: bool       # fully visible key tiles go through an instantiation without the mask
    fast_exp2: bool        # ex2.approx.ftz, the scale folded into the FMA that subtracts the max
    double_buffer: bool    # key tile j + 1 loads into a second buffer while tile j computes

    @property
    def threads(self) -> int:
        return WARP * self.block_m // MMA_M

    def dynamic_shared_bytes(self, head_dim: int) -> int:
        return cuda_flash.v2_shared_bytes(head_dim, self.block_m, self.double_buffer)


# The explicit instantiations at the end of flash_v2.cu (FLASH_V2_DESIGN_REVISIONS), in order:
# each revision turns on one more change; the last is the kernel the launcher runs.
DESIGN_REVISIONS = (
    DesignRevision("the first version: 64 query rows (4 warps), mask on every tile, exp2f, one K/V buffer",
                   block_m=64, split_mask=False, fast_exp2=False, double_buffer=False),
    DesignRevision("128 query rows per block (8 warps of 16 rows)",
                   block_m=128, split_mask=False, fast_exp2=False, double_buffer=False),
    DesignRevision("masked and unmasked tile passes as two instantiations",
                   block_m=128, split_mask=True, fast_exp2=False, double_buffer=False),
    DesignRevision("fast exp2 (ex2.approx.ftz), scale folded into one FMA",
                   block_m=128, split_mask=True, fast_exp2=True, double_buffer=False),
    DesignRevision("K/V double-buffered, one barrier per tile (the kernel that runs)",
                   block_m=128, split_mask=True, fast_exp2=True, double_buffer=True),
)
# The instructions that carry the changes, counted in each revision's PTX.
REVISION_OPCODES = ("mma.sync", "ex2.approx.f32", "ex2.approx.ftz.f32", "bar.sync")
_DESIGN = re.compile(r"flash_v2_design_kernel<\s*([\w:]+)\s*,\s*(\d+)\s*,[^<]*Design<\s*(\d+)\s*,"
                     r"\s*(true|false)\s*,\s*(true|false)\s*,\s*(true|false)\s*>")


def parse_design(name: str) -> tuple[int, DesignRevision]:
    """(head_dim, revision) of a ``flash_v2_design_kernel<__nv_bfloat16, 64, Design<...>>`` name."""
    m = _DESIGN.search(name)
    if m is None:
        raise ValueError(f"not a flash_v2_design_kernel instantiation: {name!r}")
    switches = (int(m.group(3)), *(g == "true" for g in m.group(4, 5, 6)))
    for revision in DESIGN_REVISIONS:
        if (revision.block_m, revision.split_mask, revision.fast_exp2, revision.double_buffer) == switches:
            return int(m.group(2)), revision
    raise ValueError(f"{name!r} is no revision of DESIGN_REVISIONS (flash_v2.cu and kernels.cuda.design disagree)")


@dataclass(frozen=True)
class RevisionResources:
    """One revision of the design as compiled: ptxas' resources and the PTX's instruction counts."""
    head_dim: int
    revision: DesignRevision
    kernel: KernelResources   # what ptxas logged, completed with the revision's launch
    counts: dict              # {opcode of REVISION_OPCODES: how often it occurs in the kernel's PTX}

    @property
    def index(self) -> int:
        return DESIGN_REVISIONS.index(self.revision)


def design_revisions(head_dim: int, archs: Iterable[str] = ("sm_80", "sm_90"), *,
                     live: bool) -> list[RevisionResources]:
    """cuda_v2 (bf16) at every revision of DESIGN_REVISIONS: compiled now (``live``, needs
    nvcc), or the nvcc snapshot's (``live=False``; ``read_revisions`` chooses)."""
    archs = list(archs)
    if not live:
        return [r for r in snapshot_revisions() if r.head_dim == head_dim and r.kernel.arch in archs]
    defines = (f"-DFLASH_V2_DESIGN_REVISIONS={head_dim}", "-diag-suppress=177")  # 177: fp16 helpers unused here
    compiled = cuda_flash.compile_sources(archs, ("flash_v2.cu",), defines)["flash_v2.cu"]
    out = []
    for arch in archs:
        counts = {op: instruction_counts(compiled.ptx[arch], op) for op in REVISION_OPCODES}
        for k in (k for k in compiled.kernels if k.arch == arch):
            d, revision = parse_design(k.name)
            out.append(RevisionResources(d, revision, with_launch(k, revision.threads, revision.dynamic_shared_bytes(d)),
                                         {op: counts[op][k.name] for op in REVISION_OPCODES}))
    return sorted(out, key=lambda r: (r.kernel.arch, r.index))


def read_revisions(head_dim: int, archs: Iterable[str] = ("sm_80", "sm_90")):
    """``(revisions, where_from)``: ``design_revisions`` compiled now where nvcc is and the
    compile works, else the nvcc snapshot's (``read_compiled``); ``where_from`` says which."""
    archs = list(archs)
    return read_compiled(lambda: design_revisions(head_dim, archs, live=True),
                         lambda: design_revisions(head_dim, archs, live=False))


def register_cost(revisions: Iterable[RevisionResources]) -> dict[int, int]:
    """{revision index: the most registers per thread it added to the revision before it, over
    the architectures of ``revisions``} (negative where it saved registers everywhere)."""
    regs = {(r.kernel.arch, r.head_dim, r.index): r.kernel.registers for r in revisions}
    added: dict[int, list[int]] = {}
    for (arch, d, i), n in regs.items():
        if (arch, d, i - 1) in regs:
            added.setdefault(i, []).append(n - regs[arch, d, i - 1])
    return {i: max(added[i]) for i in sorted(added)}


def revision_rows(revisions: Iterable[RevisionResources]) -> list[dict[str, Any]]:
    """Revisions in the snapshot's "design_revisions" row format, in a fixed order."""
    rows = [{"arch": r.kernel.arch, "head_dim": r.head_dim, "revision": r.index, "registers": r.kernel.registers,
             "shared_bytes": r.kernel.shared_bytes, "spill_store_bytes": r.kernel.spill_store_bytes,
             "spill_load_bytes": r.kernel.spill_load_bytes, "stack_frame_bytes": r.kernel.stack_frame_bytes,
             "ptx_counts": {op: r.counts[op] for op in REVISION_OPCODES}} for r in revisions]
    return sorted(rows, key=lambda row: (row["arch"], row["head_dim"], row["revision"]))


def snapshot_revisions(snapshot: Union[dict[str, Any], None] = None) -> list[RevisionResources]:
    """The nvcc snapshot's design revisions, completed with each revision's launch."""
    out = []
    for row in (snapshot or load_snapshot())["design_revisions"]:
        d, revision = row["head_dim"], DESIGN_REVISIONS[row["revision"]]
        switches = ", ".join(str(x).lower() for x in (revision.block_m, revision.split_mask, revision.fast_exp2,
                                                      revision.double_buffer))
        kernel = KernelResources(
            name=f"void (anonymous namespace)::flash_v2_design_kernel<__nv_bfloat16, {d}, "
                 f"(anonymous namespace)::Design<{switches}>>(flash::Problem, bool)",
            mangled="(snapshot)", arch=row["arch"], registers=row["registers"], shared_bytes=row["shared_bytes"],
            spill_store_bytes=row["spill_store_bytes"], spill_load_bytes=row["spill_load_bytes"],
            stack_frame_bytes=row["stack_frame_bytes"], barriers=1)
        out.append(RevisionResources(d, revision, with_launch(kernel, revision.threads, revision.dynamic_shared_bytes(d)),
                                     {op: row["ptx_counts"][op] for op in REVISION_OPCODES}))
    return sorted(out, key=lambda r: (r.kernel.arch, r.head_dim, r.index))


def tile_bodies(revision: RevisionResources) -> int:
    """Copies of the tile pass in the kernel: its mma.sync count over one tile's worth (each
    body is unrolled, so one copy holds exactly one key tile's mma instructions)."""
    return revision.counts["mma.sync"] // mma_per_key_tile(revision.head_dim)


def barriers_per_tile(revision: RevisionResources) -> float:
    """bar.sync in each tile pass: all of the kernel's but the prologue's one, over the bodies."""
    return (revision.counts["bar.sync"] - 1) / tile_bodies(revision)


def design_table(revisions: Iterable[RevisionResources]):
    """One row per (arch, revision): the kernel's resources, the occupancy they allow, what a
    PyTorch trace would read (Kineto's estimate, 0% above 48 KiB of shared memory), and the
    instructions that carry each change."""
    import pandas as pd

    rows = []
    for r in revisions:
        k, occ = r.kernel, occupancy_of(r.kernel)
        rows.append({"arch": k.arch, "revision": r.index, "change": r.revision.change, "threads": k.threads_per_block,
                     "registers": k.registers, "shared memory (B)": k.total_shared_bytes,
                     "spilled (B)": k.spill_store_bytes + k.spill_load_bytes,
                     "blocks/SM": occ.blocks_per_sm, "warps/SM": occ.warps_per_sm,
                     "occupancy %": round(occ.percent, 2), "limited by": " and ".join(occ.limiters),
                     "a trace reads %": round(kineto_reads(k), 2),
                     "mma.sync": r.counts["mma.sync"], "tile-pass bodies": tile_bodies(r),
                     "ex2.approx.f32": r.counts["ex2.approx.f32"], "ex2.approx.ftz.f32": r.counts["ex2.approx.ftz.f32"],
                     "barriers per tile": barriers_per_tile(r)})
    return pd.DataFrame(rows).sort_values(["arch", "revision"]).reset_index(drop=True)


def tile_census(seq_q: int, seq_k: int, block_m: int, block_n: int, causal: bool = True) -> dict:
    """What a launch does with each (query block, key tile) pair, from the reference's mask:
    "unmasked" (every real row of the block sees every key of the tile: the tile pass without the
    mask), "masked" (some rows see some keys, or the tile runs past Sk), "skipped" (no row sees
    any key: never loaded). flash_api.h's key_tiles() makes the same split (a test checks it)."""
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


def unmasked_percent(census: dict) -> float:
    """Share (%) of the key tiles a launch reads (``tile_census``: skipped tiles are not read)
    that go through the tile pass without the mask."""
    read = census["unmasked"] + census["masked"]
    if read == 0:
        raise ValueError(f"the census reads no tile: {census}")
    return 100 * census["unmasked"] / read

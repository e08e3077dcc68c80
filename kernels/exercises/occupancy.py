"""The occupancy check of chapters 4 and 5: blocks per SM and occupancy from a kernel's footprint.

Chapter 4 asks for an A100 only, ``my_occupancy(threads, registers, shared_bytes)``; chapter 5
for any architecture, ``my_occupancy(threads, registers, shared_bytes, arch)`` on sm_80 and
sm_90. One check serves both (``takes_arch``), judged by ``kernels.hw.occupancy``, with one set of
diagnoses: the rule a wrong answer forgot, or the other architecture's limits.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from kernels.hw.occupancy import ARCHES, occupancy
from kernels.exercises.judge import Passed, draw_int, fail, passed, check_seed, run_learner

__all__ = ["check_occupancy"]

_A100 = "sm_80"
_ASKED = ("sm_80", "sm_90")  # the two architectures chapter 5 compares
_FRESH_PER_ARCH = 3  # random footprints after the fixed ones, so a table cannot be learned by heart

# (threads, registers, shared bytes, arch), before a few random footprints. The sm_80 ones
# first give each limit its turn; then footprints where sm_80 and sm_90 part.
_CASES = ((128, 255, 0, "sm_80"), (128, 100, 0, "sm_80"), (256, 32, 41 * 1024, "sm_80"), (1024, 16, 0, "sm_80"),
          (128, 16, 49152, "sm_80"), (64, 24, 0, "sm_80"), (32, 40, 2048, "sm_80"),
          (128, 190, 27648, "sm_80"), (128, 200, 27648, "sm_90"), (128, 64, 50 * 1024, "sm_80"),
          (128, 64, 50 * 1024, "sm_90"), (256, 40, 70 * 1024, "sm_90"), (128, 100, 0, "sm_90"),
          (128, 32, 16 * 1024, "sm_80"), (128, 32, 16 * 1024 - 1024, "sm_90"))


def _random_case(g: torch.Generator, arch: str) -> tuple:
    """A footprint that can launch on ``arch``: at least one block's registers fit the SM."""
    lim = ARCHES[arch]
    threads = 32 * draw_int(g, 1, lim.max_threads_per_block // 32 + 1)
    registers = draw_int(g, 16, min(lim.max_registers_per_thread, lim.max_registers_per_block // threads) + 1)
    return threads, registers, draw_int(g, 0, lim.max_shared_mem_per_block + 1), arch


def _slips(threads: int, registers: int, shared: int, arch: str, other: Optional[str] = None) -> list:
    """(the rule in words, the blocks per SM it gives when forgotten) for each known slip on
    ``arch``; with ``other``, first the answer of that architecture's limits."""
    lim = ARCHES[arch]
    by = occupancy(threads, registers, shared, arch=arch).blocks_by

    def blocks(**forgotten):
        return min(n for n in {**by, **forgotten}.values() if n is not None)

    per_scheduler = lim.registers_per_sm // lim.sub_partitions
    reserved = lim.reserved_shared_mem_per_block
    slips = []
    if other is not None:
        slips.append((f"you used {other}'s limits for {arch}: {arch} has {lim.shared_mem_per_sm:,} bytes of shared "
                      f"memory per SM ({ARCHES[other].shared_mem_per_sm:,} on {other}); take the numbers from "
                      "ARCHES[arch]", occupancy(threads, registers, shared, arch=other).blocks_per_sm))
    slips.append((f"registers are handed out per warp, in units of {lim.register_granularity} registers, from one "
                  f"scheduler's share of the register file ({per_scheduler:,} on {arch}, {lim.sub_partitions} "
                  "schedulers): counting them thread by thread over the whole SM misses the rounding",
                  blocks(registers=lim.registers_per_sm // (threads * registers) if registers else None)))
    if reserved:
        slips.append((f"the driver reserves {reserved // 1024} KB of shared memory for every block on {arch} (Ampere "
                      "and later), on top of what the kernel asks for",
                      blocks(shared_memory=lim.shared_mem_per_sm // shared if shared else None)))
    slips += [(f"shared memory limits blocks too: {lim.shared_mem_per_sm:,} bytes per SM", blocks(shared_memory=None)),
              (f"warp slots limit blocks too: {lim.max_warps_per_sm} warps per SM", blocks(warps=None)),
              (f"an SM holds at most {lim.max_blocks_per_sm} blocks on {arch}", blocks(blocks=None))]
    return slips


def check_occupancy(my_occupancy: Callable, takes_arch: bool = False, seed: Optional[int] = None) -> Passed:
    """``my_occupancy(threads, registers, shared_bytes)`` -> (blocks per SM, occupancy as a fraction
    0..1) on an A100 (sm_80); with ``takes_arch``, ``my_occupancy(threads, registers, shared_bytes,
    arch)`` on sm_80 and sm_90. Checked against ``kernels.hw.occupancy`` on fixed footprints that give
    each limit its turn, then on fresh random ones."""
    g = torch.Generator().manual_seed(check_seed(seed))
    arches = _ASKED if takes_arch else (_A100,)
    cases = [c for c in _CASES if c[3] in arches]
    cases += [_random_case(g, arch) for arch in arches for _ in range(_FRESH_PER_ARCH)]
    signature = "threads, registers, shared_bytes" + (", arch" if takes_arch else "")
    for threads, registers, shared, arch in cases:
        case = (f"{arch}: " if takes_arch else "") + \
            f"{threads} threads, {registers} registers/thread, {shared:,} B shared memory"
        got = run_learner(my_occupancy, threads, registers, shared, *((arch,) if takes_arch else ()),
                   what=f"my_occupancy({signature})")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(f"my_occupancy must return (blocks_per_sm, fraction); it returned {got!r}.")
        blocks, fraction = got
        right = occupancy(threads, registers, shared, arch=arch)
        numeric = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
        if blocks == right.blocks_per_sm and numeric and abs(fraction - right.fraction) < 1e-9:
            continue
        if blocks == right.blocks_per_sm and numeric and abs(fraction - right.percent) < 1e-6:
            fail(f"[{case}] you returned a percentage ({fraction}); return a fraction between 0 and 1.")
        other = next(a for a in _ASKED if a != arch) if takes_arch else None
        slip = next((rule for rule, b in _slips(threads, registers, shared, arch, other)
                     if blocks == b != right.blocks_per_sm), None)
        if blocks == right.blocks_per_sm:
            fail(f"[{case}] {blocks} blocks per SM is right, but fraction {fraction} is not: it is the share of the "
                  "SM's warp slots those blocks fill.")
        fail(f"[{case}] you said {blocks} blocks per SM: too {'many' if blocks > right.blocks_per_sm else 'few'}. "
              + (f"Likely slip: {slip}." if slip else "Work out each limit on its own: the SM runs the smallest."))
    return passed(f"my_occupancy agrees with the CUDA occupancy calculator's rules on {len(cases)} footprints "
                   f"(each limit gets its turn) on {' and '.join(arches)}")

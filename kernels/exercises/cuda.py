"""Checks for the exercises of chapter 5, CUDA: read a ptxas log, and place v2's accumulators
on its threads. (The chapter's occupancy task is checked by ``kernels.exercises.occupancy``.)

``check_v2_lane`` tries every thread of the block, so it draws nothing at random.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from kernels.exercises.judge import Passed, draw_int, fail, passed, check_seed, run_learner
from kernels.cuda.ptxas import parse_ptxas
from kernels.cuda.threads import owners_v2

__all__ = ["check_read_ptxas", "check_v2_lane"]


def _ptxas_block(kernel: str, arch: str, registers: int, smem: int, stack: int, stores: int, loads: int,
                 barriers: int) -> list[str]:
    """One kernel's lines as ptxas -v prints them (sm_90's ptxas leaves out cmem)."""
    used = f"ptxas info    : Used {registers} registers, used {barriers} barriers"
    if stack:
        used += f", {stack} bytes cumulative stack size"
    if smem:
        used += f", {smem} bytes smem"
    if arch != "sm_90":
        used += ", 368 bytes cmem[0]"
    return [f"ptxas info    : Compiling entry function '{kernel}' for '{arch}'",
            f"ptxas info    : Function properties for {kernel}",
            f"    {stack} bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads", used]


def fresh_ptxas_log(seed: int) -> str:
    """A log in ptxas -v's format with random numbers: two kernels on sm_80 and sm_90, one that
    spills and one with static shared memory, and a device function that is not a kernel."""
    g = torch.Generator().manual_seed(seed)
    lines = []
    for more, arch in enumerate(("sm_80", "sm_90")):  # registers differ by arch, so a wrong arch shows
        lines.append("ptxas info    : 0 bytes gmem")
        spill_st, spill_ld = 8 * draw_int(g, 20, 120), 8 * draw_int(g, 20, 120)
        frame = spill_st + 8 * draw_int(g, 1, 40)
        lines += _ptxas_block("_Z4manyILi64EEvPKfPfi", arch, 8 * draw_int(g, 3 + 3 * more, 6 + 3 * more), 0, frame,
                              spill_st, spill_ld, 0)
        lines += _ptxas_block("_Z8tile_sumPKfPf", arch, draw_int(g, 10 + 25 * more, 35 + 25 * more), 256 * draw_int(g, 1, 64),
                              8 * draw_int(g, 1, 8), 0, 0, 1)
        lines += ["ptxas info    : Function properties for _Z6helperPKfi",
                  f"    {8 * draw_int(g, 1, 8)} bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"]
    return "\n".join(lines) + "\n"


def check_read_ptxas(read_ptxas: Callable, seed: Optional[int] = None) -> Passed:
    """``read_ptxas(text, kernel, arch)`` -> (registers, static shared memory bytes, spilled bytes)
    of one kernel on one architecture, judged by ``kernels.cuda.ptxas.parse_ptxas``."""
    seed = check_seed(seed)
    asked = 0
    for text in (fresh_ptxas_log(seed), fresh_ptxas_log(seed + 1)):
        found = {(k.mangled, k.arch): k for k in parse_ptxas(text, demangle=False)}
        for (kernel, arch), k in found.items():
            case = f"kernel {kernel} on {arch}"
            got = run_learner(read_ptxas, text, kernel, arch, what="read_ptxas(text, kernel, arch)")
            asked += 1
            if got is None:
                fail("read_ptxas returned None: return (registers, shared_bytes, spilled_bytes).")
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                fail(f"read_ptxas must return three numbers (registers, shared_bytes, spilled_bytes); "
                      f"it returned {got!r}.")
            right = (k.registers, k.shared_bytes, k.spill_store_bytes + k.spill_load_bytes)
            if tuple(got) == right:
                continue
            fail(f"[{case}] " + _ptxas_slip(tuple(got), right, k, found, kernel, arch))
    return passed(f"read_ptxas reads registers, shared memory and spills right for {asked} kernel entries "
                   "(two architectures, a kernel that spills, a device function that is not a kernel)")


def _ptxas_slip(got, right, k, found, kernel, arch) -> str:
    """The sentence for a wrong (registers, shared, spilled)."""
    def numbers(other):
        return (other.registers, other.shared_bytes, other.spill_store_bytes + other.spill_load_bytes)

    for (name, other_arch), other in found.items():
        if name == kernel and other_arch != arch and got == numbers(other) != right:
            return (f"those are the numbers of the same kernel compiled for {other_arch}. ptxas logs every "
                    f"kernel once per architecture: read the lines after \"Compiling entry function "
                    f"'{kernel}' for '{arch}'\".")
        if name != kernel and other_arch == arch and got == numbers(other) != right:
            return (f"those are the numbers of another kernel, {name}: find the block that starts with "
                    f"\"Compiling entry function '{kernel}'\".")
    registers, shared, spilled = got
    if registers != right[0]:
        return (f"registers: you said {registers}, which is not what this kernel's \"Used N registers\" line "
                f"for {arch} says.")
    if shared != right[1]:
        if shared is None or shared == Ellipsis:
            return ("no \"bytes smem\" on the Used line means the kernel has no static shared memory: "
                    "return 0, not None.")
        if shared == k.stack_frame_bytes and k.stack_frame_bytes:
            return ("you read the stack size as shared memory: \"bytes cumulative stack size\" is local memory "
                    "per thread; shared memory is the number before \"bytes smem\".")
        return (f"static shared memory: you said {shared} bytes, which is not the number before \"bytes smem\" "
                "on this kernel's Used line.")
    if spilled == k.spill_store_bytes or spilled == k.spill_load_bytes:
        return "spilled bytes are both directions: spill stores plus spill loads, not one of them."
    if spilled == k.stack_frame_bytes:
        return ("the stack frame is not the spill: it also holds local arrays. Spilled bytes are "
                "\"bytes spill stores\" plus \"bytes spill loads\".")
    return (f"spilled bytes: you said {spilled}, which is not what the \"Function properties for {kernel}\" "
            "line that follows the entry says. (Skip the properties of device functions that are not kernels.)")


def check_v2_lane(lane_elements: Callable) -> Passed:
    """``lane_elements(tid)`` -> (rows, cols): the two query rows of v2's 128-row block whose
    accumulators thread ``tid`` holds, and its two columns in every 8-column tile, judged by
    ``kernels.cuda.threads.owners_v2``."""
    import numpy as np


    owner = owners_v2(8)  # one 8-column tile: every tile repeats its layout
    for tid in range(int(owner.max()) + 1):  # every thread of the block
        got = run_learner(lane_elements, tid, what=f"lane_elements({tid})")
        if got is None:
            fail("lane_elements returned None: return (rows, cols), two query rows and two columns.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(f"lane_elements must return (rows, cols); lane_elements({tid}) returned {got!r}.")
        rows_right, cols_right = (sorted({int(x) for x in a}) for a in np.nonzero(owner == tid))
        try:
            rows, cols = sorted(int(r) for r in got[0]), sorted(int(c) for c in got[1])
        except (TypeError, ValueError):
            fail(f"lane_elements({tid}) returned {got!r}: rows and cols must each be two integers.")
        if rows == rows_right and cols == cols_right:
            continue
        warp, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        where = f"thread {tid} (warp {warp}, lane {lane} = 4·{g} + {t})"
        if cols != cols_right:
            if cols == [2 * g, 2 * g + 1] and rows == [16 * warp + t, 16 * warp + t + 8]:
                fail(f"{where}: g and t are swapped. lane = 4g + t, so g = lane // 4 picks the row pair "
                      "and t = lane % 4 the column pair.")
            if cols == [t, t + 1]:
                fail(f"{where}: you said columns {cols}, t and t+1; the lanes of a row group would then overlap, "
                      "and four lanes must cover 8 columns between them.")
            fail(f"{where}: you said columns {cols}, which is not where this lane sits in an 8-column tile.")
        if rows == [g, g + 8] and warp:
            fail(f"{where}: those are warp 0's rows. Warp w owns rows 16w to 16w+15 of the block.")
        if rows == [tid // 4, tid // 4 + 8]:
            fail(f"{where}: g is the lane's group within its warp, not a group counted across the whole "
                  "block; and each warp's rows start at 16w.")
        if rows == [16 * warp + g, 16 * warp + g + 1]:
            fail(f"{where}: the second row is g + 8, not g + 1: a warp's 16 rows are two halves of 8, and "
                  "a lane holds the same row of each half.")
        fail(f"{where}: you said rows {rows}, which is not where this thread's accumulators are.")
    return passed(f"lane_elements places all {int(owner.max()) + 1} threads of v2's block: warp w holds rows 16w..16w+15, "
                   "lane 4g + t rows g and g+8 of them, columns 2t and 2t+1 of every tile")

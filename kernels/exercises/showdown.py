"""Checks for the exercises of chapter 6, the showdown: TFLOP/s from a time, arithmetic
intensity from a shape, and CTAs per SM, waves and occupancy from a grid.

``check_tflops`` and ``check_intensity`` give your function fresh shapes and times and
compare its answer with ``kernels.reference``'s FLOP and byte counts, naming the slip yours
matches when it is a known one.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from kernels import reference
from kernels.exercises.judge import Passed, as_number, draw_int, fail, passed, run_learner, seeded_generator

__all__ = ["check_tflops", "check_intensity", "check_waves", "off_where"]


def check_tflops(my_tflops: Callable, seed: Optional[int] = None) -> Passed:
    """``my_tflops(batch, heads, seq, head_dim, causal, backward, ms)`` -> TFLOP/s achieved."""
    g = seeded_generator(seed)
    cases = []
    for causal in (True, False):
        for backward in (False, True):
            b, h = draw_int(g, 1, 5), draw_int(g, 1, 17)
            s, d = draw_int(g, 100, 4097), (64, 128)[draw_int(g, 0, 2)]
            ms = float(torch.rand((), generator=g)) * 5 + 0.1
            cases.append((b, h, s, d, causal, backward, ms))
    ratios = []
    for b, h, s, d, causal, backward, ms in cases:
        got = as_number(run_learner(my_tflops, b, h, s, d, causal, backward, ms, what="my_tflops(...)"), "my_tflops")
        want = reference.flops(b, h, s, d, causal=causal, backward=backward) / (ms * 1e-3) / 1e12
        ratios.append((got / want, causal, backward))
    if all(abs(r - 1) < 1e-6 for r, _, _ in ratios):
        return passed(f"my_tflops matches kernels.reference's FLOP count and units on {len(cases)} fresh cases "
                      "(causal and not, forward and forward + backward)")

    def ratio_where(causal=None, backward=None):
        rs = {round(r, 6) for r, c, bw in ratios if (causal is None or c == causal) and (backward is None or bw == backward)}
        return rs.pop() if len(rs) == 1 else None

    causal_r, dense_r = ratio_where(causal=True), ratio_where(causal=False)
    fwd_r, bwd_r = ratio_where(backward=False), ratio_where(backward=True)
    if dense_r == 1 and causal_r == 2:
        fail("causal attention is counted at full price: a causal kernel skips the masked half of the "
              "scores, so its FLOPs are halved. Your TFLOP/s is 2x too high for causal runs (the mistake "
              "of triton PR #1849).")
    if fwd_r == 1 and bwd_r is not None and abs(bwd_r - 1 / 3.5) < 1e-6:
        fail("with backward=True the time covers forward AND backward: FLOPs are 3.5x the forward's "
              "(backward is 2.5x). You counted the forward only.")
    if fwd_r == 1 and bwd_r is not None and abs(bwd_r - 2.5 / 3.5) < 1e-6:
        fail("with backward=True, count forward + backward = 1 + 2.5 = 3.5x the forward FLOPs; you used 2.5x.")
    everywhere = ratio_where()
    if everywhere is not None:
        words = {0.5: "each multiply-add is 2 FLOPs: a matmul of [S, D] by [D, S] is 2·S²·D, and attention "
                      "has two of them (4·B·H·S²·D). You are 2x low.",
                 2.0: "you are 2x high everywhere: 4·B·H·S²·D already counts both matmuls and the multiply-add as 2.",
                 1e3: "units: TFLOP/s is FLOPs / seconds / 1e12; you are 1000x high (ms taken as s, or GFLOP/s).",
                 1e-3: "units: ms must become seconds (× 1e-3) before dividing; you are 1000x low.",
                 1e6: "units: you are 1e6x high; divide FLOP/s by 1e12 for TFLOP/s, and ms by 1e3 for seconds.",
                 1e-6: "units: you are 1e6x low; TFLOP/s = FLOPs / (ms · 1e-3) / 1e12."}
        for factor, message in words.items():
            if abs(everywhere / factor - 1) < 1e-6:
                fail(message)
    groups = {f"{'causal' if c else 'dense'}{' fwd+bwd' if bw else ' fwd'}": [r] for r, c, bw in ratios}
    same = " (by the same factor in every case: look at the units)" if everywhere is not None else ""
    fail(f"my_tflops is off: {off_where(groups)}{same}. A slip that depends on causal or backward points "
         "at the FLOP count; one that is the same everywhere, at the units.")


def off_where(groups: dict[str, list[float]], shapes: bool = False) -> str:
    """Which groups of cases (name -> each case's yours / right) are off and in which direction,
    and, with ``shapes``, whether by one factor for every shape or by one that changes with the
    shape: never a factor, which would let a learner work the expected values back out."""
    said = []
    for name, rs in groups.items():
        if all(abs(r - 1) < 1e-6 for r in rs):
            said.append(f"{name} right")
            continue
        off = [r for r in rs if abs(r - 1) >= 1e-6]
        ways = [w for w, there in (("right", len(off) < len(rs)), ("too high", any(r > 1 for r in off)),
                                   ("too low", any(r < 1 for r in off))) if there]
        direction = ways[0] if len(ways) == 1 else " in some, ".join(ways[:-1]) + f" in some, {ways[-1]} in others"
        if shapes and len(rs) > 1:
            one = len(off) == len(rs) and min(rs) > 0 and max(rs) / min(rs) - 1 < 1e-6
            direction += ", by one factor for every shape" if one else ", by a factor that changes with the shape"
        said.append(f"{name} {direction}")
    return "; ".join(said)


def check_intensity(my_intensity: Callable, seed: Optional[int] = None) -> Passed:
    """``my_intensity(batch, heads, seq, head_dim, causal, bytes_per_element)`` -> FLOP per byte of a
    fused forward that reads q, k, v and writes o once."""
    g = seeded_generator(seed)
    cases = [(1, 8, 1024, 64, True, 2), (2, 16, 4096, 128, False, 2), (1, 4, 333, 64, True, 4),
             (1, 2, 100, 32, False, 4)]
    cases += [(draw_int(g, 1, 5), draw_int(g, 1, 33), draw_int(g, 64, 8193), (64, 128)[draw_int(g, 0, 2)], causal, elem)
              for causal, elem in ((True, 2), (False, 4))]
    ratios = []
    for b, h, s, d, causal, elem in cases:
        got = as_number(run_learner(my_intensity, b, h, s, d, causal, elem, what="my_intensity(...)"), "my_intensity")
        dtype = {2: torch.bfloat16, 4: torch.float32}[elem]
        want = reference.flops(b, h, s, d, causal=causal) / reference.io_bytes(b, h, s, d, dtype=dtype)
        ratios.append(got / want)
    if all(abs(r - 1) < 1e-6 for r in ratios):
        return passed(f"my_intensity matches kernels.reference's FLOPs over bytes moved on {len(cases)} cases")

    def all_near(factors):
        return all(abs(r / f - 1) < 1e-6 for r, f in zip(ratios, factors))

    causal_flags = [c[4] for c in cases]
    if all_near([c[5] for c in cases]):
        fail("you divided by elements, not bytes: multiply the element count by bytes_per_element.")
    if all_near([4 / 3] * len(cases)):
        fail("a fused kernel moves four tensors: it reads q, k, v AND writes o (4·B·H·S·D elements); "
              "you counted three.")
    if all_near([2.0 if c else 1.0 for c in causal_flags]):
        fail("causal FLOPs are halved (the kernel skips the masked half); you counted them at full price.")
    if all_near([0.5] * len(cases)):
        fail("FLOPs are 4·B·H·S²·D (two matmuls, 2 FLOPs per multiply-add); you are 2x low.")
    groups = {"causal cases": [r for r, c in zip(ratios, causal_flags) if c],
              "dense cases": [r for r, c in zip(ratios, causal_flags) if not c]}
    fail(f"my_intensity is off: {off_where(groups, shapes=True)}. Check the FLOPs (task 1's forward "
         "count) and the bytes (every tensor read or written once, in bytes, not elements) separately.")


# The SM the waves task describes: a register file of 64K registers, 64 warp slots, warps of 32.
REGISTERS_PER_SM, WARP_SLOTS, WARP = 65536, 64, 32


def waves_answer(grid, threads: int, registers: int, sms: int) -> tuple[int, float, float]:
    """(CTAs per SM at once, waves, occupancy %) by the task's rules: the smaller of the register
    and warp-slot limits, the grid's CTAs over one wave, resident warps over the slots."""
    warps = threads // WARP
    per_sm = min(REGISTERS_PER_SM // (threads * registers), WARP_SLOTS // warps)
    return per_sm, math.prod(grid) / (sms * per_sm), 100 * per_sm * warps / WARP_SLOTS


def check_waves(my_waves: Callable, seed: Optional[int] = None) -> Passed:
    """``my_waves(grid, threads, registers, sms)`` -> (CTAs per SM at once, waves, occupancy %)."""
    g = seeded_generator(seed)
    cases = [((5, 16, 16), 128, 255, 132), ((2, 1, 8), 128, 255, 132), ((64, 8, 1), 256, 64, 108)]
    for _ in range(4):
        threads = 32 * (1, 2, 4, 8, 16)[draw_int(g, 0, 5)]
        registers = draw_int(g, 16, 256)
        if threads * registers > REGISTERS_PER_SM:   # a CTA that fits no SM is a launch error, not a case
            registers = REGISTERS_PER_SM // threads
        cases.append(((draw_int(g, 1, 65), draw_int(g, 1, 33), draw_int(g, 1, 9)), threads, registers,
                      draw_int(g, 20, 160)))
    for grid, threads, registers, sms in cases:
        got = run_learner(my_waves, grid, threads, registers, sms, what="my_waves(...)")
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            fail(f"my_waves(...) must return three numbers (ctas_per_sm, waves, occupancy_percent); it returned {got!r}")
        per_sm, waves, occupancy = (as_number(x, "my_waves") for x in got)
        want_sm, want_waves, want_occ = waves_answer(grid, threads, registers, sms)
        where = f"grid {grid}, {threads} threads x {registers} registers, {sms} SMs"
        if per_sm != want_sm:
            limits = (REGISTERS_PER_SM // (threads * registers), WARP_SLOTS // (threads // WARP))
            hint = ("it matches the warp-slot limit alone: the registers limit it further" if per_sm == limits[1] != want_sm
                    else "it matches the register limit alone: the warp slots limit it further" if per_sm == limits[0] != want_sm
                    else "a CTA is whole: count how many fit, rounding down")
            fail(f"CTAs per SM is off for {where}: {hint}.")
        if not math.isclose(waves, want_waves, rel_tol=1e-6):
            fail(f"the waves are off for {where}: a wave is every SM holding its CTAs once "
                 "(SMs × CTAs per SM), and a part-filled last wave counts as a fraction.")
        if not math.isclose(occupancy, want_occ, rel_tol=1e-6):
            near = math.isclose(occupancy, want_occ / 100, rel_tol=1e-6)
            fail(f"occupancy is off for {where}: " + ("give it in %, not as a fraction." if near else
                 "count the warps resident on one SM (CTAs × warps per CTA) against its 64 slots."))
    return passed(f"my_waves matches the task's arithmetic on {len(cases)} grids, chapter 6's two H100 traces included")

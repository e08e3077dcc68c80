"""Chapter 5's bookkeeping: the CUDA kernels as the compiler and the hardware see them.

Everything here reads the kernels of ``kernels/csrc`` without running them, so all of it
works on a machine without a GPU:

* ``resources_table(report)``: one row per kernel instantiation, the compiler's registers,
  shared memory and spills (``kernels.cuda_flash.kernel_report``), the launch configuration,
  and the theoretical occupancy those imply (``kernels.occupancy``).
* ``RECORDED`` / ``recorded_report()``: the same report as one real ``nvcc`` run printed it,
  for machines without ``nvcc`` (Colab, laptops). ``record()`` writes a fresh one.
* ``compile_kernels(archs)``: that report and the PTX of every kernel, in one compile;
  ``instruction_counts(ptx, opcode)``: how often an instruction appears in each kernel.
  Tensor-core matmuls show up there as ``mma.sync.aligned.m16n8k16``; a kernel without
  them does its arithmetic on CUDA cores. ``inlined_functions(ptx)``: the functions the
  compiler inlined into each kernel, from the PTX's line information.
* ``mma_per_key_tile(head_dim)``: how many of those instructions one warp of ``cuda_v2``
  must issue per tile of keys, from the tile shapes alone, to check the PTX against.
* ``DESIGN_STEPS`` / ``design_steps(head_dim)`` / ``design_table(...)``: cuda_v2 compiled
  once per design step (from its first version to the kernel that runs, one change at a
  time, all from the one source), with what each step does to registers, shared memory,
  spills, occupancy, Kineto's estimate and the instructions that carry the change.
* ``owners_*`` and ``thread_map(...)``: which thread computes which element of a tile, the
  index formulas of the two kernels written out in NumPy, and a figure of them.
* ``cuda_excerpt(source, start, end)``: lines of a ``.cu`` file, to show in the book.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from . import cuda_flash
from .occupancy import Occupancy, kineto_estimate, occupancy
from .ptxas import KernelResources, compile_cuda, demangle_names, nvcc_path, nvcc_version, with_launch

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16   # the shape of one mma.sync.m16n8k16 (A 16x16, B 16x8, C 16x8)
SHORT_DTYPES = {"float": "fp32", "__half": "fp16", "__nv_bfloat16": "bf16"}
_INSTANCE = re.compile(r"flash_(v\d)_kernel<\s*([\w:]+)\s*,\s*(\d+)\s*>")


# ---- names -------------------------------------------------------------------------------------

def parse_instance(name: str) -> tuple[str, str, int]:
    """("v2", "bf16", 64) from "void (anonymous namespace)::flash_v2_kernel<__nv_bfloat16, 64>(...)"."""
    m = _INSTANCE.search(name)
    if m is None:
        raise ValueError(f"not a flash_v1/flash_v2 kernel instantiation: {name!r}")
    return m.group(1), SHORT_DTYPES.get(m.group(2), m.group(2)), int(m.group(3))


def short_name(name: str) -> str:
    version, dtype, head_dim = parse_instance(name)
    return f"{version}<{dtype}, {head_dim}>"


# ---- resources and occupancy ---------------------------------------------------------------------

def occupancy_of(kernel: KernelResources) -> Occupancy:
    """Theoretical occupancy of a kernel from its compile report and launch configuration."""
    if kernel.threads_per_block is None:
        raise ValueError(f"{kernel.name}: threads per block unknown; use cuda_flash.kernel_report, "
                         "which adds the launch configuration")
    return occupancy(threads_per_block=kernel.threads_per_block, registers_per_thread=kernel.registers,
                     shared_mem_per_block=kernel.total_shared_bytes, arch=kernel.arch)


def resources_table(report: Iterable[KernelResources]):
    """One row per (arch, kernel): what ptxas said, what the launcher adds, what occupancy follows."""
    import pandas as pd

    rows = []
    for k in report:
        version, dtype, head_dim = parse_instance(k.name)
        occ = occupancy_of(k)
        rows.append({"arch": k.arch, "kernel": version, "dtype": dtype, "head_dim": head_dim,
                     "threads": k.threads_per_block, "registers": k.registers,
                     "static smem (B)": k.shared_bytes, "dynamic smem (B)": k.dynamic_shared_bytes,
                     "spilled (B)": k.spill_store_bytes + k.spill_load_bytes,
                     "blocks/SM": occ.blocks_per_sm, "warps/SM": occ.warps_per_sm,
                     "occupancy %": round(occ.percent, 2), "limited by": " and ".join(occ.limiters)})
    order = {"fp32": 0, "fp16": 1, "bf16": 2}
    table = pd.DataFrame(rows)
    table["_dtype"] = table["dtype"].map(order)
    return (table.sort_values(["arch", "kernel", "head_dim", "_dtype"]).drop(columns="_dtype")
            .reset_index(drop=True))


def find(report: Iterable[KernelResources], arch: str, version: str, dtype: str, head_dim: int) -> KernelResources:
    """The one report entry for e.g. ("sm_80", "v2", "bf16", 64)."""
    hits = [k for k in report if k.arch == arch and parse_instance(k.name) == (version, dtype, head_dim)]
    if len(hits) != 1:
        raise KeyError(f"{len(hits)} kernels match {arch} {version}<{dtype}, {head_dim}>")
    return hits[0]


# ---- a recorded report, for machines without nvcc ------------------------------------------------

# Printed by `record()` after `kernel_report(["sm_80", "sm_90"])` and `design_steps(d)` for
# both head dims on a machine with nvcc (no GPU needed). tests/test_cuda_report.py compiles
# again where the same nvcc is present and fails if the kernels changed without this table
# being recorded anew.
RECORDED = {
    "nvcc": "13.0, V13.0.88",
    "date": "2026-12-01",
    # (arch, version, dtype, head_dim, registers, static smem, spill stores, spill loads, stack frame, barriers)
    "kernels": [
        ('sm_80', 'v1', 'bf16', 64, 124, 0, 0, 0, 0, 1),
        ('sm_80', 'v1', 'bf16', 128, 128, 0, 0, 0, 0, 1),
        ('sm_80', 'v1', 'fp16', 64, 124, 0, 0, 0, 0, 1),
        ('sm_80', 'v1', 'fp16', 128, 128, 0, 0, 0, 0, 1),
        ('sm_80', 'v1', 'fp32', 64, 123, 0, 0, 0, 0, 1),
        ('sm_80', 'v1', 'fp32', 128, 128, 0, 0, 0, 0, 1),
        ('sm_80', 'v2', 'bf16', 64, 167, 0, 0, 0, 0, 1),
        ('sm_80', 'v2', 'bf16', 128, 246, 0, 0, 0, 0, 1),
        ('sm_80', 'v2', 'fp16', 64, 167, 0, 0, 0, 0, 1),
        ('sm_80', 'v2', 'fp16', 128, 246, 0, 0, 0, 0, 1),
        ('sm_90', 'v1', 'bf16', 64, 128, 0, 0, 0, 0, 1),
        ('sm_90', 'v1', 'bf16', 128, 136, 0, 0, 0, 0, 1),
        ('sm_90', 'v1', 'fp16', 64, 128, 0, 0, 0, 0, 1),
        ('sm_90', 'v1', 'fp16', 128, 136, 0, 0, 0, 0, 1),
        ('sm_90', 'v1', 'fp32', 64, 128, 0, 0, 0, 0, 1),
        ('sm_90', 'v1', 'fp32', 128, 136, 0, 0, 0, 0, 1),
        ('sm_90', 'v2', 'bf16', 64, 158, 0, 0, 0, 0, 1),
        ('sm_90', 'v2', 'bf16', 128, 247, 0, 0, 0, 0, 1),
        ('sm_90', 'v2', 'fp16', 64, 158, 0, 0, 0, 0, 1),
        ('sm_90', 'v2', 'fp16', 128, 247, 0, 0, 0, 0, 1),
    ],
    # cuda_v2 at bf16, one row per (arch, head_dim, step of DESIGN_STEPS): (arch, head_dim, step,
    # registers, static smem, spill stores, spill loads, stack frame, and the PTX's counts of
    # mma.sync, ex2.approx.f32, ex2.approx.ftz.f32, bar.sync)
    "design_steps": [
        ('sm_80', 64, 0, 172, 0, 0, 0, 0, 64, 34, 0, 3),
        ('sm_80', 64, 1, 164, 0, 0, 0, 0, 64, 34, 0, 3),
        ('sm_80', 64, 2, 165, 0, 0, 0, 0, 128, 68, 0, 5),
        ('sm_80', 64, 3, 167, 0, 0, 0, 0, 128, 0, 68, 5),
        ('sm_80', 64, 4, 167, 0, 0, 0, 0, 128, 0, 68, 3),
        ('sm_80', 128, 0, 230, 0, 0, 0, 0, 128, 34, 0, 3),
        ('sm_80', 128, 1, 220, 0, 0, 0, 0, 128, 34, 0, 3),
        ('sm_80', 128, 2, 222, 0, 0, 0, 0, 256, 68, 0, 5),
        ('sm_80', 128, 3, 225, 0, 0, 0, 0, 256, 0, 68, 5),
        ('sm_80', 128, 4, 246, 0, 0, 0, 0, 256, 0, 68, 3),
        ('sm_90', 64, 0, 160, 0, 0, 0, 0, 64, 34, 0, 3),
        ('sm_90', 64, 1, 157, 0, 0, 0, 0, 64, 34, 0, 3),
        ('sm_90', 64, 2, 157, 0, 0, 0, 0, 128, 68, 0, 5),
        ('sm_90', 64, 3, 163, 0, 0, 0, 0, 128, 0, 68, 5),
        ('sm_90', 64, 4, 158, 0, 0, 0, 0, 128, 0, 68, 3),
        ('sm_90', 128, 0, 224, 0, 0, 0, 0, 128, 34, 0, 3),
        ('sm_90', 128, 1, 212, 0, 0, 0, 0, 128, 34, 0, 3),
        ('sm_90', 128, 2, 216, 0, 0, 0, 0, 256, 68, 0, 5),
        ('sm_90', 128, 3, 219, 0, 0, 0, 0, 256, 0, 68, 5),
        ('sm_90', 128, 4, 247, 0, 0, 0, 0, 256, 0, 68, 3),
    ],
}
_TYPE_OF = {short: full for full, short in SHORT_DTYPES.items()}


def recorded_report() -> list[KernelResources]:
    """RECORDED as KernelResources, completed with the launch configuration like a live report."""
    out = []
    for arch, version, dtype, d, regs, smem, st, ld, stack, barriers in RECORDED["kernels"]:
        args = "flash::Problem" if version == "v1" else "flash::Problem, bool"
        name = f"void (anonymous namespace)::flash_{version}_kernel<{_TYPE_OF[dtype]}, {d}>({args})"
        cfg = cuda_flash.launch_config(version, d)
        kernel = KernelResources(name=name, mangled="(recorded)", arch=arch, registers=regs, shared_bytes=smem,
                                 spill_store_bytes=st, spill_load_bytes=ld, stack_frame_bytes=stack,
                                 barriers=barriers)
        out.append(with_launch(kernel, cfg.threads, cfg.dynamic_shared_bytes))
    return out


def as_recorded_rows(report: Iterable[KernelResources]) -> list[tuple]:
    """A report in RECORDED's row format (to compare with it, or to record it)."""
    return [(k.arch, *parse_instance(k.name), k.registers, k.shared_bytes, k.spill_store_bytes,
             k.spill_load_bytes, k.stack_frame_bytes, k.barriers) for k in report]


def record(archs=("sm_80", "sm_90")) -> str:
    """Compile now and return RECORDED's text for this nvcc, to paste into this module."""
    import datetime

    rows = sorted(as_recorded_rows(cuda_flash.kernel_report(list(archs))))
    steps = [row for d in cuda_flash.HEAD_DIMS for row in as_recorded_steps(design_steps(d, archs, live=True))]
    lines = [f'    "nvcc": "{nvcc_version()}",', f'    "date": "{datetime.date.today().isoformat()}",',
             "    # (arch, version, dtype, head_dim, registers, static smem, spill stores, spill loads, stack frame, barriers)",
             '    "kernels": [', *(f"        {row!r}," for row in rows), "    ],",
             "    # cuda_v2 at bf16, one row per (arch, head_dim, step of DESIGN_STEPS): (arch, head_dim, step,",
             "    # registers, static smem, spill stores, spill loads, stack frame, and the PTX's counts of",
             "    # " + ", ".join(STEP_OPCODES) + ")",
             '    "design_steps": [', *(f"        {row!r}," for row in sorted(steps)), "    ],"]
    return "RECORDED = {\n" + "\n".join(lines) + "\n}"


# ---- PTX ---------------------------------------------------------------------------------------

def compile_device_code(source: Union[str, Path], arch: str = "sm_80", defines: Iterable[str] = (),
                        timeout: float = 300):
    """PTX and ptxas' report of a torch-free .cu file for one arch: ``(ptx text, [KernelResources])``.

    What ``cuda_flash.kernel_report`` compiles, under the same flags (those of the extension
    build), with ``-keep`` leaving the PTX behind for us to read. Launch configurations are
    not added here.
    """
    compiled = compile_cuda(source, [arch], (*cuda_flash.EXTRA_CUDA_FLAGS, *cuda_flash.TORCH_NVCC_FLAGS, *defines),
                            cuda_flash.TORCH_STD, keep_ptx=True, timeout=timeout)
    return compiled.ptx[arch], compiled.kernels


def compile_kernels(archs: Iterable[str] = ("sm_80", "sm_90"), sources=cuda_flash.KERNEL_SOURCES):
    """Every kernel of ``sources`` (files in kernels/csrc) for every arch.

    Returns ``(report, ptx)``: the resources exactly as ``cuda_flash.kernel_report(archs)``
    gives them (launch configuration included; the same compile, done once per process), and
    ``ptx[arch][file]``, the PTX text.
    """
    archs = list(archs)
    report, ptx = [], {a: {} for a in archs}
    for source, compiled in cuda_flash.compile_sources(archs, sources).items():
        for arch in archs:
            ptx[arch][source] = compiled.ptx[arch]
        for k in compiled.kernels:
            version, _, head_dim = parse_instance(k.name)
            cfg = cuda_flash.launch_config(version, head_dim)
            report.append(with_launch(k, cfg.threads, cfg.dynamic_shared_bytes))
    return report, ptx


_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+(\S+?)\s*\(", re.M)


def ptx_kernels(ptx: str) -> dict[str, str]:
    """{kernel name (demangled where possible): its PTX text} for every ``.entry`` in ``ptx``."""
    starts = list(_ENTRY.finditer(ptx))
    bodies = {m.group(1): ptx[m.start():(starts[i + 1].start() if i + 1 < len(starts) else len(ptx))]
              for i, m in enumerate(starts)}
    readable = demangle_names(bodies)
    return {readable[name]: body for name, body in bodies.items()}


def instruction_counts(ptx: str, opcode: str) -> dict[str, int]:
    """{kernel: how many instructions start with ``opcode``} (e.g. "mma.sync", "fma.rn.f32").

    Counts static instructions in the program text: a loop the compiler did not unroll
    counts once, however many times it runs.
    """
    pattern = re.compile(r"^\s*(?:@!?%\w+\s+)?" + re.escape(opcode) + r"\b", re.M)
    return {name: len(pattern.findall(body)) for name, body in ptx_kernels(ptx).items()}


_INFO_STRING = re.compile(r"^(\$L__info_string\d+):\s*\n((?:\s*\.b8[^\n]*\n)+)", re.M)
_FUNCTION_NAME = re.compile(r"function_name\s+(\$L__info_string\d+)")


def inlined_functions(ptx: str) -> dict[str, set]:
    """{kernel: names of the functions whose code it holds} from PTX compiled with -lineinfo.

    Every ``.loc`` line of inlined code names its function (``function_name
    $L__info_stringN``), and the PTX's ``.debug_str`` section spells each name out as bytes.
    A template instantiation that was inlined shows up here although no symbol is left for
    it. Empty sets without line information.
    """
    strings = {}
    for m in _INFO_STRING.finditer(ptx):
        raw = bytes(int(b) for line in m.group(2).split("\n") if line.strip()
                    for b in line.strip().removeprefix(".b8").split(","))
        strings[m.group(1)] = raw.split(b"\0", 1)[0].decode("ascii", "replace")
    readable = demangle_names(strings.values())
    return {name: {readable[strings[label]] for label in _FUNCTION_NAME.findall(body) if label in strings}
            for name, body in ptx_kernels(ptx).items()}


def mma_per_key_tile(head_dim: int, block_n: int = 64) -> int:
    """mma.sync instructions one warp issues per tile of ``block_n`` keys in cuda_v2.

    S = Q K^T: a warp's 16 rows x block_n keys, summed over head_dim -> (block_n / 8) x (head_dim / 16).
    O += P V:  16 rows x head_dim columns, summed over block_n keys  -> (head_dim / 8) x (block_n / 16).
    """
    scores = (block_n // MMA_N) * (head_dim // MMA_K)
    output = (head_dim // MMA_N) * (block_n // MMA_K)
    return scores + output


# ---- cuda_v2's design, one step at a time ----------------------------------------------------------

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
    raise ValueError(f"{name!r} is no step of DESIGN_STEPS (flash_v2.cu and cuda_report disagree)")


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
    RECORDED (``live=False``); ``None`` compiles where nvcc is found."""
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
    """Step reports in RECORDED["design_steps"]'s row format."""
    return [(r.kernel.arch, r.head_dim, r.index, r.kernel.registers, r.kernel.shared_bytes, r.kernel.spill_store_bytes,
             r.kernel.spill_load_bytes, r.kernel.stack_frame_bytes, *(r.counts[op] for op in STEP_OPCODES))
            for r in reports]


def recorded_steps() -> list[StepReport]:
    out = []
    for arch, d, index, regs, smem, st, ld, stack, *counts in RECORDED["design_steps"]:
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
    from .reference import future_mask

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


# ---- who owns what: the kernels' index formulas, element by element ------------------------------

def owners_v1_scores(block_m: int = 32, block_n: int = 32, threads: int = 128) -> np.ndarray:
    """Thread computing each score S[r][c] in v1's phase 1: c = tid % N, r = tid / N + i * (threads / N)."""
    owner = np.full((block_m, block_n), -1)
    step = threads // block_n
    for tid in range(threads):
        owner[tid // block_n::step, tid % block_n] = tid
    return owner


def owners_v1_softmax(block_m: int = 32, block_n: int = 32) -> np.ndarray:
    """Thread computing row r's softmax in v1's phase 2: thread r (threads >= block_m sit idle)."""
    return np.repeat(np.arange(block_m)[:, None], block_n, axis=1)


def owners_v1_output(head_dim: int, block_m: int = 32, threads: int = 128) -> np.ndarray:
    """Thread accumulating O[r][d] in v1's phase 3: d = tid % D, r = tid / D + i * (threads / D)."""
    owner = np.full((block_m, head_dim), -1)
    step = threads // head_dim
    for tid in range(threads):
        owner[tid // head_dim::step, tid % head_dim] = tid
    return owner


def owners_v2(cols: int, block_m: int = 128, threads: int = 256) -> np.ndarray:
    """Thread holding accumulator (r, c) of v2's S (cols = 64 keys) or O (cols = head_dim) tile.

    Warp w owns rows 16w..16w+15; in it lane = 4g + t holds rows g and g+8, columns 2t and
    2t+1 of every 8-column tile (the C fragment of mma.m16n8k16).
    """
    owner = np.full((block_m, cols), -1)
    for tid in range(threads):
        warp, lane = divmod(tid, WARP)
        g, t = divmod(lane, 4)
        for row in (warp * MMA_M + g, warp * MMA_M + g + 8):
            for tile in range(cols // MMA_N):
                owner[row, tile * MMA_N + 2 * t: tile * MMA_N + 2 * t + 2] = tid
    return owner


def thread_map(head_dim: int = 64, lane: int = 5):
    """Four panels: which warp computes which element in v1's three phases (4 warps) and in
    v2 (8 warps, 128 query rows).

    Colours are warps; in the v2 panel the elements of one lane of warp 0 are outlined. The
    figure is about as wide as the book's column (so it is shown unscaled), its text keeps
    the font floor (``plots.font_floor``) and the key to the colours sits in the empty cell
    beside v2, never over the data.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    from .plots import COLUMN_PX, apply_font_floor

    v2 = cuda_flash.launch_config("v2", head_dim)
    v2_owner = owners_v2(v2.block_n, v2.block_m, v2.threads)  # the S tile: [block_m, block_n]
    warps = v2.threads // WARP
    colours = ListedColormap(["#f2f2f2", "#4c72b0", "#dd8452", "#55a868", "#c44e52",
                              "#8172b3", "#937860", "#da8bc3", "#8c8c8c"][:warps + 1])
    panels = {
        "p1": ("v1 phase 1\nscores S", owners_v1_scores()),
        "p2": ("v1 phase 2\nsoftmax", owners_v1_softmax()),
        "p3": (f"v1 phase 3\noutput O (32 × {head_dim})", owners_v1_output(head_dim)),
        "v2": (f"v2: S accumulators ({v2.block_m} × {v2.block_n});\nO's columns follow the same pattern", v2_owner),
    }
    fig, axes = plt.subplot_mosaic([["p1", "p2", "p3", "p3"], ["v2", "v2", ".", "."]],
                                   figsize=(0.98 * COLUMN_PX / 100, 6.6), dpi=100,
                                   height_ratios=[1, 2.6], layout="constrained")
    for name, (title, owner) in panels.items():
        ax = axes[name]
        warp = np.where(owner >= 0, owner // WARP + 1, 0)
        ax.imshow(warp, cmap=colours, vmin=0, vmax=warps, interpolation="nearest", aspect="equal")
        ax.set_title(title, loc="left")
        rows, cols = owner.shape
        step = 16 if cols <= 64 else 32
        ax.set_xticks(list(range(0, cols - step // 2, step)) + [cols - 1])
        ystep = 16 if rows <= 64 else 32
        ax.set_yticks(list(range(0, rows - ystep // 2, ystep)) + [rows - 1])
        if name in ("p2", "p3"):  # the same 32 rows as phase 1, labelled there
            ax.tick_params(axis="y", labelleft=False)
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
    axes["p1"].set_ylabel("query row")
    axes["v2"].set_ylabel("query row")
    axes["v2"].set_xlabel("column (key, or d of the output)")
    rows, cols = np.nonzero(v2_owner == lane)
    axes["v2"].scatter(cols, rows, s=6, marker="s", facecolors="none", edgecolors="black", linewidths=0.7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(i + 1)) for i in range(warps)]
    handles.append(plt.Line2D([], [], ls="", marker="s", markerfacecolor="none", markeredgecolor="black"))
    apply_font_floor(fig)
    # In the empty cell right of v2 (the mosaic's "."), level with v2's middle.
    fig.legend(handles, [f"warp {i} (threads {32 * i}-{32 * i + 31})" + (" (v2 only)" if i >= 4 else "")
                         for i in range(warps)]
               + [f"lane {lane} of warp 0 (v2)"], loc="center left", bbox_to_anchor=(0.53, 0.36),
               frameon=False, title="who computes each element", fontsize=axes["v2"].xaxis.label.get_fontsize(),
               title_fontsize=axes["v2"].xaxis.label.get_fontsize())
    return fig


# ---- source excerpts ----------------------------------------------------------------------------

def cuda_excerpt(source: Union[str, Path], start: str, end: Optional[str] = None) -> str:
    """Lines of ``source`` from the first one containing ``start`` up to (not including) the
    first later one containing ``end``; without ``end``, the brace-balanced block that begins
    at ``start`` (a whole function or loop). Common indentation removed."""
    lines = Path(source).read_text().splitlines()
    first = next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise ValueError(f"{start!r} does not occur in {Path(source).name}")
    if end is not None:
        last = next((i for i in range(first + 1, len(lines)) if end in lines[i]), None)
        if last is None:
            raise ValueError(f"{end!r} does not occur after {start!r} in {Path(source).name}")
    else:
        depth, opened, last = 0, False, None
        for i in range(first, len(lines)):
            code = lines[i].split("//")[0]
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth == 0:
                last = i + 1
                break
        if last is None:
            raise ValueError(f"the block at {start!r} in {Path(source).name} never closes")
    return _dedent(lines[first:last])


def _dedent(lines: list[str]) -> str:
    # Like textwrap.dedent, but blind to preprocessor lines: `#pragma unroll` sits in column 0
    # inside indented code and would otherwise keep all the indentation.
    indents = [len(l) - len(l.lstrip(" ")) for l in lines if l.strip() and not l.lstrip().startswith("#")]
    cut = min(indents, default=0)
    return "\n".join(l[cut:] if l[:cut].strip() == "" else l.lstrip(" ") for l in lines).strip("\n")


def cuda_markdown(code: str):
    """A code block the book highlights as CUDA."""
    from IPython.display import Markdown

    return Markdown(f"```cuda\n{code}\n```")


__all__ = ["DESIGN_STEPS", "STEP_OPCODES", "DesignStep", "StepReport", "as_recorded_steps", "barriers_per_tile",
           "design_steps", "design_table", "inlined_functions", "parse_design", "recorded_steps", "tile_bodies",
           "tile_census",
           "RECORDED", "as_recorded_rows", "compile_device_code", "compile_kernels", "cuda_excerpt", "cuda_markdown",
           "find", "instruction_counts", "mma_per_key_tile", "nvcc_version", "occupancy_of", "owners_v1_output",
           "owners_v1_scores", "owners_v1_softmax", "owners_v2", "parse_instance", "ptx_kernels", "record",
           "recorded_report", "resources_table", "short_name", "thread_map"]

"""Chapter 5's bookkeeping: the CUDA kernels as the compiler and the hardware see them.

Everything here reads the kernels of ``kernels/cuda/csrc`` without running them, so all of it
works on a machine without a GPU:

* ``resources_table(report)``: one row per kernel instantiation, the compiler's registers,
  shared memory and spills (``kernels.cuda.flash.kernel_report``), the launch configuration,
  and the theoretical occupancy those imply (``kernels.hw.occupancy``).
* ``RECORDED_REPORT`` / ``recorded_report()``: the same report as one real ``nvcc`` run printed it,
  for machines without ``nvcc`` (Colab, laptops). ``record_report()`` writes a fresh one.
* ``compile_kernels(archs)``: that report and the PTX of every kernel, in one compile;
  ``instruction_counts(ptx, opcode)``: how often an instruction appears in each kernel.
  Tensor-core matmuls show up there as ``mma.sync.aligned.m16n8k16``; a kernel without
  them does its arithmetic on CUDA cores. ``inlined_functions(ptx)``: the functions the
  compiler inlined into each kernel, from the PTX's line information.
* ``mma_per_key_tile(head_dim)``: how many of those instructions one warp of ``cuda_v2``
  must issue per tile of keys, from the tile shapes alone, to check the PTX against.

The rest of chapter 5's reading of the kernels has modules of its own: cuda_v2's design
steps (``kernels.cuda.design``), which thread computes which element
(``kernels.cuda.threads``), and the lines of the ``.cu`` files the book shows
(``kernels.cuda.excerpts``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Union

from kernels.cuda import flash as cuda_flash
from kernels.hw.occupancy import Occupancy, occupancy
from kernels.cuda.ptxas import KernelResources, compile_cuda, demangle_names, nvcc_version, with_launch

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


def find_kernel(report: Iterable[KernelResources], arch: str, version: str, dtype: str, head_dim: int) -> KernelResources:
    """The one report entry for e.g. ("sm_80", "v2", "bf16", 64)."""
    hits = [k for k in report if k.arch == arch and parse_instance(k.name) == (version, dtype, head_dim)]
    if len(hits) != 1:
        raise KeyError(f"{len(hits)} kernels match {arch} {version}<{dtype}, {head_dim}>")
    return hits[0]


# ---- a recorded report, for machines without nvcc ------------------------------------------------

# Printed by `record_report()` after `kernel_report(["sm_80", "sm_90"])` and `design_steps(d)` for
# both head dims on a machine with nvcc (no GPU needed). tests/test_cuda_report.py compiles
# again where the same nvcc is present and fails if the kernels changed without this table
# being recorded anew.
RECORDED_REPORT: dict[str, Any] = {  # rows of mixed str and int: read by position
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
    """RECORDED_REPORT as KernelResources, completed with the launch configuration like a live report."""
    out = []
    for arch, version, dtype, d, regs, smem, st, ld, stack, barriers in RECORDED_REPORT["kernels"]:
        args = "flash::Problem" if version == "v1" else "flash::Problem, bool"
        name = f"void (anonymous namespace)::flash_{version}_kernel<{_TYPE_OF[dtype]}, {d}>({args})"
        cfg = cuda_flash.launch_config(version, d)
        kernel = KernelResources(name=name, mangled="(recorded)", arch=arch, registers=regs, shared_bytes=smem,
                                 spill_store_bytes=st, spill_load_bytes=ld, stack_frame_bytes=stack,
                                 barriers=barriers)
        out.append(with_launch(kernel, cfg.threads, cfg.dynamic_shared_bytes))
    return out


def as_recorded_rows(report: Iterable[KernelResources]) -> list[tuple]:
    """A report in RECORDED_REPORT's row format (to compare with it, or to record it)."""
    return [(k.arch, *parse_instance(k.name), k.registers, k.shared_bytes, k.spill_store_bytes,
             k.spill_load_bytes, k.stack_frame_bytes, k.barriers) for k in report]


def record_report(archs=("sm_80", "sm_90")) -> str:
    """Compile now and return RECORDED_REPORT's text for this nvcc, to paste into this module."""
    import datetime

    # Here, not at the top: cuda_design reads RECORDED_REPORT from this module.
    from kernels.cuda.design import STEP_OPCODES, as_recorded_steps, design_steps

    rows = sorted(as_recorded_rows(cuda_flash.kernel_report(list(archs))))
    steps = [row for d in cuda_flash.HEAD_DIMS for row in as_recorded_steps(design_steps(d, archs, live=True))]
    lines = [f'    "nvcc": "{nvcc_version()}",', f'    "date": "{datetime.date.today().isoformat()}",',
             "    # (arch, version, dtype, head_dim, registers, static smem, spill stores, spill loads, stack frame, barriers)",
             '    "kernels": [', *(f"        {row!r}," for row in rows), "    ],",
             "    # cuda_v2 at bf16, one row per (arch, head_dim, step of DESIGN_STEPS): (arch, head_dim, step,",
             "    # registers, static smem, spill stores, spill loads, stack frame, and the PTX's counts of",
             "    # " + ", ".join(STEP_OPCODES) + ")",
             '    "design_steps": [', *(f"        {row!r}," for row in sorted(steps)), "    ],"]
    return ("RECORDED_REPORT: dict[str, Any] = {  # rows of mixed str and int: read by position\n"
            + "\n".join(lines) + "\n}")


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
    """Every kernel of ``sources`` (files in kernels/cuda/csrc) for every arch.

    Returns ``(report, ptx)``: the resources exactly as ``cuda_flash.kernel_report(archs)``
    gives them (launch configuration included; the same compile, done once per process), and
    ``ptx[arch][file]``, the PTX text.
    """
    archs = list(archs)
    report: list[KernelResources] = []
    ptx: dict[str, dict[str, str]] = {a: {} for a in archs}
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


__all__ = ["RECORDED_REPORT", "as_recorded_rows", "compile_device_code", "compile_kernels", "find_kernel", "inlined_functions",
           "instruction_counts", "mma_per_key_tile", "nvcc_version", "occupancy_of", "parse_instance", "ptx_kernels",
           "record", "recorded_report", "resources_table", "short_name"]

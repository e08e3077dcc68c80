"""Chapter 5's kernels as the compiler sees them: resources, occupancy, PTX.

* ``resources_table(kernels)``: one row per kernel instantiation, ptxas' registers, shared
  memory and spills with the launch configuration, and the theoretical occupancy they allow.
* ``load_snapshot()`` / ``snapshot_kernels()``: the same resources as one real nvcc run
  logged them (``nvcc_snapshot.json``, written by ``python -m tools.nvcc_snapshot``), for
  machines without nvcc; ``kernel_rows`` is that file's row format.
* ``compile_cuda_kernels(archs)``: the resources and the PTX of every kernel, in one compile;
  ``instruction_counts(ptx, opcode)`` reads the PTX.
* ``mma_per_key_tile(head_dim)``: mma.sync instructions per key tile, from the tile shapes.
* ``read_kernels(archs)``: the kernels compiled now where nvcc is, else the snapshot's, and
  where they came from in words (``read_compiled``, which the design revisions share);
  ``instruction_table(ptx, opcodes)`` counts opcodes per kernel.
* ``kineto_reads(kernel)``: what a PyTorch trace's "est. achieved occupancy %" would say.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

from kernels.cuda import flash as cuda_flash
from kernels.hw.occupancy import Launch, Occupancy, kineto_estimate, occupancy
from kernels.cuda.ptxas import KernelResources, demangle_names, with_launch

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16   # the shape of one mma.sync.m16n8k16 (A 16x16, B 16x8, C 16x8)
SHORT_DTYPES = {"float": "fp32", "__half": "fp16", "__nv_bfloat16": "bf16"}
T = TypeVar("T")
_INSTANCE = re.compile(r"flash_(v\d)_kernel<\s*([\w:]+)\s*,\s*(\d+)\s*>")


# ---- names -------------------------------------------------------------------------------------

def parse_instance(name: str) -> tuple[str, str, int]:
    """("v2", "bf16", 64) from "void (anonymous namespace)::flash_v2_kernel<__nv_bfloat16, 64>(...)"."""
    m = _INSTANCE.search(name)
    if m is None:
        raise ValueError(f"not a flash_v1/flash_v2 kernel instantiation: {name!r}")
    return m.group(1), SHORT_DTYPES.get(m.group(2), m.group(2)), int(m.group(3))


def instance_label(name: str) -> str:
    """A kernel instance as a table names it: ``flash_v2_kernel<__half, 64>(...)`` -> ``v2<fp16, 64>``."""
    version, dtype, head_dim = parse_instance(name)
    return f"{version}<{dtype}, {head_dim}>"


# ---- resources and occupancy ---------------------------------------------------------------------

def occupancy_of(kernel: KernelResources) -> Occupancy:
    """Theoretical occupancy of a kernel from its resources and launch configuration."""
    if kernel.threads_per_block is None:
        raise ValueError(f"{kernel.name}: threads per block unknown; use cuda_flash.kernel_resources, "
                         "which adds the launch configuration")
    return occupancy(threads_per_block=kernel.threads_per_block, registers_per_thread=kernel.registers,
                     shared_mem_per_block=kernel.total_shared_bytes, arch=kernel.arch)


def kineto_reads(kernel: KernelResources) -> float:
    """Kineto's "est. achieved occupancy %" for ``kernel`` on a grid large enough to fill every
    SM: its real occupancy, except 0 above 48 KiB of shared memory per block (the default
    Kineto's estimate assumes, whatever the kernel opted in to)."""
    occ = occupancy_of(kernel)
    return kineto_estimate(occ.threads_per_block, kernel.registers, kernel.total_shared_bytes,
                           grid_blocks=10**6, sm_count=1, arch=kernel.arch)


def resources_table(kernels: Iterable[KernelResources]):
    """One row per (arch, kernel): what ptxas said, what the launcher adds, what occupancy
    follows, and what a PyTorch trace would estimate (``kineto_reads``)."""
    import pandas as pd

    rows = []
    for k in kernels:
        version, dtype, head_dim = parse_instance(k.name)
        occ = occupancy_of(k)
        rows.append({"arch": k.arch, "kernel": version, "dtype": dtype, "head_dim": head_dim,
                     "threads": k.threads_per_block, "registers": k.registers,
                     "static smem (B)": k.shared_bytes, "dynamic smem (B)": k.dynamic_shared_bytes,
                     "spilled (B)": k.spill_store_bytes + k.spill_load_bytes,
                     "blocks/SM": occ.blocks_per_sm, "warps/SM": occ.warps_per_sm,
                     "occupancy %": round(occ.percent, 2), "limited by": " and ".join(occ.limiters),
                     "a trace reads %": round(kineto_reads(k), 2)})
    order = {"fp32": 0, "fp16": 1, "bf16": 2}
    table = pd.DataFrame(rows)
    table["_dtype"] = table["dtype"].map(order)
    return (table.sort_values(["arch", "kernel", "head_dim", "_dtype"]).drop(columns="_dtype")
            .reset_index(drop=True))


def read_kernels(archs: Iterable[str] = ("sm_80", "sm_90")):
    """Every kernel instantiation for ``archs``: ``(kernels, ptx, where_from)``, from
    ``read_compiled``: compiled now (``compile_cuda_kernels``: resources and PTX), else the nvcc
    snapshot's resources with ``ptx`` None."""
    archs = list(archs)
    (kernels, ptx), where_from = read_compiled(
        lambda: compile_cuda_kernels(archs), lambda: ([k for k in snapshot_kernels() if k.arch in archs], None))
    return kernels, ptx, where_from


def read_compiled(compile_now: Callable[[], T], from_snapshot: Callable[[], T]) -> tuple[T, str]:
    """``(compile_now(), where_from)`` where nvcc is found; else, or when that compile fails (a
    toolkit too old for these kernels), ``(from_snapshot(), where_from)``. ``where_from`` says
    which, and why not the other, in words for the page."""
    import time

    from kernels.cuda.ptxas import nvcc_path, nvcc_version

    why_not = "this machine has no nvcc (no PATH entry, no CUDA_HOME)"
    if nvcc_path() is not None:
        started = time.perf_counter()
        try:
            compiled = compile_now()
            return compiled, f"compiled now by nvcc {nvcc_version()} in {time.perf_counter() - started:.1f} s"
        except (RuntimeError, subprocess.TimeoutExpired) as err:   # a failed or a stuck compile
            why_not = f"the compile with this machine's nvcc failed ({(str(err).splitlines() or [type(err).__name__])[0]})"
    snapshot = load_snapshot()
    return from_snapshot(), f"read from a snapshot of nvcc {snapshot['nvcc']} taken on {snapshot['date']}, because {why_not}"


def find_kernel(kernels: Iterable[KernelResources], arch: str, version: str, dtype: str, head_dim: int) -> KernelResources:
    """The one kernel of ``kernels`` that is e.g. ("sm_80", "v2", "bf16", 64)."""
    hits = [k for k in kernels if k.arch == arch and parse_instance(k.name) == (version, dtype, head_dim)]
    if len(hits) != 1:
        raise KeyError(f"{len(hits)} kernels match {arch} {version}<{dtype}, {head_dim}>")
    return hits[0]


# ---- the snapshot of one nvcc run, for machines without nvcc ---------------------------------------

# Written by tools/nvcc_snapshot.py on a machine with nvcc (no GPU needed); tests/cuda compare it
# with what the nvcc there prints and fail when the kernels changed without a new snapshot.
SNAPSHOT_PATH = Path(__file__).resolve().with_name("nvcc_snapshot.json")
_TYPE_OF = {short: full for full, short in SHORT_DTYPES.items()}


def load_snapshot(path: Union[str, Path] = SNAPSHOT_PATH) -> dict[str, Any]:
    """The snapshot as JSON holds it: "nvcc", "date", "kernels" and "design_revisions" rows."""
    return json.loads(Path(path).read_text())


def snapshot_kernels(snapshot: Union[dict[str, Any], None] = None) -> list[KernelResources]:
    """The snapshot's kernels as KernelResources, completed with the launch configuration
    like ``cuda_flash.kernel_resources`` completes a live compile."""
    rows = (snapshot or load_snapshot())["kernels"]
    out = []
    for row in rows:
        version, d = row["kernel"], row["head_dim"]
        args = "flash::Problem" if version == "v1" else "flash::Problem, bool"
        name = f"void (anonymous namespace)::flash_{version}_kernel<{_TYPE_OF[row['dtype']]}, {d}>({args})"
        cfg = cuda_flash.launch_config(version, d)
        kernel = KernelResources(name=name, mangled="(snapshot)", arch=row["arch"], registers=row["registers"],
                                 shared_bytes=row["shared_bytes"], spill_store_bytes=row["spill_store_bytes"],
                                 spill_load_bytes=row["spill_load_bytes"], stack_frame_bytes=row["stack_frame_bytes"],
                                 barriers=row["barriers"])
        out.append(with_launch(kernel, cfg.threads, cfg.dynamic_shared_bytes))
    return out


def v2_launch(batch_heads: Optional[int], seq: Optional[int], head_dim: int, dtype: str, arch: str,
              kernels: Optional[Iterable[KernelResources]] = None) -> Launch:
    """The launch ``cuda_v2`` makes for one attention call: its grid and block from
    ``launch_config``, its registers and shared memory from ``kernels`` (default: the nvcc snapshot)."""
    if batch_heads is None or seq is None:   # a trace that recorded no shapes
        raise ValueError(f"batch_heads and seq must be known, got {batch_heads}, {seq}")
    cfg = cuda_flash.launch_config("v2", head_dim)
    kernel = find_kernel(snapshot_kernels() if kernels is None else kernels, arch, "v2", dtype, head_dim)
    return Launch(f"cuda_v2 {instance_label(kernel.name)}", cfg.grid(batch_heads, 1, seq), cfg.threads,
                  kernel.registers, kernel.total_shared_bytes,
                  "launch_config, ptxas -v" + (" (nvcc snapshot)" if kernels is None else ""))


def kernel_rows(kernels: Iterable[KernelResources]) -> list[dict[str, Any]]:
    """Kernels in the snapshot's "kernels" row format, in a fixed order (to compare or to write)."""
    rows = []
    for k in kernels:
        version, dtype, head_dim = parse_instance(k.name)
        rows.append({"arch": k.arch, "kernel": version, "dtype": dtype, "head_dim": head_dim,
                     "registers": k.registers, "shared_bytes": k.shared_bytes,
                     "spill_store_bytes": k.spill_store_bytes, "spill_load_bytes": k.spill_load_bytes,
                     "stack_frame_bytes": k.stack_frame_bytes, "barriers": k.barriers})
    return sorted(rows, key=lambda r: (r["arch"], r["kernel"], r["dtype"], r["head_dim"]))


# ---- PTX ---------------------------------------------------------------------------------------

def compile_cuda_kernels(archs: Iterable[str] = ("sm_80", "sm_90")):
    """Every kernel of kernels/cuda/csrc for every arch: ``(kernels, ptx)``, the resources as
    ``cuda_flash.kernel_resources(archs)`` gives them (launch configuration included), and
    ``ptx[arch][file]``, the PTX text, both from the same compile (done once per process)."""
    archs = list(archs)
    compiled = cuda_flash.compile_sources(archs)
    return cuda_flash.kernel_resources(archs), {a: {f: c.ptx[a] for f, c in compiled.items()} for a in archs}


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


def instruction_table(ptx: dict[str, dict[str, str]], opcodes: Iterable[str]):
    """How often each of ``opcodes`` occurs in each kernel's PTX (``ptx[arch][file]``, as
    ``compile_cuda_kernels`` returns it): one row per (arch, kernel label), one column per opcode."""
    import pandas as pd

    counts: dict[tuple[str, str], dict[str, int]] = {}
    for arch, files in ptx.items():
        for text in files.values():
            for op in opcodes:
                for name, n in instruction_counts(text, op).items():
                    counts.setdefault((arch, instance_label(name)), {})[op] = n
    return pd.DataFrame(counts).T.rename_axis(["arch", "kernel"]).sort_index()


def mma_per_key_tile(head_dim: int, block_n: int = 64) -> int:
    """mma.sync instructions one warp issues per tile of ``block_n`` keys in cuda_v2.

    S = Q K^T: a warp's 16 rows x block_n keys, summed over head_dim -> (block_n / 8) x (head_dim / 16).
    O += P V:  16 rows x head_dim columns, summed over block_n keys  -> (head_dim / 8) x (block_n / 16).
    """
    scores = (block_n // MMA_N) * (head_dim // MMA_K)
    output = (head_dim // MMA_N) * (block_n // MMA_K)
    return scores + output


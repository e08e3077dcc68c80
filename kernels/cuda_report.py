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
  them does its arithmetic on CUDA cores.
* ``mma_per_key_tile(head_dim)``: how many of those instructions one warp of ``cuda_v2``
  must issue per tile of keys, from the tile shapes alone, to check the PTX against.
* ``owners_*`` and ``thread_map(...)``: which thread computes which element of a tile, the
  index formulas of the two kernels written out in NumPy, and a figure of them.
* ``cuda_excerpt(source, start, end)``: lines of a ``.cu`` file, to show in the book.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from . import cuda_flash
from .occupancy import Occupancy, occupancy
from .ptxas import KernelResources, nvcc_path, parse_ptxas, with_launch

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

# Printed by `record()` after `kernel_report(["sm_80", "sm_90"])` on a machine with nvcc
# (no GPU needed). tests/test_cuda_report.py compiles again where the same nvcc is present and
# fails if the kernels changed without this table being recorded anew.
RECORDED = {
    "nvcc": "13.0, V13.0.88",
    "date": "2026-11-30",
    # (arch, version, dtype, head_dim, registers, static smem, spill stores, spill loads, stack frame, barriers)
    "kernels": [
        ("sm_80", "v1", "bf16", 128, 128, 0, 0, 0, 0, 1),
        ("sm_80", "v1", "bf16", 64, 128, 0, 0, 0, 0, 1),
        ("sm_80", "v1", "fp16", 128, 128, 0, 0, 0, 0, 1),
        ("sm_80", "v1", "fp16", 64, 128, 0, 0, 0, 0, 1),
        ("sm_80", "v1", "fp32", 128, 128, 0, 0, 0, 0, 1),
        ("sm_80", "v1", "fp32", 64, 124, 0, 0, 0, 0, 1),
        ("sm_90", "v1", "bf16", 128, 136, 0, 0, 0, 0, 1),
        ("sm_90", "v1", "bf16", 64, 128, 0, 0, 0, 0, 1),
        ("sm_90", "v1", "fp16", 128, 136, 0, 0, 0, 0, 1),
        ("sm_90", "v1", "fp16", 64, 128, 0, 0, 0, 0, 1),
        ("sm_90", "v1", "fp32", 128, 136, 0, 0, 0, 0, 1),
        ("sm_90", "v1", "fp32", 64, 128, 0, 0, 0, 0, 1),
        ("sm_80", "v2", "bf16", 128, 232, 0, 0, 0, 0, 1),
        ("sm_80", "v2", "bf16", 64, 190, 0, 0, 0, 0, 1),
        ("sm_80", "v2", "fp16", 128, 232, 0, 0, 0, 0, 1),
        ("sm_80", "v2", "fp16", 64, 190, 0, 0, 0, 0, 1),
        ("sm_90", "v2", "bf16", 128, 242, 0, 0, 0, 0, 1),
        ("sm_90", "v2", "bf16", 64, 200, 0, 0, 0, 0, 1),
        ("sm_90", "v2", "fp16", 128, 242, 0, 0, 0, 0, 1),
        ("sm_90", "v2", "fp16", 64, 200, 0, 0, 0, 0, 1),
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


def nvcc_version() -> Optional[str]:
    """"13.0, V13.0.88" (nvcc's own words after "release"), or None without nvcc."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    m = re.search(r"release (\S+ V\S+)", done.stdout)
    return m.group(1) if m else None


def record(archs=("sm_80", "sm_90")) -> str:
    """Compile now and return RECORDED's text for this nvcc, to paste into this module."""
    import datetime

    rows = as_recorded_rows(cuda_flash.kernel_report(list(archs)))
    lines = [f'    "nvcc": "{nvcc_version()}",', f'    "date": "{datetime.date.today().isoformat()}",',
             '    "kernels": [', *(f"        {row!r}," for row in rows), "    ],"]
    return "RECORDED = {\n" + "\n".join(lines) + "\n}"


# ---- PTX ---------------------------------------------------------------------------------------

def compile_device_code(source: Union[str, Path], arch: str = "sm_80", timeout: float = 300):
    """PTX and ptxas' report of a torch-free .cu file for one arch: ``(ptx text, [KernelResources])``.

    The device half of what ``cuda_flash.kernel_report`` compiles, under the same flags (those
    of the extension build): ``nvcc -cubin -Xptxas -v`` runs the front end (C++ -> PTX) and the
    assembler (PTX -> SASS, which prints the resources) and skips the host code; ``-keep``
    leaves the PTX behind for us to read. Launch configurations are not added here.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("compile_device_code needs the CUDA compiler nvcc; none is on PATH "
                           "(nor under CUDA_HOME/CUDA_PATH)")
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch must look like 'sm_80', got {arch!r}")
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"no CUDA source at {source}")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-cubin", f"-std={cuda_flash.TORCH_STD}", "-O3", f"-arch={arch}", "-Xptxas", "-v",
               "-keep", "--keep-dir", tmp, *cuda_flash.TORCH_NVCC_FLAGS, str(source),
               "-o", str(Path(tmp) / "kernel.cubin")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source.name} for {arch}:\n{done.stderr.strip()}")
        ptx = [p for p in Path(tmp).glob("*.ptx")]
        if len(ptx) != 1:
            raise RuntimeError(f"expected one PTX file from nvcc -keep, found {len(ptx)}")
        return ptx[0].read_text(), parse_ptxas(done.stdout + "\n" + done.stderr)


def compile_kernels(archs: Iterable[str] = ("sm_80", "sm_90"), sources=cuda_flash.KERNEL_SOURCES):
    """Every kernel of ``sources`` (files in kernels/csrc) for every arch, in one parallel pass.

    Returns ``(report, ptx)``: the resources as ``cuda_flash.kernel_report(archs)`` gives them
    (launch configuration included; the same compiler and flags, so the same numbers), and
    ``ptx[arch][file]``, the PTX text. nvcc is single-threaded: the (file, arch) pairs run
    side by side.
    """
    jobs = [(s, a) for s in sources for a in archs]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: compile_device_code(cuda_flash.CSRC / job[0], job[1]), jobs))
    report, ptx = [], {}
    for (source, arch), (text, kernels) in zip(jobs, results):
        ptx.setdefault(arch, {})[source] = text
        for k in kernels:
            version, _, head_dim = parse_instance(k.name)
            cfg = cuda_flash.launch_config(version, head_dim)
            report.append(with_launch(k, cfg.threads, cfg.dynamic_shared_bytes))
    return report, ptx


_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+(\S+?)\s*\(", re.M)


def ptx_kernels(ptx: str) -> dict[str, str]:
    """{kernel name (demangled where possible): its PTX text} for every ``.entry`` in ``ptx``."""
    from .ptxas import demangle_names

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


def mma_per_key_tile(head_dim: int, block_n: int = 64) -> int:
    """mma.sync instructions one warp issues per tile of ``block_n`` keys in cuda_v2.

    S = Q K^T: a warp's 16 rows x block_n keys, summed over head_dim -> (block_n / 8) x (head_dim / 16).
    O += P V:  16 rows x head_dim columns, summed over block_n keys  -> (head_dim / 8) x (block_n / 16).
    """
    scores = (block_n // MMA_N) * (head_dim // MMA_K)
    output = (head_dim // MMA_N) * (block_n // MMA_K)
    return scores + output


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


def owners_v2(cols: int, block_m: int = 64, threads: int = 128) -> np.ndarray:
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
    """Four panels: which warp computes which element in v1's three phases and in v2.

    Colours are warps; in the v2 panel the elements of one lane of warp 0 are outlined. The
    figure is about as wide as the book's column (so it is shown unscaled), its text keeps
    the font floor (``plots.font_floor``) and the key to the colours sits in the empty cell
    beside v2, never over the data.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    from .plots import COLUMN_PX, apply_font_floor

    colours = ListedColormap(["#f2f2f2", "#4c72b0", "#dd8452", "#55a868", "#c44e52"])
    panels = {
        "p1": ("v1 phase 1\nscores S", owners_v1_scores()),
        "p2": ("v1 phase 2\nsoftmax", owners_v1_softmax()),
        "p3": (f"v1 phase 3\noutput O (32 × {head_dim})", owners_v1_output(head_dim)),
        "v2": ("v2: S and O accumulators (64 × 64)", owners_v2(64)),
    }
    fig, axes = plt.subplot_mosaic([["p1", "p2", "p3", "p3"], ["v2", "v2", ".", "."]],
                                   figsize=(0.98 * COLUMN_PX / 100, 5.9), dpi=100,
                                   height_ratios=[1, 2], layout="constrained")
    for name, (title, owner) in panels.items():
        ax = axes[name]
        warp = np.where(owner >= 0, owner // WARP + 1, 0)
        ax.imshow(warp, cmap=colours, vmin=0, vmax=4, interpolation="nearest", aspect="equal")
        ax.set_title(title, loc="left")
        rows, cols = owner.shape
        step = 16 if cols <= 64 else 32
        ax.set_xticks(list(range(0, cols - step // 2, step)) + [cols - 1])
        ax.set_yticks(list(range(0, rows - 8, 16)) + [rows - 1])
        if name in ("p2", "p3"):  # the same 32 rows as phase 1, labelled there
            ax.tick_params(axis="y", labelleft=False)
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
    axes["p1"].set_ylabel("query row")
    axes["v2"].set_ylabel("query row")
    axes["v2"].set_xlabel("column (key, or d of the output)")
    rows, cols = np.nonzero(owners_v2(64) == lane)
    axes["v2"].scatter(cols, rows, s=10, marker="s", facecolors="none", edgecolors="black", linewidths=0.8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(i + 1)) for i in range(4)]
    handles.append(plt.Line2D([], [], ls="", marker="s", markerfacecolor="none", markeredgecolor="black"))
    apply_font_floor(fig)
    # In the empty cell right of v2 (the mosaic's "."), level with v2's middle.
    fig.legend(handles, [f"warp {i} (threads {32 * i}-{32 * i + 31})" for i in range(4)]
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


__all__ = ["RECORDED", "as_recorded_rows", "compile_device_code", "compile_kernels", "cuda_excerpt", "cuda_markdown",
           "find", "instruction_counts", "mma_per_key_tile", "nvcc_version", "occupancy_of", "owners_v1_output",
           "owners_v1_scores", "owners_v1_softmax", "owners_v2", "parse_instance", "ptx_kernels", "record",
           "recorded_report", "resources_table", "short_name", "thread_map"]

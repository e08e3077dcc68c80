"""What the compiler says every kernel costs on a GPU, without a GPU.

    python -m kernels.triton.compile_sweep --target sm_90            # a table
    python -m kernels.triton.compile_sweep --target sm_80 --json     # a list of objects

Triton compiles for a named GPU on a CPU-only machine, and ``ptxas -v`` (the build Triton
chose, ``kernels.cuda.ptxas.triton_ptxas``) reports registers and spills; shared memory is
the compiled kernel's ``metadata.shared``. Every config the autotuner may try, of every
kernel and padded head dim, is compiled; each row says whether it *fits* the target
(``kernels.hw.occupancy.ARCHES``) and whether the pruning *keeps* it
(``kernels.triton.configs.fitting_configs``), a rule on the footprint that the rows check.
The hand-written CUDA kernels come from ``kernels.cuda.flash.kernel_resources``. A process
started with ``TRITON_INTERPRET=1`` cannot compile: the CLI and ``sweep`` run a subprocess.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from kernels.cuda import flash as cuda_flash
from kernels.cuda.ptxas import KernelResources, nvcc_available, parse_ptxas, triton_ptxas
from kernels.cuda.resources import parse_instance
from kernels.dtypes import TORCH_DTYPES
from kernels.triton import backward as tb
from kernels.triton import flash as tf
from kernels.triton import configs
from kernels.triton import launch
from kernels.hw.occupancy import ARCHES

TARGETS = ("sm_80", "sm_90")
SWEPT_DTYPES = ("bf16", "fp16", "fp32")   # short names (kernels.dtypes), as Triton types pointers
REGISTERS_PER_SM = 64 * 1024

# Argument names of the kernels, by kind (see kernels/triton/flash.py).
_TENSORS = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ"}
_FP32_TENSORS = {"LSE", "DELTA"}


@dataclass
class Row:
    """One compiled kernel: what the compiler reports and what that means on the target."""

    kernel: str                 # "triton fwd", "triton bwd_dkdv", "triton bwd_dq", "cuda_v2", ...
    target: str                 # "sm_80", "sm_90"
    dtype: str
    head_dim: int
    config: dict                # BLOCK_M, BLOCK_N, num_warps, num_stages (CUDA: its tile and threads)
    registers: Optional[int]
    shared_bytes: Optional[int]  # what one block takes: Triton's metadata.shared; CUDA static + dynamic
    spills: Optional[int]       # bytes of spill stores + loads, per thread
    fits: Optional[bool]
    kept: Optional[bool]        # the autotuner's pruning keeps it (CUDA: always launched)
    estimate_bytes: Optional[int] = None   # the pruning's shared-memory estimate (Triton)
    threads: Optional[int] = None
    error: str = ""             # the compiler's message when the compile failed

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def limits(target: str):
    if target not in ARCHES:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    return ARCHES[target]


def fits(target: str, shared_bytes: int, registers: int, threads: int) -> bool:
    """A block can be resident on one SM of ``target``: shared memory within the per-block
    opt-in maximum, and its registers within the SM's register file."""
    arch = limits(target)
    return shared_bytes <= arch.max_shared_mem_per_block and registers * threads <= REGISTERS_PER_SM


# --------------------------------------------------------------------------------- Triton

def _triton_module():
    """kernels.triton.flash, whose kernels must be compiled ones; RuntimeError when they are not."""
    if launch.TRITON_MISSING:
        raise RuntimeError(launch.TRITON_MISSING)
    if not _compiles_here():
        raise RuntimeError("TRITON_INTERPRET=1 made @triton.jit interpret the kernels in this process; "
                           "the compile sweep needs one where it is not set (sweep_configs() starts one)")
    return tf


def _compiles_here() -> bool:
    """Whether the course's Triton kernels are compiled objects in this process (they are
    unless TRITON_INTERPRET=1 was set when they were defined)."""
    return launch.TRITON_MISSING is not None or type(tf.attn_fwd).__name__ == "JITFunction"


def _signature(fn, constexprs: dict, dtype: str) -> tuple[dict, dict]:
    """(signature, attrs) as Triton's JIT would specialize a contiguous input of ``dtype``."""
    pointer = f"*{dtype}"
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        if name in _TENSORS:
            signature[name] = pointer
        elif name in _FP32_TENSORS:
            signature[name] = "*fp32"
        elif name.endswith("scale"):
            signature[name] = "fp32"
            continue
        else:
            signature[name] = "i32"
        attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, attrs


def _unit_strides(fn) -> dict:
    """The strides along D (``s..d``): 1 for a contiguous input, a constant to the JIT."""
    return {n: 1 for n in fn.arg_names if n.startswith("s") and n.endswith("d") and len(n) <= 5}


def ptxas_resources(ptx: str, arch: str, capability: int):
    """Registers and spills of a PTX kernel, from the ptxas Triton runs for ``capability``, with ``-v``."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [triton_ptxas(capability), "-lineinfo", "-v", "--regAllocOptLevel=2",
               f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "kernel.cubin")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed: {done.stderr.strip()[-2000:]}")
    found = parse_ptxas(done.stdout + "\n" + done.stderr, demangle=False)
    if len(found) != 1:
        raise RuntimeError(f"ptxas reported {len(found)} kernels, expected 1")
    return found[0]


def ptxas_cached(ptx: str, arch: str, capability: int):
    """`ptxas_resources`, remembered on disk beside Triton's own cache (which keeps the compiled
    kernel, but not what ptxas says about its registers and spills): a second sweep, or a
    second test run, then pays only for kernels whose PTX changed."""
    import triton   # an optional dependency: the sweep needs it, the library does not

    key = hashlib.sha256("\0".join((triton.__version__, triton_ptxas(capability), arch, ptx)).encode())
    try:
        folder = os.path.join(triton.knobs.cache.dir, "compile_sweep")
    except AttributeError:  # a Triton without knobs: its default cache folder
        folder = os.environ.get("TRITON_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".triton", "cache"))
    path = os.path.join(folder, f"{key.hexdigest()}.json")
    try:
        with open(path) as f:
            return KernelResources(**json.load(f))
    except (OSError, ValueError, TypeError):
        pass
    found = ptxas_resources(ptx, arch, capability)
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as tmp:
            json.dump(dataclasses.asdict(found), tmp)
        os.replace(tmp.name, path)    # whole or absent, even with two sweeps writing at once
    except OSError:
        pass                        # a read-only cache folder: sweep without remembering
    return found


def compile_kernel(kernel: str, head_dim: int, config: tuple, target: str, dtype: str = "bf16",
                   causal: bool = True):
    """Triton's compiled kernel for one config and target."""
    tf = _triton_module()
    import triton   # an optional dependency, as above
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    block_m, block_n, warps, stages = config
    fn = {"fwd": tf.attn_fwd, "bwd_dkdv": tb.attn_bwd_dkdv, "bwd_dq": tb.attn_bwd_dq}[kernel]
    consts = dict(D=head_dim, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    consts.update(_unit_strides(fn))
    signature, attrs = _signature(fn, consts, dtype)
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    capability = limits(target).capability[0] * 10 + limits(target).capability[1]
    return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                          options=dict(num_warps=warps, num_stages=stages))


def compile_triton(kernel: str, head_dim: int, config: tuple, target: str, dtype: str = "bf16",
                   causal: bool = True) -> Row:
    """Compile one Triton kernel at one config for ``target``: its row.

    ``kernel``: "fwd", "bwd_dkdv" or "bwd_dq"; ``config``: (BLOCK_M, BLOCK_N, num_warps,
    num_stages).
    """
    _triton_module()   # says why not, where these kernels cannot be compiled here (not a row)
    block_m, block_n, warps, stages = config
    element_size = TORCH_DTYPES[dtype].itemsize
    estimate = configs.shared_memory_estimate(block_m, block_n, stages, head_dim, element_size, kernel=kernel)
    arch = limits(target)
    threads = 32 * warps
    kept = config in [tuple(c) for c in configs.fitting_configs(
        configs.GPU_CONFIGS, 1 << 16, head_dim, element_size,
        arch.max_shared_mem_per_block, kernel=kernel, capability=arch.capability)]
    row = Row(kernel=f"triton {kernel}", target=target, dtype=dtype, head_dim=head_dim,
              config=dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages),
              registers=None, shared_bytes=None, spills=None, fits=None, kept=kept,
              estimate_bytes=estimate, threads=threads)
    try:
        capability = arch.capability[0] * 10 + arch.capability[1]
        compiled = compile_kernel(kernel, head_dim, config, target, dtype, causal)
        shared = int(compiled.metadata.shared)
        resources = ptxas_cached(compiled.asm["ptx"], f"sm_{capability}a" if capability >= 90 else f"sm_{capability}",
                                  capability)
        row.registers = resources.registers
        row.shared_bytes = shared + resources.shared_bytes
        row.spills = resources.spill_store_bytes + resources.spill_load_bytes
        row.fits = fits(target, row.shared_bytes, row.registers, threads)
    except Exception as err:  # a config the compiler refuses is a row too, with its reason
        row.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        row.fits = False
    return row


def triton_jobs(head_dims: Optional[Iterable[int]] = None, kernels: Iterable[str] = configs.KERNELS):
    """(kernel, head_dim, config) for every config the autotuner may try."""
    _triton_module()   # says why not, where these kernels cannot be compiled here
    dims = list(head_dims) if head_dims is not None else list(configs.PADDED_HEAD_DIMS)
    return [(k, d, tuple(c)) for k in kernels for d in dims for c in configs.GPU_CONFIGS]


# --------------------------------------------------------------------------------- CUDA

def cuda_rows(target: str) -> list[Row]:
    """Every instantiation of the hand-written kernels, from nvcc (RuntimeError without it)."""
    rows = []
    for k in cuda_flash.kernel_resources(target):
        version, dtype, head_dim = parse_instance(k.name)
        cfg = cuda_flash.launch_config(version, head_dim)
        rows.append(Row(kernel=f"cuda_{version}", target=k.arch, dtype=dtype, head_dim=head_dim,
                        config=dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, threads=cfg.threads),
                        registers=k.registers, shared_bytes=k.total_shared_bytes,
                        spills=k.spill_store_bytes + k.spill_load_bytes,
                        fits=fits(target, k.total_shared_bytes, k.registers, cfg.threads),
                        kept=True, threads=cfg.threads))
    return rows


# --------------------------------------------------------------------------------- all of it

def build(target: str, dtype: str = "bf16", head_dims: Optional[Sequence[int]] = None,
          kernels: Sequence[str] = configs.KERNELS, jobs: Optional[Sequence[tuple]] = None,
          cuda: bool = True, progress=None) -> list[Row]:
    """The sweep's rows for ``target``, in this process (which must not interpret Triton)."""
    limits(target)
    todo = list(jobs) if jobs is not None else triton_jobs(head_dims, kernels)
    rows = []
    for i, (kernel, head_dim, config) in enumerate(todo, 1):
        rows.append(compile_triton(kernel, head_dim, tuple(config), target, dtype))
        if progress is not None:
            print(f"[{i}/{len(todo)}] {describe(rows[-1])}", file=progress, flush=True)
    if cuda:
        if nvcc_available():
            rows.extend(cuda_rows(target))
        elif progress is not None:
            print("nvcc not found: the CUDA kernels are not in this sweep", file=progress, flush=True)
    return rows


def sweep_configs(target: str, dtype: str = "bf16", jobs: Optional[Sequence[tuple]] = None,
          cuda: bool = True, timeout: float = 1800) -> list[dict]:
    """The sweep's rows as dicts, from a subprocess when this process interprets Triton."""
    if _compiles_here():
        return [r.as_dict() for r in build(target, dtype, jobs=jobs, cuda=cuda)]
    args = [sys.executable, "-m", "kernels.triton.compile_sweep", "--target", target, "--dtype", dtype, "--json"]
    if not cuda:
        args.append("--no-cuda")
    if jobs is not None:
        args += ["--jobs", json.dumps([[k, d, list(c)] for k, d, c in jobs])]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"compile sweep for {target} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def describe(row: Row) -> str:
    cfg = row.config
    tile = (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}" if "num_warps" in cfg
            else f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} t{cfg['threads']}")
    if row.error:
        return f"{row.kernel:<16} {row.target} D={row.head_dim:<3} {tile:<18} failed: {row.error}"
    assert row.shared_bytes is not None, "a row without an error was compiled, so its shared memory is known"
    est = "" if row.estimate_bytes is None else f" est {row.estimate_bytes / 1024:6.1f} KiB"
    return (f"{row.kernel:<16} {row.target} {row.dtype} D={row.head_dim:<3} {tile:<18} "
            f"regs {row.registers:>3}  smem {row.shared_bytes / 1024:6.1f} KiB{est}  spills {row.spills:>4} B  "
            f"{'fits' if row.fits else 'DOES NOT FIT'}  {'kept' if row.kept else 'pruned'}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernels.triton.compile_sweep",
                                description="Compile every Triton config and CUDA kernel for a GPU target "
                                            "(no GPU needed) and report registers, shared memory, spills.")
    p.add_argument("--target", default="sm_90", choices=TARGETS)
    p.add_argument("--dtype", default="bf16", choices=SWEPT_DTYPES)
    p.add_argument("--json", action="store_true", help="print a JSON list of objects instead of a table")
    p.add_argument("--head-dim", type=int, nargs="+", help="padded head dims (default: all, 16..256)")
    p.add_argument("--kernels", nargs="+", choices=configs.KERNELS, default=list(configs.KERNELS))
    p.add_argument("--no-cuda", action="store_true", help="leave out the CUDA kernels")
    p.add_argument("--jobs", help=argparse.SUPPRESS)  # JSON [[kernel, head_dim, [m, n, w, s]], ...]
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if not _compiles_here():
        # TRITON_INTERPRET=1 makes @triton.jit interpret: start again without it.
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        return subprocess.run([sys.executable, "-m", "kernels.triton.compile_sweep", *argv], env=env).returncode
    jobs = [(k, d, tuple(c)) for k, d, c in json.loads(args.jobs)] if args.jobs else None
    rows = build(args.target, args.dtype, head_dims=args.head_dim, kernels=args.kernels, jobs=jobs,
                 cuda=not args.no_cuda, progress=None if args.json else sys.stderr)
    if args.json:
        json.dump([r.as_dict() for r in rows], sys.stdout, indent=1)
        print()
    else:
        bad = [r for r in rows if r.kept and (not r.fits or r.spills)]
        print(f"{len(rows)} kernels for {args.target}; {sum(bool(r.kept) for r in rows)} kept by the pruning; "
              f"{len(bad)} kept that do not fit or spill")
    return 0


if __name__ == "__main__":
    sys.exit(main())

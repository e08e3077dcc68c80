"""Chapter 5: FlashAttention written by hand in CUDA, built on first use.

Two kernels in ``kernels/cuda/csrc/``: ``cuda_v1`` (``flash_v1.cu``), the algorithm in plain
CUDA on CUDA cores, and ``cuda_v2`` (``flash_v2.cu``), FlashAttention-2 on tensor cores
(``mma.sync``). Both take grouped-query K/V heads and Sq != Sk (causal aligned bottom-right).
The kernels are torch-free behind a small launcher (``flash_api.h``); ``binding.cpp`` is the
only file that sees torch. ``torch.utils.cpp_extension.load`` builds the extension the first
time a kernel is called, so importing this module never compiles anything.

Also here: each kernel's launch configuration (``launch_config``, the formulas of
``flash_api.h``; ``launch_configs`` shows both for one shape) and ``kernel_resources(archs)``, ptxas' registers, shared memory and spills of
every instantiation completed with its launch, which needs ``nvcc`` but no GPU.
"""
from __future__ import annotations

import functools
import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

import torch

from kernels.cuda.ptxas import KernelResources, compile_cuda, nvcc_available, nvcc_path, with_launch
from kernels.registry import CannotRun, Reason, cuda_reason, register, resolve_scale

CSRC = Path(__file__).resolve().parent / "csrc"
KERNEL_SOURCES = ("flash_v1.cu", "flash_v2.cu")  # torch-free: nvcc compiles them alone
EXTENSION_NAME = "attention_profiled_flash"
HEAD_DIMS = (64, 128)
# What torch.utils.cpp_extension adds to every nvcc call (torch 2.13): C++20, and half/bf16
# implicit conversions and operators switched off. Checking the kernels under the same flags
# means a compile that passes here also passes inside the extension build.
TORCH_STD = "c++20"
TORCH_NVCC_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr")
# What extension() adds on top. -lineinfo maps SASS back to source lines for profilers; it
# does not change the code ptxas generates.
EXTRA_CUDA_FLAGS = ("-O3", "-lineinfo")
V2_BLOCK_N = 64
V2_PAD = 8  # 16-bit elements added to every shared-memory row (conflict-free ldmatrix)


# ---- launch configuration (mirrors flash_api.h; a test compiles the header and compares) ----

@dataclass(frozen=True)
class LaunchConfig:
    threads: int          # threads per block
    block_m: int          # query rows per block
    block_n: int          # keys per shared-memory tile
    dynamic_shared_bytes: int
    heads_on_x: bool = False  # grid (B * H, query tiles) rather than (query tiles, B * H)

    def grid(self, batch: int, heads: int, seq_q: int) -> tuple[int, int, int]:
        """The launch grid for queries of ``seq_q`` positions (what a GPU trace shows)."""
        tiles = -(-seq_q // self.block_m)
        return (batch * heads, tiles, 1) if self.heads_on_x else (tiles, batch * heads, 1)


def v2_shared_bytes(head_dim: int, block_m: int = 128, double_buffer: bool = True) -> int:
    """v2's dynamic shared memory (flash_api.h ``v2_design_smem_bytes``): 16-bit rows of
    D + 8 elements, buffer 0 one K/V pair (128 rows), buffer 1 Q's ``block_m`` rows, grown to
    128 when double-buffered because odd key tiles then load there once Q is in registers."""
    kv_rows = 2 * V2_BLOCK_N
    buffer1 = max(block_m, kv_rows) if double_buffer else block_m
    return 2 * (kv_rows + buffer1) * (head_dim + V2_PAD)


def launch_config(version: str, head_dim: int) -> LaunchConfig:
    """How ``cuda_v1``/``cuda_v2`` launch for ``head_dim`` (the formulas of flash_api.h).

    v1 keeps fp32 tiles: Q [32][D], K [32][D+1], V [32][D], scores [32][33], 32 row factors;
    grid (query tiles, B * H).
    v2 keeps 16-bit tiles with rows padded by 8 elements, 128 query rows per block (one warp
    per 16), two K/V buffers of 64 + 64 rows, Q passing through the second; grid
    (B * H, query tiles).
    """
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if version in ("v1", "cuda_v1"):
        m = n = 32
        floats = m * head_dim + n * (head_dim + 1) + n * head_dim + m * (n + 1) + m
        return LaunchConfig(threads=128, block_m=m, block_n=n, dynamic_shared_bytes=4 * floats)
    if version in ("v2", "cuda_v2"):
        m = 128
        return LaunchConfig(threads=32 * m // 16, block_m=m, block_n=V2_BLOCK_N,
                            dynamic_shared_bytes=v2_shared_bytes(head_dim, m), heads_on_x=True)
    raise ValueError(f"version must be 'v1' or 'v2', got {version!r}")


def launch_configs(batch: int, heads: int, seq: int, head_dim: int):
    """Both kernels' launches for one shape, side by side: block, warps, tile sizes, grid."""
    import pandas as pd

    rows = {}
    for version in ("v1", "v2"):
        cfg = launch_config(version, head_dim)
        grid = cfg.grid(batch, heads, seq)
        rows[version] = {"threads per block": cfg.threads, "warps per block": cfg.threads // 32,
                         "query rows per block (BLOCK_M)": cfg.block_m, "keys per tile (BLOCK_N)": cfg.block_n,
                         "grid (x, y)": "(B·H, query tiles)" if cfg.heads_on_x else "(query tiles, B·H)",
                         f"grid at B={batch} H={heads} S={seq}": f"{grid[0]} × {grid[1]}",
                         "blocks": grid[0] * grid[1], "dynamic shared memory (B)": cfg.dynamic_shared_bytes}
    return pd.DataFrame(rows)


_KERNEL_NAME = re.compile(r"flash_(v\d)_kernel<[^,>]+,\s*(\d+)>")


@functools.lru_cache(maxsize=32)
def _compile(source: str, digest: str, archs: tuple, defines: tuple, nvcc: str):
    # Keyed by the file's contents and the compiler, so an edited kernel compiles again.
    return compile_cuda(CSRC / source, list(archs), (*EXTRA_CUDA_FLAGS, *TORCH_NVCC_FLAGS, *defines),
                        TORCH_STD, keep_ptx=True)


def compile_sources(archs: Iterable[str], sources: Iterable[str] = KERNEL_SOURCES,
                    defines: Iterable[str] = ()) -> dict:
    """``{file: ptxas.Compiled}`` (kernels, PTX per arch, object code) for files of csrc,
    under the extension build's flags.

    One nvcc call per file for all ``archs`` (files side by side: nvcc is single-threaded),
    remembered for the process, so the chapter and the tests that read the same compile pay
    for it once. RuntimeError without nvcc.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("compiling the CUDA kernels needs the CUDA compiler nvcc; none is on PATH "
                           "(nor under CUDA_HOME/CUDA_PATH)")
    archs, sources, defines = tuple(archs), tuple(sources), tuple(defines)
    digests = {s: hashlib.sha256((CSRC / s).read_bytes() + (CSRC / "flash_api.h").read_bytes()).hexdigest()
               for s in sources}
    with ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
        done = list(pool.map(lambda s: _compile(s, digests[s], archs, defines, nvcc), sources))
    return dict(zip(sources, done))


def kernel_resources(arch: Union[str, Iterable[str]] = "sm_80") -> list[KernelResources]:
    """ptxas' resources of every kernel instantiation, completed with its launch config.

    Needs nvcc (not a GPU); RuntimeError without it. Each ``name`` reads like
    ``flash_v2_kernel<__half, 128>`` (element type, head_dim).
    """
    archs = [arch] if isinstance(arch, str) else list(arch)
    kernels = []
    for compiled in compile_sources(archs).values():
        for kernel in compiled.kernels:
            m = _KERNEL_NAME.search(kernel.name)
            if m:
                cfg = launch_config(m.group(1), int(m.group(2)))
                kernel = with_launch(kernel, cfg.threads, cfg.dynamic_shared_bytes)
            kernels.append(kernel)
    return kernels


# ---- can it run here? ------------------------------------------------------------------

def _toolchain_reason(device: torch.device) -> Reason:
    reason = cuda_reason(device)
    if reason:
        return reason
    if torch.version.cuda is None:
        return ("needs a CUDA build of PyTorch to compile its extension; this torch is "
                f"CPU-only (torch {torch.__version__}, torch.version.cuda is None)")
    return build_tools_reason()


def build_tools_reason() -> Reason:
    """What building the extension on first use needs besides CUDA torch: nvcc, and ninja
    (torch.utils.cpp_extension.load builds with it; Colab's runtime has no ninja)."""
    from torch.utils.cpp_extension import is_ninja_available

    if not nvcc_available():
        return "builds its extension with nvcc on first use, and no nvcc is on PATH or in CUDA_HOME"
    if not is_ninja_available():
        return "builds its extension with ninja on first use, and ninja is not installed (pip install ninja)"
    return None


def requires_v1(device: torch.device) -> Reason:
    return _toolchain_reason(torch.device(device))


def requires_v2(device: torch.device) -> Reason:
    device = torch.device(device)
    reason = _toolchain_reason(device)
    if reason:
        return reason
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return (f"needs compute capability 8.0 (Ampere) or newer for bf16 mma.sync and "
                f"cp.async; this GPU is sm_{major}{minor}")
    return None


# ---- build on first use ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def extension():
    """The compiled extension module (built once, then loaded from the cache)."""
    from torch.utils.cpp_extension import load

    sources = [str(CSRC / "binding.cpp")] + [str(CSRC / s) for s in KERNEL_SOURCES]
    try:
        return load(name=EXTENSION_NAME, sources=sources, extra_include_paths=[str(CSRC)],
                    extra_cuda_cflags=list(EXTRA_CUDA_FLAGS), verbose=False)
    except (RuntimeError, OSError, ImportError) as err:
        # torch's message carries the compiler's own output; keep all of it.
        raise RuntimeError(f"building the CUDA attention extension from {CSRC} failed:\n{err}") from err


def allocate_output(q: torch.Tensor) -> torch.Tensor:
    """The output buffer, [B, H, S, D] contiguous like q. Tests patch this to poison it."""
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _reason_or_raise(name: str, reason: Reason) -> None:
    # The registry checks this before calling; checked again for direct calls of the functions.
    if reason is not None:
        raise CannotRun(f"{name}: {reason}")


# Both kernels read K/V head h / (Hq / Hkv) for query head h (grouped-query attention without
# repeating K/V) and take Sq != Sk, causal aligned bottom-right (flash_api.h, visible()).
@register("cuda_v1", order=70, requires=requires_v1, head_dims=HEAD_DIMS,
          dtypes=(torch.float16, torch.bfloat16, torch.float32))
def cuda_v1(q, k, v, causal=True, scale=None):
    """Hand-written tiled FlashAttention forward in CUDA (CUDA cores, fp32 math)."""
    _reason_or_raise("cuda_v1", requires_v1(q.device))
    out = allocate_output(q)
    extension().forward_v1(q, k, v, out, bool(causal), resolve_scale(scale, q.shape[-1]))
    return out


@register("cuda_v2", order=71, requires=requires_v2, head_dims=HEAD_DIMS,
          dtypes=(torch.float16, torch.bfloat16))
def cuda_v2(q, k, v, causal=True, scale=None):
    """Hand-written FlashAttention-2 forward in CUDA on tensor cores (mma.sync, fp16/bf16)."""
    _reason_or_raise("cuda_v2", requires_v2(q.device))
    out = allocate_output(q)
    extension().forward_v2(q, k, v, out, bool(causal), resolve_scale(scale, q.shape[-1]))
    return out


"""Chapter 5: FlashAttention written by hand in CUDA, built on first use.

Two kernels, two steps of the same idea (``kernels/csrc/``):

* ``cuda_v1`` (``flash_v1.cu``): the algorithm in plain CUDA. A block owns 32 query rows,
  streams K and V through shared memory in tiles of 32 keys, keeps a running softmax per
  row, and accumulates in fp32 on CUDA cores. Readable, correct, slow.
* ``cuda_v2`` (``flash_v2.cu``): FlashAttention-2 on tensor cores. ``mma.sync`` fragments
  in registers, P fed from the score accumulators straight back into the second matmul,
  16-byte asynchronous copies, key tiles above the causal diagonal skipped entirely.

The kernels are torch-free: a small launcher takes raw pointers, sizes, element strides
and a CUDA stream (``flash_api.h``). ``binding.cpp`` is the only file that sees torch; it
checks the tensors and passes torch's current stream. ``torch.utils.cpp_extension.load``
compiles the three files the first time a kernel is called (a minute or two) and caches
the result (under ``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), so
importing this module never compiles anything and never fails.

The compiler's view of each kernel (registers, shared memory, spills) needs only ``nvcc``,
not a GPU: ``kernel_report("sm_80")`` compiles the kernels alone and adds what only the
launchers know (threads per block, dynamic shared memory), which is everything occupancy
needs.
"""
from __future__ import annotations

import functools
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

import torch

from .ptxas import KernelResources, compile_report, nvcc_available, with_launch
from .registry import CannotRun, Reason, needs_cuda, register, resolve_scale

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


# ---- launch configuration (mirrors flash_api.h; a test compiles the header and compares) ----

@dataclass(frozen=True)
class LaunchConfig:
    threads: int          # threads per block
    block_m: int          # query rows per block (grid.x = ceil(S / block_m), grid.y = B * H)
    block_n: int          # keys per shared-memory tile
    dynamic_shared_bytes: int


def launch_config(version: str, head_dim: int) -> LaunchConfig:
    """How ``cuda_v1``/``cuda_v2`` launch for ``head_dim`` (the formulas of flash_api.h).

    v1 keeps fp32 tiles: Q [32][D], K [32][D+1], V [32][D], scores [32][33], 32 row factors.
    v2 keeps 16-bit tiles with rows padded by 8 elements: Q, K, V of 64 x (D + 8).
    """
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if version in ("v1", "cuda_v1"):
        m = n = 32
        floats = m * head_dim + n * (head_dim + 1) + n * head_dim + m * (n + 1) + m
        return LaunchConfig(threads=128, block_m=m, block_n=n, dynamic_shared_bytes=4 * floats)
    if version in ("v2", "cuda_v2"):
        m = n = 64
        return LaunchConfig(threads=128, block_m=m, block_n=n,
                            dynamic_shared_bytes=2 * (m + 2 * n) * (head_dim + 8))
    raise ValueError(f"version must be 'v1' or 'v2', got {version!r}")


_KERNEL_NAME = re.compile(r"flash_(v\d)_kernel<[^,>]+,\s*(\d+)")


def kernel_report(arch: Union[str, Iterable[str]] = "sm_80") -> list[KernelResources]:
    """ptxas' resources of every kernel instantiation, completed with its launch config.

    Needs nvcc (not a GPU); RuntimeError without it. Each ``name`` reads like
    ``flash_v2_kernel<__half, 128>`` (element type, head_dim).
    """
    archs = [arch] if isinstance(arch, str) else list(arch)
    # nvcc is single-threaded: compile the two files side by side.
    with ThreadPoolExecutor(max_workers=len(KERNEL_SOURCES)) as pool:
        per_file = list(pool.map(lambda s: compile_report(CSRC / s, archs, TORCH_NVCC_FLAGS, TORCH_STD),
                                 KERNEL_SOURCES))
    report = []
    for kernel in (k for kernels in per_file for k in kernels):
        m = _KERNEL_NAME.search(kernel.name)
        if m:
            cfg = launch_config(m.group(1), int(m.group(2)))
            kernel = with_launch(kernel, cfg.threads, cfg.dynamic_shared_bytes)
        report.append(kernel)
    return report


# ---- can it run here? ------------------------------------------------------------------

def _toolchain_reason(device: torch.device) -> Reason:
    reason = needs_cuda(device)
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
                    extra_cuda_cflags=["-O3", "-lineinfo"], verbose=False)
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


# The kernels take one shape for q, k and v: no grouped-query heads, no Sq != Sk. The registry
# refuses those up front, in words, before anything is built.
@register("cuda_v1", order=70, requires=requires_v1, head_dims=HEAD_DIMS,
          dtypes=(torch.float16, torch.bfloat16, torch.float32), gqa=False, unequal_lengths=False)
def cuda_v1(q, k, v, causal=True, scale=None):
    """Hand-written tiled FlashAttention forward in CUDA (CUDA cores, fp32 math)."""
    _reason_or_raise("cuda_v1", requires_v1(q.device))
    out = allocate_output(q)
    extension().forward_v1(q, k, v, out, bool(causal), resolve_scale(scale, q.shape[-1]))
    return out


@register("cuda_v2", order=71, requires=requires_v2, head_dims=HEAD_DIMS,
          dtypes=(torch.float16, torch.bfloat16), gqa=False, unequal_lengths=False)
def cuda_v2(q, k, v, causal=True, scale=None):
    """Hand-written FlashAttention-2 forward in CUDA on tensor cores (mma.sync, fp16/bf16)."""
    _reason_or_raise("cuda_v2", requires_v2(q.device))
    out = allocate_output(q)
    extension().forward_v2(q, k, v, out, bool(causal), resolve_scale(scale, q.shape[-1]))
    return out


__all__ = ["cuda_v1", "cuda_v2", "launch_config", "kernel_report", "allocate_output", "extension",
           "compile_report", "nvcc_available", "KernelResources", "LaunchConfig"]

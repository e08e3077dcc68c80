"""Chapter 3: ``F.scaled_dot_product_attention`` with its backend pinned.

SDPA picks a backend per call (flash, memory-efficient, cuDNN, or the math fallback).
Pinning one with ``sdpa_kernel`` makes each backend its own registry entry, so the
profiler can show what each one really launches. The support rules below mirror
PyTorch's own checks (aten sdp_utils) so a reader is told *why* before a call fails.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .registry import Reason, needs_cuda, register

BACKENDS = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
HALF = (torch.float16, torch.bfloat16)


def capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def device_reason(name: str, device: torch.device) -> Reason:
    """Why backend ``name`` cannot run on ``device`` at all (None if it can)."""
    if name == "sdpa_math":
        return None
    if name == "sdpa_flash" and device.type == "cpu":
        return None  # PyTorch ships a CPU flash kernel, and it is the CPU default
    if device.type == "cpu":
        label = {"sdpa_efficient": "memory-efficient", "sdpa_cudnn": "cuDNN"}[name]
        return (f"PyTorch has no CPU kernel for the {label} backend "
                "(on CPU, SDPA raises 'No viable backend'); it needs a CUDA GPU")
    reason = needs_cuda(device)
    if reason:
        return reason
    major, minor = capability(device)
    if name in ("sdpa_flash", "sdpa_cudnn") and major < 8:
        return (f"needs compute capability 8.0 (Ampere) or newer; this GPU is sm_{major}{minor}")
    if name == "sdpa_efficient" and major < 5:
        return f"needs compute capability 5.0 or newer; this GPU is sm_{major}{minor}"
    return None


def input_reason(name: str, q: torch.Tensor) -> Reason:
    """Why backend ``name`` cannot take these particular inputs on a GPU (None if it can)."""
    if q.device.type != "cuda" or name == "sdpa_math":
        return None
    d = q.shape[-1]
    if name in ("sdpa_flash", "sdpa_cudnn") and q.dtype not in HALF:
        return f"takes float16 or bfloat16 on a GPU, got {q.dtype}"
    if name == "sdpa_flash" and d > 256:
        return f"supports head_dim <= 256, got {d}"
    if name == "sdpa_cudnn":
        limit = 256 if capability(q.device)[0] >= 9 else 128
        if d > limit:
            return f"supports head_dim <= {limit} on this GPU, got {d}"
    if name == "sdpa_efficient" and q.dtype in HALF and d % 8:
        return f"needs head_dim to be a multiple of 8 for 16-bit inputs, got {d}"
    return None


def pinned(name: str):
    """The registry function for one backend: SDPA under ``sdpa_kernel(backend)``."""
    backend = BACKENDS[name]

    def attention(q, k, v, causal=True, scale=None):
        reason = input_reason(name, q)
        if reason:
            raise RuntimeError(f"{name}: {reason}")
        try:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        except RuntimeError as err:
            # PyTorch's own refusal; keep its words but say which pinned backend refused.
            raise RuntimeError(f"{name}: PyTorch refused these inputs: {err}") from err

    attention.__name__ = name
    attention.__doc__ = f"F.scaled_dot_product_attention pinned to SDPBackend.{backend.name}."
    return attention


for _order, _name in enumerate(BACKENDS):
    register(_name, order=30 + _order, requires=lambda device, n=_name: device_reason(n, device))(pinned(_name))


def probe(q, k, v, causal: bool = True) -> dict[str, Reason]:
    """Try every backend on these inputs: ``{name: None}`` if it ran, else PyTorch's reason."""
    from .registry import get

    result = {}
    for name in BACKENDS:
        try:
            get(name)(q, k, v, causal=causal)
            result[name] = None
        except RuntimeError as err:
            result[name] = str(err)
    return result


def default_backend_name(q, k, v, causal: bool = True) -> str:
    """Which backend SDPA picks unpinned, as the first in its priority order that works here."""
    order = torch._fused_sdp_choice(q, k, v, is_causal=causal)
    return {b.value: n for n, b in BACKENDS.items()}.get(order, f"backend #{order}")

"""Chapter 3: ``F.scaled_dot_product_attention`` with its backend pinned.

SDPA picks a backend per call (flash, memory-efficient, cuDNN, or the math fallback).
Pinning one with ``sdpa_kernel`` makes each backend its own registry entry, so the
profiler can show what each one really launches. The support rules below mirror
PyTorch's own checks (aten sdp_utils) so a reader is told *why* before a call fails.

Two more things chapter 3 reads from here:

- ``math_decomposed(q, k, v)``: what the math backend runs, written out in Python one
  ATen op per line (fp32 upcast, scaling, a causal mask rebuilt on every call, the
  NaN-guarded ``safe_softmax``). It returns the math backend's output bit for bit, so
  the ops in its source are the ops in the math backend's trace.
- ``ARTICLE_A100_KERNELS``: the fused kernels the source article's A100 traces show, so
  the chapter can decode them with ``kernels.fingerprints`` even on a machine without a GPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .registry import Reason, check_inputs, needs_cuda, register, resolve_scale

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


# The one fused kernel per forward that each backend launched in the source article's traces
# ("Profiling in PyTorch (Part 3)", Hugging Face blog, one A100-SXM4-80GB, bf16). The flash
# name is shortened where the article's screenshot shows a long template argument list.
ARTICLE_A100_KERNELS = {
    "sdpa_efficient": "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
    "sdpa_flash": "void pytorch_flash::flash_fwd_kernel<...>",
    "sdpa_cudnn": "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64"
                  "_4x1x1_cga1x1x1_kernel0_0",
}


def safe_softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim`` that gives 0, not NaN, on a slice where every score is -inf.

    A plain softmax of a fully masked row computes exp(-inf) / sum(exp(-inf)) = 0 / 0.
    ATen's ``_safe_softmax`` (what the math backend calls) adds two guard passes over the
    scores, ``isneginf`` and ``all``, and a ``where`` that zeroes those rows: three more
    full passes over an S x S tensor, i.e. more kernels on a GPU.
    """
    probs = torch.softmax(scores, dim)
    fully_masked = torch.isneginf(scores).all(dim, keepdim=True)
    return torch.where(fully_masked, 0.0, probs)


def math_decomposed(q, k, v, causal: bool = True, scale=None) -> torch.Tensor:
    """SDPA's math backend written out op by op (ATen ``_scaled_dot_product_attention_math``).

    Same ops, same order, same result bit for bit; each comment says what it costs.
    """
    check_inputs(q, k, v, name="math_decomposed")
    out_dtype = q.dtype
    if out_dtype in HALF:
        # Accuracy first: 16-bit inputs are upcast to fp32, so on a GPU both matmuls run as
        # fp32 GEMMs on CUDA cores ("sgemm") instead of bf16 tensor-core ones ("s16816").
        q, k, v = q.float(), k.float(), v.float()
    # The scale is split in two square roots, one on q and one on k, to keep the products small.
    root = math.sqrt(resolve_scale(scale, q.shape[-1]))
    q = q * root
    bias = None
    if causal:
        # Rebuilt on every call: ones -> tril -> where (0 where allowed, -inf above the diagonal).
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        bias = torch.where(allowed, 0.0, float("-inf")).to(q.dtype)
    scores = q @ (k.transpose(-2, -1) * root)
    if bias is not None:
        scores.add_(bias)
    probs = safe_softmax(scores, -1)
    return (probs @ v).to(out_dtype)

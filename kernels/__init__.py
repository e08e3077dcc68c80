"""Attention, Profiled: every attention implementation of the course behind one registry.

    import kernels
    out = kernels.get("inplace")(q, k, v, causal=True)   # q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]
    kernels.names()          # registered names, in teaching order
    kernels.available("cpu") # {name: None if it runs here, else the reason in words}

Causal attention is aligned bottom-right (query i sees keys j <= i + Sk - Sq); Hq is a
multiple of Hkv (grouped-query attention). Calling an implementation that cannot run here
raises ``kernels.CannotRun`` (a RuntimeError) with the same words ``available`` gives.

Importing never needs a GPU, a compiler or a particular SDPA backend: each implementation
says what it lacks only when asked (``available``) or called. Where no CUDA GPU is visible,
importing sets ``TRITON_INTERPRET=1`` for the process (unless it is set already), so that the
Triton kernels, and any a reader defines afterwards, run in Triton's interpreter on CPU
tensors (``kernels.triton``); where a GPU is visible it sets nothing.
"""
from kernels import reference
from kernels.registry import CannotRun, available, check_inputs, get, implementation, names, register

# Each module registers its implementations on import, in the order of the chapters.
from kernels.attention import naive
from kernels.attention import inplace
from kernels.attention import sdpa
from kernels.triton import flash as triton_flash
from kernels.cuda import flash as cuda_flash
from kernels.attention import torch_compile

__all__ = ["CannotRun", "available", "check_inputs", "get", "implementation", "names", "reference", "register"]

"""Attention, Profiled: every attention implementation of the course behind one registry.

    import kernels
    out = kernels.get("inplace")(q, k, v, causal=True)   # q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]
    kernels.names()          # registered names, in teaching order
    kernels.available("cpu") # {name: None if it runs here, else the reason in words}

Causal attention is aligned bottom-right (query i sees keys j <= i + Sk - Sq); Hq is a
multiple of Hkv (grouped-query attention). Calling an implementation that cannot run here
raises ``kernels.CannotRun`` (a RuntimeError) with the same words ``available`` gives.

Importing never needs a GPU, a compiler or a particular SDPA backend: each implementation
says what it lacks only when asked (``available``) or called. The one thing importing changes:
on a machine without a GPU, with TRITON_INTERPRET unset, it sets TRITON_INTERPRET=1, because
Triton fixes its interpreter mode for the whole process when it is first imported.
"""
from . import reference
from .registry import CannotRun, available, check_inputs, get, implementation, names, register

# Each module registers its implementations on import, in the order of the chapters.
# triton_flash comes with the rest, not later: on a machine without a GPU it must choose
# Triton's interpreter before anything imports Triton, and torch itself imports Triton the
# first time some ops run (torch 2.13's torch._native.ops); see kernels/triton_flash.py.
from . import naive, inplace, sdpa, triton_flash, cuda_flash, compiled  # noqa: E402,F401  (imported for their registrations)

__all__ = ["CannotRun", "available", "check_inputs", "get", "implementation", "names", "reference", "register"]

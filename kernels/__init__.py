"""Attention, Profiled: every attention implementation of the course behind one registry.

    import kernels
    out = kernels.get("inplace")(q, k, v, causal=True)   # q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]
    kernels.names()          # registered names, in teaching order
    kernels.available("cpu") # {name: None if it runs here, else the reason in words}
    with kernels.registered("mine", my_attention, order=99):   # yours, for the length of a block
        kernels.get("mine")(q, k, v)

Causal attention is aligned bottom-right (query i sees keys j <= i + Sk - Sq); Hq is a
multiple of Hkv (grouped-query attention). Calling an implementation that cannot run here
raises ``kernels.CannotRun`` (a RuntimeError) with the same words ``available`` gives.

Importing is cheap and never needs a GPU, a compiler or a particular SDPA backend: the
registry (and torch with it) is imported on first use of the names below, and each
implementation says what it lacks only when asked (``available``) or called. Without a CUDA
GPU, importing ``kernels.triton`` (which ``get`` does) sets ``TRITON_INTERPRET=1`` for the
process, so the course's Triton kernels, and any defined after it, run in Triton's interpreter.
"""
import importlib
from typing import Any

__all__ = ["CannotRun", "available", "check_inputs", "get", "implementation", "names", "reference", "register",
           "registered"]


def __getattr__(name: str) -> Any:
    """The registry's API and ``reference``, imported when first asked for (PEP 562)."""
    if name == "reference":
        return importlib.import_module("kernels.reference")
    if name in __all__:
        return getattr(importlib.import_module("kernels.registry"), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")

"""Attention, Profiled: every attention implementation of the course behind one registry.

    import kernels
    out = kernels.get("inplace")(q, k, v, causal=True)   # q, k, v: [batch, heads, seq, head_dim]
    kernels.names()          # registered names, in teaching order
    kernels.available("cpu") # {name: None if it runs here, else the reason in words}

Importing never needs a GPU, a compiler or a particular SDPA backend: each
implementation says what it lacks only when asked (``available``) or called.
"""
from . import reference
from .registry import available, check_inputs, get, implementation, names, register

# Each module registers its implementations on import, in the order of the chapters.
from . import naive, inplace, sdpa, triton_flash, cuda_flash  # noqa: E402,F401  (imported for their registrations)

__all__ = ["available", "check_inputs", "get", "implementation", "names", "reference", "register"]

"""The registry: every attention implementation behind one call.

``kernels.get(name)(q, k, v, causal=True, scale=None)`` is the whole contract. The
registry owns what every implementation would otherwise repeat: input validation,
the default scale, and the "can this run here?" question, so that an implementation
module only holds the attention it teaches.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch

# A reason is a sentence for a reader ("needs a CUDA GPU; none is visible"), or None.
Reason = Optional[str]


@dataclass
class Implementation:
    name: str
    fn: Callable
    order: int
    requires: Callable[[torch.device], Reason]
    head_dims: Optional[tuple] = None
    dtypes: Optional[tuple] = None
    call: Callable = field(init=False, repr=False)


_REGISTRY: dict[str, Implementation] = {}


def _runs_anywhere(device: torch.device) -> Reason:
    return None


def register(name: str, *, order: int, requires: Callable[[torch.device], Reason] = _runs_anywhere,
             head_dims: Optional[Iterable[int]] = None, dtypes: Optional[Iterable[torch.dtype]] = None):
    """Decorator: add ``fn(q, k, v, causal, scale)`` to the registry under ``name``.

    ``order`` places it in teaching order, ``requires(device)`` returns why it cannot
    run on ``device`` (or None), ``head_dims``/``dtypes`` restrict what it accepts.
    The registered callable validates its inputs before ``fn`` sees them, and ``fn``
    always receives a float ``scale``.
    """

    def wrap(fn: Callable) -> Callable:
        impl = Implementation(name, fn, order, requires,
                              tuple(head_dims) if head_dims is not None else None,
                              tuple(dtypes) if dtypes is not None else None)

        @functools.wraps(fn)
        def call(q, k, v, causal: bool = True, scale: Optional[float] = None):
            check_inputs(q, k, v, name=name, head_dims=impl.head_dims, dtypes=impl.dtypes)
            reason = _why_not(impl, q.device)
            if reason is not None:
                raise RuntimeError(f"{name}: {reason}")
            if not isinstance(causal, bool):
                raise TypeError(f"{name}: causal must be a bool, got {type(causal).__name__}")
            return fn(q, k, v, causal=causal, scale=resolve_scale(scale, q.shape[-1]))

        impl.call = call
        _REGISTRY[name] = impl
        return fn

    return wrap


def get(name: str) -> Callable:
    """The registered attention ``fn(q, k, v, causal=True, scale=None)`` called ``name``."""
    try:
        return _REGISTRY[name].call
    except KeyError:
        raise KeyError(f"no attention implementation named {name!r}; "
                       f"registered: {', '.join(names())}") from None


def names() -> list[str]:
    """All registered names, in the order the course teaches them."""
    return [i.name for i in sorted(_REGISTRY.values(), key=lambda i: i.order)]


def available(device="cpu") -> dict[str, Reason]:
    """``{name: None}`` for what runs on ``device``, else ``{name: reason in words}``."""
    device = torch.device(device)
    return {n: (f"{n}: {r}" if (r := _why_not(_REGISTRY[n], device)) else None) for n in names()}


def _why_not(impl: Implementation, device: torch.device) -> Reason:
    if device.type == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"
    return impl.requires(device)


def implementation(name: str) -> Implementation:
    """The registry entry itself (its function, constraints and requirements)."""
    get(name)  # same KeyError as get()
    return _REGISTRY[name]


def resolve_scale(scale: Optional[float], head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_inputs(q, k, v, *, name: str = "attention", head_dims=None, dtypes=None) -> None:
    """Raise a clear TypeError/ValueError unless q, k, v are valid [B, H, S, D] inputs."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: {label} must have rank 4 [batch, heads, seq, head_dim], "
                             f"got rank {t.dim()} with shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: {label} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{name}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"{name}: q, k, v must have the same shape [batch, heads, seq, head_dim], "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, s, d = q.shape
    if min(b, h, s, d) < 1:
        raise ValueError(f"{name}: every dimension must be >= 1, got shape {tuple(q.shape)}")
    if head_dims is not None and d not in head_dims:
        raise ValueError(f"{name}: head_dim {d} is not supported; supported: {', '.join(map(str, head_dims))}")
    if dtypes is not None and q.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {q.dtype} is not supported; supported: "
                        f"{', '.join(str(t).replace('torch.', '') for t in dtypes)}")


def needs_cuda(device: torch.device) -> Reason:
    """The requirement of every GPU-only implementation."""
    if device.type != "cuda":
        return f"needs a CUDA GPU; the inputs are on {device.type}"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"
    return None

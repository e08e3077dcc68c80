"""The registry: every attention implementation behind one call.

``kernels.get(name)(q, k, v, causal=True, scale=None)`` is the whole contract. The
registry owns what every implementation would otherwise repeat: input validation,
the default scale, and the "can this run here?" question, so that an implementation
module only holds the attention it teaches.

Shapes: q is ``[B, Hq, Sq, D]``, k and v are ``[B, Hkv, Sk, D]``. ``Hq`` is a multiple of
``Hkv`` (grouped-query attention: query head ``h`` reads key/value head ``h // (Hq // Hkv)``),
and ``Sq`` may differ from ``Sk`` (decoding against a KV cache). ``causal=True`` is aligned
bottom-right: query ``i`` sees keys ``j <= i + Sk - Sq``, so the last query sees every key.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math
import numbers
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import torch


# A reason is a sentence for a reader ("needs a CUDA GPU; none is visible"), or None.
Reason = Optional[str]


class CannotRun(RuntimeError):
    """This implementation cannot run here (device, toolchain, backend); the message says why.

    A RuntimeError, so code written against the first version (``except RuntimeError``) still
    catches it. Input that is wrong everywhere is a ValueError or TypeError instead.
    """


def refuse_double_backward(name: str, why: str) -> None:
    """Call first in an autograd ``backward``: a backward asked to build a graph of its own
    (``create_graph=True``, for gradients of gradients) raises ``CannotRun`` saying ``why`` this
    implementation cannot, instead of failing later with a message that names neither."""
    if torch.is_grad_enabled():  # autograd enables grad inside a backward only for create_graph=True
        raise CannotRun(f"{name}: double backward (a backward with create_graph=True) is not supported: {why}; "
                        "use naive or sdpa_math for gradients of gradients")


@dataclass(frozen=True)
class Span:
    """The inclusive range ``lo..hi`` of head dims an implementation takes (``d in Span(1, 256)``)."""

    lo: int
    hi: int

    def __contains__(self, d) -> bool:
        return isinstance(d, int) and self.lo <= d <= self.hi

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi}"

    __repr__ = __str__


@dataclass
class Implementation:
    name: str
    fn: Callable
    order: int
    requires: Callable[[torch.device], Reason]
    head_dims: Optional[tuple | Span] = None
    dtypes: Optional[tuple] = None
    gqa: bool = True                # takes Hkv < Hq
    unequal_lengths: bool = True    # takes Sq != Sk
    materializes_scores: bool = False  # writes the S×S scores to memory (benchmarks charge the bytes)
    slow_on_cpu: bool = False       # correct on a CPU but no performance number there (interpreted,
                                    # or compiled per shape): sweeps leave it out unless named
    call: Callable = field(init=False, repr=False)


_REGISTRY: dict[str, Implementation] = {}


def _no_reason(device: torch.device) -> Reason:
    return None


def register(name: str, *, order: int, requires: Callable[[torch.device], Reason] = _no_reason,
             head_dims: Optional[Iterable[int] | Span] = None, dtypes: Optional[Iterable[torch.dtype]] = None,
             gqa: bool = True, unequal_lengths: bool = True, materializes_scores: bool = False,
             slow_on_cpu: bool = False):
    """Decorator: add ``fn(q, k, v, causal, scale)`` to the registry under ``name``.

    ``order`` places it in teaching order, ``requires(device)`` returns why it cannot
    run on ``device`` (or None), ``head_dims``/``dtypes`` restrict what it accepts, and
    ``gqa=False`` / ``unequal_lengths=False`` refuse Hkv < Hq / Sq != Sk up front.
    ``materializes_scores`` and ``slow_on_cpu`` are facts benchmarks read (see the fields).
    The registered callable validates its inputs before ``fn`` sees them, and ``fn``
    always receives a bool ``causal`` and a float ``scale``.
    """

    def wrap(fn: Callable) -> Callable:
        dims = head_dims if head_dims is None or isinstance(head_dims, Span) else tuple(head_dims)
        impl = Implementation(name, fn, order, requires, dims,
                              tuple(dtypes) if dtypes is not None else None, gqa, unequal_lengths,
                              materializes_scores, slow_on_cpu)

        @functools.wraps(fn)
        def call(q, k, v, causal: bool = True, scale: Optional[float] = None):
            check_inputs(q, k, v, name=name, head_dims=impl.head_dims, dtypes=impl.dtypes,
                         gqa=impl.gqa, unequal_lengths=impl.unequal_lengths)
            causal = resolve_causal(causal, name)
            scale = resolve_scale(scale, q.shape[-1], name)
            reason = _unavailable_reason(impl, q.device)
            if reason is not None:
                raise CannotRun(f"{name}: {reason}")
            try:
                return fn(q, k, v, causal=causal, scale=scale)
            except RuntimeError as err:
                if not is_out_of_memory(err):
                    raise
                same_kind = torch.OutOfMemoryError if isinstance(err, torch.OutOfMemoryError) else RuntimeError
                raise same_kind(out_of_memory_message(impl, q, k, err)) from err

        impl.call = call
        _REGISTRY[name] = impl
        return fn

    return wrap


@contextlib.contextmanager
def registered(name: str, fn: Callable, *, order: int, **options) -> Iterator[Callable]:
    """``fn`` registered under ``name`` (``register``'s options) for the length of a ``with``
    block, and the name free again after it: a test's stand-in, or an experiment in a notebook.
    Yields the registered callable, as ``get(name)`` returns it."""
    if name in _REGISTRY:
        raise ValueError(f"{name!r} is already registered; registered() adds a new name only")
    register(name, order=order, **options)(fn)
    try:
        yield get(name)
    finally:
        _REGISTRY.pop(name, None)


# The modules whose import registers the implementations. They import this module to call
# register(), so it cannot import them at its top: it imports them by name on first use, which
# keeps ``import kernels`` cheap (no torch, no Triton) for the trace tools.
IMPLEMENTATION_MODULES = ("kernels.attention.naive", "kernels.attention.inplace", "kernels.attention.sdpa",
                          "kernels.triton.flash", "kernels.cuda.flash", "kernels.attention.torch_compile")


def load_implementations() -> None:
    """Import every implementation module (each registers itself); cheap once they are imported."""
    for module in IMPLEMENTATION_MODULES:
        importlib.import_module(module)


def get(name: str) -> Callable:
    """The registered attention ``fn(q, k, v, causal=True, scale=None)`` called ``name``."""
    load_implementations()
    try:
        return _REGISTRY[name].call
    except (KeyError, TypeError):  # TypeError: an unhashable name, such as a list of names
        raise KeyError(f"no attention implementation named {name!r} (one name, a str); "
                       f"registered: {', '.join(names())}") from None


def names() -> list[str]:
    """All registered names, in the order the course teaches them."""
    load_implementations()
    return [i.name for i in sorted(_REGISTRY.values(), key=lambda i: i.order)]


def available(device="cpu") -> dict[str, Reason]:
    """``{name: None}`` for what runs on ``device``, else ``{name: reason in words}``."""
    device = as_device(device)
    load_implementations()
    return {n: (f"{n}: {r}" if (r := _unavailable_reason(_REGISTRY[n], device)) else None) for n in names()}


def as_device(device) -> torch.device:
    """``device`` as a torch.device, or a ValueError naming what was given ("gpu" is not one)."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{device!r} is not a device torch knows: give a torch.device or a string such as "
                         f"'cpu', 'cuda' or 'cuda:1' ({err})") from None


OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")


def is_out_of_memory(err: BaseException) -> bool:
    """torch's own OutOfMemoryError (an accelerator's), or the CPU allocator's RuntimeError."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and any(words in str(err).lower() for words in OUT_OF_MEMORY))


def out_of_memory_message(impl: Implementation, q, k, err: BaseException) -> str:
    """Which implementation ran out of memory, at what shapes, and what the S x S scores weigh there."""
    b, hq, sq, _ = q.shape
    sk = k.shape[2]
    gib = b * hq * sq * sk * q.element_size() / 2**30
    where = f"{impl.name}: out of memory on {q.device} at B={b}, Hq={hq}, Sq={sq}, Sk={sk} ({q.dtype}). "
    if impl.materializes_scores:
        advice = (f"It writes the S x S scores to memory: one B x Hq x Sq x Sk score matrix here is {gib:.1f} GiB, "
                  "and its softmax needs more of that size; try shorter sequences, a smaller batch, or an "
                  "implementation that does not materialise the scores (sdpa_flash, triton).")
    else:
        advice = (f"It does not write the S x S scores to memory (they would be {gib:.1f} GiB here); "
                  "try shorter sequences or a smaller batch.")
    return f"{where}{advice} The allocator said: {err}"


def _unavailable_reason(impl: Implementation, device: torch.device) -> Reason:
    return missing_device_reason(device) or impl.requires(device)


def missing_device_reason(device: torch.device) -> Reason:
    """Why no tensor can live on ``device`` in this process (None if it can).

    Checked for every implementation, so that even one that "runs anywhere" (naive) is not
    reported as running on an accelerator the machine does not have.
    """
    kind = device.type
    if kind in ("cpu", "meta"):
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"
        return None
    if kind == "mps":
        if not torch.backends.mps.is_available():
            return "needs an Apple MPS device; none is available (torch.backends.mps.is_available() is False)"
        return None
    is_available = getattr(getattr(torch, kind, None), "is_available", None)
    if not callable(is_available):
        return f"cannot tell whether a '{kind}' device is present (this PyTorch has no torch.{kind}.is_available)"
    if not is_available():
        return f"needs a '{kind}' device; none is available (torch.{kind}.is_available() is False)"
    return None


def implementation(name: str) -> Implementation:
    """The registry entry itself (its function, constraints and requirements)."""
    get(name)  # same KeyError as get()
    return _REGISTRY[name]


def _prefix(name: Optional[str]) -> str:
    return f"{name}: " if name else ""


def resolve_scale(scale, head_dim: int, name: Optional[str] = None) -> float:
    """``scale`` as a float (``1/sqrt(head_dim)`` for None). Any real number is taken
    (Python, NumPy or a one-element tensor's ``.item()``), bools are not."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, torch.Tensor)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{_prefix(name)}scale must be a real number or None, got "
                        f"{_type_name(scale)} {scale!r}")
    value = float(scale)
    if not math.isfinite(value):
        raise ValueError(f"{_prefix(name)}scale must be finite, got {value}")
    return value


def resolve_causal(causal, name: Optional[str] = None) -> bool:
    """``causal`` as a Python bool; NumPy's bool is taken, anything else (1, "yes") is refused."""
    if isinstance(causal, bool):
        return causal
    if type(causal).__module__ == "numpy" and type(causal).__name__ in ("bool", "bool_"):
        return bool(causal)
    raise TypeError(f"{_prefix(name)}causal must be True or False, got {_type_name(causal)} {causal!r}")


def _type_name(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_inputs(q, k, v, *, name: str = "attention", head_dims=None, dtypes=None,
                 gqa: bool = True, unequal_lengths: bool = True) -> None:
    """Raise a clear TypeError/ValueError unless q ``[B, Hq, Sq, D]``, k and v ``[B, Hkv, Sk, D]``
    are valid inputs (and within what this implementation takes)."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, label, name)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{name}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    _check_shapes(q, k, v, name)
    _check_limits(q, k, name, head_dims, dtypes, gqa, unequal_lengths)


def _check_tensor(t, label: str, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested:  # asking a nested tensor for its sizes crashes deep inside: refuse first
        raise TypeError(f"{name}: {label} is a nested tensor; the course's attention takes dense "
                        "[batch, heads, seq, head_dim] tensors (pad the sequences, or call "
                        "F.scaled_dot_product_attention directly)")
    if t.layout != torch.strided:
        raise TypeError(f"{name}: {label} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dim() != 4:
        raise ValueError(f"{name}: {label} must have rank 4 [batch, heads, seq, head_dim], "
                         f"got rank {t.dim()} with shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: {label} must be a floating-point tensor, got {t.dtype}")


def _check_shapes(q, k, v, name: str) -> None:
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape != v.shape:
        raise ValueError(f"{name}: k and v must have the same shape [batch, kv_heads, seq_k, head_dim], "
                         f"got {shapes}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{name}: q, k, v must have the same batch size, got {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{name}: q, k, v must have the same head_dim, got {shapes}")
    if min(*q.shape, *k.shape) < 1:
        raise ValueError(f"{name}: every dimension must be >= 1, got {shapes}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{name}: the number of query heads ({q.shape[1]}) must be a multiple of "
                         f"the number of key/value heads ({k.shape[1]}), got {shapes}")


def _check_limits(q, k, name, head_dims, dtypes, gqa, unequal_lengths) -> None:
    d = q.shape[-1]
    if head_dims is not None and d not in head_dims:
        listed = str(head_dims) if isinstance(head_dims, Span) else ", ".join(map(str, head_dims))
        raise ValueError(f"{name}: head_dim {d} is not supported; supported: {listed}")
    if dtypes is not None and q.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {q.dtype} is not supported; supported: "
                        f"{', '.join(str(t).replace('torch.', '') for t in dtypes)}")
    if not gqa and q.shape[1] != k.shape[1]:
        raise ValueError(f"{name}: grouped-query attention is not supported (q has {q.shape[1]} heads, "
                         f"k and v {k.shape[1]}); it needs as many key/value heads as query heads")
    if not unequal_lengths and q.shape[2] != k.shape[2]:
        raise ValueError(f"{name}: Sq != Sk is not supported (q has {q.shape[2]} positions, k and v "
                         f"{k.shape[2]}); it needs queries and keys of one length")


def cuda_reason(device: torch.device) -> Reason:
    """Why a GPU-only implementation cannot run on ``device``, or None."""
    if device.type != "cuda":
        return f"needs a CUDA GPU; the inputs are on {device.type}"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"
    return None


class LRU(OrderedDict):
    """A dict that keeps only its ``maxsize`` most recently used entries.

    The naive modules cache masks and modules per configuration; a plain dict would grow
    with every new sequence length or scale a caller tries.
    """

    def __init__(self, maxsize: int):
        super().__init__()
        self.maxsize = maxsize

    def get_or_make(self, key, make: Callable):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = self[key] = make()
        while len(self) > self.maxsize:
            self.popitem(last=False)
        return value

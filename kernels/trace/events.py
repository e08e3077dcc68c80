"""The events of a profiler trace file: reading it, its categories, the element types of its tensors.

``read_events(path)`` returns the raw Chrome trace JSON (plain or gzip); ``trace_events``,
``check_categories`` and ``device_properties`` take what ``kernels.trace.reader.Trace`` reads
from it; ``tensor_bytes``, ``is_contiguous`` and ``memory_layout`` read a recorded tensor's
shape, strides and type. The Kineto facts the reading relies on are listed below the imports.
"""
from __future__ import annotations

import ast
import gzip
import json
import math
import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional


# Trace facts this reader relies on (Kineto's Chrome export, torch 1.8 to 2.x):
#
# - ``cpu_op`` and ``user_annotation`` events are complete events (``ph: X``). Nesting is not
#   stored: it follows from time containment on one thread.
# - GPU work (``kernel``, ``gpu_memcpy``, ``gpu_memset``) runs on the GPU's own pid (the device)
#   and tid (the stream). It is linked to the runtime or driver call that launched it
#   (``cuda_runtime``: ``cudaLaunchKernel``, ``cudaMemcpyAsync``...; ``cuda_driver``:
#   ``cuLaunchKernel``, which Triton uses) by a flow arrow (``ac2g`` in torch 2.x; ``async_gpu``,
#   ``async_cpu_to_gpu`` or ``async`` in older Kineto) and by ``args.correlation``; flows where
#   present, the correlation id otherwise. An arrow is matched by its id (the launch's
#   correlation id), not by where it starts: two calls can start in the same microsecond.
# - In a training step the autograd engine launches the backward kernels from its own thread,
#   so the launch, not the step's thread, decides which step GPU work belongs to.
# - Kineto before torch 1.10 wrote capitalised categories (``Operator``, ``Kernel``,
#   ``Memcpy``, ``Memset``, ``Runtime``); they are read as their modern names.
# - ``[memory]`` instant events carry ``Bytes`` (+alloc / -free) and ``Total Allocated``.

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
FLOW_CATEGORIES = ("ac2g", "async_gpu", "async_cpu_to_gpu", "async")
PROFILER_STEP = "ProfilerStep#"
# Kineto before torch 1.10: the same events under capitalised category names.
LEGACY_CATEGORIES = {"Operator": "cpu_op", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
                     "Runtime": "cuda_runtime", "Driver": "cuda_driver", "User Annotation": "user_annotation"}
# Categories read above, or known and deliberately left out (they are not work of a step).
KNOWN_CATEGORIES = frozenset(GPU_CATEGORIES + LAUNCH_CATEGORIES + (
    "cpu_op", "user_annotation", "gpu_user_annotation", "python_function", "cuda_sync", "Trace",
    "cpu_instant_event", "overhead", "Python", "Trace Span")) | frozenset(LEGACY_CATEGORIES)
# Device-side categories some traces carry instead of a GPU timeline, and what they mean.
FOREIGN_DEVICE_CATEGORIES = {
    "cuda_profiler_range": "CUPTI range-profiler measurements (hardware counters per kernel, not a timeline)",
    "mtia_runtime": "MTIA accelerator runtime calls", "mtia_ccp_events": "MTIA accelerator activity",
}

# Ops that only make a new view of existing memory or allocate it: they do no arithmetic
# and launch no kernel, so "what did my code compute" tables leave them out.
VIEW_OPS = frozenset({
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::expand",
    "aten::as_strided", "aten::transpose", "aten::t", "aten::permute", "aten::alias",
    "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::resolve_conj",
    "aten::resolve_neg", "aten::detach", "aten::lift_fresh", "aten::empty", "aten::empty_like",
    "aten::empty_strided", "aten::contiguous", "aten::split", "aten::unbind",
})
# Tensor element types as Kineto spells them ("long" in some traces, "long int" in others).
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "bool": 1,
               "long int": 8, "long": 8, "int": 4, "unsigned char": 1, "signed char": 1, "short int": 2,
               "short": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::complex<float>": 8,
               "c10::complex<double>": 16}


# ----------------------------------------------------------------------------- reading

def read_events(path: str | os.PathLike) -> dict:
    """The raw Chrome trace JSON (plain or gzip-compressed)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_events(raw) -> list[dict]:
    """The event list, or a ValueError that says what the file is instead."""
    if isinstance(raw, list):  # the Chrome format's bare-array form
        return [e for e in raw if isinstance(e, dict)]
    if not isinstance(raw, dict):
        raise ValueError(f"not a Chrome trace: a JSON {type(raw).__name__}, not an object with 'traceEvents'")
    if "traceEvents" not in raw:
        if "nodes" in raw and "schema" in raw:
            raise ValueError("this is a PyTorch execution trace (ExecutionTraceObserver, schema "
                             f"{raw.get('schema')!r}), not a Kineto/Chrome trace; load the profiler's trace file")
        raise ValueError(f"not a Chrome trace: no 'traceEvents' (keys: {sorted(raw)[:8]})")
    return [e for e in raw["traceEvents"] if isinstance(e, dict)]


def check_categories(cats: Counter, where: str) -> dict:
    """Fail on a trace with nothing this reader knows; warn about device events it does not read.
    Returns the unread categories with their event counts."""
    if cats and not set(cats) & KNOWN_CATEGORIES:
        raise ValueError(f"{where}: no event of a category this reader knows (found: {dict(cats.most_common(6))}); "
                         "it reads torch.profiler's Chrome export (cpu_op, user_annotation, kernel, gpu_memcpy, "
                         "gpu_memset, cuda_runtime, cuda_driver) and Kineto's older form (Operator, Kernel, "
                         "Memcpy, Memset, Runtime)")
    unread = {c: n for c, n in cats.items() if c not in KNOWN_CATEGORIES}
    foreign = {c: n for c, n in unread.items() if c in FOREIGN_DEVICE_CATEGORIES}
    if foreign:
        what = "; ".join(f"{n} {c} events: {FOREIGN_DEVICE_CATEGORIES[c]}" for c, n in foreign.items())
        warnings.warn(f"{where}: device events this reader does not read ({what}); its steps list no GPU work "
                      "for them, only the CPU side", UserWarning, stacklevel=3)
    return unread


def device_properties(raw) -> list:
    """``deviceProperties``; some Kineto versions wrote it as a Python-literal string."""
    props = raw.get("deviceProperties", []) if isinstance(raw, dict) else []
    if isinstance(props, str):
        try:
            props = ast.literal_eval(props)
        except (ValueError, SyntaxError):
            return []
    return props if isinstance(props, list) else []


def tensor_bytes(dims: list, type_name: str) -> int:
    """Bytes of a tensor of shape ``dims`` and Kineto element type ``type_name`` (``c10::BFloat16``,
    ``float``...); a ValueError names a type the reader does not know the size of."""
    if type_name not in DTYPE_BYTES:
        raise ValueError(f"no known element size for the type {type_name!r}; known: {sorted(DTYPE_BYTES)}")
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise ValueError(f"not a tensor shape: {dims!r}")
    return math.prod(dims) * DTYPE_BYTES[type_name]


def is_contiguous(dims: list, strides: list) -> bool:
    """Whether a tensor of shape ``dims`` with ``strides`` (in elements, as Kineto records them)
    is laid out row-major with no gaps, as ``Tensor.is_contiguous()`` says; dimensions of size 1
    have any stride."""
    if len(dims) != len(strides):
        raise ValueError(f"{len(dims)} dims but {len(strides)} strides: {dims} {strides}")
    expected = 1
    for d, s in zip(reversed(dims), reversed(strides)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def memory_layout(dims: list, strides: list, names: str) -> Optional[str]:
    """The order a tensor's dimensions are laid out in memory, outermost first, by their
    ``names`` (one letter each, in the order of ``dims``): a ``[B, H, S, D]`` view of a
    ``[B, S, H, D]`` buffer reads ``"BSHD"``. None when no order makes it contiguous (a slice,
    a broadcast): it is not a rearranged dense buffer."""
    if not len(dims) == len(strides) == len(names):
        raise ValueError(f"{len(dims)} dims, {len(strides)} strides and {len(names)} names ({names!r}) must match")
    order = sorted(range(len(dims)), key=lambda i: (-strides[i], i))
    if not is_contiguous([dims[i] for i in order], [strides[i] for i in order]):
        return None
    return "".join(names[i] for i in order)



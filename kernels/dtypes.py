"""The dtypes the course names, spelled one way each.

One table maps the short names a command line takes ("bf16") to torch dtypes; what the library
writes (results, captions, chapter parameters) is torch's own name ("bfloat16", ``dtype_name``).
``parse_dtype`` reads either spelling, "torch.bfloat16" and "half" too.

    parse_dtype("bf16") is torch.bfloat16
    dtype_name(torch.bfloat16) == "bfloat16"
"""
from __future__ import annotations

import torch

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def dtype_name(dtype: torch.dtype) -> str:
    """Torch's name for a dtype, without "torch." ("bfloat16"): the spelling the library writes."""
    return str(dtype).replace("torch.", "")


TORCH_NAMES = tuple(dtype_name(d) for d in TORCH_DTYPES.values())


def parse_dtype(text) -> torch.dtype:
    """A dtype from its short name, torch's name (with or without "torch."), or "half"."""
    if isinstance(text, torch.dtype):
        return text
    key = str(text).lower().replace("torch.", "")
    by_name = {**TORCH_DTYPES, **{dtype_name(d): d for d in TORCH_DTYPES.values()}, "half": torch.float16}
    if key not in by_name:
        raise ValueError(f"unknown dtype {text!r}; use one of {', '.join(by_name)}")
    return by_name[key]

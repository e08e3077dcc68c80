"""Small helpers every chapter notebook uses, so notebooks hold prose, calls and figures only.

- ``setup(device, dtype)``: the device and dtype a chapter runs with, falling back (with a
  printed reason) when the requested one is not here.
- ``inputs(...)``: random q, k, v (never zeros: a kernel that writes nothing must not pass).
- ``glue(name, value)``: hand a computed number to the prose (myst-nb's glue in the book;
  a plain display elsewhere, e.g. in Colab without myst-nb).
- ``lesson(condition, claim)``: the prose's claim, checked on the device that ran it.
"""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def setup(device: str = "cpu", dtype: str = "float32") -> tuple[torch.device, torch.dtype]:
    """Resolve the chapter's parameters into a torch device and dtype, saying what changed."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    want = torch.device(device)
    if want.type == "cuda" and not torch.cuda.is_available():
        print("This chapter asked for a CUDA GPU, but none is visible: running on the CPU in float32 instead.")
        return torch.device("cpu"), torch.float32
    chosen = DTYPES[dtype]
    if want.type == "cuda" and chosen == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        print(f"{torch.cuda.get_device_name(want)} has no bfloat16 tensor cores: using float16 instead.")
        chosen = torch.float16
    return want, chosen


def inputs(batch: int, heads: int, seq: int, head_dim: int, dtype=torch.float32, device="cpu",
           seed: int = 0, requires_grad: bool = False):
    """q, k, v of shape [batch, heads, seq, head_dim], standard normal, reproducible."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(3, batch, heads, seq, head_dim, generator=g).to(device=device, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in qkv.unbind(0))


class _Text(str):
    """A string whose repr is itself, so glued text shows without quotes."""

    def __repr__(self) -> str:
        return str(self)


def glue(name: str, value, display: bool = False):
    """Record ``value`` under ``name`` for ``{glue:text}`` in the prose; returns the value.

    Strings are glued as they read (no quotes); numbers can be formatted in the prose,
    e.g. ``{glue:text}`name:.2f```.
    """
    if isinstance(value, str):
        value = _Text(value)
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # outside the book build (Colab, plain Jupyter): just show it
        if display:
            from IPython.display import display as show
            show(value)
        return value
    myst_glue(name, value, display=display)
    return value


class LessonFailed(AssertionError):
    """A claim the chapter makes did not hold on this run's device."""


def lesson(condition: bool, claim: str, evidence: str = "") -> None:
    """Assert what the prose says. Prints the claim when it holds, fails loudly when not."""
    if not condition:
        raise LessonFailed(f"The chapter claims: {claim}. This run disagrees. {evidence}".strip())
    print(f"✔ {claim}" + (f" ({evidence})" if evidence else ""))


def mib(nbytes: float) -> float:
    return nbytes / 2**20


def show_source(obj):
    """The source of a library object, rendered as a highlighted code block in the book."""
    import inspect

    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(obj).rstrip()}\n```")

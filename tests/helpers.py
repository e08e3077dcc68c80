"""What the tests share: the repository's root, and random attention inputs (never zeros)
in every memory layout the contract promises. Test modules import from here
(``from tests.helpers import ...``); tests/conftest.py holds only pytest's hooks and fixtures."""
from __future__ import annotations

import io
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from matplotlib.text import Text

from kernels import figures

ROOT = Path(__file__).resolve().parent.parent


def has_cuda() -> bool:
    return torch.cuda.is_available()


def console_script(name: str, package: str) -> str:
    """Path of a test tool's console script, the running interpreter's environment first: pytest
    may run as ``.venv/bin/python -m pytest`` without the venv on PATH. Missing, the test fails
    with what to install (``package``, as requirements-test.txt names it)."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `python -m pip install -r requirements-test.txt` ({package})")
    return found


# ------------------------------------------------------------------ the full contract's inputs

# bhsd: contiguous. bshd: a transposed [b, s, h, d] view (what a model has before its
# transpose). dstride: head_dim is not the fastest axis (stride(-1) != 1). offset: storage
# starting one element in (not 16-byte aligned).
LAYOUTS = ("bhsd", "bshd", "dstride", "offset")


def laid_out(t: torch.Tensor, layout: str, dtype=None, device=None) -> torch.Tensor:
    """``t``'s [b, h, s, d] values, as ``dtype`` on ``device``, in memory layout ``layout``."""
    dtype, device = dtype or t.dtype, device or t.device
    b, h, s, d = t.shape
    if layout == "offset":
        return torch.empty(t.numel() + 1, dtype=dtype, device=device)[1:].view(b, h, s, d).copy_(t)
    storage, order = {"bhsd": ((b, h, s, d), (0, 1, 2, 3)), "bshd": ((b, s, h, d), (0, 2, 1, 3)),
                      "dstride": ((b, h, d, s), (0, 1, 3, 2))}[layout]
    return torch.empty(storage, dtype=dtype, device=device).permute(*order).copy_(t)


def make_attention_inputs(b, hq, hkv, sq, sk, d, dtype=torch.float32, device="cpu", layouts="bhsd",
                          seed=0, scale=1.0):
    """Random q [b, hq, sq, d], k and v [b, hkv, sk, d]: the contract's general case.

    ``layouts`` is one layout name for all three, or a (q, k, v) triple of names. Values are
    ``scale`` x N(0, 1), never zeros, so an unwritten or ignored input cannot pass by accident.
    """
    if isinstance(layouts, str):
        layouts = (layouts,) * 3
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d))
    return tuple(laid_out(torch.randn(shape, generator=g) * scale, lay, dtype, device)
                 for shape, lay in zip(shapes, layouts))


def make_qkv(b, h, s, d, dtype=torch.float32, device="cpu", layout="bhsd", seed=0):
    """Random q, k, v of logical shape [b, h, s, d]: ``make_attention_inputs`` with as many K/V
    heads as query heads and as many keys as queries."""
    return make_attention_inputs(b, h, h, s, s, d, dtype, device, layout, seed)


def covering(*axes):
    """Rows that use every value of every axis at least once: row i takes axes[j][i % len].

    Far fewer rows than the full product, for grids whose product would not fit the suite's
    time budget; which values meet in a row shifts with the axes' lengths.
    """
    n = max(len(a) for a in axes)
    return [tuple(a[i % len(a)] for a in axes) for i in range(n)]


# ------------------------------------------------------------------ figures as the page shows them

def png_width(fig) -> int:
    """Width in pixels of the PNG the notebook would show (dpi of the figure, tight bbox)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=fig.dpi, bbox_inches="tight")
    return struct.unpack(">I", png.getvalue()[16:20])[0]


def too_small(fig) -> list[str]:
    """Texts drawn smaller than the floor once the page scales the PNG to the column."""
    width = png_width(fig)  # draws the figure: bar labels now hold what was drawn
    scale = figures.rendered_scale(width)
    small = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip():
            px = t.get_fontsize() * fig.dpi / 72 * scale
            if px < figures.MIN_FONT_PX - 1e-6:
                small.append(f"{t.get_text()[:30]!r}: {px:.1f} px")
    return small

"""Which torch, Triton and Python the course is tested with, and what is known to break.

Readers bring their own stack: Colab installs the newest torch, GPU images pin older ones. The
course is tested (the ``compat`` matrix of ``.github/workflows/ci.yml``, weekly and by hand) on
the newest torch and Triton on the package index and on the oldest it supports, the one GPU
image seen so far (README, "Supported versions"). ``known_problem_reason`` names, in words, a combination within that range that
is known to fail and that the library cannot work around here; ``kernels.available()`` reports
it for the implementation it stops.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

from kernels.triton import interpreter

# (oldest, newest) tested, as major.minor.
TESTED = {"python": ("3.11", "3.12"), "torch": ("2.11", "2.15"), "triton": ("3.6", "3.9")}


def known_problem_reason(name: str, device: torch.device) -> Optional[str]:
    """Why ``name`` cannot run on ``device`` with the versions installed here, or None."""
    if name == "triton" and device.type == "cpu":
        return _interpreter_reason()
    return None


def _interpreter_reason() -> Optional[str]:
    """Triton 3.6's interpreter with NumPy 2.4, where the library's fix could not be applied."""
    if not interpreter.asked():
        return None           # compiled kernels: the interpreter is not used
    try:
        import numpy
        import triton
    except ImportError:
        return None           # a missing Triton is the implementation's own reason
    if interpreter.squeeze_scalar_index():
        return None
    return (f"Triton {triton.__version__}'s interpreter cannot run kernels with NumPy {numpy.__version__}: "
            "it converts one-element arrays with int(), which NumPy 2.4 refuses, and this Triton's "
            "interpreter is laid out differently from the 3.6 release the library knows how to fix; "
            f"install 'numpy<2.4' or Triton 3.7 or newer ({sys.executable} -m pip install 'numpy<2.4')")

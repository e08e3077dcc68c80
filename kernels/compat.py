"""Which torch, Triton and Python the course is tested with, and what is known to break.

Readers bring their own stack: Colab installs the newest torch, GPU images pin older ones. The
course is tested (the ``compat`` matrix of ``.github/workflows/ci.yml``, weekly and by hand) on
the newest torch and Triton on the package index and on the oldest it supports, the one GPU
image seen so far (README, "Supported versions"). A combination within that range that is known
to fail, and that the library cannot work around, is the stopped implementation's own reason
(``kernels.triton.interpreter.unfixable_reason``), which ``kernels.available()`` reports.
"""
from __future__ import annotations

# (oldest, newest) tested, as major.minor.
TESTED = {"python": ("3.11", "3.12"), "torch": ("2.11", "2.15"), "triton": ("3.6", "3.9")}

"""Profiler traces, recorded and read: the course's one way to look at what a call did.

- ``record``: run a callable under ``torch.profiler`` and export its Chrome/Perfetto trace;
- ``reader``: read a trace file back into ``Trace`` and ``Step`` tables;
- ``tables``: a step's ops, kernels and copies as the chapters display them;
- ``diff``: what changed between two steps;
- ``timeline``: one step drawn as Perfetto draws it, one row per track;
- ``fingerprints``: what a GPU kernel's name says about the work it does;
- ``links``: "Download trace" and "Open in Perfetto" beside a figure;
- ``attention``: every attention call of a model's step (fused, replayed from a graph, or
  hand-written) with its kernels, FLOPs, TFLOP/s and footprint; also a command,
  ``python -m kernels.trace.attention TRACE``.
- ``breakdown``: where a model step's GPU time goes: attention first, the rest by kind of
  kernel (GEMM, elementwise, copy...), and the stacked bars that compare steps.

Imports go one way: ``reader`` and ``fingerprints`` import nothing of the package, the others
build on ``reader``; nothing here imports ``kernels.bench``.
"""

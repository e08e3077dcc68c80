"""Profiler traces, recorded and read: the course's one way to look at what a call did.

- ``record``: run a callable under ``torch.profiler`` and export its Chrome/Perfetto trace;
- ``events``: a trace file's raw events, their categories, the sizes and layouts of its tensors;
- ``reader``: read a trace file back into ``Trace`` and ``Step`` tables;
- ``tables``: a step's ops, kernels and copies as the chapters display them;
- ``diff``: what changed between two steps;
- ``timeline``: one step drawn as Perfetto draws it, one row per track;
- ``families``: every attention kernel family (FlashAttention 2/3/4, cuDNN, CUTLASS, AOTriton,
  composable kernel / AITER, FlashInfer, vLLM, SGLang, SageAttention...), by name, with a
  readable name for each kernel;
- ``fingerprints``: what a GPU kernel's name says about the work it does;
- ``links``: "Download trace" and "Open in Perfetto" beside a figure;
- ``attention``: every attention call of a model's step (fused, replayed from a graph, or
  hand-written) with its kernels, shapes, FLOPs, bytes, TFLOP/s, TB/s and footprint; also a
  command, ``python -m kernels.trace.attention TRACE [TRACE_B]``; ``serving`` reads a serving
  engine's step annotation and capture trace, ``roof`` says which roof binds each call,
  ``side_by_side`` matches two traces' calls by shape, ``attention_text`` writes the tables;
- ``breakdown``: where a model step's GPU time goes: attention first, the rest by kind of
  kernel (GEMM, elementwise, copy...), and the stacked bars that compare steps.

Imports go one way: ``events`` and ``families`` import nothing of the package, ``reader`` builds
on ``events``, ``fingerprints`` on ``families``, the others on ``reader``; nothing here imports
``kernels.bench``.
"""

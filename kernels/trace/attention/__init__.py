"""Every attention call in a model's step, however it was written, with what it cost on the GPU
and the roof it sits under.

``find_attention(step)`` reads one ``Step`` (``kernels.trace.reader``) of any Kineto trace, from
any vendor, and returns an ``AttentionReport``: one ``AttentionCall`` per attention forward, found
three ways, in this order:

- **fused**: an attention op (``aten::scaled_dot_product_attention`` and its backend op, down to
  the kernel that ran; a serving engine's op such as ``vllm::unified_attention_with_output``). The
  call is the outermost such op; its kernels are every kernel launched inside it. Ops come from
  ``ATTENTION_OPS`` (``kernels.trace.fingerprints``), kernels from the family table
  ``kernels.trace.families.FAMILIES`` (FlashAttention 2/3/4, cuDNN, CUTLASS, AOTriton, composable
  kernel / AITER, FlashInfer, vLLM, SGLang, SageAttention...), not by special code. A call made
  from a ``torch.compile``'d graph (inside a ``CompiledFxGraph`` range) is marked ``compiled``.
- **by kernel name**: attention kernels that no op launched (a CUDA/HIP graph replays them: a
  serving engine's decode step). Each "main" kernel opens a call; a "combine" kernel of the same
  library after it on its stream (the reduce of a split over the KV cache) joins it, and a
  "prologue" kernel (SageAttention's quantisation) joins the main kernel after it.
- **hand-written**: the core ``scores = q @ k^T``, ``softmax(scores)``, ``scores @ v`` (matmul,
  bmm or baddbmm, then softmax, then a matmul on the softmax's shape) on one thread; the call is
  everything launched from the first GEMM to the last, the scale and mask between them included.

Shapes: from the op's recorded inputs where it has them (SDPA: B, H_Q, H_KV, Sq, Sk, D). A serving
engine's step records instead its requests' token counts in its annotation and the heads on its
attention op, or in its graph-capture trace (``kernels.trace.serving``): ``find_attention(step,
capture=capture_trace)`` or ``heads=serving.heads_from_user("32/8", 128)``.

Costs (conventions in ``kernels.trace.roof``): FLOPs forward, ``2·B·H·Sq·Sk·(D + Dv)`` for the two
products, half for a causal fused call (exact for Sq = Sk); a serving call counts
``2·H_Q·(D + Dv)·(Σ_prefill sq·sk − Σ_prefill sq²/2 + Σ_decode sq·sk)``, TraceLens's convention.
A hand-written core counts in full (its GEMMs compute every score). Bytes: Q, K, V read once and O
written once (for decode, the whole KV cache the call reads). TFLOP/s and TB/s over the call's GPU
time (the sum of its kernels' durations). The roof: FLOPs per byte against the device's ridge
(dense 16-bit peak over bandwidth, ``kernels.hw.devices``, datasheet figures) says which roof
binds, "memory" or "compute", and the share of it achieved; for 16-bit inputs only (the peaks are
16-bit ones). The device is the trace's ``deviceProperties`` name; an empty name is matched by the
properties where they single out one GPU (``devices.match_properties``), else ``device=NAME``.

What cannot be derived is None (``null`` in the JSON), never a guess, and ``AttentionCall.why()``
says why for each such field (the JSON's ``why``; the table's footnotes).

The kernel's footprint (grid, block, registers per thread, shared memory) and Kineto's estimated
occupancy come from the call's main kernel (its attention kernel, else its longest), where the
trace records them (CUDA traces do; ROCm traces record grid and block only). Attention's share of
the step is its GPU time over the step's (``Step.gpu_time_us``: every kernel, memcpy and memset,
summed over streams).

From a shell, ``python -m kernels.trace.attention TRACE [B] [--step N] [--json] [--capture TRACE]
[--heads HQ/HKV --head-dim D] [--device NAME]``; with two traces, both reports and their calls
matched by shape (``kernels.trace.side_by_side``). ``--json`` prints, for one trace, one object:
``device``, ``device_how``, ``peak_tflops``, ``bandwidth_tbps``, ``ridge``, ``step``,
``engine_steps`` (the annotations read), ``calls`` (each: ``how``, ``library``, ``op``,
``kernels``, ``main_kernel``, ``readable_kernel``, ``gpu_us``, shapes (``batch``, ``heads``,
``kv_heads``, ``sq``, ``sk``, ``d``, ``dv``, ``tokens``), ``causal``, ``dtype``, ``flops``,
``bytes``, ``intensity``, ``tflops``, ``tbps``, ``bound``, ``roof_share``, ``peak_share``, the
footprint, and ``why``: {field: reason} for every null); for two, ``{"a": ..., "b": ...,
"matched": [...]}``.
"""
from kernels.trace.attention.calls import (FOOTPRINT, SIXTEEN_BIT, AttentionCall, AttentionReport, dims_text,
                                           short_kernel_name)
from kernels.trace.attention.command import TraceError, main, pick_step, read_trace
from kernels.trace.attention.find import SCORE_GEMMS, SOFTMAXES, TYPE_NAMES, find_attention
from kernels.trace.side_by_side import shape_text

__all__ = ["AttentionCall", "AttentionReport", "FOOTPRINT", "SCORE_GEMMS", "SIXTEEN_BIT", "SOFTMAXES", "TYPE_NAMES",
           "TraceError", "dims_text", "find_attention", "main", "pick_step", "read_trace", "shape_text",
           "short_kernel_name"]

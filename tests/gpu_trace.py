"""Synthetic GPU traces, shaped like torch.profiler's Chrome export on an A100.

They stand in for recordings in tests only (never under book/data/), built by the tests' one
trace builder (``tests/hopper_trace.trace``, given an A100's deviceProperties): CPU ops inside a
label, ``cudaLaunchKernel`` / ``cudaMemcpyAsync`` runtime calls (or the driver's
``cuLaunchKernelEx`` for cuDNN) linked by correlation id to ``kernel`` and ``gpu_memcpy``
events on the GPU's own pid/tid, with the launch footprint CUPTI records. Kernel names and
counts follow the source article's A100 forwards (Hugging Face blog, "Profiling in PyTorch (Part 3)"): naive 6 activities with
one Memcpy, in-place 5, the math backend many more with fp32 GEMMs, each fused backend one.
Chapter 0's matmul + relu follows Part 1 of the series (torch-profiler.md): an occupancy query
before the GEMM's launch and none before the elementwise kernel's. Each recorded step
(``ProfilerStep#N``) holds its label and the ``cudaDeviceSynchronize`` that
``kernels.trace.record.profile`` calls after it; the first holds a CUPTI activity-buffer request.
Footprints are consistent with Kineto's estimate (``kernels.hw.occupancy.kineto_estimate``, 108
SMs, rounded to a whole percent as Kineto writes it).
"""
from __future__ import annotations

from tests import hopper_trace

S, SCORES = 1024, [1, 8, 1024, 1024]
QKV = [1, 8, 1024, 64]

MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
       "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, "
       "at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
       "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)")
FILL = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::masked_fill_kernel"
        "(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() "
        "const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, ...)::{lambda(int)#1}>(int, ...)")
SOFTMAX = ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>"
           "(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)")
COPY = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
        "at::detail::Array<char*, 2>, ...>(int, ...)")
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::{name}, at::detail::Array<char*, 3> >(int, ...)"
TRIU = ("void at::native::triu_tril_kernel<bool, int, false, 4, true>(at::cuda::detail::TensorInfo<bool, int>, "
        "at::cuda::detail::TensorInfo<bool const, int>, long, long)")
REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<bool, at::native::func_wrapper_t<bool, ...>, unsigned int, bool, 4> >(...)"
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
         "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, "
         "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
EFFICIENT = "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)"
CUDNN = "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_kernel0_0"

# footprints: (grid, block, registers per thread, shared memory bytes, est. achieved occupancy %)
SMALL = ([8192, 1, 1], [128, 1, 1], 26, 0, 100)

# (op name, input dims, kernel name or None, kernel category, footprint, launcher)
NAIVE_A100 = [
    ("aten::matmul", [QKV, [1, 8, 64, S]], "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "kernel",
     ([8, 8, 8], [256, 1, 1], 238, 49152, 25.0), None),
    ("aten::mul", [SCORES, []], MUL, "kernel", SMALL, None),
    ("aten::masked_fill", [SCORES, [S, S], []], "Memcpy DtoD (Device -> Device)", "gpu_memcpy", None, None),
    ("aten::masked_fill_", [SCORES, [S, S], []], FILL, "kernel", ([32768, 1, 1], [128, 1, 1], 20, 0, 88.1), None),
    ("aten::softmax", [SCORES, [], []], SOFTMAX, "kernel", ([2048, 1, 1], [128, 1, 1], 56, 0, 70.4), None),
    ("aten::matmul", [SCORES, QKV], "ampere_bf16_s16816gemm_bf16_64x64_sliced1x2_ldg8_f2f_stages_64x5_nn", "kernel",
     ([1, 16, 8], [128, 1, 1], 168, 73728, 0.0), None),
]
INPLACE_A100 = [row for row in NAIVE_A100 if row[0] != "aten::masked_fill"]
MATH_A100 = [
    ("aten::_to_copy", [QKV], COPY, "kernel", SMALL, None),
    ("aten::_to_copy", [QKV], COPY, "kernel", SMALL, None),
    ("aten::_to_copy", [QKV], COPY, "kernel", SMALL, None),
    ("aten::mul", [QKV, []], ELEMENTWISE.format(name="MulFunctor<float>"), "kernel", SMALL, None),
    ("aten::mul", [QKV, []], ELEMENTWISE.format(name="MulFunctor<float>"), "kernel", SMALL, None),
    ("aten::ones", [[S, S]], ELEMENTWISE.format(name="FillFunctor<bool>"), "kernel", SMALL, None),
    ("aten::tril", [[S, S], []], TRIU, "kernel", SMALL, None),
    ("aten::where", [[S, S], [], []], ELEMENTWISE.format(name="where_kernel_impl<float>"), "kernel", SMALL, None),
    ("aten::bmm", [[8, S, 64], [8, 64, S]], "ampere_sgemm_128x64_tn", "kernel", ([8, 16, 8], [256, 1, 1], 122, 16384, 37.5), None),
    ("aten::add_", [SCORES, [S, S]], ELEMENTWISE.format(name="AddFunctor<float>"), "kernel", SMALL, None),
    ("aten::softmax", [SCORES, [], []], SOFTMAX.replace("c10::BFloat16", "float"), "kernel", SMALL, None),
    ("aten::isneginf", [SCORES], ELEMENTWISE.format(name="isneginf<float>"), "kernel", SMALL, None),
    ("aten::all", [SCORES, [], []], REDUCE, "kernel", SMALL, None),
    ("aten::where", [[1, 8, S, 1], [], SCORES], ELEMENTWISE.format(name="where_kernel_impl<float>"), "kernel", SMALL, None),
    ("aten::bmm", [[8, S, S], [8, S, 64]], "ampere_sgemm_128x64_nn", "kernel", ([1, 16, 8], [256, 1, 1], 122, 16384, 37.5), None),
    ("aten::_to_copy", [QKV], COPY, "kernel", SMALL, None),
    ("aten::_to_copy", [SCORES], COPY, "kernel", SMALL, None),
]
TRANSPOSES = [("aten::transpose", [QKV, [], []], None, None, None, None)] * 4
FUSED_A100 = {
    "sdpa_flash": TRANSPOSES + [("aten::_flash_attention_forward", [QKV, QKV, QKV], FLASH, "kernel",
                                 ([16, 32, 1], [128, 1, 1], 255, 32768, 13), None)],
    "sdpa_efficient": TRANSPOSES + [("aten::_efficient_attention_forward", [QKV, QKV, QKV], EFFICIENT, "kernel",
                                     ([16, 32, 1], [128, 1, 1], 128, 40960, 25), None)],
    "sdpa_cudnn": [("aten::_cudnn_attention_forward", [QKV, QKV, QKV], CUDNN, "kernel",
                    ([8, 8, 1], [256, 1, 1], 240, 90112, 0.0), ("cuda_driver", "cuLaunchKernelEx"))],
}
# Chapter 0's mlp_step: relu(x @ w), x [2048, 256], w [256, 256] (the cuda preset's 4*seq x 4*head_dim).
# A seventh field lists runtime calls the op makes before its launch.
MLP_A100 = [
    ("aten::mm", [[2048, 256], [256, 256]], "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "kernel",
     ([2, 16, 1], [256, 1, 1], 238, 49152, 4), None, ["cudaOccupancyMaxActiveBlocksPerMultiprocessor"]),
    ("aten::clamp_min", [[2048, 256], []], ELEMENTWISE.format(name="clamp_min_kernel<c10::BFloat16>"), "kernel",
     SMALL, None),
]
VARIANTS = {"naive": NAIVE_A100, "inplace": INPLACE_A100, "sdpa_math": MATH_A100, **FUSED_A100, "mlp_step": MLP_A100}


A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "numSms": 108,
        "regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 2048}


def as_row(op, dims, kernel, cat, footprint, launch, before=()) -> hopper_trace.Row:
    """One row above as the tests' trace builder takes it (``launch``: (category, launcher) or None)."""
    launcher = launch[1] if launch else "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
    return hopper_trace.Row(op, kernel, cat=cat or "kernel", footprint=footprint, launcher=launcher, dims=dims,
                            before=tuple(before))


def forward_trace(label: str = "naive", steps: int = 2, rows=None) -> dict:
    """Chrome-trace JSON of ``steps`` labelled forwards of ``label`` with their GPU work, on an A100."""
    rows = VARIANTS[label] if rows is None else rows
    return hopper_trace.trace(label, [as_row(*row) for row in rows], steps, device=A100)


def naive_a100_trace(steps: int = 2) -> dict:
    """The naive forward's trace (6 GPU activities, one of them the clone's Memcpy)."""
    return forward_trace("naive", steps)


# What each chapter of a GPU run records, by variant (a subset of what a real run writes).
CHAPTER_VARIANTS = {"00_profiler_primer": ["mlp_step"], "01_naive": ["naive"], "02_inplace": ["naive", "inplace"],
                    "03_sdpa": ["inplace", "sdpa_math"], "03b_sdpa_fused": ["sdpa_efficient", "sdpa_flash", "sdpa_cudnn"]}
FIXTURE_GPU = {"gpu": "NVIDIA A100-SXM4-80GB", "capability": [8, 0], "sm_count": 108, "torch": "2.13.0+cu130",
               "cuda": "13.0", "cudnn": 92000, "triton": "3.7.1", "driver": "580.65", "python": "3.11.7",
               "commit": "0123456789abcdef", "date": "2026-11-30 04:00 UTC"}


def fixture_archive(folder, variants=None, phases=None, dry_run=False, environment=None):
    """A GPU-run archive marked as real, built from the synthetic traces above (tests only).

    ``variants`` maps chapter -> {variant: rows} to replace a chapter's traces (e.g. to plant
    a wrong count); the archive goes through the same ``pack`` as a real run.
    """
    import gzip
    import json
    from pathlib import Path

    from tools import gpu_run

    work = Path(folder) / "work"
    env = {**FIXTURE_GPU, **(environment or {})}
    files = {}
    for chapter, names in CHAPTER_VARIANTS.items():
        for name in names:
            rows = (variants or {}).get(chapter, {}).get(name)
            path = work / "traces" / chapter / f"{name}.json.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(json.dumps(forward_trace(name, steps=2, rows=rows)).encode()))
            files[f"traces/{chapter}/{name}.json.gz"] = path
    (work / "bench.json").write_text(json.dumps({"meta": {"device": {"name": env["gpu"]}}, "results": []}))
    files["bench.json"] = work / "bench.json"
    phases = phases or [{"name": n, "status": "ok", "seconds": 1.0, "detail": ""} for n in gpu_run.LIMITS]
    manifest = {"format": gpu_run.FORMAT, "version": gpu_run.VERSION, "dry_run": dry_run, **env,
                "device": env["gpu"], "phases": phases}
    archive = Path(folder) / gpu_run.ARCHIVE_NAME
    gpu_run.pack(archive, manifest, files)
    return archive

"""Fixture GPU steps shaped like what an H100 (sm_90) launches, for the GPU lessons of chapters 04-10.

Tests only (never under book/data/): ``step(label, rows)`` builds a torch.profiler Chrome
trace of two recorded steps, as Kineto writes it, and returns its median step, which the
chapter's "read the GPU run and assert" function (its module in ``kernels/book``) then reads.

Each kernel name below is one a real Hopper run launches, and says where it comes from:

- cuBLAS GEMMs. cuBLAS 12.8+ on Hopper launches its generated "nvjet" family; the names
  ``nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT``, ``nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN``,
  ``nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT`` are from an nsys top-kernels table of an H100
  training run (beside FlashAttention-2's ``flash_fwd_kernel``), found by exact-string search
  of public GitHub text; kernels/trace/fingerprints.py documents the family. The older Hopper
  naming, ``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_
  execute_segment_k_off_kernel__5x_cublas``, is from nsys reports of H100 runs (same search).
- fp32 GEMMs of SDPA's math backend (it upcasts 16-bit inputs): cuBLAS's sm_80 SIMT CUTLASS
  kernel ``cutlass_80_simt_sgemm_256x128_8x4_nn_align1`` (sm_80 code runs on sm_90; format
  from kernels/trace/fingerprints.py's CUTLASS rule).
- SDPA's fused backends: FlashAttention-2 as PyTorch vendors it,
  ``void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<...>>`` (aten/src/ATen/native/
  transformers/cuda/flash_attn in PyTorch; the same FA2 kernel serves sm_80 and sm_90);
  the memory-efficient backend ``fmha_cutlassF_bf16_aligned_64x128_rf_sm80`` (PyTorch's
  mem_eff_attention kernels, generated for sm_80 and run on sm_90); cuDNN's
  ``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0``
  (an H100 profiling report found by the same search), launched through the driver's
  ``cuLaunchKernelEx``, with one memset beside it (seen in H100 cuDNN SDPA profiles).
- ATen's own kernels (elementwise, masked_fill, ``cunn_SoftMaxForward`` for rows longer than
  1024, the copy kernel): the templates of aten/src/ATen/native/cuda (names as in
  tests/gpu_trace.py and the shared real traces).
- Inductor: ``triton_{poi,per,red,tem}_fused_<ops>_<n>`` (torch/_inductor names its kernels
  from the ATen ops they fuse; ``triton_tem_`` is a template such as FlexAttention's).
- This course's kernels by their function names: ``attn_fwd``,
  ``attn_bwd_preprocess``, ``attn_bwd_dkdv``, ``attn_bwd_dq`` (kernels/triton/flash.py,
  kernels/triton/backward.py) and ``flash_v1_kernel`` / ``flash_v2_kernel`` (kernels/cuda/csrc).
- Copies and fills as Kineto names them: ``Memcpy HtoD (Pinned -> Device)``,
  ``Memcpy DtoD (Device -> Device)``, ``Memset (Device)``.

Streams: 7 is the stream PyTorch's work runs on (as CUPTI numbers it in the shared real
traces); chapter 9's training steps add a prefetch copy and a memset on side streams 14 and
20, so no reader may assume one stream.
H100 launches may come as ``cudaLaunchKernelExC`` (HolisticTraceAnalysis issue #61): the
fixture's nvjet GEMMs are launched so, Triton's through the driver's ``cuLaunchKernelEx``. Footprints carry Kineto's own estimate, computed as Kineto does
(``kernels.hw.occupancy.kineto_estimate``, on the device's own SM count).

``sweep_points`` is the other half a GPU branch reads: the points a benchmark sweep on an H100
returns (``kernels.bench.results.BenchResult`` rows, counted by ``kernels.bench.sweep.new_point``
at the cuda preset's bf16, batch 4, heads 16). Their medians are chosen, not measured: each
implementation at a fixed rate (``H100_TFLOPS``), fused attention in the hundreds of TFLOP/s
the FlashAttention-2 and -3 papers report for 16-bit attention on an H100, and the course's
CUDA v1 (no tensor cores) an order of magnitude below v2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from kernels.bench import sweep
from kernels.bench.results import FORWARD, FORWARD_BACKWARD, BenchResult, BenchResults
from kernels.hw import devices, occupancy
from kernels.trace import reader

CPU_PID, CPU_TID, ENGINE_TID, GPU_PID = 5151, 5151, 5160, 0
MAIN, SIDE, SIDE2 = 7, 14, 20
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
        "regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 2048, "sharedMemPerBlockOptin": 232448}

GEMM_NNT = "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
GEMM_TNN = "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN"
GEMM_TNT = "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
GEMM_XMMA = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
             "execute_segment_k_off_kernel__5x_cublas")
SGEMM = "cutlass_80_simt_sgemm_256x128_8x4_nn_align1"
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
         "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, "
         "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, "
             "8, 4, 4, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, "
             "cutlass::bfloat16_t> >, false, true, false, false, false>(pytorch_flash::Flash_bwd_params)")
EFFICIENT = ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
             "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)")
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"
MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
       "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, ...)")
FILL = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::masked_fill_kernel"
        "(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() "
        "const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, ...)::{lambda(int)#1}>(int, ...)")
SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, "
           "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)")
COPY = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
        "at::detail::Array<char*, 2>, ...>(int, ...)")
TRIU = ("void at::native::triu_tril_kernel<bool, int, false, 4, true>(at::cuda::detail::TensorInfo<bool, int>, "
        "at::cuda::detail::TensorInfo<bool const, int>, long, long)")
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
        "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, ...)")
SOFTMAX_BWD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<8, c10::BFloat16, float, c10::BFloat16, "
               "at::native::(anonymous namespace)::SoftMaxBackwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, "
               "c10::BFloat16 const*, int)")
DTOD, HTOD, MEMSET = "Memcpy DtoD (Device -> Device)", "Memcpy HtoD (Pinned -> Device)", "Memset (Device)"
TRITON_FWD = "attn_fwd"
TRITON_BWD = ["attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
CUDA_V1 = "void (anonymous namespace)::flash_v1_kernel<__nv_bfloat16, 64>(flash::Problem)"
CUDA_V2 = "void (anonymous namespace)::flash_v2_kernel<__nv_bfloat16, 64>(flash::Problem, bool)"

SMALL = ((16384, 1, 1), (128, 1, 1), 26, 0)   # an elementwise kernel's footprint: grid, block, regs, smem


@dataclass
class Row:
    """One op of a recorded step and the GPU activity it launches (None: a CPU-only op)."""

    op: str
    kernel: Optional[str] = None
    cat: str = "kernel"                     # kernel, gpu_memcpy, gpu_memset
    stream: int = MAIN
    footprint: Optional[tuple] = SMALL      # (grid, block, registers per thread, shared memory bytes)
    launcher: str = "cudaLaunchKernel"
    tid: int = CPU_TID                      # the CPU thread that launches it (the autograd engine's: ENGINE_TID)
    dims: Optional[list] = None             # the op's "Input Dims", where the test reads shapes
    before: tuple = ()                      # runtime calls the op makes before its launch


def kernel(op: str, name: str, footprint=SMALL, **kw) -> Row:
    if name.startswith("nvjet"):  # cuBLASLt launches its Hopper GEMMs with launch attributes
        kw.setdefault("launcher", "cudaLaunchKernelExC")
    return Row(op, name, footprint=footprint, **kw)


def copy(op: str, name: str = DTOD, cat: str = "gpu_memcpy", **kw) -> Row:
    launcher = "cudaMemsetAsync" if cat == "gpu_memset" else "cudaMemcpyAsync"
    return Row(op, name, cat=cat, footprint=None, launcher=launcher, **kw)


def _kineto_percent(footprint, device: dict) -> float:
    """The trace's estimate: a fifth footprint field as given, else Kineto's arithmetic on ``device``."""
    if len(footprint) == 5:
        return footprint[4]
    grid, block, regs, smem = footprint
    blocks = grid[0] * grid[1] * grid[2]
    return round(occupancy.kineto_estimate(block[0] * block[1] * block[2], regs, smem, grid_blocks=blocks,
                                           sm_count=device["numSms"],
                                           arch=f"sm_{device['computeMajor']}{device['computeMinor']}"), 0)


def trace(label: str, rows: list[Row], steps: int = 2, device: dict = H100) -> dict:
    """Chrome-trace JSON of ``steps`` recorded steps of ``label``, each running ``rows``, on
    ``device`` (its deviceProperties; tests/gpu_trace.py passes an A100's)."""
    events = [{"ph": "M", "name": "process_name", "pid": CPU_PID, "tid": 0, "args": {"name": "python"}},
              {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "GPU 0"}}]
    ts, corr, ext = 2_000_000.0, 500, 1
    for step in range(steps):
        start = ts
        outer = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 2}", "pid": CPU_PID,
                 "tid": CPU_TID, "ts": start - 5, "dur": 0, "args": {}}
        mark = {"ph": "X", "cat": "user_annotation", "name": label, "pid": CPU_PID, "tid": CPU_TID, "ts": start,
                "dur": 0, "args": {"External id": ext}}
        events += [outer, mark]
        if step == 0:  # CUPTI asks for an activity buffer: an overhead row on its own pid
            events.append({"ph": "X", "cat": "overhead", "name": "Activity Buffer Request", "pid": -1, "tid": 0,
                           "ts": start - 4, "dur": 2.0, "args": {}})
        gpu_free = {MAIN: start + 40, SIDE: start + 40, SIDE2: start + 40}
        ts += 10
        for row in rows:
            ext += 1
            shapes = {"Input type": ["c10::BFloat16"]} if row.dims is None else \
                {"Input Dims": row.dims, "Input type": ["c10::BFloat16"] * len(row.dims)}
            events.append({"ph": "X", "cat": "cpu_op", "name": row.op, "pid": CPU_PID, "tid": row.tid, "ts": ts,
                           "dur": 30.0, "args": {"External id": ext, **shapes}})
            if row.kernel is None:
                ts += 35
                continue
            for n, call in enumerate(row.before):
                corr += 1
                events.append({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": CPU_PID, "tid": row.tid,
                               "ts": ts + 5 + 4 * n, "dur": 3.0, "args": {"correlation": corr}})
            corr += 1
            launch_cat = "cuda_driver" if row.launcher.startswith("cu") and not row.launcher.startswith("cuda") \
                else "cuda_runtime"
            events.append({"ph": "X", "cat": launch_cat, "name": row.launcher, "pid": CPU_PID, "tid": row.tid,
                           "ts": ts + 20, "dur": 6.0, "args": {"External id": ext, "correlation": corr}})
            events.append({"ph": "s", "id": corr, "pid": CPU_PID, "tid": row.tid, "ts": ts + 20, "cat": "ac2g",
                           "name": "ac2g"})
            args = {"External id": ext, "correlation": corr, "device": 0, "context": 1, "stream": row.stream}
            if row.footprint:
                grid, block, regs, smem = row.footprint[:4]
                args.update({"grid": list(grid), "block": list(block), "registers per thread": regs,
                             "shared memory": smem, "est. achieved occupancy %": _kineto_percent(row.footprint, device)})
            else:
                args.update({"bytes": 8 * 2**20, "memory bandwidth (GB/s)": 2400.0})
            begin = max(gpu_free[row.stream], ts + 30)
            dur = 40.0 if row.cat == "kernel" else 6.0
            events.append({"ph": "X", "cat": row.cat, "name": row.kernel, "pid": GPU_PID, "tid": row.stream,
                           "ts": begin, "dur": dur, "args": args})
            events.append({"ph": "f", "id": corr, "pid": GPU_PID, "tid": row.stream, "ts": begin, "cat": "ac2g",
                           "name": "ac2g", "bp": "e"})
            gpu_free[row.stream] = begin + dur + 1
            ts += 35
        mark["dur"] = ts - start
        sync_end = max(gpu_free.values()) + 5
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": CPU_PID,
                       "tid": CPU_TID, "ts": ts + 5, "dur": sync_end - ts - 5, "args": {"correlation": corr + 1}})
        outer["dur"] = sync_end + 2 - outer["ts"]
        corr += 2
        ts = sync_end + 100
    return {"schemaVersion": 1, "deviceProperties": [device], "traceEvents": events}


def step(label: str, rows: list[Row], steps: int = 2) -> reader.Step:
    """The median recorded step of ``label`` running ``rows``, read by the course's trace reader."""
    return reader.median_step(reader.load_trace(trace(label, rows, steps)).steps(label))


# ---- what each chapter's GPU run launches, per variant ------------------------------------------

# Chapter 1-3's forwards on Hopper: nvjet GEMMs where the A100 had ampere_* ones.
NAIVE = [kernel("aten::matmul", GEMM_NNT, ((8, 16, 16), (384, 1, 1), 168, 213000)),
         kernel("aten::mul", MUL), copy("aten::masked_fill"), kernel("aten::masked_fill_", FILL),
         kernel("aten::softmax", SOFTMAX, ((65536, 1, 1), (1024, 1, 1), 40, 0)),
         kernel("aten::matmul", GEMM_TNN, ((4, 16, 16), (384, 1, 1), 168, 213000))]
INPLACE = [r for r in NAIVE if r.cat != "gpu_memcpy"]
MATH = [kernel("aten::_to_copy", COPY), kernel("aten::_to_copy", COPY), kernel("aten::_to_copy", COPY),
        kernel("aten::tril", TRIU), kernel("aten::bmm", SGEMM, ((8, 16, 16), (256, 1, 1), 122, 16384)),
        kernel("aten::softmax", SOFTMAX), kernel("aten::bmm", SGEMM, ((1, 16, 16), (256, 1, 1), 122, 16384)),
        kernel("aten::_to_copy", COPY)]
FUSED = {"sdpa_flash": [Row("aten::transpose"), kernel("aten::_flash_attention_forward", FLASH,
                                                       ((16, 64, 1), (128, 1, 1), 255, 49152))],
         "sdpa_efficient": [kernel("aten::_efficient_attention_forward", EFFICIENT,
                                   ((32, 64, 1), (128, 1, 1), 128, 65536))],
         "sdpa_cudnn": [copy("aten::_cudnn_attention_forward", MEMSET, cat="gpu_memset", stream=MAIN),
                        kernel("aten::_cudnn_attention_forward", CUDNN, ((16, 16, 4), (384, 1, 1), 168, 232448),
                               launcher="cuLaunchKernelEx")]}


def triton_forward(batch: int, heads: int, seq: int, block_m: int, warps: int) -> list[Row]:
    """Chapter 4: one forward on Hopper, on a grid the config implies."""
    grid = (batch * heads, -(-seq // block_m), 1)
    return [kernel("triton_attention", TRITON_FWD, (grid, (32 * warps, 1, 1), 232, 114688),
                   launcher="cuLaunchKernelEx")]


def triton_forward_backward(batch: int, heads: int, seq: int) -> list[Row]:
    """Chapter 4: forward then the three backward kernels, the backward's from the autograd
    engine's thread."""
    grid = (batch * heads, -(-seq // 128), 1)
    fwd = kernel("triton_attention", TRITON_FWD, (grid, (256, 1, 1), 232, 114688), launcher="cuLaunchKernelEx")
    bwd = [kernel("TritonAttentionBackward", n, ((batch * heads, -(-seq // 64), 1), (256, 1, 1), 200, 98304),
                  launcher="cuLaunchKernelEx", tid=ENGINE_TID) for n in TRITON_BWD]
    return [fwd, *bwd]


def cuda_forward(version: str, cfg, batch: int, heads: int, seq: int) -> list[Row]:
    """Chapter 5: one forward of the course's CUDA kernel, launched as its launcher does
    (``cfg``: kernels.cuda.flash.launch_config)."""
    name = CUDA_V1 if version == "v1" else CUDA_V2
    regs = 64 if version == "v1" else 128
    return [kernel(f"cuda_{version}", name, (tuple(cfg.grid(batch, heads, seq)), (cfg.threads, 1, 1), regs,
                                             cfg.dynamic_shared_bytes))]


# Chapter 7: the compiled naive forward (cuBLAS for the matmuls, one Inductor softmax between),
# and compiled flex (one template kernel).
COMPILED_NAIVE = [kernel("extern_kernels.bmm", GEMM_NNT), kernel("triton_per_fused__softmax_masked_fill_mul_0",
                                                                 "triton_per_fused__softmax_masked_fill_mul_0"),
                  kernel("extern_kernels.bmm", GEMM_TNN)]
COMPILED_FLEX = [kernel("triton_tem_fused_0", "triton_tem_fused_0", ((16, 64, 1), (256, 1, 1), 168, 98304))]

# Chapter 8: a compiled transformer block; the MLP's fc_in and fc_out are nvjet GEMMs with
# Inductor's GELU pass between them.
COMPILED_BLOCK = [kernel("triton_per_fused_native_layer_norm_0", "triton_per_fused_native_layer_norm_0"),
                  kernel("extern_kernels.addmm", GEMM_TNT), kernel("aten::_flash_attention_forward", FLASH),
                  kernel("extern_kernels.addmm", GEMM_XMMA),
                  kernel("triton_per_fused_add_native_layer_norm_1", "triton_per_fused_add_native_layer_norm_1"),
                  kernel("extern_kernels.addmm", GEMM_TNT), kernel("triton_poi_fused_gelu_view_2",
                                                                   "triton_poi_fused_gelu_view_2"),
                  kernel("extern_kernels.addmm", GEMM_NNT), kernel("triton_poi_fused_add_3", "triton_poi_fused_add_3")]
# The same block eager: ATen's GELU kernel between the two addmm GEMMs.
EAGER_BLOCK_MLP = [kernel("aten::addmm", GEMM_TNT), kernel("aten::gelu", GELU), kernel("aten::addmm", GEMM_NNT)]


def training_step(forward: list[Row], backward: list[str]) -> list[Row]:
    """Chapter 9: the next batch copied in on a side stream (an input pipeline's prefetch, so
    the step's GPU work is on two streams), a forward on the caller's thread, then the backward's
    kernels from the autograd engine's thread, and the gradient buckets zeroed on a third."""
    return ([copy("aten::copy_", HTOD, stream=SIDE), *forward]
            + [kernel("autograd::engine::evaluate_function", n, tid=ENGINE_TID) for n in backward]
            + [copy("aten::zero_", MEMSET, cat="gpu_memset", stream=SIDE2)])


BACKWARD = {"naive": training_step(NAIVE, [GEMM_TNT, GEMM_NNT, SOFTMAX_BWD, FILL, MUL, GEMM_TNN, GEMM_NNT]),
            "sdpa_flash": training_step(FUSED["sdpa_flash"], [FLASH_BWD])}


# ---- what a benchmark sweep on an H100 returns -------------------------------------------------

# TFLOP/s of a causal bf16 forward (forward+backward: 0.7x), chosen, not measured (see above).
H100_TFLOPS = {"naive": 40.0, "inplace": 45.0, "sdpa_math": 30.0, "sdpa_flash": 330.0, "sdpa_efficient": 200.0,
               "sdpa_cudnn": 420.0, "triton": 300.0, "cuda_v2": 150.0, "cuda_v1": 15.0}


def bench_point(impl: str, seq: int, mode: str = FORWARD, status: str = "ok", head_dim: int = 64) -> BenchResult:
    """One point of an H100 sweep: its FLOPs and bytes as the sweep counts them, a median at
    ``impl``'s rate, the spread of a quiet GPU; a failed point carries its status and no time."""
    point = sweep.new_point(impl, torch.device("cuda"), torch.bfloat16, 4, 16, seq, head_dim, True, mode)
    if status != "ok":
        point.status, point.reason = status, f"{impl}: {status} (fixture)"
        return point
    rate = H100_TFLOPS[impl] * (0.7 if mode == FORWARD_BACKWARD else 1.0)
    point.median_ms = point.flops / (rate * 1e12) * 1e3
    point.p10_ms, point.p90_ms, point.reps = 0.98 * point.median_ms, 1.04 * point.median_ms, 100
    sweep.rates(point)
    return point


def sweep_points(impls: Iterable[str], seqs: Iterable[int] = (1024, 2048, 4096), modes: Iterable[str] = (FORWARD,),
                 failed: Optional[dict] = None) -> BenchResults:
    """A sweep's points on an H100, every ``impl`` at every S and mode, with the run's device
    description; ``failed`` maps (impl, seq, mode) to the status of a point that did not run."""
    failed = failed or {}
    rows = [bench_point(i, s, m, failed.get((i, s, m), "ok")) for i in impls for m in modes for s in seqs]
    peaks = devices.match_gpu(H100["name"])
    assert peaks is not None, "kernels.hw.devices has the H100 SXM's datasheet row"
    return BenchResults(rows, meta={"device": {"name": H100["name"], "kind": "cuda", "capability": "sm_90",
                                               "peaks": peaks.as_dict()}})

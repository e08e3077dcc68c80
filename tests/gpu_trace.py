"""A synthetic GPU trace, shaped like torch.profiler's Chrome export on an A100.

Until the repository holds a recorded GPU trace, this stands in for one: CPU ops inside a
``naive`` label, ``cudaLaunchKernel``/``cudaMemcpyAsync`` runtime calls linked by
correlation id to ``kernel`` and ``gpu_memcpy`` events on the GPU's own pid/tid, with
the launch footprint fields CUPTI records. Kernel names and the 6-kernel shape follow the
source article's A100 naive forward (REFERENCE.md).
"""
from __future__ import annotations

CPU_PID, CPU_TID, GPU_PID, GPU_TID = 4242, 4242, 0, 7

# (op name, input dims, kernel name or None, kernel category, kernel footprint)
NAIVE_A100 = [
    ("aten::matmul", [[1, 8, 1024, 64], [1, 8, 64, 1024]],
     "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "kernel", ([8, 8, 8], [256, 1, 1], 238, 65536, 25.0)),
    ("aten::mul", [[1, 8, 1024, 1024], []],
     "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)",
     "kernel", ([8192, 1, 1], [128, 1, 1], 26, 0, 92.3)),
    ("aten::masked_fill", [[1, 8, 1024, 1024], [1024, 1024], []],
     "Memcpy DtoD (Device -> Device)", "gpu_memcpy", None),
    ("aten::masked_fill_", [[1, 8, 1024, 1024], [1024, 1024], []],
     "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, at::native::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, at::native::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1})",
     "kernel", ([32768, 1, 1], [128, 1, 1], 20, 0, 88.1)),
    ("aten::softmax", [[1, 8, 1024, 1024], [], []],
     "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)",
     "kernel", ([2048, 1, 1], [128, 1, 1], 56, 0, 70.4)),
    ("aten::matmul", [[1, 8, 1024, 1024], [1, 8, 1024, 64]],
     "ampere_bf16_s16816gemm_bf16_64x64_sliced1x2_ldg8_f2f_stages_64x5_nn", "kernel", ([1, 16, 8], [128, 1, 1], 168, 73728, 17.2)),
]


def naive_a100_trace(steps: int = 2) -> dict:
    """Chrome-trace JSON of ``steps`` labelled naive forwards with their GPU lane."""
    events = [
        {"ph": "M", "name": "process_name", "pid": CPU_PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    ts, corr, ext = 1_000_000.0, 100, 1
    for step in range(steps):
        start = ts
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 3}",
                       "pid": CPU_PID, "tid": CPU_TID, "ts": start - 5, "dur": 0, "args": {}})
        label = {"ph": "X", "cat": "user_annotation", "name": "naive", "pid": CPU_PID, "tid": CPU_TID,
                 "ts": start, "dur": 0, "args": {"External id": ext}}
        events.append(label)
        gpu_ts = start + 40
        ts += 10
        for op, dims, kernel, cat, footprint in NAIVE_A100:
            ext += 1
            op_ev = {"ph": "X", "cat": "cpu_op", "name": op, "pid": CPU_PID, "tid": CPU_TID, "ts": ts, "dur": 30.0,
                     "args": {"External id": ext, "Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)}}
            events.append(op_ev)
            launcher = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": launcher, "pid": CPU_PID, "tid": CPU_TID,
                           "ts": ts + 20, "dur": 6.0, "args": {"External id": ext, "correlation": corr, "cbid": 211}})
            gpu_dur = 25.0 if "gemm" in kernel else 12.0
            args = {"External id": ext, "correlation": corr, "device": 0, "context": 1, "stream": GPU_TID}
            if footprint:
                grid, block, regs, smem, occ = footprint
                args.update({"grid": grid, "block": block, "registers per thread": regs, "shared memory": smem,
                             "blocks per SM": 1.5, "warps per SM": 12.0, "est. achieved occupancy %": occ})
            else:
                args.update({"bytes": 16 * 2**20, "memory bandwidth (GB/s)": 1300.0})
            gpu_ts = max(gpu_ts, ts + 30)
            events.append({"ph": "X", "cat": cat, "name": kernel, "pid": GPU_PID, "tid": GPU_TID,
                           "ts": gpu_ts, "dur": gpu_dur, "args": args})
            events.append({"ph": "f", "id": corr, "pid": GPU_PID, "tid": GPU_TID, "ts": gpu_ts,
                           "cat": "ac2g", "name": "ac2g", "bp": "e"})
            gpu_ts += gpu_dur + 1
            ts += 35
        # the CPU is done launching long before the GPU is done running
        label["dur"] = ts - start
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": CPU_PID,
                       "tid": CPU_TID, "ts": ts + 5, "dur": gpu_ts - ts, "args": {"correlation": corr + 1}})
        corr += 2
        ts = max(ts, gpu_ts) + 100
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB",
            "computeMajor": 8, "computeMinor": 0, "numSms": 108, "regsPerMultiprocessor": 65536,
            "maxThreadsPerMultiProcessor": 2048}], "traceEvents": events}

// The torch side of the CUDA kernels: check tensors, describe them to the launchers.
//
// Built only where torch has CUDA (torch.utils.cpp_extension.load in kernels/cuda/flash.py).
// The kernels themselves never see torch: they get a flash::Problem (raw pointers, sizes,
// element strides) and a CUDA stream, which keeps them compilable on their own with nvcc.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <climits>

#include "flash_api.h"

namespace {

flash::Dtype dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return flash::Dtype::Float32;
    case torch::kFloat16: return flash::Dtype::Float16;
    case torch::kBFloat16: return flash::Dtype::BFloat16;
    default: TORCH_CHECK(false, "unsupported dtype ", t.scalar_type(), "; expected float32, float16 or bfloat16");
  }
  return flash::Dtype::Float32;  // not reached
}

void copy_strides(const torch::Tensor& t, int64_t (&out)[4]) {
  for (int i = 0; i < 4; ++i) out[i] = t.stride(i);
}

void check_tensor(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK(t.is_cuda(), name, " must be on a CUDA device");
  TORCH_CHECK(t.dim() == 4, name, " must be [batch, heads, seq, head_dim], got rank ", t.dim());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "dtype mismatch: ", name, " is ", t.scalar_type(),
              ", q is ", q.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "device mismatch: ", name, " is on ", t.device(), ", q on ", q.device());
}

// q, out: [B, H, Sq, D]; k, v: [B, Hkv, Sk, D] with H a multiple of Hkv; CUDA tensors of one
// dtype, any strides. out is written.
flash::Problem describe(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        torch::Tensor& out, bool causal, double scale) {
  check_tensor(q, "q", q);
  check_tensor(k, "k", q);
  check_tensor(v, "v", q);
  check_tensor(out, "out", q);
  TORCH_CHECK(k.sizes() == v.sizes(), "shape mismatch: k ", k.sizes(), " vs v ", v.sizes());
  TORCH_CHECK(out.sizes() == q.sizes(), "shape mismatch: out ", out.sizes(), " vs q ", q.sizes());
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "shape mismatch: k ", k.sizes(), " vs q ",
              q.sizes(), " (batch and head_dim must agree)");
  TORCH_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, "q's ", q.size(1),
              " heads must be a multiple of k's ", k.size(1));
  // Row indices are 32-bit in the kernels, and a block's last padded row (up to 128 past the
  // end) must not overflow either.
  TORCH_CHECK(q.size(2) <= INT32_MAX - 256 && k.size(2) <= INT32_MAX - 256, "sequence too long");
  TORCH_CHECK(q.size(0) * q.size(1) <= INT32_MAX, "batch * heads too large");
  flash::Problem p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.kv_heads = static_cast<int>(k.size(1));
  p.seq_q = static_cast<int>(q.size(2));
  p.seq_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  copy_strides(q, p.q_stride);
  copy_strides(k, p.k_stride);
  copy_strides(v, p.v_stride);
  copy_strides(out, p.o_stride);
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.dtype = dtype_of(q);
  return p;
}

using Launcher = int (*)(const flash::Problem*, void*);

void run(Launcher launch, const char* name, const torch::Tensor& q, const torch::Tensor& k,
         const torch::Tensor& v, torch::Tensor& out, bool causal, double scale) {
  const flash::Problem p = describe(q, k, v, out, causal, scale);
  // Launch on q's GPU, on torch's current stream there (what at::cuda::getCurrentCUDAStream
  // returns; the c10 header is lighter), so the kernel is ordered with torch's own work.
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const int status = launch(&p, stream);
  TORCH_CHECK(status == 0, name, " launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(status)));
}

void forward_v1(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                torch::Tensor& out, bool causal, double scale) {
  // v1 puts batch * heads on grid.y, whose limit is 65,535 (v2 puts it on x).
  TORCH_CHECK(q.size(0) * q.size(1) <= 65535, "flash_v1: batch * heads must be <= 65535, got ",
              q.size(0) * q.size(1));
  run(flash_v1_forward, "flash_v1", q, k, v, out, causal, scale);
}

void forward_v2(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                torch::Tensor& out, bool causal, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat16 || q.scalar_type() == torch::kBFloat16,
              "flash_v2 takes float16 or bfloat16");
  run(flash_v2_forward, "flash_v2", q, k, v, out, causal, scale);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Hand-written FlashAttention forward kernels (Attention, Profiled, chapter 5)";
  m.def("forward_v1", &forward_v1, "v1 (CUDA cores, fp32 math) into out",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"), py::arg("scale"));
  m.def("forward_v2", &forward_v2, "v2 (tensor cores, fp16/bf16) into out",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"), py::arg("scale"));
}

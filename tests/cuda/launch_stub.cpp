// A stand-in CUDA runtime that records what the launchers of kernels/csrc ask for.
//
// tests/test_cuda_compile.py links this file with the host objects nvcc made of flash_v1.cu
// and flash_v2.cu (nvcc -c, so the launchers and the registration code nvcc generates are
// real) instead of libcudart. No GPU is touched: every runtime call the objects make lands
// here, and a launch is recorded instead of run. So the tests can check on a CPU-only machine
// which kernel instantiation a problem launches, with which grid, block and dynamic shared
// memory, and that the launcher opted in to that much shared memory first.
//
// Input, one problem per line on stdin:
//   version dtype batch heads kv_heads seq_q seq_k head_dim causal layout
//   (version v1|v2, dtype 0 fp32 / 1 fp16 / 2 bf16, causal 0|1, layout aligned|offset|dstride)
// Output, per problem: for each call the launcher makes
//   "attr <mangled kernel> <attribute> <value>" (max_dynamic_shared for the opt-in) and
//   "launch <mangled kernel> <grid x y z> <block x y z> <shared bytes> <vec 0|1|-1> <seq_q> <seq_k> <kv_heads>",
// then "status S" (what the launcher returned) and "end".
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "flash_api.h"

namespace {

std::map<const void*, std::string> names;  // host stub -> mangled device name

struct Configuration {
  dim3 grid, block;
  size_t shared = 0;
  cudaStream_t stream = nullptr;
} pending;

const char* name_of(const void* f) {
  auto it = names.find(f);
  return it == names.end() ? "(unregistered)" : it->second.c_str();
}

}  // namespace

// ---- what nvcc's generated registration and launch code calls (crt/host_runtime.h) ----------

extern "C" {

void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char* host_fun, char*, const char* device_name, int, uint3*, uint3*,
                            dim3*, dim3*, int*) {
  names[host_fun] = device_name;
}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream) {
  pending = {grid, block, shared, stream};
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  *grid = pending.grid;
  *block = pending.block;
  *shared = pending.shared;
  *static_cast<cudaStream_t*>(stream) = pending.stream;
  return cudaSuccess;
}

// CUDA 12.8+ launches through a kernel handle; the handle here is the host stub itself.
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fun) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fun));
  return cudaSuccess;
}

static void record_launch(const void* fun, dim3 grid, dim3 block, void** args, size_t shared) {
  const flash::Problem& p = *static_cast<const flash::Problem*>(args[0]);
  // v2's kernels take (Problem, bool vec); v1's only the Problem.
  const std::string name = name_of(fun);
  const int vec = name.find("flash_v2") != std::string::npos ? int(*static_cast<const bool*>(args[1])) : -1;
  std::printf("launch %s %u %u %u %u %u %u %zu %d %d %d %d\n", name.c_str(), grid.x, grid.y, grid.z, block.x,
              block.y, block.z, shared, vec, p.seq_q, p.seq_k, p.kv_heads);
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                               cudaStream_t) {
  record_launch(reinterpret_cast<const void*>(kernel), grid, block, args, shared);
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                                    cudaStream_t stream) {
  return __cudaLaunchKernel(kernel, grid, block, args, shared, stream);
}
// Older toolkits launch through the public entry point instead.
cudaError_t cudaLaunchKernel(const void* fun, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t) {
  record_launch(fun, grid, block, args, shared);
  return cudaSuccess;
}

// ---- the public runtime calls the launchers make ------------------------------------------------

cudaError_t cudaFuncSetAttribute(const void* fun, enum cudaFuncAttribute attr, int value) {
  const std::string what = attr == cudaFuncAttributeMaxDynamicSharedMemorySize ? "max_dynamic_shared" : std::to_string(int(attr));
  std::printf("attr %s %s %d\n", name_of(fun), what.c_str(), value);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }

}  // extern "C"

// ---- the problems ------------------------------------------------------------------------------

namespace {

// Strides of a [B, H, S, D] tensor: contiguous, or with D not the fastest axis ("dstride",
// a transposed [B, H, D, S] storage) which rules out 16-byte copies.
void strides(int h, int s, int d, bool d_fastest, int64_t (&out)[4]) {
  out[0] = int64_t(h) * s * d;
  out[1] = int64_t(s) * d;
  out[2] = d_fastest ? d : 1;
  out[3] = d_fastest ? 1 : s;
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string version, layout;
    int dtype, causal;
    flash::Problem p{};
    in >> version >> dtype >> p.batch >> p.heads >> p.kv_heads >> p.seq_q >> p.seq_k >> p.head_dim >> causal >> layout;
    p.dtype = static_cast<flash::Dtype>(dtype);
    p.causal = causal != 0;
    p.scale = 0.125f;
    // Never dereferenced: nothing runs. 16-byte aligned, or 2 bytes off for "offset".
    const uintptr_t base = layout == "offset" ? 0x10000002u : 0x10000000u;
    p.q = reinterpret_cast<const void*>(base);
    p.k = reinterpret_cast<const void*>(base + 0x1000000);
    p.v = reinterpret_cast<const void*>(base + 0x2000000);
    p.o = reinterpret_cast<void*>(base + 0x3000000);
    const bool d_fastest = layout != "dstride";
    strides(p.heads, p.seq_q, p.head_dim, d_fastest, p.q_stride);
    strides(p.kv_heads, p.seq_k, p.head_dim, d_fastest, p.k_stride);
    strides(p.kv_heads, p.seq_k, p.head_dim, d_fastest, p.v_stride);
    strides(p.heads, p.seq_q, p.head_dim, true, p.o_stride);
    const int status = version == "v1" ? flash_v1_forward(&p, nullptr) : flash_v2_forward(&p, nullptr);
    std::printf("status %d\nend\n", status);
    std::fflush(stdout);
  }
  return 0;
}

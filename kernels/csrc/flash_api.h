// The contract between the torch binding and the torch-free kernels.
//
// Everything here is plain C++ (no CUDA, no torch) so that a host compiler, nvcc and a
// test program can all read it. Tile sizes live here too: the launchers derive their
// dynamic shared memory from them, and kernels/cuda_flash.py mirrors the same formulas
// (a test compiles this header and compares the numbers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flash {

// Element types a launcher accepts, named independently of torch.
enum class Dtype : int { Float32 = 0, Float16 = 1, BFloat16 = 2 };

// One attention problem: q, k, v, o are [B, H, S, D] tensors described by a base pointer
// and element strides, so any torch view (e.g. a transposed [B, S, H, D]) works unchanged.
struct Problem {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  int batch, heads, seq, head_dim;
  int64_t q_stride[4];  // strides of q along B, H, S, D, in elements
  int64_t k_stride[4];
  int64_t v_stride[4];
  int64_t o_stride[4];
  float scale;          // multiplies q.k before the softmax
  bool causal;          // key j is hidden from query i when j > i
  Dtype dtype;
};

// ---- v1: one thread block per (32 queries, batch*head), everything staged in fp32 ------
constexpr int kV1BlockM = 32;   // query rows per block
constexpr int kV1BlockN = 32;   // key rows per shared-memory tile
constexpr int kV1Threads = 128;

// Shared memory of v1, in bytes: Q [M][D], K [N][D+1] (the +1 column keeps the 32 threads
// of a warp on 32 different banks), V [N][D], scores [M][N+1] (same reason), row factors [M].
constexpr size_t v1_smem_bytes(int head_dim) {
  return sizeof(float) * (size_t(kV1BlockM) * head_dim + size_t(kV1BlockN) * (head_dim + 1) +
                          size_t(kV1BlockN) * head_dim + size_t(kV1BlockM) * (kV1BlockN + 1) +
                          size_t(kV1BlockM));
}

// ---- v2: tensor cores, 4 warps x 16 query rows, K/V tiles of 64 keys in 16-bit --------
constexpr int kV2BlockM = 64;
constexpr int kV2BlockN = 64;
constexpr int kV2Threads = 128;
constexpr int kV2Pad = 8;       // 8 extra halves (16 bytes) per row: conflict-free ldmatrix

// Shared memory of v2, in bytes: Q, K and V tiles of 64 rows x (D + 8) 16-bit elements.
constexpr size_t v2_smem_bytes(int head_dim) {
  return 2 * size_t(kV2BlockM + 2 * kV2BlockN) * size_t(head_dim + kV2Pad);
}

}  // namespace flash

// Launchers: queue the kernel on `stream` and return the launch status (0 = cudaSuccess).
// They return an error code instead of throwing, so the binding decides how to report it.
// `stream` is a cudaStream_t passed as void* to keep this header free of CUDA includes.
extern "C" int flash_v1_forward(const flash::Problem* problem, void* stream);
extern "C" int flash_v2_forward(const flash::Problem* problem, void* stream);

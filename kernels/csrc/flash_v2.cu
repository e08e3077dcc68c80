// FlashAttention forward, version 2: the same algorithm on tensor cores (FlashAttention-2).
//
// What changes from flash_v1.cu, and why:
//  * Both matmuls (S = Q K^T and O += P V) run on tensor cores through the PTX instruction
//    mma.sync.aligned.m16n8k16: one warp multiplies a 16x16 by a 16x8 tile of fp16/bf16
//    values into fp32 accumulators that live in registers, spread over the warp's 32 lanes.
//  * Each of the 4 warps owns 16 query rows, so a row's softmax state (max, sum) and its
//    output accumulators never leave the 4 lanes that hold them: no shared memory and no
//    __syncthreads() for the softmax, only two warp shuffles per row statistic.
//  * P never goes through shared memory: the accumulator layout of S (per lane: rows g and
//    g+8, columns 2t and 2t+1 of each 8-column tile) is exactly the layout mma wants for its
//    A operand, so P is rounded to 16 bits and fed straight back in.
//  * Shared memory is filled with 16-byte cp.async copies (global -> shared without passing
//    through registers), issued one tile ahead: K_{j+1} loads while we compute the softmax
//    of tile j, V_{j+1} while the next scores are computed. Inputs whose layout does not
//    allow 16-byte copies (an odd stride, an unaligned view) take a scalar path instead.
//  * Causal: key tiles entirely above the diagonal are never loaded (block skipping); only
//    tiles that cross the diagonal or the ragged end of the sequence pay for masking.
//  * Fragments are read from shared memory with ldmatrix (8x8 16-bit matrices per lane
//    group); each shared row is padded by 16 bytes so the 8 rows one ldmatrix reads sit in
//    8 different banks.
//
// Lane bookkeeping used throughout (PTX ISA, "Matrix fragments for mma.m16n8k16"):
//   g = lane / 4 (row group), t = lane % 4 (thread in group).
//   A (16x16, row major) regs a0..a3: (row g, cols 2t..2t+1), (row g+8, same cols),
//                                     (row g, cols 8+2t..), (row g+8, cols 8+2t..)
//   B (16x8, col major)  regs b0, b1: (k rows 2t..2t+1, col g), (k rows 8+2t.., col g)
//   C (16x8, fp32)       c0..c3:      (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "flash_api.h"

namespace {

using flash::kV2BlockM;
using flash::kV2BlockN;
using flash::kV2Pad;
using flash::kV2Threads;

constexpr float kLog2e = 1.4426950408889634f;

// ---- 16-bit element helpers --------------------------------------------------------------

// float -> 16-bit by name: torch builds with implicit half/bf16 conversions switched off
// (-D__CUDA_NO_HALF_CONVERSIONS__ and friends), so `T(x)` would not compile there.
__device__ __forceinline__ __half to_16bit(float x, __half) { return __float2half_rn(x); }
__device__ __forceinline__ __nv_bfloat16 to_16bit(float x, __nv_bfloat16) { return __float2bfloat16_rn(x); }

// Two floats -> one 32-bit register of two 16-bit values, first value in the low half.
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// D = A * B + D with fp32 accumulators; the element type picks the PTX instruction.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1, __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1, __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row addresses of
// matrix i, and each lane receives (row lane/4, columns 2*(lane%4), +1) of every matrix.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}
// The same, transposed: each lane receives (rows 2*(lane%4), +1, column lane/4).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

// 16-byte asynchronous copy global -> shared. With `valid` false nothing is read and the
// 16 bytes are zero-filled (the src-size operand is 0), which is how ragged tails are padded.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most `n` of the committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// ---- global -> shared tiles ---------------------------------------------------------------

// Copy rows [first, first + kRows) of one (batch, head) into a shared tile with row pitch
// D + kV2Pad; rows at or past `seq` become zeros (P = 0 times a zero V row stays 0, whereas
// stale shared memory could hold NaN). VEC: 16-byte cp.async (needs unit column stride and
// 16-byte aligned rows, checked by the launcher); otherwise element by element. `vec` is
// the same for every thread of a launch, so the branch never diverges; a runtime flag
// rather than a template parameter halves the number of kernels to compile.
template <typename T, int D, int kRows>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t row_stride,
                                          int64_t col_stride, int first, int seq, bool vec) {
  constexpr int kPitch = D + kV2Pad;
  if (vec) {
    constexpr int kChunksPerRow = D / 8;  // 8 x 16-bit = 16 bytes
#pragma unroll
    for (int idx = threadIdx.x; idx < kRows * kChunksPerRow; idx += kV2Threads) {
      const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
      const bool valid = first + r < seq;
      const T* from = valid ? src + (first + r) * row_stride + c : src;  // never out of bounds
      cp_async_16(tile + r * kPitch + c, from, valid);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * D; idx += kV2Threads) {
      const int r = idx / D, c = idx % D;
      const int row = first + r;
      tile[r * kPitch + c] = row < seq ? src[row * row_stride + c * col_stride] : to_16bit(0.0f, T());
    }
  }
}

// ---- the kernel ------------------------------------------------------------------------------

// Launch bounds: 128 threads, and at least 2 resident blocks per SM. That caps registers at
// 65,536 / (2 * 128) = 256 per thread (255 usable), so ptxas never has to spill; without
// the second number it aimed at 4 blocks (128 registers) for D = 64 and spilled on sm_90.
template <typename T, int D>
__global__ void __launch_bounds__(kV2Threads, 2)
flash_v2_kernel(flash::Problem p, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma.sync and cp.async need sm_80; the Python side refuses older GPUs
#else
  constexpr int M = kV2BlockM, N = kV2BlockN, kPitch = D + kV2Pad;
  constexpr int kDSteps = D / 16;   // k-steps of the S = Q K^T product
  constexpr int kNTiles = N / 8;    // 8-column accumulator tiles of S
  constexpr int kDTiles = D / 8;    // 8-column accumulator tiles of O
  static_assert(M == 16 * (kV2Threads / 32), "each warp owns 16 query rows");
  static_assert(D % 16 == 0 && N % 16 == 0, "tiles are whole mma steps");

  extern __shared__ uint4 smem_raw[];  // uint4: 16-byte alignment for cp.async and ldmatrix
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* k_s = q_s + M * kPitch;
  T* v_s = k_s + N * kPitch;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // Heavy causal blocks (many key tiles) launch first: reverse the query-tile order.
  const int q_tile = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int q_first = q_tile * M;
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];
  T* o = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];

  // Causal block skipping: key tiles starting after this block's last query are all masked.
  const int key_end = p.causal ? min(p.seq, q_first + M) : p.seq;
  const int n_tiles = (key_end + N - 1) / N;

  // Prologue: three copy groups in flight, Q, K_0, V_0.
  load_tile<T, D, M>(q_s, q, p.q_stride[2], p.q_stride[3], q_first, p.seq, vec);
  cp_async_commit();
  load_tile<T, D, N>(k_s, k, p.k_stride[2], p.k_stride[3], 0, p.seq, vec);
  cp_async_commit();
  load_tile<T, D, N>(v_s, v, p.v_stride[2], p.v_stride[3], 0, p.seq, vec);
  cp_async_commit();
  cp_async_wait<1>();  // Q and K_0 have landed (V_0 may still be in flight)
  __syncthreads();

  // This warp's 16 rows of Q stay in registers as A fragments for the whole kernel.
  uint32_t q_frag[kDSteps][4];
  {
    // ldmatrix x4 for A: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7),
    // (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) = a0, a1, a2, a3.
    const T* row = q_s + (warp * 16 + lane % 16) * kPitch + (lane / 16) * 8;
#pragma unroll
    for (int ks = 0; ks < kDSteps; ++ks) ldmatrix_x4(q_frag[ks], row + ks * 16);
  }

  // Per lane: output accumulators and softmax state for rows g and g+8 of the warp.
  float o_acc[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // in log2 units: scores times scale * log2(e)
  float row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kLog2e;   // exp(x * scale) = exp2(x * scale * log2 e)
  const int query[2] = {q_first + warp * 16 + g, q_first + warp * 16 + g + 8};

  for (int j = 0; j < n_tiles; ++j) {
    const int k_first = j * N;
    cp_async_wait<1>();  // K_j has landed (V_j may still be in flight)
    __syncthreads();

    // S = Q K_j^T. ldmatrix x4 on K (rows = keys) gives B fragments for two 8-key tiles:
    // (keys 0-7, d 0-7) = b0 and (keys 0-7, d 8-15) = b1 of tile n; then the same for n+1.
    float s[kNTiles][4];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDSteps; ++ks) {
#pragma unroll
      for (int n = 0; n < kNTiles; n += 2) {
        uint32_t kb[4];
        const int key = n * 8 + (lane % 8) + (lane / 16) * 8;
        const int col = ks * 16 + ((lane / 8) % 2) * 8;
        ldmatrix_x4(kb, k_s + key * kPitch + col);
        mma_16x8x16(s[n], q_frag[ks], kb[0], kb[1], T());
        mma_16x8x16(s[n + 1], q_frag[ks], kb[2], kb[3], T());
      }
    }
    __syncthreads();  // every warp is done with K_j: its buffer may be refilled
    if (j + 1 < n_tiles) {
      load_tile<T, D, N>(k_s, k, p.k_stride[2], p.k_stride[3], k_first + N, p.seq, vec);
      cp_async_commit();
    }

    // Mask only where needed: the ragged last tile, and tiles crossing the diagonal.
    const bool needs_mask = k_first + N > p.seq || (p.causal && k_first + N - 1 > q_first);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k_first + n * 8 + 2 * t + (e % 2);
        const bool hidden = needs_mask && (key >= p.seq || (p.causal && key > query[e / 2]));
        s[n][e] = hidden ? -INFINITY : s[n][e] * scale_log2;
      }
    }

    // Online softmax. Row r's 64 scores are spread over the 4 lanes of group g (2 columns
    // per 8-column tile each): reduce within the lane, then across the group by shuffles.
    uint32_t p_frag[N / 16][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row that has seen only masked keys keeps max -inf: subtract 0 instead, so that
      // exp2(-inf - (-inf)) = NaN never happens (its probabilities are exp2(-inf) = 0).
      const float shift = new_max == -INFINITY ? 0.0f : new_max;
      const float alpha = exp2f(row_max[r] - shift);
      row_max[r] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - shift);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - shift);
        tile_sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      // The lane's partial sum is enough: the group's four partials are added at the end.
      row_sum[r] = row_sum[r] * alpha + tile_sum;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) {
        o_acc[d][2 * r] *= alpha;
        o_acc[d][2 * r + 1] *= alpha;
      }
    }
    // C layout of S tiles 2kk and 2kk+1 = A layout of P for keys 16kk..16kk+15.
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      p_frag[kk][0] = pack2(s[2 * kk][0], s[2 * kk][1], T());          // row g,   keys 2t..
      p_frag[kk][1] = pack2(s[2 * kk][2], s[2 * kk][3], T());          // row g+8, keys 2t..
      p_frag[kk][2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], T());  // row g,   keys 8+2t..
      p_frag[kk][3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], T());  // row g+8, keys 8+2t..
    }

    // O += P V_j. V is stored [key][d], i.e. row major K x N for the B operand, so it is
    // read transposed: ldmatrix.trans x4 gives (keys 0-7, d 0-7) = b0, (keys 8-15, d 0-7)
    // = b1 of d-tile dt, then the same two for d-tile dt+1.
    if (j + 1 < n_tiles) cp_async_wait<1>(); else cp_async_wait<0>();  // V_j has landed
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; dt += 2) {
        uint32_t vb[4];
        const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
        const int col = dt * 8 + (lane / 16) * 8;
        ldmatrix_x4_trans(vb, v_s + key * kPitch + col);
        mma_16x8x16(o_acc[dt], p_frag[kk], vb[0], vb[1], T());
        mma_16x8x16(o_acc[dt + 1], p_frag[kk], vb[2], vb[3], T());
      }
    }
    __syncthreads();  // every warp is done with V_j: its buffer may be refilled
    if (j + 1 < n_tiles) {
      load_tile<T, D, N>(v_s, v, p.v_stride[2], p.v_stride[3], k_first + N, p.seq, vec);
      cp_async_commit();
    }
  }

  // Epilogue: complete each row's sum across its 4 lanes, divide, store rows inside seq.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    if (query[r] >= p.seq) continue;
    const float inv = 1.0f / row_sum[r];
    T* out_row = o + query[r] * p.o_stride[2];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int col = dt * 8 + 2 * t;
      const float lo = o_acc[dt][2 * r] * inv, hi = o_acc[dt][2 * r + 1] * inv;
      if (vec) {  // two neighbours in one 4-byte store
        *reinterpret_cast<uint32_t*>(out_row + col) = pack2(lo, hi, T());
      } else {
        out_row[col * p.o_stride[3]] = to_16bit(lo, T());
        out_row[(col + 1) * p.o_stride[3]] = to_16bit(hi, T());
      }
    }
  }
#endif
}

// 16-byte copies need unit column stride, every row start 16-byte aligned (all other
// strides a multiple of 8 elements) and an aligned base pointer; the output likewise for
// its 4-byte stores.
bool can_vectorise(const void* base, const int64_t (&stride)[4]) {
  const bool aligned = reinterpret_cast<uintptr_t>(base) % 16 == 0;
  return aligned && stride[3] == 1 && stride[0] % 8 == 0 && stride[1] % 8 == 0 && stride[2] % 8 == 0;
}

template <typename T, int D>
int launch(const flash::Problem& p, cudaStream_t stream) {
  const bool vec = can_vectorise(p.q, p.q_stride) && can_vectorise(p.k, p.k_stride) &&
                   can_vectorise(p.v, p.v_stride) && can_vectorise(p.o, p.o_stride);
  const size_t smem = flash::v2_smem_bytes(D);
  auto kernel = flash_v2_kernel<T, D>;
  // Above 48 KiB a kernel must opt in to dynamic shared memory (D = 128 needs 51 KiB).
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid((p.seq + kV2BlockM - 1) / kV2BlockM, p.batch * p.heads);
  kernel<<<grid, kV2Threads, smem, stream>>>(p, vec);
  return cudaGetLastError();
}

template <typename T>
int launch_for_dim(const flash::Problem& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return launch<T, 64>(p, stream);
    case 128: return launch<T, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" int flash_v2_forward(const flash::Problem* problem, void* stream) {
  const flash::Problem& p = *problem;
  if (p.seq < 1 || p.batch < 1 || p.heads < 1) return cudaErrorInvalidValue;
  if (int64_t(p.batch) * p.heads > 65535) return cudaErrorInvalidConfiguration;  // grid.y limit
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case flash::Dtype::Float16: return launch_for_dim<__half>(p, s);
    case flash::Dtype::BFloat16: return launch_for_dim<__nv_bfloat16>(p, s);
    default: return cudaErrorInvalidValue;  // tensor cores here take 16-bit inputs only
  }
}

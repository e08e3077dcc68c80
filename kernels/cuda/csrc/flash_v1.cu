// FlashAttention forward, version 1: the algorithm with nothing in the way.
//
// One thread block owns 32 query rows of one (batch, head). It walks over the keys in
// tiles of 32: each K/V tile is copied into shared memory (converted to fp32), the block
// computes the 32x32 scores, updates a running ("online") softmax per query row, and adds
// P @ V into fp32 accumulators held in registers. The S x S score matrix never exists in
// global memory, which is the whole point of FlashAttention.
//
// Three phases per tile, separated by __syncthreads():
//   1. scores  S[r][c] = scale * q_r . k_c    (128 threads, 8 scores each, masked to -inf)
//   2. softmax one thread per query row: new running max m, rescale factor alpha,
//              P = exp(S - m), running sum l
//   3. output  O[r][d] = alpha_r * O[r][d] + sum_c P[r][c] * V[c][d]
// At the end O[r] / l[r] is written back in the input's dtype.
//
// It is deliberately plain: CUDA cores only, fp32 everywhere, one row per thread in the
// softmax. flash_v2.cu is the fast version; this one is the version to read first.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "flash_api.h"

namespace {

using flash::kV1BlockM;
using flash::kV1BlockN;
using flash::kV1Threads;

// Loads convert to fp32 at once; stores convert back. One overload per input dtype.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// A [rows x D] slice of one (batch, head): base pointer plus the two strides we walk.
template <typename T>
struct Rows {
  const T* base;
  int64_t row_stride, col_stride;
};

// Copy rows [first, first + count) of `src` into shared memory `dst` (row pitch `pitch`),
// converting to fp32. Rows past the end of the sequence become zeros: a zero V row times a
// zero probability stays zero, whereas uninitialised memory could hold NaN (0 * NaN = NaN).
template <typename T, int D>
__device__ void load_tile(float* dst, int pitch, Rows<T> src, int first, int count, int seq) {
  for (int idx = threadIdx.x; idx < count * D; idx += kV1Threads) {
    const int r = idx / D, d = idx % D;  // consecutive threads read consecutive d: coalesced
    const int row = first + r;
    dst[r * pitch + d] =
        row < seq ? to_float(src.base[row * src.row_stride + d * src.col_stride]) : 0.0f;
  }
}

// Launch bounds: 128 threads and at least 2 blocks per SM, i.e. up to 255 registers per
// thread; left to itself ptxas squeezed the fp16/bf16 D=128 kernels into 96 and spilled.
template <typename T, int D>
__global__ void __launch_bounds__(kV1Threads, 2)
flash_v1_kernel(flash::Problem p) {
  constexpr int M = kV1BlockM, N = kV1BlockN;
  // Phase 3 gives each thread one column d and every (threads/D)-th row of the O tile.
  static_assert(kV1Threads % D == 0 && M % (kV1Threads / D) == 0, "O tile must split evenly");
  constexpr int kRowStep = kV1Threads / D;
  constexpr int kRowsPerThread = M / kRowStep;
  // Phase 1 gives each thread one key column c and every (threads/N)-th query row.
  static_assert(kV1Threads % N == 0 && M % (kV1Threads / N) == 0, "S tile must split evenly");
  constexpr int kScoreRowStep = kV1Threads / N;
  constexpr int kScoresPerThread = M / kScoreRowStep;

  extern __shared__ float smem[];
  float* q_s = smem;                   // [M][D]
  float* k_s = q_s + M * D;            // [N][D + 1]
  float* v_s = k_s + N * (D + 1);      // [N][D]
  float* s_s = v_s + N * D;            // [M][N + 1]  scores, then probabilities
  float* row_s = s_s + M * (N + 1);    // [M]  alpha per tile, 1/l at the end

  const int q_first = blockIdx.x * M;
  const int bh = blockIdx.y;
  const int b = bh / p.heads, h = bh % p.heads;
  const int kv_h = h / (p.heads / p.kv_heads);  // grouped-query attention: heads share K/V
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + kv_h * p.k_stride[1];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + kv_h * p.v_stride[1];
  T* o = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];

  load_tile<T, D>(q_s, D, Rows<T>{q, p.q_stride[2], p.q_stride[3]}, q_first, M, p.seq_q);

  // Running softmax state of row `tid` (only threads tid < M own a row in phase 2).
  float row_max = -INFINITY, row_sum = 0.0f;
  float acc[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) acc[i] = 0.0f;
  const int my_col = threadIdx.x % D, my_row0 = threadIdx.x / D;

  // Causal: key tiles that no query of this block can see are skipped (flash_api.h).
  const int key_end = flash::key_tiles(q_first, M, N, p.seq_q, p.seq_k, p.causal).total * N;
  for (int k_first = 0; k_first < key_end; k_first += N) {
    load_tile<T, D>(k_s, D + 1, Rows<T>{k, p.k_stride[2], p.k_stride[3]}, k_first, N, p.seq_k);
    load_tile<T, D>(v_s, D, Rows<T>{v, p.v_stride[2], p.v_stride[3]}, k_first, N, p.seq_k);
    __syncthreads();

    // Phase 1: scores. A warp shares one query row (a broadcast read) and spans 32 keys.
    {
      const int c = threadIdx.x % N, r0 = threadIdx.x / N;
      float dot[kScoresPerThread];
#pragma unroll
      for (int i = 0; i < kScoresPerThread; ++i) dot[i] = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; ++d) {
        const float kd = k_s[c * (D + 1) + d];  // read once, used for every row we own
#pragma unroll
        for (int i = 0; i < kScoresPerThread; ++i) dot[i] += q_s[(r0 + i * kScoreRowStep) * D + d] * kd;
      }
      const int key = k_first + c;
#pragma unroll
      for (int i = 0; i < kScoresPerThread; ++i) {
        const int r = r0 + i * kScoreRowStep, query = q_first + r;
        const bool seen = flash::visible(query, key, p.seq_q, p.seq_k, p.causal);
        s_s[r * (N + 1) + c] = seen ? dot[i] * p.scale : -INFINITY;
      }
    }
    __syncthreads();

    // Phase 2: online softmax, one thread per query row.
    if (threadIdx.x < M) {
      float* s_row = s_s + threadIdx.x * (N + 1);
      float tile_max = -INFINITY;
      for (int c = 0; c < N; ++c) tile_max = fmaxf(tile_max, s_row[c]);
      const float new_max = fmaxf(row_max, tile_max);
      // A row that has seen only masked keys keeps max -inf; subtract 0 instead so that
      // exp(-inf - (-inf)) = NaN never happens (its probabilities are exp(-inf) = 0).
      const float shift = new_max == -INFINITY ? 0.0f : new_max;
      const float alpha = expf(row_max - shift);  // rescales what was summed so far
      float tile_sum = 0.0f;
      for (int c = 0; c < N; ++c) {
        const float prob = expf(s_row[c] - shift);
        s_row[c] = prob;
        tile_sum += prob;
      }
      row_sum = row_sum * alpha + tile_sum;
      row_max = new_max;
      row_s[threadIdx.x] = alpha;
    }
    __syncthreads();

    // Phase 3: O = alpha * O + P @ V. Each thread owns one column of V, read once per key
    // and reused for all its rows; the warp's 32 threads read 32 consecutive columns.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) acc[i] *= row_s[my_row0 + i * kRowStep];
#pragma unroll 2
    for (int c = 0; c < N; ++c) {
      const float vc = v_s[c * D + my_col];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) acc[i] += s_s[(my_row0 + i * kRowStep) * (N + 1) + c] * vc;
    }
    __syncthreads();  // K, V, P and alpha are overwritten by the next tile
  }

  // A row that saw no key (causal, Sq > Sk) has sum 0 and accumulators 0: its output is 0.
  if (threadIdx.x < M) row_s[threadIdx.x] = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = my_row0 + i * kRowStep, query = q_first + r;
    if (query < p.seq_q) o[query * p.o_stride[2] + my_col * p.o_stride[3]] = from_float<T>(acc[i] * row_s[r]);
  }
}

template <typename T, int D>
int launch(const flash::Problem& p, cudaStream_t stream) {
  const size_t smem = flash::v1_smem_bytes(D);
  auto kernel = flash_v1_kernel<T, D>;
  // Above 48 KiB a kernel must opt in to dynamic shared memory (D = 128 needs ~52 KiB).
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid((p.seq_q + kV1BlockM - 1) / kV1BlockM, p.batch * p.heads);
  kernel<<<grid, kV1Threads, smem, stream>>>(p);
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

extern "C" int flash_v1_forward(const flash::Problem* problem, void* stream) {
  const flash::Problem& p = *problem;
  if (p.seq_q < 1 || p.seq_k < 1 || p.batch < 1 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0)
    return cudaErrorInvalidValue;
  if (int64_t(p.batch) * p.heads > 65535) return cudaErrorInvalidConfiguration;  // grid.y limit
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case flash::Dtype::Float32: return launch_for_dim<float>(p, s);
    case flash::Dtype::Float16: return launch_for_dim<__half>(p, s);
    case flash::Dtype::BFloat16: return launch_for_dim<__nv_bfloat16>(p, s);
  }
  return cudaErrorInvalidValue;
}

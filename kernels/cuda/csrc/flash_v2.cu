// FlashAttention forward, version 2: the same algorithm on tensor cores (FlashAttention-2).
//
// What changes from flash_v1.cu, and why:
//  * Both matmuls (S = Q K^T and O += P V) run on tensor cores through the PTX instruction
//    mma.sync.aligned.m16n8k16: one warp multiplies a 16x16 by a 16x8 tile of fp16/bf16
//    values into fp32 accumulators that live in registers, spread over the warp's 32 lanes.
//  * Each of the 8 warps owns 16 query rows (128 per block), so a row's softmax state (max,
//    sum) and its output accumulators never leave the 4 lanes that hold them: no shared
//    memory and no __syncthreads() for the softmax, only two warp shuffles per row statistic.
//  * P never goes through shared memory: the accumulator layout of S (per lane: rows g and
//    g+8, columns 2t and 2t+1 of each 8-column tile) is exactly the layout mma wants for its
//    A operand, so P is rounded to 16 bits and fed straight back in.
//  * K and V are double-buffered: while the warps compute tile j from one buffer, 16-byte
//    cp.async copies (global -> shared without passing through registers) bring tile j + 1
//    into the other. One barrier per tile is enough (see tile_pass). Inputs whose layout does
//    not allow 16-byte copies (an odd stride, an unaligned view) take a scalar path instead.
//  * Masks cost nothing where there is nothing to mask: a tile pass is a template on
//    kMasked, and each block runs its fully visible key tiles through the unmasked
//    instantiation (no per-element test at all) and only the tiles that cross the causal
//    boundary or the end of the keys through the masked one. Tiles that no query of the
//    block can see are never loaded (causal block skipping).
//  * exp(x * scale) is computed as exp2(x * scale * log2 e) with the hardware's ex2.approx:
//    the scale and log2 e fold into one constant, and "scale, subtract the row max" is one
//    fused multiply-add per score.
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

using flash::kV2BlockN;
using flash::kV2Pad;

constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the special-function unit alone (MUFU.EX2): ex2.approx.ftz has no range fix-up
// around it (exp2f, without fast-math flags, adds one for denormal results), and it flushes
// results below 2^-126 to 0, which a probability can afford. ex2(-inf) = +0, as the masked
// scores need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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
template <typename T, int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t row_stride,
                                          int64_t col_stride, int first, int seq, bool vec) {
  constexpr int kPitch = D + kV2Pad;
  if (vec) {
    constexpr int kChunksPerRow = D / 8;  // 8 x 16-bit = 16 bytes
    static_assert(kRows * kChunksPerRow % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
      const bool valid = first + r < seq;
      const T* from = valid ? src + (first + r) * row_stride + c : src;  // never out of bounds
      cp_async_16(tile + r * kPitch + c, from, valid);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * D; idx += kThreads) {
      const int r = idx / D, c = idx % D;
      const int row = first + r;
      tile[r * kPitch + c] = row < seq ? src[row * row_stride + c * col_stride] : to_16bit(0.0f, T());
    }
  }
}

// ---- the design, as switches ----------------------------------------------------------------

// The choices that separate this kernel from its first version, as compile-time switches, so
// that chapter 5 can compile each revision of the design from this one source and read what
// it does to the kernel's resources (kernels/cuda/design.py, design_revisions). The launcher uses Production:
// every switch on. Off, they give back the first version's behaviour: 64-row tiles (4 warps),
// the mask tested on every element of every tile, exp2f after a separate multiply by the
// scale, and one K/V buffer (load the next tile only after everyone is done with this one).
template <int kBlockM, bool kSplitMask, bool kFastExp2, bool kDoubleBuffer>
struct Design {
  static constexpr int M = kBlockM;                      // query rows per block, 16 per warp
  static constexpr int kThreads = 32 * (kBlockM / 16);
  static constexpr bool split_mask = kSplitMask;         // fully visible tiles skip the mask
  static constexpr bool fast_exp2 = kFastExp2;           // ex2.approx.ftz, scale in one FMA
  static constexpr bool double_buffer = kDoubleBuffer;   // tile j + 1 loads while j computes
  // The most resident blocks per SM we can promise ptxas while leaving it 255 registers per
  // thread: 65,536 / (256 x threads), i.e. 2 blocks of 128 threads or 1 of 256. A bigger
  // promise caps registers lower, and a warp's rows of Q, S and O do not fit: 2 blocks of 256
  // threads would mean 128 registers, and ptxas spills there even at D = 64.
  static constexpr int kMinBlocks = 256 / kThreads > 0 ? 256 / kThreads : 1;
};

template <int D>
using Production = Design<flash::v2_block_m(D), true, true, true>;

template <bool kFast>
__device__ __forceinline__ float exp2_of(float x) {
  if constexpr (kFast) return fast_exp2(x);
  else return exp2f(x);
}

// ---- one block's state, and one key tile ------------------------------------------------

// Everything one block of M query rows keeps while it walks over the key tiles. Lives in
// registers (every array index is a compile-time constant once the loops are unrolled)
// except the shared-memory buffers, which it only points to.
template <typename T, int D, class Dsg>
struct Block {
  static constexpr int M = Dsg::M, N = kV2BlockN, kPitch = D + kV2Pad;
  static constexpr int kThreads = Dsg::kThreads;
  static constexpr int kDSteps = D / 16;   // k-steps of the S = Q K^T product
  static constexpr int kNTiles = N / 8;    // 8-column accumulator tiles of S
  static constexpr int kDTiles = D / 8;    // 8-column accumulator tiles of O
  static_assert(M == 16 * (kThreads / 32), "each warp owns 16 query rows");
  static_assert(D % 16 == 0 && N % 16 == 0, "tiles are multiples of the mma shape");
  // Buffer 0 holds 2N rows (K, then V); buffer 1, which first holds Q, follows it.
  static constexpr int kBufferStride = 2 * N * kPitch;

  // The buffer of key tile j: arithmetic, not an array of two pointers, whose index j % 2
  // would not be known at compile time and would push the array (and with it this whole
  // object) out of registers into local memory.
  __device__ __forceinline__ T* kv_buffer(int j) const {
    return Dsg::double_buffer ? kv_buffers + (j & 1) * kBufferStride : kv_buffers;
  }

  const flash::Problem& p;
  bool vec;
  const T* k;            // this block's K/V head (shared by the query heads of a GQA group)
  const T* v;
  T* kv_buffers;         // [2N][kPitch] per buffer: keys in rows [0, N), values in [N, 2N)
  int lane;
  int query[2];          // the two query rows of this lane: g and g + 8 of its warp's 16
  float scale_log2;      // |scale| * log2(e): exp(s * scale) = exp2(s * scale_log2)
  int n_tiles;           // key tiles to read (tiles [0, n_tiles))

  uint32_t q_frag[kDSteps][4];   // this warp's 16 rows of Q as A fragments, for the whole kernel
  float o_acc[kDTiles][4];       // output rows g and g+8, columns 2t, 2t+1 of each 8-column tile
  float row_max[2];              // running max of the scaled scores, in log2 units
  float row_sum[2];              // this lane's part of the running sum (4 lanes share a row)

  // Issue the copies of key tile j (K and V, rows [jN, jN + N)) into its buffer.
  __device__ __forceinline__ void load_kv(int j) {
    T* k_s = kv_buffer(j);
    load_tile<T, D, N, kThreads>(k_s, k, p.k_stride[2], p.k_stride[3], j * N, p.seq_k, vec);
    load_tile<T, D, N, kThreads>(k_s + N * kPitch, v, p.v_stride[2], p.v_stride[3], j * N, p.seq_k, vec);
    cp_async_commit();
  }

  // One key tile: S = Q K_j^T, the online softmax update, O += P V_j.
  //
  // Synchronisation when double-buffered, one barrier per tile: at the barrier every thread
  // has waited for its own copies of tile j (so the whole tile is in shared memory and
  // visible to all), and every warp has finished tile j - 1, the last reader of the other
  // buffer. Only then are the copies of tile j + 1 issued, into that other buffer; they land
  // while this tile computes, and the next tile's barrier orders them before anyone reads
  // them. Q passed through buffer 1 before tile 0: tile 0's barrier also means every warp
  // holds its Q fragments, so tile 1 may overwrite it. Single-buffered, a second barrier
  // after the compute frees the one buffer, and the next tile's copies start only then.
  template <bool kMasked>
  __device__ __forceinline__ void tile_pass(int j) {
    cp_async_wait<0>();  // this thread's copies of tile j have landed
    __syncthreads();
    if constexpr (Dsg::double_buffer) {
      if (j + 1 < n_tiles) load_kv(j + 1);
    }
    const T* k_s = kv_buffer(j);
    const T* v_s = k_s + N * kPitch;

    // S = Q K_j^T. ldmatrix x4 on K (rows = keys) gives B fragments for two 8-key tiles:
    // (keys 0-7, d 0-7) = b0 and (keys 0-7, d 8-15) = b1 of tile n; then the same for n+1.
    float s[kNTiles][4];  // raw scores q.k of rows g, g+8 (this lane's columns)
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

    // The masked instantiation scales each score now and hides what the row may not see
    // (past the last key, or after the causal boundary) as -inf. The unmasked one leaves
    // the scores raw, takes their max (max(s) * c = max(s * c) for c >= 0) and lets the scale
    // meet each score inside exp2's fused multiply-add below; without the fold (the first
    // version) it multiplies every score first.
    constexpr bool kFold = !kMasked && Dsg::fast_exp2;
    if constexpr (kMasked) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j * N + n * 8 + 2 * (lane % 4) + (e % 2);
          s[n][e] = flash::visible(query[e / 2], key, p.seq_q, p.seq_k, p.causal) ? s[n][e] * scale_log2 : -INFINITY;
        }
      }
    } else if constexpr (!kFold) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= scale_log2;
    }

    // Online softmax. Row r's 64 scores are spread over the 4 lanes of group g (2 columns
    // per 8-column tile each): reduce within the lane, then across the group by shuffles.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      if constexpr (kFold) tile_max *= scale_log2;  // scores are raw (and finite) here
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row that has seen only hidden keys keeps max -inf: subtract 0 instead, so that
      // exp2(-inf - (-inf)) = NaN never happens (its probabilities are exp2(-inf) = 0).
      const float shift = new_max == -INFINITY ? 0.0f : new_max;
      const float alpha = exp2_of<Dsg::fast_exp2>(row_max[r] - shift);  // rescales what was summed so far
      row_max[r] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
        for (int c = 2 * r; c < 2 * r + 2; ++c) {
          const float x = kFold ? fmaf(s[n][c], scale_log2, -shift) : s[n][c] - shift;
          s[n][c] = exp2_of<Dsg::fast_exp2>(x);
          tile_sum += s[n][c];
        }
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
    uint32_t p_frag[N / 16][4];
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

    if constexpr (!Dsg::double_buffer) {
      __syncthreads();  // every warp is done with the one buffer: it may be refilled
      if (j + 1 < n_tiles) load_kv(j + 1);
    }
  }
};

// ---- the kernel ------------------------------------------------------------------------------

// One block: M query rows of one (batch, head) against every key tile they can see.
template <typename T, int D, class Dsg>
__device__ __forceinline__ void attention_block(const flash::Problem& p, bool vec) {
  using B = Block<T, D, Dsg>;
  constexpr int M = B::M, N = B::N, kPitch = B::kPitch;

  extern __shared__ uint4 smem_raw[];  // uint4: 16-byte alignment for cp.async and ldmatrix
  T* buffer0 = reinterpret_cast<T*>(smem_raw);  // [2N][kPitch]: K/V of (even) tiles
  T* buffer1 = buffer0 + B::kBufferStride;      // [M][kPitch] Q, then [2N][kPitch] K/V of odd tiles

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // Grid: (batch * heads, query tiles); B*H on x, whose limit is 2^31 - 1 (y's is 65,535).
  // Heavy causal blocks (many key tiles) launch first: reverse the query-tile order.
  const int q_tile = p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int q_first = q_tile * M;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int kv_h = h / (p.heads / p.kv_heads);  // the K/V head of this query head's group
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  T* o = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
  const flash::KeyTiles tiles = flash::key_tiles(q_first, M, N, p.seq_q, p.seq_k, p.causal);

  B blk{p, vec,
        static_cast<const T*>(p.k) + b * p.k_stride[0] + kv_h * p.k_stride[1],
        static_cast<const T*>(p.v) + b * p.v_stride[0] + kv_h * p.v_stride[1],
        buffer0, lane,
        {q_first + warp * 16 + g, q_first + warp * 16 + g + 8},
        fabsf(p.scale) * kLog2e, tiles.total};

  // Prologue: Q into buffer 1 and key tile 0 into buffer 0, as one copy group.
  load_tile<T, D, M, B::kThreads>(buffer1, q, p.q_stride[2], p.q_stride[3], q_first, p.seq_q, vec);
  if (tiles.total > 0) blk.load_kv(0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This warp's 16 rows of Q stay in registers as A fragments for the whole kernel.
  {
    // ldmatrix x4 for A: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7),
    // (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) = a0, a1, a2, a3.
    const T* row = buffer1 + (warp * 16 + lane % 16) * kPitch + (lane / 16) * 8;
#pragma unroll
    for (int ks = 0; ks < B::kDSteps; ++ks) ldmatrix_x4(blk.q_frag[ks], row + ks * 16);
  }
  // A negative scale: scale * (q.k) = |scale| * ((-q).k), and flipping the sign bit of each
  // 16-bit element negates q exactly. The softmax then only meets scale_log2 >= 0.
  if (p.scale < 0.0f) {
#pragma unroll
    for (int ks = 0; ks < B::kDSteps; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) blk.q_frag[ks][i] ^= 0x80008000u;
  }
#pragma unroll
  for (int i = 0; i < B::kDTiles; ++i) blk.o_acc[i][0] = blk.o_acc[i][1] = blk.o_acc[i][2] = blk.o_acc[i][3] = 0.0f;
  blk.row_max[0] = blk.row_max[1] = -INFINITY;
  blk.row_sum[0] = blk.row_sum[1] = 0.0f;

  // Fully visible tiles first, then the few that need the mask: two loops, two
  // instantiations of the tile pass, one decision per tile (which loop it is in). Any order of
  // tiles gives the same softmax; this one keeps the prefetch simple (tile j + 1 next).
  const int unmasked = Dsg::split_mask ? tiles.unmasked : 0;
  for (int j = 0; j < unmasked; ++j) blk.template tile_pass<false>(j);
  for (int j = unmasked; j < tiles.total; ++j) blk.template tile_pass<true>(j);

  // Epilogue: complete each row's sum across its 4 lanes, divide, store rows inside Sq.
  // A row that saw no key (Sq > Sk, causal) has sum 0 and accumulators 0: its output is 0.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = blk.row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int query = blk.query[r];
    if (query >= p.seq_q) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out_row = o + query * p.o_stride[2];
#pragma unroll
    for (int dt = 0; dt < B::kDTiles; ++dt) {
      const int col = dt * 8 + 2 * t;
      const float lo = blk.o_acc[dt][2 * r] * inv, hi = blk.o_acc[dt][2 * r + 1] * inv;
      if (vec) {  // two neighbours in one 4-byte store
        *reinterpret_cast<uint32_t*>(out_row + col) = pack2(lo, hi, T());
      } else {
        out_row[col * p.o_stride[3]] = to_16bit(lo, T());
        out_row[(col + 1) * p.o_stride[3]] = to_16bit(hi, T());
      }
    }
  }
}

// The kernel the launcher runs. Launch bounds: 256 threads and 1 block per SM guaranteed,
// which lets ptxas use up to 255 registers per thread (see Design::kMinBlocks).
template <typename T, int D>
__global__ void __launch_bounds__(Production<D>::kThreads, Production<D>::kMinBlocks)
flash_v2_kernel(flash::Problem p, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma.sync and cp.async need sm_80; the Python side refuses older GPUs
#else
  attention_block<T, D, Production<D>>(p, vec);
#endif
}

#if defined(FLASH_V2_DESIGN_REVISIONS)
// Only for the chapter's table of resources (nvcc -DFLASH_V2_DESIGN_REVISIONS=<head dim>): the
// same block under each revision's switches, bf16, never launched. Revision k turns on the
// first k changes.
template <typename T, int D, class Dsg>
__global__ void __launch_bounds__(Dsg::kThreads, Dsg::kMinBlocks)
flash_v2_design_kernel(flash::Problem p, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  attention_block<T, D, Dsg>(p, vec);
#endif
}

constexpr int kRevisionDim = FLASH_V2_DESIGN_REVISIONS;
template __global__ void flash_v2_design_kernel<__nv_bfloat16, kRevisionDim, Design<64, false, false, false>>(flash::Problem, bool);
template __global__ void flash_v2_design_kernel<__nv_bfloat16, kRevisionDim, Design<128, false, false, false>>(flash::Problem, bool);
template __global__ void flash_v2_design_kernel<__nv_bfloat16, kRevisionDim, Design<128, true, false, false>>(flash::Problem, bool);
template __global__ void flash_v2_design_kernel<__nv_bfloat16, kRevisionDim, Design<128, true, true, false>>(flash::Problem, bool);
template __global__ void flash_v2_design_kernel<__nv_bfloat16, kRevisionDim, Design<128, true, true, true>>(flash::Problem, bool);
#else
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
  const int block_m = flash::v2_block_m(D);
  const int64_t q_tiles = (int64_t(p.seq_q) + block_m - 1) / block_m;
  if (q_tiles > 65535) return cudaErrorInvalidConfiguration;  // grid.y limit
  auto kernel = flash_v2_kernel<T, D>;
  // Above 48 KiB a kernel must opt in to dynamic shared memory (D = 128 needs 68 KiB).
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(unsigned(p.batch * p.heads), unsigned(q_tiles));
  kernel<<<grid, flash::v2_threads(D), smem, stream>>>(p, vec);
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
#endif  // FLASH_V2_DESIGN_REVISIONS

}  // namespace

#if !defined(FLASH_V2_DESIGN_REVISIONS)
extern "C" int flash_v2_forward(const flash::Problem* problem, void* stream) {
  const flash::Problem& p = *problem;
  if (p.seq_q < 1 || p.seq_k < 1 || p.batch < 1 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0)
    return cudaErrorInvalidValue;
  if (int64_t(p.batch) * p.heads > INT32_MAX) return cudaErrorInvalidConfiguration;  // grid.x limit
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case flash::Dtype::Float16: return launch_for_dim<__half>(p, s);
    case flash::Dtype::BFloat16: return launch_for_dim<__nv_bfloat16>(p, s);
    default: return cudaErrorInvalidValue;  // tensor cores here take 16-bit inputs only
  }
}
#endif

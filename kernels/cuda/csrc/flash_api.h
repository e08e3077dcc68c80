// The contract between the torch binding and the torch-free kernels.
//
// Everything here is plain C++ (no CUDA, no torch) so that a host compiler, nvcc and a
// test program can all read it. Tile sizes live here too: the launchers derive their
// dynamic shared memory from them, and kernels/cuda/flash.py mirrors the same formulas
// (a test compiles this header and compares the numbers). The tile schedule (which key
// tiles a block of queries reads, and which of those need a mask) is here for the same
// reason: a host program checks it against the mask of the float64 reference.
#pragma once

#include <cstddef>
#include <cstdint>

// Callable from kernels when nvcc compiles this header, plain functions otherwise.
#if defined(__CUDACC__)
#define FLASH_HOST_DEVICE __host__ __device__
#else
#define FLASH_HOST_DEVICE
#endif

namespace flash {

// Element types a launcher accepts, named independently of torch.
enum class Dtype : int { Float32 = 0, Float16 = 1, BFloat16 = 2 };

// One attention problem: q and o are [B, H, Sq, D], k and v [B, Hkv, Sk, D] tensors, each
// described by a base pointer and element strides, so any torch view (e.g. a transposed
// [B, S, H, D]) works unchanged. H is a multiple of Hkv: query head h reads K/V head
// h / (H / Hkv) (grouped-query attention; Hkv == H is ordinary multi-head attention).
struct Problem {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  int64_t q_stride[4];  // strides of q along B, H, S, D, in elements
  int64_t k_stride[4];
  int64_t v_stride[4];
  int64_t o_stride[4];
  float scale;          // multiplies q.k before the softmax (any finite value)
  bool causal;          // bottom-right aligned: see visible()
  Dtype dtype;
};

// The course's causal rule, aligned bottom-right as in FlashAttention and SDPA's
// causal_lower_right: query i sees key j when j <= i + (Sk - Sq). With Sq > Sk the first
// Sq - Sk queries see no key at all; their output is 0. No overflow for real queries:
// i + (Sk - Sq) lies in [Sk - Sq, Sk - 1].
FLASH_HOST_DEVICE constexpr bool visible(int query, int key, int seq_q, int seq_k, bool causal) {
  return key >= 0 && key < seq_k && (!causal || key <= query + (seq_k - seq_q));
}

// Which key tiles a block of query rows [q_first, q_first + block_m) reads:
// tiles [0, unmasked) are visible to every real row of the block (no mask to apply),
// tiles [unmasked, total) are visible to some rows only or run past the last key (masked),
// tiles from `total` on are hidden from every row and never loaded (causal block skipping).
struct KeyTiles {
  int unmasked;
  int total;
};

FLASH_HOST_DEVICE constexpr KeyTiles key_tiles(int q_first, int block_m, int block_n, int seq_q, int seq_k,
                                               bool causal) {
  int end = seq_k;   // keys [0, end) are seen by at least one real row of the block
  int full = seq_k;  // keys [0, full) are seen by every row of the block
  if (causal) {
    const int offset = seq_k - seq_q;
    const int last_row = (q_first + block_m < seq_q ? q_first + block_m : seq_q) - 1;  // rows past Sq are padding
    end = last_row + 1 + offset;   // <= seq_k, since last_row < seq_q
    full = q_first + 1 + offset;   // the block's first row sees the fewest keys
    if (full > seq_k) full = seq_k;
  }
  if (end < 0) end = 0;
  if (full < 0) full = 0;
  const int total = (end + block_n - 1) / block_n;
  const int unmasked = full / block_n;  // whole tiles only: a ragged last tile is masked
  return {unmasked < total ? unmasked : total, total};
}

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

// ---- v2: tensor cores, one warp per 16 query rows, K/V tiles of 64 keys in 16-bit ------
constexpr int kV2BlockN = 64;
constexpr int kV2Pad = 8;       // 8 extra halves (16 bytes) per row: conflict-free ldmatrix

// Query rows per block: 128 (8 warps) at both head dims. Each warp's work is the same as
// with 64-row tiles (16 rows against a 64-key tile), so its registers are too, while each
// K/V tile brought into shared memory now serves twice as many queries. At D = 128 ptxas
// fits that warp's state in 255 registers without spilling (kernels/cuda/resources.py keeps
// the numbers; tests/cuda/test_cuda_compile.py fails if that changes), so no smaller tile is needed.
constexpr int v2_block_m(int head_dim) { return head_dim > 0 ? 128 : 0; }
constexpr int v2_threads(int head_dim) { return 32 * (v2_block_m(head_dim) / 16); }

// Shared memory of v2, in bytes, 16-bit rows of D + 8 elements. Buffer 0: one K/V pair,
// 64 + 64 rows. Buffer 1 first holds Q's M rows; double-buffered, it then takes the K/V of
// every odd tile (tile j + 1 loads there while tile j computes from buffer 0, and so on), so
// it needs the larger of M and 128 rows: Q moves to registers before tile 1 arrives.
// (`double_buffer` false is the first version's layout, kept for the chapter's comparison.)
constexpr size_t v2_design_smem_bytes(int head_dim, int block_m, bool double_buffer) {
  const size_t kv_rows = size_t(2 * kV2BlockN);
  const size_t buffer1_rows = double_buffer && size_t(block_m) < kv_rows ? kv_rows : size_t(block_m);
  return 2 * (kv_rows + buffer1_rows) * size_t(head_dim + kV2Pad);
}
constexpr size_t v2_smem_bytes(int head_dim) {
  return v2_design_smem_bytes(head_dim, v2_block_m(head_dim), true);
}

}  // namespace flash

// Launchers: queue the kernel on `stream` and return the launch status (0 = cudaSuccess).
// They return an error code instead of throwing, so the binding decides how to report it.
// `stream` is a cudaStream_t passed as void* to keep this header free of CUDA includes.
extern "C" int flash_v1_forward(const flash::Problem* problem, void* stream);
extern "C" int flash_v2_forward(const flash::Problem* problem, void* stream);

// Lab skeleton generated from solutions/08-flash-attention/naive.cu by `./course labs` [lab-hash 3689bba919af].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08, rung 1: attention the way the formula reads, in three kernels that each make one
// full pass over an N x N matrix in HBM:
//   1. scores   S = scale Q K^T                        written:      batch x heads_q x Sq x Sk floats
//   2. softmax  P = softmax(S) row by row, in place    read + write: the same again, twice
//               (and L = log sum_j exp(S_ij), the row's log-sum-exp, for the backward)
//   3. PV       O = P V                                read:         the same once more
// At Sq = Sk = 16384, one head, the scores alone are 1 GiB of float32, against 2 MiB each for
// q, k, v and o at head_dim 64 in 16 bits: the products are cheap, the passes over S are the
// cost. This rung is the memory baseline the flash rungs are measured against; it takes any
// head_dim and float32, float16 or bfloat16 (widened to float on load, float arithmetic).
//
// Masking: with causal set, scores past causal_key_end (attention.h, bottom-right aligned) are
// -inf, and nothing else is masked. A row with no visible key (causal, seqlen_q > seqlen_k) gets
// P = 0 and L = -inf: its max is -inf, and exp(-inf - (-inf)) would be NaN, so the softmax
// guards it. Every offset is int64: batch x heads x Sq x Sk passes 2^31 long before memory does.
#include <course/cuda.cuh>
#include <course/dtype.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "attention.h"

namespace {  // internal linkage: the other rungs' files may define helpers of the same names

using course::from_compute;
using course::kFullWarpMask;
using course::kWarpSize;
using course::to_compute;

// --8<-- [start:naive_tiles]
// The two products are lesson 04's shared-memory tiles (kernel 3 with 4 outputs a thread): a block
// computes a 32 x 32 tile of its output from 32 x 32 tiles of the operands, one warp per tile
// row, so every global load and store of a warp is 32 consecutive elements.
constexpr int kTile = 32;
constexpr int kTileWarps = 8;                         // 256 threads: warp w owns tile rows w, w + 8, w + 16, w + 24
constexpr int kRowsPerThread = kTile / kTileWarps;    // 4 outputs a thread, down a column of the tile
constexpr int kTileThreads = kTileWarps * kWarpSize;  // 256
static_assert(kTile == kWarpSize, "a warp spans one tile row: coalesced loads and stores");
static_assert(kTile % kTileWarps == 0, "each warp owns the same number of tile rows");
// 3 blocks of 256 threads an SM: at most 65536 / 768 = 85 registers a thread (ptxas 13.0 uses 71-80,
// no spills). With __launch_bounds__(256) alone it kept to 64 and spilled 12 bytes (scores, sm_90a).
constexpr int kTileMinBlocksPerSm = 3;
// Rows of 33 floats: in the inner loop lane x reads k_tile[x][dd] (a column walk), and with rows of
// 32 floats all 32 lanes would hit one bank; 33 puts lane x in bank (x + dd) % 32, all different.
// The other operand is read at one address by the whole warp (a broadcast), conflict-free anyway.
constexpr int kTileStride = kTile + 1;
// The softmax: one warp per row (lesson 07's warp path), 8 rows per block of 256 threads.
constexpr int kSoftmaxThreads = 256;
constexpr int kSoftmaxRowsPerBlock = kSoftmaxThreads / kWarpSize;
// --8<-- [end:naive_tiles]

// A grid-stride loop covers whatever a grid of at most INT_MAX blocks does not.
inline unsigned grid_for(int64_t items) { return static_cast<unsigned>(std::min<int64_t>(items, INT32_MAX)); }

// Tile `tile` of a (batch x heads_q) x outer_tiles x inner_tiles grid of tiles, inner fastest. The
// tiles of one head number fewer than 2^31 (the launcher checks: 2^31 tiles of 32 x 32 floats are
// 8 TiB of scores), so they split with 32-bit divisions; 64-bit ones are a subroutine call each.
struct TileIndex {
  int64_t inner, outer, bh, b, h;
};
__device__ __forceinline__ TileIndex tile_index(int64_t tile, int64_t outer_tiles, int64_t inner_tiles,
                                                int64_t heads_q) {
  const int64_t per_head = outer_tiles * inner_tiles;
  const int64_t bh = tile / per_head;
  const auto within = static_cast<uint32_t>(tile - bh * per_head);
  const auto inner = static_cast<uint32_t>(inner_tiles);
  const int64_t b = bh / heads_q;
  return {within % inner, within / inner, bh, b, bh - b * heads_q};
}

// --8<-- [start:naive_scores]
// scores[b, h, i, j] = scale * q[b, i, h, :] . k[b, j, h / group, :] for one 32 x 32 tile of (i, j)
// per step, -inf where the causal mask hides key j from query i. q and k are read through their
// strides (any, with a contiguous last dimension): no copy of a strided view.
template <typename T>
__global__ void __launch_bounds__(kTileThreads, kTileMinBlocksPerSm)
    naive_scores_kernel(const AttentionParams p, float* __restrict__ scores, int64_t query_tiles, int64_t key_tiles) {
  __shared__ float q_tile[kTile][kTileStride];  // [query][dim]
  __shared__ float k_tile[kTile][kTileStride];  // [key][dim]
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const int x = static_cast<int>(threadIdx.x) % kWarpSize;  // the tile column this lane loads and stores
  const int y = static_cast<int>(threadIdx.x) / kWarpSize;  // first of the tile rows this warp owns
  const int64_t group = p.heads_q / p.heads_kv;             // query heads per key/value head (GQA)
  const int64_t tiles = p.batch * p.heads_q * query_tiles * key_tiles;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const TileIndex at = tile_index(tile, query_tiles, key_tiles, p.heads_q);
    const int64_t key0 = at.inner * kTile, query0 = at.outer * kTile;
    const int64_t bh = at.bh, b = at.b, h = at.h;  // bh = b * heads_q + h: the row block of scores
    const T* q_head = q + b * p.q_strides.batch + h * p.q_strides.head;
    const T* k_head = k + b * p.k_strides.batch + (h / group) * p.k_strides.head;
    // Causal: a tile whose first key is past the last row's causal_key_end is all -inf; skip its products.
    const int64_t last_query = (query0 + kTile < p.seqlen_q ? query0 + kTile : p.seqlen_q) - 1;
    const bool any_visible = !p.causal || key0 < causal_key_end(last_query, p.seqlen_q, p.seqlen_k);
    float acc[kRowsPerThread] = {};
    for (int64_t d0 = 0; any_visible && d0 < p.head_dim; d0 += kTile) {  // any_visible is uniform: no divergent sync
      const int64_t d = d0 + x;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = y + r * kTileWarps;
        const int64_t query = query0 + row, key = key0 + row;
        // Past a tail: 0, which adds nothing to a dot product (and is never stored).
        q_tile[row][x] = query < p.seqlen_q && d < p.head_dim ? to_compute(q_head[query * p.q_strides.seq + d]) : 0.0f;
        k_tile[row][x] = key < p.seqlen_k && d < p.head_dim ? to_compute(k_head[key * p.k_strides.seq + d]) : 0.0f;
      }
      __syncthreads();  // both tiles complete before any thread reads them
#pragma unroll 8
      for (int dd = 0; dd < kTile; ++dd) {
        const float key_value = k_tile[x][dd];
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) acc[r] = fmaf(q_tile[y + r * kTileWarps][dd], key_value, acc[r]);
      }
      __syncthreads();  // every read done before the next step overwrites the tiles
    }
    const int64_t key = key0 + x;
    if (key >= p.seqlen_k) continue;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t query = query0 + y + r * kTileWarps;
      if (query >= p.seqlen_q) continue;
      const bool visible = !p.causal || key < causal_key_end(query, p.seqlen_q, p.seqlen_k);
      scores[(bh * p.seqlen_q + query) * p.seqlen_k + key] = visible ? p.scale * acc[r] : -INFINITY;
    }
  }
}
// --8<-- [end:naive_scores]

// exp(x - m), and 0 for x = -inf whatever m is: a row that has seen only -inf has m = -inf too,
// and exp(-inf - (-inf)) = exp(NaN) would poison its sum (lesson 07's shifted_exp).
[[maybe_unused]] __device__ __forceinline__ float shifted_exp(float x, float m) {
  return x == -INFINITY ? 0.0f : expf(x - m);
}

// --8<-- [start:naive_softmax]
// One warp per row of scores (batch x heads_q x seqlen_q rows of seqlen_k): the row's max m and
// l = sum_j exp(s_j - m) in one pass with lesson 07's online recurrence (each lane over the columns
// lane, lane + 32, ..., then the 32 lanes' (m, l) pairs merged by a butterfly), then a second pass
// that overwrites each score with p_j = exp(s_j - m) / l. L = m + log(l), natural log, per row.
// A row of any length: nothing is held in registers but a lane's (m, l).
__global__ void __launch_bounds__(kSoftmaxThreads)
    naive_softmax_kernel(float* __restrict__ scores, float* __restrict__ lse, int64_t rows, int64_t seqlen_k) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  // The row loop is uniform across a warp: every lane reaches every shuffle.
  for (int64_t row = int64_t{blockIdx.x} * kSoftmaxRowsPerBlock + threadIdx.x / kWarpSize; row < rows;
       row += int64_t{gridDim.x} * kSoftmaxRowsPerBlock) {
    [[maybe_unused]] float* s = scores + row * seqlen_k;  // (maybe_unused: the skeleton's stub)
    // TODO(lab08.1): the softmax of the row s[0 .. seqlen_k) in place, and lse[row]: this lane's max m
    //   and l = sum exp(s_j - m) over j = lane, lane + 32, ... (online: when s_j > m, l = l exp(m - s_j) + 1 and
    //   m = s_j; else l += exp(s_j - m); shifted_exp guards -inf); merge the 32 lanes' (m, l) with __shfl_xor_sync
    //   (offsets 16 .. 1: m = max, each l rescaled to it); then s_j = shifted_exp(s_j, m) / l (0 when l = 0) and
    //   lse[row] = m + logf(l) (-inf when l = 0, a row with no visible key)
    (void)lane;  // the scores stay unnormalized and lse is never written
  }
}
// --8<-- [end:naive_softmax]

// --8<-- [start:naive_pv]
// o[b, i, h, :] = sum_j P[b, h, i, j] v[b, j, h / group, :] for a 32 (queries) x 32 (dims) tile of o
// per step, the keys in steps of 32. Causal: keys past the tile's last row's causal_key_end have
// P = 0 for every row of the tile, so the loop stops there. Accumulated in float, rounded once.
template <typename T>
__global__ void __launch_bounds__(kTileThreads, kTileMinBlocksPerSm)
    naive_pv_kernel(const AttentionParams p, const float* __restrict__ probs, int64_t query_tiles, int64_t dim_tiles) {
  __shared__ float p_tile[kTile][kTileStride];  // [query][key]
  __shared__ float v_tile[kTile][kTileStride];  // [key][dim]
  const T* v = static_cast<const T*>(p.v);
  T* o = static_cast<T*>(p.o);
  const int x = static_cast<int>(threadIdx.x) % kWarpSize;
  const int y = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t tiles = p.batch * p.heads_q * query_tiles * dim_tiles;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const TileIndex at = tile_index(tile, query_tiles, dim_tiles, p.heads_q);
    const int64_t dim0 = at.inner * kTile, query0 = at.outer * kTile;
    const int64_t bh = at.bh, b = at.b, h = at.h;
    const T* v_head = v + b * p.v_strides.batch + (h / group) * p.v_strides.head;
    const float* p_rows = probs + bh * p.seqlen_q * p.seqlen_k;
    const int64_t last_query = (query0 + kTile < p.seqlen_q ? query0 + kTile : p.seqlen_q) - 1;
    const int64_t key_end = p.causal ? causal_key_end(last_query, p.seqlen_q, p.seqlen_k) : p.seqlen_k;
    const int64_t d = dim0 + x;
    float acc[kRowsPerThread] = {};
    for (int64_t key0 = 0; key0 < key_end; key0 += kTile) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = y + r * kTileWarps;
        const int64_t query = query0 + row, key = key0 + row;
        p_tile[row][x] = query < p.seqlen_q && key0 + x < p.seqlen_k ? p_rows[query * p.seqlen_k + key0 + x] : 0.0f;
        v_tile[row][x] = key < p.seqlen_k && d < p.head_dim ? to_compute(v_head[key * p.v_strides.seq + d]) : 0.0f;
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kTile; ++kk) {
        const float value = v_tile[kk][x];
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) acc[r] = fmaf(p_tile[y + r * kTileWarps][kk], value, acc[r]);
      }
      __syncthreads();
    }
    if (d >= p.head_dim) continue;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t query = query0 + y + r * kTileWarps;
      if (query < p.seqlen_q) o[((b * p.seqlen_q + query) * p.heads_q + h) * p.head_dim + d] = from_compute<T>(acc[r]);
    }
  }
}
// --8<-- [end:naive_pv]

template <typename T>
void launch_typed(const AttentionParams& p, float* scores, cudaStream_t stream) {
  const int64_t query_tiles = course::ceil_div<int64_t>(p.seqlen_q, kTile);
  const int64_t key_tiles = course::ceil_div<int64_t>(p.seqlen_k, kTile);
  const int64_t dim_tiles = course::ceil_div<int64_t>(p.head_dim, kTile);
  const int64_t bh = p.batch * p.heads_q;
  if (query_tiles * std::max(key_tiles, dim_tiles) > INT32_MAX) {
    throw std::invalid_argument("attention_naive: more than 2^31 tiles of 32 x 32 in one head's scores");
  }
  // seqlen_k = 0 launches no scores kernel; the softmax then gives every row l = 0 (P = nothing,
  // L = -inf) and the PV kernel o = 0: the convention for an empty key set, with no special case.
  if (key_tiles > 0) {
    naive_scores_kernel<T>
        <<<grid_for(bh * query_tiles * key_tiles), kTileThreads, 0, stream>>>(p, scores, query_tiles, key_tiles);
    COURSE_CHECK_LAUNCH();
  }
  const int64_t rows = bh * p.seqlen_q;
  naive_softmax_kernel<<<grid_for(course::ceil_div<int64_t>(rows, kSoftmaxRowsPerBlock)), kSoftmaxThreads, 0, stream>>>(
      scores, p.lse, rows, p.seqlen_k);
  COURSE_CHECK_LAUNCH();
  naive_pv_kernel<T>
      <<<grid_for(bh * query_tiles * dim_tiles), kTileThreads, 0, stream>>>(p, scores, query_tiles, dim_tiles);
  COURSE_CHECK_LAUNCH();
}

}  // namespace

void launch_attention_naive(ElementType type, const AttentionParams& params, float* scores, cudaStream_t stream) {
  if (params.heads_kv <= 0 || params.heads_q % params.heads_kv != 0) {
    throw std::invalid_argument("attention_naive: heads_q must be a multiple of heads_kv (and heads_kv >= 1)");
  }
  if (params.head_dim <= 0) throw std::invalid_argument("attention_naive: head_dim must be at least 1");
  // Nothing to write (o and lse are empty), and a grid of zero blocks is an invalid launch.
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) return;
  switch (type) {
    case ElementType::kFloat32: launch_typed<float>(params, scores, stream); break;
    case ElementType::kFloat16: launch_typed<__half>(params, scores, stream); break;
    case ElementType::kBFloat16: launch_typed<__nv_bfloat16>(params, scores, stream); break;
    default: throw std::invalid_argument("attention_naive: float32, float16 or bfloat16 only");
  }
}

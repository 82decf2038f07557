// Lab 08, rung 2: flash attention forward in float32 on the CUDA cores. The naive rung's three
// passes over an N x N matrix become one kernel in which S and P never leave the chip:
//   a block owns kBlockM = 64 query rows of one (batch, head): Q_i (64 x D) is loaded once into
//   shared memory; the keys stream past in blocks of kBlockN: K_j and V_j into shared memory,
//   S = Q_i K_j^T in registers (lesson 04's register blocking: each thread a 4 x kKeysPerThread
//   micro-tile), the online softmax update (lesson 07's recurrence: running max m, running sum l,
//   O rescaled when m grows), P through shared memory into O += P V_j (O in registers, 4 rows x
//   D/8 columns a thread), and at the end one division by l and L = m + log(l) per row.
// Causal (bottom-right, attention.h): key blocks past the block's last row's causal_key_end are
// never loaded; the diagonal and tail blocks are masked per element. A row with no visible key
// gives o = 0 and L = -inf. float32 only, head_dim 64 or 128, any GPU of the course (sm_75+).
#include <course/cuda.cuh>
#include <course/mma.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attention.h"

namespace {  // internal linkage: the other rungs' files may define helpers of the same names

using course::kFullWarpMask;
using course::kWarpSize;

using course::kLog2e;  // exp(x) = exp2(x log2(e)): ex2 is the hardware's exponential

// --8<-- [start:fp32_tiles]
// The block: 4 warps = 128 threads. A query row belongs to kRowLanes = 8 neighbouring lanes of one
// warp, which split its keys (in S) and its head dims (in O) between them; the row's max is then
// combined by 3 shuffles (offsets 4, 2, 1) inside the warp, never through shared memory.
// 128 / 8 = 16 row groups, and each thread takes kRowsPerThread = 4 rows, 16 apart:
// kBlockM = 16 x 4 = 64 query rows a block.
//   thread (row group g, lane c of 8):  rows g + 16 i (i < 4),  keys c + 8 t of the key block
//   (t < kKeysPerThread),  head dims 32 s + 4 c .. 32 s + 4 c + 3 (s < D / 32).
// Why these interleavings: in each shared-memory read below, the addresses a warp's lanes touch
// are neighbours (4 consecutive Q or P rows, 8 consecutive K rows, 8 consecutive 16-byte chunks
// of a V row), which with the padding below fall in different banks.
//
// Work per key block and thread: S is 4 x kKeysPerThread x D FMAs and O += P V 4 x (D / 8) x
// kBlockN, the same number since kKeysPerThread = kBlockN / 8. Lesson 04's register blocking: each
// 16-byte shared-memory load feeds several FMAs, in S a Q float4 4 x kKeysPerThread and a K float4
// 16; in O a P float4 4 x D / 8 and a V float4 16. At D = 128: 6 loads per 32 FMAs in S, 20 per
// 256 in O.
//
// Registers (65536 an SM): the O accumulators 4 x D / 8 (32 at D = 64, 64 at D = 128), the S
// micro-tile 4 x kKeysPerThread, m and l (8), one step's operands (4 Q and kKeysPerThread K
// float4s in S; 4 P and D / 32 V float4s in O), addresses. kMinBlocksPerSm = 3 blocks of 128
// threads leave 65536 / 384 = 170 a thread, 168 in the 8-register units ptxas allocates (ptxas 13.0
// takes all 168 for both head dims, no spills; held to 128 for 4 blocks an SM it spilled 28-160 bytes).
//
// Shared memory (floats; Q, K and P rows padded by 4, so that the rows a warp reads at one column
// fall in different banks: distinct_bank_groups below checks each read):
//   Q_i  64 x (D + 4)    K_j  kBlockN x (D + 4)    V_j  kBlockN x D    P  64 x (kBlockN + 4)
// kBlockN is the largest power of two that keeps a block within 64 KiB, the most a block may have
// on every GPU of the course (sm_75's limit; 99 KiB on sm_86/89, 163 KiB on sm_80, 227 KiB on
// sm_90): D = 64: kBlockN = 32, 42.5 KiB; D = 128: kBlockN = 16, 54.25 KiB. Three blocks take
// 131 or 166 KiB of an H100's 228 KiB: registers, not shared memory, set the occupancy there
// (12 warps an SM, so that while one block waits on its K/V loads or at a barrier the other two can
// compute: the loads are plain, not cp.async, which sm_75 does not have).
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kRowLanes = 8;                          // lanes sharing a query row
constexpr int kRowGroups = kThreads / kRowLanes;      // 16
constexpr int kRowsPerThread = 4;                     // TM
constexpr int kBlockM = kRowGroups * kRowsPerThread;  // 64 query rows a block
constexpr int kMinBlocksPerSm = 3;
constexpr int kVector = 4;  // floats per 16-byte shared (and global) access
constexpr int kPad = 4;     // floats of padding after each Q, K and P row
constexpr int kSharedBankWords = 32;
constexpr int kMaxSharedPerBlock = 64 * 1024;  // sm_75's opt-in limit: the smallest of the course's GPUs
constexpr int kRegistersPerSm = 64 * 1024;
constexpr int kMaxRegisters = kRegistersPerSm / (kThreads * kMinBlocksPerSm) / 8 * 8;  // 168: whole units of 8
static_assert(kWarpSize % kRowLanes == 0 && (kRowLanes & (kRowLanes - 1)) == 0,
              "a row's lanes are a power-of-two group inside one warp: xor shuffles 4, 2, 1 stay in it");
static_assert(kRowGroups * kRowLanes == kThreads, "every thread has a row group and a lane in it");

// Whether `rows` consecutive rows of `stride` floats, read as float4s at the same column, fall in
// different groups of 4 banks (a float4 covers 4 of the 32 banks): then no two of them conflict.
constexpr bool distinct_bank_groups(int stride, int rows) {
  for (int a = 0; a < rows; ++a) {
    for (int b = a + 1; b < rows; ++b) {
      if ((a * stride / kVector) % (kSharedBankWords / kVector) ==
          (b * stride / kVector) % (kSharedBankWords / kVector))
        return false;
    }
  }
  return true;
}

template <int kHeadDim>
struct Fp32Tiles {
  static constexpr int kBlockN = kHeadDim == 64 ? 32 : 16;     // keys per block (Bc)
  static constexpr int kKeysPerThread = kBlockN / kRowLanes;   // TN: 4 (D = 64), 2 (D = 128)
  static constexpr int kDimsPerThread = kHeadDim / kRowLanes;  // TD: 8, 16
  static constexpr int kDimChunks = kDimsPerThread / kVector;  // float4s of O a row: 2, 4
  static constexpr int kChunkSpan = kRowLanes * kVector;       // 32 dims between a thread's chunks
  static constexpr int kStrideQK = kHeadDim + kPad;            // floats a row of Q_i and K_j
  static constexpr int kStrideV = kHeadDim;                    // V is read a whole row at a time
  static constexpr int kStrideP = kBlockN + kPad;
  static constexpr int kSharedFloats =
      kBlockM * kStrideQK + kBlockN * kStrideQK + kBlockN * kStrideV + kBlockM * kStrideP;
  static constexpr int kSharedBytes = kSharedFloats * static_cast<int>(sizeof(float));
  static constexpr int kAccumulators = kRowsPerThread * kDimsPerThread + kRowsPerThread * kKeysPerThread;
  static constexpr int kOperands =
      kVector * (kRowsPerThread + (kKeysPerThread > kDimChunks ? kKeysPerThread : kDimChunks));
  static constexpr int kOtherRegisters = 32;  // m, l, row and column indices, addresses, loop counters

  static_assert(kHeadDim % kChunkSpan == 0 && kDimChunks >= 1, "a row of O is whole float4 chunks per lane");
  static_assert(kBlockN % kRowLanes == 0 && kBlockN % kVector == 0, "whole keys per lane, whole P float4s");
  static_assert(kKeysPerThread * kRowLanes == kBlockN, "the row's lanes split the key block");
  static_assert(distinct_bank_groups(kStrideQK, kWarpSize / kRowLanes) &&
                    distinct_bank_groups(kStrideP, kWarpSize / kRowLanes),
                "a warp's 4 row groups read 4 consecutive Q (and P) rows at one column: 4 different groups of 4 banks");
  static_assert(distinct_bank_groups(kStrideQK, kRowLanes),
                "a row's 8 lanes read 8 consecutive K rows at one column: 8 different groups of 4 banks, all 32");
  static_assert(kStrideQK % kVector == 0 && kStrideP % kVector == 0, "padded rows stay 16-byte aligned");
  static_assert(kSharedBytes <= kMaxSharedPerBlock, "fits 64 KiB: the block runs on every GPU of the course");
  static_assert(kAccumulators + kOperands + kOtherRegisters <= kMaxRegisters,
                "O, S, one step's operands and the rest fit 168 registers: 3 blocks an SM, no spills");
};
static_assert(Fp32Tiles<64>::kBlockN == 32 && Fp32Tiles<64>::kSharedBytes == 43520, "D = 64: 42.5 KiB");
static_assert(Fp32Tiles<128>::kBlockN == 16 && Fp32Tiles<128>::kSharedBytes == 55552, "D = 128: 54.25 KiB");
// --8<-- [end:fp32_tiles]

// Copies rows [first, first + kRows) of one head of q, k or v (row r at head + r * seq_stride,
// head_dim contiguous floats) into a shared tile with rows of kStride floats. Rows at or past
// seqlen are written as zeros: shared memory holds whatever was there before, possibly NaN, and a
// masked key's p = 0 times a NaN in V would still be NaN. Consecutive threads take consecutive
// elements of a row: coalesced. With `vector` (every pointer and stride a multiple of 16 bytes)
// 16-byte accesses, else 4-byte ones (a view such as q[..., 1:65] of a wider tensor).
template <int kHeadDim, int kRows, int kStride>
__device__ __forceinline__ void load_tile(float* __restrict__ tile, const float* __restrict__ head, int64_t seq_stride,
                                          int64_t first, int64_t seqlen, bool vector) {
  if (vector) {
    constexpr int kChunksPerRow = kHeadDim / kVector;
    constexpr int kChunks = kRows * kChunksPerRow;
    static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int step = 0; step < kChunks / kThreads; ++step) {
      const int chunk = step * kThreads + static_cast<int>(threadIdx.x);
      const int row = chunk / kChunksPerRow, col = chunk % kChunksPerRow * kVector;
      float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (first + row < seqlen) value = *reinterpret_cast<const float4*>(head + (first + row) * seq_stride + col);
      *reinterpret_cast<float4*>(tile + row * kStride + col) = value;
    }
  } else {
    constexpr int kElements = kRows * kHeadDim;
    static_assert(kElements % kThreads == 0, "every thread copies the same number of elements");
#pragma unroll 8
    for (int step = 0; step < kElements / kThreads; ++step) {
      const int element = step * kThreads + static_cast<int>(threadIdx.x);
      const int row = element / kHeadDim, col = element % kHeadDim;
      tile[row * kStride + col] = first + row < seqlen ? head[(first + row) * seq_stride + col] : 0.0f;
    }
  }
}

__device__ __forceinline__ float component(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;  // e is a compile-time constant after unrolling
}

// --8<-- [start:fp32_kernel]
// One block per (query block, batch, head), in a grid-stride loop over them.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    flash_fp32_kernel(const AttentionParams p, int64_t query_blocks, bool vector) {
  using Tiles = Fp32Tiles<kHeadDim>;
  constexpr int kBlockN = Tiles::kBlockN, kKeysPerThread = Tiles::kKeysPerThread;
  constexpr int kDimsPerThread = Tiles::kDimsPerThread, kDimChunks = Tiles::kDimChunks;
  constexpr int kStrideQK = Tiles::kStrideQK, kStrideV = Tiles::kStrideV, kStrideP = Tiles::kStrideP;
  extern __shared__ __align__(16) float shared[];
  float* q_tile = shared;                        // [kBlockM][kStrideQK]
  float* k_tile = q_tile + kBlockM * kStrideQK;  // [kBlockN][kStrideQK]
  float* v_tile = k_tile + kBlockN * kStrideQK;  // [kBlockN][kStrideV]
  float* p_tile = v_tile + kBlockN * kStrideV;   // [kBlockM][kStrideP]

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int col = lane % kRowLanes;  // this thread's lane among the row's 8: keys col + 8 t, dims 32 s + 4 col
  const int row_group = static_cast<int>(threadIdx.x) / kRowLanes;  // rows row_group + 16 i of the block
  const float* q = static_cast<const float*>(p.q);
  const float* k = static_cast<const float*>(p.k);
  const float* v = static_cast<const float*>(p.v);
  float* o = static_cast<float*>(p.o);
  // exp(scale s - scale m) = exp2(s scale_log2 - m scale_log2): one FMA and one ex2 per score.
  [[maybe_unused]] const float scale_log2 = p.scale * kLog2e;  // (maybe_unused: the skeleton's stub)
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t work_items = query_blocks * p.batch * p.heads_q;

  for (int64_t work = blockIdx.x; work < work_items; work += gridDim.x) {
    // The last query block of a head first: under a causal mask it sees the most keys, and the
    // longest blocks starting first keep the tail of the grid short.
    const int64_t query0 = (query_blocks - 1 - work % query_blocks) * kBlockM;
    const int64_t bh = work / query_blocks;  // b * heads_q + h
    const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
    const float* k_head = k + b * p.k_strides.batch + (h / group) * p.k_strides.head;
    const float* v_head = v + b * p.v_strides.batch + (h / group) * p.v_strides.head;
    const int64_t last_query = (query0 + kBlockM < p.seqlen_q ? query0 + kBlockM : p.seqlen_q) - 1;
    // Keys [0, key_end) are visible to some row of the block; blocks past it are skipped, not
    // loaded. Keys [0, unmasked_end) are visible to every row: the blocks below it need no mask.
    const int64_t key_end = p.causal ? causal_key_end(last_query, p.seqlen_q, p.seqlen_k) : p.seqlen_k;
    const int64_t unmasked_end = p.causal ? causal_key_end(query0, p.seqlen_q, p.seqlen_k) : p.seqlen_k;

    __syncthreads();  // the previous work item's reads of q_tile are done before it is overwritten
    load_tile<kHeadDim, kBlockM, kStrideQK>(q_tile, q + b * p.q_strides.batch + h * p.q_strides.head, p.q_strides.seq,
                                            query0, p.seqlen_q, vector);

    float o_acc[kRowsPerThread][kDimsPerThread] = {};  // O, unnormalized: divided by l at the end
    float m[kRowsPerThread], l[kRowsPerThread];        // running max (of q.k, unscaled) and this lane's sum
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      m[i] = -INFINITY;  // no key seen yet
      l[i] = 0.0f;
    }

    for (int64_t key0 = 0; key0 < key_end; key0 += kBlockN) {
      load_tile<kHeadDim, kBlockN, kStrideQK>(k_tile, k_head, p.k_strides.seq, key0, p.seqlen_k, vector);
      load_tile<kHeadDim, kBlockN, kStrideV>(v_tile, v_head, p.v_strides.seq, key0, p.seqlen_k, vector);
      __syncthreads();  // Q_i (first time), K_j and V_j complete

      // S = Q_i K_j^T for this thread's 4 rows x kKeysPerThread keys, 4 dims per step: each Q and
      // K float4 read once from shared memory feeds kKeysPerThread x 4 and 4 x 4 FMAs.
      float s[kRowsPerThread][kKeysPerThread] = {};
#pragma unroll
      for (int d = 0; d < kHeadDim; d += kVector) {
        float4 qf[kRowsPerThread], kf[kKeysPerThread];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
          qf[i] = *reinterpret_cast<const float4*>(q_tile + (row_group + i * kRowGroups) * kStrideQK + d);
#pragma unroll
        for (int t = 0; t < kKeysPerThread; ++t)
          kf[t] = *reinterpret_cast<const float4*>(k_tile + (col + t * kRowLanes) * kStrideQK + d);
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
          for (int t = 0; t < kKeysPerThread; ++t) {
            s[i][t] = fmaf(qf[i].x, kf[t].x, s[i][t]);
            s[i][t] = fmaf(qf[i].y, kf[t].y, s[i][t]);
            s[i][t] = fmaf(qf[i].z, kf[t].z, s[i][t]);
            s[i][t] = fmaf(qf[i].w, kf[t].w, s[i][t]);
          }
        }
      }

      // The diagonal blocks (causal) and the tail block: -inf where key >= causal_key_end(row)
      // (or >= seqlen_k). The other blocks skip the test: it is uniform over the block.
      if (key0 + kBlockN > unmasked_end || key0 + kBlockN > p.seqlen_k) {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int64_t query = query0 + row_group + i * kRowGroups;
          const int64_t end = p.causal ? causal_key_end(query, p.seqlen_q, p.seqlen_k) : p.seqlen_k;
#pragma unroll
          for (int t = 0; t < kKeysPerThread; ++t) {
            if (key0 + col + t * kRowLanes >= end) s[i][t] = -INFINITY;
          }
        }
      }

      // --8<-- [start:fp32_online_update]
      // SOLUTION BEGIN lab08.2: the online softmax update for this key block, for each of the thread's rows i: the
      //   block's row max (over s[i][t] and the row's kRowLanes lanes: __shfl_xor_sync with offsets 4, 2, 1);
      //   m_new = max(m[i], it); offset = m_new * scale_log2, or 0 while m_new = -inf (a row that has seen no key
      //   yet); alpha = exp2f(m[i] * scale_log2 - offset); p = exp2f(s[i][t] * scale_log2 - offset) written to
      //   p_tile[(row_group + 16 i) * kStrideP + col + 8 t]; l[i] = alpha l[i] + this lane's sum of p;
      //   o_acc[i][:] *= alpha; m[i] = m_new
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        float block_max = s[i][0];
#pragma unroll
        for (int t = 1; t < kKeysPerThread; ++t) block_max = fmaxf(block_max, s[i][t]);
#pragma unroll
        for (int offset = kRowLanes / 2; offset > 0; offset /= 2)  // the row's 8 lanes, inside one warp
          block_max = fmaxf(block_max, __shfl_xor_sync(kFullWarpMask, block_max, offset));
        const float m_new = fmaxf(m[i], block_max);
        // While a row has seen only masked keys, m_new = -inf, and exp2(-inf - (-inf)) would be NaN:
        // take 0 as the offset then, so that every p (and alpha) is exp2(-inf) = 0.
        const float offset = m_new == -INFINITY ? 0.0f : m_new * scale_log2;
        // The rescale of what was summed against the old max; exactly 1 when the max did not grow.
        const float alpha = exp2f(m[i] * scale_log2 - offset);
        float row_sum = 0.0f;
        float* p_row = p_tile + (row_group + i * kRowGroups) * kStrideP;
#pragma unroll
        for (int t = 0; t < kKeysPerThread; ++t) {
          const float prob = exp2f(fmaf(s[i][t], scale_log2, -offset));  // 0 for a masked key
          row_sum += prob;
          p_row[col + t * kRowLanes] = prob;
        }
        // l stays this lane's share of the row's sum: every lane of the row rescales by the same
        // alpha (m is the row's, after the shuffles), so the 8 shares are added once, at the end.
        l[i] = alpha * l[i] + row_sum;
#pragma unroll
        for (int e = 0; e < kDimsPerThread; ++e) o_acc[i][e] *= alpha;
        m[i] = m_new;
      }
      // SOLUTION STUB
      // for (int i = 0; i < kRowsPerThread; ++i) {  // P = 0: O, l and m never change
      //   for (int t = 0; t < kKeysPerThread; ++t) p_tile[(row_group + i * kRowGroups) * kStrideP + col + t * 8] = 0;
      // }
      // SOLUTION END
      // --8<-- [end:fp32_online_update]
      __syncthreads();  // P complete before any thread reads another lane's probabilities

      // O += P V_j: this thread's 4 rows x kDimsPerThread dims, 4 keys per step (one P float4 per row).
#pragma unroll
      for (int j = 0; j < kBlockN; j += kVector) {
        float4 pf[kRowsPerThread];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
          pf[i] = *reinterpret_cast<const float4*>(p_tile + (row_group + i * kRowGroups) * kStrideP + j);
#pragma unroll
        for (int u = 0; u < kVector; ++u) {
          float4 vf[kDimChunks];
#pragma unroll
          for (int c = 0; c < kDimChunks; ++c)
            vf[c] =
                *reinterpret_cast<const float4*>(v_tile + (j + u) * kStrideV + c * Tiles::kChunkSpan + col * kVector);
#pragma unroll
          for (int i = 0; i < kRowsPerThread; ++i) {
            const float prob = component(pf[i], u);
#pragma unroll
            for (int c = 0; c < kDimChunks; ++c) {
              o_acc[i][c * kVector + 0] = fmaf(prob, vf[c].x, o_acc[i][c * kVector + 0]);
              o_acc[i][c * kVector + 1] = fmaf(prob, vf[c].y, o_acc[i][c * kVector + 1]);
              o_acc[i][c * kVector + 2] = fmaf(prob, vf[c].z, o_acc[i][c * kVector + 2]);
              o_acc[i][c * kVector + 3] = fmaf(prob, vf[c].w, o_acc[i][c * kVector + 3]);
            }
          }
        }
      }
      __syncthreads();  // every read of K_j, V_j and P done before the next block overwrites them
    }

    // The epilogue: the row's sum from its 8 lanes, one division, o and L. A row that saw no key
    // has l = 0: o = 0 (O is 0 too) and L = -inf.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float row_l = l[i];
#pragma unroll
      for (int offset = kRowLanes / 2; offset > 0; offset /= 2) row_l += __shfl_xor_sync(kFullWarpMask, row_l, offset);
      const int64_t query = query0 + row_group + i * kRowGroups;
      if (query >= p.seqlen_q) continue;
      const float inv_l = row_l > 0.0f ? 1.0f / row_l : 0.0f;
      float* o_row = o + ((b * p.seqlen_q + query) * p.heads_q + h) * kHeadDim;
#pragma unroll
      for (int c = 0; c < kDimChunks; ++c) {
        const float* acc = &o_acc[i][c * kVector];
        *reinterpret_cast<float4*>(o_row + c * Tiles::kChunkSpan + col * kVector) =
            make_float4(acc[0] * inv_l, acc[1] * inv_l, acc[2] * inv_l, acc[3] * inv_l);
      }
      // L = log(sum_j exp(scale s_j)) = scale m + log(l), natural log.
      if (col == 0) p.lse[bh * p.seqlen_q + query] = row_l > 0.0f ? m[i] * p.scale + logf(row_l) : -INFINITY;
    }
  }
}
// --8<-- [end:fp32_kernel]

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// 16-byte loads apply when every row of q, k and v starts on a 16-byte boundary.
bool vector_loads(const AttentionParams& p) {
  const Strides* strides[] = {&p.q_strides, &p.k_strides, &p.v_strides};
  for (const Strides* s : strides) {
    if (s->batch % kVector != 0 || s->seq % kVector != 0 || s->head % kVector != 0) return false;
  }
  return aligned16(p.q) && aligned16(p.k) && aligned16(p.v);
}

template <int kHeadDim>
void launch_typed(const AttentionParams& p, cudaStream_t stream) {
  using Tiles = Fp32Tiles<kHeadDim>;
  const auto kernel = flash_fp32_kernel<kHeadDim>;
  course::opt_in_dynamic_shared(kernel, Tiles::kSharedBytes, "flash_forward_fp32 at this head_dim");  // D 128
  const int64_t query_blocks = course::ceil_div<int64_t>(p.seqlen_q, kBlockM);
  const int64_t work_items = query_blocks * p.batch * p.heads_q;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(work_items, INT32_MAX));
  kernel<<<blocks, kThreads, Tiles::kSharedBytes, stream>>>(p, query_blocks, vector_loads(p));
  COURSE_CHECK_LAUNCH();
}

}  // namespace

FlashFp32Tiles flash_fp32_tiles(int head_dim) {
  switch (head_dim) {
    case kHeadDimSmall:
      return {kBlockM, Fp32Tiles<kHeadDimSmall>::kBlockN, kWarps, Fp32Tiles<kHeadDimSmall>::kSharedBytes};
    case kHeadDimLarge:
      return {kBlockM, Fp32Tiles<kHeadDimLarge>::kBlockN, kWarps, Fp32Tiles<kHeadDimLarge>::kSharedBytes};
    default: throw std::invalid_argument("flash_forward_fp32: head_dim must be 64 or 128");
  }
}

void launch_flash_forward_fp32(const AttentionParams& params, cudaStream_t stream) {
  if (params.head_dim != kHeadDimSmall && params.head_dim != kHeadDimLarge) {
    throw std::invalid_argument("flash_forward_fp32: head_dim must be 64 or 128, got " +
                                std::to_string(params.head_dim));
  }
  if (params.heads_kv <= 0 || params.heads_q % params.heads_kv != 0) {
    throw std::invalid_argument("flash_forward_fp32: heads_q must be a multiple of heads_kv (and heads_kv >= 1)");
  }
  if (!aligned16(params.o)) throw std::invalid_argument("flash_forward_fp32: o must be 16-byte aligned");
  // Nothing to write, and a grid of zero blocks is an invalid launch. (seqlen_k = 0 needs no case
  // of its own: every block skips the key loop and writes o = 0, L = -inf.)
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) return;
  if (params.head_dim == kHeadDimSmall) {
    launch_typed<kHeadDimSmall>(params, stream);
  } else {
    launch_typed<kHeadDimLarge>(params, stream);
  }
}

// Lab skeleton generated from solutions/08-flash-attention/flash_backward.cu by `./course labs` [lab-hash 55f9fa079d61].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08, rung 4: the backward of attention on tensor cores (FlashAttention-2's algorithm), float16
// and bfloat16, head_dim 64 or 128, float32 accumulation. With s the softmax scale and L the
// forward's log-sum-exp, for a query block i and a key block j:
//   S = Q_i K_j^T,  P = exp(s S - L_i)        P recomputed from Q, K and L: never stored by the forward
//   dV_j += P^T dO_i
//   dP = dO_i V_j^T,  dS = P * (dP - D_i)     D_i = rowsum(dO_i * O_i), lesson 07's softmax row dot
//   dK_j += s dS^T Q_i,  dQ_i += s dS K_j
// Three kernels on one stream:
//   1. preprocess  D = rowsum(dO * O) per query row into params.delta; grad_q_accum zeroed
//   2. main        one block per (key block j, batch, kv head): K_j and V_j stay in shared memory,
//                  dK_j and dV_j in registers, while the query blocks of every query head of the kv
//                  head's group stream past; dQ's partial sums go to grad_q_accum by float32 atomics
//   3. convert     grad_q = s * grad_q_accum, rounded to the element type
// or, with params.deterministic, no atomics: the main kernel computes dK and dV only, and a dQ pass
// over the key blocks per query block (flash_backward_dq_kernel) writes grad_q, reproducibly.
// Recompute against store: P is Sq x Sk per head (a 16k x 16k bfloat16 P is 512 MB a head); the
// recompute costs one extra Q K^T product (5 products here against 4 if P were stored) and keeps
// the memory O(N).
#include <course/cuda.cuh>
#include <course/dtype.cuh>
#include <course/mma.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "smem_tiles.cuh"

// A namespace of this file's own: flash_forward.cu may define helpers of the same names (one program).
namespace flash_backward_impl {

using attention_tiles::byte_at;
using attention_tiles::LaneOffsets;
using attention_tiles::swizzled;
using course::commit_copies;
using course::copy_chunk_async;
using course::exp2_approx;
using course::from_compute;
using course::kElementsPerChunk;
using course::kFullWarpMask;
using course::kLog2e;
using course::kMmaK;
using course::kMmaM;
using course::kMmaN;
using course::kWarpSize;
using course::ldmatrix_x4;
using course::ldmatrix_x4_trans;
using course::mma_16816;
using course::pack_pair;
using course::store_pair;
using course::to_compute;
using course::wait_copies;

// --8<-- [start:backward_tiles]
// The work split. One block per (key block j, batch, kv head): K_j and V_j are loaded once and stay
// in shared memory; dK_j and dV_j are summed in registers over every query block i that sees key
// block j, of every query head of the GQA group, in one fixed order (heads ascending, then i), by one
// thread per element: deterministic, and written once, no atomics. dQ_i gets one partial sum from
// every key block: float32 atomics (or a second pass: see `determinism` below).
//
// Transposed scores. Of the three products that consume P or dS, two want the keys as rows
// (dV += P^T dO and dK += dS^T Q: their mma rows are keys) and one wants the queries as rows
// (dQ += dS K). So each warp computes S^T = K Q^T and dP^T = V dO^T, keys as mma rows: P^T and dS^T
// come out of the accumulators already laid out as the A operands of the dV and dK products (an
// accumulator pair (c0, c1) is an A register: pack_pair, no data movement), and only dS crosses
// shared memory, once, for dQ. (FlashAttention-2's CUDA kernel computes S with queries as rows and
// sends both P and dS through shared memory; Triton's fused-attention tutorial transposes, as here.)
//
// Warps and Bc. Each warp owns 16 keys, one mma row tile, for all five products' key side: with
// 8 warps kBlockN = Bc = 128 keys. A warp owning 16 keys needs every query of the block along the
// k dimension of dV += P^T dO, so splitting a key tile across two warps would mean two copies of
// the dK, dV accumulators (or S computed twice). Why 128 keys and not 64: each key block re-reads
// Q_i and dO_i from L2 and adds Br x D floats of dQ partial sums per step, so both traffics scale
// as Sk / Bc: 128 halves them against 64 (FlashAttention-2 uses 128 too).
//
// Registers per thread (8 warps = 256 threads, one block per SM: at most 255 each):
//   dK, dV accumulators   2 x 16 keys x D fp32 / 32 lanes = D:       128 (D = 128), 64 (D = 64)
//   S^T, dP^T             2 x 16 keys x 32 queries fp32 / 32 lanes = 32: a step's 64 queries go
//                         through in two phases of 32 (kPhaseQueries). All 64 at once would be 64
//                         registers: 128 + 64 + operands in flight spilled at D = 128.
//   dQ partial            Br x D / 256 threads: 32 (D = 128), 16 (D = 64), after the phases
//   K, V A-fragments      D = 64 only: 2 x 16 keys x 64 x 2 B / 32 lanes / 4 B = 32 registers, loaded
//                         once for the block's life (16 fewer ldmatrix.x4 a step); at D = 128 they
//                         would be 64 more: re-read from shared memory in each phase.
// ptxas (nvcc 13.0): 251 registers at D = 128 (248 on sm_90a), 227 at D = 64 (231), no spills.
// Br = 64: a step's fixed costs (two barriers, the prefetch, L_i and D_i) over 64 queries, and dQ's
// 64 x D tile as 2 x 4 warp tiles of 32 x D/4 (4 ldmatrix.x4 per 8 mma); a dS^T row of 64
// 16-bit queries is 8 chunks, the swizzle's width.
//
// Shared memory (16-bit elements):
//   K_j, V_j                        2 x 128 x D x 2 B        = 64 KiB (D = 128), 32 KiB (D = 64)
//   Q_i, dO_i, two stages           2 x 2 x 64 x D x 2 B     = 64 KiB,           32 KiB
//   dS^T (keys x queries)           128 x 64 x 2 B           = 16 KiB
//   L_i, D_i, two stages            2 x 2 x 64 x 4 B         =  1 KiB
//   total                                                     145 KiB,            81 KiB
// Both fit sm_80 (163 KiB a block, opt-in) and sm_90 (227 KiB); above 48 KiB the launcher opts in.
// One block per SM: at D = 128 shared memory allows one (2 x 145 > 228), at D = 64 the registers do
// (227 x 256 threads: 2 blocks would need <= 128 a thread).
// (GPUs with 99 KiB a block, sm_86 and sm_89, cannot run D = 128: the launcher says so.)
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kBlockN = kWarps * kMmaM;  // keys per block (Bc): warp w owns keys 16w .. 16w + 15
constexpr int kBlockM = 64;              // queries per step (Br)
constexpr int kPhaseQueries = 32;        // queries per register phase: S^T, dP^T of 16 keys x 32 queries
constexpr int kStages = 2;               // Q_i, dO_i double-buffered: step i + 1 loads while step i computes
constexpr int kMaxRegisters = 255;
constexpr int kSharedOptInSm80 = 163 * 1024;

template <int kHeadDim>
struct Tiles {
  static constexpr int kChunksD = kHeadDim / kElementsPerChunk;  // 16-byte chunks in a row of Q, dO, K, V
  static constexpr int kChunksM = kBlockM / kElementsPerChunk;   // chunks in a row of dS^T (one key)
  static constexpr int kDimTiles = kHeadDim / kMmaN;             // n8 tiles across a warp's dK, dV rows
  static constexpr bool kKvInRegisters = kHeadDim == 64;
  // dQ_i = dS K_j is a Br x D product over the block's 128 keys: 2 x 4 warps of 32 x D/4 each.
  static constexpr int kDqWarpsM = 2, kDqWarpsN = kWarps / kDqWarpsM;
  static constexpr int kDqRows = kBlockM / kDqWarpsM, kDqCols = kHeadDim / kDqWarpsN;
  static constexpr int kDqTilesM = kDqRows / kMmaM, kDqTilesN = kDqCols / kMmaN;

  static constexpr int kAccumulatorRegisters = 2 * kMmaM * kHeadDim / kWarpSize;
  static constexpr int kScoreRegisters = 2 * kMmaM * kPhaseQueries / kWarpSize;
  static constexpr int kKvRegisters = kKvInRegisters ? 2 * kMmaM * kHeadDim * 2 / kWarpSize / 4 : 0;
  static constexpr int kOtherRegisters = 48;  // addresses, loop state, operand fragments in flight

  static constexpr int kKvTileChunks = kBlockN * kChunksD;
  static constexpr int kQTileChunks = kBlockM * kChunksD;
  static constexpr int kDsTileChunks = kBlockN * kChunksM;
  static constexpr int kSharedBytes =
      (2 * kKvTileChunks + 2 * kStages * kQTileChunks + kDsTileChunks) * course::kChunkBytes +
      2 * kStages * kBlockM * static_cast<int>(sizeof(float));

  static_assert(kHeadDim % kMmaK == 0 && kBlockM % kMmaK == 0 && kBlockN % kMmaK == 0, "whole k-steps");
  static_assert(kChunksD % 8 == 0 && kChunksM % 8 == 0, "the swizzle permutes 8 chunks: rows of 64+ elements");
  static_assert(kDqRows % kMmaM == 0 && kDqTilesN % 2 == 0, "dQ: whole m16 tiles, n8 tiles in ldmatrix.x4 pairs");
  static_assert(kAccumulatorRegisters + kScoreRegisters + kKvRegisters + kOtherRegisters <= kMaxRegisters,
                "dK, dV, S^T, dP^T (and K, V fragments) fit one thread's registers at one block per SM");
  static_assert(kSharedBytes <= kSharedOptInSm80, "fits sm_80's shared memory (and so sm_90's)");
  static_assert(2 * kBlockM <= kThreads, "one thread per L and per D value of a step");
};
static_assert(Tiles<128>::kSharedBytes == 145 * 1024 && Tiles<64>::kSharedBytes == 81 * 1024,
              "the sums in the comment above");
// --8<-- [end:backward_tiles]

// ---------------------------------------------------------------- fragments and shared-memory layout
// A (row, column) position in a tile.
struct Coord {
  int row, col;
};

// mma.m16n8k16's accumulator layout (lab 05): lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and
// 2(l%4) + 1; registers 0, 1 the first row, 2, 3 the second.
__host__ __device__ constexpr Coord accumulator_coord(int lane, int register_index) {
  return {lane / 4 + 8 * (register_index / 2), 2 * (lane % 4) + register_index % 2};
}

// The (row, first column) of the stored tile whose 16-byte row `lane` addresses for ldmatrix.x4,
// for the four ways the products below read their operands (lanes 8i .. 8i + 7 address matrix i,
// which lands in register i). "Stored m-major": rows of the tile are the operand's m (or n) rows,
// k contiguous: ldmatrix as is. "Stored k-major": rows of the tile are k, m (or n) contiguous:
// ldmatrix.trans, which hands lane l the column l / 4 of each 8x8 matrix instead of its row.
// A 16x16 (m x k), stored m-major: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
__host__ __device__ constexpr Coord a_source(int lane) { return {lane % 16, 8 * (lane / 16)}; }
// B 16x16 (k x two n8 tiles), stored n-major: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, ...), ...:
// registers 0, 1 are (b0, b1) of n tile 0, registers 2, 3 those of n tile 1.
__host__ __device__ constexpr Coord b_source(int lane) { return {lane % 8 + 8 * (lane / 16), 8 * (lane / 8 % 2)}; }
// A, stored k-major (row = k, column = m), .trans: the same four matrices, addressed by their k rows.
__host__ __device__ constexpr Coord a_trans_source(int lane) {
  return {lane % 8 + 8 * (lane / 16), 8 * (lane / 8 % 2)};
}
// B, stored k-major (row = k, column = n), .trans: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), ...
__host__ __device__ constexpr Coord b_trans_source(int lane) { return {lane % 16, 8 * (lane / 16)}; }
// A stored m-major and B stored k-major address the same rows: the kernel reads K, V as A (S^T, dP^T)
// through the lane offsets of the .trans B reads.
constexpr bool a_source_is_b_trans_source() {
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (a_source(lane).row != b_trans_source(lane).row || a_source(lane).col != b_trans_source(lane).col) return false;
  }
  return true;
}
static_assert(a_source_is_b_trans_source(), "one set of lane offsets serves both");

// The swizzle, the lanes' ldmatrix offsets and byte_at: smem_tiles.cuh (shared with the forward).

// Copy rows [first_row, first_row + kRows) of a (seqlen, ..., D) view (row r at rows + r * row_stride)
// into a swizzled tile; rows past row_count are zero-filled. kChunks consecutive threads copy one
// row (coalesced 128- or 256-byte reads; their 16-byte stores cover 8 bank groups).
template <int kRows, int kChunks, int kBlockThreads = kThreads, typename T>
__device__ inline void load_tile(uint4* tile, const T* rows, int64_t row_stride, int64_t first_row, int64_t row_count) {
  constexpr int kRowsPerPass = kBlockThreads / kChunks;
  static_assert(kBlockThreads % kChunks == 0 && kRows % kRowsPerPass == 0, "every thread copies the same chunks");
  const int row = static_cast<int>(threadIdx.x) / kChunks, chunk = static_cast<int>(threadIdx.x) % kChunks;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int r = row + pass * kRowsPerPass;
    const bool valid = first_row + r < row_count;
    const T* source = valid ? rows + (first_row + r) * row_stride + chunk * kElementsPerChunk : rows;
    copy_chunk_async(tile + swizzled<kChunks>(r, chunk), source, valid);
  }
}

// One float global -> shared, 0 when !valid: cp.async of 4 bytes (.ca, the only form below 16
// bytes), in the same commit group as the tiles of its step. The rows of L and D are float32 rows
// of (batch, heads_q, seqlen_q) at any offset, so not 16-byte aligned: one float per thread.
__device__ inline void copy_float_async(float* destination, const float* source, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(course::shared_address(destination)), "l"(source),
               "r"(valid ? 4 : 0));
#else
  *destination = valid ? *source : 0.0f;
#endif
}

// Whether key kr of the block is seen by query qr of the tile (both relative): see `diagonal` in the loop.
__device__ inline bool visible_in_tile(int kr, int qr, int key_end, int query_end, int diagonal) {
  return kr < key_end && qr < query_end && kr - qr <= diagonal;
}

// L * log2(e), the subtrahend of P = exp2(s log2(e) S - L log2(e)). A row that sees no key has
// L = -inf; +inf instead makes its P = exp2(finite - inf) = 0 with no inf - inf = NaN.
__device__ inline float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// dQ partial sums into grad_q_accum: two adjacent floats. sm_90 has a vector float2 atomic add
// (one instruction for the pair); before, two scalar ones. Return values unused: RED, not ATOM.
__device__ inline void atomic_add_pair(float* address, float first, float second) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(address), make_float2(first, second));
#else
  atomicAdd(address, first);
  atomicAdd(address + 1, second);
#endif
}

// ---------------------------------------------------------------- 1. preprocess
// --8<-- [start:preprocess]
// D_i = sum_d dO[i, d] O[i, d] in float32, one group of D / 8 lanes per (batch, query, head) row:
// each lane loads one 16-byte vector of dO and of O, multiplies and adds its 8 products, and the
// group's partial sums meet by shuffles. The loop runs over whole warps' worth of rows so that
// every lane of a warp reaches every shuffle. The same pass zeroes the row of grad_q_accum (the
// atomics add into it): the bytes a cudaMemsetAsync would write, without another launch.
constexpr int kPreprocessThreads = 256;

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessThreads)
    backward_preprocess_kernel(const T* __restrict__ grad_o, const T* __restrict__ o, float* __restrict__ delta,
                               float* __restrict__ grad_q_accum, int64_t rows, int64_t seqlen_q, int64_t heads_q) {
  constexpr int kElems = course::kElemsPerVector<T>;  // 8 two-byte elements a 16-byte vector
  using Vector = course::Pack<T, kElems>;
  constexpr int kRowLanes = kHeadDim / kElems;  // 8 (D = 64) or 16 (D = 128) lanes a row
  constexpr int kRowsPerWarp = kWarpSize / kRowLanes;
  constexpr int kWarpsPerBlock = kPreprocessThreads / kWarpSize;
  static_assert(kWarpSize % kRowLanes == 0, "whole rows per warp");
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, row_lane = lane % kRowLanes;
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t first_row = warp * kRowsPerWarp; first_row < rows; first_row += warps * kRowsPerWarp) {
    const int64_t row = first_row + lane / kRowLanes;  // (batch, query, head), grad_o's row order
    const bool valid = row < rows;
    const int64_t offset = (valid ? row : rows - 1) * kHeadDim + row_lane * kElems;  // past the end: reread the last
    const Vector g = *reinterpret_cast<const Vector*>(grad_o + offset);
    const Vector y = *reinterpret_cast<const Vector*>(o + offset);
    float dot = 0.0f;
    // TODO(lab08.6): the row's dot D = sum over d of grad_o * o in float32: this lane's 8 products of g.v
    //   and y.v (to_compute each), then the sum over the row's kRowLanes lanes with __shfl_xor_sync (offsets
    //   kRowLanes / 2 down to 1: they stay inside the lane group), so that every lane of the group holds it
    if (valid) {
      if (row_lane == 0) {
        const int64_t head = row % heads_q, batch_query = row / heads_q;
        const int64_t query = batch_query % seqlen_q, batch = batch_query / seqlen_q;
        delta[(batch * heads_q + head) * seqlen_q + query] = dot;  // (batch, heads_q, seqlen_q), like L
      }
      if (grad_q_accum != nullptr) {  // null in the deterministic mode: no atomics to add into it
        float4* accum = reinterpret_cast<float4*>(grad_q_accum + offset);  // 8 floats: two float4
        accum[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        accum[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  }
}
// --8<-- [end:preprocess]

// ---------------------------------------------------------------- 2. main kernel
// kAtomicDq: dQ's partial sums by atomics (the default); false: dK and dV only, dQ by the separate
// deterministic pass (flash_backward_dq_kernel below).
template <typename T, int kHeadDim, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_kernel(const AttentionBackwardParams params, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.m16n8k16 and cp.async need sm_80: the launcher refuses older GPUs, so no body here
#else
  using Config = Tiles<kHeadDim>;
  constexpr int kChunksD = Config::kChunksD, kChunksM = Config::kChunksM;
  constexpr int kDimTiles = Config::kDimTiles;
  constexpr int kPhases = kBlockM / kPhaseQueries, kPhaseTiles = kPhaseQueries / kMmaN,
                kPhaseSteps = kPhaseQueries / kMmaK;
  constexpr bool kKvInRegisters = Config::kKvInRegisters;

  extern __shared__ uint4 shared_chunks[];                           // 16-byte aligned
  uint4* const k_tile = shared_chunks;                               // (kBlockN, D) swizzled, keys of block j
  uint4* const v_tile = k_tile + Config::kKvTileChunks;              // (kBlockN, D)
  uint4* const q_tiles = v_tile + Config::kKvTileChunks;             // (kStages, kBlockM, D)
  uint4* const do_tiles = q_tiles + kStages * Config::kQTileChunks;  // (kStages, kBlockM, D)
  uint4* const ds_tile = do_tiles + kStages * Config::kQTileChunks;  // (kBlockN, kBlockM): dS^T, 16-bit
  float* const lse_tiles = reinterpret_cast<float*>(ds_tile + Config::kDsTileChunks);  // (kStages, kBlockM)
  float* const delta_tiles = lse_tiles + kStages * kBlockM;                            // (kStages, kBlockM)

  const AttentionParams& forward = params.forward;
  const int64_t seqlen_q = forward.seqlen_q, seqlen_k = forward.seqlen_k;
  const int64_t heads_q = forward.heads_q, heads_kv = forward.heads_kv;
  const int group = static_cast<int>(heads_q / heads_kv);  // query heads per kv head: kv_head * group + g
  const bool causal = forward.causal;

  // blockIdx.x = (batch * heads_kv + kv_head) * key_blocks + j: the key blocks of one head run side by
  // side, reading the same Q_i, dO_i stream from L2.
  const int64_t key_blocks = course::ceil_div<int64_t>(seqlen_k, kBlockN);
  const int64_t batch_head = blockIdx.x / key_blocks;
  const int64_t batch = batch_head / heads_kv, kv_head = batch_head % heads_kv;
  const int64_t key0 = (blockIdx.x % key_blocks) * kBlockN;
  const int key_end = static_cast<int>(min(seqlen_k - key0, int64_t{kBlockN}));  // keys of the block inside seqlen_k

  // Causal block skipping: query q sees key key0 iff key0 < q + 1 + seqlen_k - seqlen_q, so the
  // first query block that sees any key of this block holds query key0 + seqlen_q - seqlen_k; the
  // blocks above it are skipped, not masked. (It is always < seqlen_q: the last query sees every key.)
  const int query_blocks = static_cast<int>(course::ceil_div<int64_t>(seqlen_q, kBlockM));
  const int first_query_block = causal ? static_cast<int>(max(int64_t{0}, key0 + seqlen_q - seqlen_k) / kBlockM) : 0;

  // The group's first query head, as the base of each per-head operand; a step adds its head's offset.
  const int64_t head0 = kv_head * group;
  const Strides& qs = forward.q_strides;
  const T* const q_group = static_cast<const T*>(forward.q) + batch * qs.batch + head0 * qs.head;
  const T* const do_group = static_cast<const T*>(params.grad_o) + (batch * seqlen_q * heads_q + head0) * kHeadDim;
  const int64_t lse_group = (batch * heads_q + head0) * seqlen_q;  // L and D: (batch, heads_q, seqlen_q)

  // Step (head_in_group, query_block): Q_i, dO_i, L_i, D_i of that query block and head into `stage`.
  const auto load_step = [&](int head_in_group, int query_block, int stage) {
    const int64_t query0 = int64_t{query_block} * kBlockM;
    load_tile<kBlockM, kChunksD>(q_tiles + stage * Config::kQTileChunks, q_group + head_in_group * qs.head, qs.seq,
                                 query0, seqlen_q);
    load_tile<kBlockM, kChunksD>(do_tiles + stage * Config::kQTileChunks, do_group + head_in_group * kHeadDim,
                                 heads_q * kHeadDim, query0, seqlen_q);
    if (threadIdx.x < 2 * kBlockM) {  // threads 0..63 one value of L_i each, 64..127 one of D_i
      const bool is_lse = threadIdx.x < kBlockM;
      const int row = static_cast<int>(threadIdx.x) % kBlockM;
      const float* source = (is_lse ? forward.lse : params.delta) + lse_group + head_in_group * seqlen_q;
      const bool valid = query0 + row < seqlen_q;
      copy_float_async((is_lse ? lse_tiles : delta_tiles) + stage * kBlockM + row,
                       valid ? source + query0 + row : source, valid);
    }
  };

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp_key = warp * kMmaM;  // this warp's first key row in the block
  const int lane_row = accumulator_coord(lane, 0).row, lane_col = accumulator_coord(lane, 0).col;  // l/4, 2(l%4)
  const Coord a_src = a_source(lane), b_src = b_source(lane);
  const Coord a_trans_src = a_trans_source(lane), b_trans_src = b_trans_source(lane);
  const int dq_row0 = (warp / Config::kDqWarpsN) * Config::kDqRows;  // this warp's dQ tile
  const int dq_col0 = (warp % Config::kDqWarpsN) * Config::kDqCols;
  // Every shared-memory access of the loop, as lane offsets (LaneOffsets): which tile, which rows
  // (+ row0 at the read), which chunks (+ chunk0 at the read).
  // K and V as A of S^T, dP^T read the pattern of a_source at rows warp_key + ..: the same lane
  // offsets as b_trans_source (a_source_is_b_trans_source), in the warp's 16 rows of the tiles.
  const LaneOffsets<kChunksD> qdo_b(b_src.row, b_src.col / kElementsPerChunk);  // Q, dO as B of S^T, dP^T
  const LaneOffsets<kChunksD> bt(b_trans_src.row,
                                 b_trans_src.col / kElementsPerChunk);  // Q, dO as B of dK, dV; K, V as A
  const LaneOffsets<kChunksD> k_bt(b_trans_src.row, (dq_col0 + b_trans_src.col) / kElementsPerChunk);   // K as B of dQ
  const LaneOffsets<kChunksM> ds_at(a_trans_src.row, (dq_row0 + a_trans_src.col) / kElementsPerChunk);  // dS as A of dQ
  const uint4* const k_rows = k_tile + warp_key * kChunksD;  // the warp's 16 keys
  const uint4* const v_rows = v_tile + warp_key * kChunksD;
  // dS^T stores, row warp_key + lane_row (+ 8), chunk c: byte ds_store_row + ((16 c) ^ ds_store_xor) + word.
  const uint32_t ds_store_row = (warp_key + lane_row) * kChunksM * course::kChunkBytes + (lane % 4) * 4;
  const uint32_t ds_store_xor = (lane_row % 8) * course::kChunkBytes;

  // Prologue: K_j, V_j (one commit group), then the first step (the next group). There is always a
  // first step: group >= 1 and first_query_block < query_blocks.
  const Strides &ks = forward.k_strides, &vs = forward.v_strides;
  load_tile<kBlockN, kChunksD>(k_tile, static_cast<const T*>(forward.k) + batch * ks.batch + kv_head * ks.head, ks.seq,
                               key0, seqlen_k);
  load_tile<kBlockN, kChunksD>(v_tile, static_cast<const T*>(forward.v) + batch * vs.batch + kv_head * vs.head, vs.seq,
                               key0, seqlen_k);
  commit_copies();
  load_step(0, first_query_block, 0);
  commit_copies();

  // D = 64: the warp's 16 rows of K_j and V_j as A fragments, once (the A operands of S^T and dP^T).
  uint32_t k_fragments[kKvInRegisters ? kHeadDim / kMmaK : 1][4];
  uint32_t v_fragments[kKvInRegisters ? kHeadDim / kMmaK : 1][4];
  if constexpr (kKvInRegisters) {
    wait_copies<1>();  // K_j, V_j have landed (the first step may still be in flight)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kMmaK; ++kk) {
      ldmatrix_x4(k_fragments[kk], byte_at(k_rows, bt.at(0, 2 * kk)));
      ldmatrix_x4(v_fragments[kk], byte_at(v_rows, bt.at(0, 2 * kk)));
    }
  }

  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};  // (16 keys, D) of this warp, fp32: the whole block's life

  // --8<-- [start:backward_loop]
  // The steps, in a fixed order: query heads of the group outer, query blocks from the first that
  // sees this key block inner. Counters, not a divided step index: no 64-bit division in the loop.
  const auto advance = [&](int& head_in_group, int& query_block) {
    if (++query_block == query_blocks) query_block = first_query_block, ++head_in_group;
  };
  for (int head_in_group = 0, query_block = first_query_block, stage = 0; head_in_group < group;
       advance(head_in_group, query_block), stage ^= 1) {
    // This thread's copies of this step (the newest group) have landed; after the barrier everyone's
    // have, and everyone has finished the previous step, whose stage the prefetch below overwrites
    // and whose dS^T (read by its dQ) this step overwrites.
    wait_copies<0>();
    __syncthreads();
    int next_head = head_in_group, next_block = query_block;
    advance(next_head, next_block);
    if (next_head < group) load_step(next_head, next_block, stage ^ 1);
    commit_copies();

    const int64_t query0 = int64_t{query_block} * kBlockM;
    const uint4* const q_tile = q_tiles + stage * Config::kQTileChunks;
    const uint4* const do_tile = do_tiles + stage * Config::kQTileChunks;
    const float* const lse_tile = lse_tiles + stage * kBlockM;
    const float* const delta_tile = delta_tiles + stage * kBlockM;
    // Query (query0 + qr) sees key (key0 + kr) iff kr < key_end, qr < query_end and, causal, kr - qr <=
    // diagonal (= seqlen_k - seqlen_q - key0 + query0, clamped: beyond the tile's range of kr - qr
    // its value no longer matters). Masks only where some pair of the tile is hidden: a key tail, a
    // query tail, or a tile the causal diagonal crosses. Uniform over the block: no divergence.
    const int query_end = static_cast<int>(min(seqlen_q - query0, int64_t{kBlockM}));
    const int diagonal =
        causal ? static_cast<int>(max(min(seqlen_k - seqlen_q - key0 + query0, int64_t{kBlockN}), int64_t{-kBlockM}))
               : kBlockN;
    const bool masked = key_end < kBlockN || query_end < kBlockM || diagonal < kBlockN - 1;

    // Two phases of 32 queries each (kPhaseQueries, see backward_tiles): per phase, S^T and dP^T, P and
    // dS, their share of dV and dK, and their share of dS^T to shared memory. Not unrolled: unrolled,
    // ptxas hoists the second phase's loads into the first and spills (D = 128, measured by -Xptxas -v).
#pragma unroll 1
    for (int phase = 0; phase < kPhases; ++phase) {
      const int phase_query = phase * kPhaseQueries;  // the phase's first query in the tile
      // S^T = K_j Q^T and dP^T = V_j dO^T: (16 keys, 32 queries) per warp, k = D.
      //   A = K_j, V_j rows of the warp: stored key-major, d contiguous = m-major: ldmatrix (or registers).
      //   B = Q_i^T, dO_i^T (k = d, n = query): Q_i stored query-major, d contiguous = n-major: ldmatrix.
      float s[kPhaseTiles][4] = {}, dp[kPhaseTiles][4] = {};  // (16 keys, 32 queries): query tile n, accumulator r
#pragma unroll
      for (int kk = 0; kk < kHeadDim / kMmaK; ++kk) {
        uint32_t k_a[4], v_a[4];
        if constexpr (kKvInRegisters) {
#pragma unroll
          for (int r = 0; r < 4; ++r) k_a[r] = k_fragments[kk][r], v_a[r] = v_fragments[kk][r];
        } else {
          ldmatrix_x4(k_a, byte_at(k_rows, bt.at(0, 2 * kk)));  // chunk 2kk: d = 16kk ..
          ldmatrix_x4(v_a, byte_at(v_rows, bt.at(0, 2 * kk)));
        }
#pragma unroll
        for (int n = 0; n < kPhaseTiles; n += 2) {                            // two query tiles per ldmatrix.x4
          const uint32_t offset = qdo_b.at(phase_query + n * kMmaN, 2 * kk);  // queries .. + 8n, d = 16kk ..
          uint32_t q_b[4], do_b[4];
          ldmatrix_x4(q_b, byte_at(q_tile, offset));
          ldmatrix_x4(do_b, byte_at(do_tile, offset));
          const uint32_t q0[2] = {q_b[0], q_b[1]}, q1[2] = {q_b[2], q_b[3]};
          const uint32_t do0[2] = {do_b[0], do_b[1]}, do1[2] = {do_b[2], do_b[3]};
          mma_16816<T>(s[n], k_a, q0);
          mma_16816<T>(s[n + 1], k_a, q1);
          mma_16816<T>(dp[n], v_a, do0);
          mma_16816<T>(dp[n + 1], v_a, do1);
        }
      }

      // P^T and dS^T as the A operands of dV += P^T dO and dK += dS^T Q (m = the warp's 16 keys,
      // k = queries): k-step kk covers query tiles 2kk and 2kk + 1, so its registers are the
      // accumulator pairs (0, 1) and (2, 3) of those two tiles, packed to 16 bits.
      uint32_t p_a[kPhaseSteps][4], ds_a[kPhaseSteps][4];
      // TODO(lab08.7): P and dS, then dV and dK, for this phase's 32 queries. Accumulator r of query tile n
      //   of s and dp is key warp_key + lane_row + 8 (r / 2), query phase_query + 8 n + lane_col + r % 2 of the tile:
      //   P = exp2_approx(S scale_log2 - lse_log2(L)), L and D from lse_tile, delta_tile; if `masked`, P = 0 where
      //   visible_in_tile() is false; dS = P (dP - D). Pack P into p_a and dS into ds_a (pack_pair<T>), then per
      //   k-step kk of 16 queries: dv += p_a[kk] dO_i, dk += ds_a[kk] Q_i, the B operands from do_tile and q_tile by
      //   ldmatrix_x4_trans at bt.at(phase_query + 16 kk, n)
      for (auto& fragment : ds_a) for (uint32_t& pair : fragment) pair = 0;
      (void)p_a, (void)lse_tile, (void)delta_tile, (void)masked;  // used by the code you write

      // dS^T to shared memory, as the warp holds it: row = key, the 64 queries contiguous. dQ = dS K_j
      // wants dS with queries as mma rows, the transpose of what this warp holds, and all 128 keys
      // along k, spread over all 8 warps: the one product whose operand must cross warps. One 4-byte
      // store per register: for a fixed register the 32 lanes write 8 rows (row % 8 = l / 4) x 4
      // words of one chunk column, which the swizzle spreads over 8 bank groups: no conflict.
#pragma unroll
      for (int kk = 0; kk < (kAtomicDq ? kPhaseSteps : 0); ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          // key warp_key + lane_row + 8 (r % 2), queries phase_query + 16kk + 8 (r / 2) + lane_col:
          // chunk (phase_query + 16kk) / 8 + r / 2, word lane % 4 of it
          const int row = 8 * (r % 2), chunk = (phase_query + kk * kMmaK) / kElementsPerChunk + r / 2;
          const uint32_t offset =
              ds_store_row + row * kChunksM * course::kChunkBytes + ((chunk * course::kChunkBytes) ^ ds_store_xor);
          *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(ds_tile) + offset) = ds_a[kk][r];
        }
      }
    }
    // --8<-- [end:backward_loop]

    // --8<-- [start:dq_atomics]
    // dQ_i += dS K_j: (64 queries, D) over k = the 128 keys, 2 x 4 warps of (32, D/4). Needs every warp's
    // dS^T rows: a barrier first.
    //   A = dS (m = query, k = key): stored as dS^T, key-major = k-major: ldmatrix.trans.
    //   B = K_j (k = key, n = d): stored key-major, d contiguous = k-major: ldmatrix.trans.
    // The partial sum goes straight from the accumulators to grad_q_accum with float32 atomics (red
    // at L2), unscaled: the convert kernel multiplies by the scale once.
    if constexpr (!kAtomicDq) continue;  // the deterministic pass computes dQ
    __syncthreads();
    // TODO(lab08.8): dq (kDqTilesM x kDqTilesN accumulators) = dS K_j for this warp's tile at
    //   (dq_row0, dq_col0): per k-step kk of 16 keys, A fragments of dS by ldmatrix_x4_trans from ds_tile at
    //   ds_at.at(16 kk, 2 m), B fragments of K_j by ldmatrix_x4_trans from k_tile at k_bt.at(16 kk, n); then
    //   atomic_add_pair each accumulator pair into grad_q_accum (batch, query, head, d), skipping queries past the
    //   tile's query_end
    // --8<-- [end:dq_atomics]
  }

  // dK_j = scale * sum dS^T Q, dV_j = sum P^T dO: rounded once, written once, rows past seqlen_k not.
  const float scale = forward.scale;
  T* const grad_k = static_cast<T*>(params.grad_k);
  T* const grad_v = static_cast<T*>(params.grad_v);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = warp_key + lane_row + 8 * half;  // in the block
    if (key >= key_end) continue;
    const int64_t offset = ((batch * seqlen_k + key0 + key) * heads_kv + kv_head) * kHeadDim + lane_col;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      store_pair(grad_k + offset + n * kMmaN, scale * dk[n][2 * half], scale * dk[n][2 * half + 1]);
      store_pair(grad_v + offset + n * kMmaN, dv[n][2 * half], dv[n][2 * half + 1]);
    }
  }
#endif
}

// ---------------------------------------------------------------- 3. convert
// grad_q = scale * grad_q_accum, rounded to T: 8 floats (two 16-byte loads) in, one 16-byte vector out.
constexpr int kConvertThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kConvertThreads)
    convert_grad_q_kernel(const float* __restrict__ grad_q_accum, T* __restrict__ grad_q, int64_t vectors,
                          float scale) {
  constexpr int kElems = course::kElemsPerVector<T>;
  using Vector = course::Pack<T, kElems>;
  static_assert(kElems == 8, "two float4 per vector");
  for (int64_t i = int64_t{blockIdx.x} * kConvertThreads + threadIdx.x; i < vectors;
       i += int64_t{gridDim.x} * kConvertThreads) {
    const float4 low = reinterpret_cast<const float4*>(grad_q_accum)[2 * i];
    const float4 high = reinterpret_cast<const float4*>(grad_q_accum)[2 * i + 1];
    Vector out;
    // TODO(lab08.8): the 8 values low.x .. high.w, times scale, rounded into out.v[0..7] with from_compute<T>
    for (int e = 0; e < kElems; ++e) out.v[e] = from_compute<T>(0.0f);
    (void)low, (void)high;  // used by the code you write
    reinterpret_cast<Vector*>(grad_q)[i] = out;
  }
}

// --8<-- [start:determinism]
// Determinism. Every dQ element gets one float32 atomic add per key block that sees its row, and
// the order in which the blocks' adds reach L2 changes from run to run: float addition is not
// associative, so grad_q may differ in its last bits between two runs on the same inputs. (dK and
// dV do not: each element is summed by one thread in a fixed order.) The deterministic alternative
// is a separate dQ pass:
//   pass 1 (dK, dV): per key block, over query blocks:  S, P, dP, dS; dV += P^T dO, dK += dS^T Q
//   pass 2 (dQ):     per query block, over key blocks:  S, P, dP, dS; dQ += dS K, in registers, in
//                    key-block order, written once
// Pass 2 recomputes S = Q K^T and dP = dO V^T: 4 + 3 = 7 products of 2 Sq Sk D FLOPs each against
// 5 here, 40% more tensor-core work (and every exponential twice), for no atomics and no float32
// workspace. What the atomics cost instead, in arithmetic: each key block adds Br x D floats per
// step, so a head receives 4 Sq D (Sk / 128) bytes of adds against 10 Sq Sk D FLOPs of products:
// 320 FLOP per byte of adds, whatever the lengths. At 200 TFLOP/s that is 0.6 TB/s of float32
// reductions into L2 (red.global.add; on sm_90 two floats per instruction). The atomics are the
// default, as in FlashAttention-2 (whose backward takes `deterministic=True` for a slower,
// reproducible path); params.deterministic selects the second pass (flash_backward_dq_kernel).
// --8<-- [end:determinism]

// --8<-- [start:dq_pass]
// The deterministic dQ pass (params.deterministic): FlashAttention's forward structure applied to
// dQ = s dS K. One block per (query block of 64, batch, query head); each of 4 warps owns 16 query
// rows and sums their dQ in registers over the key blocks in ascending order, written once. Per key
// block: S = Q K^T and dP = dO V^T (queries as mma rows: A = Q, dO, stored m-major; B = K^T, V^T,
// K and V stored n-major: plain ldmatrix), P and dS in registers, then dQ += dS K with dS straight
// from the accumulators as the A operand (the pairs of two key tiles make one k-step) and B = K
// (k = key, n = d; stored k-major: ldmatrix.trans). K_j, V_j double-buffered with cp.async.
// Registers: dQ 16 x D / 32 lanes = D / 2; S and dP 2 x 16 x Bc / 32 = Bc; at D = 64 also the Q and
// dO A-fragments (2 x 16 x 64 x 2 B / 32 / 4 = 32). Bc = 64 keys a step at D = 64 (32 + 64 + 32),
// 32 at D = 128 (64 + 32; with 64 keys ptxas spilled). Shared memory: Q, dO and two stages of K, V:
// 2 x 64 x D x 2 B + 2 x 2 x Bc x D x 2 B = 64 KiB (D = 128), 48 KiB (D = 64).
constexpr int kDqPassWarps = 4;
constexpr int kDqPassThreads = kDqPassWarps * kWarpSize;
constexpr int kDqPassBlockM = kDqPassWarps * kMmaM;  // 64 queries, 16 a warp

template <int kHeadDim>
struct DqPassTiles {
  static constexpr int kChunksD = kHeadDim / kElementsPerChunk;
  static constexpr int kBlockN = kHeadDim == 64 ? 64 : 32;       // keys per step
  static constexpr int kQTileChunks = kDqPassBlockM * kChunksD;  // Q or dO: (64, D)
  static constexpr int kKvTileChunks = kBlockN * kChunksD;       // a stage of K or V: (kBlockN, D)
  static constexpr bool kQdoInRegisters = kHeadDim == 64;
  static constexpr int kSharedBytes = (2 * kQTileChunks + 2 * kStages * kKvTileChunks) * course::kChunkBytes;
  static_assert(kBlockN % (2 * kMmaK) == 0, "whole k-steps, key tiles in ldmatrix.x4 pairs");
  static_assert(kHeadDim / 2 + 2 * kMmaM * kBlockN / kWarpSize + (kQdoInRegisters ? kHeadDim / 2 : 0) + 48 <=
                    kMaxRegisters,
                "dQ, S, dP (and Q, dO fragments) fit one thread's registers");
  static_assert(kSharedBytes <= kSharedOptInSm80, "fits sm_80's shared memory");
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kDqPassThreads)
    flash_backward_dq_kernel(const AttentionBackwardParams params, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // as flash_backward_kernel
#else
  using Config = DqPassTiles<kHeadDim>;
  constexpr int kChunksD = Config::kChunksD, kDimTiles = kHeadDim / kMmaN, kBlockNq = Config::kBlockN;
  constexpr int kKeyTiles = kBlockNq / kMmaN;
  constexpr bool kQdoInRegisters = Config::kQdoInRegisters;
  extern __shared__ uint4 shared_chunks[];
  uint4* const q_tile = shared_chunks;                               // (64, D) swizzled
  uint4* const do_tile = q_tile + Config::kQTileChunks;              // (64, D)
  uint4* const k_tiles = do_tile + Config::kQTileChunks;             // (kStages, kBlockN, D)
  uint4* const v_tiles = k_tiles + kStages * Config::kKvTileChunks;  // (kStages, kBlockN, D)

  const AttentionParams& forward = params.forward;
  const int64_t seqlen_q = forward.seqlen_q, seqlen_k = forward.seqlen_k;
  const int64_t heads_q = forward.heads_q, heads_kv = forward.heads_kv;
  const bool causal = forward.causal;
  // blockIdx.x = (batch * heads_q + head) * query_blocks + i
  const int64_t query_blocks = course::ceil_div<int64_t>(seqlen_q, kDqPassBlockM);
  const int64_t batch_head = blockIdx.x / query_blocks;
  const int64_t batch = batch_head / heads_q, head = batch_head % heads_q;
  const int64_t kv_head = head / (heads_q / heads_kv);
  const int64_t query0 = (blockIdx.x % query_blocks) * kDqPassBlockM;
  const int query_end = static_cast<int>(min(seqlen_q - query0, int64_t{kDqPassBlockM}));
  // Key blocks: every one, or (causal) up to the last key the block's last query sees; none when
  // every row of the block sees no key (seqlen_q > seqlen_k): their dQ is 0.
  const int64_t key_limit = causal ? causal_key_end(query0 + query_end - 1, seqlen_q, seqlen_k) : seqlen_k;
  const int key_blocks = key_limit > 0 ? static_cast<int>(course::ceil_div<int64_t>(key_limit, kBlockNq)) : 0;

  const Strides &qs = forward.q_strides, &ks = forward.k_strides, &vs = forward.v_strides;
  const T* const k_head = static_cast<const T*>(forward.k) + batch * ks.batch + kv_head * ks.head;
  const T* const v_head = static_cast<const T*>(forward.v) + batch * vs.batch + kv_head * vs.head;
  const auto load_kv = [&](int key_block, int stage) {
    const int64_t key0 = int64_t{key_block} * kBlockNq;
    load_tile<kBlockNq, kChunksD, kDqPassThreads>(k_tiles + stage * Config::kKvTileChunks, k_head, ks.seq, key0,
                                                  seqlen_k);
    load_tile<kBlockNq, kChunksD, kDqPassThreads>(v_tiles + stage * Config::kKvTileChunks, v_head, vs.seq, key0,
                                                  seqlen_k);
  };

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp_query = warp * kMmaM;  // this warp's first query row in the block
  const int lane_row = accumulator_coord(lane, 0).row, lane_col = accumulator_coord(lane, 0).col;
  // Q, dO as A (rows warp_query + a_source: the b_trans_source offsets), K, V as B of S and dP
  // (b_source), K as B of dQ (b_trans_source).
  const LaneOffsets<kChunksD> bt(b_trans_source(lane).row, b_trans_source(lane).col / kElementsPerChunk);
  const LaneOffsets<kChunksD> b(b_source(lane).row, b_source(lane).col / kElementsPerChunk);
  const uint4* const q_rows = q_tile + warp_query * kChunksD;
  const uint4* const do_rows = do_tile + warp_query * kChunksD;

  // This lane's two rows (lane_row, + 8): L log2(e) and D, once.
  float lse2[2], row_dot[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t query = query0 + warp_query + lane_row + 8 * half;
    const int64_t at = (batch * heads_q + head) * seqlen_q + query;
    lse2[half] = query < seqlen_q ? lse_log2(forward.lse[at]) : INFINITY;  // past the end: P = 0
    row_dot[half] = query < seqlen_q ? params.delta[at] : 0.0f;
  }

  load_tile<kDqPassBlockM, kChunksD, kDqPassThreads>(
      q_tile, static_cast<const T*>(forward.q) + batch * qs.batch + head * qs.head, qs.seq, query0, seqlen_q);
  load_tile<kDqPassBlockM, kChunksD, kDqPassThreads>(
      do_tile, static_cast<const T*>(params.grad_o) + (batch * seqlen_q * heads_q + head) * kHeadDim,
      heads_q * kHeadDim, query0, seqlen_q);
  if (key_blocks > 0) load_kv(0, 0);
  commit_copies();
  uint32_t q_fragments[kQdoInRegisters ? kHeadDim / kMmaK : 1][4];
  uint32_t do_fragments[kQdoInRegisters ? kHeadDim / kMmaK : 1][4];
  if constexpr (kQdoInRegisters) {
    wait_copies<0>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kMmaK; ++kk) {
      ldmatrix_x4(q_fragments[kk], byte_at(q_rows, bt.at(0, 2 * kk)));
      ldmatrix_x4(do_fragments[kk], byte_at(do_rows, bt.at(0, 2 * kk)));
    }
  }

  float dq[kDimTiles][4] = {};  // (16 queries, D) of this warp
  for (int key_block = 0, stage = 0; key_block < key_blocks; ++key_block, stage ^= 1) {
    wait_copies<0>();
    __syncthreads();  // K_j, V_j landed for everyone; everyone is done with key block j - 1's stage
    if (key_block + 1 < key_blocks) load_kv(key_block + 1, stage ^ 1);
    commit_copies();
    const uint4* const k_tile = k_tiles + stage * Config::kKvTileChunks;
    const uint4* const v_tile = v_tiles + stage * Config::kKvTileChunks;
    const int64_t key0 = int64_t{key_block} * kBlockNq;
    const int key_end = static_cast<int>(min(seqlen_k - key0, int64_t{kBlockNq}));
    const int diagonal = causal ? static_cast<int>(max(min(seqlen_k - seqlen_q - key0 + query0, int64_t{kBlockNq}),
                                                       int64_t{-kDqPassBlockM}))
                                : kBlockNq;
    const bool masked = key_end < kBlockNq || query_end < kDqPassBlockM || diagonal < kBlockNq - 1;

    // S = Q K^T, dP = dO V^T: (16 queries, 64 keys) per warp, k = D.
    float s[kKeyTiles][4] = {}, dp[kKeyTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kMmaK; ++kk) {
      uint32_t q_a[4], do_a[4];
      if constexpr (kQdoInRegisters) {
#pragma unroll
        for (int r = 0; r < 4; ++r) q_a[r] = q_fragments[kk][r], do_a[r] = do_fragments[kk][r];
      } else {
        ldmatrix_x4(q_a, byte_at(q_rows, bt.at(0, 2 * kk)));
        ldmatrix_x4(do_a, byte_at(do_rows, bt.at(0, 2 * kk)));
      }
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        const uint32_t offset = b.at(n * kMmaN, 2 * kk);  // keys 8n .., d = 16kk ..
        uint32_t k_b[4], v_b[4];
        ldmatrix_x4(k_b, byte_at(k_tile, offset));
        ldmatrix_x4(v_b, byte_at(v_tile, offset));
        const uint32_t k0[2] = {k_b[0], k_b[1]}, k1[2] = {k_b[2], k_b[3]};
        const uint32_t v0[2] = {v_b[0], v_b[1]}, v1[2] = {v_b[2], v_b[3]};
        mma_16816<T>(s[n], q_a, k0);
        mma_16816<T>(s[n + 1], q_a, k1);
        mma_16816<T>(dp[n], do_a, v0);
        mma_16816<T>(dp[n + 1], do_a, v1);
      }
    }
    // P and dS: accumulator r of key tile n is query warp_query + lane_row + 8 (r / 2), key 8n + lane_col + r % 2.
    // TODO(lab08.7): the deterministic pass's P and dS, in place in dp: as in the main kernel, with queries as
    //   rows here (lse2 and row_dot are this lane's two rows), visible_in_tile(key, query, ...) where `masked`
    for (auto& tile : dp) for (float& value : tile) value = 0.0f;
    (void)s, (void)lse2, (void)row_dot, (void)masked;  // used by the code you write
    // dQ += dS K_j: k-step kk (keys 16kk ..) takes the pairs of key tiles 2kk and 2kk + 1 as A.
    // TODO(lab08.8): the deterministic pass's dq += dS K_j: per k-step kk of 16 keys, the A fragment packed
    //   from dp's key tiles 2kk and 2kk + 1, B fragments of K_j by ldmatrix_x4_trans from k_tile at bt.at(16 kk, n)
  }

  T* const grad_q = static_cast<T*>(params.grad_q);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = warp_query + lane_row + 8 * half;
    if (query >= query_end) continue;
    const int64_t offset = ((batch * seqlen_q + query0 + query) * heads_q + head) * kHeadDim + lane_col;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      store_pair(grad_q + offset + n * kMmaN, forward.scale * dq[n][2 * half], forward.scale * dq[n][2 * half + 1]);
    }
  }
#endif
}
// --8<-- [end:dq_pass]

template <typename T, int kHeadDim>
void launch_typed(const AttentionBackwardParams& params, cudaStream_t stream) {
  const AttentionParams& forward = params.forward;
  const bool deterministic = params.deterministic;
  const int multiprocessors = course::device_attribute(cudaDevAttrMultiProcessorCount);
  constexpr int64_t kBlocksPerSm = 8;  // grid-stride kernels: a few waves' worth of blocks, then loop

  // 1. D, and the zeroed accumulator of the atomics.
  const int64_t rows = forward.batch * forward.seqlen_q * forward.heads_q;
  constexpr int64_t kRowsPerBlock = kPreprocessThreads / (kHeadDim / course::kElemsPerVector<T>);
  const int64_t preprocess_blocks =
      std::min(course::ceil_div<int64_t>(rows, kRowsPerBlock), kBlocksPerSm * multiprocessors);
  backward_preprocess_kernel<T, kHeadDim><<<static_cast<unsigned>(preprocess_blocks), kPreprocessThreads, 0, stream>>>(
      static_cast<const T*>(params.grad_o), static_cast<const T*>(forward.o), params.delta,
      deterministic ? nullptr : params.grad_q_accum, rows, forward.seqlen_q, forward.heads_q);
  COURSE_CHECK_LAUNCH();

  // 2. dK, dV (and the dQ partial sums).
  const int64_t blocks = course::ceil_div<int64_t>(forward.seqlen_k, kBlockN) * forward.batch * forward.heads_kv;
  if (blocks > std::numeric_limits<int>::max()) throw std::runtime_error("flash_backward: too many key blocks");
  const auto kernel =
      deterministic ? flash_backward_kernel<T, kHeadDim, false> : flash_backward_kernel<T, kHeadDim, true>;
  course::opt_in_dynamic_shared(kernel, Tiles<kHeadDim>::kSharedBytes, "flash_backward at this head_dim");
  kernel<<<static_cast<unsigned>(blocks), kThreads, Tiles<kHeadDim>::kSharedBytes, stream>>>(params,
                                                                                             forward.scale * kLog2e);
  COURSE_CHECK_LAUNCH();

  // 3. grad_q: from the accumulator, or by the deterministic pass.
  if (deterministic) {
    const int64_t dq_blocks =
        course::ceil_div<int64_t>(forward.seqlen_q, kDqPassBlockM) * forward.batch * forward.heads_q;
    if (dq_blocks > std::numeric_limits<int>::max()) throw std::runtime_error("flash_backward: too many query blocks");
    const auto dq_kernel = flash_backward_dq_kernel<T, kHeadDim>;
    course::opt_in_dynamic_shared(dq_kernel, DqPassTiles<kHeadDim>::kSharedBytes,
                                  "flash_backward's deterministic dQ pass at this head_dim");
    dq_kernel<<<static_cast<unsigned>(dq_blocks), kDqPassThreads, DqPassTiles<kHeadDim>::kSharedBytes, stream>>>(
        params, forward.scale * kLog2e);
    COURSE_CHECK_LAUNCH();
    return;
  }
  const int64_t vectors = rows * kHeadDim / course::kElemsPerVector<T>;
  const int64_t convert_blocks =
      std::min(course::ceil_div<int64_t>(vectors, kConvertThreads), kBlocksPerSm * multiprocessors);
  convert_grad_q_kernel<T><<<static_cast<unsigned>(convert_blocks), kConvertThreads, 0, stream>>>(
      params.grad_q_accum, static_cast<T*>(params.grad_q), vectors, forward.scale);
  COURSE_CHECK_LAUNCH();
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % course::kVectorBytes == 0; }

}  // namespace flash_backward_impl

using namespace flash_backward_impl;

FlashBackwardTiles flash_backward_tiles(int head_dim) {
  switch (head_dim) {
    case kHeadDimSmall: return {kBlockM, kBlockN, kWarps, Tiles<kHeadDimSmall>::kSharedBytes};
    case kHeadDimLarge: return {kBlockM, kBlockN, kWarps, Tiles<kHeadDimLarge>::kSharedBytes};
    default: throw std::invalid_argument("flash_backward: head_dim must be 64 or 128");
  }
}

void launch_flash_backward(ElementType type, const AttentionBackwardParams& params, cudaStream_t stream) {
  const AttentionParams& forward = params.forward;
  if (type != ElementType::kFloat16 && type != ElementType::kBFloat16) {
    throw std::invalid_argument("flash_backward: float16 or bfloat16 only");
  }
  if (forward.head_dim != kHeadDimSmall && forward.head_dim != kHeadDimLarge) {
    throw std::invalid_argument("flash_backward: head_dim must be 64 or 128");
  }
  if (forward.heads_kv <= 0 || forward.heads_q % forward.heads_kv != 0) {
    throw std::invalid_argument("flash_backward: heads_q must be a multiple of heads_kv");
  }
  if (course::device_attribute(cudaDevAttrComputeCapabilityMajor) < 8) {
    throw std::runtime_error("flash_backward: needs compute capability 8.0+ (mma.m16n8k16, cp.async)");
  }
  const int64_t element_bytes = 2;  // float16 and bfloat16
  const int64_t q_elements = forward.batch * forward.seqlen_q * forward.heads_q * forward.head_dim;
  const int64_t kv_elements = forward.batch * forward.seqlen_k * forward.heads_kv * forward.head_dim;
  if (forward.batch == 0 || forward.heads_q == 0) return;  // every tensor is empty
  if (forward.seqlen_k == 0) {  // no key: o = 0 did not depend on q, grad_q = 0; grad_k, grad_v are empty
    if (q_elements > 0) COURSE_CUDA_CHECK(cudaMemsetAsync(params.grad_q, 0, q_elements * element_bytes, stream));
    return;
  }
  if (forward.seqlen_q == 0) {  // no query: nothing flows back to k and v, but they must still be written
    COURSE_CUDA_CHECK(cudaMemsetAsync(params.grad_k, 0, kv_elements * element_bytes, stream));
    COURSE_CUDA_CHECK(cudaMemsetAsync(params.grad_v, 0, kv_elements * element_bytes, stream));
    return;
  }
  const void* const vectorized[] = {params.grad_o, forward.o, params.grad_q,
                                    params.deterministic ? nullptr : params.grad_q_accum};
  for (const void* pointer : vectorized) {
    if (!aligned16(pointer)) {
      throw std::invalid_argument("flash_backward: grad_o, o, grad_q and grad_q_accum must be 16-byte aligned");
    }
  }
  const bool half = type == ElementType::kFloat16;
  if (forward.head_dim == kHeadDimSmall) {
    half ? launch_typed<__half, kHeadDimSmall>(params, stream)
         : launch_typed<__nv_bfloat16, kHeadDimSmall>(params, stream);
  } else {
    half ? launch_typed<__half, kHeadDimLarge>(params, stream)
         : launch_typed<__nv_bfloat16, kHeadDimLarge>(params, stream);
  }
}

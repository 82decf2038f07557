// Lab skeleton generated from solutions/08-flash-attention/flash_forward.cu by `./course labs` [lab-hash 49e260ff7a89].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08, rung 3: flash attention forward on tensor cores, float16 and bfloat16, head_dim 64 or 128,
// float32 accumulation: FlashAttention-2's forward. A block owns kBlockM query rows of one
// (batch, head); each of its warps owns 16 of those rows for the whole kernel:
//   Q_i       loaded once (cp.async), then held as mma A fragments in registers for the whole key loop
//   K_j, V_j  streamed through shared memory, double-buffered: block j + 1's copies are issued
//             before block j's products, K and V in separate commit groups
//   S = Q_i K_j^T      ldmatrix + mma.m16n8k16 (K is the B operand as stored: no transpose)
//   online softmax     per row in registers: max and sum over the 4 lanes of a quad, O and l
//                      rescaled when the max grows, exp2 with scale * log2(e) folded into one FMA
//   O += P V_j         P packed to 16 bits straight from the S accumulators into A fragments;
//                      V by ldmatrix .trans
//   epilogue           one division by l per row; O rounded once; L = m + log(l), natural log
// Causal (bottom-right, attention.h): key blocks past the block's last row's causal_key_end are
// skipped (never loaded); only the diagonal blocks and the key tail are masked per element. A row
// that sees no key gives o = 0 and L = -inf. GQA: query head h reads key/value head h / (Hq / Hkv).
#include <course/cuda.cuh>
#include <course/mma.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "smem_tiles.cuh"

// A namespace of this file's own: the other rungs' files define helpers of the same names (one program).
namespace flash_forward_impl {

using attention_tiles::byte_at;
using attention_tiles::LaneOffsets;
using attention_tiles::swizzled;
using course::commit_copies;
using course::copy_chunk_async;
using course::exp2_approx;
using course::kChunkBytes;
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
using course::wait_copies;

// --8<-- [start:tiles]
// The work split (FlashAttention-2): a block owns Br = kBlockM query rows of one (batch, head) and
// walks the key blocks of Bc = kBlockN keys; warp w owns rows 16w .. 16w + 15, one mma row tile, in
// both products. Everything a row needs (its scores, its max and sum, its O row) stays in the 4 lanes
// of one quad of one warp: the softmax needs no shared memory and no barrier. The warps share only
// the K and V tiles. (FlashAttention-1 split the keys between warps instead, and had to combine the
// warps' partial rows through shared memory on every block.)
//
// Registers per thread. A warp's 16 x n tile of fp32 is 16 n / 32 = n / 2 registers a lane, a
// 16 x n tile of 16-bit pairs n / 4:
//   S accumulators   16 x Bc fp32                          Bc / 2
//   O accumulators   16 x D fp32, the whole key loop       D / 2
//   Q fragments      16 x D 16-bit, the whole key loop     D / 4
//   P fragments      16 x Bc 16-bit                        Bc / 4
//   D = 128, Bc = 64:  32 + 64 + 32 + 16 = 144        D = 64, Bc = 128:  64 + 32 + 16 + 32 = 144
// P is born as S dies (each pair of scores becomes one register of P), so at most S, O and Q are live
// at once: 128 (D = 128) and 112 (D = 64), plus m and l of the lane's 2 rows, 8 ldmatrix lane offsets,
// the tile loaders' pointers, loop state and the K or V fragments in flight: kOtherRegisters.
// B blocks of 128 threads an SM leave 65536 / (128 B) registers a thread (255 at most): 255 for two
// blocks, 168 (allocated by 8) for three. ptxas (nvcc 13.0, -Xptxas -v), no spills:
//   D = 128, 2 blocks an SM: 217 registers on sm_80, 222 on sm_90a. Capped by __maxnreg__(184) it
//     takes 182 without spilling (at 168 it spills 48 bytes), but a third block would not fit shared
//     memory anyway (below), so the spare registers go to ptxas's scheduling (K fragments loaded
//     further ahead).
//   D = 64, 3 blocks an SM: 168 registers on both (211 and 217 when given 255).
// Bc = 128 at D = 128 would be 64 + 64 + 32 = 160 live registers, still legal, but its shared memory
// would allow one block per SM; Bc = 64 at D = 64 would halve the keys over which a key block's fixed
// costs (two barriers, the max shuffles, the rescale of O) are spread. FlashAttention-2's sm_80 kernel
// makes the same choices: Bc = 128 at D = 64, 64 at D = 128 (with Br = 128: 4 warps of 32 rows).
//
// Warps: 4, so Br = 4 x 16 = 64. Each key block a block reads from L2 (2 Bc D 2-byte elements) feeds
// 4 Br Bc D FLOPs: Br = 64 FLOP per byte. 8 warps (Br = 128) would halve that traffic, but at
// D = 128 a 256-thread block of ~180-220 registers leaves room for one block per SM, whose barriers
// then stall the whole SM. Which of the two is faster is a measurement this file does not yet record.
// One warp, one m tile: each 512-byte ldmatrix.x4 of K or V feeds 2 mma of 16 x 8 x 16 (8 kFLOP),
// 16 FLOP per byte of shared memory; 32 rows a warp would double that but needs 2x the Q, S, O
// registers (D = 128: 256 live), or Q re-read from shared memory every block, as FlashAttention-2's
// kernel does at D = 128.
//
// Shared memory (16-bit elements, 16-byte chunks, swizzled: see `swizzled`):
//   Q_i     Br x D x 2 B                    16 KiB (D = 128)    8 KiB (D = 64)
//   K_j     kStages x Bc x D x 2 B          32 KiB             32 KiB
//   V_j     kStages x Bc x D x 2 B          32 KiB             32 KiB
//   total                                   80 KiB             72 KiB
// sm_80 has 164 KiB an SM (163 KiB a block, opt-in) and reserves 1 KiB a block: 2 blocks either way
// (162 and 146 KiB). sm_90 has 228 KiB: 2 blocks at D = 128 (3 would be 243 KiB), 3 at D = 64
// (219 KiB), which is why D = 64 asks ptxas for 168 registers. sm_86/89 (100 KiB an SM): one block.
// kStages = 2, double buffering: block j + 1's copies fly while block j is computed. A third stage
// would cost 16-32 KiB and, at D = 128, the second block on sm_80.
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kBlockM = kWarps * kMmaM;  // query rows a block (Br): warp w owns 16w .. 16w + 15
constexpr int kStages = 2;
constexpr int kRegistersPerSm = 64 * 1024, kRegisterGranule = 8;
constexpr int kSharedPerSmSm80 = 164 * 1024, kSharedPerSmSm90 = 228 * 1024, kReservedPerBlock = 1024;
constexpr int kOtherRegisters = 48;

template <int kHeadDim>
struct Tiles {
  static constexpr int kBlockN = kHeadDim == 64 ? 128 : 64;       // keys a block (Bc)
  static constexpr int kMinBlocksPerSm = kHeadDim == 64 ? 3 : 2;  // what shared memory allows on sm_90
  static constexpr int kChunks = kHeadDim / kElementsPerChunk;    // 16-byte chunks in a row of Q, K, V: 8 or 16
  static constexpr int kKeyTiles = kBlockN / kMmaN;               // n8 tiles of a warp's S (16 x Bc)
  static constexpr int kKeySteps = kBlockN / kMmaK;               // k16 steps of P V
  static constexpr int kDimTiles = kHeadDim / kMmaN;              // n8 tiles of a warp's O (16 x D)
  static constexpr int kDimSteps = kHeadDim / kMmaK;              // k16 steps of Q K^T: the Q fragments

  static constexpr int kScoreRegisters = kMmaM * kBlockN / kWarpSize;
  static constexpr int kOutputRegisters = kMmaM * kHeadDim / kWarpSize;
  static constexpr int kQueryRegisters = kMmaM * kHeadDim / 2 / kWarpSize;  // two 16-bit elements a register
  static constexpr int kProbRegisters = kMmaM * kBlockN / 2 / kWarpSize;
  static constexpr int kLiveRegisters = kScoreRegisters + kOutputRegisters + kQueryRegisters;  // P replaces S
  static constexpr int kMaxRegisters =
      std::min(255, kRegistersPerSm / (kThreads * kMinBlocksPerSm) / kRegisterGranule * kRegisterGranule);

  static constexpr int kQTileChunks = kBlockM * kChunks;
  static constexpr int kKvTileChunks = kBlockN * kChunks;
  static constexpr int kSharedBytes = (kQTileChunks + 2 * kStages * kKvTileChunks) * kChunkBytes;

  static_assert(kHeadDim % kMmaK == 0 && kBlockN % (2 * kMmaN) == 0, "whole k-steps; K fragments in ldmatrix.x4 pairs");
  static_assert(kChunks % 8 == 0, "the swizzle permutes 8 chunks: rows of 64 or 128 two-byte elements");
  static_assert(kThreads % kChunks == 0 && kBlockM % (kThreads / kChunks) == 0 && kBlockN % (kThreads / kChunks) == 0,
                "every thread copies the same number of chunks of a tile");
  static_assert(kScoreRegisters + kOutputRegisters + kQueryRegisters + kProbRegisters == 144,
                "the table above: 144 registers of S, O, Q and P at both head dims");
  static_assert(kLiveRegisters + kOtherRegisters <= kMaxRegisters,
                "S, O, Q and the rest fit one thread's registers at kMinBlocksPerSm blocks an SM");
  static_assert(std::min(kMinBlocksPerSm, 2) * (kSharedBytes + kReservedPerBlock) <= kSharedPerSmSm80,
                "two blocks fit sm_80's shared memory");
  static_assert(kMinBlocksPerSm * (kSharedBytes + kReservedPerBlock) <= kSharedPerSmSm90 &&
                    (kMinBlocksPerSm + 1) * (kSharedBytes + kReservedPerBlock) > kSharedPerSmSm90,
                "kMinBlocksPerSm blocks fit sm_90's shared memory, and one more would not: no register is "
                "given up for a block that could not be resident");
};
static_assert(Tiles<64>::kSharedBytes == 72 * 1024 && Tiles<128>::kSharedBytes == 80 * 1024,
              "the sums in the table above");
static_assert(Tiles<64>::kMaxRegisters == 168 && Tiles<128>::kMaxRegisters == 255, "the register caps above");
// --8<-- [end:tiles]

// ---------------------------------------------------------------- shared-memory layout and fragments
// The swizzle and the lanes' ldmatrix offsets: smem_tiles.cuh (shared with the backward).

// Lesson 05's fragment layout, as (row, first column) pairs of the tile each lane addresses for
// ldmatrix.x4 (lanes 8i .. 8i + 7 give the 8 row addresses of matrix i, which lands in register i):
//   A (16 x 16, m x k), stored m-major (Q):                 matrices (m 0-7, k 0-7), (m 8-15, k 0-7),
//     (m 0-7, k 8-15), (m 8-15, k 8-15) = a0, a1, a2, a3:   lane -> row lane % 16, chunk lane / 16
//   B (two n8 tiles of 16 x 8, k x n), stored n-major (K: rows are keys = n, d = k contiguous):
//     (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of tile 0, b0, b1 of
//     tile 1:                                               lane -> row lane % 8 + 8 (lane / 16), chunk (lane / 8) % 2
//   B stored k-major (V: rows are keys = k, d = n contiguous), .trans: (k 0-7, n 0-7), (k 8-15, n 0-7),
//     (k 0-7, n 8-15), (k 8-15, n 8-15): the same lane -> (row, chunk) map as A.
__host__ __device__ constexpr int a_lane_row(int lane) { return lane % 16; }
__host__ __device__ constexpr int a_lane_chunk(int lane) { return lane / 16; }
__host__ __device__ constexpr int b_lane_row(int lane) { return lane % 8 + 8 * (lane / 16); }
__host__ __device__ constexpr int b_lane_chunk(int lane) { return lane / 8 % 2; }

// A thread's part in copying tiles of one head's rows of q, k or v (row r at head + r * row_stride, head_dim
// contiguous) into swizzled shared tiles: kChunks consecutive threads copy one row (128- or 256-byte
// coalesced reads), and a thread's chunks are kRowsPerPass rows apart, a multiple of 8, so they share one
// swizzled column and one source pointer advanced by a constant stride. Rows at or past row_count are
// zero-filled (cp.async with 0 source bytes, from the head's first row, a valid address): a zero K row
// gives a finite score (masked anyway) and a zero V row adds 0 x 0, where stale shared memory could hold
// NaN bit patterns and 0 x NaN = NaN. Only a tile that crosses row_count tests rows: the others (every
// key block but the tail) issue their copies with no per-row arithmetic but a 64-bit add.
template <int kChunks, typename T>
struct TileLoader {
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRowsPerPass % 8 == 0, "a thread's rows share row % 8: one swizzled column");
  const T* head;   // row 0, chunk 0: the fallback address of a zero-filled row
  const T* first;  // row `row`, this thread's chunk, of row 0's tile
  int64_t row_stride;
  int row, destination;  // this thread's first row of a tile, and its swizzled chunk there

  __device__ TileLoader(const T* head_rows, int64_t stride)
      : head(head_rows), row_stride(stride), row(static_cast<int>(threadIdx.x) / kChunks) {
    const int chunk = static_cast<int>(threadIdx.x) % kChunks;
    first = head_rows + row * stride + chunk * kElementsPerChunk;
    destination = swizzled<kChunks>(row, chunk);
  }

  // Rows [first_row, first_row + kRows) into `tile`.
  template <int kRows>
  __device__ void load(uint4* tile, int64_t first_row, int64_t row_count) const {
    static_assert(kRows % kRowsPerPass == 0, "every thread copies the same number of chunks");
    const T* source = first + first_row * row_stride;
    uint4* const target = tile + destination;
    if (first_row + kRows <= row_count) {  // the whole tile is inside
#pragma unroll
      for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
        copy_chunk_async(target + pass * kRowsPerPass * kChunks, source, true);
        source += kRowsPerPass * row_stride;
      }
    } else {
      const int64_t inside = row_count - first_row - row;  // rows of this thread's column inside: pass * R < inside
#pragma unroll
      for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
        const bool valid = pass * kRowsPerPass < inside;
        copy_chunk_async(target + pass * kRowsPerPass * kChunks, valid ? source : head, valid);
        source += kRowsPerPass * row_stride;
      }
    }
  }
};

// ---------------------------------------------------------------- masks and causal block skipping
// --8<-- [start:masking]
// The key blocks a query block visits: 0 .. count - 1; the blocks from count on are skipped, their K
// and V never loaded. Blocks 0 .. unmasked - 1 need no per-element mask: every one of their keys is
// visible to every row of the query block. The others (the causal diagonal, the key tail) are masked.
struct KeyBlocks {
  int64_t count, unmasked;
};

__device__ __forceinline__ KeyBlocks key_blocks(int64_t query0, int64_t seqlen_q, int64_t seqlen_k, bool causal,
                                                int block_n) {
  // TODO(lab08.5): the loop bounds. count: the blocks that hold a key some row of the query block
  //   [query0, min(query0 + kBlockM, seqlen_q)) sees, i.e. up to causal_key_end of its last row (seqlen_k when not
  //   causal; <= 0: none). unmasked: the whole blocks below causal_key_end of its first row (the row that sees the
  //   fewest keys; seqlen_k when not causal), at most count
  (void)query0, (void)seqlen_q, (void)causal;  // used by the code you write
  const int64_t count = (seqlen_k + block_n - 1) / block_n;  // every key block, none masked
  return {count, count};
}

// -inf for the scores of a masked block that a row must not see: key >= causal_key_end(row) (causal)
// or key >= seqlen_k (the tail). s[n][r] is row `row0 + 8 (r / 2)` (row0: the lane's first row,
// query0 + 16 warp + lane / 4), key `key0 + 8 n + key_col + r % 2` (key_col = 2 (lane % 4)).
template <int kKeyTiles>
__device__ __forceinline__ void mask_scores(float (&s)[kKeyTiles][4], int64_t row0, int64_t key0, int key_col,
                                            int64_t seqlen_q, int64_t seqlen_k, bool causal) {
  // TODO(lab08.5): for each of the lane's two rows: end = causal_key_end(row, ...) if causal, else seqlen_k;
  //   set s[n][r] = -INFINITY where key0 + 8 n + key_col + r % 2 >= end (compare in the block: end - key0 is int64)
  (void)s, (void)row0, (void)key0, (void)key_col, (void)seqlen_q, (void)seqlen_k, (void)causal;  // used by your code
}
// --8<-- [end:masking]

// ---------------------------------------------------------------- the kernel
// One block per (query block, batch * heads_q), flattened into gridDim.x.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, Tiles<kHeadDim>::kMinBlocksPerSm)
    flash_forward_kernel(const AttentionParams p, int64_t query_blocks, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.m16n8k16 and cp.async need sm_80: the launcher refuses older GPUs, so no body here
#else
  using Config = Tiles<kHeadDim>;
  constexpr int kBlockN = Config::kBlockN, kChunks = Config::kChunks;
  constexpr int kKeyTiles = Config::kKeyTiles, kKeySteps = Config::kKeySteps;
  constexpr int kDimTiles = Config::kDimTiles, kDimSteps = Config::kDimSteps;

  extern __shared__ uint4 shared_chunks[];                           // 16-byte aligned
  uint4* const q_tile = shared_chunks;                               // (kBlockM, D) swizzled
  uint4* const k_tiles = q_tile + Config::kQTileChunks;              // (kStages, kBlockN, D)
  uint4* const v_tiles = k_tiles + kStages * Config::kKvTileChunks;  // (kStages, kBlockN, D)

  // blockIdx.x = (batch * heads_q + head) * query_blocks + (query_blocks - 1 - query block): the query
  // blocks of a head run side by side (their K, V stream comes from L2), the last one first: under a
  // causal mask it visits the most key blocks, and starting the longest first shortens the grid's tail.
  const int64_t bh = blockIdx.x / query_blocks;
  const int64_t query0 = (query_blocks - 1 - blockIdx.x % query_blocks) * kBlockM;
  const int64_t batch = bh / p.heads_q, head = bh % p.heads_q;
  const int64_t kv_head = head / (p.heads_q / p.heads_kv);  // GQA: groups of heads_q / heads_kv query heads
  const int64_t seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const T* const q_rows = static_cast<const T*>(p.q) + batch * p.q_strides.batch + head * p.q_strides.head;
  const T* const k_rows = static_cast<const T*>(p.k) + batch * p.k_strides.batch + kv_head * p.k_strides.head;
  const T* const v_rows = static_cast<const T*>(p.v) + batch * p.v_strides.batch + kv_head * p.v_strides.head;

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  // The warp's first row in the block; the (row, column) of the lane's accumulator register 0.
  const int warp_row = warp * kMmaM;
  const int lane_row = lane / 4, lane_col = 2 * (lane % 4);
  const LaneOffsets<kChunks> a_lane(a_lane_row(lane), a_lane_chunk(lane));  // Q as A; V as B (.trans)
  const LaneOffsets<kChunks> b_lane(b_lane_row(lane), b_lane_chunk(lane));  // K as B

  const KeyBlocks blocks = key_blocks(query0, seqlen_q, seqlen_k, p.causal, kBlockN);

  // Prologue: three commit groups, Q_i, K_0, V_0 (the last two empty when no key block is visited).
  const TileLoader<kChunks, T> k_loader(k_rows, p.k_strides.seq), v_loader(v_rows, p.v_strides.seq);
  const auto load_kv = [&](const TileLoader<kChunks, T>& loader, uint4* tiles, int64_t block, int stage) {
    loader.template load<kBlockN>(tiles + stage * Config::kKvTileChunks, block * kBlockN, seqlen_k);
  };
  TileLoader<kChunks, T>(q_rows, p.q_strides.seq).template load<kBlockM>(q_tile, query0, seqlen_q);
  commit_copies();
  if (blocks.count > 0) load_kv(k_loader, k_tiles, 0, 0);
  commit_copies();
  if (blocks.count > 0) load_kv(v_loader, v_tiles, 0, 0);
  commit_copies();

  // Q_i has landed (K_0, V_0 may still fly); after the barrier, everyone's copies of it have. The
  // warp's 16 rows become A fragments, kept for the whole loop: one ldmatrix.x4 per 16 head dims.
  wait_copies<2>();
  __syncthreads();
  uint32_t q_fragments[kDimSteps][4];
#pragma unroll
  for (int kk = 0; kk < kDimSteps; ++kk) ldmatrix_x4(q_fragments[kk], byte_at(q_tile, a_lane.at(warp_row, 2 * kk)));

  float o_acc[kDimTiles][4] = {};  // O (16 x D per warp), unnormalized: divided by l once, at the end
  // The lane's two rows (lane_row and lane_row + 8 of the warp's 16): running max of the raw scores q.k
  // (the scale is applied in the exponent) and this lane's share of the row sum of exp, relative to it.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // --8<-- [start:main_loop]
  // Key block j lives in stage j % 2. Per block, K_j's group was committed before V_j's, and both
  // before block j + 1's: waiting until at most 1 group is pending means K_j has landed, at most 2
  // (after block j + 1's are issued) means V_j has. A block past the last issues empty groups, so the
  // counts hold to the end.
#pragma unroll 1
  for (int64_t j = 0; j < blocks.count; ++j) {
    const int stage = static_cast<int>(j % kStages);
    const int64_t key0 = j * kBlockN;
    wait_copies<1>();  // this thread's copies of K_j have landed
    // Everyone's copies of K_j have landed, and everyone has finished block j - 1, whose stage the
    // copies of block j + 1 overwrite now.
    __syncthreads();
    if (j + 1 < blocks.count) load_kv(k_loader, k_tiles, j + 1, stage ^ 1);
    commit_copies();
    if (j + 1 < blocks.count) load_kv(v_loader, v_tiles, j + 1, stage ^ 1);
    commit_copies();
    const uint4* const k_tile = k_tiles + stage * Config::kKvTileChunks;
    const uint4* const v_tile = v_tiles + stage * Config::kKvTileChunks;

    // S = Q_i K_j^T: (16 rows, Bc keys) a warp, k = D. s[n] is the 16 x 8 tile of keys 8n .. 8n + 7.
    //   A = Q_i: the fragments in registers.
    //   B = K_j^T (k = d, n = key): K stored key-major, d contiguous = n-major: plain ldmatrix,
    //   two key tiles per ldmatrix.x4, exactly lab 05's weight.
    float s[kKeyTiles][4] = {};
    // TODO(lab08.3): S = Q_i K_j^T for the warp's 16 rows: per k-step kk of 16 head dims and per pair of key
    //   tiles (n, n + 1), one ldmatrix_x4 of K_j from k_tile at b_lane.at(8 n, 2 kk) (registers 0, 1: the B fragment
    //   of key tile n; 2, 3: of tile n + 1), then mma_16816<T> of q_fragments[kk] with each into s[n], s[n + 1]
    (void)q_fragments, (void)k_tile, (void)b_lane;  // used by the code you write

    // The diagonal and tail blocks only: uniform over the block, so the fast path runs no test.
    if (j >= blocks.unmasked) {
      mask_scores(s, query0 + warp_row + lane_row, key0, lane_col, seqlen_q, seqlen_k, p.causal);
    }

    // --8<-- [start:online_softmax]
    // The online softmax, per row, in registers. s[n][r] belongs to row lane_row + 8 (r / 2) of the
    // warp; the row's Bc scores are spread over the 4 lanes of its quad (lanes 4 lane_row .. + 3), so
    // the row max is this lane's max, then two xor shuffles (1, 2) inside the quad.
    //   m' = max(m, rowmax(S))        alpha = exp(scale (m - m'))     (1 when the max did not grow)
    //   P = exp(scale (S - m'))       l = alpha l + rowsum(P)         O = alpha O + P V
    // in base 2: exp(scale x) = exp2(x scale_log2), and exp2(s scale_log2 - m' scale_log2) is one FMA
    // and one ex2 per score. l stays this lane's share of the row sum: the quad's 4 lanes share m' and
    // alpha, so their shares are added once, in the epilogue.
    uint32_t p_a[kKeySteps][4];  // P as the A operand of P V: k-step kk = keys 16kk .. 16kk + 15
    // TODO(lab08.4): the online softmax update of the lane's two rows h = 0, 1 (registers 2h, 2h + 1 of
    //   every s[n]): m_new = max(m[h], the row's max over s and the quad: __shfl_xor_sync offsets 1, 2); offset =
    //   m_new scale_log2, or 0 while m_new = -inf (a row that has seen no key: no -inf - -inf); alpha =
    //   exp2_approx(m[h] scale_log2 - offset); l[h] and the row's o_acc registers times alpha; m[h] = m_new; then
    //   P = exp2_approx(s scale_log2 - offset) (one fmaf), added into l[h], and packed with pack_pair<T>: k-step kk
    //   is key tiles 2kk (registers 0, 1 of p_a[kk]: pairs (0, 1) and (2, 3)) and 2kk + 1 (registers 2, 3)
    for (auto& fragment : p_a) for (uint32_t& pair : fragment) pair = 0;  // P = 0: O, l and m never change
    (void)scale_log2, (void)m, (void)l;  // used by the code you write
    // --8<-- [end:online_softmax]

    wait_copies<2>();  // this thread's copies of V_j have landed (block j + 1's two groups may fly)
    __syncthreads();   // and everyone's

    // O += P V_j: (16 rows, D) a warp, k = the Bc keys.
    //   A = P: p_a, in registers.
    //   B = V_j (k = key, n = d): V stored key-major, d contiguous = k-major: ldmatrix .trans, two d
    //   tiles per ldmatrix.x4.
    // TODO(lab08.4): O += P V_j: per k-step kk of 16 keys and per pair of d tiles (n, n + 1), one
    //   ldmatrix_x4_trans of V_j from v_tile at a_lane.at(16 kk, n) (registers 0, 1: the B fragment of d tile n;
    //   2, 3: of d tile n + 1), then mma_16816<T> of p_a[kk] with each into o_acc[n], o_acc[n + 1]
    (void)v_tile;  // used by the code you write
  }
  // --8<-- [end:main_loop]

  // --8<-- [start:epilogue]
  // The row sums from the quad's 4 lanes, one division per row, O rounded to T once and L stored.
  // Each lane writes its column pairs as 4-byte stores; rows past seqlen_q (zero Q rows of the last
  // query block) are not written. A row that saw no key has l = 0: o = 0 (O is 0 too) and L = -inf.
  //   L = log(sum_j exp(scale s_j)) = scale m + log(l): the offset was m scale log2(e) = scale m in
  //   the natural log's units.
  T* const o = static_cast<T*>(p.o);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float row_l = l[half];
    row_l += __shfl_xor_sync(kFullWarpMask, row_l, 1);
    row_l += __shfl_xor_sync(kFullWarpMask, row_l, 2);
    const int64_t row = query0 + warp_row + lane_row + 8 * half;
    if (row >= seqlen_q) continue;
    const float inv_l = row_l > 0.0f ? 1.0f / row_l : 0.0f;
    T* const o_row = o + ((batch * seqlen_q + row) * p.heads_q + head) * kHeadDim + lane_col;  // (B, Sq, Hq, D)
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      store_pair(o_row + n * kMmaN, o_acc[n][2 * half] * inv_l, o_acc[n][2 * half + 1] * inv_l);
    }
    if (lane % 4 == 0) p.lse[bh * seqlen_q + row] = row_l > 0.0f ? m[half] * p.scale + logf(row_l) : -INFINITY;
  }
  // --8<-- [end:epilogue]
#endif
}

template <typename T, int kHeadDim>
void launch_typed(const AttentionParams& p, cudaStream_t stream) {
  using Config = Tiles<kHeadDim>;
  const auto kernel = flash_forward_kernel<T, kHeadDim>;
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once per kernel and GPU. The carveout asks for
  // the most shared memory (and the least L1) the SM can give: the data here goes through shared memory, and
  // cp.async.cg bypasses L1, so resident blocks matter more than L1.
  course::opt_in_dynamic_shared(kernel, Config::kSharedBytes, "flash_forward at this head_dim",
                                cudaSharedmemCarveoutMaxShared);
  const int64_t query_blocks = course::ceil_div<int64_t>(p.seqlen_q, kBlockM);
  const int64_t blocks = query_blocks * p.batch * p.heads_q;
  if (blocks > std::numeric_limits<int>::max()) throw std::runtime_error("flash_forward: too many query blocks");
  kernel<<<static_cast<unsigned>(blocks), kThreads, Config::kSharedBytes, stream>>>(p, query_blocks, p.scale * kLog2e);
  COURSE_CHECK_LAUNCH();
}

bool aligned(const void* pointer, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(pointer) % bytes == 0; }

// Every 16-byte chunk of a row of the view is one cp.async: the base 16-byte aligned and every stride a
// whole number of chunks. A dimension of size 1 is never stepped along, so its stride does not matter
// (PyTorch may give such a dimension any stride).
void check_view(const char* name, const void* data, const Strides& strides, int64_t batch, int64_t seqlen,
                int64_t heads) {
  const auto whole_chunks = [](int64_t stride, int64_t size) { return size <= 1 || stride % kElementsPerChunk == 0; };
  if (!aligned(data, kChunkBytes) || !whole_chunks(strides.batch, batch) || !whole_chunks(strides.seq, seqlen) ||
      !whole_chunks(strides.head, heads)) {
    throw std::invalid_argument(std::string("flash_forward: ") + name +
                                " must start on a 16-byte boundary, with batch, seq and head strides that are "
                                "multiples of 8 elements");
  }
}

}  // namespace flash_forward_impl

using namespace flash_forward_impl;

FlashForwardTiles flash_forward_tiles(int head_dim) {
  switch (head_dim) {
    case kHeadDimSmall:
      return {kBlockM, Tiles<kHeadDimSmall>::kBlockN, kWarps, kStages, Tiles<kHeadDimSmall>::kSharedBytes};
    case kHeadDimLarge:
      return {kBlockM, Tiles<kHeadDimLarge>::kBlockN, kWarps, kStages, Tiles<kHeadDimLarge>::kSharedBytes};
    default: throw std::invalid_argument("flash_forward: head_dim must be 64 or 128");
  }
}

void launch_flash_forward(ElementType type, const AttentionParams& params, cudaStream_t stream) {
  if (type != ElementType::kFloat16 && type != ElementType::kBFloat16) {
    throw std::invalid_argument("flash_forward: float16 or bfloat16 only");
  }
  if (params.head_dim != kHeadDimSmall && params.head_dim != kHeadDimLarge) {
    throw std::invalid_argument("flash_forward: head_dim must be 64 or 128, got " + std::to_string(params.head_dim));
  }
  if (params.heads_kv <= 0 || params.heads_q % params.heads_kv != 0) {
    throw std::invalid_argument("flash_forward: heads_q must be a multiple of heads_kv (and heads_kv >= 1)");
  }
  // The running max is taken over the raw scores q.k and the scale applied in the exponent, which
  // orders the scores as scale q.k does only for a positive scale.
  if (!(params.scale > 0.0f) || !std::isfinite(params.scale)) {
    throw std::invalid_argument("flash_forward: scale must be positive and finite, got " +
                                std::to_string(params.scale));
  }
  if (course::device_attribute(cudaDevAttrComputeCapabilityMajor) < 8) {
    throw std::runtime_error("flash_forward: needs compute capability 8.0+ (mma.m16n8k16, cp.async)");
  }
  // Nothing to write, and a grid of zero blocks is an invalid launch. seqlen_k = 0 needs no case of
  // its own: every block visits no key block and writes o = 0, L = -inf (k and v are never read).
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) return;
  check_view("q", params.q, params.q_strides, params.batch, params.seqlen_q, params.heads_q);
  if (params.seqlen_k > 0) {
    check_view("k", params.k, params.k_strides, params.batch, params.seqlen_k, params.heads_kv);
    check_view("v", params.v, params.v_strides, params.batch, params.seqlen_k, params.heads_kv);
  }
  if (!aligned(params.o, 4) || !aligned(params.lse, 4)) {
    throw std::invalid_argument("flash_forward: o and lse must be 4-byte aligned");
  }
  const bool half = type == ElementType::kFloat16;
  if (params.head_dim == kHeadDimSmall) {
    half ? launch_typed<__half, kHeadDimSmall>(params, stream)
         : launch_typed<__nv_bfloat16, kHeadDimSmall>(params, stream);
  } else {
    half ? launch_typed<__half, kHeadDimLarge>(params, stream)
         : launch_typed<__nv_bfloat16, kHeadDimLarge>(params, stream);
  }
}

// Lab skeleton generated from solutions/08-flash-attention/flash_forward_hopper.cu by `./course labs` [lab-hash 8bc073db25e1].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08, the reference's Hopper path (sm_90a): the same forward as flash_forward.cu (same op, same
// results: o and the natural-log L), with Hopper's data path, in FlashAttention-3's shape simplified
// for reading. Not a lab task: read it after rung 3 passes, as lesson 05's Hopper section.
//  - Warp specialization: warpgroup 0 is the producer, one thread of it issues every copy; warpgroups
//    1 and 2 are consumers, 64 query rows each (wgmma's M), so a block owns Br = 128 query rows.
//  - TMA: Q once, then K_j and V_j into a ring of kStages stages; each stage has a "full" mbarrier per
//    tile (K and V separately, so S = Q K^T starts before V has landed) and an "empty" one the
//    consumers arrive on when their products have read the stage.
//  - S = Q K^T: wgmma with both operands in shared memory (SS). The online softmax in registers, as in
//    rung 3 (the accumulator layout of wgmma is mma.m16n8's). O += P V: wgmma with P from registers
//    (RS), V as stored (MN-major: wgmma transposes it).
//  - setmaxnreg: the producer gives its registers to the consumers, which hold S, P and O.
//  - kOverlap (a template flag, both built): the softmax of key block j runs while the tensor cores
//    compute O += P_{j-1} V_{j-1}, FlashAttention-3's intra-warpgroup pipelining. Off: each product is
//    waited for before the softmax that follows it (the simplest correct pipeline).
// Causal (bottom-right), tails, GQA: as rung 3 (attention.h), with Br = 128. TMA needs 16-byte-aligned
// bases and strides: the launcher reports whether a call qualifies (flash_forward_hopper_supports) and
// the wrapper falls back to rung 3 where it does not.
#include <course/cuda.cuh>
#include <course/mma.cuh>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "attention.h"
#include "hopper_attention.cuh"

namespace flash_forward_hopper_impl {

using course::exp2_approx;
using course::kFullWarpMask;
using course::kLog2e;
using course::kWarpSize;
using course::pack_pair;
using course::store_pair;

// --8<-- [start:hopper_tiles]
// Block: 3 warpgroups. Consumer c (1 or 2) owns query rows 64 (c - 1) .. 64 c - 1 of the block.
// Registers per consumer thread (a warpgroup's 64 x n fp32 tile is n / 2 registers a thread):
//   S (64 x Bc fp32)          Bc / 2 = 64
//   P (64 x Bc, 16-bit pairs) Bc / 4 = 32    (born as S dies, but with kOverlap P_{j-1} lives on
//                                             while S_j is computed: both)
//   O (64 x D fp32)           D / 2 = 32 (D 64) or 64 (D 128)
// D = 128, kOverlap: 64 + 32 + 64 = 160 live, plus row state and addresses. 384 threads start with
// 65536 / 384 = 170 (168 by 8); the producer drops to 24 and the consumers take 240:
// 128 (24 + 2 x 240) = 64512 <= 65536.
// Shared memory, in 128-byte-swizzled boxes of 64 head dims (one swizzle line of 16-bit elements):
//   Q   Br x D x 2 B                   32 KiB (D 128)    16 KiB (D 64)
//   K   kStages x Bc x D x 2 B         64 KiB (2 stages) 48 KiB (3 stages)
//   V   the same                       64 KiB            48 KiB
// 160 and 112 KiB of the 227 an SM gives a block: one block an SM either way (the registers of 384
// threads allow only one), so the stages are bounded by shared memory alone, not balanced against occupancy.
// Deeper rings fit (3 stages at D 128, 6 at D 64: hopper_plan.py's deepest_ring); whether they pay was not measured.
constexpr int kWarpgroupThreads = 128;
constexpr int kConsumers = 2;
constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kWgmmaM = 64;
constexpr int kBlockM = kConsumers * kWgmmaM;  // Br: query rows a block
constexpr int kBlockN = 128;                   // Bc: keys a key block (wgmma n of S)
constexpr int kWgmmaK = 16;
constexpr int kElementBytes = 2;
constexpr int kBoxCols = 64;  // head dims a TMA box: 128 bytes, the 128-byte swizzle's line
constexpr int kSwizzleBytes = kBoxCols * kElementBytes;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;  // the swizzle repeats every 8 rows: tiles align to 1024
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 64 * 1024,
              "the register file after the hand-over");
// Every consumer warp frees a stage when its products have read it (as lesson 05's consumers do).
constexpr int kEmptyArrivals = kConsumers * kWarpgroupThreads / kWarpSize;
static_assert(kEmptyArrivals == 8, "2 consumers of 4 warps");

template <int kHeadDim>
struct HopperTiles {
  static constexpr int kBoxes = kHeadDim / kBoxCols;  // 1 or 2 boxes a row of Q, K, V
  static constexpr int kStages = kHeadDim == 64 ? 3 : 2;
  static constexpr int kQBoxBytes = kBlockM * kSwizzleBytes;
  static constexpr int kKvBoxBytes = kBlockN * kSwizzleBytes;
  static constexpr int kQBytes = kBoxes * kQBoxBytes;
  static constexpr int kKvBytes = kBoxes * kKvBoxBytes;  // one K (or V) tile: what its full barrier expects
  static constexpr int kBarriers = 1 + 3 * kStages;      // Q full; K full, V full, empty per stage
  static constexpr int kSharedBytes = kSwizzleAtomBytes + kQBytes + 2 * kStages * kKvBytes + kBarriers * 8;
  static constexpr int kScoreRegisters = kBlockN / 2, kOutputRegisters = kHeadDim / 2;
  static constexpr int kProbSteps = kBlockN / kWgmmaK;  // k-steps of P V: one A fragment (4 registers) each
  static_assert(kHeadDim % kBoxCols == 0, "whole boxes");
  static_assert(kQBoxBytes % kSwizzleAtomBytes == 0 && kKvBoxBytes % kSwizzleAtomBytes == 0,
                "every box starts on a 1024-byte boundary");
  static_assert((kWgmmaM * kSwizzleBytes) % kSwizzleAtomBytes == 0, "a consumer's 64 rows of Q start aligned");
  static_assert(kSharedBytes <= 227 * 1024, "H100/H200: 227 KiB of shared memory a block");
  static_assert(kScoreRegisters + kProbSteps * 4 + kOutputRegisters + 48 <= kConsumerRegisters,
                "S, P, O and the rest fit a consumer's registers");
};
static_assert(HopperTiles<128>::kSharedBytes == 1024 + 160 * 1024 + 7 * 8, "the table above");
static_assert(HopperTiles<64>::kSharedBytes == 1024 + 112 * 1024 + 10 * 8, "the table above");
// --8<-- [end:hopper_tiles]

COURSE_SM90A_IMAGE_FLAG(built_with_wgmma);

#ifdef COURSE_WGMMA
// The key blocks a query block visits, and how many of them need no per-element mask: rung 3's rule
// (flash_forward.cu, key_blocks) with Br = 128.
struct KeyBlocks {
  int64_t count, unmasked;
};
__device__ inline KeyBlocks key_blocks(int64_t query0, int64_t seqlen_q, int64_t seqlen_k, bool causal) {
  const int64_t last_row = min(query0 + kBlockM, seqlen_q) - 1;
  const int64_t key_end = causal ? causal_key_end(last_row, seqlen_q, seqlen_k) : seqlen_k;
  const int64_t full_end = causal ? causal_key_end(query0, seqlen_q, seqlen_k) : seqlen_k;
  const int64_t count = (max(key_end, int64_t{0}) + kBlockN - 1) / kBlockN;
  return {count, min(max(full_end, int64_t{0}) / kBlockN, count)};
}

// -inf for the scores of key block key0 that a row must not see. s[4 n + 2 h + e] is row row0 + 8 h
// (row0 = the thread's first row), key key0 + 8 n + key_col + e (key_col = 2 (lane % 4)).
__device__ inline void mask_scores(float (&s)[kBlockN / 2], int64_t row0, int64_t key0, int key_col, int64_t seqlen_q,
                                   int64_t seqlen_k, bool causal) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t end = causal ? causal_key_end(row0 + 8 * half, seqlen_q, seqlen_k) : seqlen_k;
    const int visible = static_cast<int>(min(max(end - key0, int64_t{0}), int64_t{kBlockN}));
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (n * 8 + key_col + e >= visible) s[4 * n + 2 * half + e] = -INFINITY;
      }
    }
  }
}

// The online softmax of one key block for the thread's two rows, rung 3's (flash_forward.cu), on
// wgmma's layout: s becomes P = exp2(s scale_log2 - m' scale_log2) in place, l and m are updated, and
// alpha (the factor O must be multiplied by) is returned per row. O itself is not touched here: with
// kOverlap the tensor cores may still be adding into it.
__device__ inline void online_softmax(float (&s)[kBlockN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                      float scale_log2) {
  float offset[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float row_max = m[half];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) row_max = fmaxf(row_max, fmaxf(s[4 * n + 2 * half], s[4 * n + 2 * half + 1]));
    row_max = fmaxf(row_max, __shfl_xor_sync(kFullWarpMask, row_max, 1));
    row_max = fmaxf(row_max, __shfl_xor_sync(kFullWarpMask, row_max, 2));
    offset[half] = row_max == -INFINITY ? 0.0f : row_max * scale_log2;  // no -inf - -inf
    alpha[half] = exp2_approx(m[half] * scale_log2 - offset[half]);
    l[half] *= alpha[half];
    m[half] = row_max;
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    s[i] = exp2_approx(fmaf(s[i], scale_log2, -offset[(i / 2) % 2]));
    l[(i / 2) % 2] += s[i];
  }
}

// P as the A operand of P V: k-step kk (keys 16 kk .. 16 kk + 15) is the n8 tiles 2 kk and 2 kk + 1 of
// S, the same pairing as rung 3's (a0, a1 = tile 2 kk rows g and g + 8; a2, a3 = tile 2 kk + 1).
template <typename T>
__device__ inline void pack_probabilities(const float (&s)[kBlockN / 2], uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    p[kk][0] = pack_pair<T>(s[8 * kk + 0], s[8 * kk + 1]);
    p[kk][1] = pack_pair<T>(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = pack_pair<T>(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = pack_pair<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

template <int kCount>
__device__ inline void rescale(float (&o)[kCount], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) o[i] *= alpha[(i / 2) % 2];
}
#endif  // COURSE_WGMMA

// --8<-- [start:hopper_kernel]
// One block per (query block, batch * heads_q), flattened into gridDim.x as rung 3 does (the longest
// causal query blocks first).
template <typename T, int kHeadDim, bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    flash_forward_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const AttentionParams p,
                                int64_t query_blocks, float scale_log2) {
#ifdef COURSE_WGMMA
  using Config = HopperTiles<kHeadDim>;
  constexpr int kStages = Config::kStages, kBoxes = Config::kBoxes;
  extern __shared__ uint8_t shared_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAtomBytes - 1) &
                         ~static_cast<uintptr_t>(kSwizzleAtomBytes - 1);
  uint8_t* const q_tile = reinterpret_cast<uint8_t*>(base);       // [box][Br rows][64]
  uint8_t* const k_tiles = q_tile + Config::kQBytes;              // [stage][box][Bc rows][64]
  uint8_t* const v_tiles = k_tiles + kStages * Config::kKvBytes;  // [stage][box][Bc rows][64]
  uint64_t* const q_full = reinterpret_cast<uint64_t*>(v_tiles + kStages * Config::kKvBytes);
  uint64_t* const k_full = q_full + 1;
  uint64_t* const v_full = k_full + kStages;
  uint64_t* const empty = v_full + kStages;

  const int64_t bh = blockIdx.x / query_blocks;
  const int64_t query0 = (query_blocks - 1 - blockIdx.x % query_blocks) * kBlockM;
  const int64_t batch = bh / p.heads_q, head = bh % p.heads_q;
  const int64_t kv_head = head / (p.heads_q / p.heads_kv);
  const KeyBlocks blocks = key_blocks(query0, p.seqlen_q, p.seqlen_k, p.causal);

  if (threadIdx.x == 0) {
    hopper::barrier_init(q_full, 1);  // the producer's expect_bytes arrival (+ the bytes)
    for (int stage = 0; stage < kStages; ++stage) {
      hopper::barrier_init(&k_full[stage], 1);
      hopper::barrier_init(&v_full[stage], 1);
      hopper::barrier_init(&empty[stage], kEmptyArrivals);
    }
    hopper::barrier_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: the producer's idle threads leave after the hand-over

  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (warpgroup == 0) {
    // --8<-- [start:hopper_producer]
    hopper::release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      const int b = static_cast<int>(batch), h = static_cast<int>(head), g = static_cast<int>(kv_head);
      hopper::barrier_arrive_expect_bytes(q_full, Config::kQBytes);  // rows past seqlen_q arrive as zeros, and count
      for (int box = 0; box < kBoxes; ++box) {
        hopper::tma_load_4d(q_tile + box * Config::kQBoxBytes, &q_map, q_full, box * kBoxCols, static_cast<int>(query0),
                            h, b);
      }
      // Key block j goes to stage j % kStages in lap j / kStages; the stage is free once the consumers
      // have arrived on its empty barrier for the lap before (lap 0 passes: parity 1 of a fresh barrier).
      for (int64_t j = 0; j < blocks.count; ++j) {
        const int stage = static_cast<int>(j % kStages);
        const uint32_t lap = static_cast<uint32_t>(j / kStages);
        const int key0 = static_cast<int>(j * kBlockN);
        hopper::barrier_wait(&empty[stage], (lap & 1) ^ 1);
        hopper::barrier_arrive_expect_bytes(&k_full[stage], Config::kKvBytes);
        for (int box = 0; box < kBoxes; ++box) {
          hopper::tma_load_4d(k_tiles + stage * Config::kKvBytes + box * Config::kKvBoxBytes, &k_map, &k_full[stage],
                              box * kBoxCols, key0, g, b);
        }
        hopper::barrier_arrive_expect_bytes(&v_full[stage], Config::kKvBytes);
        for (int box = 0; box < kBoxes; ++box) {
          hopper::tma_load_4d(v_tiles + stage * Config::kKvBytes + box * Config::kKvBoxBytes, &v_map, &v_full[stage],
                              box * kBoxCols, key0, g, b);
        }
      }
    }
    // --8<-- [end:hopper_producer]
    return;
  }

  // --8<-- [start:hopper_consumer]
  hopper::claim_registers<kConsumerRegisters>();
  const int consumer = warpgroup - 1, thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / kWarpSize, lane = thread % kWarpSize;
  // The thread's first row (its second is 8 further) and the key column of its accumulator register 0.
  const int64_t row0 = query0 + consumer * kWgmmaM + warp * 16 + lane / 4;
  const int key_col = 2 * (lane % 4);
  const uint8_t* const my_q = q_tile + consumer * kWgmmaM * kSwizzleBytes;  // in each box

  // The descriptors' addresses for k-step kk of S = Q K^T (16 head dims): box kk / 4, 32 B per step inside
  // the 128-byte swizzled row (lesson 05's rule); and of O += P V (16 keys): 16 rows of 128 B further.
  const auto q_descriptor = [&](int kk) {
    return hopper::tile_descriptor(my_q + (kk / 4) * Config::kQBoxBytes + (kk % 4) * kWgmmaK * kElementBytes);
  };
  const auto k_descriptor = [&](int stage, int kk) {
    return hopper::tile_descriptor(k_tiles + stage * Config::kKvBytes + (kk / 4) * Config::kKvBoxBytes +
                                   (kk % 4) * kWgmmaK * kElementBytes);
  };
  const auto v_descriptor = [&](int stage, int kk) {
    return hopper::mn_major_descriptor(v_tiles + stage * Config::kKvBytes + kk * kWgmmaK * kSwizzleBytes,
                                       Config::kKvBoxBytes);
  };
  // S = Q K_j^T: D / 16 wgmma into s, issued and committed as one group (not waited for here).
  const auto issue_scores = [&](float (&s)[kBlockN / 2], int stage) {
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kWgmmaK; ++kk) {
      hopper::wgmma_ss_n128<T>(s, q_descriptor(kk), k_descriptor(stage, kk), kk > 0);
    }
    hopper::wgmma_commit();
  };
  float o[Config::kOutputRegisters];
  // O += P V_j: Bc / 16 wgmma, one group.
  const auto issue_output = [&](uint32_t (&prob)[kBlockN / 16][4], int stage) {
    hopper::wgmma_fence();  // O rescaled and P written by ordinary instructions: order them before the wgmma
#pragma unroll
    for (int kk = 0; kk < kBlockN / kWgmmaK; ++kk) {
      hopper::WgmmaRs<T, kHeadDim>::run(o, prob[kk], v_descriptor(stage, kk));
    }
    hopper::wgmma_commit();
  };
  // The stage's products have read it: one arrival a warp.
  const auto release = [&](int stage) {
    if (lane == 0) hopper::barrier_arrive(&empty[stage]);
  };
  const auto parity = [](int64_t j) { return static_cast<uint32_t>((j / kStages) & 1); };
  const auto mask_if_needed = [&](float (&s)[kBlockN / 2], int64_t j) {
    if (j >= blocks.unmasked) mask_scores(s, row0, j * kBlockN, key_col, p.seqlen_q, p.seqlen_k, p.causal);
  };

#pragma unroll
  for (int i = 0; i < Config::kOutputRegisters; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
  float s[kBlockN / 2];
  uint32_t prob[kBlockN / 16][4];

  hopper::barrier_wait(q_full, 0);  // always: the block must not end while Q's copy is in flight
  if constexpr (!kOverlap) {
    // --8<-- [start:hopper_simple_loop]
    // Each product waited for before the step that needs it: S, softmax, O += P V, in turn.
#pragma unroll 1
    for (int64_t j = 0; j < blocks.count; ++j) {
      const int stage = static_cast<int>(j % kStages);
      hopper::barrier_wait(&k_full[stage], parity(j));
      issue_scores(s, stage);
      hopper::wgmma_wait<0>();
      hopper::settle(s);
      mask_if_needed(s, j);
      online_softmax(s, m, l, alpha, scale_log2);
      rescale(o, alpha);
      pack_probabilities<T>(s, prob);
      hopper::barrier_wait(&v_full[stage], parity(j));
      issue_output(prob, stage);
      hopper::wgmma_wait<0>();
      hopper::settle(o);
      hopper::keep_until_here(prob);
      release(stage);
    }
    // --8<-- [end:hopper_simple_loop]
  } else if (blocks.count > 0) {
    // --8<-- [start:hopper_overlap_loop]
    // Block 0's scores and softmax first; then per block j: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are
    // issued back to back; the softmax of S_j runs while the second is still on the tensor cores; O
    // is rescaled (and P_j packed over P_{j-1}'s registers) only after it has finished.
    hopper::barrier_wait(&k_full[0], 0);
    issue_scores(s, 0);
    hopper::wgmma_wait<0>();
    hopper::settle(s);
    mask_if_needed(s, 0);
    online_softmax(s, m, l, alpha, scale_log2);  // alpha = 0 on O = 0: nothing to rescale
    pack_probabilities<T>(s, prob);
#pragma unroll 1
    for (int64_t j = 1; j < blocks.count; ++j) {
      const int stage = static_cast<int>(j % kStages), previous = static_cast<int>((j - 1) % kStages);
      hopper::barrier_wait(&k_full[stage], parity(j));
      issue_scores(s, stage);
      hopper::barrier_wait(&v_full[previous], parity(j - 1));
      issue_output(prob, previous);
      hopper::wgmma_wait<1>();  // groups retire in order: S_j is done, P_{j-1} V_{j-1} may still run
      hopper::settle(s);
      mask_if_needed(s, j);
      online_softmax(s, m, l, alpha, scale_log2);
      hopper::wgmma_wait<0>();
      hopper::settle(o);
      hopper::keep_until_here(prob);  // P_{j-1}'s registers were read until here
      release(previous);
      rescale(o, alpha);
      pack_probabilities<T>(s, prob);
    }
    const int64_t last = blocks.count - 1;
    const int stage = static_cast<int>(last % kStages);
    hopper::barrier_wait(&v_full[stage], parity(last));
    issue_output(prob, stage);
    hopper::wgmma_wait<0>();
    hopper::settle(o);
    hopper::keep_until_here(prob);
    release(stage);
    // --8<-- [end:hopper_overlap_loop]
  }
  // --8<-- [end:hopper_consumer]

  // The epilogue of rung 3: the row sums from the quad's 4 lanes, one division per row, O rounded to T
  // once, L = m scale + log(l); rows past seqlen_q are not written; a row that saw no key: o = 0, L = -inf.
  T* const out = static_cast<T*>(p.o);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float row_l = l[half];
    row_l += __shfl_xor_sync(kFullWarpMask, row_l, 1);
    row_l += __shfl_xor_sync(kFullWarpMask, row_l, 2);
    const int64_t row = row0 + 8 * half;
    if (row >= p.seqlen_q) continue;
    const float inv_l = row_l > 0.0f ? 1.0f / row_l : 0.0f;
    T* const o_row = out + ((batch * p.seqlen_q + row) * p.heads_q + head) * kHeadDim + key_col;  // (B, Sq, Hq, D)
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      store_pair(o_row + 8 * n, o[4 * n + 2 * half] * inv_l, o[4 * n + 2 * half + 1] * inv_l);
    }
    if (lane % 4 == 0) {
      p.lse[bh * p.seqlen_q + row] = row_l > 0.0f ? m[half] * p.scale + logf(row_l) : -INFINITY;
    }
  }
#else
  __trap();  // not built for sm_90a: the launcher refuses before launching
#endif
}
// --8<-- [end:hopper_kernel]

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    COURSE_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found));
#else
    COURSE_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      throw std::runtime_error("flash_forward (Hopper path): the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A dimension of size 1 is never stepped along, and PyTorch may give it any stride; TMA wants every
// stride a multiple of 16 bytes, so such a dimension gets one that is (its value is never used).
int64_t stride_bytes(int64_t stride, int64_t size) {
  const int64_t bytes = stride * kElementBytes;
  return size <= 1 ? (bytes > 0 && bytes % 16 == 0 ? bytes : 16) : bytes;
}

constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;  // TMA's limit on a stride
constexpr int64_t kMaxCoordinate = 0x7fffffff;         // TMA box coordinates are 32-bit

// Whether TMA can describe the (batch, seqlen, heads, head_dim) view: a 16-byte-aligned base, strides
// that are multiples of 16 bytes below 2^40 (size-1 dimensions excepted: stride_bytes), coordinates
// below 2^31.
bool view_qualifies(const void* data, const Strides& strides, int64_t batch, int64_t seqlen, int64_t heads) {
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
  if (batch > kMaxCoordinate || seqlen > kMaxCoordinate || heads > kMaxCoordinate) return false;
  for (const auto& [stride, size] :
       {std::pair{strides.batch, batch}, std::pair{strides.seq, seqlen}, std::pair{strides.head, heads}}) {
    const int64_t bytes = stride_bytes(stride, size);
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= kMaxStrideBytes) return false;
  }
  return true;
}

// The 4-D tensor map of a view, moved in boxes of 64 head dims x `box_rows` rows of one head of one
// batch, 128-byte swizzled; rows past seqlen arrive as zeros. Returns the driver's status.
CUresult encode_view(CUtensorMap* map, ElementType type, const void* data, const Strides& strides, int64_t batch,
                     int64_t seqlen, int64_t heads, int64_t head_dim, int box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t byte_strides[3] = {static_cast<cuuint64_t>(stride_bytes(strides.seq, seqlen)),
                                      static_cast<cuuint64_t>(stride_bytes(strides.head, heads)),
                                      static_cast<cuuint64_t>(stride_bytes(strides.batch, batch))};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kBoxCols), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return tensor_map_encoder()(
      map, type == ElementType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(data), dims, byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

template <typename T, int kHeadDim, bool kOverlap>
void launch_typed(const AttentionParams& p, ElementType type, cudaStream_t stream) {
  using Config = HopperTiles<kHeadDim>;
  const auto kernel = flash_forward_hopper_kernel<T, kHeadDim, kOverlap>;
  course::opt_in_dynamic_shared(kernel, Config::kSharedBytes, "flash_forward (Hopper path)");
  CUtensorMap maps[3];
  const struct {
    const void* data;
    const Strides& strides;
    int64_t seqlen, heads;
    int box_rows;
    const char* name;
  } views[3] = {{p.q, p.q_strides, p.seqlen_q, p.heads_q, kBlockM, "q"},
                {p.k, p.k_strides, p.seqlen_k, p.heads_kv, kBlockN, "k"},
                {p.v, p.v_strides, p.seqlen_k, p.heads_kv, kBlockN, "v"}};
  for (int i = 0; i < 3; ++i) {
    const CUresult status = encode_view(&maps[i], type, views[i].data, views[i].strides, p.batch, views[i].seqlen,
                                        views[i].heads, kHeadDim, views[i].box_rows);
    if (status != CUDA_SUCCESS) {
      throw std::runtime_error(std::string("flash_forward (Hopper path): cuTensorMapEncodeTiled refused ") +
                               views[i].name + " (CUresult " + std::to_string(static_cast<int>(status)) +
                               "); path='portable' runs rung 3 instead");
    }
  }
  const int64_t query_blocks = course::ceil_div<int64_t>(p.seqlen_q, kBlockM);
  const int64_t blocks = query_blocks * p.batch * p.heads_q;
  if (blocks > std::numeric_limits<int>::max()) throw std::runtime_error("flash_forward: too many query blocks");
  kernel<<<static_cast<unsigned>(blocks), kThreads, Config::kSharedBytes, stream>>>(maps[0], maps[1], maps[2], p,
                                                                                    query_blocks, p.scale * kLog2e);
  COURSE_CHECK_LAUNCH();
}

}  // namespace flash_forward_hopper_impl

using namespace flash_forward_hopper_impl;

bool flash_forward_hopper_available() {
  static course::PerDeviceCache loaded;
  return course::sm90a_image_loaded(loaded,
                                    [](int* out) { return cudaMemcpyFromSymbol(out, built_with_wgmma, sizeof(int)); });
}

std::string flash_forward_hopper_refusal(ElementType type, const AttentionParams& params) {
  if (type != ElementType::kFloat16 && type != ElementType::kBFloat16) return "float16 or bfloat16 only";
  if (params.head_dim != kHeadDimSmall && params.head_dim != kHeadDimLarge) return "head_dim 64 or 128 only";
  if (params.seqlen_k == 0 || params.seqlen_q == 0 || params.batch == 0 || params.heads_q == 0) {
    return "an empty tensor (a tensor map cannot describe one)";
  }
  if (!view_qualifies(params.q, params.q_strides, params.batch, params.seqlen_q, params.heads_q)) {
    return "q is not 16-byte aligned with strides that are multiples of 16 bytes (TMA's rule)";
  }
  if (!view_qualifies(params.k, params.k_strides, params.batch, params.seqlen_k, params.heads_kv)) {
    return "k is not 16-byte aligned with strides that are multiples of 16 bytes (TMA's rule)";
  }
  if (!view_qualifies(params.v, params.v_strides, params.batch, params.seqlen_k, params.heads_kv)) {
    return "v is not 16-byte aligned with strides that are multiples of 16 bytes (TMA's rule)";
  }
  if (!flash_forward_hopper_available()) {
    return "needs a Hopper GPU (compute capability 9.0) and a build for sm_90a (TORCH_CUDA_ARCH_LIST=9.0a)";
  }
  return "";
}

FlashForwardHopperTiles flash_forward_hopper_tiles(int head_dim) {
  switch (head_dim) {
    case kHeadDimSmall:
      return {kBlockM, kBlockN, kThreads / kWarpSize, HopperTiles<kHeadDimSmall>::kStages,
              HopperTiles<kHeadDimSmall>::kSharedBytes};
    case kHeadDimLarge:
      return {kBlockM, kBlockN, kThreads / kWarpSize, HopperTiles<kHeadDimLarge>::kStages,
              HopperTiles<kHeadDimLarge>::kSharedBytes};
    default: throw std::invalid_argument("flash_forward (Hopper path): head_dim must be 64 or 128");
  }
}

void launch_flash_forward_hopper(ElementType type, const AttentionParams& params, bool overlap, cudaStream_t stream) {
  const std::string refusal = flash_forward_hopper_refusal(type, params);
  if (!refusal.empty()) throw std::invalid_argument("flash_forward (Hopper path): " + refusal);
  if (!(params.scale > 0.0f) || !std::isfinite(params.scale)) {
    throw std::invalid_argument("flash_forward (Hopper path): scale must be positive and finite");
  }
  if (params.heads_kv <= 0 || params.heads_q % params.heads_kv != 0) {
    throw std::invalid_argument("flash_forward (Hopper path): heads_q must be a multiple of heads_kv");
  }
  const bool half = type == ElementType::kFloat16;
  const auto run = [&](auto overlap_tag) {
    constexpr bool kOverlap = decltype(overlap_tag)::value;
    if (params.head_dim == kHeadDimSmall) {
      half ? launch_typed<__half, kHeadDimSmall, kOverlap>(params, type, stream)
           : launch_typed<__nv_bfloat16, kHeadDimSmall, kOverlap>(params, type, stream);
    } else {
      half ? launch_typed<__half, kHeadDimLarge, kOverlap>(params, type, stream)
           : launch_typed<__nv_bfloat16, kHeadDimLarge, kOverlap>(params, type, stream);
    }
  };
  overlap ? run(std::true_type{}) : run(std::false_type{});
}

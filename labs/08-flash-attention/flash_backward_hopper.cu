// Lab skeleton generated from solutions/08-flash-attention/flash_backward_hopper.cu by `./course labs` [lab-hash 8bbd81dd4904].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08, the reference's Hopper path of rung 4 (sm_90a): the same backward as flash_backward.cu (same
// op, same results: grad_q, grad_k, grad_v from grad_o and the forward's o and L), with the Hopper
// forward's data path (flash_forward_hopper.cu): TMA, an mbarrier ring, wgmma, warp specialization. Not a
// lab task: read it after rung 4 passes, beside lesson 08's Hopper section.
//
// The algorithm is rung 4's (flash_backward.cu's header): preprocess D = rowsum(dO * O); one block per
// (key block j, batch, kv head) keeping K_j, V_j in shared memory and dK_j, dV_j in registers while the
// query blocks of every query head of the group stream past in one fixed order (dK, dV deterministic,
// written once); dQ's partial sums by float32 atomics, then grad_q = scale * accumulator. The transposed
// scores too: S^T = K_j Q_i^T and dP^T = V_j dO_i^T put the keys on wgmma's M, so that P^T and dS^T come
// out of the accumulators as the register A operands of dV += P^T dO_i and dK += dS^T Q_i (RS), as rung 4's
// come out as mma.sync A fragments. What changes with Hopper:
//  - Warp specialization, as the forward: warpgroup 0 the producer (one thread issues every copy),
//    warpgroups 1 and 2 consumers of 64 keys each (wgmma's M), so a block owns Bc = 128 keys.
//  - TMA: K_j and V_j once; per step Q_i and dO_i (4-D tensor maps, 128-byte swizzle) and the step's
//    64 values of L log2(e) and of D (1-D bulk copies) into a ring of kStages stages, each with a "full"
//    and an "empty" mbarrier.
//  - S^T, dP^T: wgmma SS (K_j, Q_i both K-major as stored). dV, dK: wgmma RS, dO_i and Q_i MN-major (as
//    stored: wgmma transposes them, as it does V in the forward).
//  - dQ_i = dS K_j: dS^T goes to shared memory in the 128-byte swizzle's layout (one 128-byte line = the 64
//    queries of one key), and wgmma reads both dS^T and K_j MN-major (imm-trans-a, imm-trans-b).
//    head_dim 128: consumer c computes dQ's head dims 64c .. 64c + 63 over all 128 keys (both warpgroups'
//    dS^T: one barrier of the 256 consumer threads a step; dS^T double-buffered so that the next step's
//    stores do not wait for the other warpgroup's reads). head_dim 64: a 64 x 32 half would need an
//    MN-major B narrower than the swizzle's 64-column line, so instead consumer c computes dQ over its own
//    64 keys and both add into grad_q_accum (twice the atomics of head_dim 128's split, no barrier).
//  - The pipeline is the simple one (the forward's hopper_simple_loop): each product waited for before the
//    step that needs it; the two consumer warpgroups overlap each other.
// params.deterministic stays on the portable kernel (its second dQ pass): the wrapper routes it there.
// Causal (bottom-right), tails, GQA, strided q, k, v: as rung 4. The rows of L log2(e) and D are padded to
// a multiple of Br (the preprocess writes +inf and 0 past seqlen_q: P = 0 there), so that every step's
// bulk copy is whole and aligned.
#include <course/cuda.cuh>
#include <course/dtype.cuh>
#include <course/mma.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention.h"
#include "hopper_attention.cuh"

namespace flash_backward_hopper_impl {

using course::exp2_approx;
using course::from_compute;
using course::kFullWarpMask;
using course::kLog2e;
using course::kWarpSize;
using course::pack_pair;
using course::store_pair;
using course::to_compute;

// --8<-- [start:hopper_backward_tiles]
// Block: 3 warpgroups. Consumer c (1 or 2) owns keys 64 (c - 1) .. 64 c - 1 of the block's Bc = 128; a step
// is Br = 64 queries of one query head.
// Registers per consumer thread (a warpgroup's 64 x n fp32 tile is n / 2 registers a thread):
//   dK, dV   (64 keys x D fp32 each)        D / 2 each: 128 (D 128), 64 (D 64), the block's whole life
//   S^T, dP^T (64 keys x Br fp32 each)      Br / 2 = 32 each
//   P^T, dS^T (16-bit pairs)                Br / 4 = 16 each, born as S^T, dP^T die
//   dQ       (64 queries x 64 fp32)         32, after S^T and dP^T have died
// D = 128: 128 + 64 at the peak, plus addresses: the forward's hand-over (producer 24, consumers 240).
// Shared memory (16-bit elements, 128-byte-swizzled boxes of 64 head dims):
//   K_j, V_j                 2 x 128 x D x 2 B           64 KiB (D 128)   32 KiB (D 64)
//   Q_i, dO_i, kStages       2 x 2 x 64 x D x 2 B        64 KiB           32 KiB
//   dS^T, two buffers        2 x 128 x 64 x 2 B          32 KiB           32 KiB
//   L log2(e), D, kStages    2 x 2 x 64 x 4 B             1 KiB            1 KiB
// 161 KiB and 97 KiB (+ 1 KiB to align the base, + the barriers): one block an SM (the registers of 384
// threads allow only one).
constexpr int kWarpgroupThreads = 128;
constexpr int kConsumers = 2;
constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kWgmmaM = 64;
constexpr int kBlockN = kConsumers * kWgmmaM;  // Bc: keys a block
constexpr int kBlockM = 64;                    // Br: queries a step (wgmma n of S^T, dP^T)
constexpr int kWgmmaK = 16;
constexpr int kStages = 2;
constexpr int kElementBytes = 2;
constexpr int kBoxCols = 64;  // head dims a TMA box: 128 bytes, the 128-byte swizzle's line
constexpr int kSwizzleBytes = kBoxCols * kElementBytes;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;
constexpr int kChunkBytes = 16;
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 64 * 1024,
              "the register file after the hand-over");
// --8<-- [start:hopper_backward_release]
// Every consumer thread arrives on a stage's empty barrier, not one lane a warp: each thread reads the stage's L
// and D rows with ordinary loads, and an mbarrier arrival releases the arriving thread's own accesses only. With
// one arrival a warp racecheck reported each D load against the producer's next bulk copy into the stage (15360
// errors in the quick pass's 2 backward cases; with __syncwarp before it, still 282624 over 56 cases); with one a
// thread, 0 over the 56. Same time at the block's shape: 1.329 vs 1.332 ms (an H100;
// lesson 08's notes, "Hopper backward").
constexpr int kEmptyArrivals = kConsumers * kWarpgroupThreads;
// --8<-- [end:hopper_backward_release]
// Named barriers (0 is __syncthreads'): the 256 consumer threads; each consumer warpgroup's 128.
constexpr int kConsumersBarrier = 1, kWarpgroupBarrier0 = 2;

template <int kHeadDim>
struct HopperBackwardTiles {
  static constexpr int kBoxes = kHeadDim / kBoxCols;
  static constexpr int kQBoxBytes = kBlockM * kSwizzleBytes;
  static constexpr int kKvBoxBytes = kBlockN * kSwizzleBytes;
  static constexpr int kQBytes = kBoxes * kQBoxBytes;    // one Q_i (or dO_i) tile
  static constexpr int kKvBytes = kBoxes * kKvBoxBytes;  // K_j (or V_j)
  static constexpr int kDsBytes = kBlockN * kBlockM * kElementBytes;
  static constexpr int kRowBytes = kBlockM * static_cast<int>(sizeof(float));  // a step's L log2(e) (or D)
  static constexpr int kStepBytes = 2 * kQBytes + 2 * kRowBytes;               // what a stage's full barrier expects
  static constexpr int kBarriers = 1 + 2 * kStages;                            // K/V full; full, empty per stage
  static constexpr int kSharedBytes =
      kSwizzleAtomBytes + 2 * kKvBytes + 2 * kStages * kQBytes + 2 * kDsBytes + 2 * kStages * kRowBytes + kBarriers * 8;
  // dQ's split between the two consumers (the header): by head dims at D 128, by keys at D 64.
  static constexpr bool kDqSplitsKeys = kHeadDim == 64;
  static constexpr int kDqSteps = (kDqSplitsKeys ? kWgmmaM : kBlockN) / kWgmmaK;  // k-steps of dQ = dS K
  static constexpr int kAccumulatorRegisters = kHeadDim / 2;
  static_assert(kHeadDim % kBoxCols == 0, "whole boxes");
  static_assert(kDqSplitsKeys || kHeadDim == kConsumers * 64, "D 128: one 64-column box of dQ a consumer");
  static_assert(kQBoxBytes % kSwizzleAtomBytes == 0 && kKvBoxBytes % kSwizzleAtomBytes == 0 &&
                    kDsBytes % kSwizzleAtomBytes == 0,
                "every tile starts on a 1024-byte boundary");
  static_assert(kBlockM * kElementBytes == kSwizzleBytes, "a dS^T row (one key's 64 queries) is one swizzle line");
  static_assert(kSharedBytes <= 227 * 1024, "H100/H200: 227 KiB of shared memory a block");
  static_assert(2 * kAccumulatorRegisters + kBlockM + 48 <= kConsumerRegisters,
                "dK, dV, S^T, dP^T and the rest fit a consumer's registers");
};
static_assert(HopperBackwardTiles<128>::kSharedBytes == 1024 + 161 * 1024 + 5 * 8, "the table above");
static_assert(HopperBackwardTiles<64>::kSharedBytes == 1024 + 97 * 1024 + 5 * 8, "the table above");
// --8<-- [end:hopper_backward_tiles]

// The rows of L log2(e) and D: seqlen_q rounded up to Br, so that a step's 64 values are one aligned bulk copy.
inline int64_t padded_rows(int64_t seqlen_q) { return course::ceil_div<int64_t>(seqlen_q, kBlockM) * kBlockM; }

// What the main kernel reads besides the tensor maps.
struct Params {
  const float* lse_log2;  // (batch, heads_q, padded_rows(seqlen_q)): L log2(e), +inf past seqlen_q and where L = -inf
  const float* delta;     // the same shape: D = rowsum(dO * O), 0 past seqlen_q
  float* grad_q_accum;    // (batch, seqlen_q, heads_q, D) float32, zeroed by the preprocess
  void* grad_k;           // (batch, seqlen_k, heads_kv, D), contiguous
  void* grad_v;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, rows;  // rows = padded_rows(seqlen_q)
  int64_t wave_heads;  // (batch, kv head)s a group of the grid: their key blocks fill about one wave (the kernel)
  float scale, scale_log2;
  bool causal;
};

// ---------------------------------------------------------------- 1. preprocess
// rung 4's (backward_preprocess_kernel), writing into the padded rows, with L log2(e) beside D (the main
// kernel's subtrahend: -inf becomes +inf, so that P = exp2(finite - inf) = 0 and never inf - inf), and the
// padding (+inf, 0) by the same grid.
constexpr int kPreprocessThreads = 256;

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessThreads)
    hopper_preprocess_kernel(const T* __restrict__ grad_o, const T* __restrict__ o, const float* __restrict__ lse,
                             float* __restrict__ lse_log2, float* __restrict__ delta, float* __restrict__ grad_q_accum,
                             int64_t rows, int64_t seqlen_q, int64_t heads_q, int64_t padded) {
  constexpr int kElems = course::kElemsPerVector<T>;
  using Vector = course::Pack<T, kElems>;
  constexpr int kRowLanes = kHeadDim / kElems;
  constexpr int kRowsPerWarp = kWarpSize / kRowLanes;
  constexpr int kWarpsPerBlock = kPreprocessThreads / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, row_lane = lane % kRowLanes;
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t first_row = warp * kRowsPerWarp; first_row < rows; first_row += warps * kRowsPerWarp) {
    const int64_t row = first_row + lane / kRowLanes;  // (batch, query, head)
    const bool valid = row < rows;
    const int64_t offset = (valid ? row : rows - 1) * kHeadDim + row_lane * kElems;
    const Vector g = *reinterpret_cast<const Vector*>(grad_o + offset);
    const Vector y = *reinterpret_cast<const Vector*>(o + offset);
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < kElems; ++e) dot += to_compute(g.v[e]) * to_compute(y.v[e]);
#pragma unroll
    for (int lanes = kRowLanes / 2; lanes > 0; lanes /= 2) dot += __shfl_xor_sync(kFullWarpMask, dot, lanes);
    if (valid) {
      if (row_lane == 0) {
        const int64_t head = row % heads_q, batch_query = row / heads_q;
        const int64_t query = batch_query % seqlen_q, batch = batch_query / seqlen_q;
        const float l = lse[(batch * heads_q + head) * seqlen_q + query];
        const int64_t at = (batch * heads_q + head) * padded + query;
        delta[at] = dot;
        lse_log2[at] = l == -INFINITY ? INFINITY : l * kLog2e;
      }
      float4* accum = reinterpret_cast<float4*>(grad_q_accum + offset);
      accum[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      accum[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  // The padding: (batch, head) pairs x (padded - seqlen_q) rows.
  const int64_t pad = padded - seqlen_q, pads = rows / seqlen_q * pad;
  for (int64_t i = int64_t{blockIdx.x} * kPreprocessThreads + threadIdx.x; i < pads;
       i += int64_t{gridDim.x} * kPreprocessThreads) {
    const int64_t at = (i / pad) * padded + seqlen_q + i % pad;
    delta[at] = 0.0f;
    lse_log2[at] = INFINITY;
  }
}

// ---------------------------------------------------------------- 3. convert (rung 4's)
// A copy of flash_backward.cu's convert_grad_q_kernel, not a call of it: that one's body is the student's task
// lab08.8, and this path is the reference's (it must not run a student's unfinished code).
constexpr int kConvertThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kConvertThreads)
    hopper_convert_kernel(const float* __restrict__ grad_q_accum, T* __restrict__ grad_q, int64_t vectors,
                          float scale) {
  constexpr int kElems = course::kElemsPerVector<T>;
  using Vector = course::Pack<T, kElems>;
  static_assert(kElems == 8, "two float4 per vector");
  for (int64_t i = int64_t{blockIdx.x} * kConvertThreads + threadIdx.x; i < vectors;
       i += int64_t{gridDim.x} * kConvertThreads) {
    const float4 low = reinterpret_cast<const float4*>(grad_q_accum)[2 * i];
    const float4 high = reinterpret_cast<const float4*>(grad_q_accum)[2 * i + 1];
    const float values[kElems] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    Vector out;
#pragma unroll
    for (int e = 0; e < kElems; ++e) out.v[e] = from_compute<T>(scale * values[e]);
    reinterpret_cast<Vector*>(grad_q)[i] = out;
  }
}

COURSE_SM90A_IMAGE_FLAG(backward_built_with_wgmma);

#ifdef COURSE_WGMMA
// dQ partial sums: two adjacent floats, one vector reduction at L2 with no value returned (sm_90's
// red.global.add.v2.f32; atomicAdd(float2*) compiles to the returning atom.global.add.v2.f32).
__device__ inline void atomic_add_pair(float* address, float first, float second) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(first), "f"(second) : "memory");
}
#endif

// ---------------------------------------------------------------- 2. main kernel
// --8<-- [start:hopper_backward_kernel]
// One block per (key block j, batch, kv head), in an order of its own. Two things decide it:
//  - Under a causal mask key block j sees seqlen_q / 64 - 2 j query blocks of each head: the work falls with j.
//    Rung 4's order, (batch, kv head)-major, starts the longest blocks of the last heads among the last ones, and
//    the grid's tail is those blocks running alone.
//  - dQ's partial sums are added (atomics at L2) into a float32 accumulator of 4 B x batch x seqlen_q x heads_q x D
//    (134 MB at the decoder block's shape, against the H100's 50 MB of L2): the blocks that add into the same rows,
//    one (batch, kv head)'s, should run together, or each add reads and writes DRAM. The atomics bound this kernel:
//    taken out (a wrong dQ, timed only) the block shape ran in 1.073 ms against 1.315 with them.
// So the grid takes the (batch, kv head)s in groups of p.wave_heads, whose key blocks fill about one wave (the
// launcher: SMs / key blocks, 132 / 16 = 8 at seqlen 2048), and within a group key block 0 of every head first,
// then key block 1, ...: the longest first. At the block shape (8, 2048, 16 query on 4 kv heads, d128, causal; an
// H100): rung 4's order 1.308-1.315 ms; groups of 8 heads 1.121. Bulk reductions (cp.reduce.async.bulk)
// in place of the atomics cost the same (1.125 ms). Every variant, with Nsight Compute's DRAM
// bytes: lesson 08's notes, "block order" (lessons/notes/08-flash-attention.md).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                 const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                                 const Params p) {
#ifdef COURSE_WGMMA
  using Config = HopperBackwardTiles<kHeadDim>;
  constexpr int kBoxes = Config::kBoxes;
  extern __shared__ uint8_t shared_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAtomBytes - 1) &
                         ~static_cast<uintptr_t>(kSwizzleAtomBytes - 1);
  uint8_t* const k_tile = reinterpret_cast<uint8_t*>(base);        // [box][Bc rows][64]
  uint8_t* const v_tile = k_tile + Config::kKvBytes;               // [box][Bc rows][64]
  uint8_t* const q_tiles = v_tile + Config::kKvBytes;              // [stage][box][Br rows][64]
  uint8_t* const do_tiles = q_tiles + kStages * Config::kQBytes;   // [stage][box][Br rows][64]
  uint8_t* const ds_tiles = do_tiles + kStages * Config::kQBytes;  // [buffer][Bc keys][Br queries], swizzled
  float* const lse_rows = reinterpret_cast<float*>(ds_tiles + 2 * Config::kDsBytes);  // [stage][Br]
  float* const delta_rows = lse_rows + kStages * kBlockM;                             // [stage][Br]
  uint64_t* const kv_full = reinterpret_cast<uint64_t*>(delta_rows + kStages * kBlockM);
  uint64_t* const full = kv_full + 1;
  uint64_t* const empty = full + kStages;

  // --8<-- [start:hopper_backward_grid]
  const int64_t key_blocks = course::ceil_div<int64_t>(p.seqlen_k, kBlockN);
  const int64_t first_head = blockIdx.x / (p.wave_heads * key_blocks) * p.wave_heads;  // the group's first
  const int64_t heads_here = min(p.wave_heads, p.batch * p.heads_kv - first_head);     // the last group: fewer
  const int64_t in_group = blockIdx.x - first_head * key_blocks;
  const int64_t batch_head = first_head + in_group % heads_here;
  const int64_t batch = batch_head / p.heads_kv, kv_head = batch_head % p.heads_kv;
  const int64_t key0 = in_group / heads_here * kBlockN;
  // --8<-- [end:hopper_backward_grid]
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const int64_t head0 = kv_head * group;
  // Rung 4's causal skipping: the first query block that sees any key of this block.
  const int query_blocks = static_cast<int>(course::ceil_div<int64_t>(p.seqlen_q, kBlockM));
  const int first_query_block =
      p.causal ? static_cast<int>(max(int64_t{0}, key0 + p.seqlen_q - p.seqlen_k) / kBlockM) : 0;
  const int steps_per_head = query_blocks - first_query_block;  // >= 1: the last query sees every key
  const int steps = group * steps_per_head;

  if (threadIdx.x == 0) {
    hopper::barrier_init(kv_full, 1);
    for (int stage = 0; stage < kStages; ++stage) {
      hopper::barrier_init(&full[stage], 1);
      hopper::barrier_init(&empty[stage], kEmptyArrivals);
    }
    hopper::barrier_init_fence();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (warpgroup == 0) {
    // --8<-- [start:hopper_backward_producer]
    hopper::release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      const int b = static_cast<int>(batch), g = static_cast<int>(kv_head), k0 = static_cast<int>(key0);
      hopper::barrier_arrive_expect_bytes(kv_full, 2 * Config::kKvBytes);
      for (int box = 0; box < kBoxes; ++box) {
        hopper::tma_load_4d(k_tile + box * Config::kKvBoxBytes, &k_map, kv_full, box * kBoxCols, k0, g, b);
        hopper::tma_load_4d(v_tile + box * Config::kKvBoxBytes, &v_map, kv_full, box * kBoxCols, k0, g, b);
      }
      // Step t: head head0 + t / steps_per_head, query block first_query_block + t % steps_per_head, into
      // stage t % kStages in lap t / kStages (the forward's ring: lap 0 passes the fresh empty barrier).
      for (int t = 0; t < steps; ++t) {
        const int stage = t % kStages;
        const uint32_t lap = static_cast<uint32_t>(t / kStages);
        const int head = static_cast<int>(head0) + t / steps_per_head;
        const int query0 = (first_query_block + t % steps_per_head) * kBlockM;
        hopper::barrier_wait(&empty[stage], (lap & 1) ^ 1);
        hopper::barrier_arrive_expect_bytes(&full[stage], Config::kStepBytes);
        for (int box = 0; box < kBoxes; ++box) {
          hopper::tma_load_4d(q_tiles + stage * Config::kQBytes + box * Config::kQBoxBytes, &q_map, &full[stage],
                              box * kBoxCols, query0, head, b);
          hopper::tma_load_4d(do_tiles + stage * Config::kQBytes + box * Config::kQBoxBytes, &do_map, &full[stage],
                              box * kBoxCols, query0, head, b);
        }
        const int64_t row = (batch * p.heads_q + head) * p.rows + query0;  // 64 floats: 256-byte aligned
        hopper::bulk_load(lse_rows + stage * kBlockM, p.lse_log2 + row, Config::kRowBytes, &full[stage]);
        hopper::bulk_load(delta_rows + stage * kBlockM, p.delta + row, Config::kRowBytes, &full[stage]);
      }
    }
    // --8<-- [end:hopper_backward_producer]
    return;
  }

  // --8<-- [start:hopper_backward_consumer]
  hopper::claim_registers<kConsumerRegisters>();
  const int consumer = warpgroup - 1, thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / kWarpSize, lane = thread % kWarpSize;
  const int group_row = lane / 4;       // the thread's first accumulator row in its warp's 16 (second: + 8)
  const int pair_col = 2 * (lane % 4);  // the first of its two accumulator columns in each n8 tile
  const int warp_key = consumer * kWgmmaM + warp * 16;  // the warp's first key in the block
  // dQ's tile of this consumer: head dims dq_col0 .. + 63; over keys dq_key0 .. (D 64: its own 64; D 128: all)
  const int dq_col0 = Config::kDqSplitsKeys ? 0 : consumer * kBoxCols;
  const int dq_key0 = Config::kDqSplitsKeys ? consumer * kWgmmaM : 0;

  // Descriptors. S^T = K Q^T, dP^T = V dO^T (k-step kk: 16 head dims): A = the consumer's 64 rows of K_j or
  // V_j, B = Q_i or dO_i, both K-major: box kk / 4, 32 bytes a step inside the swizzled row.
  const auto kv_rows_descriptor = [&](const uint8_t* tile, int kk) {
    return hopper::tile_descriptor(tile + (kk / 4) * Config::kKvBoxBytes + consumer * kWgmmaM * kSwizzleBytes +
                                   (kk % 4) * kWgmmaK * kElementBytes);
  };
  const auto step_rows_descriptor = [&](const uint8_t* tile, int kk) {
    return hopper::tile_descriptor(tile + (kk / 4) * Config::kQBoxBytes + (kk % 4) * kWgmmaK * kElementBytes);
  };
  // dV += P^T dO, dK += dS^T Q (k-step kk: 16 queries): B = dO_i or Q_i MN-major, 16 rows of 128 B a step,
  // the D / 64 boxes kQBoxBytes apart.
  const auto step_mn_descriptor = [&](const uint8_t* tile, int kk) {
    return hopper::mn_major_descriptor(tile + kk * kWgmmaK * kSwizzleBytes, Config::kQBoxBytes);
  };
  // dQ = dS K (k-step kk: 16 keys from dq_key0): A = dS^T MN-major (a key's 64 queries = one line), B = the
  // box of K_j holding head dims dq_col0 .., MN-major.
  const auto ds_descriptor = [&](const uint8_t* ds, int kk) {
    return hopper::mn_major_descriptor(ds + (dq_key0 + kk * kWgmmaK) * kSwizzleBytes, Config::kDsBytes);
  };
  const auto k_mn_descriptor = [&](int kk) {
    return hopper::mn_major_descriptor(
        k_tile + (dq_col0 / kBoxCols) * Config::kKvBoxBytes + (dq_key0 + kk * kWgmmaK) * kSwizzleBytes,
        Config::kKvBoxBytes);
  };

  float dk[Config::kAccumulatorRegisters], dv[Config::kAccumulatorRegisters];
#pragma unroll
  for (int i = 0; i < Config::kAccumulatorRegisters; ++i) dk[i] = 0.0f, dv[i] = 0.0f;
  const int key_end = static_cast<int>(min(p.seqlen_k - key0, int64_t{kBlockN}));
  float* const accum_base = p.grad_q_accum + batch * p.seqlen_q * p.heads_q * kHeadDim + dq_col0 + pair_col;

  hopper::barrier_wait(kv_full, 0);
#pragma unroll 1
  for (int t = 0, head_in_group = 0, query_block = first_query_block; t < steps; ++t) {
    const int stage = t % kStages;
    const uint32_t parity = static_cast<uint32_t>((t / kStages) & 1);
    const int64_t query0 = int64_t{query_block} * kBlockM;
    const int64_t head = head0 + head_in_group;
    const uint8_t* const q_tile = q_tiles + stage * Config::kQBytes;
    const uint8_t* const do_tile = do_tiles + stage * Config::kQBytes;
    uint8_t* const ds_tile = ds_tiles + (t & 1) * Config::kDsBytes;
    // Rung 4's mask: query (query0 + qr) sees key (key0 + kr) iff kr < key_end, qr < query_end and, causal,
    // kr - qr <= diagonal; only where some pair of the tile is hidden. Uniform over the block.
    const int query_end = static_cast<int>(min(p.seqlen_q - query0, int64_t{kBlockM}));
    const int diagonal =
        p.causal
            ? static_cast<int>(max(min(p.seqlen_k - p.seqlen_q - key0 + query0, int64_t{kBlockN}), int64_t{-kBlockM}))
            : kBlockN;
    const bool masked = key_end < kBlockN || query_end < kBlockM || diagonal < kBlockN - 1;

    hopper::barrier_wait(&full[stage], parity);
    // S^T and dP^T: two groups, the second running while P^T is computed from the first.
    float s[kBlockM / 2], dp[kBlockM / 2];
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kWgmmaK; ++kk) {
      hopper::WgmmaSsN64<T, false>::run(s, kv_rows_descriptor(k_tile, kk), step_rows_descriptor(q_tile, kk), kk > 0);
    }
    hopper::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kWgmmaK; ++kk) {
      hopper::WgmmaSsN64<T, false>::run(dp, kv_rows_descriptor(v_tile, kk), step_rows_descriptor(do_tile, kk), kk > 0);
    }
    hopper::wgmma_commit();

    // P^T = exp2(S^T scale log2(e) - L log2(e)): s[4 n + 2 h + e] is key warp_key + group_row + 8 h, query
    // 8 n + pair_col + e of the step, whose L is a column's: one 8-byte load per n8 tile.
    const float* const lse_row = lse_rows + stage * kBlockM;
    const float* const delta_row = delta_rows + stage * kBlockM;
    hopper::wgmma_wait<1>();
    hopper::settle(s);
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
      const float2 lse2 = *reinterpret_cast<const float2*>(lse_row + 8 * n + pair_col);
#pragma unroll
      for (int r = 0; r < 4; ++r)
        s[4 * n + r] = exp2_approx(fmaf(s[4 * n + r], p.scale_log2, -(r % 2 ? lse2.y : lse2.x)));
    }
    if (masked) {
#pragma unroll
      for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int kr = warp_key + group_row + 8 * (r / 2), qr = 8 * n + pair_col + r % 2;
          if (!(kr < key_end && qr < query_end && kr - qr <= diagonal)) s[4 * n + r] = 0.0f;
        }
      }
    }
    hopper::wgmma_wait<0>();
    hopper::settle(dp);
    // dS^T = P^T (dP^T - D), D a column's.
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
      const float2 row_dot = *reinterpret_cast<const float2*>(delta_row + 8 * n + pair_col);
#pragma unroll
      for (int r = 0; r < 4; ++r) dp[4 * n + r] = s[4 * n + r] * (dp[4 * n + r] - (r % 2 ? row_dot.y : row_dot.x));
    }
    // As A operands (the forward's pack_probabilities): k-step kk = queries 16 kk .. 16 kk + 15 = n8 tiles 2 kk, 2 kk
    // + 1.
    uint32_t prob[kBlockM / 16][4], grad_s[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        prob[kk][r] = pack_pair<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        grad_s[kk][r] = pack_pair<T>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
      }
    }
    // dS^T to shared memory in the layout TMA's 128-byte swizzle would give it: key row r at r x 128 B, its
    // 16-byte chunk c (queries 8c ..) at chunk c ^ (r % 8). grad_s[kk][i] holds key row warp_key + group_row +
    // 8 (i % 2), queries 16 kk + 8 (i / 2) + pair_col, + 1: for one i the warp's 32 lanes write 8 rows x 16 B,
    // which the XOR spreads over all 32 banks.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = warp_key + group_row + 8 * (i % 2), chunk = 2 * kk + i / 2;
        *reinterpret_cast<uint32_t*>(ds_tile + row * kSwizzleBytes + ((chunk ^ group_row) * kChunkBytes) +
                                     (lane % 4) * 4) = grad_s[kk][i];
      }
    }
    // Written by ordinary stores, read by wgmma (the async proxy): each writer fences. (The stores come before
    // the dV, dK products, which read grad_s: the PTX ISA makes any access to an in-flight wgmma's A registers
    // undefined.)
    hopper::fence_shared_for_tma();
    // dV += P^T dO_i, dK += dS^T Q_i: one group.
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / kWgmmaK; ++kk) {
      hopper::WgmmaRs<T, kHeadDim>::run(dv, prob[kk], step_mn_descriptor(do_tile, kk));
    }
#pragma unroll
    for (int kk = 0; kk < kBlockM / kWgmmaK; ++kk) {
      hopper::WgmmaRs<T, kHeadDim>::run(dk, grad_s[kk], step_mn_descriptor(q_tile, kk));
    }
    hopper::wgmma_commit();

    // The barrier that hands dS^T over (D 128: both consumers read each other's rows; D 64: each reads its own
    // warps' rows), while dV and dK run.
    if constexpr (Config::kDqSplitsKeys) {
      hopper::warpgroup_barrier(kWarpgroupBarrier0 + consumer, kWarpgroupThreads);
    } else {
      hopper::warpgroup_barrier(kConsumersBarrier, kConsumers * kWarpgroupThreads);
    }
    // dQ_i (+)= dS K_j.
    float dq[32];
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Config::kDqSteps; ++kk) {
      hopper::WgmmaSsN64<T, true>::run(dq, ds_descriptor(ds_tile, kk), k_mn_descriptor(kk), kk > 0);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::settle(dq);
    hopper::settle(dv);
    hopper::settle(dk);
    hopper::keep_until_here(prob);
    hopper::keep_until_here(grad_s);
    hopper::barrier_arrive(&empty[stage]);  // this thread's products have read Q_i, dO_i, its loads L and D

    // dq[4 n + 2 h + e]: query warp * 16 + group_row + 8 h of the step, head dim dq_col0 + 8 n + pair_col + e.
    const int64_t row_stride = p.heads_q * kHeadDim;
    float* const accum = accum_base + query0 * row_stride + head * kHeadDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int query = warp * 16 + group_row + 8 * h;
      if (query >= query_end) continue;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        atomic_add_pair(accum + query * row_stride + 8 * n, dq[4 * n + 2 * h], dq[4 * n + 2 * h + 1]);
      }
    }
    if (++query_block == query_blocks) query_block = first_query_block, ++head_in_group;
  }
  // --8<-- [end:hopper_backward_consumer]

  // dK_j = scale * sum dS^T Q, dV_j = sum P^T dO: rounded once, written once, keys past seqlen_k not.
  T* const grad_k = static_cast<T*>(p.grad_k);
  T* const grad_v = static_cast<T*>(p.grad_v);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = warp_key + group_row + 8 * h;
    if (key >= key_end) continue;
    const int64_t offset = ((batch * p.seqlen_k + key0 + key) * p.heads_kv + kv_head) * kHeadDim + pair_col;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      store_pair(grad_k + offset + 8 * n, p.scale * dk[4 * n + 2 * h], p.scale * dk[4 * n + 2 * h + 1]);
      store_pair(grad_v + offset + 8 * n, dv[4 * n + 2 * h], dv[4 * n + 2 * h + 1]);
    }
  }
#else
  __trap();  // not built for sm_90a: the launcher refuses before launching
#endif
}
// --8<-- [end:hopper_backward_kernel]

template <typename T, int kHeadDim>
void launch_typed(const AttentionBackwardParams& params, float* lse_log2, cudaStream_t stream) {
  using Config = HopperBackwardTiles<kHeadDim>;
  const AttentionParams& forward = params.forward;
  const ElementType type = std::is_same_v<T, __half> ? ElementType::kFloat16 : ElementType::kBFloat16;
  const int multiprocessors = course::device_attribute(cudaDevAttrMultiProcessorCount);
  constexpr int64_t kBlocksPerSm = 8;
  const int64_t rows = forward.batch * forward.seqlen_q * forward.heads_q;
  const int64_t padded = padded_rows(forward.seqlen_q);

  // 1. D and L log2(e) into the padded rows; the accumulator zeroed.
  constexpr int64_t kRowsPerBlock = kPreprocessThreads / (kHeadDim / course::kElemsPerVector<T>);
  const int64_t preprocess_blocks =
      std::min(course::ceil_div<int64_t>(rows, kRowsPerBlock), kBlocksPerSm * multiprocessors);
  hopper_preprocess_kernel<T, kHeadDim><<<static_cast<unsigned>(preprocess_blocks), kPreprocessThreads, 0, stream>>>(
      static_cast<const T*>(params.grad_o), static_cast<const T*>(forward.o), forward.lse, lse_log2, params.delta,
      params.grad_q_accum, rows, forward.seqlen_q, forward.heads_q, padded);
  COURSE_CHECK_LAUNCH();

  // 2. The main kernel: tensor maps of q, k, v (their strides) and of grad_o (contiguous).
  const auto kernel = flash_backward_hopper_kernel<T, kHeadDim>;
  course::opt_in_dynamic_shared(kernel, Config::kSharedBytes, "flash_backward (Hopper path)");
  const Strides grad_o_strides{forward.seqlen_q * forward.heads_q * kHeadDim, forward.heads_q * kHeadDim, kHeadDim};
  CUtensorMap maps[4];
  const struct {
    const void* data;
    Strides strides;
    int64_t seqlen, heads;
    int box_rows;
    const char* name;
  } views[4] = {{forward.q, forward.q_strides, forward.seqlen_q, forward.heads_q, kBlockM, "q"},
                {forward.k, forward.k_strides, forward.seqlen_k, forward.heads_kv, kBlockN, "k"},
                {forward.v, forward.v_strides, forward.seqlen_k, forward.heads_kv, kBlockN, "v"},
                {params.grad_o, grad_o_strides, forward.seqlen_q, forward.heads_q, kBlockM, "grad_o"}};
  for (int i = 0; i < 4; ++i) {
    const CUresult status =
        flash_forward_hopper_impl::encode_view(&maps[i], type, views[i].data, views[i].strides, forward.batch,
                                               views[i].seqlen, views[i].heads, kHeadDim, views[i].box_rows);
    if (status != CUDA_SUCCESS) {
      throw std::runtime_error(std::string("flash_backward (Hopper path): cuTensorMapEncodeTiled refused ") +
                               views[i].name + " (CUresult " + std::to_string(static_cast<int>(status)) +
                               "); path='portable' runs rung 4 instead");
    }
  }
  Params p{};
  p.lse_log2 = lse_log2;
  p.delta = params.delta;
  p.grad_q_accum = params.grad_q_accum;
  p.grad_k = params.grad_k;
  p.grad_v = params.grad_v;
  p.batch = forward.batch;
  p.seqlen_q = forward.seqlen_q;
  p.seqlen_k = forward.seqlen_k;
  p.heads_q = forward.heads_q;
  p.heads_kv = forward.heads_kv;
  p.rows = padded;
  p.scale = forward.scale;
  p.scale_log2 = forward.scale * kLog2e;
  p.causal = forward.causal;
  const int64_t key_blocks = course::ceil_div<int64_t>(forward.seqlen_k, kBlockN);
  p.wave_heads = std::max<int64_t>(1, multiprocessors / key_blocks);  // the kernel's block order
  const int64_t blocks = key_blocks * forward.batch * forward.heads_kv;
  if (blocks > std::numeric_limits<int>::max()) throw std::runtime_error("flash_backward: too many key blocks");
  kernel<<<static_cast<unsigned>(blocks), kThreads, Config::kSharedBytes, stream>>>(maps[0], maps[1], maps[2], maps[3],
                                                                                    p);
  COURSE_CHECK_LAUNCH();

  // 3. grad_q = scale * accumulator.
  const int64_t vectors = rows * kHeadDim / course::kElemsPerVector<T>;
  const int64_t convert_blocks =
      std::min(course::ceil_div<int64_t>(vectors, kConvertThreads), kBlocksPerSm * multiprocessors);
  hopper_convert_kernel<T><<<static_cast<unsigned>(convert_blocks), kConvertThreads, 0, stream>>>(
      params.grad_q_accum, static_cast<T*>(params.grad_q), vectors, forward.scale);
  COURSE_CHECK_LAUNCH();
}

bool built_for_hopper() {
  static course::PerDeviceCache loaded;
  return course::sm90a_image_loaded(
      loaded, [](int* out) { return cudaMemcpyFromSymbol(out, backward_built_with_wgmma, sizeof(int)); });
}

}  // namespace flash_backward_hopper_impl

using namespace flash_backward_hopper_impl;

int64_t flash_backward_hopper_rows(int64_t seqlen_q) { return padded_rows(seqlen_q); }

std::string flash_backward_hopper_refusal(ElementType type, const AttentionBackwardParams& params) {
  const AttentionParams& f = params.forward;
  if (params.deterministic) return "deterministic=True (dQ's second pass) runs on the portable kernel only";
  if (type != ElementType::kFloat16 && type != ElementType::kBFloat16) return "float16 or bfloat16 only";
  if (f.head_dim != kHeadDimSmall && f.head_dim != kHeadDimLarge) return "head_dim 64 or 128 only";
  if (f.seqlen_k == 0 || f.seqlen_q == 0 || f.batch == 0 || f.heads_q == 0) {
    return "an empty tensor (a tensor map cannot describe one)";
  }
  using flash_forward_hopper_impl::view_qualifies;
  if (!view_qualifies(f.q, f.q_strides, f.batch, f.seqlen_q, f.heads_q)) {
    return "q is not 16-byte aligned with strides that are multiples of 16 bytes (TMA's rule)";
  }
  if (!view_qualifies(f.k, f.k_strides, f.batch, f.seqlen_k, f.heads_kv)) {
    return "k is not 16-byte aligned with strides that are multiples of 16 bytes (TMA's rule)";
  }
  if (!view_qualifies(f.v, f.v_strides, f.batch, f.seqlen_k, f.heads_kv)) {
    return "v is not 16-byte aligned with strides that are multiples of 16 bytes (TMA's rule)";
  }
  const Strides grad_o_strides{f.seqlen_q * f.heads_q * f.head_dim, f.heads_q * f.head_dim, f.head_dim};
  if (!view_qualifies(params.grad_o, grad_o_strides, f.batch, f.seqlen_q, f.heads_q)) {
    return "grad_o is not 16-byte aligned";
  }
  if (!built_for_hopper()) {
    return "needs a Hopper GPU (compute capability 9.0) and a build for sm_90a (TORCH_CUDA_ARCH_LIST=9.0a)";
  }
  return "";
}

FlashBackwardHopperTiles flash_backward_hopper_tiles(int head_dim) {
  switch (head_dim) {
    case kHeadDimSmall:
      return {kBlockM, kBlockN, kThreads / kWarpSize, kStages, HopperBackwardTiles<kHeadDimSmall>::kSharedBytes};
    case kHeadDimLarge:
      return {kBlockM, kBlockN, kThreads / kWarpSize, kStages, HopperBackwardTiles<kHeadDimLarge>::kSharedBytes};
    default: throw std::invalid_argument("flash_backward (Hopper path): head_dim must be 64 or 128");
  }
}

void launch_flash_backward_hopper(ElementType type, const AttentionBackwardParams& params, float* lse_log2,
                                  cudaStream_t stream) {
  const std::string refusal = flash_backward_hopper_refusal(type, params);
  if (!refusal.empty()) throw std::invalid_argument("flash_backward (Hopper path): " + refusal);
  const AttentionParams& forward = params.forward;
  if (!(forward.scale > 0.0f) || !std::isfinite(forward.scale)) {
    throw std::invalid_argument("flash_backward (Hopper path): scale must be positive and finite");
  }
  if (forward.heads_kv <= 0 || forward.heads_q % forward.heads_kv != 0) {
    throw std::invalid_argument("flash_backward (Hopper path): heads_q must be a multiple of heads_kv");
  }
  const void* const vectorized[] = {params.grad_o,       forward.o,    params.grad_q,
                                    params.grad_q_accum, params.delta, lse_log2};
  for (const void* pointer : vectorized) {
    if (pointer == nullptr || reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      throw std::invalid_argument(
          "flash_backward (Hopper path): grad_o, o, grad_q and the workspaces must be 16-byte aligned");
    }
  }
  const bool half = type == ElementType::kFloat16;
  if (forward.head_dim == kHeadDimSmall) {
    half ? launch_typed<__half, kHeadDimSmall>(params, lse_log2, stream)
         : launch_typed<__nv_bfloat16, kHeadDimSmall>(params, lse_log2, stream);
  } else {
    half ? launch_typed<__half, kHeadDimLarge>(params, lse_log2, stream)
         : launch_typed<__nv_bfloat16, kHeadDimLarge>(params, lse_log2, stream);
  }
}

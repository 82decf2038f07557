// Lab 05: out = act(x @ weight^T + bias) on tensor cores, in one kernel.
// Data path: global -> shared (cp.async, a ring of kStages tiles) -> registers (ldmatrix)
// -> tensor cores (mma.sync, fp32 accumulators in registers) -> bias + activation -> global,
// each output element written once.
#include <course/cuda.cuh>

#include <stdexcept>
#include <string>

#include "mma.cuh"
#include "tensor_cores.h"

// --8<-- [start:tiles]
// Block tile 128 x 128 (rows of x by rows of weight), k-slice 32, 4 warps each owning 64 x 64.
//  - Reuse: per k-slice a block fetches (128 + 128) rows * 64 B = 16 KB and does
//    2 * 128 * 128 * 32 = 1 MFLOP: 64 FLOP per byte from L2/DRAM. At 4096^3 the whole problem
//    reads 2 * 32 MB * 4096 / 128 = 2 GB through L2: ~0.2 ms at ~10 TB/s, about the time of
//    the math at 700 TFLOP/s. The grouped block order below keeps most of it out of DRAM.
//  - Warp tile 64 x 64 = 4 x 8 mma tiles of 16 x 8: per k-step of 16, 4 ldmatrix.x4 for x and 4
//    for weight (8 * 512 B = 4 KB of shared-memory reads) feed 32 mma (131 kFLOP): 32 FLOP per
//    byte. Shared memory delivers 128 B/clock/SM, enough for 4096 FLOP/clock/SM, above what
//    mma.sync issues; a 64 x 32 warp tile (21 FLOP/B) would be bound by shared memory first.
//  - Registers: 4 * 8 * 4 = 128 fp32 accumulators + 16 + 16 fragment registers per thread,
//    under the 255 a thread can have (ptxas: 240 for bf16, nvcc 13.0, sm_90a). kMinBlocksPerSm is
//    __launch_bounds__'s *minimum* of resident blocks: it caps ptxas's budget at
//    65536 / (128 * kMinBlocksPerSm) registers a thread, and limits nothing at run time. At 240
//    registers (128 * 240 = 30720 of an SM's 65536 a block) and 64 KB of shared memory, 2 blocks fit
//    an H100/H200 SM with 1 or 2 here (linear_act_residency below asks the runtime). On an H200,
//    kMinBlocksPerSm = 2 (ptxas: 236 registers, the same instruction counts scheduled differently)
//    ran 0.42-0.43x cuBLAS and 1 ran 0.47x: a difference of code generation, not of occupancy.
//  - Shared memory: (128 + 128) rows * 64 B = 16 KB per stage; 4 stages = 64 KB per block
//    (A100 has 164 KB per SM, H100 228 KB). On sm_75 (no cp.async, 64 KB per SM) 2 stages: 32 KB.
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 32;
constexpr int kWarpM = 64, kWarpN = 64;
constexpr int kWarpsM = kBlockM / kWarpM, kWarpsN = kBlockN / kWarpN;
constexpr int kThreads = kWarpsM * kWarpsN * kWarpSize;
constexpr int kMinBlocksPerSm = 1;
constexpr int kTilesM = kWarpM / kMmaM, kTilesN = kWarpN / kMmaN;  // mma tiles per warp: 4 x 8
constexpr int kStagesAsync = 4, kStagesSync = 2;
constexpr int kChunksPerRow = kBlockK / kElementsPerChunk;  // 16-byte chunks per tile row
static_assert(kBlockK % kMmaK == 0 && kWarpM % kMmaM == 0 && kWarpN % (2 * kMmaN) == 0,
              "whole mma tiles per warp; weight fragments come two n8 tiles per ldmatrix.x4");
constexpr int kRegistersPerSm = 65536, kAccumulatorRegisters = kTilesM * kTilesN * 4;
static_assert(kRegistersPerSm / (kThreads * kMinBlocksPerSm) >= kAccumulatorRegisters + 64,
              "room for the accumulators plus fragments and addresses at kMinBlocksPerSm blocks per SM");
// Grouped block order (grouped_tile): 8 tile-rows of x, 8 * 128 rows * K * 2 B = 8 MB at K = 4096,
// and the weight tiles they meet stay in L2 (50 MB on an H100).
constexpr int kGroupM = 8;

constexpr int shared_bytes_for(int stages) { return stages * (kBlockM + kBlockN) * kBlockK * 2; }
static_assert(shared_bytes_for(kStagesAsync) <= 227 * 1024 / kMinBlocksPerSm, "H100's per-SM shared memory");
static_assert(shared_bytes_for(kStagesSync) <= 64 * 1024, "sm_75 shared memory");
// --8<-- [end:tiles]

// Copy rows [first_row, first_row + Rows) x k [k_begin, k_begin + kBlockK) of a row-major
// [row_count, K] matrix into a swizzled tile. Thread t copies chunk column t % kChunksPerRow of
// rows t / kChunksPerRow + i * kRowsPerPass: 4 consecutive threads read one 64-byte row segment
// (2 full 32-byte sectors), and 8 consecutive threads store two whole tile rows, 8 different
// bank groups. A thread's chunks are kRowsPerPass rows apart, a whole number of swizzle
// periods, so one source pointer and one swizzled offset serve them all: the address
// arithmetic per k-slice is an add, not a 64-bit multiply per chunk.
constexpr int kRowsPerPass = kThreads / kChunksPerRow;
static_assert(kRowsPerPass % (kBankLineChunks / kChunksPerRow * kChunksPerRow) == 0,
              "rows kRowsPerPass apart get the same XOR in swizzled_chunk");
template <int Rows, typename T>
__device__ void load_tile(uint4* tile, const T* matrix, int64_t row_count, int64_t first_row, int64_t K,
                          int64_t k_begin) {
  static_assert(Rows % kRowsPerPass == 0, "every thread copies the same number of chunks");
  const int row = static_cast<int>(threadIdx.x) / kChunksPerRow, chunk = static_cast<int>(threadIdx.x) % kChunksPerRow;
  const int64_t global_k = k_begin + chunk * kElementsPerChunk;
  const bool k_inside = global_k < K;  // K % 8 == 0: a chunk is all in or all out
  const T* source = matrix + (first_row + row) * K + global_k;
  uint4* const destination = tile + swizzled_chunk<kChunksPerRow>(row, chunk);
#pragma unroll
  for (int i = 0; i < Rows / kRowsPerPass; ++i) {
    const bool valid = k_inside && first_row + row + i * kRowsPerPass < row_count;
    copy_chunk_async(destination + i * kRowsPerPass * kChunksPerRow, valid ? source + i * kRowsPerPass * K : matrix,
                     valid);
  }
}

template <typename T, int kStages>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    linear_act_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                      T* __restrict__ out, int64_t M, int64_t N, int64_t K, Activation activation) {
  // kStages x tiles of x, then kStages weight tiles; 16-byte chunks, so every ldmatrix row is aligned.
  extern __shared__ uint4 shared_chunks[];
  constexpr int kTileAChunks = kBlockM * kChunksPerRow, kTileBChunks = kBlockN * kChunksPerRow;
  uint4* const tiles_a = shared_chunks;
  uint4* const tiles_b = shared_chunks + kStages * kTileAChunks;

  const TileIndex tile =
      grouped_tile(blockIdx.x, course::ceil_div<int64_t>(M, kBlockM), course::ceil_div<int64_t>(N, kBlockN), kGroupM);
  const int64_t block_row = tile.row * kBlockM, block_col = tile.col * kBlockN;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warp_row = (warp / kWarpsN) * kWarpM, warp_col = (warp % kWarpsN) * kWarpN;

  float accumulators[kTilesM][kTilesN][4] = {};

  // --8<-- [start:pipeline]
  // The ring: tile kt lives in stage kt % kStages. Before the loop, kStages - 1 tiles are in
  // flight; each iteration waits for the oldest, then refills the stage freed by the previous
  // iteration, so loads run kStages - 1 slices ahead of the tensor cores.
  const int k_tiles = static_cast<int>(course::ceil_div<int64_t>(K, kBlockK));
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < k_tiles) {
      load_tile<kBlockM>(tiles_a + stage * kTileAChunks, x, M, block_row, K, stage * kBlockK);
      load_tile<kBlockN>(tiles_b + stage * kTileBChunks, weight, N, block_col, K, stage * kBlockK);
    }
    commit_copies();  // one group per tile, empty or not, so "groups in flight" counts tiles
  }

  int read_stage = 0, write_stage = kStages - 1;  // stages of tile kt and of tile kt + kStages - 1
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Tile kt is this thread's group number kt: at most kStages - 2 younger ones may be pending.
    wait_copies<kStages - 2>();
    // Everyone's copies of tile kt have landed, and everyone has finished reading tile kt - 1,
    // whose stage the next load overwrites.
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      load_tile<kBlockM>(tiles_a + write_stage * kTileAChunks, x, M, block_row, K, int64_t{next} * kBlockK);
      load_tile<kBlockN>(tiles_b + write_stage * kTileBChunks, weight, N, block_col, K, int64_t{next} * kBlockK);
    }
    commit_copies();

    const uint4* tile_a = tiles_a + read_stage * kTileAChunks;
    const uint4* tile_b = tiles_b + read_stage * kTileBChunks;
    read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
    // --8<-- [end:pipeline]
    // --8<-- [start:main_loop]
#pragma unroll
    for (int k_step = 0; k_step < kBlockK / kMmaK; ++k_step) {
      // SOLUTION BEGIN lab05.2: one k-step of 16: ldmatrix.x4 the kTilesM fragments of x (rows warp_row + 16 i) and the
      //   kTilesN fragments of weight (two n8 tiles per ldmatrix.x4, rows warp_col + 16 j), addressing each lane's row
      //   with ldmatrix_a_source / ldmatrix_b_source and swizzled_chunk; then mma_16816 every (i, j) pair into
      //   accumulators[i][j]
      const int chunk_of_step = k_step * (kMmaK / kElementsPerChunk);
      const Position a_source = ldmatrix_a_source(lane), b_source = ldmatrix_b_source(lane);
      uint32_t a_fragments[kTilesM][4];
      uint32_t b_fragments[kTilesN][2];
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        const int row = warp_row + i * kMmaM + a_source.row;
        ldmatrix_x4(a_fragments[i],
                    tile_a + swizzled_chunk<kChunksPerRow>(row, chunk_of_step + a_source.col / kElementsPerChunk));
      }
#pragma unroll
      for (int j = 0; j < kTilesN; j += 2) {
        const int row = warp_col + j * kMmaN + b_source.row;
        uint32_t pair[4];
        ldmatrix_x4(pair,
                    tile_b + swizzled_chunk<kChunksPerRow>(row, chunk_of_step + b_source.col / kElementsPerChunk));
        b_fragments[j][0] = pair[0], b_fragments[j][1] = pair[1];
        b_fragments[j + 1][0] = pair[2], b_fragments[j + 1][1] = pair[3];
      }
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) mma_16816<T>(accumulators[i][j], a_fragments[i], b_fragments[j]);
      }
      // SOLUTION END
    }
    // --8<-- [end:main_loop]
  }

  // --8<-- [start:epilogue]
  // Straight from the accumulator registers: each lane owns pairs of adjacent columns, so a
  // pair is one 4-byte store; bias is read once per column pair, the output written once.
  // SOLUTION BEGIN lab05.3: for every accumulator pair (registers 0,1 and 2,3 of accumulators[i][j]), find its row and
  //   column with accumulator_position (offset by block_row + warp_row + 16 i and block_col + warp_col + 8 j), skip it
  //   outside [M, N), add bias[column] to each value, apply activate(..., activation) and store_pair it to out[row * N
  //   + column]
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) {
    const int64_t col = block_col + warp_col + j * kMmaN + accumulator_position(lane, 0).col;
    if (col >= N) continue;  // N % 8 == 0: both columns of the pair are in, or both out
    const float bias_first = to_float(bias[col]), bias_second = to_float(bias[col + 1]);
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = block_row + warp_row + i * kMmaM + accumulator_position(lane, 2 * half).row;
        if (row >= M) continue;
        store_pair(out + row * N + col, activate(accumulators[i][j][2 * half] + bias_first, activation),
                   activate(accumulators[i][j][2 * half + 1] + bias_second, activation));
      }
    }
  }
  // SOLUTION END
  // --8<-- [end:epilogue]
}

TileConfig tile_config(int capability_major) {
  const int stages = capability_major >= 8 ? kStagesAsync : kStagesSync;
  return {kBlockM, kBlockN, kBlockK, stages, kThreads, shared_bytes_for(stages), kChunksPerRow};
}

template <typename T, int kStages>
static void launch_typed(const void* x, const void* weight, const void* bias, void* out, int64_t M, int64_t N,
                         int64_t K, Activation activation, cudaStream_t stream) {
  const auto kernel = linear_act_kernel<T, kStages>;
  constexpr int shared_bytes = shared_bytes_for(kStages);
  // Above 48 KB of dynamic shared memory a kernel must opt in.
  COURSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  const int64_t blocks = course::ceil_div<int64_t>(M, kBlockM) * course::ceil_div<int64_t>(N, kBlockN);
  if (blocks > 0x7fffffff) throw std::runtime_error("linear_act: too many output tiles for one grid");
  kernel<<<static_cast<unsigned>(blocks), kThreads, shared_bytes, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(out), M, N,
      K, activation);
  COURSE_CHECK_LAUNCH();
}

void launch_linear_act(ElementType type, const void* x, const void* weight, const void* bias, void* out, int64_t M,
                       int64_t N, int64_t K, Activation activation, cudaStream_t stream) {
  if (M == 0 || N == 0) return;  // nothing to write; K == 0 still writes act(bias)
  const bool async_copies = course::device_attribute(cudaDevAttrComputeCapabilityMajor) >= 8;
  if (type == ElementType::kBFloat16) {
    if (!async_copies) throw std::runtime_error("linear_act: bfloat16 tensor cores need compute capability 8.0+");
    launch_typed<__nv_bfloat16, kStagesAsync>(x, weight, bias, out, M, N, K, activation, stream);
  } else if (async_copies) {
    launch_typed<__half, kStagesAsync>(x, weight, bias, out, M, N, K, activation, stream);
  } else {
    launch_typed<__half, kStagesSync>(x, weight, bias, out, M, N, K, activation, stream);
  }
}

// Residency as the CUDA runtime computes it (not a task; the lesson's section 5 and the notebook quote it).
// __launch_bounds__'s second argument is a minimum that caps ptxas's register budget, not a limit on
// blocks per SM: the blocks that fit are set by the registers ptxas chose and the shared memory each
// stage count takes, so they are asked of the runtime here for the bf16 kernel at 4 (the one the
// launcher runs on sm_80+), 6 and 8 stages. registers_only_blocks_per_sm is the same question with no
// dynamic shared memory: the registers' (and threads') limit alone.
template <int kStages>
static KernelResidency residency_of() {
  const auto kernel = linear_act_kernel<__nv_bfloat16, kStages>;
  constexpr int shared_bytes = shared_bytes_for(kStages);
  KernelResidency r{kStages, kThreads, 0, 0, shared_bytes, 0, 0, 0};
  cudaFuncAttributes attributes{};
  COURSE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  r.registers = attributes.numRegs;
  r.static_shared_bytes = static_cast<int>(attributes.sharedSizeBytes);
  r.local_bytes = static_cast<int>(attributes.localSizeBytes);
  COURSE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.registers_only_blocks_per_sm, kernel, kThreads, 0));
  // More than the GPU lets one block opt in to: the kernel cannot launch at this stage count (sm_75: 64 KB).
  if (shared_bytes > course::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) return r;
  COURSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  COURSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, kernel, kThreads, shared_bytes));
  return r;
}

KernelResidency linear_act_residency(int stages) {
  switch (stages) {
    case 4: return residency_of<4>();
    case 6: return residency_of<6>();
    case 8: return residency_of<8>();
    default:
      throw std::runtime_error("linear_act_residency: stages must be 4, 6 or 8 (the instantiated ones), got " +
                               std::to_string(stages));
  }
}

Position accumulator_position_host(int lane, int register_index) { return accumulator_position(lane, register_index); }
Position ldmatrix_a_source_host(int lane) { return ldmatrix_a_source(lane); }
Position ldmatrix_b_source_host(int lane) { return ldmatrix_b_source(lane); }
int swizzled_chunk_host(int row, int chunk) { return swizzled_chunk<kChunksPerRow>(row, chunk); }

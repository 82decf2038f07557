// Lab skeleton generated from solutions/05-tensor-cores/linear_act_wgmma.cu by `./course labs` [lab-hash 6997a875cb8c].
// Students: fill in the TODO(lab05.k) blocks, then run `./course grade 05`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 05, the reference's Hopper path (section 10): the same out = act(x @ weight^T + bias),
// with Hopper's own data path instead of mma.sync. Not a lab task: read it after yours passes.
//  - TMA: one thread copies a whole swizzled tile global -> shared; the edges arrive as zeros.
//  - wgmma: a warpgroup (4 warps) multiplies 64 x 256 x 16 straight out of shared memory.
//  - Warp specialization: warpgroup 0 only issues copies, warpgroups 1 and 2 only multiply;
//    mbarriers hand each stage of the ring from one side to the other.
//  - Persistent: one block per SM walks the output tiles, so the copies of the next tile start
//    while the consumers are still writing the last one.
//  - The epilogue rounds into shared memory and TMA writes it out, asynchronously: the
//    consumers go back to multiplying while the results stream to global memory.
// Built only by nvcc's sm_90a pass (TORCH_CUDA_ARCH_LIST=9.0a); wgmma_available() says whether
// this process has it. The epilogue is the mma.sync kernel's: bias, activate(), one rounding.
#include <course/cuda.cuh>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled: the driver call that builds a CUtensorMap

#include <stdexcept>
#include <string>

#include <course/wgmma.cuh>

#include "mma.cuh"
#include "tensor_cores.h"

namespace {

// --8<-- [start:hopper_tiles]
// Block tile 128 x 256, k-slice 64, 4 stages; three warpgroups: one producer, two consumers.
//  - wgmma's largest shape is m64 n256 k16; each consumer owns 64 rows x all 256 columns, so a
//    k-step is one instruction per consumer that reads 64 x 16 of x and 256 x 16 of weight.
//  - k-slice 64: 64 two-byte elements = 128 B, one line of TMA's 128-byte swizzle, the widest;
//    wgmma reads swizzled tiles without bank conflicts by construction.
//  - Per stage (128 + 256) rows * 128 B = 48 KB; 4 stages = 192 KB of the 227 KB an SM has:
//    three k-slices in flight while the tensor cores work on the fourth.
//  - Reuse: 2 * 128 * 256 * 64 FLOP per 48 KB = 85 FLOP per byte from L2, against 64 for the
//    mma.sync kernel's 128 x 128 tile.
//  - Registers: 384 threads get 65536 / 384 = 170 each at launch; the producer hands back all
//    but 40 and the consumers take 232: 64 x 256 fp32 accumulators / 128 threads = 128 each.
constexpr int kWgmmaM = 64, kWgmmaN = 256, kWgmmaK = 16;
constexpr int kConsumers = 2, kWarpgroupThreads = 128;
constexpr int kThreadsHopper = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kBlockMHopper = kConsumers * kWgmmaM, kBlockNHopper = kWgmmaN, kBlockKHopper = 64;
constexpr int kStagesHopper = 4;
constexpr int kElementBytes = 2;
constexpr int kSwizzleBytes = 128;  // CU_TENSOR_MAP_SWIZZLE_128B
static_assert(kBlockKHopper * kElementBytes == kSwizzleBytes, "one k-slice row is one 128-byte swizzle line");
constexpr int kTileABytes = kBlockMHopper * kBlockKHopper * kElementBytes;  // 16 KB
constexpr int kTileBBytes = kBlockNHopper * kBlockKHopper * kElementBytes;  // 32 KB
constexpr int kStageBytes = kTileABytes + kTileBBytes;
// 128-byte-swizzled tiles start on 1024-byte boundaries (the swizzle repeats every 8 rows of
// 128 B); dynamic shared memory only promises 16, so the kernel rounds its base up.
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;
static_assert(kTileABytes % kSwizzleAtomBytes == 0 && kTileBBytes % kSwizzleAtomBytes == 0, "tiles stay aligned");
constexpr int kBarrierBytes = 2 * kStagesHopper * 8;  // a "full" and an "empty" mbarrier per stage
// Epilogue staging: a consumer's 64 x 256 results leave in two passes of 128 columns, each two
// TMA boxes of 64 x 64 (128-byte rows, swizzled like the input tiles, so the 8 rows a warp
// writes at once land in 8 different bank groups). Whole 64 x 256 buffers would not fit next to
// 4 stages; halves do: 16 KB per consumer.
constexpr int kStoreBoxCols = kSwizzleBytes / kElementBytes, kStoreBoxRows = kWgmmaM;  // 64 x 64
constexpr int kStoreBoxBytes = kStoreBoxCols * kStoreBoxRows * kElementBytes;
constexpr int kStorePasses = 2, kStoreBoxesPerPass = kWgmmaN / kStoreBoxCols / kStorePasses;
constexpr int kStagingBytes = kStoreBoxesPerPass * kStoreBoxBytes;
constexpr int kSharedBytesHopper =
    kSwizzleAtomBytes + kStagesHopper * kStageBytes + kConsumers * kStagingBytes + kBarrierBytes;
static_assert(kSharedBytesHopper <= 227 * 1024, "H100/H200: 227 KB of shared memory per block");
constexpr int kAccumulatorsPerThread = kWgmmaM * kWgmmaN / kWarpgroupThreads;
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536,
              "the register file after the hand-over");
static_assert(kConsumerRegisters >= kAccumulatorsPerThread + 64, "accumulators plus addresses and the epilogue");
// Each consumer warp frees a stage once its wgmma have read it: 4 warps per consumer arrive.
constexpr int kEmptyArrivals = kConsumers * kWarpgroupThreads / kWarpSize;
constexpr int kGroupMHopper = 8;  // grouped_tile: 8 x 128 rows of x and the weight tiles they meet stay in L2
// --8<-- [end:hopper_tiles]

COURSE_SM90A_IMAGE_FLAG(built_with_wgmma);

template <typename T>
__global__ void __launch_bounds__(kThreadsHopper, 1)
    linear_act_wgmma_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap weight_map,
                            const __grid_constant__ CUtensorMap out_map, const T* __restrict__ bias, int64_t M,
                            int64_t N, int64_t K, Activation activation) {
#ifdef COURSE_WGMMA
  extern __shared__ uint8_t shared_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAtomBytes - 1) &
                         ~static_cast<uintptr_t>(kSwizzleAtomBytes - 1);
  uint8_t* const tiles_a = reinterpret_cast<uint8_t*>(base);       // [stage][128 rows][64 k]
  uint8_t* const tiles_b = tiles_a + kStagesHopper * kTileABytes;  // [stage][256 rows][64 k]
  uint8_t* const staging = tiles_b + kStagesHopper * kTileBBytes;  // [consumer][2 boxes][64 rows][64 cols]
  uint64_t* const full = reinterpret_cast<uint64_t*>(staging + kConsumers * kStagingBytes);  // copies landed
  uint64_t* const empty = full + kStagesHopper;                                              // reads done

  const int warpgroup = threadIdx.x / kWarpgroupThreads, thread = threadIdx.x % kWarpgroupThreads;
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStagesHopper; ++stage) {
      hopper::barrier_init(&full[stage], 1);  // the producer's expect_bytes arrival (+ the bytes)
      hopper::barrier_init(&empty[stage], kEmptyArrivals);
    }
    hopper::barrier_init_fence();
  }
  __syncthreads();

  const int64_t tiles_m = course::ceil_div<int64_t>(M, kBlockMHopper);
  const int64_t tiles_n = course::ceil_div<int64_t>(N, kBlockNHopper);
  const int k_tiles = static_cast<int>(course::ceil_div<int64_t>(K, kBlockKHopper));  // >= 1: K == 0 never comes here

  // --8<-- [start:hopper_roles]
  // Both roles walk the same sequence of (output tile, k-slice) steps; step s uses stage
  // s % kStages in its lap s / kStages, whose parity names the barrier phase to wait for.
  if (warpgroup == 0) {
    hopper::release_registers<kProducerRegisters>();
    if (thread == 0) {
      int step = 0;
      for (int64_t index = blockIdx.x; index < tiles_m * tiles_n; index += gridDim.x) {
        const TileIndex tile = grouped_tile(index, tiles_m, tiles_n, kGroupMHopper);
        for (int kt = 0; kt < k_tiles; ++kt, ++step) {
          const int stage = step % kStagesHopper;
          const uint32_t lap = step / kStagesHopper;
          hopper::barrier_wait(&empty[stage], (lap & 1) ^ 1);              // lap 0 passes: the stage was never used
          hopper::barrier_arrive_expect_bytes(&full[stage], kStageBytes);  // zero-filled edges count too
          hopper::tma_load_2d(tiles_a + stage * kTileABytes, &x_map, &full[stage], kt * kBlockKHopper,
                              static_cast<int>(tile.row * kBlockMHopper));
          hopper::tma_load_2d(tiles_b + stage * kTileBBytes, &weight_map, &full[stage], kt * kBlockKHopper,
                              static_cast<int>(tile.col * kBlockNHopper));
        }
      }
    }
  } else {
    hopper::claim_registers<kConsumerRegisters>();
    const int consumer = warpgroup - 1, warp = thread / kWarpSize, lane = thread % kWarpSize;
    float accumulators[kAccumulatorsPerThread];
    int step = 0;
    for (int64_t index = blockIdx.x; index < tiles_m * tiles_n; index += gridDim.x) {
      const TileIndex tile = grouped_tile(index, tiles_m, tiles_n, kGroupMHopper);
      for (int kt = 0; kt < k_tiles; ++kt, ++step) {
        const int stage = step % kStagesHopper;
        hopper::barrier_wait(&full[stage], (step / kStagesHopper) & 1);
        const uint8_t* a = tiles_a + stage * kTileABytes + consumer * kWgmmaM * kSwizzleBytes;
        const uint8_t* b = tiles_b + stage * kTileBBytes;
        hopper::wgmma_fence();
#pragma unroll
        for (int k_step = 0; k_step < kBlockKHopper / kWgmmaK; ++k_step) {
          const int k_offset = k_step * kWgmmaK * kElementBytes;  // 32 B further along the swizzled row
          hopper::wgmma_m64n256k16<T>(accumulators, hopper::tile_descriptor(a + k_offset),
                                      hopper::tile_descriptor(b + k_offset), kt > 0 || k_step > 0);
        }
        hopper::wgmma_commit();
        // Keep this slice's multiplies running and wait only for the previous slice's: its
        // stage can then go back to the producer while the tensor cores are still busy.
        hopper::wgmma_wait<1>();
        if (kt > 0 && lane == 0) hopper::barrier_arrive(&empty[(step - 1) % kStagesHopper]);
      }
      hopper::wgmma_wait<0>();
      if (lane == 0) hopper::barrier_arrive(&empty[(step - 1) % kStagesHopper]);
      hopper::settle(accumulators);
      // --8<-- [end:hopper_roles]

      // --8<-- [start:hopper_epilogue]
      // wgmma's accumulator layout is mma.m16n8's, repeated: warp w of the warpgroup owns rows
      // 16 w .. 16 w + 15, and registers 4 j .. 4 j + 3 are the m16n8 tile of columns 8 j .. 8 j + 7.
      uint8_t* const my_staging = staging + consumer * kStagingBytes;
      const int col_in_chunk = 2 * (lane % 4);
#pragma unroll
      for (int pass = 0; pass < kStorePasses; ++pass) {
        // The buffer is free once TMA has read the previous pass (or the previous tile's last).
        if (thread == 0) hopper::wait_stores_read();
        hopper::warpgroup_barrier(1 + consumer, kWarpgroupThreads);
#pragma unroll
        for (int chunk = 0; chunk < kWgmmaN / 8 / kStorePasses; ++chunk) {
          const int j = pass * (kWgmmaN / 8 / kStorePasses) + chunk;
          const int64_t col = tile.col * kBlockNHopper + 8 * j + col_in_chunk;
          const bool col_in = col < N;  // N % 8 == 0: both columns of a pair are in, or both out
          const float bias_first = col_in ? to_float(bias[col]) : 0.0f;
          const float bias_second = col_in ? to_float(bias[col + 1]) : 0.0f;
          const int box = chunk / (kStoreBoxCols / 8), box_chunk = chunk % (kStoreBoxCols / 8);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = warp * 16 + lane / 4 + 8 * half;
            // TMA's 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8).
            uint8_t* destination = my_staging + box * kStoreBoxBytes + row * kSwizzleBytes +
                                   (box_chunk ^ (row % 8)) * 16 + col_in_chunk * kElementBytes;
            store_pair(reinterpret_cast<T*>(destination),
                       activate(accumulators[4 * j + 2 * half] + bias_first, activation),
                       activate(accumulators[4 * j + 2 * half + 1] + bias_second, activation));
          }
        }
        hopper::fence_shared_for_tma();
        hopper::warpgroup_barrier(1 + consumer, kWarpgroupThreads);
        if (thread == 0) {  // rows past M and columns past N are clipped by TMA
          for (int box = 0; box < kStoreBoxesPerPass; ++box) {
            const int col =
                static_cast<int>(tile.col * kBlockNHopper) + (pass * kStoreBoxesPerPass + box) * kStoreBoxCols;
            hopper::tma_store_2d(&out_map, my_staging + box * kStoreBoxBytes, col,
                                 static_cast<int>(tile.row * kBlockMHopper) + consumer * kWgmmaM);
          }
          hopper::commit_stores();
        }
      }
      // --8<-- [end:hopper_epilogue]
    }
    if (thread == 0) hopper::wait_stores_done();  // the staging buffers must outlive the stores
  }
#else
  __trap();  // not built for sm_90a: launch_linear_act_wgmma refuses before launching
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050  // the by-version query; the older one is deprecated from CUDA 13
    COURSE_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found));
#else  // CUDA 12.0-12.4 (Colab's toolkits, for instance)
    COURSE_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      throw std::runtime_error("linear_act_wgmma: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// The tensor map of a row-major [rows, cols] matrix moved in boxes of box_cols x box_rows,
// 128-byte swizzled; loads read elements outside the matrix as zeros, stores skip them.
CUtensorMap row_major_map(ElementType type, const void* matrix, int64_t rows, int64_t cols, int box_rows,
                          int box_cols) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};  // innermost first
  const cuuint64_t row_stride_bytes[1] = {static_cast<cuuint64_t>(cols) * kElementBytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = tensor_map_encoder()(
      &map, type == ElementType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
      const_cast<void*>(matrix), dims, row_stride_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error("linear_act_wgmma: cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(static_cast<int>(status)) + " for a [" + std::to_string(rows) + ", " +
                             std::to_string(cols) + "] matrix");
  }
  return map;
}

template <typename T>
void launch_typed(const void* x, const void* weight, const void* bias, void* out, int64_t M, int64_t N, int64_t K,
                  Activation activation, ElementType type, cudaStream_t stream) {
  const auto kernel = linear_act_wgmma_kernel<T>;
  COURSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytesHopper));
  const CUtensorMap x_map = row_major_map(type, x, M, K, kBlockMHopper, kBlockKHopper);
  const CUtensorMap weight_map = row_major_map(type, weight, N, K, kBlockNHopper, kBlockKHopper);
  const CUtensorMap out_map = row_major_map(type, out, M, N, kStoreBoxRows, kStoreBoxCols);
  const int64_t tiles = course::ceil_div<int64_t>(M, kBlockMHopper) * course::ceil_div<int64_t>(N, kBlockNHopper);
  const int64_t sms = course::device_attribute(cudaDevAttrMultiProcessorCount);
  kernel<<<static_cast<unsigned>(tiles < sms ? tiles : sms), kThreadsHopper, kSharedBytesHopper, stream>>>(
      x_map, weight_map, out_map, static_cast<const T*>(bias), M, N, K, activation);
  COURSE_CHECK_LAUNCH();
}

}  // namespace

TileConfig wgmma_tile_config() {
  return {kBlockMHopper,
          kBlockNHopper,
          kBlockKHopper,
          kStagesHopper,
          kThreadsHopper,
          kSharedBytesHopper,
          kBlockKHopper / kElementsPerChunk};
}

bool wgmma_available() {
  static course::PerDeviceCache loaded;
  return course::sm90a_image_loaded(loaded,
                                    [](int* out) { return cudaMemcpyFromSymbol(out, built_with_wgmma, sizeof(int)); });
}

void launch_linear_act_wgmma(ElementType type, const void* x, const void* weight, const void* bias, void* out,
                             int64_t M, int64_t N, int64_t K, Activation activation, cudaStream_t stream) {
  if (!wgmma_available()) {
    throw std::runtime_error(
        "linear_act_wgmma: needs a Hopper GPU (compute capability 9.0) and a build for sm_90a "
        "(TORCH_CUDA_ARCH_LIST=9.0a); use linear_act, the mma.sync path, elsewhere");
  }
  if (M == 0 || N == 0) return;
  if (K == 0) {  // a tensor map cannot describe an empty K: out = act(bias), as the mma.sync path writes it
    launch_linear_act(type, x, weight, bias, out, M, N, K, activation, stream);
    return;
  }
  constexpr int64_t kMaxCoordinate = 0x7fffffff;  // TMA box coordinates are 32-bit
  if (M > kMaxCoordinate || N > kMaxCoordinate || K > kMaxCoordinate) {
    throw std::runtime_error("linear_act_wgmma: M, N and K must each be below 2^31 (TMA coordinates)");
  }
  if (type == ElementType::kBFloat16) {
    launch_typed<__nv_bfloat16>(x, weight, bias, out, M, N, K, activation, type, stream);
  } else {
    launch_typed<__half>(x, weight, bias, out, M, N, K, activation, type, stream);
  }
}

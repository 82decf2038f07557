// Lab skeleton generated from solutions/04-tiled-matmul/07_warptiling.cu by `./course labs` [lab-hash 3c21e960a855].
// Students: fill in the TODO(lab04.k) blocks, then run `./course grade 04`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Kernel 7 (the stretch): warp tiling and double buffering. Kernel 6's block tile and
// float4s, with three changes:
//  1. Warp tiles: each warp owns a 32 x 64 region of the block's tile, and each thread a
//     2 x 2 grid of 4 x 4 squares spread over it, so a warp's float4 reads of a tile row
//     are consecutive addresses: no bank conflicts in the inner loop.
//  2. Double buffering: two shared-memory stages. The next tile's global loads are issued
//     before the current tile's math, so their latency hides behind 512 FMAs per thread,
//     and one __syncthreads per step suffices.
//  3. The A tile's rows are padded so that the transposed stores are conflict-free.
#include <course/cuda.cuh>

#include "tiled_matmul.h"

namespace {
// --8<-- [start:config]
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 8;
constexpr int kThreads = 256, kWarps = kThreads / course::kWarpSize, kMinBlocksPerSm = 2;
constexpr int kVector = 4;
// Warp tile: 8 warps as 4 (down M) x 2 (across N) tiles of 32 x 64.
constexpr int kWarpM = 32, kWarpN = 64;
static_assert((kBlockM / kWarpM) * (kBlockN / kWarpN) == kWarps, "the warp tiles cover the block tile");
// Each thread: a 2 x 2 grid of 4 x 4 squares, one square in each quarter of the warp tile.
// Within a quarter (16 x 32) the 32 lanes sit as 4 rows x 8 columns of squares.
constexpr int kSquare = 4, kSquaresM = 2, kSquaresN = 2;
constexpr int kLanesM = kWarpM / kSquaresM / kSquare, kLanesN = kWarpN / kSquaresN / kSquare;  // 4, 8
static_assert(kLanesM * kLanesN == course::kWarpSize, "one square per lane in each quarter of the warp tile");
static_assert(kSquare == kVector, "a square's row is one float4: one 16-byte shared-memory load");
// Why this is conflict-free: for one k, the warp's B reads are 8 lanes-in-N float4s at
// consecutive 16-byte addresses (128 bytes, one wavefront; the 4 lanes-in-M repeat them:
// broadcast), and its A reads are 4 consecutive float4s (64 bytes). Kernel 6's threads
// read 8 consecutive floats each, so neighbouring lanes were 32 bytes apart.
constexpr int kAccumulators = kSquaresM * kSquaresN * kSquare * kSquare;
static_assert(kAccumulators == 64, "64 accumulators per thread, as in kernels 5 and 6");
// Padding: a warp stores its A float4s transposed, lane pairs (k 0-3 and k 4-7) into the
// same column a_row: with rows of 128 floats, k and k + 4 fall in the same bank (4 * 128 is
// a multiple of 32 banks). A row of 132 floats moves k + 4 by 4 * 132 % 32 = 16 banks, and
// keeps each row 16-byte aligned (132 * 4 = 528 = 33 * 16) for the float4 reads.
constexpr int kPadA = 4;
static_assert((kVector * (kBlockM + kPadA)) % 32 == 16, "k and k + 4 land 16 banks apart");
static_assert((kBlockM + kPadA) % kVector == 0, "padded rows stay 16-byte aligned");
static_assert(kBlockM * kBlockK / kVector == kThreads && kBlockK * kBlockN / kVector == kThreads,
              "one float4 of each tile per thread per step");
// Shared memory: 2 stages x (8 x 132 + 8 x 128) floats x 4 bytes = 16.3 KiB per block.
constexpr int kStages = 2;
constexpr int kSmemBytes = kStages * kBlockK * (kBlockM + kPadA + kBlockN) * static_cast<int>(sizeof(float));
static_assert(kSmemBytes <= 48 * 1024, "static shared memory is limited to 48 KiB per block");
// --8<-- [end:config]
}  // namespace

// --8<-- [start:warptiling]
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    sgemm_warptiling(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                     int K) {
  __shared__ __align__(16) float a_tile[kStages][kBlockK][kBlockM + kPadA];  // transposed, as in kernel 6
  __shared__ __align__(16) float b_tile[kStages][kBlockK][kBlockN];
  const int row0 = blockIdx.y * kBlockM, col0 = blockIdx.x * kBlockN;
  const int t = threadIdx.x, warp = t / course::kWarpSize, lane = t % course::kWarpSize;
  // This thread's squares start at rows warp_row + lane_row + {0, kWarpM / 2} and columns
  // warp_col + lane_col + {0, kWarpN / 2} of the block tile.
  const int warp_row = (warp / (kBlockN / kWarpN)) * kWarpM, warp_col = (warp % (kBlockN / kWarpN)) * kWarpN;
  const int lane_row = (lane / kLanesN) * kSquare, lane_col = (lane % kLanesN) * kSquare;
  const int a_row = t / (kBlockK / kVector), a_k = (t % (kBlockK / kVector)) * kVector;
  const int b_row = t / (kBlockN / kVector), b_col = (t % (kBlockN / kVector)) * kVector;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  // Global -> registers (guarded per float4), and registers -> one shared-memory stage.
  auto load_a = [&](int k0) {
    return row0 + a_row < M && k0 + a_k < K ? *reinterpret_cast<const float4*>(&A[(row0 + a_row) * K + k0 + a_k])
                                            : zero;
  };
  auto load_b = [&](int k0) {
    return k0 + b_row < K && col0 + b_col < N ? *reinterpret_cast<const float4*>(&B[(k0 + b_row) * N + col0 + b_col])
                                              : zero;
  };
  auto store = [&](int stage, float4 a, float4 b) {
    a_tile[stage][a_k + 0][a_row] = a.x;
    a_tile[stage][a_k + 1][a_row] = a.y;
    a_tile[stage][a_k + 2][a_row] = a.z;
    a_tile[stage][a_k + 3][a_row] = a.w;
    *reinterpret_cast<float4*>(&b_tile[stage][b_row][b_col]) = b;
  };

  float acc[kSquaresM * kSquare][kSquaresN * kSquare] = {};
  float a_frag[kSquaresM * kSquare], b_frag[kSquaresN * kSquare];
  store(0, load_a(0), load_b(0));
  __syncthreads();
  int stage = 0;
  for (int k0 = 0; k0 < K; k0 += kBlockK) {
    const bool has_next = k0 + kBlockK < K;
    float4 a_next = zero, b_next = zero;
    if (has_next) {  // issued now, consumed after the math below: the loads fly meanwhile
      a_next = load_a(k0 + kBlockK);
      b_next = load_b(k0 + kBlockK);
    }
#pragma unroll
    for (int k = 0; k < kBlockK; ++k) {
#pragma unroll
      for (int s = 0; s < kSquaresM; ++s)
        *reinterpret_cast<float4*>(&a_frag[s * kSquare]) =
            *reinterpret_cast<const float4*>(&a_tile[stage][k][warp_row + s * (kWarpM / 2) + lane_row]);
#pragma unroll
      for (int s = 0; s < kSquaresN; ++s)
        *reinterpret_cast<float4*>(&b_frag[s * kSquare]) =
            *reinterpret_cast<const float4*>(&b_tile[stage][k][warp_col + s * (kWarpN / 2) + lane_col]);
#pragma unroll
      for (int i = 0; i < kSquaresM * kSquare; ++i)
#pragma unroll
        for (int j = 0; j < kSquaresN * kSquare; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }
    // The other stage was last read before the previous __syncthreads: safe to overwrite.
    if (has_next) store(stage ^ 1, a_next, b_next);
    __syncthreads();  // the next stage is complete, and nobody reads this one any more
    stage ^= 1;
  }
#pragma unroll
  for (int i = 0; i < kSquaresM * kSquare; ++i) {
    const int row = row0 + warp_row + (i / kSquare) * (kWarpM / 2) + lane_row + i % kSquare;
#pragma unroll
    for (int s = 0; s < kSquaresN; ++s) {
      const int col = col0 + warp_col + s * (kWarpN / 2) + lane_col;
      const float* out = &acc[i][s * kSquare];
      if (row < M && col < N)
        *reinterpret_cast<float4*>(&C[row * N + col]) = make_float4(out[0], out[1], out[2], out[3]);
    }
  }
}
// --8<-- [end:warptiling]

BlockTile sgemm_warptiling_tile() { return {kBlockM, kBlockN}; }

void launch_sgemm_warptiling(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  if (!can_vectorize(M, N, K, reinterpret_cast<uintptr_t>(A), reinterpret_cast<uintptr_t>(B),
                     reinterpret_cast<uintptr_t>(C))) {
    launch_sgemm_blocktiling_2d(A, B, C, M, N, K, stream);
    return;
  }
  const dim3 grid(course::ceil_div(N, kBlockN), course::ceil_div(M, kBlockM));
  sgemm_warptiling<<<grid, kThreads, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

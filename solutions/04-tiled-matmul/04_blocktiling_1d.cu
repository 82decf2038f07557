// Kernel 4: 1D register blocking. Kernel 3 does one FMA per two shared-memory loads, so
// shared memory, not arithmetic, is its limit. Here each thread computes a column of
// kThreadM outputs: per step k it loads one B value into a register and reuses it
// kThreadM times against kThreadM A values (a broadcast within the warp).
#include <course/cuda.cuh>

#include "tiled_matmul.h"

namespace {
// --8<-- [start:config]
constexpr int kBlockM = 64, kBlockN = 64;  // the block's tile of C
constexpr int kBlockK = 8;                 // the depth of each shared-memory step
constexpr int kThreadM = 8;                // outputs per thread, down a column
// Each thread computes kThreadM outputs, so the tile needs this many threads:
constexpr int kThreads = kBlockM * kBlockN / kThreadM;  // 512
static_assert(kThreads % course::kWarpSize == 0 && kThreads <= 1024, "whole warps, within the block limit");
// Loading: each thread brings one float of the A tile and one of the B tile per step.
static_assert(kBlockM * kBlockK == kThreads, "the A tile (64 x 8) is one float per thread");
static_assert(kBlockK * kBlockN == kThreads, "the B tile (8 x 64) is one float per thread");
// A warp covers 32 consecutive columns of one row of B and of the output: coalesced.
static_assert(kBlockN % course::kWarpSize == 0, "a warp's threads share their output rows");
// (64 + 64) * 8 * 4 = 4 KiB of shared memory per block.
static_assert((kBlockM + kBlockN) * kBlockK * sizeof(float) <= 48 * 1024, "static shared memory limit");
// --8<-- [end:config]
}  // namespace

// --8<-- [start:blocktiling_1d]
__global__ void __launch_bounds__(kThreads)
    sgemm_blocktiling_1d(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                         int K) {
  __shared__ float a_tile[kBlockM][kBlockK];
  __shared__ float b_tile[kBlockK][kBlockN];
  const int row0 = blockIdx.y * kBlockM, col0 = blockIdx.x * kBlockN;
  const int t = threadIdx.x;
  const int thread_col = t % kBlockN;                  // this thread's column of C in the tile
  const int thread_row = (t / kBlockN) * kThreadM;     // and the first of its kThreadM rows
  const int a_row = t / kBlockK, a_col = t % kBlockK;  // the A element this thread loads
  const int b_row = t / kBlockN, b_col = t % kBlockN;  // the B element this thread loads

  float acc[kThreadM] = {};
  for (int k0 = 0; k0 < K; k0 += kBlockK) {
    a_tile[a_row][a_col] = (row0 + a_row < M && k0 + a_col < K) ? A[(row0 + a_row) * K + k0 + a_col] : 0.0f;
    b_tile[b_row][b_col] = (k0 + b_row < K && col0 + b_col < N) ? B[(k0 + b_row) * N + col0 + b_col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBlockK; ++k) {
      const float b = b_tile[k][thread_col];  // one load, kThreadM uses
#pragma unroll
      for (int i = 0; i < kThreadM; ++i) acc[i] += a_tile[thread_row + i][k] * b;
    }
    __syncthreads();
  }
  const int col = col0 + thread_col;
#pragma unroll
  for (int i = 0; i < kThreadM; ++i) {
    const int row = row0 + thread_row + i;
    if (row < M && col < N) C[row * N + col] = acc[i];
  }
}
// --8<-- [end:blocktiling_1d]

BlockTile sgemm_blocktiling_1d_tile() { return {kBlockM, kBlockN}; }

void launch_sgemm_blocktiling_1d(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  const dim3 grid(course::ceil_div(N, kBlockN), course::ceil_div(M, kBlockM));
  sgemm_blocktiling_1d<<<grid, kThreads, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

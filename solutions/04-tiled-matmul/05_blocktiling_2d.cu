// Kernel 5: 2D register blocking. Each thread computes an 8 x 8 square of outputs: per
// step k it loads 8 A values and 8 B values into registers and does all 64 products, so
// 16 shared-memory loads feed 64 FMAs (kernel 3: 2 loads per FMA; kernel 4: 9 per 8).
#include <course/cuda.cuh>

#include "tiled_matmul.h"

namespace {
// --8<-- [start:config]
constexpr int kBlockM = 128, kBlockN = 128;  // the block's tile of C
constexpr int kBlockK = 8;                   // the depth of each shared-memory step
constexpr int kThreadM = 8, kThreadN = 8;    // each thread's square of C
// 64 accumulators per thread, plus 8 + 8 fragment registers, plus addresses, indices and
// loop counters: about 120 of the 255 registers a thread may hold (ptxas of nvcc 13.0 for
// sm_90 reports 128, no spills). Two blocks of 256 threads then fill 2 * 256 * 128 = 65536
// registers: exactly one SM's register file on sm_75 ... sm_90.
constexpr int kThreads = (kBlockM / kThreadM) * (kBlockN / kThreadN);  // 16 x 16 = 256
static_assert(kThreadM * kThreadN == 64, "64 accumulators: more would spill past 255 registers per thread");
static_assert(kThreads == 256 && kThreads % course::kWarpSize == 0,
              "8 whole warps; 2 blocks fit an SM's 64K registers");
// __launch_bounds__(kThreads, kMinBlocksPerSm) makes ptxas hold each thread to
// 65536 / (2 * 256) = 128 registers, so that two blocks (16 warps) are resident per SM:
// while one block waits at __syncthreads, the other computes.
constexpr int kMinBlocksPerSm = 2;
// Loading: the 128 x 8 A tile and the 8 x 128 B tile are 1024 floats each, 4 per thread.
constexpr int kLoadsPerThread = kBlockM * kBlockK / kThreads;
static_assert(kBlockM * kBlockK % kThreads == 0 && kBlockK * kBlockN % kThreads == 0,
              "the tiles divide evenly among the threads");
static_assert(kThreads % kBlockK == 0 && kThreads % kBlockN == 0, "every load pass covers whole tile rows");
// Shared memory per block: (BM + BN) * BK * 4 = (128 + 128) * 8 * 4 = 8 KiB.
constexpr int kSmemBytes = (kBlockM + kBlockN) * kBlockK * static_cast<int>(sizeof(float));
static_assert(kSmemBytes <= 48 * 1024, "static shared memory is limited to 48 KiB per block");
// Arithmetic intensity from global memory: each step loads (BM + BN) * BK floats and does
// 2 * BM * BN * BK flops, i.e. 2 * 128 * 128 / (256 * 4) = 32 flops per byte (kernel 3: 8).
// --8<-- [end:config]
}  // namespace

// --8<-- [start:blocktiling_2d]
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    sgemm_blocktiling_2d(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                         int K) {
  __shared__ float a_tile[kBlockM][kBlockK];  // a_tile[r][k] = A[row0 + r, k0 + k]
  __shared__ float b_tile[kBlockK][kBlockN];  // b_tile[k][c] = B[k0 + k, col0 + c]
  const int row0 = blockIdx.y * kBlockM, col0 = blockIdx.x * kBlockN;
  const int t = threadIdx.x;
  // This thread's outputs: rows thread_row .. thread_row + 7, columns thread_col .. + 7.
  const int thread_row = (t / (kBlockN / kThreadN)) * kThreadM;
  const int thread_col = (t % (kBlockN / kThreadN)) * kThreadN;
  // Loading: pass p brings A tile row a_row + p * kRowsPerPassA (and B likewise), so that
  // neighbouring threads read neighbouring floats of A's rows and of B's rows.
  const int a_row = t / kBlockK, a_col = t % kBlockK;
  const int b_row = t / kBlockN, b_col = t % kBlockN;
  constexpr int kRowsPerPassA = kThreads / kBlockK, kRowsPerPassB = kThreads / kBlockN;

  float acc[kThreadM][kThreadN] = {};
  // SOLUTION BEGIN lab04.2: for each k0 below K step kBlockK: load the A and B tiles in kLoadsPerThread passes (0
  //   outside the matrices), __syncthreads(), then for each k load a_frag[i] = a_tile[thread_row + i][k] and b_frag[j]
  //   = b_tile[k][thread_col + j] into registers and add all 64 products to acc, __syncthreads(); finally store acc to
  //   C where row < M and col < N (store_tile<1> in tiled_matmul.h does that)
  float a_frag[kThreadM], b_frag[kThreadN];
  for (int k0 = 0; k0 < K; k0 += kBlockK) {
#pragma unroll
    for (int p = 0; p < kLoadsPerThread; ++p) {
      const int r = a_row + p * kRowsPerPassA;
      a_tile[r][a_col] = (row0 + r < M && k0 + a_col < K) ? A[(row0 + r) * K + k0 + a_col] : 0.0f;
      const int k = b_row + p * kRowsPerPassB;
      b_tile[k][b_col] = (k0 + k < K && col0 + b_col < N) ? B[(k0 + k) * N + col0 + b_col] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBlockK; ++k) {
#pragma unroll
      for (int i = 0; i < kThreadM; ++i) a_frag[i] = a_tile[thread_row + i][k];
#pragma unroll
      for (int j = 0; j < kThreadN; ++j) b_frag[j] = b_tile[k][thread_col + j];
#pragma unroll
      for (int i = 0; i < kThreadM; ++i)
#pragma unroll
        for (int j = 0; j < kThreadN; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }
    __syncthreads();
  }
  store_tile<1>(C, acc, row0 + thread_row, col0 + thread_col, M, N);  // guarded float stores
  // SOLUTION END
}
// --8<-- [end:blocktiling_2d]

BlockTile sgemm_blocktiling_2d_tile() { return {kBlockM, kBlockN}; }

void launch_sgemm_blocktiling_2d(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  const dim3 grid(course::ceil_div(N, kBlockN), course::ceil_div(M, kBlockM));
  sgemm_blocktiling_2d<<<grid, kThreads, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

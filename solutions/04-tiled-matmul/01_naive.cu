// Kernel 1: naive. One thread per element of C, a dot product of a row of A and a column
// of B read straight from global memory. Correct, and the slowest rung of the ladder.
#include <course/cuda.cuh>

#include "tiled_matmul.h"

// 32 x 32 = 1024 threads: the hardware's most per block, as a square so that the grid is
// ceil(M / 32) x ceil(N / 32) blocks.
constexpr int kNaiveTile = 32;
static_assert(kNaiveTile * kNaiveTile <= 1024, "the hardware limit of threads per block");

// --8<-- [start:naive]
__global__ void __launch_bounds__(kNaiveTile* kNaiveTile)
    sgemm_naive(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  // threadIdx.x walks down a column of C: the 32 threads of a warp have 32 different rows,
  // so each load of A[row, k] touches 32 different 128-byte lines (K floats apart), and
  // the stores to C are 32 lines too. Kernel 2 swaps the two indices and nothing else.
  const int row = blockIdx.x * kNaiveTile + threadIdx.x;
  const int col = blockIdx.y * kNaiveTile + threadIdx.y;
  if (row >= M || col >= N) return;  // the partial tiles at the bottom and right edges
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = acc;
}
// --8<-- [end:naive]

BlockTile sgemm_naive_tile() { return {kNaiveTile, kNaiveTile}; }

void launch_sgemm_naive(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  const dim3 block(kNaiveTile, kNaiveTile);
  const dim3 grid(course::ceil_div(M, kNaiveTile), course::ceil_div(N, kNaiveTile));
  sgemm_naive<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

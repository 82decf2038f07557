// Kernel 2: coalesced. The same arithmetic as kernel 1; only the mapping of threads to
// elements changes, so that a warp's 32 threads touch 32 neighbouring floats.
#include <course/cuda.cuh>

#include "tiled_matmul.h"

constexpr int kCoalescedTile = 32;
static_assert(kCoalescedTile == course::kWarpSize, "one warp per row of the block: threadIdx.x spans exactly a warp");

// --8<-- [start:coalesced]
__global__ void __launch_bounds__(kCoalescedTile* kCoalescedTile)
    sgemm_coalesced(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                    int K) {
  // threadIdx.x now walks along a row of C. In one step k, the warp's 32 threads read
  // A[row, k] (one address: a broadcast), B[k, col..col+31] (one 128-byte line) and at the
  // end store C[row, col..col+31] (one line): 2 lines per step instead of 33.
  const int col = blockIdx.x * kCoalescedTile + threadIdx.x;
  const int row = blockIdx.y * kCoalescedTile + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = acc;
}
// --8<-- [end:coalesced]

BlockTile sgemm_coalesced_tile() { return {kCoalescedTile, kCoalescedTile}; }

void launch_sgemm_coalesced(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  const dim3 block(kCoalescedTile, kCoalescedTile);
  const dim3 grid(course::ceil_div(N, kCoalescedTile), course::ceil_div(M, kCoalescedTile));
  sgemm_coalesced<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

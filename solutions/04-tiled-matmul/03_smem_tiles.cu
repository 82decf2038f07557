// Kernel 3: shared-memory tiles. A block computes a 32 x 32 tile of C. It walks K in steps
// of 32: the block loads a 32 x 32 tile of A and one of B into shared memory (each thread
// one element of each, coalesced), waits, and every thread reads the 32 values of its row
// and column from shared memory. Each float loaded from global memory is now used 32 times.
#include <course/cuda.cuh>

#include "tiled_matmul.h"

// --8<-- [start:tile]
// The tile is square and one thread computes one output, so the block is kTile x kTile
// threads, and each thread loads one float of the A tile and one of the B tile per step.
constexpr int kTile = 32;
static_assert(kTile * kTile <= 1024, "one thread per output: a block holds at most 1024 threads");
static_assert(kTile % course::kWarpSize == 0,
              "threadIdx.x spans whole warps, so each row of a tile is a coalesced load");
// Two tiles of kTile^2 floats: 2 * 32 * 32 * 4 = 8 KiB, within the 48 KiB a block may use
// without opting in, on every GPU from sm_75 up.
constexpr int kSmemTilesBytes = 2 * kTile * kTile * static_cast<int>(sizeof(float));
static_assert(kSmemTilesBytes <= 48 * 1024, "static shared memory is limited to 48 KiB per block");
// --8<-- [end:tile]

// --8<-- [start:smem_tiles]
__global__ void __launch_bounds__(kTile* kTile)
    sgemm_smem_tiles(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                     int K) {
  __shared__ float a_tile[kTile][kTile];  // a_tile[r][k] = A[row0 + r, k0 + k]
  __shared__ float b_tile[kTile][kTile];  // b_tile[k][c] = B[k0 + k, col0 + c]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;  // this thread's output C[row, col]
  const int col = blockIdx.x * kTile + tx;
  float acc = 0.0f;
  // SOLUTION BEGIN lab04.1: for each k0 = 0, kTile, 2 * kTile, ... below K: load a_tile[ty][tx] = A[row, k0 + tx] and
  //   b_tile[ty][tx] = B[k0 + ty, col] (0 outside the matrices), __syncthreads(), add the kTile products of a_tile's
  //   row ty and b_tile's column tx to acc, __syncthreads() again before the next load; then store acc to C[row, col]
  //   if it lies inside C
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Zero-fill outside A and B: a zero contributes nothing to the dot product, so the
    // loop below needs no bounds check, and the partial last tile of K costs nothing extra.
    a_tile[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
    b_tile[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
    __syncthreads();  // the tiles are complete before anyone reads them
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += a_tile[ty][k] * b_tile[k][tx];
    __syncthreads();  // everyone is done reading before the next iteration overwrites them
  }
  if (row < M && col < N) C[row * N + col] = acc;
  // SOLUTION END
}
// --8<-- [end:smem_tiles]

BlockTile sgemm_smem_tiles_tile() { return {kTile, kTile}; }

void launch_sgemm_smem_tiles(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(course::ceil_div(N, kTile), course::ceil_div(M, kTile));
  sgemm_smem_tiles<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

// Lab skeleton generated from solutions/04-tiled-matmul/03_smem_tiles.cu by `./course labs` [lab-hash d2835c54d8f3].
// Students: fill in the TODO(lab04.k) blocks, then run `./course grade 04`.
// Instructors: edit the solution file instead, then run `./course labs`.
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
  // TODO(lab04.1): for each k0 = 0, kTile, 2 * kTile, ... below K: load a_tile[ty][tx] = A[row, k0 + tx] and
  //   b_tile[ty][tx] = B[k0 + ty, col] (0 outside the matrices), __syncthreads(), add the kTile products of a_tile's
  //   row ty and b_tile's column tx to acc, __syncthreads() again before the next load; then store acc to C[row, col]
  //   if it lies inside C
}
// --8<-- [end:smem_tiles]

BlockTile sgemm_smem_tiles_tile() { return {kTile, kTile}; }

void launch_sgemm_smem_tiles(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(course::ceil_div(N, kTile), course::ceil_div(M, kTile));
  sgemm_smem_tiles<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}

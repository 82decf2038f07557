// Lab skeleton generated from solutions/02-shared-memory/transpose.cu by `./course labs` [lab-hash ee055a238f0c].
// Students: fill in the TODO(lab02.k) blocks, then run `./course grade 02`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 02: transpose through shared memory. A transpose moves every element once and computes
// nothing, so its only measure is bandwidth; the ladder naive -> tiled -> padded shows what
// it takes to make both its reads and its writes coalesced.
#include <course/cuda.cuh>

#include <climits>
#include <stdexcept>
#include <string>

#include "transpose.h"

using course::kWarpSize;

// --8<-- [start:tile_shape]
// A tile row is one warp wide: 32 lanes x 4 B = 128 B, the line a warp's load is served in,
// so a warp reading one tile row (or writing one) touches exactly one 128-byte line.
constexpr int kTile = kWarpSize;
// 4 rows of threads: 32 x 4 = 128 threads per block, each thread carrying 8 of the tile's 32
// rows and issuing its 8 loads back to back before it waits on any of them (8 LDG before the first
// STS in the SASS). The loads in flight are what keep HBM busy (Little's law, lesson 01: ~2.1 MB,
// ~16 KB per SM on an H200 for a kernel that reads half the bytes it moves, a floor). 16 blocks of
// 128 fill the 2048 resident threads of an sm_80/sm_90 SM with 64 KiB of loads in flight; 8 fill a
// T4's 1024. Measured on an H200: 8 rows of threads (4 loads each, 32 KiB per SM) reached 77% of
// copy bandwidth, 4 rows (8 loads each, 64 KiB) 89%.
constexpr int kBlockRows = 4;
constexpr int kThreadsPerBlock = kTile * kBlockRows;
constexpr int kRowsPerThread = kTile / kBlockRows;
static_assert(kTile == kWarpSize, "a tile row is one warp: 32 lanes x 4 B = one 128-byte line");
static_assert(kTile % kBlockRows == 0, "each thread covers a whole number of tile rows");
static_assert(kThreadsPerBlock % kWarpSize == 0 && kThreadsPerBlock <= 1024, "whole warps, within the block limit");
static_assert(2048 % kThreadsPerBlock == 0 && 1024 % kThreadsPerBlock == 0, "whole blocks fill an SM");
static_assert(kRowsPerThread == 8, "8 independent loads in flight per thread");
// --8<-- [end:tile_shape]

// --8<-- [start:banks]
// Shared memory is 32 banks, each 4 bytes wide; consecutive 4-byte words lie in consecutive
// banks. A bank serves one word per cycle, so a warp's access takes as many cycles as the
// largest number of distinct words it needs from any one bank: 1 at best, 32 at worst.
constexpr int kBanks = 32;
constexpr int kBankWidthBytes = 4;
static_assert(sizeof(float) == kBankWidthBytes, "one float per bank word: the counts below are in floats");

// The bank that holds tile[row][col] when the tile's rows are row_stride floats apart.
__host__ __device__ constexpr int bank_of(int row, int col, int row_stride) {
  return (row * row_stride + col) % kBanks;
}

// Cycles a warp's column read costs: lane i reads tile[i][col], and this counts the lanes
// that land in the busiest bank (each reads a different word, so none is a broadcast).
__host__ __device__ constexpr int column_read_ways(int row_stride) {
  int worst = 0;
  for (int bank = 0; bank < kBanks; ++bank) {
    int lanes = 0;
    for (int lane = 0; lane < kWarpSize; ++lane) lanes += bank_of(lane, 0, row_stride) == bank ? 1 : 0;
    worst = lanes > worst ? lanes : worst;
  }
  return worst;
}

// A row of 32 floats is 128 B = exactly once round the 32 banks, so every row starts in
// bank 0 and a whole column lies in one bank: the column read is a 32-way conflict.
static_assert(column_read_ways(kTile) == kWarpSize, "unpadded 32 x 32 float tile: a column is one bank, 32-way");
// --8<-- [end:banks]

// --8<-- [start:padding]
// TODO(lab02.3): choose the padded tile's row stride (floats between rows) so that the 32 floats of a tile
//   column fall in 32 different banks, and state it in a static_assert with column_read_ways
constexpr int kPaddedRowStride = kTile;  // correct, but every column read is a 32-way bank conflict
// --8<-- [end:padding]

// --8<-- [start:shared_budget]
// Shared memory per block: 32 rows x 33 floats x 4 B = 4224 B. Threads, not shared memory,
// limit how many blocks an SM holds: a T4's SM holds 1024 threads = 8 blocks = 33 KiB of
// its 64 KiB; an H100's holds 2048 threads = 16 blocks = 66 KiB of its 228 KiB.
constexpr int kTileBytes = kTile * kPaddedRowStride * static_cast<int>(sizeof(float));
static_assert(kTileBytes <= 48 * 1024, "static shared memory is limited to 48 KiB per block");
static_assert(kTileBytes * (1024 / kThreadsPerBlock) <= 64 * 1024, "a full sm_75 SM's blocks fit its 64 KiB");
static_assert(kTileBytes * (2048 / kThreadsPerBlock) <= 228 * 1024, "a full sm_90 SM's blocks fit its 228 KiB");
// --8<-- [end:shared_budget]

struct TileOrigin {
  int64_t batch, row, col;  // the matrix, and the input row and column of the tile's corner
};

// Block b covers tile (b mod tiles_across) of its tile row; consecutive blocks take
// neighbouring tiles of the same input rows, so together they also read whole rows.
__device__ TileOrigin tile_origin(const TileGrid& grid) {
  int64_t block = blockIdx.x;
  const int64_t tile_col = block % grid.tiles_across;
  block /= grid.tiles_across;
  const int64_t tile_row = block % grid.tiles_down;
  return {block / grid.tiles_down, tile_row * kTile, tile_col * kTile};
}

// --8<-- [start:naive_kernel]
// Global memory to global memory, in the same two phases as the tiled kernel but without the
// tile. Lane tx reads input column col + tx: a warp reads 32 neighbours, one 128-byte line.
// It writes output row col + tx: a warp's 32 stores land in 32 different rows, 32 lines.
__global__ void __launch_bounds__(kThreadsPerBlock)
    naive_transpose_kernel(const float* __restrict__ in, float* __restrict__ out, TransposeShape shape, TileGrid grid) {
  const TileOrigin tile = tile_origin(grid);
  const int64_t col = tile.col + threadIdx.x;
  const float* matrix = in + tile.batch * shape.batch_stride;
  float* result = out + tile.batch * shape.rows * shape.cols;
  // All loads first, into registers: kRowsPerThread (8) independent loads in flight per thread, not one.
  float staged[kRowsPerThread];
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    const int64_t row = tile.row + threadIdx.y + j * kBlockRows;
    staged[j] = row < shape.rows && col < shape.cols ? matrix[row * shape.row_stride + col * shape.col_stride] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    const int64_t row = tile.row + threadIdx.y + j * kBlockRows;
    if (row < shape.rows && col < shape.cols) result[col * shape.rows + row] = staged[j];
  }
}
// --8<-- [end:naive_kernel]

// --8<-- [start:tiled_kernel]
// Stage a 32 x 32 tile in shared memory so that both global sides are row reads and row
// writes. kRowStride is the distance between tile rows in floats: kTile for the plain tiled
// kernel, kPaddedRowStride for the conflict-free one. Everything else is identical.
template <int kRowStride>
__global__ void __launch_bounds__(kThreadsPerBlock)
    tiled_transpose_kernel(const float* __restrict__ in, float* __restrict__ out, TransposeShape shape, TileGrid grid) {
  __shared__ float tile[kTile][kRowStride];
  // TODO(lab02.2): load the block's tile row by row (lane threadIdx.x takes a column, so a warp reads one
  //   input row), wait for the whole block, then write the tile's columns as output rows (lane threadIdx.x takes an
  //   output column); guard both sides against the matrix edges
  (void)tile;
}
// --8<-- [end:tiled_kernel]

// --8<-- [start:grid]
TileGrid transpose_grid(int64_t batch, int64_t rows, int64_t cols) {
  // Round up: the last tile of a row or column may be partial, and the kernels guard it.
  const int64_t tiles_across = course::ceil_div<int64_t>(cols, kTile);
  const int64_t tiles_down = course::ceil_div<int64_t>(rows, kTile);
  return {tiles_across, tiles_down, batch * tiles_down * tiles_across};
}
// --8<-- [end:grid]

TileLayout tile_layout() { return {kTile, kBlockRows, kTile, kPaddedRowStride, kWarpSize, kBanks, kBankWidthBytes}; }

// --8<-- [start:launch]
void launch_transpose(TransposeKernel kernel, const float* in, float* out, const TransposeShape& shape,
                      cudaStream_t stream) {
  const TileGrid grid = transpose_grid(shape.batch, shape.rows, shape.cols);
  if (grid.blocks == 0) return;  // an empty matrix: a grid of zero blocks is an invalid launch
  // One block per tile, in a 1-D grid: gridDim.x reaches 2^31 - 1 (y and z stop at 65535),
  // i.e. 2^41 elements, more than any GPU holds.
  if (grid.blocks > INT_MAX) {
    throw std::invalid_argument("transpose: " + std::to_string(grid.blocks) +
                                " tiles exceed the grid limit of 2^31 - 1");
  }
  const dim3 threads(kTile, kBlockRows);
  const int blocks = static_cast<int>(grid.blocks);
  switch (kernel) {
    case TransposeKernel::kNaive: naive_transpose_kernel<<<blocks, threads, 0, stream>>>(in, out, shape, grid); break;
    case TransposeKernel::kTiled:
      tiled_transpose_kernel<kTile><<<blocks, threads, 0, stream>>>(in, out, shape, grid);
      break;
    case TransposeKernel::kPadded:
      tiled_transpose_kernel<kPaddedRowStride><<<blocks, threads, 0, stream>>>(in, out, shape, grid);
      break;
  }
  COURSE_CHECK_LAUNCH();
}
// --8<-- [end:launch]

// Lab 02's kernel launchers: plain pointers, sizes and a stream, no torch types, so the
// kernel file compiles without torch headers and the wrapper is the only bridge.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// A batch of matrices to transpose. Element (b, r, c) of the input lives at
// in[b * batch_stride + r * row_stride + c * col_stride]: strides in elements, exactly as
// torch reports them, so slices, transposed views and expanded batches need no copy.
// The output is always contiguous, shape (batch, cols, rows).
struct TransposeShape {
  int64_t batch, rows, cols;
  int64_t batch_stride, row_stride, col_stride;
};

// How a launch covers the input: one block per 32 x 32 tile, numbered along a row of
// tiles first, then down the matrix, then through the batch.
struct TileGrid {
  int64_t tiles_across;  // ceil(cols / tile)
  int64_t tiles_down;    // ceil(rows / tile)
  int64_t blocks;        // batch * tiles_down * tiles_across
};

// The tile and block shapes the kernels use, for tests and notebooks to reason with.
struct TileLayout {
  int tile;               // a tile is tile x tile elements
  int block_rows;         // a block is tile x block_rows threads
  int tiled_row_stride;   // floats between rows of the shared tile in the unpadded kernel
  int padded_row_stride;  // ... and in the conflict-free one
  int warp_size;          // lanes of a warp: a tile row is one warp wide
  int banks;              // shared-memory banks ...
  int bank_bytes;         // ... each this many bytes wide
};

enum class TransposeKernel { kNaive, kTiled, kPadded };

TileGrid transpose_grid(int64_t batch, int64_t rows, int64_t cols);
TileLayout tile_layout();

// out = in transposed, per matrix of the batch, with the chosen kernel.
void launch_transpose(TransposeKernel kernel, const float* in, float* out, const TransposeShape& shape,
                      cudaStream_t stream);

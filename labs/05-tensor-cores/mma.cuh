// Lab skeleton generated from solutions/05-tensor-cores/mma.cuh by `./course labs` [lab-hash 31062382e9ce].
// Students: fill in the TODO(lab05.k) blocks, then run `./course grade 05`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 05's tensor-core building blocks: the fragment layout of mma.m16n8k16 and the shared-memory
// swizzle; the PTX wrappers (ldmatrix, mma, cp.async) are the course's, in <course/mma.cuh>, which
// lab 08 uses too. Every function here is one instruction or a few integer operations; the GEMM in
// linear_act.cu is built from them.
#pragma once

#include <course/cuda.cuh>
#include <course/mma.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor_cores.h"

using course::commit_copies;
using course::copy_chunk_async;
using course::kChunkBytes;
using course::kElementsPerChunk;
using course::kMmaK;
using course::kMmaM;
using course::kMmaN;
using course::kWarpSize;
using course::ldmatrix_x4;
using course::mma_16816;
using course::store_pair;
using course::wait_copies;
static_assert(kElementsPerChunk == kShapeMultiple, "the shape contract is one 16-byte chunk");

// --8<-- [start:fragments]
// Which element of a 16x8 tile does each lane hold? The PTX ISA fixes it (section
// "Matrix Fragments for mma.m16n8k16"): a warp is 8 groups of 4 lanes; group g = lane / 4 owns
// rows g and g + 8, and lane t = lane % 4 in the group owns the two adjacent columns 2t, 2t+1.
//   accumulator registers c0, c1: (row g,     cols 2t, 2t+1)
//                         c2, c3: (row g + 8, cols 2t, 2t+1)
// A (16x16) uses the same pattern twice along k (a0,a1: k 0-7; a2,a3: k 8-15), and B (16x8,
// k by n) the transposed one: b0 holds (k 2t, 2t+1; n g), b1 the same 8 rows of k further on.
__host__ __device__ inline Position accumulator_position(int lane, int register_index) {
  // TODO(lab05.1): the row and column, within the 16x8 accumulator tile, of accumulator register
  //   register_index (0..3) of lane (0..31)
  return {0, 0};
}

// ldmatrix.x4 loads four 8x8 matrices of 2-byte elements from shared memory; lanes 8i..8i+7
// give the addresses of the 8 rows of matrix i, and matrix i lands in register i of every lane
// with the accumulator pattern (lane l holds row l / 4, elements 2(l % 4), 2(l % 4) + 1).
// For A (16x16 at rows m, k-contiguous) registers a0..a3 must be the four 8x8 quarters in the
// order (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
// Returns the (row, first k) of the 8 elements whose address `lane` supplies.
__host__ __device__ inline Position ldmatrix_a_source(int lane) {
  // TODO(lab05.1): the row (0..15) and first k (0 or 8) of the 16x16 A tile that lane supplies to ldmatrix.x4
  return {0, 0};
}

// For B, stored as weight rows n (k-contiguous, like nn.Linear), one ldmatrix.x4 covers two
// n8 tiles: registers (b0, b1) of n-tile 0 = (n 0-7, k 0-7), (n 0-7, k 8-15), then (b0, b1) of
// n-tile 1 = (n 8-15, k 0-7), (n 8-15, k 8-15). Returns (n, first k) of lane's 8 elements.
__host__ __device__ inline Position ldmatrix_b_source(int lane) {
  // TODO(lab05.1): the n row (0..15) and first k (0 or 8) of the 16x16 weight tile that lane supplies to
  //   ldmatrix.x4
  return {0, 0};
}
// --8<-- [end:fragments]

// --8<-- [start:swizzle]
// Shared memory has 32 four-byte banks: 128 bytes (8 chunks) span all banks once, and the
// bank group of a chunk is its offset in chunks mod 8. One ldmatrix 8x8 matrix reads the same
// chunk column of 8 consecutive tile rows in one 128-byte pass, so those 8 chunks must land in
// 8 different groups. Unswizzled they do not: rows of C chunks (C = 4 for 32 elements, 8 for
// 64) put row r + 8 / C on the same banks as row r, so C = 4 is a 4-way conflict (rows r, r + 2,
// r + 4, r + 6) and C = 8 an 8-way one (every row starts at bank 0).
// The XOR swizzle permutes the chunks within each row by the row's "line" number
// (row / (8 / C)) mod C: consecutive lines get different permutations, and since c ^ p takes C
// different values for C different p, the 8 rows of an ldmatrix land in 8 different groups.
// Rows stay whole, so a cp.async of one chunk is still one 16-byte store, and 8 consecutive
// threads storing 128 contiguous bytes of rows still cover 8 groups.
constexpr int kBankLineChunks = 128 / kChunkBytes;  // 8 chunks cover the 32 banks once

template <int kChunksPerRow>
__host__ __device__ inline int swizzled_chunk(int row, int chunk) {
  static_assert(kChunksPerRow == 4 || kChunksPerRow == 8, "rows of 32 or 64 two-byte elements");
  constexpr int kRowsPerLine = kBankLineChunks / kChunksPerRow;
  return row * kChunksPerRow + (chunk ^ ((row / kRowsPerLine) % kChunksPerRow));
}
// --8<-- [end:swizzle]

// Blocks that share a row of x tiles should run together: groups of `group_rows` tile-rows sweep
// the tile-columns, so the x tiles of a group and the weight tiles they meet stay in L2
// (Triton's "grouped ordering"). Maps a linear tile index to its (tile-row, tile-column).
struct TileIndex {
  int64_t row, col;
};
__host__ __device__ inline TileIndex grouped_tile(int64_t index, int64_t tiles_m, int64_t tiles_n, int group_rows) {
  const int64_t per_group = group_rows * tiles_n;
  const int64_t group = index / per_group, in_group = index % per_group;
  const int64_t first_row = group * group_rows;
  const int64_t rows = tiles_m - first_row < group_rows ? tiles_m - first_row : group_rows;
  return {first_row + in_group % rows, in_group / rows};
}

// The PTX wrappers (ldmatrix, mma, cp.async) live in <course/mma.cuh>, shared with lab 08.

// ---------------------------------------------------------------- element conversions and activations
__device__ inline float to_float(__half v) { return __half2float(v); }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// --8<-- [start:activation]
// GELU, tanh approximation (torch.nn.functional.gelu(approximate="tanh")):
//   0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),  which equals  x / (1 + exp(-2u)).
// The second form costs two special-function instructions (ex2 and a reciprocal: __expf and
// __fdividef, ~1e-6 relative error, far below even fp16's 2^-11 rounding); tanhf is ~20
// instructions with a branch, and measured: at 4096^3 it made the whole mma.sync kernel 25%
// slower (0.519 against 0.413 ms without the activation, H200). Large negative x: exp -> inf
// and x / inf -> 0, GELU's own limit.
__device__ inline float activate(float x, Activation activation) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
  switch (activation) {
    case Activation::kRelu: return fmaxf(x, 0.0f);
    case Activation::kGelu: return __fdividef(x, 1.0f + __expf(-2.0f * kSqrt2OverPi * (x + kCubic * x * x * x)));
    default: return x;
  }
}
// --8<-- [end:activation]

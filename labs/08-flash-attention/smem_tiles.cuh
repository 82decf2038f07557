// Lab skeleton generated from solutions/08-flash-attention/smem_tiles.cuh by `./course labs` [lab-hash 94af7f625caa].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08's shared-memory tiles, used by the forward (flash_forward.cu) and the backward
// (flash_backward.cu): rows of Q, K, V, dO of 64 or 128 two-byte elements (8 or 16 16-byte chunks),
// stored XOR-swizzled so that every ldmatrix reads 8 different bank groups, and the per-lane byte
// offsets those reads start from. Lesson 05 derived the swizzle for rows of 4 or 8 chunks; here rows
// are whole multiples of the 8-chunk bank line, so the XOR is the row's index mod 8.
#pragma once

#include <course/mma.cuh>
#include <cuda_runtime.h>

#include <cstdint>

namespace attention_tiles {

// --8<-- [start:swizzle]
// Shared memory has 32 four-byte banks: 128 bytes (8 chunks) span them once, so the bank group of a
// 16-byte chunk is its chunk offset mod 8. Every ldmatrix 8x8 matrix below (plain or .trans) reads
// one chunk column c of 8 consecutive tile rows r0 .. r0 + 7 (r0 a multiple of 8) in one pass. Rows
// are 8 or 16 chunks, a multiple of 8, so unswizzled every row starts in group 0 and those 8 chunks
// all fall in group c % 8: an 8-way conflict. Stored at chunk c ^ (r % 8) of its row instead, the
// chunk falls in group (c % 8) ^ (r % 8), which takes 8 different values on the 8 rows: no conflict.
// The XOR touches the low 3 bits only, so a chunk stays in its row (a cp.async of one chunk is still
// one 16-byte store), and the kChunks consecutive threads that copy one row store to a permutation
// of it: 8 consecutive chunks, 8 groups, no conflict there either.
template <int kChunks>
__host__ __device__ constexpr int swizzled(int row, int chunk) {
  static_assert(kChunks % 8 == 0, "the XOR must stay inside the row");
  return row * kChunks + (chunk ^ (row % 8));
}

// A lane's ldmatrix addresses in a swizzled tile, computed once per thread. Every read below starts
// its matrices at a tile row row0 that is a multiple of 8 plus the lane's own row (< 16), so the XOR
// takes the lane's row % 8 whatever row0 is; and at an even chunk chunk0 plus the lane's chunk bit
// (0 or 1), whose XOR touches only the low 3 bits. So (row0 + lane_row, chunk0 + lane_chunk) is at byte
//   bytes[(chunk0 % 8) / 2] + 16 (row0 kChunks + 8 (chunk0 / 8))
// with bytes[e] the offset of (lane_row, lane_chunk + 2e): four registers, and each read of an unrolled
// loop is one of them plus a constant (ldmatrix [reg + imm]).
template <int kChunks>
struct LaneOffsets {
  uint32_t bytes[4];
  __host__ __device__ LaneOffsets(int lane_row, int lane_chunk) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      bytes[e] = static_cast<uint32_t>(swizzled<kChunks>(lane_row, lane_chunk + 2 * e) * course::kChunkBytes);
  }
  // row0 % 8 == 0, chunk0 % 2 == 0.
  __host__ __device__ uint32_t at(int row0, int chunk0) const {
    return bytes[chunk0 % 8 / 2] + static_cast<uint32_t>((row0 * kChunks + chunk0 / 8 * 8) * course::kChunkBytes);
  }
};
// --8<-- [end:swizzle]

// A byte offset into a shared-memory tile, as the pointer the PTX wrappers take.
__device__ __forceinline__ const void* byte_at(const uint4* tile, uint32_t bytes) {
  return reinterpret_cast<const char*>(tile) + bytes;
}

}  // namespace attention_tiles

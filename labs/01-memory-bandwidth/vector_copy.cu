// Lab skeleton generated from solutions/01-memory-bandwidth/vector_copy.cu by `./course labs` [lab-hash ec0415fb084e].
// Students: fill in the TODO(lab01.k) blocks, then run `./course grade 01`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 01, part 2: the copy with 16-byte accesses. One float4 load moves four floats in one
// instruction, so a warp moves 512 bytes per instruction instead of 128, and each thread can
// keep several of them in flight: what it takes to reach the copy ceiling.
#include <course/cuda.cuh>

#include <algorithm>
#include <cstdint>

#include "memory_bandwidth.h"

// --8<-- [start:constants]
// The widest load a thread can issue is 16 bytes (LDG.E.128): a float4.
constexpr int kVectorBytes = sizeof(float4);
constexpr int kFloatsPerVector = kVectorBytes / sizeof(float);
static_assert(kVectorBytes == 16 && kFloatsPerVector == 4, "float4 is four 4-byte floats, 16-byte aligned");

// float4s each thread loads before it stores any: the bytes in flight. Little's law: to
// sustain bandwidth B with latency L, B * L bytes must be on their way at every moment.
// An H200 reads ~2.1 TB/s during a 4.2 TB/s copy; a DRAM load under that load takes ~1 us
// (assumed, not measured): ~2.1 MB in flight over 132 SMs = ~16 KB per SM, 8 bytes for each of
// 2048 resident threads, a floor (lesson 01, section 3). One float4 (16 B) per thread covers it on
// paper, with no margin for lower occupancy or the latency growing as the memory system fills;
// four (64 B, 128 KB per SM; four LDG.E.128 before the first store in the SASS) do, and they
// quarter the loop overhead per byte. Their 16 data registers fit in the 32 per thread
// that full occupancy leaves (65536 registers / 2048 threads).
constexpr int kVectorsPerThread = 4;
static_assert(kVectorsPerThread * kFloatsPerVector <= 65536 / 2048 / 2,
              "the loaded data must leave half of a thread's 32 registers for addresses and counters");
// --8<-- [end:constants]

// --8<-- [start:vector_split]
VectorSplit vector_split(uintptr_t src_address, uintptr_t dst_address, int64_t n) {
  // TODO(lab01.3): split n floats into a scalar head (until src and dst reach a 16-byte boundary), float4
  //   vectors and a scalar tail of fewer than 4; no vectors at all when src and dst cannot be 16-byte aligned at the
  //   same element
  return VectorSplit{n, 0, 0};
}
// --8<-- [end:vector_split]

// --8<-- [start:kernel]
__global__ void __launch_bounds__(kThreadsPerBlock)
    copy_vectorized_kernel(const float* __restrict__ src, float* __restrict__ dst, VectorSplit split) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t grid_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // TODO(lab01.4): three grid-stride loops: the scalar head [0, head); the float4 body, each thread loading
  //   kVectorsPerThread float4s (a warp's loads contiguous) before storing them; the scalar tail [head + 4 * vectors,
  //   n)
}
// --8<-- [end:kernel]

// --8<-- [start:launch]
void launch_copy_vectorized(const float* src, float* dst, int64_t n, int blocks, cudaStream_t stream) {
  if (n == 0) return;
  const VectorSplit split = vector_split(reinterpret_cast<uintptr_t>(src), reinterpret_cast<uintptr_t>(dst), n);
  // A thread's unit of work is one trip of the body loop (kVectorsPerThread float4s), or one
  // scalar when the pointers cannot align and everything is head.
  const int64_t work_items =
      std::max(course::ceil_div<int64_t>(split.vectors, kVectorsPerThread), split.head + split.tail);
  // One block per chunk, not lesson 00's single wave. Measured on an H200 (1 GiB; the variants
  // are in site/data/evidence/01-memory-bandwidth/grid_variants.txt): one wave reached 90% of
  // copy bandwidth, 16 waves 94%, one block per chunk 96%. The likely reason is balance: a fixed
  // one-wave split gives every SM the same share, so the copy ends when the slowest SM does;
  // many small blocks are handed out as SMs free up. The grid-stride loops stay, for forced
  // grids and for grids past INT_MAX blocks.
  const int64_t chunks = course::ceil_div<int64_t>(work_items, kThreadsPerBlock);
  const int grid = blocks > 0 ? blocks : static_cast<int>(std::min<int64_t>(chunks, INT32_MAX));
  copy_vectorized_kernel<<<grid, kThreadsPerBlock, 0, stream>>>(src, dst, split);
  COURSE_CHECK_LAUNCH();
}
// --8<-- [end:launch]

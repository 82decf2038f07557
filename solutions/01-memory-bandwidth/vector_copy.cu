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
  // SOLUTION BEGIN lab01.3: split n floats into a scalar head (until src and dst reach a 16-byte boundary), float4
  //   vectors and a scalar tail of fewer than 4; no vectors at all when src and dst cannot be 16-byte aligned at the
  //   same element
  VectorSplit all_scalar{n, 0, 0};
  // float4 needs both addresses on a 16-byte boundary at the same element. Advancing one
  // element moves both by 4 bytes, so their difference never changes: it must be a multiple
  // of 16 (unsigned wrap-around keeps the remainder right). A float tensor's address is a
  // multiple of 4, but a raw pointer need not be; then no number of elements aligns it.
  if ((src_address - dst_address) % kVectorBytes != 0) return all_scalar;
  if (src_address % sizeof(float) != 0) return all_scalar;
  // Bytes to the next 16-byte boundary, in floats: 0, 1, 2 or 3; never more than n.
  const int64_t to_boundary = static_cast<int64_t>((kVectorBytes - src_address % kVectorBytes) % kVectorBytes);
  const int64_t head = std::min<int64_t>(n, to_boundary / static_cast<int64_t>(sizeof(float)));
  const int64_t vectors = (n - head) / kFloatsPerVector;
  return VectorSplit{head, vectors, n - head - vectors * kFloatsPerVector};
  // SOLUTION STUB
  // return VectorSplit{n, 0, 0};
  // SOLUTION END
}
// --8<-- [end:vector_split]

// --8<-- [start:kernel]
__global__ void __launch_bounds__(kThreadsPerBlock)
    copy_vectorized_kernel(const float* __restrict__ src, float* __restrict__ dst, VectorSplit split) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t grid_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // SOLUTION BEGIN lab01.4: three grid-stride loops: the scalar head [0, head); the float4 body, each thread loading
  //   kVectorsPerThread float4s (a warp's loads contiguous) before storing them; the scalar tail [head + 4 * vectors,
  //   n)
  // 1. Scalar head: at most 3 elements (or all n when the pointers cannot align).
  for (int64_t i = thread; i < split.head; i += grid_threads) dst[i] = src[i];

  // 2. The body, as float4s. vector_split guarantees src + head and dst + head are 16-byte aligned.
  const float4* src4 = reinterpret_cast<const float4*>(src + split.head);
  float4* dst4 = reinterpret_cast<float4*>(dst + split.head);
  // A block copies chunks of blockDim.x * kVectorsPerThread float4s. Thread t takes vectors
  // t, t + blockDim.x, t + 2 * blockDim.x, ... of its chunk, so each of the kVectorsPerThread
  // loads of a warp covers 32 consecutive float4s: 512 contiguous bytes.
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kVectorsPerThread;
  const int64_t full_chunks = split.vectors / chunk;
  for (int64_t c = blockIdx.x; c < full_chunks; c += gridDim.x) {
    const int64_t first = c * chunk + threadIdx.x;
    float4 values[kVectorsPerThread];
#pragma unroll
    for (int k = 0; k < kVectorsPerThread; ++k) values[k] = src4[first + k * blockDim.x];  // all loads issued...
#pragma unroll
    for (int k = 0; k < kVectorsPerThread; ++k) dst4[first + k * blockDim.x] = values[k];  // ...before any store
  }
  // The vectors after the last full chunk: one float4 per thread, fewer than a chunk in all.
  for (int64_t v = full_chunks * chunk + thread; v < split.vectors; v += grid_threads) dst4[v] = src4[v];

  // 3. Scalar tail: the last (n - head) % 4 elements.
  const int64_t tail_begin = split.head + split.vectors * kFloatsPerVector;
  for (int64_t i = tail_begin + thread; i < tail_begin + split.tail; i += grid_threads) dst[i] = src[i];
  // SOLUTION END
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

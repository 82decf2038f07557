// Lab 03: the sum of a whole array, in two passes (deterministic) or with atomics
// (one pass, not bitwise reproducible), and the per-warp reduction on its own.
#include <course/cuda.cuh>

#include <algorithm>

#include "reduce.cuh"
#include "reductions.h"

using reduce::kThreadsPerBlock;
using reduce::kWarpSize;

// --8<-- [start:unroll]
// A memory-bound kernel is fast when enough bytes are in flight to cover the memory's
// latency (Little's law, lesson 01): a sum only reads, at up to the ~4.2 TB/s an H200's copy
// moves, so ~4.2 MB at an assumed ~1 us, ~32 KB per SM, a floor. 2048 resident threads x one
// 16-byte load each is just that, with no margin, so every thread issues kVectorsInFlight loads
// before it adds any of them: 128 KB in flight per SM (LDG.E.128 x4 in the SASS).
constexpr int kVectorsInFlight = 4;
// --8<-- [end:unroll]

// --8<-- [start:partial_sums]
// First pass: each block reduces its share of x to one float. kAtomic: add it into
// out[0] with atomicAdd; otherwise store it in partials[blockIdx.x].
template <typename T, bool kAtomic>
__global__ void __launch_bounds__(kThreadsPerBlock)
    partial_sums_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ partials, float* __restrict__ out) {
  constexpr int kElems = reduce::kElemsPerVector<T>;
  // x splits into a head (elements before the first 16-byte boundary; none for a fresh
  // torch allocation), whole vectors, and a tail of fewer than kElems elements.
  const int64_t head = reduce::elements_before_alignment(x, n);
  const int64_t n_vectors = (n - head) / kElems;
  const int64_t tail_start = head + n_vectors * kElems;
  const T* vectors = x + head;  // 16-byte aligned
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;

  float thread_sum = 0.0f;
  // SOLUTION BEGIN lab03.3: grid-stride over the whole vectors: per trip load kVectorsInFlight vectors (vectors + (i +
  //   k * threads) * kElems, k = 0..kVectorsInFlight-1) with reduce::load_vector BEFORE adding any, into kElems
  //   independent float accumulators; then the vectors left over, one per trip; then the scalar elements: the head
  //   x[thread] for thread < head and the tail x[tail_start + thread] for thread < n - tail_start. Sum the accumulators
  //   into thread_sum
  float acc[kElems] = {};  // kElems independent add chains, not one long dependent one
  int64_t i = thread;
  for (; i + (kVectorsInFlight - 1) * threads < n_vectors; i += kVectorsInFlight * threads) {
    float v[kVectorsInFlight][kElems];
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) reduce::load_vector(vectors + (i + k * threads) * kElems, v[k]);
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc[e] += v[k][e];
    }
  }
  for (; i < n_vectors; i += threads) {  // fewer than kVectorsInFlight vectors were left for this thread
    float v[kElems];
    reduce::load_vector(vectors + i * kElems, v);
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[e] += v[e];
  }
  if (thread < head) acc[0] += reduce::to_float(x[thread]);
  if (thread < n - tail_start) acc[0] += reduce::to_float(x[tail_start + thread]);
#pragma unroll
  for (int e = 0; e < kElems; ++e) thread_sum += acc[e];
  // SOLUTION END

  const float block_sum = reduce::block_all_reduce<kThreadsPerBlock>(thread_sum, reduce::Sum{});
  if (threadIdx.x == 0) {
    if constexpr (kAtomic) {
      atomicAdd(out, block_sum);  // the order of the blocks' adds, and so the rounding, varies
    } else {
      partials[blockIdx.x] = block_sum;
    }
  }
}
// --8<-- [end:partial_sums]

// --8<-- [start:final_sum]
// Second pass: one block sums the partials. Each thread walks a fixed set of them in a
// fixed order and the block reduce's order is fixed too: the same partials always give
// the same bits. There are at most one wave of partials (~1000), a few per thread.
__global__ void __launch_bounds__(kThreadsPerBlock)
    final_sum_kernel(const float* __restrict__ partials, int count, float* __restrict__ out) {
  float thread_sum = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) thread_sum += partials[i];
  const float total = reduce::block_all_reduce<kThreadsPerBlock>(thread_sum, reduce::Sum{});
  if (threadIdx.x == 0) *out = total;
}
// --8<-- [end:final_sum]

// --8<-- [start:sum_grid]
LaunchConfig sum_grid(int64_t n, int sm_count, int resident_blocks_per_sm) {
  // SOLUTION BEGIN lab03.3: kThreadsPerBlock threads; as many blocks as are resident at once (one wave: sm_count *
  //   resident_blocks_per_sm), but no more than ceil(n / kThreadsPerBlock) so that every block has work, and at least 1
  // One wave: every block starts at once and, the grid-stride loop giving each the same
  // share, all finish together. A second wave would start late and leave SMs idle at the
  // end, and every extra block adds a partial for the second pass to read.
  const int64_t one_wave = static_cast<int64_t>(sm_count) * resident_blocks_per_sm;
  const int64_t needed_blocks = course::ceil_div<int64_t>(n, kThreadsPerBlock);
  LaunchConfig config{static_cast<int>(std::max<int64_t>(1, std::min(needed_blocks, one_wave))), kThreadsPerBlock};
  // SOLUTION STUB
  // LaunchConfig config{1, kThreadsPerBlock};
  // SOLUTION END
  return config;
}
// --8<-- [end:sum_grid]

// --8<-- [start:launch_sum]
template <typename T>
LaunchConfig sum_launch_config(int64_t n, int blocks_override) {
  // Registers, not only the thread limit, can cap the blocks an SM holds: ask the
  // occupancy calculator how many of THIS kernel fit, once per element type and GPU.
  static course::PerDeviceCache occupancy;  // a static of this template: one per element type
  const int resident_blocks_per_sm =
      course::resident_blocks_per_sm(occupancy, partial_sums_kernel<T, false>, kThreadsPerBlock);
  LaunchConfig config = sum_grid(n, course::device_attribute(cudaDevAttrMultiProcessorCount), resident_blocks_per_sm);
  if (blocks_override > 0) config.blocks = blocks_override;
  return config;
}

template <typename T>
void launch_sum(const T* x, int64_t n, LaunchConfig config, float* partials, float* out, bool deterministic,
                cudaStream_t stream) {
  if (deterministic) {
    partial_sums_kernel<T, false><<<config.blocks, config.threads, 0, stream>>>(x, n, partials, out);
    COURSE_CHECK_LAUNCH();
    final_sum_kernel<<<1, kThreadsPerBlock, 0, stream>>>(partials, config.blocks, out);
    COURSE_CHECK_LAUNCH();
  } else {
    COURSE_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream));  // the atomics add into out
    partial_sums_kernel<T, true><<<config.blocks, config.threads, 0, stream>>>(x, n, partials, out);
    COURSE_CHECK_LAUNCH();
  }
}
// --8<-- [end:launch_sum]

// --8<-- [start:warp_reduce_kernel]
// One warp per 32-element segment. Lanes past the end contribute the identity instead
// of returning: the shuffles need all 32 lanes. The LAST lane writes, so a reduction that
// leaves its total in lane 0 only (a __shfl_down_sync tree) is caught by the grader.
template <typename T, typename Op>
__global__ void warp_reduce_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ out, Op op) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t segments = course::ceil_div<int64_t>(n, kWarpSize);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t s = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; s < segments;
       s += warps) {
    const int64_t i = s * kWarpSize + lane;
    const float total = reduce::warp_all_reduce(i < n ? reduce::to_float(x[i]) : Op::identity(), op);
    if (lane == kWarpSize - 1) out[s] = total;
  }
}
// --8<-- [end:warp_reduce_kernel]

// A grid-stride loop over segments: one wave of blocks (as the sum's first pass), fewer when
// the segments do not fill it.
template <typename T, typename Op>
static void launch_warp_reduce_with(const T* x, int64_t n, float* out, Op op, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
  static course::PerDeviceCache occupancy;  // a static of this template: one per kernel
  const int64_t one_wave = static_cast<int64_t>(course::device_attribute(cudaDevAttrMultiProcessorCount)) *
                           course::resident_blocks_per_sm(occupancy, warp_reduce_kernel<T, Op>, kThreadsPerBlock);
  const int64_t needed_blocks = course::ceil_div<int64_t>(course::ceil_div<int64_t>(n, kWarpSize), kWarpsPerBlock);
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min(needed_blocks, one_wave)));
  warp_reduce_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(x, n, out, op);
  COURSE_CHECK_LAUNCH();
}

template <typename T>
void launch_warp_reduce(const T* x, int64_t n, ReduceOp op, float* out, cudaStream_t stream) {
  if (n == 0) return;
  if (op == ReduceOp::kSum) {
    launch_warp_reduce_with(x, n, out, reduce::Sum{}, stream);
  } else {
    launch_warp_reduce_with(x, n, out, reduce::Max{}, stream);
  }
}

// The two element types the wrapper dispatches to.
#define INSTANTIATE(T)                                                                              \
  template LaunchConfig sum_launch_config<T>(int64_t, int);                                         \
  template void launch_sum<T>(const T*, int64_t, LaunchConfig, float*, float*, bool, cudaStream_t); \
  template void launch_warp_reduce<T>(const T*, int64_t, ReduceOp, float*, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

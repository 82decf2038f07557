// Lab skeleton generated from solutions/01-memory-bandwidth/scalar_copy.cu by `./course labs` [lab-hash 18d8aadc7391].
// Students: fill in the TODO(lab01.k) blocks, then run `./course grade 01`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 01, part 1: two scalar copies that do the same work and differ only in WHICH element
// each thread touches. Their speeds differ by an order of magnitude: that is coalescing.
#include <course/cuda.cuh>

#include <algorithm>

#include "memory_bandwidth.h"

// --8<-- [start:copy_launch]
// One full wave, as in lesson 00: every SM holds max_threads_per_sm / threads blocks at once;
// more blocks would only queue behind them and do what the grid-stride loop does anyway.
LaunchConfig copy_launch(int64_t work_items, int threads, int sm_count, int max_threads_per_sm) {
  const int64_t resident_blocks = static_cast<int64_t>(sm_count) * std::max(1, max_threads_per_sm / threads);
  const int64_t needed_blocks = course::ceil_div<int64_t>(work_items, threads);
  return {static_cast<int>(std::max<int64_t>(1, std::min(needed_blocks, resident_blocks))), threads};
}
// --8<-- [end:copy_launch]

// --8<-- [start:coalesced]
__global__ void __launch_bounds__(kThreadsPerBlock)
    copy_coalesced_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n) {
  // TODO(lab01.1): grid-stride copy dst[i] = src[i] where consecutive threads take consecutive elements, so a
  //   warp's 32 loads fall into one 128-byte line
}
// --8<-- [end:coalesced]

// --8<-- [start:strided]
__global__ void __launch_bounds__(kThreadsPerBlock)
    copy_strided_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n, int64_t stride) {
  // TODO(lab01.2): copy every element exactly once, but with neighbouring threads `stride` elements apart:
  //   view the n elements as rows of `stride` columns, give thread t row t (grid-stride over rows) and walk the columns
  //   one after another; skip positions >= n in the last, short row
}
// --8<-- [end:strided]

LaunchConfig copy_launch_on_current_device(int64_t work_items, int blocks) {
  LaunchConfig launch =
      copy_launch(work_items, kThreadsPerBlock, course::device_attribute(cudaDevAttrMultiProcessorCount),
                  course::device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor));
  if (blocks > 0) launch.blocks = blocks;
  return launch;
}

void launch_copy_coalesced(const float* src, float* dst, int64_t n, int blocks, cudaStream_t stream) {
  if (n == 0) return;  // a grid of zero blocks is an invalid launch, not a no-op
  const LaunchConfig launch = copy_launch_on_current_device(n, blocks);
  copy_coalesced_kernel<<<launch.blocks, launch.threads, 0, stream>>>(src, dst, n);
  COURSE_CHECK_LAUNCH();
}

void launch_copy_strided(const float* src, float* dst, int64_t n, int64_t stride, int blocks, cudaStream_t stream) {
  if (n == 0) return;
  // A stride past n changes nothing (every row but the first is empty) but would make the
  // kernel loop over columns that hold no element; n also keeps row * stride from overflowing.
  stride = std::min(stride, n);
  const LaunchConfig launch =
      copy_launch_on_current_device(course::ceil_div<int64_t>(n, stride), blocks);  // one thread per row
  copy_strided_kernel<<<launch.blocks, launch.threads, 0, stream>>>(src, dst, n, stride);
  COURSE_CHECK_LAUNCH();
}

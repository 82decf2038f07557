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
  // SOLUTION BEGIN lab01.1: grid-stride copy dst[i] = src[i] where consecutive threads take consecutive elements, so a
  //   warp's 32 loads fall into one 128-byte line
  // Thread t of the grid takes t, t + S, t + 2S, ... (S = threads in the grid). On every trip,
  // the 32 threads of a warp read 32 neighbouring floats: 128 contiguous bytes, four 32-byte
  // sectors, the fewest a warp's 4-byte loads can touch.
  const int64_t grid_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += grid_threads) {
    dst[i] = src[i];
  }
  // SOLUTION END
}
// --8<-- [end:coalesced]

// --8<-- [start:strided]
__global__ void __launch_bounds__(kThreadsPerBlock)
    copy_strided_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n, int64_t stride) {
  // SOLUTION BEGIN lab01.2: copy every element exactly once, but with neighbouring threads `stride` elements apart:
  //   view the n elements as rows of `stride` columns, give thread t row t (grid-stride over rows) and walk the columns
  //   one after another; skip positions >= n in the last, short row
  // Row-major view: element e sits at row e / stride, column e % stride, and there are
  // ceil(n / stride) rows. A thread owns rows; for each column in turn it copies
  // row * stride + column. Neighbouring threads own neighbouring rows, so a warp's 32 loads
  // are `stride` floats apart: from stride 8 (32 bytes) on, each hits its own sector.
  // Every (row, column) pair is visited once, so every element below n is copied once.
  const int64_t rows = course::ceil_div<int64_t>(n, stride);
  const int64_t grid_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t column = 0; column < stride; ++column) {
    for (int64_t row = first_row; row < rows; row += grid_threads) {
      const int64_t element = row * stride + column;
      if (element < n) dst[element] = src[element];  // the last row may be short
    }
  }
  // SOLUTION END
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

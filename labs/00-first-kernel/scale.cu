// Lab skeleton generated from solutions/00-first-kernel/scale.cu by `./course labs` [lab-hash a05e2811dace].
// Students: fill in the TODO(lab00.k) blocks, then run `./course grade 00`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 00: the first kernels. One thread per element would need as many threads as
// elements; a grid-stride loop lets a grid of any size cover any n.
#include <course/cuda.cuh>

#include <algorithm>

#include "first_kernel.h"

// --8<-- [start:threads]
// 256 threads = 8 warps per block. Why this number:
//  - a multiple of the 32-thread warp, so no warp runs partly empty;
//  - at most 1024, the hardware's limit per block;
//  - at least 2048 / 32 = 64: an SM holds at most 32 blocks, so smaller blocks would
//    hit that cap before the 2048 resident threads of sm_80/sm_90 (1024 on sm_75);
//  - it divides 1024 and 2048, so whole blocks fill an SM on every GPU we support.
constexpr int kThreadsPerBlock = 256;
static_assert(kThreadsPerBlock % course::kWarpSize == 0, "whole warps only");
static_assert(kThreadsPerBlock <= 1024, "the hardware limit of threads per block");
static_assert(kThreadsPerBlock >= 2048 / 32, "32 blocks per SM must be able to reach 2048 threads");
static_assert(1024 % kThreadsPerBlock == 0 && 2048 % kThreadsPerBlock == 0, "whole blocks fill an SM");
// --8<-- [end:threads]

int threads_per_block() { return kThreadsPerBlock; }

// --8<-- [start:scale_kernel]
__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float alpha, int64_t n) {
  // TODO(lab00.1): grid-stride loop: start at this thread's global index and step by the number of threads in
  //   the whole grid, so any grid covers all n elements
}
// --8<-- [end:scale_kernel]

__global__ void axpy_kernel(float alpha, const float* __restrict__ x, const float* __restrict__ y,
                            float* __restrict__ out, int64_t n) {
  // TODO(lab00.3): the same grid-stride loop, computing out[i] = alpha * x[i] + y[i]
}

// --8<-- [start:launch_config]
LaunchConfig launch_config(int64_t n, int sm_count, int max_threads_per_sm) {
  // TODO(lab00.2): derive the launch: kThreadsPerBlock threads; enough blocks to cover n, but no more than fit
  //   on the GPU at once (sm_count * max_threads_per_sm threads), since the grid-stride loop covers the rest
  LaunchConfig config{1, 1};
  return config;
}
// --8<-- [end:launch_config]

static LaunchConfig config_for(int64_t n, int blocks) {
  LaunchConfig config = launch_config(n, course::device_attribute(cudaDevAttrMultiProcessorCount),
                                      course::device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor));
  if (blocks > 0) config.blocks = blocks;
  return config;
}

// --8<-- [start:launch_scale]
void launch_scale(const float* x, float* y, float alpha, int64_t n, int blocks, cudaStream_t stream) {
  if (n == 0) return;  // a grid of zero blocks is an invalid launch, not a no-op
  const LaunchConfig config = config_for(n, blocks);
  scale_kernel<<<config.blocks, config.threads, 0, stream>>>(x, y, alpha, n);
  COURSE_CHECK_LAUNCH();
}
// --8<-- [end:launch_scale]

void launch_axpy(float alpha, const float* x, const float* y, float* out, int64_t n, int blocks, cudaStream_t stream) {
  if (n == 0) return;
  const LaunchConfig config = config_for(n, blocks);
  axpy_kernel<<<config.blocks, config.threads, 0, stream>>>(alpha, x, y, out, n);
  COURSE_CHECK_LAUNCH();
}

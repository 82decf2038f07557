// Lab 00's kernel launchers: plain pointers and a stream, no torch types, so the
// kernel file compiles without torch headers and the wrapper is the only bridge.
#pragma once

#include <course/cuda.cuh>
#include <cuda_runtime.h>

#include <cstdint>

using course::LaunchConfig;

// The kernels' threads per block (kThreadsPerBlock), for the grader and the notebook.
int threads_per_block();

// Threads per block and blocks per grid for a grid-stride loop over n >= 1 elements,
// given the GPU's multiprocessor count and resident-thread limit per multiprocessor.
LaunchConfig launch_config(int64_t n, int sm_count, int max_threads_per_sm);

// y = alpha * x over n floats. blocks = 0 derives the grid with launch_config;
// any other value forces that many blocks (the result must not change).
void launch_scale(const float* x, float* y, float alpha, int64_t n, int blocks, cudaStream_t stream);

// out = alpha * x + y over n floats; blocks as for launch_scale.
void launch_axpy(float alpha, const float* x, const float* y, float* out, int64_t n, int blocks, cudaStream_t stream);

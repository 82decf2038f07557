// Lab 03's kernel launchers: plain pointers and a stream, no torch types. Each
// launcher is a template over the input's element type, instantiated in the .cu
// files for float and __nv_bfloat16; the wrapper picks one from the tensor's dtype.
// Every kernel accumulates in float, whatever it loads.
#pragma once

#include <course/cuda.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

using course::LaunchConfig;

// The numbers the kernels are built with (reduce.cuh, row_stats.cu), for the grader and the notebook.
struct ReductionConstants {
  int warp_size;
  int threads_per_block;
  int vector_bytes;      // one vector load
  int longest_warp_row;  // row_stats gives rows of up to this many columns to a warp, longer ones to a block
};
ReductionConstants reduction_constants();

// The first pass of the sum: one partial sum per block, one full wave of blocks
// (sm_count * resident_blocks_per_sm, what the occupancy calculator says fits),
// fewer when n is too small to give every thread an element.
LaunchConfig sum_grid(int64_t n, int sm_count, int resident_blocks_per_sm);

// The grid the GPU in use gets for n elements of T (blocks_override > 0 forces the
// block count); the wrapper sizes the partials buffer with its .blocks.
template <typename T>
LaunchConfig sum_launch_config(int64_t n, int blocks_override);

// out[0] = sum of x[0..n), n >= 1, over the grid `config` (from sum_launch_config).
// deterministic: per-block partials, then one block sums them in a fixed order, so
//   the same input on the same GPU and grid gives the same bits every run.
// otherwise: each block atomicAdds its partial into out[0] in whatever order the
//   blocks finish: one pass, no partials buffer, but the rounding, and so the low
//   bits of the result, can change from run to run.
template <typename T>
void launch_sum(const T* x, int64_t n, LaunchConfig config, float* partials, float* out, bool deterministic,
                cudaStream_t stream);

// out[s] = sum (or max) of the 32-element segment x[32 s, 32 s + 32), one warp per segment:
// the warp all-reduce on its own, for the grader and the notebook.
enum class ReduceOp { kSum, kMax };
template <typename T>
void launch_warp_reduce(const T* x, int64_t n, ReduceOp op, float* out, cudaStream_t stream);

// The statistics softmax needs, per row of a rows x cols row-major matrix:
// row_max[r] = max_j x[r, j] and row_sumexp[r] = sum_j exp(x[r, j] - row_max[r]).
template <typename T>
void launch_row_stats(const T* x, int64_t rows, int64_t cols, float* row_max, float* row_sumexp, cudaStream_t stream);

// Threads that share one row: a warp for short rows, a block for long ones.
int row_stats_threads_per_row(int64_t cols);

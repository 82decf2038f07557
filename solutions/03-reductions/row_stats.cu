// Lab 03: row-wise reductions, the base of softmax and of every norm. For each row,
// the two statistics a softmax needs: m = max(x) and s = sum(exp(x - m)); then
// softmax(x) = exp(x - m) / s, and subtracting m keeps exp from overflowing.
#include <course/cuda.cuh>

#include <algorithm>

#include "reduce.cuh"
#include "reductions.h"

using reduce::kThreadsPerBlock;
using reduce::kWarpSize;

// --8<-- [start:threads_per_row]
// A warp per row while each lane has at most kMaxElemsPerLane elements to walk (rows of
// up to 32 x 32 = 1024), a whole block per row beyond. A warp needs no shared memory and
// no __syncthreads; a block spreads a long row over 8x more threads, which keeps a few
// long rows from running on a few warps while the rest of the GPU idles.
constexpr int kMaxElemsPerLane = 32;
int row_stats_threads_per_row(int64_t cols) {
  return cols <= static_cast<int64_t>(kWarpSize) * kMaxElemsPerLane ? kWarpSize : kThreadsPerBlock;
}
// --8<-- [end:threads_per_row]

ReductionConstants reduction_constants() {
  return {kWarpSize, kThreadsPerBlock, reduce::kVectorBytes, kWarpSize * kMaxElemsPerLane};
}

// kElems consecutive elements at p as floats: one 16-byte load, or one element.
template <typename T, int kElems>
__device__ __forceinline__ void load_elems(const T* p, float (&v)[kElems]) {
  if constexpr (kElems > 1) {
    reduce::load_vector(p, v);  // kElems == reduce::kElemsPerVector<T> here
  } else {
    v[0] = reduce::to_float(*p);
  }
}

// --8<-- [start:row_stats_kernel]
// kThreadsPerRow threads (a warp or the block) share each row. kElems elements per load:
// reduce::kElemsPerVector<T> when every row starts 16-byte aligned, else 1.
template <typename T, int kThreadsPerRow, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_stats_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, float* __restrict__ row_max,
                     float* __restrict__ row_sumexp) {
  static_assert(kThreadsPerBlock % kThreadsPerRow == 0, "whole rows per block");
  constexpr int kRowsPerBlock = kThreadsPerBlock / kThreadsPerRow;
  const int thread_in_row = threadIdx.x % kThreadsPerRow;
  const int64_t loads_per_row = cols / kElems;  // cols % kElems == 0 when kElems > 1
  // Grid-stride over rows. The whole group (warp or block) takes the same trips, so no
  // lane leaves a shuffle, and no thread a __syncthreads, that the others still reach.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* row_x = x + row * cols;
    float m = reduce::Max::identity();
    float s = reduce::Sum::identity();
    // SOLUTION BEGIN lab03.4: two sweeps over the row, each with load_elems(row_x + i * kElems, v) at load indices
    //   thread_in_row, thread_in_row + kThreadsPerRow, ... < loads_per_row: first the thread's max, made the row's max
    //   with reduce::group_all_reduce<kThreadsPerRow>(m, reduce::Max{}) so that every thread knows it; then the
    //   thread's sum of expf(v - m), all-reduced with reduce::Sum{}
    // Sweep 1: the row's max. Neighbouring threads load neighbouring vectors: coalesced.
#pragma unroll 4
    for (int64_t i = thread_in_row; i < loads_per_row; i += kThreadsPerRow) {
      float v[kElems];
      load_elems(row_x + i * kElems, v);
#pragma unroll
      for (int e = 0; e < kElems; ++e) m = fmaxf(m, v[e]);
    }
    m = reduce::group_all_reduce<kThreadsPerRow>(m, reduce::Max{});  // every thread needs m below
    // Sweep 2: sum of exp(x - m). The row was just read by this SM, so these loads mostly
    // hit L1/L2 instead of HBM: the kernel reads x from memory about once.
#pragma unroll 4
    for (int64_t i = thread_in_row; i < loads_per_row; i += kThreadsPerRow) {
      float v[kElems];
      load_elems(row_x + i * kElems, v);
#pragma unroll
      for (int e = 0; e < kElems; ++e) s += expf(v[e] - m);  // each term in (0, 1]: no overflow
    }
    s = reduce::group_all_reduce<kThreadsPerRow>(s, reduce::Sum{});
    // SOLUTION END
    if (thread_in_row == 0) {
      row_max[row] = m;
      row_sumexp[row] = s;
    }
  }
}
// --8<-- [end:row_stats_kernel]

template <typename T, int kThreadsPerRow, int kElems>
static void launch_row_stats_with(const T* x, int64_t rows, int64_t cols, float* row_max, float* row_sumexp,
                                  cudaStream_t stream) {
  constexpr int kRowsPerBlock = kThreadsPerBlock / kThreadsPerRow;
  constexpr int64_t kMaxBlocks = (int64_t{1} << 31) - 1;  // gridDim.x's limit; the row loop covers the rest
  const int blocks = static_cast<int>(std::min(course::ceil_div<int64_t>(rows, kRowsPerBlock), kMaxBlocks));
  row_stats_kernel<T, kThreadsPerRow, kElems>
      <<<blocks, kThreadsPerBlock, 0, stream>>>(x, rows, cols, row_max, row_sumexp);
  COURSE_CHECK_LAUNCH();
}

template <typename T, int kThreadsPerRow>
static void launch_row_stats_per_row(const T* x, int64_t rows, int64_t cols, float* row_max, float* row_sumexp,
                                     cudaStream_t stream) {
  // Vector loads need every row to start on a 16-byte boundary: x aligned and cols a
  // multiple of the vector (true of most real widths: 128, 1000, 4096, ...).
  constexpr int kVector = reduce::kElemsPerVector<T>;
  if (cols % kVector == 0 && reduce::elements_before_alignment(x, cols) == 0) {
    launch_row_stats_with<T, kThreadsPerRow, kVector>(x, rows, cols, row_max, row_sumexp, stream);
  } else {
    launch_row_stats_with<T, kThreadsPerRow, 1>(x, rows, cols, row_max, row_sumexp, stream);
  }
}

template <typename T>
void launch_row_stats(const T* x, int64_t rows, int64_t cols, float* row_max, float* row_sumexp, cudaStream_t stream) {
  if (rows == 0) return;
  if (row_stats_threads_per_row(cols) == kWarpSize) {
    launch_row_stats_per_row<T, kWarpSize>(x, rows, cols, row_max, row_sumexp, stream);
  } else {
    launch_row_stats_per_row<T, kThreadsPerBlock>(x, rows, cols, row_max, row_sumexp, stream);
  }
}

template void launch_row_stats<float>(const float*, int64_t, int64_t, float*, float*, cudaStream_t);
template void launch_row_stats<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t, float*, float*, cudaStream_t);

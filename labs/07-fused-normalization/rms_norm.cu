// Lab skeleton generated from solutions/07-fused-normalization/rms_norm.cu by `./course labs` [lab-hash c7a28bbb4894].
// Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 07, RMSNorm over the last dimension: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)
// per row, as torch.nn.functional.rms_norm. The forward also writes rstd (one float a row) for
// the backward, which would otherwise need a pass over x to recompute it. The backward, for a row
// with g = weight * grad_y:
//   grad_x = rstd * g - rstd^3 * x * mean(g * x)       (the second term: rstd depends on every x)
//   grad_weight = the sum over rows of grad_y * x * rstd, a column sum, made bitwise reproducible
//   as lab 06's grad_bias: per-chunk partial rows, then a second kernel that adds them in order.
#include <course/cuda.cuh>

#include <algorithm>
#include <cstdint>

#include "normalization.h"
#include "row_reduce.cuh"

// --8<-- [start:rstd]
// 1 / sqrt(mean(x^2) + eps), from the row's sum of squares: both forward kernels call it.
template <typename C>
__device__ __forceinline__ C inverse_rms(C sum_sq, int64_t n, C eps) {
  // TODO(lab07.4): return 1 / sqrt(sum_sq / n + eps) with rsqrt_of, in C: the mean over the row's n
  //   elements (not over the slots a thread holds), eps inside the root, as in torch.nn.functional.rms_norm
  return C(1);  // no normalization at all: y = x * weight
}
// --8<-- [end:rstd]

// --8<-- [start:forward]
// The register path: the row is read once, its sum of squares reduced, and y written from registers.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rms_norm_registers_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                              Compute<T>* __restrict__ rstd, int64_t rows, int64_t n, Compute<T> eps) {
  using C = Compute<T>;
  using Slice = RowSlice<T, kRowThreads, kElemsPerThread, kElems>;
  constexpr int kRowsPerBlock = kThreadsPerBlock / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  for (int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kRowThreads; row < rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    Slice slice;
    slice.load(x + row * n, n, t, C(0));  // 0 past the row: nothing to the sum of squares
    // TODO(lab07.4): the row's sum of squares in C (row_all_reduce<kRowThreads>, SumOp<C>), r =
    //   inverse_rms(sum, n, eps), stored to rstd[row] by the row's thread 0; then each value of slice.v becomes
    //   (x * r) * w, w the weight of its column (one Pack<T, kElems> at weight + Slice::column(j, t), for columns < n)
    slice.store(y + row * n, n, t);
  }
}

// The streaming path, one block per row: pass 1 the sum of squares, pass 2 y.
template <typename T, int kElems>
__global__ void __launch_bounds__(kStreamThreads)
    rms_norm_streaming_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                              Compute<T>* __restrict__ rstd, int64_t rows, int64_t n, Compute<T> eps) {
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  const int64_t packs = n / kElems;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * n;
    T* y_row = y + row * n;
    // TODO(lab07.4): pass 1: the row's sum of squares with stream_row<T, kElems>({x_row}, packs, visit) and
    //   block_all_reduce<kStreamThreads>; r = inverse_rms(...), rstd[row] = r by thread 0; pass 2:
    //   stream_row<T, kElems>({x_row, weight}, ...) and store (x * r) * w, rounded once, as pack p of y_row
  }
}
// --8<-- [end:forward]

template <typename T>
void launch_rms_norm_forward(const T* x, const T* weight, T* y, Compute<T>* rstd, int64_t rows, int64_t n, double eps,
                             RowPath path, cudaStream_t stream) {
  // rows > 0 with n = 0 still launches: rstd = 1 / sqrt(0 / 0 + eps) is NaN, as torch's mean of nothing.
  if (rows == 0) return;  // a grid of zero blocks is an invalid launch
  const Compute<T> e = static_cast<Compute<T>>(eps);
  with_row_kernel<T>(
      n, path, {x, weight, y},
      [&](auto row_threads, auto elems_per_thread, auto elems) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        rms_norm_registers_kernel<T, kRowThreads, decltype(elems_per_thread)::value, decltype(elems)::value>
            <<<register_blocks(rows, kRowThreads), kThreadsPerBlock, 0, stream>>>(x, weight, y, rstd, rows, n, e);
        COURSE_CHECK_LAUNCH();
      },
      [&](auto elems) {
        rms_norm_streaming_kernel<T, decltype(elems)::value>
            <<<stream_blocks(rows), kStreamThreads, 0, stream>>>(x, weight, y, rstd, rows, n, e);
        COURSE_CHECK_LAUNCH();
      });
}

// --8<-- [start:backward]
// The register path of the backward. Block b owns rows [b rows_per_chunk, (b + 1) rows_per_chunk)
// (the grid is grad_weight_chunks(rows) blocks); its kRowsPerBlock row groups take every
// kRowsPerBlock-th of them. A thread's slice covers the same columns in every row, so it sums
// grad_y * x * rstd of its columns over its rows in registers, and the block writes one row of
// partials at the end.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rms_norm_backward_registers_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                                       const T* __restrict__ weight, const Compute<T>* __restrict__ rstd,
                                       T* __restrict__ grad_x, Compute<T>* __restrict__ partials, int64_t rows,
                                       int64_t n, int64_t rows_per_chunk) {
  using C = Compute<T>;
  using Slice = RowSlice<T, kRowThreads, kElemsPerThread, kElems>;
  constexpr int kRowsPerBlock = kThreadsPerBlock / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  const int group = threadIdx.x / kRowThreads;
  const int64_t chunk = blockIdx.x;
  const int64_t chunk_end = (chunk + 1) * rows_per_chunk < rows ? (chunk + 1) * rows_per_chunk : rows;
  C sums[Slice::kPacks][kElems] = {};  // this thread's columns: sum of grad_y * x * rstd over its rows
  for (int64_t row = chunk * rows_per_chunk + group; row < chunk_end; row += kRowsPerBlock) {
    Slice gs, xs;  // 0 past the row: nothing to the dot or to the sums
    gs.load(grad_y + row * n, n, t, C(0));
    xs.load(x + row * n, n, t, C(0));
    const C r = rstd[row];
    // TODO(lab07.5): for each column < n of the slice (weight: one Pack<T, kElems> at weight +
    //   Slice::column(j, t)): add grad_y * x * r to sums, then make gs.v the product g = weight * grad_y and add
    //   g * x to the row's dot (row_all_reduce<kRowThreads>, SumOp<C>); then gs.v = r * g - (r^3 dot / n) * x
    //   (gs is stored to grad_x for you)
    gs.store(grad_x + row * n, n, t);
  }

  // The block's column sums -> partials[chunk, :]. Its kRowsPerBlock row groups (8 warps, or 1
  // block) hold sums of the same columns: added in the order 0, 1, ..., through shared memory, t
  // innermost so that a warp's 32 stores of one (j, e) fall into 32 consecutive words, one per bank.
  __shared__ C group_sums[kRowsPerBlock][Slice::kPacks][kElems][kRowThreads];  // 256 threads x E: 32 KB at most
  // TODO(lab07.5): store sums[j][e] in group_sums[group][j][e][t]; __syncthreads(); then group 0 adds the
  //   kRowsPerBlock values of each of its columns < n in the order 0, 1, ... and stores the total at
  //   partials[chunk * n + column + e]
}

// The streaming path: block b walks the rows of chunk b one after the other, two passes each.
// Thread t visits the same packs of every row (stream_row's order depends on t alone), so it
// alone updates those columns of partials[chunk, :], in row order: no race, and a fixed order.
template <typename T, int kElems>
__global__ void __launch_bounds__(kStreamThreads)
    rms_norm_backward_streaming_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                                       const T* __restrict__ weight, const Compute<T>* __restrict__ rstd,
                                       T* __restrict__ grad_x, Compute<T>* __restrict__ partials, int64_t rows,
                                       int64_t n, int64_t rows_per_chunk) {
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  const int64_t packs = n / kElems;
  const int64_t first_row = int64_t{blockIdx.x} * rows_per_chunk;
  const int64_t chunk_end = first_row + rows_per_chunk < rows ? first_row + rows_per_chunk : rows;
  C* partial_row = partials + int64_t{blockIdx.x} * n;
  for (int64_t row = first_row; row < chunk_end; ++row) {
    const T* g_row = grad_y + row * n;
    const T* x_row = x + row * n;
    T* gx_row = grad_x + row * n;
    const C r = rstd[row];
    // TODO(lab07.5): pass 1: the row's dot sum(weight * grad_y * x) with stream_row<T, kElems>({g_row,
    //   x_row, weight}, ...) and block_all_reduce; pass 2: the same walk, storing r * (w * grad_y) - (r^3 dot / n) * x
    //   as pack p of gx_row, and setting each column's partial_row[p * kElems + e] to grad_y * x * r plus its old
    //   value (plus nothing on the chunk's first row: partials are not zeroed)
  }
}
// --8<-- [end:backward]

// --8<-- [start:finalize]
// grad_weight[col] = the sum of partials[0..chunks, col], as lab 06's finalize: a block takes 32
// columns; row lane r adds chunks r, r + 8, r + 16, ... in that order, then row lane 0 adds the
// 8 sums in the order 0, 1, ..., 7. The order depends on chunks alone: the same bits every run.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    grad_weight_finalize_kernel(const Compute<T>* __restrict__ partials, int64_t chunks, int64_t n,
                                T* __restrict__ grad_weight) {
  using C = Compute<T>;
  __shared__ C lane_sums[kRowLanes][kColumnThreads];
  const int lane = threadIdx.x % kColumnThreads;
  const int row_lane = threadIdx.x / kColumnThreads;
  const int64_t strips = course::ceil_div<int64_t>(n, kColumnThreads);
  for (int64_t strip = blockIdx.x; strip < strips; strip += gridDim.x) {  // uniform across the block
    const int64_t col = strip * kColumnThreads + lane;
    // TODO(lab07.6): the column's sum in a fixed order: row lane r adds partials[k * n + col] for k = r,
    //   r + kRowLanes, ... < chunks (nothing when col >= n) into a C; store it in lane_sums[row_lane][lane],
    //   __syncthreads(), and let row lane 0 add lane_sums[0..kRowLanes)[lane] in order and store the total, rounded
    //   once, in grad_weight[col]; __syncthreads() again before the next strip
  }
}
// --8<-- [end:finalize]

template <typename T>
void launch_rms_norm_backward(const T* grad_y, const T* x, const T* weight, const Compute<T>* rstd, T* grad_x,
                              T* grad_weight, Compute<T>* partials, int64_t rows, int64_t n, RowPath path,
                              cudaStream_t stream) {
  if (n == 0) return;  // grad_x and grad_weight are empty
  if (rows == 0) {
    // grad_weight is the sum over no rows: zero (all-zero bits are 0 in each of the four types).
    COURSE_CUDA_CHECK(cudaMemsetAsync(grad_weight, 0, n * sizeof(T), stream));
    return;
  }
  const int64_t rows_per_chunk = grad_weight_rows_per_chunk(rows);
  const int64_t chunks = grad_weight_chunks(rows);  // <= kMaxPartialRows blocks
  // One block per chunk on both paths: the partial rows are the same rows_per_chunk rows' sums.
  const int blocks = static_cast<int>(chunks);
  with_row_kernel<T>(
      n, path, {grad_y, x, weight, grad_x},
      [&](auto row_threads, auto elems_per_thread, auto elems) {
        rms_norm_backward_registers_kernel<T, decltype(row_threads)::value, decltype(elems_per_thread)::value,
                                           decltype(elems)::value><<<blocks, kThreadsPerBlock, 0, stream>>>(
            grad_y, x, weight, rstd, grad_x, partials, rows, n, rows_per_chunk);
        COURSE_CHECK_LAUNCH();
      },
      [&](auto elems) {
        rms_norm_backward_streaming_kernel<T, decltype(elems)::value>
            <<<blocks, kStreamThreads, 0, stream>>>(grad_y, x, weight, rstd, grad_x, partials, rows, n, rows_per_chunk);
        COURSE_CHECK_LAUNCH();
      });
  // A block per 32 columns (past INT_MAX blocks the strip loop covers the rest).
  const int finalize_blocks =
      static_cast<int>(std::min<int64_t>(course::ceil_div<int64_t>(n, kColumnThreads), INT32_MAX));
  grad_weight_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock, 0, stream>>>(partials, chunks, n, grad_weight);
  COURSE_CHECK_LAUNCH();
}

#define INSTANTIATE(T)                                                                                             \
  template void launch_rms_norm_forward<T>(const T*, const T*, T*, Compute<T>*, int64_t, int64_t, double, RowPath, \
                                           cudaStream_t);                                                          \
  template void launch_rms_norm_backward<T>(const T*, const T*, const T*, const Compute<T>*, T*, T*, Compute<T>*,  \
                                            int64_t, int64_t, RowPath, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

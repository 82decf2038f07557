// Lab skeleton generated from solutions/07-fused-normalization/rms_norm.cu by `./course labs` [lab-hash 9d1b5c3f95e0].
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

// --8<-- [start:backward_step]
// The backward's register kernel takes kRows rows a step (issue 13). One row a step (the kernel
// before issue 13), a block per row: the threads load their slices of grad_y and x, all-reduce the
// row's dot over the block, then compute grad_x from registers and store it. Nothing is in flight
// while the block waits at the reduction's barriers (block_all_reduce has two), and the next row's
// loads start only after them. Two rows a step: both rows' loads are issued before the reduction, 2
// rows x 2 operands x 32 bytes = 128 bytes in flight a thread at 16 bfloat16 elements a thread (one
// row: 64), and the two dots are reduced at once, a pair of floats, behind one barrier
// (row_all_reduce_alternating): one barrier per two rows. The arithmetic and the order of every
// addition are those of one row a step, so grad_x and grad_weight keep their bits. Measured with
// tools/gpu/probe/lab07_rms_bwd.py on an H200 at (8, 4096, 4096) bfloat16 (tools/gpu/NOTES.md, lab
// 07): the backward 0.2141 ms, 89.0% of copy, against one row a step's 0.2624 ms, 72.6%; forward +
// backward 1.198x torch.compile of the composition, against 1.047x.
// Two rows where a block takes the row (a warp per row has no barrier to save; not measured) and
// a thread holds at most 64 bytes of each operand in the compute type (8 or 16 floats, 8 doubles):
// two rows of grad_y and x and the column sums are then 5 x 64 bytes, 80 registers of data, fewer
// than one row of 32 floats holds (3 x 128 bytes: 96). Registers a thread, ptxas 13.0
// (`./course build 07 -v`), two rows a step, sm_90a / sm_80 / sm_75, no spills (one row a step,
// sm_90a, in brackets):
//   16 a thread, 16-byte loads   bfloat16 116 / 116 / 114 (80), half 116 / 116 / 116 (78),
//                                float 122 / 122 / 128 (80)
//   8 a thread, 16-byte loads    bfloat16 75 / 73 / 73 (56), float 64 / 64 / 64 (56),
//                                double 122 / 121 / 122 (96)
//   scalar loads (odd n)         at most 121 (double, 8 a thread)
// At most 128: two blocks of 256 threads an SM still fit its 65536 registers, the one wave of
// kMaxPartialRows blocks that normalization.h counts on.
template <typename T, int kRowThreads, int kElemsPerThread>
constexpr int kBackwardRowsPerStep =
    kRowThreads == kThreadsPerBlock && kElemsPerThread * sizeof(Compute<T>) <= 64 ? 2 : 1;

// The step's dots, one per row, all-reduced together: the shuffles and the shared-memory slots of
// a lone float, once per row, in the same order, so each row's dot has the bits of its own reduction.
template <typename F, int kRows>
struct RowDots {
  F v[kRows];
};
template <typename F, int kRows>
struct SumRowDots {
  __device__ static RowDots<F, kRows> identity() { return {}; }  // zeros
  __device__ RowDots<F, kRows> operator()(RowDots<F, kRows> a, RowDots<F, kRows> b) const {
#pragma unroll
    for (int k = 0; k < kRows; ++k) a.v[k] += b.v[k];
    return a;
  }
};
template <typename F, int kRows>
__device__ __forceinline__ RowDots<F, kRows> shfl_xor(RowDots<F, kRows> d, int offset) {
#pragma unroll
  for (int k = 0; k < kRows; ++k) d.v[k] = shfl_xor(d.v[k], offset);
  return d;
}

// row_all_reduce with one barrier, where block_all_reduce has two: its second keeps the next
// call's stores out of the slots that this call's reads may still need. Here consecutive steps use
// two sets of slots, by the step's parity: a thread that stores into a set again, two steps on,
// has passed the barrier of the step between, which each thread reaches after its reads. The same
// operations in the same order as row_all_reduce: the same bits. Every thread of the block calls
// it, once a step.
template <int kRowThreads, typename V, typename Op>
__device__ __forceinline__ V row_all_reduce_alternating(V value, Op op, int64_t step) {
  if constexpr (kRowThreads == kWarpSize) {
    return warp_all_reduce(value, op);
  } else {
    static_assert(kRowThreads == kThreadsPerBlock, "a warp or the whole block per row");
    constexpr int kWarps = kRowThreads / kWarpSize;
    __shared__ V warp_results[2][kWarps];
    const int parity = static_cast<int>(step & 1);
    const int lane = threadIdx.x % kWarpSize;
    value = warp_all_reduce(value, op);
    if (lane == 0) warp_results[parity][threadIdx.x / kWarpSize] = value;
    __syncthreads();  // every warp's result is in shared memory before any warp reads them
    return warp_all_reduce(lane < kWarps ? warp_results[parity][lane] : Op::identity(), op);
  }
}
// --8<-- [end:backward_step]

// --8<-- [start:backward]
// The register path of the backward. Block b owns rows [b rows_per_chunk, (b + 1) rows_per_chunk)
// (the grid is grad_weight_chunks(rows) blocks); its kRowsPerBlock row groups take every
// kRowsPerBlock-th of them, kRows at a time: the step of group g that starts at row `first` takes
// rows first, first + kRowsPerBlock, ..., the rows it would take one at a time, in the same order.
// A step at the chunk's end may have fewer (a chunk of an odd number of rows, two a step): the rows
// past chunk_end are not loaded, add nothing and are not stored. A thread's slice covers the same
// columns in every row, so it sums grad_y * x * rstd of its columns over its rows in registers,
// and the block writes one row of partials at the end.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rms_norm_backward_registers_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                                       const T* __restrict__ weight, const Compute<T>* __restrict__ rstd,
                                       T* __restrict__ grad_x, Compute<T>* __restrict__ partials, int64_t rows,
                                       int64_t n, int64_t rows_per_chunk) {
  using C = Compute<T>;
  using Slice = RowSlice<T, kRowThreads, kElemsPerThread, kElems>;
  constexpr int kRowsPerBlock = kThreadsPerBlock / kRowThreads;
  constexpr int kRows = kBackwardRowsPerStep<T, kRowThreads, kElemsPerThread>;  // rows a step
  const int t = threadIdx.x % kRowThreads;
  const int group = threadIdx.x / kRowThreads;
  const int64_t chunk = blockIdx.x;
  const int64_t chunk_end = (chunk + 1) * rows_per_chunk < rows ? (chunk + 1) * rows_per_chunk : rows;
  C sums[Slice::kPacks][kElems] = {};  // this thread's columns: sum of grad_y * x * rstd over its rows
  int64_t step = 0;
  for (int64_t first = chunk * rows_per_chunk + group; first < chunk_end;
       first += int64_t{kRows} * kRowsPerBlock, ++step) {
    // This step's rows: kRows, or fewer at the chunk's end (the same for all the threads of a row).
    const int64_t rows_left = course::ceil_div<int64_t>(chunk_end - first, kRowsPerBlock);  // the group's, >= 1
    const int step_rows = rows_left < kRows ? static_cast<int>(rows_left) : kRows;
    Slice gs[kRows], xs[kRows];  // 0 past the row's end: nothing to the dot or to the sums
    C r[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (k >= step_rows) continue;
      const int64_t row = first + int64_t{k} * kRowsPerBlock;
      gs[k].load(grad_y + row * n, n, t, C(0));
      xs[k].load(x + row * n, n, t, C(0));
      r[k] = rstd[row];
    }
    RowDots<C, kRows> dots = {};  // dots.v[k]: row k's sum of g * x
    // TODO(lab07.5): for each row k < step_rows and each column < n of its slice (weight: one
    //   Pack<T, kElems> at weight + Slice::column(j, t)): add grad_y * x * r[k] to sums, then make gs[k].v the
    //   product g = weight * grad_y and add g * x to dots.v[k]
    // Every thread, once a step, whatever step_rows is: the block's barrier is in it.
    dots = row_all_reduce_alternating<kRowThreads>(dots, SumRowDots<C, kRows>{}, step);
    // TODO(lab07.5): for each row k < step_rows, with its whole-row dots.v[k]: gs[k].v = r * g -
    //   (r^3 dot / n) * x, r = r[k] (gs is stored to grad_x for you)
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (k < step_rows) gs[k].store(grad_x + (first + int64_t{k} * kRowsPerBlock) * n, n, t);
    }
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

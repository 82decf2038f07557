// Lab 07, softmax over the last dimension: y = exp(x - m) / s per row, m the row's max (which
// keeps exp from overflowing: every term is in (0, 1]) and s the sum of exp(x - m). Composed of
// separate ops (max, subtract, exp, sum, divide), each a kernel, the row's bytes would cross HBM
// several times; torch.softmax is one kernel, and so is each of the two paths here:
//   registers  the row is read from HBM once into registers, reduced twice (max, then the sum of
//              the exps) without leaving them, and written: 2 tensors' worth of bytes.
//   streaming  a row too long for registers is read twice. Pass 1 computes m and s together with
//              the online recurrence, pass 2 writes exp(x - m) / s. Lab 03 needed a pass for m and
//              another for s; the online form merges them into one.
// The backward, grad_x = y * (grad_y - dot(grad_y, y)), needs y alone (not x): one row dot.
#include <course/cuda.cuh>

#include <algorithm>
#include <cstdint>

#include "normalization.h"
#include "row_reduce.cuh"

// --8<-- [start:forward_registers]
// kRowThreads threads (a warp or the block) per row, kThreadsPerBlock / kRowThreads rows per
// block. The row loop is uniform across the threads of a row, so none leaves a shuffle or a
// __syncthreads that the others still reach.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    softmax_registers_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  using C = Compute<T>;
  constexpr int kRowsPerBlock = kThreadsPerBlock / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  for (int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kRowThreads; row < rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    RowSlice<T, kRowThreads, kElemsPerThread, kElems> slice;
    // Slots past the row hold -inf: no effect on the max, and exp(-inf - m) = 0 adds nothing to the sum.
    slice.load(x + row * n, n, t, minus_infinity<C>());
    // SOLUTION BEGIN lab07.1: softmax of the row in slice.v, in place, in C: the thread's max of slice.v, made the
    //   row's max with row_all_reduce<kRowThreads>(..., MaxOp<C>{}); replace each value by exp_of(value - row max)
    //   and sum them, the row's sum with row_all_reduce and SumOp<C>; multiply each by 1 / sum (the slice is
    //   stored for you)
    C row_max = minus_infinity<C>();
#pragma unroll
    for (int j = 0; j < slice.kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) row_max = max_of(row_max, slice.v[j][e]);
    }
    row_max = row_all_reduce<kRowThreads>(row_max, MaxOp<C>{});  // every thread needs it below
    C sum = 0;
#pragma unroll
    for (int j = 0; j < slice.kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        slice.v[j][e] = exp_of(slice.v[j][e] - row_max);  // in (0, 1]: no overflow, whatever the row holds
        sum += slice.v[j][e];
      }
    }
    sum = row_all_reduce<kRowThreads>(sum, SumOp<C>{});
    const C inv_sum = C(1) / sum;  // one division a row, then a multiply per element
#pragma unroll
    for (int j = 0; j < slice.kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) slice.v[j][e] *= inv_sum;
    }
    // SOLUTION END
    slice.store(y + row * n, n, t);
  }
}
// --8<-- [end:forward_registers]

// --8<-- [start:forward_streaming]
// One block per row (a grid-stride loop over rows past INT_MAX blocks). kElems as above.
template <typename T, int kElems>
__global__ void __launch_bounds__(kStreamThreads)
    softmax_streaming_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  const int64_t packs = n / kElems;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * n;
    T* y_row = y + row * n;
    MaxSum<C> stats = MergeMaxSum<C>::identity();  // (-inf, 0): nothing seen yet
    // SOLUTION BEGIN lab07.2: pass 1: walk the row with stream_row<T, kElems>({x_row}, packs, visit) and fold each
    //   value v into stats with the online recurrence m' = max_of(m, v), s' = s * exp(m - m') + exp(v - m') (both
    //   exps with shifted_exp, which is 0 for -inf); then merge the block's pairs with
    //   block_all_reduce<kStreamThreads>(stats, MergeMaxSum<C>{}) (and write MergeMaxSum in row_reduce.cuh)
    stream_row<T, kElems>({x_row}, packs, [&](int64_t, const P(&loaded)[1]) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const C v = to_compute(loaded[0].v[e]);
        const C m_new = max_of(stats.m, v);
        // The sum so far was taken relative to the old max: rescale it to the new one.
        stats.s = stats.s * shifted_exp(stats.m, m_new) + shifted_exp(v, m_new);
        stats.m = m_new;
      }
    });
    stats = block_all_reduce<kStreamThreads>(stats, MergeMaxSum<C>{});  // the row's (m, s), in every thread
    // SOLUTION END
    // Pass 2: the row again (from L2 where it is still there), written as exp(x - m) / s.
    const C inv_sum = C(1) / stats.s;
    stream_row<T, kElems, true>({x_row}, packs, [&](int64_t p, const P(&loaded)[1]) {
      P out;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        out.v[e] = from_compute<T>(exp_of(to_compute(loaded[0].v[e]) - stats.m) * inv_sum);
      }
      reinterpret_cast<P*>(y_row)[p] = out;
    });
  }
}
// --8<-- [end:forward_streaming]

// --8<-- [start:backward]
// grad_x = y * (grad_y - d), d = sum(grad_y * y) over the row: the row's y and grad_y in registers.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    softmax_backward_registers_kernel(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x,
                                      int64_t rows, int64_t n) {
  using C = Compute<T>;
  constexpr int kRowsPerBlock = kThreadsPerBlock / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  for (int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kRowThreads; row < rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    RowSlice<T, kRowThreads, kElemsPerThread, kElems> ys, gs;  // slots past the row: 0, nothing to the dot
    ys.load(y + row * n, n, t, C(0));
    gs.load(grad_y + row * n, n, t, C(0));
    // SOLUTION BEGIN lab07.3: the row's dot d = sum(gs.v * ys.v) (row_all_reduce, SumOp<C>), then gs.v = ys.v *
    //   (gs.v - d), in C (gs is stored to grad_x for you)
    C dot = 0;
#pragma unroll
    for (int j = 0; j < gs.kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot += gs.v[j][e] * ys.v[j][e];
    }
    dot = row_all_reduce<kRowThreads>(dot, SumOp<C>{});
#pragma unroll
    for (int j = 0; j < gs.kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) gs.v[j][e] = ys.v[j][e] * (gs.v[j][e] - dot);
    }
    // SOLUTION END
    gs.store(grad_x + row * n, n, t);
  }
}

// The same for long rows: pass 1 the dot, pass 2 grad_x (y and grad_y read twice).
template <typename T, int kElems>
__global__ void __launch_bounds__(kStreamThreads)
    softmax_backward_streaming_kernel(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x,
                                      int64_t rows, int64_t n) {
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  const int64_t packs = n / kElems;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* y_row = y + row * n;
    const T* g_row = grad_y + row * n;
    T* gx_row = grad_x + row * n;
    // SOLUTION BEGIN lab07.3: pass 1: the row's dot d = sum(grad_y * y) with stream_row<T, kElems>({y_row, g_row},
    //   packs, visit) and block_all_reduce<kStreamThreads>(..., SumOp<C>{}); pass 2: walk again and store
    //   y * (grad_y - d), rounded once, as the pack p of gx_row
    C dot = 0;
    stream_row<T, kElems>({y_row, g_row}, packs, [&](int64_t, const P(&loaded)[2]) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot += to_compute(loaded[0].v[e]) * to_compute(loaded[1].v[e]);
    });
    dot = block_all_reduce<kStreamThreads>(dot, SumOp<C>{});
    stream_row<T, kElems, true>({y_row, g_row}, packs, [&](int64_t p, const P(&loaded)[2]) {
      P out;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        out.v[e] = from_compute<T>(to_compute(loaded[0].v[e]) * (to_compute(loaded[1].v[e]) - dot));
      }
      reinterpret_cast<P*>(gx_row)[p] = out;
    });
    // SOLUTION END
  }
}
// --8<-- [end:backward]

// --8<-- [start:launch]
// The launchers pick the path, the bucket and the load width (row_reduce.cuh); one block per
// kThreadsPerBlock / kRowThreads rows on the register path, one block per row streaming.
template <typename T>
void launch_softmax_forward(const T* x, T* y, int64_t rows, int64_t n, RowPath path, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;  // nothing to write, and a grid of zero blocks is an invalid launch
  with_row_kernel<T>(
      n, path, {x, y},
      [&](auto row_threads, auto elems_per_thread, auto elems) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        softmax_registers_kernel<T, kRowThreads, decltype(elems_per_thread)::value, decltype(elems)::value>
            <<<register_blocks(rows, kRowThreads), kThreadsPerBlock, 0, stream>>>(x, y, rows, n);
        COURSE_CHECK_LAUNCH();
      },
      [&](auto elems) {
        softmax_streaming_kernel<T, decltype(elems)::value>
            <<<stream_blocks(rows), kStreamThreads, 0, stream>>>(x, y, rows, n);
        COURSE_CHECK_LAUNCH();
      });
}

template <typename T>
void launch_softmax_backward(const T* grad_y, const T* y, T* grad_x, int64_t rows, int64_t n, RowPath path,
                             cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  with_row_kernel<T>(
      n, path, {grad_y, y, grad_x},
      [&](auto row_threads, auto elems_per_thread, auto elems) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        softmax_backward_registers_kernel<T, kRowThreads, decltype(elems_per_thread)::value, decltype(elems)::value>
            <<<register_blocks(rows, kRowThreads), kThreadsPerBlock, 0, stream>>>(grad_y, y, grad_x, rows, n);
        COURSE_CHECK_LAUNCH();
      },
      [&](auto elems) {
        softmax_backward_streaming_kernel<T, decltype(elems)::value>
            <<<stream_blocks(rows), kStreamThreads, 0, stream>>>(grad_y, y, grad_x, rows, n);
        COURSE_CHECK_LAUNCH();
      });
}
// --8<-- [end:launch]

#define INSTANTIATE(T)                                                                            \
  template void launch_softmax_forward<T>(const T*, T*, int64_t, int64_t, RowPath, cudaStream_t); \
  template void launch_softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, RowPath, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

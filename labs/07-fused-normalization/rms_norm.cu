// Lab skeleton generated from solutions/07-fused-normalization/rms_norm.cu by `./course labs` [lab-hash 71ec543f2b8d].
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
#include <course/mma.cuh>

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
    //   (x * r) * w, w the weight of its column (one Pack<T, kElems> at weight + Slice::column(j, t), for columns < n,
    //   widened by course::widen_pack)
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

// --8<-- [start:backward_row]
// One row of the backward on a thread's slices of it (gs: grad_y, xs: x; 0 past the row's end), the arithmetic both
// backward register kernels share. backward_row_sums adds grad_y * x * r of each of the thread's columns to its
// sums and returns the thread's share of the row's dot, sum(weight * grad_y * x); once the kernel has added the row's
// shares, backward_row_grad_x turns gs into grad_x = r g - r^3 (dot / n) x, g = weight * grad_y.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__device__ __forceinline__ Compute<T> backward_row_sums(const RowSlice<T, kRowThreads, kElemsPerThread, kElems>& gs,
                                                        const RowSlice<T, kRowThreads, kElemsPerThread, kElems>& xs,
                                                        const T* __restrict__ weight, int t, int64_t n, Compute<T> r,
                                                        Compute<T> (&sums)[kElemsPerThread / kElems][kElems]) {
  using C = Compute<T>;
  using Slice = RowSlice<T, kRowThreads, kElemsPerThread, kElems>;
  // TODO(lab07.5): for each column < n of the slice (weight: one Pack<T, kElems> at weight +
  //   Slice::column(j, t), widened by course::widen_pack): add grad_y * x * r to sums, and g * x to the dot this
  //   returns, g = weight * grad_y
  return C(0);  // no sums and no dot: grad_weight = 0
}

template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__device__ __forceinline__ void backward_row_grad_x(RowSlice<T, kRowThreads, kElemsPerThread, kElems>& gs,
                                                    const RowSlice<T, kRowThreads, kElemsPerThread, kElems>& xs,
                                                    const T* __restrict__ weight, int t, int64_t n, Compute<T> r,
                                                    Compute<T> dot) {
  using C = Compute<T>;
  using Slice = RowSlice<T, kRowThreads, kElemsPerThread, kElems>;
  // TODO(lab07.5): c = r^3 (dot / n), rstd^3 mean(g x); then each value of gs (columns < n) becomes
  //   r * g - c * x, with g = weight * grad_y computed again as backward_row_sums did (the kernel stores gs to grad_x)
}
// --8<-- [end:backward_row]

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
    // The row's dot: each thread's share, added over the row's threads (a warp, or the block).
    const C dot = row_all_reduce<kRowThreads>(backward_row_sums(gs, xs, weight, t, n, r, sums), SumOp<C>{});
    backward_row_grad_x(gs, xs, weight, t, n, r, dot);
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

// --8<-- [start:backward_staged]
// The staged path of the backward ('auto' takes it for full rows where it runs: staged_grid). The
// register kernel's arithmetic, fed differently. The register kernel (a block of 256 threads a row) loads a row, waits
// for it, reduces it over the block behind a barrier, stores, and only then loads the next: 64 bytes a thread in
// flight, none across the barrier. Nsight Compute, H100, (8, 4096, 4096) bfloat16: DRAM 74% of peak, 24% of warp
// slots active, 54% of the warps' stalls waiting on memory and 15% at the barrier. Here:
//   - kStagedRows rows a step share one barrier: their dots are reduced together (RowDots);
//   - the rows reach shared memory by cp.async, one step ahead of the step being computed (a ring of kStagedSteps
//     steps), so loads stay in flight through the barrier; each thread copies exactly the packs it later reads,
//     which makes its own wait_copies all the synchronization the ring needs;
//   - a row is read from shared memory twice, before and after the barrier, instead of being held in registers
//     across it;
//   - one block an SM (the ring is kStagedSharedBytes), each taking rows b, b + G, b + 2G, ... of a grid of G: the
//     blocks' loads at any moment fall on neighbouring rows, and block b's column sums are partials[b, :].
// grad_x has the register kernel's bits (the same arithmetic and reduction order); grad_weight adds G partial rows,
// G a property of the GPU (its SMs), so its bits are reproducible on one GPU but may differ on another.
template <typename F, int kRows>
struct RowDots {
  F v[kRows];
};
template <typename F, int kRows>
struct SumRowDots {
  __device__ static RowDots<F, kRows> identity() { return {}; }
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

// The staged kernel takes rows that fill its row image, n = kThreadsPerBlock x kElemsPerThread (16-bit rows of 4096,
// float rows of 2048; staged_grid launches it for no other n), with n a compile-time constant: every column check of
// RowSlice and of the row's arithmetic then folds away. With n a run-time value, ptxas 13.0 wrapped the packs' loads
// and arithmetic in branches of their own (cuobjdump, sm_90a: 64 BSSY / BSYNC pairs and 98 branches, against none
// and 22 in the kernel of site/data/evidence/07-fused-normalization/rms_bwd.py), and the kernel measured 79% of copy
// against the probe's 95%; a run-time n that is not the row image's length (3000 bfloat16) measured slower than the
// register kernel.
template <typename T, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    rms_norm_backward_staged_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ weight,
                                    const Compute<T>* __restrict__ rstd, T* __restrict__ grad_x,
                                    Compute<T>* __restrict__ partials, int64_t rows) {
  using C = Compute<T>;
  using Slice = RowSlice<T, kThreadsPerBlock, kElemsPerThread, kElems>;
  static_assert(sizeof(Pack<T, kElems>) == course::kChunkBytes, "a pack is one 16-byte cp.async");
  static_assert(kStagedSharedBytes == kStagedSteps * kStagedRows * 2 * kThreadsPerBlock * kElemsPerThread * sizeof(T),
                "the ring holds kStagedSteps steps of kStagedRows rows of grad_y and x");
  constexpr int kWarps = kThreadsPerBlock / kWarpSize;
  constexpr int64_t n = int64_t{kThreadsPerBlock} * kElemsPerThread;  // the row fills its image exactly
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* const ring = reinterpret_cast<T*>(staged_bytes);       // [kStagedSteps][kStagedRows][2: grad_y, x][n]
  __shared__ RowDots<C, kStagedRows> warp_dots[2][kWarps];  // [step % 2]: one barrier a step (see below)
  // t < kThreadsPerBlock said to the compiler: with n a constant, column(j, t) < n is then known true, and the
  // checks of every pack fold away.
  const int t = threadIdx.x % kThreadsPerBlock, lane = t % kWarpSize;
  const int64_t first = blockIdx.x, stride = gridDim.x;  // this block's rows: first, first + stride, ...
  const int64_t count = (rows - first + stride - 1) / stride;
  const int64_t steps = course::ceil_div<int64_t>(count, kStagedRows);
  // Row k of a step, operand 0 (grad_y) or 1 (x), in shared memory: the row's packs at the columns they have in HBM.
  auto staged_row = [&](int64_t step, int k, int operand) {
    return ring + ((step % kStagedSteps * kStagedRows + k) * 2 + operand) * n;
  };
  auto issue = [&](int64_t step) {
    for (int k = 0; k < kStagedRows && step < steps; ++k) {
      const int64_t index = step * kStagedRows + k;
      if (index >= count) break;
      const int64_t row = first + index * stride;
#pragma unroll
      for (int j = 0; j < Slice::kPacks; ++j) {  // every pack inside the row: n fills the image
        const int64_t col = Slice::column(j, t);
        course::copy_chunk_async(staged_row(step, k, 0) + col, grad_y + row * n + col, true);
        course::copy_chunk_async(staged_row(step, k, 1) + col, x + row * n + col, true);
      }
    }
    course::commit_copies();  // a group even when empty: wait_copies counts groups
  };
  // Launched as a dependent launch (course::launch_after_prior_grid): nothing an earlier kernel wrote is read before
  // this wait (the forward's rstd, and grad_y or x when a kernel produced them).
  course::wait_for_prior_grid();
  for (int step = 0; step < kStagedSteps - 1; ++step) issue(step);
  C sums[Slice::kPacks][kElems] = {};
  for (int64_t step = 0; step < steps; ++step) {
    // Into the slots this thread read a step ago; its reads of them are done (their values were used).
    issue(step + kStagedSteps - 1);
    C r[kStagedRows];
#pragma unroll
    for (int k = 0; k < kStagedRows; ++k) {
      const int64_t index = step * kStagedRows + k;
      r[k] = index < count ? rstd[first + index * stride] : C(0);
    }
    course::wait_copies<kStagedSteps - 1>();  // this step's group has landed: this thread's packs of its rows
    reread_shared();
    RowDots<C, kStagedRows> dots = {};
#pragma unroll
    for (int k = 0; k < kStagedRows; ++k) {
      if (step * kStagedRows + k >= count) continue;
      Slice gs, xs;
      gs.load(staged_row(step, k, 0), n, t, C(0));
      xs.load(staged_row(step, k, 1), n, t, C(0));
      dots.v[k] = backward_row_sums(gs, xs, weight, t, n, r[k], sums);
    }
    // The block all-reduce of lab 03 over kStagedRows dots at once, with two sets of slots: a warp writes this
    // step's set again two steps later, after the next step's barrier, which every warp reaches only after its
    // reads of this step's set; so one barrier a step, not two.
    dots = warp_all_reduce(dots, SumRowDots<C, kStagedRows>{});
    if (lane == 0) warp_dots[step % 2][t / kWarpSize] = dots;
    __syncthreads();  // every warp's dots are in shared memory before any warp reads them
    dots = warp_all_reduce(lane < kWarps ? warp_dots[step % 2][lane] : SumRowDots<C, kStagedRows>::identity(),
                           SumRowDots<C, kStagedRows>{});
#pragma unroll
    for (int k = 0; k < kStagedRows; ++k) {
      const int64_t index = step * kStagedRows + k;
      if (index >= count) continue;
      Slice gs, xs;
      gs.load(staged_row(step, k, 0), n, t, C(0));
      xs.load(staged_row(step, k, 1), n, t, C(0));
      backward_row_grad_x(gs, xs, weight, t, n, r[k], dots.v[k]);
      gs.store(grad_x + (first + index * stride) * n, n, t);
    }
  }
  course::allow_next_grid();  // the finalize may be scheduled now; it waits for this kernel before reading partials
  course::wait_copies<0>();   // (only empty groups are left) nothing in flight when the block exits
  // partials: (G, n). A thread's kElems sums of a pack are consecutive columns: written as 16-byte packs of C, as
  // the rows are. With scalar stores (8 a pack) the kernel wrote 13.29 M L2 sectors where the probe's, whose
  // partials are 16-byte stores, wrote 12.70 M (Nsight Compute); as packs it measured 95.6% of copy against 94.8-95.0
  // (bfloat16, H100, separate calls; lesson 07's notes).
  constexpr int kSumElems = course::kElemsPerVector<C>;
  static_assert(kElems % kSumElems == 0, "a pack's sums are whole 16-byte packs of C");
#pragma unroll
  for (int j = 0; j < Slice::kPacks; ++j) {
    const int64_t col = Slice::column(j, t);
#pragma unroll
    for (int q = 0; q < kElems / kSumElems; ++q) {
      Pack<C, kSumElems> pack;
#pragma unroll
      for (int e = 0; e < kSumElems; ++e) pack.v[e] = sums[j][q * kSumElems + e];
      course::store_pack_global(partials + first * n + col + q * kSumElems, pack);
    }
  }
}

// --8<-- [end:backward_staged]

// Blocks the staged backward <T, kElemsPerThread, kElems> runs on the current GPU at once (its SMs times the blocks
// an SM holds: one, at 128 KiB of ring), asked once per GPU; 0 where it does not run: an image without cp.async
// (sm_75), or a shared-memory opt-in below the ring (sm_86, sm_89: 99 KiB), where 'auto' keeps the register kernel.
template <typename T, int kElemsPerThread, int kElems>
int rms_norm_backward_staged_slots() {
  static course::PerDeviceCache cache;
  return cache.get([] {
    const auto kernel = rms_norm_backward_staged_kernel<T, kElemsPerThread, kElems>;
    cudaFuncAttributes attributes;
    COURSE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (attributes.ptxVersion < 80) return 0;
    const int64_t opt_in = course::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    if (opt_in < kStagedSharedBytes + static_cast<int64_t>(attributes.sharedSizeBytes)) return 0;
    course::opt_in_dynamic_shared(kernel, kStagedSharedBytes, "rms_norm_backward (staged rows)");
    int blocks = 0;
    COURSE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreadsPerBlock, kStagedSharedBytes));
    return blocks * course::device_attribute(cudaDevAttrMultiProcessorCount);
  });
}

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
  course::wait_for_prior_grid();  // launched as a dependent launch: partials are read only after this
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

// The staged backward's grid (its rows of partials) for `rows` rows in register bucket <kRowThreads,
// kElemsPerThread> with kElems-element packs; 0 where the launcher runs the register kernel instead: another bucket
// or load width, a path other than 'auto', or a GPU the staged kernel does not run on.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
constexpr bool kStageable = kRowThreads == kThreadsPerBlock && kElemsPerThread * sizeof(T) == kStagedThreadBytes &&
                            kElems == kElemsPerVector<T>;

template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
int64_t staged_grid(int64_t rows, int64_t n, RowPath path) {
  if constexpr (kStageable<T, kRowThreads, kElemsPerThread, kElems>) {
    if (path != RowPath::kAuto || rows == 0 || n != int64_t{kRowThreads} * kElemsPerThread) return 0;
    const int64_t slots = rms_norm_backward_staged_slots<T, kElemsPerThread, kElems>();
    return std::min<int64_t>({rows, slots, grad_weight_chunks(rows)});  // <= the partials the caller allocates
  } else {
    return 0;
  }
}

template <typename T>
int64_t rms_norm_backward_staged_blocks(int64_t rows, int64_t n) {
  if (!use_registers<T>(RowPath::kAuto, n)) return 0;  // staged_grid takes only the n that fills a bucket
  int64_t grid = 0;
  with_register_bucket<T>(n, [&](auto row_threads, auto elems_per_thread) {
    grid = staged_grid<T, decltype(row_threads)::value, decltype(elems_per_thread)::value, kElemsPerVector<T>>(
        rows, n, RowPath::kAuto);
  });
  return grid;
}

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
  int64_t partial_rows = chunks;  // the staged path writes fewer: one per block of its grid
  with_row_kernel<T>(
      n, path, {grad_y, x, weight, grad_x},
      [&](auto row_threads, auto elems_per_thread, auto elems) {
        constexpr int kRowThreads = decltype(row_threads)::value, kE = decltype(elems_per_thread)::value;
        constexpr int kPackElems = decltype(elems)::value;
        if (const int64_t grid = staged_grid<T, kRowThreads, kE, kPackElems>(rows, n, path); grid > 0) {
          if constexpr (kStageable<T, kRowThreads, kE, kPackElems>) {
            const auto kernel = rms_norm_backward_staged_kernel<T, kE, kPackElems>;
            course::opt_in_dynamic_shared(kernel, kStagedSharedBytes, "rms_norm_backward (staged rows)");
            course::launch_after_prior_grid(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreadsPerBlock),
                                            kStagedSharedBytes, stream, grad_y, x, weight, rstd, grad_x, partials,
                                            rows);
            partial_rows = grid;
            return;
          }
        }
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
  // A dependent launch (course::launch_after_prior_grid): scheduled while the backward's last blocks drain.
  course::launch_after_prior_grid(grad_weight_finalize_kernel<T>, dim3(finalize_blocks), dim3(kThreadsPerBlock), 0,
                                  stream, partials, partial_rows, n, grad_weight);
}

#define INSTANTIATE(T)                                                                                             \
  template void launch_rms_norm_forward<T>(const T*, const T*, T*, Compute<T>*, int64_t, int64_t, double, RowPath, \
                                           cudaStream_t);                                                          \
  template void launch_rms_norm_backward<T>(const T*, const T*, const T*, const Compute<T>*, T*, T*, Compute<T>*,  \
                                            int64_t, int64_t, RowPath, cudaStream_t);                              \
  template int64_t rms_norm_backward_staged_blocks<T>(int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

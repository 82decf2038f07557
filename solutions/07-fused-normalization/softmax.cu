// Lab 07, softmax over the last dimension: y = exp(x - m) / s per row, m the row's max (which
// keeps exp from overflowing: every term is in (0, 1]) and s the sum of exp(x - m). Composed of
// separate ops (max, subtract, exp, sum, divide), each a kernel, the row's bytes would cross HBM
// several times; torch.softmax is one kernel, and so is each of the three paths here:
//   registers  the row is read from HBM once into registers, reduced twice (max, then the sum of
//              the exps) without leaving them, and written: 2 tensors' worth of bytes.
//   on chip    a row too long for one block's registers, still read once: kept in a 1024-thread
//              block's registers and shared memory (forward), or in the registers of a cluster of
//              4 such blocks (backward, sm_90). Given code (normalization.h says why these sizes).
//   streaming  a row too long for either is read twice. Pass 1 computes m and s together with
//              the online recurrence, pass 2 writes exp(x - m) / s. Lab 03 needed a pass for m and
//              another for s; the online form merges them into one.
// The backward, grad_x = y * (grad_y - dot(grad_y, y)), needs y alone (not x): one row dot.
#include <cooperative_groups.h>
#include <course/cuda.cuh>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

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

// --8<-- [start:cp_async]
// cp.async (sm_80): a copy from global to shared memory that does not pass through registers, so a
// thread can have all of its shared half in flight while its register loads are issued too. 16
// bytes bypass L1 (.cg, the only form of that size); 4 and 8 (the scalar path's floats and
// doubles) go through it (.ca). The "memory" clobbers keep the compiler from moving other memory
// accesses across the copy or the wait.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* shared, const void* global) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "the sizes cp.async copies");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(to), "l"(global), "n"(kBytes) : "memory");
  }
#else
  __trap();  // sm_75 has no cp.async; its only caller is compiled for sm_80 and newer
#endif
}

// Waits until every cp.async this thread issued has landed; its own later reads then see them.
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// --8<-- [end:cp_async]

// --8<-- [start:forward_on_chip]
// One block of kOnChipThreads per row (a grid-stride loop past INT_MAX rows); float and double.
// Thread t holds RowSlice's packs of the row's first kRegisterColumns columns in registers and the
// same packs of the next kRegisterColumns in dynamic shared memory, slots[j][t] (normalization.h
// draws both layouts). Only t reads its slots, so no barrier guards them. Each thread takes its own
// max m_t, turns its values into exp(v - m_t) and sums them to s_t; the block merges the (m_t, s_t)
// pairs into the row's (M, S) with lab07.2's MergeMaxSum, and y = exp(v - m_t) * exp(m_t - M) / S.
template <typename T, int kElems>
__global__ void __launch_bounds__(kOnChipThreads, 1)
    softmax_on_chip_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  static_assert(kOnChipForward<T>, "float and double: each shared slot holds an element, then its exp");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  using Slice = RowSlice<T, kOnChipThreads, kOnChipElemsPerThread<T>, kElems>;
  constexpr int64_t kRegisterColumns = int64_t{kOnChipThreads} * kOnChipElemsPerThread<T>;
  extern __shared__ __align__(16) unsigned char on_chip_shared[];
  P* slots = reinterpret_cast<P*>(on_chip_shared);  // [Slice::kPacks][kOnChipThreads], as many rows as the launch gave
  // The loops over the shared slots unroll by 8, all of a vector row's. Unrolled whole, the scalar
  // path's 32 slots a thread spilled (float: 96 bytes on sm_90a, 16 on sm_80; ptxas 13.0); as they
  // are, nothing spills. The register half's loops unroll whole: its slots are registers.
  constexpr int kSlotUnroll = 8;
  const int t = threadIdx.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * n;
    T* y_row = y + row * n;
    // Columns of the shared half: kRegisterColumns + Slice::column(j, t) for those below n (none when
    // n <= kRegisterColumns; shared_n is then <= 0).
    const int64_t shared_n = n - kRegisterColumns;
    // The shared half's copies first: they take no registers, so all of them are in flight while
    // the register half's loads are issued.
#pragma unroll kSlotUnroll
    for (int j = 0; j < Slice::kPacks; ++j) {
      const int64_t col = Slice::column(j, t);
      if (col < shared_n) cp_async<sizeof(P)>(&slots[j * kOnChipThreads + t], x_row + kRegisterColumns + col);
    }
    Slice slice;
    slice.load(x_row, n, t, minus_infinity<C>());  // -inf past the row: nothing to the max or the sum
    cp_async_wait_all();

    // The thread's max m_t over both halves.
    C m = minus_infinity<C>();
#pragma unroll
    for (int j = 0; j < Slice::kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) m = max_of(m, slice.v[j][e]);
    }
#pragma unroll kSlotUnroll
    for (int j = 0; j < Slice::kPacks; ++j) {
      if (Slice::column(j, t) >= shared_n) continue;
      const P p = slots[j * kOnChipThreads + t];
#pragma unroll
      for (int e = 0; e < kElems; ++e) m = max_of(m, p.v[e]);
    }
    reread_shared();
    // Each value becomes exp(v - m_t), in place, and s_t their sum. shifted_exp: a thread whose
    // values are all -inf (m_t = -inf) gets zeros, not exp(NaN).
    C s = 0;
#pragma unroll
    for (int j = 0; j < Slice::kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        slice.v[j][e] = shifted_exp(slice.v[j][e], m);
        s += slice.v[j][e];
      }
    }
#pragma unroll kSlotUnroll
    for (int j = 0; j < Slice::kPacks; ++j) {
      if (Slice::column(j, t) >= shared_n) continue;
      P p = slots[j * kOnChipThreads + t];
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        p.v[e] = shifted_exp(p.v[e], m);
        s += p.v[e];
      }
      slots[j * kOnChipThreads + t] = p;
    }
    reread_shared();
    // The row's (M, S) in every thread, merged from the threads' pairs.
    const MaxSum<C> total = block_all_reduce<kOnChipThreads>(MaxSum<C>{m, s}, MergeMaxSum<C>{});
    // One factor a thread: exp(m_t - M) / S, 0 for a thread that saw only -inf; for a row of -inf
    // it is 0 / 0 = NaN, the NaN torch.softmax gives there.
    const C scale = shifted_exp(m, total.m) / total.s;
#pragma unroll
    for (int j = 0; j < Slice::kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) slice.v[j][e] *= scale;
    }
    slice.store(y_row, n, t);
#pragma unroll kSlotUnroll
    for (int j = 0; j < Slice::kPacks; ++j) {
      const int64_t col = Slice::column(j, t);
      if (col >= shared_n) continue;
      P p = slots[j * kOnChipThreads + t];
#pragma unroll
      for (int e = 0; e < kElems; ++e) p.v[e] *= scale;
      *reinterpret_cast<P*>(y_row + kRegisterColumns + col) = p;
    }
  }
#else
  __trap();  // sm_75: no cp.async; softmax_on_chip_row(false) is 0 there, and the launcher streams
#endif
}
// --8<-- [end:forward_on_chip]

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

// --8<-- [start:backward_cluster]
// The backward on chip: a cluster of kClusterBlocks blocks per row (a grid-stride loop over rows
// past INT_MAX blocks), block `rank` holding columns [rank kBlockColumns, (rank + 1) kBlockColumns)
// of y and grad_y in registers, as RowSlices of kOnChipThreads threads. Each block reduces its
// part of dot(grad_y, y) and leaves it in its shared memory; every block then reads all
// kClusterBlocks parts through distributed shared memory and adds them in rank order, so the four
// blocks hold the same bits of the row's dot. Compiled for sm_90 only (clusters); below that the
// body traps, and the launcher never gets here (softmax_on_chip_row(true) is 0).
template <typename T, int kElems>
__global__ void __launch_bounds__(kOnChipThreads, 1)
    softmax_backward_cluster_kernel(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x,
                                    int64_t rows, int64_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using C = Compute<T>;
  using Slice = RowSlice<T, kOnChipThreads, kClusterElemsPerThread<T>, kElems>;
  constexpr int64_t kBlockColumns = int64_t{kOnChipThreads} * kClusterElemsPerThread<T>;
  __shared__ C partial_dot;  // this block's part of the dot, read by every block of the cluster
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int t = threadIdx.x;
  const int64_t clusters = gridDim.x / kClusterBlocks;
  for (int64_t row = blockIdx.x / kClusterBlocks; row < rows; row += clusters) {
    // This block's columns start at `first` (n for a block past a short row's end: it loads
    // nothing, its slots hold 0 and add nothing to the dot).
    const int64_t first = int64_t{rank} * kBlockColumns < n ? int64_t{rank} * kBlockColumns : n;
    const int64_t offset = row * n + first;
    Slice ys, gs;  // slots past the row: 0
    ys.load(y + offset, n - first, t, C(0));
    gs.load(grad_y + offset, n - first, t, C(0));
    C dot = 0;
#pragma unroll
    for (int j = 0; j < Slice::kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot += gs.v[j][e] * ys.v[j][e];
    }
    dot = block_all_reduce<kOnChipThreads>(dot, SumOp<C>{});
    if (t == 0) partial_dot = dot;
    cluster.sync();  // every block's partial_dot is written (release) before any block reads one (acquire)
    C row_dot = 0;
#pragma unroll
    for (int r = 0; r < kClusterBlocks; ++r) row_dot += *cluster.map_shared_rank(&partial_dot, r);
    // This block is done reading the others' partial_dot. The wait below, after the stores, keeps
    // any block from writing its next row's partial_dot, or exiting, while another still reads.
    cluster.barrier_arrive();
#pragma unroll
    for (int j = 0; j < Slice::kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) gs.v[j][e] = ys.v[j][e] * (gs.v[j][e] - row_dot);
    }
    gs.store(grad_x + offset, n - first, t);
    cluster.barrier_wait();
  }
#else
  __trap();
#endif
}
// --8<-- [end:backward_cluster]

// --8<-- [start:on_chip_host]
// The on-chip forward's dynamic shared memory for rows of n: the rows j of slots[j][t] that reach
// past the registers' columns, and only those (none for n <= kRegisterColumns).
template <typename T, int kElems>
size_t on_chip_shared_bytes(int64_t n) {
  constexpr int64_t kRegisterColumns = int64_t{kOnChipThreads} * kOnChipElemsPerThread<T>;
  constexpr int64_t kSlotRowColumns = int64_t{kOnChipThreads} * kElems;
  const int64_t slot_rows = course::ceil_div<int64_t>(std::max<int64_t>(0, n - kRegisterColumns), kSlotRowColumns);
  return static_cast<size_t>(slot_rows * kOnChipThreads * sizeof(Pack<T, kElems>));
}

// The longest row the on-chip forward <T, kElems> takes on the current GPU (0: none), found once per
// GPU: the register half, plus the whole 16-byte slot rows that the GPU's shared-memory opt-in
// holds beside the kernel's static shared memory (the same row lengths for both load widths: a
// scalar row needs no more shared memory than a vector row as long), with one block resident.
template <typename T, int kElems>
int64_t on_chip_forward_row() {
  static course::PerDeviceCache cache;
  return cache.get([] {
    const auto kernel = softmax_on_chip_kernel<T, kElems>;
    cudaFuncAttributes attributes;
    COURSE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (attributes.ptxVersion < 80) return 0;  // the image this GPU runs has no cp.async (sm_75): it traps
    constexpr int64_t kRegisterColumns = int64_t{kOnChipThreads} * kOnChipElemsPerThread<T>;
    constexpr int64_t kSlotRowBytes = int64_t{kOnChipThreads} * kVectorBytes;
    constexpr int64_t kSlotRowColumns = int64_t{kOnChipThreads} * kElemsPerVector<T>;
    const int64_t opt_in = course::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    const int64_t slot_rows =
        std::clamp<int64_t>((opt_in - static_cast<int64_t>(attributes.sharedSizeBytes)) / kSlotRowBytes, 0,
                            kOnChipSharedBytes / kSlotRowBytes);
    const int64_t longest = kRegisterColumns + slot_rows * kSlotRowColumns;
    const size_t bytes = on_chip_shared_bytes<T, kElems>(longest);
    // Past 48 KiB a kernel must ask for its dynamic shared memory: here, to ask the occupancy question; the
    // launch asks again (course::opt_in_dynamic_shared: this cached value may be another library's).
    course::opt_in_dynamic_shared(kernel, bytes, "softmax (on-chip rows)");
    int blocks = 0;
    COURSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kOnChipThreads, bytes));
    return blocks > 0 ? static_cast<int>(longest) : 0;
  });
}

// Launch configuration of the backward's clusters: `blocks` blocks of kOnChipThreads, kClusterBlocks
// a cluster (cudaLaunchKernelEx: <<<...>>> has no cluster size). Not copyable: config points at
// this object's attribute.
struct ClusterLaunch {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(int blocks, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kClusterBlocks;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(kOnChipThreads);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether the backward's cluster kernel <T, kElems> runs on the current GPU, found once per GPU: a
// GPU with cluster launch (sm_90), an image of the kernel compiled for it (a build whose newest
// target is older, run through its PTX, has only the trapping body), and at least one cluster of
// 4 such blocks resident at once (cudaOccupancyMaxActiveClusters; 0 where the GPU's partitions
// cannot place one, and an error where it cannot answer).
template <typename T, int kElems>
bool cluster_backward_runs() {
  static course::PerDeviceCache cache;
  return cache.get([] {
    if (course::device_attribute(cudaDevAttrClusterLaunch) == 0) return 0;
    const auto kernel = softmax_backward_cluster_kernel<T, kElems>;
    cudaFuncAttributes attributes;
    COURSE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (attributes.ptxVersion < 90) return 0;
    const ClusterLaunch launch(kClusterBlocks, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess) {
      (void)cudaGetLastError();  // not a sticky error: clear it, and stream
      return 0;
    }
    return clusters > 0 ? 1 : 0;
  }) == 1;
}

template <typename T>
int64_t softmax_on_chip_row(bool backward) {
  constexpr int kVector = kElemsPerVector<T>;
  if (backward) {
    return cluster_backward_runs<T, kVector>() && cluster_backward_runs<T, 1>() ? max_on_chip_backward_row<T>() : 0;
  }
  if constexpr (kOnChipForward<T>) {
    return std::min(on_chip_forward_row<T, kVector>(), on_chip_forward_row<T, 1>());
  } else {
    return 0;  // 16-bit rows past the register path stream (normalization.h)
  }
}

// Whether the on-chip path runs a row that the register path does not take: kAuto picks it where
// this GPU takes the row (`longest`, softmax_on_chip_row), kOnChip demands it. The wrapper refuses
// kOnChip for a row the GPU cannot take, with a message for the user; this is the launchers' guard.
inline bool use_on_chip(RowPath path, int64_t n, int64_t longest) {
  if (path == RowPath::kOnChip && n > longest) {
    throw std::invalid_argument("RowPath::kOnChip: the row is longer than softmax_on_chip_row<T>() on this GPU (" +
                                std::to_string(longest) + ")");
  }
  return path == RowPath::kOnChip || (path == RowPath::kAuto && n <= longest);
}
// --8<-- [end:on_chip_host]

// --8<-- [start:launch]
// The launchers pick the path, the bucket and the load width (row_reduce.cuh): one block per
// kThreadsPerBlock / kRowThreads rows on the register path; one block per row on chip (forward)
// and streaming; one cluster per row on chip (backward). softmax_on_chip_row is asked only when
// the register path does not take the row and the on-chip path may: 'streaming' asks nothing.
template <typename T>
void launch_softmax_forward(const T* x, T* y, int64_t rows, int64_t n, RowPath path, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;  // nothing to write, and a grid of zero blocks is an invalid launch
  with_load_width<T>(n, {x, y}, [&](auto elems) {
    constexpr int kElems = decltype(elems)::value;
    if (use_registers<T>(path, n)) {
      with_register_bucket<T>(n, [&](auto row_threads, auto elems_per_thread) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        softmax_registers_kernel<T, kRowThreads, decltype(elems_per_thread)::value, kElems>
            <<<register_blocks(rows, kRowThreads), kThreadsPerBlock, 0, stream>>>(x, y, rows, n);
        COURSE_CHECK_LAUNCH();
      });
    } else if (path != RowPath::kStreaming && use_on_chip(path, n, softmax_on_chip_row<T>(false))) {
      if constexpr (kOnChipForward<T>) {  // else softmax_on_chip_row is 0, and use_on_chip false or a throw
        course::opt_in_dynamic_shared(softmax_on_chip_kernel<T, kElems>, on_chip_shared_bytes<T, kElems>(n),
                                      "softmax (on-chip rows)");
        softmax_on_chip_kernel<T, kElems>
            <<<stream_blocks(rows), kOnChipThreads, on_chip_shared_bytes<T, kElems>(n), stream>>>(x, y, rows, n);
        COURSE_CHECK_LAUNCH();
      }
    } else {
      softmax_streaming_kernel<T, kElems><<<stream_blocks(rows), kStreamThreads, 0, stream>>>(x, y, rows, n);
      COURSE_CHECK_LAUNCH();
    }
  });
}

template <typename T>
void launch_softmax_backward(const T* grad_y, const T* y, T* grad_x, int64_t rows, int64_t n, RowPath path,
                             cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  with_load_width<T>(n, {grad_y, y, grad_x}, [&](auto elems) {
    constexpr int kElems = decltype(elems)::value;
    if (use_registers<T>(path, n)) {
      with_register_bucket<T>(n, [&](auto row_threads, auto elems_per_thread) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        softmax_backward_registers_kernel<T, kRowThreads, decltype(elems_per_thread)::value, kElems>
            <<<register_blocks(rows, kRowThreads), kThreadsPerBlock, 0, stream>>>(grad_y, y, grad_x, rows, n);
        COURSE_CHECK_LAUNCH();
      });
    } else if (path != RowPath::kStreaming && use_on_chip(path, n, softmax_on_chip_row<T>(true))) {
      // One cluster a row, at most INT_MAX blocks in all (the kernel's row loop covers the rest).
      const int clusters = static_cast<int>(std::min<int64_t>(rows, INT32_MAX / kClusterBlocks));
      const ClusterLaunch launch(clusters * kClusterBlocks, stream);
      COURSE_CUDA_CHECK(
          cudaLaunchKernelEx(&launch.config, softmax_backward_cluster_kernel<T, kElems>, grad_y, y, grad_x, rows, n));
    } else {
      softmax_backward_streaming_kernel<T, kElems>
          <<<stream_blocks(rows), kStreamThreads, 0, stream>>>(grad_y, y, grad_x, rows, n);
      COURSE_CHECK_LAUNCH();
    }
  });
}
// --8<-- [end:launch]

#define INSTANTIATE(T)                                                                            \
  template int64_t softmax_on_chip_row<T>(bool);                                                  \
  template void launch_softmax_forward<T>(const T*, T*, int64_t, int64_t, RowPath, cudaStream_t); \
  template void launch_softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, RowPath, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

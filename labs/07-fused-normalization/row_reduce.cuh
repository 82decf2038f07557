// Lab skeleton generated from solutions/07-fused-normalization/row_reduce.cuh by `./course labs` [lab-hash 45290b208a0c].
// Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 07's device helpers, shared by softmax.cu and rms_norm.cu: math in the compute type, the
// warp and block all-reduce (lab 03's, for any value type and operator), the online (max, sum)
// pair and its merge, a thread's share of a row in registers, the streaming walk over a row, and
// the host-side choice of the register kernel's bucket. No torch.
#pragma once

#include <course/cuda.cuh>
#include <course/dtype.cuh>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>

#include "normalization.h"

using course::kFullWarpMask;
using course::kWarpSize;

// One function name per operation, overloaded so that float stays float (expf, not exp(double)).
__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float rsqrt_of(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_of(double v) { return rsqrt(v); }
__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }
template <typename F>
__device__ __forceinline__ F minus_infinity() {
  return F(-INFINITY);
}

// --8<-- [start:reduce]
// Reduction operators: how to combine two values, and the identity a lane without a value gives.
template <typename F>
struct SumOp {
  __device__ static F identity() { return F(0); }
  __device__ F operator()(F a, F b) const { return a + b; }
};
template <typename F>
struct MaxOp {
  __device__ static F identity() { return minus_infinity<F>(); }
  __device__ F operator()(F a, F b) const { return max_of(a, b); }
};

__device__ __forceinline__ float shfl_xor(float v, int offset) { return __shfl_xor_sync(kFullWarpMask, v, offset); }
__device__ __forceinline__ double shfl_xor(double v, int offset) { return __shfl_xor_sync(kFullWarpMask, v, offset); }

// Lab 03's butterfly: every lane ends with the reduction of all 32, in the same order up to
// swapped operands, so with a commutative op every lane has the same bits.
template <typename V, typename Op>
__device__ __forceinline__ V warp_all_reduce(V value, Op op) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value = op(value, shfl_xor(value, offset));
  return value;
}

// The reduction over the kThreads threads of the block, returned to every thread; all must call it.
template <int kThreads, typename V, typename Op>
__device__ __forceinline__ V block_all_reduce(V value, Op op) {
  static_assert(kThreads % kWarpSize == 0 && kThreads / kWarpSize <= kWarpSize, "whole warps, at most 32");
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ V warp_results[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  value = warp_all_reduce(value, op);
  if (lane == 0) warp_results[threadIdx.x / kWarpSize] = value;
  __syncthreads();  // every warp's result is in shared memory before any warp reads them
  value = warp_all_reduce(lane < kWarps ? warp_results[lane] : Op::identity(), op);
  __syncthreads();  // the reads are done before the next call writes warp_results again
  return value;
}

// The all-reduce over the threads that share a row: one warp, or the whole block.
template <int kRowThreads, typename V, typename Op>
__device__ __forceinline__ V row_all_reduce(V value, Op op) {
  if constexpr (kRowThreads == kWarpSize) {
    return warp_all_reduce(value, op);
  } else {
    static_assert(kRowThreads == kThreadsPerBlock, "a warp or the whole block per row");
    return block_all_reduce<kRowThreads>(value, op);
  }
}
// --8<-- [end:reduce]

// --8<-- [start:online]
// The online softmax statistics of the values seen so far: m their max, s the sum of exp(x - m).
// Values can be added one at a time (softmax.cu), and two pairs of disjoint parts merged into the
// pair of their union: m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m).
template <typename F>
struct MaxSum {
  F m;
  F s;
};

// exp(a - m), and 0 when a = -inf for every m. The plain formula gives that for a finite m, but
// a part that has seen only -inf (or nothing) has m = -inf, and merged with another such part
// exp(-inf - (-inf)) = exp(NaN) would turn the sum into NaN: a row of -inf but one element
// must give a one-hot, and two empty parts must merge to (-inf, 0).
template <typename F>
__device__ __forceinline__ F shifted_exp(F a, F m) {
  return a == minus_infinity<F>() ? F(0) : exp_of(a - m);
}

template <typename F>
struct MergeMaxSum {
  __device__ static MaxSum<F> identity() { return {minus_infinity<F>(), F(0)}; }
  __device__ MaxSum<F> operator()(MaxSum<F> a, MaxSum<F> b) const {
    // TODO(lab07.2): the pair of the union of a and b: m = max_of(a.m, b.m), and each part's sum rescaled
    //   from its own max to m before adding, with shifted_exp(part's m, m) (which keeps -inf parts from giving NaN)
    return a;  // b is dropped: the statistics of a part of the row only
  }
};

template <typename F>
__device__ __forceinline__ MaxSum<F> shfl_xor(MaxSum<F> v, int offset) {
  return {shfl_xor(v.m, offset), shfl_xor(v.s, offset)};
}
// --8<-- [end:online]

// For the compiler only: shared memory is read again after this point rather than kept in registers
// from before it (softmax's on-chip rows: which would hold the row's shared half in registers too, and
// spill), nor read before it (the staged RMSNorm backward: before its cp.async wait).
__device__ __forceinline__ void reread_shared() { asm volatile("" ::: "memory"); }

// --8<-- [start:row_slice]
// A thread's share of one row in registers: kElemsPerThread elements as kPacks packs of kElems
// (kElems = kElemsPerVector<T> when the row is vectorizable(), else 1). Pack j is at column
// (j kRowThreads + t) kElems, t the thread's index among the kRowThreads threads of the row: for
// each j the row's threads read consecutive packs, coalesced. Slots past the row's end are not
// loaded; they hold a fill value that changes no reduction (0 for a sum, -inf for a max).
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
struct RowSlice {
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  static constexpr int kPacks = kElemsPerThread / kElems;
  static_assert(kElemsPerThread % kElems == 0, "whole packs");
  C v[kPacks][kElems];

  __device__ static int64_t column(int j, int t) { return (int64_t{j} * kRowThreads + t) * kElems; }

  // n % kElems == 0 (vectorizable() or kElems = 1), so a pack that starts inside the row ends inside it.
  __device__ void load(const T* row, int64_t n, int t, C fill) {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int64_t col = column(j, t);
      if (col < n) {
        course::widen_pack(*reinterpret_cast<const P*>(row + col), v[j]);  // one 16-byte load, widened
      } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) v[j][e] = fill;
      }
    }
  }
  __device__ void store(T* row, int64_t n, int t) const {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int64_t col = column(j, t);
      if (col >= n) continue;
      P pack;
#pragma unroll
      for (int e = 0; e < kElems; ++e) pack.v[e] = from_compute<T>(v[j][e]);  // rounded once
      course::store_pack_global(row + col, pack);  // one 16-byte store (see store_pack_global)
    }
  }
};
// --8<-- [end:row_slice]

// --8<-- [start:stream_row]
// The streaming walk: thread t of the kStreamThreads visits packs t, t + 1024, t + 2048, ... of a
// row of `packs` packs, reading pack p of each of the kArrays arrays (rows of x and grad_y, or the
// weight), in batches: it issues the loads of kUnroll packs before it hands any to
// visit(p, loaded), so that kStreamPacksInFlight packs are in flight whatever kArrays is.
// kLastFirst walks the batches from the row's end back to its start: a second pass that way
// first re-reads what the first pass read last, the part of the row most likely still in L2.
template <typename T, int kElems, bool kLastFirst = false, int kArrays, typename Visit>
__device__ __forceinline__ void stream_row(const T* const (&arrays)[kArrays], int64_t packs, Visit&& visit) {
  using P = Pack<T, kElems>;
  constexpr int kUnroll = kStreamPacksInFlight / kArrays > 0 ? kStreamPacksInFlight / kArrays : 1;
  constexpr int64_t kBatch = int64_t{kStreamThreads} * kUnroll;      // packs a block visits per batch
  const int64_t batches = course::ceil_div<int64_t>(packs, kBatch);  // the last one may be partial
  // Not unrolled: a thread of a 1024-thread block has at most 64 registers (65536 / 1024). Unrolled,
  // two bfloat16 kernels spilled 20 and 110 bytes; as it is, one spills 48 (the RMSNorm forward's;
  // ptxas 13.0, sm_90a, `./course build 07 -v`).
#pragma unroll 1
  for (int64_t step = 0; step < batches; ++step) {
    const int64_t b = kLastFirst ? batches - 1 - step : step;
    P loaded[kUnroll][kArrays];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = b * kBatch + int64_t{u} * kStreamThreads + threadIdx.x;
      if (p >= packs) continue;
#pragma unroll
      for (int a = 0; a < kArrays; ++a) loaded[u][a] = reinterpret_cast<const P*>(arrays[a])[p];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = b * kBatch + int64_t{u} * kStreamThreads + threadIdx.x;
      if (p < packs) visit(p, loaded[u]);
    }
  }
}
// --8<-- [end:stream_row]

// --8<-- [start:buckets]
// Host side. Calls launch(row_threads, elems_per_thread), both std::integral_constant<int, ...>,
// with the smallest register bucket whose kRowThreads x E holds a row of n elements: a warp with
// E = 8 or kMaxWarpElemsPerThread<T>, else the block with E = 8, 16 or kMaxElemsPerThread<T>. Each
// bucket is a kernel of its own, so the list is short: every entry is compiled for every dtype
// and both load widths. The caller has checked n <= max_register_row<T>().
template <int kValue>
using IntConstant = std::integral_constant<int, kValue>;

template <typename T, typename Launch>
void with_register_bucket(int64_t n, Launch&& launch) {
  constexpr int kMax = kMaxElemsPerThread<T>;
  constexpr int kMaxWarp = kMaxWarpElemsPerThread<T>;
  using Warp = IntConstant<kWarpSize>;
  using Block = IntConstant<kThreadsPerBlock>;
  if (n <= int64_t{kWarpSize} * kMinElemsPerThread) {
    launch(Warp{}, IntConstant<kMinElemsPerThread>{});
  } else if (kMaxWarp > kMinElemsPerThread && n <= int64_t{kWarpSize} * kMaxWarp) {
    launch(Warp{}, IntConstant<kMaxWarp>{});
  } else if (n <= int64_t{kThreadsPerBlock} * kMinElemsPerThread) {
    launch(Block{}, IntConstant<kMinElemsPerThread>{});
  } else if (n <= int64_t{kThreadsPerBlock} * 16) {
    launch(Block{}, IntConstant<16>{});
  } else {
    launch(Block{}, IntConstant<kMax>{});
  }
}

// Calls launch(elems) with elems = std::integral_constant<int, kElemsPerVector<T>> when the row
// length and every pointer allow 16-byte accesses, else with 1.
template <typename T, typename Launch>
void with_load_width(int64_t n, std::initializer_list<const void*> pointers, Launch&& launch) {
  if (vectorizable(n, kElemsPerVector<T>, pointers)) {
    launch(IntConstant<kElemsPerVector<T>>{});
  } else {
    launch(IntConstant<1>{});
  }
}

// Whether the register path runs: kAuto picks it when the row fits. The wrapper refuses
// kRegisters for a row that does not, with a message for the user; this is the launchers' guard.
template <typename T>
bool use_registers(RowPath path, int64_t n) {
  if (path == RowPath::kRegisters && n > max_register_row<T>()) {
    throw std::invalid_argument("RowPath::kRegisters: the row is longer than max_register_row<T>()");
  }
  return path == RowPath::kRegisters || (path == RowPath::kAuto && n <= max_register_row<T>());
}

// The three choices together, for an op's launcher: registers(row_threads, elems_per_thread,
// elems) on the register path, streaming(elems) on the other (integral_constants, as above).
template <typename T, typename Registers, typename Streaming>
void with_row_kernel(int64_t n, RowPath path, std::initializer_list<const void*> pointers, Registers&& registers,
                     Streaming&& streaming) {
  with_load_width<T>(n, pointers, [&](auto elems) {
    if (use_registers<T>(path, n)) {
      with_register_bucket<T>(
          n, [&](auto row_threads, auto elems_per_thread) { registers(row_threads, elems_per_thread, elems); });
    } else {
      streaming(elems);
    }
  });
}

// Blocks of the register kernels: kThreadsPerBlock / kRowThreads rows per block. Past INT_MAX
// blocks the kernels' row loops cover the rest.
inline int register_blocks(int64_t rows, int row_threads) {
  return static_cast<int>(
      std::min<int64_t>(course::ceil_div<int64_t>(rows, kThreadsPerBlock / row_threads), INT32_MAX));
}

// Blocks of the streaming kernels: one per row, at most INT_MAX (the row loops cover the rest).
inline int stream_blocks(int64_t rows) { return static_cast<int>(std::min<int64_t>(rows, INT32_MAX)); }
// --8<-- [end:buckets]

// Lab skeleton generated from solutions/03-reductions/reduce.cuh by `./course labs` [lab-hash bd99b350c960].
// Students: fill in the TODO(lab03.k) blocks, then run `./course grade 03`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 03's building blocks, shared by the sum and the row statistics: the two
// reduction operators, loads that turn any element type into float, and the warp
// and block all-reduce. Device code only; no torch.
#pragma once

#include <course/cuda.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace reduce {

using course::kFullWarpMask;
using course::kWarpSize;

// 256 threads = 8 warps, for the reasons of lesson 00 (whole warps, 2048 / 256 = 8 blocks
// fill an SM). The block reduce keeps one value per warp in shared memory and lets one
// warp reduce those, so a block may have at most 32 warps: 1024 threads, the hardware's cap.
constexpr int kThreadsPerBlock = 256;
static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps only");
static_assert(kThreadsPerBlock / kWarpSize <= kWarpSize, "one warp must hold every warp's partial");

// --8<-- [start:ops]
// A reduction operator: how to combine two values, and the identity that a lane with no
// element contributes (x + 0 = x, max(x, -inf) = x), so that every lane can take part.
struct Sum {
  __device__ static float identity() { return 0.0f; }
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ static float identity() { return -INFINITY; }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
// --8<-- [end:ops]

// --8<-- [start:loads]
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// A 16-byte load is the widest one instruction makes: 4 floats or 8 bfloat16s.
constexpr int kVectorBytes = 16;
template <typename T>
constexpr int kElemsPerVector = kVectorBytes / sizeof(T);

// The kElemsPerVector elements at p (16-byte aligned), as floats, in one 16-byte load.
template <typename T>
__device__ __forceinline__ void load_vector(const T* p, float (&out)[kElemsPerVector<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);  // one ld.global.v4: 16 bytes
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
  } else {
    static_assert(sizeof(T) == 2, "float or bfloat16");
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // each 32-bit word holds two bfloat16s
      __nv_bfloat162 pair;
      memcpy(&pair, &words[i], sizeof(pair));
      const float2 f = __bfloat1622float2(pair);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}
// --8<-- [end:loads]

// Elements from p up to the next 16-byte boundary (at most n): the part a vectorized
// loop must handle one element at a time before its first aligned vector.
template <typename T>
__host__ __device__ inline int64_t elements_before_alignment(const T* p, int64_t n) {
  const auto misalignment = reinterpret_cast<uintptr_t>(p) % kVectorBytes;
  const int64_t head = misalignment ? static_cast<int64_t>((kVectorBytes - misalignment) / sizeof(T)) : 0;
  return head < n ? head : n;
}

// --8<-- [start:warp_all_reduce]
// The reduction of `value` over the 32 lanes of the warp, returned to EVERY lane.
// All 32 lanes must call it together (no lane may have returned early): a shuffle
// reads a register of another lane, and with the full mask the hardware waits for all 32.
template <typename Op>
__device__ __forceinline__ float warp_all_reduce(float value, Op op) {
  // TODO(lab03.1): butterfly all-reduce: for offset = 16, 8, 4, 2, 1 combine value with the value of lane
  //   (lane XOR offset), read with __shfl_xor_sync(kFullWarpMask, value, offset); after 5 steps every lane holds the
  //   result
  return value;
}
// --8<-- [end:warp_all_reduce]

// --8<-- [start:block_all_reduce]
// The reduction of `value` over the kThreads threads of the block, returned to every
// thread. All threads of the block must call it (it contains __syncthreads).
template <int kThreads, typename Op>
__device__ __forceinline__ float block_all_reduce(float value, Op op) {
  static_assert(kThreads % kWarpSize == 0 && kThreads / kWarpSize <= kWarpSize, "whole warps, at most 32");
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ float warp_results[kWarps];  // one value per warp: 8 floats for 256 threads
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  // TODO(lab03.2): reduce within each warp; lane 0 of each warp stores the warp's result in
  //   warp_results[warp]; __syncthreads(); then every warp reads warp_results[lane] (lanes >= kWarps take
  //   Op::identity()) and reduces those with warp_all_reduce; __syncthreads() again before returning, so the next call
  //   cannot overwrite warp_results while a slow warp still reads them
  value = warp_all_reduce(value, op);  // only this warp's share: the other warps' values are lost
  return value;
}
// --8<-- [end:block_all_reduce]

// The all-reduce over the threads that share a row: one warp, or the whole block.
template <int kThreadsPerRow, typename Op>
__device__ __forceinline__ float group_all_reduce(float value, Op op) {
  if constexpr (kThreadsPerRow == kWarpSize) {
    return warp_all_reduce(value, op);
  } else {
    return block_all_reduce<kThreadsPerRow>(value, op);
  }
}

}  // namespace reduce

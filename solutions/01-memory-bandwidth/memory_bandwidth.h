// Lab 01's kernel launchers: plain pointers, sizes and a stream, no torch types, so the
// kernel files compile without torch headers and wrapper.cpp is the only bridge.
#pragma once

#include <course/cuda.cuh>
#include <cuda_runtime.h>

#include <cstdint>

using course::LaunchConfig;

// 256 threads = 8 warps per block, for the reasons lesson 00 derived: whole warps, under the
// 1024-thread limit, and whole blocks fill the 1024 (sm_75) or 2048 (sm_80, sm_90) resident
// threads of an SM without hitting the 32-blocks-per-SM cap first.
constexpr int kThreadsPerBlock = 256;
static_assert(kThreadsPerBlock % course::kWarpSize == 0, "whole warps only");
static_assert(kThreadsPerBlock <= 1024, "the hardware limit of threads per block");
static_assert(kThreadsPerBlock >= 2048 / 32, "32 blocks per SM must be able to reach 2048 threads");
static_assert(1024 % kThreadsPerBlock == 0 && 2048 % kThreadsPerBlock == 0, "whole blocks fill an SM");

// One full wave of `threads`-thread blocks over `work_items` units of work (elements for the
// scalar copies, groups of float4s for the vectorized one). Defined in scalar_copy.cu.
LaunchConfig copy_launch(int64_t work_items, int threads, int sm_count, int max_threads_per_sm);

// copy_launch for kThreadsPerBlock threads on the current GPU; blocks > 0 overrides the grid.
LaunchConfig copy_launch_on_current_device(int64_t work_items, int blocks);

// --8<-- [start:vector_split]
// How a copy of n floats splits around 16-byte boundaries:
//   [0, head)                       scalars, until both pointers sit on a 16-byte boundary;
//   [head, head + 4 * vectors)      float4s: 16-byte loads and stores;
//   [head + 4 * vectors, n)         tail scalars, fewer than 4.
// head + 4 * vectors + tail == n always. When src and dst can never be 16-byte aligned
// together (their addresses differ by something other than a multiple of 16), vectors = 0.
struct VectorSplit {
  int64_t head;
  int64_t vectors;
  int64_t tail;
};
VectorSplit vector_split(uintptr_t src_address, uintptr_t dst_address, int64_t n);
// --8<-- [end:vector_split]

// dst[i] = src[i] for i < n. blocks = 0 derives a one-wave grid; any other value forces
// that many blocks (the result must not change).
void launch_copy_coalesced(const float* src, float* dst, int64_t n, int blocks, cudaStream_t stream);

// The same copy, but consecutive threads touch elements `stride` apart (stride >= 1).
void launch_copy_strided(const float* src, float* dst, int64_t n, int64_t stride, int blocks, cudaStream_t stream);

// The same copy with 16-byte float4 accesses, scalar head and tail; any alignment of src and dst.
// blocks = 0 launches one block per chunk of the body (faster than one wave: see the launcher).
void launch_copy_vectorized(const float* src, float* dst, int64_t n, int blocks, cudaStream_t stream);

// Lab 06's kernel launchers: plain pointers, sizes and a stream, no torch types, so the kernel
// files compile without torch headers and wrapper.cpp is the only bridge. Each launcher is a
// template over the element type T, instantiated in forward.cu and backward.cu for float,
// double, __half and __nv_bfloat16; the wrapper picks one from the tensor's dtype.
//
// Shapes: x is (rows, cols) row-major (the wrapper flattens every leading dimension into rows),
// bias is (cols,), and every kernel indexes with int64: rows * cols may pass 2^31.
#pragma once

#include <course/cuda.cuh>
#include <course/dtype.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

// The two GELUs of torch.nn.functional.gelu: approximate="none" (erf) and approximate="tanh".
enum class GeluForm { kErf, kTanh };

// The element types' helpers (Compute<T>, to_compute / from_compute, Pack, kVectorBytes,
// kElemsPerVector, vectorizable) are the course's, shared with lab 07: include/course/dtype.cuh.
using course::Compute;
using course::from_compute;
using course::kElemsPerVector;
using course::kVectorBytes;
using course::Pack;
using course::to_compute;
using course::vectorizable;

// --8<-- [start:constants]
// 256 threads = 8 warps per block, for lesson 00's reasons: whole warps, and 2048 / 256 = 8
// blocks fill an SM's 2048 resident threads (sm_80, sm_90) without hitting its block cap.
constexpr int kThreadsPerBlock = 256;
static_assert(kThreadsPerBlock % course::kWarpSize == 0, "whole warps only");

// Backward tile: a block owns a strip of columns and a chunk of rows. A warp spans the strip
// (lane i takes the i-th group of 1 or kElemsPerVector<T> columns), so every load of a warp
// reads 32 consecutive groups of one row: coalesced, 512 bytes with vectors. The block's 8
// warps are its row lanes: warp w takes rows w, w + 8, w + 16, ... of the chunk, and each
// thread sums its column(s) over those rows in registers.
constexpr int kColumnThreads = course::kWarpSize;
constexpr int kRowLanes = kThreadsPerBlock / kColumnThreads;
static_assert(kColumnThreads * kRowLanes == kThreadsPerBlock, "the block is a kRowLanes x kColumnThreads grid");

// Rows per chunk: each chunk writes one row of float partials (cols of them), which the
// finalize kernel reads back. With 128 rows that is 2 x 4 bytes per 128 elements, ~1% of the
// 6 bytes per element the bfloat16 backward moves (read grad_y and x, write grad_x), 0.5% in
// float32. Fewer rows per chunk cost partials, more cost blocks: at (8192, 8192) in bfloat16,
// 128 rows make 32 strips x 64 chunks = 2048 blocks, ~8 per resident slot (2 blocks of 128
// registers a thread per SM, 132 SMs). Measured there: 64 rows 5% slower, 256 rows 2% faster in
// bfloat16 but 1% slower in float32. The count of chunks is a function of rows alone: that is
// what makes grad_bias bitwise reproducible (see backward.cu).
constexpr int kRowsPerChunk = 128;
constexpr int kRowsPerLane = kRowsPerChunk / kRowLanes;  // 16 rows per thread
// Rows a thread loads before it computes any: 2 tensors x 4 rows x 16 bytes = 128 bytes in
// flight per thread. Measured: 2 rows made the bfloat16 backward 4% slower.
constexpr int kRowsInFlight = 4;
static_assert(kRowsPerChunk % (kRowLanes * kRowsInFlight) == 0, "every thread takes whole trips of kRowsInFlight rows");
// --8<-- [end:constants]

// The numbers above, for the grader and the notebook (wrapper.cpp's constants()).
struct FusedConstants {
  int warp_size;
  int threads_per_block;
  int vector_bytes;
  int backward_column_threads;
  int backward_row_lanes;
  int backward_rows_per_chunk;
};
constexpr FusedConstants kFusedConstants{course::kWarpSize, kThreadsPerBlock, kVectorBytes,
                                         kColumnThreads,    kRowLanes,        kRowsPerChunk};

// y = GELU(x + bias), rows x cols. vectorized = true takes the 16-byte kernel when
// vectorizable(); false forces the scalar kernel (for the grader and the notebook).
template <typename T>
void launch_bias_gelu_forward(const T* x, const T* bias, T* y, int64_t rows, int64_t cols, GeluForm form,
                              bool vectorized, cudaStream_t stream);

// Row chunks of the backward for `rows` rows: the partials buffer is backward_row_chunks(rows) x cols.
__host__ __device__ inline int64_t backward_row_chunks(int64_t rows) {
  return course::ceil_div<int64_t>(rows, kRowsPerChunk);
}

// grad_x = grad_y * GELU'(x + bias) (rows x cols) and grad_bias = grad_x summed over the rows
// (cols), in one pass over grad_y and x plus a small second kernel. `partials` is scratch the
// caller allocates: backward_row_chunks(rows) x cols of Compute<T>. vectorized as in the forward.
template <typename T>
void launch_bias_gelu_backward(const T* grad_y, const T* x, const T* bias, T* grad_x, T* grad_bias,
                               Compute<T>* partials, int64_t rows, int64_t cols, GeluForm form, bool vectorized,
                               cudaStream_t stream);

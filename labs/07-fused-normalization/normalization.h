// Lab skeleton generated from solutions/07-fused-normalization/normalization.h by `./course labs` [lab-hash b0ce530fcdb1].
// Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 07's kernel launchers: plain pointers, sizes and a stream, no torch types, so the kernel
// files compile without torch headers and wrapper.cpp is the only bridge. Each launcher is a
// template over the element type T, instantiated in softmax.cu and rms_norm.cu for float, double,
// __half and __nv_bfloat16; the wrapper picks one from the tensor's dtype.
//
// Shapes: x is (rows, n) row-major (the wrapper flattens every leading dimension into rows), each
// op works on one row at a time, and every kernel indexes with int64: rows * n may pass 2^31.
#pragma once

#include <course/cuda.cuh>
#include <course/dtype.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

using course::Compute;
using course::from_compute;
using course::kElemsPerVector;
using course::kVectorBytes;
using course::Pack;
using course::to_compute;
using course::vectorizable;

// How a row is read. kRegisters: from HBM once, into registers, then reduced and written from
// there; only rows up to max_register_row<T>() fit. kStreaming: any length, two passes over the
// row (the second one re-reads it). kAuto: kRegisters when the row fits, else kStreaming.
enum class RowPath { kAuto, kRegisters, kStreaming };

// --8<-- [start:constants]
// 256 threads = 8 warps per block, for lesson 00's reasons: whole warps, and 2048 / 256 = 8
// blocks fill an SM's 2048 resident threads (sm_80, sm_90) without hitting its block cap.
constexpr int kThreadsPerBlock = 256;
static_assert(kThreadsPerBlock % course::kWarpSize == 0, "whole warps only");

// The register path: a row is split over kRowThreads threads (one warp for short rows, the whole
// block for longer ones, as lab 03's row statistics did), and each thread holds E elements of it,
// E a compile-time bucket: kMinElemsPerThread, 16 or kMaxElemsPerThread<T>, the smallest that
// holds the row. 8 is the smallest bucket because a bfloat16 vector is 8 elements.
constexpr int kMinElemsPerThread = 8;
// The largest bucket is set by the RMSNorm backward, the kernel that keeps the most of a row: it
// holds x, grad_y and the thread's grad_weight column sums, 3 E values of the compute type a
// thread. 128 bytes of each (E = 32 floats or 16 doubles) are 96 32-bit registers of data, below
// the 255 a thread may have; E = 64 floats would be 192 of them before any index or temporary.
constexpr int kRegisterBytesPerOperand = 128;
template <typename T>
constexpr int kMaxElemsPerThread = kRegisterBytesPerOperand / static_cast<int>(sizeof(Compute<T>));
static_assert(kMaxElemsPerThread<float> == 32 && kMaxElemsPerThread<__nv_bfloat16> == 32 &&
                  kMaxElemsPerThread<double> == 16,
              "32 floats or 16 doubles a thread");
// The longest row of the register path: a block's 256 threads x 32 floats = 8192 elements for
// float, half and bfloat16 (which compute in float), 256 x 16 = 4096 for double.
template <typename T>
constexpr int64_t max_register_row() {
  return int64_t{kThreadsPerBlock} * kMaxElemsPerThread<T>;
}
// A warp takes the rows of up to 32 x 32 = 1024 elements, 32 x 8 = 256 in double: at 16 doubles
// a lane, ptxas 13.0 held the softmax warp kernel to 64 registers and spilled 376 bytes (sm_90a);
// the block kernel with 8 doubles a thread (40 registers, no spill) takes those rows.
template <typename T>
constexpr int kMaxWarpElemsPerThread = sizeof(Compute<T>) == 8 ? kMinElemsPerThread : kMaxElemsPerThread<T>;
template <typename T>
constexpr int64_t max_warp_row() {
  return int64_t{course::kWarpSize} * kMaxWarpElemsPerThread<T>;
}

// The streaming path: one block of 1024 threads per row, the largest block there is, so that a
// long row has the most threads and the GPU the fewest rows in flight, whose bytes the second
// pass wants to find in L2 (50 MB on an H100). ptxas gives the float32 softmax forward 34
// registers a thread, so an SM holds one such block (65536 / 1024 = 64 registers for 2 would need
// 32 each): 132 rows in flight, 34 MB at n = 65536 floats. Measured on an H100 at 4096 x 65536
// float32 (tools/gpu/NOTES.md, lab 07): 73% of copy bandwidth forward and 67% backward with the
// second pass walking the row last batch first, 67% and 61% front first, where a re-read served
// entirely by L2 would approach 100%: L2 serves part of it.
constexpr int kStreamThreads = 1024;
// Packs each thread loads before it uses any, over all the arrays it reads: 4 x 16 bytes in
// flight a thread, 64 KB an SM at 1024 threads. (Not measured against 2 or 8.)
constexpr int kStreamPacksInFlight = 4;

// RMSNorm's grad_weight, like lab 06's grad_bias, is summed in two kernels so that it is bitwise
// reproducible: block b takes rows [b rows_per_chunk, (b + 1) rows_per_chunk) and writes the
// column sums of its rows to partials[b, :]; a finalize kernel adds partials[0..chunks) of each
// column in that order. At most kMaxPartialRows chunks. The backward's blocks are long-lived (a
// chunk of rows each), so they should all be resident at once: a second wave of them that fills
// part of the GPU leaves the other SMs idle while it runs. 256 blocks fit one wave at 2 resident
// blocks per SM on 132 SMs (H100, H200): ptxas gives the register kernel 128 registers a thread
// for float32 rows of 8192 (2 blocks of 256 threads an SM) and 80 for bfloat16 rows of 4096 (3).
// The partials are then 256 x 8192 x 4 bytes = 8 MB at (8192, 8192) float32, written once and read
// once, against the 768 MB the backward moves (2%). (Not measured against 512 or 1024 chunks.)
constexpr int64_t kMaxPartialRows = 256;
// The finalize kernel's block: 8 row lanes x 32 columns, as lab 06's.
constexpr int kColumnThreads = course::kWarpSize;
constexpr int kRowLanes = kThreadsPerBlock / kColumnThreads;
// --8<-- [end:constants]

// Rows per grad_weight chunk and the number of chunks (= rows of partials): functions of rows
// alone, never of the GPU or of timing, which is what makes grad_weight reproducible.
inline int64_t grad_weight_rows_per_chunk(int64_t rows) {
  return std::max<int64_t>(1, course::ceil_div<int64_t>(rows, kMaxPartialRows));
}
inline int64_t grad_weight_chunks(int64_t rows) {
  return course::ceil_div<int64_t>(rows, grad_weight_rows_per_chunk(rows));
}

// The numbers above, for the grader and the notebook (wrapper.cpp's constants()).
struct NormConstants {
  int warp_size;
  int threads_per_block;
  int stream_threads;
  int stream_packs_in_flight;
  int vector_bytes;
  int min_elems_per_thread;
  int64_t max_partial_rows;
  int finalize_row_lanes;
};
constexpr NormConstants kNormConstants{course::kWarpSize, kThreadsPerBlock,   kStreamThreads,  kStreamPacksInFlight,
                                       kVectorBytes,      kMinElemsPerThread, kMaxPartialRows, kRowLanes};

// y = softmax(x) over each row. path kRegisters requires n <= max_register_row<T>().
template <typename T>
void launch_softmax_forward(const T* x, T* y, int64_t rows, int64_t n, RowPath path, cudaStream_t stream);

// grad_x = y * (grad_y - sum(grad_y * y)) per row.
template <typename T>
void launch_softmax_backward(const T* grad_y, const T* y, T* grad_x, int64_t rows, int64_t n, RowPath path,
                             cudaStream_t stream);

// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) per row, written to rstd (rows,).
template <typename T>
void launch_rms_norm_forward(const T* x, const T* weight, T* y, Compute<T>* rstd, int64_t rows, int64_t n, double eps,
                             RowPath path, cudaStream_t stream);

// grad_x (rows x n) and grad_weight (n,) of the RMSNorm, from the forward's rstd. `partials` is
// scratch the caller allocates: grad_weight_chunks(rows) x n of Compute<T>.
template <typename T>
void launch_rms_norm_backward(const T* grad_y, const T* x, const T* weight, const Compute<T>* rstd, T* grad_x,
                              T* grad_weight, Compute<T>* partials, int64_t rows, int64_t n, RowPath path,
                              cudaStream_t stream);

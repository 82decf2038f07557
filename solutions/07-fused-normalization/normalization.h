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
// there; only rows up to max_register_row<T>() fit. kOnChip (softmax only): a longer row, still
// read once, kept in a 1024-thread block's registers and shared memory (forward) or in the
// registers of a cluster of such blocks (backward, sm_90), up to softmax_on_chip_row<T>() on the
// GPU at hand. kStreaming: any length, two passes over the row (the second one re-reads it).
// kAuto: kRegisters when the row fits, else kOnChip where this GPU and dtype take the row, else
// kStreaming.
enum class RowPath { kAuto, kRegisters, kOnChip, kStreaming };

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
// float32 (lesson 07's notes): 73% of copy bandwidth forward and 67% backward with the
// second pass walking the row last batch first, 67% and 61% front first, where a re-read served
// entirely by L2 would approach 100%: L2 serves part of it.
constexpr int kStreamThreads = 1024;
// Packs each thread loads before it uses any, over all the arrays it reads: 4 x 16 bytes in
// flight a thread, 64 KB an SM at 1024 threads. (Not measured against 2 or 8.)
constexpr int kStreamPacksInFlight = 4;

// --8<-- [start:on_chip]
// The on-chip path of softmax: a row past the register path read from HBM once and kept
// on chip until its output is written, instead of streaming it twice with the second read served
// by L2 only in part. Measured with site/data/evidence/07-fused-normalization/softmax_onepass.py
// on an H200 at 4096 x 65536 float32 (lesson 07's notes): forward 92.1% of copy against
// the streaming kernel's 65.7%, backward 100.7% against 68.2%.
//
// Forward: one block of kOnChipThreads per row, the largest block there is, so that a row is one
// SM's: a 1024-thread block holds the SM's whole register file (65536 32-bit registers / 1024 =
// 64 a thread, what __launch_bounds__(1024, 1) lets ptxas use). A thread keeps
// kOnChipRegisterBytes = 128 bytes of its row in registers (32 floats: half of its 64 registers;
// the other half holds addresses, the thread's max and sum, and the loop) and as many again in
// dynamic shared memory, which cp.async fills without passing the bytes through registers:
//   registers       1024 threads x 32 floats x 4 bytes = 128 KiB
//   shared memory   1024 threads x 32 floats x 4 bytes = 128 KiB (opt-in per block: sm_90 227
//                   KiB, sm_80 163 KiB, sm_86 / sm_89 99 KiB, sm_75 64 KiB)
//   the row         2 x 32 x 1024 = 65536 floats (256 KiB), 32768 doubles (16 + 16 a thread)
// As CuTe-style layouts (shape):(stride) in elements, float rows (4 elements a 16-byte pack):
//   registers       (4, 1024, 8):(1, 4, 4096)          element e of pack j of thread t: column
//                                                      e + 4 t + 4096 j (RowSlice's order)
//   shared memory   (4, 1024, 8):(1, 4, 4096) + 32768  the same past the registers' 32768 columns
// so each of a warp's 8 + 8 loads is 512 contiguous bytes. A row of n < 65536 fills the slots it
// reaches, and its launch allocates only the shared memory those need (none for n <= 32768): a
// GPU whose opt-in is smaller takes rows up to what it holds and streams the longer ones
// (softmax_on_chip_row<T>(), asked at run time). cp.async is sm_80's; sm_75 streams.
// Forward for float and double only, where an element is its compute type: cp.async copies bytes,
// and the kernel overwrites each shared slot in place with its exp. A 16-bit row would have to
// keep its shared half as stored and compute those exps twice (not written, not measured): 16-bit
// rows past the register path stream.
constexpr int kOnChipThreads = 1024;
constexpr int kOnChipRegisterBytes = 128;
template <typename T>
constexpr bool kOnChipForward = sizeof(T) == sizeof(Compute<T>);
// Elements of the row a thread keeps in registers, and as many again in shared memory.
template <typename T>
constexpr int kOnChipElemsPerThread = kOnChipRegisterBytes / static_cast<int>(sizeof(Compute<T>));
template <typename T>
constexpr int64_t max_on_chip_forward_row() {
  return kOnChipForward<T> ? int64_t{2} * kOnChipThreads * kOnChipElemsPerThread<T> : 0;
}
// The shared-memory half at its largest: the row's other 128 KiB.
constexpr int kOnChipSharedBytes = kOnChipThreads * kOnChipRegisterBytes;
static_assert(max_on_chip_forward_row<float>() == 65536 && max_on_chip_forward_row<double>() == 32768 &&
                  max_on_chip_forward_row<__nv_bfloat16>() == 0,
              "65536 floats or 32768 doubles a row; 16-bit rows stream");
static_assert(kOnChipSharedBytes == 128 * 1024 && kOnChipSharedBytes <= 163 * 1024,
              "the shared half fits sm_80's opt-in, and sm_90's with room to spare");
static_assert(kOnChipThreads * 64 == 65536, "64 registers a thread: one block holds an SM's register file");

// Backward: grad_x = y (grad_y - dot(grad_y, y)) needs both y and grad_y until the dot is known,
// 512 KiB of a float row: more than one SM holds (256 KiB of registers + 227 KiB of shared
// memory). A thread-block cluster (sm_90) of kClusterBlocks blocks of 1024 threads, on as many
// SMs, takes a row, each block a quarter of it in registers; each block's partial dot is read by
// all four through distributed shared memory. A thread holds kClusterOperandBytes = 64 bytes of
// each operand (16 floats of y and 16 of grad_y: 32 of its 64 registers):
//   the row         4 blocks x 1024 threads x 16 = 65536 floats, half or bfloat16 (computed in
//                   float), 32768 doubles (8 a thread)
//   block r         (4, 1024, 4):(1, 4, 4096) + 16384 r   (float; RowSlice's order in each block)
// The probe's other layouts (4 blocks of 512 with grad_y in shared memory: 99.4% of copy; 8 of
// 512: 98.4%; 8 of 256: 99.5%) were no faster than this one (100.7%), the simplest: registers
// only, no shared memory but the four partial dots.
constexpr int kClusterBlocks = 4;
constexpr int kClusterOperandBytes = 64;
template <typename T>
constexpr int kClusterElemsPerThread = kClusterOperandBytes / static_cast<int>(sizeof(Compute<T>));
template <typename T>
constexpr int64_t max_on_chip_backward_row() {
  return int64_t{kClusterBlocks} * kOnChipThreads * kClusterElemsPerThread<T>;
}
static_assert(max_on_chip_backward_row<float>() == 65536 && max_on_chip_backward_row<__half>() == 65536 &&
                  max_on_chip_backward_row<double>() == 32768,
              "65536 elements a row (32768 doubles)");
static_assert(kClusterBlocks <= 8, "a portable cluster size: at most 8 blocks");
// --8<-- [end:on_chip]

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

// The staged backward (rms_norm.cu): rows copied to shared memory by cp.async a step ahead, kStagedRows rows
// reduced behind one barrier. It takes the rows that fill the register bucket of 32 bytes of each operand a thread
// (2 packs): 16-bit rows of 4096 and float rows of 2048, where the register kernel measured 81-84% of copy at
// (8, 4096, 4096) bfloat16 on an H100. Its ring: 2 steps x 4 rows x 2 operands (grad_y, x) x 256 threads x 32 bytes =
// 128 KiB, one block an SM. Measured with site/data/evidence/07-fused-normalization/rms_bwd.py (H100, (8, 4096, 4096)
// bfloat16, % of copy; rows x steps, blocks an SM): 4 x 2, 1: 95.1-95.5%; 4 x 3, 1: 94.9; 6 x 2, 1: 92.7; 2 x 2, 2:
// 93.1-93.5; 3 x 2, 2: 90.1; 2 x 2, 1: 82.2; 2 x 3, 1: 83.1; one row a step, 2-4 an SM: 87.2-93.3; the register
// kernel 83.2-83.9.
constexpr int kStagedRows = 4;
constexpr int kStagedSteps = 2;
constexpr int kStagedThreadBytes = 2 * kVectorBytes;
constexpr int kStagedSharedBytes = kStagedSteps * kStagedRows * 2 * kThreadsPerBlock * kStagedThreadBytes;
static_assert(
    kStagedSharedBytes == 128 * 1024 && kStagedSharedBytes <= 163 * 1024,
    "128 KiB: within sm_80's 163 KiB opt-in and sm_90's 227, above sm_86's and sm_89's 99 (no staging there)");
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
  int on_chip_threads;
  int cluster_blocks;
};
constexpr NormConstants kNormConstants{course::kWarpSize, kThreadsPerBlock,   kStreamThreads,  kStreamPacksInFlight,
                                       kVectorBytes,      kMinElemsPerThread, kMaxPartialRows, kRowLanes,
                                       kOnChipThreads,    kClusterBlocks};

// The longest row softmax's on-chip path takes on the current GPU, forward or backward, for
// element type T: 0 where it takes none (a 16-bit forward; a forward on sm_75; a backward without
// thread-block clusters, or where no cluster of the kernel can be resident; a build without code
// for this GPU's architecture). Asked once per GPU, then cached.
template <typename T>
int64_t softmax_on_chip_row(bool backward);

// y = softmax(x) over each row. path kRegisters requires n <= max_register_row<T>(), kOnChip
// n <= softmax_on_chip_row<T>(false).
template <typename T>
void launch_softmax_forward(const T* x, T* y, int64_t rows, int64_t n, RowPath path, cudaStream_t stream);

// grad_x = y * (grad_y - sum(grad_y * y)) per row. path kOnChip requires n <= softmax_on_chip_row<T>(true).
template <typename T>
void launch_softmax_backward(const T* grad_y, const T* y, T* grad_x, int64_t rows, int64_t n, RowPath path,
                             cudaStream_t stream);

// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) per row, written to rstd (rows,).
template <typename T>
void launch_rms_norm_forward(const T* x, const T* weight, T* y, Compute<T>* rstd, int64_t rows, int64_t n, double eps,
                             RowPath path, cudaStream_t stream);

// The staged backward's blocks (= its rows of grad_weight partials) for rows x n with 16-byte-aligned tensors on the
// current GPU under path 'auto'; 0 where the backward runs another kernel.
template <typename T>
int64_t rms_norm_backward_staged_blocks(int64_t rows, int64_t n);

// grad_x (rows x n) and grad_weight (n,) of the RMSNorm, from the forward's rstd. `partials` is
// scratch the caller allocates: grad_weight_chunks(rows) x n of Compute<T>.
template <typename T>
void launch_rms_norm_backward(const T* grad_y, const T* x, const T* weight, const Compute<T>* rstd, T* grad_x,
                              T* grad_weight, Compute<T>* partials, int64_t rows, int64_t n, RowPath path,
                              cudaStream_t stream);

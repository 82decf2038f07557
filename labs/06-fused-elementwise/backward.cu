// Lab skeleton generated from solutions/06-fused-elementwise/backward.cu by `./course labs` [lab-hash 79899778c1b5].
// Students: fill in the TODO(lab06.k) blocks, then run `./course grade 06`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 06, backward: grad_x = grad_y * GELU'(x + bias), and grad_bias = grad_x summed over every
// row. One pass reads grad_y and x and writes grad_x, and sums grad_x's columns on the way, so
// grad_x is never read back for the sum: 3 tensors' worth of bytes. PyTorch's unfused backward
// moves 4: GELU's backward reads grad_y and the saved t = x + bias and writes grad_t (which is
// grad_x), and the bias's gradient reads grad_t once more to sum it.
//
// Determinism. A column's sum is split between blocks; adding their parts with atomicAdd would
// make the order of the additions the order in which blocks happen to finish, and float
// addition is not associative, so the low bits of grad_bias would change from run to run.
// Here each block writes its part to its own slot, partials[chunk, col], and a second kernel
// adds a column's slots in an order fixed by the number of chunks. Every addition's order is
// then fixed by the shape (the chunking depends on rows alone, never on the SM count or on
// timing), so the same inputs give the same bits on every run. The cost: the partials' bytes
// (~1%, see kRowsPerChunk) and a second launch.
#include <course/cuda.cuh>

#include <algorithm>
#include <cstdint>

#include "fused_elementwise.h"
#include "gelu.cuh"

// --8<-- [start:backward]
// Tile = a chunk of kRowsPerChunk rows x a strip of kColumnThreads * kElems columns; one tile
// per block (more only past INT_MAX tiles). kElems = kElemsPerVector<T> when vectorizable(),
// else 1: one kernel, the width a template parameter. Lane i of a warp owns columns
// [strip start + i * kElems, + kElems) of the tile; warp w (its row lane) owns rows w, w + 8,
// w + 16, ... of the chunk. cols % kElems == 0, so a lane's kElems columns are all inside the
// matrix or all outside.
template <typename T, GeluForm kForm, int kElems>
__global__ void __launch_bounds__(kThreadsPerBlock)
    bias_gelu_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ bias,
                              T* __restrict__ grad_x, Compute<T>* __restrict__ partials, int64_t rows, int64_t cols) {
  using C = Compute<T>;
  using Vector = Pack<T, kElems>;
  constexpr int kStripCols = kColumnThreads * kElems;
  // The row lanes' column sums, [row lane][element][lane]: lane innermost, so a warp's 32 stores
  // of one element fall into 32 consecutive words, one per bank: no bank conflicts.
  __shared__ C lane_sums[kRowLanes][kElems][kColumnThreads];  // 8 KB for bfloat16 vectors
  const int lane = threadIdx.x % kColumnThreads;
  const int row_lane = threadIdx.x / kColumnThreads;
  const int64_t strips = course::ceil_div<int64_t>(cols, kStripCols);
  const int64_t tiles = strips * backward_row_chunks(rows);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform across the block: all reach the syncs
    // Neighbouring blocks take neighbouring strips of the same rows: together they read whole rows.
    const int64_t chunk = tile / strips;
    const int64_t col = (tile % strips) * kStripCols + lane * kElems;  // this lane's first column
    const bool in_matrix = col < cols;
    const int64_t first_row = chunk * kRowsPerChunk + row_lane;
    // TODO(lab06.4): this thread's column sums: load its kElems biases once (Vector at bias + col); then for
    //   its rows first_row + j * kRowLanes, j = 0..kRowsPerLane-1 (skip rows >= rows, and everything when !in_matrix),
    //   kRowsInFlight rows at a time, load grad_y and x (one Vector each at row * cols + col) before computing any;
    //   g = grad_y * gelu_grad<kForm, T>(x + bias) in C, store grad_x (rounded once), and add the unrounded g into
    //   sums[e]
    //   then the block's sums: store sums[e] in lane_sums[row_lane][e][lane], __syncthreads(), let row lane 0 add
    //   the kRowLanes values of each column in the order 0, 1, ..., kRowLanes-1 and write them to
    //   partials[chunk * cols + col + e]; __syncthreads() again before the next tile overwrites lane_sums
  }
}
// --8<-- [end:backward]

// --8<-- [start:backward_finalize]
// grad_bias[col] = the sum of partials[0..chunks, col]. A block takes kColumnThreads columns
// with the main kernel's thread grid: row lane r adds chunks r, r + kRowLanes, r + 2 kRowLanes,
// ... in that order, then row lane 0 adds the kRowLanes sums in the order 0, 1, ..., kRowLanes - 1.
// That order depends on chunks alone: the same bits every run. Eight threads per column, not
// one, because each add waits for its load from L2: with one thread per column the chain was 64
// round trips long at (8192, 8192) and showed in the backward's time (measured in bfloat16:
// halving the chunks made the whole backward 2% faster, doubling them 5% slower).
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    grad_bias_finalize_kernel(const Compute<T>* __restrict__ partials, int64_t chunks, int64_t cols,
                              T* __restrict__ grad_bias) {
  using C = Compute<T>;
  __shared__ C lane_sums[kRowLanes][kColumnThreads];
  const int lane = threadIdx.x % kColumnThreads;
  const int row_lane = threadIdx.x / kColumnThreads;
  const int64_t strips = course::ceil_div<int64_t>(cols, kColumnThreads);
  for (int64_t strip = blockIdx.x; strip < strips; strip += gridDim.x) {  // uniform across the block
    const int64_t col = strip * kColumnThreads + lane;
    // TODO(lab06.4): the column's sum in a fixed order: row lane r adds partials[k * cols + col] for k = r,
    //   r + kRowLanes, ... < chunks (nothing when col >= cols) into a Compute<T>; store it in
    //   lane_sums[row_lane][lane],
    //   __syncthreads(), and let row lane 0 add lane_sums[0..kRowLanes)[lane] in order and store the total, rounded
    //   once, in grad_bias[col]; __syncthreads() again before the next strip
  }
}
// --8<-- [end:backward_finalize]

// --8<-- [start:backward_launch]
template <typename T, GeluForm kForm, int kElems>
static void launch_backward_with(const T* grad_y, const T* x, const T* bias, T* grad_x, T* grad_bias,
                                 Compute<T>* partials, int64_t rows, int64_t cols, cudaStream_t stream) {
  // One block per tile, for the forward's reason (lab 01's measured one block per chunk). At
  // (8192, 8192): 128 rows x 128 float columns = 4096 tiles in float32, 128 x 256 = 2048 in
  // bfloat16. Past INT_MAX tiles the kernel's tile loop covers the rest.
  const int64_t chunks = backward_row_chunks(rows);
  const int64_t tiles = course::ceil_div<int64_t>(cols, int64_t{kColumnThreads} * kElems) * chunks;
  const int blocks = static_cast<int>(std::min<int64_t>(tiles, INT32_MAX));
  bias_gelu_backward_kernel<T, kForm, kElems>
      <<<blocks, kThreadsPerBlock, 0, stream>>>(grad_y, x, bias, grad_x, partials, rows, cols);
  COURSE_CHECK_LAUNCH();
  // A block per kColumnThreads columns: 256 blocks for 8192 columns, 2 MB of partials in all at
  // (8192, 8192) against the main kernel's 384-768 MB.
  const int finalize_blocks =
      static_cast<int>(std::min<int64_t>(course::ceil_div<int64_t>(cols, kColumnThreads), INT32_MAX));
  grad_bias_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock, 0, stream>>>(partials, chunks, cols, grad_bias);
  COURSE_CHECK_LAUNCH();
}

template <typename T, GeluForm kForm>
static void launch_backward_form(const T* grad_y, const T* x, const T* bias, T* grad_x, T* grad_bias,
                                 Compute<T>* partials, int64_t rows, int64_t cols, bool vectorized,
                                 cudaStream_t stream) {
  if (vectorized && vectorizable(cols, kElemsPerVector<T>, {grad_y, x, bias, grad_x})) {
    launch_backward_with<T, kForm, kElemsPerVector<T>>(grad_y, x, bias, grad_x, grad_bias, partials, rows, cols,
                                                       stream);
  } else {
    launch_backward_with<T, kForm, 1>(grad_y, x, bias, grad_x, grad_bias, partials, rows, cols, stream);
  }
}

template <typename T>
void launch_bias_gelu_backward(const T* grad_y, const T* x, const T* bias, T* grad_x, T* grad_bias,
                               Compute<T>* partials, int64_t rows, int64_t cols, GeluForm form, bool vectorized,
                               cudaStream_t stream) {
  if (cols == 0) return;  // nothing to compute, and a grid of zero blocks is an invalid launch
  if (rows == 0) {
    // grad_bias is the sum over no rows: zero (all-zero bits are 0 in each of the four types).
    COURSE_CUDA_CHECK(cudaMemsetAsync(grad_bias, 0, cols * sizeof(T), stream));
    return;
  }
  if (form == GeluForm::kErf) {
    launch_backward_form<T, GeluForm::kErf>(grad_y, x, bias, grad_x, grad_bias, partials, rows, cols, vectorized,
                                            stream);
  } else {
    launch_backward_form<T, GeluForm::kTanh>(grad_y, x, bias, grad_x, grad_bias, partials, rows, cols, vectorized,
                                             stream);
  }
}
// --8<-- [end:backward_launch]

#define INSTANTIATE(T)                                                                                            \
  template void launch_bias_gelu_backward<T>(const T*, const T*, const T*, T*, T*, Compute<T>*, int64_t, int64_t, \
                                             GeluForm, bool, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

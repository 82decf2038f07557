// Lab skeleton generated from solutions/06-fused-elementwise/forward.cu by `./course labs` [lab-hash 76715f2b2f70].
// Students: fill in the TODO(lab06.k) blocks, then run `./course grade 06`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 06, forward: y = GELU(x + bias) in one pass. PyTorch's unfused F.gelu(x + b) reads x,
// writes t = x + b, reads t and writes y: 4 tensors' worth of bytes. Fused, the sum stays in a
// register: read x, write y, 2 tensors' worth, so the kernel can take half the time. Two
// versions: scalar (any shape and alignment) and 16-byte vectors (the usual case, and faster).
#include <course/cuda.cuh>

#include <algorithm>
#include <cstdint>

#include "fused_elementwise.h"
#include "gelu.cuh"

// --8<-- [start:forward_scalar]
// One element per trip of a grid-stride loop. The column of flat element i is i % cols (x is
// row-major), and each element's bias is its own 1-to-8-byte load (served by L1 after the first).
template <typename T, GeluForm kForm>
__global__ void __launch_bounds__(kThreadsPerBlock)
    bias_gelu_scalar_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t n,
                            int64_t cols) {
  // TODO(lab06.2): grid-stride over the n = rows * cols elements with an int64 index i (n may pass 2^31):
  //   y[i] = from_compute<T>(gelu<kForm, T>(to_compute(x[i]) + to_compute(bias[i % cols]))), widened once, rounded once
}
// --8<-- [end:forward_scalar]

// --8<-- [start:forward_vectorized]
// The same with 16-byte packs of kElems = kElemsPerVector<T> elements, when vectorizable():
// cols % kElems == 0 and every pointer 16-byte aligned, so vector v lies inside one row, starting
// at pack column v % packs_per_row, and its kElems biases are the one 16-byte pack there.
// n % kElems == 0 follows, so there is no tail to handle.
//
// One vector per thread and trip, not lab 01's four. A copy does nothing between its loads and
// stores, so it keeps bytes in flight by issuing several loads first; here a thread that loaded
// four vectors holds 32 bfloat16 GELUs' inputs at once. ptxas gives that version 95 registers a
// thread (two 256-thread blocks, 16 warps, fit an SM's 65536 registers) and this one 31-32 (64
// warps, the SM's limit; `./course build 06 -v`, sm_90a). Measured on an H100 at (8192, 8192)
// bfloat16: 0.85x (erf) and 0.95x (tanh) of copy bandwidth with one vector per thread, 0.77x and
// 0.82x with four; float32 reaches 1.0x with either. That the occupancy is what costs the
// four-vector version its speed is the reading these figures suggest; no profile has checked it.
template <typename T, GeluForm kForm>
__global__ void __launch_bounds__(kThreadsPerBlock)
    bias_gelu_vectorized_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                int64_t n_vectors, int64_t packs_per_row) {
  constexpr int kElems = kElemsPerVector<T>;
  using Vector = Pack<T, kElems>;
  const Vector* x_vectors = reinterpret_cast<const Vector*>(x);        // (n_vectors,)
  const Vector* bias_vectors = reinterpret_cast<const Vector*>(bias);  // (packs_per_row,)
  Vector* y_vectors = reinterpret_cast<Vector*>(y);                    // (n_vectors,)
  // TODO(lab06.3): grid-stride over the n_vectors vectors with an int64 index v: load x_vectors[v] and its
  //   bias pack bias_vectors[v % packs_per_row] (one 16-byte load each), GELU each of the kElems elements in
  //   Compute<T>, and store the kElems results with one 16-byte store to y_vectors[v]
}
// --8<-- [end:forward_vectorized]

// --8<-- [start:forward_launch]
// One thread per element (scalar) or per vector, ceil(work / 256) blocks: lab 01 measured many
// short blocks beating one long-lived wave that grid-strides (96% against 90% of copy bandwidth,
// site/data/evidence/01-memory-bandwidth/grid_variants.json), as SMs take new blocks when they
// free up and none ends long after the others. Both kernels get the same rule, so they differ
// only in the width of their accesses. Past INT_MAX blocks (2^39 elements) the grid-stride loops
// cover the rest.
static int blocks_for(int64_t work) {
  return static_cast<int>(std::min<int64_t>(course::ceil_div<int64_t>(work, kThreadsPerBlock), INT32_MAX));
}

template <typename T, GeluForm kForm>
static void launch_forward_form(const T* x, const T* bias, T* y, int64_t rows, int64_t cols, bool vectorized,
                                cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (vectorized && vectorizable(cols, kElemsPerVector<T>, {x, bias, y})) {
    constexpr int kElems = kElemsPerVector<T>;
    bias_gelu_vectorized_kernel<T, kForm>
        <<<blocks_for(n / kElems), kThreadsPerBlock, 0, stream>>>(x, bias, y, n / kElems, cols / kElems);
  } else {
    bias_gelu_scalar_kernel<T, kForm><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(x, bias, y, n, cols);
  }
  COURSE_CHECK_LAUNCH();
}

template <typename T>
void launch_bias_gelu_forward(const T* x, const T* bias, T* y, int64_t rows, int64_t cols, GeluForm form,
                              bool vectorized, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;  // a grid of zero blocks is an invalid launch, not a no-op
  if (form == GeluForm::kErf) {
    launch_forward_form<T, GeluForm::kErf>(x, bias, y, rows, cols, vectorized, stream);
  } else {
    launch_forward_form<T, GeluForm::kTanh>(x, bias, y, rows, cols, vectorized, stream);
  }
}
// --8<-- [end:forward_launch]

#define INSTANTIATE(T) \
  template void launch_bias_gelu_forward<T>(const T*, const T*, T*, int64_t, int64_t, GeluForm, bool, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

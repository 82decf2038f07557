// Lab 04's kernel launchers: C = A @ B in fp32, row-major A [M, K], B [K, N], C [M, N].
// Plain pointers and a stream, no torch types: the wrapper is the only bridge to torch.
//
// The kernels form a ladder, numbered as in the lesson, the file names and the results
// table: kernel 1 is 01_naive.cu, ..., kernel 7 is 07_warptiling.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// The tile of C one block of a kernel computes, rows x columns: the grader names the tile of a
// wrong element with it. Kernel k's comes from the function beside its launcher.
struct BlockTile {
  int rows;
  int cols;
};
BlockTile sgemm_naive_tile();
BlockTile sgemm_coalesced_tile();
BlockTile sgemm_smem_tiles_tile();
BlockTile sgemm_blocktiling_1d_tile();
BlockTile sgemm_blocktiling_2d_tile();
BlockTile sgemm_vectorized_tile();  // also kernel 5's, which it runs when it cannot use float4s
BlockTile sgemm_warptiling_tile();  // likewise

// Every kernel indexes with 32-bit ints (fewer registers in the inner loops); the wrapper
// refuses matrices of 2^31 elements or more, so `row * ld + col` never overflows.
using SgemmLauncher = void (*)(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);

void launch_sgemm_naive(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);
void launch_sgemm_coalesced(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);
void launch_sgemm_smem_tiles(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);
void launch_sgemm_blocktiling_1d(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);
void launch_sgemm_blocktiling_2d(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);
// Kernels 6 and 7 load and store float4s; when can_vectorize() says no, they run kernel 5.
void launch_sgemm_vectorized(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);
void launch_sgemm_warptiling(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);

// Whether every float4 that kernels 6 and 7 load from A and B and store to C is a whole,
// 16-byte-aligned float4: A, B and C are given by their addresses so that the grader can
// ask about any alignment on a machine without a GPU.
bool can_vectorize(int64_t M, int64_t N, int64_t K, uintptr_t a_address, uintptr_t b_address, uintptr_t c_address);

#ifdef __CUDACC__  // device helpers for the kernel files; wrapper.cpp is compiled without them
// --8<-- [start:store_tile]
// Store one thread's register tile: C[row + i, col + j] = tile[i][j] for every element
// inside the M x N matrix C, kVector floats per store. kVector = 1: plain float stores,
// each guarded alone (any M, N). kVector = 4: float4 stores, guarded per float4, which is
// exact only when can_vectorize() said yes (no float4 straddles C's edge, all aligned).
template <int kVector, int kRows, int kCols>
__device__ __forceinline__ void store_tile(float* __restrict__ C, const float (&tile)[kRows][kCols], int row, int col,
                                           int M, int N) {
  static_assert(kVector == 1 || kVector == 4, "plain float or float4 stores");
  static_assert(kCols % kVector == 0, "each row of the tile is whole vectors");
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = row + i;
#pragma unroll
    for (int j = 0; j < kCols; j += kVector) {
      const int c = col + j;
      if (r < M && c < N) {
        if constexpr (kVector == 4) {
          *reinterpret_cast<float4*>(&C[r * N + c]) =
              make_float4(tile[i][j], tile[i][j + 1], tile[i][j + 2], tile[i][j + 3]);
        } else {
          C[r * N + c] = tile[i][j];
        }
      }
    }
  }
}
// --8<-- [end:store_tile]
#endif  // __CUDACC__

// Lab 04's kernel launchers: C = A @ B in fp32, row-major A [M, K], B [K, N], C [M, N].
// Plain pointers and a stream, no torch types: the wrapper is the only bridge to torch.
//
// The kernels form a ladder, numbered as in the lesson, the file names and the results
// table: kernel 1 is 01_naive.cu, ..., kernel 7 is 07_warptiling.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

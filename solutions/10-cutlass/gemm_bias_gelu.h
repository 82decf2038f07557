// Lesson 10's launchers: plain pointers, sizes, a workspace and a stream, no torch types, so the CUTLASS
// files compile without torch headers (and the torch wrapper without CUTLASS's).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

// out[M, N] = gelu_tanh(x[M, K] @ weight[N, K]^T + bias[N]), all bfloat16, fp32 accumulation: lesson 05's
// linear_act(..., "gelu") through CUTLASS 3.x (sm_90: TMA + wgmma, warp-specialized, persistent; the bias and
// the GELU in an epilogue visitor tree). Row-major x and out, weight [N, K] row-major (nn.Linear's), bias [N].
// Pointers 16-byte aligned, K and N multiples of 8 (TMA's 16-byte rows), any M. The workspace (the tile
// scheduler's) is gemm_bias_gelu_sm90_workspace_bytes(...) bytes of device memory, from the caller's allocator.
// Throws unless gemm_bias_gelu_sm90_available(): a compute capability 9.0 GPU and a build for sm_90a.
void launch_gemm_bias_gelu_sm90(const void* x, const void* weight, const void* bias, void* out, int64_t M, int64_t N,
                                int64_t K, void* workspace, size_t workspace_bytes, cudaStream_t stream);
size_t gemm_bias_gelu_sm90_workspace_bytes(int64_t M, int64_t N, int64_t K);
bool gemm_bias_gelu_sm90_available();

// The tile and cluster shapes compiled in, for the page and the grader's messages; shared_bytes is the kernel's
// dynamic shared memory (the mainloop's stages plus the epilogue's), what GemmUniversalAdapter::initialize asks for.
struct CutlassConfig {
  int tile_m, tile_n, tile_k, cluster_m, cluster_n, stages, shared_bytes;
};
CutlassConfig gemm_bias_gelu_sm90_config();
// The epilogue visitor tree's C++ type, demangled: the grader reads its nodes without a GPU.
std::string gemm_bias_gelu_sm90_epilogue();

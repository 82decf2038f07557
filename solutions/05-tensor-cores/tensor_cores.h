// Lab 05's launcher and host-side helpers: plain pointers, sizes and a stream, no torch
// types, so the kernel files compile without torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

enum class Activation : int { kNone = 0, kRelu = 1, kGelu = 2 };
enum class ElementType : int { kFloat16 = 0, kBFloat16 = 1 };

// The shape contract of the kernel: K and N multiples of 8 (16 bytes of a 2-byte type), any M.
constexpr int kShapeMultiple = 8;

// out[M, N] = act(x[M, K] @ weight[N, K]^T + bias[N]), all of `type`, fp32 accumulation.
// Pointers 16-byte aligned, K and N multiples of kShapeMultiple (the wrapper checks both).
// capability_major selects the data path: cp.async pipeline on 8+, plain loads on 7.5.
void launch_linear_act(ElementType type, const void* x, const void* weight, const void* bias, void* out, int64_t M,
                       int64_t N, int64_t K, Activation activation, cudaStream_t stream);

// The same product on Hopper's own path (TMA + wgmma, linear_act_wgmma.cu), same contract.
// Throws unless wgmma_available(): a compute capability 9.0 GPU and a build for sm_90a.
void launch_linear_act_wgmma(ElementType type, const void* x, const void* weight, const void* bias, void* out,
                             int64_t M, int64_t N, int64_t K, Activation activation, cudaStream_t stream);
bool wgmma_available();

// The block tile and the shared memory one block uses on a GPU of this compute capability;
// chunks_per_row is the 16-byte chunks in a row of a k-slice (kBlockK two-byte elements).
struct TileConfig {
  int block_m, block_n, block_k, stages, threads, shared_bytes, chunks_per_row;
};
TileConfig tile_config(int capability_major);
// The same for the Hopper path (linear_act_wgmma.cu), whatever GPU this is.
TileConfig wgmma_tile_config();

// What the CUDA runtime reports for the bf16 mma.sync kernel at `stages` pipeline stages (4, 6 or 8)
// on the current GPU: cudaFuncGetAttributes (registers, static shared memory, local memory) and
// cudaOccupancyMaxActiveBlocksPerMultiprocessor with the stage count's dynamic shared memory
// (blocks_per_sm; 0 where it exceeds what a block may opt in to) and with none (the registers' limit).
struct KernelResidency {
  int stages, threads, registers, static_shared_bytes, dynamic_shared_bytes, local_bytes, blocks_per_sm,
      registers_only_blocks_per_sm;
};
KernelResidency linear_act_residency(int stages);

// Fragment layout of mma.m16n8k16 (see mma.cuh), exposed so the grader checks it without a GPU.
struct Position {
  int row, col;
};
Position accumulator_position_host(int lane, int register_index);
Position ldmatrix_a_source_host(int lane);
Position ldmatrix_b_source_host(int lane);
// Offset, in 16-byte chunks, of (row, chunk) of a swizzled shared-memory tile.
int swizzled_chunk_host(int row, int chunk);

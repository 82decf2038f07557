// The course's tensor-core building blocks, shared by lab 05 (GEMM) and lab 08 (attention): the
// PTX wrappers for ldmatrix, mma.sync and cp.async, and the register packing that turns an fp32
// accumulator fragment into the 16-bit A operand of the next product. Every function here is one
// instruction or a few; a kernel is built from them. No torch header: kernel files stay quick to build.
// Lab 05's page derives the fragment layout (which lane holds which element); lab 08 relies on it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace course {

// The per-warp MMA shape: D[16x8] (fp32) += A[16x16] (row-major) * B[16x8] (col-major).
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
// One 16-byte chunk holds 8 two-byte elements: the unit of cp.async, ldmatrix rows and swizzling.
constexpr int kChunkBytes = 16;
constexpr int kElementsPerChunk = kChunkBytes / 2;

__device__ inline uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// --8<-- [start:ptx]
// Four 8x8 matrices of b16 from shared memory into 4 registers per lane (sm_75+).
__device__ inline void ldmatrix_x4(uint32_t (&registers)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(registers[0]), "=r"(registers[1]), "=r"(registers[2]), "=r"(registers[3])
               : "r"(shared_address(row_address)));
}

// d[4] += a[4] * b[2] for one 16x8x16 tile, fp32 accumulation. m16n8k16 exists from sm_80;
// on sm_75 the fp16 product is two m16n8k8 halves: (a0, a1, b0) covers k 0-7, (a2, a3, b1) k 8-15.
template <typename T>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ inline void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b[0]));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
}

template <>
__device__ inline void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // no bf16 tensor cores before sm_80: the launcher refuses bf16 there
#endif
}

// Copy one 16-byte chunk global -> shared, zero-filling it when `valid` is false (rows past M
// or N, k past K), so partial tiles need no special case in the main loop. From sm_80 it is
// asynchronous (cp.async, bypassing registers and L1); before, a plain load and store.
__device__ inline void copy_chunk_async(void* shared_destination, const void* global_source, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int source_bytes = valid ? kChunkBytes : 0;  // bytes past source_bytes are filled with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_address(shared_destination)),
               "l"(global_source), "n"(kChunkBytes), "r"(source_bytes));
#else
  *static_cast<uint4*>(shared_destination) = valid ? *static_cast<const uint4*>(global_source) : make_uint4(0, 0, 0, 0);
#endif
}

// Close the group of copies issued since the last commit.
__device__ inline void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most `pending` committed groups of this thread are still in flight.
template <int pending>
__device__ inline void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}
// --8<-- [end:ptx]

// --8<-- [start:ldmatrix_trans]
// ldmatrix.x4 with .trans: each 8x8 matrix arrives transposed, so lane l holds column l / 4,
// rows 2(l % 4) and 2(l % 4) + 1. Attention's second product O += P V needs V as the B operand
// (k = key, n = head dim), but V is stored key-major (head dim contiguous): rows of V are rows of
// k, where mma's B fragment wants pairs along k. The transpose in the load fixes that for free.
__device__ inline void ldmatrix_x4_trans(uint32_t (&registers)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(registers[0]), "=r"(registers[1]), "=r"(registers[2]), "=r"(registers[3])
               : "r"(shared_address(row_address)));
}
// --8<-- [end:ldmatrix_trans]

// --8<-- [start:pack]
// Two fp32 values rounded to a 16-bit type and packed into one 32-bit register, first value in the
// low half: the layout of an mma operand register. An accumulator fragment (c0, c1) of a 16x8 tile
// covers the same (row, column pair) as an A-operand register of the next 16x16 product, so a
// product's output feeds the next product through registers, never through shared memory
// (attention: P = softmax(S) straight into O += P V).
template <typename T>
__device__ inline uint32_t pack_pair(float first, float second);
template <>
__device__ inline uint32_t pack_pair<__half>(float first, float second) {
  const __half2 pair = __floats2half2_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
template <>
__device__ inline uint32_t pack_pair<__nv_bfloat16>(float first, float second) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
// --8<-- [end:pack]

// Round two fp32 values to the output type and store them as one 4-byte word (an accumulator pair).
__device__ inline void store_pair(__half* out, float first, float second) {
  *reinterpret_cast<__half2*>(out) = __floats2half2_rn(first, second);
}
__device__ inline void store_pair(__nv_bfloat16* out, float first, float second) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(first, second);
}

// exp(x) = exp2(x log2(e)): ex2 is the hardware's exponential, so a softmax folds log2(e) into its scale.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the SFU's ex2.approx (relative error ~2^-22; -inf -> +0), what exp2f becomes under
// --use_fast_math (FlashAttention's build flag). The course builds without it, and exp2f's accurate
// path adds a range check and two multiplies to every exponential of an attention tile.
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace course

// Lab skeleton generated from solutions/08-flash-attention/hopper_attention.cuh by `./course labs` [lab-hash 4d2ba36ca7d1].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// The Hopper (sm_90a) instructions lab 08's Hopper forward needs beyond include/course/wgmma.cuh (whose
// mbarrier, register hand-over, wgmma fence/commit/wait and K-major descriptor it reuses):
//  - a 4-D TMA load: q, k and v are (batch, seqlen, heads, head_dim) views with free strides, so a
//    tile of one head's rows is a box of the 4-D tensor, not of a matrix;
//  - the descriptor of an MN-major tile (V, whose rows are keys = the k of O += P V, with head_dim = n
//    contiguous): wgmma transposes it on the way in, as ldmatrix .trans does for mma.sync;
//  - S = Q K^T as wgmma m64n128k16 with both operands in shared memory (SS), and O += P V as
//    m64n64k16 / m64n128k16 with A = P from registers (RS).
// and what the Hopper backward (flash_backward_hopper.cu) adds: a 1-D bulk copy (its rows of L log2(e) and
// D) and S^T = K Q^T, dP^T = V dO^T, dQ = dS K as wgmma m64n64k16 SS (the last with both operands transposed).
// Compiled only where COURSE_WGMMA is defined (wgmma.cuh: nvcc's sm_90a pass).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <course/wgmma.cuh>

#include "attention.h"

// Host side, defined in flash_forward_hopper.cu and used by the backward too (flash_backward_hopper.cu):
// whether TMA can describe a (batch, seqlen, heads, head_dim) view, and its 4-D tensor map in boxes of 64
// head dims x box_rows rows, 128-byte swizzled.
namespace flash_forward_hopper_impl {
bool view_qualifies(const void* data, const Strides& strides, int64_t batch, int64_t seqlen, int64_t heads);
CUresult encode_view(CUtensorMap* map, ElementType type, const void* data, const Strides& strides, int64_t batch,
                     int64_t seqlen, int64_t heads, int64_t head_dim, int box_rows);
}  // namespace flash_forward_hopper_impl

#ifdef COURSE_WGMMA
namespace hopper {

// The box of `map` whose first element is (c0, c1, c2, c3) (c0 the contiguous dimension) into shared
// memory; its bytes count towards `barrier`. Elements outside the tensor arrive as zeros: a tile that
// crosses seqlen needs no guard, and the zeros are of this head only (each dimension is clipped on its
// own, so row seqlen is not the next head's row 0).
__device__ inline void tma_load_4d(void* destination, const CUtensorMap* map, uint64_t* barrier, int c0, int c1, int c2,
                                   int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(barrier))
      : "memory");
}

// A 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared
// memory, counted towards `barrier` as the tensor copies are: the backward's rows of L log2(e) and D.
__device__ inline void bulk_load(void* destination, const void* source, uint32_t bytes, uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(destination)),
               "l"(reinterpret_cast<uint64_t>(source)), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
}

// The descriptor of an MN-major tile written by TMA with the 128-byte swizzle: rows are the k index
// (here: keys), each row 64 two-byte elements of n (head dims) in 128 bytes; 8 rows (1024 B, one
// swizzle pattern) are the unit wgmma steps over along k (the stride byte offset), and a tile wider
// than 64 along n is stored as boxes of 64 columns, `box_bytes` apart (the leading byte offset).
// Advancing k by 16 rows is adding 16 x 128 bytes to the address.
__device__ inline uint64_t mn_major_descriptor(const void* tile, uint32_t box_bytes) {
  constexpr uint64_t kStrideBytes = 1024, kSwizzle128 = 1;
  return ((shared_address(tile) & 0x3FFFF) >> 4) | (static_cast<uint64_t>((box_bytes >> 4) & 0x3FFF) << 16) |
         ((kStrideBytes >> 4) << 32) | (kSwizzle128 << 62);
}

// The same "settle" as wgmma.cuh's, for an A operand in registers: an empty asm that reads and
// "rewrites" each register after the wgmma that reads it has been waited for. Until then the
// registers are live, so the compiler cannot hand them to other values while the tensor cores read them.
template <int kRows, int kCols>
__device__ inline void keep_until_here(uint32_t (&registers)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+r"(registers[i][j])::"memory");
}

// The operand lists: 8 accumulators at a time.
#define COURSE_ACC8(i)                                                                                            \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define COURSE_ACC32(i) COURSE_ACC8(i), COURSE_ACC8(i + 8), COURSE_ACC8(i + 16), COURSE_ACC8(i + 24)
#define COURSE_REGS32                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define COURSE_REGS64                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d[64 x 128] (64 fp32 a thread) = (accumulate ? d : 0) + A[64 x 16] B[128 x 16]^T, A and B K-major in
// shared memory (SS). The layout of d is mma.m16n8's, repeated (wgmma.cuh): register 4 j + r of a
// thread is register r of the m16n8 tile of columns 8 j .. 8 j + 7 in its warp's 16 rows.
#define COURSE_WGMMA_SS_N128(TYPE)                                                   \
  asm volatile(                                                                      \
      "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %66, 0;\n"               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " COURSE_REGS64 \
      ", %64, %65, accumulate, 1, 1, 0, 0;\n}\n"                                     \
      : COURSE_ACC32(0), COURSE_ACC32(32)                                            \
      : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)))

template <typename T>
__device__ inline void wgmma_ss_n128(float (&d)[64], uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate);
template <>
__device__ inline void wgmma_ss_n128<__nv_bfloat16>(float (&d)[64], uint64_t a_descriptor, uint64_t b_descriptor,
                                                    bool accumulate) {
  COURSE_WGMMA_SS_N128("bf16");
}
template <>
__device__ inline void wgmma_ss_n128<__half>(float (&d)[64], uint64_t a_descriptor, uint64_t b_descriptor,
                                             bool accumulate) {
  COURSE_WGMMA_SS_N128("f16");
}

// d[64 x 64] (32 fp32 a thread) = (accumulate ? d : 0) + A[64 x 16] B[16 x 64], both operands in shared
// memory (SS), for the backward. kTransposed false: A and B K-major (A rows of 16 k, B stored as B^T: S^T =
// K Q^T, dP^T = V dO^T). kTransposed true: both MN-major (imm-trans-a = imm-trans-b = 1: dQ = dS K with dS
// stored as dS^T and K as stored, k = keys as the rows of both).
#define COURSE_WGMMA_SS_N64(TYPE, TRANS)                                            \
  asm volatile(                                                                     \
      "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %34, 0;\n"              \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " COURSE_REGS32 \
      ", %32, %33, accumulate, 1, 1, " TRANS ";\n}\n"                               \
      : COURSE_ACC32(0)                                                             \
      : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)))

template <typename T, bool kTransposed>
struct WgmmaSsN64;
template <>
struct WgmmaSsN64<__nv_bfloat16, false> {
  __device__ static void run(float (&d)[32], uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate) {
    COURSE_WGMMA_SS_N64("bf16", "0, 0");
  }
};
template <>
struct WgmmaSsN64<__nv_bfloat16, true> {
  __device__ static void run(float (&d)[32], uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate) {
    COURSE_WGMMA_SS_N64("bf16", "1, 1");
  }
};
template <>
struct WgmmaSsN64<__half, false> {
  __device__ static void run(float (&d)[32], uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate) {
    COURSE_WGMMA_SS_N64("f16", "0, 0");
  }
};
template <>
struct WgmmaSsN64<__half, true> {
  __device__ static void run(float (&d)[32], uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate) {
    COURSE_WGMMA_SS_N64("f16", "1, 1");
  }
};
#undef COURSE_WGMMA_SS_N64

// d[64 x N] += A[64 x 16] B[16 x N], A in registers (the m16n8k16 A fragment of the thread's warp's 16
// rows: the packed P), B MN-major in shared memory (imm-trans-b = 1: V as stored). N = 64 or 128.
// Always accumulates (O starts at zero): scale-d is a predicate, set from the constant operand 1.
template <typename T, int kN>
struct WgmmaRs;
template <>
struct WgmmaRs<__nv_bfloat16, 64> {
  __device__ static void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b_descriptor) {
    asm volatile(
        "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " COURSE_REGS32
        ", {%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;\n}\n"
        : COURSE_ACC32(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "r"(1));
  }
};
template <>
struct WgmmaRs<__half, 64> {
  __device__ static void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b_descriptor) {
    asm volatile(
        "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " COURSE_REGS32
        ", {%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;\n}\n"
        : COURSE_ACC32(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "r"(1));
  }
};
template <>
struct WgmmaRs<__nv_bfloat16, 128> {
  __device__ static void run(float (&d)[64], const uint32_t (&a)[4], uint64_t b_descriptor) {
    asm volatile(
        "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " COURSE_REGS64
        ", {%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n}\n"
        : COURSE_ACC32(0), COURSE_ACC32(32)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "r"(1));
  }
};
template <>
struct WgmmaRs<__half, 128> {
  __device__ static void run(float (&d)[64], const uint32_t (&a)[4], uint64_t b_descriptor) {
    asm volatile(
        "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " COURSE_REGS64
        ", {%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n}\n"
        : COURSE_ACC32(0), COURSE_ACC32(32)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "r"(1));
  }
};
#undef COURSE_WGMMA_SS_N128
#undef COURSE_REGS64
#undef COURSE_REGS32
#undef COURSE_ACC32
#undef COURSE_ACC8

}  // namespace hopper
#endif  // COURSE_WGMMA

// Hopper's (sm_90a) tensor-core data path, one PTX instruction per function: the tensor memory
// accelerator (TMA) copies tiles global -> shared and signals an mbarrier; wgmma multiplies
// tiles straight out of shared memory. Used by lab 05's linear_act_wgmma.cu, the reference's Hopper
// path (lesson 05, section 10), and by lab 08's Hopper forward (with its hopper_attention.cuh). It
// lives in include/, not in lab 05's folder, so that a build without lab 05 beside it (lab 09
// compiles labs 06-08 only) still finds it. Every function compiles only where COURSE_WGMMA is
// defined: the sm_90a pass of nvcc (TORCH_CUDA_ARCH_LIST=9.0a); other passes see none of it.
#pragma once

#include <cuda.h>  // CUtensorMap: a 128-byte descriptor of a tensor in global memory
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <course/mma.cuh>
#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define COURSE_WGMMA 1
#endif

#ifdef COURSE_WGMMA
namespace hopper {

using course::shared_address;

// ---------------------------------------------------------------- mbarrier
// A 64-bit shared-memory barrier that completes a phase when `count` arrivals have been made
// and every byte announced with expect_bytes has landed. Waiters name the phase by its parity.
__device__ inline void barrier_init(uint64_t* barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(count));
}

// Make the initialised barriers visible to the TMA unit (the async proxy) before first use.
__device__ inline void barrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival, plus `bytes` the phase must also wait for (the TMA copies' complete_tx).
__device__ inline void barrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

__device__ inline void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}

// Block until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and
// the phase "before" it (parity 1) counts as complete: waiting on parity 1 returns at once.
__device__ inline void barrier_wait(uint64_t* barrier, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity)
        : "memory");
  } while (!done);
}

// ---------------------------------------------------------------- TMA
// Copy the box of `map` whose first element is (inner, outer) (inner = the contiguous
// dimension) into shared memory; the bytes count towards `barrier`'s phase. Out-of-bounds
// elements arrive as zeros, so edge tiles need no guards in the main loop.
__device__ inline void tma_load_2d(void* destination, const CUtensorMap* map, uint64_t* barrier, int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(shared_address(barrier))
      : "memory");
}

// The reverse: copy a box from shared memory to `map` at (inner, outer); elements outside the
// tensor are not written, so edge tiles need no guards in the epilogue either. Asynchronous:
// commit_stores closes a group, and the shared memory may be reused after wait_stores_read.
__device__ inline void tma_store_2d(const CUtensorMap* map, const void* source, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(inner), "r"(outer), "r"(shared_address(source))
               : "memory");
}
__device__ inline void commit_stores() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Every committed store group of this thread has finished reading its shared memory.
__device__ inline void wait_stores_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Every committed store group of this thread has finished writing global memory.
__device__ inline void wait_stores_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Shared memory written by ordinary stores, read next by TMA (the async proxy): each writing
// thread fences before the barrier that hands the buffer over.
__device__ inline void fence_shared_for_tma() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A barrier for `threads` threads only (one warpgroup), so the other warpgroups keep running.
// Id 0 is __syncthreads'; the kernel numbers its own from 1.
__device__ inline void warpgroup_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------- registers per warpgroup
// Hand registers from the producer warpgroup (which only issues copies) to the consumers
// (which hold the accumulators). Counts are multiples of 8; the kernel's __launch_bounds__
// (threads, 1) gives the cap at entry that these move.
template <int kRegisters>
__device__ inline void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ inline void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---------------------------------------------------------------- wgmma
// The shared-memory matrix descriptor of a K-major tile written by TMA with the 128-byte
// swizzle: rows of 64 two-byte elements (128 B), 8-row groups 1024 B apart (the stride
// byte offset); the leading byte offset is unused for swizzled K-major tiles (set to 16 B).
// Bits: 0-13 address / 16, 16-29 leading offset / 16, 32-45 stride offset / 16, 62-63 swizzle
// mode (1 = 128 B). Advancing along k inside the 128-byte row is adding k * 2 bytes to the
// address: the hardware applies the same XOR the TMA applied when it wrote the tile.
__device__ inline uint64_t tile_descriptor(const void* tile) {
  constexpr uint64_t kLeadingBytes = 16, kStrideBytes = 1024, kSwizzle128 = 1;
  return ((shared_address(tile) & 0x3FFFF) >> 4) | ((kLeadingBytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) |
         (kSwizzle128 << 62);
}

// Order this warpgroup's earlier register and shared-memory accesses before the next wgmma.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Close the batch of wgmma issued since the last commit into one group.
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most `pending` groups of this warpgroup are still running.
template <int pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}

// The accumulators are written by the tensor cores in the background between the wgmma and
// its wait: this empty asm "redefines" each one after the wait, so the compiler cannot move a
// read of it above the wait.
template <int kCount>
__device__ inline void settle(float (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(registers[i])::"memory");
}

// d[64 x 256] (fp32, 128 registers per thread) = (accumulate ? d : 0) + A[64 x 16] * B[256 x 16]^T,
// A and B K-major in shared memory. Register d[4 j + r] of a thread holds the element that
// register r of mma.m16n8 holds in n-chunk j, in the 16-row slice of the thread's warp.
#define COURSE_WGMMA_OPERANDS_16(i)                                                                               \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7]), "+f"(d[i + 8]), "+f"(d[i + 9]), "+f"(d[i + 10]), "+f"(d[i + 11]), "+f"(d[i + 12]),          \
      "+f"(d[i + 13]), "+f"(d[i + 14]), "+f"(d[i + 15])
#define COURSE_WGMMA_M64N256K16(TYPE)                                                                                \
  asm volatile(                                                                                                      \
      "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %130, 0;\n"                                              \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE                                                   \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "  \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "    \
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, "    \
      "%65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, "    \
      "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, "   \
      "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
      "%124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n}\n"                                            \
      : COURSE_WGMMA_OPERANDS_16(0), COURSE_WGMMA_OPERANDS_16(16), COURSE_WGMMA_OPERANDS_16(32),                     \
        COURSE_WGMMA_OPERANDS_16(48), COURSE_WGMMA_OPERANDS_16(64), COURSE_WGMMA_OPERANDS_16(80),                    \
        COURSE_WGMMA_OPERANDS_16(96), COURSE_WGMMA_OPERANDS_16(112)                                                  \
      : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)))

template <typename T>
__device__ inline void wgmma_m64n256k16(float (&d)[128], uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate);
template <>
__device__ inline void wgmma_m64n256k16<__nv_bfloat16>(float (&d)[128], uint64_t a_descriptor, uint64_t b_descriptor,
                                                       bool accumulate) {
  COURSE_WGMMA_M64N256K16("bf16");
}
template <>
__device__ inline void wgmma_m64n256k16<__half>(float (&d)[128], uint64_t a_descriptor, uint64_t b_descriptor,
                                                bool accumulate) {
  COURSE_WGMMA_M64N256K16("f16");
}
#undef COURSE_WGMMA_M64N256K16
#undef COURSE_WGMMA_OPERANDS_16

}  // namespace hopper
#endif  // COURSE_WGMMA

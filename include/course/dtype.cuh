// The course's element types in kernels: the type the arithmetic runs in, the conversions to it
// and back, and the 16-byte packs that vectorized kernels move, for float, double, __half and
// __nv_bfloat16. Labs 06 and 07 (and later ones) share them. No torch header: kernel sources include
// this, and so may host code (a wrapper reads Compute<T> and vectorizable()).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

namespace course {

// --8<-- [start:compute_type]
// The type the arithmetic runs in: double for double, float for float, __half and
// __nv_bfloat16. A 16-bit element is widened once on load and rounded once on store, because
// CUDA has few 16-bit math functions (no erf; its 16-bit exp and tanh are approximations), and
// because a chain of 16-bit operations would round at every step (lab 06's x + b, u^3, exp, two
// products: each up to 2^-9 relative in bfloat16) where float rounds once at the end. Double
// stays double so that gradcheck's float64 finite differences test the kernel's own arithmetic,
// not a float32 shortcut inside it.
template <typename T>
struct ComputeType {
  using type = float;
};
template <>
struct ComputeType<double> {
  using type = double;
};
template <typename T>
using Compute = typename ComputeType<T>::type;
// --8<-- [end:compute_type]

// --8<-- [start:convert]
// Element -> Compute<T> and back, with the conversion intrinsics rather than casts: torch's
// extension build defines __CUDA_NO_HALF_CONVERSIONS__ and __CUDA_NO_BFLOAT16_CONVERSIONS__,
// which remove the implicit ones. Rounding to nearest even on the way back is the one rounding
// a 16-bit result gets.
__device__ __forceinline__ float to_compute(float v) { return v; }
__device__ __forceinline__ double to_compute(double v) { return v; }
__device__ __forceinline__ float to_compute(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_compute(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_compute(Compute<T> v);
template <>
__device__ __forceinline__ float from_compute<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ double from_compute<double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_compute<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_compute<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// --8<-- [end:convert]

// --8<-- [start:pack]
// 16 bytes is the widest load or store one thread can issue (LDG.E.128 / STG.E.128): 4 floats,
// 8 halves or bfloat16s, 2 doubles. A warp then moves 32 x 16 = 512 contiguous bytes per
// instruction, against 64 bytes for 2-byte scalars: 8x fewer instructions for the same bytes.
constexpr int kVectorBytes = 16;
template <typename T>
constexpr int kElemsPerVector = kVectorBytes / static_cast<int>(sizeof(T));
static_assert(kElemsPerVector<float> == 4 && kElemsPerVector<__nv_bfloat16> == 8 && kElemsPerVector<double> == 2,
              "16 bytes: 4 floats, 8 bfloat16s or halves, 2 doubles");

// kElems consecutive elements that one load or store moves: with kElems = kElemsPerVector<T>,
// 16 bytes aligned to 16, which the compiler turns into one LDG.E.128 / STG.E.128 (a store not
// always: store_pack_global below); with kElems = 1, a plain scalar access. The caller guarantees
// the alignment (vectorizable()).
template <typename T, int kElems>
struct alignas(sizeof(T) * kElems) Pack {
  T v[kElems];
};
static_assert(sizeof(Pack<__nv_bfloat16, 8>) == kVectorBytes && alignof(Pack<float, 4>) == kVectorBytes,
              "a full pack is exactly one 16-byte access");
// --8<-- [end:pack]

// --8<-- [start:widen_pack]
// A pack's elements in Compute<T>, for a pack just loaded. A bfloat16 is the top half of a float32, so a 32-bit word
// of two bfloat16s widens with integer operations: the low element shifted up, the high one masked (exact, NaN and
// subnormals included). Element by element, to_compute is __bfloat162float, an inline-PTX conversion the compiler
// does not see through: it split each word into halves first, one PRMT a pair. Lab 07's staged RMSNorm backward
// (bfloat16, nvcc 13.0, sm_90a, counted from cuobjdump -sass) had 1768 SASS instructions, 192 of them PRMT; widened
// here, 1576 and none. The pack is taken by value: by reference (a memcpy from the caller's pack), nvcc turned a weight
// load of one LDG.E.128 into byte loads.
template <typename T, int kElems>
__device__ __forceinline__ void widen_pack(Pack<T, kElems> pack, Compute<T> (&out)[kElems]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && kElems % 2 == 0) {
    uint32_t words[kElems / 2];
    memcpy(words, &pack, sizeof(words));
#pragma unroll
    for (int i = 0; i < kElems / 2; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);              // element 2i: the word's low half
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);  // element 2i + 1: the high half, in place
    }
  } else {
#pragma unroll
    for (int e = 0; e < kElems; ++e) out[e] = to_compute(pack.v[e]);
  }
}
// --8<-- [end:widen_pack]

// --8<-- [start:store_pack_global]
// A pack's store into global memory, kept one access. The compiler does not always keep a Pack assignment whole: in
// lab 07's staged RMSNorm backward (4 rows a step, unrolled), nvcc 13.0 (sm_90a) split two of its eight 16-byte
// grad_x stores a step into 2- and 4-byte ones (its PTX: 12 st.global.u16 and 2 st.global.v2.u16 beside 6
// st.global.v4.u32; stored through a uint4 instead, 4 st.global.u32 each). With every pack one store, that kernel
// measured 276.4 us against 277.3 on an H100 (lesson 07's notes). A full pack here is one st.global.v4
// (STG.E.128) whatever the compiler infers; the "memory" clobber keeps it in program order with the kernel's other
// memory accesses.
template <typename T, int kElems>
__device__ __forceinline__ void store_pack_global(T* destination, const Pack<T, kElems>& pack) {
  if constexpr (sizeof(Pack<T, kElems>) == kVectorBytes) {
    uint32_t words[4];
    memcpy(words, &pack, kVectorBytes);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(destination), "r"(words[0]), "r"(words[1]),
                 "r"(words[2]), "r"(words[3])
                 : "memory");
  } else {
    *reinterpret_cast<Pack<T, kElems>*>(destination) = pack;
  }
}
// --8<-- [end:store_pack_global]

// --8<-- [start:vectorizable]
// Whether the 16-byte kernels apply: every pointer on a 16-byte boundary (a fresh torch
// allocation is; a view such as x.view(-1)[1:] is not) and cols a multiple of the vector. Then
// every row starts on a vector boundary too, so no vector straddles two rows, and a per-column
// operand (lab 06's bias, lab 07's weight) of a whole vector is one 16-byte load. Anything else
// (cols = 1, 3, 4097; an offset view) takes the scalar path: correct everywhere, slower.
inline bool vectorizable(int64_t cols, int elems_per_vector, std::initializer_list<const void*> pointers) {
  if (cols % elems_per_vector != 0) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % kVectorBytes != 0) return false;
  }
  return true;
}
// --8<-- [end:vectorizable]

}  // namespace course

// Lab 06's device math, shared by the forward and the backward: GELU with its derivative in both
// of torch's forms. The conversions to the compute type and back and the 16-byte packs that the
// vectorized kernels move are the course's (include/course/dtype.cuh, through
// fused_elementwise.h). Device code only; no torch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "fused_elementwise.h"

// Overloads that keep each precision in its own functions: erff for float (not erf(double),
// which would run float data through the slow double path), erf for double.
__device__ __forceinline__ float erf_of(float v) { return erff(v); }
__device__ __forceinline__ double erf_of(double v) { return erf(v); }
__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
// exp(v) for the normal density's v = -u^2 / 2 <= 0 only. __expf (a multiply and the hardware's
// ex2) has a relative error of up to 2 + 1.17 |v| ulps, growing with |v|, but the density it
// feeds shrinks like exp(v): u phi(u) stays within 8e-8 of the truth for every u (worst near
// u = 1.7, where GELU'(u) = 1.1, so about an ulp of the result). It is 2 instructions against
// expf's ~8, and made the bfloat16 backward 2% faster.
__device__ __forceinline__ float density_exp_of(float v) { return __expf(v); }
__device__ __forceinline__ double density_exp_of(double v) { return exp(v); }
__device__ __forceinline__ float fabs_of(float v) { return fabsf(v); }
__device__ __forceinline__ double fabs_of(double v) { return fabs(v); }
// 1 / v for v in [1, 2], the only place it is used: __fdividef is the hardware reciprocal and a
// multiply (2 ulps at most in this range), where 1.0f / v is IEEE division, a ~10-instruction
// sequence with a slow-path branch. Measured, bfloat16 tanh forward at (8192, 8192) on an H100:
// 0.62x of copy bandwidth with the division, 0.82x with __fdividef (four vectors per thread).
__device__ __forceinline__ float reciprocal_of(float v) { return __fdividef(1.0f, v); }
__device__ __forceinline__ double reciprocal_of(double v) { return 1.0 / v; }

// The constants, in double; F(constant) rounds each once, at compile time, to the compute type.
constexpr double kInvSqrt2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi): the normal density at 0
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kTanhCubic = 0.044715;                  // the cubic term of the tanh approximation

// --8<-- [start:gelu]
// GELU(u) = u Phi(u), Phi the standard normal CDF:
//   erf form   0.5 u (1 + erf(u / sqrt(2)))
//   tanh form  0.5 u (1 + tanh(k)),  k = sqrt(2 / pi) (u + 0.044715 u^3)
// F is float or double (Compute<T>): all arithmetic in F, the constants rounded to F.
//
// The tanh form is computed as u sigma(2k), sigma(z) = 1 / (1 + exp(-z)), which is the same
// function (0.5 (1 + tanh k) = sigma(2k)) without its cancellation: for k << 0, 1 + tanh(k) is
// 1 minus a number within a few ulps of 1, so tanhf's error of an ulp of 1 becomes most of the
// result. sigma(2k) = a / (1 + a) with a = exp(-2|k|) for k < 0 (and 1 / (1 + a) for k >= 0) is
// accurate to a few ulps relative everywhere, a in (0, 1] cannot overflow, and it costs about as
// much as tanhf (one exp, one hardware reciprocal; measured within 4%).
//
// The erf form keeps 1 + erf(...), which cancels the same way; its absolute error is erff's,
// 2 ulps of 1, times 0.5 |u|: at most ~3e-7, near u = -5.5 (below that erff rounds to -1 and y
// to 0, where |y| < 1e-7), small against the outputs' typical size of ~1 but not against a value
// of 1e-6. The exact 0.5 u erfc(-u / sqrt 2) would cost 2.5x the instructions (erfcf: ~70 PTX
// instructions against erff's ~29), and the 16-bit kernels, which have ~50 instruction slots per
// element at 90% of an H100's copy bandwidth, would become compute-bound. PyTorch's kernels compute both forms
// with the cancelling expressions.
template <typename F>
struct Sigmoid2k {  // sigma(2k) and the pieces of it that the derivative reuses
  F a;              // exp(-2 |k|), in (0, 1]
  F q;              // 1 / (1 + a) = sigma(2 |k|)
  F value;          // sigma(2k): q for k >= 0, a q for k < 0
};
template <typename F>
__device__ __forceinline__ Sigmoid2k<F> sigmoid_2k(F k) {
  const F a = exp_of(F(-2) * fabs_of(k));
  const F q = reciprocal_of(F(1) + a);
  return {a, q, k >= F(0) ? q : a * q};
}

template <GeluForm kForm, typename F>
__device__ __forceinline__ F gelu(F u) {
  static_assert(std::is_same_v<F, float> || std::is_same_v<F, double>, "compute in float or double");
  // SOLUTION BEGIN lab06.1: return GELU(u) in the form kForm, every operation in F (write constants as F(kInvSqrt2)
  //   so that float stays float): erf form 0.5 u (1 + erf_of(u / sqrt 2)); tanh form u sigma(2k) with
  //   k = sqrt(2 / pi) (u + 0.044715 u^3), sigma(2k) from sigmoid_2k(k)
  if constexpr (kForm == GeluForm::kErf) {
    return F(0.5) * u * (F(1) + erf_of(u * F(kInvSqrt2)));
  } else {
    const F k = F(kSqrt2OverPi) * (u + F(kTanhCubic) * u * u * u);
    return u * sigmoid_2k(k).value;  // = 0.5 u (1 + tanh(k))
  }
  // SOLUTION STUB
  // return u;  // no activation at all: y = x + bias
  // SOLUTION END
}

// d GELU / du:
//   erf form   Phi(u) + u phi(u),  phi(u) = exp(-u^2 / 2) / sqrt(2 pi) = Phi'(u)
//   tanh form  0.5 (1 + tanh k) + 0.5 u (1 - tanh^2 k) dk/du,  dk/du = sqrt(2 / pi) (1 + 3 0.044715 u^2)
//              = sigma(2k) + 2 u a q^2 dk/du,  since 1 - tanh^2 k = 4 sigma(2k) sigma(-2k) = 4 a q^2
template <GeluForm kForm, typename F>
__device__ __forceinline__ F gelu_grad(F u) {
  // SOLUTION BEGIN lab06.1: return GELU'(u) in the form kForm, both terms of the product rule, every operation in F:
  //   erf form Phi(u) + u phi(u); tanh form sigma(2k) + 2 u a q^2 dk/du with a, q from sigmoid_2k(k)
  if constexpr (kForm == GeluForm::kErf) {
    const F cdf = F(0.5) * (F(1) + erf_of(u * F(kInvSqrt2)));        // Phi(u)
    const F pdf = F(kInvSqrt2Pi) * density_exp_of(F(-0.5) * u * u);  // phi(u): 0 for |u| > ~14
    return cdf + u * pdf;
  } else {
    const F u2 = u * u;
    const Sigmoid2k<F> s = sigmoid_2k(F(kSqrt2OverPi) * (u + F(kTanhCubic) * u2 * u));
    const F dk_du = F(kSqrt2OverPi) * (F(1) + F(3 * kTanhCubic) * u2);
    return s.value + F(2) * u * s.a * s.q * s.q * dk_du;
  }
  // SOLUTION STUB
  // return F(1);  // the derivative of no activation: grad_x = grad_y
  // SOLUTION END
}
// --8<-- [end:gelu]

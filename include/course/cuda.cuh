// The course's one shared CUDA header: error checks and small helpers for kernel
// sources. It includes no torch header, so a kernel .cu file that includes only
// this compiles in seconds and rebuilds alone when it changes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace course {

// Blocks needed to cover n items with `per_block` items each.
template <typename T>
__host__ __device__ constexpr T ceil_div(T n, T per_block) {
  return (n + per_block - 1) / per_block;
}

// --8<-- [start:checks]
// Throws (rather than exits) so the Python caller sees a RuntimeError that names
// the failing call, and a grader process survives to report it.
inline void check_cuda(cudaError_t status, const char* expr, const char* file, int line) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ") from " + expr + " at " + file + ":" +
                             std::to_string(line));
  }
}

// --8<-- [end:checks]

// An attribute of the current device (multiprocessor count, threads per SM, ...),
// read once per device and attribute: the query costs microseconds per launch otherwise.
inline int device_attribute(cudaDeviceAttr attribute) {
  constexpr int kMaxDevices = 64, kMaxAttributes = 256;
  static int cache[kMaxDevices][kMaxAttributes] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", __FILE__, __LINE__);
  const bool cacheable = device < kMaxDevices && static_cast<int>(attribute) < kMaxAttributes;
  if (cacheable && cache[device][attribute] > 0) return cache[device][attribute];
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attribute, device), "cudaDeviceGetAttribute", __FILE__, __LINE__);
  if (cacheable) cache[device][attribute] = value;
  return value;
}

}  // namespace course

// --8<-- [start:macros]
// Wrap every CUDA runtime call: COURSE_CUDA_CHECK(cudaMemsetAsync(...));
#define COURSE_CUDA_CHECK(expr) ::course::check_cuda((expr), #expr, __FILE__, __LINE__)
// After every launch: a bad configuration (too many threads, too much shared memory)
// is reported here, at the launch, instead of surfacing later in an unrelated call.
#define COURSE_CHECK_LAUNCH() ::course::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
// --8<-- [end:macros]

// The course's one shared CUDA header: error checks, the warp, launch shapes and per-GPU
// queries for kernel sources. It includes no torch header, so a kernel .cu file that includes only
// this compiles in seconds and rebuilds alone when it changes.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "target.h"

namespace course {

// The warp: the 32 threads that issue each instruction together, on every GPU from sm_75 to
// sm_90. Block sizes are whole warps, and a warp's shuffles exchange registers among its lanes.
constexpr int kWarpSize = 32;
// Every lane of the warp takes part in a __shfl_*_sync: bit i of the mask is lane i.
constexpr unsigned kFullWarpMask = 0xffffffffu;
static_assert(sizeof(kFullWarpMask) * 8 == kWarpSize, "one mask bit per lane");

// The shape of a 1-D launch: kernel<<<blocks, threads>>>.
struct LaunchConfig {
  int blocks;
  int threads;
};

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
    throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                             ") from " + expr + " at " + file + ":" + std::to_string(line));
  }
}

// --8<-- [end:checks]

// The GPU that this thread's CUDA calls go to (torch's CUDAGuard sets it to the tensor's).
inline int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", __FILE__, __LINE__);
  return device;
}

// One int per GPU, computed by the first get() on that GPU and returned by every later one.
// For what a launcher would otherwise ask the driver on every call (microseconds each) although
// it changes only with the GPU: attributes, occupancy. Keyed by device because one process may
// drive different GPUs, whose SM counts and occupancies differ. Keep one as a static beside the
// code that asks (a static starts zeroed: nothing known). For values only, never for a side effect
// on a kernel (see opt_in_dynamic_shared below).
class PerDeviceCache {
 public:
  template <typename Compute>
  int get(Compute&& compute) {
    const int device = current_device();
    if (device < 0 || device >= kMaxDevices) return compute();  // past the table: ask every time
    if (known_[device].load(std::memory_order_acquire)) return values_[device].load(std::memory_order_relaxed);
    const int value = compute();  // threads that race here compute the same value
    values_[device].store(value, std::memory_order_relaxed);
    known_[device].store(true, std::memory_order_release);  // publishes the value stored above
    return value;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int> values_[kMaxDevices];
  std::atomic<bool> known_[kMaxDevices];
};

// The value of `attribute` on the GPU being simulated (target.h), given the real GPU's: the simulated compute
// capability, the lower of each limit, no thread block clusters below 9.0.
inline int simulated_attribute(cudaDeviceAttr attribute, int real) {
  const TargetLimits& target = target_limits();
  if (!target.active) return real;
  switch (attribute) {
    case cudaDevAttrComputeCapabilityMajor: return target.major;
    case cudaDevAttrComputeCapabilityMinor: return target.minor;
    case cudaDevAttrMultiProcessorCount: return capped(real, target.sms);
    case cudaDevAttrMaxThreadsPerMultiProcessor: return capped(real, target.threads_per_sm);
    case cudaDevAttrMaxBlocksPerMultiprocessor: return capped(real, target.blocks_per_sm);
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: return capped(real, target.shared_per_block_optin);
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: return capped(real, target.shared_per_sm);
    case cudaDevAttrL2CacheSize: return capped(real, target.l2_bytes);
    case cudaDevAttrClusterLaunch: return target.major >= 9 ? real : 0;
    default: return real;
  }
}

// An attribute of the current device (multiprocessor count, threads per SM, ...): of the GPU simulated, when one
// is (target.h).
inline int device_attribute(cudaDeviceAttr attribute) {
  constexpr int kCachedAttributes = 256;  // above every cudaDeviceAttr value in use
  static PerDeviceCache cache[kCachedAttributes];
  const auto query = [attribute] {
    int value = 0;
    check_cuda(cudaDeviceGetAttribute(&value, attribute, current_device()), "cudaDeviceGetAttribute", __FILE__,
               __LINE__);
    return simulated_attribute(attribute, value);
  };
  const int index = static_cast<int>(attribute);
  return index >= 0 && index < kCachedAttributes ? cache[index].get(query) : query();
}

// The sm_90a image (wgmma, TMA, Hopper's CUTLASS kernels). A file with such kernels names a flag with
// COURSE_SM90A_IMAGE_FLAG(name): a __device__ int that is 1 in the image nvcc built for sm_90a and 0 in every other
// (each image has its own copy). The driver loads the sm_90a image only on a compute capability 9.0 GPU, and only if
// the build had one (TORCH_CUDA_ARCH_LIST=9.0a); sm90a_image_loaded reads the loaded image's flag, once per GPU
// (`cache` is the caller's: a process may hold a Hopper GPU and an older one). The read itself,
// [](int* out) { return cudaMemcpyFromSymbol(out, flag, sizeof(int)); }, is written in the flag's own .cu file, the
// symbol named there: passed in here as a const int& and read as cudaMemcpyFromSymbol(out, &flag, ...), every
// read failed with cudaErrorInvalidSymbol (an H100; why was not found).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define COURSE_SM90A_IMAGE_FLAG(name) __device__ int name = 1
#else
#define COURSE_SM90A_IMAGE_FLAG(name) __device__ int name = 0
#endif

template <typename ReadFlag>
bool sm90a_image_loaded(PerDeviceCache& cache, ReadFlag read_flag) {
  return cache.get([&read_flag] {
    int loaded = 0;
    if (device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
        device_attribute(cudaDevAttrComputeCapabilityMinor) == 0) {
      check_cuda(read_flag(&loaded), "cudaMemcpyFromSymbol", __FILE__, __LINE__);
    }
    return loaded;
  }) == 1;
}

// Blocks of `kernel` that one SM of the current GPU holds at once, launched with
// `threads_per_block` threads and `dynamic_shared_bytes` of dynamic shared memory. Threads are
// not the only limit: the occupancy calculator also counts the kernel's registers and shared
// memory, whichever runs out first. The caller keeps `cache`, one per kernel and block size.
template <typename Kernel>
int resident_blocks_per_sm(PerDeviceCache& cache, Kernel kernel, int threads_per_block,
                           size_t dynamic_shared_bytes = 0) {
  return cache.get([&] {
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads_per_block, dynamic_shared_bytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor", __FILE__, __LINE__);
    return blocks;
  });
}

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the current GPU (past 48 KiB a
// kernel must opt in), asking the driver once per kernel and GPU; `carveout` (e.g.
// cudaSharedmemCarveoutMaxShared) also sets the kernel's preferred shared memory carveout. Where the
// GPU lets a block have less (sm_75: 64 KiB), it throws "<what>: a block needs ..." instead of
// letting the launch fail with cudaErrorInvalidValue.
//
// Why this memo is keyed by the kernel's address and is not a `static PerDeviceCache` beside the
// launcher, as a value is: a static local of a template or inline function is ONE object in the
// whole process (g++ emits it as a unique global symbol, `nm` type u, which the dynamic linker
// merges even across libraries loaded RTLD_LOCAL), shared by every extension compiled from the same
// launcher source. Lab 09 compiles lab 08's sources again: with lab 08's module loaded in the same
// process, lab 08's "opted in" flag told lab 09's launcher that its own kernel, a different
// function in a different library, had opted in, and the launch failed with cudaErrorInvalidValue
// (an H100). A cached value (an attribute, an occupancy) of the same code is the same in
// every library; a side effect on one library's kernel is not.
inline void opt_in_dynamic_shared_bytes(const void* kernel, size_t bytes, const char* what, int carveout) {
  struct Done {
    const void* kernel;
    int device;
    size_t bytes;
  };
  static std::mutex mutex;
  static std::vector<Done> done;  // a few dozen kernels: a scan costs less than the launch
  const int device = current_device();
  std::lock_guard<std::mutex> lock(mutex);
  for (const Done& d : done) {
    if (d.kernel == kernel && d.device == device && d.bytes >= bytes) return;
  }
  const int limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);  // the simulated GPU's, if one is
  if (bytes > static_cast<size_t>(limit)) {
    throw std::runtime_error(std::string(what) + ": a block needs " + std::to_string(bytes) +
                             " bytes of shared memory; this GPU allows " + std::to_string(limit) +
                             (target_limits().active ? " (the GPU simulated, COURSE_TARGET_ARCH)" : ""));
  }
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", __FILE__, __LINE__);
  if (carveout >= 0) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
               "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)", __FILE__, __LINE__);
  }
  done.push_back({kernel, device, bytes});
}

template <typename Kernel>
void opt_in_dynamic_shared(Kernel kernel, size_t bytes, const char* what, int carveout = -1) {
  opt_in_dynamic_shared_bytes(reinterpret_cast<const void*>(kernel), bytes, what, carveout);
}

// --8<-- [start:dependent_launch]
// Programmatic dependent launch (sm_90 and later). A kernel launched by launch_after_prior_grid may be scheduled while
// the kernel before it in the stream is still draining, so that its launch and prologue overlap that kernel's last
// blocks instead of following them; it must call wait_for_prior_grid() before it reads anything an earlier kernel
// wrote (the wait returns once that kernel has finished and its writes are visible). allow_next_grid() lets the
// kernel after this one, launched so, be scheduled before this one's blocks exit. Lab 07's RMSNorm backward: with
// both of its kernels launched so, forward + backward measured 1.8-2.5 us (0.4-0.5%) less on an H100
// (lesson 07's notes). Before sm_90 the launch is an ordinary one and both device calls compile to nothing.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), as a dependent launch where the GPU has them; checked.
template <typename... Params, typename... Args>
void launch_after_prior_grid(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchAttribute dependent = {};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9 ? 1 : 0;  // sm_90 and later
  check_cuda(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...), "cudaLaunchKernelEx", __FILE__,
             __LINE__);
}
// --8<-- [end:dependent_launch]

}  // namespace course

// --8<-- [start:macros]
// Wrap every CUDA runtime call: COURSE_CUDA_CHECK(cudaMemsetAsync(...));
#define COURSE_CUDA_CHECK(expr) ::course::check_cuda((expr), #expr, __FILE__, __LINE__)
// After every launch: a bad configuration (too many threads, too much shared memory)
// is reported here, at the launch, instead of surfacing later in an unrelated call.
#define COURSE_CHECK_LAUNCH() ::course::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
// --8<-- [end:macros]

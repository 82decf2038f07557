// Lab skeleton generated from solutions/01-memory-bandwidth/wrapper.cpp by `./course labs` [lab-hash a88779936cb8].
// Students: fill in the TODO(lab01.k) blocks, then run `./course grade 01`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 01's host wrapper: Tensors in, checks, current stream, launch. The copies write into a
// dst the caller owns, like PyTorch's dst.copy_(src), so the grader can hand them views that
// start anywhere in memory (x[1:]) and see what a kernel does to the floats around them.
#include <ATen/MemoryOverlap.h>
#include <course/torch_op.h>
#include <torch/csrc/utils/pybind.h>

#include "memory_bandwidth.h"

// --8<-- [start:checks]
static void check_copy(const at::Tensor& dst, const at::Tensor& src, const char* op) {
  course::check_cuda_tensor(dst, op, "dst");
  course::check_cuda_tensor(src, op, "src");
  course::check_dtype(dst, op, "dst", at::kFloat);
  course::check_dtype(src, op, "src", at::kFloat);
  // A flat index i means element i only for gap-free row-major storage. A contiguous view
  // may still start anywhere (x[1:] starts 4 bytes past a 16-byte boundary): that is allowed.
  course::check_contiguous(dst, op, "dst");
  course::check_contiguous(src, op, "src");
  course::check_same_device(dst, src, op, "dst", "src");
  course::check_same_shape(dst, src, op, "dst", "src");
  // The kernels' __restrict__ promises the compiler that dst and src never alias; with an
  // overlap, a thread could overwrite what another has yet to read.
  TORCH_CHECK(at::get_overlap_status(dst, src) == at::MemOverlapStatus::No, op, ": dst and src overlap in memory (",
              course::describe(dst), " and ", course::describe(src),
              "); copy into a separate tensor, e.g. src.clone()");
}
// --8<-- [end:checks]

// The part every copy shares: checks, device guard, launch on the current stream.
template <typename Launcher>
static at::Tensor run_copy(const char* op, const at::Tensor& dst, const at::Tensor& src, int64_t blocks,
                           Launcher launch) {
  check_copy(dst, src, op);
  TORCH_CHECK(blocks >= 0, op, ": blocks must be >= 0 (0 derives the grid), got ", std::to_string(blocks));
  // Make dst's GPU current, so the launch goes to the GPU the tensors live on.
  const c10::cuda::CUDAGuard device_guard(dst.device());
  launch(src.const_data_ptr<float>(), dst.mutable_data_ptr<float>(), src.numel(), static_cast<int>(blocks),
         course::current_stream());
  return dst;
}

at::Tensor copy_coalesced(const at::Tensor& dst, const at::Tensor& src, int64_t blocks) {
  return run_copy("copy_coalesced", dst, src, blocks, launch_copy_coalesced);
}

at::Tensor copy_strided(const at::Tensor& dst, const at::Tensor& src, int64_t stride, int64_t blocks) {
  TORCH_CHECK(stride >= 1, "copy_strided: stride must be >= 1 (1 is the coalesced copy), got ", std::to_string(stride));
  return run_copy("copy_strided", dst, src, blocks,
                  [stride](const float* from, float* to, int64_t n, int grid, cudaStream_t stream) {
                    launch_copy_strided(from, to, n, stride, grid, stream);
                  });
}

at::Tensor copy_vectorized(const at::Tensor& dst, const at::Tensor& src, int64_t blocks) {
  return run_copy("copy_vectorized", dst, src, blocks, launch_copy_vectorized);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("copy_coalesced", &copy_coalesced,
        "dst[i] = src[i], neighbouring threads on neighbouring elements; returns dst", pybind11::arg("dst"),
        pybind11::arg("src"), pybind11::arg("blocks") = 0);
  m.def("copy_strided", &copy_strided, "dst[i] = src[i], neighbouring threads `stride` elements apart; returns dst",
        pybind11::arg("dst"), pybind11::arg("src"), pybind11::arg("stride"), pybind11::arg("blocks") = 0);
  m.def("copy_vectorized", &copy_vectorized, "dst[i] = src[i] with 16-byte float4 accesses; returns dst",
        pybind11::arg("dst"), pybind11::arg("src"), pybind11::arg("blocks") = 0);
  m.def(
      "vector_split",
      [](uint64_t src_address, uint64_t dst_address, int64_t n) {
        TORCH_CHECK(n >= 0, "vector_split: n must be >= 0, got ", std::to_string(n));
        const VectorSplit s = vector_split(static_cast<uintptr_t>(src_address), static_cast<uintptr_t>(dst_address), n);
        return std::make_tuple(s.head, s.vectors, s.tail);
      },
      "(head, vectors, tail) of a copy of n floats between these addresses", pybind11::arg("src_address"),
      pybind11::arg("dst_address"), pybind11::arg("n"));
  m.def(
      "copy_launch",
      [](int64_t work_items, int sm_count, int max_threads_per_sm) {
        const LaunchConfig c = copy_launch(work_items, kThreadsPerBlock, sm_count, max_threads_per_sm);
        return std::make_pair(c.blocks, c.threads);
      },
      "(blocks, threads) for work_items units of work on a GPU with sm_count SMs", pybind11::arg("work_items"),
      pybind11::arg("sm_count"), pybind11::arg("max_threads_per_sm"));
  // The numbers the kernels are built with, so that the grader and the notebook read them
  // instead of restating them.
  m.def(
      "constants",
      [] {
        return pybind11::dict(pybind11::arg("threads_per_block") = kThreadsPerBlock,
                              pybind11::arg("warp_size") = course::kWarpSize);
      },
      "{threads_per_block, warp_size}: the kernels' fixed launch numbers");
}

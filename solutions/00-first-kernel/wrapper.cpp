// Lab 00's host wrapper: Tensor in, checks, current stream, launch, Tensor out.
// This is the only file of the lab that includes torch headers.
#include <course/torch_op.h>
#include <torch/csrc/utils/pybind.h>

#include "first_kernel.h"

// --8<-- [start:scale]
at::Tensor scale(const at::Tensor& x, double alpha, int64_t blocks) {
  course::check_cuda_tensor(x, "scale", "x");
  course::check_dtype(x, "scale", "x", at::kFloat);
  course::check_contiguous(x, "scale", "x");
  TORCH_CHECK(blocks >= 0, "scale: blocks must be >= 0 (0 derives the grid), got ", std::to_string(blocks));
  // Make x's GPU current, so the allocation and the launch go to the GPU x lives on.
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor y = at::empty_like(x);
  launch_scale(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), static_cast<float>(alpha), x.numel(),
               static_cast<int>(blocks), course::current_stream());
  return y;
}
// --8<-- [end:scale]

// --8<-- [start:axpy]
at::Tensor axpy(double alpha, const at::Tensor& x, const at::Tensor& y, int64_t blocks) {
  // SOLUTION BEGIN lab00.4: check both inputs as scale() does (CUDA, float32, contiguous), and that x and y share a
  //   device and a shape; then allocate out, guard x's device and launch on the current stream
  for (const auto& [t, name] : {std::pair{&x, "x"}, std::pair{&y, "y"}}) {
    course::check_cuda_tensor(*t, "axpy", name);
    course::check_dtype(*t, "axpy", name, at::kFloat);
    course::check_contiguous(*t, "axpy", name);
  }
  course::check_same_device(x, y, "axpy", "x", "y");
  course::check_same_shape(x, y, "axpy", "x", "y");
  TORCH_CHECK(blocks >= 0, "axpy: blocks must be >= 0 (0 derives the grid), got ", std::to_string(blocks));
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor out = at::empty_like(x);
  launch_axpy(static_cast<float>(alpha), x.const_data_ptr<float>(), y.const_data_ptr<float>(),
              out.mutable_data_ptr<float>(), x.numel(), static_cast<int>(blocks), course::current_stream());
  return out;
  // SOLUTION STUB
  // return at::empty_like(x);
  // SOLUTION END
}
// --8<-- [end:axpy]

// pybind11 exposes the functions as a Python module; load() returns it. Lesson 09
// replaces this with a TORCH_LIBRARY op that torch.compile and autograd can see.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale", &scale, "y = alpha * x", pybind11::arg("x"), pybind11::arg("alpha"), pybind11::arg("blocks") = 0);
  m.def("axpy", &axpy, "alpha * x + y", pybind11::arg("alpha"), pybind11::arg("x"), pybind11::arg("y"),
        pybind11::arg("blocks") = 0);
  m.def(
      "launch_config",
      [](int64_t n, int sm_count, int max_threads_per_sm) {
        const LaunchConfig c = launch_config(n, sm_count, max_threads_per_sm);
        return std::make_pair(c.blocks, c.threads);
      },
      "(blocks, threads) for n elements on a GPU with sm_count SMs", pybind11::arg("n"), pybind11::arg("sm_count"),
      pybind11::arg("max_threads_per_sm"));
  // The numbers the kernels are built with, so that the grader and the notebook read them
  // instead of restating them.
  m.def(
      "constants",
      [] {
        return pybind11::dict(pybind11::arg("threads_per_block") = threads_per_block(),
                              pybind11::arg("warp_size") = course::kWarpSize);
      },
      "{threads_per_block, warp_size}: the kernels' fixed launch numbers");
}

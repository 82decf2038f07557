// Lab 07's Python module: wrapper.h's functions bound with pybind11, and the kernels' fixed
// numbers. Kept apart from wrapper.cpp so that lab 09 can compile the wrapper without Python.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "normalization.h"
#include "wrapper.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("softmax", &softmax, "softmax over the last dimension of x (..., N); path 'auto', 'registers' or 'streaming'",
        py::arg("x"), py::arg("path") = "auto");
  m.def("softmax_backward", &softmax_backward, "grad_x = y * (grad_y - sum(grad_y * y, -1)) of y = softmax(x)",
        py::arg("grad_y"), py::arg("y"), py::arg("path") = "auto");
  m.def("rms_norm", &rms_norm,
        "(y, rstd): y = x * rsqrt(mean(x^2, -1) + eps) * weight for x (..., N), weight (N,); rstd (x.shape[:-1]) "
        "in float32 (float64 for float64 x)",
        py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-6, py::arg("path") = "auto");
  m.def("rms_norm_backward", &rms_norm_backward,
        "(grad_x, grad_weight) of rms_norm from the forward's rstd; grad_weight bitwise reproducible",
        py::arg("grad_y"), py::arg("x"), py::arg("weight"), py::arg("rstd"), py::arg("path") = "auto");
  // The numbers the kernels are built with, so that the grader and the notebook read them
  // instead of restating them. Per element size in bytes where they depend on the dtype.
  m.def(
      "constants",
      [] {
        constexpr NormConstants c = kNormConstants;
        py::dict max_register_row_by_size, max_warp_row_by_size;
        max_register_row_by_size[py::int_(2)] = max_register_row<__half>();
        max_register_row_by_size[py::int_(4)] = max_register_row<float>();
        max_register_row_by_size[py::int_(8)] = max_register_row<double>();
        max_warp_row_by_size[py::int_(2)] = max_warp_row<__half>();
        max_warp_row_by_size[py::int_(4)] = max_warp_row<float>();
        max_warp_row_by_size[py::int_(8)] = max_warp_row<double>();
        return py::dict(
            py::arg("warp_size") = c.warp_size, py::arg("threads_per_block") = c.threads_per_block,
            py::arg("stream_threads") = c.stream_threads, py::arg("stream_packs_in_flight") = c.stream_packs_in_flight,
            py::arg("vector_bytes") = c.vector_bytes, py::arg("min_elems_per_thread") = c.min_elems_per_thread,
            py::arg("max_register_row") = max_register_row_by_size, py::arg("max_warp_row") = max_warp_row_by_size,
            py::arg("max_partial_rows") = c.max_partial_rows, py::arg("finalize_row_lanes") = c.finalize_row_lanes);
      },
      "{warp_size, threads_per_block, stream_threads, stream_packs_in_flight, vector_bytes, min_elems_per_thread, "
      "max_register_row {element bytes: N}, max_warp_row {element bytes: N}, max_partial_rows, finalize_row_lanes}");
  m.def("grad_weight_chunks", &grad_weight_chunks,
        "rows of grad_weight partials (= blocks of the backward) for `rows` rows: a function of rows alone",
        py::arg("rows"));
}

// Lab skeleton generated from solutions/07-fused-normalization/module.cpp by `./course labs` [lab-hash 6bdbc183f52c].
// Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 07's Python module: wrapper.h's functions bound with pybind11, and the kernels' fixed
// numbers. Kept apart from wrapper.cpp so that lab 09 can compile the wrapper without Python.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "normalization.h"
#include "wrapper.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("softmax", &softmax,
        "softmax over the last dimension of x (..., N); path 'auto', 'registers', 'on_chip' or 'streaming'",
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
        py::dict max_register_row_by_size, max_warp_row_by_size, on_chip_forward_by_size, on_chip_backward_by_size;
        max_register_row_by_size[py::int_(2)] = max_register_row<__half>();
        max_register_row_by_size[py::int_(4)] = max_register_row<float>();
        max_register_row_by_size[py::int_(8)] = max_register_row<double>();
        max_warp_row_by_size[py::int_(2)] = max_warp_row<__half>();
        max_warp_row_by_size[py::int_(4)] = max_warp_row<float>();
        max_warp_row_by_size[py::int_(8)] = max_warp_row<double>();
        on_chip_forward_by_size[py::int_(2)] = max_on_chip_forward_row<__half>();
        on_chip_forward_by_size[py::int_(4)] = max_on_chip_forward_row<float>();
        on_chip_forward_by_size[py::int_(8)] = max_on_chip_forward_row<double>();
        on_chip_backward_by_size[py::int_(2)] = max_on_chip_backward_row<__half>();
        on_chip_backward_by_size[py::int_(4)] = max_on_chip_backward_row<float>();
        on_chip_backward_by_size[py::int_(8)] = max_on_chip_backward_row<double>();
        return py::dict(
            py::arg("warp_size") = c.warp_size, py::arg("threads_per_block") = c.threads_per_block,
            py::arg("stream_threads") = c.stream_threads, py::arg("stream_packs_in_flight") = c.stream_packs_in_flight,
            py::arg("vector_bytes") = c.vector_bytes, py::arg("min_elems_per_thread") = c.min_elems_per_thread,
            py::arg("max_register_row") = max_register_row_by_size, py::arg("max_warp_row") = max_warp_row_by_size,
            py::arg("max_partial_rows") = c.max_partial_rows, py::arg("finalize_row_lanes") = c.finalize_row_lanes,
            py::arg("on_chip_threads") = c.on_chip_threads, py::arg("cluster_blocks") = c.cluster_blocks,
            py::arg("max_on_chip_forward_row") = on_chip_forward_by_size,
            py::arg("max_on_chip_backward_row") = on_chip_backward_by_size,
            py::arg("staged_shared_bytes") = kStagedSharedBytes);
      },
      "{warp_size, threads_per_block, stream_threads, stream_packs_in_flight, vector_bytes, min_elems_per_thread, "
      "max_register_row {element bytes: N}, max_warp_row {element bytes: N}, max_partial_rows, finalize_row_lanes, "
      "on_chip_threads, cluster_blocks, max_on_chip_forward_row {element bytes: N}, max_on_chip_backward_row "
      "{element bytes: N}, staged_shared_bytes}: the on-chip rows at their longest, on a GPU that has room for them "
      "(on_chip_row says what this one takes); the staged RMSNorm backward's ring, dynamic shared memory a block");
  // What the on-chip path takes on the current GPU, asked at run time (shared memory, clusters).
  m.def(
      "on_chip_row",
      [](int64_t element_bytes, bool backward) -> int64_t {
        switch (element_bytes) {
          case 2: return softmax_on_chip_row<__half>(backward);  // bfloat16 alike: both compute in float
          case 4: return softmax_on_chip_row<float>(backward);
          case 8: return softmax_on_chip_row<double>(backward);
          default: throw py::value_error("on_chip_row: element_bytes must be 2, 4 or 8");
        }
      },
      "the longest row softmax's path='on_chip' takes on the current GPU for elements of element_bytes bytes, "
      "forward or backward; 0 where it takes none",
      py::arg("element_bytes"), py::arg("backward"));
  m.def(
      "staged_backward_blocks",
      [](int64_t element_bytes, int64_t rows, int64_t n) -> int64_t {
        switch (element_bytes) {
          case 2: return rms_norm_backward_staged_blocks<__half>(rows, n);  // bfloat16 alike
          case 4: return rms_norm_backward_staged_blocks<float>(rows, n);
          case 8: return rms_norm_backward_staged_blocks<double>(rows, n);
          default: throw py::value_error("staged_backward_blocks: element_bytes must be 2, 4 or 8");
        }
      },
      "blocks (= rows of grad_weight partials) of the staged RMSNorm backward for rows x n, aligned, under path "
      "'auto' on the current GPU; 0 where rms_norm_backward runs another kernel",
      py::arg("element_bytes"), py::arg("rows"), py::arg("n"));
  m.def("grad_weight_chunks", &grad_weight_chunks,
        "rows of grad_weight partials (= blocks of the backward) for `rows` rows: a function of rows alone",
        py::arg("rows"));
}

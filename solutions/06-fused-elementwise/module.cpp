// Lab 06's Python module: wrapper.h's functions bound with pybind11, and the kernels' fixed
// numbers. Kept apart from wrapper.cpp so that lab 09 can compile the wrapper without Python.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "fused_elementwise.h"
#include "wrapper.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bias_gelu", &bias_gelu,
        "GELU(x + bias) for x (..., C) and bias (C,), one fused pass; approximate 'none' (erf) or 'tanh'; "
        "vectorized=False forces the scalar kernel",
        pybind11::arg("x"), pybind11::arg("bias"), pybind11::arg("approximate") = "none",
        pybind11::arg("vectorized") = true);
  m.def("bias_gelu_backward", &bias_gelu_backward,
        "(grad_x, grad_bias) of GELU(x + bias): grad_x = grad_y * GELU'(x + bias), grad_bias = grad_x summed over "
        "every leading dimension (bitwise reproducible)",
        pybind11::arg("grad_y"), pybind11::arg("x"), pybind11::arg("bias"), pybind11::arg("approximate") = "none",
        pybind11::arg("vectorized") = true);
  // The numbers the kernels are built with, so that the grader and the notebook read them
  // instead of restating them.
  m.def(
      "constants",
      [] {
        constexpr FusedConstants c = kFusedConstants;
        return pybind11::dict(pybind11::arg("warp_size") = c.warp_size,
                              pybind11::arg("threads_per_block") = c.threads_per_block,
                              pybind11::arg("vector_bytes") = c.vector_bytes,
                              pybind11::arg("backward_column_threads") = c.backward_column_threads,
                              pybind11::arg("backward_row_lanes") = c.backward_row_lanes,
                              pybind11::arg("backward_rows_per_chunk") = c.backward_rows_per_chunk);
      },
      "{warp_size, threads_per_block, vector_bytes, backward_column_threads, "
      "backward_row_lanes, backward_rows_per_chunk}: the kernels' fixed numbers");
}

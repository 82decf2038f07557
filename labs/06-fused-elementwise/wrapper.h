// Lab skeleton generated from solutions/06-fused-elementwise/wrapper.h by `./course labs` [lab-hash c88bd3573684].
// Students: fill in the TODO(lab06.k) blocks, then run `./course grade 06`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 06's ops as C++ functions on tensors (bias+GELU forward and backward): what wrapper.cpp defines
// (checks, device guard, current stream, launch) and what binds them to Python. module.cpp binds
// them with pybind11 for this lab; lab 09 registers the same functions with the dispatcher
// (TORCH_LIBRARY_IMPL), so the checks and launches are written once.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, const std::string& approximate, bool vectorized);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                      const at::Tensor& bias, const std::string& approximate,
                                                      bool vectorized);

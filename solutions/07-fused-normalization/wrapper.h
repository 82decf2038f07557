// Lab 07's ops as C++ functions on tensors (softmax and RMSNorm, forward and backward): what wrapper.cpp defines
// (checks, device guard, current stream, launch) and what binds them to Python. module.cpp binds
// them with pybind11 for this lab; lab 09 registers the same functions with the dispatcher
// (TORCH_LIBRARY_IMPL), so the checks and launches are written once.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>

at::Tensor softmax(const at::Tensor& x, const std::string& path);
at::Tensor softmax_backward(const at::Tensor& grad_y, const at::Tensor& y, const std::string& path);
void rms_norm_out(const at::Tensor& x, const at::Tensor& weight, double eps, const std::string& path,
                  const at::Tensor& y, const at::Tensor& rstd);
std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                            const std::string& path);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                     const at::Tensor& weight, const at::Tensor& rstd,
                                                     const std::string& path);

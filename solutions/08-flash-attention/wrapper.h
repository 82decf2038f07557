// Lab 08's ops as C++ functions on tensors (the attention rungs, forward and backward): what wrapper.cpp defines
// (checks, device guard, current stream, launch) and what binds them to Python. module.cpp binds
// them with pybind11 for this lab; lab 09 registers the same functions with the dispatcher
// (TORCH_LIBRARY_IMPL), so the checks and launches are written once.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

std::tuple<at::Tensor, at::Tensor> attention_naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   bool causal, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor> flash_forward_fp32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      bool causal, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor> flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 bool causal, std::optional<double> scale);
// The same op with its kernel chosen by `path`: "auto" (the Hopper kernel on a compute capability 9.0 GPU
// when the build has sm_90a and the views qualify for TMA, else rung 3), "portable" (rung 3, mma.sync),
// "hopper" (the Hopper kernel in its default pipeline, or an error saying why it cannot run),
// "hopper_simple" / "hopper_overlap" (the Hopper kernel with either pipeline: flash_forward_hopper.cu).
// flash_forward is path "auto".
std::tuple<at::Tensor, at::Tensor> flash_forward_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      bool causal, std::optional<double> scale,
                                                      const std::string& path);
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(const at::Tensor& grad_o, const at::Tensor& q,
                                                              const at::Tensor& k, const at::Tensor& v,
                                                              const at::Tensor& o, const at::Tensor& lse, bool causal,
                                                              std::optional<double> scale, bool deterministic);
// The same op with its kernel chosen by `path`, as flash_forward_path: "auto" (the Hopper kernel,
// flash_backward_hopper.cu, where flash_backward_hopper_refusal is empty: a compute capability 9.0 GPU, an
// sm_90a build, views TMA can describe, not deterministic; else rung 4), "portable" (rung 4), "hopper" (the
// Hopper kernel, or an error saying why it cannot run). flash_backward is path "auto".
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward_path(const at::Tensor& grad_o, const at::Tensor& q,
                                                                   const at::Tensor& k, const at::Tensor& v,
                                                                   const at::Tensor& o, const at::Tensor& lse,
                                                                   bool causal, std::optional<double> scale,
                                                                   bool deterministic, const std::string& path);

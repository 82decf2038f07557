// Lab 05's host wrapper: checks the shape contract, the dtypes and the GPU, then launches
// the fused GEMM + bias + activation on the current stream (the mma.sync kernel, or on Hopper
// the wgmma one). The only file with torch headers.
// Numbers go into error messages through std::to_string: streaming integers into TORCH_CHECK
// crashed (SIGSEGV in c10::str) on the GPU box's g++ 13 build, like IntArrayRef in torch_op.h.
#include <course/cuda.cuh>
#include <course/torch_op.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "tensor_cores.h"

namespace {

Activation parse_activation(const char* op, const std::string& name) {
  if (name == "gelu") return Activation::kGelu;
  if (name == "relu") return Activation::kRelu;
  if (name == "none") return Activation::kNone;
  TORCH_CHECK(false, op, ": activation must be 'gelu' (tanh approximation), 'relu' or 'none', got '", name, "'");
}

// cp.async and ldmatrix move 16-byte chunks: every row must start on a 16-byte boundary, which
// K % 8 == 0 gives for rows after the first, and the data pointer gives for the first.
void check_aligned(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name,
              " must start on a 16-byte boundary (tensor cores load 16-byte chunks), got ", course::describe(t),
              " with storage offset ", std::to_string(t.storage_offset()), "; pass ", name, ".clone()");
}

using Launcher = decltype(&launch_linear_act);  // launch_linear_act_wgmma has the same signature

// --8<-- [start:linear_act]
// out[..., N] = act(x[..., K] @ weight[N, K]^T + bias[N]): torch.nn.functional.linear followed by
// the activation, with weight laid out as nn.Linear stores it. `op` names the caller in errors.
at::Tensor checked_linear_act(const char* op, Launcher launch, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& bias, const std::string& activation,
                              const std::optional<at::Tensor>& out_arg) {
  const Activation act = parse_activation(op, activation);
  for (const auto& [t, name] : {std::pair{&x, "x"}, std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    course::check_cuda_tensor(*t, op, name);
  }
  course::check_same_device(x, weight, op, "x", "weight");
  course::check_same_device(x, bias, op, "x", "bias");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, op,
              ": x must have dtype float16 or bfloat16 (the tensor cores' input types), got ", course::describe(x),
              "; convert it with x.to(torch.bfloat16)");
  course::check_dtype(weight, op, "weight", dtype);
  course::check_dtype(bias, op, "bias", dtype);
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && bias.dim() == 1, op,
              ": expected x [..., K], weight [N, K] (nn.Linear's layout) and bias [N], got x ", course::describe(x),
              ", weight ", course::describe(weight), ", bias ", course::describe(bias));
  const int64_t K = x.size(-1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && bias.size(0) == N, op, ": shape mismatch: x ", course::describe(x), ", weight ",
              course::describe(weight), ", bias ", course::describe(bias),
              "; weight must be [N, K] with K = x.size(-1), bias [N]");
  TORCH_CHECK(K % kShapeMultiple == 0 && N % kShapeMultiple == 0, op, ": K and N must be multiples of ",
              std::to_string(kShapeMultiple),
              " (16-byte rows for the tensor cores' loads), got K = ", std::to_string(K), ", N = ", std::to_string(N),
              "; pad them with torch.nn.functional.pad");
  course::check_contiguous(x, op, "x");
  course::check_contiguous(weight, op, "weight");
  course::check_contiguous(bias, op, "bias");
  check_aligned(x, op, "x");
  check_aligned(weight, op, "weight");

  const c10::cuda::CUDAGuard device_guard(x.device());
  const int major = course::device_attribute(cudaDevAttrComputeCapabilityMajor);
  TORCH_CHECK(dtype != at::kBFloat16 || major >= 8, op,
              ": bfloat16 needs tensor cores of compute capability "
              "8.0 or newer (A100, H100, RTX 30xx+); this GPU is ",
              std::to_string(major), ".x: use float16 (x.half())");

  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;
  at::Tensor out;
  if (out_arg.has_value()) {
    out = *out_arg;
    course::check_cuda_tensor(out, op, "out");
    course::check_same_device(x, out, op, "x", "out");
    course::check_dtype(out, op, "out", dtype);
    TORCH_CHECK(out.sizes().vec() == out_shape, op, ": out must have shape ", course::format_dims(out_shape), ", got ",
                course::describe(out));
    course::check_contiguous(out, op, "out");
    check_aligned(out, op, "out");
  } else {
    out = at::empty(out_shape, x.options());
  }
  const int64_t M = N ? out.numel() / N : 0;
  launch(dtype == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16, x.const_data_ptr(),
         weight.const_data_ptr(), bias.const_data_ptr(), out.mutable_data_ptr(), M, N, K, act,
         course::current_stream());
  return out;
}
// --8<-- [end:linear_act]

pybind11::dict tile_dict(const TileConfig& c) {
  return pybind11::dict(pybind11::arg("block_m") = c.block_m, pybind11::arg("block_n") = c.block_n,
                        pybind11::arg("block_k") = c.block_k, pybind11::arg("stages") = c.stages,
                        pybind11::arg("threads") = c.threads, pybind11::arg("shared_bytes") = c.shared_bytes,
                        pybind11::arg("chunks_per_row") = c.chunks_per_row);
}

}  // namespace

at::Tensor linear_act(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const std::string& activation, const std::optional<at::Tensor>& out) {
  return checked_linear_act("linear_act", launch_linear_act, x, weight, bias, activation, out);
}

at::Tensor linear_act_wgmma(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const std::string& activation, const std::optional<at::Tensor>& out) {
  return checked_linear_act("linear_act_wgmma", launch_linear_act_wgmma, x, weight, bias, activation, out);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_act", &linear_act, "act(x @ weight^T + bias) on tensor cores", pybind11::arg("x"),
        pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("activation") = "gelu",
        pybind11::arg("out") = pybind11::none());
  m.def("linear_act_wgmma", &linear_act_wgmma,
        "linear_act on Hopper's TMA + wgmma path (reference only; needs wgmma_available())", pybind11::arg("x"),
        pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("activation") = "gelu",
        pybind11::arg("out") = pybind11::none());
  m.def(
      "wgmma_available", [] { return wgmma_available(); },
      "True on a compute capability 9.0 GPU when this build includes sm_90a (TORCH_CUDA_ARCH_LIST=9.0a)");
  m.def(
      "tile_config", [](int capability_major) { return tile_dict(tile_config(capability_major)); },
      "the block tile and shared memory per block on a GPU of this compute capability", pybind11::arg("major"));
  m.def(
      "wgmma_tile_config", [] { return tile_dict(wgmma_tile_config()); },
      "tile_config of the Hopper path (linear_act_wgmma), whatever GPU this is");
  m.def(
      "residency",
      [](int stages) {
        const KernelResidency r = linear_act_residency(stages);
        return pybind11::dict(
            pybind11::arg("stages") = r.stages, pybind11::arg("threads") = r.threads,
            pybind11::arg("registers") = r.registers, pybind11::arg("static_shared_bytes") = r.static_shared_bytes,
            pybind11::arg("dynamic_shared_bytes") = r.dynamic_shared_bytes,
            pybind11::arg("local_bytes") = r.local_bytes, pybind11::arg("blocks_per_sm") = r.blocks_per_sm,
            pybind11::arg("registers_only_blocks_per_sm") = r.registers_only_blocks_per_sm);
      },
      "the bf16 mma.sync kernel at `stages` (4, 6 or 8) on this GPU, from the CUDA runtime: registers, shared "
      "memory, and blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor), with and without its shared memory",
      pybind11::arg("stages") = 4);
  m.def(
      "constants",
      [] {
        return pybind11::dict(pybind11::arg("warp_size") = course::kWarpSize,
                              pybind11::arg("shape_multiple") = kShapeMultiple);
      },
      "{warp_size, shape_multiple}: the lanes of a warp, and what K and N must be multiples of");
  m.def(
      "accumulator_position",
      [](int lane, int index) {
        const Position p = accumulator_position_host(lane, index);
        return std::make_pair(p.row, p.col);
      },
      "(row, col) in the 16x8 tile of accumulator register index of lane", pybind11::arg("lane"),
      pybind11::arg("index"));
  m.def(
      "ldmatrix_a_source",
      [](int lane) {
        const Position p = ldmatrix_a_source_host(lane);
        return std::make_pair(p.row, p.col);
      },
      "(row, first k) of the 16x16 x tile whose address lane gives ldmatrix.x4", pybind11::arg("lane"));
  m.def(
      "ldmatrix_b_source",
      [](int lane) {
        const Position p = ldmatrix_b_source_host(lane);
        return std::make_pair(p.row, p.col);
      },
      "(n row, first k) of the 16x16 weight tile whose address lane gives ldmatrix.x4", pybind11::arg("lane"));
  m.def("swizzled_chunk", &swizzled_chunk_host, "16-byte chunk offset of (row, chunk) in a swizzled tile",
        pybind11::arg("row"), pybind11::arg("chunk"));
}

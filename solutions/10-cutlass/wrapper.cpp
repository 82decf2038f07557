// Lab 10's host wrapper: lesson 05's checks and conventions (the current stream, errors that say what to do),
// around the CUTLASS launcher; the tile scheduler's workspace comes from PyTorch's caching allocator, so no
// cudaMalloc runs per call. The only file with torch headers: the CUTLASS file compiles without them.
// Numbers go into error messages through std::to_string: streaming integers into TORCH_CHECK crashed
// (SIGSEGV in c10::str) on the GPU box's g++ 13 build.
#include <course/cuda.cuh>
#include <course/torch_op.h>
#include <ATen/ops/gelu.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "gemm_bias_gelu.h"

namespace {

constexpr const char* kOp = "gemm_bias_gelu";
// TMA moves 16-byte-aligned boxes: each row of x, weight and out must start on a 16-byte boundary, which
// K % 8 == 0 (x, weight) and N % 8 == 0 (out) give for every row after the first, and the data pointer for
// the first. CUTLASS's can_implement would refuse the same problems, with "Misaligned Operand" and no names.
constexpr int64_t kShapeMultiple = 8;

void check_aligned(const at::Tensor& t, const char* name, const char* why) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, kOp, ": ", name,
              " must start on a 16-byte boundary (", why, "), got ", course::describe(t), " with storage offset ",
              std::to_string(t.storage_offset()), "; pass ", name, ".clone()");
}
constexpr const char* kTmaReason = "TMA loads and stores 16-byte-aligned boxes";
// CUTLASS 4.2's Sm90RowBroadcast copies the bias element by element (its Alignment parameter is unused), so this
// is the op's contract rather than the library's: one rule for every pointer, and room for a vectorized bias load.
constexpr const char* kBiasReason = "this op's contract: every pointer 16-byte aligned";

// --8<-- [start:wrapper]
// out[..., N] = gelu_tanh(x[..., K] @ weight[N, K]^T + bias[N]), bfloat16: lesson 05's linear_act(..., "gelu").
at::Tensor gemm_bias_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const std::optional<at::Tensor>& out_arg) {
  for (const auto& [t, name] : {std::pair{&x, "x"}, std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    course::check_cuda_tensor(*t, kOp, name);
  }
  course::check_same_device(x, weight, kOp, "x", "weight");
  course::check_same_device(x, bias, kOp, "x", "bias");
  // One instantiation, bf16 (each more is another ~100 s of compile): lesson 05's kernels take float16 too.
  course::check_dtype(x, kOp, "x", at::kBFloat16);
  course::check_dtype(weight, kOp, "weight", at::kBFloat16);
  course::check_dtype(bias, kOp, "bias", at::kBFloat16);
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && bias.dim() == 1, kOp,
              ": expected x [..., K], weight [N, K] (nn.Linear's layout) and bias [N], got x ", course::describe(x),
              ", weight ", course::describe(weight), ", bias ", course::describe(bias));
  const int64_t K = x.size(-1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && bias.size(0) == N, kOp, ": shape mismatch: x ", course::describe(x), ", weight ",
              course::describe(weight), ", bias ", course::describe(bias),
              "; weight must be [N, K] with K = x.size(-1), bias [N]");
  TORCH_CHECK(K % kShapeMultiple == 0 && N % kShapeMultiple == 0, kOp, ": K and N must be multiples of ",
              std::to_string(kShapeMultiple), " (TMA needs 16-byte rows), got K = ", std::to_string(K),
              ", N = ", std::to_string(N), "; pad them with torch.nn.functional.pad");
  course::check_contiguous(x, kOp, "x");
  course::check_contiguous(weight, kOp, "weight");
  course::check_contiguous(bias, kOp, "bias");
  check_aligned(x, "x", kTmaReason);
  check_aligned(weight, "weight", kTmaReason);
  check_aligned(bias, "bias", kBiasReason);

  const c10::cuda::CUDAGuard device_guard(x.device());
  TORCH_CHECK(gemm_bias_gelu_sm90_available(), kOp,
              ": this CUTLASS kernel needs a Hopper GPU (compute capability 9.0) and a build for sm_90a "
              "(TORCH_CUDA_ARCH_LIST=9.0a); this GPU is ",
              std::to_string(course::device_attribute(cudaDevAttrComputeCapabilityMajor)), ".",
              std::to_string(course::device_attribute(cudaDevAttrComputeCapabilityMinor)),
              ": use lesson 05's linear_act(x, weight, bias, 'gelu') here");

  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;
  at::Tensor out;
  if (out_arg.has_value()) {
    out = *out_arg;
    course::check_cuda_tensor(out, kOp, "out");
    course::check_same_device(x, out, kOp, "x", "out");
    course::check_dtype(out, kOp, "out", at::kBFloat16);
    TORCH_CHECK(out.sizes().vec() == out_shape, kOp, ": out must have shape ", course::format_dims(out_shape), ", got ",
                course::describe(out));
    course::check_contiguous(out, kOp, "out");
    check_aligned(out, "out", kTmaReason);
  } else {
    out = at::empty(out_shape, x.options());
  }
  const int64_t M = N ? out.numel() / N : 0;
  if (M == 0 || N == 0) return out;
  if (K == 0) {  // no k-tiles for CUTLASS's mainloop: the product is zero, out = gelu(bias) on every row
    out.copy_(at::gelu(bias.to(at::kFloat), "tanh").to(at::kBFloat16).expand_as(out));
    return out;
  }
  const size_t workspace_bytes = gemm_bias_gelu_sm90_workspace_bytes(M, N, K);
  const at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, x.options().dtype(at::kByte));
  launch_gemm_bias_gelu_sm90(x.const_data_ptr(), weight.const_data_ptr(), bias.const_data_ptr(), out.mutable_data_ptr(),
                             M, N, K, workspace_bytes ? workspace.mutable_data_ptr() : nullptr, workspace_bytes,
                             course::current_stream());
  return out;
}
// --8<-- [end:wrapper]

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm_bias_gelu", &gemm_bias_gelu,
        "gelu_tanh(x @ weight^T + bias) in bfloat16 through CUTLASS 3.x (Hopper, sm_90a): lesson 05's "
        "linear_act(..., 'gelu')",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("out") = pybind11::none());
  m.def(
      "available", [] { return gemm_bias_gelu_sm90_available(); },
      "True on a compute capability 9.0 GPU when this build includes sm_90a (TORCH_CUDA_ARCH_LIST=9.0a)");
  m.def(
      "config",
      [] {
        const CutlassConfig c = gemm_bias_gelu_sm90_config();
        return pybind11::dict(pybind11::arg("tile_m") = c.tile_m, pybind11::arg("tile_n") = c.tile_n,
                              pybind11::arg("tile_k") = c.tile_k, pybind11::arg("cluster_m") = c.cluster_m,
                              pybind11::arg("cluster_n") = c.cluster_n, pybind11::arg("stages") = c.stages,
                              pybind11::arg("shared_bytes") = c.shared_bytes);
      },
      "the tile and cluster shapes compiled in, the pipeline stages CUTLASS chose for them and the kernel's shared "
      "memory in bytes");
  m.def(
      "epilogue_tree", [] { return gemm_bias_gelu_sm90_epilogue(); },
      "the C++ type of the epilogue visitor tree, demangled: its nodes, nested");
  m.def("workspace_bytes", &gemm_bias_gelu_sm90_workspace_bytes,
        "the bytes of workspace CUTLASS's tile scheduler asks for at this problem size", pybind11::arg("M"),
        pybind11::arg("N"), pybind11::arg("K"));
  m.def(
      "constants", [] { return pybind11::dict(pybind11::arg("shape_multiple") = kShapeMultiple); },
      "{shape_multiple}: what K and N must be multiples of");
}

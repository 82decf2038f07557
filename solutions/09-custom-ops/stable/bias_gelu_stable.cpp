// Lesson 06's fused bias + GELU forward as a PyTorch operator built against LibTorch's stable ABI:
// only torch/csrc/stable and torch/headeronly headers, whose calls into libtorch go through the
// versioned C shim (aoti_torch_*, torch_*), never through at::Tensor or c10 classes, whose layout
// changes between releases. setup.py defines TORCH_TARGET_VERSION (2.10): the headers then hide
// every API newer than 2.10, and including an ATen or c10 header is a compile error, so the one
// binary built against 2.11's headers also loads in 2.10.
//
// The kernel is lesson 06's, untouched: setup.py compiles solutions/06-fused-elementwise/forward.cu
// into this library, and this file calls its launcher with plain pointers and a cudaStream_t.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fused_elementwise.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "course_stable::bias_gelu";

// The checks. The stable headers' STD_TORCH_CHECK builds its message in an std::ostringstream and
// always writes __LINE__, an int, into it (torch/headeronly/util/Exception.h); on the GPU box an
// integer written to a stream from extension code crashes with SIGSEGV (include/course/torch_op.h),
// so the first check that failed there killed the process instead of raising (an H100, torch 2.11). This
// one concatenates strings only and throws what STD_TORCH_CHECK throws, std::runtime_error, which
// the dispatcher hands to Python as a RuntimeError. Every part is a string: numbers go through
// std::to_string.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::string message;
  (message.append(std::string_view(parts)), ...);
  throw std::runtime_error(message);
}
#define COURSE_STABLE_CHECK(cond, ...) \
  do {                                 \
    if (!(cond)) fail(__VA_ARGS__);    \
  } while (false)

// The stable headers have no dtype name in torch's spelling (c10's toString is not header-only,
// headeronly's says "Float"): the error messages name dtypes as the user writes them.
std::string dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Bool: return "torch.bool";
    default: return std::string("torch dtype ") + torch::headeronly::toString(dtype);
  }
}

// "torch.float32 tensor of shape [2, 3] on cuda:0": c10's DeviceTypeName is not header-only either.
// Numbers go through std::to_string, never an ostringstream: include/course/torch_op.h says why (an
// integer written to a stream from an extension crashed the GPU box; this op's checks did).
std::string describe(const Tensor& t) {
  std::string text = dtype_name(t.scalar_type()) + " tensor of shape [";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  text += "] on ";
  if (t.is_cuda()) return text + "cuda:" + std::to_string(t.get_device_index());
  if (t.is_cpu()) return text + "cpu";
  return text + "device type " + std::to_string(static_cast<int>(t.device().type()));
}

GeluForm parse_approximate(std::string_view approximate) {
  if (approximate == "none") return GeluForm::kErf;
  COURSE_STABLE_CHECK(approximate == "tanh", kOp,
                      ": approximate must be 'none' (the exact erf form) or 'tanh' (the tanh approximation), as in "
                      "torch.nn.functional.gelu; got '",
                      std::string(approximate), "'");
  return GeluForm::kTanh;
}

// The dispatcher sends only CUDA tensors here (the op has a CUDA kernel and nothing else), but a
// CUDA x with a CPU bias still arrives: the dispatch key comes from all the tensor arguments.
void check_inputs(const Tensor& x, const Tensor& bias) {
  COURSE_STABLE_CHECK(x.is_cuda(), kOp, ": x must be a CUDA tensor, got ", describe(x));
  COURSE_STABLE_CHECK(bias.is_cuda(), kOp, ": bias must be a CUDA tensor, got ", describe(bias));
  COURSE_STABLE_CHECK(x.get_device_index() == bias.get_device_index(), kOp,
                      ": x and bias must be on the same GPU, got x ", describe(x), " and bias ", describe(bias));
  const ScalarType dtype = x.scalar_type();
  COURSE_STABLE_CHECK(dtype == ScalarType::Float || dtype == ScalarType::Half || dtype == ScalarType::BFloat16 ||
                          dtype == ScalarType::Double,
                      kOp, ": x must have dtype torch.float32, torch.float16, torch.bfloat16 or torch.float64, got ",
                      describe(x));
  COURSE_STABLE_CHECK(bias.scalar_type() == dtype, kOp, ": bias must have x's dtype ", dtype_name(dtype), ", got ",
                      describe(bias), " (the kernel reads both as one element type: no silent promotion)");
  COURSE_STABLE_CHECK(x.dim() >= 1, kOp, ": x must have at least one dimension (the last one is the channels), got ",
                      describe(x));
  const int64_t channels = x.size(x.dim() - 1);
  COURSE_STABLE_CHECK(bias.dim() == 1 && bias.size(0) == channels, kOp,
                      ": bias must have shape [C] with C = x.size(-1) = ", std::to_string(channels), ", got bias ",
                      describe(bias), " for x ", describe(x));
  // Refused, not copied, for lesson 06's reason: a hidden x.contiguous() doubles the bytes moved.
  COURSE_STABLE_CHECK(x.is_contiguous(), kOp, ": x must be contiguous, got ", describe(x),
                      "; call x.contiguous() first (this op does not copy it for you: a hidden copy would double the "
                      "bytes the fused kernel moves)");
}

// The current CUDA stream. The stable C shim's getter, aoti_torch_get_current_cuda_stream, is
// defined in libtorch_cuda.so, not libtorch_cpu.so; the device-generic
// torch::stable::accelerator::getCurrentStream() gives only a stream id, from which no public API
// recovers the cudaStream_t. Linking libtorch_cuda would make this library fail to load in a
// CPU-only torch (no libtorch_cuda.so there), so the getter is looked up when the op first runs,
// in the libtorch_cuda.so that a CUDA torch has already loaded (RTLD_NOLOAD: never load a second).
// Its signature is the shim's (torch/csrc/inductor/aoti_torch/c/shim.h), which is versioned and
// kept stable like the rest of the C shim.
using GetCurrentCudaStream = AOTITorchError (*)(int32_t device_index, void** ret_stream);

GetCurrentCudaStream find_stream_getter() {
  void* library = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  return reinterpret_cast<GetCurrentCudaStream>(dlsym(library, "aoti_torch_get_current_cuda_stream"));
}

cudaStream_t current_stream(int32_t device_index) {
  static const GetCurrentCudaStream getter = find_stream_getter();
  COURSE_STABLE_CHECK(getter != nullptr, kOp,
                      ": this torch has no aoti_torch_get_current_cuda_stream in a loaded libtorch_cuda.so (a CPU-only "
                      "torch cannot run the CUDA kernel)");
  void* stream = nullptr;
  COURSE_STABLE_CHECK(getter(device_index, &stream) == AOTI_TORCH_SUCCESS, kOp,
                      ": aoti_torch_get_current_cuda_stream failed for cuda:", std::to_string(device_index));
  return static_cast<cudaStream_t>(stream);
}

// AT_DISPATCH_* is ATen's: the stable build writes the dtype switch out, from torch's element type
// to CUDA's, whose pointers the launcher takes.
template <typename T>
void launch(const Tensor& x, const Tensor& bias, Tensor& y, int64_t rows, int64_t cols, GeluForm form,
            cudaStream_t stream) {
  launch_bias_gelu_forward<T>(static_cast<const T*>(x.const_data_ptr()), static_cast<const T*>(bias.const_data_ptr()),
                              static_cast<T*>(y.mutable_data_ptr()), rows, cols, form, /*vectorized=*/true, stream);
}

Tensor bias_gelu(Tensor x, Tensor bias, std::string approximate) {
  const GeluForm form = parse_approximate(approximate);
  check_inputs(x, bias);
  const torch::stable::accelerator::DeviceGuard device_guard(x.get_device_index());  // launch on x's GPU
  // A strided bias (bias[::2]) is copied: C elements, nothing beside x's rows x C.
  const Tensor b = torch::stable::contiguous(bias);
  // (..., C) row-major. Not empty_like(x): it keeps x's strides, which is_contiguous() lets differ at
  // dimensions of size 1, and the fake kernel promises contiguous strides.
  Tensor y = torch::stable::empty(x.sizes(), x.scalar_type(), std::nullopt, x.device());
  const int64_t cols = x.size(x.dim() - 1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const cudaStream_t stream = current_stream(x.get_device_index());
  switch (x.scalar_type()) {
    case ScalarType::Float: launch<float>(x, b, y, rows, cols, form, stream); break;
    case ScalarType::Double: launch<double>(x, b, y, rows, cols, form, stream); break;
    case ScalarType::Half: launch<__half>(x, b, y, rows, cols, form, stream); break;
    case ScalarType::BFloat16: launch<__nv_bfloat16>(x, b, y, rows, cols, form, stream); break;
    default: COURSE_STABLE_CHECK(false, kOp, ": unreachable dtype ", dtype_name(x.scalar_type()));
  }
  return y;
}

}  // namespace

STABLE_TORCH_LIBRARY(course_stable, m) {
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(course_stable, CUDA, m) { m.impl("bias_gelu", TORCH_BOX(&bias_gelu)); }

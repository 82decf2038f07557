// The course's one shared header for host wrappers: the layer between a torch
// Tensor and a kernel launcher. Only wrapper .cpp files include it.
//
// No Python here: a lab's PYBIND11_MODULE includes <torch/csrc/utils/pybind.h> itself, and lab 09
// compiles lessons 06-08's wrappers into an op library that links no Python at all.
//
// It includes the few torch headers a wrapper needs instead of <torch/extension.h>:
// that umbrella pulls in autograd, nn and optim and costs ~3x the compile time
// (21 s against 7 s on a 2-core machine), paid on every cold build of every lab.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cctype>
#include <string>

namespace course {

// Build error messages from strings: format numbers with std::to_string, shapes with
// format_dims. TORCH_CHECK formats its arguments through std::ostringstream, and on the GPU box
// (torch 2.11 wheel, extensions built by g++ 13.3) writing any integer to an ostringstream from
// extension code crashes with SIGSEGV, while strings are fine: tools/gpu/probe/checkfmt.py
// shows it. The message of an error that is never raised in testing would crash a student's run.
//
// "[33, 17]"
inline std::string format_dims(c10::IntArrayRef dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// "Float[33, 17] on cuda:0": what an error message says about a tensor.
inline std::string describe(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + format_dims(t.sizes()) + " on " + t.device().str();
}

// --8<-- [start:check_cuda_tensor]
// A kernel can only dereference device memory: refuse CPU tensors before launch,
// where the error can still say what to do, instead of an illegal address later.
inline void check_cuda_tensor(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", describe(t), "; move it with ", name,
              ".cuda() or create it with device='cuda'");
}
// --8<-- [end:check_cuda_tensor]

// "torch.float32": the name Python code writes for a dtype, which an error message must use when it
// tells the user what to call. c10::toString gives the C++ enum's names ("Float", "Half"), which
// torch does not have; lowercased they are right for every type but these.
inline std::string python_dtype(at::ScalarType type) {
  switch (type) {
    case at::ScalarType::Byte: return "torch.uint8";
    case at::ScalarType::Char: return "torch.int8";
    case at::ScalarType::Short: return "torch.int16";
    case at::ScalarType::Int: return "torch.int32";
    case at::ScalarType::Long: return "torch.int64";
    case at::ScalarType::Half: return "torch.float16";
    case at::ScalarType::Float: return "torch.float32";
    case at::ScalarType::Double: return "torch.float64";
    case at::ScalarType::ComplexHalf: return "torch.complex32";
    case at::ScalarType::ComplexFloat: return "torch.complex64";
    case at::ScalarType::ComplexDouble: return "torch.complex128";
    default: {  // BFloat16, Bool, Float8_e4m3fn, UInt16, QInt8, ...
      std::string name = c10::toString(type);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return "torch." + name;
    }
  }
}

inline void check_dtype(const at::Tensor& t, const char* op, const char* name, at::ScalarType want) {
  const std::string wanted = python_dtype(want);
  TORCH_CHECK(t.scalar_type() == want, op, ": ", name, " must have dtype ", wanted, ", got ", describe(t),
              "; convert it with ", name, ".to(", wanted, ")");
}

// Kernels index with a flat offset, which is only right for row-major, gap-free storage.
inline void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", describe(t), " with strides ",
              format_dims(t.strides()), "; pass ", name, ".contiguous()");
}

inline void check_same_shape(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name_a,
                             const char* name_b) {
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": ", name_a, " and ", name_b, " must have the same shape, got ", describe(a),
              " and ", describe(b));
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name_a,
                              const char* name_b) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", name_a, " and ", name_b, " must be on the same device, got ",
              describe(a), " and ", describe(b));
}

// --8<-- [start:dispatch]
// The kernels are templates over CUDA's element types; the dtype is known only at run time.
// AT_DISPATCH_FLOATING_TYPES_AND2 is a switch over the dtype that runs its lambda once per
// case with scalar_t set to torch's C++ type: float, double, at::Half, at::BFloat16. The last
// two are the same 16 bits as CUDA's __half and __nv_bfloat16 under other names, so CudaType
// maps them and the pointer is reinterpreted, not converted. A wrapper checks the dtype before
// the dispatch, so the macro's own error ("not implemented for 'Int'") is never the one a user sees.
template <typename T>
struct CudaTypeOf {
  using type = T;
};
template <>
struct CudaTypeOf<at::Half> {
  using type = __half;
};
template <>
struct CudaTypeOf<at::BFloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using CudaType = typename CudaTypeOf<T>::type;
static_assert(sizeof(at::Half) == sizeof(__half) && sizeof(at::BFloat16) == sizeof(__nv_bfloat16),
              "the same 16-bit formats");

template <typename T>
const CudaType<T>* cuda_data(const at::Tensor& t) {
  return reinterpret_cast<const CudaType<T>*>(t.const_data_ptr<T>());
}
template <typename T>
CudaType<T>* cuda_mutable_data(at::Tensor& t) {
  return reinterpret_cast<CudaType<T>*>(t.mutable_data_ptr<T>());
}
// --8<-- [end:dispatch]

// The stream PyTorch is using on the tensor's device. Launching on it (never on
// the legacy default stream 0) keeps our kernel ordered with the surrounding
// PyTorch ops and lets users run it under torch.cuda.stream(...) and CUDA graphs.
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace course

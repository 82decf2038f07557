// Lab skeleton generated from solutions/06-fused-elementwise/wrapper.cpp by `./course labs` [lab-hash ce233a4cb9d8].
// Students: fill in the TODO(lab06.k) blocks, then run `./course grade 06`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 06's host wrapper: checks, the dtype dispatch, the current stream, launches. This is the
// only file of the lab that includes torch headers.
#include <ATen/Dispatch.h>
#include <course/torch_op.h>

#include <string>
#include <tuple>

#include "fused_elementwise.h"
#include "wrapper.h"

namespace {

// The dtype dispatch's helpers (course/torch_op.h): torch's element type -> CUDA's, and a
// tensor's data as a pointer to it.
using course::cuda_data;
using course::cuda_mutable_data;
using course::CudaType;

GeluForm parse_approximate(const std::string& approximate, const char* op) {
  if (approximate == "none") return GeluForm::kErf;
  TORCH_CHECK(approximate == "tanh", op,
              ": approximate must be 'none' (the exact erf form) or 'tanh' (the tanh approximation), as in "
              "torch.nn.functional.gelu; got '",
              approximate, "'");
  return GeluForm::kTanh;
}

// --8<-- [start:checks]
void check_inputs(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  course::check_cuda_tensor(x, op, "x");
  course::check_cuda_tensor(bias, op, "bias");
  course::check_same_device(x, bias, op, "x", "bias");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble, op,
              ": x must have dtype torch.float32, torch.float16, torch.bfloat16 or torch.float64, got ",
              course::describe(x), "; convert it with x.float()");
  course::check_dtype(bias, op, "bias", dtype);  // one dtype for both: no silent promotion in the kernel
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension (the last one is the channels), got ",
              course::describe(x));
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), op,
              ": bias must have shape [C] with C = x.size(-1) = ", std::to_string(x.size(-1)), ", got bias ",
              course::describe(bias), " for x ", course::describe(x));
  // Refused, not copied: x.contiguous() here would read and write all of x once more, doubling
  // the bytes of a kernel whose whole point is moving fewer of them. The caller decides.
  TORCH_CHECK(x.is_contiguous(), op, ": x must be contiguous, got ", course::describe(x), " with strides ",
              course::format_dims(x.strides()),
              "; call x.contiguous() first (this op does not copy it for you: a hidden copy would double the bytes "
              "the fused kernel moves)");
}
// --8<-- [end:checks]

// Leading dimensions flatten into rows: x (..., C) is rows x C, row-major.
int64_t rows_of(const at::Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

}  // namespace

// --8<-- [start:bias_gelu]
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, const std::string& approximate, bool vectorized) {
  constexpr const char* op = "bias_gelu";
  const GeluForm form = parse_approximate(approximate, op);
  check_inputs(x, bias, op);
  const c10::cuda::CUDAGuard device_guard(x.device());  // launch on x's GPU, whichever is current
  // A strided bias (bias[::2]) is copied: C elements, nothing beside x's rows x C.
  const at::Tensor b = bias.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());  // (..., C), contiguous
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu", [&] {
    launch_bias_gelu_forward<CudaType<scalar_t>>(cuda_data<scalar_t>(x), cuda_data<scalar_t>(b),
                                                 cuda_mutable_data<scalar_t>(y), rows_of(x), x.size(-1), form,
                                                 vectorized, course::current_stream());
  });
  return y;
}
// --8<-- [end:bias_gelu]

// --8<-- [start:bias_gelu_backward]
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                      const at::Tensor& bias, const std::string& approximate,
                                                      bool vectorized) {
  constexpr const char* op = "bias_gelu_backward";
  const GeluForm form = parse_approximate(approximate, op);
  check_inputs(x, bias, op);
  course::check_cuda_tensor(grad_y, op, "grad_y");
  course::check_same_device(x, grad_y, op, "x", "grad_y");
  course::check_dtype(grad_y, op, "grad_y", x.scalar_type());
  course::check_same_shape(grad_y, x, op, "grad_y", "x");
  TORCH_CHECK(grad_y.is_contiguous(), op, ": grad_y must be contiguous, got ", course::describe(grad_y),
              " with strides ", course::format_dims(grad_y.strides()), "; call grad_y.contiguous() first");
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor b = bias.contiguous();
  const int64_t rows = rows_of(x), cols = x.size(-1);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());  // (..., C)
  at::Tensor grad_bias = at::empty({cols}, x.options());  // (C,)
  // One row of column sums per chunk of rows, in the compute type: float, or double for double.
  const auto partial_dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor partials = at::empty({backward_row_chunks(rows), cols}, x.options().dtype(partial_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_backward", [&] {
    using T = CudaType<scalar_t>;
    launch_bias_gelu_backward<T>(cuda_data<scalar_t>(grad_y), cuda_data<scalar_t>(x), cuda_data<scalar_t>(b),
                                 cuda_mutable_data<scalar_t>(grad_x), cuda_mutable_data<scalar_t>(grad_bias),
                                 partials.mutable_data_ptr<Compute<T>>(), rows, cols, form, vectorized,
                                 course::current_stream());
  });
  return {grad_x, grad_bias};
}
// --8<-- [end:bias_gelu_backward]

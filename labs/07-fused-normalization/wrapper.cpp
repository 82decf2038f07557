// Lab skeleton generated from solutions/07-fused-normalization/wrapper.cpp by `./course labs` [lab-hash 8d87b59be530].
// Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 07's host wrapper: checks, the dtype dispatch, the current stream, launches. This is the
// only file of the lab that includes torch headers.
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/accumulate.h>
#include <course/torch_op.h>

#include <cmath>
#include <string>
#include <tuple>

#include "normalization.h"
#include "wrapper.h"

namespace {

using course::cuda_data;
using course::cuda_mutable_data;
using course::CudaType;

// `on_chip`: whether the op has the on-chip path (softmax's forward and backward; RMSNorm has none).
RowPath parse_path(const std::string& path, const char* op, bool on_chip) {
  if (path == "auto") return RowPath::kAuto;
  if (path == "registers") return RowPath::kRegisters;
  if (path == "on_chip") {
    TORCH_CHECK(on_chip, op,
                ": path='on_chip' is softmax's (a long row kept on chip); this op takes 'auto', 'registers' or "
                "'streaming'");
    return RowPath::kOnChip;
  }
  TORCH_CHECK(path == "streaming", op, ": path must be 'auto' (registers when the row fits, else ",
              on_chip ? "on chip where this GPU takes the row, else " : "",
              "streaming), 'registers' (the row read once, kept in registers), ",
              on_chip ? "'on_chip' (a longer row read once, kept in a block's registers and shared memory, or a "
                        "cluster's registers) "
                      : "",
              "or 'streaming' (any row length, two passes); got '", path, "'");
  return RowPath::kStreaming;
}

// The longest row the register path takes for x's dtype.
int64_t max_register_row_for(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return max_register_row<double>();
    case at::kFloat: return max_register_row<float>();
    default: return max_register_row<__half>();  // bfloat16 and float16 compute in float too
  }
}

// --8<-- [start:checks]
// A tensor that an op reads row by row with a flat index: refused, not copied, when strided. A
// hidden x.contiguous() would read and write the whole tensor once more, in an op whose point is
// to move each byte as few times as possible; the caller decides.
void check_rows_tensor(const at::Tensor& t, const char* op, const char* name) {
  course::check_cuda_tensor(t, op, name);
  TORCH_CHECK(t.dim() >= 1, op, ": ", name, " must have at least one dimension (the last one is normalized), got ",
              course::describe(t));
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", course::describe(t), " with strides ",
              course::format_dims(t.strides()), "; call ", name,
              ".contiguous() first (this op does not copy it for you: a hidden copy would add a read and a write of "
              "the whole tensor to an op that is all about bytes)");
}

void check_x(const at::Tensor& x, const char* op, const char* name) {
  check_rows_tensor(x, op, name);
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble, op, ": ",
              name, " must have dtype torch.float32, torch.float16, torch.bfloat16 or torch.float64, got ",
              course::describe(x), "; convert it with ", name, ".float()");
}

// A second tensor of the same shape and dtype as the first one (grad_y beside y or x).
void check_like(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name, const char* ref_name) {
  check_rows_tensor(t, op, name);
  course::check_same_device(ref, t, op, ref_name, name);
  course::check_dtype(t, op, name, ref.scalar_type());
  course::check_same_shape(t, ref, op, name, ref_name);
}

void check_weight(const at::Tensor& weight, const at::Tensor& x, const char* op) {
  course::check_cuda_tensor(weight, op, "weight");
  course::check_same_device(x, weight, op, "x", "weight");
  course::check_dtype(weight, op, "weight", x.scalar_type());  // one dtype: no silent promotion in the kernel
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op,
              ": weight must have shape [N] with N = x.size(-1) = ", std::to_string(x.size(-1)), ", got weight ",
              course::describe(weight), " for x ", course::describe(x));
}

void check_registers_fit(RowPath path, const at::Tensor& x, const char* op) {
  const int64_t longest = max_register_row_for(x.scalar_type());
  TORCH_CHECK(path != RowPath::kRegisters || x.size(-1) <= longest, op,
              ": path='registers' keeps a row in registers only up to ", std::to_string(longest), " elements of ",
              course::python_dtype(x.scalar_type()), ", and x has rows of ", std::to_string(x.size(-1)),
              "; use path='streaming' (or 'auto', which picks it)");
}

// path='on_chip' on a row this GPU's on-chip path takes (softmax_on_chip_row: the dtype, the row
// length, and what the GPU offers). Call with x's device current: the answer is per GPU.
void check_on_chip_fits(RowPath path, const at::Tensor& x, bool backward, const char* op) {
  if (path != RowPath::kOnChip) return;
  int64_t longest = 0;
  switch (x.scalar_type()) {
    case at::kDouble: longest = softmax_on_chip_row<double>(backward); break;
    case at::kFloat: longest = softmax_on_chip_row<float>(backward); break;
    case at::kBFloat16: longest = softmax_on_chip_row<__nv_bfloat16>(backward); break;
    default: longest = softmax_on_chip_row<__half>(backward);  // check_x has left float16 alone
  }
  const std::string dtype = course::python_dtype(x.scalar_type());
  TORCH_CHECK(longest > 0, op, ": path='on_chip' does not run here for ", dtype, ": ",
              backward ? "the backward needs thread-block clusters (compute capability 9.0, and a build for it: "
                         "TORCH_CUDA_ARCH_LIST with 9.0a)"
                       : "the forward keeps rows on chip for torch.float32 and torch.float64 only, and needs cp.async "
                         "(compute capability 8.0 or newer)",
              "; use path='streaming' (or 'auto', which picks it)");
  TORCH_CHECK(x.size(-1) <= longest, op, ": path='on_chip' keeps a row on chip only up to ", std::to_string(longest),
              " elements of ", dtype, " on this GPU, and x has rows of ", std::to_string(x.size(-1)),
              "; use path='streaming' (or 'auto', which picks it)");
}
// --8<-- [end:checks]

// Leading dimensions flatten into rows: x (..., N) is rows x N, row-major (rows > 0 even when N = 0).
int64_t rows_of(const at::Tensor& x) { return c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)); }

// rstd's dtype: the compute type, float32 for the 16-bit types and float32, float64 for float64.
at::ScalarType compute_dtype(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

}  // namespace

// --8<-- [start:softmax]
at::Tensor softmax(const at::Tensor& x, const std::string& path) {
  constexpr const char* op = "softmax";
  const RowPath row_path = parse_path(path, op, true);
  check_x(x, op, "x");
  check_registers_fit(row_path, x, op);
  const c10::cuda::CUDAGuard device_guard(x.device());  // launch on x's GPU, whichever is current
  check_on_chip_fits(row_path, x, false, op);
  at::Tensor y = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    launch_softmax_forward<CudaType<scalar_t>>(cuda_data<scalar_t>(x), cuda_mutable_data<scalar_t>(y), rows_of(x),
                                               x.size(-1), row_path, course::current_stream());
  });
  return y;
}
// --8<-- [end:softmax]

at::Tensor softmax_backward(const at::Tensor& grad_y, const at::Tensor& y, const std::string& path) {
  constexpr const char* op = "softmax_backward";
  const RowPath row_path = parse_path(path, op, true);
  check_x(y, op, "y");
  check_like(grad_y, y, op, "grad_y", "y");
  check_registers_fit(row_path, y, op);
  const c10::cuda::CUDAGuard device_guard(y.device());
  check_on_chip_fits(row_path, y, true, op);
  at::Tensor grad_x = at::empty(y.sizes(), y.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), op, [&] {
    launch_softmax_backward<CudaType<scalar_t>>(cuda_data<scalar_t>(grad_y), cuda_data<scalar_t>(y),
                                                cuda_mutable_data<scalar_t>(grad_x), rows_of(y), y.size(-1), row_path,
                                                course::current_stream());
  });
  return grad_x;
}

// --8<-- [start:rms_norm]
namespace {
// `op` names the caller in error messages: rms_norm or rms_norm_out.
// y and rstd by value: a handle, whose data the launch writes.
void run_rms_norm(const char* op, const at::Tensor& x, const at::Tensor& weight, double eps, const std::string& path,
                  at::Tensor y, at::Tensor rstd) {
  const RowPath row_path = parse_path(path, op, false);
  check_x(x, op, "x");
  check_weight(weight, x, op);
  TORCH_CHECK(std::isfinite(eps) && eps >= 0, op,
              ": eps must be finite and >= 0 (it is added to mean(x^2) under the square root), got ",
              std::to_string(eps));
  check_registers_fit(row_path, x, op);
  check_like(y, x, op, "out", "x");
  check_rows_tensor(rstd, op, "rstd");
  course::check_same_device(x, rstd, op, "x", "rstd");
  course::check_dtype(rstd, op, "rstd", compute_dtype(x));
  TORCH_CHECK(rstd.sizes() == x.sizes().slice(0, x.dim() - 1), op,
              ": rstd must have shape x.shape[:-1] = ", course::format_dims(x.sizes().slice(0, x.dim() - 1)), ", got ",
              course::describe(rstd));
  // The kernel reads x after writing parts of y only within one thread's own elements, but nothing
  // promises that stays true: an out that shares memory with x is refused, not raced.
  at::assert_no_overlap(y, x);
  const c10::cuda::CUDAGuard device_guard(x.device());  // launch on x's GPU, whichever is current
  // A strided weight (w[::2]) is copied: N elements, nothing beside x's rows x N.
  const at::Tensor w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
    using T = CudaType<scalar_t>;
    launch_rms_norm_forward<T>(cuda_data<scalar_t>(x), cuda_data<scalar_t>(w), cuda_mutable_data<scalar_t>(y),
                               rstd.mutable_data_ptr<Compute<T>>(), rows_of(x), x.size(-1), eps, row_path,
                               course::current_stream());
  });
}
}  // namespace

// The out= form: y and rstd are the caller's (lab 09 registers it as rms_norm.out, whose schema
// marks both as written). Checked like inputs: a wrong shape or dtype would be a silent wrong answer.
void rms_norm_out(const at::Tensor& x, const at::Tensor& weight, double eps, const std::string& path,
                  const at::Tensor& y, const at::Tensor& rstd) {
  run_rms_norm("rms_norm_out", x, weight, eps, path, y, rstd);
}

std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                            const std::string& path) {
  check_x(x, "rms_norm", "x");  // before x.dim() is used below
  at::Tensor y = at::empty(x.sizes(), x.options());
  // One rstd a row, shape x.shape[:-1], in the compute type: the backward reads it instead of
  // recomputing it, which would be a pass over x.
  at::Tensor rstd = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(compute_dtype(x)));
  run_rms_norm("rms_norm", x, weight, eps, path, y, rstd);
  return {y, rstd};
}
// --8<-- [end:rms_norm]

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                     const at::Tensor& weight, const at::Tensor& rstd,
                                                     const std::string& path) {
  constexpr const char* op = "rms_norm_backward";
  const RowPath row_path = parse_path(path, op, false);
  check_x(x, op, "x");
  check_like(grad_y, x, op, "grad_y", "x");
  check_weight(weight, x, op);
  course::check_cuda_tensor(rstd, op, "rstd");
  course::check_same_device(x, rstd, op, "x", "rstd");
  course::check_dtype(rstd, op, "rstd", compute_dtype(x));
  TORCH_CHECK(rstd.sizes() == x.sizes().slice(0, x.dim() - 1), op,
              ": rstd must have shape x.shape[:-1] = ", course::format_dims(x.sizes().slice(0, x.dim() - 1)),
              " (the forward's second output), got ", course::describe(rstd));
  check_registers_fit(row_path, x, op);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor w = weight.contiguous();
  const at::Tensor r = rstd.contiguous();  // rows floats: a copy of a strided one costs nothing beside x
  const int64_t rows = rows_of(x), n = x.size(-1);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  at::Tensor grad_weight = at::empty({n}, x.options());
  // One row of column sums per chunk of rows, in the compute type (see normalization.h).
  at::Tensor partials = at::empty({grad_weight_chunks(rows), n}, x.options().dtype(compute_dtype(x)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using T = CudaType<scalar_t>;
    launch_rms_norm_backward<T>(cuda_data<scalar_t>(grad_y), cuda_data<scalar_t>(x), cuda_data<scalar_t>(w),
                                r.const_data_ptr<Compute<T>>(), cuda_mutable_data<scalar_t>(grad_x),
                                cuda_mutable_data<scalar_t>(grad_weight), partials.mutable_data_ptr<Compute<T>>(), rows,
                                n, row_path, course::current_stream());
  });
  return {grad_x, grad_weight};
}

// Lab skeleton generated from solutions/09-custom-ops/ops.cpp by `./course labs` [lab-hash ed09f23d88be].
// Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 09: lessons 06-08's ops registered with PyTorch's dispatcher. No pybind11 here: loading the
// shared library runs the static registrations below (torch.ops.load_library, or `import` of a
// package that loads it), and every op is then torch.ops.<namespace>.<name>, the same object
// torch.compile, torch.library.opcheck, CUDA graphs and autograd see.
//
// The CUDA implementations are the lessons' host wrappers (wrapper.h of each lab): they check
// their inputs, take a device guard and launch on the current stream, so nothing is re-checked
// here. The fake (meta) implementations and the autograd formulas live in Python (ops.py), next to
// the ops, as torch.library.register_fake and register_autograd.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "../06-fused-elementwise/wrapper.h"
#include "../07-fused-normalization/wrapper.h"
#include "../08-flash-attention/wrapper.h"

// The namespace the ops live in: torch.ops.<namespace>. The JIT build (the grader, the notebook)
// names it after the module, TORCH_EXTENSION_NAME (course_labs_lab09, course_solutions_lab09), so
// the labs and the solutions builds register side by side in one process; the ahead-of-time builds
// (CMake, the wheel) define it as `course`. One namespace may be defined by one library only.
#ifndef COURSE_OPS_NAMESPACE
#define COURSE_OPS_NAMESPACE TORCH_EXTENSION_NAME
#endif
// Torch before 2.11 quoted TORCH_LIBRARY's namespace argument with #ns, which takes a macro's own
// name, not its value (2.11 expands it first: lesson 09, section 3). One more macro level expands it
// on every version.
#define COURSE_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define COURSE_TORCH_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

// --8<-- [start:schemas]
COURSE_TORCH_LIBRARY(COURSE_OPS_NAMESPACE, m) {
  // TODO(lab09.1): one m.def per op with its schema: bias_gelu, bias_gelu_backward, rms_norm,
  //   rms_norm_out (writes its out and rstd arguments: annotate them Tensor(a!) and Tensor(b!), return ()),
  //   rms_norm_backward, softmax, softmax_backward, flash_attention (-> (Tensor o, Tensor lse)) and
  //   flash_attention_backward; defaults as in the lessons (approximate="none", eps=1e-6, causal=False,
  //   scale=None as float?, deterministic=False). The tests print the schema they expect when one differs.
}
// --8<-- [end:schemas]

namespace {

// The schemas' `str` arrives as a string_view; the lessons' wrappers take a std::string.
std::string text(c10::string_view view) { return std::string(view.data(), view.size()); }

// Each adapter fixes the lessons' tuning knobs the schema does not expose: the vectorized
// bias+GELU kernel, and the path each row takes chosen by the row length ("auto").
at::Tensor bias_gelu_op(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  return bias_gelu(x, bias, text(approximate), /*vectorized=*/true);
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_op(const at::Tensor& grad_y, const at::Tensor& x,
                                                         const at::Tensor& bias, c10::string_view approximate) {
  return bias_gelu_backward(grad_y, x, bias, text(approximate), /*vectorized=*/true);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_op(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm(x, weight, eps, "auto");
}

void rms_norm_out_op(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out, at::Tensor& rstd) {
  rms_norm_out(x, weight, eps, "auto", out, rstd);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_op(const at::Tensor& grad_y, const at::Tensor& x,
                                                        const at::Tensor& weight, const at::Tensor& rstd) {
  return rms_norm_backward(grad_y, x, weight, rstd, "auto");
}

at::Tensor softmax_op(const at::Tensor& x) { return softmax(x, "auto"); }

at::Tensor softmax_backward_op(const at::Tensor& grad_y, const at::Tensor& y) {
  return softmax_backward(grad_y, y, "auto");
}

}  // namespace

// --8<-- [start:impls]
COURSE_TORCH_LIBRARY_IMPL(COURSE_OPS_NAMESPACE, CUDA, m) {
  // TODO(lab09.2): bind each op's CUDA implementation with m.impl("name", &function): the adapters
  //   above, and lesson 08's flash_forward / flash_backward (their signatures already match the schemas)
}
// --8<-- [end:impls]

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
  // SOLUTION BEGIN lab09.1: one m.def per op with its schema: bias_gelu, bias_gelu_backward, rms_norm,
  //   rms_norm_out (writes its out and rstd arguments: annotate them Tensor(a!) and Tensor(b!), return ()),
  //   rms_norm_backward, softmax, softmax_backward, flash_attention (-> (Tensor o, Tensor lse)) and
  //   flash_attention_backward; defaults as in the lessons (approximate="none", eps=1e-6, causal=False,
  //   scale=None as float?, deterministic=False). The tests print the schema they expect when one differs.
  // Lesson 06: GELU(x + bias), fused; its backward gives grad_x and the bias's column sums.
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor");
  m.def(
      "bias_gelu_backward(Tensor grad_y, Tensor x, Tensor bias, str approximate=\"none\") -> (Tensor grad_x, "
      "Tensor grad_bias)");
  // Lesson 07: rms_norm returns rstd (one float a row) for the backward to read instead of
  // recomputing it. rms_norm_out writes into the caller's tensors, vLLM's style: the (a!) and (b!)
  // tell every pass that reorders, fuses or replays ops (functionalization, CUDA graphs) which
  // arguments change, so that none reads them too early or drops the call as dead.
  m.def("rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> (Tensor y, Tensor rstd)");
  m.def("rms_norm_out(Tensor x, Tensor weight, float eps, Tensor(a!) out, Tensor(b!) rstd) -> ()");
  m.def(
      "rms_norm_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd) -> (Tensor grad_x, Tensor "
      "grad_weight)");
  m.def("softmax(Tensor x) -> Tensor");
  m.def("softmax_backward(Tensor grad_y, Tensor y) -> Tensor");
  // Lesson 08: the tensor-core forward and backward. lse is an output so that autograd can save it:
  // a custom op's backward sees only its inputs and outputs, not the kernel's intermediates.
  m.def(
      "flash_attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> (Tensor o, Tensor lse)");
  m.def(
      "flash_attention_backward(Tensor grad_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool "
      "causal=False, float? scale=None, bool deterministic=False) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v)");
  // SOLUTION END
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
  // SOLUTION BEGIN lab09.2: bind each op's CUDA implementation with m.impl("name", &function): the adapters
  //   above, and lesson 08's flash_forward / flash_backward (their signatures already match the schemas)
  m.impl("bias_gelu", &bias_gelu_op);
  m.impl("bias_gelu_backward", &bias_gelu_backward_op);
  m.impl("rms_norm", &rms_norm_op);
  m.impl("rms_norm_out", &rms_norm_out_op);
  m.impl("rms_norm_backward", &rms_norm_backward_op);
  m.impl("softmax", &softmax_op);
  m.impl("softmax_backward", &softmax_backward_op);
  m.impl("flash_attention", &flash_forward);
  m.impl("flash_attention_backward", &flash_backward);
  // SOLUTION END
}
// --8<-- [end:impls]

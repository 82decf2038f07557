// Lab skeleton generated from solutions/08-flash-attention/wrapper.cpp by `./course labs` [lab-hash e1be1c159042].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08's host wrapper: checks, the device and stream, the outputs and workspaces, launches. The
// only file of the lab that includes torch headers; the kernels see attention.h's plain structs.
//
// Every op takes q (batch, seqlen_q, heads_q, head_dim) and k, v (batch, seqlen_k, heads_kv,
// head_dim) as they are: any strides with a contiguous last dimension, read through the strides by
// the kernels (a hidden q.contiguous() would copy all three tensors, a full read and write of the
// inputs, in an op whose point is to move as few bytes as possible). Outputs are fresh and
// contiguous. Numbers go into error messages through std::to_string (torch_op.h says why).
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <course/cuda.cuh>
#include <course/dtype.cuh>
#include <course/torch_op.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#include "attention.h"
#include "wrapper.h"

namespace {

// Which kernels an op runs: the dtypes, head dims, layouts and GPUs each rung takes differ.
enum class Rung { kNaive, kFp32, kTensorCores };

// flash_forward's kernels (wrapper.h): rung 3 everywhere, the Hopper kernel where it can run.
enum class ForwardPath { kAuto, kPortable, kHopper, kHopperSimple, kHopperOverlap };

// --8<-- [start:hopper_default]
// The Hopper kernel's pipeline for path 'auto' and 'hopper': the simple one. FlashAttention-3's intra-warpgroup
// overlap measured slower here (H100, lesson 08's notes, bf16 (8, 16, 4096..8192):
// 0.71-0.74x cuDNN against 0.82-0.87x at d128, 0.81-0.84x against 0.87-0.90x at d64); 'hopper_simple' and
// 'hopper_overlap' pick either, so that both stay timed.
constexpr bool kHopperOverlapByDefault = false;
// --8<-- [end:hopper_default]

ForwardPath parse_forward_path(const std::string& path, const char* op) {
  if (path == "auto") return ForwardPath::kAuto;
  if (path == "portable") return ForwardPath::kPortable;
  if (path == "hopper") return ForwardPath::kHopper;
  if (path == "hopper_simple") return ForwardPath::kHopperSimple;
  TORCH_CHECK(path == "hopper_overlap", op,
              ": path must be 'auto' (the Hopper kernel where it runs, else the portable one), 'portable' (rung 3, "
              "mma.sync), 'hopper', 'hopper_simple' or 'hopper_overlap' (the sm_90a kernel, flash_forward_hopper.cu); "
              "got '",
              path, "'");
  return ForwardPath::kHopperOverlap;
}

// "0.125", "1e-50": a double as a message shows it (std::to_string would print 0.000000).
std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

ElementType element_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return ElementType::kFloat16;
    case at::kBFloat16: return ElementType::kBFloat16;
    default: return ElementType::kFloat32;  // the checks let nothing else through
  }
}

// The sizes the kernels need, read from q and k once the checks have passed.
struct Shape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
};

// The dtypes each rung computes in: the naive rung widens any of the three to float; the float32
// rung is float on the CUDA cores; the tensor cores take 16-bit inputs.
void check_rung_dtype(const at::Tensor& q, const char* op, Rung rung) {
  const auto dtype = q.scalar_type();
  switch (rung) {
    case Rung::kNaive:
      TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
                  ": q must have dtype torch.float32, torch.float16 or torch.bfloat16, got ", course::describe(q),
                  "; convert it with q.float()");
      return;
    case Rung::kFp32:
      TORCH_CHECK(dtype == at::kFloat, op,
                  ": q must have dtype torch.float32 (this rung computes in float32 on the CUDA cores), got ",
                  course::describe(q),
                  "; convert it with q.float(), or call flash_forward, the tensor-core rung, for float16 and bfloat16");
      return;
    case Rung::kTensorCores:
      TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, op,
                  ": q must have dtype torch.float16 or torch.bfloat16 (the tensor cores' input types), got ",
                  course::describe(q),
                  "; for float32 call flash_forward_fp32 (the CUDA-core rung), or convert with q.to(torch.bfloat16)");
      return;
  }
}

// --8<-- [start:checks]
// The layout every rung reads: the head_dim elements of a row contiguous, the other strides free.
// The tensor-core rungs copy rows in 16-byte cp.async chunks of 8 elements, so each row must also
// start on a 16-byte boundary: an aligned base and batch, seq and head strides that are multiples
// of 8 elements (a dimension of size 1 is never stepped over: its stride does not matter).
void check_layout(const at::Tensor& t, const char* op, const char* name, Rung rung) {
  TORCH_CHECK(t.size(3) == 1 || t.stride(3) == 1, op, ": ", name,
              "'s last dimension (head_dim) must have stride 1, got ", course::describe(t), " with strides ",
              course::format_dims(t.strides()), "; pass ", name,
              ".contiguous() or a view with a contiguous last dimension (the other strides may be anything)");
  if (rung != Rung::kTensorCores) return;
  constexpr int64_t kChunkElements = 8;  // 16 bytes of float16 or bfloat16
  const auto address = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  bool strides_ok = true;
  for (int dim = 0; dim < 3; ++dim)
    strides_ok = strides_ok && (t.size(dim) == 1 || t.stride(dim) % kChunkElements == 0);
  TORCH_CHECK(address % course::kVectorBytes == 0 && strides_ok, op, ": ", name,
              " must be 16-byte aligned with its batch, seq and head strides multiples of 8 elements (the kernel "
              "copies each row in 16-byte cp.async chunks of 8 elements, so every row must start on a 16-byte "
              "boundary), got ",
              course::describe(t), " with strides ", course::format_dims(t.strides()), " starting ",
              std::to_string(address % course::kVectorBytes), " bytes past a 16-byte boundary (storage offset ",
              std::to_string(t.storage_offset()), "); pass ", name,
              ".contiguous(), or slice views at multiples of 8 elements");
}
// --8<-- [end:checks]

Shape check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op, Rung rung) {
  course::check_cuda_tensor(q, op, "q");
  course::check_cuda_tensor(k, op, "k");
  course::check_cuda_tensor(v, op, "v");
  course::check_same_device(q, k, op, "q", "k");
  course::check_same_device(q, v, op, "q", "v");
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    TORCH_CHECK(t->dim() == 4, op, ": ", name, " must be 4-D (batch, seqlen, heads, head_dim), got ",
                course::describe(*t),
                "; a (batch, heads, seqlen, head_dim) tensor, as "
                "F.scaled_dot_product_attention takes, is ",
                name, ".transpose(1, 2)");
  }
  check_rung_dtype(q, op, rung);
  course::check_dtype(k, op, "k", q.scalar_type());  // one dtype: no silent promotion in the kernel
  course::check_dtype(v, op, "v", q.scalar_type());
  course::check_same_shape(k, v, op, "k", "v");
  TORCH_CHECK(k.size(0) == q.size(0), op, ": q and k must have the same batch size (dimension 0), got q ",
              course::describe(q), " and k ", course::describe(k));
  TORCH_CHECK(k.size(3) == q.size(3), op, ": q, k and v must have the same head_dim (dimension 3), got q ",
              course::describe(q), " and k ", course::describe(k));
  const int64_t head_dim = q.size(3);
  if (rung == Rung::kNaive) {
    TORCH_CHECK(head_dim >= 1, op, ": head_dim must be at least 1, got q ", course::describe(q));
  } else {
    TORCH_CHECK(head_dim == kHeadDimSmall || head_dim == kHeadDimLarge, op, ": head_dim must be ",
                std::to_string(kHeadDimSmall), " or ", std::to_string(kHeadDimLarge),
                " (the kernels are compiled for those two), got ", std::to_string(head_dim),
                "; attention_naive takes any head_dim");
  }
  const int64_t heads_q = q.size(2), heads_kv = k.size(2);
  TORCH_CHECK(heads_kv >= 1, op, ": k and v must have at least one head (dimension 2), got k ", course::describe(k));
  TORCH_CHECK(heads_q % heads_kv == 0, op, ": the number of query heads (", std::to_string(heads_q),
              ") must be a multiple of the number of key/value heads (", std::to_string(heads_kv),
              "): in grouped-query attention query head h reads key/value head h / (heads_q / heads_kv); got q ",
              course::describe(q), " and k ", course::describe(k));
  check_layout(q, op, "q", rung);
  check_layout(k, op, "k", rung);
  check_layout(v, op, "v", rung);
  return {q.size(0), q.size(1), k.size(1), heads_q, heads_kv, head_dim};
}

// The backward's o and grad_o: q's shape and dtype, contiguous (the kernels index them flat, as the
// forward wrote o) and 16-byte aligned (read in 16-byte vectors).
void check_like_q(const at::Tensor& t, const at::Tensor& q, const char* op, const char* name) {
  course::check_cuda_tensor(t, op, name);
  course::check_same_device(q, t, op, "q", name);
  course::check_dtype(t, op, name, q.scalar_type());
  TORCH_CHECK(t.sizes() == q.sizes(), op, ": ", name, " must have q's shape ", course::format_dims(q.sizes()),
              " (the forward's output shape), got ", course::describe(t));
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", course::describe(t), " with strides ",
              course::format_dims(t.strides()), "; pass ", name, ".contiguous()");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.const_data_ptr()) % course::kVectorBytes == 0, op, ": ", name,
              " must start on a 16-byte boundary (it is read in 16-byte vectors), got ", course::describe(t),
              " with storage offset ", std::to_string(t.storage_offset()), "; pass ", name, ".clone()");
}

// The backward's lse: the forward's second output, float32 (batch, heads_q, seqlen_q), contiguous.
void check_lse(const at::Tensor& lse, const at::Tensor& q, const char* op) {
  course::check_cuda_tensor(lse, op, "lse");
  course::check_same_device(q, lse, op, "q", "lse");
  course::check_dtype(lse, op, "lse", at::kFloat);
  const std::vector<int64_t> want{q.size(0), q.size(2), q.size(1)};
  TORCH_CHECK(lse.sizes() == c10::IntArrayRef(want), op, ": lse must have shape ", course::format_dims(want),
              " = (batch, heads_q, seqlen_q) of q ", course::describe(q), " (the forward's second output), got ",
              course::describe(lse));
  course::check_contiguous(lse, op, "lse");
}

// None means 1 / sqrt(head_dim); anything else must be a finite float > 0 (the kernels take the
// row max of q . k unscaled, which is the max of the scaled scores only for a positive scale).
float resolve_scale(const std::optional<double>& scale, int64_t head_dim, const char* op) {
  const double value = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  const auto single = static_cast<float>(value);
  TORCH_CHECK(std::isfinite(single) && single > 0.0f, op,
              ": scale must be a finite number > 0 in float32 (it multiplies q . k before the softmax; None means "
              "1 / sqrt(head_dim)), got ",
              format_number(value));
  return single;
}

// The tensor-core rungs need mma.m16n8k16 on 16-bit inputs and cp.async: compute capability 8.0.
void check_tensor_core_gpu(const at::Tensor& q, const char* op) {
  const int major = course::device_attribute(cudaDevAttrComputeCapabilityMajor);
  const int minor = course::device_attribute(cudaDevAttrComputeCapabilityMinor);
  TORCH_CHECK(major >= 8, op,
              " needs a GPU of compute capability 8.0 or newer (mma.m16n8k16 on float16/bfloat16, cp.async), and ",
              q.device().str(), " is ", std::to_string(major), ".", std::to_string(minor),
              "; the float32 rung flash_forward_fp32 and attention_naive run on it");
}

Strides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

AttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Shape& shape,
                            float scale, bool causal) {
  AttentionParams p{};
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.batch = shape.batch;
  p.seqlen_q = shape.seqlen_q;
  p.seqlen_k = shape.seqlen_k;
  p.heads_q = shape.heads_q;
  p.heads_kv = shape.heads_kv;
  p.head_dim = shape.head_dim;
  p.scale = scale;
  p.causal = causal;
  return p;
}

// One forward rung: checks, o (q's shape and dtype, contiguous) and lse (batch, heads_q, seqlen_q)
// float32, the empty cases, then `launch(params)` on the current stream of q's GPU.
template <typename Launch>
std::tuple<at::Tensor, at::Tensor> run_forward(const char* op, Rung rung, const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, bool causal, const std::optional<double>& scale,
                                               Launch&& launch) {
  const Shape shape = check_qkv(q, k, v, op, rung);
  const float softmax_scale = resolve_scale(scale, shape.head_dim, op);
  const c10::cuda::CUDAGuard device_guard(q.device());  // launch on q's GPU, whichever is current
  if (rung == Rung::kTensorCores) check_tensor_core_gpu(q, op);
  at::Tensor o = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({shape.batch, shape.heads_q, shape.seqlen_q}, q.options().dtype(at::kFloat));
  if (lse.numel() == 0) return {o, lse};  // batch, heads_q or seqlen_q is 0: nothing to compute
  if (shape.seqlen_k == 0) {              // no key: every row's sum is empty, o = 0 and L = log(0) = -inf
    o.zero_();
    lse.fill_(-INFINITY);
    return {o, lse};
  }
  AttentionParams params = make_params(q, k, v, shape, softmax_scale, causal);
  params.o = o.mutable_data_ptr();
  params.lse = lse.mutable_data_ptr<float>();
  launch(params);
  return {o, lse};
}

}  // namespace

// --8<-- [start:ops]
std::tuple<at::Tensor, at::Tensor> attention_naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   bool causal, std::optional<double> scale) {
  constexpr const char* op = "attention_naive";
  return run_forward(op, Rung::kNaive, q, k, v, causal, scale, [&](const AttentionParams& params) {
    // The N x N matrix the lesson is about not writing: batch x heads_q x seqlen_q x seqlen_k floats.
    at::Tensor scores =
        at::empty({params.batch, params.heads_q, params.seqlen_q, params.seqlen_k}, q.options().dtype(at::kFloat));
    launch_attention_naive(element_type(q.scalar_type()), params, scores.mutable_data_ptr<float>(),
                           course::current_stream());
  });
}

std::tuple<at::Tensor, at::Tensor> flash_forward_fp32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      bool causal, std::optional<double> scale) {
  return run_forward("flash_forward_fp32", Rung::kFp32, q, k, v, causal, scale, [&](const AttentionParams& params) {
    launch_flash_forward_fp32(params, course::current_stream());
  });
}

std::tuple<at::Tensor, at::Tensor> flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 bool causal, std::optional<double> scale) {
  return flash_forward_path(q, k, v, causal, scale, "auto");
}

// --8<-- [start:forward_dispatch]
std::tuple<at::Tensor, at::Tensor> flash_forward_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      bool causal, std::optional<double> scale,
                                                      const std::string& path) {
  constexpr const char* op = "flash_forward";
  const ForwardPath chosen = parse_forward_path(path, op);
  return run_forward(op, Rung::kTensorCores, q, k, v, causal, scale, [&](const AttentionParams& params) {
    const ElementType type = element_type(q.scalar_type());
    if (chosen == ForwardPath::kPortable) {
      launch_flash_forward(type, params, course::current_stream());
      return;
    }
    const std::string refusal = flash_forward_hopper_refusal(type, params);
    if (chosen == ForwardPath::kAuto && !refusal.empty()) {  // not Hopper, or a view TMA cannot describe
      launch_flash_forward(type, params, course::current_stream());
      return;
    }
    TORCH_CHECK(refusal.empty(), op, ": path='", path,
                "' runs the Hopper kernel, which cannot take this call: ", refusal, "; got q ", course::describe(q),
                " with strides ", course::format_dims(q.strides()),
                "; use path='auto' (which falls back to the portable kernel) or path='portable'");
    const bool overlap = chosen == ForwardPath::kHopperOverlap ||
                         ((chosen == ForwardPath::kHopper || chosen == ForwardPath::kAuto) && kHopperOverlapByDefault);
    launch_flash_forward_hopper(type, params, overlap, course::current_stream());
  });
}
// --8<-- [end:forward_dispatch]

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(const at::Tensor& grad_o, const at::Tensor& q,
                                                              const at::Tensor& k, const at::Tensor& v,
                                                              const at::Tensor& o, const at::Tensor& lse, bool causal,
                                                              std::optional<double> scale, bool deterministic) {
  return flash_backward_path(grad_o, q, k, v, o, lse, causal, scale, deterministic, "auto");
}

// --8<-- [start:backward_dispatch]
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward_path(const at::Tensor& grad_o, const at::Tensor& q,
                                                                   const at::Tensor& k, const at::Tensor& v,
                                                                   const at::Tensor& o, const at::Tensor& lse,
                                                                   bool causal, std::optional<double> scale,
                                                                   bool deterministic, const std::string& path) {
  constexpr const char* op = "flash_backward";
  TORCH_CHECK(path == "auto" || path == "portable" || path == "hopper", op,
              ": path must be 'auto' (the Hopper kernel where it runs, else the portable one), 'portable' (rung 4, "
              "mma.sync) or 'hopper' (the sm_90a kernel, flash_backward_hopper.cu); got '",
              path, "'");
  const Shape shape = check_qkv(q, k, v, op, Rung::kTensorCores);
  check_like_q(grad_o, q, op, "grad_o");
  check_like_q(o, q, op, "o");
  check_lse(lse, q, op);
  const float softmax_scale = resolve_scale(scale, shape.head_dim, op);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_tensor_core_gpu(q, op);
  // No query (or no query head): nothing flows back to k and v. No key: o = 0 did not depend on q.
  // Either way the gradients are zeros, and nothing is launched.
  if (q.numel() == 0 || k.numel() == 0) {
    return {at::zeros(q.sizes(), q.options()), at::zeros(k.sizes(), k.options()), at::zeros(v.sizes(), v.options())};
  }
  at::Tensor grad_q = at::empty(q.sizes(), q.options());
  at::Tensor grad_k = at::empty(k.sizes(), k.options());
  at::Tensor grad_v = at::empty(v.sizes(), v.options());
  const auto floats = q.options().dtype(at::kFloat);

  AttentionBackwardParams params{};
  params.forward = make_params(q, k, v, shape, softmax_scale, causal);
  params.forward.o = const_cast<void*>(o.const_data_ptr());  // read, not written, by the backward
  params.forward.lse = const_cast<float*>(lse.const_data_ptr<float>());
  params.grad_o = grad_o.const_data_ptr();
  params.grad_q = grad_q.mutable_data_ptr();
  params.grad_k = grad_k.mutable_data_ptr();
  params.grad_v = grad_v.mutable_data_ptr();
  params.deterministic = deterministic;
  const ElementType type = element_type(q.scalar_type());
  // dQ's float32 partial sums, added by atomics from every key block; the launcher zeroes it on the
  // stream (attention.h). The deterministic pass sums dQ in registers and needs none.
  at::Tensor grad_q_accum = deterministic ? at::Tensor() : at::empty(q.sizes(), floats);
  params.grad_q_accum = deterministic ? nullptr : grad_q_accum.mutable_data_ptr<float>();
  const std::string refusal = path == "portable" ? "" : flash_backward_hopper_refusal(type, params);
  if (path == "portable" || (path == "auto" && !refusal.empty())) {
    at::Tensor delta = at::empty({shape.batch, shape.heads_q, shape.seqlen_q}, floats);  // D = rowsum(dO * O)
    params.delta = delta.mutable_data_ptr<float>();
    launch_flash_backward(type, params, course::current_stream());
    return {grad_q, grad_k, grad_v};
  }
  TORCH_CHECK(refusal.empty(), op, ": path='hopper' runs the Hopper kernel, which cannot take this call: ", refusal,
              "; got q ", course::describe(q), " with strides ", course::format_dims(q.strides()),
              "; use path='auto' (which falls back to the portable kernel) or path='portable'");
  // The Hopper kernel's D and L log2(e): one allocation, each (batch, heads_q, seqlen_q padded to its query block).
  const int64_t rows = flash_backward_hopper_rows(shape.seqlen_q);
  at::Tensor rows_workspace = at::empty({2, shape.batch, shape.heads_q, rows}, floats);
  params.delta = rows_workspace[0].mutable_data_ptr<float>();
  launch_flash_backward_hopper(type, params, rows_workspace[1].mutable_data_ptr<float>(), course::current_stream());
  return {grad_q, grad_k, grad_v};
}
// --8<-- [end:backward_dispatch]
// --8<-- [end:ops]

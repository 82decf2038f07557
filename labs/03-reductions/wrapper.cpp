// Lab skeleton generated from solutions/03-reductions/wrapper.cpp by `./course labs` [lab-hash ecc5eadeccd0].
// Students: fill in the TODO(lab03.k) blocks, then run `./course grade 03`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 03's host wrapper: checks, the dtype dispatch, the current stream, launches.
// This is the only file of the lab that includes torch headers.
#include <course/torch_op.h>
#include <torch/csrc/utils/pybind.h>

#include <limits>
#include <type_traits>
#include <utility>

#include "reductions.h"

// --8<-- [start:dispatch]
// The kernels are templates over the element type; the dtype is only known at run time.
// Checking it here gives one clear error, and calls fn with x's data as a typed pointer:
// at::BFloat16 and CUDA's __nv_bfloat16 are the same 16 bits under two names.
template <typename Fn>
static void dispatch_float_or_bfloat16(const at::Tensor& x, Fn&& fn) {
  if (x.scalar_type() == at::kBFloat16) {
    static_assert(sizeof(at::BFloat16) == sizeof(__nv_bfloat16), "the same 16-bit format");
    fn(reinterpret_cast<const __nv_bfloat16*>(x.const_data_ptr<at::BFloat16>()));
  } else {
    fn(x.const_data_ptr<float>());
  }
}
// --8<-- [end:dispatch]

static void check_input(const at::Tensor& x, const char* op) {
  course::check_cuda_tensor(x, op, "x");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, op,
              ": x must have dtype float32 or bfloat16 (accumulation is in float32 either way), got ",
              course::describe(x), "; convert it with x.float()");
  course::check_contiguous(x, op, "x");
}

template <typename Pointer>
using ElementOf = std::remove_cv_t<std::remove_pointer_t<Pointer>>;

// --8<-- [start:sum]
static at::Tensor sum_impl(const at::Tensor& x, int64_t blocks, bool deterministic, const char* op) {
  check_input(x, op);
  TORCH_CHECK(blocks >= 0 && blocks <= std::numeric_limits<int>::max(), op,
              ": blocks must be >= 0 (0 derives the grid) and fit in an int, got ", std::to_string(blocks));
  const c10::cuda::CUDAGuard device_guard(x.device());
  const auto float_options = x.options().dtype(at::kFloat);
  at::Tensor out = at::empty({}, float_options);  // allocated first: the grader poisons this one
  const int64_t n = x.numel();
  if (n == 0) return out.zero_();  // the empty sum; a grid of zero blocks is not a launch
  dispatch_float_or_bfloat16(x, [&](const auto* data) {
    using T = ElementOf<decltype(data)>;
    const LaunchConfig config = sum_launch_config<T>(n, static_cast<int>(blocks));
    // One float per block for the deterministic second pass; the atomic path needs none.
    at::Tensor partials = at::empty({deterministic ? config.blocks : 0}, float_options);
    launch_sum<T>(data, n, config, partials.mutable_data_ptr<float>(), out.mutable_data_ptr<float>(), deterministic,
                  course::current_stream());
  });
  return out;
}

at::Tensor sum(const at::Tensor& x, int64_t blocks) { return sum_impl(x, blocks, /*deterministic=*/true, "sum"); }
at::Tensor sum_atomic(const at::Tensor& x, int64_t blocks) {
  return sum_impl(x, blocks, /*deterministic=*/false, "sum_atomic");
}
// --8<-- [end:sum]

static at::Tensor warp_reduce(const at::Tensor& x, ReduceOp reduce_op, const char* op) {
  check_input(x, op);
  const c10::cuda::CUDAGuard device_guard(x.device());
  constexpr int64_t kSegment = course::kWarpSize;  // one warp's lanes
  const int64_t n = x.numel();
  at::Tensor out = at::empty({(n + kSegment - 1) / kSegment}, x.options().dtype(at::kFloat));
  dispatch_float_or_bfloat16(x, [&](const auto* data) {
    launch_warp_reduce<ElementOf<decltype(data)>>(data, n, reduce_op, out.mutable_data_ptr<float>(),
                                                  course::current_stream());
  });
  return out;
}

// --8<-- [start:row_stats]
// Reduces the last dimension; every leading dimension is a batch of rows.
std::tuple<at::Tensor, at::Tensor> row_stats(const at::Tensor& x) {
  check_input(x, "row_stats");
  TORCH_CHECK(x.dim() >= 1, "row_stats: x must have at least one dimension (the row), got ", course::describe(x));
  const int64_t cols = x.size(-1);
  TORCH_CHECK(cols >= 1,
              "row_stats: the last dimension of x must not be empty (the max of no elements is undefined), got ",
              course::describe(x));
  const int64_t rows = x.numel() / cols;
  const c10::cuda::CUDAGuard device_guard(x.device());
  // Both statistics in one allocation, so that one poisoned block covers both outputs.
  at::Tensor stats = at::empty({2, rows}, x.options().dtype(at::kFloat));
  dispatch_float_or_bfloat16(x, [&](const auto* data) {
    float* out = stats.mutable_data_ptr<float>();
    launch_row_stats<ElementOf<decltype(data)>>(data, rows, cols, out, out + rows, course::current_stream());
  });
  const auto batch_shape = x.sizes().slice(0, x.dim() - 1);
  return {stats[0].view(batch_shape), stats[1].view(batch_shape)};
}
// --8<-- [end:row_stats]

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sum", &sum, "the sum of all elements of x, in float32; the same bits every run (two passes)",
        pybind11::arg("x"), pybind11::arg("blocks") = 0);
  m.def("sum_atomic", &sum_atomic, "the sum of all elements of x with atomicAdd: one pass, low bits vary run to run",
        pybind11::arg("x"), pybind11::arg("blocks") = 0);
  m.def(
      "warp_sums", [](const at::Tensor& x) { return warp_reduce(x, ReduceOp::kSum, "warp_sums"); },
      "the sum of each 32-element segment of x, one warp each", pybind11::arg("x"));
  m.def(
      "warp_maxes", [](const at::Tensor& x) { return warp_reduce(x, ReduceOp::kMax, "warp_maxes"); },
      "the max of each 32-element segment of x, one warp each", pybind11::arg("x"));
  m.def("row_stats", &row_stats, "(max, sum(exp(x - max))) over the last dimension of x", pybind11::arg("x"));
  m.def(
      "sum_grid",
      [](int64_t n, int sm_count, int resident_blocks_per_sm) {
        const LaunchConfig c = sum_grid(n, sm_count, resident_blocks_per_sm);
        return std::make_pair(c.blocks, c.threads);
      },
      "(blocks, threads) of the sum's first pass for n elements", pybind11::arg("n"), pybind11::arg("sm_count"),
      pybind11::arg("resident_blocks_per_sm"));
  m.def("row_stats_threads_per_row", &row_stats_threads_per_row, "threads that share a row of cols elements",
        pybind11::arg("cols"));
  // The numbers the kernels are built with, so that the grader and the notebook read them
  // instead of restating them.
  m.def(
      "constants",
      [] {
        const ReductionConstants c = reduction_constants();
        return pybind11::dict(
            pybind11::arg("warp_size") = c.warp_size, pybind11::arg("threads_per_block") = c.threads_per_block,
            pybind11::arg("vector_bytes") = c.vector_bytes, pybind11::arg("longest_warp_row") = c.longest_warp_row);
      },
      "{warp_size, threads_per_block, vector_bytes, longest_warp_row}: the kernels' fixed numbers");
}

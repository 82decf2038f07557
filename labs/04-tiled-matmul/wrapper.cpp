// Lab skeleton generated from solutions/04-tiled-matmul/wrapper.cpp by `./course labs` [lab-hash f02f908711c3].
// Students: fill in the TODO(lab04.k) blocks, then run `./course grade 04`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 04's host wrapper: C = A @ B through kernel 1 ... 7 of the ladder. Checks, device
// guard, current stream, launch. The only file of the lab that includes torch headers.
#include <ATen/ops/zeros.h>
#include <course/torch_op.h>
#include <torch/csrc/utils/pybind.h>

#include <climits>
#include <string>
#include <utility>

#include "tiled_matmul.h"

namespace {
struct Rung {
  const char* name;
  SgemmLauncher launch;
  BlockTile (*tile)();
};
// Index = the kernel's number: rung 1 is 01_naive.cu, and so on up the ladder.
constexpr Rung kLadder[] = {
    {nullptr, nullptr, nullptr},
    {"naive", launch_sgemm_naive, sgemm_naive_tile},
    {"coalesced", launch_sgemm_coalesced, sgemm_coalesced_tile},
    {"smem tiles", launch_sgemm_smem_tiles, sgemm_smem_tiles_tile},
    {"1D register blocking", launch_sgemm_blocktiling_1d, sgemm_blocktiling_1d_tile},
    {"2D register blocking", launch_sgemm_blocktiling_2d, sgemm_blocktiling_2d_tile},
    {"vectorized", launch_sgemm_vectorized, sgemm_vectorized_tile},
    {"warp tiling", launch_sgemm_warptiling, sgemm_warptiling_tile},
};
constexpr int64_t kKernels = sizeof(kLadder) / sizeof(kLadder[0]) - 1;
// The launchers put M or N tiles of 32 rows on gridDim.y, whose limit is 65535.
constexpr int64_t kMaxRowsOrCols = 65535LL * 32;
}  // namespace

// --8<-- [start:matmul]
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, int64_t kernel) {
  // Messages are built as one std::string: numbers streamed into TORCH_CHECK's c10::str
  // crashed (SIGSEGV) on the GPU box's g++ 13 build (see course::format_dims).
  const std::string ladder = "1 ... " + std::to_string(kKernels) + " (1 naive ... 7 warp tiling)";
  TORCH_CHECK(1 <= kernel && kernel <= kKernels,
              "matmul: kernel must be " + ladder + ", got " + std::to_string(kernel));
  course::check_cuda_tensor(a, "matmul", "a");
  course::check_cuda_tensor(b, "matmul", "b");
  course::check_dtype(a, "matmul", "a", at::kFloat);
  course::check_dtype(b, "matmul", "b", at::kFloat);
  const std::string operands = course::describe(a) + " and " + course::describe(b);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: a and b must be 2-D matrices [M, K] and [K, N], got " + operands +
                                                "; for a batch, loop over it or use torch.bmm");
  TORCH_CHECK(a.size(1) == b.size(0),
              "matmul: the inner dimensions must match (a is [M, K], b is [K, N]), got " + operands);
  // The kernels read row r of A at a + r * K: only right for row-major, gap-free storage. A
  // transposed view (x.t()) is refused rather than silently read in the wrong order.
  course::check_contiguous(a, "matmul", "a");
  course::check_contiguous(b, "matmul", "b");
  course::check_same_device(a, b, "matmul", "a", "b");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(M * K < INT_MAX && K * N < INT_MAX && M * N < INT_MAX,
              "matmul: the kernels index with 32-bit ints, so each matrix must have fewer than 2^31 elements; got " +
                  operands + "; split the product into blocks");
  TORCH_CHECK(M <= kMaxRowsOrCols && N <= kMaxRowsOrCols,
              "matmul: M and N must be at most " + std::to_string(kMaxRowsOrCols) +
                  " (the grid's y limit of 65535 tiles of 32), got " + operands);
  const c10::cuda::CUDAGuard device_guard(a.device());
  if (K == 0) return at::zeros({M, N}, a.options());  // a sum over nothing; no kernel to launch
  at::Tensor c = at::empty({M, N}, a.options());
  if (M == 0 || N == 0) return c;  // a grid of zero blocks is an invalid launch
  kLadder[kernel].launch(a.const_data_ptr<float>(), b.const_data_ptr<float>(), c.mutable_data_ptr<float>(),
                         static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), course::current_stream());
  return c;
}
// --8<-- [end:matmul]

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matmul", &matmul, "C = A @ B in fp32 with kernel 1 (naive) ... 7 (warp tiling) of the ladder",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("kernel"));
  m.def(
      "kernels",
      [] {
        pybind11::dict names;
        for (int64_t k = 1; k <= kKernels; ++k) names[pybind11::int_(k)] = kLadder[k].name;
        return names;
      },
      "{number: name} of the ladder's kernels");
  m.def(
      "tiles",
      [] {
        pybind11::dict tiles;
        for (int64_t k = 1; k <= kKernels; ++k) {
          const BlockTile t = kLadder[k].tile();
          tiles[pybind11::int_(k)] = std::make_pair(t.rows, t.cols);
        }
        return tiles;
      },
      "{number: (rows, cols)}: the tile of C one block of each kernel computes");
  m.def(
      "can_vectorize",
      [](int64_t M, int64_t N, int64_t K, uintptr_t a, uintptr_t b, uintptr_t c) {
        return can_vectorize(M, N, K, a, b, c);
      },
      "whether kernels 6 and 7 may use float4s for these sizes and addresses (else they run kernel 5)",
      pybind11::arg("M"), pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("a_address"),
      pybind11::arg("b_address"), pybind11::arg("c_address"));
}

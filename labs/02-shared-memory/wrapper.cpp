// Lab skeleton generated from solutions/02-shared-memory/wrapper.cpp by `./course labs` [lab-hash 5f271b4bfd44].
// Students: fill in the TODO(lab02.k) blocks, then run `./course grade 02`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 02's host wrapper: Tensor in, checks, current stream, launch, Tensor out.
// This is the only file of the lab that includes torch headers.
#include <course/torch_op.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>
#include <vector>

#include "transpose.h"

// --8<-- [start:transpose]
// x is (M, N) or (B, M, N), with any strides; the result is contiguous, (N, M) or (B, N, M).
static at::Tensor transpose_with(TransposeKernel kernel, const at::Tensor& x, const char* op) {
  course::check_cuda_tensor(x, op, "x");
  course::check_dtype(x, op, "x", at::kFloat);
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, op, ": x must be a matrix (M, N) or a batch of matrices (B, M, N), got ",
              course::describe(x), "; reshape it to 3 dimensions first, e.g. x.flatten(0, -3)");
  const c10::cuda::CUDAGuard device_guard(x.device());
  // TODO(lab02.1): allocate the output with the last two sizes of x swapped, and describe x to the kernel: a
  //   2-D x is a batch of one; the sizes and the strides (in elements) come from x itself, so views need no copy
  at::Tensor out = at::empty_like(x);
  const TransposeShape shape{0, 0, 0, 0, 0, 0};
  launch_transpose(kernel, x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), shape, course::current_stream());
  return out;
}
// --8<-- [end:transpose]

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def(
      "naive_transpose",
      [](const at::Tensor& x) { return transpose_with(TransposeKernel::kNaive, x, "naive_transpose"); },
      "transpose the last two dims, global memory to global memory (writes uncoalesced)", pybind11::arg("x"));
  m.def(
      "tiled_transpose",
      [](const at::Tensor& x) { return transpose_with(TransposeKernel::kTiled, x, "tiled_transpose"); },
      "transpose the last two dims through a 32 x 32 shared-memory tile", pybind11::arg("x"));
  m.def(
      "padded_transpose",
      [](const at::Tensor& x) { return transpose_with(TransposeKernel::kPadded, x, "padded_transpose"); },
      "transpose the last two dims through a padded, bank-conflict-free shared-memory tile", pybind11::arg("x"));
  m.def(
      "transpose_grid",
      [](int64_t batch, int64_t rows, int64_t cols) {
        const TileGrid g = transpose_grid(batch, rows, cols);
        return std::make_tuple(g.tiles_across, g.tiles_down, g.blocks);
      },
      "(tiles_across, tiles_down, blocks) covering a batch of rows x cols matrices", pybind11::arg("batch"),
      pybind11::arg("rows"), pybind11::arg("cols"));
  m.def(
      "tile_layout",
      [] {
        const TileLayout t = tile_layout();
        pybind11::dict d;
        d["tile"] = t.tile;
        d["block_rows"] = t.block_rows;
        d["tiled_row_stride"] = t.tiled_row_stride;
        d["padded_row_stride"] = t.padded_row_stride;
        d["warp_size"] = t.warp_size;
        d["banks"] = t.banks;
        d["bank_bytes"] = t.bank_bytes;
        return d;
      },
      "the tile and block shapes of the kernels, the row strides of their shared tiles, and the warp and bank "
      "widths those derive from");
}

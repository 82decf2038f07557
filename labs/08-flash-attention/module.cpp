// Lab skeleton generated from solutions/08-flash-attention/module.cpp by `./course labs` [lab-hash 159f655701e9].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08's Python module: wrapper.h's functions bound with pybind11, and the kernels' fixed
// numbers. Kept apart from wrapper.cpp so that lab 09 can compile the wrapper without Python.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "attention.h"
#include "wrapper.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("attention_naive", &attention_naive,
        "rung 1: (o, lse) of softmax(scale q k^T) v with the (batch, heads_q, seqlen_q, seqlen_k) float32 scores "
        "written to memory; q (B, Sq, Hq, D), k and v (B, Sk, Hkv, D); float32, float16 or bfloat16, any head_dim",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none());
  m.def("flash_forward_fp32", &flash_forward_fp32,
        "rung 2: (o, lse) by flash attention in float32 on the CUDA cores; head_dim 64 or 128", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none());
  m.def("flash_forward", &flash_forward_path,
        "rung 3: (o, lse) by flash attention on the tensor cores; float16 or bfloat16, head_dim 64 or 128, "
        "compute capability 8.0+. path: 'auto' (the Hopper kernel on sm_90a where the views qualify for TMA, else "
        "rung 3), 'portable' (rung 3), 'hopper', 'hopper_simple', 'hopper_overlap' (the Hopper kernel, or an error)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none(),
        py::arg("path") = "auto");
  m.def("flash_forward_hopper_available", &flash_forward_hopper_available,
        "whether flash_forward's Hopper kernel runs on the current GPU (compute capability 9.0, a build for sm_90a)");
  m.def("flash_backward", &flash_backward_path,
        "rung 4: (grad_q, grad_k, grad_v) from grad_o and the forward's o and lse; deterministic=True computes dQ "
        "in a second pass instead of float32 atomics (bitwise reproducible, more FLOPs, the portable kernel). path: "
        "'auto' (the Hopper kernel on sm_90a where the views qualify for TMA, else rung 4), 'portable' (rung 4), "
        "'hopper' (the Hopper kernel, or an error)",
        py::arg("grad_o"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"),
        py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("deterministic") = false,
        py::arg("path") = "auto");
  // The numbers the kernels are built with, so that the grader, the notebook and the page read them
  // instead of restating them: per head_dim, each flash kernel's block of queries (block_m), of keys
  // (block_n), warps and dynamic shared memory, keyed like "forward_block_m_d64".
  m.def(
      "constants",
      [] {
        py::dict c;
        py::list head_dims;
        head_dims.append(kHeadDimSmall);
        head_dims.append(kHeadDimLarge);
        c["head_dims"] = head_dims;
        for (const int d : {kHeadDimSmall, kHeadDimLarge}) {
          const std::string suffix = "_d" + std::to_string(d);
          const auto put = [&](const std::string& key, int value) { c[py::str(key + suffix)] = value; };
          const FlashFp32Tiles fp32 = flash_fp32_tiles(d);
          put("fp32_block_m", fp32.block_m);
          put("fp32_block_n", fp32.block_n);
          put("fp32_warps", fp32.warps);
          put("fp32_shared_bytes", fp32.shared_bytes);
          const FlashForwardTiles fwd = flash_forward_tiles(d);
          put("forward_block_m", fwd.block_m);
          put("forward_block_n", fwd.block_n);
          put("forward_warps", fwd.warps);
          put("forward_stages", fwd.stages);
          put("forward_shared_bytes", fwd.shared_bytes);
          const FlashForwardHopperTiles hopper = flash_forward_hopper_tiles(d);
          put("hopper_block_m", hopper.block_m);
          put("hopper_block_n", hopper.block_n);
          put("hopper_warps", hopper.warps);
          put("hopper_stages", hopper.stages);
          put("hopper_shared_bytes", hopper.shared_bytes);
          const FlashBackwardHopperTiles hopper_bwd = flash_backward_hopper_tiles(d);
          put("hopper_backward_block_m", hopper_bwd.block_m);
          put("hopper_backward_block_n", hopper_bwd.block_n);
          put("hopper_backward_warps", hopper_bwd.warps);
          put("hopper_backward_stages", hopper_bwd.stages);
          put("hopper_backward_shared_bytes", hopper_bwd.shared_bytes);
          const FlashBackwardTiles bwd = flash_backward_tiles(d);
          put("backward_block_m", bwd.block_m);
          put("backward_block_n", bwd.block_n);
          put("backward_warps", bwd.warps);
          put("backward_shared_bytes", bwd.shared_bytes);
        }
        return c;
      },
      "{head_dims: [64, 128], and per head_dim d: fp32_/forward_/backward_ block_m, block_n, warps, shared_bytes "
      "(+ forward_stages), hopper_ the same for the Hopper forward, hopper_backward_ for the Hopper backward, keyed "
      "like 'forward_block_m_d64'}");
}

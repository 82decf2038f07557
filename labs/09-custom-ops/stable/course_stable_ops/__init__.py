# Lab skeleton generated from solutions/09-custom-ops/stable/course_stable_ops/__init__.py by `./course labs` [lab-hash 62d4e4cb3cc3].
# Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""course_stable::bias_gelu, lesson 06's fused bias + GELU forward, built against LibTorch's stable ABI.

Importing this package registers the op: torch.ops.course_stable.bias_gelu(x, bias, approximate="none").

The shared library _C.abi3.so is loaded with torch.ops.load_library, not imported as a Python module.
It has no PyInit function and calls no Python API: its static initializers register the op with the
dispatcher through the stable C shim, and that is all it does. So it links neither libpython nor
libtorch_python, the same file can be loaded by a C++ program on LibTorch alone, and the abi3 tag of
the wheel is true without any Py_LIMITED_API discipline in the C++ (a PyInit stub would make it
importable, and buy nothing else).
"""
from pathlib import Path

import torch

_LIBRARY = next(Path(__file__).parent.glob("_C*.so"), None)
if _LIBRARY is None:
    raise ImportError(f"course_stable_ops: no _C*.so next to {__file__}; build the wheel first "
                      "(solutions/09-custom-ops/stable/README.md)")
torch.ops.load_library(str(_LIBRARY))

bias_gelu = torch.ops.course_stable.bias_gelu


@torch.library.register_fake("course_stable::bias_gelu")
def _(x, bias, approximate="none"):
    # The CUDA kernel's output: a new contiguous tensor of x's shape, dtype and device (x must be
    # contiguous, so empty_like keeps its strides). No data is read, so FakeTensorMode and
    # torch.compile trace through the op without a GPU.
    torch._check(x.dim() >= 1, lambda: "course_stable::bias_gelu: x must have at least one dimension")
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: f"course_stable::bias_gelu: bias must have shape [{x.shape[-1]}], got {list(bias.shape)}")
    torch._check(bias.dtype == x.dtype, lambda: f"course_stable::bias_gelu: bias must be {x.dtype}, got {bias.dtype}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


__all__ = ["bias_gelu"]

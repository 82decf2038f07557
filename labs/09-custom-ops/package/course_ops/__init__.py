# Lab skeleton generated from solutions/09-custom-ops/package/course_ops/__init__.py by `./course labs` [lab-hash 67f158e436bb].
# Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lessons 06-08's kernels as PyTorch operators: `import course_ops` registers torch.ops.course.*.

    import course_ops
    y = torch.ops.course.bias_gelu(x, bias)               # or course_ops.torch_ops.bias_gelu
    block = course_ops.DecoderBlock(course_ops.BlockConfig(), dtype=torch.bfloat16, device="cuda")
    y = block(x, course_ops.CourseOps(course_ops.torch_ops))

The compiled library is loaded by importing it, as the extension module course_ops._C (its PyInit is
an empty stub, pyinit_stub.cpp), rather than with torch.ops.load_library on its path: Python's import
finds the file whatever its platform suffix (_C.abi3.so), loads it once per process however often the
package is imported, and raises ImportError, naming the module, when it is missing. The price is one
Python symbol in the library; the CMake build's libcourse_ops.so, meant for C++ as well, has none and
is loaded with torch.ops.load_library.

ops.py and block.py are the lab's own files (solutions/09-custom-ops/ or labs/09-custom-ops/), copied
into the wheel at build time.
"""
import torch  # noqa: F401  (first: the library's NEEDED libtorch*.so are the ones torch has loaded)

from . import _C  # noqa: F401  (loading the library runs its TORCH_LIBRARY registrations)
from .block import BlockConfig, CourseOps, DecoderBlock, TorchOps
from .ops import register

# The namespace the ahead-of-time builds register (ops.cpp's COURSE_OPS_NAMESPACE).
NAMESPACE = "course"
# torch.ops.course, with the fake implementations and autograd formulas of ops.py registered.
torch_ops = register(NAMESPACE)

__all__ = ["NAMESPACE", "BlockConfig", "CourseOps", "DecoderBlock", "TorchOps", "register", "torch_ops"]

"""The stable-ABI wheel of lesson 06's bias + GELU: one binary for every torch from 2.10 on, any CPython >= 3.10.

    export PYTHONPATH=$PWD   # from the repository root: setup.py imports coursekit
    pip wheel --no-build-isolation --no-deps -w build/stable-abi/dist solutions/09-custom-ops/stable
    (or: ./course run solutions/09-custom-ops/stable/stable_tools.py wheel, which also brings bdist_wheel)

--no-build-isolation: the build compiles against the torch already installed (with build isolation pip
would download another, pyproject.toml). The library is built for sm_90a unless TORCH_CUDA_ARCH_LIST says
otherwise, and lands in the wheel as course_stable_ops/_C.abi3.so. Intermediate files go to
build/stable-abi/ of the repository (BUILD_BASE), not into this folder; the grader (stable_tools.py)
sets COURSE_STABLE_BUILD to a folder of the graded tree's own, and COURSE_ROOT to the course checkout.

What the .so needs at load time, from readelf -d (tests/grader09/stable_abi.py checks it): NEEDED
libtorch_cpu.so (the stable C shim: aoti_torch_*, torch_*), libstdc++.so.6, libgcc_s.so.1, libc.so.6,
ld-linux-x86-64.so.2; no RPATH or RUNPATH (libtorch_cpu.so is found by its soname, already loaded by
`import torch`). Not libtorch_python nor libpython: it is no Python extension module (no Python API,
see course_stable_ops/__init__.py). Not libcudart.so: the CUDA runtime (13.0 here) is linked statically,
so the wheel does not depend on the CUDA runtime the installed torch ships, or on its shipping one; the
driver must still support CUDA 13. Not libtorch_cuda.so, libc10_cuda.so, libc10.so or libtorch.so, which
CUDAExtension links by default: a CPU-only torch has no libtorch_cuda.so, and the wheel must load there
too (registration and fake tensors need no GPU). The one CUDA-only shim function it calls, the current
stream's getter, is looked up at run time (bias_gelu_stable.cpp says why).
"""
import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
# The course checkout (include/): this folder's grandparent's parent, unless the grader builds
# a submission stored elsewhere and says where the course is.
ROOT = Path(os.environ.get("COURSE_ROOT") or HERE.parents[2])
LESSON06 = HERE.parents[1] / "06-fused-elementwise"  # lesson 06 of the same tree (solutions/ or labs/)
BUILD_BASE = Path(os.environ.get("COURSE_STABLE_BUILD", ROOT / "build" / "stable-abi"))
BUILD_BASE.mkdir(parents=True, exist_ok=True)  # setuptools refuses an egg_base that does not exist

# The grader's compiler flags (coursekit/jit.py), so this build compiles lesson 06 as the grader does. The course's
# root is on PYTHONPATH: stable_tools.py puts it there for the build (coursekit.trees.pythonpath); by hand, from the
# repository root: PYTHONPATH=$PWD pip wheel ...
from coursekit import jit  # noqa: E402

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")  # one target keeps the build (and CI) short
jit.drop_python_rpath()  # no RUNPATH naming this machine's python: the library links no libpython

# The oldest torch this binary loads in: the stable headers hide every newer API (a compile error,
# not a load-time surprise) and make ATen and c10 headers an #error. 0xMMmm000000000000 = MM.mm.
TARGET_VERSION = "0x020A000000000000"  # 2.10
# Py_LIMITED_API is what torch's BuildExtension defines for py_limited_api=True (CPython 3.10's
# hex in torch 2.11); the wheel's cp310 tag says the same. The library uses no Python API at all.
PY_LIMITED = "cp310"

stable = [f"-DTORCH_TARGET_VERSION={TARGET_VERSION}"]
extension = CUDAExtension(
    name="course_stable_ops._C",
    sources=[str(HERE / "bias_gelu_stable.cpp"), str(LESSON06 / "forward.cu")],
    include_dirs=[str(ROOT / "include"), str(LESSON06)],
    extra_compile_args={"cxx": jit.CXX_FLAGS + stable, "nvcc": jit.NVCC_FLAGS + stable},
    # --as-needed drops any library nothing references; -z defs fails the link on a symbol that none
    # of the libraries below defines, instead of at load time on a user's machine; --strip-debug drops
    # the host code's DWARF (python's CFLAGS say -g): 0.5 of the 1.8 MB.
    extra_link_args=["-Wl,--as-needed", "-Wl,-z,defs", "-Wl,--strip-debug"],
    py_limited_api=True,
)
# CUDAExtension's default list is c10, torch, torch_cpu, cudart, c10_cuda, torch_cuda: replaced by
# the stable shim's library and the static CUDA runtime (with what libcudart_static.a needs).
extension.libraries = ["torch_cpu", "cudart_static", "rt", "pthread", "dl"]

setup(
    name="course_stable_ops",
    version="0.1.0",
    description="Lesson 06's fused bias+GELU as a stable-ABI PyTorch operator (course_stable::bias_gelu)",
    packages=["course_stable_ops"],
    package_dir={"course_stable_ops": str((HERE / "course_stable_ops").relative_to(HERE))},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.10"],
    options={
        "bdist_wheel": {"py_limited_api": PY_LIMITED},
        "build": {"build_base": str(BUILD_BASE / "build")},
        "egg_info": {"egg_base": str(BUILD_BASE)},
    },
)

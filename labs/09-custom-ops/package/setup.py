# Lab skeleton generated from solutions/09-custom-ops/package/setup.py by `./course labs` [lab-hash 95bf8b0e6d21].
# Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""The course_ops wheel: lab 09's op library built with setuptools and torch's CUDAExtension.

    export PYTHONPATH=$PWD   # from the repository root: setup.py imports coursekit
    pip wheel --no-build-isolation --no-deps -w build/wheel/solutions/dist solutions/09-custom-ops/package
    pip install --no-build-isolation solutions/09-custom-ops/package     # or labs/09-custom-ops/package

Then `import course_ops` registers torch.ops.course.* (course_ops/__init__.py).

What is compiled: the lab folder's own sources (ops.cpp), the sources of the labs its depends.txt names
without their module.cpp, read by coursekit/jit.py's functions (the grader's JIT build and the CMake
build read the same file: no second list here), and pyinit_stub.cpp. With the grader's flags, for sm_90a
unless TORCH_CUDA_ARCH_LIST says otherwise; MAX_JOBS caps ninja's parallel compiles (torch's
BuildExtension reads it). ops.py and block.py are not copied into this folder: the build copies them from
the lab folder into the wheel (BuildPy), so each has one source. (Hence no editable install, `pip install
-e`: it would import the package from this folder, where they are not.)

Intermediate files go to build/wheel/<tree>/ of the repository, not into this folder: `./course labs` copies
every file under solutions/ into labs/. The grader (tests/grader09/aot.py) sets COURSE_WHEEL_BUILD to a folder of
the graded tree's own, and COURSE_ROOT to the course checkout when the tree is a submission stored elsewhere.
"""
import importlib.metadata
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
LAB = HERE.parent  # <tree>/09-custom-ops
# The course checkout (include/): this folder's grandparent's parent, unless the grader builds
# a submission stored elsewhere and says where the course is.
ROOT = Path(os.environ.get("COURSE_ROOT") or HERE.parents[2])
BUILD_BASE = Path(os.environ.get("COURSE_WHEEL_BUILD", ROOT / "build" / "wheel" / LAB.parent.name))
BUILD_BASE.mkdir(parents=True, exist_ok=True)  # setuptools refuses an egg_base that does not exist
# The lab's Python files that go into the package as course_ops.ops and course_ops.block.
LAB_MODULES = ["ops.py", "block.py"]

# The grader's build rules (sources, depends.txt, flags; standard library only). The course's root is on PYTHONPATH:
# the grader puts it there for the builds it starts (coursekit.trees.pythonpath), ./course for its children; by hand,
# from the repository root: PYTHONPATH=$PWD pip wheel ...
from coursekit import jit  # noqa: E402

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")  # one target: the course's GPU, and a short build
jit.drop_python_rpath()  # no RUNPATH naming this machine's python: the library links no libpython

dependencies = jit.lab_dependencies(LAB)
sources = jit.lab_sources(LAB) + jit.dependency_sources(LAB) + [HERE / "pyinit_stub.cpp"]
# ops.cpp's namespace: `course` (the JIT build names it after its module instead).
namespace = ["-DCOURSE_OPS_NAMESPACE=course"]
extension = CUDAExtension(
    name="course_ops._C",
    # Absolute paths: BuildExtension names each object after its source's path, so the three labs'
    # wrapper.cpp compile to three objects (the JIT build needs stubs for that: jit.dependency_stubs).
    sources=[str(s) for s in sources],
    include_dirs=[str(ROOT / "include"), str(LAB)] + [str(d) for d in dependencies],
    extra_compile_args={"cxx": jit.CXX_FLAGS + namespace, "nvcc": jit.NVCC_FLAGS + namespace},
    # The limited C API for the PyInit stub: no libtorch_python in the link (CUDAExtension adds it
    # otherwise) and an abi3 wheel. pyinit_stub.cpp says why the stub exists.
    py_limited_api=True,
)


class BuildPy(build_py):
    """The package's own files, then the lab's ops.py and block.py copied in from the lab folder."""

    def run(self):
        super().run()
        package = Path(self.build_lib) / "course_ops"
        for name in LAB_MODULES:
            self.copy_file(str(LAB / name), str(package / name))


setup(
    packages=["course_ops"],
    # Off (pyproject's [project] turns it on): it would look for package data among the sources the
    # egg-info lists, and refuse their absolute paths. The package has no data, only its .py files.
    # (An sdist is not supported either: the sources live outside this folder, in the lab folders.)
    include_package_data=False,
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension, "build_py": BuildPy},
    # Exactly the torch distribution it was compiled against: at::Tensor and c10 have no stable ABI
    # across releases. (The version pip knows, e.g. 2.11.0; torch.__version__ adds the CUDA build,
    # +cu130, which a package index may not carry. The library also needs that build's CUDA runtime,
    # libcudart.so.13: readelf -d lists it.)
    install_requires=[f"torch=={importlib.metadata.version('torch')}"],
    options={
        "bdist_wheel": {"py_limited_api": "cp310"},  # torch's Py_LIMITED_API for py_limited_api=True: 3.10
        "build": {"build_base": str(BUILD_BASE / "build")},
        "egg_info": {"egg_base": str(BUILD_BASE)},
    },
)

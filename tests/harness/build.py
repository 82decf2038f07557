"""JIT-build a lab with torch.utils.cpp_extension.load: one build dir per (tree, lab).

`load` writes a ninja file that compiles every source to its own object, so
editing one kernel `.cu` recompiles that object and relinks; the host wrapper
(the only file that includes torch headers, and the slow one) is not rebuilt.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from . import trees

_built: dict[tuple[str, str], object] = {}

CXX_FLAGS = ["-O3", "-std=c++17"]
# -lineinfo maps SASS back to source lines for Nsight Compute and compute-sanitizer at no speed cost.
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo"]


def default_arch_list() -> str:
    """The GPU present (so nvcc compiles one target, fast), else sm_90a as a compile check.
    Compute capability 9.0 builds for 9.0a, the target that has Hopper's wgmma (lab 05)."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return "9.0a" if (major, minor) == (9, 0) else f"{major}.{minor}"
    return "9.0a"


def ensure_arch_list() -> str:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_arch_list())
    return os.environ["TORCH_CUDA_ARCH_LIST"]


def module_name(lab: trees.Lab, tree: trees.Tree) -> str:
    # Distinct per tree, so a process can hold the labs and the solutions builds at once.
    return f"course_{tree.tag}_{lab.module_stem}"


def build(lab: trees.Lab, tree: trees.Tree, verbose: bool = False, extra_cuda_cflags: list[str] | None = None):
    """Compile (or reuse) the lab in `tree` and return the imported module."""
    key = (tree.tag, lab.name)
    if key in _built and not extra_cuda_cflags:
        return _built[key]
    from torch.utils.cpp_extension import load

    ensure_arch_list()
    sources = trees.lab_sources(lab, tree)
    if not sources:
        raise FileNotFoundError(f"{lab.dir_in(tree)} has no .cu or .cpp files to build")
    build_dir = lab.build_dir(tree)
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        module = _load(load, lab, tree, sources, build_dir, verbose, extra_cuda_cflags)
    except ImportError as error:
        # load() imports without rebuilding when it thinks nothing changed (e.g. after a
        # compile was interrupted); run ninja ourselves so the real compiler error shows.
        result = subprocess.run(["ninja", "-v"], cwd=build_dir, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"Error building extension:\n{result.stdout}{result.stderr}") from None
        raise error
    _built[key] = module
    return module


def _load(load, lab, tree, sources, build_dir, verbose, extra_cuda_cflags):
    return load(
        name=module_name(lab, tree),
        sources=[str(s) for s in sources],
        extra_include_paths=[str(trees.INCLUDE), str(lab.dir_in(tree))],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=NVCC_FLAGS + list(extra_cuda_cflags or []),
        build_directory=str(build_dir),
        verbose=verbose,
    )

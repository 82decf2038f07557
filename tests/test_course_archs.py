"""Every kernel file of the solutions compiles for each GPU generation the course supports, not only for the one
the grader builds for (the GPU present, else sm_90a, which the grader's own build and CMake already compile on a
machine without a GPU): sm_75 (a Colab T4: no bf16 tensor cores, no cp.async) and sm_80 (A100: no wgmma, no TMA).
The kernel files include no PyTorch header (the wrappers do), so nvcc compiles their device code alone (-cubin):
about 3 minutes for all of them on a 2-core machine. Issue 14's "compile-checked in CI" for sm_75 and sm_80.
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from torch.utils.cpp_extension import CUDA_HOME

from coursekit import env, jit, trees

ARCHS = ("sm_75", "sm_80")
KERNEL_FILES = sorted(p for lab in trees.all_labs() for p in lab.dir_in(trees.resolve_tree("solutions")).glob("*.cu"))
# The toolkit the grader's own builds use (torch's load() compiles with CUDA_HOME's nvcc).
NVCC = Path(CUDA_HOME or "/nonexistent") / "bin" / "nvcc"


def test_kernel_files_include_no_torch_header():
    """The compile check below builds device code with nvcc alone: a kernel file that included torch would need
    PyTorch's include paths (and take 20x longer); keep the torch side in the wrappers."""
    offenders = [p.relative_to(trees.ROOT) for p in KERNEL_FILES
                 if any(f"#include <{h}" in p.read_text() for h in ("torch/", "ATen/", "c10/"))]
    assert not offenders, f"kernel files that include a PyTorch header: {offenders}"


# A compile that passed leaves a stamp named by everything it could have read (the file, its lab folder's and
# include/'s headers by their paths in the repository, the flags, nvcc itself): a run with the same inputs passes
# without compiling again (80 s of a warm CI run's self-tests went to these compiles); any edit gives a new name.
# Kept in the cache outside the clone, as the venv and the compiler cache are, so a fresh clone of the same code hits.
STAMPS = env.cache_dir() / "arch-checks"
HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inc")


def _inputs_key(path: Path, command: list[str]) -> str:
    digest = hashlib.sha256("\0".join(command).replace(str(trees.ROOT), "<root>").encode())  # any clone: one key
    nvcc = NVCC.stat()
    digest.update(f"{NVCC.resolve()}:{nvcc.st_size}:{nvcc.st_mtime_ns}".encode())
    for file in [path, *sorted(p for folder in (path.parent, trees.ROOT / "include") for p in folder.rglob("*")
                               if p.suffix in HEADER_SUFFIXES)]:
        digest.update(str(file.relative_to(trees.ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:32]


@pytest.mark.skipif(not NVCC.is_file(), reason="needs nvcc (the CUDA toolkit torch builds with) on this machine")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: f"{p.parent.name[:2]}-{p.stem}")
def test_kernel_file_compiles_for(path, arch):
    # A lab's headers.txt packages (lab 10: CUTLASS, whose sm_90a kernel must still compile, to a stub, elsewhere).
    # CUTLASS's host/device constexpr calls need --expt-relaxed-constexpr (which torch's JIT build passes too).
    packages = [f"-I{d}" for d in jit.lab_include_paths(path.parent, trees.ROOT)]
    packages += ["--expt-relaxed-constexpr"] if packages else []
    command = [str(NVCC), "-std=c++17", "-cubin", f"-arch={arch}", "-I", str(trees.ROOT / "include"), *packages,
               "-o", "/dev/null", path.name]
    stamp = STAMPS / f"{path.parent.name}-{path.stem}-{arch}-{_inputs_key(path, command)}.ok"
    if stamp.is_file():
        return  # these very inputs compiled before
    run = subprocess.run(command, cwd=path.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (f"{path.relative_to(trees.ROOT)} does not compile for {arch}:\n"
                                 + (run.stderr or run.stdout)[-3000:])
    STAMPS.mkdir(parents=True, exist_ok=True)
    stamp.write_text(" ".join(command) + "\n")

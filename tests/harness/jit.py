"""The build flags, the arch rule, the notebook build and the CUDA-event timer, in one place.

The grader (`build.py`, `perf.py`) and every lab notebook use this module, so a notebook
compiles and times a lab the way `./course grade` does. It needs only the standard library
and torch, and imports nothing else of the harness (whose `__init__` imports pytest), so a
notebook can import it on its own:

    sys.path.insert(0, str(ROOT / "tests" / "harness"))
    import jit
    lab = jit.load_lab(LAB_DIR, ROOT)
    ms = jit.median_ms(lambda: lab.scale(x, 1.5))
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Callable, Sequence

CXX_FLAGS = ["-O3", "-std=c++17"]
# -lineinfo maps SASS back to source lines for Nsight Compute and compute-sanitizer at no speed cost.
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo"]
# ptxas's report, one line per kernel: registers, spills, shared memory (shown when load() is verbose).
PTXAS_REPORT = ["-Xptxas=-v"]
# Files of a lab folder that the build compiles.
SOURCE_SUFFIXES = (".cu", ".cpp")


def default_arch_list() -> str:
    """The GPU present (so nvcc compiles one target, fast), else sm_90a as a compile check.
    Compute capability 9.0 builds for 9.0a, the target that has Hopper's wgmma (lab 05)."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return "9.0a" if (major, minor) == (9, 0) else f"{major}.{minor}"
    return "9.0a"


def ensure_arch_list() -> str:
    """Set TORCH_CUDA_ARCH_LIST to default_arch_list() unless it is set already; return it."""
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_arch_list())
    return os.environ["TORCH_CUDA_ARCH_LIST"]


def lab_sources(lab_dir: str | Path) -> list[Path]:
    """Every .cu and .cpp file of a lab folder, sorted: what the build compiles."""
    return sorted(p for p in Path(lab_dir).iterdir() if p.suffix in SOURCE_SUFFIXES)


# Set by the grader when it executes a notebook (harness.notebooks): the build folder and module
# name of the lab it has just built, so the notebook's load() finds that build up to date instead
# of compiling the lab a second time.
BUILD_DIR_ENV, MODULE_ENV = "COURSE_JIT_BUILD_DIR", "COURSE_JIT_MODULE"


def notebook_build_dir(lab_dir: str | Path, root: str | Path) -> Path:
    """ROOT/build/notebook/<tree>/<lab>, e.g. build/notebook/labs/00-first-kernel (created), or the
    grader's own build folder when it runs the notebook."""
    lab_dir = Path(lab_dir)
    path = Path(os.environ.get(BUILD_DIR_ENV) or Path(root) / "build" / "notebook" / lab_dir.parent.name / lab_dir.name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def notebook_module_name(lab_dir: str | Path) -> str:
    """`labNN_notebook`, or the grader's module name when it runs the notebook."""
    return os.environ.get(MODULE_ENV) or f"lab{Path(lab_dir).name[:2]}_notebook"


def load_lab(lab_dir: str | Path, root: str | Path, *, name: str | None = None, ptxas_report: bool = False,
             extra_cuda_cflags: Sequence[str] = (), verbose: bool = False, build_dir: str | Path | None = None):
    """Build (or reuse) a lab folder with torch.utils.cpp_extension.load and return the module.

    Compiles lab_sources(lab_dir) with CXX_FLAGS / NVCC_FLAGS for ensure_arch_list(), with
    ROOT/include and the lab folder on the include path, into `build_dir` (the grader's) or
    notebook_build_dir(). The module is named `labNN_notebook` unless `name` says otherwise.
    `ptxas_report` adds PTXAS_REPORT (visible with verbose=True, which prints the compiler's output).
    The grader (harness.build) and the notebooks both build through here, so a notebook the grader
    runs finds the grader's build up to date: same sources, flags and name.
    """
    from torch.utils.cpp_extension import load

    lab_dir = Path(lab_dir).resolve()
    root = Path(root).resolve()
    ensure_arch_list()
    sources = lab_sources(lab_dir)
    if not sources:
        raise FileNotFoundError(f"{lab_dir} has no .cu or .cpp files to build")
    if os.environ.get(MODULE_ENV):
        ptxas_report = False  # the grader's build has no ptxas report: another flag would rebuild it all
    return load(
        name=name or notebook_module_name(lab_dir),
        sources=[str(s) for s in sources],
        extra_include_paths=[str(root / "include"), str(lab_dir)],
        extra_cflags=list(CXX_FLAGS),
        extra_cuda_cflags=NVCC_FLAGS + (PTXAS_REPORT if ptxas_report else []) + list(extra_cuda_cflags),
        build_directory=str(build_dir or notebook_build_dir(lab_dir, root)),
        verbose=verbose,
    )


_flush_buffers: dict = {}


def flush_l2_cache() -> None:
    """Evict the current GPU's L2: write a buffer twice its size (allocated once per device)."""
    import torch

    device = torch.cuda.current_device()
    if device not in _flush_buffers:
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        _flush_buffers[device] = torch.empty(2 * l2_bytes // 4, dtype=torch.float32, device="cuda")
    _flush_buffers[device].zero_()


def interleaved_median_ms(fns: Sequence[Callable], *, warmup: int = 3, reps: int = 25,
                          flush_l2: bool = True) -> list[float]:
    """Median milliseconds of each callable, timed in turn within each rep (so clock drift hits all).

    `warmup` untimed rounds first; then per rep and callable: the L2 flushed (so a small input
    is not served from cache; flush_l2=False keeps it warm), a CUDA event, the call, a CUDA
    event. One synchronize at the end: the CPU queues ahead, so launch gaps do not count.
    """
    import torch

    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    events: list[list] = [[] for _ in fns]
    for _ in range(reps):
        for fn, timed in zip(fns, events):
            if flush_l2:
                flush_l2_cache()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            timed.append((start, end))
    torch.cuda.synchronize()
    return [statistics.median(start.elapsed_time(end) for start, end in timed) for timed in events]


def median_ms(fn: Callable, *, warmup: int = 3, reps: int = 25, flush_l2: bool = True) -> float:
    """Median milliseconds of fn(): CUDA events, a warm-up, the L2 flushed before each timed call
    (flush_l2=False keeps it warm), the median of `reps` runs."""
    return interleaved_median_ms([fn], warmup=warmup, reps=reps, flush_l2=flush_l2)[0]


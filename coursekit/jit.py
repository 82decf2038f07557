"""The build flags, the arch rule, the notebook build and the CUDA-event timer, in one place.

The grader (harness's `build.py`, `perf.py`) and every lab notebook use this module, so a notebook
compiles and times a lab the way `./course grade` does. It needs only the standard library
and torch, and nothing of the harness (whose `__init__` imports pytest), so a notebook can
import it on its own:

    sys.path.insert(0, str(ROOT))  # the repository root (./course puts it on PYTHONPATH for its children)
    from coursekit import jit
    lab = jit.load_lab(LAB_DIR, ROOT)
    ms = jit.median_ms(lambda: lab.scale(x, 1.5))
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Callable, Sequence

from . import trees

CXX_FLAGS = ["-O3", "-std=c++17"]
# -lineinfo maps SASS back to source lines for Nsight Compute and compute-sanitizer at no speed cost.
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo"]
# ptxas's report, one line per kernel: registers, spills, shared memory (shown when load() is verbose).
PTXAS_REPORT = ["-Xptxas=-v"]
# Files of a lab folder that the build compiles.
SOURCE_SUFFIXES = (".cu", ".cpp")


# ---------------------------------------------------------------- simulating an older GPU
# COURSE_TARGET_ARCH=7.5 (8.0, 8.6, 8.9) runs the course as it would run on that GPU, on a newer one: the build is
# PTX for that compute capability alone (the driver JIT-compiles it for the GPU present, so the device code is the
# code that GPU would run: no cp.async below 8.0, no wgmma below 9.0), and the limits below stand in for the real
# GPU's in the kernels' host code (include/course/target.h reads them from COURSE_TARGET_LIMITS, which this module
# sets): the compute capability the launchers dispatch on, the shared memory a block may opt in to (a kernel that
# asks for more fails as it would there), SMs, threads and blocks per SM, L2. Speed is not measured in this mode.
# Each row is one real GPU of that capability, from NVIDIA's data sheets and the CUDA programming guide's tables.
TARGET_ARCH_ENV, TARGET_LIMITS_ENV = trees.TARGET_ARCH_ENV, "COURSE_TARGET_LIMITS"
KiB, MiB = 1024, 1024 * 1024
TARGET_GPUS = {
    "7.5": {"name": "Tesla T4", "sms": 40, "threads_per_sm": 1024, "blocks_per_sm": 16,
            "shared_per_block_optin": 64 * KiB, "shared_per_sm": 64 * KiB, "l2_bytes": 4 * MiB},
    "8.0": {"name": "A100", "sms": 108, "threads_per_sm": 2048, "blocks_per_sm": 32,
            "shared_per_block_optin": 163 * KiB, "shared_per_sm": 164 * KiB, "l2_bytes": 40 * MiB},
    "8.6": {"name": "GeForce RTX 3090", "sms": 82, "threads_per_sm": 1536, "blocks_per_sm": 16,
            "shared_per_block_optin": 99 * KiB, "shared_per_sm": 100 * KiB, "l2_bytes": 6 * MiB},
    "8.9": {"name": "GeForce RTX 4090", "sms": 128, "threads_per_sm": 1536, "blocks_per_sm": 24,
            "shared_per_block_optin": 99 * KiB, "shared_per_sm": 100 * KiB, "l2_bytes": 72 * MiB},
}


def simulated_arch() -> str | None:
    """The compute capability COURSE_TARGET_ARCH names ("7.5"), or None; an unknown one is an error that lists
    the known ones."""
    arch = os.environ.get(TARGET_ARCH_ENV, "").strip()
    if not arch:
        return None
    if arch not in TARGET_GPUS:
        raise ValueError(f"{TARGET_ARCH_ENV}={arch!r}: the course simulates compute capability "
                         f"{', '.join(TARGET_GPUS)} ({', '.join(g['name'] for g in TARGET_GPUS.values())}); "
                         "unset it to run as the GPU present")
    return arch


def target_limits_text(arch: str) -> str:
    """COURSE_TARGET_LIMITS for `arch`: "major=7;minor=5;sms=40;...", what include/course/target.h parses."""
    major, minor = arch.split(".")
    numbers = {key: value for key, value in TARGET_GPUS[arch].items() if isinstance(value, int)}
    return ";".join(f"{key}={value}" for key, value in {"major": major, "minor": minor, **numbers}.items())


def publish_target_limits() -> str | None:
    """Set COURSE_TARGET_LIMITS from COURSE_TARGET_ARCH (before any lab's library asks for an attribute: it reads
    the variable once), or clear it; return the simulated arch."""
    arch = simulated_arch()
    if arch:
        os.environ[TARGET_LIMITS_ENV] = target_limits_text(arch)
    else:
        os.environ.pop(TARGET_LIMITS_ENV, None)
    return arch


def capability() -> tuple[int, int]:
    """The compute capability the course runs as: the simulated one (COURSE_TARGET_ARCH), else the GPU's. What every
    grader and notebook asks instead of torch.cuda.get_device_capability, so all of them agree with the kernels'
    host code (course::device_attribute)."""
    arch = simulated_arch()
    if arch:
        major, minor = arch.split(".")
        return int(major), int(minor)
    import torch

    return torch.cuda.get_device_capability()


def shared_bytes_per_block_optin() -> int:
    """The dynamic shared memory a block may opt in to on the GPU the course runs as (simulated or real)."""
    import torch

    real = torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin
    arch = simulated_arch()
    return min(real, TARGET_GPUS[arch]["shared_per_block_optin"]) if arch else real


publish_target_limits()


def default_arch_list() -> str:
    """The GPU present (so nvcc compiles one target, fast), else sm_90a as a compile check; when simulating an older
    GPU, PTX for its compute capability alone ("7.5+PTX": no image the GPU present could run natively).
    Compute capability 9.0 builds for 9.0a, the target that has Hopper's wgmma (lab 05)."""
    import torch

    arch = simulated_arch()
    if arch:
        return f"{arch}+PTX"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return "9.0a" if (major, minor) == (9, 0) else f"{major}.{minor}"
    return "9.0a"


def ensure_arch_list() -> str:
    """Set TORCH_CUDA_ARCH_LIST to default_arch_list() unless it is set already (a simulation sets it whatever it
    was: its PTX-only build is what makes the device code the older GPU's); return it."""
    if simulated_arch():
        os.environ["TORCH_CUDA_ARCH_LIST"] = default_arch_list()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_arch_list())
    return os.environ["TORCH_CUDA_ARCH_LIST"]


def lab_sources(lab_dir: str | Path) -> list[Path]:
    """Every .cu and .cpp file of a lab folder, sorted: what the build compiles (with the sources
    of the labs it depends on: dependency_sources)."""
    return sorted(p for p in Path(lab_dir).iterdir() if p.suffix in SOURCE_SUFFIXES)


# A lab that ships other labs' kernels (lab 09 registers lessons 06-08's ops) names their folders,
# one a line, in this file; '#' starts a comment. Their sources are compiled into it from their
# own folders (no copies), except their Python binding.
DEPENDS_FILE = "depends.txt"
PYTHON_BINDING = "module.cpp"


def lab_dependencies(lab_dir: str | Path) -> list[Path]:
    """The lab folders `lab_dir`/depends.txt names, next to it in the same tree."""
    lab_dir = Path(lab_dir)
    listing = lab_dir / DEPENDS_FILE
    if not listing.is_file():
        return []
    names = [line.split("#", 1)[0].strip() for line in listing.read_text().splitlines()]
    folders = [lab_dir.parent / name for name in names if name]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        raise FileNotFoundError(f"{listing} names lab folders that do not exist: {', '.join(missing)}")
    return folders


def dependency_sources(lab_dir: str | Path) -> list[Path]:
    """The sources of the labs lab_dir depends on, without their PYTHON_BINDING: what the
    CMake and wheel builds of lab 09 compile beside its own sources."""
    return [src for dep in lab_dependencies(lab_dir) for src in lab_sources(dep) if src.name != PYTHON_BINDING]


def dependency_stubs(lab_dir: str | Path, build_dir: str | Path) -> list[Path]:
    """One-line files in build_dir/deps that #include each dependency source, named labNN_<file>.

    load() names each object after its source's file name alone, so three labs' wrapper.cpp would
    all compile to wrapper.o; a stub gives each a name of its own. The #include keeps the real file
    the one compiled (errors name it, and ninja's depfile tracks it: edit it and it rebuilds), and
    its quoted includes resolve next to it. The path is relative to the stub, so every clone writes
    the same stub (a compiler cache then hits); a stub is rewritten only when its text changes."""
    folder = Path(build_dir) / "deps"
    folder.mkdir(parents=True, exist_ok=True)
    stubs = []
    for src in dependency_sources(lab_dir):
        stub = folder / f"lab{src.parent.name[:2]}_{src.name}"
        text = f'#include "{os.path.relpath(src.resolve(), folder.resolve())}"  // generated by coursekit/jit.py\n'
        if not stub.is_file() or stub.read_text() != text:
            stub.write_text(text)
        stubs.append(stub)
    return stubs


# A lab that compiles against a header-only library from outside the repository names it, one a line, in this
# file ('#' starts a comment). Known names: `cutlass` (lab 10: CUTLASS's and CuTe's headers from the pinned
# nvidia-cutlass wheel, coursekit/cutlass.py, which installs it on first use from .whl/ or PyPI).
HEADERS_FILE = "headers.txt"
KNOWN_HEADER_PACKAGES = ("cutlass",)


def lab_header_packages(lab_dir: str | Path) -> list[str]:
    """The names `lab_dir`/headers.txt lists (none without the file); an unknown name is an error."""
    listing = Path(lab_dir) / HEADERS_FILE
    if not listing.is_file():
        return []
    names = [line.split("#", 1)[0].strip() for line in listing.read_text().splitlines()]
    names = [name for name in names if name]
    unknown = [name for name in names if name not in KNOWN_HEADER_PACKAGES]
    if unknown:
        raise ValueError(f"{listing} names header packages the course does not know: {', '.join(unknown)} "
                         f"(known: {', '.join(KNOWN_HEADER_PACKAGES)})")
    return names


def lab_include_paths(lab_dir: str | Path, root: str | Path) -> list[Path]:
    """The include folders of the packages lab_dir's headers.txt names, installed if missing: coursekit/NAME.py
    (cutlass.py) needs only the standard library, so a notebook gets the same folders the grader does. `root` is
    the checkout the caller builds against (one checkout's coursekit is this one)."""
    import importlib

    paths: list[Path] = []
    for name in lab_header_packages(lab_dir):
        module = importlib.import_module(f"{__package__}.{name}")
        paths.extend(module.include_dirs())
    return paths


def drop_python_rpath() -> None:
    """For a setuptools build of a library that links no libpython (lab 09's wheels): a python built with
    --enable-shared (pyenv's) links extensions with -rpath to its own lib folder, a RUNPATH naming the build
    machine's python that the library has no use for. Drops it from LDSHARED, unless LDSHARED is set already."""
    import sysconfig

    ldshared = sysconfig.get_config_var("LDSHARED")
    if ldshared:
        os.environ.setdefault("LDSHARED", " ".join(a for a in ldshared.split() if not a.startswith("-Wl,-rpath")))


def is_op_library(sources: Sequence[Path]) -> bool:
    """A lab without a PYBIND11_MODULE is an op library: its ops register with the dispatcher
    (TORCH_LIBRARY) when the shared library is loaded, and there is no Python module to import."""
    return not any("PYBIND11_MODULE" in src.read_text(errors="replace") for src in sources)


# Set by the grader when it executes a notebook (harness.notebooks): the build folder and module
# name of the lab it has just built, so the notebook's load() finds that build up to date instead
# of compiling the lab a second time.
BUILD_DIR_ENV, MODULE_ENV = "COURSE_JIT_BUILD_DIR", "COURSE_JIT_MODULE"


def notebook_build_dir(lab_dir: str | Path, root: str | Path) -> Path:
    """ROOT/build/notebook/<tree>/<lab>, e.g. build/notebook/labs/00-first-kernel (created), or the
    grader's own build folder when it runs the notebook."""
    lab_dir = Path(lab_dir)
    kind = trees.simulated_folder("notebook")  # a simulation's build beside the real one
    path = Path(os.environ.get(BUILD_DIR_ENV) or Path(root) / "build" / kind / lab_dir.parent.name / lab_dir.name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def notebook_module_name(lab_dir: str | Path) -> str:
    """`labNN_notebook`, or the grader's module name when it runs the notebook."""
    return os.environ.get(MODULE_ENV) or f"lab{Path(lab_dir).name[:2]}_notebook"


def load_lab(lab_dir: str | Path, root: str | Path, *, name: str | None = None, ptxas_report: bool = False,
             extra_cuda_cflags: Sequence[str] = (), verbose: bool = False, build_dir: str | Path | None = None):
    """Build (or reuse) a lab folder with torch.utils.cpp_extension.load and return the module
    (the library's path for an op library, is_op_library: lab 09).

    Compiles lab_sources(lab_dir) with CXX_FLAGS / NVCC_FLAGS for ensure_arch_list(), with
    ROOT/include, the lab folder and its headers.txt packages (lab_include_paths) on the include path,
    into `build_dir` (the grader's) or notebook_build_dir(). The module is named `labNN_notebook` unless
    `name` says otherwise.
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
    build_dir = Path(build_dir or notebook_build_dir(lab_dir, root))
    build_dir.mkdir(parents=True, exist_ok=True)
    python_module = not is_op_library(sources)
    return load(
        name=name or notebook_module_name(lab_dir),
        sources=[str(s) for s in sources + dependency_stubs(lab_dir, build_dir)],
        extra_include_paths=[str(root / "include"), str(lab_dir), *map(str, lab_include_paths(lab_dir, root))],
        extra_cflags=list(CXX_FLAGS),
        extra_cuda_cflags=NVCC_FLAGS + (PTXAS_REPORT if ptxas_report else []) + list(extra_cuda_cflags),
        build_directory=str(build_dir),
        verbose=verbose,
        # An op library (lab 09) is loaded with torch.ops.load_library, and load() returns its path.
        is_python_module=python_module,
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


def free_flush_buffers() -> None:
    """Let the flush buffers go (a session's end): allocated after a larger tensor was freed, one is carved from that
    tensor's cached segment and keeps all of it reserved (conftest.py's lock release)."""
    _flush_buffers.clear()


def interleaved_median_ms(fns: Sequence[Callable], *, warmup: int = 3, reps: int = 25,
                          flush_l2: bool = True, before_rep: Callable | None = None) -> list[float]:
    """Median milliseconds of each callable, timed in turn within each rep (so clock drift hits all).

    `warmup` untimed rounds first; then per rep and callable: the L2 flushed (so a small input
    is not served from cache; flush_l2=False keeps it warm), a CUDA event, the call, a CUDA
    event. One synchronize at the end: the CPU queues ahead, so launch gaps do not count.
    `before_rep`, if given, runs untimed before every round, warm-ups included (the grader gives the inputs new
    values there, so that no call can return an earlier call's result).
    """
    import torch

    for _ in range(warmup):
        if before_rep:
            before_rep()
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    events: list[list] = [[] for _ in fns]
    for _ in range(reps):
        if before_rep:
            before_rep()
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


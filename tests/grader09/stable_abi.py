"""Lab 09's stable-ABI build (<tree>/09-custom-ops/stable/): one wheel, built once, loaded by two torch versions.

Not a test_*.py file: the lab's grader, tests/test_09_custom_ops.py, imports the test_stable_* functions from
here (`from grader09.stable_abi import *` brings exactly those, see __all__); `pytest tests/grader09/stable_abi.py`
also runs them. They need no fixture: the wheel, its installed copies and the second torch are made by cached
functions, once per process, so importing the functions is enough (the wheel's build may start early, beside
the lab's other tests: start_early).

  - the wheel builds from the graded tree (its stable/ folder, given code, and its lesson 06 kernel) into that tree's
    own folder, build/stable-abi/<tree tag>/09-custom-ops/ (stable_tools.build_wheel: reused while its sources are
    the same, made under the folder's lock and renamed into place whole), is tagged abi3, and its library
    needs only libtorch_cpu.so (the stable C shim) and the C/C++ runtimes: no libpython, no libtorch_python,
    no libtorch_cuda, no libcudart.so (static), and only C shim symbols from torch;
  - in this process's torch: import course_stable_ops registers course_stable::bias_gelu with its schema, the
    fake kernel gives x's shape, dtype and contiguous strides under FakeTensorMode (and on meta tensors), and
    a CPU tensor is refused by the dispatcher;
  - the same wheel file installed into a second torch (2.10, stable_tools.second_torch(): a cached venv; the
    first run downloads it) and into this one reports the same schema and fake results
    (check_registration.py, a subprocess each);
  - on a GPU: lesson 06's forward through the stable op against F.gelu(x + bias) in float64, with lab 06's own
    forward check (tolerances, the flash rule), and the host function's input checks.
CPU cost: one wheel build (19 to 51 s cold on 2 cores, by the load) and, on a machine without the second torch, its venv
(3 min, 3 GB from PyPI), made only under CI, when COURSE_SECOND_TORCH is set, or when it exists already (a
student's grade skips the test, saying how to make it). COURSE_SECOND_TORCH=none always skips it (with a reason);
COURSE_STABLE_WHEEL=path tests that wheel instead of building one (e.g. a wheel built elsewhere, on a GPU box).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import torch

import harness
from coursekit import trees
from harness import background, requires_gpu, todos
from harness.check import dtype_name, shape_id

LAB = trees.find_lab("09")
# The course's build tool (given code: the grader runs the course's copy, on the graded tree's sources).
TOOLS_FILE = LAB.dir_in(trees.resolve_tree("solutions")) / "stable" / "stable_tools.py"
# The lesson 06 files whose TODOs the stable op's output depends on: its forward kernel and the GELU it inlines.
LESSON06_KERNEL_FILES = ("forward.cu", "gelu.cuh")
SCHEMA = 'course_stable::bias_gelu(Tensor x, Tensor bias, str approximate="none") -> Tensor'
CPU_REFUSAL = "Could not run 'course_stable::bias_gelu' with arguments from the 'CPU' backend"
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
FAKE_SHAPES = [(1,), (31,), (2, 33), (3, 5, 4097), (0, 8)]
# What the library may link: the stable C shim's home and the C/C++ runtimes. Everything else is a failure,
# named: libtorch_python and libpython (not abi3-clean), libtorch_cuda/libc10_cuda (no load in a CPU-only
# torch), libcudart.so (the runtime is static), libc10/libtorch (C++ ABI, not the stable shim).
ALLOWED_NEEDED = {"libtorch_cpu.so", "libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6",
                  "ld-linux-x86-64.so.2", "libdl.so.2", "librt.so.1", "libpthread.so.0"}
# Undefined symbols of the library that are torch's: the stable C shim's, and nothing mangled (C++).
SHIM_SYMBOL = re.compile(r"^(aoti_torch_|torch_)\w+$")

__all__ = ["test_stable_wheel_builds", "test_stable_library_dependencies", "test_stable_registers_in_this_torch",
           "test_stable_same_wheel_in_second_torch", "test_stable_matches_gelu_on_gpu",
           "test_stable_input_checks_on_gpu"]


_LOADING = threading.Lock()


def _stable_tools():
    """stable_tools.py, loaded by path once. The lock: a test and the build started early both ask, and a module is
    in sys.modules before its body has run (so a second thread could find it half made)."""
    with _LOADING:
        module = sys.modules.get("course_stable_tools")
        if module is None:
            spec = importlib.util.spec_from_file_location("course_stable_tools", TOOLS_FILE)
            module = importlib.util.module_from_spec(spec)
            sys.modules["course_stable_tools"] = module
            spec.loader.exec_module(module)
        return module


@background.once
def stable_wheel(tree: trees.Tree) -> Path:
    """The wheel: COURSE_STABLE_WHEEL, or the one built from the tree's stable/ folder into the tree's own build
    folder (reused while its sources are the same)."""
    given = os.environ.get("COURSE_STABLE_WHEEL")
    if given:
        return Path(given).resolve()
    wheel, seconds = _stable_tools().build_wheel(LAB.dir_in(tree) / "stable", LAB.build_dir(tree, "stable-abi"))
    if seconds is not None:
        print(f"[lab09] built {wheel.name} from {LAB.dir_in(tree)}/stable in {seconds:.1f} s")
    return wheel


def start_early() -> None:
    """Start the wheel's build now, in a thread (background.once): test_09_custom_ops.py calls this when the
    session has selected these tests, so the build runs while the others do."""
    _stable_tools()  # loaded here, with the modules it loads, before a second thread needs them
    stable_wheel.start(trees.resolve_tree())


@functools.lru_cache(maxsize=None)
def installed(tree: trees.Tree, python: str) -> Path:
    """stable_wheel(tree) installed by `python`'s pip into the tree's build folder (--no-deps)."""
    return _stable_tools().install_wheel(stable_wheel(tree), python, LAB.build_dir(tree, "stable-abi"))


@functools.lru_cache(maxsize=None)
def stable_ops(tree: trees.Tree):
    """course_stable_ops imported into this process from its installed copy: registers the op."""
    site = str(installed(tree, sys.executable))
    if site not in sys.path:
        sys.path.insert(0, site)
    import course_stable_ops

    return course_stable_ops


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} (binutils) is not on PATH: the dependency check reads the library with it"
    return path


def _library_bytes(wheel: Path, tmp_path: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if re.fullmatch(r"course_stable_ops/_C\.abi3\.so", n)]
        assert names, f"{wheel.name} has no course_stable_ops/_C.abi3.so; it holds {archive.namelist()}"
        return Path(archive.extract(names[0], tmp_path))


# ---------------------------------------------------------------- CPU: the wheel and its library
def test_stable_wheel_builds():
    wheel = stable_wheel(trees.resolve_tree())
    assert wheel.is_file(), f"no wheel at {wheel}"
    assert re.fullmatch(r"course_stable_ops-[\w.]+-cp3\d+-abi3-linux_x86_64\.whl", wheel.name), \
        f"{wheel.name}: expected a course_stable_ops wheel tagged cpXY-abi3 (setup.py's bdist_wheel py_limited_api)"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for name in ("course_stable_ops/__init__.py", "course_stable_ops/_C.abi3.so"):
        assert name in names, f"{wheel.name} lacks {name}; it holds {sorted(names)}"


def test_stable_library_dependencies(tmp_path):
    library = _library_bytes(stable_wheel(trees.resolve_tree()), tmp_path)
    dynamic = subprocess.run([_tool("readelf"), "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    assert "libtorch_cpu.so" in needed, f"the library does not link libtorch_cpu.so (the stable shim): {needed}"
    extra = needed - ALLOWED_NEEDED
    assert not extra, (f"{library.name} needs {sorted(extra)} at load time; allowed: {sorted(ALLOWED_NEEDED)} "
                       "(setup.py: extension.libraries, the static CUDA runtime)")
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic, \
        f"{library.name} carries a build machine's library path:\n{dynamic}"
    undefined = subprocess.run([_tool("nm"), "-D", "--undefined-only", str(library)], capture_output=True,
                               text=True, check=True).stdout.split()
    symbols = {s for s in undefined if len(s) > 1 and not s.startswith("_Z") and "@" not in s}
    torch_cxx = [s for s in undefined if re.match(r"_ZN?K?(3c10|2at|5torch)", s)]
    assert not torch_cxx, f"{library.name} calls torch's C++ API, which has no stable ABI: {torch_cxx[:10]}"
    # The C++ runtime's own entry points (__cxa_*, __gxx_*) come from libstdc++, which every C++ library needs: the
    # GPU box's nm printed __cxa_pure_virtual without its @CXXABI version, so the version filter above missed it.
    not_shim = sorted(s for s in symbols if not SHIM_SYMBOL.match(s)
                      and not s.startswith(("_ITM_", "__gmon", "__cxa_", "__gxx_")))
    assert not not_shim, f"{library.name} needs symbols that are not the stable C shim's: {not_shim[:20]}"


# ---------------------------------------------------------------- CPU: this torch
def _expected_stride(shape):
    return torch.empty(shape, device="meta").stride()


def test_stable_registers_in_this_torch():
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = stable_ops(trees.resolve_tree())
    assert hasattr(torch.ops.course_stable, "bias_gelu"), "import course_stable_ops did not register the op"
    schema = str(torch.ops.course_stable.bias_gelu.default._schema)
    assert schema == SCHEMA, f"schema {schema!r}, expected {SCHEMA!r}"
    assert ops.bias_gelu is torch.ops.course_stable.bias_gelu
    for dtype in DTYPES:
        for shape in FAKE_SHAPES:
            case = f"fake course_stable::bias_gelu of x {shape_id(shape)} {dtype_name(dtype)}"
            with FakeTensorMode():
                x = torch.empty(shape, dtype=dtype, device="cuda")
                bias = torch.empty(shape[-1:], dtype=dtype, device="cuda")
                y = torch.ops.course_stable.bias_gelu(x, bias, "tanh")
            assert (tuple(y.shape), y.dtype, y.device) == (shape, dtype, x.device), \
                f"{case}: got {tuple(y.shape)} {y.dtype} on {y.device}"
            assert y.stride() == _expected_stride(shape), f"{case}: strides {y.stride()}, not contiguous"
            meta = torch.ops.course_stable.bias_gelu(torch.empty(shape, dtype=dtype, device="meta"),
                                                     torch.empty(shape[-1:], dtype=dtype, device="meta"))
            assert (tuple(meta.shape), meta.dtype, meta.stride()) == (shape, dtype, _expected_stride(shape)), \
                f"{case} on meta tensors: got {tuple(meta.shape)} {meta.dtype} strides {meta.stride()}"
    with pytest.raises(NotImplementedError) as refused:
        torch.ops.course_stable.bias_gelu(torch.ones(2, 3), torch.ones(3))
    assert CPU_REFUSAL in str(refused.value), f"a CPU x: expected {CPU_REFUSAL!r}, got {str(refused.value)[:300]}"


# ---------------------------------------------------------------- CPU: the same wheel in another torch
def test_stable_same_wheel_in_second_torch():
    tools = _stable_tools()
    if tools.SECOND_TORCH == "none":
        pytest.skip("COURSE_SECOND_TORCH=none: the second torch is not made on this machine")
    made = (tools.second_torch_dir() / ".installed").exists()
    if not (made or os.environ.get("CI") or os.environ.get("COURSE_SECOND_TORCH")):
        # A student's `./course grade 09` should not start a 3 GB download: CI makes the second torch
        # before the suite (.ci/run), anyone else asks for it.
        pytest.skip(f"the second torch ({tools.SECOND_TORCH}) is not on this machine: make it with "
                    "`./course run solutions/09-custom-ops/stable/stable_tools.py second-torch` (about 3 GB, once) "
                    f"or set "
                    f"COURSE_SECOND_TORCH={tools.SECOND_TORCH}, then grade again")
    second, tree = str(tools.second_torch()), trees.resolve_tree()
    here = tools.run_check(sys.executable, installed(tree, sys.executable))
    there = tools.run_check(second, installed(tree, second))
    versions = (here["torch"], there["torch"])
    assert here["torch"].split(".")[:2] != there["torch"].split(".")[:2], f"both pythons run torch {versions}"
    for report in (here, there):
        where = f"torch {report['torch']}"
        assert report["registered"], f"{where}: import course_stable_ops registered no course_stable::bias_gelu"
        assert report["schema"] == SCHEMA, f"{where}: schema {report['schema']!r}, expected {SCHEMA!r}"
        assert report["cpu_error"] and CPU_REFUSAL in report["cpu_error"], \
            f"{where}: a CPU tensor gave {report['cpu_error']!r}, expected {CPU_REFUSAL!r}"
        for row in report["fake"]:
            expected = (row["x"], row["dtype"], list(_expected_stride(row["x"])), True)
            assert (row["shape"], row["out_dtype"], row["stride"], row["contiguous"]) == expected, \
                f"{where}: fake output for x {row['x']} {row['dtype']}: {row}"
    assert here["fake"] == there["fake"], f"the fake results differ between torch {versions[0]} and {versions[1]}"
    # Both loaded the very same file's bytes: one wheel, two torch versions.
    assert Path(here["library"]).read_bytes() == Path(there["library"]).read_bytes()


# ---------------------------------------------------------------- GPU: the kernel through the stable op
def _skip_while_lesson06_kernel_is_a_todo() -> None:
    """The stable op runs the graded tree's lesson 06 forward kernel: while its TODOs are open (the skeleton in
    labs/), its outputs say nothing of lab 09's given code, and lab 06's grader grades them."""
    tree = trees.resolve_tree()
    lesson06 = trees.find_lab("06")
    open_todos = [str(todo) for todo in todos.open_todos(lesson06, tree) if todo.file in LESSON06_KERNEL_FILES]
    if open_todos:
        pytest.skip(f"the stable op runs {lesson06.dir_in(tree)}'s forward kernel, whose TODOs are open "
                    f"({'; '.join(open_todos[:3])}): `./course grade 06` grades them; this check runs once they "
                    "are done")


GPU_SHAPES = [(1, 1), (3, 31), (5, 33), (2, 4097), (2, 3, 33), (64, 4096)]


@requires_gpu
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_stable_matches_gelu_on_gpu(shape, dtype, approximate):
    """Lab 06's own forward check (tests/grader06/common.py: float64 golden, dtype tolerances, the
    flash rule for 16-bit outputs) on the stable op's output, which comes from a poisoned pool."""
    from grader06 import common as lab06

    _skip_while_lesson06_kernel_is_a_todo()
    stable_ops(trees.resolve_tree())
    x, bias, _ = lab06.inputs(shape, dtype)
    case = f"course_stable::bias_gelu of x {shape_id(shape)} {dtype_name(dtype)}, approximate={approximate!r}"
    with harness.check.PoisonedPool(large_bytes=0) as pool:
        y = torch.ops.course_stable.bias_gelu(x, bias, approximate)
    pool.assert_no_spill(y, name="y", case=case)
    torch.cuda.synchronize()
    lab06.check_forward(y, x, bias, approximate, case=case)


@requires_gpu
def test_stable_input_checks_on_gpu():
    """The host function's checks (COURSE_STABLE_CHECK, a string-only STD_TORCH_CHECK): each names the problem,
    and raises instead of crashing the process (STD_TORCH_CHECK itself did, on the GPU box)."""
    stable_ops(trees.resolve_tree())
    op = torch.ops.course_stable.bias_gelu
    x = torch.randn(4, 8, device="cuda")
    bias = torch.randn(8, device="cuda")
    cases = [
        (lambda: op(x, bias.cpu()), ("bias", "CUDA"), "bias on the CPU"),
        (lambda: op(x, bias.double()), ("bias", "float64", "float32"), "bias of another dtype"),
        (lambda: op(x.int(), bias.int()), ("dtype", "int32"), "int32 x"),
        (lambda: op(x, torch.randn(7, device="cuda")), ("shape", "C = x.size(-1) = 8"), "bias of the wrong size"),
        (lambda: op(x.t(), torch.randn(4, device="cuda")), ("contiguous",), "transposed x"),
        (lambda: op(x, bias, "fast"), ("approximate", "fast"), "approximate='fast'"),
    ]
    for call, words, what in cases:
        harness.check.assert_raises_clearly(call, must_mention=words, case=f"course_stable::bias_gelu with {what}")

"""Lab 09's ahead-of-time builds: the CMake op library and the course_ops wheel register the same ops as the JIT build.

Not a test_*.py file: the lab's grader, tests/test_09_custom_ops.py, imports the test_aot_* functions from here;
`pytest tests/grader09/aot.py` also runs them. They need no fixture of their own (an imported function brings none):
the builds are made by cached functions, once per process, started early when the session selects these tests
(start_early, harness/background.py: they run beside the lab's other tests).

Both builds are of the graded tree (its ops.cpp, ops.py, block.py, package/ and the lessons its depends.txt names),
each in a folder of the tree's own (trees.Lab.build_dir: build/aot-cmake/<tree tag>/09-custom-ops and
build/aot-wheel/<tree tag>/09-custom-ops), so runs of different trees never share one; runs of the same tree build
one at a time under the folder's lock, and what they hand over is published whole by a rename (coursekit/folders.py).

  - CMake: the repository's CMakeLists.txt configured for this tree's lab 09 alone (COURSE_TREES=<tag>=<path>,
    COURSE_LABS=09-custom-ops) in <folder>/cmake, then `cmake --build --target course_<tag>_ops`; the library is
    published as <folder>/libcourse_ops.so. It compiles exactly the sources the JIT build compiles (lab 09's, and
    depends.txt's labs' without their module.cpp), and links no libpython and no libtorch_python (readelf -d);
  - the wheel: `pip wheel --no-build-isolation --no-deps` of <tree>/09-custom-ops/package into <folder>/dist-<key>,
    the key a hash of its sources (made once per key); it holds the lab's own ops.py and block.py, byte for byte,
    and an abi3 library without libpython or libtorch_python;
  - each in a subprocess of its own (both define the namespace `course`, which a process can load once):
    torch.ops.load_library + ops.register("course") for the CMake library, `import course_ops` for the wheel
    installed with pip --target. Both give tests/grader09/schemas.py's nine schemas, a CUDA kernel for each op, the
    same fake-tensor results (FakeTensorMode on fake CUDA tensors: no GPU needed), and the dispatcher's own
    refusal of CPU tensors;
  - on a GPU: both give bitwise the outputs of the grader's JIT build of the same tree on the same inputs.

Which trees: solutions always; labs and submissions when CI or COURSE_AOT is set (two more builds of lessons
06-08's kernels: minutes each). Cold builds on a 2-core machine busy with other compiles: the CMake target 2.7 min
(labs) to 6.8 min (solutions), the wheel 2.6 to 5.0 min; warm, the tests take about 25 s. CI builds both for the
solutions before the suite (.ci/run), so lab 09's grading stays inside its deadline.

    ./course run tests/grader09/aot.py wheel [labs|solutions|PATH]   # build (or reuse) the wheel, print its path
    ./course run tests/grader09/aot.py cmake [labs|solutions|PATH]   # build (or reuse) the CMake library
"""
from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # a script (the commands above, the probe's fresh python): import from the course's roots
    # (PYTHONPATH: ./course run, or the probe's environment), not from this folder, whose modules must not shadow others
    _HERE = os.path.realpath(os.path.dirname(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _HERE]

import pytest  # noqa: E402
import torch  # noqa: E402

import harness  # noqa: E402
from coursekit import env as course_env  # noqa: E402
from coursekit import folders, jit, trees  # noqa: E402
from grader09 import schemas  # noqa: E402
from harness import background, requires_gpu  # noqa: E402
from harness import build as lab_build  # noqa: E402

LAB = trees.find_lab("09")
NAMESPACE = "course"  # ops.cpp's COURSE_OPS_NAMESPACE in both ahead-of-time builds
# What an op library must not need: it is loaded into a python that has these already, or into C++.
PYTHON_LIBRARIES = re.compile(r"^lib(python\d|torch_python)")
CPU_REFUSAL = f"Could not run '{NAMESPACE}::bias_gelu' with arguments from the 'CPU' backend"
WHEEL_EXPORTS = ("BlockConfig", "CourseOps", "DecoderBlock", "TorchOps", "torch_ops", "NAMESPACE")
PROBE_PREFIX = "LAB09_PROBE "
# The files of a tree's 09-custom-ops/package that the wheel is made from: given code (no TODO).
PACKAGE_FILES = ("setup.py", "pyproject.toml", "pyinit_stub.cpp", "course_ops/__init__.py")
LIBRARY_NAME = "libcourse_ops.so"

__all__ = ["test_aot_cmake_compiles_the_jit_sources", "test_aot_cmake_library_links_no_python",
           "test_aot_cmake_library_registers_the_ops", "test_aot_wheel_holds_the_lab_files",
           "test_aot_wheel_library_links_no_python", "test_aot_wheel_registers_the_same_ops",
           "test_aot_cmake_matches_jit_on_gpu", "test_aot_wheel_matches_jit_on_gpu"]


# Set to run the ahead-of-time builds when grading labs/ or a submission (CI runs them always).
AOT_ENV = "COURSE_AOT"


def _aot_tree() -> tuple[trees.Tree, str]:
    """The tree under grading, and why its ahead-of-time builds are not checked ("" when they are)."""
    tree = trees.resolve_tree()
    if not tree.is_reference and not (os.environ.get("CI") or os.environ.get(AOT_ENV)):
        # Two more builds of lessons 06-08's kernels (CMake, the wheel): minutes each on a small machine, on
        # top of the JIT build. The edit-grade loop stays on the JIT build; these run when asked.
        return tree, (f"the ahead-of-time builds of your lab (CMake library, wheel) take minutes: run them with "
                      f"{AOT_ENV}=1 ./course grade 09 once your ops pass")
    return tree, ""


def graded_tree() -> trees.Tree:
    """The tree under grading, when its ahead-of-time builds are checked in this run."""
    tree, why_not = _aot_tree()
    if why_not:
        pytest.skip(why_not)
    return tree


def start_early() -> None:
    """Start the CMake library's and the wheel's builds and probes now, each in a thread (background.once): they are
    subprocesses, so they run while the session's other tests do, and each test here then waits for its part.
    test_09_custom_ops.py calls this when the session has selected these tests."""
    tree, why_not = _aot_tree()
    if not why_not:
        probe_once.start("cmake", tree)
        probe_once.start("wheel", tree)


def _tail(path: Path, lines: int = 60) -> str:
    return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def _jobs() -> str:
    return os.environ.get("MAX_JOBS") or str(os.cpu_count() or 2)


def _arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST as the grader sets it (the GPU present, else 9.0a), ';'-separated for CMake."""
    return ";".join(jit.ensure_arch_list().replace(",", " ").replace(";", " ").split())


def _run_logged(command: list[str], log: Path, what: str, **options) -> float:
    """Run `command` with its output in `log`; its seconds, or a failure quoting the log's end."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **options)
    assert done.returncode == 0, f"{what} failed ({log}):\n{_tail(log)}"
    return time.perf_counter() - started


# ---------------------------------------------------------------- the CMake library
@dataclass(frozen=True)
class CMakeBuild:
    library: Path  # the published libcourse_ops.so
    compiled: frozenset  # the source files compile_commands.json compiles into the target


def _cmake_cache(build: Path) -> dict[str, str]:
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return {}
    entries = {}
    for line in cache.read_text(errors="replace").splitlines():
        match = re.match(r"^([A-Za-z_][\w.-]*):[A-Z]+=(.*)$", line)
        if match:
            entries[match.group(1)] = match.group(2)
    return entries


def _python_path() -> str:
    """This python by its folder's real path (.venv is a link to the course's cache): CI's `readlink -f` and the
    grader's .venv/bin/python name one CMake configuration, not two."""
    executable = Path(sys.executable)
    return str(Path(os.path.realpath(executable.parent)) / executable.name)


def _cmake_options(tree: trees.Tree) -> dict[str, str]:
    """The configure options of the tree's lab 09 build: this tree's lab 09 alone, named by its tag."""
    return {"COURSE_PYTHON": _python_path(), "COURSE_CUDA_ARCH": _arch_list(),
            "COURSE_TREES": f"{tree.tag}={tree.path}", "COURSE_LABS": LAB.name, "COURSE_OP_LIBRARIES": "ON"}


def _cmake_compiled_sources(build: Path, target: str) -> frozenset:
    """The files compile_commands.json compiles into the op-library target."""
    commands = json.loads((build / "compile_commands.json").read_text())
    marker = f"/{target}.dir/"
    return frozenset(Path(c["file"]).resolve() for c in commands if marker in c.get("output", c["command"]))


@background.once
def cmake_library(tree: trees.Tree) -> CMakeBuild:
    """The tree's lab 09 op library, built by its target alone in the tree's folder (configured when new, or when
    its options changed), then published as <folder>/libcourse_ops.so."""
    target, folder = f"course_{tree.tag}_ops", LAB.build_dir(tree, "aot-cmake")
    build = folder / "cmake"
    with folders.exclusive(folder):
        options = _cmake_options(tree)
        cache = _cmake_cache(build)
        if any(cache.get(name) != value for name, value in options.items()):
            _run_logged(["cmake", "-S", str(trees.ROOT), "-B", str(build),
                         *(f"-D{name}={value}" for name, value in options.items())],
                        folder / "cmake-configure.log", f"cmake's configure step for {LAB.dir_in(tree)}")
        seconds = _run_logged(["cmake", "--build", str(build), "--target", target, "-j", _jobs()],
                              folder / "cmake-build.log", f"cmake --build --target {target}")
        print(f"[lab09] cmake --build --target {target}: {seconds:.1f} s")
        built = build / tree.tag / LIBRARY_NAME
        assert built.is_file(), f"the {target} target built no {built}"
        made = folders.staging_path(folder / LIBRARY_NAME)
        shutil.copyfile(built, made)
        library = folders.publish_file(made, folder / LIBRARY_NAME)
        return CMakeBuild(library, _cmake_compiled_sources(build, target))


# ---------------------------------------------------------------- the wheel
def wheel_inputs(lab_dir: Path) -> list[tuple[str, Path]]:
    """(name, file) of every file the wheel is made from: the package folder, the lab's sources and Python files,
    the sources and headers of the labs depends.txt names (all of the graded tree, named from the tree's folder),
    the course's headers, and jit.py (setup.py reads its rules)."""
    code = {".cpp", ".cu", ".h", ".cuh"}
    files = [p for p in (lab_dir / "package").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files += [p for p in lab_dir.iterdir() if p.is_file() and (p.suffix in code | {".py"} or p.name == "depends.txt")]
    for dependency in jit.lab_dependencies(lab_dir):
        files += [p for p in dependency.iterdir() if p.is_file() and p.suffix in code]
    named = [(str(p.relative_to(lab_dir.parent)), p) for p in sorted(set(files))]
    named += [(str(p.relative_to(trees.ROOT)), p) for p in sorted(trees.INCLUDE.rglob("*")) if p.is_file()]
    named.append(("coursekit/jit.py", Path(jit.__file__)))
    return named


def wheel_key(lab_dir: Path) -> str:
    return folders.content_key(wheel_inputs(lab_dir), f"torch {torch.__version__} arch {_arch_list()}")


def _wheel_in(dist: Path) -> Path | None:
    found = sorted(dist.glob("course_ops-*.whl"))
    return found[-1] if found else None


@background.once
def wheel(tree: trees.Tree) -> Path:
    """The tree's course_ops wheel, in <folder>/dist-<key>: built with pip unless that folder exists (a dist-<key>
    is published whole, by a rename). Intermediate files stay in <folder>/build (setup.py's COURSE_WHEEL_BUILD), so
    a rebuild is incremental."""
    lab_dir, folder = LAB.dir_in(tree), LAB.build_dir(tree, "aot-wheel")
    folders.require_given_files(lab_dir / "package", PACKAGE_FILES, "the course_ops wheel",
                                "labs/09-custom-ops/package/")
    dist = folder / f"dist-{wheel_key(lab_dir)}"
    with folders.exclusive(folder):
        if _wheel_in(dist) is None:
            staging = folders.staging_path(dist)
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            # wheel's bdist_wheel warns of setuptools' own; COURSE_ROOT: where include/ is; PYTHONPATH: coursekit
            # (setup.py imports coursekit.jit), and bdist_wheel when setuptools (65) has none of its own
            env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning", COURSE_ROOT=str(trees.ROOT),
                       COURSE_WHEEL_BUILD=str(folder / "build"))
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [course_env.bdist_wheel_path(),
                                                              trees.pythonpath(env.get("PYTHONPATH"))]))
            seconds = _run_logged([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check",
                                   "--no-build-isolation", "--no-deps", "-w", str(staging), str(lab_dir / "package")],
                                  folder / "pip-wheel.log", f"pip wheel of {lab_dir / 'package'}", env=env)
            print(f"[lab09] pip wheel {lab_dir}/package: {seconds:.1f} s")
            folders.publish_folder(staging, dist)
            folders.remove_leftovers(folder, "dist-", keep=dist)
    found = _wheel_in(dist)
    assert found, f"pip wheel wrote no course_ops wheel into {dist} ({folder / 'pip-wheel.log'})"
    return found


@background.once
def installed_wheel(tree: trees.Tree) -> Path:
    """wheel(tree) installed with pip --target into <folder>/site-<key> (--no-deps: this torch is the one), made
    once per wheel and renamed into place whole."""
    built = wheel(tree)
    folder = built.parent.parent
    site = folder / f"site-{built.parent.name.removeprefix('dist-')}"
    with folders.exclusive(folder):
        if not site.is_dir():
            staging = folders.staging_path(site)
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                            "--target", str(staging), str(built)], check=True)
            folders.publish_folder(staging, site)
            folders.remove_leftovers(folder, "site-", keep=site)
    return site


def _needed(library: Path) -> list[str]:
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils) is not on PATH: the dependency check reads the library with it"
    text = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)


def _assert_links_no_python(library: Path, what: str) -> None:
    needed = _needed(library)
    assert any(n.startswith("libtorch") for n in needed), f"{what} needs no libtorch*: NEEDED {needed}"
    python = [n for n in needed if PYTHON_LIBRARIES.match(n)]
    assert not python, (f"{what} needs {python} (readelf -d: NEEDED {needed}): an op library registers through "
                        "libtorch alone; libtorch_python comes in by linking ${TORCH_PYTHON_LIBRARY} or Python3 "
                        "(CMake) or by a CUDAExtension without py_limited_api (setup.py)")


# ---------------------------------------------------------------- the probe: one build per subprocess
def _ops_module(lab_dir: Path):
    spec = importlib.util.spec_from_file_location("lab09_ops_under_probe", lab_dir / "ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_build(kind: str, location: str, lab_dir: Path) -> tuple[str, dict]:
    """Load one build into this process; its namespace, and what the loading showed."""
    seen: dict = {}
    if kind == "wheel":
        sys.path.insert(0, location)
        import course_ops

        seen["package_file"] = course_ops.__file__
        seen["exports"] = [name for name in WHEEL_EXPORTS if hasattr(course_ops, name)]
        seen["torch_ops_is_namespace"] = getattr(course_ops, "torch_ops", None) is getattr(torch.ops, NAMESPACE)
        seen["ops_py_file"] = sys.modules["course_ops.ops"].__file__
        return NAMESPACE, seen
    torch.ops.load_library(location)
    namespace = NAMESPACE if kind == "cmake" else Path(location).stem  # the JIT build: the module's name
    _ops_module(lab_dir).register(namespace)
    return namespace, seen


def _metadata(outputs) -> list[dict]:
    tensors = [] if outputs is None else list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return [{"shape": list(t.shape), "dtype": str(t.dtype), "stride": list(t.stride()), "device": str(t.device)}
            for t in tensors]


def run_cases(ops, make) -> dict:
    """Every op on a few inputs: {case: outputs}. `make(shape, dtype)` gives an input (a fake CUDA tensor, or
    seeded random values on the GPU). Backward ops take their forward's outputs, as autograd hands them over."""
    f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
    out = {}
    x, bias = make((5, 7, 33), bf16), make((33,), bf16)
    out["bias_gelu bf16"] = ops.bias_gelu(x, bias)
    out["bias_gelu bf16 tanh"] = ops.bias_gelu(x, bias, "tanh")
    x, bias = make((4, 130), f64), make((130,), f64)
    out["bias_gelu f64"] = ops.bias_gelu(x, bias)
    x, bias, grad = make((9, 258), f32), make((258,), f32), make((9, 258), f32)
    out["bias_gelu_backward f32 tanh"] = ops.bias_gelu_backward(grad, x, bias, "tanh")
    x, weight = make((3, 5, 96), f16), make((96,), f16)
    y, rstd = out["rms_norm f16"] = ops.rms_norm(x, weight, 1e-5)
    out["rms_norm_backward f16"] = ops.rms_norm_backward(make((3, 5, 96), f16), x, weight, rstd)
    written, written_rstd = make((3, 5, 96), f16), make((3, 5), f32)
    ops.rms_norm_out(x, weight, 1e-5, written, written_rstd)
    out["rms_norm_out f16"] = (written, written_rstd)
    out["rms_norm f64"] = ops.rms_norm(make((2, 1000), f64), make((1000,), f64))
    y = out["softmax f32"] = ops.softmax(make((6, 1030), f32))
    out["softmax_backward f32"] = ops.softmax_backward(make((6, 1030), f32), y)
    out["softmax bf16"] = ops.softmax(make((3, 4097), bf16))
    # Attention: q strided ((B, H, S, D) storage seen as (B, S, H, D)), k and v with 2 heads for q's 8 (GQA).
    q = make((2, 8, 65, 64), bf16).transpose(1, 2)
    k, v = make((2, 65, 2, 64), bf16), make((2, 65, 2, 64), bf16)
    o, lse = out["flash_attention bf16 causal gqa"] = ops.flash_attention(q, k, v, True)
    out["flash_attention_backward bf16 causal gqa"] = ops.flash_attention_backward(
        make((2, 65, 8, 64), bf16), q, k, v, o, lse, True, None, True)  # deterministic: bitwise repeatable
    q, k, v = make((1, 33, 4, 128), f16), make((1, 70, 4, 128), f16), make((1, 70, 4, 128), f16)
    out["flash_attention f16 scale"] = ops.flash_attention(q, k, v, False, 0.05)
    return out


def probe(kind: str, location: str, lab_dir: Path, outputs_file: str | None = None) -> dict:
    """What one build registers: schemas, CUDA kernels, fake results, the CPU refusal; with `outputs_file`, the
    ops' real outputs on the GPU saved there (torch.save)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    namespace, report = _load_build(kind, location, lab_dir)
    prefix = f"{namespace}::"
    report["schemas"] = {s.name[len(prefix):]: str(s) for s in torch._C._jit_get_all_schemas()
                         if s.name.startswith(prefix)}
    report["cuda_kernels"] = sorted(name for name in report["schemas"]
                                    if torch._C._dispatch_has_kernel_for_dispatch_key(prefix + name, "CUDA"))
    ops = getattr(torch.ops, namespace)
    with FakeTensorMode():
        results = run_cases(ops, lambda shape, dtype: torch.empty(shape, dtype=dtype, device="cuda"))
        report["fakes"] = {case: _metadata(value) for case, value in results.items()}
    try:
        ops.bias_gelu(torch.ones(2, 3), torch.ones(3))
        report["cpu_refusal"] = "no error"
    except Exception as error:  # the dispatcher's NotImplementedError is expected; anything else is reported
        report["cpu_refusal"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if outputs_file:
        generator = torch.Generator().manual_seed(9)

        def make(shape, dtype):
            return torch.randn(shape, generator=generator).to(dtype).cuda()

        results = run_cases(ops, make)
        torch.cuda.synchronize()
        torch.save({case: [t.cpu() for t in (v if isinstance(v, (tuple, list)) else [v])]
                    for case, v in results.items()}, outputs_file)
    return report


def run_probe(kind: str, location: Path, tree: trees.Tree, outputs_file: Path | None = None) -> dict:
    """probe() in a fresh python (a library defines its namespace once per process)."""
    lab_dir = LAB.dir_in(tree)
    trees.BUILD.mkdir(exist_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "probe", kind, str(location), str(lab_dir)]
    if outputs_file:
        command.append(str(outputs_file))
    done = subprocess.run(command, capture_output=True, text=True, cwd=trees.BUILD,
                          env=dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH"))))
    lines = [line for line in done.stdout.splitlines() if line.startswith(PROBE_PREFIX)]
    assert done.returncode == 0 and lines, (f"loading the {kind} build ({location}) in a fresh python failed "
                                            f"(exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(lines[-1][len(PROBE_PREFIX):])


@functools.lru_cache(maxsize=None)
def _scratch() -> Path:
    """A folder of this process's own (removed at its exit) for what the probes hand back: two runs of one tree
    at once each read their own outputs."""
    folder = Path(tempfile.mkdtemp(prefix="course-lab09-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _outputs_file(kind: str, tree: trees.Tree) -> Path:
    return _scratch() / f"gpu-outputs-{kind}-{tree.tag}.pt"


@background.once
def probe_once(kind: str, tree: trees.Tree) -> dict:
    """One fresh python per ahead-of-time build: what it registers, and on a GPU its outputs too (one process for
    both: a python that imports torch and loads the library takes ~7 s)."""
    location = cmake_library(tree).library if kind == "cmake" else installed_wheel(tree)
    return run_probe(kind, location, tree, _outputs_file(kind, tree) if torch.cuda.is_available() else None)


def cmake_report(tree: trees.Tree) -> dict:
    return probe_once("cmake", tree)


def wheel_report(tree: trees.Tree) -> dict:
    return probe_once("wheel", tree)


# ---------------------------------------------------------------- what every build must register
def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return strides


# {case: [(shape, dtype) of each output]}: the wrappers' allocations (fresh, contiguous, on the input's GPU).
EXPECTED_FAKES = {
    "bias_gelu bf16": [((5, 7, 33), "torch.bfloat16")],
    "bias_gelu bf16 tanh": [((5, 7, 33), "torch.bfloat16")],
    "bias_gelu f64": [((4, 130), "torch.float64")],
    "bias_gelu_backward f32 tanh": [((9, 258), "torch.float32"), ((258,), "torch.float32")],
    "rms_norm f16": [((3, 5, 96), "torch.float16"), ((3, 5), "torch.float32")],
    "rms_norm_backward f16": [((3, 5, 96), "torch.float16"), ((96,), "torch.float16")],
    "rms_norm_out f16": [((3, 5, 96), "torch.float16"), ((3, 5), "torch.float32")],
    "rms_norm f64": [((2, 1000), "torch.float64"), ((2,), "torch.float64")],
    "softmax f32": [((6, 1030), "torch.float32")],
    "softmax_backward f32": [((6, 1030), "torch.float32")],
    "softmax bf16": [((3, 4097), "torch.bfloat16")],
    "flash_attention bf16 causal gqa": [((2, 65, 8, 64), "torch.bfloat16"), ((2, 8, 65), "torch.float32")],
    "flash_attention_backward bf16 causal gqa": [((2, 65, 8, 64), "torch.bfloat16"), ((2, 65, 2, 64), "torch.bfloat16"),
                                                 ((2, 65, 2, 64), "torch.bfloat16")],
    "flash_attention f16 scale": [((1, 33, 4, 128), "torch.float16"), ((1, 4, 33), "torch.float32")],
}


def expected_fakes() -> dict:
    return {case: [{"shape": list(shape), "dtype": dtype, "stride": _contiguous_strides(shape), "device": "cuda:0"}
                   for shape, dtype in outputs] for case, outputs in EXPECTED_FAKES.items()}


def assert_registers_the_ops(report: dict, what: str) -> None:
    expected = schemas.qualified(NAMESPACE)
    got = report["schemas"]
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    assert not missing and not extra, (f"{what} registers {sorted(got)} in torch.ops.{NAMESPACE}; missing {missing}, "
                                       f"unexpected {extra} (ops.cpp's TORCH_LIBRARY block, TODO lab09.1)")
    wrong = {name: f"got {got[name]!r}, expected {expected[name]!r}"
             for name in expected if got[name] != expected[name]}
    assert not wrong, f"{what}: schemas differ from tests/grader09/schemas.py: {wrong}"
    no_kernel = sorted(set(expected) - set(report["cuda_kernels"]))
    assert not no_kernel, (f"{what}: no CUDA kernel bound to {no_kernel} "
                           "(TORCH_LIBRARY_IMPL(..., CUDA, m), TODO lab09.2)")
    want = expected_fakes()
    wrong = {case: {"got": report["fakes"].get(case), "expected": want[case]} for case in want
             if report["fakes"].get(case) != want[case]}
    assert not wrong, f"{what}: fake-tensor results differ (ops.py's register_fake, TODO lab09.3): {wrong}"
    assert report["cpu_refusal"].startswith(f"NotImplementedError: {CPU_REFUSAL}"), (
        f"{what}: a CPU tensor must be refused by the dispatcher ({CPU_REFUSAL!r}: a CUDA kernel only), got "
        f"{report['cpu_refusal']!r}")


# ---------------------------------------------------------------- CPU tests
@harness.reference_check
def test_aot_cmake_compiles_the_jit_sources():
    """The CMake target compiles what the JIT build compiles: lab 09's sources and the sources of the labs its
    depends.txt names, without their module.cpp (CMakeLists.txt reads the same file)."""
    tree = graded_tree()
    lab_dir = LAB.dir_in(tree)
    expected = {p.resolve() for p in jit.lab_sources(lab_dir) + jit.dependency_sources(lab_dir)}
    got = cmake_library(tree).compiled
    assert got == expected, (f"course_{tree.tag}_ops compiles {sorted(map(str, got - expected))} that the JIT build "
                             f"does not, and not {sorted(map(str, expected - got))}")


@harness.reference_check
def test_aot_cmake_library_links_no_python():
    """libcourse_ops.so needs libtorch and neither libpython nor libtorch_python (readelf -d)."""
    tree = graded_tree()
    library = cmake_library(tree).library
    _assert_links_no_python(library, str(library))


@harness.tasks("lab09.1", "lab09.2", "lab09.3")
def test_aot_cmake_library_registers_the_ops():
    """torch.ops.load_library(libcourse_ops.so) + ops.register("course"): the nine schemas, a CUDA kernel each,
    the fakes' shapes, dtypes and strides on fake CUDA tensors, and the dispatcher's refusal of CPU tensors."""
    tree = graded_tree()
    assert_registers_the_ops(cmake_report(tree), f"course_{tree.tag}_ops (CMake)")


@harness.reference_check
def test_aot_wheel_holds_the_lab_files():
    """The wheel is abi3 and holds the package, the library, and the lab's own ops.py and block.py byte for byte
    (copied at build time: one source each)."""
    tree = graded_tree()
    built = wheel(tree)
    assert re.fullmatch(r"course_ops-[\w.]+-cp3\d+-abi3-linux_x86_64\.whl", built.name), (
        f"{built.name}: expected a course_ops wheel tagged cpXY-abi3 (setup.py's py_limited_api)")
    lab_dir = LAB.dir_in(tree)
    with zipfile.ZipFile(built) as archive:
        names = set(archive.namelist())
        for name in ("course_ops/__init__.py", "course_ops/_C.abi3.so", "course_ops/ops.py", "course_ops/block.py"):
            assert name in names, f"{built.name} lacks {name}; it holds {sorted(names)}"
        for name in ("ops.py", "block.py"):
            assert archive.read(f"course_ops/{name}") == (lab_dir / name).read_bytes(), (
                f"{built.name}'s course_ops/{name} is not {lab_dir / name} (setup.py's BuildPy copies it)")


@harness.reference_check
def test_aot_wheel_library_links_no_python(tmp_path):
    """The wheel's _C.abi3.so needs libtorch and neither libpython nor libtorch_python (py_limited_api)."""
    tree = graded_tree()
    with zipfile.ZipFile(wheel(tree)) as archive:
        library = Path(archive.extract("course_ops/_C.abi3.so", tmp_path))
    _assert_links_no_python(library, f"the wheel's {library.name}")


@harness.tasks("lab09.1", "lab09.2", "lab09.3")
def test_aot_wheel_registers_the_same_ops():
    """pip install --target of the wheel, then `import course_ops` in a fresh python: the same schemas, kernels,
    fake results and CPU refusal as the CMake library, the package's exports, and ops.py from the install."""
    tree = graded_tree()
    site = installed_wheel(tree)
    report = wheel_report(tree)
    assert_registers_the_ops(report, "the installed wheel")
    assert Path(report["package_file"]).resolve().is_relative_to(site.resolve()), (
        f"import course_ops found {report['package_file']}, not the installed copy in {site}")
    assert Path(report["ops_py_file"]).resolve().is_relative_to(site.resolve()), report["ops_py_file"]
    assert report["exports"] == list(WHEEL_EXPORTS), f"course_ops exports {report['exports']}, expected {WHEEL_EXPORTS}"
    assert report["torch_ops_is_namespace"], "course_ops.torch_ops is not torch.ops.course"
    cmake = cmake_report(tree)
    for key in ("schemas", "cuda_kernels", "fakes", "cpu_refusal"):
        assert report[key] == cmake[key], f"the wheel and the CMake library differ in {key}"


# ---------------------------------------------------------------- GPU tests: bitwise the JIT build's outputs
@background.once
def gpu_outputs(kind: str, tree: trees.Tree) -> dict:
    """The outputs of run_cases on the GPU for one build of the tree (a subprocess each), loaded here."""
    if kind == "jit":
        lab_build.build(LAB, tree)  # the grader's build (reused when it is up to date)
        library = LAB.build_dir(tree) / f"{lab_build.module_name(LAB, tree)}.so"
        run_probe(kind, library, tree, _outputs_file(kind, tree))
    else:
        probe_once(kind, tree)  # the same process as the build's registration report
    return torch.load(_outputs_file(kind, tree))


def assert_bitwise_like_jit(kind: str) -> None:
    tree = graded_tree()
    ours, reference = gpu_outputs(kind, tree), gpu_outputs("jit", tree)
    assert set(ours) == set(reference), f"{kind}: cases {sorted(ours)} vs the JIT build's {sorted(reference)}"
    differ = {}
    for case, expected in reference.items():
        got = ours[case]
        for index, (a, b) in enumerate(zip(got, expected)):
            same_bits = (a.shape == b.shape and a.dtype == b.dtype
                         and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))
            if not same_bits:
                detail = f"shape {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
                if a.shape == b.shape and a.dtype == b.dtype:
                    wrong = (a.double() != b.double()).sum().item()
                    detail = f"{wrong} of {a.numel()} elements differ"
                differ[f"{case} output {index}"] = detail
    assert not differ, f"the {kind} build's outputs are not the JIT build's, bit for bit: {differ}"


@requires_gpu
@harness.tasks("lab09.1", "lab09.2")
def test_aot_cmake_matches_jit_on_gpu():
    """The CMake library's ops give bitwise the JIT build's outputs (same kernels, same inputs)."""
    assert_bitwise_like_jit("cmake")


@requires_gpu
@harness.tasks("lab09.1", "lab09.2")
def test_aot_wheel_matches_jit_on_gpu():
    """The wheel's ops give bitwise the JIT build's outputs (same kernels, same inputs)."""
    assert_bitwise_like_jit("wheel")


# ---------------------------------------------------------------- command line (and the probe's subprocess)
def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"] and len(argv) in (4, 5):
        _, kind, location, lab_dir, *outputs = argv
        report = probe(kind, location, Path(lab_dir), outputs[0] if outputs else None)
        print(PROBE_PREFIX + json.dumps(report), flush=True)
        return 0
    if argv[:1] in (["wheel"], ["cmake"]) and len(argv) <= 2:
        tree = trees.resolve_tree(argv[1] if len(argv) == 2 else "solutions")
        print(wheel(tree) if argv[0] == "wheel" else cmake_library(tree).library)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

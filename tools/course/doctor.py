"""./course doctor: check the toolchain and say exactly how to fix what is wrong."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_FREE_GB = 5
# Peak memory of one compile job of a lab build, measured with /usr/bin/time -v on a 2-core machine (2026-11-24):
# g++ on lab 05's wrapper.cpp (course/torch_op.h) 0.8 GB; g++ on a file including <torch/extension.h> 1.5 GB;
# nvcc on linear_act.cu 0.2 GB. The largest lab compiles 6 files, so at most 6 jobs run at once.
GIB_PER_COMPILE = 1.5
MAX_LAB_SOURCES = 6


class Probe:
    """How doctor looks at the machine; tests substitute a fake to plant each failure."""

    def which(self, name: str) -> str | None:
        found = shutil.which(name)
        if not found and name == "nvcc" and Path("/usr/local/cuda/bin/nvcc").exists():
            found = "/usr/local/cuda/bin/nvcc"
        return found

    def run(self, command: list[str]) -> str:
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def free_gb(self, path: Path) -> float:
        return shutil.disk_usage(path).free / 1e9

    def torch_facts(self, env) -> dict:
        """torch's facts (asked once per probe: each time a python imports torch)."""
        if not hasattr(self, "_torch_facts"):
            has_torch = env._has_modules(sys.executable, ("torch",)) or env.venv_python().exists()
            self._torch_facts = torch_facts(self, env.python_for("test")) if has_torch else {}
        return self._torch_facts

    def build_locks(self, build: Path) -> list[Path]:
        """load()'s lock files: the grader's builds (build/jit/TREE/LAB) and the notebooks' (build/notebook/...)."""
        return sorted(lock for kind in ("jit", "notebook") for lock in (build / kind).glob("*/*/lock"))

    def module_declarations(self, tree: Path) -> list[tuple[Path, int, str]]:
        """Each PYBIND11_MODULE(NAME, ...) in a lab's C++ files: (file, line, NAME)."""
        found = []
        for path in sorted(tree.glob("*/*.cpp")):
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                match = re.match(r"\s*PYBIND11_MODULE\s*\(\s*(\w+)", line)
                if match:
                    found.append((path, number, match.group(1)))
        return found

    def environ(self, name: str) -> str | None:
        return os.environ.get(name)

    def is_file(self, path: str) -> bool:
        return Path(path).is_file()

    def memory(self) -> tuple[int, float | None]:
        """The cores this process may use and the GiB of memory free to it (None if unknown)."""
        import runner

        return runner.usable_cores(), runner.available_memory_gib()


def torch_facts(probe: Probe, python: str) -> dict:
    # arch_error: what load() would raise for this TORCH_CUDA_ARCH_LIST, in torch's own words (it parses the
    # variable in _get_cuda_arch_flags; asked only when the variable is set: unset, the grader sets it).
    code = ("import json, os, torch; from torch.utils import cpp_extension as c; d = torch.cuda.is_available()\n"
            "arch_error = None\n"
            "if os.environ.get('TORCH_CUDA_ARCH_LIST'):\n"
            "    try: c._get_cuda_arch_flags()\n"
            "    except Exception as e: arch_error = f'{type(e).__name__}: {e}'\n"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_home': c.CUDA_HOME,"
            "'gpu': torch.cuda.get_device_name() if d else None,"
            "'cc': '%d.%d' % torch.cuda.get_device_capability() if d else None, 'arch_error': arch_error}))")
    out = probe.run([python, "-c", code]).strip().splitlines()
    import json

    return json.loads(out[-1]) if out else {}


def checks(root: Path, trees, env, probe: Probe | None = None) -> list[tuple[str, bool, str]]:
    """(what, ok, detail-or-fix) for each check."""
    probe = probe or Probe()
    results = []
    nvcc = probe.which("nvcc")
    nvcc_version = None
    if nvcc:
        match = re.search(r"release (\d+\.\d+)", probe.run([nvcc, "--version"]))
        nvcc_version = match.group(1) if match else None
    results.append(("nvcc", bool(nvcc_version), f"{nvcc} (CUDA {nvcc_version})" if nvcc_version else
                    "not found: install the CUDA toolkit and put its bin/ on PATH, or set CUDA_HOME"))
    facts = probe.torch_facts(env)
    results.append(("torch", bool(facts), f"{facts.get('torch')} built with CUDA {facts.get('cuda')}" if facts else
                    "not installed: run ./course test once (it installs the pinned requirements)"))
    if facts and nvcc_version and facts.get("cuda"):
        same_major = facts["cuda"].split(".")[0] == nvcc_version.split(".")[0]
        results.append(("nvcc vs torch CUDA", same_major,
                        f"nvcc {nvcc_version}, torch built with {facts['cuda']}" if same_major else
                        f"nvcc is CUDA {nvcc_version} but torch was built with {facts['cuda']}: extensions may fail to "
                        f"link or load; install CUDA {facts['cuda'].split('.')[0]}.x "
                        f"or a torch built for {nvcc_version}"))
    if facts:
        results.append(cuda_home_check(facts, probe))
    arch_list = probe.environ("TORCH_CUDA_ARCH_LIST")
    if facts and arch_list:
        results.append(arch_list_check(arch_list, facts))
    ninja = probe.which("ninja")
    results.append(("ninja", bool(ninja), ninja or "not found: pip install ninja (load() needs it)"))
    compiler = probe.which("c++") or probe.which("g++")
    results.append(("host compiler", bool(compiler),
                    (probe.run([compiler, "--version"]).splitlines() or [""])[0] if compiler
                    else "no c++/g++: apt-get install g++ (or build-essential)"))
    if facts:
        if facts.get("gpu"):
            results.append(("GPU", True, f"{facts['gpu']} (compute capability {facts['cc']}); the grader builds for "
                            f"TORCH_CUDA_ARCH_LIST={facts['cc']}"))
        else:
            results.append(("GPU", False, "no CUDA GPU visible: labs build and CPU checks run, GPU tests are skipped "
                            "(check nvidia-smi; on Colab pick a GPU runtime)"))
    results.append(compile_memory_check(probe))
    results.append(cutlass_check(root))
    free_gb = probe.free_gb(root)
    results.append(("disk", free_gb >= MIN_FREE_GB, f"{free_gb:.0f} GB free" + (
        "" if free_gb >= MIN_FREE_GB else f": builds need space; delete {trees.BUILD} (rm -rf build/) to reclaim it")))
    wrong = [(path, line, name) for path, line, name in probe.module_declarations(trees.LABS)
             if name != "TORCH_EXTENSION_NAME"]
    where = "; ".join(f"{path.relative_to(root) if path.is_relative_to(root) else path}:{line} names the module "
                      f"{name}" for path, line, name in wrong[:3])
    results.append(("module names", not wrong, "every PYBIND11_MODULE in labs/ is named TORCH_EXTENSION_NAME"
                    if not wrong else f"{where}: the build names the module after the lab, so the import fails with "
                    "'dynamic module does not define module export function (PyInit_...)'; write "
                    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)"))
    locks = probe.build_locks(trees.BUILD)
    results.append(("build locks", not locks, "none" if not locks else
                    "stale lock left by a killed compile (later builds wait on it forever); remove it with: rm " +
                    " ".join(str(p) for p in locks)))
    return results


def cuda_home_check(facts: dict, probe: Probe) -> tuple[str, bool, str]:
    """The toolkit torch's load() compiles with: CUDA_HOME (or CUDA_PATH), else nvcc's folder, else /usr/local/cuda."""
    home = facts.get("cuda_home")
    if not home:
        return ("CUDA_HOME", False, "torch finds no CUDA toolkit (CUDA_HOME unset, no nvcc on PATH, no "
                "/usr/local/cuda): builds fail with 'OSError: CUDA_HOME environment variable is not set'; "
                "export CUDA_HOME=/path/to/cuda (the folder whose bin/ holds nvcc)")
    nvcc = f"{home}/bin/nvcc"
    if not probe.is_file(nvcc):
        return ("CUDA_HOME", False, f"torch compiles with {nvcc}, which does not exist: builds fail with "
                f"'/bin/sh: 1: {nvcc}: not found'; point CUDA_HOME at the toolkit (the folder whose bin/ holds nvcc) "
                "or unset it")
    return ("CUDA_HOME", True, f"{home} (torch's load() compiles with {nvcc})")


def arch_list_check(arch_list: str, facts: dict) -> tuple[str, bool, str]:
    """TORCH_CUDA_ARCH_LIST as torch reads it, and whether it names the GPU at hand (the grader sets it to the GPU
    itself when it is unset; a value left in the shell overrides that)."""
    if facts.get("arch_error"):
        return ("TORCH_CUDA_ARCH_LIST", False, f"TORCH_CUDA_ARCH_LIST={arch_list!r}: torch refuses it "
                f"({facts['arch_error']}); write versions as major.minor (9.0a, 8.0, 7.5; a for Hopper's wgmma), "
                "not sm_90a or 90, or unset it: the grader sets it to this GPU")
    cc = facts.get("cc")
    entries = {entry.split("+")[0] for entry in re.split(r"[ ;]", arch_list) if entry}
    if cc and not entries & {cc, f"{cc}a"}:
        return ("TORCH_CUDA_ARCH_LIST", False, f"TORCH_CUDA_ARCH_LIST={arch_list!r} does not name this GPU "
                f"(compute capability {cc}): kernels fail with 'no kernel image is available for execution on the "
                f"device'; set it to {'9.0a' if cc == '9.0' else cc} or unset it")
    if cc == "9.0" and "9.0a" not in entries:
        return ("TORCH_CUDA_ARCH_LIST", False, f"TORCH_CUDA_ARCH_LIST={arch_list!r} builds sm_90 without the a: lab "
                "05's wgmma path refuses to run ('needs a Hopper GPU (compute capability 9.0) and a build for "
                "sm_90a'); set it to 9.0a or unset it")
    return ("TORCH_CUDA_ARCH_LIST", True, f"{arch_list} (set in the environment: the grader keeps it)")


def compile_memory_check(probe: Probe) -> tuple[str, bool, str]:
    """Enough memory for the compile jobs ninja runs at once: MAX_JOBS, else ninja's default (its GuessParallelism:
    2 on one core, 3 on two, cores + 2 beyond), at most the largest lab's file count. Too little and the kernel's
    OOM killer ends a compiler: 'c++: fatal error: Killed signal terminated program cc1plus'."""
    cores, free = probe.memory()
    max_jobs = probe.environ("MAX_JOBS")
    jobs = int(max_jobs) if max_jobs and max_jobs.isdigit() else {0: 2, 1: 2, 2: 3}.get(cores, cores + 2)
    parallel = max(1, min(jobs, MAX_LAB_SOURCES))
    need = parallel * GIB_PER_COMPILE
    rule = f"MAX_JOBS={max_jobs}" if max_jobs else f"ninja's default for {cores} cores"
    if free is None:
        return ("compile memory", True, f"free memory unknown; up to {parallel} compile jobs at once ({rule})")
    if free >= need:
        return ("compile memory", True, f"{free:.0f} GiB free for up to {parallel} compile jobs at once ({rule}), "
                f"about {GIB_PER_COMPILE} GiB each")
    fits = max(1, int(free // GIB_PER_COMPILE))
    return ("compile memory", False, f"{free:.1f} GiB free, and a lab build runs up to {parallel} compile jobs at "
            f"once ({rule}) of about {GIB_PER_COMPILE} GiB each: a compiler may be killed ('Killed signal "
            f"terminated program cc1plus'); export MAX_JOBS={fits}")


def cutlass_check(root: Path) -> tuple[str, bool, str]:
    """Lab 10's CUTLASS headers (coursekit/cutlass.py). Not installed yet is no problem: the lab's first build
    installs them (from .whl/ or PyPI); only a COURSE_CUTLASS_INCLUDE that points at no CUTLASS is."""
    from coursekit import cutlass

    ok, line = cutlass.check()
    misconfigured = not ok and "COURSE_CUTLASS_INCLUDE" in line
    # Measured on a 2-core machine (NOTES of lab 10): its CUTLASS file alone peaks at 3.7 GB, beyond GIB_PER_COMPILE.
    return ("CUTLASS (lab 10)", not misconfigured, line + "; its kernel file's compile peaks at about 3.7 GB")


def what_runs(root: Path, capability: str | None) -> list[str]:
    """What each lab runs on a GPU of `capability` ("8.6"), from site/data/support.json (the home page's table):
    one line a row of the table, or why nothing runs."""
    import json

    if not capability:
        return []
    data = json.loads((root / "site" / "data" / "support.json").read_text())
    major, minor = (int(part) for part in capability.split(".")[:2])
    if (major, minor) < (7, 5):
        return [f"compute capability {capability}: the course needs 7.5 or newer (a T4 or later); its kernels "
                "do not build for this GPU"]
    columns = data["columns"]
    listed = [tuple(map(int, cap.split("."))) for column in columns for cap in column["capabilities"]]
    # The column that lists this capability; past the newest listed, the table's column for newer GPUs (sm_90a code
    # runs on 9.0 alone); else the newest column whose capabilities it is past.
    index = next((i for i, c in enumerate(columns) if capability in c["capabilities"]), None)
    note = []
    if index is None and (major, minor) > max(listed):
        index, note = data["newer"]["column"], [f"  {data['newer']['note']}"]
    elif index is None:
        index = max(i for i, c in enumerate(columns)
                    if (major, minor) >= min(tuple(map(int, cap.split("."))) for cap in c["capabilities"]))
    lines = [f"what a compute capability {capability} GPU runs (the home page's column '{columns[index]['title']}'):"]
    lines += [f"  lab {row['title']:<20} {row['cells'][index]}" for row in data["rows"]]
    return lines + note


def main(root: Path, trees, env, remove_locks: bool = False) -> int:
    problems, probe = 0, Probe()
    for what, ok, detail in checks(root, trees, env, probe):
        problems += not ok
        print(f"{'ok ' if ok else 'FIX'}  {what:<20} {detail}")
    simulated = os.environ.get(trees.TARGET_ARCH_ENV, "").strip()
    capability = simulated or probe.torch_facts(env).get("cc")  # the facts checks() asked for
    if capability:
        print("\n" + "\n".join(what_runs(root, capability)))
    if simulated:
        print(f"  ({trees.TARGET_ARCH_ENV}={simulated}: the grader simulates that GPU on this one)")
    locks = probe.build_locks(trees.BUILD)
    if locks and remove_locks:
        for lock in locks:
            lock.unlink()
            print(f"removed {lock}")
    elif locks:
        print("(./course doctor --remove-locks removes them; make sure no build is running first)")
    print("\nall good" if not problems else f"\n{problems} problem(s): each FIX line says what to do")
    return 0 if not problems else 1

"""./course doctor: check the toolchain and say exactly how to fix what is wrong."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_FREE_GB = 5


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
        if not (env._has_modules(sys.executable, ("torch",)) or env.venv_python().exists()):
            return {}
        return torch_facts(self, env.python_for("test"))

    def build_locks(self, build: Path) -> list[Path]:
        return sorted((build / "jit").glob("*/*/lock")) if (build / "jit").exists() else []


def torch_facts(probe: Probe, python: str) -> dict:
    code = ("import json, torch; from torch.utils import cpp_extension as c; d = torch.cuda.is_available();"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_home': c.CUDA_HOME,"
            "'gpu': torch.cuda.get_device_name() if d else None,"
            "'cc': '%d.%d' % torch.cuda.get_device_capability() if d else None}))")
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
    free_gb = probe.free_gb(root)
    results.append(("disk", free_gb >= MIN_FREE_GB, f"{free_gb:.0f} GB free" + (
        "" if free_gb >= MIN_FREE_GB else f": builds need space; delete {trees.BUILD} (rm -rf build/) to reclaim it")))
    locks = probe.build_locks(trees.BUILD)
    results.append(("build locks", not locks, "none" if not locks else
                    "stale lock left by a killed compile (later builds wait on it forever); remove it with: rm " +
                    " ".join(str(p) for p in locks)))
    return results


def main(root: Path, trees, env, remove_locks: bool = False) -> int:
    problems = 0
    for what, ok, detail in checks(root, trees, env):
        problems += not ok
        print(f"{'ok ' if ok else 'FIX'}  {what:<20} {detail}")
    locks = Probe().build_locks(trees.BUILD)
    if locks and remove_locks:
        for lock in locks:
            lock.unlink()
            print(f"removed {lock}")
    elif locks:
        print("(./course doctor --remove-locks removes them; make sure no build is running first)")
    print("\nall good" if not problems else f"\n{problems} problem(s): each FIX line says what to do")
    return 0 if not problems else 1

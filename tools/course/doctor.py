"""./course doctor: check the toolchain and say exactly how to fix what is wrong."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_FREE_GB = 5


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def torch_facts(python: str) -> dict:
    code = ("import json, torch; from torch.utils import cpp_extension as c; d = torch.cuda.is_available();"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_home': c.CUDA_HOME,"
            "'gpu': torch.cuda.get_device_name() if d else None,"
            "'cc': '%d.%d' % torch.cuda.get_device_capability() if d else None}))")
    out = _run([python, "-c", code]).strip().splitlines()
    import json

    return json.loads(out[-1]) if out else {}


def checks(root: Path, trees, env) -> list[tuple[str, bool, str]]:
    """(what, ok, detail-or-fix) for each check."""
    results = []
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    nvcc_version = None
    if nvcc:
        match = re.search(r"release (\d+\.\d+)", _run([nvcc, "--version"]))
        nvcc_version = match.group(1) if match else None
    results.append(("nvcc", bool(nvcc_version), f"{nvcc} (CUDA {nvcc_version})" if nvcc_version else
                    "not found: install the CUDA toolkit and put its bin/ on PATH, or set CUDA_HOME"))
    python = env.python_for("test") if env._has_modules(sys.executable, ("torch",)) or env.venv_python().exists() else None
    facts = torch_facts(python) if python else {}
    results.append(("torch", bool(facts), f"{facts.get('torch')} built with CUDA {facts.get('cuda')}" if facts else
                    "not installed: run ./course test once (it installs the pinned requirements)"))
    if facts and nvcc_version and facts.get("cuda"):
        same_major = facts["cuda"].split(".")[0] == nvcc_version.split(".")[0]
        results.append(("nvcc vs torch CUDA", same_major,
                        f"nvcc {nvcc_version}, torch built with {facts['cuda']}" if same_major else
                        f"nvcc is CUDA {nvcc_version} but torch was built with {facts['cuda']}: extensions may fail to "
                        f"link or load; install CUDA {facts['cuda'].split('.')[0]}.x or a torch built for {nvcc_version}"))
    ninja = shutil.which("ninja")
    results.append(("ninja", bool(ninja), ninja or "not found: pip install ninja (load() needs it)"))
    compiler = shutil.which("c++") or shutil.which("g++")
    results.append(("host compiler", bool(compiler), (_run([compiler, "--version"]).splitlines() or [""])[0] if compiler
                    else "no c++/g++: apt-get install g++ (or build-essential)"))
    if facts:
        if facts.get("gpu"):
            results.append(("GPU", True, f"{facts['gpu']} (compute capability {facts['cc']}); the grader builds for "
                            f"TORCH_CUDA_ARCH_LIST={facts['cc']}"))
        else:
            results.append(("GPU", False, "no CUDA GPU visible: labs build and CPU checks run, GPU tests are skipped "
                            "(check nvidia-smi; on Colab pick a GPU runtime)"))
    free_gb = shutil.disk_usage(root).free / 1e9
    results.append(("disk", free_gb >= MIN_FREE_GB, f"{free_gb:.0f} GB free" + (
        "" if free_gb >= MIN_FREE_GB else f": builds need space; delete {trees.BUILD} (rm -rf build/) to reclaim it")))
    locks = sorted((trees.BUILD / "jit").glob("*/*/lock")) if (trees.BUILD / "jit").exists() else []
    results.append(("build locks", not locks, "none" if not locks else
                    "stale lock left by a killed compile (later builds wait on it forever): rm " +
                    " ".join(str(p) for p in locks)))
    return results


def main(root: Path, trees, env) -> int:
    problems = 0
    for what, ok, detail in checks(root, trees, env):
        problems += not ok
        print(f"{'ok ' if ok else 'FIX'}  {what:<20} {detail}")
    print("\nall good" if not problems else f"\n{problems} problem(s): each FIX line says what to do")
    return 0 if not problems else 1

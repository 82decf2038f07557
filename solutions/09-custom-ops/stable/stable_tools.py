"""The stable-ABI wheel's build, and a second torch to load it in.

    cd solutions/09-custom-ops/stable
    python stable_tools.py wheel          # builds (or reuses) the wheel, prints its path (--force: rebuild)
    python stable_tools.py second-torch   # makes (or reuses) torch 2.10's venv, prints its python
    python stable_tools.py check          # both, then check_registration.py under each torch (JSON)

Only the standard library here: the second torch's python imports nothing of it.

The wheel: `pip wheel --no-build-isolation` of setup.py into build/stable-abi/dist/, rebuilt only when
a source is newer than it. setuptools 65 (the main venv's) has no bdist_wheel of its own: the `wheel`
package provides it, installed with pip --target into the course's cache, not into the venv.

The second torch: a virtualenv in the course's cache (tools/course/env.py's cache_dir(), loaded from
there, not copied), outside the clone, keyed by the python version, the torch version and the index, so
a warm machine makes it once; from the same base python as the one running this. A stamp written after
pip succeeds marks it complete, so a half-made one is made again. The index: PyPI by default, whose
Linux torch wheels are CUDA builds (2.10.0: CUDA 12.8, 6.9 GB installed with its nvidia-* wheels, 3 min
here); COURSE_SECOND_TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU-only build where
that index is reachable. Either imports on a machine with no GPU, all the check needs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BUILD = ROOT / "build" / "stable-abi"
DIST = BUILD / "dist"
CHECK_SCRIPT = HERE / "check_registration.py"
LESSON06 = HERE.parents[1] / "06-fused-elementwise"  # lesson 06 of the same tree, as setup.py compiles it
# What the wheel is made of: a change to any of them rebuilds it.
SOURCES = [
    HERE / "setup.py",
    HERE / "pyproject.toml",
    HERE / "bias_gelu_stable.cpp",
    HERE / "course_stable_ops" / "__init__.py",
    *sorted(LESSON06.glob("*.cu")),
    *sorted(LESSON06.glob("*.cuh")),
    *sorted(LESSON06.glob("*.h")),
    *sorted((ROOT / "include" / "course").glob("*.cuh")),
]
SECOND_TORCH = os.environ.get("COURSE_SECOND_TORCH", "2.10.0")
# Empty: PyPI. e.g. https://download.pytorch.org/whl/cpu for the small CPU-only build.
SECOND_TORCH_INDEX = os.environ.get("COURSE_SECOND_TORCH_INDEX", "")


def _course_env():
    """tools/course/env.py, loaded by path (tools/ is not a package); it imports no torch."""
    module = sys.modules.get("course_env")
    if module is None:
        spec = importlib.util.spec_from_file_location("course_env", ROOT / "tools" / "course" / "env.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["course_env"] = module
        spec.loader.exec_module(module)
    return module


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def find_wheel() -> Path | None:
    wheels = sorted(DIST.glob("course_stable_ops-*.whl"))
    return wheels[-1] if wheels else None


def wheel_is_current(wheel: Path | None) -> bool:
    return wheel is not None and wheel.stat().st_mtime > max(s.stat().st_mtime for s in SOURCES)


def build_wheel(force: bool = False, jobs: int | None = None) -> tuple[Path, float | None]:
    """The wheel, built unless an up-to-date one is in build/stable-abi/dist; and the build's seconds
    (None when reused). jobs: ninja's parallel compiles (MAX_JOBS), 2 unless set."""
    wheel = find_wheel()
    if not force and wheel_is_current(wheel):
        return wheel, None
    DIST.mkdir(parents=True, exist_ok=True)
    for old in DIST.glob("course_stable_ops-*.whl"):
        old.unlink()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_course_env().bdist_wheel_path(), env.get("PYTHONPATH")]))
    env.setdefault("MAX_JOBS", str(jobs or 2))
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"  # wheel's bdist_wheel says setuptools >= 70.1 has its own
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-build-isolation",
                           "--no-deps", "-v", "-w", str(DIST), str(HERE)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (BUILD / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the stable-ABI wheel did not build (pip wheel exit {done.returncode}; the whole log: "
                           f"{BUILD / 'build.log'}):\n{(done.stdout + done.stderr)[-4000:]}")
    wheel = find_wheel()
    if wheel is None:
        raise FileNotFoundError(f"pip wheel wrote no course_stable_ops wheel into {DIST}")
    return wheel, seconds


def second_torch_dir(version: str = SECOND_TORCH, index: str = SECOND_TORCH_INDEX) -> Path:
    tag = "cpu" if index.rstrip("/").endswith("/cpu") else "pypi"
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = _key(f"torch=={version}\n{index}")
    return _course_env().cache_dir() / f"venv-torch{version}-{tag}-{py}-{key}"


def second_torch(version: str = SECOND_TORCH, index: str = SECOND_TORCH_INDEX) -> Path:
    """The second venv's python; creates the venv and installs torch only the first time."""
    target = second_torch_dir(version, index)
    python = target / "bin" / "python"
    stamp = target / ".installed"
    if stamp.exists() and python.exists():
        return python
    print(f"[course] creating {target} with torch=={version} (cached outside the clone)", file=sys.stderr, flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", f"torch=={version}"]
    if index:
        command += ["--index-url", index]
    subprocess.run(command, check=True)
    stamp.write_text(f"torch=={version} {index}\n")
    return python


def install_wheel(wheel: Path, python: str | Path, target: Path) -> Path:
    """The wheel installed with `python`'s pip into `target` (--no-deps: that python's torch is the one tested)."""
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                    "--upgrade", "--target", str(target), str(wheel)], check=True)
    return target


def run_check(python: str | Path, site: Path) -> dict:
    """check_registration.py under `python`, with the installed wheel at `site`: its JSON."""
    done = subprocess.run([str(python), str(CHECK_SCRIPT), str(site)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{CHECK_SCRIPT.name} failed under {python} (exit {done.returncode}):\n"
                           f"{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout)


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "check"
    if what == "wheel":
        wheel, seconds = build_wheel(force="--force" in argv)
        print(wheel if seconds is None else f"{wheel}  (built in {seconds:.1f} s)")
    elif what == "second-torch":
        print(second_torch())
    elif what == "check":
        wheel, _ = build_wheel()
        for python in (sys.executable, str(second_torch())):
            site = install_wheel(wheel, python, BUILD / f"site-{_key(python)}")
            print(json.dumps(run_check(python, site), indent=1))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# Lab skeleton generated from solutions/09-custom-ops/stable/stable_tools.py by `./course labs` [lab-hash 9964672b99d7].
# Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""The stable-ABI wheel's build, and a second torch to load it in.

    ./course run solutions/09-custom-ops/stable/stable_tools.py wheel         # builds (or reuses) the wheel, prints
                                                                              # its path (--force: rebuild)
    ./course run solutions/09-custom-ops/stable/stable_tools.py second-torch  # makes (or reuses) torch 2.10's venv,
                                                                              # prints its python
    ./course run solutions/09-custom-ops/stable/stable_tools.py check         # both, then check_registration.py under
                                                                              # each torch (JSON)

Only the standard library here, and the course's core (coursekit, from the root ./course run or the grader puts on
PYTHONPATH): the second torch's python imports nothing of it.

The wheel: `pip wheel --no-build-isolation` of a tree's stable/ folder (this one from the command line; the graded
tree's when tests/grader09/stable_abi.py builds it), into build/stable-abi/<tree tag>/09-custom-ops/, the tree's own
folder (coursekit/trees.py: Lab.build_dir), so concurrent grading runs of different trees never share one.
There, under the folder's lock (coursekit/folders.py), the wheel is made in a partial folder and renamed to
dist-<key>, the key a hash of every file it is made from: a dist-<key> that exists is whole and current, and a
changed source makes another. setuptools 65 (the main venv's) has no bdist_wheel of its own: the `wheel` package
provides it, installed with pip --target into the course's cache, not into the venv.

The second torch: a virtualenv in the course's cache (coursekit/env.py's cache_dir()), outside the clone,
keyed by the python version, the torch version and the index, so a warm machine makes it once; from the same
base python as the one running this. A stamp written after pip succeeds marks it complete, so a half-made one
is made again. The index: PyPI by default, whose Linux torch wheels are CUDA builds (2.10.0: CUDA 12.8, 6.9 GB
installed with its nvidia-* wheels, 3 min here);
COURSE_SECOND_TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU-only build where that index is
reachable. Either imports on a machine with no GPU, all the check needs.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

from coursekit import env as course_env
from coursekit import folders, trees

HERE = Path(__file__).resolve().parent
ROOT = trees.ROOT  # the course checkout (include/, coursekit/), whichever tree this file is in
CHECK_SCRIPT = HERE / "check_registration.py"
# The files of a tree's stable/ folder that the wheel is made from: given code (no TODO), which a submission keeps.
GIVEN_FILES = ("setup.py", "pyproject.toml", "bias_gelu_stable.cpp", "course_stable_ops/__init__.py")
# The lesson whose kernel the wheel compiles (setup.py: forward.cu), a folder of the same tree.
LESSON06 = "06-fused-elementwise"
KERNEL_SUFFIXES = (".cu", ".cuh", ".h")
DEFAULT_ARCH = "9.0a"  # setup.py's TORCH_CUDA_ARCH_LIST when none is set
SECOND_TORCH = os.environ.get("COURSE_SECOND_TORCH", "2.10.0")
# Empty: PyPI. e.g. https://download.pytorch.org/whl/cpu for the small CPU-only build.
SECOND_TORCH_INDEX = os.environ.get("COURSE_SECOND_TORCH_INDEX", "")



def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_build_dir(source_dir: Path = HERE) -> Path:
    """The build folder of the tree that holds `source_dir` (its 09-custom-ops/stable): the grader's for it."""
    return trees.find_lab("09").build_dir(trees.resolve_tree(str(Path(source_dir).resolve().parents[1])),
                                          "stable-abi")


def wheel_sources(source_dir: Path) -> list[tuple[str, Path]]:
    """(name, file) of everything the wheel is made from: the given files of `source_dir`, lesson 06's kernel
    sources of the same tree, the course's headers, and coursekit/jit.py (setup.py's compiler flags)."""
    lesson06 = source_dir.parents[1] / LESSON06
    if not (lesson06 / "forward.cu").is_file():
        raise FileNotFoundError(f"{lesson06 / 'forward.cu'} is missing: the stable-ABI wheel compiles lesson 06's "
                                "forward kernel from the graded tree (keep lab 06's folder beside lab 09's)")
    named = [(f"stable/{name}", source_dir / name) for name in GIVEN_FILES]
    named += [(f"{LESSON06}/{p.name}", p) for p in sorted(lesson06.iterdir()) if p.suffix in KERNEL_SUFFIXES]
    named += [(str(p.relative_to(ROOT)), p) for p in sorted((ROOT / "include").rglob("*")) if p.is_file()]
    named.append(("coursekit/jit.py", ROOT / "coursekit" / "jit.py"))
    return named


def wheel_key(source_dir: Path) -> str:
    """What names a build of the wheel: its sources' bytes, the torch it compiles against, the GPU target."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCH
    salt = f"torch {importlib.metadata.version('torch')} arch {arch} python {sys.version_info[:2]}"
    return folders.content_key(wheel_sources(source_dir), salt)


def _wheel_in(folder: Path) -> Path | None:
    wheels = sorted(folder.glob("course_stable_ops-*.whl"))
    return wheels[-1] if wheels else None


def build_wheel(source_dir: Path = HERE, build_dir: Path | None = None, force: bool = False,
                jobs: int | None = None) -> tuple[Path, float | None]:
    """The wheel of `source_dir` (a tree's 09-custom-ops/stable), built unless build_dir holds one of the same
    sources; and the build's seconds (None when reused). build_dir: default_build_dir(source_dir). jobs: ninja's
    parallel compiles (MAX_JOBS), 2 unless set."""
    source_dir = Path(source_dir).resolve()
    build_dir = Path(build_dir or default_build_dir(source_dir))
    folders.require_given_files(source_dir, GIVEN_FILES, "the stable-ABI wheel", "labs/09-custom-ops/stable/")
    final = build_dir / f"dist-{wheel_key(source_dir)}"
    with folders.exclusive(build_dir):
        wheel = _wheel_in(final)
        if wheel is not None and not force:
            return wheel, None
        staging = folders.staging_path(final)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        seconds = _pip_wheel(source_dir, staging, build_dir, jobs)
        if force:
            shutil.rmtree(final, ignore_errors=True)
        folders.publish_folder(staging, final)
        folders.remove_leftovers(build_dir, "dist-", keep=final)
    wheel = _wheel_in(final)
    if wheel is None:
        raise FileNotFoundError(f"pip wheel wrote no course_stable_ops wheel into {final}")
    return wheel, seconds


def _pip_wheel(source_dir: Path, out: Path, build_dir: Path, jobs: int | None) -> float:
    """pip wheel of source_dir into `out`, its intermediate files in build_dir/build; the seconds it took."""
    env = dict(os.environ, COURSE_STABLE_BUILD=str(build_dir / "build"), COURSE_ROOT=str(ROOT))
    # setup.py imports coursekit (the course's root on PYTHONPATH); setuptools 65 has no bdist_wheel of its own
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [course_env.bdist_wheel_path(),
                                                      trees.pythonpath(env.get("PYTHONPATH"))]))
    env.setdefault("MAX_JOBS", str(jobs or 2))
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"  # wheel's bdist_wheel says setuptools >= 70.1 has its own
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-build-isolation",
                           "--no-deps", "-v", "-w", str(out), str(source_dir)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    log = build_dir / "build.log"
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the stable-ABI wheel of {source_dir} did not build (pip wheel exit {done.returncode}; "
                           f"the whole log: {log}):\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds


def second_torch_dir(version: str = SECOND_TORCH, index: str = SECOND_TORCH_INDEX) -> Path:
    tag = "cpu" if index.rstrip("/").endswith("/cpu") else "pypi"
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = _key(f"torch=={version}\n{index}")
    return course_env.cache_dir() / f"venv-torch{version}-{tag}-{py}-{key}"


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


def install_wheel(wheel: Path, python: str | Path, build_dir: Path) -> Path:
    """The wheel installed with `python`'s pip (--no-deps: that python's torch is the one tested) into
    build_dir/site-<python>-<wheel>, made once under the folder's lock and renamed into place whole."""
    prefix = f"site-{_key(str(python))}-"
    target = build_dir / f"{prefix}{hashlib.sha256(Path(wheel).read_bytes()).hexdigest()[:12]}"
    with folders.exclusive(build_dir):
        if not target.is_dir():
            staging = folders.staging_path(target)
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                            "--target", str(staging), str(wheel)], check=True)
            folders.publish_folder(staging, target)
            folders.remove_leftovers(build_dir, prefix, keep=target)
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
            site = install_wheel(wheel, python, default_build_dir())
            print(json.dumps(run_check(python, site), indent=1))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

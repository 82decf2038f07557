"""CUTLASS's C++ headers from a pinned package, not a copy in the repository (issue 18).

    python3 -m coursekit.cutlass            # the include folders, one a line (installs them on first use)
    python3 -m coursekit.cutlass --flags    # the same as compiler flags: -I... -I...
    python3 -m coursekit.cutlass --check    # only look: exit 1 (and say how to fix it) when not installed

The `nvidia-cutlass` wheel on PyPI (pure Python, py3-none-any) carries CUTLASS's whole source tree under
cutlass_library/source/: include/ (cutlass/ and cute/) and tools/util/include/ (cutlass/util/: packed_stride,
device_memory, the host reference GEMMs). Its Python parts need cuda-python, scipy, networkx...; the course
needs only the headers, so it is installed with --no-deps and never imported.

Where the headers are taken from, first match wins:
  1. COURSE_CUTLASS_INCLUDE: an include folder given by hand (a CUTLASS checkout's include/; tools/util/include
     beside it is added when present);
  2. <cache>/cutlass-<PIN>/, the install this module makes (coursekit/env.py's cache_dir(), outside the clone,
     keyed by the pin, so a warm machine makes it once); complete only with its stamp file, written after pip
     succeeds: a half-made folder is removed and made again;
  3. otherwise it is made now: `pip install --no-deps --target` of the pinned wheel, from a wheel file in the
     repository's .whl/ folder (the GPU box has no network: the wheel travels there like the notebook packages,
     and pip is then run with --no-index) or else from PyPI.
Standard library only: ./course runs under any python3.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from coursekit import env, trees

PIN = "4.2.0.0"  # the newest nvidia-cutlass on PyPI on 2026-11-25 (CUTLASS 4.2.0, Sept 2025)
PACKAGE = "nvidia-cutlass"
ROOT = trees.ROOT
WHEELHOUSE = ROOT / ".whl"
STAMP = ".installed"
# Inside the wheel, relative to the folder pip --target writes.
INCLUDE_SUBDIRS = ("cutlass_library/source/include", "cutlass_library/source/tools/util/include")


def install_dir(pin: str = PIN) -> Path:
    return env.cache_dir() / f"cutlass-{pin}"


def _from_environment() -> list[Path] | None:
    given = os.environ.get("COURSE_CUTLASS_INCLUDE")
    if not given:
        return None
    include = Path(given).expanduser().resolve()
    if not (include / "cutlass" / "cutlass.h").is_file() or not (include / "cute" / "tensor.hpp").is_file():
        raise FileNotFoundError(f"COURSE_CUTLASS_INCLUDE={given}: no cutlass/cutlass.h and cute/tensor.hpp there")
    util = include.parent / "tools" / "util" / "include"
    return [include, util] if util.is_dir() else [include]


def _installed(target: Path, pin: str) -> list[Path] | None:
    stamp = target / STAMP
    if not stamp.is_file() or stamp.read_text().strip() != f"{PACKAGE}=={pin}":
        return None
    dirs = [target / sub for sub in INCLUDE_SUBDIRS]
    return dirs if all(d.is_dir() for d in dirs) else None


def local_wheel(pin: str = PIN) -> Path | None:
    """The pinned wheel in .whl/ (or COURSE_WHEELHOUSE), for a machine without PyPI."""
    folder = Path(os.environ.get("COURSE_WHEELHOUSE") or WHEELHOUSE)
    found = sorted(folder.glob(f"nvidia_cutlass-{pin}-*.whl")) if folder.is_dir() else []
    return found[-1] if found else None


def _pip_python() -> str:
    """A python with pip: this one, else the course's virtualenv (created by ./course test)."""
    if importlib.util.find_spec("pip") is not None:
        return sys.executable
    venv = env.venv_python()
    if venv.exists():
        return str(venv)
    raise RuntimeError(f"no pip in {sys.executable} and no course virtualenv: run ./course test once, or install "
                       f"the headers by hand and set COURSE_CUTLASS_INCLUDE")


@contextlib.contextmanager
def _lock(path: Path):
    """One installer at a time (a class graded with --jobs 8 builds several labs at once)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(pin: str = PIN, quiet: bool = False) -> tuple[Path, float | None]:
    """The install folder, made if missing; and pip's seconds (None when it was already there)."""
    target = install_dir(pin)
    if _installed(target, pin):
        return target, None
    with _lock(target.parent / f"cutlass-{pin}.lock"):
        if _installed(target, pin):  # made by another process while this one waited
            return target, None
        if target.exists():
            shutil.rmtree(target)  # half-made: no stamp
        wheel = local_wheel(pin)
        source = [str(wheel), "--no-index"] if wheel else [f"{PACKAGE}=={pin}"]
        if not quiet:
            print(f"[course] installing {PACKAGE}=={pin} (CUTLASS's headers, 6.4 MB download, 40 MB installed) into "
                  f"{target}{' from ' + str(wheel) if wheel else ''}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        done = subprocess.run([_pip_python(), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                               "--no-compile", "--target", str(target), *source], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"pip could not install {PACKAGE}=={pin} into {target} (exit {done.returncode}). "
                               f"Without network, put the wheel (pip download --no-deps {PACKAGE}=={pin}) into "
                               f"{WHEELHOUSE}/, or set COURSE_CUTLASS_INCLUDE to a CUTLASS include/ folder.\n"
                               f"{done.stderr[-3000:]}")
        missing = [sub for sub in INCLUDE_SUBDIRS if not (target / sub).is_dir()]
        if missing:
            raise FileNotFoundError(f"{PACKAGE}=={pin} installed into {target} without {', '.join(missing)}: "
                                    f"the wheel's layout changed; update INCLUDE_SUBDIRS in {__file__}")
        (target / STAMP).write_text(f"{PACKAGE}=={pin}\n")
    return target, seconds


def include_dirs(pin: str = PIN, quiet: bool = False) -> list[Path]:
    """CUTLASS's include folders: include/ (cutlass/, cute/) and tools/util/include/ (cutlass/util/)."""
    given = _from_environment()
    if given is not None:
        return given
    target, _ = install(pin, quiet=quiet)
    return [target / sub for sub in INCLUDE_SUBDIRS]


_VERSION_MACROS = ("CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH")


def version(include: Path) -> str:
    """CUTLASS's own version, read from cutlass/version.h."""
    numbers = {}
    for line in (include / "cutlass" / "version.h").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "#define" and parts[1] in _VERSION_MACROS:
            numbers[parts[1]] = parts[2]
    return ".".join(numbers.get(k, "?") for k in _VERSION_MACROS)


def check(pin: str = PIN) -> tuple[bool, str]:
    """For ./course doctor: (ok, a line saying what is there or how to fix it); installs nothing."""
    try:
        given = _from_environment()
    except FileNotFoundError as error:
        return False, str(error)
    if given is not None:
        return True, f"CUTLASS {version(given[0])} from COURSE_CUTLASS_INCLUDE={given[0]}"
    dirs = _installed(install_dir(pin), pin)
    if dirs:
        return True, f"CUTLASS {version(dirs[0])} ({PACKAGE}=={pin}) in {install_dir(pin)}"
    how = f"the wheel in {local_wheel(pin)}" if local_wheel(pin) else f"PyPI ({PACKAGE}=={pin})"
    return False, (f"CUTLASS's headers are not installed yet (lab 10 installs them on first build, from {how}); "
                   f"to do it now: python3 -m coursekit.cutlass")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flags", action="store_true", help="print -I flags on one line")
    parser.add_argument("--check", action="store_true", help="install nothing; exit 1 when missing")
    parser.add_argument("--pin", default=PIN, help=f"the {PACKAGE} version (default {PIN})")
    args = parser.parse_args(argv)
    if args.check:
        ok, line = check(args.pin)
        print(line)
        return 0 if ok else 1
    try:
        dirs = include_dirs(args.pin)
    except (RuntimeError, FileNotFoundError) as error:
        print(f"[course] {error}", file=sys.stderr)
        return 1
    print(" ".join(f"-I{d}" for d in dirs) if args.flags else "\n".join(str(d) for d in dirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

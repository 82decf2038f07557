"""Which Python runs the tests and the site, and installing what it lacks.

Rules (README "Set-up"):
  - If the running python already has what a command needs (the GPU box, Colab),
    use it and install nothing: that works with no network.
  - Otherwise build a virtualenv from the pinned requirements, outside the clone
    (a cache keyed by python version and requirement pins, so a warm machine does
    not download torch again), and point `.venv` in the clone at it.
  - `serve` needs only the docs group; `test` and `grade` need the test group.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from coursekit import folders, trees

ROOT = trees.ROOT
REQUIREMENTS = ROOT / "requirements"
# What must import for a group to count as present in the running python.
GROUP_MODULES = {
    "docs": ("mkdocs", "material", "pymdownx"),
    "test": ("torch", "pytest", "numpy", "ninja"),
    "lint": ("ruff", "clang_format"),
    "report": ("matplotlib",),
}


def _has_modules(python: str, modules: tuple[str, ...]) -> bool:
    if python == sys.executable:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    probe = "import importlib.util,sys; sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)"
    return subprocess.run([python, "-c", probe, *modules], capture_output=True).returncode == 0


def requirements_key(group: str = "test") -> str:
    """Python version + the group's pins. The venv is keyed by the heavy group (test:
    torch), so a change to the docs pins reinstalls the docs alone, not torch."""
    digest = hashlib.sha256((REQUIREMENTS / f"{group}.txt").read_bytes()).hexdigest()[:12]
    return f"py{sys.version_info.major}{sys.version_info.minor}-{digest}"


def cache_dir() -> Path:
    base = os.environ.get("COURSE_CACHE") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-ops-course"


# setuptools >= 70.1 builds wheels itself; older ones (the venv's 65) take bdist_wheel from this package. Lab 09's
# wheels alone need it, so it is installed beside the venv (pip --target into the cache), not pinned into it.
WHEEL_PACKAGE = "wheel==0.48.0"


def _setuptools_has_bdist_wheel() -> bool:
    """Whether setuptools ships setuptools/command/bdist_wheel.py (70.1 and later), found without importing it.
    find_spec("setuptools.command.bdist_wheel") imports setuptools.command, and with it setuptools' distutils shim,
    which is not thread-safe: lab 09's wheel build asks from a background thread while the main thread imports
    torch.utils.cpp_extension (setuptools too). A CI run (2026-11-27) failed in that build with KeyError:
    'distutils.util', which such a race explains; not reproduced (the same test passed alone and in two other runs)."""
    spec = importlib.util.find_spec("setuptools")
    return spec is not None and any((Path(folder) / "command" / "bdist_wheel.py").is_file()
                                    for folder in spec.submodule_search_locations or ())


def bdist_wheel_path() -> str | None:
    """A PYTHONPATH entry that gives this python bdist_wheel (WHEEL_PACKAGE, installed once into the cache), or
    None when it has one already."""
    if importlib.util.find_spec("wheel") is not None or _setuptools_has_bdist_wheel():
        return None
    target = cache_dir() / f"pip-target-{hashlib.sha256(WHEEL_PACKAGE.encode()).hexdigest()[:12]}"
    stamp = target / ".installed"
    if stamp.exists():
        return str(target)
    # A class's lab 09 runs all ask at once on a fresh machine: one installs, into a folder of its own that is
    # renamed into place whole with its stamp, and the others wait for it and find it.
    with folders.exclusive(cache_dir() / "pip-target.locks"):
        if not stamp.exists():
            shutil.rmtree(target, ignore_errors=True)  # half made by an older course version, which had no rename
            staging = folders.staging_path(target)
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--upgrade",
                            "--target", str(staging), WHEEL_PACKAGE], check=True)
            (staging / stamp.name).write_text(WHEEL_PACKAGE + "\n")
            folders.publish_folder(staging, target)
    return str(target)


def venv_python() -> Path:
    return ROOT / ".venv" / "bin" / "python"


def _ensure_venv() -> Path:
    target = cache_dir() / f"venv-{requirements_key()}"
    if not (target / "bin" / "python").exists():
        print(f"[course] creating a virtualenv at {target} (cached outside the clone)", flush=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(target)
    link = ROOT / ".venv"
    if link.is_symlink() and Path(os.readlink(link)) != target:
        link.unlink()
    if not link.exists() and not link.is_symlink():
        link.symlink_to(target)
    return target


def python_for(group: str, extra_groups: tuple[str, ...] = ()) -> str:
    """The python that runs `group`; installs the pinned requirements only if needed."""
    if _has_modules(sys.executable, GROUP_MODULES[group]):
        return sys.executable
    if venv_python().exists() and all(
        _has_modules(str(venv_python()), GROUP_MODULES[g]) for g in (group, *extra_groups)
    ):
        return str(venv_python())
    target = _ensure_venv()
    python = str(target / "bin" / "python")
    for name in (group, *extra_groups):
        stamp = target / f".installed-{name}-{requirements_key(name)}"
        if stamp.exists():
            continue
        requirements = REQUIREMENTS / f"{name}.txt"
        print(f"[course] installing {requirements.relative_to(ROOT)} into {target}", flush=True)
        subprocess.run(
            [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", str(requirements)], check=True
        )
        stamp.touch()
    return python

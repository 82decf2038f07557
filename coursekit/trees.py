"""Where things live: the repository's trees, labs, and build folders.

This is the only module that knows paths, and it holds the few names that the
`./course` CLI and the harness must agree on. It imports nothing outside the
standard library, so the CLI can use it before torch is installed.

A *tree* is a directory laid out like `labs/`: one folder per lab, named
`NN-slug`. `labs` (the student skeletons) and `solutions` (the references) are
the two built-in trees; any other path (a student's submission) is a tree too.
"""
from __future__ import annotations

import hashlib
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
SOLUTIONS = ROOT / "solutions"
TESTS = ROOT / "tests"
BUILD = ROOT / "build"
INCLUDE = ROOT / "include"
LESSONS = ROOT / "lessons"
BENCH_DATA = ROOT / "site" / "data" / "bench"
PROFILE_DATA = ROOT / "site" / "data" / "profile"  # ./course profile NN --json (site/hooks/profiles.py)
PLOT_DATA = ROOT / "site" / "data" / "plots"  # a probe's rows, drawn by site/hooks/plots.py

# Environment variable through which `./course` tells pytest which tree to grade.
IMPL_ENV = "COURSE_IMPL"
# The tree graded when nothing says otherwise: `./course test`, and a plain `pytest` run.
DEFAULT_IMPL = "solutions"
# The random seed of the inputs: `./course` draws one (or takes --seed) and passes it to the
# grading process in this variable; printed with every result so a run can be reproduced.
SEED_ENV = "COURSE_SEED"
# A tree whose build of a lab the graded tree may use when every file the compiler reads is the same in both (a
# known-wrong variant that edits only a Python file: harness.mutants sets it to solutions/; harness/build.py).
BUILD_FROM_ENV = "COURSE_BUILD_FROM"
# The compute capability an older GPU is simulated as (coursekit/jit.py: simulated_arch); its builds go to folders of
# their own (Lab.build_dir), so switching the simulation on and off rebuilds nothing.
TARGET_ARCH_ENV = "COURSE_TARGET_ARCH"


def simulated_folder(kind: str) -> str:
    """A build folder kind ("jit", "notebook"), or kind-smNN while an older GPU is simulated (TARGET_ARCH_ENV)."""
    arch = os.environ.get(TARGET_ARCH_ENV, "").strip()
    return f"{kind}-sm{arch.replace('.', '')}" if arch else kind
SHARD_ENV = "COURSE_TEST_SHARD"  # I/N: pytest keeps the I-th of every N selected tests (tests/conftest.py)
# A file `./course grade` holds while the lab's notebook runs beside the graded run: that run takes its timed
# (perf, large) cases last and starts them once the file is gone (tests/conftest.py), so no timing shares the GPU.
SIDE_WORK_ENV = "COURSE_SIDE_WORK"
# MODE:PATH, a file a class's grading processes lock (flock) to share the GPU (tools/course/runner.py, run_class):
# "shared" (the correctness runs: shared, from the start of the session, before torch is imported, to its end) or
# "exclusive" (the perf runs and the runs graded again whole: shared for correctness cases, exclusive from the
# first perf or large case to the end; tests/conftest.py), so that a timing shares the GPU with no other run's
# kernels, while the other runs start up (python, torch) beside it.
TIMING_LOCK_ENV = "COURSE_TIMING_LOCK"
LAB_DIR_PATTERN = re.compile(r"^(\d\d)-([a-z0-9-]+)$")
# CUDA and C++ sources and headers: their comments (and so their solution markers) start with //.
CXX_SUFFIXES = (".cu", ".cuh", ".cpp", ".h")
# Files that take part in lab generation (solution markers may appear in each).
GENERATED_SUFFIXES = (*CXX_SUFFIXES, ".py", ".ipynb")
SITE_SOURCES = ROOT / "site"
SITE_BUILD = BUILD / "site"
MKDOCS_YML = ROOT / "mkdocs.yml"
LOGS = BUILD / "logs"
# What Lab.build_dir makes, one folder per tree and lab: the grader's JIT build (and the notebook run, which reuses
# it); lab 09's ahead-of-time builds, the CMake op library and the course_ops wheel; its stable-ABI wheel.
BUILD_KINDS = ("jit", "aot-cmake", "aot-wheel", "stable-abi")
# The import roots of every course process: the repository root (coursekit) and tests/ (harness, the graders). The
# ./course launcher exports them as PYTHONPATH; pythonpath() gives the same to a child started with an environment
# of its own.
IMPORT_ROOTS = (ROOT, TESTS)


def pythonpath(existing: str | None = None) -> str:
    """PYTHONPATH for a child process: IMPORT_ROOTS, then `existing` (the caller's PYTHONPATH) without repeats."""
    entries = [str(p) for p in IMPORT_ROOTS] + [e for e in (existing or "").split(os.pathsep) if e]
    return os.pathsep.join(dict.fromkeys(entries))


def seed() -> int:
    """The seed in COURSE_SEED, or a fresh random one."""
    value = os.environ.get(SEED_ENV)
    return int(value) if value else random.randrange(2**31)


def sanitize_hint(lab_number: str | None, impl: str, looking_for: str = "the faulting access") -> str:
    """The line that sends a student from a crash (or a hang) to compute-sanitizer."""
    if not lab_number:
        return ""
    return (f"\n  hint: find {looking_for} with `./course sanitize {lab_number} --impl {impl}` "
            f"(compute-sanitizer's memcheck, racecheck, synccheck and initcheck on small cases)")


@dataclass(frozen=True)
class Tree:
    """A directory of labs and the short tag that names its builds."""

    path: Path
    tag: str  # 'labs', 'solutions' or 'sub_<name>_<hash>': used in build dirs and module names

    @property
    def is_reference(self) -> bool:
        return self.path == SOLUTIONS


def resolve_tree(impl: str | None = None) -> Tree:
    """`labs`, `solutions`, or a path to a submission laid out like `labs/`."""
    impl = impl or os.environ.get(IMPL_ENV) or DEFAULT_IMPL
    if impl == "labs":
        return Tree(LABS, "labs")
    if impl == "solutions":
        return Tree(SOLUTIONS, "solutions")
    path = Path(impl).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(
            f"--impl {impl!r}: no such directory. Give 'labs', 'solutions', or the path "
            "of a submission laid out like labs/ (one NN-slug folder per lab)."
        )
    if path == LABS.resolve():
        return Tree(LABS, "labs")
    if path == SOLUTIONS.resolve():
        return Tree(SOLUTIONS, "solutions")
    # A tree inside the checkout (build/mutants/...) is named by its path relative to the
    # checkout, so its build (module name, flags) is the same in every clone: a compiler cache
    # (ccache in CI) then serves a fresh clone's mutant builds from the last run's objects.
    key = path.relative_to(ROOT.resolve()) if path.is_relative_to(ROOT.resolve()) else path
    digest = hashlib.sha1(str(key).encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9]", "_", path.name)[:24]
    return Tree(path, f"sub_{name}_{digest}")


@dataclass(frozen=True)
class Lab:
    number: str  # two digits, e.g. '00'
    slug: str  # e.g. 'first-kernel'

    @property
    def name(self) -> str:
        return f"{self.number}-{self.slug}"

    @property
    def module_stem(self) -> str:
        return f"lab{self.number}"

    @property
    def test_file(self) -> Path:
        return TESTS / f"test_{self.number}_{self.slug.replace('-', '_')}.py"

    @property
    def marker(self) -> str:
        return f"lab{self.number}"

    @property
    def bench_file(self) -> Path:
        return BENCH_DATA / f"{self.name}.json"

    @property
    def lesson_page(self) -> Path:
        return LESSONS / f"{self.name}.md"

    def dir_in(self, tree: Tree) -> Path:
        return tree.path / self.name

    def build_dir(self, tree: Tree, kind: str = "jit") -> Path:
        """BUILD/<kind>/<tree tag>/<lab>: every build of a lab in a folder of the graded tree's own, so concurrent
        runs of different trees (a class) never share one. Kinds: BUILD_KINDS."""
        if kind not in BUILD_KINDS:
            raise ValueError(f"build kind {kind!r}: expected one of {', '.join(BUILD_KINDS)}")
        return BUILD / simulated_folder(kind) / tree.tag / self.name


def formatted_cxx_sources() -> list[Path]:
    """The C++/CUDA files clang-format keeps in style: the solutions (labs/ are generated from
    them), the shared headers and the GPU probes; not build outputs or student skeletons."""
    roots = [SOLUTIONS, INCLUDE, ROOT / "tools"]
    return sorted(p for root in roots for p in root.rglob("*") if p.suffix in CXX_SUFFIXES and p.is_file())


def all_labs() -> list[Lab]:
    """Every lab, in lesson order; `solutions/` is the source of truth."""
    labs = []
    for entry in sorted(SOLUTIONS.iterdir()):
        match = LAB_DIR_PATTERN.match(entry.name)
        if entry.is_dir() and match:
            labs.append(Lab(match.group(1), match.group(2)))
    return labs


def find_lab(key: str) -> Lab:
    """A lab by number ('0', '00'), by full name ('00-first-kernel') or by slug."""
    key = key.strip()
    for lab in all_labs():
        if key in (lab.number, lab.name, lab.slug) or (key.isdigit() and int(key) == int(lab.number)):
            return lab
    known = ", ".join(lab.name for lab in all_labs())
    raise KeyError(f"no lab {key!r}; the labs are: {known}")

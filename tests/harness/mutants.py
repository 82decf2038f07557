"""Known-wrong variants of a reference solution, which the grader must fail.

A grader that passes everything is worthless, and one that fails the classic bug
with a useless message nearly so. Each lab's test file lists MUTANTS: a small
text substitution in one solution file that plants one classic bug, the tests
that must catch it (a pytest -k expression), and a phrase the failure message
must contain. tests/test_course_mutants.py builds each mutant as a submission
and grades it in a separate process.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from coursekit import jit, trees


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, e.g. 'no-grid-stride'
    file: str  # solution file to change, e.g. 'scale.cu' ('../06-fused-elementwise/forward.cu': a dependency's)
    old: str  # text that must occur exactly once in that file
    new: str  # what replaces it: the planted bug
    tests: str  # pytest -k expression selecting the tests that must catch it
    expect: str  # a phrase that must appear in some failure message
    needs_gpu: bool = True  # False when a CPU-side test catches it (also run in CI)
    perf: bool = False  # True when only a perf test can catch it (a slow, correct variant)
    gpus: int = 1  # GPUs needed to show the bug (a missing device guard needs two)


def plant(lab: trees.Lab, root: trees.Path, edits: list[tuple[str, str, str]], source: str = "solutions") -> trees.Path:
    """A submission folder `root` (laid out like labs/) holding `lab` copied from the `source`
    tree, with each (file, old, new) edit applied; `old` must occur exactly once in its file.
    A lab that compiles other labs' sources (its depends.txt: lab 09) gets those lab folders
    beside it, and an edit may name one of their files from the lab's folder
    ("../06-fused-elementwise/forward.cu").

    A folder that already holds exactly these files is left as it is: its files keep their times, so
    the JIT build of an earlier run of the same submission is still up to date (ninja rebuilds what
    is newer than its objects) and grading it again does not compile again."""
    source_dir = lab.dir_in(trees.resolve_tree(source))
    names = [lab.name, *(dep.name for dep in jit.lab_dependencies(source_dir))]
    staging = root.parent / f".{root.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    for name in names:
        shutil.copytree(source_dir.parent / name, staging / name)
    for file, old, new in edits:
        target = (staging / lab.name / file).resolve()
        if not target.is_relative_to(staging.resolve()) or not target.is_file():
            shutil.rmtree(staging)
            raise AssertionError(f"{root.name}: {file} is not a file of {lab.name} or of a lab it depends on")
        text = target.read_text()
        count = text.count(old)
        if count != 1:
            shutil.rmtree(staging)
            raise AssertionError(f"{root.name}: {old!r} occurs {count} times in {file}, not once")
        target.write_text(text.replace(old, new))
    for name in names:  # only a folder whose files changed is replaced: the others keep their times
        if not ((root / name).is_dir() and _files(root / name) == _files(staging / name)):
            shutil.rmtree(root / name, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            (staging / name).rename(root / name)
    shutil.rmtree(staging)
    return root


def _files(folder: trees.Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def pytest_command(lab: trees.Lab, report: trees.Path, *, k: str | None, perf: bool) -> list[str]:
    """The grading process of a planted submission (its tree in COURSE_IMPL): the lab's tests that `k`
    selects, the perf tests or the others, each test's record written to `report`."""
    return [sys.executable, "-m", "pytest", str(lab.test_file), "-q", "-p", "no:cacheprovider",
            *(["-k", k] if k else []), f"--course-json={report}", "-m", "perf" if perf else "not perf"]


def make_tree(lab: trees.Lab, mutant: Mutant) -> trees.Path:
    """A submission folder holding the solution with the bug planted."""
    return plant(lab, trees.BUILD / "mutants" / lab.name / mutant.name, [(mutant.file, mutant.old, mutant.new)])


def grade(lab: trees.Lab, mutant: Mutant, timeout_s: int = 900) -> list[dict]:
    """Grade the mutant in its own process; return its failed tests."""
    root = make_tree(lab, mutant)
    report = root / "result.json"
    report.unlink(missing_ok=True)  # a report left by an earlier run must not stand in for this one
    command = pytest_command(lab, report, k=mutant.tests, perf=mutant.perf)
    # A variant that leaves every compiled file as it is (an edit of autograd.py) uses solutions/' build of the lab
    # (harness/build.py checks that the files are the same): the course's self-tests compile each lab once, not once
    # a variant.
    env = dict(os.environ, **{trees.IMPL_ENV: str(root), trees.BUILD_FROM_ENV: str(trees.ROOT / "solutions")})
    run = subprocess.run(command, cwd=trees.ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if not report.exists():
        raise AssertionError(
            f"mutant {mutant.name}: the grader process died (exit {run.returncode}):\n{run.stdout[-3000:]}"
        )
    tests = json.loads(report.read_text())["tests"]
    if not tests:
        raise AssertionError(f"mutant {mutant.name}: -k {mutant.tests!r} selected no test")
    return [t for t in tests if t["outcome"] == "failed"]

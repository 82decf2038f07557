"""Lab 09's grader, the ahead-of-time and stable-ABI builds: their tests, from aot.py (the CMake op library and
the course_ops wheel) and stable_abi.py (the stable-ABI wheel), brought in here; the fixture that starts their
builds early, beside the lab's other tests; and the one that keeps every build off the machine while a test is
timed.
"""
from __future__ import annotations

import importlib

import pytest
import torch

import harness
from grader09.common import LAB, LESSON_MODULES, _lesson_module_compiled
from harness import background


# ---------------------------------------------------------------- the AOT and stable-ABI builds (other helpers' tests)
def _tests_of(module_name: str, prefix: str) -> dict:
    """The test functions named prefix* of the module module_name (tests/grader09/aot.py, stable_abi.py), when that
    module exists (the CMake / wheel and stable-ABI builds of this lab are tested there). One that declares no task
    is marked harness.reference_check: it checks given code of the graded tree (package/, stable/), which has no
    TODO."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return {}
    found = {name: fn for name, fn in vars(module).items() if name.startswith(prefix) and callable(fn)}
    for name, fn in found.items():
        marks = {mark.name for mark in getattr(fn, "pytestmark", [])}
        if not marks & {harness.todos.MARK, harness.todos.REFERENCE_MARK}:
            found[name] = harness.reference_check(fn)
    return found


globals().update(_tests_of("grader09.aot", "test_aot_"))
globals().update(_tests_of("grader09.stable_abi", "test_stable_"))
# What test_09_custom_ops.py brings into its namespace, for pytest to collect there: these tests, then the fixtures.
__all__ = [name for name in globals() if name.startswith(("test_aot_", "test_stable_"))]
__all__ += ["_ahead_of_time_builds_early", "_no_build_beside_a_timing"]


@pytest.fixture(scope="module", autouse=True)
def _ahead_of_time_builds_early(request):
    """Where the session selected the ahead-of-time tests, their builds start with the module's first test and run
    beside the others (they are subprocesses: cmake, pip, a fresh python): `./course grade 09` ran them one after
    another at the end, ~94 s of its 183 s on an H100 (2026-11-27). On a GPU, lessons 07 and 08's own modules for
    test_ops_run_beside_the_lessons_modules start compiling then too (_lesson_module_compiled)."""
    selected = {item.name for item in request.session.items}
    for module_name, prefix in (("grader09.aot", "test_aot_"), ("grader09.stable_abi", "test_stable_")):
        if any(name.startswith(prefix) for name in selected):
            importlib.import_module(module_name).start_early()
    if torch.cuda.is_available() and "test_ops_run_beside_the_lessons_modules" in selected:
        for number in LESSON_MODULES:
            _lesson_module_compiled.start(number, str(LAB.tree.path))


@pytest.fixture(autouse=True)
def _no_build_beside_a_timing(request):
    """A timed test waits until every build started early has ended: no compile shares the machine with a timing."""
    if request.node.get_closest_marker("perf"):
        background.wait_all()

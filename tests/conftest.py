"""pytest glue: per-lab markers, and the JSON record `./course` reads back.

Each test's record carries what it grades as data: `tasks` (the TODO ids it declares with
harness.tasks), `todos` (for a failure: those of them still open in the graded tree, with
file and line) and `kind` ("student", or "reference" for a harness.reference_check).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest

from coursekit import trees
from harness import perf, timing, todos  # noqa: E402

_records: list[dict] = []
_points: dict[str, dict] = {}
# A CUDA error inside a kernel (illegal address, device-side assert) breaks the process's
# CUDA context: every later CUDA call fails with it. Record the first one and stop there.
# ("Device-side assertions were explicitly omitted", in every CUDA error's text, is not one.)
_STICKY_CUDA_ERROR = re.compile(r"illegal (memory )?(access|address|instruction)|device-side assert triggered|"
                                r"unspecified launch failure|misaligned address", re.IGNORECASE)
_broken_context: list[str] = []
SEED = trees.seed()


def pytest_addoption(parser):
    parser.addoption("--course-json", default=None, help="write per-test outcomes and perf cases here")


def pytest_configure(config):
    register_shard(config)
    for lab in trees.all_labs():
        config.addinivalue_line("markers", f"{lab.marker}: tests of lab {lab.name}")
    config.addinivalue_line("markers", "perf: timing against the PyTorch baseline (needs a GPU)")
    config.addinivalue_line("markers", "large: a case too big for compute-sanitizer (./course sanitize skips it)")
    config.addinivalue_line("markers", "tma_output: the output is written by TMA stores, which compute-sanitizer's "
                            "initcheck does not track (./course sanitize runs it under the other tools)")
    config.addinivalue_line("markers", "sanitize: one of the few small cases `./course grade` runs under "
                            "compute-sanitizer by default (from the grader's SANITIZE_CASES)")
    config.addinivalue_line("markers", f"{todos.MARK}(*ids): the student tasks (TODO ids) this test grades")
    config.addinivalue_line("markers", f"{todos.REFERENCE_MARK}: checks code the student is given, not a TODO")


def pytest_sessionstart(session):
    timing.record_to(session.config.getoption("--course-json"))
    _hold_timing_lock("session")


def pytest_collection_finish(session):
    timing.collected(len(session.items))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # The cases a class run gives the GPU alone (runner.ALONE_MARKERS): their time is the perf phase's.
    alone = _alone(item)
    _hold_timing_lock("test", alone, item)
    if alone:
        _wait_for_side_work()
        timing.alone_started()
    timing.test_started(item.nodeid)  # after the waits: the parent's --test-deadline counts the test alone
    yield
    timing.test_ended()
    if alone:
        timing.alone_ended()


def _alone(item) -> bool:
    return item.get_closest_marker("perf") is not None or item.get_closest_marker("large") is not None


_timing_lock: dict = {}  # "handle": the open lock file, "held": "shared" or "exclusive", until the session ends


def _hold_timing_lock(when: str, alone: bool = False, item=None) -> None:
    """The class's GPU lock (trees.TIMING_LOCK_ENV, MODE:PATH), kept until the session ends. MODE "shared" (a
    correctness run): shared, from the session's start (`when` "session"). MODE "exclusive" (a perf run, or a run
    graded again whole): before each test (`when` "test", `item`), shared for a correctness case and exclusive from
    the first perf or large case on; not exclusive once a kernel broke the CUDA context (no later test runs a
    kernel)."""
    mode, _, path = os.environ.get(trees.TIMING_LOCK_ENV, "").partition(":")
    if not mode or (when == "session") != (mode == "shared"):
        return
    want = "exclusive" if mode == "exclusive" and alone and not _broken_context else "shared"
    if _timing_lock.get("held") in (want, "exclusive"):
        return
    import fcntl

    if "handle" not in _timing_lock:
        _timing_lock["handle"] = open(path, "a")
        if mode == "exclusive":  # the CUDA context (an allocation: no kernel) before any wait, not in a GPU turn
            import torch

            if torch.cuda.is_available():
                torch.empty(1, device="cuda")
            # ...and the lab, built or loaded from its cache: 0.3-0.5 s of each of a class's serialized perf runs
            # (lab 00, H100) that the GPU would otherwise spend idle. A failed build is cached as such, and the
            # test reports it.
            lab = getattr(getattr(item, "module", None), "LAB", None)
            if lab is not None:
                try:
                    lab.module
                except Exception:  # noqa: BLE001
                    pass
    timing.lock_wait_started()
    # shared -> exclusive lets go first (flock(2)): two runs converting at once cannot deadlock
    fcntl.flock(_timing_lock["handle"], fcntl.LOCK_EX if want == "exclusive" else fcntl.LOCK_SH)
    timing.lock_wait_ended()
    _timing_lock["held"] = want


# What a session may still hold on the GPU and yet let go of the lock before it exits: the next holder's large case
# asks up to 35 GB (lab 00's past-2^31 case, of an 80 GB H100), so a few GB left until this process exits cannot
# starve it, while waiting for the exit costs every perf run of a class about 1.4 s in which the GPU is idle.
RELEASE_RESERVED_MAX = 2 * 2**30


def _release_timing_lock() -> None:
    """At the session's end, before the JSON and the interpreter's exit: no kernel of this session runs after it.
    Only once this process holds at most RELEASE_RESERVED_MAX of GPU memory, though: the next holder's large case
    needs it (a skeleton's failed past-2^31 case kept 45 GB alive through its traceback, and the next perf run's cases
    ran out of memory, H100, 2026-11-26). Otherwise the lock goes with the process, when it exits."""
    if "handle" not in _timing_lock:
        return
    import gc

    for name in ("last_type", "last_value", "last_traceback", "last_exc"):  # pytest keeps the last failure's frames
        if hasattr(sys, name):
            setattr(sys, name, None)
    jit = sys.modules.get("coursekit.jit")
    if jit is not None:
        jit.free_flush_buffers()
    gc.collect()
    torch = sys.modules.get("torch")
    reserved = 0
    if torch is not None and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            reserved = torch.cuda.memory_reserved()
        except RuntimeError:  # a broken CUDA context: its memory goes when the process does
            timing.lock_released(reserved=-1, kept=True)
            return
    timing.lock_released(reserved=reserved, kept=reserved > RELEASE_RESERVED_MAX)
    if reserved > RELEASE_RESERVED_MAX:
        return
    _timing_lock.pop("handle").close()
    _timing_lock.clear()


# The longest a timed case waits for the grader's side work (the notebook's run, which has a deadline of its own;
# the grader removes the file when that run ends, however it ends).
SIDE_WORK_WAIT_S = 900


def _wait_for_side_work() -> None:
    """Hold a timed case until `./course grade`'s side work (the notebook, run beside this process) has ended."""
    busy = os.environ.get(trees.SIDE_WORK_ENV)
    if not busy:
        return
    import time

    give_up = time.monotonic() + SIDE_WORK_WAIT_S
    while Path(busy).exists() and time.monotonic() < give_up:
        time.sleep(0.1)


def pytest_collection_modifyitems(items):
    if os.environ.get(trees.SIDE_WORK_ENV):
        items.sort(key=_alone)  # stable: the shared cases in their order, then the timed ones, which wait once
    for item in items:
        lab = todos.lab_of(item)
        if lab:
            item.add_marker(getattr(pytest.mark, lab.marker))
            if any(re.fullmatch(pattern, item.name) for pattern in getattr(item.module, "SANITIZE_CASES", ())):
                item.add_marker(pytest.mark.sanitize)
            if lab.name not in _points:
                _points[lab.name] = dict(getattr(item.module, "POINTS", {}))


# A slice of the selected tests, trees.SHARD_ENV="I/N": the I-th (0-based) of every N, in collection order, after
# -k and -m have chosen. ./course sanitize --shards N runs N such slices at once: compute-sanitizer's tools are slow
# per test and the GPU is idle between kernels, so slices share it (lab 07's racecheck and initcheck did not end in
# 545 s in one process on an H100).
class _Shard:
    """Keeps the I-th of every N selected tests. A plugin object, not a second pytest_collection_modifyitems in this
    file (a module holds one function of a name): trylast, so it slices what -k and -m (the mark plugin's own
    modifyitems, after this file's, which adds the markers -m reads) have left."""

    def __init__(self, index: int, count: int):
        self.index, self.count = index, count

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        kept = items[self.index::self.count]
        dropped = [item for position, item in enumerate(items) if position % self.count != self.index]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def register_shard(config) -> None:
    shard = os.environ.get(trees.SHARD_ENV)
    if shard:
        index, count = (int(part) for part in shard.split("/"))
        if not 0 <= index < count:
            raise pytest.UsageError(f"{trees.SHARD_ENV}={shard}: want I/N with 0 <= I < N")
        config.pluginmanager.register(_Shard(index, count), "course-test-shard")


def pytest_runtest_setup(item):
    if _broken_context:
        pytest.fail(f"not run: an earlier test hit a CUDA error that breaks this process's CUDA context:\n  "
                    f"{_broken_context[0]}", pytrace=False)
    # Fresh inputs every run, reproducible from the printed seed: each test draws from its own
    # stream, so selecting a subset of tests with -k does not change what a test sees.
    digest = int(hashlib.sha256(f"{SEED}:{item.nodeid}".encode()).hexdigest()[:8], 16)
    import random

    random.seed(digest)
    import torch

    torch.manual_seed(digest)


@pytest.fixture
def gpu_memory():
    """For the past-2^31 cases: `gpu_memory(gib)` skips without that much free GPU memory; after the
    test (its tensors gone) the cached blocks go back to the driver, so the next test starts free."""
    from harness import require_gpu_memory

    yield require_gpu_memory
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.course_tasks, report.course_reference = todos.declared(item)
    report.course_lab = todos.lab_of(item)


def _message(report) -> str:
    if report.skipped:
        longrepr = report.longrepr
        return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
        for prefix in ("harness.check.GradeFailure: ", "GradeFailure: ", "AssertionError: "):
            text = text.removeprefix(prefix)
        return text
    return str(report.longrepr)[-3000:]


def pytest_runtest_logreport(report):
    # One record per test: its call, or the setup/teardown phase that skipped or failed it.
    if report.when != "call" and report.outcome == "passed":
        return
    message = _message(report) if report.outcome != "passed" else ""
    lab = getattr(report, "course_lab", None)
    tree = trees.resolve_tree()
    # Only a lab's own test can break this process's context: a tooling test's message quotes other processes.
    if report.failed and lab and not _broken_context and _STICKY_CUDA_ERROR.search(message):
        _broken_context.append(message.splitlines()[0][:300])
        message += "\n  a kernel made an invalid access or hit an assert." + trees.sanitize_hint(
            lab.number if lab else "NN", str(tree.path))
    declared = getattr(report, "course_tasks", [])
    _records.append({
        "name": report.nodeid.split("::", 1)[-1], "outcome": report.outcome, "when": report.when,
        "message": message, "seconds": round(report.duration, 3), "tasks": declared,
        "kind": "reference" if getattr(report, "course_reference", False) else "student",
        "perf": "perf" in report.keywords,  # a timing against its bar, not a correctness check (report.speed_score)
        "todos": todos.open_for(lab, tree, declared) if report.failed and lab else [],
    })


def pytest_sessionfinish(session):
    _release_timing_lock()
    path = session.config.getoption("--course-json")
    if not path:
        return
    import torch

    labs = {name: {"points": points, "titles": todos.lab_tasks(trees.find_lab(name))}
            for name, points in _points.items()}
    data = {"seed": SEED, "tests": _records, "perf": perf.RESULTS, "profiled": perf.PROFILED,
            "torch": torch.__version__,
            "cuda": torch.version.cuda, "copy_bandwidth_gbps": perf._ceilings.get("copy"),
            "impl": str(trees.resolve_tree().path), "labs": labs,
            "broken_context": _broken_context[0] if _broken_context else None}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")

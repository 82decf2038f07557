"""Where a grading process's time goes, for `./course grade --all` (issue 19): its start-up, its builds and
its perf and large cases, written as they happen to a small JSON file beside the process's --course-json.

The file is rewritten at each step, not only at the end, so that a process killed at its deadline or dead
from a crash still says what it was doing then (e.g. 25 of its 30 s spent building). The parent
(tools/course/runner.py, process_phases) turns it into the result's phase times. Standard library only.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

# Epoch seconds (time.time()): the parent's clock and the child's are the same machine's.
STATE: dict = {
    "collected_at": None,  # pytest finished collecting: python, pytest, torch and the test module are loaded
    "build_s": 0.0,  # seconds in harness.build's compiles and imports that ended
    "build_since": None,  # a build under way since then
    "build_failed": False,  # a build of this process raised: the lab did not compile or import
    "build_infrastructure": None,  # ...because the machine failed it (out of memory or disk, a killed compiler)
    "alone_s": 0.0,  # seconds in the perf and large cases that ended, their builds not counted
    "alone_since": None,  # a perf or large case under way since then...
    "alone_build_s": 0.0,  # ...when build_s was this (a build inside it is build time, not the case's)
    "lock_wait_s": 0.0,  # seconds waiting for trees.TIMING_LOCK_ENV's lock (another run had the GPU)...
    "lock_wait_since": None,  # ...and a wait under way since then (the parent's deadline does not count waits)
    "lock_wait_in_startup": False,  # the wait came before collection ended (a shared lock, taken at session start)
    "tests_total": None,  # tests collected...
    "tests_done": 0,  # ...and ended: the parent's progress line says "k of N"
    "test": None,  # the test under way (its node id)...
    "test_since": None,  # ...since then...
    "test_build_s": 0.0,  # ...when build_s was this: the parent's --test-deadline counts the test, not its builds
    # When the GPU lock changed hands, to see what a class run's serialized perf runs spend beside their cases:
    "lock_acquired_at": None,  # the last wait for the lock ended
    "alone_ended_at": None,  # the last perf or large case ended
    "lock_released_at": None,  # the session let go of the lock early (None: it goes at the process's exit)...
    "lock_release_reserved": None,  # ...with this many bytes reserved by the caching allocator then (-1: unknown)
}
_path: list[Path] = []
_write_lock = threading.Lock()  # background builds (harness/background.py) record from their own threads


def suffix_for(json_path: str | Path) -> Path:
    """The timing file of a process whose --course-json is `json_path`: LABEL.json -> LABEL.timing.json."""
    json_path = Path(json_path)
    return json_path.with_name(json_path.name.removesuffix(".json") + ".timing.json")


def record_to(json_path: str | Path | None) -> None:
    """Write the timing file beside `json_path` from now on (None: record in memory only)."""
    _path.clear()
    if json_path:
        _path.append(suffix_for(json_path))
        _write()


def _write() -> None:
    """Written whole, then renamed: the parent reads it while the run goes on (runner.py's deadline). One
    writer at a time, each with its own partial file: two threads sharing one name made the second rename
    find nothing (FileNotFoundError in a reference check, seen in CI)."""
    if not _path:
        return
    with _write_lock:
        partial = _path[0].with_name(f"{_path[0].name}.partial-{os.getpid()}")
        partial.write_text(json.dumps(STATE))
        partial.replace(_path[0])


def collected(total: int | None = None) -> None:
    STATE["collected_at"], STATE["tests_total"] = time.time(), total
    _write()


_build_depth = [0]  # builds inside builds (a background step that JIT-builds a lab) count once, the outer one


def build_started() -> None:
    _build_depth[0] += 1
    if _build_depth[0] == 1:
        STATE["build_since"] = time.time()
        _write()


def build_ended(failed: bool, infrastructure: str | None = None) -> None:
    """A build ended; `infrastructure`: why it could not run at all (harness.build.infrastructure_failure)."""
    _build_depth[0] = max(_build_depth[0] - 1, 0)
    if STATE["build_since"] is not None and not _build_depth[0]:
        STATE["build_s"] += time.time() - STATE["build_since"]
        STATE["build_since"] = None
    STATE["build_failed"] = STATE["build_failed"] or failed
    if infrastructure:
        STATE["build_infrastructure"] = infrastructure
    _write()


def alone_started() -> None:
    STATE["alone_since"], STATE["alone_build_s"] = time.time(), STATE["build_s"]
    _write()


def alone_ended() -> None:
    if STATE["alone_since"] is not None:
        STATE["alone_s"] += time.time() - STATE["alone_since"] - (STATE["build_s"] - STATE["alone_build_s"])
    STATE["alone_since"], STATE["alone_ended_at"] = None, time.time()
    _write()


def lock_wait_started() -> None:
    STATE["lock_wait_since"] = time.time()
    _write()


def lock_wait_ended() -> None:
    if STATE["lock_wait_since"] is not None:
        STATE["lock_wait_s"] += time.time() - STATE["lock_wait_since"]
        STATE["lock_wait_in_startup"] = STATE["collected_at"] is None
    STATE["lock_wait_since"], STATE["lock_acquired_at"] = None, time.time()
    _write()


def test_started(nodeid: str) -> None:
    STATE["test"], STATE["test_since"], STATE["test_build_s"] = nodeid, time.time(), STATE["build_s"]
    _write()


def test_ended() -> None:
    STATE["test"] = STATE["test_since"] = None
    STATE["tests_done"] += 1
    _write()


def lock_released(reserved: int, kept: bool) -> None:
    """The session's end: `reserved` bytes still reserved; `kept`: the lock stays until the process exits."""
    STATE["lock_released_at"], STATE["lock_release_reserved"] = None if kept else time.time(), reserved
    _write()

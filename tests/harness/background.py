"""Slow steps computed once and started early: the grader's functools.lru_cache for builds that may run beside tests.

Lab 09's ahead-of-time builds (the CMake library, the wheel, the stable-ABI wheel) are subprocesses (cmake, pip, a
fresh python) that took about 94 s of `./course grade 09`'s 183 s on an H100 (2026-11-27), one after another, at
the end of the run. Started when the session starts, they run while the JIT build and the other tests do.

    @background.once
    def wheel(tag): ...          # wheel(tag) waits for the one computation of wheel(tag), starting it if needed
    wheel.start(tag)             # start it now in a thread of its own; return at once

Every caller, whatever its thread, waits for the same computation: two cmake or pip runs on one folder at once
would collide. A result or an exception is kept (a failed build fails every test that needs it, without building
again). A call that finds nothing started runs inline, in the caller's thread, so a step that needs another step
never waits on a pool. `wait_all()` returns once every started step has ended: timed tests call it first, so that
no build shares the machine with a timing.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import threading

from . import timing

_LOCK = threading.Lock()
_STARTED: list[concurrent.futures.Future] = []


def _run_into(future: concurrent.futures.Future, fn, args) -> None:
    try:
        future.set_result(fn(*args))
    except BaseException as error:  # noqa: BLE001  (kept for every caller, re-raised there)
        future.set_exception(error)


def once(fn):
    futures: dict[tuple, concurrent.futures.Future] = {}

    def claim(args: tuple) -> tuple[concurrent.futures.Future, bool]:
        with _LOCK:
            future = futures.get(args)
            if future is not None:
                return future, False
            future = futures[args] = concurrent.futures.Future()
            _STARTED.append(future)
            return future, True

    @functools.wraps(fn)
    def call(*args):
        future, mine = claim(args)
        with _counted_as_build(future):
            if mine:
                _run_into(future, fn, args)
            concurrent.futures.wait([future])
        return future.result()

    def start(*args) -> None:
        future, mine = claim(args)
        if mine:
            threading.Thread(target=_run_into, args=(future, fn, args), name=f"course-{fn.__name__}",
                             daemon=True).start()

    call.start = start
    return call


def wait_all() -> None:
    """Return once every started step has ended (its result or exception stays for its callers)."""
    with _LOCK:
        pending = [future for future in _STARTED if not future.done()]
    with _counted_as_build(*pending):
        concurrent.futures.wait(pending)


@contextlib.contextmanager
def _counted_as_build(*futures: concurrent.futures.Future):
    """A test's wait for steps still under way is build time (timing.py): the run's deadline does not count it."""
    if all(future.done() for future in futures):
        yield
        return
    timing.build_started()
    try:
        yield
    finally:
        timing.build_ended(failed=False)

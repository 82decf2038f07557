"""Run one lab's tests in a process of its own: a crash or a hang fails that lab alone.

The child writes per-test results to a JSON file (tests/conftest.py); this side
adds what only the parent can see: that the process died, or that it ran past
its deadline and was killed.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from coursekit import trees

PROGRESS_EVERY_S = 15  # a quiet build of the wrapper takes tens of seconds on a laptop


_PYTEST_OWN_ERRORS = (2, 3, 4)
# What a quick sanitizer pass adds to a run's result (sanitizer.run_into): its rows, and the lab's error where they fail
# it; carried over wherever the result is remade.
SANITIZER_KEYS = ("sanitizer", "sanitizer_seconds", "sanitizer_not_checked")
QUICK_PASS_KEYS = (*SANITIZER_KEYS, "error")
# The grading processes running now (each the leader of its own process group), so that an
# interrupted class run can stop the ones it started.
_RUNNING: set = set()
_RUNNING_LOCK = threading.Lock()


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


TEST_CHECK_EVERY_S = 1.0  # how often a run's timing file is read (its waits and builds, the per-test deadline)
# One build's limit, apart from the run's deadline: generous, since a class run compiles many labs at once on shared
# cores (lab 08's reference built in 75 s with 14 runs at once on an H200 box; lab 09's wheels take longer).
BUILD_DEADLINE_S = int(os.environ.get("COURSE_BUILD_DEADLINE", "1800"))


def run_pytest(python: str, files: list[Path], *, impl: str, label: str, lab_number: str | None, verbose: bool,
               deadline_s: int, seed: int | None = None, pytest_args: list[str] | None = None,
               wrapper: list[str] | None = None, extra_env: dict | None = None, quiet: bool = False,
               test_deadline_s: float | None = None, build_deadline_s: float | None = None) -> dict:
    """pytest over `files` in a child process grading the tree `impl`; returns its results plus
    what happened to the process. Logs and the child's JSON go to build/logs/LABEL.*. `quiet`: no
    progress lines (a pool of runs prints its own). `test_deadline_s`: the child is killed as hung once one test
    has run that long (its builds not counted), not only at `deadline_s` for the whole run. Neither deadline counts
    the child's builds or its waits for the class's GPU lock; a single build running past `build_deadline_s`
    (BUILD_DEADLINE_S) kills the run as a slow build."""
    build_deadline_s = build_deadline_s or BUILD_DEADLINE_S
    trees.LOGS.mkdir(parents=True, exist_ok=True)
    json_path, log_path = trees.LOGS / f"{label}.json", trees.LOGS / f"{label}.log"
    timing_path = json_path.with_name(f"{label}.timing.json")  # tests/harness/timing.py writes it
    json_path.unlink(missing_ok=True)
    timing_path.unlink(missing_ok=True)
    seed = seed if seed is not None else trees.seed()
    command = [*(wrapper or []), python, "-m", "pytest", *map(str, files), "-q", "-p", "no:cacheprovider", "-rN",
               f"--course-json={json_path}", "--tb=short", *(pytest_args or [])]
    environment = dict(os.environ, **{trees.IMPL_ENV: impl, trees.SEED_ENV: str(seed), "PYTHONUNBUFFERED": "1"},
                       **(extra_env or {}))
    if not quiet:
        print(f"[course] {label}: building and testing (impl={impl}, seed={seed}) ...", flush=True)
    started, launched_at = time.perf_counter(), time.time()
    hung = False
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=trees.ROOT, env=environment, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(process)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
        next_progress = started + PROGRESS_EVERY_S
        # Not counted against the deadline: the child's waits for the class's GPU lock, and its builds (a build
        # under contention is slow, not hung: with 14 runs at once, lab 08's build alone took 75 s). A build has
        # a limit of its own, build_deadline_s.
        excluded, building_for, state = 0.0, 0.0, {}  # state: the timing file as last read
        overrun, slow_build, next_check = None, False, started + TEST_CHECK_EVERY_S
        while True:
            now = time.perf_counter()
            if now > next_check:
                state = _read_timing(timing_path)
                excluded, building_for = lock_waits(state) + build_seconds(state), build_under_way(state)
                overrun = test_overrun(state, test_deadline_s) if test_deadline_s else None
                slow_build, next_check = building_for > build_deadline_s, now + TEST_CHECK_EVERY_S
            if now - started - excluded > deadline_s or overrun or slow_build:
                hung = True
                # The whole process group: a run killed while it builds leaves no ninja or nvcc behind to hold
                # cores that the other runs of a class need (process.kill() stopped pytest alone).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                break
            if not verbose and not quiet and now > next_progress:
                print(f"[course] {label}: {progress_line(state, now - started)}", flush=True)
                next_progress = now + PROGRESS_EVERY_S
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            log.write(line)
            if verbose:
                sys.stdout.write(line)
        process.wait()
        with _RUNNING_LOCK:
            _RUNNING.discard(process)
    seconds = time.perf_counter() - started
    ended_at = launched_at + seconds
    result = json.loads(json_path.read_text()) if json_path.exists() else {"tests": [], "perf": []}
    result.update(label=label, impl=impl, seed=seed, seconds=seconds, returncode=process.returncode, log=str(log_path))
    timing = _read_timing(timing_path)
    result["phases"] = process_phases(seconds, launched_at, ended_at, timing)
    result["build_failed"] = bool(timing.get("build_failed"))
    if timing.get("build_infrastructure"):  # the machine failed the build (harness.build): nothing was graded
        result["build_infrastructure"] = timing["build_infrastructure"]
    if hung and slow_build:
        result["error"] = (f"killed after one build ran for {building_for:.0f} s, past the build limit of "
                           f"{build_deadline_s} s: a slow build, not a hanging kernel (on a busy machine, grade "
                           "with fewer --jobs; `./course doctor` checks the compilers and memory)")
    elif hung and overrun:
        result["error"] = (f"killed after {overrun.split('::')[-1]} ran for more than {test_deadline_s:g} s (the "
                           "per-test deadline, --test-deadline): a kernel probably hangs (an endless loop, or "
                           "__syncthreads() inside a branch that not every thread of the block takes)"
                           + trees.sanitize_hint(lab_number, impl, looking_for="a barrier in divergent code"))
    elif hung:
        result["error"] = (f"killed after the {deadline_s} s deadline (its builds not counted): a kernel probably "
                           "hangs (an endless loop, or "
                           "__syncthreads() inside a branch that not every thread of the block takes)"
                           + trees.sanitize_hint(lab_number, impl, looking_for="a barrier in divergent code"))
    elif process.returncode not in (0, 1, 5) or not json_path.exists():
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-12:])
        # pytest's own failures (2 interrupted, 3 internal error, 4 usage error) are no kernel's doing.
        crashed = process.returncode not in _PYTEST_OWN_ERRORS
        result["error"] = (f"the test process died (exit code {process.returncode}) "
                           "before finishing; its last output:\n"
                           f"{tail.rstrip()}" + (trees.sanitize_hint(lab_number, impl) if crashed else ""))
    return result


def _read_timing(timing_path: Path) -> dict:
    """A running child's timing file (tests/harness/timing.py writes it whole, then renames it), or {}."""
    try:
        return json.loads(timing_path.read_text())
    except (OSError, ValueError):
        return {}


def build_seconds(timing: dict) -> float:
    """Seconds a running child has spent in its builds so far, the one under way included."""
    return timing.get("build_s", 0.0) + build_under_way(timing)


def build_under_way(timing: dict) -> float:
    """Seconds the child's build under way has run (0: none is)."""
    return max(time.time() - timing["build_since"], 0.0) if timing.get("build_since") else 0.0


def test_overrun(timing: dict, test_deadline_s: float) -> str | None:
    """The node id of a test a running child has been in for more than `test_deadline_s` seconds, its builds not
    counted (the child's timing file, _read_timing), else None."""
    if not timing.get("test_since") or timing.get("build_since"):
        return None
    busy = time.time() - timing["test_since"] - (timing.get("build_s", 0.0) - timing.get("test_build_s", 0.0))
    return timing.get("test") if busy > test_deadline_s else None


def lock_waits(timing: dict) -> float:
    """Seconds a running child has waited for the class's GPU lock so far (its timing file, _read_timing)."""
    ongoing = time.time() - timing["lock_wait_since"] if timing.get("lock_wait_since") else 0.0
    return timing.get("lock_wait_s", 0.0) + max(ongoing, 0.0)


# ---------------------------------------------------------------- where a class's time goes (issue 19)
# Each result's "phases": seconds per phase of a submission x lab, summed over its processes.
#   queued       from the start of the class to its first process (waiting for a slot of the pool)
#   startup      python, pytest, torch and the test module loaded, in each of its processes
#   build        harness.build's compiles and imports (a cold build, or ninja finding it up to date)
#   correctness  the rest of its processes: the shared cases, collection's leftovers, the JSON written
#   sanitizer    the quick compute-sanitizer pass
#   perf_wait    from the end of its first run (and sanitizer pass) to its perf run, and that run's wait for
#                the GPU lock once started: the GPU not yet free
#   perf         the perf and large cases (ALONE_MARKERS), their build not counted
#   total        startup + build + correctness + sanitizer + perf: the time its processes ran, waits not counted
PHASES = ("queued", "startup", "build", "correctness", "sanitizer", "perf_wait", "perf", "total")
WORK_PHASES = ("startup", "build", "correctness", "sanitizer", "perf")


def progress_line(state: dict, elapsed: float, now: float | None = None) -> str:
    """What a run's heartbeat says: where it is (starting, building, k of N tests) and, once tests have ended, about
    how long the rest takes at the pace so far (builds not counted: the first test of a lab builds it)."""
    now = time.time() if now is None else now
    if not state.get("collected_at"):
        return f"starting ({elapsed:.0f} s: python, torch and the tests load)"
    total, done = state.get("tests_total"), state.get("tests_done", 0)
    if state.get("build_since"):
        where = f"building the lab ({now - state['build_since']:.0f} s so far; the first build takes longest)"
        return f"{done} of {total} tests done, {where}" if total else where
    if not total:
        return f"running ({elapsed:.0f} s)"
    testing_s = now - state["collected_at"] - state.get("build_s", 0.0) - state.get("lock_wait_s", 0.0)
    eta = f", about {testing_s / done * (total - done):.0f} s left" if done and done < total else ""
    return f"{done} of {total} tests done ({elapsed:.0f} s{eta})"


def process_phases(seconds: float, launched_at: float, ended_at: float, timing: dict) -> dict:
    """One process's startup, build, correctness, perf and GPU-lock wait (perf_wait) seconds (they add up to
    `seconds`), from the timing file its conftest wrote (tests/harness/timing.py). A build, a perf case or a
    wait still under way when the process ended (killed at its deadline, or dead) counts until then; a
    process that never finished collecting counts as start-up only."""
    def since(key: str) -> float:
        return max(ended_at - timing[key], 0.0) if timing.get(key) else 0.0

    build = timing.get("build_s", 0.0) + since("build_since")
    perf = timing.get("alone_s", 0.0)
    if timing.get("alone_since"):
        perf += since("alone_since") - (build - timing.get("alone_build_s", 0.0))
    collected = timing.get("collected_at")
    startup = min(max(collected - launched_at, 0.0), seconds) if collected else seconds
    build, perf = min(build, seconds - startup), max(perf, 0.0)
    perf = min(perf, seconds - startup - build)
    lock_wait = timing.get("lock_wait_s", 0.0) + since("lock_wait_since")
    if timing.get("lock_wait_in_startup"):  # a shared lock, taken before collection: out of the start-up
        lock_wait = min(lock_wait, startup)
        startup -= lock_wait
    else:
        lock_wait = min(lock_wait, seconds - startup - build - perf)
    phases = {"startup": startup, "build": build, "correctness": seconds - startup - build - perf - lock_wait,
              "perf": perf, "perf_wait": lock_wait}
    return {key: round(value, 3) for key, value in phases.items()}


def add_phases(*parts: dict) -> dict:
    """The phases of several processes (or of a job's runs) added, key by key."""
    total: dict = {}
    for part in parts:
        for key, value in (part or {}).items():
            total[key] = round(total.get(key, 0.0) + value, 3)
    return total


def job_phases(result: dict, *, queued: float, perf_wait: float) -> dict:
    """A submission x lab's phases (PHASES, in order): its processes' (result["phases"]), its sanitizer pass,
    the waits the scheduler measured, and the total of the work."""
    phases = {key: 0.0 for key in PHASES}
    phases.update(result.get("phases") or {})
    phases.update(queued=round(queued, 3), perf_wait=round(phases["perf_wait"] + perf_wait, 3),
                  sanitizer=round(float(result.get("sanitizer_seconds") or 0.0), 3))
    phases["total"] = round(sum(phases[key] for key in WORK_PHASES), 3)
    return {key: phases[key] for key in PHASES}


def breakdown(results: list[dict], wall_s: float) -> str:
    """One line: each phase summed over `results` (their "phases"), the wall time, and the sum of the totals
    over the wall time (how many runs' worth of work went on at once; about the speed-up over one run
    after another, were each run as fast alone as beside the others)."""
    sums = add_phases(*(r.get("phases") for r in results))
    parts = ", ".join(f"{key.replace('_', ' ')} {sums.get(key, 0.0):.0f} s" for key in PHASES if key != "total")
    total = sums.get("total", 0.0)
    ratio = f"{total / wall_s:.2f}x" if wall_s > 0 else "n/a"
    return (f"time over {len(results)} run(s), summed: {parts}; total {total:.0f} s of work in {wall_s:.0f} s wall "
            f"= {ratio}")


# ---------------------------------------------------------------- a class: many runs at once
# The cases that get the GPU to themselves: the timings (a kernel timed beside another process's work
# is slowed by it) and the past-2^31 cases (they skip unless tens of GiB of GPU memory are free).
ALONE_MARKERS = "perf or large"
SHARED_MARKERS = f"not ({ALONE_MARKERS})"
GIB_PER_RUN = 4  # host memory a concurrent run may take: its compilers (torch headers) and a torch process
MAX_DEFAULT_JOBS = 8


def usable_cores() -> int:
    """The cores this process may run on (a Slurm allocation, a container's cpuset), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_memory_gib() -> float | None:
    """Linux's MemAvailable, no more than the cgroup's memory limit (a Slurm job, a container); None if unknown."""
    values = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                values.append(int(line.split()[1]) / 2**20)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            values.append(int(limit) / 2**30)
    return min(values) if values else None


def default_jobs() -> tuple[int, str]:
    """How many runs of a class go at once by default, and the rule that gave it: half the cores (each
    build compiles a few files at once), no more than one per GIB_PER_RUN GiB of free memory, at most 8."""
    cores, memory = usable_cores(), available_memory_gib()
    jobs = min(cores // 2, MAX_DEFAULT_JOBS)
    rule = f"{cores} cores // 2"
    if memory is not None and memory // GIB_PER_RUN < jobs:
        jobs, rule = int(memory // GIB_PER_RUN), f"{memory:.0f} GiB free // {GIB_PER_RUN} GiB a run"
    return max(1, jobs), rule


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` (1 <= I <= N) as (I, N)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"{text!r} is not I/N (e.g. 2/4: the second of four shards)")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise ValueError(f"shard {text}: I must be from 1 to N")
    return index, count


def shard(items: list, index: int, count: int, key: Callable = str) -> list:
    """The I-th of N slices of `items`, round-robin in the order of `key` (a submission's folder name):
    sorted, the I-th, the (I+N)-th, the (I+2N)-th, ... (1-based). The N slices cover every item once, and
    their sizes differ by at most one."""
    return sorted(items, key=key)[index - 1::count]


@dataclass(frozen=True)
class Job:
    """One submission x lab of a class."""

    student: str
    lab: str  # the lab's folder name, NN-slug
    lab_number: str
    test_file: Path
    impl: str  # the submission's absolute path
    seed: int  # one seed for every run of the job, so one --seed reproduces its result

    @property
    def label(self) -> str:
        return f"{self.student}-{self.lab}"


def broke_context(result: dict) -> bool:
    """A kernel of the run broke its process's CUDA context (conftest.py records the first such error):
    in a single run every later test of the lab fails with it, the perf cases included."""
    return bool(result.get("broken_context"))


def merge_phases(shared: dict, alone: dict) -> dict:
    """The result a single run of every test of a submission x lab gives, from the records of its two
    runs: the shared cases (`-m SHARED_MARKERS`, the quick sanitizer pass after them) and the perf and
    large cases (`-m ALONE_MARKERS`). The tests of both (the shared ones first), the perf cases, one seed,
    the seconds added; `log` is the first run's log, `perf_log` the second's. When the second run's process
    died or hung the result is that failure, as a single run's would be: no test (the child reports its
    tests when it ends), its error, no sanitizer pass."""
    merged = dict(shared)
    reported = "torch" in alone  # the child wrote its JSON (conftest.py's pytest_sessionfinish)
    merged["tests"] = [*shared.get("tests", []), *alone.get("tests", [])] if reported else []
    merged["perf"] = [*shared.get("perf", []), *alone.get("perf", [])] if reported else []
    merged["labs"] = {**alone.get("labs", {}), **shared.get("labs", {})}
    merged["copy_bandwidth_gbps"] = alone.get("copy_bandwidth_gbps") or shared.get("copy_bandwidth_gbps")
    merged["seconds"] = shared.get("seconds", 0) + alone.get("seconds", 0)
    merged["phases"] = add_phases(shared.get("phases"), alone.get("phases"))
    merged["build_failed"] = bool(shared.get("build_failed") or alone.get("build_failed"))
    merged["perf_log"] = alone.get("log")
    codes = (shared.get("returncode"), alone.get("returncode"))
    merged["returncode"] = 1 if 1 in codes else 0 if 0 in codes else 5
    if alone.get("error"):
        merged["error"], merged["returncode"] = alone["error"], alone.get("returncode")
        for key in SANITIZER_KEYS:
            merged.pop(key, None)
    return merged


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def _tally(result: dict) -> str:
    outcomes = [test["outcome"] for test in result.get("tests", [])]
    text = ", ".join(f"{outcomes.count(word)} {word}" for word in ("passed", "failed", "skipped"))
    if result.get("error"):
        text += f"; ERROR: {result['error'].splitlines()[0][:100]}"
    return f"{text} in {_duration(result.get('seconds', 0))}"


class _Progress:
    """The lines a pool of runs prints: each run as it ends, with how many are done, running and
    queued and an estimate of the time left; and, when nothing ended for a while, the same counts alone."""

    def __init__(self, phase: str, total: int, workers: int, say: Callable[[str], None]):
        self.phase, self.total, self.workers, self.say = phase, total, workers, say
        self.lock = threading.Lock()
        self.running: dict[str, float] = {}
        self.durations: list[float] = []
        self.last = time.perf_counter()

    def planned(self) -> None:
        """One more run to come (a pool whose runs are known only as the runs before them end)."""
        with self.lock:
            self.total += 1

    def started(self, job: Job) -> str:
        """Counts the run as running; returns its place, e.g. 3/40."""
        with self.lock:
            self.running[job.label] = time.perf_counter()
            return f"{len(self.durations) + len(self.running)}/{self.total}"

    def ended(self, job: Job, result: dict, note: str = "") -> None:
        with self.lock:
            self.durations.append(time.perf_counter() - self.running.pop(job.label))
            self.say(f"[course] {len(self.durations)}/{self.total} {job.student} {job.lab}: {_tally(result)}{note}"
                     f" | {self._counts()}")
            self.last = time.perf_counter()

    def tick(self) -> None:
        with self.lock:
            if time.perf_counter() - self.last >= PROGRESS_EVERY_S:
                now = time.perf_counter()
                longest = sorted(self.running.items(), key=lambda item: item[1])[:3]
                who = ", ".join(f"{label} {_duration(now - since)}" for label, since in longest)
                self.say(f"[course] {self.phase}: {self._counts()}" + (f" (running: {who})" if who else ""))
                self.last = now

    def _counts(self) -> str:
        done, running = len(self.durations), len(self.running)
        queued = self.total - done - running
        text = f"{done} done, {running} running, {queued} queued"
        if not self.durations:
            return text + ", ETA after the first run ends"
        if not running and not queued:
            return text
        mean, now = sum(self.durations) / done, time.perf_counter()
        left = [max(mean - (now - since), 0.0) for since in self.running.values()]
        eta = max((queued * mean + sum(left)) / self.workers, max(left, default=0.0))
        return text + f", ETA {_duration(eta)}"


def run_class(python: str, jobs: list[Job], *, workers: int, deadline_s: int, alone: bool,
              after: Callable[[Job, dict], None] | None = None, say: Callable[[str], None] = print,
              test_deadline_s: float | None = None) -> dict[Job, dict]:
    """Grade every job, `workers` runs at a time; return each job's result as a single run of all its tests gives it.

    1. Each job's shared cases (`-m SHARED_MARKERS`: its build and every correctness case) in a pool of
       `workers` processes, each build given usable_cores() // workers of ninja's parallelism (MAX_JOBS,
       which torch.utils.cpp_extension passes to ninja); then `after(job, result)` (the quick sanitizer pass).
    2. Each job's perf and large cases (`-m ALONE_MARKERS`), merged into its result (merge_phases). With
       `alone` (a GPU) and several workers, started as the job's first run ends, in a pool of their own, each
       taking timing_lock_file()'s lock exclusively before its first test, while every other child (correctness
       runs, sanitizer passes) holds it shared from its session's start: a timing shares the GPU with no other
       run's kernels, while the next runs start up beside it (python, torch: 8-10 s of a perf run's 10-11 s for
       lab 00 on an H100). With one worker, one after another once the pool has drained, as before --jobs.
       Without a GPU (those cases skip): in the pool, right after the job's first run.
    A job whose first run died or hung has no second (a single run would have died too, and reported no
    test); one whose lab did not build has its second right away, in the pool (no kernel of it runs, so it
    spoils no timing); one whose kernel broke its CUDA context is graded again, whole, in the second phase (in a single
    run every later test fails with that error, which a fresh process would not show). Every run keeps
    run_pytest's deadline and error handling: a crash or a hang fails its own job only."""
    builds = {} if "MAX_JOBS" in os.environ else {"MAX_JOBS": str(max(1, usable_cores() // max(workers, 1)))}
    stopping = threading.Event()

    def run(job: Job, label: str, markers: str | None, extra_env: dict) -> dict:
        if stopping.is_set():
            raise KeyboardInterrupt
        result = run_pytest(python, [job.test_file], impl=job.impl, label=label, lab_number=job.lab_number,
                            verbose=False, deadline_s=deadline_s, seed=job.seed,
                            pytest_args=["-m", markers] if markers else None, extra_env=extra_env, quiet=True,
                            test_deadline_s=test_deadline_s)
        if stopping.is_set():  # killed by stop_all: no student's doing, nothing to report
            raise KeyboardInterrupt
        return result

    def second(job: Job, first: dict, whole: bool, extra_env: dict) -> dict:
        waited = time.perf_counter() - first_done[job]
        if not whole:
            result = merge_phases(first, run(job, f"{job.label}-perf", ALONE_MARKERS, extra_env))
        else:
            result = run(job, f"{job.label}-whole", None, extra_env)
            result["label"] = job.label
            result["phases"] = add_phases(first.get("phases"), result.get("phases"))  # both runs' work
            if not result.get("error"):  # the sanitizer pass after the first run stands (a single run's would too)
                result.update({key: first[key] for key in QUICK_PASS_KEYS if key in first})
        result["phases"] = job_phases(result, queued=queued[job], perf_wait=waited)
        return result

    def first_phase(job: Job) -> tuple[Job, dict, str | None]:
        queued[job] = time.perf_counter() - class_started
        progress.started(job)
        result = run(job, job.label, SHARED_MARKERS, builds)
        plan = (None if result.get("error") else "retry" if result.get("build_infrastructure")
                else "whole" if broke_context(result) else "perf")
        if plan in ("perf", "whole") and after:
            after(job, result)
        first_done[job] = time.perf_counter()
        note = ""
        # A lab that did not build runs no kernel: its perf and large cases (they fail on the same build error)
        # can spoil no timing, so they run now, in the pool, not in the one-at-a-time queue behind the others.
        if plan in ("perf", "whole") and (not alone or (plan == "perf" and result.get("build_failed"))):
            result, plan = second(job, result, plan == "whole", builds), None
        elif plan == "whole":
            note = " (its kernel broke the CUDA context: it is graded again whole, with the GPU to itself)"
        elif plan == "retry":
            note = " (the machine failed its build: it is graded again whole, alone, once the class is done)"
        if plan is None and "total" not in result["phases"]:  # no second run: it died or hung
            result["phases"] = job_phases(result, queued=queued[job], perf_wait=0.0)
        progress.ended(job, result, note)
        return job, result, plan

    def retry_alone(job: Job, first: dict) -> dict:
        """A job whose build the machine failed, graded again whole with nothing beside it; where the build still
        cannot run, the result says the lab was not checked (report.lab_failure), never that the code failed."""
        result = run(job, f"{job.label}-retry", None, {})
        result["label"] = job.label
        result["phases"] = job_phases({**result, "phases": add_phases(first.get("phases"), result.get("phases"))},
                                      queued=queued[job], perf_wait=0.0)
        if result.get("build_infrastructure"):
            result["not_checked"] = (f"the grader's build could not run, beside the class and again alone: "
                                     f"{result['build_infrastructure']}")
        return result

    results: dict[Job, dict] = {}
    later: list[tuple[Job, dict, str]] = []
    retries: list[Job] = []
    class_started = time.perf_counter()
    queued: dict[Job, float] = {}
    first_done: dict[Job, float] = {}
    phase = "correctness runs" if alone else "runs"
    progress = _Progress(phase, len(jobs), workers, say)
    perf_progress = _Progress("perf and large cases", 0, 1, say)
    # With a GPU and several workers, a job's perf run starts (python, torch) as soon as its correctness run ends,
    # and waits for the GPU lock: correctness runs hold it shared, a perf run exclusively (tests/conftest.py).
    overlap = alone and workers > 1
    # As many perf runs under way as correctness runs: each spends 8-10 s starting up (python, torch) and holds the
    # GPU 2-3 s (lab 00, H100), so with half as many the lock sat idle behind start-ups (--jobs 8 of 16 submissions:
    # 122 s, 34 s of it the ten perf runs after the last correctness run, a hang killed at its 60 s deadline).
    perf_workers = workers
    saved_lock_env = os.environ.get(trees.TIMING_LOCK_ENV)

    def alone_run(job: Job, first: dict, plan: str, extra_env: dict) -> tuple[Job, dict, None]:
        """A job's second run; returns as first_phase does, with nothing left to plan."""
        say(f"[course] {perf_progress.started(job)} {job.student} {job.lab}: "
            + ("all its tests again" if plan == "whole" else "its perf and large cases") + " ...")
        result = second(job, first, plan == "whole", extra_env)
        perf_progress.ended(job, result)
        return job, result, None

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    perf_pool = concurrent.futures.ThreadPoolExecutor(max_workers=perf_workers) if overlap else None
    try:
        exclusive = {}
        if overlap:
            lock_file = timing_lock_file()
            os.environ[trees.TIMING_LOCK_ENV] = f"shared:{lock_file}"  # every child: correctness, sanitizer
            exclusive = {trees.TIMING_LOCK_ENV: f"exclusive:{lock_file}"}
            say(f"[course] perf and large cases: each run's start as its correctness run ends, up to {perf_workers} "
                "at once, and take the GPU in turn when no correctness run holds it (nothing runs beside a timing)")
        pending = {pool.submit(first_phase, job) for job in heaviest_first(jobs)}
        while pending:
            finished, pending = concurrent.futures.wait(pending, timeout=1.0)
            progress.tick()
            perf_progress.tick()
            for future in finished:
                job, result, plan = future.result()
                results[job] = result
                if plan == "retry":
                    retries.append(job)
                elif plan and perf_pool:
                    perf_progress.planned()
                    pending.add(perf_pool.submit(alone_run, job, result, plan, exclusive))
                elif plan:
                    later.append((job, result, plan))
        if later:  # one worker: one run at a time, as before --jobs
            say(f"[course] the perf and large cases of {len(later)} run(s), one at a time (nothing else runs "
                "beside a timing)")
            order = {job: index for index, job in enumerate(jobs)}
            later.sort(key=lambda item: order[item[0]])
            for job, first, plan in later:
                perf_progress.planned()
                _, results[job], _ = alone_run(job, first, plan, {})
        for job in sorted(retries, key=jobs.index):  # after every other run: the machine to itself
            say(f"[course] {job.student} {job.lab}: graded again, alone (its build could not run beside the others: "
                f"{results[job]['build_infrastructure']})")
            results[job] = retry_alone(job, results[job])
    except BaseException:
        stopping.set()
        for executor in (pool, perf_pool):
            if executor:
                executor.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    finally:
        if saved_lock_env is None:
            os.environ.pop(trees.TIMING_LOCK_ENV, None)
        else:
            os.environ[trees.TIMING_LOCK_ENV] = saved_lock_env
    pool.shutdown()
    if perf_pool:
        perf_pool.shutdown()
    return {job: results[job] for job in jobs}


def heaviest_first(jobs: list[Job]) -> list[Job]:
    """The order a class's runs are started in: the later labs first (they build and test longest: in a class run
    on an H200, lab 08 took 422 s, 09 301 s and 07 217 s, labs 00-05 70-105 s), students in their order within a
    lab. Started last, the longest run would finish minutes after the pool had emptied; results keep `jobs`' order."""
    return sorted(jobs, key=lambda job: -int(job.lab_number))


def timing_lock_file() -> Path:
    """The file whose lock (tests/conftest.py, trees.TIMING_LOCK_ENV) a run holds while it has the GPU: one per
    machine's checkout, so two classes graded at once also time one run at a time."""
    trees.BUILD.mkdir(parents=True, exist_ok=True)
    return trees.BUILD / "gpu-timing.lock"


def stop_all(grace_s: float = 3.0) -> int:
    """Stop the grading processes this process started that still run; return how many. Each gets SIGTERM
    with its process group (ninja, which starts each compiler in a group of its own, stops those on SIGTERM),
    then SIGKILL if it is still there after `grace_s`."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for process in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
    return len(running)


@functools.lru_cache(maxsize=None)
def gpu_visible() -> bool:
    """A GPU the driver sees (nvidia-smi -L lists one). Asked once per process, not once per lab."""
    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


# "1": a class run keeps the perf and large cases apart, one run at a time, even where perf_alone() sees no
# GPU; "0": they share the pool (no GPU, so no timing to spoil). tests/test_course_class.py sets it to
# run the GPU machine's schedule on a CPU.
PERF_ALONE_ENV = "COURSE_PERF_ALONE"


def perf_alone() -> bool:
    """Whether a class run gives the perf and large cases the machine to themselves: where a GPU may be
    there (nvidia-smi lists one, or the driver's device files exist: a container without nvidia-smi),
    unless COURSE_PERF_ALONE says."""
    forced = os.environ.get(PERF_ALONE_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return gpu_visible() or any(Path("/dev").glob("nvidia[0-9]*"))

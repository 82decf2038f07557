"""Run one lab's tests in a process of its own: a crash or a hang fails that lab alone.

The child writes per-test results to a JSON file (tests/conftest.py); this side
adds what only the parent can see: that the process died, or that it ran past
its deadline and was killed.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import env

trees = env.load_trees()
PROGRESS_EVERY_S = 15  # a quiet build of the wrapper takes tens of seconds on a laptop
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# What the sanitizer runs: the correctness cases, not the timings (100x slower under it) or the notebook.
# Not the CUDA-graph check either: without the caching allocator (below) an op cannot allocate
# inside a graph capture, so that test would fail for a reason unrelated to the kernel.
_SANITIZE_MARKERS, _SANITIZE_KEYWORDS = "not perf and not large", "not notebook and not current_stream"
SANITIZE_SELECTION = ["-m", _SANITIZE_MARKERS, "-k", _SANITIZE_KEYWORDS]
# initcheck appears not to see writes made by TMA stores (cp.async.bulk.tensor): on an H200 it reported
# every read of lab 05's wgmma outputs as uninitialized, while the same cases pass with their
# outputs NaN-poisoned first, so every element was written. Those cases (marker tma_output) run
# under the other three tools only.
INITCHECK_SELECTION = ["-m", f"{_SANITIZE_MARKERS} and not tma_output", "-k", _SANITIZE_KEYWORDS]
# The quick pass `./course grade` runs by default on a GPU: the grader's SANITIZE_CASES (a few small
# edge cases per kernel, marker `sanitize`) under the three tools that find what a comparison misses:
# out-of-bounds accesses (memcheck), shared-memory races (racecheck), barriers in divergent code (synccheck).
QUICK_TOOLS = ("memcheck", "racecheck", "synccheck")
QUICK_SELECTION = ["-m", f"sanitize and {_SANITIZE_MARKERS}", "-k", _SANITIZE_KEYWORDS]
# PyTorch's caching allocator carves tensors out of large cudaMalloc'd segments, so an access
# just past a tensor usually lands inside the segment, where memcheck cannot see it. Without
# caching every tensor is its own allocation, and memcheck catches an access one element out.
SANITIZE_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


_PYTEST_OWN_ERRORS = (2, 3, 4)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_pytest(python: str, files: list[Path], *, impl: str, label: str, lab_number: str | None, verbose: bool,
               deadline_s: int, seed: int | None = None, pytest_args: list[str] | None = None,
               wrapper: list[str] | None = None, extra_env: dict | None = None) -> dict:
    """pytest over `files` in a child process grading the tree `impl`; returns its results plus
    what happened to the process. Logs and the child's JSON go to build/logs/LABEL.*."""
    trees.LOGS.mkdir(parents=True, exist_ok=True)
    json_path, log_path = trees.LOGS / f"{label}.json", trees.LOGS / f"{label}.log"
    json_path.unlink(missing_ok=True)
    seed = seed if seed is not None else trees.seed()
    command = [*(wrapper or []), python, "-m", "pytest", *map(str, files), "-q", "-p", "no:cacheprovider", "-rN",
               f"--course-json={json_path}", "--tb=short", *(pytest_args or [])]
    environment = dict(os.environ, **{trees.IMPL_ENV: impl, trees.SEED_ENV: str(seed), "PYTHONUNBUFFERED": "1"},
                       **(extra_env or {}))
    print(f"[course] {label}: building and testing (impl={impl}, seed={seed}) ...", flush=True)
    started = time.perf_counter()
    hung = False
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=trees.ROOT, env=environment, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
        next_progress = started + PROGRESS_EVERY_S
        while True:
            now = time.perf_counter()
            if now - started > deadline_s:
                hung = True
                process.kill()
                break
            if not verbose and now > next_progress:
                print(f"[course] {label}: still running ({now - started:.0f} s; "
                      "the first build of a lab takes longest)", flush=True)
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
    seconds = time.perf_counter() - started
    result = json.loads(json_path.read_text()) if json_path.exists() else {"tests": [], "perf": []}
    result.update(label=label, impl=impl, seed=seed, seconds=seconds, returncode=process.returncode, log=str(log_path))
    if hung:
        result["error"] = (f"killed after the {deadline_s} s deadline: a kernel probably hangs (an endless loop, or "
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


# memcheck, synccheck and initcheck end with "ERROR SUMMARY: N errors"; racecheck with
# "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?")


def is_clean(row: dict) -> bool:
    """A sanitizer row is clean when the tool ran to its summary and reported nothing."""
    return row["ran"] and not row["errors"] and not row["process_error"]


def sanitizer_available() -> bool:
    """compute-sanitizer on the PATH and a GPU the driver sees."""
    if not shutil.which("compute-sanitizer") or not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def sanitize(python: str, test_file: Path, *, impl: str, lab_number: str, tools: tuple[str, ...] = SANITIZER_TOOLS,
             deadline_s: int = 1800, quick: bool = False) -> list[dict]:
    """Each compute-sanitizer tool over the lab's correctness cases (quick: its SANITIZE_CASES); one row per tool."""
    rows = []
    for tool in tools:
        label = f"sanitize-{lab_number}-{tool}{'-quick' if quick else ''}"
        wrapper = ["compute-sanitizer", "--tool", tool, "--print-limit", "20"]
        if tool == "racecheck":
            wrapper += ["--racecheck-report", "hazard"]
        selection = QUICK_SELECTION if quick else INITCHECK_SELECTION if tool == "initcheck" else SANITIZE_SELECTION
        result = run_pytest(python, [test_file], impl=impl, label=label, lab_number=lab_number, verbose=False,
                            deadline_s=deadline_s, pytest_args=selection, wrapper=wrapper, extra_env=SANITIZE_ENV)
        log_text = Path(result["log"]).read_text(errors="replace")
        counts = [int(a or b) for a, b in _ERROR_SUMMARY.findall(log_text)]
        summaries = [line.strip() for line in log_text.splitlines() if "SUMMARY:" in line]
        tests = result.get("tests", [])
        rows.append({"tool": tool, "errors": sum(counts), "ran": bool(counts), "tests": len(tests),
                     "failed": sum(t["outcome"] == "failed" for t in tests), "findings": findings_of(log_text)[:10],
                     "summaries": summaries[:4],
                     "process_error": result.get("error"), "log": result["log"], "seconds": result["seconds"]})
    return rows


def findings_of(log_text: str) -> list[str]:
    """Each distinct report of a compute-sanitizer log, as its headline ("Invalid __global__ write of size
    4 bytes", "Error: Race reported between Write access at ... reduce.cuh:115 ...") with its first
    source location ("at kernel+0x1b0 in file.cu:23") when the headline has none: the tool's own words."""
    lines = log_text.splitlines()
    findings = []
    for index, line in enumerate(lines):
        if not re.match(r"========= \S", line) or "SUMMARY" in line or "COMPUTE-SANITIZER" in line:
            continue
        headline = line.removeprefix("=========").strip()
        if not re.search(r"\S+:\d+", headline):
            for detail in lines[index + 1:index + 6]:
                where = re.match(r"=========\s+at (.*)", detail)
                if where:
                    headline += f" (at {where.group(1).strip()})"
                    break
        if headline not in findings:
            findings.append(headline)
    return findings

"""compute-sanitizer over a lab's grader: the four tools of `./course sanitize`, and the quick pass `./course grade`
runs by default on a GPU. Each tool runs the lab's tests in a process of its own (runner.run_pytest) under the
tool; a row per tool says what it found, in the tool's own words.
"""
from __future__ import annotations

import ast
import concurrent.futures
import re
import shutil
import time
from pathlib import Path

import runner

from coursekit import jit, trees

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# What the sanitizer runs: the correctness cases, not the timings (100x slower under it) or the notebook.
# Not the CUDA-graph check either: without the caching allocator (below) an op cannot allocate
# inside a graph capture, so that test would fail for a reason unrelated to the kernel.
_SANITIZE_MARKERS, _SANITIZE_KEYWORDS = "not perf and not large", "not notebook and not current_stream"
SANITIZE_MARKERS = _SANITIZE_MARKERS
# initcheck appears not to see writes made by TMA stores (cp.async.bulk.tensor): on an H200 it reported
# every read of lab 05's wgmma outputs as uninitialized, while the same cases pass with their
# outputs NaN-poisoned first, so every element was written. Those cases (marker tma_output) run
# under the other three tools only.
INITCHECK_MARKERS = f"{_SANITIZE_MARKERS} and not tma_output"
# The quick pass `./course grade` runs by default on a GPU: the grader's SANITIZE_CASES (a few small
# edge cases per kernel, marker `sanitize`) under the three tools that find what a comparison misses:
# out-of-bounds accesses (memcheck), shared-memory races (racecheck), barriers in divergent code (synccheck).
QUICK_TOOLS = ("memcheck", "racecheck", "synccheck")
QUICK_MARKERS = f"sanitize and {_SANITIZE_MARKERS}"
# PyTorch's caching allocator carves tensors out of large cudaMalloc'd segments, so an access
# just past a tensor usually lands inside the segment, where memcheck cannot see it. Without
# caching every tensor is its own allocation, and memcheck catches an access one element out.
SANITIZE_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

# The tools check the lab's own kernels only (compute-sanitizer --kernel-name regex=...): every __global__ function of
# the lab's sources (and of the labs it compiles, depends.txt) and every @triton.jit function. PyTorch's kernels run
# uninstrumented: on an H100 (2026-11-26) racecheck reported hazards inside PyTorch's memory-efficient attention
# backward (fmha_cutlassB, the grader's float32 reference), and instrumenting the float64 references made lab 08's
# racecheck pass run past 9 minutes with half its cases done. Not initcheck: it must see every write to know what
# is initialized, and filtered it took the inputs torch.randn had filled for uninitialized (H100, 2026-11-26: each
# input snapshot's cudaMemcpy reported).
_CUDA_KERNEL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")
_TRITON_KERNEL = re.compile(r"@triton\.jit[^\n]*\n\s*def\s+(\w+)")
# A lab whose kernels a library defines (lab 10: CUTLASS launches each through cutlass::device_kernel<Kernel>) names
# them in a comment of its sources, "// course: library kernel device_kernel", so that they are checked too.
_LIBRARY_KERNEL = re.compile(r"//\s*course: library kernel (\w+)")

# memcheck, synccheck and initcheck end with "ERROR SUMMARY: N errors"; racecheck with
# "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?")


# What compute-sanitizer prints when the tool itself fails, not the program under it. Seen on an H200 (compute-sanitizer
# 2025.3.1, driver 580.159.04): racecheck with --kernel-name died on the first case of labs 05 and 10 ("Internal
# Sanitizer Error: The Sanitizer failed to handle a hardware exception", the test process aborted, and the summary
# counted the tool's own error as "1 hazard"); the same cases ran clean under racecheck without the kernel filter.
# In a class run on the same machine, a memcheck whose test process could not start (pytest's conftest failed to
# import while the grader's own files were being replaced) ended "Target application terminated before first
# instrumented API call": nothing of the student's code had run.
_TOOL_FAILURE = re.compile(r"Internal Sanitizer Error|process didn't terminate successfully|"
                           r"Target application returned an error|Device not supported|"
                           r"terminated before first instrumented API call|"
                           r"Sanitizer (?:failed|is unable|could not)|out of memory", re.IGNORECASE)


def is_clean(row: dict) -> bool:
    """A sanitizer row is clean when the tool ran to its summary and reported nothing."""
    return row["ran"] and not row["errors"] and not row["process_error"]


def real_findings(row: dict) -> list[str]:
    """The row's findings that are reports about the program, not the tool's own failure."""
    return [f for f in row.get("findings", []) if not _TOOL_FAILURE.search(f)]


def tool_failure(row: dict) -> str | None:
    """Why the tool could not check the lab, or None when it did: its process died (or ran past its deadline) with
    no report about the program and no failed test. Such a death is the grader's problem, never the student's."""
    if not row.get("process_error") or real_findings(row) or row.get("failed"):
        return None
    own = [f for f in row.get("findings", []) if _TOOL_FAILURE.search(f)]
    return own[0] if own else row["process_error"].splitlines()[0][:200]


def fails_the_lab(row: dict) -> bool:
    """A row that fails the lab: the tool ran and reported something (a finding, a failed test, a death that is
    not the tool's own); a tool that could not check (row['not_checked']) fails nothing."""
    return not is_clean(row) and not row.get("not_checked")


def sanitizer_available() -> bool:
    """compute-sanitizer on the PATH and a GPU the driver sees."""
    return bool(shutil.which("compute-sanitizer")) and runner.gpu_visible()


DEADLINE_S = 1800  # a tool's run over a lab, unless the caller passes its own (grade: the graded run's)


def sanitize(python: str, test_file: Path, *, impl: str, lab_number: str, tools: tuple[str, ...] = SANITIZER_TOOLS,
             deadline_s: int = DEADLINE_S, quick: bool = False, label_prefix: str = "", quiet: bool = False,
             select: str | None = None, shards: int = 1) -> list[dict]:
    """Each compute-sanitizer tool over the lab's correctness cases (quick: its SANITIZE_CASES); one row per tool.
    `label_prefix` keeps the logs of concurrent runs apart (build/logs/PREFIXsanitize-NN-TOOL.log).

    The tools run at once, each its own process: none of the cases is timed, so they share the GPU harmlessly,
    and the pass takes about as long as its slowest tool instead of the sum (lab 06's quick pass: 24 s against
    14.5 + 17.9 + 12.6 s one after another; lab 08's full pass, one tool after another, ran past 8 minutes,
    memcheck alone past 7).
    The full pass leaves out the cases the test file names in SANITIZE_EXCLUDE (excluded_cases); `select`, a pytest
    -k expression, narrows it further (./course sanitize -k). `shards` > 1 runs each tool as that many processes at
    once, each over every shards-th selected case (trees.SHARD_ENV, read by tests/conftest.py), and merges them
    into the tool's row: a tool is slow per test and leaves the GPU idle between kernels, so the slices share it."""
    exclude = None if quick else excluded_cases(test_file)
    keywords = (_SANITIZE_KEYWORDS + (f" and not ({exclude})" if exclude else "")
                + (f" and ({select})" if select else ""))

    kernels = lab_kernels(lab_number, impl)

    def one_tool(tool: str, shard: int = 0, retry: bool = False) -> dict:
        label = (f"{label_prefix}sanitize-{lab_number}-{tool}{'-quick' if quick else ''}"
                 + (f"-shard{shard}of{shards}" if shards > 1 else "") + ("-retry" if retry else ""))
        wrapper = ["compute-sanitizer", "--tool", tool, "--print-limit", "20"]
        if kernels and tool != "initcheck" and not retry:
            wrapper += ["--kernel-name", "regex=" + "|".join(kernels)]
        if tool == "racecheck":
            wrapper += ["--racecheck-report", "hazard"]
        markers = QUICK_MARKERS if quick else INITCHECK_MARKERS if tool == "initcheck" else SANITIZE_MARKERS
        # A line a test in the log (the runner's -q prints dots, and a line of dots reaches the log only when it
        # ends), and the slowest tests at the end: lab 08's pass printed nothing at all in 320 s on an H200, and its
        # log could not say whether one test or all of them were slow under the tools.
        selection = ["-m", markers, "-k", keywords, "-v", "-v", "--durations=15"]
        shard_env = {runner.trees.SHARD_ENV: f"{shard}/{shards}"} if shards > 1 else {}
        result = runner.run_pytest(python, [test_file], impl=impl, label=label, lab_number=lab_number, verbose=False,
                            deadline_s=deadline_s, pytest_args=selection, wrapper=wrapper,
                            extra_env={**SANITIZE_ENV, **shard_env}, quiet=quiet or quick or shards > 1)
        log_text = Path(result["log"]).read_text(errors="replace")
        counts = [int(a or b) for a, b in _ERROR_SUMMARY.findall(log_text)]
        summaries = [line.strip() for line in log_text.splitlines() if "SUMMARY:" in line]
        tests = result.get("tests", [])
        return {"tool": tool, "errors": sum(counts), "ran": bool(counts), "tests": len(tests),
                "failed": sum(t["outcome"] == "failed" for t in tests), "findings": findings_of(log_text)[:10],
                # A test can fail under the tool with nothing to report from the tool itself (a wrong result, an
                # error that only the tool's slower or uncached allocations expose): named, so it can be rerun.
                "failed_tests": [f"{t['name']}: {(t['message'].splitlines() or [''])[0][:200]}"
                                 for t in tests if t["outcome"] == "failed"][:5],
                "summaries": summaries[:4],
                "process_error": result.get("error"), "log": result["log"], "seconds": result["seconds"]}

    def checked(tool: str, shard: int, row: dict) -> dict:
        """The row, or, where the tool itself failed, the row of one more run of it alone and without the kernel
        filter (the cause seen so far); a second failure marks the row not_checked, with why."""
        first = tool_failure(row)
        if not first:
            return row
        if not quiet:
            print(f"[course] {label_prefix}sanitize-{lab_number}: {tool} could not run ({first}); once more, alone "
                  "and over every kernel", flush=True)
        again = one_tool(tool, shard, retry=True)
        again["retried_after"] = first
        second = tool_failure(again)
        if second:
            again["not_checked"] = (f"compute-sanitizer {tool} could not run: {first}; run again alone over every "
                                    f"kernel: {second}")
        elif kernels and real_findings(again) and not any(name in f for f in real_findings(again) for name in kernels):
            # The retry instrumented PyTorch's kernels too: reports about them alone are not the lab's (racecheck
            # reported hazards inside PyTorch's own attention backward on an H100), but they leave the lab unchecked
            # where the process died of them or a test failed.
            again["foreign_findings"], again["findings"], again["errors"] = again["findings"], [], 0
            if again["process_error"] or again["failed"]:
                again["not_checked"] = (f"compute-sanitizer {tool} could not run: {first}; run again over every "
                                        "kernel, it reported only on PyTorch's kernels, not the lab's")
        return again

    if not quiet:
        what = ("the quick pass" if quick else "every correctness case" + (f" but ({exclude})" if exclude else "")
                + (f" that -k '{select}' selects" if select else ""))
        print(f"[course] {label_prefix}sanitize-{lab_number}: {what}, {', '.join(tools)} at once ...", flush=True)
    jobs = [(tool, shard) for tool in tools for shard in range(shards)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        rows = list(pool.map(lambda job: one_tool(*job), jobs))
    rows = [checked(tool, shard, row) for (tool, shard), row in zip(jobs, rows)]  # retries one at a time: alone
    return [merge_shards([row for (tool_, _), row in zip(jobs, rows) if tool_ == tool]) for tool in tools]


def merge_shards(rows: list[dict]) -> dict:
    """One tool's row from its shards' rows: counts summed, findings and failed tests joined (each list's first ten
    or five, as one process's), the slowest shard's seconds (they ran at once), every shard's log."""
    if len(rows) == 1:
        return rows[0]
    first = rows[0]
    errors = [r["process_error"] for r in rows if r["process_error"]]
    return {"tool": first["tool"], "errors": sum(r["errors"] for r in rows), "ran": all(r["ran"] for r in rows),
            "tests": sum(r["tests"] for r in rows), "failed": sum(r["failed"] for r in rows),
            "findings": list(dict.fromkeys(f for r in rows for f in r["findings"]))[:10],
            "failed_tests": [t for r in rows for t in r["failed_tests"]][:5],
            "summaries": [line for r in rows for line in r["summaries"]][:4],
            "process_error": "; ".join(errors) or None, "log": ", ".join(r["log"] for r in rows),
            "seconds": max(r["seconds"] for r in rows),
            "not_checked": "; ".join(r["not_checked"] for r in rows if r.get("not_checked")) or None}


def lab_kernels(lab_number: str, impl: str) -> list[str]:
    """The names of the kernels a lab's tree defines: its __global__ functions (templates included), its
    @triton.jit functions and the library kernels it names (_LIBRARY_KERNEL), with those of the labs it compiles
    (depends.txt); the sanitizer checks these only.
    Read from the sources, so a student's extra kernel is checked too. Empty (check everything) if the tree or the
    lab cannot be found."""
    try:
        folder = trees.find_lab(lab_number).dir_in(trees.resolve_tree(impl))
        folders = [folder, *jit.lab_dependencies(folder)] if folder.is_dir() else []
    except (KeyError, FileNotFoundError):  # no such lab or tree, or a depends.txt naming a missing folder
        return []
    names: set[str] = set()
    for path in (p for f in folders for p in sorted(f.iterdir())):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            text = path.read_text(errors="replace")
            names.update(_CUDA_KERNEL.findall(text) + _LIBRARY_KERNEL.findall(text))
        elif path.suffix == ".py":
            names.update(_TRITON_KERNEL.findall(path.read_text(errors="replace")))
    return sorted(names)


def excluded_cases(test_file: Path) -> str | None:
    """The test file's SANITIZE_EXCLUDE, a pytest -k expression (e.g. "2048x2048 or 4224x4224"): cases the full
    pass leaves out because they only repeat smaller ones at a size that costs minutes under the tools (lab 08's
    memcheck over every case ran past 7 minutes on an H200). Read from the source, not imported: the tool's
    process has no business importing torch and the lab."""
    for node in ast.parse(Path(test_file).read_text()).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SANITIZE_EXCLUDE"
                                                 for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


def findings_of(log_text: str) -> list[str]:
    """Each distinct report of a compute-sanitizer log, as its headline ("Invalid __global__ write of size
    4 bytes", "Error: Race reported between Write access at ... reduce.cuh:115 ...") with its first
    source location ("at kernel+0x1b0 in file.cu:23") when the headline has none: the tool's own words."""
    lines = log_text.splitlines()
    findings = []
    for index, line in enumerate(lines):
        # The tool's lines start with its marker, or follow a test's name on the line pytest -v began for it.
        marked = re.search(r"(?:^|\s)========= (\S.*)", line)
        if not marked or "SUMMARY" in line or "COMPUTE-SANITIZER" in line:
            continue
        headline = marked.group(1).strip()
        if not re.search(r"\S+:\d+", headline):
            for detail in lines[index + 1:index + 6]:
                where = re.match(r"=========\s+at (.*)", detail)
                if where:
                    headline += f" (at {where.group(1).strip()})"
                    break
        if headline not in findings:
            findings.append(headline)
    return findings


def run_as_asked(args, python: str, result: dict, lab, impl: str, *, label_prefix: str = "",
                 quiet: bool = False) -> None:
    """`grade --sanitize`: the four tools over every correctness case. `grade` on a GPU, unless
    --no-sanitize: the quick pass (memcheck, racecheck, synccheck over the grader's SANITIZE_CASES),
    which finds the out-of-bounds writes and races that leave every compared element right."""
    if getattr(args, "sanitize", False):
        run_into(python, result, lab, impl, quick=False, label_prefix=label_prefix, quiet=quiet)
    elif quick_pass_wanted(args) and quick_pass_counts(result):
        run_into(python, result, lab, impl, quick=True, label_prefix=label_prefix, quiet=quiet)


def quick_pass_wanted(args) -> bool:
    """`grade` on a GPU, neither --sanitize (the full pass instead) nor --no-sanitize: the quick pass is due."""
    return not getattr(args, "sanitize", False) and getattr(args, "quick_sanitize", False) and sanitizer_available()


def quick_pass_counts(result: dict) -> bool:
    """Whether a run's quick pass belongs in its result: the run built its lab and neither died nor hung (it has an
    error of its own to report then)."""
    built = [t for t in result.get("tests", []) if t["name"] == "test_builds"]
    return not result.get("error") and bool(built) and built[0]["outcome"] == "passed"


def take_quick_pass(result: dict, quick_pass: dict) -> None:
    """A quick pass run beside `result`'s run (run_into on a dict of its own) into `result`, where it counts."""
    if quick_pass_counts(result):
        for key in runner.QUICK_PASS_KEYS:
            if key in quick_pass:
                result[key] = quick_pass[key]


def run_into(python: str, result: dict, lab, impl: str, *, quick: bool, label_prefix: str = "",
             quiet: bool = False, deadline_s: int = DEADLINE_S) -> None:
    """Run the tools (quick: the quick pass) and put their rows, and a failing lab's error, into `result`."""
    tools = QUICK_TOOLS if quick else SANITIZER_TOOLS
    started = time.monotonic()
    rows = sanitize(python, lab.test_file, impl=impl, lab_number=lab.number, tools=tools, quick=quick,
                    label_prefix=label_prefix, quiet=quiet, deadline_s=deadline_s)
    result["sanitizer"] = rows
    result["sanitizer_seconds"] = round(time.monotonic() - started, 1)  # wall time: the quick pass's tools overlap
    unchecked = [r["not_checked"] for r in rows if r.get("not_checked")]
    if unchecked:  # the tool's failure, not the student's: reported, and no point lost
        result["sanitizer_not_checked"] = unchecked
    dirty = [r for r in rows if fails_the_lab(r)]
    if dirty:
        lines = [f"compute-sanitizer {r['tool']}: {r['findings'][0] if r['findings'] else r['process_error'] or ''}"
                 for r in dirty]
        result["error"] = ("\n  ".join(lines) + f"\n  hint: ./course sanitize {lab.number} --impl {impl} "
                           f"--tool {dirty[0]['tool']} lists every finding with its thread and block")

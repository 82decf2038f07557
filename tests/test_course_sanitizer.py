"""compute-sanitizer in the grader (tools/course/sanitizer.py), with no GPU: every pattern of a grader's
SANITIZE_CASES matches a test, and lab_kernels names every __global__ function of a lab; COURSE_TEST_SHARD splits a
selection into disjoint shards whose rows merge into one; with the tool's runs faked, a tool that died on its own or
whose program never started runs once more alone, one that cannot run leaves the lab not checked instead of failed,
a finding still fails the lab, and a retry's reports about PyTorch's own kernels are not the lab's."""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import threading

import pytest
import report  # noqa: E402

from coursekit import jit, trees


# ---------------------------------------------------------------- what the sanitizer checks
@pytest.mark.parametrize("lab", trees.all_labs(), ids=lambda lab: lab.name)
def test_every_sanitize_case_names_a_test(lab):
    """Each pattern of a grader's SANITIZE_CASES (the quick compute-sanitizer pass of `grade`) matches a test."""
    module = importlib.import_module(lab.test_file.stem)
    patterns = getattr(module, "SANITIZE_CASES", [])
    assert patterns, f"{lab.test_file.name} has no SANITIZE_CASES: `grade` would run no case under compute-sanitizer"
    run = subprocess.run([sys.executable, "-m", "pytest", str(lab.test_file), "--co", "-q", "-p", "no:cacheprovider"],
                         cwd=trees.ROOT, capture_output=True, text=True, timeout=300)
    names = [line.split("::", 1)[1] for line in run.stdout.splitlines() if "::" in line]
    unmatched = [p for p in patterns if not any(re.fullmatch(p, name) for name in names)]
    assert not unmatched, f"{lab.test_file.name}: SANITIZE_CASES patterns that match no test: {unmatched}"


@pytest.mark.parametrize("tree", ["solutions", "labs"])
@pytest.mark.parametrize("lab", trees.all_labs(), ids=lambda lab: lab.name)
def test_sanitizer_checks_every_kernel_of_the_lab(lab, tree):
    """compute-sanitizer instruments only the kernels sanitizer.lab_kernels names (--kernel-name regex=...): it must
    find every __global__ declaration of the lab's sources (and of the labs it compiles), or a kernel would run
    unchecked; and each name must look like an identifier (the regex is an alternation of them)."""
    import sanitizer

    names = sanitizer.lab_kernels(lab.number, tree)
    folder = lab.dir_in(trees.resolve_tree(tree))
    folders = [folder, *jit.lab_dependencies(folder)]
    assert names, f"{lab.name} ({tree}): no kernel names found"
    assert all(re.fullmatch(r"\w+", n) for n in names), names
    for path in (p for f in folders for p in f.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp")):
        text = path.read_text()
        for match in re.finditer(r"__global__", text):
            after = text[match.start():match.start() + 400]
            assert any(re.search(rf"\b{n}\s*\(", after) for n in names), (
                f"{path.relative_to(trees.ROOT)}: a __global__ function whose name lab_kernels does not find: "
                f"{after[:120]!r}")


# ---------------------------------------------------------------- test shards (./course sanitize --shards)
def test_shards_split_the_selected_tests_exactly(tmp_path):
    """COURSE_TEST_SHARD=I/N keeps every N-th test after -k and -m chose: the shards are disjoint and together the
    unsharded selection."""
    def collected(shard: str | None) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != trees.SHARD_ENV}
        if shard:
            env[trees.SHARD_ENV] = shard
        run = subprocess.run([sys.executable, "-m", "pytest", "tests/test_03_reductions.py", "--collect-only", "-q",
                              "-p", "no:cacheprovider", "-m", "not perf", "-k", "warp or sum"],
                             cwd=trees.ROOT, env=env, capture_output=True, text=True)
        return [line for line in run.stdout.splitlines() if "::" in line]

    whole = collected(None)
    shards = [collected(f"{i}/3") for i in range(3)]
    assert len(whole) > 10
    assert sorted(sum(shards, [])) == sorted(whole)
    assert all(len(s) in (len(whole) // 3, len(whole) // 3 + 1) for s in shards)


def test_sanitizer_merges_a_tools_shards():
    import sanitizer

    rows = [{"tool": "racecheck", "errors": e, "ran": True, "tests": t, "failed": f, "findings": fi,
             "failed_tests": ft, "summaries": [f"SUMMARY: {e} errors"], "process_error": pe, "log": f"log{i}",
             "seconds": s}
            for i, (e, t, f, fi, ft, pe, s) in enumerate([(0, 10, 0, [], [], None, 30.0),
                                                          (2, 11, 1, ["Race A"], ["t1: x"], None, 50.0),
                                                          (1, 9, 0, ["Race A", "Race B"], [], "deadline", 40.0)])]
    merged = sanitizer.merge_shards(rows)
    assert (merged["errors"], merged["tests"], merged["failed"], merged["seconds"]) == (3, 30, 1, 50.0)
    assert merged["findings"] == ["Race A", "Race B"] and merged["failed_tests"] == ["t1: x"]
    assert merged["process_error"] == "deadline" and not sanitizer.is_clean(merged)
    assert sanitizer.merge_shards(rows[:1]) is rows[0]


# ---------------------------------------------------------------- a tool that died, one that cannot run, and a finding
_INTERNAL_ERROR_LOG = """========= COMPUTE-SANITIZER
tests/test_05_tensor_cores.py::test_linear_act[17x40x24-bf16-gelu] ========= Internal Sanitizer Error: The Sanitizer \
failed to handle a hardware exception.
Fatal Python error: Aborted
========= Error: process didn't terminate successfully
========= Target application returned an error
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


_CLEAN_LOG = ("========= COMPUTE-SANITIZER\n1 passed\n"
              "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")


_RACE_LOG = ("========= Error: Race reported between Write access at void linear_act_kernel<16>(int)+0x1b0 in "
             "lin.cu:23\n"
             "========= and Read access at void linear_act_kernel<16>(int)+0x2c0 in lin.cu:30\n"
             "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")


def _fake_sanitizer_runs(monkeypatch, tmp_path, racecheck_runs, tool="racecheck"):
    """sanitizer.sanitize over lab 05 with runner.run_pytest faked: each run of `tool` takes the next (log text,
    process error) of `racecheck_runs`, the other tools run clean; returns that tool's command lines."""
    import sanitizer

    calls, lock = [], threading.Lock()

    def run_pytest(python, files, *, label, wrapper, **_):
        if tool in wrapper:
            with lock:
                log, error = racecheck_runs[len(calls)]
                calls.append(wrapper)
        else:
            log, error = "========= ERROR SUMMARY: 0 errors\n", None
        path = tmp_path / f"{label}.log"
        path.write_text(log)
        return {"log": str(path), "seconds": 1.0, "tests": [], **({"error": error} if error else {})}

    monkeypatch.setattr(sanitizer.runner, "run_pytest", run_pytest)
    monkeypatch.setattr(sanitizer, "lab_kernels", lambda lab, impl: ["linear_act_kernel"])
    return calls


def test_sanitizer_runs_a_dead_tool_again_alone_over_every_kernel(monkeypatch, tmp_path):
    """A tool that dies on its own (racecheck's Internal Sanitizer Error with --kernel-name, labs 05 and 10 on an
    H200) runs once more without the kernel filter; a clean second run makes the row clean, and the lab passes."""
    import sanitizer

    died = "the test process died (exit code 6) before finishing"
    calls = _fake_sanitizer_runs(monkeypatch, tmp_path, [(_INTERNAL_ERROR_LOG, died), (_CLEAN_LOG, None)])
    result = {}
    sanitizer.run_into("python", result, trees.find_lab("05"), "solutions", quick=True, quiet=True)
    row = next(r for r in result["sanitizer"] if r["tool"] == "racecheck")
    assert len(calls) == 2 and "--kernel-name" in calls[0]
    assert "--kernel-name" not in calls[1], "the retry must instrument every kernel"
    assert sanitizer.is_clean(row) and "Internal Sanitizer Error" in row["retried_after"], row
    assert not result.get("error") and not result.get("sanitizer_not_checked")


_NO_START_LOG = """========= COMPUTE-SANITIZER
ImportError while loading conftest '/work/main/tests/conftest.py'.
E   ImportError: cannot import name 'build' from partially initialized module 'harness'
========= Error: Target application terminated before first instrumented API call
"""


def test_sanitizer_whose_program_never_started_runs_again(monkeypatch, tmp_path):
    """A memcheck whose test process died before its first CUDA call (seen in a class run on an H200: pytest's
    conftest failed to import) found nothing about the student's code: it runs again alone, and a clean second run
    passes the lab instead of zeroing it."""
    import sanitizer

    died = "the test process died (exit code 255) before finishing"
    clean = "========= COMPUTE-SANITIZER\n1 passed\n========= ERROR SUMMARY: 0 errors\n"
    calls = _fake_sanitizer_runs(monkeypatch, tmp_path, [(_NO_START_LOG, died), (clean, None)], tool="memcheck")
    result = {}
    sanitizer.run_into("python", result, trees.find_lab("05"), "solutions", quick=True, quiet=True)
    row = next(r for r in result["sanitizer"] if r["tool"] == "memcheck")
    assert len(calls) == 2 and sanitizer.is_clean(row) and "before first instrumented" in row["retried_after"], row
    assert not result.get("error") and not result.get("sanitizer_not_checked")


def test_sanitizer_that_cannot_run_is_not_checked_and_fails_nothing(monkeypatch, tmp_path):
    import sanitizer

    died = "the test process died (exit code 6) before finishing"
    _fake_sanitizer_runs(monkeypatch, tmp_path, [(_INTERNAL_ERROR_LOG, died)] * 2)
    rows = sanitizer.sanitize("python", trees.find_lab("05").test_file, impl="solutions", lab_number="05",
                              tools=("racecheck",), quick=True, quiet=True)
    assert "could not run" in rows[0]["not_checked"] and not sanitizer.fails_the_lab(rows[0])
    result = {"sanitizer": rows, "sanitizer_not_checked": [rows[0]["not_checked"]], "lab": "05-tensor-cores"}
    assert report.lab_failure(result) is None, "a tool that could not run must not zero the lab"


def test_sanitizer_finding_still_fails_the_lab(monkeypatch, tmp_path):
    import sanitizer

    calls = _fake_sanitizer_runs(monkeypatch, tmp_path, [(_RACE_LOG, None)])
    result = {}
    sanitizer.run_into("python", result, trees.find_lab("05"), "solutions", quick=True, quiet=True)
    assert len(calls) == 1, "a finding is never retried"
    assert "Race reported" in result["error"]


def test_sanitizer_retry_does_not_count_pytorchs_kernels(monkeypatch, tmp_path):
    """The retry instruments PyTorch's kernels too: a report about one of them alone is not the lab's finding."""
    import sanitizer

    died = "the test process died (exit code 6) before finishing"
    foreign = _RACE_LOG.replace("linear_act_kernel<16>(int)", "fmha_cutlassB_f32_aligned_64x64_k64_sm80(Params)")
    _fake_sanitizer_runs(monkeypatch, tmp_path, [(_INTERNAL_ERROR_LOG, died), (foreign, None)])
    rows = sanitizer.sanitize("python", trees.find_lab("05").test_file, impl="solutions", lab_number="05",
                              tools=("racecheck",), quick=True, quiet=True)
    assert sanitizer.is_clean(rows[0]) and rows[0]["foreign_findings"], rows[0]

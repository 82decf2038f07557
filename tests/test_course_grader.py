"""The grader under stress: broken, crashing and hanging submissions, a whole class at
once, Gradescope's results, the quick compute-sanitizer pass of `grade`, and a build the
machine failed, compiled once more. (`./course doctor`: test_course_doctor.py; harness.perf's
timings: test_course_perf.py.)"""
from __future__ import annotations

import csv
import hashlib
import importlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from coursekit import trees
from harness import HAS_GPU, NO_GPU_REASON, mutants

COURSE = str(trees.ROOT / "course")
LAB = trees.find_lab("00")


def planted(root: Path, student: str, source_tree: str = "solutions", edits: dict | None = None) -> Path:
    """A submission folder: lab 00 copied from a tree, with text edits planted in its files."""
    return mutants.plant(LAB, root / student, [(name, old, new) for name, (old, new) in (edits or {}).items()],
                         source=source_tree)


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def grade_all(submissions: Path, out: Path, *extra: str) -> tuple[dict, list[dict], str]:
    run = subprocess.run([COURSE, "grade", "00", "--all", "--impl", str(submissions), "--json", str(out), *extra],
                         capture_output=True, text=True, timeout=1800)
    assert out.exists(), f"grade --all wrote no report:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    with open(out.with_suffix(".csv")) as handle:
        rows = list(csv.DictReader(handle))
    return json.loads(out.read_text()), rows, run.stdout


WILD_WRITE = ("    y[i] = alpha * x[i];", "    y[i + (int64_t{1} << 40)] = alpha * x[i];")
SPIN_FOREVER = ("    y[i] = alpha * x[i];",
                "    for (;;) __nanosleep(1000);  // a side effect the compiler must keep\n    y[i] = alpha * x[i];")
SYNTAX_ERROR = ("#include <algorithm>", "#include <algorithm>\nthis is not C++;")


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """A good (alice), an unfinished (bob: the labs/ skeleton) and an uncompilable (carol) submission
    of lab 00, graded once with --all --format gradescope (three builds: shared by the tests below)."""
    root = tmp_path_factory.mktemp("graded")
    submissions = root / "class"
    planted(submissions, "alice")
    planted(submissions, "bob", source_tree="labs")
    planted(submissions, "carol", edits={"scale.cu": SYNTAX_ERROR})
    before = tree_digest(submissions)
    gradescope_dir = root / "gradescope"
    report, rows, output = grade_all(submissions, root / "grades.json", "--format", "gradescope",
                                     "--out", str(gradescope_dir))
    return {"submissions": submissions, "modified": tree_digest(submissions) != before, "report": report, "rows": rows,
            "output": output, "gradescope": gradescope_dir}


def test_batch_grading_one_row_per_student_and_lab(graded_class):
    """A good, an unfinished and an uncompilable submission: each graded, none modified, none breaking another."""
    report, rows, output = graded_class["report"], graded_class["rows"], graded_class["output"]
    assert not graded_class["modified"], "grading modified a submission"
    assert set(report) == {"alice", "bob", "carol"} and len(rows) == 3
    by_student = {row["student"]: row for row in rows}
    assert by_student["alice"]["failed"] == "0" and int(by_student["alice"]["passed"]) > 0, output
    bob_todos = [todo for test in report["bob"][0]["tests"] for todo in test.get("todos", [])]
    assert int(by_student["bob"]["failed"]) > 0 and any(todo["task"].startswith("lab00.") for todo in bob_todos), (
        "the skeleton's failures must carry the open TODOs they need (the `todos` field)")
    assert int(by_student["carol"]["failed"]) > 0 and "did not build" in by_student["carol"]["errors"]


# ---------------------------------------------------------------- Gradescope
# https://gradescope-autograders.readthedocs.io/en/latest/specs/: the fields ./course writes.
GRADESCOPE_FIELDS = {"score": (int, float), "execution_time": (int, float), "output": str, "tests": list}
GRADESCOPE_TEST_FIELDS = {"name": str, "score": (int, float), "max_score": (int, float), "output": str,
                          "visibility": str, "status": str}
GRADESCOPE_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def gradescope_results(path: Path, points: dict) -> dict:
    """results.json, checked against Gradescope's schema and against the lab's tasks and POINTS."""
    data = json.loads(path.read_text())
    for key, types in GRADESCOPE_FIELDS.items():
        assert isinstance(data.get(key), types), f"{path}: {key!r} missing or not {types}"
    tasks = {}
    for test in data["tests"]:
        for key, types in GRADESCOPE_TEST_FIELDS.items():
            assert isinstance(test.get(key), types), (
                f"{path}: test {test.get('name')!r}: {key!r} missing or not {types}")
        assert test["visibility"] in GRADESCOPE_VISIBILITY and test["status"] in ("passed", "failed"), test
        assert 0 <= test["score"] <= test["max_score"], test
        tasks[test["name"].split()[1].rstrip(":")] = test
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]))
    assert set(tasks) >= set(points), f"{path}: one test per task of POINTS expected, got {sorted(tasks)}"
    for task, maximum in points.items():
        assert tasks[task]["max_score"] == maximum, (task, tasks[task]["max_score"], maximum)
    return data


def test_gradescope_results_for_a_good_an_unfinished_and_an_uncompilable_submission(graded_class, tmp_path):
    report = graded_class["report"]
    points = report["alice"][0].get("labs", {}).get(LAB.name, {}).get("points", {})
    results = {student: gradescope_results(graded_class["gradescope"] / student / "results.json", points)
               for student in ("alice", "bob", "carol")}
    carol = results["carol"]
    assert carol["score"] == 0 and all(t["score"] == 0 for t in carol["tests"])
    # nvcc's "f.cu(6): error", g++'s "f.cu:6:1: error"
    compiler_error = re.compile(r"scale\.cu(\(\d+\)|:\d+:\d+): error")
    for text in [carol["output"], *(t["output"] for t in carol["tests"])]:
        assert "did not build" in text and compiler_error.search(text), f"no compiler error in:\n{text[:3000]}"
    alice, bob = results["alice"], results["bob"]
    assert bob["score"] <= alice["score"], (bob["score"], alice["score"])
    # Where a test that ran (on CPU: the launch configuration, axpy's input check) tells them apart, it shows.
    told = any(t["outcome"] == "failed" and t.get("kind") != "reference" and t.get("tasks")
               and t["name"] != "test_builds"
               for t in report["bob"][0]["tests"])
    if told:
        assert bob["score"] < alice["score"], (bob["score"], alice["score"])
    assert alice["score"] > 0 or not any(t["outcome"] == "passed" and t.get("tasks") and t["name"] != "test_builds"
                                         for t in report["alice"][0]["tests"])
    # A single run writes the same mapping where --out says (alice's build is reused: same folder).
    single = tmp_path / "results.json"
    run = subprocess.run([COURSE, "grade", "00", "--impl", str(graded_class["submissions"] / "alice"),
                          "--format", "gradescope", "--out", str(single)], capture_output=True, text=True, timeout=1800)
    assert single.exists(), f"grade --format gradescope wrote nothing:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    assert gradescope_results(single, points)["score"] == alice["score"]


def test_gradescope_out_needs_the_format():
    run = subprocess.run([COURSE, "grade", "00", "--out", "x.json"], capture_output=True, text=True)
    assert run.returncode == 2 and "--format gradescope" in run.stdout, run.stdout + run.stderr
    run = subprocess.run([COURSE, "grade", "00", "--leaderboard", "00"], capture_output=True, text=True)
    assert run.returncode == 2 and "--format gradescope" in run.stdout, run.stdout + run.stderr


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_crashing_and_hanging_kernels_fail_their_own_submission(tmp_path):
    submissions = tmp_path / "class"
    planted(submissions, "crasher", edits={"scale.cu": WILD_WRITE})
    planted(submissions, "hanger", edits={"scale.cu": SPIN_FOREVER})
    planted(submissions, "zoe")
    report, rows, output = grade_all(submissions, tmp_path / "grades.json", "--deadline", "90")
    by_student = {row["student"]: row for row in rows}
    assert by_student["zoe"]["failed"] == "0", f"a good submission graded after a crash must pass:\n{output}"
    crash = json.dumps(report["crasher"])
    assert "illegal" in crash.lower() or "died" in crash, f"no CUDA error text for the crashing kernel:\n{crash[:2000]}"
    assert "./course sanitize 00" in crash, "the crash report must give the compute-sanitizer command"
    hang = report["hanger"][0]
    assert "deadline" in hang.get("error", ""), f"the hanging kernel was not reported as hung: {hang.get('error')}"


ONE_PAST_THE_END = ("    y[i] = alpha * x[i];", "    y[i + 1] = alpha * x[i];")


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_sanitize_finds_a_write_one_past_the_end(tmp_path):
    """A write one element past the output: often invisible to the comparison, never to memcheck."""
    submission = planted(tmp_path, "off-by-one", edits={"scale.cu": ONE_PAST_THE_END})
    out = tmp_path / "sanitize.json"
    run = subprocess.run([COURSE, "sanitize", "00", "--impl", str(submission), "--tool", "memcheck",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, f"./course sanitize passed a kernel that writes out of bounds:\n{run.stdout[-2000:]}"
    memcheck = json.loads(out.read_text())["tools"][0]
    # On the H200 (2026-11-21) memcheck reported this write as the kernel's launch failure
    # ("Program hit cudaErrorLaunchFailure"), with 3 errors in its summary.
    reported = any("Invalid __global__" in line or "launch failure" in line for line in memcheck["findings"])
    assert memcheck["errors"] > 0 and reported, (memcheck["findings"], memcheck["summaries"])


# ---------------------------------------------------------------- the quick compute-sanitizer pass of `grade`
def lab_mutant(lab, name: str) -> mutants.Mutant:
    """One of a lab grader's own MUTANTS, by name (the planted bug is defined once, there)."""
    return next(m for m in importlib.import_module(lab.test_file.stem).MUTANTS if m.name == name)


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_grade_runs_the_quick_sanitizer_pass_and_fails_a_race(tmp_path):
    """`./course grade` on a GPU runs memcheck, racecheck and synccheck over the grader's SANITIZE_CASES:
    the reference is clean, and a block reduce whose warps read shared memory before every warp has
    written it fails the lab with racecheck's own report (the comparison alone passes it on most runs)."""
    lab = trees.find_lab("03")
    race = lab_mutant(lab, "race-on-shared-partials")
    reports = {}
    for name, edits in (("reference", []), ("race", [(race.file, race.old, race.new)])):
        root = mutants.plant(lab, tmp_path / name, edits)
        out = tmp_path / f"{name}.json"
        run = subprocess.run([COURSE, "grade", "03", "--impl", str(root), "--json", str(out)], capture_output=True,
                             text=True, timeout=900)
        assert out.exists(), f"grade wrote no report:\n{run.stdout[-3000:]}"
        reports[name] = (json.loads(out.read_text())["results"][0], run.stdout)
    clean, output = reports["reference"]
    assert [r["tool"] for r in clean.get("sanitizer", [])] == ["memcheck", "racecheck", "synccheck"], output[-2000:]
    assert not clean.get("error"), f"the reference failed the quick sanitizer pass: {clean.get('error')}"
    per_tool = ", ".join(f"{row['tool']} {row['seconds']:.0f} s" for row in clean["sanitizer"])
    print(f"quick sanitizer pass over lab 03's reference: {clean['sanitizer_seconds']} s ({per_tool})")
    race, output = reports["race"]
    assert "racecheck" in (race.get("error") or ""), f"the race was not reported by racecheck:\n{output[-3000:]}"
    assert "Race reported" in race["error"] or "hazard" in race["error"].lower(), race["error"]


# ---------------------------------------------------------------- a build the machine failed (harness.build)
def test_a_build_the_machine_failed_is_compiled_once_more_then_called_the_graders(monkeypatch):
    """harness.build: a build that failed for the machine's reason (a compiler killed, out of memory) is compiled
    once more with MAX_JOBS=1; a second such failure raises BuildInfrastructureError (not the student's), a compile
    error is never retried."""
    from harness import build

    lab, tree = trees.find_lab("00"), trees.resolve_tree("solutions")
    attempts = []

    def compile_failing(*failures):
        def fake(*args):
            attempts.append(os.environ.get("MAX_JOBS"))
            failure = failures[min(len(attempts), len(failures)) - 1]
            if failure:
                raise RuntimeError(f"Error building extension 'x':\n{failure}")
            return "module"
        return fake

    oom = "nvcc error   : 'cicc' died due to signal 9 (Kill signal)"
    monkeypatch.setenv("MAX_JOBS", "8")
    monkeypatch.setattr(build, "_compile_and_import", compile_failing(oom, None))
    assert build._compile_once_more_if_the_machine_failed(lab, tree, False, None) == "module"
    assert attempts == ["8", "1"] and os.environ["MAX_JOBS"] == "8"
    attempts.clear()
    monkeypatch.setattr(build, "_compile_and_import", compile_failing(oom, oom))
    with pytest.raises(build.BuildInfrastructureError, match="not your code"):
        build._compile_once_more_if_the_machine_failed(lab, tree, False, None)
    attempts.clear()
    error = "scale.cu(12): error: identifier \"y\" is undefined"
    monkeypatch.setattr(build, "_compile_and_import", compile_failing(error))
    with pytest.raises(RuntimeError, match="is undefined"):
        build._compile_once_more_if_the_machine_failed(lab, tree, False, None)
    assert attempts == ["8"], "a compile error must not be retried"

"""A class at scale (issue 19): `grade --all --jobs N` runs submissions at once, `--shard I/N` grades a
slice of the class, and `report merge` joins the slices; the results must not depend on either."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import report  # noqa: E402
import runner  # noqa: E402

from coursekit import trees
from harness import mutants

COURSE = str(trees.ROOT / "course")
LAB = trees.find_lab("00")
SYNTAX_ERROR = ("scale.cu", "#include <algorithm>", "#include <algorithm>\nthis is not C++;")
GRID_TOO_SMALL = ("scale.cu", "std::min(needed_blocks, resident_blocks)", "std::min<int64_t>(needed_blocks, 1)")
# The CSV columns that say how a student did (not the failure messages: they quote random inputs).
CSV_OUTCOME = ("student", "lab", "passed", "failed", "skipped", "points", "max_points")


def course(*args: str, timeout: int = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COURSE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def read_class(out: Path) -> tuple[dict, list[dict]]:
    with open(out.with_suffix(".csv")) as handle:
        return json.loads(out.read_text()), list(csv.DictReader(handle))


def outcomes(report_json: dict) -> dict:
    """Per student and lab: each test's outcome, the open TODOs its failures name, whether the run errored."""
    return {student: {result["label"]: {"tests": {t["name"]: t["outcome"] for t in result["tests"]},
                                        "todos": sorted({(todo["task"], todo["file"], todo["line"])
                                                         for t in result["tests"] for todo in t.get("todos", [])}),
                                        "error": bool(result.get("error"))}
                      for result in results}
            for student, results in report_json.items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Four submissions of lab 00: good (alice), the skeleton (bob), uncompilable (carol), a CPU-visible bug
    (dave), graded three ways on the same builds (the same folders):
      - whole, --jobs 2 with the GPU machine's schedule (COURSE_PERF_ALONE=1: the perf and large cases of
        each run after the pool, one run at a time): the four cold builds, two at a time;
      - --shard 1/2 (alice, carol) with --jobs 1: one run after another, as before --jobs;
      - --shard 2/2 (bob, dave) with --jobs 2 and this machine's schedule (no GPU: the perf and large cases,
        which skip, in the pool);
    then the shards merged with report merge."""
    root = tmp_path_factory.mktemp("class")
    submissions = root / "class"
    for student, source, edits in (("alice", "solutions", []), ("bob", "labs", []),
                                   ("carol", "solutions", [SYNTAX_ERROR]), ("dave", "solutions", [GRID_TOO_SMALL])):
        mutants.plant(LAB, submissions / student, edits, source=source)
    # --no-sanitize: on a GPU the quick compute-sanitizer pass adds ~25 s to each of the twelve runs, and
    # test_course_grader.py tests that pass; here only the scheduling and the reports are under test.
    grade = ("grade", "00", "--all", "--impl", str(submissions), "--no-sanitize")
    runs = {"whole": course(*grade, "--jobs", "2", "--json", str(root / "all.json"), "--format", "gradescope",
                            "--out", str(root / "gradescope-all"), env={runner.PERF_ALONE_ENV: "1"})}
    for index, jobs in ((1, "1"), (2, "2")):
        runs[index] = course(*grade, "--shard", f"{index}/2", "--jobs", jobs,
                             "--json", str(root / f"shard-{index}.json"), env={runner.PERF_ALONE_ENV: "0"})
    runs["merge"] = course("report", "merge", str(root / "shard-1.json"), str(root / "shard-2.json"),
                           "-o", str(root / "merged.json"),
                           "--format", "gradescope", "--out", str(root / "gradescope-merged"))
    for name, run in runs.items():
        assert run.returncode == 0, f"{name}: exit {run.returncode}\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    return {"root": root, "submissions": submissions, "runs": runs}


def test_shards_merged_equal_the_whole_class_and_jobs_do_not_change_results(graded):
    """The shards merged (alice and carol graded one run after another, bob and dave two at a time) == the
    whole class two at a time with the perf and large cases apart: per student and test the same outcomes,
    open TODOs and errors; the same CSV counts and points; the same Gradescope scores."""
    root = graded["root"]
    whole, whole_rows = read_class(root / "all.json")
    merged, merged_rows = read_class(root / "merged.json")
    assert list(whole) == list(merged) == ["alice", "bob", "carol", "dave"]
    assert outcomes(merged) == outcomes(whole)
    assert [{k: row[k] for k in CSV_OUTCOME} for row in merged_rows] == [
        {k: row[k] for k in CSV_OUTCOME} for row in whole_rows]
    # The same schema (a merge leaves no shard tag); a run in two phases adds only the second one's log.
    for student in whole:
        assert set(merged[student][0]) | {"perf_log"} == set(whole[student][0]), student
    for student in whole:
        scores = [json.loads((root / folder / student / "results.json").read_text())["score"]
                  for folder in ("gradescope-all", "gradescope-merged")]
        assert scores[0] == scores[1], (student, scores)
    # The grades tell the four apart, whichever way they were run.
    by_student = {row["student"]: row for row in whole_rows}
    assert by_student["alice"]["failed"] == "0" and int(by_student["alice"]["passed"]) > 0
    assert "did not build" in by_student["carol"]["errors"]
    assert int(by_student["bob"]["failed"]) > 0 and int(by_student["dave"]["failed"]) > 0


def test_shards_are_round_robin_slices_with_their_own_reports(graded):
    root = graded["root"]
    shards = [json.loads((root / f"shard-{index}.json").read_text()) for index in (1, 2)]
    assert [list(shard) for shard in shards] == [["alice", "carol"], ["bob", "dave"]]
    assert all(r["shard"] == f"{index}/2" for index, shard in enumerate(shards, 1) for rs in shard.values() for r in rs)
    assert (root / "shard-1.csv").exists() and (root / "shard-2.csv").exists()
    assert "shard 1/2: 2 of the 4 submissions" in graded["runs"][1].stdout


def test_concurrent_runs_show_their_progress(graded):
    """Each run as it ends with the counts done / running / queued and an ETA; the perf and large cases of each
    run that built, started as its correctness run ends and taking the GPU in turn (on a GPU: here forced), each
    announced, with their own counts."""
    output = graded["runs"]["whole"].stdout
    assert "2 at a time" in output and "MAX_JOBS" in output, output[-3000:]
    status = [line for line in output.splitlines() if "done," in line and "running" in line and "queued" in line]
    assert len(status) >= 7, output[-3000:]  # 4 correctness runs, then 3 perf runs
    assert any("ETA" in line for line in status), output[-3000:]
    # carol's lab does not build: no kernel of hers runs, so her perf and large cases ran in the pool
    announced = ("perf and large cases: each run's start as its correctness run ends, up to 2 at once, and take "
                 "the GPU in turn when no correctness run holds it")
    assert announced in output, output[-3000:]
    perf_lines = [line for line in output.split(announced)[1].splitlines() if "its perf and large cases" in line]
    assert sorted(line.split()[2] for line in perf_lines) == ["alice", "bob", "dave"], output[-3000:]
    assert "carol 00-first-kernel: its perf" not in output, output[-3000:]
    assert any(line.startswith("[course] 3/3 ") and line.endswith("3 done, 0 running, 0 queued")
               for line in output.splitlines()), output[-3000:]
    pool = graded["runs"][2].stdout
    assert "no GPU: the perf and large cases (which skip) in the pool too" in pool, pool[-3000:]


def test_every_run_reports_where_its_time_went(graded):
    """Each result's phases (runner.PHASES) add up: the work phases to its processes' seconds and its
    sanitizer pass; the class run ends with the breakdown line, its sums and the wall time."""
    root = graded["root"]
    for name in ("all", "shard-1", "shard-2"):
        for student, results in json.loads((root / f"{name}.json").read_text()).items():
            for result in results:
                phases = result["phases"]
                assert list(phases) == list(runner.PHASES), (name, student, phases)
                assert all(value >= 0 for value in phases.values()), (name, student, phases)
                work = sum(phases[key] for key in runner.WORK_PHASES)
                assert phases["total"] == pytest.approx(work, abs=0.01), (name, student, phases)
                # its processes' seconds, but the time a perf run waited for the GPU lock (counted in perf_wait)
                ran = result["seconds"] + phases["sanitizer"]
                assert ran - phases["perf_wait"] - 0.05 <= phases["total"] <= ran + 0.05, \
                    (name, student, phases, result["seconds"])
                assert phases["startup"] > 0 and phases["build"] > 0, (name, student, phases)
    whole = json.loads((root / "all.json").read_text())
    # carol, who did not build, waited for no GPU: her second run follows at once, in the pool. How long the others'
    # perf runs wait for the lock depends on which correctness runs still hold it when each asks (a race between
    # the runs: alice's measured 0.2 s once and more than 1 s before); that the lock keeps a timing apart from
    # every other run's tests is test_course_runner.py's test_the_timing_lock_keeps_two_runs_tests_apart.
    assert whole["carol"][0]["build_failed"] and not whole["alice"][0]["build_failed"]
    assert whole["carol"][0]["phases"]["perf_wait"] < 1.0
    for run in ("whole", 1, 2):
        line = [li for li in graded["runs"][run].stdout.splitlines() if li.startswith("[course] time over ")]
        assert len(line) == 1 and "s of work in" in line[0] and "perf wait" in line[0], graded["runs"][run].stdout


def test_the_timing_file_takes_writers_on_many_threads(tmp_path):
    """Background builds record their steps from their own threads while the main thread records its tests: every
    write must land whole (a shared partial name once made a rename find nothing, failing a reference check). A
    child process, so that this run's own timing file is left alone."""
    script = (
        "import json, sys, threading\n"
        "from harness import timing\n"
        "import pathlib, time\n"
        "rename = pathlib.Path.replace  # a rename that waits first: the window between write and rename, wide\n"
        "pathlib.Path.replace = lambda self, target: (time.sleep(0.0005), rename(self, target))[1]\n"
        f"timing.record_to({str(tmp_path / 'probe.json')!r})\n"
        "def churn():\n"
        "    for _ in range(50):\n"
        "        timing.build_started(); timing.build_ended(False); timing.test_started('t'); timing.test_ended()\n"
        "errors = []\n"
        "threading.excepthook = lambda failed: errors.append(repr(failed.exc_value))\n"
        "workers = [threading.Thread(target=churn) for _ in range(6)]\n"
        "[w.start() for w in workers]; [w.join() for w in workers]\n"
        "assert not errors, errors[:3]\n"
        f"print(json.loads(open({str(tmp_path / 'probe.timing.json')!r}).read())['build_failed'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH"))))
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
    assert [f.name for f in tmp_path.iterdir()] == ["probe.timing.json"], "a partial file was left behind"


def test_the_heartbeat_says_k_of_n_and_the_time_left():
    """A long run's progress line (every PROGRESS_EVERY_S): where it is, from the child's timing file, with an
    estimate of the time left at the pace of the tests so far, builds and GPU-lock waits not counted."""
    assert runner.progress_line({}, 12.0, now=112.0).startswith("starting (12 s")
    state = {"collected_at": 100.0, "tests_total": 40, "tests_done": 10, "build_s": 30.0, "lock_wait_s": 0.0}
    assert runner.progress_line(state, 60.0, now=150.0) == "10 of 40 tests done (60 s, about 60 s left)"
    assert runner.progress_line({**state, "build_since": 140.0}, 60.0, now=150.0) == (
        "10 of 40 tests done, building the lab (10 s so far; the first build takes longest)")
    assert runner.progress_line({**state, "tests_done": 0}, 60.0, now=150.0) == "0 of 40 tests done (60 s)"


def test_process_phases_split_a_run_and_name_what_a_killed_one_was_doing():
    timing = {"collected_at": 102.0, "build_s": 20.0, "build_since": None, "alone_s": 5.0, "alone_since": None,
              "alone_build_s": 0.0}
    assert runner.process_phases(40.0, 100.0, 140.0, timing) == {"startup": 2.0, "build": 20.0,
                                                                 "correctness": 13.0, "perf": 5.0, "perf_wait": 0.0}
    # killed at its deadline 8 s into a build: those 8 s are build time
    building = {**timing, "build_s": 0.0, "alone_s": 0.0, "build_since": 122.0}
    assert runner.process_phases(30.0, 100.0, 130.0, building) == {"startup": 2.0, "build": 8.0,
                                                                   "correctness": 20.0, "perf": 0.0,
                                                                   "perf_wait": 0.0}
    # killed in a perf case that began with a 3 s load of the build: the rest of it is perf time
    timed = {**timing, "build_s": 3.0, "alone_s": 0.0, "alone_since": 110.0, "alone_build_s": 0.0}
    assert runner.process_phases(30.0, 100.0, 130.0, timed) == {"startup": 2.0, "build": 3.0,
                                                                "correctness": 8.0, "perf": 17.0, "perf_wait": 0.0}
    # dead before pytest collected anything: all start-up
    assert runner.process_phases(4.0, 100.0, 104.0, {}) == {"startup": 4.0, "build": 0.0, "correctness": 0.0,
                                                            "perf": 0.0, "perf_wait": 0.0}
    # a perf run that waited 6 s for the GPU lock (another run's timing): waiting, not correctness
    assert runner.process_phases(40.0, 100.0, 140.0, {**timing, "lock_wait_s": 6.0}) == {
        "startup": 2.0, "build": 20.0, "correctness": 7.0, "perf": 5.0, "perf_wait": 6.0}
    # a correctness run that waited 1.5 s for its shared lock before collecting: waiting, not start-up
    assert runner.process_phases(40.0, 100.0, 140.0, {**timing, "lock_wait_s": 1.5, "lock_wait_in_startup": True}) \
        == {"startup": 0.5, "build": 20.0, "correctness": 13.0, "perf": 5.0, "perf_wait": 1.5}
    # killed 4 s into a wait for the lock (the parent's deadline does not count waits; stop_all does kill)
    assert runner.process_phases(30.0, 100.0, 130.0, {**timing, "alone_s": 0.0, "lock_wait_since": 126.0}) == {
        "startup": 2.0, "build": 20.0, "correctness": 4.0, "perf": 0.0, "perf_wait": 4.0}
    phases = runner.job_phases({"phases": {"startup": 1, "build": 2, "correctness": 3, "perf": 4, "perf_wait": 1},
                                "sanitizer_seconds": 5}, queued=6, perf_wait=7)
    assert phases == {"queued": 6, "startup": 1, "build": 2, "correctness": 3, "sanitizer": 5, "perf_wait": 8,
                      "perf": 4, "total": 15}
    assert runner.breakdown([{"phases": phases}, {"phases": phases}], 10.0).endswith("total 30 s of work in 10 s "
                                                                                       "wall = 3.00x")


def test_a_run_killed_at_its_deadline_leaves_no_process_of_it_behind(tmp_path):
    """The deadline kills the run's whole process group: a build under way (ninja, nvcc) stops with it rather
    than holding cores the rest of the class needs. Here the "python" starts a child and hangs."""
    pid_file = tmp_path / "child.pid"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nsleep 300\n")
    fake.chmod(0o755)
    result = runner.run_pytest(str(fake), [], impl="labs", label="deadline-probe", lab_number="00", verbose=False,
                               deadline_s=2, quiet=True)
    assert "killed after the 2 s deadline" in result["error"]
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":  # dead, not yet reaped by whichever process adopted it
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError("the run's child outlived the deadline kill")
    # A build under way (the timing file, tests/harness/timing.py, says so) does not count against the deadline: the
    # run outlives its 2 s deadline while it builds, and is killed at the build's own limit, called a slow build.
    timing_file = trees.LOGS / "deadline-probe.timing.json"
    fake.write_text(f"#!/bin/sh\necho '{{\"collected_at\": '$(date +%s)', \"build_since\": '$(date +%s)'}}' "
                    f"> {timing_file}\nsleep 300\n")
    started = time.monotonic()
    result = runner.run_pytest(str(fake), [], impl="labs", label="deadline-probe", lab_number="00", verbose=False,
                               deadline_s=2, quiet=True, build_deadline_s=5)
    assert time.monotonic() - started > 4.5, "the build counted against the run's deadline"
    assert "a slow build, not a hanging kernel" in result["error"] and "hangs" not in result["error"], result["error"]
    assert result["phases"]["build"] > 4, result["phases"]
    # Built (build_s) for longer than the deadline, then hung: killed 2 s after the build's 3 s, called a hang.
    fake.write_text(f"#!/bin/sh\necho '{{\"collected_at\": '$(date +%s)', \"build_s\": 3.0}}' > {timing_file}\n"
                    "sleep 300\n")
    started = time.monotonic()
    result = runner.run_pytest(str(fake), [], impl="labs", label="deadline-probe", lab_number="00", verbose=False,
                               deadline_s=2, quiet=True)
    assert time.monotonic() - started > 4.5, "the finished build counted against the run's deadline"
    assert "its builds not counted" in result["error"] and "hangs" in result["error"], result["error"]


def test_the_per_test_deadline_kills_a_hang_early_and_spares_builds(tmp_path):
    """--test-deadline: a run whose current test (its timing file's "test_since") has gone on longer than that,
    its builds not counted, is killed then, named by its test; a test that is building is not."""
    timing_file = trees.LOGS / "test-deadline-probe.timing.json"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho '{{\"collected_at\": '$(date +%s)', \"test\": \"tests/t.py::test_spin\", "
                    f"\"test_since\": '$(date +%s)', \"build_s\": 0.0, \"test_build_s\": 0.0}}' > {timing_file}\n"
                    "sleep 300\n")
    fake.chmod(0o755)
    started = time.monotonic()
    result = runner.run_pytest(str(fake), [], impl="labs", label="test-deadline-probe", lab_number="00",
                               verbose=False, deadline_s=60, quiet=True, test_deadline_s=1.5)
    assert time.monotonic() - started < 15, "the per-test deadline did not kill the run early"
    assert "test_spin ran for more than 1.5 s" in result["error"] and "hangs" in result["error"], result["error"]
    fake.write_text(f"#!/bin/sh\necho '{{\"collected_at\": '$(date +%s)', \"test\": \"tests/t.py::test_big\", "
                    f"\"test_since\": '$(date +%s)', \"build_since\": '$(date +%s)'}}' > {timing_file}\n"
                    "sleep 300\n")
    result = runner.run_pytest(str(fake), [], impl="labs", label="test-deadline-probe", lab_number="00",
                               verbose=False, deadline_s=4, quiet=True, test_deadline_s=1.5, build_deadline_s=3)
    assert "a slow build" in result["error"], result["error"]


def test_a_class_starts_its_longest_labs_first_and_reports_in_its_own_order(monkeypatch):
    """runner.heaviest_first: with one worker the runs start later labs first (students in order within a lab);
    the results come back in the order of the jobs given."""
    started = []

    def run_pytest(python, files, *, label, **_):
        started.append(label)
        return {"tests": [], "seconds": 1.0, "phases": {}}

    monkeypatch.setattr(runner, "run_pytest", run_pytest)
    labs = [trees.find_lab(number) for number in ("00", "08", "03")]
    jobs = [runner.Job(student, lab.name, lab.number, lab.test_file, f"/tmp/{student}", 1)
            for student in ("alice", "bob") for lab in labs]
    results = runner.run_class("python", jobs, workers=1, deadline_s=60, alone=False, say=lambda line: None)
    firsts = [label for label in started if not label.endswith("-perf")]
    assert firsts == [f"{student}-{lab}" for lab in (labs[1].name, labs[2].name, labs[0].name)
                      for student in ("alice", "bob")], firsts
    assert list(results) == jobs


def test_a_build_the_machine_failed_is_graded_again_alone_then_not_graded(monkeypatch):
    """A run whose build the machine failed (the child's timing file names the cause: out of memory, a compiler
    killed) is graded again, whole and alone, after every other run; a second such failure leaves the lab
    NOT GRADED, which names the cause and blames no code (report.lab_failure); a success replaces the result."""
    labels, oom = [], "c++: fatal error: Killed signal terminated program cc1plus"

    def run_pytest(python, files, *, label, **_):
        labels.append(label)
        failing = label.startswith("bob") or label == "alice-00-first-kernel"
        return {"tests": [], "seconds": 1.0, "phases": {"build": 1.0},
                **({"build_infrastructure": oom, "build_failed": True} if failing else {})}

    monkeypatch.setattr(runner, "run_pytest", run_pytest)
    lab = trees.find_lab("00")
    jobs = [runner.Job(student, lab.name, lab.number, lab.test_file, f"/tmp/{student}", 1)
            for student in ("alice", "bob")]
    results = runner.run_class("python", jobs, workers=2, deadline_s=60, alone=False, say=lambda line: None)
    assert labels[-2:] == ["alice-00-first-kernel-retry", "bob-00-first-kernel-retry"], labels
    alice, bob = (results[job] for job in jobs)
    assert not alice.get("not_checked") and report.lab_failure(alice) is None, alice
    assert "Killed signal" in bob["not_checked"]
    assert report.lab_failure(bob).startswith("NOT GRADED, not your code's fault"), report.lab_failure(bob)


def test_merge_refuses_overlapping_or_incomplete_shards(graded, tmp_path):
    root = graded["root"]
    twice = course("report", "merge", str(root / "shard-1.json"), str(root / "shard-1.json"), "-o",
                   str(tmp_path / "x.json"))
    assert twice.returncode == 2 and "alice (in" in twice.stdout and "more than one file" in twice.stdout, twice.stdout
    mixed = course("report", "merge", str(root / "all.json"), str(root / "shard-2.json"),
                   "-o", str(tmp_path / "y.json"))
    assert mixed.returncode == 2 and "bob (in" in mixed.stdout, mixed.stdout
    missing = course("report", "merge", str(root / "shard-2.json"), "-o", str(tmp_path / "z.json"))
    assert missing.returncode == 2 and "shard(s) 1/2" in missing.stdout, missing.stdout
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()
    partial = course("report", "merge", str(root / "shard-2.json"), "-o", str(tmp_path / "z.json"), "--partial")
    assert partial.returncode == 0 and list(json.loads((tmp_path / "z.json").read_text())) == ["bob", "dave"]
    not_a_report = tmp_path / "bench.json"
    not_a_report.write_text(json.dumps({"lab": "00-first-kernel", "cases": []}))
    wrong = course("report", "merge", str(not_a_report), "-o", str(tmp_path / "w.json"))
    assert wrong.returncode == 2 and "not a class report" in wrong.stdout, wrong.stdout


def test_report_summary_reads_the_merged_report(graded, tmp_path):
    """`./course report summary` (tools/course/summary.py) over the merged class report."""
    run = course("report", "summary", str(graded["root"] / "merged.json"), "-o", str(tmp_path), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    text = (tmp_path / "merged-summary.md").read_text()
    assert all(student in text for student in ("alice", "bob", "carol", "dave")), text


# ---------------------------------------------------------------- the rules, without building anything
def test_shard_slicing_is_round_robin_by_name():
    names = [f"student{i:02d}" for i in range(11)]
    shuffled = names[5:] + names[:5]
    slices = [runner.shard(shuffled, index, 4) for index in range(1, 5)]
    assert slices[0] == ["student00", "student04", "student08"] and slices[3] == ["student03", "student07"]
    assert sorted(sum(slices, [])) == names  # every student in exactly one slice
    assert max(map(len, slices)) - min(map(len, slices)) <= 1
    assert runner.shard(names, 1, 1) == names and runner.shard(names[:2], 3, 3) == []
    assert runner.parse_shard("2/4") == (2, 4) and runner.parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/2", "3/2", "2", "a/b", "1/0"):
        with pytest.raises(ValueError):
            runner.parse_shard(bad)


def test_grade_refuses_bad_shards_and_jobs_without_all():
    for extra in (["--shard", "3/2"], ["--jobs", "0"]):
        run = course("grade", "00", "--all", "--impl", "labs", *extra)
        assert run.returncode == 2 and ("I must be from 1 to N" in run.stderr or "1 or more" in run.stderr), run.stderr
    run = course("grade", "00", "--jobs", "2")
    assert run.returncode == 2 and "add --all" in run.stdout, run.stdout


def test_an_empty_shard_writes_an_empty_report_under_its_default_name(tmp_path):
    (tmp_path / "class" / "only").mkdir(parents=True)
    default = trees.BUILD / "grades-shard-7-of-7.json"
    existed = {path: path.exists() for path in (default, default.with_suffix(".csv"))}
    try:
        run = course("grade", "00", "--all", "--impl", str(tmp_path / "class"), "--shard", "7/7", timeout=300)
        assert run.returncode == 0 and json.loads(default.read_text()) == {}, run.stdout + run.stderr
        assert "shard 7/7: 0 of the 1 submissions" in run.stdout
    finally:
        for path, was_there in existed.items():
            if not was_there:
                path.unlink(missing_ok=True)


def record(tests, **extra) -> dict:
    return {"label": "ada-00-first-kernel", "tests": [{"name": n, "outcome": o} for n, o in tests], "perf": [],
            "seed": 7, "seconds": 10.0, "returncode": 0, "log": "a.log", "torch": "2", "labs": {}, **extra}


def test_the_two_phases_of_a_run_merge_as_a_single_run_would_report_it():
    shared = record([("test_builds", "passed"), ("test_scale", "failed")], returncode=1)
    alone = record([("test_perf_scale", "passed")], perf=[{"name": "scale", "ratio": 1.0}], log="b.log",
                   copy_bandwidth_gbps=3000.0)
    merged = runner.merge_phases(shared, alone)
    assert [t["name"] for t in merged["tests"]] == ["test_builds", "test_scale", "test_perf_scale"]
    assert merged["returncode"] == 1 and merged["seconds"] == 20.0 and merged["seed"] == 7
    assert merged["log"] == "a.log" and merged["perf_log"] == "b.log" and merged["copy_bandwidth_gbps"] == 3000.0
    assert merged["perf"] == alone["perf"] and "error" not in merged
    # The perf run's process died: a single run would have died too, and reported no test.
    died = {k: v for k, v in record([], returncode=-11, error="the test process died").items() if k != "torch"}
    merged = runner.merge_phases({**shared, "sanitizer": [], "sanitizer_seconds": 1}, died)
    assert merged["tests"] == [] and merged["error"] == "the test process died" and "sanitizer" not in merged
    # conftest records the first CUDA error that broke its process's context as a field, not in prose.
    broken = record([("test_scale", "failed")], broken_context="CUDA error: an illegal memory access was encountered")
    assert runner.broke_context(broken) and not runner.broke_context(shared)


def test_shard_problems():
    assert report.shard_problem({}) is None
    assert report.shard_problem({"1/2": {"a"}, "2/2": {"b"}}) is None
    assert "different splits" in report.shard_problem({"1/2": {"a"}, "2/3": {"b"}})
    assert "two files" in report.shard_problem({"1/2": {"a", "c"}, "2/2": {"b"}})
    assert "2/2" in report.shard_problem({"1/2": {"a"}})
    assert report.shard_problem({"1/2": {"a"}}, empty_files=1) is None  # shard 2/2 held no student

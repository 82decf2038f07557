"""The class summary (tools/course/summary.py) over a synthetic class report: no build, no GPU."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import report  # noqa: E402
import summary  # noqa: E402

LAB = "00-first-kernel"
# The grader's POINTS and the solution's task titles, as a crashed lab gets them (read from the sources).
POINTS, TITLES = report.lab_tasks({"lab": LAB})
LAUNCH_LINE = "launch_config(n=N) on a N (N SMs, N threads/SM) gave N blocks x N threads:"
CRASH = "the test process died (exit code -11) before finishing; its last output:\nSegmentation fault"
OPEN_TODO = {"task": "lab00.2", "file": "scale.cu", "line": 41, "text": "derive the launch"}


def _test(name, outcome, tasks, message="", todos=(), kind="student"):
    return {"name": name, "outcome": outcome, "tasks": list(tasks), "message": message, "todos": list(todos),
            "kind": kind, "when": "call", "seconds": 0.1}


def _launch(gpu: str, outcome: str, message: str = "", todos=()):
    return _test(f"test_launch_config[{gpu}]", outcome, ["lab00.2"], message, todos)


def _result(student: str, tests: list[dict], **extra) -> dict:
    result = {"label": f"{student}-{LAB}", "lab": LAB, "impl": f"/subs/{student}", "seed": 1, "seconds": 2.0,
              "log": "x.log", "perf": [], "tests": tests, "labs": {LAB: {"points": POINTS, "titles": TITLES}}}
    result.update(extra)
    return result


def _common(reference: str = "passed") -> list[dict]:
    """What every student who built runs: the build, scale (tasks 1, 2), axpy (2, 3, 4), a skip, a reference check."""
    return [_test("test_builds", "passed", list(POINTS)),
            _test("test_scale[31]", "passed", ["lab00.1", "lab00.2"]),
            _test("test_axpy[31]", "passed", ["lab00.2", "lab00.3", "lab00.4"]),
            _test("test_empty_input", "skipped", ["lab00.4"], "no CUDA GPU on this machine"),
            _test("test_scale_refuses_cpu_tensor", reference, [], kind="reference")]


def class_report() -> dict:
    bob_t4 = "launch_config(n=31) on a T4 (40 SMs, 1024 threads/SM) gave 1 blocks x 1 threads:\n  not a multiple of 32"
    bob_a100 = "launch_config(n=4097) on a A100 (108 SMs, 2048 threads/SM) gave 1 blocks x 1 threads:\n  too few"
    cy_a100 = "launch_config(n=4097) on a A100 (108 SMs, 2048 threads/SM) gave 64 blocks x 96 threads:\n  too few"
    return {
        # ada passes everything that ran.
        "ada": [_result("ada", _common() + [_launch("31-T4", "passed"), _launch("4097-A100", "passed")])],
        # bob left TODO(lab00.2) open: both launch cases fail, with messages that differ only in numbers.
        "bob": [_result("bob", _common() + [_launch("31-T4", "failed", bob_t4, [OPEN_TODO]),
                                            _launch("4097-A100", "failed", bob_a100, [OPEN_TODO])])],
        # cy did the TODO, wrongly for one case (bob's message with other numbers), and broke a given check.
        "cy": [_result("cy", _common(reference="failed") + [_launch("31-T4", "passed"),
                                                            _launch("4097-A100", "failed", cy_a100)])],
        # dee's process died: no test records, no reported POINTS (read from the grader's source).
        "dee": [{"label": f"dee-{LAB}", "lab": LAB, "impl": "/subs/dee", "seed": 1, "seconds": 1.0, "log": "x.log",
                 "tests": [], "perf": [], "returncode": -11, "error": CRASH}],
    }


@pytest.fixture(scope="module")
def summarized() -> dict:
    return summary.summarize(class_report())


def test_the_lab_has_the_tasks_the_synthetic_report_uses():
    assert {"lab00.1", "lab00.2", "lab00.3", "lab00.4"} <= set(POINTS), POINTS


def test_counts_students_passing_each_task(summarized):
    tasks = summarized["labs"][LAB]["tasks"]
    assert {name: (t["passed"], t["graded"]) for name, t in tasks.items()} == {
        "lab00.1": (3, 4), "lab00.2": (1, 4), "lab00.3": (3, 4), "lab00.4": (3, 4)}
    assert summarized["labs"][LAB]["graded"] == 4
    assert tasks["lab00.2"]["todo_open"] == 1  # bob's; cy's failure names no open TODO


def test_groups_failure_lines_that_differ_only_in_numbers(summarized):
    failures = summarized["labs"][LAB]["tasks"]["lab00.2"]["failures"]
    # bob's two failing cases and cy's one are one line, counted once per student.
    assert failures[0] == {"line": LAUNCH_LINE, "students": 2}
    assert {"line": "the test process died (exit code -N) before finishing; its last output:", "students": 1} \
        in failures
    assert len(failures) == 2
    assert summarized["labs"][LAB]["tasks"]["lab00.1"]["failures"] == [failures[1]]  # only dee's crash


def test_normalise_keeps_the_first_line_and_drops_what_differs_per_student():
    message = "lab 00 (/subs/bob) did not build at 0x7ffe12, shape (3, 4097):\nthe compiler's output"
    assert summary.normalise(message, "/subs/bob") == "lab N (SUBMISSION) did not build at N, shape (N, N):"
    assert summary.normalise("") == "(no message)"


def test_per_student_totals(summarized):
    students = summarized["students"]
    assert list(students) == ["ada", "bob", "cy", "dee"]
    full = sum(POINTS.values())
    # report.task_scores's share rule: bob passed 2 of lab00.2's 4 tests that ran, cy 3 of 4; the build test and
    # the skipped test do not count; a crash scores 0 everywhere.
    expected = {"ada": full, "bob": full - POINTS["lab00.2"] / 2, "cy": full - POINTS["lab00.2"] / 4, "dee": 0}
    assert {name: s["points"] for name, s in students.items()} == expected
    assert all(s["max_points"] == full for s in students.values())
    assert (students["ada"]["passed"], students["ada"]["failed"], students["ada"]["skipped"]) == (6, 0, 1)
    assert (students["bob"]["passed"], students["bob"]["failed"]) == (4, 2)
    assert (students["cy"]["passed"], students["cy"]["failed"]) == (4, 2)  # one launch case, one reference check
    assert students["dee"]["errors"] == {LAB: "crashed"}
    assert not any(students[name]["errors"] for name in ("ada", "bob", "cy"))


def test_error_kind_tells_a_hang_and_sanitizer_findings_from_a_crash():
    hung = {"error": "killed after the 600 s deadline: a kernel probably hangs"}
    dirty = {"error": "compute-sanitizer memcheck: Invalid __global__ write",
             "sanitizer": [{"ran": True, "errors": 3, "process_error": None}]}
    kinds = [summary.error_kind(r) for r in (hung, dirty, {"error": CRASH}, {})]
    assert kinds == ["hung", "sanitizer", "crashed", None]


def test_print_table(summarized, capsys):
    summary.print_table(summarized)
    out = capsys.readouterr().out
    assert f"[2] {LAUNCH_LINE}" in out
    assert "lab00.2" in out and "1/4" in out
    assert f"{LAB} crashed" in out


def test_markdown_links_the_chart(summarized, tmp_path):
    written = summary.write_markdown(summarized, tmp_path / "class-summary.md")
    text = (tmp_path / "class-summary.md").read_text()
    assert f"[2] {LAUNCH_LINE}" in text and "| 1/4 |" in text and "| dee | 0 / 100 |" in text
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (./course setup report installs it): no chart to check")
    assert "![Pass rate per task](class-summary.png)" in text
    assert written == [tmp_path / "class-summary.md", tmp_path / "class-summary.png"]
    assert (tmp_path / "class-summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_without_matplotlib_says_how_to_install_it(summarized, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    written = summary.write_markdown(summarized, tmp_path / "class-summary.md")
    assert written == [tmp_path / "class-summary.md"]
    assert summary.SETUP_HINT in written[0].read_text()
    assert not (tmp_path / "class-summary.png").exists()


def test_main_reads_a_class_json(tmp_path, capsys):
    path = tmp_path / "week1.json"
    path.write_text(json.dumps(class_report()))
    assert summary.main([str(path), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "week1-summary.md").exists()
    assert "dee" in capsys.readouterr().out
    assert summary.main([str(tmp_path / "missing.json")]) == 2


def test_a_single_run_counts_as_one_student():
    result = summary.summarize({"impl": "/subs/ada", "results": class_report()["ada"]})
    assert list(result["students"]) == ["ada"]
    json.dumps(result)  # the summary is plain data


def test_speed_scores_rank_only_correct_verified_labs_and_the_summary_shows_their_spread(tmp_path):
    """The leaderboard's number (report.speed_score): the geometric mean of the perf ratios whose output was
    verified after timing; 0 when a correctness test failed (a failing perf bar alone does not zero it); none
    without perf cases (graded without a GPU). Gradescope gets one leaderboard column per chosen lab; the class
    summary shows the spread."""
    case = {"baseline_name": "torch.mul", "student_bar": 0.5}
    perf = [{**case, "name": "a", "ratio": 2.0, "verified": True},
            {**case, "name": "b", "ratio": 0.5, "verified": True}]
    passing = [_test("test_scale[31]", "passed", ["lab00.1"]),
               {**_test("test_perf_scale", "failed", ["lab00.1"], "below the student bar"), "perf": True}]
    fast = {"lab": LAB, "label": f"ada-{LAB}", "tests": passing, "perf": perf}
    assert report.speed_score(fast) == 1.0  # sqrt(2.0 * 0.5); the perf bar's failure does not count
    unverified = {**fast, "perf": [*perf, {**case, "name": "c", "ratio": 50.0}]}  # its output failed the check
    assert report.speed_score(unverified) == 1.0
    wrong = {**fast, "tests": [*passing, _test("test_scale[4097]", "failed", ["lab00.1"], "wrong")]}
    assert report.speed_score(wrong) == 0.0
    assert report.speed_score({**fast, "perf": []}) is None and report.speed_score({**fast, "error": CRASH}) == 0.0
    board = report.gradescope([fast], ["00"])["leaderboard"]
    assert board == [{"name": "00 speed-up over PyTorch (geomean)", "value": 1.0, "order": "desc"}]
    assert "leaderboard" not in report.gradescope([fast]) and report.gradescope([fast], ["01"])["leaderboard"] == []
    fastest = {**fast, "label": f"bo-{LAB}", "perf": [{**case, "name": "a", "ratio": 4.0, "verified": True}]}
    summed = summary.summarize({"ada": [fast], "bo": [fastest], "cy": [{**wrong, "label": f"cy-{LAB}"}]})
    assert sorted(summed["labs"][LAB]["speed"]) == [0.0, 1.0, 4.0]
    spread = summary.speed_spread(summed["labs"][LAB]["speed"])
    assert spread == ("speed-up over PyTorch (geomean of the perf cases), 3 students: min 0.00x, q1 0.50x, "
                      "median 1.00x, q3 2.50x, max 4.00x; 1 at 0 (a correctness failure)")
    written = summary.write_markdown(summed, tmp_path / "class-summary.md")
    assert "Speed-up over PyTorch (geomean of the perf cases), 3 students" in written[0].read_text()

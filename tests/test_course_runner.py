"""How a lab's tests are run (tools/course/cli.py's grade_lab, runner.py, harness.notebooks, tests/conftest.py). On a
GPU the notebook's run and the quick sanitizer pass go beside the graded run, whose timed cases wait for that side work
and run last; a timing lock keeps one run's perf cases apart from every other run's tests; a notebook run that died
fails the notebook's test only, and a notebook kernel that never answers is started once more before the test is
skipped as not checked. No GPU and no build: the runs are faked or small pytest processes."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from coursekit import jit, trees


# ---------------------------------------------------------------- the notebook runner
@pytest.mark.parametrize("failures, expect_calls, expect_skip", [(0, 1, False), (1, 2, False), (2, 2, True)])
def test_notebook_kernel_that_never_answers_is_started_once_more(monkeypatch, failures, expect_calls, expect_skip):
    """A kernel that does not answer (two kernels started at once took one TCP port: 1 of 10 parallel graders on the
    GPU box) gets one more start; a second failure skips the test as not checked (the grader's tool failed: no cell
    ran), never fails it."""
    nbclient = pytest.importorskip("nbclient")
    from harness import notebooks

    calls = []

    class FakeClient:
        def __init__(self, notebook, **kwargs):
            self.notebook = notebook

        def execute(self):
            calls.append(1)
            if len(calls) <= failures:
                raise RuntimeError("Kernel didn't respond in 60 seconds")

    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    for name in ("COURSE_ROOT", jit.BUILD_DIR_ENV, jit.MODULE_ENV):  # execute() sets them: restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    lab = trees.find_lab("00")
    if expect_skip:
        with pytest.raises(pytest.skip.Exception, match="not checked: the notebook's kernel did not start"):
            notebooks.execute(lab, trees.resolve_tree("solutions"))
    else:
        notebooks.execute(lab, trees.resolve_tree("solutions"))
    assert len(calls) == expect_calls


# ---------------------------------------------------------------- the notebook beside the graded run
def _cli():
    import cli  # tools/course, on sys.path above; imported here, where its tests need it

    return cli


@pytest.mark.parametrize("gpu", [True, False])
def test_grade_runs_the_notebook_beside_the_graded_run(monkeypatch, gpu):
    """On a GPU the graded run leaves the notebook out and a second run takes it at the same time, with the same
    seed; the graded run is told the file that is held until the notebook's run ends (its timed cases wait for it),
    and the file is gone when grade_lab returns. The notebook's test joins the lab's result, then the sanitizer pass
    runs. Without a GPU one run takes every test."""
    cli = _cli()
    runs, passes, held = [], [], []

    def fake_run(python, files, impl, label, **kw):
        runs.append((label, kw.get("keywords"), kw.get("seed")))
        side_work = (kw.get("extra_env") or {}).get(trees.SIDE_WORK_ENV)
        if side_work:
            held.append(Path(side_work))
        name = cli.NOTEBOOK_TEST if kw.get("keywords") == cli.NOTEBOOK_TEST else "test_op"
        return {"tests": [{"name": name, "outcome": "passed", "tasks": ["lab00.1"], "kind": "student"}],
                "seed": kw.get("seed") or 1234, "returncode": 0, "log": f"{label}.log"}

    monkeypatch.setattr(cli, "run_lab_tests", fake_run)
    monkeypatch.setattr(cli.runner, "gpu_visible", lambda: gpu)
    monkeypatch.setattr(cli.sanitizer, "run_as_asked",
                        lambda *a, **k: passes.append([t["name"] for t in a[2]["tests"]]))
    args = types.SimpleNamespace(verbose=False, deadline=60, seed=77)
    result = cli.grade_lab(args, sys.executable, trees.find_lab("00"), "solutions")
    if gpu:
        # Named by the tree as well as the lab (cli.run_label): two trees graded at once share no log file.
        assert sorted(runs) == [("solutions-00-first-kernel", f"not {cli.NOTEBOOK_TEST}", 77),
                                ("solutions-00-first-kernel-notebook", cli.NOTEBOOK_TEST, 77)]
        assert [t["name"] for t in result["tests"]] == ["test_op", cli.NOTEBOOK_TEST]
        assert passes == [["test_op", cli.NOTEBOOK_TEST]]
        assert len(held) == 1 and not held[0].exists()
    else:
        assert runs == [("solutions-00-first-kernel", None, 77)] and passes == [["test_op"]] and not held


@pytest.mark.parametrize("built", [True, False])
def test_grade_runs_the_quick_sanitizer_pass_beside_the_graded_run(monkeypatch, built):
    """On a GPU with the quick pass due, it runs beside the graded run as side work (the file the timed cases wait
    for is held until it and the notebook's run have both ended), under the graded run's deadline, and its rows and
    error join the result only where the graded run built the lab; nothing runs after the graded run."""
    cli = _cli()
    held, side_work_seen = [], []

    def fake_run(python, files, impl, label, **kw):
        side_work = (kw.get("extra_env") or {}).get(trees.SIDE_WORK_ENV)
        if side_work:
            held.append(Path(side_work))
        if kw.get("keywords") == cli.NOTEBOOK_TEST:
            return {"tests": [{"name": cli.NOTEBOOK_TEST, "outcome": "passed", "tasks": ["lab00.1"],
                               "kind": "student"}], "seed": 77, "returncode": 0, "log": f"{label}.log"}
        outcome = "passed" if built else "failed"
        return {"tests": [{"name": "test_builds", "outcome": outcome, "tasks": ["lab00.1"], "kind": "student"}],
                "seed": 77, "returncode": 0 if built else 1, "log": f"{label}.log"}

    def fake_quick_pass(python, rows, lab, impl, *, quick, deadline_s, **kw):
        assert quick and deadline_s == 60
        time.sleep(0.5)
        side_work_seen.append((trees.LOGS / f"{cli.run_label(lab, impl)}.side-work").exists())  # held meanwhile
        rows.update(sanitizer=[{"tool": "memcheck", "ran": True, "errors": 1}], sanitizer_seconds=0.5,
                    error="compute-sanitizer memcheck: Invalid __global__ write of size 4 bytes")

    def no_pass_after(*args, **kwargs):
        raise AssertionError("the quick pass ran after the graded run instead of beside it")

    monkeypatch.setattr(cli, "run_lab_tests", fake_run)
    monkeypatch.setattr(cli.runner, "gpu_visible", lambda: True)
    monkeypatch.setattr(cli.sanitizer, "sanitizer_available", lambda: True)
    monkeypatch.setattr(cli.sanitizer, "run_into", fake_quick_pass)
    monkeypatch.setattr(cli.sanitizer, "run_as_asked", no_pass_after)
    args = types.SimpleNamespace(verbose=False, deadline=60, seed=77, quick_sanitize=True, sanitize=False)
    result = cli.grade_lab(args, sys.executable, trees.find_lab("00"), "solutions")
    assert side_work_seen == [True] and len(held) == 1 and not held[0].exists()
    if built:
        assert result["error"].startswith("compute-sanitizer memcheck") and result["sanitizer"][0]["tool"] == "memcheck"
    else:
        assert "sanitizer" not in result and not result.get("error")


def test_timed_cases_wait_for_the_side_work_and_run_last(tmp_path):
    """With the side-work file named, pytest takes the perf case after the others, and starts it only once the
    file is gone (here a thread of the test's own removes it after 1 s); without it, the file's order."""
    test_file = tmp_path / "test_order.py"
    test_file.write_text(
        "import os, time\nimport pytest\n"
        "@pytest.mark.perf\ndef test_timed():\n"
        "    print('TIMED', time.time(), os.path.exists(os.environ.get('COURSE_SIDE_WORK', '/nonexistent')))\n"
        "def test_plain():\n    print('PLAIN', time.time())\n")
    busy = tmp_path / "busy"

    def order(env_extra: dict) -> list[str]:
        # tests/conftest.py as a plugin: the file is outside tests/, where pytest would find the conftest itself
        run = subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-q", "-s", "-p", "no:cacheprovider",
                              "-p", "conftest", "--rootdir", str(tmp_path)], capture_output=True, text=True,
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": trees.pythonpath(), **env_extra})
        return re.findall(r"(?:TIMED|PLAIN) \S+(?: \S+)?", run.stdout)  # -q's dots share the lines

    assert [line.split()[0] for line in order({})] == ["TIMED", "PLAIN"]
    busy.write_text("held")
    threading.Timer(1.0, busy.unlink).start()
    started = time.time()
    lines = order({trees.SIDE_WORK_ENV: str(busy)})
    assert [line.split()[0] for line in lines] == ["PLAIN", "TIMED"]
    timed = lines[1].split()
    assert timed[2] == "False" and float(timed[1]) >= started + 1.0


def test_the_timing_lock_keeps_two_runs_tests_apart(tmp_path):
    """Two pytest processes given the same trees.TIMING_LOCK_ENV file in "exclusive" mode: each holds the lock from
    its first perf case to its end, so their perf cases (1.5 s each, two a process) never overlap, though both
    started at once; in "shared" mode (the correctness runs) they overlap."""
    test_file = tmp_path / "test_two.py"
    test_file.write_text("import time\nimport pytest\n"
                         "@pytest.mark.perf\ndef test_a():\n    print('SPAN', time.time()); time.sleep(1.5)\n"
                         "@pytest.mark.perf\ndef test_b():\n    time.sleep(1.5); print('END', time.time())\n")
    command = [sys.executable, "-m", "pytest", str(test_file), "-q", "-s", "-p", "no:cacheprovider", "-p", "conftest",
               "--rootdir", str(tmp_path)]

    def spans(mode: str) -> list[tuple[float, float]]:
        env = {**os.environ, "PYTHONPATH": trees.pythonpath(), trees.TIMING_LOCK_ENV: f"{mode}:{tmp_path / 'gpu.lock'}"}
        runs = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        found = []
        for run in runs:
            out = run.communicate(timeout=120)[0]
            assert run.returncode == 0, out
            found.append((float(re.search(r"SPAN (\S+)", out)[1]), float(re.search(r"END (\S+)", out)[1])))
        return sorted(found)

    first, second = spans("exclusive")
    assert first[1] <= second[0], (first, second)
    first, second = spans("shared")
    assert second[0] < first[1], (first, second)


def test_a_notebook_run_that_died_fails_the_notebook_test_only():
    cli = _cli()
    result = {"tests": [{"name": "test_op", "outcome": "passed", "tasks": ["lab00.2", "lab00.1"], "kind": "student"},
                        {"name": "test_given", "outcome": "passed", "tasks": [], "kind": "reference"}],
              "returncode": 0}
    cli.add_notebook_run(result, {"error": "the test process died (exit code -11)", "tests": [], "seconds": 3.0})
    notebook = result["tests"][-1]
    assert (notebook["name"], notebook["outcome"], notebook["tasks"]) == (cli.NOTEBOOK_TEST, "failed",
                                                                          ["lab00.1", "lab00.2"])
    assert "died" in notebook["message"] and result["returncode"] == 1 and "error" not in result

"""The `./course` command line itself: every subcommand answers --help and the top-level help lists them, an unknown
lab is a clear error, a run's summary closes with the line CI reads ('total: N passed, N failed, N skipped', reference
checks counted in it), and SIGTERM to ./course (a `timeout`, scancel) stops the pytest sessions it started. No GPU, no
build."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import report  # noqa: E402

from coursekit import trees

COURSE = str(trees.ROOT / "course")


@pytest.mark.parametrize(
    "command", ["serve", "site", "setup", "test", "grade", "sanitize", "profile", "build", "bench", "labs", "lint",
                "doctor"]
)
def test_every_subcommand_has_help(command):
    result = subprocess.run([COURSE, command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr


def test_top_level_help_lists_every_subcommand():
    """`./course --help` formats every subcommand's help with %: a literal '%' in one crashed it (2026-11-26)."""
    result = subprocess.run([COURSE, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr
    for command in ("test", "grade", "sanitize", "profile", "bench"):
        assert command in result.stdout, f"./course --help does not list {command}:\n{result.stdout}"


def test_unknown_lab_is_a_clear_error():
    result = subprocess.run([COURSE, "build", "97"], capture_output=True, text=True)
    assert result.returncode == 2 and "no lab '97'" in result.stdout


def test_summary_ends_with_the_line_ci_reads(capsys):
    """CI judges a run by its closing line, 'total: N passed, N failed, N skipped', alone on its line:
    reference checks are counted in it, not appended to it."""
    tests = [{"name": "a", "outcome": "passed", "kind": "student"},
             {"name": "b", "outcome": "failed", "kind": "student", "message": "wrong", "todos": []},
             {"name": "c", "outcome": "passed", "kind": "reference"},
             {"name": "d", "outcome": "skipped", "kind": "reference", "message": "no GPU"}]
    report.print_summary([{"label": "99-demo", "impl": "solutions", "seconds": 1.0, "seed": 1, "log": "x.log",
                           "tests": tests}])
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert re.fullmatch(r"total: \d+ passed, \d+ failed, \d+ skipped", last), last
    assert last == "total: 2 passed, 1 failed, 1 skipped"


def test_sigterm_to_course_stops_the_pytest_sessions_it_started(tmp_path):
    """runner.run_pytest starts its child in a session of its own; SIGTERM to ./course (a `timeout`, scancel) must
    still stop it: cli.run_command takes SIGTERM as Ctrl-C and stops every process runner started."""
    import signal
    import time

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "course_like.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import cli, runner

        def fn(args):  # a run whose 'pytest' is a shell that records its pid and sleeps (exec keeps the pid)
            runner.run_pytest(sys.executable, [], impl="solutions", label="sigterm-test", lab_number=None,
                              verbose=False, deadline_s=120, quiet=True,
                              wrapper=["bash", "-c", "echo $$ > {pid_file}; exec sleep 120"])
            return 0

        sys.exit(cli.run_command(fn, None))
    """))
    path = trees.pythonpath(os.pathsep.join(filter(None, [str(trees.ROOT / "tools" / "course"),
                                                          os.environ.get("PYTHONPATH")])))
    course = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, PYTHONPATH=path))
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    course.send_signal(signal.SIGTERM)
    assert course.wait(timeout=30) == 130, course.stdout.read()
    for _ in range(100):  # stop_all waits for it; an orphan is reaped by init a moment later
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the child {child} still runs after ./course took SIGTERM")

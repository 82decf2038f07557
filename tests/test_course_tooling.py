"""Tests of the course's own machinery: lab generation, the checks, the CLI, the
skeletons, and the links between lessons, labs and graders. All run without a GPU."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from harness import check, jit, trees
from harness.todos import ALL, REFERENCE_MARK, declarations_in, open_todos

sys.path.insert(0, str(trees.ROOT / "tools" / "course"))
import labgen  # noqa: E402
import report  # noqa: E402

COURSE = str(trees.ROOT / "course")


# ---------------------------------------------------------------- lab generation
SOLUTION = """\
int f() {
  // SOLUTION BEGIN lab99.1: return the answer
  return 42;
  // SOLUTION STUB
  // return 0;
  // SOLUTION END
}
"""


def test_strip_solutions_keeps_todo_and_stub():
    assert labgen.strip_solutions(SOLUTION, "x.cu") == (
        "int f() {\n  // TODO(lab99.1): return the answer\n  return 0;\n}\n")


def test_strip_solutions_keeps_a_multi_line_task_text():
    """A task text continues on the comment lines right after BEGIN that indent by 2+ spaces; the
    solution's own first comment (one space) is code of the region and stays out of the lab."""
    solution = ("  // SOLUTION BEGIN lab99.1: return the answer, which is\n"
                "  //   the product of six and seven\n"
                "  // the reference's own note\n"
                "  return 42;\n"
                "  // SOLUTION END\n")
    assert labgen.strip_solutions(solution, "x.cu") == (
        "  // TODO(lab99.1): return the answer, which is\n  //   the product of six and seven\n")


def test_no_todo_line_runs_past_the_column_limit():
    for lab in trees.all_labs():
        for path in sorted(lab.dir_in(trees.resolve_tree("labs")).iterdir()):
            if path.suffix in trees.CXX_SUFFIXES:
                long = [n for n, line in enumerate(path.read_text().splitlines(), 1)
                        if "TODO(" in line and len(line) > 120]
                assert not long, f"{path.relative_to(trees.ROOT)}:{long}: a TODO line over 120 columns (continue its "\
                                 "text on indented comment lines after SOLUTION BEGIN)"


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


@pytest.mark.parametrize("broken, problem", [
    ("// SOLUTION BEGIN lab99.1: a\n", "never closed"),
    ("// SOLUTION END\n", "without BEGIN"),
    ("// SOLUTION BEGIN lab99.1: a\n// SOLUTION BEGIN lab99.2: b\n", "inside another"),
    ("// SOLUTION BEGIN lab99.1: a\n// SOLUTION STUB\nint x;\n// SOLUTION END\n", "commented out"),
])
def test_strip_solutions_rejects_bad_markers(broken, problem):
    with pytest.raises(labgen.MarkerError, match=problem):
        labgen.strip_solutions(broken, "x.cu")


def test_generated_file_detects_student_edits(tmp_path):
    (tmp_path / "solutions" / "99-demo").mkdir(parents=True)
    source = tmp_path / "solutions" / "99-demo" / "k.cu"
    source.write_text(SOLUTION)
    labs = tmp_path / "labs"
    plan = labgen.plan(tmp_path / "solutions", labs, tmp_path)
    assert len(plan.writes) == 1 and not plan.student_edited
    target, text = plan.writes[0]
    target.parent.mkdir(parents=True)
    target.write_text(text)
    recorded, actual = labgen.recorded_and_actual_hash(target)
    assert recorded == actual
    assert not labgen.plan(tmp_path / "solutions", labs, tmp_path).writes  # up to date
    target.write_text(text.replace("return 0;", "return 41;"))  # the student works on it
    source.write_text(SOLUTION.replace("the answer", "the answer, 42"))  # the instructor edits the solution
    plan = labgen.plan(tmp_path / "solutions", labs, tmp_path)
    assert plan.student_edited == [target], "a student's edited file must be flagged, never silently overwritten"


def test_labs_are_up_to_date():
    result = subprocess.run([COURSE, "labs", "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _is_reference_check(fn) -> bool:
    """Whether a test function, or one of its parametrize values, carries harness.reference_check."""
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == REFERENCE_MARK:
            return True
        if mark.name == "parametrize" and any(m.name == REFERENCE_MARK
                                              for value in mark.args[1] for m in getattr(value, "marks", ())):
            return True
    return False


def test_every_task_has_a_todo_a_test_and_a_lesson_row():
    """Each SOLUTION task id appears as a TODO in the lab, is declared (harness.tasks) by a test of its
    grader, has its points in the grader's POINTS, and a row in its lesson page. A task named only in
    a comment or a string is not graded; harness.ALL (a build, a notebook run) grades no task alone."""
    for lab in trees.all_labs():
        solution_text = "".join(p.read_text() for p in sorted(lab.dir_in(trees.resolve_tree("solutions")).iterdir())
                                if p.suffix in labgen.COMMENT)
        tasks = sorted(set(re.findall(r"SOLUTION BEGIN (lab\d\d\.\d+)", solution_text)))
        assert tasks, f"{lab.name} has no SOLUTION regions"
        assert all(t.startswith(lab.module_stem + ".") for t in tasks), (
            f"{lab.name}: task ids must start with {lab.module_stem}.")
        todos = {t.task for t in open_todos(lab, trees.resolve_tree("labs"))}
        module = importlib.import_module(lab.test_file.stem)
        declared = declarations_in(module)
        typos = {name: sorted(ids - set(tasks) - {ALL}) for name, ids in declared.items() if ids - set(tasks) - {ALL}}
        assert not typos, f"{lab.test_file.name} declares ids that are not tasks of {lab.name} ({tasks}): {typos}"
        undeclared = [name for name, ids in declared.items()
                      if not ids and not _is_reference_check(getattr(module, name))]
        assert not undeclared, (f"{lab.test_file.name}: these tests declare neither the tasks they grade "
                                "(@harness.tasks) nor that they check given code (@harness.reference_check): "
                                f"{undeclared}")
        graded = set().union(*declared.values())
        points = getattr(module, "POINTS", None)
        assert isinstance(points, dict) and sorted(points) == tasks, (
            f"{lab.test_file.name}: POINTS must give points to exactly the tasks {tasks}, got {points}")
        bad = {task: value for task, value in points.items() if type(value) is not int or value <= 0}
        assert not bad, f"{lab.test_file.name}: POINTS must be positive integers, got {bad}"
        assert sum(points.values()) == 100, f"{lab.test_file.name}: POINTS must sum to 100, got {sum(points.values())}"
        page = lab.lesson_page.read_text()
        for task in tasks:
            assert task in todos, f"{task} has no TODO in labs/{lab.name}: run ./course labs"
            assert task in graded, (f"{task} is declared by no test of {lab.test_file.name} "
                                    f"(@harness.tasks(\"{task}\") on the tests that check it): which test grades it?")
            assert f"`{task}`" in page, f"{task} is missing from the task table of {lab.lesson_page.name}"


def test_declarations_count_markers_not_mentions():
    """declarations_in reads the harness.tasks marks of a module's tests (their own and their parameters'),
    never a task id that is only mentioned in a comment, a docstring or a string."""
    module = types.ModuleType("test_99_demo")
    exec(textwrap.dedent('''
        import pytest
        from harness.todos import reference_check, tasks

        NOTE = "lab99.3 is checked by test_named_in_a_comment"

        @tasks("lab99.1")
        def test_declared():
            pass

        # grades lab99.2, see TODO(lab99.2)
        def test_named_in_a_comment():
            """Checks lab99.2 and lab99.3."""
            assert "lab99.2"

        @pytest.mark.parametrize("x", [pytest.param(1, marks=tasks("lab99.4")), 2])
        def test_per_parameter(x):
            pass

        @reference_check
        def test_given_code():
            pass

        def helper_not_a_test():
            pass
    '''), module.__dict__)
    assert declarations_in(module) == {"test_declared": {"lab99.1"}, "test_named_in_a_comment": set(),
                                       "test_per_parameter": {"lab99.4"}, "test_given_code": set()}
    assert _is_reference_check(module.test_given_code) and not _is_reference_check(module.test_named_in_a_comment)


# ---------------------------------------------------------------- the checks themselves
def test_tolerance_grows_with_reduction_length():
    assert check.tolerance(torch.float32) < check.tolerance(torch.bfloat16)
    assert check.tolerance(torch.float32, 10_000) == pytest.approx(100 * check.tolerance(torch.float32))


def test_assert_close_reports_unwritten_elements():
    ref = torch.arange(1, 1001, dtype=torch.float64).reshape(10, 100)
    out = ref.float().clone()
    out[3, 70:] = float("nan")  # a tile the kernel never wrote
    with pytest.raises(check.GradeFailure) as failure:
        check.assert_close(out, ref, case="demo", tol=check.tolerance(torch.float32), tile=(4, 32))
    message = str(failure.value)
    assert "30 of 1000 elements wrong" in message
    assert "row 3, col 70" in message and "tile (0, 2)" in message
    assert "never written" in message


def test_assert_close_passes_rounding_and_fails_real_error():
    ref = torch.randn(4097, dtype=torch.float64)
    check.assert_close(ref.float(), ref, case="rounding only", tol=check.tolerance(torch.float32))
    wrong = ref.float().clone()
    wrong[4096] += 1e-3
    with pytest.raises(check.GradeFailure, match=r"index 4096 \(flat 4096: block 16, thread 0 of 256\)"):
        check.assert_close(wrong, ref, case="one bad element", tol=check.tolerance(torch.float32), block=256)


@pytest.mark.parametrize("shape", [(0, 5), (1, 3), (127, 4), (128, 4), (129, 4), (16384, 10), (3, 5, 7),
                                   (2**15 + 3, 2)])
def test_column_sum_is_the_sum_over_rows(shape):
    t = torch.randn(shape, dtype=torch.float64)
    got = check.column_sum(t)
    want = t.reshape(-1, shape[-1]).sum(0)
    assert got.shape == (shape[-1],) and torch.allclose(got, want, rtol=1e-12, atol=1e-9)


def test_assert_close_rejects_wrong_shape():
    with pytest.raises(check.GradeFailure, match="shape"):
        check.assert_close(torch.zeros(3), torch.zeros(4, dtype=torch.float64), case="shape", tol=1e-6)


# ---------------------------------------------------------------- the CLI
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


# ---------------------------------------------------------------- the skeletons
@pytest.mark.parametrize("lab", trees.all_labs(), ids=lambda lab: lab.name)
def test_skeleton_builds_and_fails_naming_its_todos(lab, tmp_path):
    """The untouched skeleton compiles, and grading it fails with its open TODOs named in each failed
    record's `todos`, not with a crash; its reference checks (of given code) pass."""
    report = tmp_path / "report.json"
    env = dict(os.environ, **{trees.IMPL_ENV: "labs"})
    run = subprocess.run([sys.executable, "-m", "pytest", str(lab.test_file), "-q", "-p", "no:cacheprovider",
                          "-m", "not perf", f"--course-json={report}"], cwd=trees.ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert report.exists(), f"grading the {lab.name} skeleton crashed:\n{run.stdout[-3000:]}"
    tests = json.loads(report.read_text())["tests"]
    builds = [t for t in tests if t["name"] == "test_builds"]
    assert builds and builds[0]["outcome"] == "passed", f"the {lab.name} skeleton does not build: {builds}"
    failed = [t for t in tests if t["outcome"] == "failed"]
    assert failed, (f"the untouched {lab.name} skeleton passed every test: "
                    "the grader checks nothing a TODO leaves undone")
    reference = [t for t in failed if t["kind"] == "reference"]
    assert not reference, (
        f"reference checks of the untouched {lab.name} skeleton failed: they check code the lab gives, which no TODO "
        "can break, so the given code (or the check) is wrong:\n"
        + "\n".join(f"{t['name']}: {t['message'][:300]}" for t in reference)
    )
    unnamed = [t for t in failed if not t["todos"]]
    assert not unnamed, (
        "every failure of an untouched skeleton must name the open TODOs it needs (the tasks its test declares "
        "with harness.tasks); these do not:\n"
        + "\n".join(f"{t['name']} (declares {t['tasks']}): {t['message'][:300]}" for t in unnamed)
    )
    for t in failed:
        assert all(todo["task"] in t["tasks"] and todo["file"] and todo["line"] > 0 for todo in t["todos"]), t


def test_notebooks_clone_the_repository_the_site_names():
    """Colab runs a notebook alone, so each one names the repository it clones: it must be the
    one mkdocs.yml's repo_url names (the site's links and "Open in Colab" buttons use that)."""
    repo_url = re.search(r"^repo_url:\s*(\S+)", (trees.ROOT / "mkdocs.yml").read_text(), re.MULTILINE).group(1)
    for lab in trees.all_labs():
        for tree in ("solutions", "labs"):
            notebook = lab.dir_in(trees.resolve_tree(tree)) / f"{lab.name}.ipynb"
            assert f'"{repo_url}"' in notebook.read_text().replace('\\"', '"'), (
                f"{notebook.relative_to(trees.ROOT)} does not clone {repo_url} (mkdocs.yml repo_url)")


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


def test_labs_check_finds_a_solution_body_in_a_given_file(tmp_path):
    """labgen.leaks: a task's SOLUTION body copied into another file of labs/ (lines in order, a line or two between
    them allowed) is an answer given away; the generated skeleton itself and KNOWN_LEAKS are not reported."""
    solutions, labs = tmp_path / "solutions" / "00-x", tmp_path / "labs" / "00-x"
    solutions.mkdir(parents=True)
    labs.mkdir(parents=True)
    body = ("    for (int e = 0; e < kElems; ++e) dot += to_compute(g.v[e]) * to_compute(y.v[e]);\n"
            "    for (int lanes = 4; lanes > 0; lanes /= 2) dot += __shfl_xor_sync(~0u, dot, lanes);\n")
    source = f"int f() {{\n    // SOLUTION BEGIN lab00.1: the dot\n{body}    // SOLUTION END\n}}\n"
    (solutions / "k.cu").write_text(source)
    (labs / "k.cu").write_text(labgen.generate_text(solutions / "k.cu", "solutions/00-x/k.cu"))
    first, second = body.splitlines()
    (labs / "given.cu").write_text(f"void g() {{\n  float dot = 0;\n{first}\n  int copied = 1;\n{second}\n}}\n")
    assert labgen.leaks(tmp_path / "solutions", tmp_path / "labs") == [("lab00.1", "00-x/given.cu")]
    (labs / "given.cu").write_text("void g() { /* its own code */ }\n")
    assert labgen.leaks(tmp_path / "solutions", tmp_path / "labs") == []


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
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(trees.TESTS), **env_extra})
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
        env = {**os.environ, "PYTHONPATH": str(trees.TESTS), trees.TIMING_LOCK_ENV: f"{mode}:{tmp_path / 'gpu.lock'}"}
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


def test_sigterm_to_course_stops_the_pytest_sessions_it_started(tmp_path):
    """runner.run_pytest starts its child in a session of its own; SIGTERM to ./course (a `timeout`, scancel) must
    still stop it: cli.run_command takes SIGTERM as Ctrl-C and stops every process runner started."""
    import signal
    import time

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "course_like.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(trees.ROOT / "tools" / "course")!r})
        import cli, runner

        def fn(args):  # a run whose 'pytest' is a shell that records its pid and sleeps (exec keeps the pid)
            runner.run_pytest(sys.executable, [], impl="solutions", label="sigterm-test", lab_number=None,
                              verbose=False, deadline_s=120, quiet=True,
                              wrapper=["bash", "-c", "echo $$ > {pid_file}; exec sleep 120"])
            return 0

        sys.exit(cli.run_command(fn, None))
    """))
    course = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
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
# ---------------------------------------------------------------- CPU models of reference kernels
def test_lab08_hopper_backward_model(capsys):
    """tools/gpu/lab08_hopper_bwd_model.py: the Hopper backward's shared-memory layouts, descriptors and fragment maps
    replayed in float64 agree with an attention backward on tails, causal, GQA and both head dims, and each of its
    mutants (a slip in the replayed kernel code) is caught."""
    spec = importlib.util.spec_from_file_location("lab08_hopper_bwd_model",
                                                  trees.ROOT / "tools" / "gpu" / "lab08_hopper_bwd_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.main() == 0, capsys.readouterr().out


@pytest.mark.parametrize("first, reps", [((100.0, 1.0), 3), ((3.0, 0.1), 25), ((10.0, 1.0), 25)])
def test_a_far_too_slow_kernel_is_timed_a_few_times(monkeypatch, first, reps):
    """perf.time_pair times a first pair; a kernel FAR_TOO_SLOW x its baseline and over FAR_TOO_SLOW_MS a call gets
    FAR_TOO_SLOW_REPS reps, anything else (a baseline that does nothing included) the reps asked for."""
    from harness import perf

    asked = []

    def fake(fns, *, warmup, reps, flush_l2, before_rep=None):
        asked.append(reps)
        return list(first)

    monkeypatch.setattr(perf.jit, "interleaved_median_ms", fake)
    assert perf.time_pair(lambda: None, lambda: None) == first
    assert asked == [1, reps]


def test_size_budgets_find_long_functions_and_the_allow_list_only_shrinks():
    """./course lint's size budgets (tools/course/sizes.py): Python functions by the AST, C++/CUDA functions by their
    braces (attributes such as __launch_bounds__ skipped, blocks and lambdas inside a body part of it); an entry of
    the allow-list may not grow, and one that fits its budget now must leave the list."""
    sys.path.insert(0, str(trees.ROOT / "tools" / "course"))
    import sizes

    python = "def short():\n    return 1\n\n\nclass A:\n    @staticmethod\n    def long():\n" + "        x = 1\n" * 90
    assert sizes.python_functions(python) == [("short", 2), ("A.long", 92)]
    cxx = ("namespace course {\n// a comment { with a brace\ntemplate <int N>\n__global__ void __launch_bounds__(128)\n"
           "kernel(const float* x,\n       float* y) {\n  if (x) {\n    auto f = [&](int i) { return i; };\n  }\n"
           "  const char* s = \"}\";\n}\nstruct Tile {\n  int size() const { return 4; }\n};\n}  // namespace course\n")
    assert sizes.cxx_functions(cxx) == [("kernel", 9), ("size", 1)]  # from its template line to its brace
    over = {"a.py": 900, "a.py::f": 90}
    assert sizes.problems(over, {"a.py": 900, "a.py::f": 90}) == []
    grew = sizes.problems({"a.py": 901, "a.py::f": 90}, {"a.py": 900, "a.py::f": 90})
    assert len(grew) == 1 and "may only shrink" in grew[0]
    fixed = sizes.problems({"a.py": 900}, {"a.py": 900, "a.py::f": 90})
    assert len(fixed) == 1 and fixed[0].startswith("a.py::f: within its budget now")
    new = sizes.problems({"b.cu::kernel": 81}, {})
    assert len(new) == 1 and "over the function budget of 80: split it" in new[0]
    assert sizes.main([]) == 0, "the repository breaks its own size budgets: see the lines above"

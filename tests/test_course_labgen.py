"""Lab generation (tools/course/labgen.py, `./course labs`) and the task links it keeps. A SOLUTION region becomes its
TODO and stub (a task text may run on over indented comment lines), bad markers are refused, a file the student
edited is flagged instead of overwritten, labs/ is up to date with solutions/ and gives no solution body away in
another of its files, and no TODO line runs past 120 columns; every task id has a TODO in its lab, a grader test that
declares it (harness.tasks; declarations are read from marks, never from mentions), its POINTS and a row in its
lesson page. No GPU, no build."""
from __future__ import annotations

import importlib
import re
import subprocess
import textwrap
import types

import labgen  # noqa: E402
import pytest

from coursekit import trees
from harness.todos import ALL, REFERENCE_MARK, declarations_in, open_todos

COURSE = str(trees.ROOT / "course")


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


# ---------------------------------------------------------------- every task: its TODO, test, points and lesson row
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

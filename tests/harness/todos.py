"""Which student task (a `TODO(labNN.k)` block) each test grades, declared as data.

A test says what it grades once, with a marker, instead of threading ids through its asserts:

    @harness.tasks("lab03.1", "lab03.2")
    def test_sum(...): ...

    pytest.param(rung, marks=harness.tasks(*rung.tasks))    # per parameter, when it varies

A test of code the student is given (a layout the lab hands out, a helper the skeleton
already contains) cannot fail because of a student's work: it is marked
`@harness.reference_check` instead, and reports list it apart from the student's passes.

conftest.py reads the declarations of each test that ran (`declared`), and for a failed
one writes the TODOs still open in the graded tree (`open_for`) into the JSON record: the
report, the class CSV and Gradescope read them from there, never from a message.
Each lab's grader declares the points of its tasks once, in `POINTS = {"labNN.k": n}`.
"""
from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from coursekit import trees

MARK = "tasks"
REFERENCE_MARK = "reference_check"
ALL = "all"  # harness.tasks(ALL): the test needs every task of the lab (a notebook run, say)
TODO_PATTERN = re.compile(r"TODO\((lab\d\d\.\d+)\):?\s*(.*)")
TASK_ID = re.compile(r"^lab\d\d\.\d+$")
# The solution's region header names each task: "// SOLUTION BEGIN lab03.1: what to do".
SOLUTION_TASK = re.compile(r"SOLUTION BEGIN\s+(lab\d\d\.\d+)\s*:\s*(.*)")


def tasks(*ids: str):
    """Marker: the test grades these TODOs (task ids such as "lab03.1", or ALL)."""
    for task in ids:
        if task != ALL and not TASK_ID.match(task):
            raise ValueError(f"harness.tasks({task!r}): a task id looks like 'lab03.1'")
    return pytest.mark.tasks(*ids)


reference_check = pytest.mark.reference_check


@dataclass(frozen=True)
class Todo:
    task: str
    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"TODO({self.task}) at {self.file}:{self.line}: {self.text}"

    def as_dict(self) -> dict:
        return asdict(self)


def _lab_files(lab: trees.Lab, tree: trees.Tree) -> list[Path]:
    folder = lab.dir_in(tree)
    if not folder.is_dir():
        return []
    return [p for p in sorted(folder.iterdir()) if p.suffix in trees.CXX_SUFFIXES or p.suffix == ".py"]


@functools.lru_cache(maxsize=None)
def open_todos(lab: trees.Lab, tree: trees.Tree) -> tuple[Todo, ...]:
    """The TODO(labNN.k) markers still present in the tree's copy of the lab. Read once per process
    (a grading run does not edit the lab), not once for each of a skeleton's hundreds of failures."""
    found = []
    for path in _lab_files(lab, tree):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = TODO_PATTERN.search(line)
            if match and match.group(1).startswith(lab.module_stem + "."):
                found.append(Todo(match.group(1), path.name, number, match.group(2).strip()))
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _solution_tasks(lab: trees.Lab) -> tuple[tuple[str, str], ...]:
    titles: dict[str, str] = {}
    for path in _lab_files(lab, trees.resolve_tree("solutions")):
        for match in SOLUTION_TASK.finditer(path.read_text()):
            titles.setdefault(match.group(1), match.group(2).strip())
    return tuple(sorted(titles.items()))


def lab_tasks(lab: trees.Lab) -> dict[str, str]:
    """Every task of the lab and its one-line title, from the solution's SOLUTION BEGIN headers
    (read once per process: conftest asks for every phase of every test that declares ALL)."""
    return dict(_solution_tasks(lab))


def declared(item) -> tuple[list[str], bool]:
    """(task ids, is a reference check) of a collected test: its own marks, its
    parametrization's and its module's. ALL expands to every task of the lab."""
    ids: list[str] = []
    for mark in item.iter_markers(MARK):
        ids.extend(t for t in mark.args if t not in ids)
    if ALL in ids:
        lab = lab_of(item)
        ids = list(lab_tasks(lab)) if lab else []
    return ids, item.get_closest_marker(REFERENCE_MARK) is not None


def open_for(lab: trees.Lab, tree: trees.Tree, ids: list[str]) -> list[dict]:
    """The open TODOs among `ids`, as JSON-ready dicts."""
    return [todo.as_dict() for todo in open_todos(lab, tree) if todo.task in ids]


_LAB_FILE = re.compile(r"test_(\d\d)_")


def lab_of(item_or_path) -> trees.Lab | None:
    """The lab whose grader holds this test (a pytest item or a test file path)."""
    path = Path(str(getattr(item_or_path, "fspath", item_or_path)))
    match = _LAB_FILE.match(path.name)
    return trees.find_lab(match.group(1)) if match else None


def declarations_in(module) -> dict[str, set[str]]:
    """Statically, without running anything: test name -> the task ids it declares (own marks and
    the marks of its parametrize values). The tooling test checks every task is graded with it."""
    result: dict[str, set[str]] = {}
    module_marks = getattr(module, "pytestmark", [])
    module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
    for name, fn in vars(module).items():
        if not name.startswith("test_") or not callable(fn):
            continue
        ids: set[str] = set()
        for mark in [*module_marks, *getattr(fn, "pytestmark", [])]:
            if mark.name == MARK:
                ids.update(mark.args)
            elif mark.name == "parametrize":
                for value in mark.args[1]:
                    for param_mark in getattr(value, "marks", ()):
                        if param_mark.name == MARK:
                            ids.update(param_mark.args)
        result[name] = ids
    return result

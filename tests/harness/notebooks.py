"""Each lab's notebook: committed without outputs, valid everywhere, executed on a GPU."""
from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from coursekit import trees

from .todos import ALL, reference_check, tasks

# IPython syntax that is not Python: shell escapes and magics.
_IPYTHON_LINE = re.compile(r"^\s*[!%]")


def notebook_path(lab: trees.Lab, tree: trees.Tree) -> Path:
    return lab.dir_in(tree) / f"{lab.name}.ipynb"


def validate(lab: trees.Lab, tree: trees.Tree) -> None:
    path = notebook_path(lab, tree)
    assert path.exists(), f"lab {lab.name} has no notebook: expected {path}"
    notebook = json.loads(path.read_text())
    try:
        import nbformat
    except ImportError:
        nbformat = None
    if nbformat is not None:
        nbformat.validate(nbformat.reads(path.read_text(), as_version=4))
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs") and cell.get("execution_count") is None, (
            f"{path.name} cell {index} has outputs: commit notebooks cleared (Kernel > Restart & Clear Output)"
        )
        source = "".join(cell["source"])
        python = "\n".join("pass" if _IPYTHON_LINE.match(line) else line for line in source.splitlines())
        try:
            ast.parse(python)
        except SyntaxError as error:
            raise AssertionError(f"{path.name} cell {index} is not valid Python: {error}") from None


def execute(lab: trees.Lab, tree: trees.Tree, timeout_s: int = 600) -> None:
    """Run every cell top to bottom in a fresh kernel, in the lab's folder."""
    nbclient = pytest.importorskip(
        "nbclient",
        reason="nbclient is not installed here, so the notebook was not executed (pip install nbclient ipykernel)",
    )
    import nbformat

    path = notebook_path(lab, tree)
    notebook = nbformat.read(path, as_version=4)
    # A submission lives outside the course: tell the notebook where include/ and build/ are,
    # so it neither fails to find the course headers nor writes into the submission.
    os.environ["COURSE_ROOT"] = str(trees.ROOT)
    # ...and where the grader built this lab, so the notebook's load() reuses that build.
    from coursekit import jit

    from . import build

    os.environ[jit.BUILD_DIR_ENV] = str(lab.build_dir(tree))
    os.environ[jit.MODULE_ENV] = build.module_name(lab, tree)
    # A kernel that never answers is started once more: jupyter_client picks free TCP ports, then binds them later,
    # and two kernels started at once can take the same one ("ZMQError: Address already in use", then "Kernel didn't
    # respond in 60 seconds": 1 of 10 graders run together on the GPU box, 2026-11-27; ./course grade --all --jobs
    # starts notebooks together). Unix sockets (transport "ipc") avoid the race but hung the same way on the box with
    # one kernel alone, so TCP stays. No cell has run when the kernel fails to start: nothing runs twice.
    for attempt in (1, 2):
        client = nbclient.NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
            return
        except nbclient.exceptions.CellExecutionError as error:
            raise AssertionError(f"{path.name} failed while executing:\n{str(error)[-3000:]}") from None
        except RuntimeError as error:
            if not kernel_never_started(error):
                raise
            if attempt == 2:  # the grader's tool failed twice: no cell ran, nothing is known about the lab
                pytest.skip(f"not checked: the notebook's kernel did not start, twice ({error}); the grader's tool "
                            "failed, not your notebook")
            print(f"[course] {path.name}: the notebook's kernel did not start ({error}); starting another", flush=True)


def kernel_never_started(error: BaseException) -> bool:
    """jupyter_client's words when a kernel it started never answered (client.py, wait_for_ready)."""
    return "didn't respond" in str(error)


def tests_for(handle):
    """The two notebook tests of a lab's grader: `test_a, test_b = notebooks.tests_for(LAB)`."""
    from . import requires_gpu  # the package is fully imported by the time a grader calls this

    # The notebook is given: a failure here (outputs saved, a cell that no longer parses) is no TODO.
    @reference_check
    def test_notebook_is_clean():
        validate(handle.lab, handle.tree)

    @requires_gpu
    @tasks(ALL)
    def test_notebook_runs():
        # The notebook compiles the lab again, with its own load(): a submission that the grader
        # could not build fails here with that build's error instead of a second compile.
        handle.module
        execute(handle.lab, handle.tree)

    return test_notebook_is_clean, test_notebook_runs

"""Concurrent runs of a class share no build or output folder; every part a student writes is built from the student's
tree (SYLLABUS section 4). No GPU, and no compile: the folders, the sources each build reads, and the lock."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from grader09 import aot, stable_abi

from coursekit import folders, jit, trees
from harness import mutants, notebooks

LAB09 = trees.find_lab("09")


def _submission(root, name="submission", edits=()):
    """A copy of the reference's lab 09 (and the labs it depends on) at root/name, laid out like labs/."""
    return trees.resolve_tree(str(mutants.plant(LAB09, root / name, list(edits))))


def test_each_tree_builds_in_folders_of_its_own(tmp_path):
    """Every kind of build folder is BUILD/<kind>/<tree tag>/<lab>: labs, solutions and two submissions that share a
    folder name (two students' `submission`) get four folders."""
    graded = [trees.resolve_tree("labs"), trees.resolve_tree("solutions"),
              _submission(tmp_path / "alice"), _submission(tmp_path / "bob")]
    assert len({tree.tag for tree in graded}) == len(graded), [tree.tag for tree in graded]
    for kind in trees.BUILD_KINDS:
        found = [LAB09.build_dir(tree, kind) for tree in graded]
        assert len(set(found)) == len(graded), f"{kind}: trees share a build folder: {found}"
        for tree, folder in zip(graded, found):
            assert folder == trees.BUILD / kind / tree.tag / LAB09.name


def test_lab09_builds_read_the_graded_tree(tmp_path):
    """The stable-ABI wheel, the course_ops wheel and the CMake library are made from the graded tree's files (its
    stable/ and package/, which are given code, too); an edit there gives the build another key."""
    tree = _submission(tmp_path)
    lab_dir = LAB09.dir_in(tree)
    tools = stable_abi._stable_tools()
    course = {trees.INCLUDE, trees.ROOT / "coursekit"}  # given code the builds read: the headers, the core (jit.py)
    stable, package = tools.wheel_sources(lab_dir / "stable"), aot.wheel_inputs(lab_dir)
    for name, path in stable + package:
        assert path.is_relative_to(tree.path) or path.parent in course or path.parent.parent in course, (name, path)
    assert lab_dir / "stable" / "bias_gelu_stable.cpp" in [path for _, path in stable]
    assert lab_dir / "package" / "setup.py" in [path for _, path in package]
    options = aot._cmake_options(tree)
    assert options["COURSE_TREES"] == f"{tree.tag}={tree.path}" and options["COURSE_LABS"] == LAB09.name
    key = tools.wheel_key(lab_dir / "stable")
    edited = _submission(tmp_path, "edited", [("stable/bias_gelu_stable.cpp", "namespace {", "namespace {  // edit")])
    assert tools.wheel_key(LAB09.dir_in(edited) / "stable") != key
    # The same files in another folder (a copy of one submission) make the same wheel: the key names no path.
    assert tools.wheel_key(LAB09.dir_in(_submission(tmp_path, "copy")) / "stable") == key


def test_ci_prebuilds_into_the_graders_folders():
    """.ci/run builds the reference's wheels before the suite; the grader of solutions/ looks in the same folders."""
    solutions = trees.resolve_tree("solutions")
    assert stable_abi._stable_tools().default_build_dir() == LAB09.build_dir(solutions, "stable-abi")


def test_a_missing_given_file_is_named(tmp_path):
    """A submission without stable/setup.py (given code, no TODO) fails saying which file and where to get it."""
    tree = _submission(tmp_path)
    (LAB09.dir_in(tree) / "stable" / "setup.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks setup\.py: given code .* labs/09-custom-ops/stable/"):
        stable_abi._stable_tools().build_wheel(LAB09.dir_in(tree) / "stable", tmp_path / "out")


def _child_env() -> dict:
    """A child python's environment: the course's import roots on PYTHONPATH, as ./course gives its children."""
    return dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH")))


# A builder of one output in one folder, as the lab 09 builds are made: under the folder's lock, in a partial folder
# renamed into place. It writes slowly, so that a reader that ignored the rename would see a half-written file.
BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from coursekit import folders
    folder = Path(sys.argv[1])
    final = folder / "dist-key"
    with folders.exclusive(folder):
        if final.is_dir():
            print("reused")
            sys.exit(0)
        staging = folders.staging_path(final)
        staging.mkdir(parents=True)
        with open(staging / "out.whl", "wb") as out:
            for _ in range(40):
                out.write(b"x" * 1000)
                out.flush()
                time.sleep(0.01)
        folders.publish_folder(staging, final)
        print("built")
""")


def test_concurrent_builders_of_one_folder_build_once_and_publish_whole(tmp_path):
    """Four processes build the same output at once: one builds, three wait and reuse it, and a reader polling
    throughout never sees a partial file."""
    folder, seen = tmp_path / "build", []
    stop = threading.Event()

    def read_while_building():
        while not stop.is_set():
            out = folder / "dist-key" / "out.whl"
            if out.is_file():
                seen.append(out.stat().st_size)
            time.sleep(0.002)

    reader = threading.Thread(target=read_while_building)
    reader.start()
    command = [sys.executable, "-c", BUILDER, str(folder)]
    builders = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=_child_env()) for _ in range(4)]
    said = sorted(builder.communicate(timeout=60)[0].strip() for builder in builders)
    stop.set()
    reader.join()
    assert said == ["built", "reused", "reused", "reused"], said
    assert seen and set(seen) == {40_000}, f"a reader saw partial outputs of sizes {sorted(set(seen))}"
    assert not list(folder.glob(f"*{folders.PARTIAL_MARK}*")), "a partial output was left behind"


def test_a_killed_builder_leaves_no_lock_behind(tmp_path):
    """A run killed at its deadline while it builds (SIGKILL) lets the next builder in at once: the kernel drops an
    flock with its holder."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from coursekit import folders
        with folders.exclusive(Path(sys.argv[1])):
            print("holding", flush=True)
            time.sleep(60)
    """), str(tmp_path)], stdout=subprocess.PIPE, text=True, env=_child_env())
    assert holder.stdout.readline().strip() == "holding"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    started = time.perf_counter()
    with folders.exclusive(tmp_path):
        assert time.perf_counter() - started < 5


def test_a_notebook_run_keeps_to_its_trees_folders(tmp_path, monkeypatch):
    """The executed notebook runs in the graded tree's lab folder, reuses the tree's JIT build folder, and its kernel
    keeps its history in memory (nbclient's default), not in ~/.ipython's one file, which a class's notebook runs
    would share."""
    pytest.importorskip("nbclient", reason="nbclient and ipykernel are not installed here")
    import nbformat

    for name in ("COURSE_ROOT", jit.BUILD_DIR_ENV, jit.MODULE_ENV):  # execute() sets them: restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    lab = trees.find_lab("00")
    (tmp_path / "student" / lab.name).mkdir(parents=True)
    tree = trees.resolve_tree(str(tmp_path / "student"))
    expected = {"cwd": str(lab.dir_in(tree)), "build": str(lab.build_dir(tree)), "history": ":memory:"}
    cell = textwrap.dedent(f"""
        import os
        from IPython import get_ipython
        seen = {{"cwd": os.getcwd(), "build": os.environ["{jit.BUILD_DIR_ENV}"],
                 "history": str(get_ipython().history_manager.hist_file)}}
        assert seen == {json.dumps(expected)}, seen
    """)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nbformat.write(notebook, notebooks.notebook_path(lab, tree))
    notebooks.execute(lab, tree, timeout_s=120)

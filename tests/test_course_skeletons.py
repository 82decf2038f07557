"""What a student is handed. Each lab's untouched skeleton (labs/) compiles, and grading it fails with the open TODOs
named in every failed record while its reference checks (of the code the lab gives) pass; each notebook, in both
trees, clones the repository mkdocs.yml names. The skeleton test builds every lab's extension: minutes on a machine
without a GPU."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from coursekit import trees


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

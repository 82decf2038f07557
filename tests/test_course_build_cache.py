"""A submission that does not compile is compiled once per grading run, not once per test."""
from __future__ import annotations

import time

from coursekit import trees
from harness import build, mutants

LAB = trees.find_lab("04")
# A syntax error in one kernel of the ladder: every test that touches the module must fail with it.
BROKEN = mutants.Mutant("uncompilable", "03_smem_tiles.cu", '#include "tiled_matmul.h"',
                        '#include "tiled_matmul.h"\nthis is not C++;', tests="", expect="did not build")


def test_uncompilable_submission_is_built_once():
    tree = trees.resolve_tree(str(mutants.make_tree(LAB, BROKEN)))  # where mutants.grade plants it again
    attempts = LAB.build_dir(tree) / build.ATTEMPTS_LOG
    attempts.unlink(missing_ok=True)
    started = time.perf_counter()
    failed = mutants.grade(LAB, BROKEN)  # every test but the perf cases, in a process of its own
    seconds = time.perf_counter() - started
    assert len(failed) >= 2, f"expected every test that needs the module to fail, got {len(failed)} failures"
    other = [f"{t['name']}: {t['message'][:300]}" for t in failed if BROKEN.expect not in t["message"]]
    assert not other, "these failures do not report the build error:\n" + "\n".join(other)
    lines = attempts.read_text().splitlines() if attempts.exists() else []
    print(f"{len(failed)} tests failed with the build error after {len(lines)} compile attempt(s) in {seconds:.1f} s")
    assert len(lines) == 1, (f"{len(failed)} tests touched the broken module and the compiler ran {len(lines)} times: "
                             "a failed build must be cached for the rest of the run")


def test_a_variant_that_edits_only_python_uses_the_solutions_build(monkeypatch):
    """harness.build.same_build_elsewhere: a planted variant whose compiled files are the solution's (an edit of
    autograd.py, lab 09's ops.py) is built from solutions/ when BUILD_FROM_ENV says so; an edit of a kernel, or no
    BUILD_FROM_ENV, compiles the variant's own tree."""
    lab06, lab09 = trees.find_lab("06"), trees.find_lab("09")
    edit = "import torch\n", "import torch  # edited\n"
    python_only = mutants.Mutant("py-only", "autograd.py", *edit, tests="", expect="")
    kernel = mutants.Mutant("kernel", "forward.cu", "// Lab 06,", "// edited\n// Lab 06,", tests="", expect="")
    ops_py = mutants.Mutant("ops-py", "ops.py", *edit, tests="", expect="")
    solutions = trees.resolve_tree("solutions")
    monkeypatch.setenv(trees.BUILD_FROM_ENV, str(trees.ROOT / "solutions"))
    edited = trees.resolve_tree(str(mutants.make_tree(lab06, python_only)))
    assert build.same_build_elsewhere(lab06, edited) == solutions
    assert build.same_build_elsewhere(lab06, solutions) is None, "the solutions build is its own"
    assert build.same_build_elsewhere(lab06, trees.resolve_tree(str(mutants.make_tree(lab06, kernel)))) is None
    assert build.same_build_elsewhere(lab09, trees.resolve_tree(str(mutants.make_tree(lab09, ops_py)))) == solutions
    monkeypatch.delenv(trees.BUILD_FROM_ENV)
    assert build.same_build_elsewhere(lab06, edited) is None

"""A submission that does not compile is compiled once per grading run, not once per test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from harness import build, mutants, trees

LAB = trees.find_lab("04")
# A syntax error in one kernel of the ladder: every test that touches the module must fail with it.
BROKEN = ("03_smem_tiles.cu", '#include "tiled_matmul.h"', '#include "tiled_matmul.h"\nthis is not C++;')


def test_uncompilable_submission_is_built_once(tmp_path):
    root = mutants.plant(LAB, tmp_path / "broken", [BROKEN])
    tree = trees.resolve_tree(str(root))
    attempts = LAB.build_dir(tree) / build.ATTEMPTS_LOG
    attempts.unlink(missing_ok=True)
    report = tmp_path / "result.json"
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", str(LAB.test_file), "-q", "-p", "no:cacheprovider",
                          "-m", "not perf", f"--course-json={report}"], cwd=trees.ROOT,
                         env=dict(os.environ, **{trees.IMPL_ENV: str(root)}), capture_output=True, text=True,
                         timeout=900)
    seconds = time.perf_counter() - started
    assert report.exists(), f"the grader process died:\n{run.stdout[-3000:]}"
    tests = json.loads(report.read_text())["tests"]
    failed = [t for t in tests if t["outcome"] == "failed"]
    assert len(failed) >= 2, f"expected every test that needs the module to fail, got {len(failed)} failures"
    other = [f"{t['name']}: {t['message'][:300]}" for t in failed if "did not build" not in t["message"]]
    assert not other, "these failures do not report the build error:\n" + "\n".join(other)
    lines = attempts.read_text().splitlines() if attempts.exists() else []
    print(f"{len(failed)} tests failed with the build error after {len(lines)} compile attempt(s) in {seconds:.1f} s")
    assert len(lines) == 1, (f"{len(failed)} tests touched the broken module and the compiler ran {len(lines)} times: "
                             "a failed build must be cached for the rest of the run")

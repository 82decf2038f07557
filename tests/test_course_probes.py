"""The measurement scripts (probes) under site/data/evidence/ and tools/gpu/probe/ import the course as plain modules
(coursekit, harness, the graders) from the path `./course run` gives them: each answers --help through it, with no
GPU, or (the few that take no --help) imports. No GPU, no build."""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import pytest

from coursekit import trees

COURSE = str(trees.ROOT / "course")
PROBES = sorted(p.relative_to(trees.ROOT).as_posix() for folder in ("site/data/evidence", "tools/gpu/probe")
                for p in (trees.ROOT / folder).rglob("*.py"))
# Probes that take no --help: their arguments are verbs (a --help would start the work), so they are imported.
IMPORTED = {"tools/gpu/probe/carveout.py", "tools/gpu/probe/class_acceptance.py", "tools/gpu/probe/class_scale.py"}
# Probes that measure at import time (they need the GPU to load at all): compiled only.
COMPILED = {"tools/gpu/probe/alloc_speed.py", "tools/gpu/probe/checkfmt.py"}


def _help(probe: str) -> subprocess.CompletedProcess:
    return subprocess.run([COURSE, "run", probe, "--help"], cwd=trees.ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))


def test_every_probe_is_checked():
    assert PROBES and IMPORTED | COMPILED <= set(PROBES), sorted(IMPORTED | COMPILED - set(PROBES))


def test_probes_answer_help_through_course_run():
    helped = [p for p in PROBES if p not in IMPORTED | COMPILED]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(helped, pool.map(_help, helped)))
    failed = {p: (r.stdout + r.stderr)[-1500:] for p, r in results.items()
              if r.returncode != 0 or "Traceback" in r.stderr or not r.stdout.strip()}
    assert not failed, "\n\n".join(f"./course run {p} --help:\n{text}" for p, text in failed.items())


@pytest.mark.parametrize("probe", sorted(IMPORTED))
def test_verb_probes_import(probe):
    code = f"import runpy; runpy.run_path({str(trees.ROOT / probe)!r}, run_name='imported')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH")),
                                   CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("probe", sorted(COMPILED))
def test_gpu_at_import_probes_compile(probe):
    compile((trees.ROOT / probe).read_text(), probe, "exec")

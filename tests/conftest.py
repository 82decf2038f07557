"""pytest glue: per-lab markers, and the JSON record `./course` reads back."""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import perf, trees  # noqa: E402

_LAB_FILE = re.compile(r"test_(\d\d)_")
_records: list[dict] = []
# A CUDA error inside a kernel (illegal address, device-side assert) breaks the process's
# CUDA context: every later CUDA call fails with it. Record the first one and stop there.
_STICKY_CUDA_ERROR = re.compile(r"illegal (memory )?(access|address|instruction)|device-side assert|"
                                r"unspecified launch failure|misaligned address", re.IGNORECASE)
_broken_context: list[str] = []
SEED = int(os.environ.get("COURSE_SEED") or random.randrange(2**31))
SANITIZE_HINT = ("\n  hint: a kernel made an invalid access or hit an assert; find it with "
                 "`./course sanitize {lab} --impl {impl}` (compute-sanitizer memcheck on small cases)")


def pytest_addoption(parser):
    parser.addoption("--course-json", default=None, help="write per-test outcomes and perf cases here")


def pytest_configure(config):
    for lab in trees.all_labs():
        config.addinivalue_line("markers", f"{lab.marker}: tests of lab {lab.name}")
    config.addinivalue_line("markers", "perf: timing against the PyTorch baseline (needs a GPU)")
    config.addinivalue_line("markers", "large: a case too big for compute-sanitizer (./course sanitize skips it)")
    config.addinivalue_line("markers", "tma_output: the output is written by TMA stores, which compute-sanitizer's "
                            "initcheck does not track (./course sanitize runs it under the other tools)")


def pytest_collection_modifyitems(items):
    for item in items:
        match = _LAB_FILE.match(Path(str(item.fspath)).name)
        if match:
            item.add_marker(getattr(pytest.mark, f"lab{match.group(1)}"))


def pytest_runtest_setup(item):
    if _broken_context:
        pytest.fail(f"not run: an earlier test hit a CUDA error that breaks this process's CUDA context:\n  "
                    f"{_broken_context[0]}", pytrace=False)
    # Fresh inputs every run, reproducible from the printed seed: each test draws from its own
    # stream, so selecting a subset of tests with -k does not change what a test sees.
    digest = int(hashlib.sha256(f"{SEED}:{item.nodeid}".encode()).hexdigest()[:8], 16)
    random.seed(digest)
    import torch

    torch.manual_seed(digest)


def _message(report) -> str:
    if report.skipped:
        longrepr = report.longrepr
        return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
        for prefix in ("harness.check.GradeFailure: ", "GradeFailure: ", "AssertionError: "):
            text = text.removeprefix(prefix)
        return text
    return str(report.longrepr)[-3000:]


def pytest_runtest_logreport(report):
    # One record per test: its call, or the setup/teardown phase that skipped or failed it.
    if report.when != "call" and report.outcome == "passed":
        return
    message = _message(report) if report.outcome != "passed" else ""
    if report.failed and not _broken_context and _STICKY_CUDA_ERROR.search(message):
        _broken_context.append(message.splitlines()[0][:300])
        match = _LAB_FILE.match(Path(report.fspath).name)
        message += SANITIZE_HINT.format(lab=match.group(1) if match else "NN", impl=os.environ.get(trees.IMPL_ENV, "labs"))
    _records.append({"name": report.nodeid.split("::", 1)[-1], "outcome": report.outcome, "when": report.when,
                     "message": message, "seconds": round(report.duration, 3)})


def pytest_sessionfinish(session):
    path = session.config.getoption("--course-json")
    if not path:
        return
    import torch

    data = {"seed": SEED, "tests": _records, "perf": perf.RESULTS, "torch": torch.__version__, "cuda": torch.version.cuda,
            "copy_bandwidth_gbps": perf._ceilings.get("copy"), "impl": str(trees.resolve_tree().path)}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")

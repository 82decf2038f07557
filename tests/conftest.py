"""pytest glue: per-lab markers, and the JSON record `./course` reads back."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import perf, trees  # noqa: E402

_LAB_FILE = re.compile(r"test_(\d\d)_")
_records: list[dict] = []


def pytest_addoption(parser):
    parser.addoption("--course-json", default=None, help="write per-test outcomes and perf cases here")


def pytest_configure(config):
    for lab in trees.all_labs():
        config.addinivalue_line("markers", f"{lab.marker}: tests of lab {lab.name}")
    config.addinivalue_line("markers", "perf: timing against the PyTorch baseline (needs a GPU)")


def pytest_collection_modifyitems(items):
    for item in items:
        match = _LAB_FILE.match(Path(str(item.fspath)).name)
        if match:
            item.add_marker(getattr(pytest.mark, f"lab{match.group(1)}"))


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
    _records.append({"name": report.nodeid.split("::", 1)[-1], "outcome": report.outcome, "when": report.when,
                     "message": _message(report) if report.outcome != "passed" else "",
                     "seconds": round(report.duration, 3)})


def pytest_sessionfinish(session):
    path = session.config.getoption("--course-json")
    if not path:
        return
    import torch

    data = {"tests": _records, "perf": perf.RESULTS, "torch": torch.__version__, "cuda": torch.version.cuda,
            "copy_bandwidth_gbps": perf._ceilings.get("copy"), "impl": str(trees.resolve_tree().path)}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")

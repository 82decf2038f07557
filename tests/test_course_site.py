"""The built course site, checked in a headless browser (tools/site/browser_check.py).

This test is the one place CI runs the browser check: .ci/run builds the site (`./course site`)
and installs chromium, then `./course test` runs this. Under CI (the CI environment variable
set, as .ci/run does) a check that cannot run (no chromium, no built site, a site older than
its sources) FAILS; elsewhere it skips, saying what is missing.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from harness import trees

SITE_TOOLS = trees.ROOT / "tools" / "site"
CHECK = SITE_TOOLS / "browser_check.py"
_spec = importlib.util.spec_from_file_location("site_devtools", SITE_TOOLS / "devtools.py")
devtools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(devtools)  # for CHROMIUM_NAMES and find_chromium: one list of browser names
IN_CI = bool(os.environ.get("CI"))


def cannot_run(reason: str):
    if IN_CI:
        pytest.fail(f"the browser check cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def stale_source():
    """The newest source of the site when it is newer than the built site, else None."""
    sources = [p for folder in (trees.LESSONS, trees.SITE_SOURCES, trees.LABS) for p in folder.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts]
    newest = max([*sources, trees.MKDOCS_YML], key=lambda p: p.stat().st_mtime)
    built = (trees.SITE_BUILD / "index.html").stat().st_mtime
    return newest if newest.stat().st_mtime > built else None


def test_site_in_a_browser():
    chromium = devtools.find_chromium()
    if chromium is None:
        cannot_run(f"no chromium on the PATH (looked for {', '.join(devtools.CHROMIUM_NAMES)}): "
                   f"install it ({devtools.INSTALL_HINT})")
    site = trees.SITE_BUILD.relative_to(trees.ROOT)
    if not (trees.SITE_BUILD / "index.html").is_file():
        cannot_run(f"the site is not built ({site}/index.html is missing): run ./course site first")
    newest = stale_source()
    if newest:
        cannot_run(f"the built site is older than {newest.relative_to(trees.ROOT)}: rebuild it with ./course site")
    result = subprocess.run([sys.executable, str(CHECK), str(trees.SITE_BUILD), "--chromium", chromium],
                            cwd=trees.ROOT, capture_output=True, text=True, timeout=600, check=False)
    print(result.stdout)
    assert result.returncode == 0, f"browser check failed:\n{result.stdout}{result.stderr}"

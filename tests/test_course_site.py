"""The built course site, checked in a headless browser (tools/site/browser_check.py).

Runs when chromium is installed and the site is built (`./course site` writes build/site);
skips, saying which is missing, otherwise. CI: `apt-get install -y chromium`, `./course site`,
then this test (or the script directly: `python3 tools/site/browser_check.py build/site`).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "build" / "site"
CHECK = ROOT / "tools" / "site" / "browser_check.py"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def test_site_in_a_browser():
    if CHROMIUM is None:
        pytest.skip("no chromium on the PATH: install it (Debian: apt-get install -y chromium) to run the browser check")
    if not (SITE / "index.html").is_file():
        pytest.skip(f"the site is not built ({SITE.relative_to(ROOT)}/index.html is missing): run ./course site first")
    sources = [p for folder in ("lessons", "site", "labs") for p in (ROOT / folder).rglob("*") if p.is_file()]
    sources.append(ROOT / "mkdocs.yml")
    newest = max(sources, key=lambda p: p.stat().st_mtime)
    if newest.stat().st_mtime > (SITE / "index.html").stat().st_mtime:
        pytest.skip(f"the built site is older than {newest.relative_to(ROOT)}: rebuild it with ./course site")
    result = subprocess.run([sys.executable, str(CHECK), str(SITE), "--chromium", CHROMIUM], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    print(result.stdout)
    assert result.returncode == 0, f"browser check failed:\n{result.stdout}{result.stderr}"

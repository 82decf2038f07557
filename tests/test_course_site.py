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

from coursekit import trees

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
                            cwd=trees.ROOT, capture_output=True, text=True, timeout=600, check=False,
                            env=dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH"))))
    print(result.stdout)
    assert result.returncode == 0, f"browser check failed:\n{result.stdout}{result.stderr}"


_spine_spec = importlib.util.spec_from_file_location("site_spine", trees.SITE_SOURCES / "hooks" / "spine.py")
spine = importlib.util.module_from_spec(_spine_spec)
_spine_spec.loader.exec_module(spine)


def test_every_lesson_page_keeps_the_spine_rules(capsys):
    """Lessons 00-10 within the word budget, with no internal references or stale 'not measured' text, and every
    {{fig}} and evidence table found in the data (the strict site build fails on the same problems; this says which,
    page by page, without building). Prints each page's count."""
    pages = sorted(trees.LESSONS.glob("[0-9][0-9]-*.md")) + sorted((trees.LESSONS / "notes").glob("*.md"))
    assert len([p for p in pages if p.parent == trees.LESSONS]) == 11, [p.name for p in pages]
    report, failing = [], []
    for page in pages:
        name = page.relative_to(trees.LESSONS).as_posix()
        text = page.read_text()
        problems = spine.text_problems(name, text) + spine.render_evidence(text)[1] + spine.render_figures(text)[1]
        report.append(f"{name}: {spine.word_count(text)} words of main text, {len(problems)} problem(s)")
        failing += [f"{name}: {problem}" for problem in problems]
    with capsys.disabled():
        print("\n" + "\n".join(report))
    assert not failing, "\n".join(failing[:40])


def test_the_word_count_leaves_out_included_code_and_collapsed_blocks():
    page = ("# Title\n\none two three\n\n--8<-- \"labs/00-first-kernel/scale.cu:kernel\"\n\n<!-- a comment -->\n"
            '??? note "How we got there: a story"\n    four five six seven\n\n    eight\n\nnine\n'
            "<details><summary>ten</summary>\neleven\n</details>\ntwelve\n```bash\n./course test 06\n```\n")
    # counted: "# Title", "one two three", "nine", "twelve", the typed code block (fences and 3 words)
    assert spine.word_count(page) == 2 + 3 + 1 + 1 + 5
    assert spine.word_count("ran at {{fig bench/x | some case name | ratio | .2f}}x of copy") == 5


def test_the_page_rules_name_internal_references_and_stale_phrases():
    text = ("as issue 23 found\nsee #41 and [here](#3-the-forward)\nmeasured 2026-11-26\nin tools/gpu/NOTES.md\n"
            "this has not been timed yet\nthe long rows are to be measured\nclean line, #include <cuda.h>\n")
    problems = spine.text_problems("06-fused-elementwise.md", text)
    assert [p.split(":")[0] for p in problems] == ["line 1", "line 2", "line 3", "line 4", "line 5", "line 6"], problems
    assert spine.text_problems("troubleshooting.md", text) == []
    over = "word " * (spine.WORD_BUDGET + 1)
    assert any("over the budget" in p for p in spine.text_problems("06-fused-elementwise.md", over))
    assert not spine.text_problems("notes/06-fused-elementwise.md", over)


def test_figures_come_from_the_data_or_fail_the_build():
    bench = "bench/06-fused-elementwise"
    data = spine.load(bench)
    case = data["cases"][0]
    rendered, problems = spine.render_figures(f"{{{{fig {bench} | {case['name']} | ratio | .3f}}}}x")
    assert not problems and f">{case['ratio']:.3f}</span>x" in rendered and data["gpu"] in rendered
    for wrong in (f"{bench} | no such case | ratio", f"{bench} | {case['name']} | no_field", "bench/none | - | gpu",
                  f"{bench} | {case['name']} | ratio | .2q", f"{bench} | - "):
        rendered, problems = spine.render_figures(f"{{{{fig {wrong}}}}}")
        assert len(problems) == 1 and "missing figure" in rendered, (wrong, problems)


def test_the_measurement_ledger_is_up_to_date():
    """tools/gpu/LEDGER.md lists every measurement file with its GPU, date, command and the pages quoting it;
    it is generated, so it must match what tools/gpu/ledger.py makes of the data and the pages now."""
    done = subprocess.run([sys.executable, str(trees.ROOT / "tools" / "gpu" / "ledger.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

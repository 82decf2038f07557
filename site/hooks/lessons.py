"""What every lesson page and the home page get without their authors writing it.

Home page (lessons/index.md): `<!-- syllabus -->` becomes the syllabus table, built from
site/data/syllabus.yml, with each lesson's status read off the repository:

  ready        lessons/NN-slug.md, labs/NN-slug/ and the committed GPU results
               (site/data/bench/NN-slug.json) all exist: a lesson whose kernels never ran on a GPU
               is not ready, however complete its prose
  below target ready, but those GPU results show a case of the reference solution below its target
  in progress  any of them, solutions/NN-slug/, or a nav entry for NN-*.md exists
  planned      none of those

Lesson pages (lessons/NN-slug.md):
  - a "The lab" box right after the objectives admonition: links to the lab's files and
    notebook in the repository (mkdocs.yml repo_url), an "Open in Colab" button for the
    notebook, the lab's task ids (the TODO(labNN.k) markers found in labs/NN-slug/) and
    the grade command;
  - checks, reported as warnings (so `mkdocs build --strict` fails on them): the page opens
    with an objectives admonition (`!!! abstract "After this lesson you can"`), ends with an
    `## Exercises` section, names every task id of its lab, and its lab folder and notebook
    exist.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from urllib.parse import urlparse

import yaml

from coursekit import trees

log = logging.getLogger("mkdocs.hooks.lessons")
SYLLABUS = trees.SITE_SOURCES / "data" / "syllabus.yml"
BRANCH = "main"  # the branch the repository links and the Colab links point at
LESSON_PAGE = re.compile(r"^(\d\d)-([a-z0-9-]+)\.md$")
TASK_ID = re.compile(r"TODO\((lab\d\d\.\d+)\)")
OBJECTIVES = re.compile(r'^!!! abstract( "[^"\n]*")?[ \t]*\n', re.MULTILINE)
EXERCISES = re.compile(r"^##\s+(?:\d+\.\s*)?Exercises\b", re.MULTILINE)
SYLLABUS_MARKER = re.compile(r"^<!--\s*syllabus\s*-->[ \t]*$", re.MULTILINE)
# `<!-- support -->` (indented as the table must be): what each lab runs per GPU generation, from
# site/data/support.json, which ./course doctor reads too.
SUPPORT_MARKER = re.compile(r"^([ \t]*)<!--\s*support\s*-->[ \t]*$", re.MULTILINE)
SUPPORT = trees.SITE_SOURCES / "data" / "support.json"
STATUS_LABEL = {"ready": "ready", "below-target": "ready, below its speed target", "in-progress": "being written",
                "planned": "planned"}


# ------------------------------------------------------------------ the repository
def _one(folder: Path, number: str, suffix: str = "") -> Path | None:
    found = sorted(folder.glob(f"{number}-*{suffix}"))
    return found[0] if found else None


def _nav_pages(nav) -> list[str]:
    """Every page path named in mkdocs.yml's nav (any nesting)."""
    out: list[str] = []
    if isinstance(nav, str):
        out.append(nav)
    elif isinstance(nav, list):
        for item in nav:
            out += _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            out += _nav_pages(value)
    return out


def lesson_status(number: str, nav_pages: list[str]) -> tuple[str, str | None]:
    """(status, page file name or None) of lesson `number`, from what the repository holds."""
    page = _one(trees.LESSONS, number, ".md")
    lab = _one(trees.LABS, number)
    solution = _one(trees.SOLUTIONS, number)
    bench = trees.BENCH_DATA / f"{lab.name}.json" if lab else None
    if page and lab and lab.is_dir() and bench.exists():
        cases = json.loads(bench.read_text())["cases"]
        return ("below-target" if any(c["ratio"] < c["target"] for c in cases) else "ready"), page.name
    in_nav = any(re.match(rf"^{number}-[a-z0-9-]+\.md$", p) for p in nav_pages)
    if page or lab or solution or in_nav:
        return "in-progress", page.name if page else None
    return "planned", None


def repo_parts(config) -> tuple[str, str] | None:
    """(owner, name) from repo_url, for github.com URLs."""
    url = urlparse(config.get("repo_url") or "")
    parts = [p for p in url.path.strip("/").removesuffix(".git").split("/") if p]
    if url.netloc.endswith("github.com") and len(parts) >= 2:
        return parts[0], parts[1]
    return None


def task_ids(lab: Path) -> list[str]:
    ids: set[str] = set()
    for path in lab.rglob("*"):
        if path.is_file() and path.suffix in trees.GENERATED_SUFFIXES:
            ids.update(TASK_ID.findall(path.read_text(errors="replace")))
    return sorted(ids, key=lambda t: [int(x) for x in re.findall(r"\d+", t)])


# ------------------------------------------------------------------ the home page
def syllabus_table(config) -> str:
    lessons = yaml.safe_load(SYLLABUS.read_text())
    nav_pages = _nav_pages(config.get("nav") or [])
    rows = ["| # | lesson | you write | the idea it leaves you with | status |", "|---|---|---|---|---|"]
    for lesson in lessons:
        number = str(lesson["number"]).zfill(2)
        status, page = lesson_status(number, nav_pages)
        title = f"[{lesson['title']}]({page})" if page else lesson["title"]
        badge = f'<span class="course-status course-status--{status}">{STATUS_LABEL[status]}</span>'
        rows.append(f"| {number} | {title} | {lesson['writes']} | {lesson['idea']} | {badge} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ lesson pages
def lab_box(number: str, name: str, config) -> tuple[str, list[str]]:
    """The markdown of the lab box, and the problems found on the way."""
    problems: list[str] = []
    lab = trees.LABS / name
    if not lab.is_dir():
        return "", [f"its lab folder labs/{name}/ does not exist (run ./course labs after adding solutions/{name}/)"]
    repo = repo_parts(config)
    base = (config.get("repo_url") or "").rstrip("/")
    files = sorted(p for p in lab.iterdir() if p.is_file() and not p.name.startswith("."))
    notebook = lab / f"{name}.ipynb"
    links = " · ".join(f"[`{p.name}`]({base}/blob/{BRANCH}/labs/{name}/{p.name})" for p in files if p != notebook)
    lines = [f'!!! example "The lab: `labs/{name}/`"', f"    Files: {links}", ""]
    buttons = [f"[Lab folder on GitHub]({base}/tree/{BRANCH}/labs/{name}){{ .md-button }}"]
    if notebook.exists():
        buttons.insert(0, f"[Notebook]({base}/blob/{BRANCH}/labs/{name}/{notebook.name}){{ .md-button }}")
        if repo:
            colab = f"https://colab.research.google.com/github/{repo[0]}/{repo[1]}/blob/{BRANCH}/labs/{name}/{notebook.name}"
            buttons.insert(0, f"[Open in Colab]({colab}){{ .md-button .md-button--primary }}")
        else:
            problems.append(f"repo_url {base!r} is not a github.com repository: no Colab link")
    else:
        problems.append(f"labs/{name}/ has no notebook {notebook.name}")
    lines += ["    " + " ".join(buttons), ""]
    ids = task_ids(lab)
    tasks = ", ".join(f"`{t}`" for t in ids) if ids else "none left (all done)"
    lines.append(f"    Tasks: {tasks} · grade them with `./course grade {number}` · "
                 f"compile only with `./course build {number}`")
    return "\n".join(lines) + "\n", problems


def _end_of_admonition(markdown: str, start: int) -> int:
    """Index just past the admonition whose header line ends at `start`: its body is the
    following indented (or blank) lines."""
    position = start
    for line in markdown[start:].splitlines(keepends=True):
        if line.strip() and not line.startswith(("    ", "\t")):
            break
        position += len(line)
    # Give back trailing blank lines so the box starts right after the body.
    while position > start and markdown[position - 2:position] == "\n\n":
        position -= 1
    return position


def support_table(indent: str) -> str:
    """The support table of site/data/support.json, each line indented by `indent`."""
    data = json.loads(SUPPORT.read_text())
    lines = ["| lab | " + " | ".join(column["title"] for column in data["columns"]) + " |",
             "|---|" + "---|" * len(data["columns"])]
    lines += ["| " + " | ".join([row["title"], *row["cells"]]) + " |" for row in data["rows"]]
    lines += ["", data["newer"]["note"]]
    return "\n".join(indent + line if line else "" for line in lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    if src == "index.md":
        markdown = SUPPORT_MARKER.sub(lambda match: support_table(match.group(1)), markdown, count=1)
    if src == "index.md" and SYLLABUS_MARKER.search(markdown):
        table = syllabus_table(config)
        return SYLLABUS_MARKER.sub(lambda _: table, markdown, count=1)
    match = LESSON_PAGE.match(src)
    if not match:
        return markdown
    number, name = match.group(1), src[:-3]
    problems: list[str] = []
    box, box_problems = lab_box(number, name, config)
    problems += box_problems
    objectives = OBJECTIVES.search(markdown)
    first_section = re.search(r"^## ", markdown, re.MULTILINE)
    if not objectives or (first_section and objectives.start() > first_section.start()):
        problems.append('it does not open with its learning objectives (an `!!! abstract "After this lesson '
                        'you can"` admonition before the first section)')
    if not EXERCISES.search(markdown):
        problems.append("it has no `## Exercises` section")
    lab = trees.LABS / name
    if lab.is_dir():
        missing = [t for t in task_ids(lab) if not re.search(rf"\b{re.escape(t)}\b", markdown)]
        if missing:
            problems.append(f"it does not name these tasks of its lab: {', '.join(missing)} (list every task "
                            "in a table: task id, file, what to write, the test that checks it)")
    for problem in problems:
        log.warning(f"lesson page {src}: {problem}")
    if box and objectives:
        at = _end_of_admonition(markdown, objectives.end())
        markdown = markdown[:at] + "\n" + box + "\n" + markdown[at:]
    elif box:
        title = re.search(r"^# .*\n", markdown, re.MULTILINE)
        at = title.end() if title else 0
        markdown = markdown[:at] + "\n" + box + "\n" + markdown[at:]
    return markdown

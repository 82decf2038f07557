"""Generate the student skeletons in labs/ from the reference solutions.

A solution file marks each student task with a region:

    // SOLUTION BEGIN lab00.1: what the student must do
    ...reference code...
    // SOLUTION STUB
    // ...code the skeleton gets instead, so it still compiles (optional)...
    // SOLUTION END

Stub lines are commented out in the solution (so the solution compiles without
them) and uncommented in the lab.

A long task text continues on the comment lines right after BEGIN that indent their text
by two or more spaces; they follow the TODO line in the lab, so no TODO line runs long:

    // SOLUTION BEGIN lab05.2: one k-step of 16: ldmatrix.x4 the fragments of x
    //   and of weight, then mma_16816 every (i, j) pair into accumulators[i][j]

(`#` instead of `//` in Python and notebook cells). In the generated lab the
region becomes `// TODO(lab00.1): what the student must do` followed by the stub.
Each generated file starts with a banner that names its source and records a
hash of the generated body: a lab file whose body no longer matches its hash was
edited by a student, and is never overwritten without --force.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from coursekit import trees

# The line comment of each file type that may hold solution markers (.ipynb: per cell, as .py).
COMMENT = {**dict.fromkeys(trees.CXX_SUFFIXES, "//"), ".py": "#"}
BEGIN = re.compile(r"^(?P<indent>\s*)(?P<comment>//|#)\s*SOLUTION BEGIN\s+(?P<task>lab\d\d\.\d+)\s*:\s*(?P<text>.*)$")
STUB = re.compile(r"^\s*(//|#)\s*SOLUTION STUB\s*$")
STUB_LINE = re.compile(r"^(?P<indent>\s*)(//|#) ?(?P<code>.*?)\n?$")
END = re.compile(r"^\s*(//|#)\s*SOLUTION END\s*$")
# A continuation of the BEGIN line's task text: a comment whose text starts 2+ spaces in.
CONTINUATION = re.compile(r"^\s*(//|#)  +\S")
BANNER_HASH = re.compile(r"\[lab-hash ([0-9a-f]{12})\]")
SKIP_NAMES = {"__pycache__", ".ipynb_checkpoints"}


class MarkerError(ValueError):
    pass


def strip_solutions(text: str, where: str) -> str:
    """Replace every SOLUTION region with its TODO line and stub."""
    out: list[str] = []
    state = "code"  # code -> heading -> solution -> stub -> code
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if state == "heading":
            if CONTINUATION.match(line):
                out.append(line)
                continue
            state = "solution"
        begin = BEGIN.match(line)
        if begin:
            if state != "code":
                raise MarkerError(f"{where}:{number}: SOLUTION BEGIN inside another region")
            out.append(f"{begin['indent']}{begin['comment']} TODO({begin['task']}): {begin['text'].strip()}\n")
            state = "heading"
        elif STUB.match(line):
            if state != "solution":
                raise MarkerError(f"{where}:{number}: SOLUTION STUB outside a region")
            state = "stub"
        elif END.match(line):
            if state == "code":
                raise MarkerError(f"{where}:{number}: SOLUTION END without BEGIN")
            state = "code"
        elif state == "stub":
            stub = STUB_LINE.match(line)
            if not stub:
                raise MarkerError(f"{where}:{number}: a stub line must be commented out in the solution")
            out.append(stub["indent"] + stub["code"] + ("\n" if line.endswith("\n") else ""))
        elif state == "code":
            out.append(line)
    if state != "code":
        raise MarkerError(f"{where}: a SOLUTION region is never closed")
    return "".join(out)


def body_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:12]


BANNER_LINES = 3


def banner(source_rel: str, comment: str, digest: str) -> str:
    number = Path(source_rel).parts[1][:2]
    return (
        f"{comment} Lab skeleton generated from {source_rel} by `./course labs` [lab-hash {digest}].\n"
        f"{comment} Students: fill in the TODO(lab{number}.k) blocks, then run `./course grade {number}`.\n"
        f"{comment} Instructors: edit the solution file instead, then run `./course labs`.\n"
    )


def generate_text(source: Path, source_rel: str) -> str:
    """The lab file's full text for one solution file."""
    if source.suffix == ".ipynb":
        return _generate_notebook(source, source_rel)
    text = source.read_text()
    comment = COMMENT.get(source.suffix)
    if comment is None:
        return text  # copied verbatim (data, docs)
    body = strip_solutions(text, source_rel)
    return banner(source_rel, comment, body_hash(body)) + body


def _generate_notebook(source: Path, source_rel: str) -> str:
    notebook = json.loads(source.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = strip_solutions(src, source_rel).splitlines(keepends=True)
    notebook.setdefault("metadata", {}).pop("course", None)
    body = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    notebook["metadata"]["course"] = {"generated_from": source_rel, "lab_hash": body_hash(body)}
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def recorded_and_actual_hash(path: Path) -> tuple[str | None, str]:
    """The hash a generated file recorded, and the hash of its body now."""
    text = path.read_text()
    if path.suffix == ".ipynb":
        notebook = json.loads(text)
        recorded = notebook.get("metadata", {}).pop("course", {}).get("lab_hash")
        return recorded, body_hash(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    lines = text.splitlines(keepends=True)
    match = BANNER_HASH.search(lines[0]) if lines else None
    if not match:
        return None, body_hash(text)
    return match.group(1), body_hash("".join(lines[BANNER_LINES:]))


@dataclass
class Plan:
    writes: list[tuple[Path, str]]
    unchanged: list[Path]
    student_edited: list[Path]  # would overwrite a file a student changed
    extra: list[Path]  # in labs/ but generated from nothing


def plan(solutions: Path, labs: Path, root: Path) -> Plan:
    result = Plan([], [], [], [])
    expected: set[Path] = set()
    for source in sorted(solutions.rglob("*")):
        if source.is_dir() or SKIP_NAMES & set(source.parts):
            continue
        target = labs / source.relative_to(solutions)
        expected.add(target)
        text = generate_text(source, str(source.relative_to(root)))
        if target.exists() and target.read_text() == text:
            result.unchanged.append(target)
            continue
        if target.exists():
            try:
                recorded, actual = recorded_and_actual_hash(target)
            except (json.JSONDecodeError, UnicodeDecodeError):
                recorded, actual = None, ""
            if recorded is None or recorded != actual:
                result.student_edited.append(target)
        result.writes.append((target, text))
    if labs.exists():
        for existing in sorted(labs.rglob("*")):
            if existing.is_file() and existing not in expected and not SKIP_NAMES & set(existing.parts):
                result.extra.append(existing)
    return result


# ---------------------------------------------------------------- answers given away
# A SOLUTION body must not reach a student in another file of labs/ (a copy of a task's code in a given file: the
# task answered). Compared as runs of code lines (stripped, comments and blank lines dropped): a body of at least
# LEAK_MIN_LINES lines and LEAK_MIN_CHARS characters (lab08.8's leaked answer: two lines, 150 characters), all of it.
LEAK_MIN_LINES, LEAK_MIN_CHARS = 2, 60
# Leaks known and kept for now, each with why; the list only shrinks. (solution task, lab file relative to labs/)
KNOWN_LEAKS = {
    # The Hopper backward is given code that must not run a student's unfinished kernels: it carries its own copy of
    # the fragment-level steps of lab08.6 and lab08.8 (to be replaced by code of its own, or by a call into the
    # student's with the dependency between the tasks stated).
    ("lab08.6", "08-flash-attention/flash_backward_hopper.cu"),
    ("lab08.8", "08-flash-attention/flash_backward_hopper.cu"),
}


def _code_lines(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip() and not re.match(r"^\s*(//|#)", line)]


def solution_bodies(text: str) -> list[tuple[str, list[str]]]:
    """(task, its body's code lines) for each SOLUTION region of a solution file's text."""
    bodies, task, body, state = [], None, [], "code"
    for line in text.splitlines():
        if state == "heading" and CONTINUATION.match(line):
            continue
        if state in ("heading", "solution"):
            if STUB.match(line) or END.match(line):
                bodies.append((task, _code_lines(body)))
                state = "stub" if STUB.match(line) else "code"
                continue
            state = "solution"
            body.append(line)
            continue
        if state == "stub":
            state = "code" if END.match(line) else "stub"
            continue
        begin = BEGIN.match(line)
        if begin:
            task, body, state = begin["task"], [], "heading"
    return bodies


def leaks(solutions: Path, labs: Path) -> list[tuple[str, str]]:
    """(task, lab file relative to labs/) for each SOLUTION body (of LEAK_MIN_LINES code lines and LEAK_MIN_CHARS
    characters or more) whose code lines all appear, in order and together, in a file of labs/ (KNOWN_LEAKS left
    out)."""
    bodies = []
    for source in sorted(solutions.rglob("*")):
        if source.is_file() and source.suffix in COMMENT and not SKIP_NAMES & set(source.parts):
            bodies += [(task, lines) for task, lines in solution_bodies(source.read_text(errors="replace"))
                       if len(lines) >= LEAK_MIN_LINES and sum(map(len, lines)) >= LEAK_MIN_CHARS]
    found = []
    for target in sorted(labs.rglob("*")):
        if not target.is_file() or target.suffix not in COMMENT or SKIP_NAMES & set(target.parts):
            continue
        code = _code_lines(target.read_text(errors="replace").splitlines())
        where = str(target.relative_to(labs))
        for task, lines in bodies:
            if (task, where) not in KNOWN_LEAKS and _appears(lines, code):
                found.append((task, where))
    return sorted(set(found))


LEAK_GAP = 2  # code lines a copy may put between two of the body's (a declaration moved, a line added)


def _appears(body: list[str], code: list[str]) -> bool:
    """Whether every line of `body` is a line of `code`, in order, each at most LEAK_GAP lines after the last."""
    for start in (i for i, line in enumerate(code) if line == body[0]):
        at = start
        for line in body[1:]:
            window = code[at + 1:at + 2 + LEAK_GAP]
            if line not in window:
                break
            at += 1 + window.index(line)
        else:
            return True
    return False


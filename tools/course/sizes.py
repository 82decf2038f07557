"""Size budgets for `./course lint`: a file a newcomer can read in one sitting, a function they can see whole.

A source file (Python, C++/CUDA) over FILE_BUDGET lines, or a function over FUNCTION_BUDGET lines, fails, unless
tools/course/size_allowlist.txt names it with the size it had when the budget came in. That list only shrinks: an
entry may not grow past its recorded size, and an entry that now fits its budget (or names nothing) fails too, so
that whoever splits a file also takes it off the list. Standard library only (the CLI runs without torch).

    python3 tools/course/sizes.py            # check, as ./course lint does
    python3 tools/course/sizes.py --record   # rewrite the list from today's offenders (only to start it)
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWLIST = ROOT / "tools" / "course" / "size_allowlist.txt"
FILE_BUDGET, FUNCTION_BUDGET = 800, 80
PYTHON = {".py"}
CXX = {".cu", ".cuh", ".cpp", ".h", ".hpp", ".cc"}
SKIP_DIRS = {"labs", "build", ".git", ".venv", "node_modules", "__pycache__", ".whl"}  # labs/: generated
NOT_A_FUNCTION = re.compile(r"^\s*(?:template\s*<[^>]*>\s*)?(?:namespace|struct|class|enum|union|extern\s+\"C\")\b")


def sources() -> list[Path]:
    """The Python and C++/CUDA files of the repository, not walking into build outputs, venvs or hidden folders
    (a build folder of a class run holds tens of thousands of files)."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIP_DIRS and not d.startswith(".")]
        found += [Path(folder) / name for name in files if Path(name).suffix in PYTHON | CXX]
    return sorted(found)


def python_functions(text: str) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method, nested ones too."""
    found: list[tuple[str, int]] = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    found.append((name, child.end_lineno - first + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(text), "")
    return found


def _code_only(line: str) -> str:
    """The line without string and character literals and // comments (enough to count braces)."""
    line = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', line)
    return line.split("//", 1)[0]


def cxx_functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of the functions defined at namespace or class scope: a `{` whose statement so far has a
    parameter list and is no namespace, struct, class or enum, to its matching `}`. Block comments and
    preprocessor lines are skipped; a heuristic that fits clang-formatted code."""
    found: list[tuple[str, int]] = []
    depth, statement, start, open_at = 0, "", None, []
    in_comment = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw
        if in_comment:
            if "*/" not in line:
                continue
            line, in_comment = line.split("*/", 1)[1], False
        line = re.sub(r"/\*.*?\*/", "", _code_only(line))
        if "/*" in line:
            line, in_comment = line.split("/*", 1)[0], True
        if line.lstrip().startswith("#"):
            continue
        for char in line:
            if char == "{":
                if not statement.strip() and start is None:
                    start = number
                is_function = "(" in statement and not NOT_A_FUNCTION.match(statement) and not open_at_function(
                    open_at)
                open_at.append((depth, number if start is None else start, is_function, statement))
                depth += 1
                statement, start = "", None
            elif char == "}":
                depth -= 1
                if open_at:
                    _, began, is_function, signature = open_at.pop()
                    if is_function:
                        found.append((_function_name(signature), number - began + 1))
                statement, start = "", None
            elif char == ";":
                statement, start = "", None
            else:
                if start is None and not char.isspace():
                    start = number
                statement += char
        statement += " "
    return found


def _function_name(signature: str) -> str:
    """The name before the parameter list, past attributes such as __launch_bounds__(...) and __align__(...)."""
    names = [n for n in re.findall(r"([~\w:]+)\s*\(", signature)
             if not n.startswith("__") and n not in ("alignas", "decltype", "sizeof", "noexcept")]
    return names[0] if names else "?"


def open_at_function(open_at: list) -> bool:
    """Inside a function body already: braces there are blocks and lambdas, part of that function."""
    return any(is_function for _, _, is_function, _ in open_at)


def measure() -> dict[str, int]:
    """Every file and function over its budget: {"path": lines, "path::function": lines}."""
    over: dict[str, int] = {}
    for path in sources():
        text = path.read_text(errors="replace")
        relative = path.relative_to(ROOT).as_posix()
        lines = text.count("\n") + (not text.endswith("\n") and bool(text))
        if lines > FILE_BUDGET:
            over[relative] = lines
        try:
            functions = python_functions(text) if path.suffix in PYTHON else cxx_functions(text)
        except SyntaxError:
            continue  # ruff reports it
        for name, length in functions:
            key = f"{relative}::{name}"
            if length > FUNCTION_BUDGET:
                over[key] = max(over.get(key, 0), length)
    return over


def read_allowlist() -> dict[str, int]:
    allowed = {}
    for line in ALLOWLIST.read_text().splitlines() if ALLOWLIST.is_file() else []:
        if line.strip() and not line.startswith("#"):
            name, lines = line.rsplit(None, 1)
            allowed[name] = int(lines)
    return allowed


def problems(over: dict[str, int], allowed: dict[str, int]) -> list[str]:
    found = []
    for name, lines in sorted(over.items()):
        budget = FUNCTION_BUDGET if "::" in name else FILE_BUDGET
        what = "function" if "::" in name else "file"
        if name not in allowed:
            found.append(f"{name}: {lines} lines, over the {what} budget of {budget}: split it")
        elif lines > allowed[name]:
            found.append(f"{name}: {lines} lines, more than the {allowed[name]} it had when the budget came in "
                         f"({what} budget {budget}): it may only shrink")
    for name in sorted(set(allowed) - set(over)):
        found.append(f"{name}: within its budget now (or gone): take it off {ALLOWLIST.relative_to(ROOT)}")
    return found


def main(argv: list[str]) -> int:
    over = measure()
    if "--record" in argv:
        header = ("# Files over 800 lines and functions over 80 when the budgets came in (tools/course/sizes.py).\n"
                  "# This list only shrinks: split an entry, then delete its line.\n")
        ALLOWLIST.write_text(header + "".join(f"{name} {lines}\n" for name, lines in sorted(over.items())))
        print(f"wrote {ALLOWLIST.relative_to(ROOT)}: {len(over)} entries")
        return 0
    found = problems(over, read_allowlist())
    for problem in found:
        print(f"[course] size: {problem}")
    if not found:
        print(f"[course] size: every file within {FILE_BUDGET} lines and function within {FUNCTION_BUDGET}, "
              f"or on the allow-list ({len(read_allowlist())} entries, which only shrinks)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

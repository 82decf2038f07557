"""What a student reads after grading, what an instructor's spreadsheet gets, and Gradescope's results.json.

Everything here reads the per-test records of tests/conftest.py: `outcome`, `message`, `tasks`
(the TODO ids a test grades), `kind` ("student", or "reference" for a check of code the
student is given) and, for a failure, `todos` (the declared TODOs still open in the tree).
Messages are shown, never parsed.
"""
from __future__ import annotations

import ast
import csv
import json
import statistics
import sys
from pathlib import Path

import labgen
import sanitizer

from coursekit import trees

_COLOUR = sys.stdout.isatty()
_CODES = {"PASS": "32", "FAIL": "31", "SKIP": "33", "ERROR": "31"}
# Every lab's grader starts with this test: the lab compiles and imports. When it fails, the lab
# did not build, and every task of the lab scores 0.
BUILD_TEST = "test_builds"
REFERENCE_LABEL = "reference checks (code you were given)"
SHOWN_FAILURES = 5  # per task in a Gradescope output: the first few failures say what is wrong


def _tag(word: str) -> str:
    return f"\033[{_CODES[word]}m{word}\033[0m" if _COLOUR else word


def _is_reference(test: dict) -> bool:
    return test.get("kind") == "reference"


def _counts(tests: list[dict]) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for test in tests:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return counts


def _student_tests(result: dict) -> list[dict]:
    return [t for t in result.get("tests", []) if not _is_reference(t)]


def _reference_tests(result: dict) -> list[dict]:
    return [t for t in result.get("tests", []) if _is_reference(t)]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def open_todos(tests: list[dict], task: str | None = None) -> list[str]:
    """Each open TODO named by a failed test's `todos`, once, in task order ("TODO(lab00.1) at scale.cu:12: ...")."""
    seen: dict[tuple, dict] = {}
    for test in tests:
        if test["outcome"] != "failed":
            continue
        for todo in test.get("todos", []):
            if task is None or todo["task"] == task:
                seen.setdefault((todo["task"], todo["file"], todo["line"]), todo)
    return [f"TODO({t['task']}) at {t['file']}:{t['line']}: {t['text']}" for _, t in sorted(seen.items())]


def _reference_line(tests: list[dict]) -> str:
    counts = _counts(tests)
    parts = [f"{counts[k]} {k}" for k in ("passed", "failed", "skipped") if counts[k] or k == "passed"]
    return f"{REFERENCE_LABEL}: {', '.join(parts)}"


# ---------------------------------------------------------------- the terminal report
def print_summary(results: list[dict], verbose: bool = False) -> dict:
    """Print each lab's result; return the totals: student tests (passed, failed, skipped), the
    reference checks apart (reference_passed, reference_failed), and errors (labs that crashed)."""
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0,
              "reference_passed": 0, "reference_failed": 0, "reference_skipped": 0}
    for result in results:
        student, reference = _student_tests(result), _reference_tests(result)
        counts, reference_counts = _counts(student), _counts(reference)
        for key in ("passed", "failed", "skipped"):
            totals[key] += counts[key]
        totals["reference_passed"] += reference_counts["passed"]
        totals["reference_failed"] += reference_counts["failed"]
        totals["reference_skipped"] += reference_counts["skipped"]
        print(f"\n== {result['label']} (impl: {result['impl']}) -- {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['skipped']} skipped in {result['seconds']:.1f} s "
              f"(seed {result.get('seed')}: --seed {result.get('seed')} reproduces the inputs)")
        if result.get("error"):
            totals["errors"] += 1
            print(f"  {_tag('ERROR')} {result['error']}")
        skip_reasons: dict[str, int] = {}
        for test in result.get("tests", []):
            flag = " [reference check: code you were given, not a TODO]" if _is_reference(test) else ""
            if test["outcome"] == "failed":
                print(f"  {_tag('FAIL')} {test['name']}{flag}")
                for line in test.get("message", "").rstrip().splitlines()[:12]:
                    print(f"       {line}")
                if flag:
                    print("       this checks code the lab gives you: if you changed it, restore it from labs/; "
                          "if not, the set-up is at fault (./course doctor)")
            elif test["outcome"] == "skipped":
                if not flag:  # the reference checks' skips are counted on their own line
                    skip_reasons[test.get("message", "")] = skip_reasons.get(test.get("message", ""), 0) + 1
                if verbose:
                    print(f"  {_tag('SKIP')} {test['name']}{flag}")
            elif verbose:
                print(f"  {_tag('PASS')} {test['name']}{flag}")
        unfinished = open_todos(result.get("tests", []))
        if unfinished:
            print("  The failures above need these TODOs done first:")
            for line in unfinished:
                print(f"    {line}")
        for reason, count in skip_reasons.items():
            print(f"  {_tag('SKIP')} {count} test(s): {reason}")
        if reference:
            print(f"  {_reference_line(reference)}")
        for case in result.get("perf", []):
            print(f"  perf: {case['name']}: {case['ratio']:.2f}x {case['baseline_name']} "
                  f"(student bar {case['student_bar']:.2f}x, reference target {case['target']:.2f}x)")
        if result.get("sanitizer"):
            rows = result["sanitizer"]
            clean = [r["tool"] for r in rows if sanitizer.is_clean(r)]
            unchecked = result.get("sanitizer_not_checked", [])
            print(f"  compute-sanitizer over {rows[0]['tests']} case(s) in {result.get('sanitizer_seconds', 0):.0f} s: "
                  + (f"{', '.join(clean)} clean" if clean else "no tool clean")
                  + ("" if len(clean) + len(unchecked) == len(rows) else "; findings above"))
            for line in unchecked:  # the grader's tool failed, not the lab: no point is lost for it
                print(f"  {_tag('SKIP')} not checked: {line} (no point lost; the course's tool failed, not your lab)")
        print(f"  log: {result['log']}")
    if totals["reference_passed"] + totals["reference_failed"] + totals["reference_skipped"]:
        print(f"\n{REFERENCE_LABEL}: {totals['reference_passed']} passed, {totals['reference_failed']} failed, "
              f"{totals['reference_skipped']} skipped (counted in the total below)")
    # The closing line CI reads, alone on its line: every test, the student's and the reference checks.
    passed = totals["passed"] + totals["reference_passed"]
    failed = totals["failed"] + totals["errors"] + totals["reference_failed"]
    print(f"\ntotal: {passed} passed, {failed} failed, {totals['skipped'] + totals['reference_skipped']} skipped")
    return totals


def all_passed(totals: dict) -> bool:
    return totals["failed"] == 0 and totals["errors"] == 0 and totals["reference_failed"] == 0


def print_bench(cases: list[dict]) -> None:
    header = (f"{'case':<34} {'ours ms':>9} {'baseline':>22} {'base ms':>9} {'ratio':>6} {'target':>6} "
              f"{'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8}")
    print(header)
    print("-" * len(header))
    for c in cases:
        pct = f"{c['pct_of_copy']:.0f}" if c.get("pct_of_copy") else ""
        print(f"{c['name']:<34} {c['ours_ms']:>9.3f} {c['baseline_name']:>22} {c['baseline_ms']:>9.3f} "
              f"{c['ratio']:>6.2f} {c['target']:>6.2f} {c['ours_gbps'] or 0:>7.0f} {pct:>6} "
              f"{c['ours_tflops'] or 0:>8.1f}")
    print(f"gpu: {cases[0]['gpu']}; ratio = baseline time / our time (higher is better)")


# ---------------------------------------------------------------- points per task
def _static_points(lab) -> dict[str, float]:
    """POINTS read from the grader's source without importing it (used when the grading process
    died before reporting them): the module-level `POINTS = {...}` literal, or {}."""
    try:
        tree = ast.parse(lab.test_file.read_text())
    except (OSError, SyntaxError):
        return {}
    for node in tree.body:
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else getattr(node, "target", None))
        if isinstance(target, ast.Name) and target.id == "POINTS" and node.value is not None:
            try:
                return dict(ast.literal_eval(node.value))
            except ValueError:
                return {}
    return {}


def _static_titles(lab) -> dict[str, str]:
    """Each task's title from the solution's `SOLUTION BEGIN labNN.k: title` headers."""
    titles: dict[str, str] = {}
    folder = lab.dir_in(trees.resolve_tree("solutions"))
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.suffix in labgen.COMMENT:
            for line in path.read_text(errors="replace").splitlines():
                match = labgen.BEGIN.match(line)
                if match:
                    titles.setdefault(match["task"], match["text"].strip())
    return titles


def lab_tasks(result: dict) -> tuple[dict[str, float], dict[str, str]]:
    """(points, titles) of the lab of a result: as the grading process reported them (the grader's
    POINTS and the solution's task titles), else read from the sources (the process died first)."""
    name = result.get("lab")
    reported = result.get("labs", {}).get(name) if name else None
    if reported and (reported.get("points") or reported.get("titles")):
        return dict(reported.get("points") or {}), dict(reported.get("titles") or {})
    lab = trees.find_lab(name) if name else None
    return (_static_points(lab), _static_titles(lab)) if lab else ({}, {})


def lab_failure(result: dict) -> str | None:
    """Why the whole lab scores 0, if it does: the process crashed or hung (or the sanitizer
    found problems), or the lab did not build."""
    if result.get("error"):
        return result["error"]
    if result.get("not_checked") or result.get("build_infrastructure"):
        why = result.get("not_checked") or f"the grader's build could not run: {result['build_infrastructure']}"
        return f"NOT GRADED, not your code's fault: {why}. Your instructor will grade this lab again."
    for test in result.get("tests", []):
        if test["name"] == BUILD_TEST and test["outcome"] == "failed":
            return test.get("message") or "the lab did not build"
    return None


def task_scores(result: dict) -> list[dict]:
    """One row per task of the lab: its points, and the score the share rule gives it.

    The rule (lessons/instructors.md): a task's score is its POINTS times the share of its student
    tests that ran and passed (skipped tests do not count; a task none of whose tests ran scores 0);
    reference checks and the build check never count (an untouched skeleton builds: that earns
    nothing); a build failure or a crash scores 0 for every task of the lab.
    Without POINTS in the grader, each task is worth 1 point.
    """
    points, titles = lab_tasks(result)
    failure = lab_failure(result)
    student = _student_tests(result)
    rows = []
    for task in sorted(set(points) | set(titles)):
        maximum = float(points.get(task, 0 if points else 1))
        tests = [t for t in student if task in t.get("tasks", []) and t["name"] != BUILD_TEST]
        counts = _counts(tests)
        ran = counts["passed"] + counts["failed"]
        lines = []
        if failure:
            score = 0.0
            lines.append(f"0 points: the lab was not graded:\n{failure}")
        elif not tests:
            score = 0.0
            lines.append("0 points: no test of the grader declares this task")
        elif not ran:
            score = 0.0
            reasons = sorted({t.get("message", "") for t in tests})
            lines.append(f"0 points: none of its {_plural(len(tests), 'test')} ran (skipped: {'; '.join(reasons)})")
        else:
            score = round(maximum * counts["passed"] / ran, 2)
            lines.append(f"{counts['passed']} of {_plural(ran, 'test')} passed"
                         + (f" ({counts['skipped']} more skipped: {_first_skip(tests)})" if counts["skipped"] else ""))
            failed = [t for t in tests if t["outcome"] == "failed"]
            for test in failed[:SHOWN_FAILURES]:
                lines.append(f"FAIL {test['name']}")
                lines.extend(f"    {line}" for line in test.get("message", "").rstrip().splitlines()[:8])
            if len(failed) > SHOWN_FAILURES:
                lines.append(f"... and {_plural(len(failed) - SHOWN_FAILURES, 'more failed test')} "
                             "(./course grade lists each)")
            todos = open_todos(tests, task)
            if todos:
                lines.append("still to do:")
                lines.extend(f"    {line}" for line in todos)
        rows.append({"lab": result.get("lab"), "task": task, "title": titles.get(task, ""), "max_score": maximum,
                     "score": score, **counts, "passed_all": bool(ran) and not counts["failed"] and not failure,
                     "output": "\n".join(lines)})
    return rows


def _first_skip(tests: list[dict]) -> str:
    return next((t.get("message", "") for t in tests if t["outcome"] == "skipped"), "")


# ---------------------------------------------------------------- Gradescope
# https://gradescope-autograders.readthedocs.io/en/latest/specs/ (results.json): top level score,
# execution_time, output, tests; per test name, score, max_score, output, visibility, status.
GRADESCOPE_VISIBILITY = "visible"


def _lab_output(result: dict, rows: list[dict]) -> str:
    counts = _counts(_student_tests(result))
    score, maximum = sum(r["score"] for r in rows), sum(r["max_score"] for r in rows)
    lines = [f"{result.get('lab') or result['label']}: {score:g} of {maximum:g} points; "
             f"tests {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
             f"(seed {result.get('seed')}: --seed {result.get('seed')} reproduces the inputs)"]
    failure = lab_failure(result)
    if failure:
        lines.append(failure)
    if counts["skipped"]:
        lines.append(f"skipped: {_first_skip(_student_tests(result))}")
    lines.extend(f"not checked (no point lost): {line}" for line in result.get("sanitizer_not_checked", []))
    reference = _reference_tests(result)
    if reference:
        lines.append(_reference_line(reference))
        for test in reference:
            if test["outcome"] == "failed":
                lines.append(f"FAIL {test['name']} [reference check: code you were given, not a TODO]: "
                             f"{(test.get('message') or '').splitlines()[0] if test.get('message') else ''}")
    for case in result.get("perf", []):
        lines.append(f"perf: {case['name']}: {case['ratio']:.2f}x {case['baseline_name']} "
                     f"(student bar {case['student_bar']:.2f}x)")
    return "\n".join(lines)


def _shorten(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip(" ,;:") + "..."


def speed_score(result: dict) -> float | None:
    """A lab's speed for a leaderboard: the geometric mean of its perf ratios (baseline time / ours, on the GPU that
    graded it), counting only cases whose output was verified after timing; 0.0 when the lab crashed, hung or failed
    a correctness test (speed counts only for a correct lab); None when no perf case ran (no GPU)."""
    ratios = [case["ratio"] for case in result.get("perf", []) if case.get("verified") and case.get("ratio", 0) > 0]
    correct = not result.get("error") and not any(
        t["outcome"] == "failed" and t.get("kind") != "reference" and not t.get("perf")
        for t in result.get("tests", []))
    if not result.get("perf"):
        return None
    return round(statistics.geometric_mean(ratios), 4) if correct and ratios else 0.0


def leaderboard(results: list[dict], labs: list[str]) -> list[dict]:
    """Gradescope's leaderboard entries for the chosen labs (numbers such as "06"): one column per lab, its
    speed_score, higher first. A lab without perf results (graded without a GPU) gets no column."""
    entries = []
    for result in results:
        lab = result.get("lab") or ""
        if lab[:2] in labs:
            score = speed_score(result)
            if score is not None:
                entries.append({"name": f"{lab[:2]} speed-up over PyTorch (geomean)", "value": score,
                                "order": "desc"})
    return entries


def gradescope(results: list[dict], leaderboard_labs: list[str] | None = None) -> dict:
    """Gradescope's results.json for the labs of one submission: one test entry per task; with
    `leaderboard_labs`, the leaderboard entries of those labs (leaderboard())."""
    tests, outputs = [], []
    for result in results:
        if not result.get("lab"):
            continue
        rows = task_scores(result)
        outputs.append(_lab_output(result, rows))
        for row in rows:
            tests.append({
                "name": f"{row['lab']} {row['task']}" + (f": {_shorten(row['title'])}" if row["title"] else ""),
                "score": row["score"], "max_score": row["max_score"], "output": row["output"],
                "visibility": GRADESCOPE_VISIBILITY, "status": "passed" if row["passed_all"] else "failed",
            })
    data = {"score": round(sum(t["score"] for t in tests), 2),
            "execution_time": round(sum(r.get("seconds", 0) for r in results)),
            "output": "\n\n".join(outputs) or "no lab was graded", "tests": tests}
    if leaderboard_labs:
        data["leaderboard"] = leaderboard(results, leaderboard_labs)
    return data


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------- the class spreadsheet
CSV_FIELDS = ["student", "lab", "passed", "failed", "skipped", "perf_ratios", "errors", "points", "max_points"]


def csv_row(student: str, result: dict) -> dict:
    counts = _counts(result.get("tests", []))
    failures = [f"{t['name']}: {t.get('message', '').splitlines()[0] if t.get('message') else ''}"
                for t in result.get("tests", []) if t["outcome"] == "failed"]
    ratios = "; ".join(f"{c['name']}={c['ratio']:.2f}" for c in result.get("perf", []))
    rows = task_scores(result)
    return {"student": student, "lab": result["label"][len(student) + 1:], **counts,
            "perf_ratios": ratios,
            "errors": " | ".join(([result["error"].splitlines()[0]] if result.get("error") else []) + failures),
            "points": f"{sum(r['score'] for r in rows):g}", "max_points": f"{sum(r['max_score'] for r in rows):g}"}


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        print(f"{row['student']:<20} {row['lab']:<22} {row['passed']:>3} passed {row['failed']:>3} failed "
              f"{row['skipped']:>3} skipped {row['points']:>6}/{row['max_points']:<4} points  {row['perf_ratios']}")


def is_class_report(data) -> bool:
    """The JSON of `grade --all`: {student: [one result per lab, each with its label and tests]}."""
    return isinstance(data, dict) and all(
        isinstance(results, list) and all(isinstance(r, dict) and "label" in r and "tests" in r for r in results)
        for results in data.values())


def shard_problem(shards: dict[str, set], empty_files: int = 0) -> str | None:
    """What is wrong with a set of shards to merge, given each shard tag ("I/N", as `grade --all --shard`
    records it in every result) and the files it came from, and how many files hold no result at all (a
    shard with no student has no tag): two splits mixed, a shard twice, or a shard missing. None if sound."""
    if not shards:
        return None
    parsed = {tag: tuple(map(int, tag.split("/"))) for tag in shards}
    counts = sorted({count for _, count in parsed.values()})
    if len(counts) > 1:
        return f"the files come from different splits (shards of {' and of '.join(map(str, counts))})"
    twice = [f"{tag} (in {' and '.join(sorted(shards[tag]))})" for tag in sorted(shards) if len(shards[tag]) > 1]
    if twice:
        return f"the same shard in two files: {'; '.join(twice)}"
    missing = sorted(set(range(1, counts[0] + 1)) - {index for index, _ in parsed.values()})
    if len(missing) > empty_files:
        return (f"no result from shard(s) {', '.join(f'{index}/{counts[0]}' for index in missing)}: the class "
                "report would lack their students")
    return None


def print_sanitizer(lab: str, impl: str, rows: list[dict]) -> None:
    print(f"\ncompute-sanitizer on {lab} (impl: {impl})")
    for row in rows:
        if row.get("not_checked"):
            status = _tag("SKIP")
        elif row["process_error"] and not row["ran"]:
            status = _tag("ERROR")
        else:
            status = _tag("PASS") if sanitizer.is_clean(row) else _tag("FAIL")
        print(f"  {status} {row['tool']:<10} {row['errors']} error(s) over {row['tests']} test(s) "
              f"in {row['seconds']:.0f} s")
        for line in row["findings"]:
            print(f"       {line}")
        for line in row.get("failed_tests", []):
            print(f"       a test failed under {row['tool']} (the tool itself reported nothing on it): {line}")
        if row["process_error"]:
            print(f"       {row['process_error'].splitlines()[0]}")
        if row.get("retried_after"):
            print(f"       ran twice: the first run could not check ({row['retried_after']}); "
                  "the second ran alone, over every kernel")
        if row.get("not_checked"):
            print(f"       not checked: {row['not_checked']}")
        for line in row.get("foreign_findings", [])[:3]:
            print(f"       in a kernel that is not the lab's (not counted): {line}")
        if row["errors"] or row["process_error"]:
            print(f"       log: {row['log']}")

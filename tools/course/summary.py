"""A class at a glance: per task, how many students pass it and why the others fail; per student, the totals.

Reads the class report that `./course grade --all --json CLASS.json` writes (student -> that student's
per-lab results) and scores it with report.py's rule, so the points here are those of grades.csv and
of Gradescope.

    python tools/course/summary.py CLASS.json [-o DIR]   # prints the tables; writes DIR/CLASS-summary.md and .png

The chart needs matplotlib (`./course setup report`); without it the Markdown is written all the same.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

import report
import sanitizer

PASS_RULE = ("a task passes for a student when at least one student test declaring it ran, every one that ran "
             "passed (skipped tests do not count), and the lab built and neither crashed, hung nor had "
             "compute-sanitizer findings")
HUNG_PREFIX = "killed after the"  # how runner.run_pytest's error for a lab killed at its deadline starts
SETUP_HINT = "./course setup report"
SHOWN_FAILURES = 3  # per task in the Markdown; the terminal shows the most common one
# Numbers that differ from student to student or case to case (sizes, shapes, exit codes, addresses, and the
# GPU models a case is run for: A100, T4) become N, so that "launch_config(n=31) on a T4 gave 1 blocks" and
# "launch_config(n=4097) on a A100 gave 1 blocks" count as one line.
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\b[A-Z]\d+\b|\d+")


def normalise(message: str, impl: str = "") -> str:
    """The first line of a failure message, with the submission's path and every number made generic."""
    lines = (message or "").strip().splitlines()
    line = lines[0] if lines else "(no message)"
    if impl:
        line = line.replace(impl, "SUBMISSION")
    return " ".join(_NUMBER.sub("N", line).split())


def error_kind(result: dict) -> str | None:
    """Why the grading process of a lab gave no full result: "not graded" (the grader's own build could not run),
    "sanitizer", "hung", "crashed", or None."""
    if result.get("not_checked") or result.get("build_infrastructure"):
        return "not graded"
    if not result.get("error"):
        return None
    if any(sanitizer.fails_the_lab(row) for row in result.get("sanitizer", [])):
        return "sanitizer"
    # The runner records a hang only in its message; a `hung` field, when it has one, says it outright.
    return "hung" if result.get("hung") or result["error"].startswith(HUNG_PREFIX) else "crashed"


def _students(class_report: dict) -> dict[str, list[dict]]:
    """student -> results; a single run's JSON ({"impl", "results"}) counts as one student."""
    if isinstance(class_report.get("results"), list) and isinstance(class_report.get("impl"), str):
        return {Path(class_report["impl"]).name: class_report["results"]}
    return {name: results for name, results in class_report.items() if isinstance(results, list)}


def summarize(class_report: dict) -> dict:
    """Per lab and task: students graded, passing, with the task's TODO still open, and the failure lines
    (normalise()) with how many students hit each, most common first; per student: points and max points
    (report.task_scores), tests passed/failed/skipped (all tests, as in grades.csv), and the labs that crashed,
    hung or had sanitizer findings.

    The pass rule (PASS_RULE; report.task_scores's `passed_all`, Gradescope's status for the task): a task
    passes for a student when at least one student test declaring it ran, every one that ran passed (skipped
    tests do not count), and the lab built and neither crashed, hung nor had compute-sanitizer findings.
    A failure line counts a student once however many of their tests print it.
    """
    labs: dict[str, dict] = {}
    students: dict[str, dict] = {}
    for student, results in sorted(_students(class_report).items()):
        totals = {"points": 0.0, "max_points": 0.0, "passed": 0, "failed": 0, "skipped": 0, "errors": {}}
        for result in results:
            lab = result.get("lab") or result["label"][len(student) + 1:]
            result = {**result, "lab": lab}
            tests = result.get("tests", [])
            for outcome, count in Counter(t["outcome"] for t in tests).items():
                totals[outcome] = totals.get(outcome, 0) + count
            kind = error_kind(result)
            if kind:
                totals["errors"][lab] = kind
            failure = report.lab_failure(result)
            entry = labs.setdefault(lab, {"graded": 0, "tasks": {}, "speed": []})
            entry["graded"] += 1
            speed = report.speed_score(result)
            if speed is not None:
                entry["speed"].append(speed)
            for row in report.task_scores(result):
                totals["points"] += row["score"]
                totals["max_points"] += row["max_score"]
                task = entry["tasks"].setdefault(row["task"], {"title": row["title"], "points": row["max_score"],
                                                               "graded": 0, "passed": 0, "todo_open": 0,
                                                               "failures": Counter()})
                task["graded"] += 1
                task["passed"] += row["passed_all"]
                declaring = [t for t in tests if row["task"] in t.get("tasks", []) and t.get("kind") != "reference"]
                task["todo_open"] += bool(report.open_todos(declaring, row["task"]))
                # A set: one wrong kernel fails dozens of cases with one message, and is one student's mistake.
                lines = {normalise(t.get("message", ""), result.get("impl", ""))
                         for t in declaring if t["outcome"] == "failed"}
                if failure:
                    lines.add(normalise(failure, result.get("impl", "")))
                task["failures"].update(lines)
        totals["points"], totals["max_points"] = round(totals["points"], 2), round(totals["max_points"], 2)
        students[student] = totals
    for entry in labs.values():
        for task in entry["tasks"].values():
            ranked = sorted(task["failures"].items(), key=lambda item: (-item[1], item[0]))
            task["failures"] = [{"line": line, "students": count} for line, count in ranked]
    return {"rule": PASS_RULE, "students": students, "labs": dict(sorted(labs.items()))}


def speed_spread(scores: list[float]) -> str | None:
    """The class's spread of one lab's speed-up (report.speed_score): min, quartiles, max; None without GPU runs.
    A 0 is a lab that failed a correctness test: its speed does not count."""
    if not scores:
        return None
    ranked = sorted(scores)
    quartiles = statistics.quantiles(ranked, n=4, method="inclusive") if len(ranked) > 1 else ranked * 3
    points = [ranked[0], *quartiles, ranked[-1]]
    zero = sum(1 for score in ranked if score == 0)
    spread = ", ".join(f"{label} {value:.2f}x" for label, value in zip(("min", "q1", "median", "q3", "max"), points))
    return (f"speed-up over PyTorch (geomean of the perf cases), {_plural(len(ranked), 'student')}: {spread}"
            + (f"; {zero} at 0 (a correctness failure)" if zero else ""))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _problems(totals: dict) -> str:
    return ", ".join(f"{lab} {kind}" for lab, kind in totals["errors"].items())


def print_table(summary: dict) -> None:
    """Per lab, per task: students passing / graded, its points, the most common failure; then each student."""
    for lab, entry in summary["labs"].items():
        print(f"\n{lab}: {_plural(entry['graded'], 'student')} graded")
        spread = speed_spread(entry["speed"])
        if spread:
            print(f"  {spread}")
        print(f"  {'task':<10} {'passed':>7} {'points':>6}  most common failure [students]")
        for name, task in entry["tasks"].items():
            top = task["failures"][0] if task["failures"] else None
            print(f"  {name:<10} {str(task['passed']) + '/' + str(task['graded']):>7} {task['points']:>6g}  "
                  + (f"[{top['students']}] {_clip(top['line'], 90)}" if top else ""))
    print(f"\n{'student':<20} {'points':>13} {'passed':>7} {'failed':>7} {'skipped':>7}  "
          "crashed / hung / sanitizer / not graded")
    for name, totals in summary["students"].items():
        points = f"{totals['points']:g} / {totals['max_points']:g}"
        print(f"{name:<20} {points:>13} {totals['passed']:>7} "
              f"{totals['failed']:>7} {totals['skipped']:>7}  {_problems(totals)}")
    print(f"\n({summary['rule']})")


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: a `|` would end the cell, a `<` start an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _chart(summary: dict, path: Path) -> str | None:
    """A bar per task: the share of its graded students who pass it. None once written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # off-screen: a grading server has no display
        import matplotlib.pyplot as plt
    except ImportError:
        return f"The pass-rate chart needs matplotlib: `{SETUP_HINT}` installs it (requirements/report.txt)."
    rows = [(name, task) for entry in summary["labs"].values() for name, task in entry["tasks"].items()]
    if not rows:
        return "No task was graded, so there is no chart."
    rates = [100 * task["passed"] / task["graded"] if task["graded"] else 0 for _, task in rows]
    figure, axes = plt.subplots(figsize=(7, 1.2 + 0.32 * len(rows)))
    bars = axes.barh([name for name, _ in rows], rates, color="#4c72b0")
    axes.bar_label(bars, labels=[f"{task['passed']}/{task['graded']}" for _, task in rows], padding=3)
    axes.invert_yaxis()  # the first task on top, as in the tables
    axes.set_xlim(0, 112)  # room for the last label past a full bar
    axes.set_xticks(range(0, 101, 20))
    axes.set_xlabel("% of graded students who pass the task")
    axes.set_title(f"Pass rate per task ({_plural(len(summary['students']), 'student')})")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None


def write_markdown(summary: dict, path: Path) -> list[Path]:
    """The tables and the pass-rate chart (a PNG beside the Markdown, linked from it); returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_suffix(".png")
    missing = _chart(summary, png)
    lines = ["# Class summary", "",
             f"{_plural(len(summary['students']), 'student')}; {summary['rule']}.", "",
             f"_{missing}_" if missing else f"![Pass rate per task]({png.name})", ""]
    for lab, entry in summary["labs"].items():
        lines += [f"## {lab} ({_plural(entry['graded'], 'student')} graded)", ""]
        spread = speed_spread(entry["speed"])
        if spread:
            lines += [spread[0].upper() + spread[1:] + ".", ""]
        lines += ["| task | passed | TODO left open | points | most common failures [students] |",
                  "|---|---:|---:|---:|---|"]
        for name, task in entry["tasks"].items():
            title = f"{name}: {_clip(task['title'], 60)}" if task["title"] else name
            failures = "<br>".join(f"[{f['students']}] {_cell(_clip(f['line'], 120))}"
                                   for f in task["failures"][:SHOWN_FAILURES])
            lines.append(f"| {_cell(title)} | {task['passed']}/{task['graded']} | {task['todo_open']} "
                         f"| {task['points']:g} | {failures} |")
        lines.append("")
    lines += ["## Students", "",
              "| student | points | tests passed | failed | skipped | crashed / hung / sanitizer / not graded |",
              "|---|---:|---:|---:|---:|---|"]
    for name, totals in summary["students"].items():
        lines.append(f"| {_cell(name)} | {totals['points']:g} / {totals['max_points']:g} | {totals['passed']} "
                     f"| {totals['failed']} | {totals['skipped']} | {_problems(totals)} |")
    path.write_text("\n".join(lines) + "\n")
    return [path] + ([] if missing else [png])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="summary.py", description=__doc__.splitlines()[0])
    parser.add_argument("class_json", type=Path, help="the JSON of ./course grade --all --json CLASS.json")
    parser.add_argument("-o", "--out", type=Path, help="folder of CLASS-summary.md and .png (default: the JSON's)")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.class_json.read_text())
    except (OSError, json.JSONDecodeError) as error:
        print(f"summary: cannot read {args.class_json}: {error}")
        return 2
    summary = summarize(data)
    print_table(summary)
    written = write_markdown(summary, (args.out or args.class_json.parent) / f"{args.class_json.stem}-summary.md")
    print(f"[course] wrote {' and '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

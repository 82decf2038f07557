"""What a student reads after grading, and what an instructor's spreadsheet gets."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import env
import runner

_COLOUR = sys.stdout.isatty()
# The line tests/harness/check.py puts before the TODOs a failure needs (defined in trees.py).
UNFINISHED = env.load_trees().UNFINISHED
_CODES = {"PASS": "32", "FAIL": "31", "SKIP": "33", "ERROR": "31"}


def _tag(word: str) -> str:
    return f"\033[{_CODES[word]}m{word}\033[0m" if _COLOUR else word


def _counts(result: dict) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for test in result.get("tests", []):
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return counts


def print_summary(results: list[dict], verbose: bool = False) -> dict:
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for result in results:
        counts = _counts(result)
        for key in ("passed", "failed", "skipped"):
            totals[key] += counts[key]
        print(f"\n== {result['label']} (impl: {result['impl']}) -- {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['skipped']} skipped in {result['seconds']:.1f} s "
              f"(seed {result.get('seed')}: --seed {result.get('seed')} reproduces the inputs)")
        if result.get("error"):
            totals["errors"] += 1
            print(f"  {_tag('ERROR')} {result['error']}")
        skip_reasons: dict[str, int] = {}
        unfinished: list[str] = []
        for test in result.get("tests", []):
            if test["outcome"] == "failed":
                message, _, todos = test.get("message", "").rstrip().partition(UNFINISHED)
                for line in todos.splitlines()[1:]:
                    if line.strip() and line.strip() not in unfinished:
                        unfinished.append(line.strip())
                print(f"  {_tag('FAIL')} {test['name']}")
                for line in message.rstrip().splitlines()[:12]:
                    print(f"       {line}")
            elif test["outcome"] == "skipped":
                skip_reasons[test.get("message", "")] = skip_reasons.get(test.get("message", ""), 0) + 1
                if verbose:
                    print(f"  {_tag('SKIP')} {test['name']}")
            elif verbose:
                print(f"  {_tag('PASS')} {test['name']}")
        if unfinished:
            print("  The failures above need these TODOs done first:")
            for line in unfinished:
                print(f"    {line}")
        for reason, count in skip_reasons.items():
            print(f"  {_tag('SKIP')} {count} test(s): {reason}")
        for case in result.get("perf", []):
            print(f"  perf: {case['name']}: {case['ratio']:.2f}x {case['baseline_name']} "
                  f"(student bar {case['student_bar']:.2f}x, reference target {case['target']:.2f}x)")
        print(f"  log: {result['log']}")
    # The closing line CI reads: counts over every lab and the grader's own tests.
    print(f"\ntotal: {totals['passed']} passed, {totals['failed'] + totals['errors']} failed, {totals['skipped']} skipped")
    return totals


def print_bench(cases: list[dict]) -> None:
    header = f"{'case':<34} {'ours ms':>9} {'baseline':>22} {'base ms':>9} {'ratio':>6} {'target':>6} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8}"
    print(header)
    print("-" * len(header))
    for c in cases:
        pct = f"{c['pct_of_copy']:.0f}" if c.get("pct_of_copy") else ""
        print(f"{c['name']:<34} {c['ours_ms']:>9.3f} {c['baseline_name']:>22} {c['baseline_ms']:>9.3f} "
              f"{c['ratio']:>6.2f} {c['target']:>6.2f} {c['ours_gbps'] or 0:>7.0f} {pct:>6} {c['ours_tflops'] or 0:>8.1f}")
    print(f"gpu: {cases[0]['gpu']}; ratio = baseline time / our time (higher is better)")


def csv_row(student: str, result: dict) -> dict:
    counts = _counts(result)
    failures = [f"{t['name']}: {t.get('message', '').splitlines()[0] if t.get('message') else ''}"
                for t in result.get("tests", []) if t["outcome"] == "failed"]
    ratios = "; ".join(f"{c['name']}={c['ratio']:.2f}" for c in result.get("perf", []))
    return {"student": student, "lab": result["label"][len(student) + 1:], **counts,
            "perf_ratios": ratios, "errors": " | ".join(([result["error"].splitlines()[0]] if result.get("error") else []) + failures)}


def write_csv(path: Path, rows: list[dict]) -> None:
    fields = ["student", "lab", "passed", "failed", "skipped", "perf_ratios", "errors"]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        print(f"{row['student']:<20} {row['lab']:<22} {row['passed']:>3} passed {row['failed']:>3} failed "
              f"{row['skipped']:>3} skipped  {row['perf_ratios']}")


def print_sanitizer(lab: str, impl: str, rows: list[dict]) -> None:
    print(f"\ncompute-sanitizer on {lab} (impl: {impl})")
    for row in rows:
        if row["process_error"] and not row["ran"]:
            status = _tag("ERROR")
        else:
            status = _tag("PASS") if runner.is_clean(row) else _tag("FAIL")
        print(f"  {status} {row['tool']:<10} {row['errors']} error(s) over {row['tests']} test(s) in {row['seconds']:.0f} s")
        for line in row["findings"]:
            print(f"       {line}")
        if row["process_error"]:
            print(f"       {row['process_error'].splitlines()[0]}")
        if row["errors"] or row["process_error"]:
            print(f"       log: {row['log']}")

"""Issue 34's class acceptance, on the GPU box: the unmodified solutions of every lab as three students each, graded
as a class; every student must score full points with no failed test.

    python3 tools/gpu/probe/class_acceptance.py make [STUDENTS]      build/class-acceptance/s1..sN, copies of solutions/
    python3 tools/gpu/probe/class_acceptance.py grade [--jobs N] [--shard I/N] [--labs "00 01"]
                                                                      ./course grade --all over them: $OUT/class-*.json
    python3 tools/gpu/probe/class_acceptance.py check CLASS.json [...]   each student x lab: points, failures, where the
                                                                      time went; exit 1 unless every one is full

One device call holds 10 minutes: a whole class (33 runs, each lab's cold build, every perf case one at a time) does
not fit one, so grade it in shards (--shard 1/3 ... 3/3, one student each) or a few labs a call (--labs), and check
the shard reports together (their students are disjoint). The sanitizer's quick pass runs (the default of grade on a
GPU): its not-checked and retried rows are listed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools" / "course"))
import report  # noqa: E402

CLASS = ROOT / "build" / "class-acceptance"


def make(students: int) -> None:
    for index in range(1, students + 1):
        target = CLASS / f"s{index}"
        if not target.is_dir():
            shutil.copytree(ROOT / "solutions", target, ignore=shutil.ignore_patterns("__pycache__"))
    print(f"{students} students under {CLASS}")


def grade(args: list[str]) -> int:
    out = Path(os.environ.get("OUT", ROOT / "build"))
    labs = []
    if "--labs" in args:
        at = args.index("--labs")
        labs, args = args[at + 1].split(), args[:at] + args[at + 2:]
    name = "class" + "".join(f"-{a.replace('/', 'of').lstrip('-')}" for a in args)
    command = [str(ROOT / "course"), "grade", *labs, "--all", "--impl", str(CLASS), "--json", str(out / f"{name}.json"),
               *args]
    print(" ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


def check(paths: list[str]) -> int:
    bad = 0
    for path in paths:
        for student, results in json.loads(Path(path).read_text()).items():
            if not isinstance(results, list):
                continue
            for result in results:
                rows = report.task_scores(result)
                score, maximum = sum(r["score"] for r in rows), sum(r["max_score"] for r in rows)
                failed = [t["name"] for t in result.get("tests", []) if t["outcome"] == "failed"]
                unchecked = result.get("sanitizer_not_checked", [])
                retried = [r["tool"] for r in result.get("sanitizer", []) if r.get("retried_after")]
                full = score == maximum and not failed and not report.lab_failure(result)
                bad += not full
                phases = result.get("phases", {})
                print(f"{'OK ' if full else 'BAD'} {student} {result.get('lab')}: {score:g}/{maximum:g}, "
                      f"{len(failed)} failed{': ' + ', '.join(failed[:3]) if failed else ''}"
                      f"{'; ' + str(report.lab_failure(result))[:200] if report.lab_failure(result) else ''}"
                      f"{'; not checked: ' + '; '.join(unchecked) if unchecked else ''}"
                      f"{'; retried: ' + ', '.join(retried) if retried else ''} | "
                      + " ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    print(f"{bad} student x lab run(s) short of full points")
    return 1 if bad else 0


if __name__ == "__main__":
    verb, rest = sys.argv[1], sys.argv[2:]
    if verb == "make":
        make(int(rest[0]) if rest else 3)
    elif verb == "grade":
        raise SystemExit(grade(rest))
    elif verb == "check":
        raise SystemExit(check(rest))
    else:
        raise SystemExit(__doc__)

"""Issue 19's bar, measured: a class of 16 submissions of lab 00 graded one after another and with --jobs.

    ./course run tools/gpu/probe/class_scale.py seq          grade with --jobs 1: $OUT/class-seq.json (+ seconds)
    ./course run tools/gpu/probe/class_scale.py jobs [N]
        grade with --jobs N (default: ./course's): $OUT/class-jobs.json
    ./course run tools/gpu/probe/class_scale.py seq --shard I/N
        the I-th of N slices with --jobs 1: $OUT/class-seq-I.json
    ./course run tools/gpu/probe/class_scale.py compare A [A2 ...] B
                                                        the sequential report (or its shards: their seconds added,
                                                        their students joined) against --jobs's B: speed-up, same
                                                        outcomes, perf differences

(one device call fits one run of the class, not both: each pays 16 cold builds; the sequential run may not fit one
call of 600 s, so it can run as shards in two calls: the class's sequential time is their times added, each shard
with cold builds as the whole run has).

The class: 8 right ones (copies of the solution), 2 untouched skeletons, 2 that do not compile, 2 that crash
(an illegal address), 1 that hangs (a kernel that never ends: the deadline kills it) and 1 slow-but-right one
(a grid of one block). Both runs use the same folders, --no-sanitize (the quick sanitizer pass is per
submission and the same in both; test_course_grader.py covers it) and --deadline 60 (DEADLINE_S). Reported: both wall
times and their ratio, whether every submission's pass/fail per test is the same, and the perf ratios of the
right submissions in both runs (the largest relative difference; the bar is 5%).

Where the time goes (issue 19): each run prints, per submission, the phases the class JSON records
(tools/course/runner.py PHASES: queued, startup, build, correctness, sanitizer, perf_wait, perf, total) and
the breakdown line (each phase summed, the wall time, the sum of the totals over it); `compare` prints both.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools" / "course"))
import runner  # noqa: E402  (tools/course: the phases and the breakdown line ./course grade --all prints)

from coursekit import trees  # noqa: E402
from harness import mutants  # noqa: E402

LAB = trees.find_lab("00")
LOOP = ("  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {\n"
        "    y[i]")
CLASS = {
    **{f"good{i:02d}": ("solutions", []) for i in range(8)},
    **{f"skeleton{i}": ("labs", []) for i in range(2)},
    **{f"syntax{i}": ("solutions", [("scale.cu", "#include <algorithm>", "#include <algorithm>\nnot C++;")])
       for i in range(2)},
    # y[i + 2^40]: far outside any allocation, an illegal address the first time a thread stores
    **{f"crash{i}": ("solutions", [("scale.cu", "    y[i] = alpha * x[i];",
                                     "    y[i + (int64_t(1) << 40)] = alpha * x[i];")]) for i in range(2)},
    # i never advances: every thread stores forever, until the deadline kills the run
    "hang": ("solutions", [("scale.cu", LOOP, LOOP.replace("i += stride", "i += 0"))]),
    "slow": ("solutions", [("scale.cu", "std::min(needed_blocks, resident_blocks)",
                            "std::min<int64_t>(needed_blocks, 1)")]),
}


# Each grading process's deadline (the build counts): with --jobs 1 a submission's one process builds cold and runs
# every test, 22-31 s on an H100 for lab 00, so 30 s killed four right ones of a shard (2026-11-26); the hanging one
# costs the deadline in both runs.
DEADLINE_S = 60
# With --test-deadline (`class_scale.py jobs 8 --test-deadline S`, the same for `seq`): one test running S seconds,
# builds not counted, is a hang. Lab 00's longest test on an H100 was the notebook's, 7-14 s (it builds inside).


def grade(submissions: Path, jobs: int, out: Path, shard: str | None = None, test_deadline: str | None = None) -> float:
    start = time.perf_counter()
    run = subprocess.run([str(ROOT / "course"), "grade", "00", "--all", "--impl", str(submissions), "--no-sanitize",
                          "--deadline", str(DEADLINE_S), "--jobs", str(jobs), "--json", str(out),
                          *(["--shard", shard] if shard else []),
                          *(["--test-deadline", test_deadline] if test_deadline else [])],
                         capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(run.stdout[-1500:], flush=True)
    return seconds


def phase_table(report: dict, seconds: float) -> str:
    """Per submission its phases (runner.PHASES, from the class JSON), how its run ended, then the breakdown
    line over the class with this script's wall time (which includes ./course's own start and the report)."""
    keys = runner.PHASES
    lines = [f"{'student':<10} " + " ".join(f"{key:>11}" for key in keys) + "  error"]
    for student, results in report.items():
        for result in results:
            phases = result.get("phases", {})
            error = (result.get("error") or "").splitlines()[0][:60] if result.get("error") else ""
            lines.append(f"{student:<10} " + " ".join(f"{phases.get(key, float('nan')):>11.1f}" for key in keys)
                         + f"  {error}")
    lines.append(runner.breakdown([r for results in report.values() for r in results], seconds))
    return "\n".join(lines)


def outcomes(report: dict) -> dict:
    return {student: {t["name"]: t["outcome"] for result in results for t in result["tests"]}
            for student, results in report.items()}


def perf_ratios(report: dict) -> dict:
    return {(student, p["name"]): p["ratio"] for student, results in report.items() if student.startswith("good")
            for result in results for p in result.get("perf", [])}


def joined(runs: list[dict]) -> dict:
    """One run from the shards of a class (or the one run itself): their seconds added, their students joined."""
    if len(runs) == 1:
        return runs[0]
    students = [name for run in runs for name in run["report"]]
    assert len(students) == len(set(students)) == runs[0]["students"], "shards overlap or miss students"
    return {**runs[0], "seconds": sum(run["seconds"] for run in runs),
            "report": {name: results for run in runs for name, results in run["report"].items()},
            "shard": "+".join(str(run.get("shard")) for run in runs)}


def compare(seq: dict, par: dict) -> dict:
    ratios_seq, ratios_par = perf_ratios(seq["report"]), perf_ratios(par["report"])
    worst = max((abs(ratios_par[k] / ratios_seq[k] - 1) for k in ratios_seq if k in ratios_par), default=None)
    for name, run in (("sequential", seq), ("jobs", par)):
        print(f"{name} ({run.get('device')}, --jobs {run['jobs']}):\n{phase_table(run['report'], run['seconds'])}\n")
    return {"seconds": {"sequential": seq["seconds"], "jobs": par["seconds"]}, "jobs": par["jobs"],
            "speedup": seq["seconds"] / par["seconds"],
            "same_outcomes": outcomes(seq["report"]) == outcomes(par["report"]),
            "perf_cases_compared": len(ratios_seq), "worst_perf_difference": worst}


def main() -> None:
    out_dir = Path(os.environ.get("OUT", trees.BUILD))
    out_dir.mkdir(parents=True, exist_ok=True)
    if sys.argv[1] == "compare":
        runs = [json.loads(Path(p).read_text()) for p in sys.argv[2:]]
        print(json.dumps(compare(joined(runs[:-1]), runs[-1]), indent=1))
        return
    shard = sys.argv[sys.argv.index("--shard") + 1] if "--shard" in sys.argv else None
    test_deadline = sys.argv[sys.argv.index("--test-deadline") + 1] if "--test-deadline" in sys.argv else None
    count = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else None
    jobs = 1 if sys.argv[1] == "seq" else int(count) if count else min(8, (os.cpu_count() or 2) // 2)
    root = trees.BUILD / "class-scale"
    shutil.rmtree(root, ignore_errors=True)
    for student, (source, edits) in CLASS.items():
        mutants.plant(LAB, root / "class" / student, edits, source=source)
    shutil.rmtree(trees.BUILD / "jit", ignore_errors=True)  # every submission builds from cold
    seconds = grade(root / "class", jobs, root / "report.json", shard, test_deadline)
    result = {"device": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip(),
              "cpus": os.cpu_count(), "jobs": jobs, "students": len(CLASS), "seconds": seconds,
              "report": json.loads((root / "report.json").read_text())}
    print(f"{len(CLASS)} submissions, --jobs {jobs}: {seconds:.0f} s")
    print(phase_table(result["report"], seconds), flush=True)
    result["breakdown"] = runner.breakdown([r for rs in result["report"].values() for r in rs], seconds)
    result["shard"], result["test_deadline"] = shard, test_deadline
    name = f"class-{sys.argv[1]}" + (f"-{shard.split('/')[0]}" if shard else "")
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

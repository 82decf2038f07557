"""Issue 19's bar, measured: a class of 16 submissions of lab 00 graded one after another and with --jobs.

    python3 tools/gpu/probe/class_scale.py seq          grade with --jobs 1: $OUT/class-seq.json (+ seconds)
    python3 tools/gpu/probe/class_scale.py jobs [N]     grade with --jobs N (default: ./course's): $OUT/class-jobs.json
    python3 tools/gpu/probe/class_scale.py compare A B  the two reports: speed-up, same outcomes, perf differences

(one device call fits one run of the class, not both: each pays 16 cold builds).

The class: 8 right ones (copies of the solution), 2 untouched skeletons, 2 that do not compile, 2 that crash
(an illegal address), 1 that hangs (a kernel that never ends: the deadline kills it) and 1 slow-but-right one
(a grid of one block). Both runs use the same folders, --no-sanitize (the quick sanitizer pass is per
submission and the same in both; test_course_grader.py covers it) and --deadline 30. Reported: both wall
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools" / "course"))
import runner  # noqa: E402  (tools/course: the phases and the breakdown line ./course grade --all prints)

from harness import mutants, trees  # noqa: E402

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


def grade(submissions: Path, jobs: int, out: Path) -> float:
    start = time.perf_counter()
    run = subprocess.run([str(ROOT / "course"), "grade", "00", "--all", "--impl", str(submissions), "--no-sanitize",
                          "--deadline", "30", "--jobs", str(jobs), "--json", str(out)],
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
        print(json.dumps(compare(*(json.loads(Path(p).read_text()) for p in sys.argv[2:4])), indent=1))
        return
    jobs = 1 if sys.argv[1] == "seq" else int(sys.argv[2]) if len(sys.argv) > 2 else min(8, (os.cpu_count() or 2) // 2)
    root = trees.BUILD / "class-scale"
    shutil.rmtree(root, ignore_errors=True)
    for student, (source, edits) in CLASS.items():
        mutants.plant(LAB, root / "class" / student, edits, source=source)
    shutil.rmtree(trees.BUILD / "jit", ignore_errors=True)  # every submission builds from cold
    seconds = grade(root / "class", jobs, root / "report.json")
    result = {"device": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip(),
              "cpus": os.cpu_count(), "jobs": jobs, "students": len(CLASS), "seconds": seconds,
              "report": json.loads((root / "report.json").read_text())}
    print(f"{len(CLASS)} submissions, --jobs {jobs}: {seconds:.0f} s")
    print(phase_table(result["report"], seconds), flush=True)
    result["breakdown"] = runner.breakdown([r for rs in result["report"].values() for r in rs], seconds)
    (out_dir / f"class-{sys.argv[1]}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

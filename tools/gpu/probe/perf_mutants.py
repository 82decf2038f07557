"""Where do the student perf bars stand against the perf mutants? (issue 11, class 6)

    .venv/bin/./course run tools/gpu/probe/perf_mutants.py [LAB ...] [--mutant NAME ...] [--no-reference]
                                                      [--build-only] [--jobs N] [--budget SECONDS]

For every perf mutant (harness.Mutant(..., perf=True)) in the MUTANTS of the given labs (default: every lab that
has one): plant it where mutants.make_tree does (build/mutants/LAB/NAME), build it, and run the lab's perf tests
that its -k expression selects in a pytest process with the command mutants.grade uses (-m perf, --course-json);
then read the measured ratios from that report. The reference solutions' perf tests of each lab (all of them)
run once beside them. The table: lab, variant (mutant or 'reference'), perf case, ratio, the current student bar
and whether the ratio passes it, and the reference's ratio for the same case; then per mutant whether the grader
caught it (a failed test whose message has the mutant's `expect` phrase, what test_course_mutants asserts), and
any failure that is not a perf bar (a mutant meant to be correct that is not). JSON of every case and run goes to
$OUT/perf-mutants.json when OUT is set, rewritten after every run.

Phases: plant every tree; build them all, --jobs at a time (`python -m harness.build`, what `./course build`
runs: the grading process then finds its build up to date); then time one process at a time, nothing else
running. A tree already planted with the same text is left alone, so its build is reused on the next run:
`--build-only` in one call and the timing in the next keeps each call short. Timing runs that would start after
--budget seconds (default 560, under the device's 600 s per command) are skipped and listed.
Without a GPU it plants (which checks that each `old` occurs exactly once), lists the mutants and stops with
exit status 2 ("no GPU"); --build-only builds there too (an sm_90a compile check).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
from coursekit import trees  # noqa: E402
from harness import HAS_GPU, mutants  # noqa: E402

STARTED = time.monotonic()
REPORTS = trees.BUILD / "mutants"
PROCESS_TIMEOUT_S = 300  # one pytest process (build excluded): lab 04's reference, the longest, takes ~20 s


def elapsed() -> float:
    return time.monotonic() - STARTED


def perf_mutants_of(lab: trees.Lab) -> list[mutants.Mutant]:
    module = importlib.import_module(lab.test_file.stem)  # as tests/test_course_mutants.py finds them
    return [m for m in getattr(module, "MUTANTS", []) if m.perf]


def build(lab: trees.Lab, impl: str) -> dict:
    """`./course build LAB --impl IMPL` in its own process: the build the grading process will reuse."""
    command = [sys.executable, "-W", "ignore::RuntimeWarning:runpy", "-m", "harness.build", lab.number,
               "--impl", impl]
    path = trees.pythonpath(os.environ.get("PYTHONPATH"))
    started = time.monotonic()
    try:
        run = subprocess.run(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=path), capture_output=True,
                             text=True, timeout=900)
        ok, log = run.returncode == 0, run.stdout + run.stderr
    except subprocess.TimeoutExpired:
        ok, log = False, "the build ran past 900 s"
    return {"ok": ok, "seconds": round(time.monotonic() - started, 1), "log": log[-3000:]}


def time_perf(lab: trees.Lab, impl: str, report: Path, k_expression: str | None) -> dict:
    """The lab's perf tests (those -k selects) in a pytest process, as mutants.grade runs them."""
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    command = mutants.pytest_command(lab, report, k=k_expression, perf=True)
    env = dict(os.environ, **{trees.IMPL_ENV: impl})
    started = time.monotonic()
    try:
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
        output = run.stdout
    except subprocess.TimeoutExpired as error:
        output = f"timed out after {PROCESS_TIMEOUT_S} s\n{error.stdout or ''}"
    seconds = round(time.monotonic() - started, 1)
    if not report.exists():
        return {"error": f"the pytest process wrote no report:\n{output[-2000:]}", "seconds": seconds}
    data = json.loads(report.read_text())
    return {"seconds": seconds, "perf": data["perf"], "tests": data["tests"], "seed": data["seed"],
            "copy_bandwidth_gbps": data.get("copy_bandwidth_gbps")}


def first_line(message: str) -> str:
    return message.strip().splitlines()[0][:160] if message.strip() else ""


class Results:
    def __init__(self):
        self.runs: list[dict] = []
        self.builds: list[dict] = []
        self.skipped: list[str] = []

    def rows(self) -> list[dict]:
        reference = {(r["lab"], c["name"]): c["ratio"] for r in self.runs if r["variant"] == "reference"
                     for c in r.get("perf", [])}
        return [{"lab": r["lab"], "variant": r["variant"], "case": c["name"], "ratio": round(c["ratio"], 3),
                 "student_bar": c["student_bar"], "target": c["target"],
                 "at_student_bar": "PASS" if c["ratio"] >= c["student_bar"] else "FAIL",
                 "reference_ratio": reference.get((r["lab"], c["name"])), "ours_ms": round(c["ours_ms"], 4),
                 "baseline_ms": round(c["baseline_ms"], 4), "pct_of_copy": c.get("pct_of_copy"), "gpu": c.get("gpu")}
                for r in self.runs for c in r.get("perf", [])]

    def save(self) -> None:
        out = os.environ.get("OUT")
        if not out:
            return
        import torch

        data = {"gpu": torch.cuda.get_device_name() if HAS_GPU else None, "torch": torch.__version__,
                "elapsed_s": round(elapsed(), 1), "rows": self.rows(), "runs": self.runs, "builds": self.builds,
                "skipped": self.skipped}
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "perf-mutants.json").write_text(json.dumps(data, indent=1) + "\n")


def summarize_run(run: dict, mutant: mutants.Mutant | None) -> None:
    """Fill in what the grader made of the run: caught (for a mutant), and failures that are not perf bars."""
    tests = run.get("tests", [])
    failed = [t for t in tests if t["outcome"] == "failed"]
    run["failed"] = [{"name": t["name"], "message": first_line(t["message"])} for t in failed]
    run["skipped_tests"] = [{"name": t["name"], "message": first_line(t["message"])} for t in tests
                            if t["outcome"] == "skipped"]
    # A perf bar's message says "below the student bar" (or "reference target"); anything else is a wrong output.
    run["not_perf_failures"] = [f for f, t in zip(run["failed"], failed) if "below the " not in t["message"]]
    if mutant is not None:
        run["caught"] = any(mutant.expect.lower() in t["message"].lower() for t in failed)


def print_run(run: dict) -> None:
    head = f"[{elapsed():5.0f} s] {run['lab']} {run['variant']}"
    if "error" in run:
        print(f"{head}: {run['error']}", flush=True)
        return
    print(f"{head} ({run['seconds']:.0f} s):", flush=True)
    for case in run.get("perf", []):
        verdict = "PASS" if case["ratio"] >= case["student_bar"] else "FAIL"
        print(f"    {case['name']:<70} {case['ratio']:6.3f}x  student bar {case['student_bar']:.2f}: {verdict}",
              flush=True)
    for failure in run.get("not_perf_failures", []):
        print(f"    NOT A PERF FAILURE: {failure['name']}: {failure['message']}", flush=True)
    for skipped in run.get("skipped_tests", []):
        print(f"    skipped {skipped['name']}: {skipped['message']}", flush=True)
    if not run.get("perf") and not run.get("skipped_tests"):
        print("    no perf case ran", flush=True)
    if "caught" in run and run.get("perf"):
        print(f"    grader: {'caught' if run['caught'] else 'MISSED'}", flush=True)


def print_table(results: Results) -> None:
    rows = results.rows()
    if not rows:
        return
    print(f"\n{'lab':<20} {'variant':<26} {'perf case':<70} {'ratio':>7} {'bar':>5} {'at bar':>6} {'ref':>7} "
          f"{'target':>6}")
    for row in rows:
        ref = f"{row['reference_ratio']:.3f}" if row["reference_ratio"] is not None else "-"
        print(f"{row['lab']:<20} {row['variant']:<26} {row['case']:<70} {row['ratio']:7.3f} "
              f"{row['student_bar']:5.2f} {row['at_student_bar']:>6} {ref:>7} {row['target']:6.2f}")
    mutant_runs = [r for r in results.runs if r["variant"] != "reference"]
    if mutant_runs:
        print("\nper mutant: caught = a failed test says its `expect` phrase (what test_course_mutants asserts)")
        for run in mutant_runs:
            if "error" in run:
                state = "error: " + first_line(run["error"])
            elif not run.get("perf"):
                state = "no perf case ran"
            else:
                state = "caught" if run.get("caught") else "MISSED (passes the student bar)"
            wrong = "; NOT A PERF FAILURE in " + ", ".join(f["name"] for f in run["not_perf_failures"]) \
                if run.get("not_perf_failures") else ""
            print(f"    {run['lab']:<20} {run['variant']:<26} {state}{wrong}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", help="lab numbers (default: every lab with a perf mutant)")
    parser.add_argument("--mutant", action="append", default=[], help="only this mutant (repeatable)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference solutions' perf run")
    parser.add_argument("--build-only", action="store_true", help="plant and build, time nothing")
    parser.add_argument("--jobs", type=int, default=max(1, min(6, (os.cpu_count() or 2) // 2)),
                        help="builds at once (default: half the cores, at most 6)")
    parser.add_argument("--budget", type=float, default=560.0,
                        help="start no timing run after this many seconds (default 560)")
    args = parser.parse_args(argv)

    try:
        labs = [trees.find_lab(key) for key in args.labs] if args.labs else trees.all_labs()
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    plan: list[tuple[trees.Lab, mutants.Mutant | None, Path | None]] = []  # (lab, mutant or None = reference, root)
    problems: list[str] = []
    for lab in labs:
        if not lab.test_file.exists():
            continue
        chosen = [m for m in perf_mutants_of(lab) if not args.mutant or m.name in args.mutant]
        if not chosen and (args.mutant or not args.labs):
            continue  # a lab with no perf mutant (or none asked for) is left out unless named
        if not args.no_reference:
            plan.append((lab, None, None))
        for mutant in chosen:
            try:
                plan.append((lab, mutant, mutants.make_tree(lab, mutant)))
            except AssertionError as error:  # mutants.plant: `old` does not occur exactly once
                problems.append(f"{lab.name} {mutant.name}: {error}")
    if problems:
        print("could not plant:\n    " + "\n    ".join(problems), file=sys.stderr)
        return 2
    if not plan:
        print("no perf mutant matches", file=sys.stderr)
        return 2
    print(f"[{elapsed():5.0f} s] planted {sum(m is not None for _, m, _ in plan)} perf mutants:")
    for lab, mutant, root in plan:
        if mutant is not None:
            print(f"    {lab.name:<20} {mutant.name:<26} {mutant.file:<22} -k {mutant.tests!r}  ({root})")
    if not HAS_GPU and not args.build_only:
        print("no GPU: nothing timed (the trees are planted; --build-only compiles them here)")
        return 2

    results = Results()
    targets = [(lab, "solutions", "reference") if mutant is None else (lab, str(root), mutant.name)
               for lab, mutant, root in plan]
    # Longest builds first (lab 05's wgmma file, lab 04's eight kernels) so the pool ends together.
    order = sorted(targets, key=lambda t: t[0].number, reverse=True)
    print(f"[{elapsed():5.0f} s] building {len(order)} trees, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        built = list(pool.map(lambda t: build(t[0], t[1]), order))
    failed_builds = set()
    for (lab, impl, variant), outcome in zip(order, built):
        results.builds.append({"lab": lab.name, "variant": variant, **outcome})
        print(f"    {lab.name:<20} {variant:<26} {'built' if outcome['ok'] else 'DID NOT BUILD'} "
              f"in {outcome['seconds']:.0f} s", flush=True)
        if not outcome["ok"]:
            failed_builds.add((lab.name, variant))
            print("        " + outcome["log"][-1500:].replace("\n", "\n        "), flush=True)
    results.save()
    if args.build_only:
        print(f"[{elapsed():5.0f} s] built; nothing timed (--build-only)")
        return 1 if failed_builds else 0

    for lab, mutant, root in plan:
        variant = "reference" if mutant is None else mutant.name
        if (lab.name, variant) in failed_builds:
            results.runs.append({"lab": lab.name, "variant": variant, "error": "did not build"})
            continue
        if elapsed() > args.budget:
            results.skipped.append(f"{lab.name} {variant}")
            continue
        if mutant is None:
            run = time_perf(lab, "solutions", REPORTS / lab.name / "reference-perf.json", None)
        else:  # the report where mutants.grade writes it
            run = time_perf(lab, str(root), root / "result.json", mutant.tests)
        run = {"lab": lab.name, "variant": variant, **({"tests_k": mutant.tests, "file": mutant.file,
                                                        "expect": mutant.expect} if mutant else {}), **run}
        if "error" not in run:
            summarize_run(run, mutant)
        results.runs.append(run)
        print_run(run)
        results.save()
    print_table(results)
    if results.skipped:
        print(f"\nskipped past the {args.budget:.0f} s budget: {', '.join(results.skipped)}")
    print(f"\n[{elapsed():5.0f} s] done" + (f"; JSON in {os.environ['OUT']}/perf-mutants.json"
                                           if os.environ.get("OUT") else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""./course: serve the site, grade labs, build, benchmark, regenerate labs, diagnose.

Runs under any python3 >= 3.9 with only the standard library; the commands that
need torch or mkdocs run them in the python that has them (tools/course/env.py).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import env  # noqa: E402
import labgen  # noqa: E402
import report  # noqa: E402
import runner  # noqa: E402


trees = env.load_trees()
ROOT = trees.ROOT
DEFAULT_DEADLINE_S = 600  # per lab: a hung kernel is killed after this and reported as such


def _labs_for(keys: list[str] | None) -> list:
    return [trees.find_lab(k) for k in keys] if keys else trees.all_labs()


# ---------------------------------------------------------------- running pytest per lab
def run_lab_tests(python: str, files: list[Path], impl: str, label: str, *, verbose: bool, lab_number: str | None = None,
                  markers: str | None = None, deadline_s: int = DEFAULT_DEADLINE_S, seed: int | None = None) -> dict:
    return runner.run_pytest(python, ROOT, trees.BUILD / "logs", files, impl=impl, impl_env=trees.IMPL_ENV, label=label,
                             lab_number=lab_number, verbose=verbose, deadline_s=deadline_s, seed=seed,
                             pytest_args=["-m", markers] if markers else None)


def _grade(args, labs, impl: str, with_tooling: bool) -> int:
    python = env.python_for("test")
    results = []
    if with_tooling:
        tooling = sorted(trees.TESTS.glob("test_course_*.py"))
        if tooling:
            results.append(run_lab_tests(python, tooling, "solutions", "course-tooling", verbose=args.verbose,
                                         seed=args.seed))
    for lab in labs:
        if not lab.test_file.exists():
            print(f"[course] {lab.name}: no grader yet ({lab.test_file.relative_to(ROOT)} is missing)")
            continue
        results.append(run_lab_tests(python, [lab.test_file], impl, lab.name, verbose=args.verbose,
                                     lab_number=lab.number, deadline_s=args.deadline, seed=args.seed))
        if getattr(args, "sanitize", False):
            rows = runner.sanitize(python, ROOT, trees.BUILD / "logs", lab.test_file, impl=impl,
                                   impl_env=trees.IMPL_ENV, lab_number=lab.number)
            results[-1]["sanitizer"] = rows
            dirty = [r["tool"] for r in rows if not runner.is_clean(r)]
            if dirty:
                results[-1]["error"] = (f"compute-sanitizer found problems with {', '.join(dirty)}: "
                                        f"run ./course sanitize {lab.number} --impl {impl} for the findings")
    totals = report.print_summary(results, verbose=args.verbose)
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps({"impl": impl, "results": results}, indent=1) + "\n")
        print(f"[course] wrote {args.json}")
    return 0 if totals["failed"] == 0 and totals["errors"] == 0 else 1


def cmd_test(args) -> int:
    return _grade(args, _labs_for(args.labs), args.impl, with_tooling=not args.labs)


def cmd_grade(args) -> int:
    if args.all:
        return _grade_submissions(args)
    if not args.labs:
        print("grade: name a lab (./course grade 00), several, or --all with --impl DIR_OF_SUBMISSIONS")
        return 2
    trees.resolve_tree(args.impl)  # fail early on a wrong path
    return _grade(args, _labs_for(args.labs), args.impl, with_tooling=False)


def _grade_submissions(args) -> int:
    folder = Path(args.impl).resolve()
    submissions = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not submissions:
        print(f"grade --all: {folder} holds no submission folders")
        return 2
    rows, everything = [], {}
    python = env.python_for("test")
    for submission in submissions:
        labs = [lab for lab in _labs_for(args.labs) if (submission / lab.name).is_dir()]
        results = [run_lab_tests(python, [lab.test_file], str(submission), f"{submission.name}-{lab.name}",
                                 verbose=args.verbose, lab_number=lab.number, deadline_s=args.deadline, seed=args.seed)
                   for lab in labs if lab.test_file.exists()]
        everything[submission.name] = results
        for result in results:
            rows.append(report.csv_row(submission.name, result))
    out = Path(args.json or (trees.BUILD / "grades.json"))
    out.write_text(json.dumps(everything, indent=1) + "\n")
    report.write_csv(out.with_suffix(".csv"), rows)
    report.print_rows(rows)
    print(f"[course] wrote {out} and {out.with_suffix('.csv')}")
    return 0


def cmd_build(args) -> int:
    python = env.python_for("test")
    lab = trees.find_lab(args.lab)
    tree = trees.resolve_tree(args.impl)
    if args.clean:
        shutil.rmtree(lab.build_dir(tree), ignore_errors=True)
    flags = ["-Xptxas=-v"] if args.verbose else []
    code = (
        "import sys, time; sys.path.insert(0, 'tests');"
        "from harness import build, trees;"
        f"lab = trees.find_lab({lab.number!r}); tree = trees.resolve_tree({args.impl!r});"
        "t = time.perf_counter();"
        f"build.build(lab, tree, verbose={bool(args.verbose)}, extra_cuda_cflags={flags!r});"
        "print(f'[course] built {lab.name} from {tree.path} in {time.perf_counter() - t:.1f} s "
        "(arch list {build.ensure_arch_list()}, build dir {lab.build_dir(tree)})')"
    )
    return subprocess.run([python, "-c", code], cwd=ROOT).returncode


def cmd_bench(args) -> int:
    python = env.python_for("test")
    lab = trees.find_lab(args.lab)
    result = run_lab_tests(python, [lab.test_file], args.impl, f"bench-{lab.name}", verbose=args.verbose,
                           lab_number=lab.number, markers="perf", deadline_s=args.deadline)
    if result.get("error"):
        print(result["error"])
        return 1
    cases = result.get("perf", [])
    if not cases:
        report.print_summary([result], verbose=True)
        print("[course] no perf case ran (is there a CUDA GPU?)")
        return 1
    report.print_bench(cases)
    if args.json:
        target = Path(args.json) if args.json != "-" else lab.bench_file
        target.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "lab": lab.name,
            "gpu": cases[0]["gpu"],
            "torch": result.get("torch"),
            "cuda": result.get("cuda"),
            "date": _dt.date.today().isoformat(),
            "impl": args.impl,
            "command": f"./course bench {lab.number} --impl {args.impl} --json",
            "copy_bandwidth_gbps": result.get("copy_bandwidth_gbps"),
            "cases": cases,
        }
        target.write_text(json.dumps(data, indent=1) + "\n")
        print(f"[course] wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
    failed = [t for t in result["tests"] if t["outcome"] == "failed"]
    return 1 if failed else 0


def cmd_sanitize(args) -> int:
    python = env.python_for("test")
    lab = trees.find_lab(args.lab)
    trees.resolve_tree(args.impl)
    tools = tuple(args.tool) if args.tool else runner.SANITIZER_TOOLS
    rows = runner.sanitize(python, ROOT, trees.BUILD / "logs", lab.test_file, impl=args.impl,
                           impl_env=trees.IMPL_ENV, lab_number=lab.number, tools=tools)
    report.print_sanitizer(lab.name, args.impl, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"lab": lab.name, "impl": args.impl, "tools": rows}, indent=1) + "\n")
    return 0 if all(runner.is_clean(r) for r in rows) else 1


def cmd_labs(args) -> int:
    result = labgen.plan(trees.SOLUTIONS, trees.LABS, ROOT)
    if args.check:
        problems = [p for p, _ in result.writes] + result.extra
        for path in problems:
            print(f"stale: {path.relative_to(ROOT)}")
        if problems:
            print("labs/ is out of date with solutions/: run ./course labs (and commit)")
            return 1
        print(f"labs/ is up to date ({len(result.unchanged)} files)")
        return 0
    skipped = 0
    for target, text in result.writes:
        if target in result.student_edited and not args.force:
            print(f"kept (edited by hand; --force overwrites): {target.relative_to(ROOT)}")
            skipped += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")
    for path in result.extra:
        print(f"not generated from any solution file (left alone): {path.relative_to(ROOT)}")
    print(f"[course] labs: {len(result.writes) - skipped} written, {len(result.unchanged)} unchanged, {skipped} kept")
    return 0


def _mkdocs(args_list: list[str]) -> int:
    python = env.python_for("docs")
    return subprocess.run([python, "-m", "mkdocs", *args_list, "-f", str(ROOT / "mkdocs.yml")], cwd=ROOT).returncode


def cmd_serve(args) -> int:
    print(f"[course] serving the course at http://{args.addr}/ (Ctrl-C stops)", flush=True)
    return _mkdocs(["serve", "-a", args.addr])


def cmd_site(args) -> int:
    return _mkdocs(["build", "--strict", "-d", str(trees.BUILD / "site")])


def cmd_setup(args) -> int:
    for group in args.groups or ["docs", "test"]:
        if group not in env.GROUP_MODULES or group == "notebooks":
            print(f"setup: unknown group {group!r}; the groups are docs and test")
            return 2
        print(f"[course] {group}: {env.python_for(group)}")
    return 0


def cmd_doctor(args) -> int:
    import doctor

    return doctor.main(ROOT, trees, env, remove_locks=args.remove_locks)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="./course", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_text, fn):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(fn=fn)
        return p

    impl_help = "tree to grade: labs (your skeletons), solutions (references) or a path laid out like labs/"
    p = add("serve", "serve the course site at http://127.0.0.1:8000 (installs the docs dependencies on first use)", cmd_serve)
    p.add_argument("--addr", default="127.0.0.1:8000")
    add("site", "build the site into build/site with mkdocs --strict", cmd_site)
    p = add("test", "run the whole suite (grader self-tests, then every lab) against the reference solutions", cmd_test)
    p.add_argument("labs", nargs="*", help="only these labs (e.g. 00 01)")
    p.add_argument("--impl", default="solutions", help=impl_help)
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest's full output and every passing case")
    p.add_argument("--json", help="also write the results as JSON to this file")
    p.add_argument("--deadline", type=int, default=DEFAULT_DEADLINE_S, help="seconds before a lab's run is killed as hung")
    p.add_argument("--seed", type=int, help="random seed for the inputs (printed on every run; pass it to reproduce one)")
    p = add("grade", "grade labs: correctness, error handling and speed, with a per-case report", cmd_grade)
    p.add_argument("labs", nargs="*", help="lab numbers (e.g. 00)")
    p.add_argument("--impl", default="labs", help=impl_help + " (default: labs)")
    p.add_argument("--all", action="store_true", help="--impl is a folder of submissions: grade each one")
    p.add_argument("--json", help="write per-lab results (or, with --all, per student x lab) as JSON here")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--deadline", type=int, default=DEFAULT_DEADLINE_S, help="seconds before a lab's run is killed as hung")
    p.add_argument("--seed", type=int, help="random seed for the inputs (printed on every run; pass it to reproduce one)")
    p.add_argument("--sanitize", action="store_true", help="also run compute-sanitizer's four tools; findings fail the lab")
    p = add("sanitize", "run a lab's correctness cases under compute-sanitizer memcheck, racecheck, synccheck, initcheck", cmd_sanitize)
    p.add_argument("lab")
    p.add_argument("--impl", default="labs", help=impl_help + " (default: labs)")
    p.add_argument("--tool", action="append", choices=runner.SANITIZER_TOOLS, help="only this tool (repeatable)")
    p.add_argument("--json", help="write the findings as JSON here")
    p = add("build", "compile one lab (JIT, as the grader does) and report the time", cmd_build)
    p.add_argument("lab")
    p.add_argument("--impl", default="labs", help=impl_help + " (default: labs)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the compiler commands and ptxas's register/smem report")
    p.add_argument("--clean", action="store_true", help="delete the build dir first (a cold build)")
    p = add("bench", "time a lab's kernels against PyTorch on this GPU; print a table", cmd_bench)
    p.add_argument("lab")
    p.add_argument("--impl", default="solutions", help=impl_help + " (default: solutions)")
    p.add_argument("--json", nargs="?", const="-", help="write results as JSON (default path: site/data/bench/NN-slug.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--deadline", type=int, default=DEFAULT_DEADLINE_S)
    p = add("labs", "regenerate labs/ from solutions/ (files a student edited are kept unless --force)", cmd_labs)
    p.add_argument("--check", action="store_true", help="fail if labs/ is stale; write nothing")
    p.add_argument("--force", action="store_true", help="overwrite lab files even where they were edited")
    p = add("setup", "install what the other commands need (done by them on first use anyway)", cmd_setup)
    p.add_argument("groups", nargs="*", help="docs, test (default: both)")
    p = add("doctor", "check the toolchain (nvcc, CUDA vs torch, ninja, compiler, GPU, disk, stale build locks)", cmd_doctor)
    p.add_argument("--remove-locks", action="store_true", help="delete stale build locks left by killed compiles")
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (KeyError, FileNotFoundError) as error:
        print(f"./course {args.command}: {error.args[0] if error.args else error}")
        return 2
    except subprocess.CalledProcessError as error:
        print(f"./course {args.command}: {' '.join(map(str, error.cmd))} failed with exit code {error.returncode}")
        return error.returncode or 1


if __name__ == "__main__":
    sys.exit(main())

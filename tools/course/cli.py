"""./course: serve the site, grade labs, build, benchmark, regenerate labs, diagnose.

Runs under any python3 >= 3.9 with only the standard library; the commands that
need torch or mkdocs run them in the python that has them (coursekit/env.py). The ./course launcher puts the
repository root on PYTHONPATH (coursekit/__init__.py), for this process and every one it starts.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import labgen
import report
import runner
import sanitizer
import sweep_cmd

from coursekit import env, trees

HERE = Path(__file__).resolve().parent
ROOT = trees.ROOT
DEFAULT_DEADLINE_S = 600  # per lab: a hung kernel is killed after this and reported as such
# The course's own tests (test_course_*.py) build a mutant of every lab, and each of lab 09's compiles
# lessons 06-08's kernels again (2-3 min each on a 2-core machine; the suite took 600+ s there with
# three of them): no student kernel runs in it, so its deadline is a hang guard, not a grading limit.
TOOLING_DEADLINE_S = 1800
# Where Gradescope looks for the results of a run (its autograder specification).
GRADESCOPE_RESULTS = Path("/autograder/results")


def _labs_for(keys: list[str] | None) -> list:
    return [trees.find_lab(k) for k in keys] if keys else trees.all_labs()


def _impl(arg: str) -> str:
    """The --impl the grading process gets and every message prints: `labs` or `solutions` for
    the built-in trees, else the submission's absolute path (the process runs from the repository
    root, where a path relative to the caller's folder would name another tree)."""
    tree = trees.resolve_tree(arg)
    return tree.tag if tree.tag in ("labs", "solutions") else str(tree.path)


# ---------------------------------------------------------------- running pytest per lab
def run_lab_tests(python: str, files: list[Path], impl: str, label: str, *, verbose: bool, lab=None,
                  markers: str | None = None, keywords: str | None = None, deadline_s: int = DEFAULT_DEADLINE_S,
                  seed: int | None = None, extra_env: dict | None = None,
                  test_deadline_s: float | None = None) -> dict:
    args = [*(["-m", markers] if markers else []), *(["-k", keywords] if keywords else [])]
    result = runner.run_pytest(python, files, impl=impl, label=label, lab_number=lab.number if lab else None,
                               verbose=verbose, deadline_s=deadline_s, seed=seed, pytest_args=args or None,
                               extra_env=extra_env, test_deadline_s=test_deadline_s)
    if lab is not None:
        result["lab"] = lab.name
    return result


# The notebook test runs every cell of the lab's notebook (22 s of lab 08's 50 s of tests, 27 s of lab 09's on an
# H100). It is not timed, so on a GPU `grade` runs it in a process of its own beside the graded run, which leaves it
# out and takes its timed cases last, once the side work has ended (trees.SIDE_WORK_ENV names the file held until
# then). Run after the graded run instead, beside the quick sanitizer pass, ./course grade 09 took 101.6 s (tests
# 68.2 s, then 33 s for the two; H100). The quick sanitizer pass is side work too: it runs no timed case, and after
# the graded run it took 12-13 s of lab 09's 52 s (H100, 2026-11-26); it counts only where the graded run built
# the lab and neither died nor hung (sanitizer.take_quick_pass). Without a GPU the notebook test skips and there is
# no sanitizer: one run takes every test.
NOTEBOOK_TEST = "test_notebook_runs"


def run_label(lab, impl: str) -> str:
    """The name of a single run's logs and side-work file (build/logs/LABEL.*): the lab's, and for any tree but
    your labs/ the tree's tag before it, so that two trees graded at once write files of their own."""
    tag = trees.resolve_tree(impl).tag
    return lab.name if tag == "labs" else f"{tag}-{lab.name}"


def grade_lab(args, python: str, lab, impl: str) -> dict:
    """One lab's run, with its notebook's run and its quick sanitizer pass beside it (before its timed cases)."""
    label = run_label(lab, impl)
    prefix = label.removesuffix(lab.name)  # the sanitizer's logs: PREFIXsanitize-NN-TOOL
    if not (runner.gpu_visible() and NOTEBOOK_TEST in lab.test_file.read_text(errors="replace")):
        result = run_lab_tests(python, [lab.test_file], impl, label, verbose=args.verbose, lab=lab,
                               deadline_s=args.deadline, seed=args.seed,
                               test_deadline_s=getattr(args, "test_deadline", None))
        sanitizer.run_as_asked(args, python, result, lab, impl, label_prefix=prefix)
        return result
    seed = args.seed  # resolved once, in main()
    busy = trees.LOGS / f"{label}.side-work"
    busy.parent.mkdir(parents=True, exist_ok=True)
    busy.write_text("the notebook's run (and the quick sanitizer pass) is under way; the timed cases wait until this "
                    "file is gone\n")
    quick_pass_beside = sanitizer.quick_pass_wanted(args)
    side_jobs, side_lock = [2 if quick_pass_beside else 1], threading.Lock()

    def side_job_ended() -> None:
        with side_lock:
            side_jobs[0] -= 1
            if not side_jobs[0]:
                busy.unlink(missing_ok=True)

    def notebook_run() -> dict:
        try:
            return run_lab_tests(python, [lab.test_file], impl, f"{label}-notebook", verbose=False, lab=lab,
                                 keywords=NOTEBOOK_TEST, deadline_s=args.deadline, seed=seed)
        finally:
            side_job_ended()

    def quick_pass() -> dict:
        rows: dict = {}
        try:  # the graded run's deadline: a kernel that hangs there hangs here too
            sanitizer.run_into(python, rows, lab, impl, quick=True, deadline_s=args.deadline, label_prefix=prefix)
        finally:
            side_job_ended()
        return rows

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        notebook = pool.submit(notebook_run)
        beside = pool.submit(quick_pass) if quick_pass_beside else None
        try:
            result = run_lab_tests(python, [lab.test_file], impl, label, verbose=args.verbose, lab=lab,
                                   keywords=f"not {NOTEBOOK_TEST}", deadline_s=args.deadline, seed=seed,
                                   extra_env={trees.SIDE_WORK_ENV: str(busy)},
                                   test_deadline_s=getattr(args, "test_deadline", None))
        finally:
            notebook_result = notebook.result()
            quick_pass_result = beside.result() if beside else None
    if not result.get("error"):  # a run that died or hung reports that alone, as it did with the notebook inside
        add_notebook_run(result, notebook_result)
    if quick_pass_result is not None:
        sanitizer.take_quick_pass(result, quick_pass_result)
    else:
        sanitizer.run_as_asked(args, python, result, lab, impl, label_prefix=prefix)
    return result


def add_notebook_run(result: dict, notebook: dict) -> None:
    """The notebook run's test into the lab's result, as one run would have reported it; a notebook process that
    died or hung is the notebook test's failure (with the lab's every task, as its @tasks(ALL)), not the lab's."""
    tests = notebook.get("tests") or []
    if notebook.get("error") or not tests:
        tasks = sorted({task for test in result.get("tests", []) if test.get("kind") == "student"
                        for task in test.get("tasks", [])})
        tests = [{"name": NOTEBOOK_TEST, "outcome": "failed", "when": "call", "seconds": notebook.get("seconds", 0),
                  "message": notebook.get("error") or "the notebook's run reported no test", "tasks": tasks,
                  "kind": "student", "todos": []}]
    result["tests"] = [*result.get("tests", []), *tests]
    result["notebook_log"] = notebook.get("log")
    if any(test["outcome"] == "failed" for test in tests):
        result["returncode"] = 1


def _grade(args, labs, impl: str, with_tooling: bool) -> int:
    python = env.python_for("test")
    results = []
    if with_tooling:
        tooling = sorted(trees.TESTS.glob("test_course_*.py"))
        if tooling:
            results.append(run_lab_tests(python, tooling, trees.DEFAULT_IMPL, "course-tooling", verbose=args.verbose,
                                         deadline_s=max(TOOLING_DEADLINE_S, args.deadline), seed=args.seed))
    for lab in labs:
        if not lab.test_file.exists():
            print(f"[course] {lab.name}: no grader yet ({lab.test_file.relative_to(ROOT)} is missing)")
            continue
        results.append(grade_lab(args, python, lab, impl))
    totals = report.print_summary(results, verbose=args.verbose)
    if getattr(args, "json", None):
        report.write_json(Path(args.json), {"impl": impl, "results": results})
        print(f"[course] wrote {args.json}")
    if getattr(args, "format", "text") == "gradescope":
        out = _gradescope_out(args)
        report.write_json(out, report.gradescope(results, getattr(args, "leaderboard", None)))
        print(f"[course] wrote Gradescope's results.json to {out}")
    return 0 if report.all_passed(totals) else 1


def _gradescope_out(args) -> Path:
    """A single run's results.json: --out, else where Gradescope reads it (when that folder
    exists, as inside its autograder), else build/results.json."""
    if args.out:
        return Path(args.out)
    return GRADESCOPE_RESULTS / "results.json" if GRADESCOPE_RESULTS.is_dir() else trees.BUILD / "results.json"


def cmd_test(args) -> int:
    return _grade(args, _labs_for(args.labs), _impl(args.impl), with_tooling=not args.labs)


def cmd_grade(args) -> int:
    if args.out and args.format != "gradescope":
        print("grade: --out is where --format gradescope writes results.json; add --format gradescope, "
              "or use --json for the course's own JSON")
        return 2
    if args.leaderboard and args.format != "gradescope":
        print("grade: --leaderboard adds entries to Gradescope's results.json; add --format gradescope")
        return 2
    if args.all:
        return _grade_submissions(args)
    if args.jobs or args.shard:
        print("grade: --jobs and --shard grade a class: add --all (and --impl DIR_OF_SUBMISSIONS)")
        return 2
    if not args.labs:
        print("grade: name a lab (./course grade 00), several, or --all with --impl DIR_OF_SUBMISSIONS")
        return 2
    return _grade(args, _labs_for(args.labs), _impl(args.impl), with_tooling=False)


def _grade_submissions(args) -> int:
    folder = Path(args.impl).resolve()
    submissions = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not submissions:
        print(f"grade --all: {folder} holds no submission folders")
        return 2
    shard_tag = None
    if args.shard:
        index, count = args.shard
        shard_tag = f"{index}/{count}"
        chosen = runner.shard(submissions, index, count, key=lambda path: path.name)
        names = ", ".join(path.name for path in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        print(f"[course] shard {shard_tag}: {len(chosen)} of the {len(submissions)} submissions (sorted by name, "
              f"round-robin: the {index}{_ordinal(index)}, then every {count}{_ordinal(count)}){': ' if chosen else ''}"
              f"{names}", flush=True)
        submissions = chosen
    gradescope = args.format == "gradescope"
    python = env.python_for("test")
    # Every lab the student handed in; with --format gradescope every lab named on the command
    # line, handed in or not (a missing one fails to build and scores 0 on each of its tasks).
    plan = {submission: [lab for lab in _labs_for(args.labs)
                         if lab.test_file.exists() and ((submission / lab.name).is_dir() or (gradescope and args.labs))]
            for submission in submissions}
    runs = sum(len(labs) for labs in plan.values())
    jobs, rule = (args.jobs, "--jobs") if args.jobs else runner.default_jobs()
    workers = min(jobs, runs)
    class_started = time.perf_counter()
    if workers > 1:
        everything = _grade_concurrently(args, python, plan, workers, f"--jobs {jobs}" if args.jobs else
                                         f"--jobs {jobs}, the default: {rule}, at most {runner.MAX_DEFAULT_JOBS}")
    else:
        everything = {}
        for submission, labs in plan.items():
            results = everything[submission.name] = []
            for lab in labs:
                queued = time.perf_counter() - class_started
                results.append(run_lab_tests(python, [lab.test_file], str(submission),
                                             f"{submission.name}-{lab.name}", verbose=args.verbose, lab=lab,
                                             deadline_s=args.deadline, seed=args.seed,
                                             test_deadline_s=args.test_deadline))
                sanitizer.run_as_asked(args, python, results[-1], lab, str(submission),
                                       label_prefix=f"{submission.name}-{lab.name}-")
                results[-1]["phases"] = runner.job_phases(results[-1], queued=queued, perf_wait=0.0)
    wall_s = time.perf_counter() - class_started
    if shard_tag:  # `report merge` checks that the shards it gets are one split, and complete
        for results in everything.values():
            for result in results:
                result["shard"] = shard_tag
    default = f"grades-shard-{args.shard[0]}-of-{args.shard[1]}.json" if args.shard else "grades.json"
    _write_class(Path(args.json or (trees.BUILD / default)), everything,
                 (Path(args.out) if args.out else trees.BUILD / "gradescope") if gradescope else None,
                 args.leaderboard)
    # Where the time went (each result's "phases" in the JSON says it per submission x lab).
    print(f"[course] {runner.breakdown([r for results in everything.values() for r in results], wall_s)}",
          flush=True)
    return 0


def _ordinal(number: int) -> str:
    return "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")


def _grade_concurrently(args, python: str, plan: dict, workers: int, why: str) -> dict[str, list[dict]]:
    """`grade --all --jobs N`: every submission x lab through runner.run_class; results per student, in lab order."""
    jobs = [runner.Job(student=submission.name, lab=lab.name, lab_number=lab.number, test_file=lab.test_file,
                       impl=str(submission), seed=args.seed)
            for submission, labs in plan.items() for lab in labs]
    alone = runner.perf_alone()
    print(f"[course] grading {len(jobs)} submission x lab runs, {workers} at a time ({why}); each build gets "
          f"{os.environ.get('MAX_JOBS') or max(1, runner.usable_cores() // workers)} of ninja's jobs (MAX_JOBS); "
          + ("the perf and large cases after them, one run at a time" if alone else
             "no GPU: the perf and large cases (which skip) in the pool too"), flush=True)
    if args.verbose:
        print("[course] -v: each run's pytest output goes to build/logs/STUDENT-NN-slug.log (and -perf.log); "
              "--jobs 1 shows it as it comes", flush=True)
    labs = {lab.name: lab for labs in plan.values() for lab in labs}

    def sanitize(job: runner.Job, result: dict) -> None:
        sanitizer.run_as_asked(args, python, result, labs[job.lab], job.impl, label_prefix=f"{job.label}-", quiet=True)

    said = threading.Lock()

    def say(line: str) -> None:
        # Called from the pool's threads: print writes the line and its newline separately, and two runs ending
        # together printed "...cases ...[course] 2/2 alice ...: its perf and large cases ..." on one line (CI,
        # 2026-11-27, test_concurrent_runs_show_their_progress).
        with said:
            print(line, flush=True)

    try:  # SIGTERM arrives as KeyboardInterrupt (run_command); run_class stops its processes before it re-raises
        graded = runner.run_class(python, jobs, workers=workers, deadline_s=args.deadline, alone=alone,
                                  after=sanitize, say=say, test_deadline_s=args.test_deadline)
    except KeyboardInterrupt:
        print("\n[course] interrupted: the grading processes it started were stopped; nothing was written", flush=True)
        raise SystemExit(130) from None
    everything: dict[str, list[dict]] = {submission.name: [] for submission in plan}
    for job, result in graded.items():
        result["lab"] = job.lab
        everything[job.student].append(result)
    return everything


def _write_class(out: Path, everything: dict[str, list[dict]], gradescope_dir: Path | None,
                 leaderboard: list[str] | None = None) -> None:
    """A class report: the JSON (student: results), the CSV beside it, the rows on the terminal and, with
    `gradescope_dir`, each student's Gradescope results.json under it."""
    rows = [report.csv_row(student, result) for student, results in everything.items() for result in results]
    report.write_json(out, everything)
    report.write_csv(out.with_suffix(".csv"), rows)
    report.print_rows(rows)
    if gradescope_dir is not None:
        for student, results in everything.items():
            report.write_json(gradescope_dir / student / "results.json", report.gradescope(results, leaderboard))
    print(f"[course] wrote {out} and {out.with_suffix('.csv')} ({len(everything)} student(s), {len(rows)} row(s))")
    if gradescope_dir is not None:
        print(f"[course] wrote Gradescope's results.json of each student to {gradescope_dir}/STUDENT/results.json")


def cmd_report_merge(args) -> int:
    everything: dict[str, list[dict]] = {}
    origin: dict[str, str] = {}
    overlaps, shards, empty_files = [], {}, 0
    for name in args.files:
        try:
            data = json.loads(Path(name).read_text())
        except (OSError, ValueError) as error:
            print(f"report merge: cannot read {name}: {error}")
            return 2
        if not report.is_class_report(data):
            print(f"report merge: {name} is not a class report of ./course grade --all (a JSON object "
                  "STUDENT: [one result per lab])")
            return 2
        empty_files += not any(data.values())
        for student, results in data.items():
            if student in origin:
                overlaps.append(f"{student} (in {origin[student]} and {name})")
                continue
            origin[student] = name
            for result in results:
                tag = result.pop("shard", None)
                if tag:
                    shards.setdefault(tag, set()).add(name)
            everything[student] = results
    if overlaps:
        print(f"report merge: {len(overlaps)} student(s) in more than one file: "
              f"{'; '.join(overlaps[:10])}{'; ...' if len(overlaps) > 10 else ''}.\n"
              "The files must be disjoint shards (./course grade --all --shard I/N, each I once, one N); "
              "was a file given twice, or were two splits mixed?")
        return 2
    problem = report.shard_problem(shards, empty_files)
    if problem:
        print(f"report merge: {problem}" + ("" if args.partial else "\n(--partial merges them anyway)"))
        if not args.partial:
            return 2
    merged = {student: everything[student] for student in sorted(everything)}
    _write_class(Path(args.json), merged,
                 (Path(args.out) if args.out else trees.BUILD / "gradescope") if args.format == "gradescope" else None,
                 args.leaderboard)
    return 0


def cmd_report_summary(args) -> int:
    """tools/course/summary.py over a class report, in a python that has matplotlib if one is at hand (`./course
    setup report` installs it in the course's virtualenv); else in this one, which writes the tables, not the chart."""
    candidates = (sys.executable, str(env.venv_python()))
    python = next((c for c in candidates if Path(c).exists() and env._has_modules(c, env.GROUP_MODULES["report"])),
                  sys.executable)
    command = [python, str(HERE / "summary.py"), args.class_json, *(["-o", args.out] if args.out else [])]
    return subprocess.run(command).returncode


def cmd_build(args) -> int:
    python = env.python_for("test")
    lab = trees.find_lab(args.lab)  # a wrong lab or tree fails here, before torch is imported
    command = [python, "-W", "ignore::RuntimeWarning:runpy", "-m", "harness.build", lab.number,
               "--impl", _impl(args.impl), *(["-v"] if args.verbose else []), *(["--clean"] if args.clean else [])]
    return subprocess.run(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=trees.pythonpath(
        os.environ.get("PYTHONPATH")))).returncode


def cmd_run(args) -> int:
    """A Python script (a probe, a measurement script) in the python the tests run in, with the course's import roots
    on PYTHONPATH (coursekit, harness, the graders: trees.IMPORT_ROOTS), from the caller's folder."""
    python = env.python_for("test")
    environment = dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH")))
    return subprocess.run([python, args.script, *args.args], env=environment).returncode


def cmd_bench(args) -> int:
    """--json FILE writes there, plain --json the site's data file, --json - stdout (everything
    else then goes to stderr, so the JSON can be piped). --sweep: the shape sweep instead (sweep_cmd.py)."""
    if args.ops and not args.sweep:
        print("./course bench: --ops names ops of a shape sweep: add --sweep")
        return 2
    to_stdout = args.json == "-"
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        if args.sweep:
            code, data = sweep_cmd.bench_sweep(args, trees=trees, env=env, runner=runner, report=report,
                                               impl=_impl(args.impl))
        else:
            code, data = _bench(args)
    if to_stdout and data is not None:
        print(json.dumps(data, indent=1))
    return code


def _bench(args) -> tuple[int, dict | None]:
    python = env.python_for("test")
    lab = trees.find_lab(args.lab)
    impl = _impl(args.impl)
    result = run_lab_tests(python, [lab.test_file], impl, f"bench-{lab.name}", verbose=args.verbose,
                           lab=lab, markers="perf", deadline_s=args.deadline,
                           extra_env={"COURSE_BENCH_WRITING": "1"})  # harness/perf.py: the run that renews the bars
    if result.get("error"):
        print(result["error"])
        return 1, None
    cases = result.get("perf", [])
    failed = [t for t in result["tests"] if t["outcome"] == "failed"]
    if not cases:
        if failed:
            report.print_summary([result], verbose=False)
        skipped = [t.get("message", "") for t in result["tests"] if t["outcome"] == "skipped"]
        why = f"every perf test was skipped: {skipped[0]}" if skipped and not failed else "see the failures above"
        print(f"./course bench: no perf case of {lab.name} ran ({why})")
        return 1, None
    report.print_bench(cases)
    data = None
    if args.json:
        data = {
            "lab": lab.name,
            "gpu": cases[0]["gpu"],
            "torch": result.get("torch"),
            "cuda": result.get("cuda"),
            "date": _dt.date.today().isoformat(),
            "impl": impl,
            "command": f"./course bench {lab.number} --impl {impl} --json",
            "copy_bandwidth_gbps": result.get("copy_bandwidth_gbps"),
            "cases": cases,
        }
        if args.json != "-":
            target = lab.bench_file if args.json is True else Path(args.json)
            report.write_json(target, data)
            print(f"[course] wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
    return (1 if failed else 0), data


def cmd_sanitize(args) -> int:
    python = env.python_for("test")
    lab = trees.find_lab(args.lab)
    impl = _impl(args.impl)
    tools = tuple(args.tool) if args.tool else sanitizer.SANITIZER_TOOLS
    if not sanitizer.sanitizer_available():
        print("./course sanitize: needs compute-sanitizer (it ships with the CUDA toolkit, in $CUDA_HOME/bin: put "
              "that on PATH) and a GPU the driver sees (nvidia-smi -L); "
              f"this machine has {'no GPU' if shutil.which('compute-sanitizer') else 'no compute-sanitizer on PATH'}")
        return 2
    rows = sanitizer.sanitize(python, lab.test_file, impl=impl, lab_number=lab.number, tools=tools, select=args.select,
                              shards=args.shards)
    report.print_sanitizer(lab.name, impl, rows)
    if args.json:
        report.write_json(Path(args.json), {"lab": lab.name, "impl": impl, "tools": rows})
    if any(sanitizer.fails_the_lab(r) for r in rows):
        return 1
    return 3 if any(r.get("not_checked") for r in rows) else 0  # 3: a tool could not check (said above)


def cmd_profile(args) -> int:
    import kernel_profile

    python = env.python_for("test")
    lab = trees.find_lab(args.lab)
    impl = _impl(args.impl)
    json_out = args.json
    if json_out is True:  # plain --json: the site's data, beside the benchmark JSON
        json_out = str(trees.PROFILE_DATA / f"{lab.name}{'-sass' if args.sass else ''}.json")
    if args.sass:
        return kernel_profile.sass(python, lab, impl, kernel=args.kernel, json_out=json_out)
    return kernel_profile.profile(python, lab, impl, kernel=args.kernel, select=args.select, baseline=args.baseline,
                                  json_out=json_out, deadline_s=args.deadline)


def cmd_labs(args) -> int:
    result = labgen.plan(trees.SOLUTIONS, trees.LABS, ROOT)
    if args.check:
        problems = [p for p, _ in result.writes] + result.extra
        for path in problems:
            print(f"stale: {path.relative_to(ROOT)}")
        if problems:
            print("labs/ is out of date with solutions/: run ./course labs (and commit)")
            return 1
        leaked = labgen.leaks(trees.SOLUTIONS, trees.LABS)
        for task, where in leaked:
            print(f"answer given away: the solution of {task} appears in labs/{where}, a file the student is given")
        if leaked:
            print("give that file code of its own, or have it call the student's (and say which task it needs)")
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
    for group in args.groups or list(env.GROUP_MODULES):
        if group not in env.GROUP_MODULES:
            print(f"setup: unknown group {group!r}; the groups are {' and '.join(env.GROUP_MODULES)}")
            return 2
        print(f"[course] {group}: {env.python_for(group)}")
    return 0


def cmd_lint(args) -> int:
    """ruff over the Python, clang-format over the C++/CUDA, the size budgets (sizes.py): what CI enforces."""
    python = env.python_for("lint")
    ruff = [python, "-m", "ruff", "check", *(["--fix"] if args.fix else []), str(ROOT)]
    status = subprocess.run(ruff, cwd=ROOT).returncode
    clang_format = subprocess.run(
        [python, "-c", "import clang_format; print(clang_format.get_executable('clang-format'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    sources = [str(p) for p in trees.formatted_cxx_sources()]
    mode = ["-i"] if args.fix else ["--dry-run", "--Werror"]
    formatted = subprocess.run([clang_format, *mode, *sources], cwd=ROOT).returncode
    if formatted and not args.fix:
        print(f"[course] lint: {len(sources)} C++/CUDA files checked against .clang-format; "
              "./course lint --fix rewrites them (then ./course labs)")
    import sizes  # files within 800 lines and functions within 80, or on the allow-list that only shrinks

    oversized = sizes.main([])
    return 1 if status or formatted or oversized else 0


def cmd_doctor(args) -> int:
    import doctor

    return doctor.main(ROOT, trees, env, remove_locks=args.remove_locks)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _shard(text: str) -> tuple[int, int]:
    try:
        return runner.parse_shard(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _interrupt(signum, frame):  # SIGTERM (timeout, scancel, a cancelled CI job) stops ./course as Ctrl-C does
    raise KeyboardInterrupt


def run_command(fn, args) -> int:
    """fn(args), with SIGTERM taken as Ctrl-C. runner.run_pytest starts each pytest in a session of its own (so that a
    deadline kills a run's whole group), which a signal to ./course does not reach: on either, those processes are
    stopped before ./course exits. (A device call's `timeout` once killed ./course sanitize and left its racecheck
    pytest running beside the next step's timings: lab 02's transposes measured 2-3x slow, H100, 2026-11-27.)"""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return fn(args)
    except KeyboardInterrupt:
        stopped = runner.stop_all()
        print(f"\n[course] interrupted: {stopped} process(es) it started were stopped", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_flags(p, impl_default: str | None = None, impl_help: str = "") -> None:
    """The flags of the commands that grade: -v, --deadline, --seed (and --impl, when given its default here)."""
    if impl_default is not None:
        p.add_argument("--impl", default=impl_default, help=impl_help)
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest's full output and every passing case")
    p.add_argument("--deadline", type=int, default=DEFAULT_DEADLINE_S,
                   help="seconds before a lab's run is killed as hung, its builds not counted (a build has its own "
                        f"limit, {runner.BUILD_DEADLINE_S} s; COURSE_BUILD_DEADLINE sets it)")
    p.add_argument("--seed", type=int,
                   help="random seed for the inputs (printed on every run; pass it to reproduce one; default: one "
                        "drawn for the whole command)")


def bench_flags(p, impl_help: str) -> None:
    p.add_argument("lab")
    p.add_argument("--impl", default=trees.DEFAULT_IMPL, help=impl_help)
    p.add_argument("--json", nargs="?", const=True, metavar="FILE",
                   help="write the results as JSON: to FILE, to stdout with -, or with no FILE to the site's data, "
                   "site/data/bench/NN-slug.json (with --sweep: site/data/plots/NN-slug-sweep.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--deadline", type=int, default=DEFAULT_DEADLINE_S,
                   help="seconds before the run is killed (with --sweep: it starts no shape after 0.8 of them)")
    p.add_argument("--sweep", action="store_true",
                   help="instead of the perf cases: each perf-graded op over model shapes (rows a multiple of no "
                   "tile, hidden 2048-14336 and odd, vocabulary rows), ours beside eager PyTorch, torch.compile and "
                   "the peer libraries installed (liger-kernel, quack-kernels); labs with a tests/graderNN/sweep.py")
    p.add_argument("--ops", metavar="OP[,OP]", help="with --sweep: only these ops (e.g. rms_norm_fwd)")


def leaderboard_flag(p) -> None:
    p.add_argument("--leaderboard", nargs="+", metavar="NN", type=lambda text: text.zfill(2)[:2],
                   help="with --format gradescope: add Gradescope leaderboard entries for these labs, each lab's "
                   "speed-up over PyTorch (the geometric mean of its perf ratios; 0 for a lab that fails a "
                   "correctness test; none when graded without a GPU)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="./course", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_text, fn):
        # argparse %-formats a subcommand's help in the top-level --help (a literal "% of peak" crashed it); the
        # description is printed as written.
        p = sub.add_parser(name, help=help_text.replace("%", "%%"), description=help_text)
        p.set_defaults(fn=fn)
        return p

    impl_help = ("the tree to grade: labs (your skeletons), solutions (the references) or the path of a folder laid "
                 "out like labs/ (default: %(default)s)")
    p = add("serve", "serve the course site at http://127.0.0.1:8000 (installs the docs dependencies on first use)",
            cmd_serve)
    p.add_argument("--addr", default="127.0.0.1:8000")
    add("site", "build the site into build/site with mkdocs --strict", cmd_site)
    p = add("test", "run the whole suite (grader self-tests, then every lab) against the reference solutions", cmd_test)
    p.add_argument("labs", nargs="*", help="only these labs (e.g. 00 01)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    run_flags(p, impl_default=trees.DEFAULT_IMPL, impl_help=impl_help)
    p = add("grade", "grade labs: correctness, error handling and speed, with a per-case report", cmd_grade)
    p.add_argument("labs", nargs="*", help="lab numbers (e.g. 00)")
    p.add_argument("--impl", default="labs",
                   help=impl_help + "; with --all, the folder holding one such folder per student")
    p.add_argument("--all", action="store_true", help="--impl is a folder of submissions: grade each one")
    p.add_argument("--json", help="write per-lab results (or, with --all, per student x lab) as JSON here "
                   "(--all: default build/grades.json, and a CSV beside it)")
    p.add_argument("--format", choices=("text", "gradescope"), default="text",
                   help="gradescope: also write Gradescope's results.json, one test per task, scored from POINTS "
                   "(default: %(default)s)")
    leaderboard_flag(p)
    p.add_argument("--out", help="with --format gradescope: the results.json to write (default: "
                   f"{GRADESCOPE_RESULTS}/results.json when that folder exists, else build/results.json); with --all, "
                   "the folder that gets STUDENT/results.json (default: build/gradescope)")
    run_flags(p)
    p.add_argument("--test-deadline", type=float, default=None, metavar="SECONDS",
                   help="also kill a run as hung once one of its tests has run this long, its builds not counted "
                        "(default: off; --deadline alone). A hanging submission then costs its build and this, "
                        "not the whole --deadline: a class's timings wait for it (nothing is timed beside a kernel "
                        "that spins)")
    p.add_argument("--sanitize", action="store_true",
                   help="run compute-sanitizer's four tools over every correctness case; findings fail the lab")
    p.add_argument("--no-sanitize", dest="quick_sanitize", action="store_false",
                   help="skip the quick compute-sanitizer pass (memcheck, racecheck, synccheck on a few small "
                        "cases) that grading on a GPU runs by default; its findings fail the lab")
    jobs, rule = runner.default_jobs()
    p.add_argument("--jobs", type=_positive, metavar="N",
                   help=f"with --all: grade N submission x lab runs at once (builds and correctness cases; each "
                   "build gets cores/N of ninja's jobs); the perf and large cases of each run follow, one run at a "
                   f"time, so timings stay honest. 1 grades one run after another. Default here: {jobs} ({rule}, "
                   f"at most {runner.MAX_DEFAULT_JOBS})")
    p.add_argument("--shard", type=_shard, metavar="I/N",
                   help="with --all: grade only the I-th of N slices of the class (submissions sorted by name, "
                   "round-robin: the I-th, then every N-th); the report goes to build/grades-shard-I-of-N.json "
                   "(and .csv) unless --json says; ./course report merge joins the shards' reports")
    p = add("report", "work on the class reports of grade --all (the JSON it writes): merge shards, summarize",
            None)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    m = actions.add_parser(
        "merge", help="merge the reports of grade --all --shard I/N into one class report",
        description="Merge the JSON reports of grade --all --shard I/N (or any class reports with no student in "
        "common) into one class report, as an unsharded grade --all writes it: the JSON, the CSV beside it and, "
        "with --format gradescope, each student's results.json. A student in two files is an error, and so are "
        "shards of different splits, or a shard missing.")
    m.set_defaults(fn=cmd_report_merge)
    m.add_argument("files", nargs="+", metavar="SHARD.json", help="the reports to merge (e.g. build/grades-shard-*)")
    m.add_argument("-o", "--json", default=str(trees.BUILD / "grades.json"), metavar="CLASS.json",
                   help="the class report to write, and its CSV beside it (default: build/grades.json)")
    m.add_argument("--format", choices=("text", "gradescope"), default="text",
                   help="gradescope: also write each student's Gradescope results.json (default: %(default)s)")
    leaderboard_flag(m)
    m.add_argument("--out", metavar="DIR", help="with --format gradescope: the folder that gets STUDENT/results.json "
                   "(default: build/gradescope)")
    m.add_argument("--partial", action="store_true",
                   help="merge even when a shard is missing (the report then lacks its students)")
    m = actions.add_parser(
        "summary", help="the class at a glance: per task how many pass and the common failures; per student the totals",
        description="A class at a glance from a class report (grade --all, or report merge): per task, how many "
        "students pass it and the most common failures; per student, the points and test totals. Prints the "
        "tables and writes CLASS-summary.md, with a pass-rate chart CLASS-summary.png when matplotlib is installed "
        "(./course setup report).")
    m.set_defaults(fn=cmd_report_summary)
    m.add_argument("class_json", metavar="CLASS.json", help="the class report (e.g. build/grades.json)")
    m.add_argument("-o", "--out", metavar="DIR", help="the folder of CLASS-summary.md and .png (default: the JSON's)")
    p = add("sanitize",
            "run a lab's correctness cases under compute-sanitizer memcheck, racecheck, synccheck, initcheck",
            cmd_sanitize)
    p.add_argument("lab")
    p.add_argument("--impl", default="labs", help=impl_help)
    p.add_argument("--tool", action="append", choices=sanitizer.SANITIZER_TOOLS, help="only this tool (repeatable)")
    p.add_argument("-k", dest="select", metavar="EXPR",
                   help="only the correctness cases pytest -k selects (e.g. -k '113x203 and flash_forward'): a failing "
                   "case under the tools in seconds instead of the whole lab")
    p.add_argument("--shards", type=_positive, default=1, metavar="N",
                   help="run each tool as N processes at once, each over every N-th case (the tools are slow per "
                   "test and leave the GPU idle between kernels; lab 07's racecheck did not end in 545 s as one)")
    p.add_argument("--json", help="write the findings as JSON here")
    p = add("profile", "a lab's kernels under Nsight Compute: one table per kernel (throughput as % of peak, sectors "
            "per request, bank conflicts, occupancy and its limiter, top stalls); --sass: their memory and MMA "
            "instructions", cmd_profile)
    p.add_argument("lab")
    p.add_argument("--impl", default="labs", help=impl_help)
    p.add_argument("--kernel", metavar="REGEX", help="only the kernels whose name matches (e.g. copy_vectorized)")
    p.add_argument("-k", dest="select", metavar="EXPR",
                   help="only the perf tests pytest -k selects (e.g. -k vectorized); the default profiles every "
                   "perf case of the lab, each call once")
    p.add_argument("--baseline", action="store_true", help="profile each case's PyTorch baseline too")
    p.add_argument("--sass", action="store_true",
                   help="instead: each kernel's memory and tensor-core instructions from cuobjdump -sass of the "
                   "built extension, counted per opcode and in program order (no GPU needed)")
    p.add_argument("--json", nargs="?", const=True, metavar="FILE",
                   help="also write the tables as JSON: to FILE, or with no FILE to the site's data, "
                   "site/data/profile/NN-slug.json (NN-slug-sass.json with --sass)")
    p.add_argument("--deadline", type=int, default=3600, help="seconds before the profiled run is killed")
    p = add("build", "compile one lab (JIT, as the grader does) and report the time", cmd_build)
    p.add_argument("lab")
    p.add_argument("--impl", default="labs", help=impl_help)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show the compiler commands and ptxas's register/smem report")
    p.add_argument("--clean", action="store_true", help="delete the build dir first (a cold build)")
    bench_flags(add("bench", "time a lab's kernels against PyTorch on this GPU; print a table", cmd_bench), impl_help)
    p = add("run", "run a Python script (a probe under site/data/evidence/ or tools/gpu/) in the test python, with the "
            "course's modules importable (coursekit, harness, the graders)", cmd_run)
    p.add_argument("script", help="the script's path")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, passed as they are (--help included)")
    p = add("labs", "regenerate labs/ from solutions/ (files a student edited are kept unless --force)", cmd_labs)
    p.add_argument("--check", action="store_true", help="fail if labs/ is stale; write nothing")
    p.add_argument("--force", action="store_true", help="overwrite lab files even where they were edited")
    p = add("setup", "install what the other commands need (done by them on first use anyway)", cmd_setup)
    p.add_argument("groups", nargs="*", help=f"{', '.join(env.GROUP_MODULES)} (default: all)")
    p = add("lint", "check the style: ruff (Python), clang-format (C++/CUDA), size budgets, as CI does", cmd_lint)
    p.add_argument("--fix", action="store_true", help="rewrite the files instead (then run ./course labs)")
    p = add("doctor", "check the toolchain (nvcc, CUDA vs torch, ninja, compiler, GPU, disk, stale build locks)",
            cmd_doctor)
    p.add_argument("--remove-locks", action="store_true", help="delete stale build locks left by killed compiles")
    args = parser.parse_args(argv)
    if getattr(args, "seed", 0) is None:  # the one place a run's seed is drawn: every run of the command shares it
        args.seed = trees.seed()
    try:
        return run_command(args.fn, args)
    except (KeyError, FileNotFoundError) as error:
        print(f"./course {args.command}: {error.args[0] if error.args else error}")
        return 2
    except subprocess.CalledProcessError as error:
        print(f"./course {args.command}: {' '.join(map(str, error.cmd))} failed with exit code {error.returncode}")
        return error.returncode or 1


if __name__ == "__main__":
    sys.exit(main())

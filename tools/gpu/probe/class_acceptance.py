"""Issue 34's class acceptance, on the GPU box: the unmodified solutions of every lab as three students each, graded
as a class; every student must score full points with no failed test.

    ./course run tools/gpu/probe/class_acceptance.py make [STUDENTS]
        build/class-acceptance/s1..sN, copies of solutions/
    ./course run tools/gpu/probe/class_acceptance.py grade [--jobs N] [--shard I/N] [--labs "00 01"]
                                                                      ./course grade --all over them: $OUT/class-*.json
    ./course run tools/gpu/probe/class_acceptance.py check CLASS.json [...]
        each student x lab: points, failures, where the
                                                                      time went; exit 1 unless every one is full

One device call holds 10 minutes: a whole class (33 runs, each lab's cold build, every perf case one at a time) does
not fit one, so grade it in shards (--shard 1/3 ... 3/3, one student each) or a few labs a call (--labs), and check
the shard reports together (their students are disjoint). The sanitizer's quick pass runs (the default of grade on a
GPU): its not-checked and retried rows are listed.

A whole class in one go, across device calls (a machine stays warm between calls made within its idle window):

    ./course run tools/gpu/probe/class_acceptance.py start [STUDENTS] [--modes "14 default"] [--labs "00 01"]
        copies the checkout to /tmp/class-acceptance/repo and grades the class there, unsharded, once per mode
        (--jobs 14, then the default --jobs), detached from the call (setsid): it outlives the call that started it
    ./course run tools/gpu/probe/class_acceptance.py wait SECONDS
        waits until that is done (at most SECONDS), prints the log and each mode's check, packs results and logs
        into $OUT/class.tgz

It grades a copy because the device tool copies the working tree again at every call: a grading run that read the
tree during such a copy found tests/harness/build.py missing (a conftest ImportError under compute-sanitizer).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
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


SNAPSHOT = Path(os.environ.get("CLASS_SNAPSHOT", "/tmp/class-acceptance"))


def start(args: list[str]) -> None:
    options = {"--modes": "14 default", "--labs": ""}
    for flag in options:
        if flag in args:
            at = args.index(flag)
            options[flag], args = args[at + 1], args[:at] + args[at + 2:]
    modes, labs = options["--modes"], options["--labs"]
    students = args[0] if args else "3"
    repo = SNAPSHOT / "repo"
    shutil.rmtree(SNAPSHOT, ignore_errors=True)
    shutil.copytree(ROOT, repo, symlinks=True,
                    ignore=shutil.ignore_patterns("build", ".git", ".whl", ".venv", "__pycache__"))
    log = (SNAPSHOT / "log.txt").open("w")
    probe = repo / Path(__file__).resolve().relative_to(ROOT)
    # The copy's own import roots (./course's), not this checkout's: the copy is what the device tool cannot touch.
    roots = os.pathsep.join([str(repo), str(repo / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
    subprocess.Popen([sys.executable, str(probe), "run-modes", students, modes, labs], cwd=repo, stdout=log,
                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                     env=dict(os.environ, PYTHONPATH=roots))
    print(f"grading {students} students x every lab in {repo}, modes {modes}; log {SNAPSHOT / 'log.txt'}")


def run_modes(students: str, modes: list[str], labs: str) -> None:
    make(int(students))
    results = SNAPSHOT / "results"
    results.mkdir(parents=True, exist_ok=True)
    os.environ["OUT"] = str(results)
    os.environ.pop("MAX_JOBS", None)  # each build gets its share of the cores, as an instructor's run would
    for mode in modes:
        started = time.time()
        print(f"=== mode {mode}: started", flush=True)
        code = grade((["--labs", labs] if labs else []) + ([] if mode == "default" else ["--jobs", mode]))
        print(f"=== mode {mode}: rc {code}, {time.time() - started:.0f} s wall", flush=True)
        name = "class.json" if mode == "default" else f"class-jobs-{mode}.json"
        with (SNAPSHOT / f"check-{mode}.txt").open("w") as out:
            subprocess.run([sys.executable, __file__, "check", str(results / name)], stdout=out,
                           stderr=subprocess.STDOUT)
    (SNAPSHOT / "done").touch()


def wait(seconds: float) -> int:
    deadline = time.time() + seconds
    while not (SNAPSHOT / "done").exists() and time.time() < deadline:
        time.sleep(5)
    print((SNAPSHOT / "log.txt").read_text()[-6000:] if (SNAPSHOT / "log.txt").exists() else "no log yet")
    for check_file in sorted(SNAPSHOT.glob("check-*.txt")):
        print(f"== {check_file.name}\n{check_file.read_text()}")
    out = Path(os.environ.get("OUT", ROOT / "build"))
    with tarfile.open(out / "class.tgz", "w:gz") as tar:
        for part in ("results", "log.txt", "repo/build/logs"):
            if (SNAPSHOT / part).exists():
                tar.add(SNAPSHOT / part, arcname=Path(part).name)
        for check_file in SNAPSHOT.glob("check-*.txt"):
            tar.add(check_file, arcname=check_file.name)
    return 0 if (SNAPSHOT / "done").exists() else 3


if __name__ == "__main__":
    verb, rest = sys.argv[1], sys.argv[2:]
    if verb == "make":
        make(int(rest[0]) if rest else 3)
    elif verb == "grade":
        raise SystemExit(grade(rest))
    elif verb == "check":
        raise SystemExit(check(rest))
    elif verb == "start":
        start(rest)
    elif verb == "run-modes":
        run_modes(rest[0], rest[1].split(), rest[2])
    elif verb == "wait":
        raise SystemExit(wait(float(rest[0]) if rest else 560))
    else:
        raise SystemExit(__doc__)

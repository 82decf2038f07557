"""`./course bench NN --sweep`: a lab's perf-graded ops over model shapes, with PyTorch, torch.compile and peer
libraries side by side (tests/harness/sweep.py does the work; the lab's table is tests/graderNN/sweep.py).

The sweep runs in the test python as a child process, as bench runs pytest: `python -m harness.sweep NN --out FILE`
with the graded tree in COURSE_IMPL. It rewrites FILE after each op, so a run stopped by its deadline still leaves
the ops it finished; it starts no new shape past its budget (SWEEP_BUDGET_FRACTION of --deadline) and records the
shapes it left as "not run". Standard library only (the CLI imports no torch).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

SWEEP_BUDGET_FRACTION = 0.8  # of --deadline: the child starts no shape after this; the rest is the last shape's


def table_file(trees, lab) -> Path:
    return trees.TESTS / f"grader{lab.number}" / "sweep.py"


def labs_with_sweeps(trees) -> list[str]:
    return [lab.number for lab in trees.all_labs() if table_file(trees, lab).is_file()]


def default_output(trees, lab) -> Path:
    """The site's plot data: site/data/plots/NN-slug-sweep.json, which `<!-- plot: NN-slug-sweep -->` draws."""
    return trees.PLOT_DATA / f"{lab.name}-sweep.json"


def shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def command_line(lab, impl: str, json_arg) -> str:
    json_part = "" if not json_arg else " --json" if json_arg is True else f" --json {json_arg}"
    return f"./course bench {lab.number} --impl {impl} --sweep{json_part}"


def run_child(python: str, trees, lab, impl: str, out: Path, *, deadline_s: int, ops: str | None,
              command: str, runner) -> tuple[int, bool]:
    """Run the sweep's process until it ends or `deadline_s` pass (then its whole group is killed); (its exit
    status, whether the deadline killed it). Its output goes to this terminal as it comes."""
    budget = max(1, int(deadline_s * SWEEP_BUDGET_FRACTION))
    child = [python, "-W", "ignore::RuntimeWarning:runpy", "-m", "harness.sweep", lab.number, "--out", str(out),
             "--budget-s", str(budget), "--command", command, *(["--ops", ops] if ops else [])]
    path = trees.pythonpath(os.environ.get("PYTHONPATH"))
    environment = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **{trees.IMPL_ENV: impl})
    try:  # where this process prints: stderr under `--json -`, whose stdout is the JSON's
        stdout = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        stdout = None
    process = subprocess.Popen(child, cwd=trees.ROOT, env=environment, stdout=stdout, start_new_session=True)
    with runner._RUNNING_LOCK:  # ./course's Ctrl-C and SIGTERM stop it (runner.stop_all)
        runner._RUNNING.add(process)
    try:
        return process.wait(timeout=deadline_s), False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return -9, True
    finally:
        with runner._RUNNING_LOCK:
            runner._RUNNING.discard(process)


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary_lines(data: dict) -> list[str]:
    """Per op and dtype: the shapes measured, ours' verification, its % of copy (median, least) and the geometric
    mean of each other implementation's time over ours (above 1: ours is faster)."""
    lines = [f"{'op':<20} {'dtype':<9} {'shapes':>6} {'verified':>8} {'%copy med':>9} {'min':>5}  ours faster than "
             "(geomean of their ms / ours)"]
    groups: dict[tuple, list[dict]] = {}
    for row in data.get("rows", []):
        groups.setdefault((row["op"], row["dtype"]), []).append(row)
    for (op, dtype), rows in groups.items():
        ours = {tuple(r["shape"]): r for r in rows if r["impl"] == "ours"}
        pcts = sorted(r["pct_of_copy"] for r in ours.values())
        verified = sum(1 for r in ours.values() if r.get("verified"))
        others = []
        for impl in dict.fromkeys(r["impl"] for r in rows if r["impl"] != "ours"):
            ratios = [r["ms"] / ours[tuple(r["shape"])]["ms"] for r in rows
                      if r["impl"] == impl and tuple(r["shape"]) in ours]
            mean = _geomean(ratios)
            if mean:
                others.append(f"{impl} {mean:.2f}x")
        median = f"{pcts[len(pcts) // 2]:.0f}" if pcts else "-"
        least = f"{pcts[0]:.0f}" if pcts else "-"
        lines.append(f"{op:<20} {dtype:<9} {len(ours):>6} {verified:>4}/{len(ours):<3} {median:>9} {least:>5}  "
                     + ", ".join(others))
    peers = ", ".join(f"{name} {text}" for name, text in data.get("peers", {}).items())
    lines.append(f"gpu: {data.get('gpu')}; copy {data.get('copy_bandwidth_gbps')} GB/s; peers: {peers}")
    if data.get("skipped"):
        lines.append(f"{len(data['skipped'])} implementation(s) x shape(s) skipped, each with its reason, under "
                     "\"skipped\" in the JSON")
    return lines


def bench_sweep(args, *, trees, env, runner, report, impl: str) -> tuple[int, dict | None]:
    """The sweep of `./course bench NN --sweep [--json [FILE|-]]`: (exit status, the JSON, or None)."""
    lab = trees.find_lab(args.lab)
    if not table_file(trees, lab).is_file():
        have = ", ".join(labs_with_sweeps(trees)) or "none"
        print(f"./course bench {lab.number} --sweep: lab {lab.name} has no sweep table "
              f"({table_file(trees, lab).relative_to(trees.ROOT)}); the labs with one: {have}. Without --sweep, "
              f"./course bench {lab.number} times its perf cases")
        return 2, None
    python = env.python_for("test")
    out = trees.LOGS / f"sweep-{trees.resolve_tree(impl).tag}-{lab.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    command = command_line(lab, impl, args.json)
    print(f"[course] sweep of {lab.name} (impl={impl}): {shown(out, trees.ROOT)}", flush=True)
    code, killed = run_child(python, trees, lab, impl, out, deadline_s=args.deadline, ops=getattr(args, "ops", None),
                             command=command, runner=runner)
    if not out.is_file():
        print(f"./course bench {lab.number} --sweep: the sweep wrote nothing (exit status {code}"
              f"{', killed at its deadline' if killed else ''}); its output is above")
        return code or 1, None
    data = json.loads(out.read_text())
    if killed:
        data["complete"] = False
        data["aborted"] = f"killed at ./course's deadline of {args.deadline} s"
    print("\n".join(summary_lines(data)))
    if not data.get("rows"):
        print(f"./course bench {lab.number} --sweep: nothing was measured (see \"skipped\" in "
              f"{shown(out, trees.ROOT)}); no JSON written beyond it")
        return 1, None
    if args.json and args.json != "-":
        target = default_output(trees, lab) if args.json is True else Path(args.json)
        report.write_json(target, data)
        print(f"[course] wrote {shown(target, trees.ROOT)}"
              f"{'' if data.get('complete') else ' (incomplete: see aborted and skipped)'}")
    return (0 if code == 0 and not killed else 1), data

"""Time variants of a reference solution on the GPU box, to choose between them.

    ./course run tools/gpu/variants.py 02 'rows4:transpose.cu:kBlockRows = 8;:kBlockRows = 4;' ...

    ./course run tools/gpu/variants.py 08 --run 'python3 tools/gpu/probe/lab08_hopper_bwd.py --quick --impl {tree}' @F
        (--run's command inherits ./course's PYTHONPATH, so a plain python3 imports coursekit and harness)

Each variant is NAME:FILE:OLD:NEW (or @FILE with one such spec per line) (OLD must occur once in FILE; '\\n' allowed);
several edits for one variant are joined with '|'. Each variant is built as a submission and
benchmarked with `./course bench`; a table of every perf case's ratio ends the output. The builds run first, all at
once (CPU work: a lab's variants build in the time of one), then the benches one after another (timings never
overlap); each variant's ratios are printed as its bench ends, so a call stopped at its deadline keeps what it timed.
With --run CMD, CMD runs for each variant in turn instead of the bench ({tree}: the variant's folder; base first),
and its output's last 30 lines are printed: a probe that times one kernel in seconds where the lab's bench takes
a minute.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from coursekit import trees  # noqa: E402
from harness.mutants import plant  # noqa: E402


def spec_line(name: str, edits) -> str:
    """A variant's spec line, NAME:FILE:OLD:NEW|..., from (file, old, new) edits: the format main() reads, written by
    the generators (tools/gpu/lab05_epilogue_variants.py)."""
    parts = []
    for file, old, new in edits:
        assert ":" not in old and "|" not in old + new and "\\n" not in old + new, name
        parts.append(f"{file}:{old}:{new}".replace("\n", "\\n"))
    return f"{name}:" + "|".join(parts)


def main() -> None:
    lab = trees.find_lab(sys.argv[1])
    args = sys.argv[2:]
    command = None
    if args[:1] == ["--run"]:
        command, args = args[1], args[2:]
    rows, variants = {}, {}
    specs = []
    for arg in args:  # @FILE: one variant spec per line
        specs += Path(arg[1:]).read_text().splitlines() if arg.startswith("@") else [arg]
    for spec in ["base:::"] + [s for s in specs if s.strip() and not s.startswith("#")]:
        name, _, rest = spec.partition(":")
        edits = []
        for edit in rest.split("|") if rest != "::" else []:
            file, old, new = edit.split(":", 2)
            edits.append((file, old.replace("\\n", "\n"), new.replace("\\n", "\n")))
        variants[name] = plant(lab, trees.BUILD / "variants" / lab.name / name, edits)
    builds = {name: subprocess.Popen([str(ROOT / "course"), "build", lab.number, "--impl", str(tree)], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for name, tree in variants.items()}
    for name, build in builds.items():
        log = build.communicate()[0]
        print(f"{name}: build rc={build.returncode} {log.strip().splitlines()[-1] if log.strip() else ''}", flush=True)
    if command:
        for name, tree in variants.items():
            run = subprocess.run(command.replace("{tree}", str(tree)), shell=True, cwd=ROOT, capture_output=True,
                                 text=True)
            tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-30:])
            print(f"== {name} (rc={run.returncode})\n{tail}", flush=True)
        return
    for name, tree in variants.items():
        out = tree / "bench.json"
        run = subprocess.run([str(ROOT / "course"), "bench", lab.number, "--impl", str(tree), "--json", str(out)],
                             cwd=ROOT, capture_output=True, text=True)
        if not out.exists():
            print(f"{name}: failed\n{run.stdout[-1500:]}", flush=True)
            continue
        rows[name] = {c["name"]: (c["ratio"], c.get("pct_of_copy")) for c in json.loads(out.read_text())["cases"]}
        print(f"{name}: " + "; ".join(f"{case} {ratio:.3f}x" for case, (ratio, _) in rows[name].items()), flush=True)
    cases = sorted({case for r in rows.values() for case in r})
    for case in cases:
        print(case)
        for name, r in rows.items():
            if case in r:
                ratio, pct = r[case]
                print(f"    {name:<24} {ratio:6.2f}x" + (f"  {pct:5.1f}% of copy" if pct else ""))


if __name__ == "__main__":
    main()

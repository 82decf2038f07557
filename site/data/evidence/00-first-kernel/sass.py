"""The loads and stores nvcc emitted for a lab's kernels, as an evidence file (lessons 00 and 01 quote them).

    ./course run site/data/evidence/00-first-kernel/sass.py 00     # writes site/data/evidence/00-first-kernel/sass.json
    ./course run site/data/evidence/00-first-kernel/sass.py 01
        # writes site/data/evidence/01-memory-bandwidth/sass.json

Runs `./course profile NN --impl solutions --sass --json` (a build and cuobjdump -sass: no GPU needed, but the CUDA
toolkit's cuobjdump and nvdisasm on PATH) and turns its summary into one row per kernel: the instruction count, the
loads and stores, the longest batch of loads issued before a store (read off the program order) and the bytes one
thread has in flight in that batch (4 per 32-bit load, 16 per LDG.E.128), and per SM at 2048 resident threads (sm_80
and sm_90's most).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
EVIDENCE = ROOT / "site" / "data" / "evidence"


def load_bytes(opcode: str) -> int:
    """Bytes one thread moves with one global load or store opcode (LDG.E.128.CONSTANT: 16)."""
    for width, size in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if width in opcode:
            return size
    return 4


def expand(sequence: list[str]) -> list[str]:
    """The program-order opcodes from the summary's folded runs ("LDG.E.CONSTANT x4")."""
    ops = []
    for item in sequence:
        found = re.fullmatch(r"(\S+)(?: x(\d+))?", item)
        ops += [found.group(1)] * int(found.group(2) or 1)
    return ops


def row(summary: dict) -> dict:
    ops = expand(summary["sequence"])
    batches, batch = [], []  # runs of loads with no store between them
    for op in ops + ["END"]:
        if op.startswith("LDG"):
            batch.append(op)
        elif batch:
            batches.append(batch)
            batch = []
    widest = max(batches, key=lambda b: sum(map(load_bytes, b)), default=[])
    counts = summary["counts"]
    return {"name": summary["kernel"].split("(")[0], "signature": summary["kernel"], "arch": summary["arch"],
            "instructions": summary["instructions"],
            "loads": sum(n for op, n in counts.items() if op.startswith("LDG")),
            "stores": sum(n for op, n in counts.items() if op.startswith("STG")),
            "counts": ", ".join(f"{op} {n}" for op, n in counts.items()),
            "order": ", ".join(summary["sequence"]),
            "batch_loads": len(widest), "batch": ", ".join(expand_fold(widest)),
            "bytes_in_flight": sum(map(load_bytes, widest)),
            "kib_in_flight_per_sm_2048": sum(map(load_bytes, widest)) * 2048 / 1024}


def expand_fold(ops: list[str]) -> list[str]:
    runs: list[list] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    return [f"{op} x{n}" if n > 1 else op for op, n in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lab", help="lab number, e.g. 00")
    parser.add_argument("--impl", default="solutions")
    args = parser.parse_args()
    found = sorted((ROOT / "solutions").glob(f"{int(args.lab):02d}-*"))
    if len(found) != 1:
        sys.exit(f"sass.py: no lab {args.lab!r} under solutions/")
    lab_name, lab_number = found[0].name, found[0].name[:2]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "sass.json"
        run = subprocess.run([str(ROOT / "course"), "profile", lab_number, "--impl", args.impl, "--sass", "--json",
                              str(raw)], cwd=ROOT)
        if run.returncode != 0 or not raw.exists():
            sys.exit(f"sass.py: ./course profile {lab_number} --sass failed (exit status {run.returncode})")
        data = json.loads(raw.read_text())
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([\d.]+)", nvcc)
    torch = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip()
    arch = sorted({s["arch"] for s in data["sass"]})
    compiler = f"nvcc {release.group(1) if release else '?'}"
    out = {"gpu": f"{', '.join(arch)} code from {compiler} (a compile: no GPU needed)",
           "torch": torch or None, "date": data["date"],
           "command": f"python3 site/data/evidence/00-first-kernel/sass.py {lab_number}",
           "source": f"{data['command']} --json (cuobjdump -sass of the built extension), one row per kernel",
           "rows": sorted((row(s) for s in data["sass"]), key=lambda r: r["name"]),
           "table": {"columns": [["name", "kernel", ""], ["instructions", "instructions", "d"],
                                 ["order", "loads (LDG) and stores (STG) in program order", ""],
                                 ["bytes_in_flight", "most bytes a thread loads before a store", "d"]]}}
    path = EVIDENCE / lab_name / "sass.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    for r in out["rows"]:
        print(f"{r['name']:<24} {r['instructions']:4d} instructions, {r['batch']} -> {r['bytes_in_flight']} B "
              "in flight")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""How long lab 00's host wrapper takes to compile with the course's few torch headers, and with <torch/extension.h>.

    .venv/bin/./course run site/data/evidence/00-first-kernel/wrapper_headers.py [--repeat N] [--json FILE]

Compiles solutions/00-first-kernel/wrapper.cpp with the host compiler and the flags torch.utils.cpp_extension.load
gives a wrapper (the `compile` rule of the JIT build's build.ninja), twice per round: as it is (course/torch_op.h),
and with `#include <torch/extension.h>` in front of it (the umbrella header most extension tutorials use; it pulls
in autograd, nn and optim). Prints the best wall time of each over --repeat rounds and, with --json, writes the
evidence file beside this script (wrapper_headers.json). No GPU needed: this is the cost of every cold build.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
HERE = Path(__file__).resolve().parent
WRAPPER = ROOT / "solutions" / "00-first-kernel" / "wrapper.cpp"


def compile_flags() -> list[str]:
    from torch.utils.cpp_extension import CUDA_HOME, include_paths  # the paths load() passes
    flags = ["-DTORCH_EXTENSION_NAME=wrapper_headers", "-DTORCH_API_INCLUDE_EXTENSION_H",
             f"-I{ROOT / 'include'}", f"-I{WRAPPER.parent}"]
    for path in include_paths() + [str(Path(CUDA_HOME or "/usr/local/cuda") / "include"),
                                   sysconfig.get_paths()["include"]]:
        flags += ["-isystem", path]
    return flags + ["-fPIC", "-std=c++17", "-O3"]


def compile_seconds(source: Path, flags: list[str], out: Path) -> float:
    command = [os.environ.get("CXX", "c++"), *flags, "-c", str(source), "-o", str(out)]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the best time of each variant is kept")
    parser.add_argument("--json", nargs="?", const=str(HERE / "wrapper_headers.json"), metavar="FILE",
                        help="write the evidence file (default: wrapper_headers.json beside this script)")
    args = parser.parse_args()
    import torch

    flags = compile_flags()
    with tempfile.TemporaryDirectory() as tmp:
        umbrella = Path(tmp) / "wrapper_extension_h.cpp"
        umbrella.write_text("#include <torch/extension.h>\n" + WRAPPER.read_text())
        best = {"course/torch_op.h": float("inf"), "torch/extension.h": float("inf")}
        for _ in range(args.repeat):
            for name, source in (("course/torch_op.h", WRAPPER), ("torch/extension.h", umbrella)):
                best[name] = min(best[name], compile_seconds(source, flags, Path(tmp) / "wrapper.o"))
    for name, seconds in best.items():
        print(f"wrapper.cpp with {name:<18} {seconds:6.1f} s")
    ratio = best["torch/extension.h"] / best["course/torch_op.h"]
    print(f"ratio {ratio:.1f}x")
    if args.json:
        compiler = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True,
                                  text=True).stdout.splitlines()[0]
        data = {"gpu": f"a {os.cpu_count()}-core CPU machine without a GPU ({compiler})", "torch": torch.__version__,
                "date": _dt.date.today().isoformat(),
                "command": ".venv/bin/python site/data/evidence/00-first-kernel/wrapper_headers.py --json",
                "source": f"this script's output: best wall time of {args.repeat} compiles of "
                          "solutions/00-first-kernel/wrapper.cpp each",
                "rows": [{"name": name, "seconds": round(seconds, 2),
                          "vs_course_header": round(seconds / best["course/torch_op.h"], 2)}
                         for name, seconds in best.items()],
                "table": {"columns": [["name", "wrapper.cpp includes", ""], ["seconds", "compile (s)", ".1f"],
                                      ["vs_course_header", "x course/torch_op.h", ".1f"]]}}
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

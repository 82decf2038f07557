"""Lab 02 without its __syncthreads(): how often is the transpose wrong, per shape, with fresh inputs each
run and with the same input every run? The reference (with the barrier) is the control.

    ./course run site/data/evidence/02-shared-memory/nosync.py [RUNS]   (default 2000 runs a small shape; about 1 min)

Lesson 02 (section 2 and exercise 2) quotes its counts from nosync.json beside this file. In a 1 x 31 tile only
row 0 holds data: warp 0 (threadIdx.y = 0) loads all of it, and the write-out of output rows y + 4j is done by
warp y, so warps 1-3 read tile entries that warp 0 stored: a cross-warp race like any other. It can pass where
the shared memory still holds the same values from an earlier launch on the same input. The "same input" column
repeats one input; "fresh" draws a new one each run, as every grader case does.
Builds solutions/02 as is, and a copy with the barrier line removed (the grader's no-syncthreads mutant),
under build/variants/. Prints a table; with $OUT set, also writes $OUT/nosync.json in the layout of the
evidence file (rows and table; the date is the day it ran).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

# The grader's small edge shapes, one full tile, and two large ones (fewer runs: each is many tiles).
SHAPES = [(1, 31), (31, 33), (1, 1), (32, 32), (33, 4097), (1000, 1000), (16, 1000, 1000)]
COLUMNS = [["barrier", "__syncthreads()", ""], ["kernel", "kernel", ""], ["shape", "shape", ""], ["runs", "runs", "d"],
           ["wrong_fresh", "wrong, fresh input each run", "d"], ["wrong_same", "wrong, one input repeated", "d"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="?", type=int, default=2000,
                        help="runs per small shape (large shapes: a twentieth, at least 20)")
    args = parser.parse_args()

    import torch

    from coursekit import trees
    from harness import build
    from harness.check import poison_allocator
    from harness.mutants import plant

    if not torch.cuda.is_available():
        sys.exit("nosync.py needs a CUDA GPU")
    lab = trees.find_lab("02")
    builds = {
        "with": trees.resolve_tree("solutions"),
        "without": trees.resolve_tree(str(plant(lab, trees.BUILD / "variants" / lab.name / "no-syncthreads",
                                                [("transpose.cu", "  __syncthreads();\n", "")]))),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; wrong runs of N per shape (exact comparison)")
    print(f"{'__syncthreads':<14} {'kernel':<7} {'shape':<14} {'runs':>5} {'fresh input':>12} {'same input':>11}")
    rows = []
    started = time.perf_counter()
    for barrier, tree in builds.items():
        module = build.build(lab, tree)
        for kernel in ("tiled", "padded"):
            op = getattr(module, f"{kernel}_transpose")
            for shape in SHAPES:
                numel = 1
                for size in shape:
                    numel *= size
                runs = args.runs if numel <= 1 << 16 else max(20, args.runs // 20)
                wrong = {}
                for mode in ("fresh", "same"):
                    fixed = torch.randn(shape, device="cuda")
                    count = 0
                    for _ in range(runs):
                        x = torch.randn(shape, device="cuda") if mode == "fresh" else fixed
                        poison_allocator(numel, torch.float32)
                        out = op(x)
                        if not torch.equal(out, x.transpose(-2, -1)):
                            count += 1
                    wrong[mode] = count
                shape_text = " x ".join(map(str, shape))
                print(f"{barrier:<14} {kernel:<7} {shape_text:<14} {runs:>5} {wrong['fresh']:>12} {wrong['same']:>11}",
                      flush=True)
                rows.append({"name": f"{barrier} __syncthreads, {kernel}, {shape_text}", "barrier": barrier,
                             "kernel": kernel, "shape": shape_text, "runs": runs, "wrong_fresh": wrong["fresh"],
                             "wrong_same": wrong["same"]})
    print(f"{time.perf_counter() - started:.0f} s")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "nosync.json"
        evidence = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(),
                    "command": f"python3 site/data/evidence/02-shared-memory/nosync.py {args.runs}",
                    "rows": rows, "table": {"columns": COLUMNS}}
        path.write_text(json.dumps(evidence, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

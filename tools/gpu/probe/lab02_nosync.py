"""Lab 02 without its __syncthreads(): how often is the transpose wrong, per shape, with fresh inputs each
run and with the same input every run? The reference (with the barrier) is the control.

    python3 tools/gpu/probe/lab02_nosync.py [RUNS]      (default 2000 runs a small shape; about 1 min)

Why (issue 16, item 4): lesson 02's exercise 2 said a 1 x 31 tile "never fails" without the barrier. In a
1 x 31 tile only row 0 holds data: warp 0 (threadIdx.y = 0) loads all of it, and the write-out of output
rows y + 4j is done by warp y, so warps 1-3 read tile entries that warp 0 stored: a cross-warp race like
any other. It passed only where the shared memory still held the same values from an earlier launch on
the same input. The "same input" column repeats one input (what the grader's repeated test did before
it drew a fresh input each run); "fresh" draws a new one each run, as every other grader case does.
Builds solutions/02 as is, and a copy with the barrier line removed (the grader's no-syncthreads mutant),
under build/variants/. Prints a table; with $OUT set, also $OUT/lab02_nosync.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from harness import build, trees  # noqa: E402
from harness.check import poison_allocator  # noqa: E402
from harness.mutants import plant  # noqa: E402

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
# The grader's small edge shapes, one full tile, and two large ones (fewer runs: each is many tiles).
SHAPES = [(1, 31), (31, 33), (1, 1), (32, 32), (33, 4097), (1000, 1000), (16, 1000, 1000)]
lab = trees.find_lab("02")
builds = {
    "reference": trees.resolve_tree("solutions"),
    "no __syncthreads": trees.resolve_tree(str(plant(lab, trees.BUILD / "variants" / lab.name / "no-syncthreads",
                                                     [("transpose.cu", "  __syncthreads();\n", "")]))),
}
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; wrong runs of N per shape (exact comparison)")
print(f"{'build':<18} {'kernel':<7} {'shape':<14} {'runs':>5} {'fresh input':>12} {'same input':>11}")
results = []
started = time.perf_counter()
for build_name, tree in builds.items():
    module = build.build(lab, tree)
    for kernel in ("tiled", "padded"):
        op = getattr(module, f"{kernel}_transpose")
        for shape in SHAPES:
            numel = 1
            for size in shape:
                numel *= size
            runs = RUNS if numel <= 1 << 16 else max(20, RUNS // 20)
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
            shape_text = "x".join(map(str, shape))
            print(f"{build_name:<18} {kernel:<7} {shape_text:<14} {runs:>5} {wrong['fresh']:>12} {wrong['same']:>11}",
                  flush=True)
            results.append({"build": build_name, "kernel": kernel, "shape": list(shape), "runs": runs,
                            "wrong_fresh": wrong["fresh"], "wrong_same": wrong["same"]})
print(f"{time.perf_counter() - started:.0f} s")
if os.environ.get("OUT"):
    path = Path(os.environ["OUT"]) / "lab02_nosync.json"
    path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1))
    print(f"wrote {path}")

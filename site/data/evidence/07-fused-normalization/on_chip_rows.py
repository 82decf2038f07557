"""Lab 07, softmax: the on-chip path against the streaming path at every row length it takes, float32 and bfloat16.

    ./course run site/data/evidence/07-fused-normalization/on_chip_rows.py [--impl solutions|labs]
    (JSON: $OUT/lab07-on-chip-rows.json)

Why: issue 13 adopted the on-chip kernels for rows past the register path (8193 and longer) up to what the GPU holds
(65536 floats), measured only at 4096 x 65536 float32 (NOTES.md@8a81008, lab 07). Shorter rows use a fraction of
the block (forward) or of the cluster (backward: a 16384-long float row fills one of its 4 blocks), and the streaming
path's second read is more likely to hit L2 there. This times both paths, forced, at 256 MiB a tensor for each n and
prints which is faster, as % of a same-bytes copy (2S forward, 3S backward): 'auto' should take the on-chip path only
where it is not slower. Each case is checked against float64 on its first 8 rows before it is timed.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)
from coursekit import jit  # noqa: E402
from harness import perf  # noqa: E402

IMPL = sys.argv[sys.argv.index("--impl") + 1] if "--impl" in sys.argv else "solutions"
LENGTHS = (8196, 12288, 16384, 24576, 32768, 40960, 49152, 57344, 65536)
TENSOR_BYTES = 2**28

jit.ensure_arch_list()
lab = jit.load_lab(ROOT / IMPL / "07-fused-normalization", ROOT)
copy = perf.copy_bandwidth()
out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "impl": IMPL,
             "copy_gbps": round(copy, 1), "on_chip_row": {}, "cases": []}
print(f"{out['device']}, copy {copy:.0f} GB/s; % of copy, on_chip / streaming")
for dtype in (torch.float32, torch.bfloat16):
    size = torch.empty((), dtype=dtype).element_size()
    limits = {kind: int(lab.on_chip_row(size, kind == "backward")) for kind in ("forward", "backward")}
    out["on_chip_row"][str(dtype)] = limits
    for n in LENGTHS:
        rows = TENSOR_BYTES // (n * size)
        x = torch.randn(rows, n, device="cuda").to(dtype)
        y = torch.softmax(x.float(), -1).to(dtype)
        g = torch.randn(rows, n, device="cuda").to(dtype)
        for kind, moved in (("forward", 2 * x.numel() * size), ("backward", 3 * x.numel() * size)):
            if n > limits[kind]:
                continue  # this GPU does not take the row on chip (16-bit forwards: never)
            def run(path, kind=kind, x=x, y=y, g=g):
                return lab.softmax(x, path) if kind == "forward" else lab.softmax_backward(g, y, path)

            y64, g64 = y[:8].double(), g[:8].double()
            want = torch.softmax(x[:8].double(), -1) if kind == "forward" else y64 * (g64 - (g64 * y64).sum(-1, True))
            errors = {p: ((run(p)[:8].double() - want).norm() / want.norm()).item() for p in ("on_chip", "streaming")}
            ms = jit.interleaved_median_ms([lambda: run("on_chip"), lambda: run("streaming")], warmup=3, reps=20)
            pct = [100 * moved / (t * 1e-3) / 1e9 / copy for t in ms]
            out["cases"].append({"dtype": str(dtype), "n": n, "rows": rows, "kind": kind, "ms": ms, "pct": pct,
                                 "errors": errors})
            print(f"  {str(dtype):15} {kind:8} n {n:6} rows {rows:6}: {pct[0]:5.1f}% / {pct[1]:5.1f}%"
                  f"  ({'on_chip' if ms[0] <= ms[1] else 'streaming'} faster; errors {errors['on_chip']:.1e} / "
                  f"{errors['streaming']:.1e})", flush=True)
Path(os.environ.get("OUT", "build")).mkdir(parents=True, exist_ok=True)
Path(os.environ.get("OUT", "build"), "lab07-on-chip-rows.json").write_text(json.dumps(out, indent=1))

"""Where does lab 05's time go? Both paths and cuBLAS over shapes and activations, one process.

    ./course run site/data/evidence/05-tensor-cores/shapes.py [IMPL_DIR]      (default: solutions)

Differences between rows place the time: activation none vs gelu is the epilogue's math; K 4096
vs 8192 splits a tile's time into a per-k-slice part and a fixed (epilogue) part; 8192^2 outputs
have 4x the tiles, so less wave quantization.
"""
from __future__ import annotations

import sys

if {"-h", "--help"} & set(sys.argv[1:]):  # on any machine, GPU or not
    print(__doc__)
    sys.exit(0)

from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[4]  # site/data/evidence/05-tensor-cores/
from coursekit import trees  # noqa: E402
from harness import build, perf  # noqa: E402

lab = trees.find_lab("05")
module = build.build(lab, trees.resolve_tree(sys.argv[1] if len(sys.argv) > 1 else "solutions"))
print(f"{torch.cuda.get_device_name()}, wgmma available: {module.wgmma_available()}")
print(f"{'M N K':<18} {'act':<5} {'path':<18} {'ms':>7} {'TFLOP/s':>8} {'cuBLAS ms':>9} {'ratio':>6}")
for (m, n, k) in [(4096, 4096, 4096), (4096, 4096, 8192), (8192, 8192, 4096), (4096, 4096, 1024)]:
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16()
    flops = 2 * m * n * k
    for act in ("none", "gelu"):
        for path in ("linear_act_wgmma", "linear_act"):
            if path == "linear_act_wgmma" and not module.wgmma_available():
                continue
            fn = getattr(module, path)
            ours, base = perf.time_pair(lambda: fn(x, w, b, act), lambda: torch.matmul(x, w.t()), reps=30)
            print(f"{m}x{n}x{k:<8} {act:<5} {path:<18} {ours:7.3f} {flops / ours / 1e9:8.1f} {base:9.3f} "
                  f"{base / ours:6.2f}")
    for name, fn in [("gelu(addmm)", lambda: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh")),
                     ("gelu(matmul+bias)", lambda: F.gelu(torch.matmul(x, w.t()) + b, approximate="tanh")),
                     ("_addmm_activation", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))]:
        ms, base = perf.time_pair(fn, lambda: torch.matmul(x, w.t()), reps=30)
        print(f"{m}x{n}x{k:<8} {'gelu':<5} {name:<18} {ms:7.3f} {flops / ms / 1e9:8.1f} {base:9.3f} {base / ms:6.2f}")

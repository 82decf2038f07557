"""When does lab 05's fused kernel beat the unfused layer? A K sweep at 8192 x 8192 outputs against the model of
the lesson's section 1 (tests/test_05_tensor_cores.py, FUSION_SHAPE's comment), on this GPU.

    ./course run site/data/evidence/05-tensor-cores/fusion.py [IMPL_DIR]     (default: solutions; one build, then ~30 s)

Measures, in one process: the copy bandwidth BW (harness.perf.copy_bandwidth, the grader's ceiling), cuBLAS's
bf16 rate R and the fused kernel's fraction r of it at 4096^3 (GELU), so I = R / BW; then for each K at
M = N = 8192, bf16 + bias + GELU: the fused kernel (linear_act), gelu(addmm) (the perf case's baseline),
the GEMM alone (addmm) and the GELU pass alone on its output. Prints the speed-up unfused / fused beside the
model's range (stores hidden under the math: max(2K/(rI), 2); not hidden: 2K/(rI) + 2; unfused max(2K/I, 2) + 4,
all per output element in units of 1 / BW), the fused kernel's output bytes per second as % of copy, and the
GELU pass's (4 bytes an element) as % of copy. Stdout; with $OUT set, also $OUT/lab05_fusion.json (the rows)
and $OUT/05-tensor-cores-fusion.json, a plot of the speed-up against K in site/hooks/plots.py's format (commit it
to site/data/plots/ and write `<!-- plot: 05-tensor-cores-fusion -->` on the page to show it).
"""
from __future__ import annotations

import sys

if {"-h", "--help"} & set(sys.argv[1:]):  # on any machine, GPU or not
    print(__doc__)
    sys.exit(0)

import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[4]  # site/data/evidence/05-tensor-cores/
from coursekit import trees  # noqa: E402
from harness import build, perf  # noqa: E402

IMPL = sys.argv[1] if len(sys.argv) > 1 else "solutions"
lab = trees.find_lab("05")
module = build.build(lab, trees.resolve_tree(IMPL))
name = torch.cuda.get_device_name()
BF16 = torch.bfloat16


def inputs(m: int, n: int, k: int):
    x = torch.randn(m, k, device="cuda").to(BF16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(BF16)
    b = torch.randn(n, device="cuda").to(BF16)
    return x, w, b


def unfused(x, w, b):
    return F.gelu(torch.addmm(b, x, w.t()), approximate="tanh")


def calibrate() -> tuple[float, float, float, float]:
    """Copy bandwidth (bytes/s), and at 4096^3 bf16: cuBLAS's ms, the fused kernel's ms (GELU), cuBLAS's FLOP/s."""
    bw = perf.copy_bandwidth() * 1e9  # bytes read + written per second
    x, w, b = inputs(4096, 4096, 4096)
    fused_ms, gemm_ms = perf.time_pair(lambda: module.linear_act(x, w, b, "gelu"), lambda: torch.matmul(x, w.t()))
    return bw, gemm_ms, fused_ms, 2 * 4096**3 / (gemm_ms * 1e-3)


def measure(m: int, n: int, k: int) -> dict:
    x, w, b = inputs(m, n, k)
    fused_ms, unfused_ms = perf.time_pair(lambda: module.linear_act(x, w, b, "gelu"), lambda: unfused(x, w, b))
    pre = torch.addmm(b, x, w.t())
    addmm_ms, gelu_ms = perf.time_pair(lambda: torch.addmm(b, x, w.t()), lambda: F.gelu(pre, approximate="tanh"))
    math, model_unfused = 2 * k / intensity, max(2 * k / intensity, 2) + 4
    return {"m": m, "n": n, "k": k, "fused_ms": fused_ms, "unfused_ms": unfused_ms, "speedup": unfused_ms / fused_ms,
            "model_no_overlap": model_unfused / (math / r + 2), "model_overlap": model_unfused / max(math / r, 2),
            "addmm_ms": addmm_ms, "gelu_ms": gelu_ms,
            "fused_output_pct_of_copy": 100 * m * n * 2 / (fused_ms * 1e-3) / bw,
            "gelu_pct_of_copy": 100 * m * n * 4 / (gelu_ms * 1e-3) / bw}


bw, gemm_ms, ours_ms, rate = calibrate()
r = gemm_ms / ours_ms
intensity = rate / bw
print(f"{name}, torch {torch.__version__}, impl {IMPL}")
print(f"copy {bw / 1e9:.0f} GB/s; cuBLAS bf16 4096^3 {gemm_ms:.3f} ms = {rate / 1e12:.0f} TFLOP/s; "
      f"fused {ours_ms:.3f} ms = r {r:.3f}; I = R / BW = {intensity:.0f} FLOP/B")
print(f"model crossover K: {2 * r * intensity / (1 - r):.0f} (stores hidden), {2 * r * intensity:.0f} (not hidden)\n")
print(f"{'M N K':<16} {'fused ms':>8} {'unfused':>8} {'speed-up':>8} {'model':>10} {'addmm ms':>8} {'GELU ms':>8} "
      f"{'fused % copy':>12} {'GELU % copy':>11}")
rows = []
for k in (32, 64, 128, 256, 512, 1024, 4096):
    row = measure(8192, 8192, k)
    rows.append(row)
    print(f"{row['m']}x{row['n']}x{k:<6} {row['fused_ms']:8.3f} {row['unfused_ms']:8.3f} {row['speedup']:7.2f}x "
          f"{row['model_no_overlap']:4.2f}-{row['model_overlap']:4.2f}x {row['addmm_ms']:8.3f} {row['gelu_ms']:8.3f} "
          f"{row['fused_output_pct_of_copy']:11.0f}% {row['gelu_pct_of_copy']:10.0f}%")

if os.environ.get("OUT"):
    out = Path(os.environ["OUT"])
    meta = {"device": name, "gpu": name, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "impl": IMPL,
            "command": "python3 site/data/evidence/05-tensor-cores/fusion.py", "copy_gbps": bw / 1e9,
            "cublas_4096_ms": gemm_ms,
            "fused_4096_ms": ours_ms, "r": r, "intensity": intensity}
    (out / "lab05_fusion.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    series = []
    for row in rows:
        for label, value in (("measured: gelu(addmm) time / fused time", row["speedup"]),
                             ("model, stores hidden under the math", row["model_overlap"]),
                             ("model, stores not hidden", row["model_no_overlap"])):
            series.append({"k": row["k"], "speedup": round(value, 3), "line": label})
    plot = {**meta, "rows": series,
            "plot": {"x": "k", "y": "speedup", "series": "line", "panels": [], "log2_x": True,
                     "x_label": "K (M = N = 8192, bf16 + bias + GELU)", "y_label": "speed-up over gelu(addmm)",
                     "title": "Lab 05's fused mma.sync kernel against the unfused layer",
                     "caption": "Above 1 the fused kernel is faster. The model: section 6, with this GPU's "
                                "copy bandwidth, cuBLAS's 4096^3 rate and the kernel's fraction r of it."}}
    (out / "05-tensor-cores-fusion.json").write_text(json.dumps(plot, indent=1))
    print(f"\nwrote {out / 'lab05_fusion.json'} and {out / '05-tensor-cores-fusion.json'}")

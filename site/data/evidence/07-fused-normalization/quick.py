"""Lab 07's reference on the GPU box before its grader exists: right answers on every path, then the speed cases.

    ./course run site/data/evidence/07-fused-normalization/quick.py [--speed] [IMPL_DIR]
        (JSON to $OUT/lab07-quick.json)

Correctness: max relative error (normwise) against float64 for softmax / RMSNorm forward and backward, each path,
float32 / bfloat16, a few odd shapes. Speed (CUDA events, interleaved medians, L2 flushed): the issue's cases, as
% of a device-to-device copy (fused byte counts: forward 2S, backward 3S) and against PyTorch's versions.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[4]
if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)
import harness  # noqa: E402
from coursekit import jit, trees  # noqa: E402
from harness import build, perf  # noqa: E402

SPEED_ONLY = "--speed" in sys.argv  # skip the correctness table
args = [a for a in sys.argv[1:] if a != "--speed"]
os.environ[trees.IMPL_ENV] = args[0] if args else "solutions"
LAB = harness.lab("07")
ops = build.build(LAB.lab, LAB.tree)
spec = importlib.util.spec_from_file_location("triton_rms_norm", LAB.lab.dir_in(LAB.tree) / "triton_rms_norm.py")
tri = importlib.util.module_from_spec(spec)
sys.modules["triton_rms_norm"] = tri
spec.loader.exec_module(tri)
out: dict = {"device": torch.cuda.get_device_name(), "errors": [], "speed": []}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def rms_ref(x, w, eps):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


for dtype in () if SPEED_ONLY else (torch.float32, torch.bfloat16):
    for rows, n in ((1, 1), (7, 33), (64, 1000), (33, 4097), (8, 8192), (3, 65536), (2, 2**17 + 3)):
        x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
        w = torch.randn(n, device="cuda", dtype=dtype)
        gy = torch.randn_like(x)
        for path in ("auto", "registers", "streaming"):
            try:
                y = ops.softmax(x, path)
            except RuntimeError as error:
                out["errors"].append({"case": f"softmax {rows}x{n} {dtype} {path}", "refused": str(error)[:80]})
                continue
            x64 = x.double().requires_grad_()
            y64 = torch.softmax(x64, -1)
            (g64,) = torch.autograd.grad(y64, x64, gy.double())
            gx = ops.softmax_backward(gy, y, path)
            yr, rstd = ops.rms_norm(x, w, 1e-5, path)
            xr = x.double().requires_grad_()
            wr = w.double().requires_grad_()
            yr64 = rms_ref(xr, wr, 1e-5)
            gxr64, gwr64 = torch.autograd.grad(yr64, (xr, wr), gy.double())
            gxr, gwr = ops.rms_norm_backward(gy, x, w, rstd, path)
            row = {"case": f"{rows}x{n} {dtype} {path}", "softmax": rel(y, y64), "softmax_bwd": rel(gx, g64),
                   "rms": rel(yr, yr64), "rms_dx": rel(gxr, gxr64), "rms_dw": rel(gwr, gwr64)}
            if dtype != torch.float64 and path == "auto":
                ty = tri.rms_norm(x, w, 1e-5)
                tx = x.detach().clone().requires_grad_()
                tw = w.detach().clone().requires_grad_()
                tri.rms_norm(tx, tw, 1e-5).backward(gy)
                row.update({"triton": rel(ty, yr64), "triton_dx": rel(tx.grad, gxr64),
                            "triton_dw": rel(tw.grad, gwr64)})
            out["errors"].append(row)
            print({k: (f"{v:.1e}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)

copy = perf.copy_bandwidth()
out["copy_gbps"] = copy
print(f"copy {copy:.0f} GB/s")


def speed(label, fns: dict, nbytes: int):
    ms = jit.interleaved_median_ms(list(fns.values()), warmup=5, reps=30)
    for (name, _), t in zip(fns.items(), ms):
        pct = 100 * nbytes / (t * 1e-3) / 1e9 / copy
        out["speed"].append({"case": label, "version": name, "ms": round(t, 4),
                             "pct_of_copy_at_fused_bytes": round(pct, 1)})
        print(f"  {label:<34} {name:<22} {t:8.4f} ms  {pct:5.1f}% of copy (fused bytes)", flush=True)


def eager_rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


compiled_rms = torch.compile(eager_rms)
x = torch.randn(8, 4096, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
S = x.numel() * 2
speed("rmsnorm fwd (8,4096,4096) bf16",
      {"ours": lambda: ops.rms_norm(x, w, 1e-6), "F.rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
       "eager": lambda: eager_rms(x, w), "compiled": lambda: compiled_rms(x, w),
       "triton": lambda: tri.rms_norm(x, w, 1e-6)}, 2 * S)
y, rstd = ops.rms_norm(x, w, 1e-6)
gy = torch.randn_like(x)
speed("rmsnorm bwd (8,4096,4096) bf16", {"ours": lambda: ops.rms_norm_backward(gy, x, w, rstd),
      "triton": lambda: torch.ops.course07.rms_norm_bwd(gy, x, w, rstd)}, 3 * S)
for shape in ((8192, 8192), (4096, 65536)):
    xs = torch.randn(*shape, device="cuda")
    S = xs.numel() * 4
    speed(f"softmax fwd {shape} fp32",
          {"ours": lambda: ops.softmax(xs), "torch.softmax": lambda: torch.softmax(xs, -1)}, 2 * S)
    ys = ops.softmax(xs)
    gs = torch.randn_like(xs)
    speed(f"softmax bwd {shape} fp32", {"ours": lambda: ops.softmax_backward(gs, ys),
          "torch": lambda: torch._softmax_backward_data(gs, ys, -1, torch.float32)}, 3 * S)
Path(os.environ.get("OUT", "build")).mkdir(parents=True, exist_ok=True)
Path(os.environ.get("OUT", "build"), "lab07-quick.json").write_text(json.dumps(out, indent=1))

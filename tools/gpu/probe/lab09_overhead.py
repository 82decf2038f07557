"""Lab 09's call overhead, taken apart: where the microseconds between a pybind11 call and a dispatcher op go.

    python3 tools/gpu/probe/lab09_overhead.py [IMPL_DIR]     (JSON to $OUT/lab09-overhead.json, default build/gpu-out)

Host microseconds per call of bias_gelu on a tiny input (8 x 64 float32: the GPU runs it faster than the host
launches it, so host time is the overhead), each against lab 06's pybind11 bias_gelu of the same tree, the same
kernel (tests/grader09/support.host_us_per_call: 2000 calls back to back, the callables in turn, median of 9 rounds):
  - torch.ops.<ns>.bias_gelu (the OpOverloadPacket, as users call it) and .default (the overload: no packet
    resolution), each under torch.inference_mode() (the Autograd keys skipped) and with grad mode on (register_
    autograd's Python kernel first, inputs not requiring grad);
  - the same before ops.register (no Python autograd kernel at all: what a C++ autograd registration would cost);
  - a torch.library.custom_op (Python) around the pybind11 call, both modes;
  - torch.ops.aten.gelu on the same input, for scale (a native op through the same dispatcher).
The grader's test_perf_call_overhead holds the first line to SYLLABUS §5's 5 us; this shows which layer costs what.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from grader09 import support as S  # noqa: E402

import harness  # noqa: E402
from harness import build, trees  # noqa: E402

os.environ[trees.IMPL_ENV] = sys.argv[1] if len(sys.argv) > 1 else "solutions"
LAB = harness.lab("09")
library = build.build(LAB.lab, LAB.tree)
lab06 = build.build(trees.find_lab("06"), LAB.tree)
raw = library.ops
x, bias = torch.randn(8, 64, device="cuda"), torch.randn(64, device="cuda")
custom = S.pybind_custom_op(lab06, LAB.tree.tag)
rows: list[dict] = []


def measure(label: str, fns: dict) -> None:
    names = list(fns)
    with torch.inference_mode() if "inference" in label else torch.enable_grad():
        times = S.host_us_per_call([fns[n] for n in names])
    direct = times[names.index("pybind11 (direct)")]
    for name, us in zip(names, times):
        rows.append({"mode": label, "call": name, "us": round(us, 3), "extra_us": round(us - direct, 3)})
        print(f"{label:<16} {name:<40} {us:8.2f} us  {us - direct:+7.2f} us")


def calls(ops) -> dict:
    return {"pybind11 (direct)": lambda: lab06.bias_gelu(x, bias, "none", True),
            "torch.ops packet": lambda: ops.bias_gelu(x, bias),
            "torch.ops .default overload": lambda: ops.bias_gelu.default(x, bias, "none"),
            "custom_op around pybind11": lambda: custom(x, bias),
            "aten.gelu (native, for scale)": lambda: torch.ops.aten.gelu(x)}


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
for mode in ("inference_mode", "grad mode"):
    measure(f"{mode}, before register", calls(raw))
ops = LAB.python("ops").register(library.namespace)
for mode in ("inference_mode", "grad mode"):
    measure(f"{mode}, registered", calls(ops))
out = Path(os.environ.get("OUT", ROOT / "build" / "gpu-out"))
out.mkdir(parents=True, exist_ok=True)
(out / "lab09-overhead.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                      "rows": rows}, indent=1) + "\n")

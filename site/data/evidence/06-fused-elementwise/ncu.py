"""Lab 06's vectorized forward under Nsight Compute: where the bfloat16 erf form's time goes.

    ncu --kernel-name regex:bias_gelu_vectorized --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section InstructionStats --section WarpStateStats --section Occupancy \
        ./course run site/data/evidence/06-fused-elementwise/ncu.py

One launch each, in this order, at x = (8192, 8192): float32 erf, bfloat16 erf, bfloat16 tanh (each bfloat16
forward followed by its backward, which a --kernel-name regex:bias_gelu_backward_kernel run profiles). The three
reach 0.98x, 0.81-0.85x and 0.92-0.95x of copy bandwidth (NOTES.md@8a81008); the profile says whether
the bfloat16 erf kernel is short of memory traffic because its arithmetic pipes are full.
"""
from __future__ import annotations

import sys

if {"-h", "--help"} & set(sys.argv[1:]):  # on any machine, GPU or not
    print(__doc__)
    sys.exit(0)

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
import harness  # noqa: E402
from coursekit import trees  # noqa: E402
from harness import build  # noqa: E402

os.environ[trees.IMPL_ENV] = sys.argv[1] if len(sys.argv) > 1 else "solutions"
LAB = harness.lab("06")
ops = build.build(LAB.lab, LAB.tree)
for dtype, form in ((torch.float32, "none"), (torch.bfloat16, "none"), (torch.bfloat16, "tanh")):
    x = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, device="cuda", dtype=dtype)
    ops.bias_gelu(x, b, form)
    torch.cuda.synchronize()
    print(f"launched {dtype} {form}", flush=True)
    if dtype == torch.bfloat16:  # the backward's main kernel, for --kernel-name regex:bias_gelu_backward_kernel
        ops.bias_gelu_backward(torch.randn_like(x), x, b, form)
        torch.cuda.synchronize()

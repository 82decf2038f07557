"""Lab 07's RMSNorm backward, the staged kernel against the register kernel, over the staged bucket's shapes.

    ./course run site/data/evidence/07-fused-normalization/staged.py [--impl solutions] [--first]
    (JSON: $OUT/lab07-staged.json)

The staged kernel (solutions/07-fused-normalization/rms_norm.cu, rms_norm_backward_staged_kernel) takes 16-bit rows
of 2049-4096 elements and float rows of 1025-2048 under path='auto'; path='registers' forces the register kernel.
Each shape: both paths' backward (the main kernel and the finalize), milliseconds and % of a copy of the same bytes
(3 tensors: grad_y and x read, grad_x written), timed in turn in one process (coursekit/jit.py's timer, L2
flushed before each call); grad_x of the two paths compared bit for bit first.
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
SHAPES = [((8, 4096, 4096), torch.bfloat16), ((8, 4096, 4096), torch.float16), ((4096, 4096), torch.bfloat16),
          ((32768, 3000), torch.bfloat16), ((32768, 2048), torch.float32), ((65536, 1536), torch.float32),
          ((8, 4096, 2048), torch.bfloat16)]  # the last: the register kernel's E = 8 bucket, 'auto' = 'registers'
if "--first" in sys.argv:  # the shape only (a variant's quick check)
    SHAPES = SHAPES[:1]

jit.ensure_arch_list()
lab = jit.load_lab(ROOT / IMPL / "07-fused-normalization", ROOT)
copy = perf.copy_bandwidth()
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbps": round(copy, 1), "rows": []}
print(f"{out['device']}; copy {copy:.0f} GB/s (1 GiB)")
for shape, dtype in SHAPES:
    x = torch.randn(shape, device="cuda").to(dtype)
    grad_y = torch.randn(shape, device="cuda").to(dtype)
    w = torch.randn(shape[-1], device="cuda").to(dtype)
    _, rstd = lab.rms_norm(x, w, 1e-6)
    rows, n = x.numel() // shape[-1], shape[-1]
    blocks = int(lab.staged_backward_blocks(x.element_size(), rows, n))
    auto_x, _ = lab.rms_norm_backward(grad_y, x, w, rstd, path="auto")
    reg_x, _ = lab.rms_norm_backward(grad_y, x, w, rstd, path="registers")
    same = bool(torch.equal(auto_x, reg_x))
    del auto_x, reg_x
    moved = 3 * x.numel() * x.element_size()
    ms = jit.interleaved_median_ms([lambda: lab.rms_norm_backward(grad_y, x, w, rstd, path="auto"),
                                    lambda: lab.rms_norm_backward(grad_y, x, w, rstd, path="registers")],
                                   warmup=5, reps=30)
    pct = [100 * moved / (m * 1e-3) / 1e9 / copy for m in ms]
    row = {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "staged_blocks": blocks,
           "grad_x_bits_equal": same, "auto_ms": round(ms[0], 4), "registers_ms": round(ms[1], 4),
           "auto_pct_of_copy": round(pct[0], 1), "registers_pct_of_copy": round(pct[1], 1)}
    out["rows"].append(row)
    print(f"  {str(shape):<18} {row['dtype']:<9} staged blocks {blocks:4d}  grad_x equal {same}  auto {ms[0]:.4f} ms "
          f"({pct[0]:5.1f}%)  registers {ms[1]:.4f} ms ({pct[1]:5.1f}%)  {ms[1] / ms[0]:.3f}x", flush=True)
Path(os.environ.get("OUT", "build")).mkdir(parents=True, exist_ok=True)
Path(os.environ.get("OUT", "build"), "lab07-staged.json").write_text(json.dumps(out, indent=1))

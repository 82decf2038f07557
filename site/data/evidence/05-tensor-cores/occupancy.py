"""Lab 05's real residency: blocks per SM of the mma.sync kernel at 4, 6 and 8 stages, as the CUDA runtime
computes it, for the reference (`__launch_bounds__(128, kMinBlocksPerSm = 1)`) and for the same source with
kMinBlocksPerSm = 2, with the registers and shared memory behind each figure; and the time of each build's
4-stage kernel (the one the launcher runs) against cuBLAS at 4096^3 bf16 + GELU.

    ./course run site/data/evidence/05-tensor-cores/occupancy.py [IMPL_DIR]   (default: solutions; 1-2 min, two builds)

Why: __launch_bounds__'s second argument is a minimum number of resident blocks that ptxas
must leave room for by capping its register budget (65536 / (128 * 2) = 256 a thread for 2: no cap below
the 255 a thread may have anyway); it does not limit residency. What fits an SM is set by the registers ptxas
chose and by the shared memory of the stage count: the page's "1 block/SM" and "2 blocks/SM" were the
launch-bounds argument, not residency. Prints, per build and stage count: registers a thread
(cudaFuncGetAttributes.numRegs), static and dynamic shared memory a block, local memory (spills), blocks per SM
(cudaOccupancyMaxActiveBlocksPerMultiprocessor with the stage count's shared memory), and blocks per SM with no
dynamic shared memory (the registers' and threads' limit alone), so the limiter is whichever is smaller.
Stdout only; with $OUT set, also $OUT/lab05_occupancy.json.
"""
from __future__ import annotations

import sys

if {"-h", "--help"} & set(sys.argv[1:]):  # on any machine, GPU or not
    print(__doc__)
    sys.exit(0)

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[4]  # site/data/evidence/05-tensor-cores/
from coursekit import trees  # noqa: E402
from harness import build, perf  # noqa: E402
from harness.mutants import plant  # noqa: E402

SOURCE = sys.argv[1] if len(sys.argv) > 1 else "solutions"
lab = trees.find_lab("05")
MIN_BLOCKS = "constexpr int kMinBlocksPerSm = 1;"
variants = {"kMinBlocksPerSm=1 (reference)": trees.resolve_tree(SOURCE)}
planted = plant(lab, trees.BUILD / "variants" / lab.name / "min-blocks-2",
                [("linear_act.cu", MIN_BLOCKS, MIN_BLOCKS.replace("= 1;", "= 2;"))], source=SOURCE)
variants["kMinBlocksPerSm=2"] = trees.resolve_tree(str(planted))

props = torch.cuda.get_device_properties(0)
print(f"{props.name}: {props.multi_processor_count} SMs, "
      f"{getattr(props, 'regs_per_multiprocessor', '?')} registers / SM, "
      f"{getattr(props, 'shared_memory_per_multiprocessor', 0) // 1024} KiB shared memory / SM, "
      f"{getattr(props, 'shared_memory_per_block_optin', 0) // 1024} KiB a block may opt in to, "
      f"{props.max_threads_per_multi_processor} threads / SM; torch {torch.__version__}")

M = N = K = 4096
x = torch.randn(M, K, device="cuda").bfloat16()
w = (torch.randn(N, K, device="cuda") / K**0.5).bfloat16()
b = torch.randn(N, device="cuda").bfloat16()
flops = 2 * M * N * K
results = {"device": props.name, "builds": {}}
print(f"\n{'build':<30} {'stages':>6} {'regs':>5} {'smem/block':>11} {'local':>6} {'blocks/SM':>9} "
      f"{'regs-only':>9}  limiter")
for name, tree in variants.items():
    module = build.build(lab, tree)
    rows = []
    for stages in (4, 6, 8):
        r = dict(module.residency(stages))
        shared = r["static_shared_bytes"] + r["dynamic_shared_bytes"]
        limiter = ("does not fit" if r["blocks_per_sm"] == 0 else
                   "shared memory" if r["blocks_per_sm"] < r["registers_only_blocks_per_sm"] else
                   "registers (or threads)")
        print(f"{name:<30} {stages:>6} {r['registers']:>5} {shared / 1024:>8.1f} KB {r['local_bytes']:>6} "
              f"{r['blocks_per_sm']:>9} {r['registers_only_blocks_per_sm']:>9}  {limiter}")
        rows.append({**r, "limiter": limiter})
    ours, gemm = perf.time_pair(lambda m=module: m.linear_act(x, w, b, "gelu"), lambda: torch.matmul(x, w.t()),
                                reps=30)
    unfused, _ = perf.time_pair(lambda: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh"),
                                lambda: torch.matmul(x, w.t()), reps=30)
    print(f"{name:<30} 4 stages at 4096^3 bf16 gelu: {ours:.3f} ms ({flops / ours / 1e9:.0f} TFLOP/s), "
          f"{gemm / ours:.3f}x cuBLAS GEMM ({gemm:.3f} ms), {unfused / ours:.3f}x gelu(addmm) ({unfused:.3f} ms)")
    results["builds"][name] = {"residency": rows, "ms": ours, "cublas_gemm_ms": gemm, "gelu_addmm_ms": unfused}

if os.environ.get("OUT"):
    path = Path(os.environ["OUT"]) / "lab05_occupancy.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {path}")

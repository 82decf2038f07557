"""Issue 15: where the decoder block's forward+backward time goes, the course's ops against PyTorch's, kernel by kernel.

    python3 tools/gpu/probe/lab09_block_profile.py [eager|compiled ...]   (JSON to $OUT/lab09-block-profile.json)

The grader's perf case (tests/grader09/speed.py's BLOCK_PERF: batch 8, seqlen 2048, hidden 2048, 16 heads, 4 KV
heads, bf16), its step (forward, then autograd.grad of every parameter and x), run under torch.profiler after
warm-up. Per mode and per ops set: the step's median time by CUDA events (11 runs), then every CUDA kernel's summed
device time over PROFILED_STEPS steps, divided per step, largest first, with a category (gemm, attention, norm, gelu,
elementwise / fused by Inductor, other) so the two columns can be compared category by category: the gap between the
two blocks is then read off a measurement, not guessed.
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("COURSE_IMPL", "solutions")
from grader09 import speed as T  # noqa: E402  (the grader's block, ops and step: one source of truth)

PROFILED_STEPS = 5
CATEGORIES = (("attention", ("flash", "fmha", "attention", "sdpa", "cudnn", "attn")),
              ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas", "matmul", "ampere_", "sm80_")),
              ("norm", ("rms", "norm")),
              ("gelu", ("gelu",)),
              ("inductor fused", ("triton_",)),
              ("elementwise", ("elementwise", "vectorized", "reduce", "copy", "fill", "cat")))


def category(name: str) -> str:
    low = name.lower()
    for label, keys in CATEGORIES:
        if any(k in low for k in keys):
            return label
    return "other"


def median_ms(step, runs: int = 11) -> float:
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels(step) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name] += event.device_time / 1000 / PROFILED_STEPS  # us -> ms per step
    return dict(per_kernel)


def main() -> None:
    modes = sys.argv[1:] or ["eager", "compiled"]
    ops, mod = T.course_ops(), T.block_module()
    case = T.BLOCK_PERF
    block = T._make_block(mod, case, "cuda")
    shape = (case.batch, case.seqlen, case.hidden)
    x = T.random_tensor(shape, case.dtype).requires_grad_()
    grad_y = T.random_tensor(shape, case.dtype)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": list(shape),
              "heads": case.heads, "kv_heads": case.kv_heads, "modes": {}}
    print(f"{report['gpu']}, torch {torch.__version__}, block {shape} h{case.heads} kv{case.kv_heads} bf16")
    for mode in modes:
        torch._dynamo.reset()
        sides = {}
        for side, ops_set in (("course", mod.CourseOps(ops)), ("torch", mod.TorchOps())):
            fn = lambda t, o=ops_set: block(t, o)  # noqa: E731
            if mode == "compiled":
                fn = torch.compile(fn, fullgraph=True)
            step = T._block_step(block, x, grad_y, fn)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            ms = median_ms(step)
            per_kernel = kernels(step)
            by_cat = collections.defaultdict(float)
            for name, t in per_kernel.items():
                by_cat[category(name)] += t
            sides[side] = {"step_ms": ms, "kernel_ms": sum(per_kernel.values()), "by_category": dict(by_cat),
                           "kernels": dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])[:40])}
        report["modes"][mode] = sides
        c, t = sides["course"], sides["torch"]
        print(f"\n== {mode}: step course {c['step_ms']:.3f} ms, torch {t['step_ms']:.3f} ms, "
              f"torch/course {t['step_ms'] / c['step_ms']:.3f}x; kernels summed {c['kernel_ms']:.3f} / "
              f"{t['kernel_ms']:.3f} ms")
        for cat in sorted(set(c["by_category"]) | set(t["by_category"])):
            a, b = c["by_category"].get(cat, 0.0), t["by_category"].get(cat, 0.0)
            print(f"  {cat:<16} course {a:8.3f} ms   torch {b:8.3f} ms   diff {a - b:+8.3f}")
        for side in ("course", "torch"):
            print(f"  -- {side}: top kernels (ms per step)")
            for name, ms in list(sides[side]["kernels"].items())[:18]:
                print(f"    {ms:8.3f}  [{category(name)}] {name[:110]}")
    out = Path(os.environ.get("OUT", "build/gpu-out")) / "lab09-block-profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

"""Lesson 09: where the decoder block's forward+backward time goes, the course's ops against PyTorch's, by kernel.

    ./course run site/data/evidence/09-custom-ops/block_profile.py [eager|compiled ...]
        (GPU; JSON to $OUT/lab09-block-profile.json)
    ./course run site/data/evidence/09-custom-ops/block_profile.py --evidence RAW.json  (no GPU: RAW.json, the GPU run's
        output, summed into the lesson's table, site/data/evidence/09-custom-ops/block_profile.json)

The grader's perf case (test_09 BLOCK_PERF: batch 8, seqlen 2048, hidden 2048, 16 heads, 4 KV heads, bf16), its
step (forward, then autograd.grad of every parameter and x), run under torch.profiler after warm-up. Per mode and
per ops set: the step's median time by CUDA events (11 runs), then every CUDA kernel's summed device time over
PROFILED_STEPS steps, divided per step, largest first, with a category (gemm, attention, norm, gelu, elementwise /
fused by Inductor, other) so the two columns can be compared category by category: the gap between the two blocks
is then read off a measurement, not guessed.
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

ROOT = Path(__file__).resolve().parents[4]
HERE = Path(__file__).resolve().parent
T = None  # tests/grader09/speed.py, imported by main() (the GPU run) only

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


# The lesson's table: (row label, categories summed, or a kernel-name prefix for one kernel's row).
EVIDENCE_ROWS = (
    ("cuBLAS GEMMs (projections, MLP)", ("gemm",)),
    ("attention, all kernels", ("attention",)),
    ("of which the backward's main kernel", "backward-main"),
    ("of which the forward", "forward"),
    ("everything else: bias + GELU, RMSNorm, adds", ("norm", "gelu", "elementwise", "inductor fused", "other")),
)
BACKWARD_MAIN = ("void flash_backward_hopper_impl::flash_backward_hopper_kernel",
                 "void flash_backward_impl::flash_backward_kernel",
                 "cudnn_generated_fort_native_sdpa_sm90_flash_bprop")
FORWARD = ("void flash_forward_hopper_impl::flash_forward_hopper_kernel",
           "cudnn_generated_fort_native_sdpa_sm90_flash_fprop")


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def evidence(raw_path: Path, name: str = "block_profile", source: str | None = None, date: str | None = None) -> None:
    """The GPU run's output summed into the rows the lesson shows (ms per forward+backward step)."""
    raw = json.loads(raw_path.read_text())
    rows = []
    columns = [(mode, side) for mode in ("eager", "compiled") for side in ("course", "torch")]
    for label, what in (("step (CUDA events, median of 11)", "step"), ("all kernels, summed", "kernels"),
                        *EVIDENCE_ROWS):
        row = {"name": label}
        for mode, side in columns:
            data = raw["modes"][mode][side]
            if what == "step":
                value = data["step_ms"]
            elif what == "kernels":
                value = data["kernel_ms"]
            elif isinstance(what, tuple):
                value = sum(data["by_category"].get(c, 0.0) for c in what)
            else:
                prefixes = BACKWARD_MAIN if what == "backward-main" else FORWARD
                value = sum(ms for name, ms in data["kernels"].items() if name.startswith(prefixes))
            row[f"{side}_{mode}"] = round(value, 4)
        rows.append(row)
    step = {f"{side}_{mode}": raw["modes"][mode][side]["step_ms"] for mode, side in columns}
    kern = {f"{side}_{mode}": raw["modes"][mode][side]["kernel_ms"] for mode, side in columns}
    by_name = {r["name"]: r for r in rows}
    bwd = by_name["of which the backward's main kernel"]
    out = {
        "gpu": raw["gpu"], "torch": raw["torch"], "date": date or raw["date"],
        "command": "python3 site/data/evidence/09-custom-ops/block_profile.py eager compiled",
        "source": f"{source or _relative(raw_path)} (the GPU run's output), summed by "
                  "`./course run site/data/evidence/09-custom-ops/block_profile.py --evidence` into these rows",
        "shape": raw["shape"], "heads": raw["heads"], "kv_heads": raw["kv_heads"],
        # derived: PyTorch's step over ours (higher is faster), and the differences the lesson names
        "step_ratio_eager": round(step["torch_eager"] / step["course_eager"], 4),
        "step_ratio_compiled": round(step["torch_compiled"] / step["course_compiled"], 4),
        "attention_behind_compiled_ms": round(by_name["attention, all kernels"]["course_compiled"]
                                              - by_name["attention, all kernels"]["torch_compiled"], 4),
        "backward_main_behind_compiled_ms": round(bwd["course_compiled"] - bwd["torch_compiled"], 4),
        "else_ahead_compiled_ms": round(by_name[EVIDENCE_ROWS[-1][0]]["torch_compiled"]
                                        - by_name[EVIDENCE_ROWS[-1][0]]["course_compiled"], 4),
        # the compiled step's time beyond its kernels' summed time (the step timed without the profiler)
        "between_kernels_compiled_course_ms": round(step["course_compiled"] - kern["course_compiled"], 4),
        "between_kernels_compiled_torch_ms": round(step["torch_compiled"] - kern["torch_compiled"], 4),
        "else_ahead_eager_ms": round(by_name[EVIDENCE_ROWS[-1][0]]["torch_eager"]
                                     - by_name[EVIDENCE_ROWS[-1][0]]["course_eager"], 4),
        "rows": rows,
        "table": {"columns": [["name", "ms per forward+backward step", ""],
                              ["course_eager", "course, eager", ".2f"], ["torch_eager", "PyTorch, eager", ".2f"],
                              ["course_compiled", "course, compiled", ".2f"],
                              ["torch_compiled", "PyTorch, compiled", ".2f"]]},
    }
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def main() -> None:
    if sys.argv[1:2] == ["--evidence"]:
        import argparse

        parser = argparse.ArgumentParser(prog="block_profile.py --evidence")
        default_raw = ROOT / "tools/gpu/results/lab09-block-profile-h100.json"
        parser.add_argument("raw", nargs="?", type=Path, default=default_raw)
        parser.add_argument("--name", default="block_profile", help="evidence file name, without .json")
        parser.add_argument("--source", help="where RAW came from, if not its path (e.g. a file at an older commit)")
        parser.add_argument("--date", help="the run's date, where RAW does not record it")
        a = parser.parse_args(sys.argv[2:])
        evidence(a.raw, a.name, a.source, a.date)
        return
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    global T
    os.environ.setdefault("COURSE_IMPL", "solutions")
    from grader09 import speed  # the grader's block, ops and step: one source of truth

    T = speed
    modes = sys.argv[1:] or ["eager", "compiled"]
    ops, mod = T.course_ops(), T.block_module()
    case = T.BLOCK_PERF
    block = T._make_block(mod, case, "cuda")
    shape = (case.batch, case.seqlen, case.hidden)
    x = T.random_tensor(shape, case.dtype).requires_grad_()
    grad_y = T.random_tensor(shape, case.dtype)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": __import__("datetime").date.today().isoformat(), "shape": list(shape),
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

"""Every figure lesson 06's page quotes, measured in one process on the GPU box.

    ./course run site/data/evidence/06-fused-elementwise/page.py [IMPL_DIR]
    (default: solutions; JSON to $OUT/lab06-page.json)

At x = (8192, 8192), float32 and bfloat16 (S = the bytes of one such tensor):
  - times: the fused forward (16-byte and scalar kernels), eager F.gelu(x + b), torch.compile of it; the fused
    backward, eager autograd's backward, compiled backward; forward + backward through each; the backward on a
    saved u = x + b (zero bias) against the one that recomputes it, and what writing u costs the forward;
  - GB/s from the bytes each version moves (fused forward 2S, eager forward 4S, fused backward 3S, eager
    backward 4S) against a device-to-device copy, the measured ceiling;
  - the kernels each version launches, from torch.profiler (names and microseconds): the fused backward's two
    kernels, Inductor's Triton kernels;
  - peak memory above the baseline for forward + backward, unfused / fused / compiled, on a live x and after a
    bias-free linear layer;
  - the first (compiling) call of torch.compile, forward and backward.
"""
from __future__ import annotations

import sys

if {"-h", "--help"} & set(sys.argv[1:]):  # on any machine, GPU or not
    print(__doc__)
    sys.exit(0)

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[4]
import harness  # noqa: E402
from coursekit import jit, trees  # noqa: E402
from harness import build, perf  # noqa: E402

os.environ[trees.IMPL_ENV] = sys.argv[1] if len(sys.argv) > 1 else "solutions"  # the tree harness.lab("06") takes

SHAPE = (8192, 8192)
REPS = 30
LAB = harness.lab("06")
ops = build.build(LAB.lab, LAB.tree)  # the raw module: LAB.module's per-call input checks would be timed too
bias_gelu = LAB.python("autograd").bias_gelu
results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": list(SHAPE)}
copy_gbps = perf.copy_bandwidth()
results["copy_gbps"] = round(copy_gbps, 1)
print(f"{results['device']}, torch {torch.__version__}; copy ceiling {copy_gbps:.0f} GB/s")


def timed(fns: dict) -> dict:
    ms = jit.interleaved_median_ms(list(fns.values()), warmup=5, reps=REPS)
    return dict(zip(fns, ms))


def report(label: str, ms: float, nbytes: int) -> dict:
    gbps = nbytes / (ms * 1e-3) / 1e9
    print(f"    {label:<44} {ms:8.4f} ms  {gbps:7.0f} GB/s  {100 * gbps / copy_gbps:5.1f}% of copy")
    return {"ms": round(ms, 4), "gbps": round(gbps, 1), "pct_of_copy": round(100 * gbps / copy_gbps, 1)}


def kernels(fn, label: str) -> list[dict]:
    """The CUDA kernels one call of fn launches, with their device time (torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [{"name": e.key[:90], "us": round(e.device_time_total, 1)} for e in prof.key_averages()
            if e.device_time_total > 0]
    print(f"    kernels of {label}: " + "; ".join(f"{r['name']} {r['us']} us" for r in rows))
    return rows


def peak_mib(run) -> float:
    """MiB allocated at run()'s peak above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(dtype: torch.dtype) -> dict:
    """Every figure for one dtype (a function, so that its tensors are freed when it returns)."""
    name = str(dtype).removeprefix("torch.")
    print(f"\n{name} {SHAPE}")
    x = torch.randn(SHAPE, device="cuda", dtype=dtype)
    b = torch.randn(SHAPE[1], device="cuda", dtype=dtype)
    g = torch.randn(SHAPE, device="cuda", dtype=dtype)
    S = x.numel() * x.element_size()
    row = {"S_MiB": S / 2**20}

    def eager_fwd(x, b):
        return F.gelu(x + b)

    compiled_fwd = torch.compile(eager_fwd)
    torch._dynamo.reset()
    start = time.perf_counter()
    compiled_fwd(x, b)
    torch.cuda.synchronize()
    row["compile_first_forward_s"] = round(time.perf_counter() - start, 2)

    t = timed({"fused": lambda: ops.bias_gelu(x, b), "scalar": lambda: ops.bias_gelu(x, b, "none", False),
               "eager": lambda: eager_fwd(x, b), "compiled": lambda: compiled_fwd(x, b)})
    print("  forward (erf form)")
    row["forward"] = {"fused": report("fused, 16-byte kernel (2S)", t["fused"], 2 * S),
                      "scalar": report("fused, scalar kernel (2S)", t["scalar"], 2 * S),
                      "eager": report("eager F.gelu(x + b) (4S)", t["eager"], 4 * S),
                      "compiled": report("torch.compile(F.gelu(x + b)) (2S)", t["compiled"], 2 * S)}
    t_tanh = timed({"fused": lambda: ops.bias_gelu(x, b, "tanh"),
                    "eager": lambda: F.gelu(x + b, approximate="tanh")})
    print("  forward (tanh form)")
    row["forward_tanh"] = {"fused": report("fused, 16-byte kernel (2S)", t_tanh["fused"], 2 * S),
                           "eager": report("eager (4S)", t_tanh["eager"], 4 * S)}

    # Backward alone: autograd's graph built once, run again with retain_graph.
    xr, br = x.clone().requires_grad_(), b.clone().requires_grad_()
    y_eager = eager_fwd(xr, br)
    y_compiled = compiled_fwd(xr, br)
    start = time.perf_counter()
    torch.autograd.grad(y_compiled, (xr, br), g, retain_graph=True)
    torch.cuda.synchronize()
    row["compile_first_backward_s"] = round(time.perf_counter() - start, 2)
    u = (x + b).contiguous()
    zeros = torch.zeros_like(b)
    t = timed({"fused": lambda: ops.bias_gelu_backward(g, x, b),
               "fused_saved_u": lambda: ops.bias_gelu_backward(g, u, zeros),
               "eager": lambda: torch.autograd.grad(y_eager, (xr, br), g, retain_graph=True),
               "compiled": lambda: torch.autograd.grad(y_compiled, (xr, br), g, retain_graph=True),
               "write_u": lambda: torch.add(x, b)})
    print("  backward (erf form)")
    row["backward"] = {"fused": report("fused (3S)", t["fused"], 3 * S),
                       "fused_saved_u": report("fused on a saved u, zero bias (3S)", t["fused_saved_u"], 3 * S),
                       "eager": report("eager autograd (gelu_backward + sum: 4S)", t["eager"], 4 * S),
                       "compiled": report("compiled autograd (3S if fused)", t["compiled"], 3 * S),
                       "write_u_in_forward": report("the forward's extra t = x + b (2S)", t["write_u"], 2 * S)}

    def ours_fwd_bwd():
        y = bias_gelu(xr, br, ops=ops)
        return torch.autograd.grad(y, (xr, br), g)

    def eager_fwd_bwd():
        return torch.autograd.grad(eager_fwd(xr, br), (xr, br), g)

    def compiled_fwd_bwd():
        return torch.autograd.grad(compiled_fwd(xr, br), (xr, br), g)

    t = timed({"fused": ours_fwd_bwd, "eager": eager_fwd_bwd, "compiled": compiled_fwd_bwd})
    print("  forward + backward through autograd")
    row["forward_backward"] = {"fused": report("autograd.Function (5S)", t["fused"], 5 * S),
                               "eager": report("eager (8S)", t["eager"], 8 * S),
                               "compiled": report("torch.compile (5S if fused)", t["compiled"], 5 * S)}
    row["kernels"] = {"fused_backward": kernels(lambda: ops.bias_gelu_backward(g, x, b), "the fused backward"),
                      "compiled_forward": kernels(lambda: compiled_fwd(x, b), "the compiled forward"),
                      "compiled_backward": kernels(
                          lambda: torch.autograd.grad(y_compiled, (xr, br), g, retain_graph=True),
                          "the compiled backward"),
                      "eager_backward": kernels(lambda: torch.autograd.grad(y_eager, (xr, br), g, retain_graph=True),
                                                "eager autograd's backward")}

    # Peak memory of forward + backward above what is allocated before (x, b, g live throughout).
    def live_x(fn):
        xg, bg = x.clone().requires_grad_(), b.clone().requires_grad_()
        return peak_mib(lambda: fn(xg, bg).backward(g))

    row["peak_live_x_MiB"] = {k: round(live_x(f), 1) for k, f in (
        ("eager", eager_fwd), ("fused", lambda xg, bg: bias_gelu(xg, bg, ops=ops)), ("compiled", compiled_fwd))}
    inp = torch.randn(SHAPE[0], 1024, device="cuda", dtype=dtype)
    weight = (torch.randn(SHAPE[1], 1024, device="cuda", dtype=dtype) / 32)

    def layer(fn):
        wg, bg = weight.clone().requires_grad_(), b.clone().requires_grad_()
        return peak_mib(lambda: fn(inp @ wg.t(), bg).backward(g))

    row["peak_layer_MiB"] = {k: round(layer(f), 1) for k, f in (
        ("eager", eager_fwd), ("fused", lambda h, bg: bias_gelu(h, bg, ops=ops)), ("compiled", compiled_fwd))}
    print(f"  peak MiB above baseline, forward + backward (S = {S / 2**20:.0f} MiB): live x {row['peak_live_x_MiB']}; "
          f"after a linear layer {row['peak_layer_MiB']}")
    print(f"  first compiled call: forward {row['compile_first_forward_s']} s, backward "
          f"{row['compile_first_backward_s']} s")
    return row



for dtype in (torch.float32, torch.bfloat16):
    results[str(dtype).removeprefix("torch.")] = measure(dtype)
    torch.cuda.empty_cache()

out = Path(os.environ.get("OUT", trees.BUILD)) / "lab06-page.json"
out.write_text(json.dumps(results, indent=1))
print(f"\nwrote {out}")

"""Lab 10's first launches, one case at a time, before the grader runs (issue 18): which case fails, and how.

    timeout 60 ./course run site/data/evidence/10-cutlass/smoke.py [--impl solutions] [--skip-perf]

Step 3 of first_run.sh (beside this file), between the build and `./course test 10`. The CUTLASS kernel had never
run; if it hangs or faults, the grader's log says little about where. Here each case is launched alone, smallest
first, synchronized and printed before the next: the last line printed before a hang names the case that hung; a
CUDA error (the context is then lost) stops the pass. Per case: whether the grader's own check_output passes
(tests/test_10_cutlass.py: float64 reference, per-element tolerance, flash rule), the NaN count (out comes from a
NaN buffer: NaN = never written), rows past M written, and, when wrong, which of a few wrong formulas the output is
closest to (no GELU, no bias, bias on the wrong axis, acc alone, gelu(bias) alone), so one run points at the EVT
node or argument at fault. Then the CUDA-graph replay (the current stream) and, unless --skip-perf, 4096^3 against
torch.matmul and gelu(addmm) (CUDA events, L2 flushed, median of 25: coursekit.jit.interleaved_median_ms).
Results also go to $OUT/lab10_smoke.json, written even when a case fails (not when the process is killed: its
absence means a hang or a crash, and first_run.sh then skips the grader's steps).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]  # site/data/evidence/10-cutlass/smoke.py: the repository root

# Smallest first: a fault or a hang shows on the cheapest case. (128, 256, 64) is one whole tile; (1, 8, 8) leaves
# the second block of the 2 x 1 cluster with no rows at all; (4100, 2056, 72) has more tiles than SMs.
CASES = [(1, 8, 8), (17, 40, 24), (128, 256, 64), (31, 136, 72), (129, 264, 520), (1000, 1000, 1000),
         (129, 264, 4104), (4100, 2056, 72), (2048, 2048, 2048)]
CUDA_ERROR_WORDS = ("CUDA error", "cudaError", "illegal", "unspecified launch failure", "misaligned address")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="solutions", help="the tree to build (default: solutions)")
    parser.add_argument("--skip-perf", action="store_true", help="no 4096^3 timing")
    args = parser.parse_args()
    os.environ["COURSE_IMPL"] = args.impl  # the grader's LAB handle (check_output's tile) is this build
    import test_10_cutlass as T
    import torch
    import torch.nn.functional as F

    from coursekit import trees
    from coursekit.jit import interleaved_median_ms
    from harness import build

    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    out_dir = os.environ.get("OUT")

    def save() -> None:
        if out_dir:
            Path(out_dir, "lab10_smoke.json").write_text(json.dumps(results, indent=1))

    try:
        started = time.perf_counter()
        module = build.build(trees.find_lab("10"), trees.resolve_tree(args.impl))
        results["load_s"] = round(time.perf_counter() - started, 1)
        results["config"] = module.config()
        results["available"] = module.available()
        results["workspace_bytes"] = {f"{m}x{n}x{k}": module.workspace_bytes(m, n, k)
                                      for m, n, k in ((1, 8, 8), (4096, 4096, 4096))}
        print(f"{results['device']}, torch {torch.__version__}, arch list {os.environ.get('TORCH_CUDA_ARCH_LIST')}, "
              f"module loaded in {results['load_s']} s", flush=True)
        print(f"config {results['config']}, available {results['available']}, "
              f"workspace bytes {results['workspace_bytes']}", flush=True)
        print(f"epilogue tree: {module.epilogue_tree()[:600]}", flush=True)
        if not results["available"]:
            print("FAIL the CUTLASS kernel is not available here (needs compute capability 9.0 and a 9.0a build)")
            return 1
        failures = 0
        for m, n, k in CASES:
            case = f"{m}x{n}x{k}"
            row: dict = {"case": case}
            results["cases"].append(row)
            x, weight, bias = T.make_inputs(m, n, k)
            buffer = torch.full((m + 128, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            t0 = time.perf_counter()
            try:
                T.LAB.module.gemm_bias_gelu(x, weight, bias, out=buffer[:m])
                torch.cuda.synchronize()
            except Exception as error:  # can_implement / initialize / run status, or a CUDA error
                row["error"] = f"{type(error).__name__}: {error}"
                print(f"FAIL {case}: {row['error'][:800]}", flush=True)
                failures += 1
                if any(word in str(error) for word in CUDA_ERROR_WORDS):
                    print("  a CUDA error: the context is lost, stopping here", flush=True)
                    save()
                    return 1
                continue
            row["first_call_s"] = round(time.perf_counter() - t0, 3)
            out = buffer[:m]
            row["nan"] = int(out.isnan().sum())
            row["past_m_written"] = int((~buffer[m:].isnan()).sum())
            try:
                T.check_output(out, x, weight, bias, case=f"smoke {case}")
                row["ok"] = True
            except AssertionError as error:
                row["ok"] = False
                row["check"] = str(error)[:1500]
            if not row["ok"] or row["past_m_written"]:
                failures += 1
                # Which formula is the output closest to? Relative Frobenius distance, NaNs left out.
                acc = x.double() @ weight.double().t()
                b = bias.double()
                gelu = lambda v: F.gelu(v, approximate="tanh")  # noqa: E731
                candidates = {"right: gelu(acc + bias[n])": gelu(acc + b), "no GELU: acc + bias": acc + b,
                              "no bias: gelu(acc)": gelu(acc), "acc alone": acc,
                              "no acc: gelu(bias)": gelu(b).expand(m, n)}
                if m == n:
                    candidates["bias along M: gelu(acc + bias[m])"] = gelu(acc + b[:, None])
                finite = ~out.isnan()
                got = out.double()[finite]
                row["distance"] = {name: float((got - c[finite]).norm() / c[finite].norm().clamp_min(1e-30))
                                   for name, c in candidates.items()}
                closest = min(row["distance"], key=row["distance"].get)
                right = row["distance"][next(iter(candidates))]
                print(f"FAIL {case}: nan {row['nan']}, rows past M written {row['past_m_written']}, closest to "
                      f"'{closest}' ({row['distance'][closest]:.2e}; the right one {right:.2e})"
                      f"\n  {row.get('check', '')[:600]}", flush=True)
            else:
                print(f"ok   {case} ({row['first_call_s']} s first call)", flush=True)
        # The CUDA graph replay on fresh inputs (the grader's test_runs_on_current_stream).
        try:
            x, weight, bias = T.make_inputs(129, 264, 520)
            out = T.LAB.capture_on_current_stream(lambda: T.LAB.module.gemm_bias_gelu(x, weight, bias),
                                                  inputs=(x, weight, bias), case="smoke graph")
            T.check_output(out, x, weight, bias, case="smoke: replayed from a CUDA graph")
            results["graph"] = "ok"
        except Exception as error:
            results["graph"] = f"{type(error).__name__}: {str(error)[:800]}"
            failures += 1
        print(f"graph replay: {results['graph']}", flush=True)
        if not args.skip_perf:
            m = n = k = 4096
            x, weight, bias = T.make_inputs(m, n, k)
            # The raw module: T.LAB.module's call checks copy the inputs to the host on every call.
            fns = {"cutlass gemm_bias_gelu": lambda: module.gemm_bias_gelu(x, weight, bias),
                   "torch.matmul (cuBLAS)": lambda: torch.matmul(x, weight.t()),
                   "gelu(addmm)": lambda: F.gelu(torch.addmm(bias, x, weight.t()), approximate="tanh")}
            times = interleaved_median_ms(list(fns.values()))
            results["perf_4096"] = {}
            for (name, _), ms in zip(fns.items(), times):
                tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
                results["perf_4096"][name] = {"ms": round(ms, 4), "tflops": round(tflops, 1)}
                print(f"4096^3 {name:24s} {ms:8.3f} ms {tflops:7.1f} TFLOP/s  {times[1] / ms:5.2f}x cuBLAS", flush=True)
        print(f"smoke: {failures} failure(s)", flush=True)
        return 1 if failures else 0
    except Exception:
        results["exception"] = traceback.format_exc()[-3000:]
        print(results["exception"], flush=True)
        return 1
    finally:
        save()


if __name__ == "__main__":
    sys.exit(main())

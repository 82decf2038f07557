"""Lab 08's Hopper forward (flash_forward_hopper.cu) on the GPU box: correctness, then speed, one process.

    timeout 170 ./course run tools/gpu/probe/lab08_hopper.py [--quick] [--skip-perf] [--impl solutions]

Builds lab 08 (the solutions tree unless --impl says otherwise; TORCH_CUDA_ARCH_LIST=9.0a on an H100/H200).
Correctness: both Hopper pipelines (path='hopper_simple', 'hopper_overlap') on the grader's shapes (test_08's
SMALL_SEQLENS and BIG_SEQLENS, its GQA heads, its strided layouts, two scales), each checked by the grader's own
check_forward (float64 golden, the flash rule against PyTorch's same-dtype attention, lse, rows that see no key),
outputs from a poisoned pool; path='auto' must give the Hopper kernel's bits. One line per case: "ok" or
"FAIL <path> <case>: <why>". A CUDA error stops the correctness pass (the context is lost) and skips the timings.
Speed: (8, 16, 4096 and 8192, 64 and 128) bfloat16, causal and not: the Hopper kernel (both pipelines), rung 3
(path='portable'), SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backends; CUDA events, warm-up, median
(coursekit.jit.interleaved_median_ms), TFLOP/s counting 4 B H Sq Sk D (halved when causal) and ratios. --quick: a
subset that runs in about a minute. Results also go to $OUT/lab08_hopper.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a subset: about a minute")
    parser.add_argument("--skip-perf", action="store_true", help="correctness only")
    parser.add_argument("--impl", default="solutions", help="the tree to build (default: solutions)")
    args = parser.parse_args()
    os.environ["COURSE_IMPL"] = args.impl  # the grader's LAB handle (check_forward's tiles) is this build
    import torch
    from grader08 import common as T

    import harness
    from coursekit import trees
    from coursekit.jit import interleaved_median_ms
    from harness import build
    from harness.attention import make_qkv

    started = time.perf_counter()
    lab = trees.find_lab("08")
    module = build.build(lab, trees.resolve_tree(args.impl))
    print(f"[build] lab 08 from {args.impl} in {time.perf_counter() - started:.0f} s, "
          f"arch list {os.environ.get('TORCH_CUDA_ARCH_LIST')}", flush=True)
    device = torch.cuda.get_device_name()
    available = module.flash_forward_hopper_available()
    constants = module.constants()
    print(f"{device}, torch {torch.__version__}, Hopper path available: {available}")
    for d in (64, 128):
        print(f"  d{d}: hopper tile {constants[f'hopper_block_m_d{d}']}x{constants[f'hopper_block_n_d{d}']}, "
              f"{constants[f'hopper_warps_d{d}']} warps, {constants[f'hopper_stages_d{d}']} stages, "
              f"{constants[f'hopper_shared_bytes_d{d}']} B shared; portable {constants[f'forward_block_m_d{d}']}x"
              f"{constants[f'forward_block_n_d{d}']}")
    if not available:
        print("FAIL the Hopper path is not available here (needs compute capability 9.0 and a 9.0a build)")
        return 1
    results = {"device": device, "torch": torch.__version__, "correctness": [], "perf": []}
    failures = 0
    paths = ("hopper_simple", "hopper_overlap")

    # ------------------------------------------------------------ correctness
    BF16, FP16 = torch.bfloat16, torch.float16
    cases = []  # (seqlens, dtype, head_dim, causal, heads, layout, scale)
    small = T.SMALL_SEQLENS if not args.quick else [(1, 1), (113, 203), (203, 113), (1023, 1024)]
    for s in small:
        for dtype in ((BF16, FP16) if not args.quick else (BF16,)):
            for d in (64, 128):
                for causal in (False, True):
                    cases.append((s, dtype, d, causal, T.main_heads(s), "contiguous", None))
    for s in (T.BIG_SEQLENS if not args.quick else T.BIG_SEQLENS[:1]):
        for d in (64, 128):
            for causal in (False, True):
                cases.append((s, BF16, d, causal, T.main_heads(s), "contiguous", None))
    for heads in (T.HEADS if not args.quick else [(1, 8, 2), (2, 4, 1)]):
        for s, causal in T.HEADS_SEQLENS:
            for d in (64, 128):
                cases.append((s, BF16, d, causal, heads, "contiguous", None))
    for layout, heads in (T.STRIDED if not args.quick else T.STRIDED[:2]):
        cases.append(((200, 200), BF16, 64, True, heads, layout, None))
        cases.append(((200, 200), FP16, 128, True, heads, layout, None))
    for scale in T.SCALES:
        cases.append(((113, 203), BF16, 128, True, (2, 3, 3), "contiguous", scale))

    def call(path, q, k, v, causal, scale, case):
        sizes = [T.nbytes(q), T._lse_bytes(q)]
        with harness.check.PoisonedPool(large_bytes=T._pool_bytes(*sizes)) as pool:
            o, lse = module.flash_forward(q, k, v, causal, scale, path)
        torch.cuda.synchronize()  # a launch or kernel error surfaces here, on its own case
        pool.assert_no_spill(o, name="o", case=case)
        pool.assert_no_spill(lse, name="lse", case=case)
        return o, lse

    fatal = False
    checked = 0
    t0 = time.perf_counter()
    for seqlens, dtype, d, causal, heads, layout, scale in cases:
        torch.manual_seed(0)
        q, k, v = make_qkv(heads[0], *seqlens, heads[1], heads[2], d, dtype, layout)
        base = T.describe(q, k, causal=causal, scale=scale, layout=layout)
        gold = T.golden(q, k, v, causal, scale)
        outputs = {}
        for path in paths:
            case = f"flash_forward path='{path}' of {base}"
            try:
                o, lse = call(path, q, k, v, causal, scale, case)
                outputs[path] = (o, lse)
                T.check_forward(o, lse, q, k, v, causal=causal, scale=scale, rung="forward", case=case,
                                hint="the Hopper kernel (flash_forward_hopper.cu)", gold=gold)
                status = "ok"
            except harness.GradeFailure as error:
                status = "FAIL " + " | ".join(str(error).splitlines()[:3])
            except Exception as error:  # noqa: BLE001 - a CUDA error: the context is gone, stop here
                status = f"FAIL (error) {type(error).__name__}: " + " | ".join(str(error).splitlines()[:3])
                fatal = "CUDA" in str(error) or "cuda" in str(error)
            checked += 1
            if status != "ok":
                failures += 1
                print(f"FAIL {path} {base}: {status[5:]}", flush=True)
            else:
                print(f"ok   {path} {base}", flush=True)
            results["correctness"].append({"path": path, "case": base, "status": status})
            if fatal:
                break
        if fatal:
            print("FAIL a CUDA error ended the correctness pass; timings skipped")
            break
        if "hopper_overlap" in outputs:  # 'auto' must pick the Hopper kernel here: the same bits
            try:
                o_auto, lse_auto = call("auto", q, k, v, causal, scale, f"path='auto' of {base}")
                o_h, lse_h = outputs["hopper_overlap"]
                same = torch.equal(o_auto, o_h) and torch.equal(lse_auto.nan_to_num(), lse_h.nan_to_num())
                if not same:
                    failures += 1
                    print(f"FAIL auto {base}: path='auto' does not give path='hopper_overlap''s bits")
            except Exception as error:  # noqa: BLE001
                failures += 1
                print(f"FAIL auto {base}: {type(error).__name__}: {str(error).splitlines()[0]}")
    print(f"[correctness] {checked} calls checked, {failures} failures, {time.perf_counter() - t0:.0f} s", flush=True)

    # ------------------------------------------------------------ speed
    if not args.skip_perf and not fatal:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        shapes = [(8, 16, s, d) for s in (4096, 8192) for d in (64, 128)]
        if args.quick:
            shapes = [(8, 16, 4096, 128), (8, 16, 4096, 64)]
        reps = 10 if args.quick else 20
        print(f"\n{'shape (B, H, S, D)':<22} {'mask':<9} {'kernel':<16} {'ms':>8} {'TFLOP/s':>8} "
              f"{'x portable':>10} {'x FA2':>6} {'x cuDNN':>8}")
        for batch, heads, seqlen, d in shapes:
            for causal in (False, True):
                q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=BF16) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (B, H, S, D), same storage

                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    return run

                fns = {
                    "hopper_simple": lambda: module.flash_forward(q, k, v, causal, None, "hopper_simple"),
                    "hopper_overlap": lambda: module.flash_forward(q, k, v, causal, None, "hopper_overlap"),
                    "portable": lambda: module.flash_forward(q, k, v, causal, None, "portable"),
                    "sdpa_flash (FA2)": sdpa(SDPBackend.FLASH_ATTENTION),
                    "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                }
                usable = {}
                for name, fn in fns.items():
                    try:
                        fn()
                        torch.cuda.synchronize()
                        usable[name] = fn
                    except Exception as error:  # noqa: BLE001 - a backend SDPA does not offer here
                        print(f"  {name}: unavailable ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
                # Sanity at the timed shape: the Hopper outputs against rung 3's (no float64 golden at this size).
                ref = module.flash_forward(q, k, v, causal, None, "portable")
                for path in paths:
                    o, lse = module.flash_forward(q, k, v, causal, None, path)
                    diff_o = (o.float() - ref[0].float()).abs().max().item()
                    diff_l = (lse - ref[1]).abs().max().item()
                    bad = not (diff_o < 2e-2 and diff_l < 1e-3)
                    failures += bad
                    print(f"  {'FAIL' if bad else 'ok  '} {path} vs portable at this shape: max |o diff| "
                          f"{diff_o:.2e}, max |lse diff| {diff_l:.2e}")
                names = list(usable)
                times = dict(zip(names, interleaved_median_ms([usable[n] for n in names], warmup=3, reps=reps)))
                flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
                for name in names:
                    ms = times[name]
                    ratio = lambda other: f"{times[other] / ms:.2f}" if other in times else "-"  # noqa: E731
                    print(f"{str((batch, heads, seqlen, d)):<22} {'causal' if causal else 'full':<9} {name:<16} "
                          f"{ms:8.3f} {flops / ms / 1e9:8.1f} {ratio('portable'):>10} {ratio('sdpa_flash (FA2)'):>6} "
                          f"{ratio('sdpa_cudnn'):>8}", flush=True)
                    results["perf"].append({"batch": batch, "heads": heads, "seqlen": seqlen, "head_dim": d,
                                            "causal": causal, "kernel": name, "ms": ms,
                                            "tflops": flops / ms / 1e9})
                del q, k, v, qt, kt, vt
                torch.cuda.empty_cache()
    results["failures"] = failures
    out = os.environ.get("OUT")
    if out:
        Path(out, "lab08_hopper.json").write_text(json.dumps(results, indent=1))
    print(f"\n[done] {failures} failures, {time.perf_counter() - started:.0f} s in all")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

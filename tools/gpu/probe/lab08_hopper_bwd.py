"""Lab 08's Hopper backward (flash_backward_hopper.cu) on the GPU box: correctness, then speed, one process.

    timeout 170 ./course run tools/gpu/probe/lab08_hopper_bwd.py [--quick] [--skip-perf] [--impl solutions]

Builds lab 08 (the solutions tree unless --impl says otherwise; TORCH_CUDA_ARCH_LIST=9.0a on an H100/H200).
Correctness: flash_backward(path='hopper') on the grader's backward shapes (test_08's SMALL_SEQLENS, both 16-bit
dtypes, d 64 and 128, causal or not; BIG_SEQLENS; its GQA heads; its strided layouts; two scales), each checked by
the grader's own check_backward (float64 golden with D from the given o, the flash rule against PyTorch's same-dtype
backward, blind rows' grad_q = 0), outputs from a poisoned pool; grad_k and grad_v must be bitwise equal over two
calls (no atomics touch them), and path='auto' must give the Hopper kernel's grad_k, grad_v bits. One line per case:
"ok" or "FAIL <case>: <why>". A CUDA error stops the correctness pass (the context is lost) and skips the timings.
Speed: the backward alone (o, lse from the forward, outside the timing) at (8, 16, 4096, d 128) with 16 kv heads,
causal and not, and at lesson 09's block shape (batch 8, seqlen 2048, 16 query heads, 4 kv heads, d 128, causal):
path='hopper', path='portable', SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backward (torch.autograd.grad of a
retained graph, enable_gqa=True); CUDA events, warm-up, median (coursekit.jit.interleaved_median_ms); TFLOP/s
counting 2.5 x the forward's 4 B H Sq Sk D (halved when causal). Results also go to $OUT/lab08_hopper_bwd.json
when OUT is set.
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
    os.environ["COURSE_IMPL"] = args.impl
    import torch
    from grader08 import common as T

    import harness
    from coursekit import trees
    from coursekit.jit import interleaved_median_ms
    from harness import attention, build
    from harness.attention import make_qkv

    started = time.perf_counter()
    lab = trees.find_lab("08")
    module = build.build(lab, trees.resolve_tree(args.impl))
    print(f"[build] lab 08 from {args.impl} in {time.perf_counter() - started:.0f} s, "
          f"arch list {os.environ.get('TORCH_CUDA_ARCH_LIST')}", flush=True)
    device = torch.cuda.get_device_name()
    constants = module.constants()
    print(f"{device}, torch {torch.__version__}, Hopper forward available: {module.flash_forward_hopper_available()}")
    for d in (64, 128):
        c = {key[:-len(f"_d{d}")]: value for key, value in constants.items() if key.endswith(f"_d{d}")}
        print(f"  d{d}: hopper backward {c['hopper_backward_block_m']} queries x {c['hopper_backward_block_n']} keys, "
              f"{c['hopper_backward_warps']} warps, {c['hopper_backward_stages']} stages, "
              f"{c['hopper_backward_shared_bytes']} B shared; portable {c['backward_block_m']} x "
              f"{c['backward_block_n']}")
    results = {"device": device, "torch": torch.__version__, "correctness": [], "perf": []}
    failures = 0

    # ------------------------------------------------------------ correctness
    BF16, FP16 = torch.bfloat16, torch.float16
    cases = []  # (seqlens, dtype, head_dim, causal, heads, layout, scale)
    small = T.SMALL_SEQLENS if not args.quick else [(1, 1), (113, 203), (203, 113), (128, 217)]
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

    def call(path, grad_o, q, k, v, o, lse, causal, scale, case):
        sizes = [T.nbytes(q), T.nbytes(k), T.nbytes(v), T._lse_bytes(q), q.numel() * 4]
        with harness.check.PoisonedPool(large_bytes=T._pool_bytes(*sizes)) as pool:
            grads = module.flash_backward(grad_o, q, k, v, o, lse, causal, scale, False, path)
        torch.cuda.synchronize()  # a launch or kernel error surfaces here, on its own case
        for name, got in zip(("grad_q", "grad_k", "grad_v"), grads):
            pool.assert_no_spill(got, name=name, case=case)
        return grads

    fatal = False
    checked = 0
    t0 = time.perf_counter()
    for seqlens, dtype, d, causal, heads, layout, scale in cases:
        torch.manual_seed(0)
        q, k, v = make_qkv(heads[0], *seqlens, heads[1], heads[2], d, dtype, layout)
        grad_o = T.randn(q.shape, dtype)
        o = attention.same_dtype_attention(q, k, v, causal, scale).contiguous()
        gold = T.golden(q, k, v, causal, scale, grad_o=grad_o, o=o)
        lse = gold["lse"].float()
        base = T.describe(q, k, causal=causal, scale=scale, layout=layout)
        case = f"flash_backward path='hopper' of {base}"
        try:
            grads = call("hopper", grad_o, q, k, v, o, lse, causal, scale, case)
            T.check_backward(grads, grad_o, q, k, v, o, causal=causal, scale=scale, case=case,
                             hint="the Hopper kernel (flash_backward_hopper.cu)", gold=gold)
            again = call("hopper", grad_o, q, k, v, o, lse, causal, scale, case)
            auto = call("auto", grad_o, q, k, v, o, lse, causal, scale, case)
            for name, i in (("grad_k", 1), ("grad_v", 2)):
                if not torch.equal(grads[i], again[i]):
                    raise harness.GradeFailure(f"{name} differs between two calls (it must be deterministic)")
                if not torch.equal(grads[i], auto[i]):
                    raise harness.GradeFailure(f"path='auto' does not give path='hopper''s {name} bits")
            status = "ok"
        except harness.GradeFailure as error:
            status = "FAIL " + " | ".join(str(error).splitlines()[:3])
        except Exception as error:  # noqa: BLE001 - a CUDA error: the context is gone, stop here
            status = f"FAIL (error) {type(error).__name__}: " + " | ".join(str(error).splitlines()[:3])
            fatal = "CUDA" in str(error) or "cuda" in str(error)
        checked += 1
        if status != "ok":
            failures += 1
        print(f"{'ok  ' if status == 'ok' else 'FAIL'} {base}{'' if status == 'ok' else ': ' + status[5:]}",
              flush=True)
        results["correctness"].append({"case": base, "status": status})
        if fatal:
            print("FAIL a CUDA error ended the correctness pass; timings skipped")
            break
    print(f"[correctness] {checked} cases checked, {failures} failures, {time.perf_counter() - t0:.0f} s", flush=True)

    # ------------------------------------------------------------ speed
    if not args.skip_perf and not fatal:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # (batch, heads_q, heads_kv, seqlen, head_dim, causal)
        shapes = [(8, 16, 4, 2048, 128, True), (8, 16, 16, 4096, 128, True), (8, 16, 16, 4096, 128, False)]
        if args.quick:
            shapes = shapes[:1]
        reps = 10 if args.quick else 20
        print(f"\n{'shape (B, Hq, Hkv, S, D)':<26} {'mask':<7} {'kernel':<17} {'ms':>8} {'TFLOP/s':>8} "
              f"{'x portable':>10} {'x FA2':>6} {'x cuDNN':>8}")
        for batch, heads_q, heads_kv, seqlen, d, causal in shapes:
            torch.manual_seed(0)
            q = torch.randn(batch, seqlen, heads_q, d, device="cuda", dtype=BF16)
            k, v = (torch.randn(batch, seqlen, heads_kv, d, device="cuda", dtype=BF16) for _ in range(2))
            grad_o = torch.randn_like(q)
            o, lse = module.flash_forward(q, k, v, causal, None, "portable")

            def ours(path):
                return lambda: module.flash_backward(grad_o, q, k, v, o, lse, causal, None, False, path)

            def sdpa(backend):
                leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]  # (B, H, S, D) views
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=heads_q != heads_kv)
                g = grad_o.transpose(1, 2)

                def run():
                    with sdpa_kernel(backend):
                        return torch.autograd.grad(out, leaves, g, retain_graph=True)
                return run

            fns = {"hopper": ours("hopper"), "portable": ours("portable")}
            for name, backend in (("sdpa_flash (FA2)", SDPBackend.FLASH_ATTENTION),
                                  ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    fns[name] = sdpa(backend)
                except Exception as error:  # noqa: BLE001 - a backend SDPA does not offer here
                    print(f"  {name}: unavailable ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
            usable = {}
            for name, fn in fns.items():
                try:
                    fn()
                    torch.cuda.synchronize()
                    usable[name] = fn
                except Exception as error:  # noqa: BLE001
                    print(f"  {name}: failed ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
            # Sanity at the timed shape: the Hopper gradients against rung 4's (no float64 golden at this size).
            if "hopper" in usable:
                ref = module.flash_backward(grad_o, q, k, v, o, lse, causal, None, False, "portable")
                got = module.flash_backward(grad_o, q, k, v, o, lse, causal, None, False, "hopper")
                for name, a, b in zip(("grad_q", "grad_k", "grad_v"), got, ref):
                    diff = (a.float() - b.float()).abs().max().item()
                    size = b.float().abs().max().item()
                    bad = not diff <= 2e-2 * max(size, 1e-3)
                    failures += bad
                    print(f"  {'FAIL' if bad else 'ok  '} hopper {name} vs portable at this shape: max |diff| "
                          f"{diff:.2e} (max |portable| {size:.2e})")
            names = list(usable)
            times = dict(zip(names, interleaved_median_ms([usable[n] for n in names], warmup=3, reps=reps)))
            flops = 2.5 * 4 * batch * heads_q * seqlen * seqlen * d / (2 if causal else 1)
            shape = str((batch, heads_q, heads_kv, seqlen, d))
            for name in names:
                ms = times[name]
                ratio = lambda other: f"{times[other] / ms:.2f}" if other in times else "-"  # noqa: E731
                print(f"{shape:<26} {'causal' if causal else 'full':<7} {name:<17} {ms:8.3f} "
                      f"{flops / ms / 1e9:8.1f} {ratio('portable'):>10} {ratio('sdpa_flash (FA2)'):>6} "
                      f"{ratio('sdpa_cudnn'):>8}", flush=True)
                results["perf"].append({"batch": batch, "heads_q": heads_q, "heads_kv": heads_kv, "seqlen": seqlen,
                                        "head_dim": d, "causal": causal, "kernel": name, "ms": ms,
                                        "tflops": flops / ms / 1e9})
            del q, k, v, o, lse, grad_o, fns, usable
            torch.cuda.empty_cache()
    results["failures"] = failures
    out = os.environ.get("OUT")
    if out:
        Path(out, "lab08_hopper_bwd.json").write_text(json.dumps(results, indent=1))
    print(f"\n[done] {failures} failures, {time.perf_counter() - started:.0f} s in all")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

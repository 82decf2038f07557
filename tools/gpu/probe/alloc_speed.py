"""Whether where a tensor lands in GPU memory changes how fast it streams: the same copy from many 256 MiB tensors.

    ./course run tools/gpu/probe/alloc_speed.py [--tensors 24] [--churn | --fragment]   (JSON: $OUT/alloc-speed*.json)
    ./course run tools/gpu/probe/alloc_speed.py --after-free GIB [--keep]   (JSON: $OUT/alloc-speed-after-free-*.json)

Why: in some processes every kernel that reads one perf case's inputs ran 13-17% slower on an H100 at 1980 MHz
(lab 07's graph-timed forward + backward: 0.537 / 0.575 ms against 0.460 / 0.508 in another process; the forward vs
copy case 0.214 / 0.212 against 0.181 / 0.183; NOTES.md@8a81008, 2026-11-27), both sides of a case alike, so the
cause is something the two sides share: their input tensors. Here each of `tensors` tensors of 256 MiB (what lab 07's
x and grad_y are) is copied into one fixed destination, CUDA events around each copy, L2 not flushed (256 MiB is
5x the L2), rounds interleaved across the tensors; medians per tensor, and the slow ones (< 93% of the median) with
their address and their allocator segment. --churn first allocates and frees a mix of sizes (what a test session's
earlier cases do) and then allocates the tensors. --fragment turns the caching allocator off (every tensor its own
cudaMalloc), fills 90% of free memory with 64 KiB allocations, frees every other one, and only then allocates the
tensors: the driver has no free 2 MiB page left, only 64 KiB holes, so whether small pages stream slower shows.
--after-free GIB: the copy's time, a median per 50 ms, over the 3 s after GIB GiB of torch.randn (8 GiB tensors) were
handed back to the driver (empty_cache), as the grader's past-2^31 cases do before its perf cases (GIB 0: the same
without them; --keep: freed to the caching allocator only): whether memory handed back costs the next kernels
bandwidth for a while.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

FRAGMENT = "--fragment" in sys.argv
if FRAGMENT:  # before torch initialises CUDA: every allocation straight from the driver
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"

import torch  # noqa: E402

TENSORS = int(sys.argv[sys.argv.index("--tensors") + 1]) if "--tensors" in sys.argv else 24
CHURN = "--churn" in sys.argv
ELEMS = 2**27  # bfloat16: 256 MiB
ROUNDS, REPS = 3, 7


def churn() -> list[torch.Tensor]:
    rng = random.Random(0)
    kept = []
    for _ in range(300):
        size = rng.choice([2**18, 2**20, 2**22, 2**24, 2**26, 2**28, 3 * 2**26])  # bytes / 4: 1 MiB .. 1 GiB
        t = torch.empty(size, device="cuda")
        if rng.random() < 0.15:
            kept.append(t)
        if len(kept) > 12:
            kept.pop(rng.randrange(len(kept)))
    return kept


def fragment() -> list[torch.Tensor]:
    free, _ = torch.cuda.mem_get_info()
    small = 64 * 1024
    count = int(0.9 * free) // small
    pieces = []
    for _ in range(count):
        try:
            pieces.append(torch.empty(small, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:  # the driver rounds a small allocation up further than 64 KiB
            break
    count = len(pieces)
    kept = pieces[::2]  # the others freed: holes of 64 KiB between live allocations
    del pieces
    print(f"fragment: {count} allocations of 64 KiB, {len(kept)} kept; free now "
          f"{torch.cuda.mem_get_info()[0] >> 30} GiB")
    return kept


def after_free(gib: int, keep: bool) -> None:
    if gib:
        chunks = [torch.randn(2**31, device="cuda") for _ in range(gib // 8)]  # 8 GiB each, as the huge cases' x
        torch.cuda.synchronize()
        del chunks
        if not keep:
            torch.cuda.empty_cache()  # back to the driver
    src = torch.randn(ELEMS, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    windows = []
    while time.perf_counter() - t0 < 3:
        window = []
        w0 = time.perf_counter()
        while time.perf_counter() - w0 < 0.05:
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            window.append(start.elapsed_time(end))
        windows.append({"t_s": round(w0 - t0, 3), "median_ms": round(statistics.median(window), 4),
                        "copies": len(window)})
    name = torch.cuda.get_device_name()
    what = "kept by the caching allocator" if keep else "handed back to the driver (empty_cache)"
    print(f"{name}; after {gib} GiB of torch.randn {what}: a 256 MiB copy's median per 50 ms window")
    for w in windows[:12] + windows[12::10]:
        print(f"  t = {w['t_s']:6.3f} s  {w['median_ms']:.4f} ms  ({w['copies']} copies)")
    out = Path(os.environ.get("OUT", "build"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"alloc-speed-after-free-{gib}{'-kept' if keep else ''}.json").write_text(
        json.dumps({"device": name, "gib": gib, "kept": keep, "windows": windows}, indent=1))


def segment_of(ptr: int, segments) -> str:
    for s in segments:
        if s["address"] <= ptr < s["address"] + s["total_size"]:
            return f"segment {s['address']:#x} of {s['total_size'] >> 20} MiB ({s['segment_type']})"
    return "no segment"


def main() -> None:
    if "--after-free" in sys.argv:
        after_free(int(sys.argv[sys.argv.index("--after-free") + 1]), "--keep" in sys.argv)
        return
    held = churn() if CHURN else fragment() if FRAGMENT else []
    dst = torch.empty(ELEMS, device="cuda", dtype=torch.bfloat16)
    tensors = [torch.randn(ELEMS, device="cuda").to(torch.bfloat16) for _ in range(TENSORS)]
    times: list[list[float]] = [[] for _ in tensors]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(ROUNDS):
        for i, t in enumerate(tensors):
            dst.copy_(t)
            for _ in range(REPS):
                start.record()
                dst.copy_(t)
                end.record()
                end.synchronize()
                times[i].append(start.elapsed_time(end))
    medians = [statistics.median(ts) for ts in times]
    overall = statistics.median(medians)
    gbps = [2 * ELEMS * 2 / (m * 1e-3) / 1e9 for m in medians]
    segments = torch.cuda.memory_snapshot()
    rows = []
    for i, (t, m, g) in enumerate(zip(tensors, medians, gbps)):
        slow = m > overall / 0.93
        rows.append({"tensor": i, "ptr": hex(t.data_ptr()), "ms": round(m, 4), "gbps": round(g, 1), "slow": slow,
                     "segment": segment_of(t.data_ptr(), segments), "spread_ms": [round(min(times[i]), 4),
                                                                                 round(max(times[i]), 4)]})
    name = torch.cuda.get_device_name()
    mode = " after churn" if CHURN else " in 64 KiB holes" if FRAGMENT else ""
    print(f"{name}; {TENSORS} tensors of 256 MiB{mode}; copy medians: min "
          f"{min(medians):.4f} median {overall:.4f} max {max(medians):.4f} ms ({min(gbps):.0f}-{max(gbps):.0f} GB/s)")
    for r in rows:
        print(f"  {r['tensor']:3d} {r['ptr']} {r['ms']:.4f} ms {r['gbps']:7.1f} GB/s {'SLOW ' if r['slow'] else ''}"
              f"[{r['spread_ms'][0]:.4f}, {r['spread_ms'][1]:.4f}] {r['segment']}")
    out = Path(os.environ.get("OUT", "build"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"alloc-speed{'-churn' if CHURN else '-fragment' if FRAGMENT else ''}.json").write_text(json.dumps(
        {"device": name, "churn": CHURN, "fragment": FRAGMENT, "rows": rows, "held": len(held)}, indent=1))


if __name__ == "__main__":
    main()

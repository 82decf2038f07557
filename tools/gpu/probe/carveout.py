"""Whether a kernel with a large shared-memory footprint slows the memory-bound kernels that run after it.

    ./course run tools/gpu/probe/carveout.py                            (JSON: $OUT/carveout.json)
    ./course run tools/gpu/probe/carveout.py --huge alloc|on_chip|streaming

Why: lab 07's first perf case (forward vs copy) read 0.213 ms, both sides, after the grader's past-2^31 cases in the
same process, and 0.183 ms without them; of those cases, exactly the three whose kernels take 128-227 KiB of shared
memory a block (the on-chip softmax forward and backward, the staged RMSNorm backward) did it (NOTES.md@8a81008,
2026-11-27, c58-c59), and a new process after them did not. An SM splits one array between L1 and shared memory;
a kernel that needs most of it as shared memory has the SM reconfigured, and the kernels after it, which state no
preference, may run with the small L1 left. Here, in one process: a 256 MiB bfloat16 copy (torch's kernel) and the
lab's RMSNorm forward (register path, no dynamic shared memory) timed before any such kernel, after each trigger,
again later, and after a small kernel whose preferred carveout is the largest L1 (cudaSharedmemCarveoutMaxL1).
--huge MODE instead repeats the grader's past-2^31 on-chip softmax case in the probe: x float32 (2^15 + 1, 2^16)
from torch.randn, softmax'd with path MODE (alloc: no kernel), everything freed and handed back (empty_cache); then
the copy and the forward, timed as above, four times over 4 s.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

ROOT = Path(__file__).resolve().parents[3]
from coursekit import jit  # noqa: E402

RESET = r"""
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
// No shared memory, and a preferred carveout of the largest L1: launched on every SM, it asks each SM for the L1-heavy
// configuration again.
__global__ void prefer_l1_kernel(int* sink) {
  if (sink != nullptr && threadIdx.x == 0 && blockIdx.x == 0) *sink = 0;
}
void prefer_l1(int64_t blocks) {
  static bool set = false;
  if (!set) {
    cudaFuncSetAttribute(prefer_l1_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxL1);
    set = true;
  }
  prefer_l1_kernel<<<static_cast<unsigned>(blocks), 128, 0, at::cuda::getCurrentCUDAStream()>>>(nullptr);
}
"""


def median_ms(fn, reps=40) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def huge(mode: str, lab) -> None:
    x = torch.randn((2**15 + 1, 2**16), device="cuda")  # the grader's HUGE["on_chip"], float32: 8.6 GB
    if mode != "alloc":
        y = lab.softmax(x, path=mode)
        torch.cuda.synchronize()
        del y
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def main() -> None:
    jit.ensure_arch_list()
    lab = jit.load_lab(ROOT / "solutions" / "07-fused-normalization", ROOT)
    reset = load_inline("course_prefer_l1", "void prefer_l1(int64_t blocks);", cuda_sources=RESET,
                        functions=["prefer_l1"], extra_cuda_cflags=jit.NVCC_FLAGS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    src = torch.randn(2**27, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    x = torch.randn(8, 4096, 4096, device="cuda").to(torch.bfloat16)
    w = torch.randn(4096, device="cuda").to(torch.bfloat16)
    long_rows = torch.randn(4, 65536, device="cuda")
    grad_y = torch.randn(4 * sms, 4096, device="cuda").to(torch.bfloat16)
    xs = torch.randn(4 * sms, 4096, device="cuda").to(torch.bfloat16)
    _, rstd = lab.rms_norm(xs, w, 1e-6)

    triggers = {
        "softmax on chip (forward)": lambda: lab.softmax(long_rows, path="on_chip"),
        "rms_norm backward (staged)": lambda: lab.rms_norm_backward(grad_y, xs, w, rstd, path="auto"),
        "softmax on chip (backward)": lambda: lab.softmax_backward(long_rows, long_rows, path="on_chip"),
    }
    rows = []

    def measure(label: str) -> None:
        torch.cuda.synchronize()
        copy = median_ms(lambda: dst.copy_(src))
        forward = median_ms(lambda: lab.rms_norm(x, w, 1e-6))
        rows.append({"after": label, "copy_ms": round(copy, 4), "rms_forward_ms": round(forward, 4)})
        print(f"  {label:<44} copy {copy:.4f} ms   rms_norm forward {forward:.4f} ms", flush=True)

    print(f"{torch.cuda.get_device_name()}: 256 MiB bfloat16 copy and the (8, 4096, 4096) bfloat16 forward, medians")
    if "--huge" in sys.argv:
        mode = sys.argv[sys.argv.index("--huge") + 1]
        del src, dst, x
        torch.cuda.empty_cache()
        huge(mode, lab)
        src = torch.randn(2**27, device="cuda").to(torch.bfloat16)
        dst = torch.empty_like(src)
        x = torch.randn(8, 4096, 4096, device="cuda").to(torch.bfloat16)
        for second in range(4):
            measure(f"huge {mode}, {second} s")
            time.sleep(1.0)
        reset.prefer_l1(sms * 4)
        measure(f"huge {mode}, then the max-L1 kernel")
        return
    measure("nothing (first)")
    for name, trigger in triggers.items():
        trigger()
        measure(name)
        time.sleep(1.0)
        measure(f"{name}, 1 s later")
        reset.prefer_l1(sms * 4)
        measure(f"{name}, then the max-L1 kernel")
    out = Path(os.environ.get("OUT", "build"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "carveout.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

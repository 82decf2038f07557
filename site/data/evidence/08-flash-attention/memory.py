"""Lab 08, peak memory against sequence length: flash forward + backward against the naive rung and SDPA's math
backend (forward + backward at seqlen 16384 must stay O(N)).

    ./course run site/data/evidence/08-flash-attention/memory.py      (JSON: $OUT/lab08-memory.json, else build/)

Batch 1, 16 heads, head_dim 64, causal, bfloat16.
For each N: the bytes allocated at the peak of the call beyond what was allocated before it
(torch.cuda.max_memory_allocated), inputs and grad_o excluded, so what is left is outputs, workspaces and
anything the op keeps: for flash forward + backward, o, lse, D, the float32 dQ and the three gradients, all O(N);
for the naive rung, its float32 N x N scores (workspace) on top; SDPA's math backend (forward + backward through
autograd) materializes S and P as well. The figures it gave are in memory.json beside this file.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
HEADS, HEAD_DIM = 16, 64
MIB = 2**20


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from coursekit import jit

    jit.ensure_arch_list()
    lab = jit.load_lab(ROOT / "solutions" / "08-flash-attention", ROOT)

    def peak_mib(fn) -> float:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del result
        return round(peak / MIB, 1)

    def qkv(n: int, dtype):
        return [torch.randn(1, n, HEADS, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(3)]

    def flash_fwd_bwd(q, k, v, grad_o):
        o, lse = lab.flash_forward(q, k, v, causal=True)
        return o, lse, lab.flash_backward(grad_o, q, k, v, o, lse, causal=True)

    def sdpa_math(q, k, v, grad_o):
        leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        return torch.autograd.grad(out, leaves, grad_o.transpose(1, 2))

    rows = []
    free = torch.cuda.mem_get_info()[0]
    for n in (1024, 2048, 4096, 8192, 16384):
        q = k = v = grad_o = None  # the last size's tensors freed before this one's are made
        torch.cuda.empty_cache()
        q, k, v = qkv(n, torch.bfloat16)
        grad_o = torch.randn_like(q)
        row = {"seqlen": n, "inputs_mib": round(4 * q.numel() * 2 / MIB, 1),
               "flash_fwd_bwd_mib": peak_mib(lambda: flash_fwd_bwd(q, k, v, grad_o))}
        scores_bytes = HEADS * n * n * 4
        if 3 * scores_bytes < free:  # S and P in float32, and autograd's copies: skip what cannot fit
            row["sdpa_math_fwd_bwd_mib"] = peak_mib(lambda: sdpa_math(q, k, v, grad_o))
            row["naive_fwd_mib"] = peak_mib(lambda: lab.attention_naive(q, k, v, causal=True))
        row["scores_fp32_mib"] = round(scores_bytes / MIB, 1)
        rows.append(row)
        print(row, flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": 1, "heads": HEADS,
           "head_dim": HEAD_DIM, "causal": True, "rows": rows}
    folder = Path(os.environ.get("OUT", "build"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lab08-memory.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

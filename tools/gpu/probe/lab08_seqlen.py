"""Lab 08, forward TFLOP/s against sequence length for every rung and SDPA's backends: the data of lesson 08's plot
(issue 14: "rung timings and the plot on the page"; issue 17's Hopper path, path="hopper_simple", is on it too:
on a GPU without it that row fails to run and is left out).

    ./course run tools/gpu/probe/lab08_seqlen.py [--quick]     (JSON: $OUT/lab08-seqlen.json, else build/)

Shapes as FlashAttention-2's paper plots them: batch x seqlen = 16384 tokens, 16 heads, head_dim 64 and 128,
causal and not. The 16-bit rungs and SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends run in bfloat16; the
float32 rung and the naive one run in float32 against SDPA's EFFICIENT_ATTENTION in float32, as the bench does.
The naive rung writes batch x heads x N x N float32 scores, so it stops at 8192 (4 GiB of scores there).
FLOPs: 4 N^2 d per (batch, head) non-causal (two GEMMs), half of that causal, the count FA2's paper uses.
Each row is timed with the harness's own timer (CUDA events, warm-up, L2 flushed, median of reps), each rung
interleaved with SDPA FLASH at the same shape so that clock drift hits both.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[3]
from coursekit import jit  # noqa: E402

TOKENS, HEADS = 16384, 16
NAIVE_MAX_SEQLEN = 8192


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal)
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="seqlen 1024 and 4096, head_dim 128 only")
    args = parser.parse_args()
    jit.ensure_arch_list()
    lab = jit.load_lab(ROOT / "solutions" / "08-flash-attention", ROOT)
    rungs_16 = {"tensor-core flash (rung 3)": lambda q, k, v, c: lab.flash_forward(q, k, v, causal=c, path="portable"),
                "Hopper flash (TMA, wgmma)": lambda q, k, v, c: lab.flash_forward(q, k, v, causal=c,
                                                                                  path="hopper_simple"),
                "SDPA FLASH_ATTENTION (FA2)": sdpa(SDPBackend.FLASH_ATTENTION),
                "SDPA CUDNN_ATTENTION": sdpa(SDPBackend.CUDNN_ATTENTION)}
    rungs_32 = {"float32 flash (rung 2)": lambda q, k, v, c: lab.flash_forward_fp32(q, k, v, causal=c),
                "naive (rung 1)": lambda q, k, v, c: lab.attention_naive(q, k, v, causal=c),
                "SDPA EFFICIENT_ATTENTION float32": sdpa(SDPBackend.EFFICIENT_ATTENTION)}
    seqlens = (1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    head_dims = (128,) if args.quick else (64, 128)
    rows = []
    for d in head_dims:
        for causal in (False, True):
            for n in seqlens:
                batch = max(1, TOKENS // n)
                flops = 4 * batch * HEADS * n * n * d // (2 if causal else 1)
                for dtype, rungs in ((torch.bfloat16, rungs_16), (torch.float32, rungs_32)):
                    q, k, v = (torch.randn(batch, n, HEADS, d, device="cuda", dtype=dtype) for _ in range(3))
                    for name, fn in rungs.items():
                        if name.startswith("naive") and n > NAIVE_MAX_SEQLEN:
                            continue
                        reps = 10 if (dtype == torch.float32 and n >= 8192) else 25
                        try:
                            call = (lambda fn=fn, q=q, k=k, v=v: fn(q, k, v, causal))
                            (ms,) = jit.interleaved_median_ms([call], reps=reps)
                        except RuntimeError as error:  # a backend that refuses the shape (cuDNN, say): a gap
                            print(f"{name} d{d} causal={causal} N={n}: {str(error).splitlines()[0]}", flush=True)
                            torch.cuda.synchronize()
                            continue
                        row = {"rung": name, "dtype": str(dtype).removeprefix("torch."), "head_dim": d,
                               "causal": causal, "seqlen": n, "batch": batch, "heads": HEADS, "ms": round(ms, 4),
                               "tflops": round(flops / ms / 1e9, 1)}
                        rows.append(row)
                        print(row, flush=True)
                    q = k = v = None  # freed before the next shape is made
                    torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": TOKENS,
           "command": "python3 tools/gpu/probe/lab08_seqlen.py" + (" --quick" if args.quick else ""), "rows": rows}
    folder = Path(os.environ.get("OUT", ROOT / "build"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lab08-seqlen.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

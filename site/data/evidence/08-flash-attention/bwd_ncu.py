"""Lab 08's Hopper backward at the decoder block's shape, one launch, for Nsight Compute: where its dQ traffic goes.

    ncu --kernel-name regex:flash_backward_hopper_kernel --launch-count 1 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_red.sum \
        ./course run site/data/evidence/08-flash-attention/bwd_ncu.py [TREE]

(8, 2048, 16 query heads on 4 kv heads, d128, causal, bf16), path='hopper'. With the dQ atomics taken out the kernel
took 1.073 ms against 1.315 (hopper_backward_order.json beside this file): the counters say whether the partial
sums' adds miss L2 (the float32 accumulator is 134 MB, the L2 50 MB) and so cost DRAM reads and writes. The figures
it gave are in hopper_backward_dram.json beside this file. TREE: the lab tree to build (default: solutions).
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default="solutions", help="the lab tree to build (default: solutions)")
    args = parser.parse_args()

    import torch

    from coursekit import trees
    from harness import build

    module = build.build(trees.find_lab("08"), trees.resolve_tree(args.tree))
    torch.manual_seed(0)
    q = torch.randn(8, 2048, 16, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, 2048, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    grad_o = torch.randn_like(q)
    o, lse = module.flash_forward(q, k, v, True, None, "portable")
    module.flash_backward(grad_o, q, k, v, o, lse, True, None, False, "hopper")
    torch.cuda.synchronize()
    print("launched flash_backward path='hopper' at (8, 2048, 16/4, 128) causal", flush=True)


if __name__ == "__main__":
    main()

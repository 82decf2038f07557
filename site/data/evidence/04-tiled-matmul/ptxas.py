"""ptxas's report for the seven kernels of lab 04's reference solution: registers, spill bytes and static shared
memory per kernel, the block size its __launch_bounds__ declares, and the blocks of that size an SM can hold by
registers and threads. A compile only: no GPU needed.

    ./course run site/data/evidence/04-tiled-matmul/ptxas.py [--arch 90] [--write]

Compiles each solutions/04-tiled-matmul/0N_*.cu as `./course build 04 -v` does (nvcc -O3 -std=c++17, the same
include paths), once to PTX (for .maxntid, the block size) and once with -Xptxas -v (the report). --write stores
the result as ptxas_sm<ARCH>.json beside this file: the evidence lesson 04's "Reading ptxas's report" renders.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
LAB = ROOT / "solutions" / "04-tiled-matmul"
NAMES = {"01": "1 naive", "02": "2 coalesced", "03": "3 smem tiles", "04": "4 1D blocking", "05": "5 2D blocking",
         "06": "6 vectorized", "07": "7 warp tiling"}
# Per SM, for the residency column: the register file and the most resident threads. Registers are allocated
# 256 per warp, so a thread's count rounds up to a multiple of 8.
SM_LIMITS = {"90": (65536, 2048), "80": (65536, 2048), "75": (65536, 1024)}
REPORT = re.compile(r"Used (\d+) registers[^\n]*")
SMEM = re.compile(r"(\d+) bytes smem")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
MAXNTID = re.compile(r"\.maxntid\s+(\d+),\s*(\d+),\s*(\d+)")


def nvcc_flags(arch: str) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", f"-gencode=arch=compute_{arch},code=sm_{arch}",
             "-I", str(ROOT / "include"), "-I", str(LAB), "-isystem", sysconfig.get_paths()["include"],
             "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-D__CUDA_NO_HALF2_OPERATORS__"]
    for path in include_paths(device_type="cuda"):
        flags += ["-isystem", path]
    return flags


def report(source: Path, arch: str, tmp: Path) -> dict:
    flags = nvcc_flags(arch)
    subprocess.run(["nvcc", *flags, "-ptx", str(source), "-o", str(tmp / "k.ptx")], capture_output=True, text=True,
                   check=True)
    found = MAXNTID.search((tmp / "k.ptx").read_text())
    threads = int(found.group(1)) * int(found.group(2)) * int(found.group(3)) if found else None
    compiled = subprocess.run(["nvcc", *flags, "-Xptxas=-v", "-cubin", str(source), "-o", str(tmp / "k.cubin")],
                              capture_output=True, text=True, check=True)
    text = compiled.stdout + compiled.stderr
    used, spills = REPORT.search(text), SPILLS.search(text)
    smem = SMEM.search(used.group(0))
    registers = int(used.group(1))
    regs_limit, threads_limit = SM_LIMITS[arch]
    allocated = -(-registers // 8) * 8
    blocks = min(regs_limit // (allocated * threads), threads_limit // threads) if threads else None
    return {"registers": registers, "spill_bytes": int(spills.group(1)) + int(spills.group(2)),
            "smem_bytes": int(smem.group(1)) if smem else 0, "threads": threads, "blocks_per_sm": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="90", choices=sorted(SM_LIMITS), help="compute capability, no dot")
    parser.add_argument("--write", action="store_true", help="write ptxas_sm<ARCH>.json beside this file")
    args = parser.parse_args()
    import tempfile

    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release ([\d.]+)", version).group(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for source in sorted(LAB.glob("0[1-7]_*.cu")):
            row = {"name": NAMES[source.name[:2]], "file": source.name, **report(source, args.arch, Path(tmp))}
            rows.append(row)
            print(f"{row['name']:<16} {row['registers']:>4} registers {row['spill_bytes']:>3} B spilled "
                  f"{row['smem_bytes']:>6} B smem {row['threads']:>5} threads {row['blocks_per_sm']} blocks/SM")
    if args.write:
        import torch

        evidence = {
            "gpu": f"sm_{args.arch} (ptxas of nvcc {release}, no GPU needed)", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": f"python3 site/data/evidence/04-tiled-matmul/ptxas.py --arch {args.arch} --write",
            "source": "ptxas -v of solutions/04-tiled-matmul, compiled as ./course build 04 -v compiles it",
            "rows": rows,
            "table": {"columns": [["name", "kernel", ""], ["registers", "registers", "d"],
                                  ["spill_bytes", "spills (bytes)", "d"], ["smem_bytes", "shared memory (bytes)", "d"],
                                  ["threads", "threads per block", "d"],
                                  ["blocks_per_sm", "resident blocks per SM (registers, threads)", "d"]]}}
        path = HERE / f"ptxas_sm{args.arch}.json"
        path.write_text(json.dumps(evidence, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())

"""SASS instruction counts of compiled kernels, without a GPU: what a code change did to a kernel's instructions.

    python3 tools/gpu/sass_hist.py OBJ REGEX [--top N]          one kernel: its count and its N commonest opcodes
    python3 tools/gpu/sass_hist.py OBJ REGEX --against OBJ2     the same kernel in two builds, opcode by opcode
    python3 tools/gpu/sass_hist.py OBJ REGEX --against OBJ2 REGEX2   two kernels of different names (lab vs probe)

OBJ: an object or library with sm_XX code, e.g. `nvcc -O3 -std=c++17 -arch=sm_90a -Iinclude -c rms_norm.cu -o a.o`
in a lab folder. Needs cuobjdump and nvdisasm on PATH: not in this machine's CUDA, but in PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (unzip them; the binaries are under nvidia/cu13/bin).
Static counts: a loop's body counts once. Lab 07's staged backward (NOTES.md@8a81008, 2026-11-26): 1768
instructions against the probe's 1528, 192 of the difference PRMTs.
"""
from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter


def kernels(obj: str) -> dict[str, str]:
    out = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
    parts = re.split(r"\n\s+Function : (\S+)\n", out)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def opcodes(sass: str) -> Counter:
    return Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))


def one(obj: str, pattern: str) -> tuple[str, Counter]:
    found = [(name, body) for name, body in kernels(obj).items() if re.search(pattern, name)]
    if len(found) != 1:
        sys.exit(f"{obj}: {len(found)} kernels match {pattern!r}: " + ", ".join(n[:60] for n, _ in found[:8]))
    return found[0][0], opcodes(found[0][1])


def main() -> None:
    obj, pattern, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    name, counts = one(obj, pattern)
    print(f"{name[:100]}: {sum(counts.values())} instructions")
    if "--against" in rest:
        at = rest.index("--against")
        other_pattern = rest[at + 2] if len(rest) > at + 2 and not rest[at + 2].startswith("--") else pattern
        other_name, other = one(rest[at + 1], other_pattern)
        print(f"{other_name[:100]}: {sum(other.values())} instructions")
        for op in sorted(set(counts) | set(other), key=lambda op: -abs(counts[op] - other[op])):
            if counts[op] != other[op]:
                print(f"  {op:28s} {counts[op]:6d} {other[op]:6d}")
        return
    top = int(rest[rest.index("--top") + 1]) if "--top" in rest else 20
    for op, n in counts.most_common(top):
        print(f"  {op:28s} {n:6d}")


if __name__ == "__main__":
    main()

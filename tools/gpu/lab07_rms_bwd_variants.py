"""Writes tools/gpu/lab07-rms-bwd-variants.txt (RMSNorm backward, issue 13) and ptxas-checks each variant.

    python3 tools/gpu/lab07_rms_bwd_variants.py [--ptxas]

Each variant renames the lab's register backward kernel (left in the file, never instantiated) and inserts a new
one under the old name before launch_rms_norm_backward. Why (tools/gpu/NOTES.md, "RMSNorm backward: why the 2rows
port did not reach the probe"): the reverted port (88a9046) loaded each row through RowSlice::load, which widens to
float inside the row's `k < step_rows` branch, so its sm_90a SASS waits for row 0's four 16-byte loads before it
issues row 1's: one row in flight, as before. The new kernel loads both rows as raw packs first, widening at use.
--ptxas plants each variant (harness.mutants.plant) and prints ptxas -v for the bf16 (256, 16, 8) kernel, sm_90a.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from variants import spec_line as line  # noqa: E402  (tools/gpu: the spec format's one writer)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tools" / "gpu" / "lab07-rms-bwd-variants.txt"

HELPERS = r"""// Variant (issue 13): the step's dots all-reduced together behind one barrier (the reverted port's).
template <typename F, int kRows>
struct RowDots {
  F v[kRows];
};
template <typename F, int kRows>
struct SumRowDots {
  __device__ static RowDots<F, kRows> identity() { return {}; }
  __device__ RowDots<F, kRows> operator()(RowDots<F, kRows> a, RowDots<F, kRows> b) const {
#pragma unroll
    for (int k = 0; k < kRows; ++k) a.v[k] += b.v[k];
    return a;
  }
};
template <typename F, int kRows>
__device__ __forceinline__ RowDots<F, kRows> shfl_xor(RowDots<F, kRows> d, int offset) {
#pragma unroll
  for (int k = 0; k < kRows; ++k) d.v[k] = shfl_xor(d.v[k], offset);
  return d;
}
// Two sets of slots by the step's parity: one barrier a step (a thread that writes a set again has
// passed the barrier of the step between, which every thread reaches after its reads).
template <int kRowThreads, typename V, typename Op>
__device__ __forceinline__ V row_all_reduce_alternating(V value, Op op, int64_t step) {
  if constexpr (kRowThreads == kWarpSize) {
    return warp_all_reduce(value, op);
  } else {
    constexpr int kWarps = kRowThreads / kWarpSize;
    __shared__ V warp_results[2][kWarps];
    const int parity = static_cast<int>(step & 1);
    const int lane = threadIdx.x % kWarpSize;
    value = warp_all_reduce(value, op);
    if (lane == 0) warp_results[parity][threadIdx.x / kWarpSize] = value;
    __syncthreads();
    return warp_all_reduce(lane < kWarps ? warp_results[parity][lane] : Op::identity(), op);
  }
}
"""

KERNEL = r"""// Variant (issue 13): kRows rows a step, every load of the step issued (raw packs) before any is used.
template <typename T, int kRowThreads, int kElemsPerThread, int kElems>
__global__ void __launch_bounds__(LAUNCH_BOUNDS)
    rms_norm_backward_registers_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                                       const T* __restrict__ weight, const Compute<T>* __restrict__ rstd,
                                       T* __restrict__ grad_x, Compute<T>* __restrict__ partials, int64_t rows,
                                       int64_t n, int64_t rows_per_chunk) {
  using C = Compute<T>;
  using P = Pack<T, kElems>;
  using Slice = RowSlice<T, kRowThreads, kElemsPerThread, kElems>;
  constexpr int kPacks = Slice::kPacks;
  constexpr int kRowsPerBlock = kThreadsPerBlock / kRowThreads;
  constexpr int kRows = ROWS_RULE;
  const int t = threadIdx.x % kRowThreads;
  const int group = threadIdx.x / kRowThreads;
  const int64_t chunk = blockIdx.x;
  const int64_t chunk_end = (chunk + 1) * rows_per_chunk < rows ? (chunk + 1) * rows_per_chunk : rows;
  C sums[kPacks][kElems] = {};
  int64_t step = 0;
  for (int64_t first = chunk * rows_per_chunk + group; first < chunk_end;
       first += int64_t{kRows} * kRowsPerBlock, ++step) {
    const int64_t rows_left = course::ceil_div<int64_t>(chunk_end - first, kRowsPerBlock);
    const int step_rows = rows_left < kRows ? static_cast<int>(rows_left) : kRows;
    P gp[kRows][kPacks], xp[kRows][kPacks];
    C r[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t row = first + int64_t{k} * kRowsPerBlock;
      const bool live = k < step_rows;
      r[k] = live ? rstd[row] : C(0);
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int64_t col = Slice::column(j, t);
        gp[k][j] = P{};
        xp[k][j] = P{};
        if (live && col < n) {
          gp[k][j] = *reinterpret_cast<const P*>(grad_y + row * n + col);
          xp[k][j] = *reinterpret_cast<const P*>(x + row * n + col);
        }
      }
    }
    RowDots<C, kRows> dots = {};
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (k >= step_rows) continue;
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int64_t col = Slice::column(j, t);
        if (col >= n) continue;
        const P w = *reinterpret_cast<const P*>(weight + col);
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          const C gy = to_compute(gp[k][j].v[e]), xv = to_compute(xp[k][j].v[e]);
          sums[j][e] += gy * xv * r[k];
          const C g = gy * to_compute(w.v[e]);
          dots.v[k] += g * xv;
        }
      }
    }
    dots = row_all_reduce_alternating<kRowThreads>(dots, SumRowDots<C, kRows>{}, step);
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (k >= step_rows) continue;
      const int64_t row = first + int64_t{k} * kRowsPerBlock;
      const C c = r[k] * r[k] * r[k] * (dots.v[k] / C(n));
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int64_t col = Slice::column(j, t);
        if (col >= n) continue;
        const P w = *reinterpret_cast<const P*>(weight + col);
        P out;
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          const C g = to_compute(gp[k][j].v[e]) * to_compute(w.v[e]);
          out.v[e] = from_compute<T>(r[k] * g - c * to_compute(xp[k][j].v[e]));
        }
        *reinterpret_cast<P*>(grad_x + row * n + col) = out;
      }
    }
  }
PARTIALS}

"""

PARTIALS_LAB = r"""  __shared__ C group_sums[kRowsPerBlock][kPacks][kElems][kRowThreads];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) group_sums[group][j][e][t] = sums[j][e];
  }
  __syncthreads();
  if (group != 0) return;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int64_t col = Slice::column(j, t);
    if (col >= n) continue;
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      C total = group_sums[0][j][e][t];
#pragma unroll
      for (int g = 1; g < kRowsPerBlock; ++g) total += group_sums[g][j][e][t];
      partials[chunk * n + col + e] = total;
    }
  }
"""
# A block per row (kRowsPerBlock == 1): the sums are the partials already; no shared memory, no barrier (the
# probe's "2rows" writes them so). The same values, so grad_weight keeps its bits.
PARTIALS_DIRECT = ("  if constexpr (kRowsPerBlock == 1) {\n#pragma unroll\n  for (int j = 0; j < kPacks; ++j) {\n"
                   "    const int64_t col = Slice::column(j, t);\n    if (col >= n) continue;\n#pragma unroll\n"
                   "    for (int e = 0; e < kElems; ++e) partials[chunk * n + col + e] = sums[j][e];\n  }\n"
                   "  } else {\n" + PARTIALS_LAB + "  }\n")

TWO_ROWS = "kRowThreads == kThreadsPerBlock && kElemsPerThread * sizeof(C) <= 64 ? 2 : 1"
# (name, rows rule, launch bounds, partials): what each variant changes, one difference from the probe at a time.
VARIANTS = (
    ("1row-raw", "1", "kThreadsPerBlock", PARTIALS_LAB),
    ("2rows-raw", TWO_ROWS, "kThreadsPerBlock", PARTIALS_LAB),
    ("2rows-raw-direct", TWO_ROWS, "kThreadsPerBlock", PARTIALS_DIRECT),
    ("2rows-raw-direct-lb2", TWO_ROWS, "kThreadsPerBlock, 2", PARTIALS_DIRECT),
)
RENAME = ("    rms_norm_backward_registers_kernel(const T* __restrict__ grad_y",
          "    rms_norm_backward_registers_kernel_lab(const T* __restrict__ grad_y")
ANCHOR = "template <typename T>\nvoid launch_rms_norm_backward("


def edits(rows_rule: str, bounds: str, partials: str) -> list[tuple[str, str, str]]:
    kernel = KERNEL.replace("ROWS_RULE", rows_rule).replace("LAUNCH_BOUNDS", bounds).replace("PARTIALS", partials)
    return [("rms_norm.cu", *RENAME), ("rms_norm.cu", ANCHOR, HELPERS + kernel + ANCHOR)]


def main() -> None:
    header = OUT.read_text().split("\n# ---\n")[0] if OUT.exists() else "# (header: see the generator)"
    OUT.write_text(header + "\n# ---\n" + "\n".join(line(n, edits(*v)) for n, *v in VARIANTS) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    if "--ptxas" not in sys.argv:
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from harness import trees
    from harness.mutants import plant
    lab = trees.find_lab("07")
    for name, *v in VARIANTS:
        tree = plant(lab, trees.BUILD / "variants-ptxas" / lab.name / name, edits(*v))
        src = tree / lab.name
        run = subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-Xptxas", "-v",
                              f"-I{ROOT / 'include'}", f"-I{src}", "-o", str(tree / "rms_norm.cubin"),
                              str(src / "rms_norm.cu")], capture_output=True, text=True)
        if run.returncode:
            print(f"{name}: FAILED\n{run.stderr[-3000:]}")
            continue
        report = run.stderr.split("Compiling entry function")
        for block in report:
            m = re.search(r"'(_Z34rms_norm_backward_registers_kernelI\w+)'", block)
            if m and "__nv_bfloat16Li256ELi16ELi8E" in m.group(1):
                regs = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", block)
                spill = re.search(r"(\d+) bytes spill stores", block)
                print(f"{name}: bf16 256x16, 16-byte packs: {regs.group(1)} registers, {regs.group(2)} B smem, "
                      f"{spill.group(1)} B spill stores")
        worst = max(int(r) for r in re.findall(r"Used (\d+) registers", run.stderr))
        spills = sum(int(s) for s in re.findall(r"(\d+) bytes spill stores", run.stderr))
        print(f"{name}: every kernel in rms_norm.cu at most {worst} registers, {spills} B spilled in all")


if __name__ == "__main__":
    main()

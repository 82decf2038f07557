"""Writes tools/gpu/lab05-epilogue-variants.txt (lab 05's mma.sync epilogue, issue 16 item 3) and checks each variant.

    ./course run tools/gpu/lab05_epilogue_variants.py [--ptxas] [--sass] [--plant]

Why: at M = N = 8192, K = 64 the fused kernel took 0.246 ms against gelu(addmm)'s 0.150 on an H100 (NOTES.md@8a81008,
2026-11-27), its output leaving at 18% of copy bandwidth. Two things in the reference's epilogue are candidates
(neither is measured as the cause): its stores are 4 bytes a lane, 8 rows x 16 bytes an instruction; and its sm_90a
SASS (cuobjdump -sass of the bf16 4-stage kernel, CPU) loads bias inside the j loop, two LDG.E.U16 per n8 tile,
each pair followed by that tile's 8 stores, so a warp waits for 8 dependent bias round trips (one per j) after the
main loop; at K = 64 the main loop is 2 k-slices, so those waits are a large part of a block's life (not measured).
The variants separate the two:
  stage             the warp's 64 x 64 outputs staged (bf16/fp16) in the pipeline's freed ring, then written with
                    16-byte stores, 4 whole 128-byte row segments an instruction; bias read as the reference does
  bias              the reference's 4-byte stores; bias read before the main loop, one 4-byte pair per n8 tile
  stage-bias        both
  stage-bias-n64    both, with a 128 x 64 block tile (warp tile 64 x 32) and __launch_bounds__(128, 3): more blocks
                    resident to hide latency at small K (expected to lose at 4096^3, where the file's comment says a
                    64 x 32 warp tile is bound by shared memory; neither is measured)
Each edit keeps the reference's code it replaces under `#if 0`, so the diff of a planted tree reads as a patch.
Timed on an H100 (the results are in the spec file's header): "stage" won at 8192x8192x64 (1.22x against 0.61x)
and at 4096^3 (0.489x against 0.465x cuBLAS) and is now the solution's epilogue. The edits apply to the solution
before that (git history); on today's solution "stage" plants a second copy of the same epilogue.
Always: a Python model of the staging layout's indices (check_layout) for 64- and 32-column warp tiles.
--ptxas plants each variant (harness.mutants.plant) and prints ptxas -v for linear_act.cu on sm_90a and sm_75.
--plant plants them where tools/gpu/variants.py does (build/variants/05-tensor-cores/NAME), for the probes.
--sass (with cuobjdump on PATH or in the venv's triton) counts the bf16 4-stage kernel's global loads and stores.
"""
from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
from pathlib import Path

from variants import spec_line as line  # noqa: E402  (tools/gpu: the spec format's one writer)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tools" / "gpu" / "lab05-epilogue-variants.txt"

# ------------------------------------------------------------------ bias before the main loop
BIAS_ANCHOR = "  float accumulators[kTilesM][kTilesN][4] = {};\n"
BIAS_EARLY = BIAS_ANCHOR + """\
  // Variant "bias" (issue 16 item 3): this lane's bias pairs, loaded before the main loop (kTilesN 4-byte loads,
  // kTilesN registers), so their latency hides under the tile loads instead of following the last mma: the
  // reference's epilogue loads them inside its j loop, one dependent round trip per n8 tile (its SASS).
  // bias + col is 4-byte aligned: col is even and bias 16-byte aligned (the wrapper checks).
  uint32_t bias_pairs[kTilesN];
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) {
    const int64_t col = block_col + warp_col + j * kMmaN + accumulator_position(lane, 0).col;
    bias_pairs[j] = col < N ? *reinterpret_cast<const uint32_t*>(bias + col) : 0u;
  }
"""
BIAS_LINE_REF = "    const float bias_first = to_float(bias[col]), bias_second = to_float(bias[col + 1]);\n"
BIAS_LINE_EARLY = ("    const T* const bias_pair = reinterpret_cast<const T*>(&bias_pairs[j]);\n"
                   "    const float bias_first = to_float(bias_pair[0]), bias_second = to_float(bias_pair[1]);\n")

# ------------------------------------------------------------------ the staged epilogue
STAGE_BEGIN = "  // SOLUTION BEGIN lab05.3"
STAGE_END = "  // SOLUTION END\n  // --8<-- [end"
STAGED = """\
  // Variant "stage" (issue 16 item 3): the warp's kWarpM x kWarpN outputs are rounded into shared memory, then
  // written to global memory 16 bytes a lane, whole row segments an instruction.
  //  - Space: the pipeline's ring is free once every warp has read its last tile (the barrier below) and no copy
  //    is in flight (every group the loop committed after tile k_tiles - 1 is empty; the wait makes it explicit).
  //    4 warps x 64 rows x 128 B = 32 KB, within the ring for either stage count (sm_75's 2 stages: exactly 32 KB).
  //  - Layout: a warp's rows of kWarpN outputs, kStageChunksPerRow 16-byte chunks each, swizzled as the tiles are
  //    (swizzled_chunk<8>: chunk c of row r at c ^ (r % 8)). An n8 mma tile is one chunk column (kMmaN ==
  //    kElementsPerChunk), so tile (i, j), register pair h, is one 4-byte store a lane: lane (g, t) writes byte 4t
  //    of chunk j of row 16i + 8h + g. The 8 rows g = 0..7 have r % 8 = g and land in chunks j ^ g: 8 different
  //    bank groups (a chunk spans 4 banks), t picks the bank in the group: 32 lanes, 32 banks, one wavefront.
  //    Unswizzled, 128-byte rows would put all 8 rows on the same 4 banks: 8-way conflicts.
  //    (64 x 32 warp tiles, swizzled_chunk<4>: row r's chunk c at 4r + (c ^ ((r / 2) % 4)), bank group
  //    4 (r % 2) + (c ^ ((r / 2) % 4)): 8 different groups for g = 0..7, the same argument.)
  //    Reading back: 16-byte loads go in phases of 8 lanes; lanes 8q..8q+7 read 128 contiguous bytes (one row of
  //    8 chunks, or two rows of 4), a permutation of the 32 banks: no conflict.
  //  - Global: lane l stores chunk l % kStageChunksPerRow of row l / kStageChunksPerRow + kStageRowsPerStore p:
  //    with 64-column warp tiles each instruction writes 4 rows x 128 contiguous bytes (whole lines where N * 2 B is
  //    a multiple of 128), 16 instructions a lane, against the reference's 64 instructions of 8 rows x 16 bytes.
  //  - Edges as the reference: a chunk is all inside N or all outside (N % 8 == 0, block_col % 8 == 0); rows past M
  //    are computed from the zero-filled tiles (act(bias)) and not stored.
  constexpr int kStageChunksPerRow = kWarpN / kElementsPerChunk;
  constexpr int kStageRowsPerStore = kWarpSize / kStageChunksPerRow;
  static_assert(kMmaN == kElementsPerChunk, "an n8 accumulator tile is one 16-byte chunk column");
  static_assert(kThreads / kWarpSize * kWarpM * kStageChunksPerRow <= kStages * (kTileAChunks + kTileBChunks),
                "every warp's staging area fits in the ring");
  static_assert(kWarpM % kStageRowsPerStore == 0, "whole store instructions per warp tile");
  wait_copies<0>();
  __syncthreads();  // every warp has read its last fragments: the ring is free
  uint4* const staging = shared_chunks + warp * (kWarpM * kStageChunksPerRow);
  uint32_t* const staging_words = reinterpret_cast<uint32_t*>(staging);
  const Position lane_first = accumulator_position(lane, 0);
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) {
    const int64_t col = block_col + warp_col + j * kMmaN + lane_first.col;
    if (col >= N) continue;  // N % 8 == 0: the whole chunk column is outside, and its reads below are skipped
BIAS_LINE#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = i * kMmaM + accumulator_position(lane, 2 * half).row;
        staging_words[swizzled_chunk<kStageChunksPerRow>(row, j) * (kChunkBytes / 4) + lane_first.col / 2] =
            course::pack_pair<T>(activate(accumulators[i][j][2 * half] + bias_first, activation),
                                 activate(accumulators[i][j][2 * half + 1] + bias_second, activation));
      }
    }
  }
  __syncwarp();  // the warp's staging area is written by the warp only
  {
    const int chunk = lane % kStageChunksPerRow;
    const int64_t col = block_col + warp_col + chunk * kElementsPerChunk;
    if (col < N) {
#pragma unroll
      for (int p = 0; p < kWarpM / kStageRowsPerStore; ++p) {
        const int row = p * kStageRowsPerStore + lane / kStageChunksPerRow;
        const int64_t global_row = block_row + warp_row + row;
        const uint4 chunk_value = staging[swizzled_chunk<kStageChunksPerRow>(row, chunk)];
        if (global_row < M) *reinterpret_cast<uint4*>(out + global_row * N + col) = chunk_value;
      }
    }
  }
#if 0  // the reference's epilogue, replaced by the one above
"""

# ------------------------------------------------------------------ a smaller block tile
N64 = [("constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 32;",
        "constexpr int kBlockM = 128, kBlockN = 64, kBlockK = 32;  // variant n64"),
       ("constexpr int kWarpM = 64, kWarpN = 64;", "constexpr int kWarpM = 64, kWarpN = 32;  // variant n64"),
       ("constexpr int kMinBlocksPerSm = 1;", "constexpr int kMinBlocksPerSm = 3;  // variant n64")]


def staged(bias_line: str) -> list[tuple[str, str, str]]:
    return [("linear_act.cu", STAGE_BEGIN, STAGED.replace("BIAS_LINE", bias_line) + STAGE_BEGIN),
            ("linear_act.cu", STAGE_END, "  // SOLUTION END\n#endif\n  // --8<-- [end")]


VARIANTS = {
    "stage": staged(BIAS_LINE_REF),
    "bias": [("linear_act.cu", BIAS_ANCHOR, BIAS_EARLY),
             ("linear_act.cu", BIAS_LINE_REF, BIAS_LINE_EARLY)],
    "stage-bias": [("linear_act.cu", BIAS_ANCHOR, BIAS_EARLY), *staged(BIAS_LINE_EARLY)],
    "stage-bias-n64": [("linear_act.cu", BIAS_ANCHOR, BIAS_EARLY), *staged(BIAS_LINE_EARLY),
                       *(("linear_act.cu", old, new) for old, new in N64)],
}


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump") or sorted(glob.glob(str(ROOT / ".venv/lib/python3*/site-packages/triton/"
                                                               "backends/nvidia/bin/cuobjdump")))
    return found if isinstance(found, str) else (found[0] if found else None)


BF16_4 = "_Z17linear_act_kernelI13__nv_bfloat16Li4EEvPKT_S3_S3_PS1_lll10Activation"


def check(name: str, tree: Path, sass: bool) -> None:
    src = tree / "05-tensor-cores"
    for arch in ("sm_90a", "sm_75"):
        cubin = tree / f"linear_act.{arch}.cubin"
        run = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Xptxas", "-v",
                              f"-I{ROOT / 'include'}", f"-I{src}", "-o", str(cubin), str(src / "linear_act.cu")],
                             capture_output=True, text=True)
        if run.returncode:
            print(f"{name} {arch}: FAILED\n{run.stderr[-3000:]}")
            continue
        for block in run.stderr.split("Compiling entry function")[1:]:
            kernel = re.search(r"'_Z17linear_act_kernelI(\w+?)Li(\d+)E", block)
            regs = re.search(r"Used (\d+) registers", block)
            spill = re.search(r"(\d+) bytes spill stores", block)
            smem = re.search(r"(\d+) bytes smem", block)
            if kernel and regs:
                dtype = "bf16" if "bfloat16" in kernel.group(1) else "fp16"
                print(f"{name:<16} {arch:<7} {dtype} {kernel.group(2)} stages: {regs.group(1)} registers, "
                      f"{spill.group(1) if spill else 0} B spill stores, {smem.group(1) if smem else 0} B static smem")
        tool = cuobjdump()
        if sass and arch == "sm_90a" and tool:
            text = subprocess.run([tool, "-sass", "-fun", BF16_4, str(cubin)], capture_output=True, text=True).stdout
            counts = {op: len(re.findall(rf"\b{re.escape(op)}[ ;]", text))
                      for op in ("LDG.E.U16.CONSTANT", "LDG.E.CONSTANT", "STG.E", "STG.E.128", "STS", "LDS.128")}
            first_bias = [i for i, ln in enumerate(text.splitlines()) if "LDG.E" in ln and "CONSTANT" in ln]
            first_hmma = [i for i, ln in enumerate(text.splitlines()) if "HMMA" in ln]
            where = ("before" if first_bias and first_hmma and first_bias[0] < first_hmma[0] else "after")
            print(f"{name:<16} sm_90a  bf16 4 stages SASS (all three activations' copies): {counts}; "
                  f"first bias load {where} the first HMMA")


def check_layout(warp_n: int) -> str:
    """The staging layout's index arithmetic, modelled here (the formulas of accumulator_position and
    swizzled_chunk): every output of a warp tile is written once and read back from where it was written, and
    no shared-memory instruction of the epilogue has a bank conflict (4-byte writes: 32 lanes on 32 banks;
    16-byte reads: each phase of 8 lanes on 32 banks)."""
    warp_m, chunks = 64, warp_n // 8
    rows_per_line = 8 // chunks

    def swizzled(row: int, chunk: int) -> int:
        return row * chunks + (chunk ^ ((row // rows_per_line) % chunks))

    written = {}
    for i in range(warp_m // 16):
        for j in range(warp_n // 8):
            for half in range(2):
                banks = set()
                for lane in range(32):
                    row, col = i * 16 + lane // 4 + 8 * half, j * 8 + 2 * (lane % 4)
                    word = swizzled(row, j) * 4 + (lane % 4)
                    assert word not in written, (warp_n, row, col)
                    written[word] = (row, col)
                    banks.add(word % 32)
                assert len(banks) == 32, f"write conflict at tile ({i}, {j}) half {half}: {len(banks)} banks"
    assert len(written) == warp_m * warp_n // 2
    rows_per_store = 32 // chunks
    for p in range(warp_m // rows_per_store):
        for phase in range(4):
            banks = set()
            for lane in range(8 * phase, 8 * phase + 8):
                row, chunk = p * rows_per_store + lane // chunks, lane % chunks
                first = swizzled(row, chunk) * 4
                for w in range(4):
                    assert written[first + w] == (row, chunk * 8 + 2 * w), (warp_n, row, chunk, w)
                    banks.add((first + w) % 32)
            assert len(banks) == 32, f"read conflict at store {p} phase {phase}"
    return (f"warp tile {warp_m} x {warp_n}: {len(written)} pairs written once and read back in place; "
            f"{warp_m // 16 * warp_n // 8 * 2} 4-byte writes and {warp_m // rows_per_store} 16-byte reads a lane, "
            "no bank conflict")


def main() -> None:
    header = OUT.read_text().split("\n# ---\n")[0] if OUT.exists() else "# (header: see the generator)"
    OUT.write_text(header + "\n# ---\n" + "\n".join(line(n, e) for n, e in VARIANTS.items()) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    for warp_n in (64, 32):  # the reference's warp tile and stage-bias-n64's
        print(check_layout(warp_n))
    if not {"--ptxas", "--sass", "--plant"} & set(sys.argv):
        return
    from coursekit import trees
    from harness.mutants import plant
    lab = trees.find_lab("05")
    if "--plant" in sys.argv:  # where variants.py plants them: the probes and ./course take these paths
        for name, edits in VARIANTS.items():
            print(plant(lab, trees.BUILD / "variants" / lab.name / name, edits).relative_to(ROOT))
        return
    for name, edits in {"base": [], **VARIANTS}.items():
        tree = plant(lab, trees.BUILD / "variants-ptxas" / lab.name / name, edits)
        check(name, tree, "--sass" in sys.argv)


if __name__ == "__main__":
    main()

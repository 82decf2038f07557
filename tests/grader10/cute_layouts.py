"""Lesson 10's CuTe reading: CuTe's layouts against lesson 05's hand derivation, element by element. No GPU.

solutions/10-cutlass/cute/cute_layouts.cpp builds, with CuTe's own layout algebra (the headers of the pinned
nvidia-cutlass wheel, coursekit/cutlass.py), lesson 05's shared-memory swizzles, the thread-value layouts of
the mma.sync.m16n8k16 bf16 atom (SM80_16x8x16_F32BF16BF16F32_TN) and ldmatrix.x4 retiled to them
(make_tiled_copy_A/B), and prints every element with `--dump`. This file computes the same maps the way
lesson 05's code does, from its formulas, transcribed below with the line each comes from (QUOTES: a test
fails when a quoted line is no longer in its file, so the transcription cannot silently drift from the code),
and compares every element.

Not a test_*.py file yet: lab 10 has no grader of its own (issue 18); `pytest tests/grader10/cute_layouts.py`
runs it, and `./course run tests/grader10/cute_layouts.py` prints the tables and the compile time.

The program is compiled once per source and include set (build/cute/, keyed by a hash), with nvcc as a host
compiler: CuTe's layouts are host code. About 8 s on a 2-core machine under load.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import pytest

from coursekit import cutlass

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "solutions" / "10-cutlass" / "cute" / "cute_layouts.cpp"
LESSON05 = ROOT / "solutions" / "05-tensor-cores"
BUILD = ROOT / "build" / "cute"


def _nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@lru_cache(maxsize=None)
def build() -> tuple[Path, float | None]:
    """The compiled program, and the seconds its compile took (None when an up-to-date one was found)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc (CUDA_HOME, /usr/local/cuda or PATH): the CuTe program needs it as its compiler driver")
    includes = [f"-I{d}" for d in cutlass.include_dirs()]
    # CuTe's headers warn (unused local typedefs, CUDA 13's deprecated long4); the program's own code is -Wall clean.
    command = [nvcc, "-std=c++17", "-O1", "-Xcompiler", "-Wall,-Wno-deprecated-declarations,-Wno-unused-local-typedefs",
               *includes, str(SOURCE)]
    key = hashlib.sha256((SOURCE.read_text() + "\n".join(command)).encode()).hexdigest()[:12]
    binary = BUILD / f"cute_layouts-{key}"
    if binary.is_file():
        return binary, None
    BUILD.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = subprocess.run([*command, "-o", str(binary)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        pytest.fail(f"cute_layouts.cpp did not compile ({' '.join(command)}):\n{(done.stdout + done.stderr)[-4000:]}")
    return binary, seconds


@lru_cache(maxsize=None)
def cute() -> dict[str, dict[tuple[int, int], tuple[int, ...]]]:
    """name -> {(first, second): values}: (row, column) -> offset for the swizzles, (thread, value) -> (row, col)."""
    binary, _ = build()
    out = subprocess.run([str(binary), "--dump"], capture_output=True, text=True, check=True).stdout
    maps: dict[str, dict] = {}
    for line in out.splitlines():
        name, *numbers = line.split()
        values = tuple(int(n) for n in numbers)
        maps.setdefault(name, {})[values[:2]] = values[2:]
    return maps


# ---------------------------------------------------------------- lesson 05, as its code computes it
# Each line quoted here is checked to be in its file (test_quotes_are_current); the Python below it is that line.
QUOTES = {
    "accumulator": (LESSON05 / "mma.cuh", [
        "const int group = lane / 4, lane_in_group = lane % 4;",
        "return {group + 8 * (register_index / 2), 2 * lane_in_group + register_index % 2};"]),
    "a_source": (LESSON05 / "mma.cuh", ["return {lane % 16, (lane / 16) * kElementsPerChunk};"]),
    "b_source": (LESSON05 / "mma.cuh", ["return {lane % 8 + 8 * (lane / 16), ((lane / 8) % 2) * kElementsPerChunk};"]),
    "ldmatrix": (LESSON05 / "mma.cuh", [
        "// ldmatrix.x4 loads four 8x8 matrices of 2-byte elements from shared memory; lanes 8i..8i+7",
        "// give the addresses of the 8 rows of matrix i, and matrix i lands in register i of every lane",
        "// with the accumulator pattern (lane l holds row l / 4, elements 2(l % 4), 2(l % 4) + 1)."]),
    "swizzle": (LESSON05 / "mma.cuh", [
        "constexpr int kBankLineChunks = 128 / kChunkBytes;  // 8 chunks cover the 32 banks once",
        "constexpr int kRowsPerLine = kBankLineChunks / kChunksPerRow;",
        "return row * kChunksPerRow + (chunk ^ ((row / kRowsPerLine) % kChunksPerRow));"]),
    "chunk_address": (LESSON05 / "linear_act.cu", [
        "tile_a + swizzled_chunk<kChunksPerRow>(row, chunk_of_step + a_source.col / kElementsPerChunk));",
        "b_fragments[j][0] = pair[0], b_fragments[j][1] = pair[1];",
        "b_fragments[j + 1][0] = pair[2], b_fragments[j + 1][1] = pair[3];"]),
    "tma_swizzle": (LESSON05 / "linear_act_wgmma.cu", [
        "// TMA's 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8).",
        "uint8_t* destination = my_staging + box * kStoreBoxBytes + row * kSwizzleBytes +",
        "(box_chunk ^ (row % 8)) * 16 + col_in_chunk * kElementBytes;"]),
    "gmma_descriptor": (ROOT / "include" / "course" / "wgmma.cuh", [
        "// swizzle: rows of 64 two-byte elements (128 B), 8-row groups 1024 B apart (the stride",
        "constexpr uint64_t kLeadingBytes = 16, kStrideBytes = 1024, kSwizzle128 = 1;"]),
    "fragment_table": (ROOT / "lessons" / "05-tensor-cores.md", [
        "| accumulator \\(D\\) (16x8 fp32) | c0, c1 | row \\(g\\), columns \\(2t, 2t+1\\) |",
        "| | c2, c3 | row \\(g + 8\\), columns \\(2t, 2t+1\\) |",
        "| \\(A\\) (16x16, row-major) | a0 | row \\(g\\), k \\(2t, 2t+1\\) |",
        "| | a1 | row \\(g+8\\), k \\(2t, 2t+1\\) |",
        "| | a2, a3 | as a0, a1 with k + 8 |",
        "| \\(B\\) (16x8, k by n) | b0 | k \\(2t, 2t+1\\), column \\(g\\) |",
        "| | b1 | k \\(2t+8, 2t+9\\), column \\(g\\) |"]),
}
ELEMENTS_PER_CHUNK = 8  # include/course/mma.cuh: kElementsPerChunk = kChunkBytes / 2 (16-byte chunks of bf16)


def accumulator_position(lane: int, register: int) -> tuple[int, int]:
    group, lane_in_group = lane // 4, lane % 4
    return group + 8 * (register // 2), 2 * lane_in_group + register % 2


def ldmatrix_a_source(lane: int) -> tuple[int, int]:
    return lane % 16, (lane // 16) * ELEMENTS_PER_CHUNK


def ldmatrix_b_source(lane: int) -> tuple[int, int]:
    return lane % 8 + 8 * (lane // 16), ((lane // 8) % 2) * ELEMENTS_PER_CHUNK


def ldmatrix_x4(source, lane: int, register: int, half: int) -> tuple[int, int]:
    """The element (row, column) of the tile that lands in half `half` of register `register` of `lane`, when
    each lane l gives the row address source(l): matrix i = register i is addressed by lanes 8i..8i+7, and
    lane l gets row l / 4 of it, elements 2(l % 4) + half."""
    row, first = source(8 * register + lane // 4)
    return row, first + 2 * (lane % 4) + half


def swizzled_chunk(chunks_per_row: int, row: int, chunk: int) -> int:
    rows_per_line = 8 // chunks_per_row
    return row * chunks_per_row + (chunk ^ ((row // rows_per_line) % chunks_per_row))


def swizzled_element(chunks_per_row: int, row: int, k: int) -> int:
    """The element offset of (row, k) in a tile: linear_act.cu addresses chunk k / 8 through swizzled_chunk,
    and the 8 elements of a chunk stay in order."""
    return swizzled_chunk(chunks_per_row, row, k // ELEMENTS_PER_CHUNK) * ELEMENTS_PER_CHUNK + k % ELEMENTS_PER_CHUNK


def tma_swizzled_byte(row: int, k: int) -> int:
    """linear_act_wgmma.cu's 128-byte swizzle (rows of 64 bf16 = 128 B), for a whole tile: 8-row groups 1024 B
    apart (wgmma.cuh's stride byte offset), so row r starts at 128 r."""
    chunk, in_chunk = k // ELEMENTS_PER_CHUNK, k % ELEMENTS_PER_CHUNK
    return row * 128 + (chunk ^ (row % 8)) * 16 + in_chunk * 2


# The lesson's table (lessons/05-tensor-cores.md, section 2), value v of a lane = bf16 v % 2 of register v / 2.
def table_a(lane: int, value: int) -> tuple[int, int]:
    g, t, register, half = lane // 4, lane % 4, value // 2, value % 2
    return g + 8 * (register % 2), 2 * t + half + 8 * (register // 2)


def table_b(lane: int, value: int) -> tuple[int, int]:  # (n, k)
    g, t, register, half = lane // 4, lane % 4, value // 2, value % 2
    return g, 2 * t + half + 8 * register


# ---------------------------------------------------------------- the comparisons
def compare(name: str, expected: dict, what: str) -> None:
    got = cute()[name]
    assert set(got) == set(expected), f"{name}: CuTe's domain {len(got)} entries, lesson 05's {len(expected)}"
    wrong = [(key, got[key], expected[key]) for key in sorted(expected) if got[key] != expected[key]]
    assert not wrong, (f"{name}: {len(wrong)} of {len(expected)} elements differ ({what}); the first: {wrong[0][0]} "
                       f"CuTe {wrong[0][1]}, lesson 05 {wrong[0][2]}")


def test_quotes_are_current():
    """The formulas below are transcriptions: each quoted line must still be in its file."""
    missing = []
    for name, (path, lines) in QUOTES.items():
        text = [line.strip() for line in path.read_text().splitlines()]
        missing += [f"{path.relative_to(ROOT)}: {name}: {line!r}" for line in lines if line.strip() not in text]
    assert not missing, "lesson 05 changed under its transcription here; re-derive and re-quote:\n  " + \
        "\n  ".join(missing)


@pytest.mark.parametrize("chunks_per_row", [4, 8])
def test_swizzle(chunks_per_row):
    """Swizzle<2,3,3> (kBlockK 32) or Swizzle<3,3,3> (kBlockK 64) o the row-major atom, tiled to 128 rows,
    = swizzled_chunk."""
    elements = 8 * chunks_per_row
    expected = {(r, k): (swizzled_element(chunks_per_row, r, k),) for r in range(128) for k in range(elements)}
    compare(f"swizzle{elements}", expected, "offset in elements of (row, k)")


def test_gmma_128_byte_swizzle():
    """CuTe's GMMA::Layout_K_SW128_Atom<bf16>, tiled to 128 x 64 = the Hopper path's TMA swizzle (bytes / 2)."""
    expected = {(r, k): (tma_swizzled_byte(r, k) // 2,) for r in range(128) for k in range(64)}
    compare("gmma_sw128", expected, "offset in elements of (row, k) from a 1024-byte-aligned base")


def test_accumulator_fragment():
    """CuTe's C layout of the atom = accumulator_position: CuTe's value v is the course's register v."""
    expected = {(lane, v): accumulator_position(lane, v) for lane in range(32) for v in range(4)}
    compare("mma_C", expected, "(m, n) of accumulator v of a lane")


def test_a_fragment():
    """CuTe's A layout = what lesson 05's ldmatrix.x4 (ldmatrix_a_source) puts in a[v / 2], half v % 2; = the table."""
    from_code = {(lane, v): ldmatrix_x4(ldmatrix_a_source, lane, v // 2, v % 2) for lane in range(32) for v in range(8)}
    compare("mma_A", from_code, "(m, k) of A value v of a lane, from ldmatrix_a_source")
    compare("mma_A", {(lane, v): table_a(lane, v) for lane in range(32) for v in range(8)}, "the lesson's table")


def test_b_fragment():
    """CuTe's B layout of one atom (n 8) = the lesson's table for b0, b1."""
    compare("mma_B", {(lane, v): table_b(lane, v) for lane in range(32) for v in range(4)}, "(n, k), the table")


def test_b_fragment_two_n_tiles():
    """Two atoms along n (Tile<_16,_16,_16>): CuTe's value v of a lane is half v % 2 of pair[v / 2] of lesson 05's
    ldmatrix.x4 of the weight tile (ldmatrix_b_source), pair[0..1] = b0, b1 of n-tile j, pair[2..3] of n-tile j+1."""
    from_code = {(lane, v): ldmatrix_x4(ldmatrix_b_source, lane, v // 2, v % 2) for lane in range(32) for v in range(8)}
    compare("mma_B16", from_code, "(n, k) of B value v of a lane over n 16, from ldmatrix_b_source")
    # and each n-tile of it is the one-atom table shifted by 8 n per tile: pair[2 j + r] is b_r of n-tile j
    shifted = {(lane, v): (table_b(lane, v % 4)[0] + 8 * (v // 4), table_b(lane, v % 4)[1])
               for lane in range(32) for v in range(8)}
    compare("mma_B16", shifted, "(n, k): n-tile v / 4, register (v / 2) % 2")


@pytest.mark.parametrize("operand, source", [("A", ldmatrix_a_source), ("B", ldmatrix_b_source)])
def test_ldmatrix_sources(operand, source):
    """make_tiled_copy_{A,B}(SM75_U32x4_LDSM_N): lane l's source row is the 8 elements at ldmatrix_{a,b}_source(l)."""
    expected = {(lane, v): (source(lane)[0], source(lane)[1] + v) for lane in range(32) for v in range(8)}
    compare(f"ldsm_{operand}_src", expected, f"(row, k) of element v of lane's 16-byte row, ldmatrix_{operand.lower()}"
            "_source")


@pytest.mark.parametrize("operand", ["A", "B"])
def test_ldmatrix_destination_is_the_fragment(operand):
    """CuTe's own consistency, the premise of the above: the copy lands each element where the mma wants it."""
    compare(f"ldsm_{operand}_dst", cute()["mma_A" if operand == "A" else "mma_B16"], "copy destination vs mma layout")


def test_tables_print():
    binary, _ = build()
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    for expected in ("Sw<2,3,3> o _0 o (_8,_32):(_32,_1)", "Sw<3,4,3> o smem_ptr[16b](unset) o (_8,_64):(_64,_1)",
                     "((_4,_8),((_2,_2,_2),(_1,_1))):((_32,_1),((_16,_8,_128),(_0,_0)))"):
        assert expected in out, f"the tables no longer show {expected!r}"


if __name__ == "__main__":
    binary, seconds = build()
    print(subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout)
    print(f"[cute] {binary}: " + (f"compiled in {seconds:.1f} s" if seconds is not None else "up to date"),
          file=sys.stderr)

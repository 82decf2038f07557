"""Grader for lab 02: transpose through shared memory (naive, tiled, padded), its grid,
its bank-conflict-free tile, batched and strided inputs, and its speed against a copy."""
from __future__ import annotations

import math

import pytest
import torch

import harness
from harness import inputs, notebooks, random_tensor, requires_gpu, tolerance
from harness.check import pool_bytes, shape_id
from harness.inputs import Arg

LAB = harness.lab("02")
FP32 = torch.float32
# Shapes that are not multiples of the tile (1, 31, 33, 4097), tall and wide, square, batched,
# and one with more tiles than an H100 holds at once (1025 x 2049: 2145 blocks), so that the
# edge tiles run long after the first tiles have finished.
SHAPES = [(1, 1), (1, 31), (31, 33), (32, 32), (33, 4097), (4097, 33), (1000, 1000), (1025, 2049),
          (3, 33, 65), (2, 1, 1), (8, 64, 96)]
KERNELS = {"naive": ("lab02.1",), "tiled": ("lab02.1", "lab02.2"), "padded": ("lab02.1", "lab02.2", "lab02.3")}
HINT = ("find the pattern in the wrong elements: NaN = never written (a missing tile or a kernel left empty); "
        "wrong in every tile = row/col swapped in the shared-memory read or the output index; "
        "wrong only at the start of rows after an edge tile = the write-out is missing its edge guard "
        "(out_row < cols && out_col < rows), so the last tile spills into the next row; "
        "wrong in a few scattered tiles, differing between runs = a missing __syncthreads() between "
        "filling the tile and reading it back (a warp read a row another warp had not written yet)")
SPILL_HINT = ("the write-out is missing its edge guard (out_row < cols && out_col < rows): the last tile of the "
              "last matrix runs past the output's end")

# Points per task (of 100), by the work each is: the wrapper's output shape and strides; the tiled
# kernel, the lab's main work; the padded stride, one line and its reasoning.
POINTS = {"lab02.1": 25, "lab02.2": 55, "lab02.3": 20}


# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck,
# synccheck) by default: regular expressions over test names (conftest marks them `sanitize`).
SANITIZE_CASES = [r"test_transpose\[.*-(31x33|33x4097)\]"]


def kernel_params(*names):
    """The kernels (all, or those named) as parameters, each marked with the tasks it grades."""
    return [pytest.param(name, marks=harness.tasks(*KERNELS[name])) for name in names or KERNELS]


def tile_layout() -> dict:
    """The kernels' tile and block shapes, and the warp and bank widths they derive from, from the lab
    itself: read inside the tests, so a lab that does not build fails each test rather than the import."""
    return LAB.module.tile_layout()


def tile_shape() -> tuple[int, int]:
    """The kernels' square tile: the grader reports wrong elements by tile."""
    tile = tile_layout()["tile"]
    return tile, tile


def transposed(x: torch.Tensor) -> torch.Tensor:
    """The float64 reference: the last two dims swapped."""
    return x.double().transpose(-2, -1).contiguous()


def run(kernel: str, x: torch.Tensor) -> torch.Tensor:
    return getattr(LAB.module, f"{kernel}_transpose")(x)


def run_guarded(kernel: str, x: torch.Tensor, *, case: str) -> torch.Tensor:
    """The transpose with its output from a poisoned pool (harness.check.PoisonedPool): an element never written
    reads NaN, and a write past the output's end (the allocator's slack after it) fails."""
    with harness.check.PoisonedPool(large_bytes=pool_bytes(4 * x.numel())) as pool:
        out = run(kernel, x)
    pool.assert_no_spill(out, name="out", case=case, hint=SPILL_HINT)
    return out


@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports: checked on every machine, GPU or not."""
    for name in ("naive_transpose", "tiled_transpose", "padded_transpose", "transpose_grid", "tile_layout"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"


# ---------------------------------------------------------------- CPU-side: the grid and the tile
@pytest.mark.parametrize("batch, rows, cols", [(1, 1, 1), (1, 31, 33), (1, 33, 4097), (1, 4097, 33), (7, 1000, 1000),
                                               (1, 8192, 8192), (1, 2**31, 1), (0, 5, 5), (1, 0, 9)])
@harness.reference_check  # transpose_grid is given
def test_transpose_grid(batch, rows, cols):
    across, down, blocks = LAB.module.transpose_grid(batch, rows, cols)
    tile = LAB.module.tile_layout()["tile"]
    case = (f"transpose_grid(batch={batch}, rows={rows}, cols={cols}) "
            f"gave {across} tiles across, {down} down, {blocks} blocks")
    problems = []
    if across * tile < cols or down * tile < rows:
        problems.append(f"the tiles do not cover the matrix: round up with ceil(n / {tile}), "
                        "the last tile may be partial")
    if (across - 1) * tile >= max(cols, 1) or (down - 1) * tile >= max(rows, 1):
        problems.append("a whole row or column of tiles lies outside the matrix")
    if blocks != batch * across * down:
        problems.append("one block per tile of every matrix: blocks = batch * tiles_down * tiles_across")
    if problems:
        raise harness.GradeFailure(f"{case}:\n  " + "\n  ".join(problems))


def column_read_banks(row_stride: int) -> list[int]:
    """Lanes per bank when lane i reads tile[i][0] of a tile whose rows are row_stride floats apart."""
    layout = tile_layout()
    banks = layout["banks"]
    hits = [0] * banks
    for lane in range(layout["warp_size"]):
        hits[(lane * row_stride) % banks] += 1
    return hits


@harness.reference_check  # kTile and kBlockRows are given
def test_tile_shape_is_derived_from_the_hardware():
    layout = tile_layout()
    tile, block_rows, warp = layout["tile"], layout["block_rows"], layout["warp_size"]
    assert tile == warp, f"a tile row should be one warp wide ({warp} floats = {4 * warp} B, one line), got {tile}"
    threads = tile * block_rows
    assert threads % warp == 0 and threads <= 1024 and tile % block_rows == 0, (
        f"a {tile} x {block_rows} block: whole warps, at most 1024 threads, a whole number of rows per thread")


@harness.tasks("lab02.3")
def test_padded_tile_is_conflict_free():
    """The padded kernel's shared tile must let a warp read a column in one pass: 32 lanes, 32 banks."""
    layout = tile_layout()
    stride, tile, bank_count = layout["padded_row_stride"], layout["tile"], layout["banks"]
    hits = column_read_banks(stride)
    worst = max(hits)
    shared_bytes = tile * stride * layout["bank_bytes"]
    t4_blocks = 1024 // (tile * layout["block_rows"])  # the blocks a T4's 1024 resident threads make
    if worst > 1:
        banks = [b for b, n in enumerate(hits) if n]
        raise harness.GradeFailure(
            f"padded tile: rows are {stride} floats apart, so a warp reading a column (lane i reads tile[i][c]) "
            f"lands {worst} lanes in one bank (banks used: {banks[:8]}{'...' if len(banks) > 8 else ''}): "
            f"a {worst}-way bank conflict, {worst} cycles instead of 1\n"
            f"  hint: tile[i][c] is in bank (i * row_stride + c) mod {bank_count}; which row strides make "
            f"i * row_stride mod {bank_count} take {tile} different values for i = 0..{tile - 1}?")
    assert stride >= tile, f"the padded tile's rows ({stride} floats) must hold a whole tile row of {tile}"
    assert shared_bytes * t4_blocks <= 64 * 1024, (
        f"the padded tile takes {shared_bytes} B; {t4_blocks} blocks per SM must fit a T4's 64 KiB of shared memory")


@harness.reference_check  # the plain tiled kernel's row stride is given
def test_unpadded_tile_has_the_conflict_the_lesson_measures():
    layout = tile_layout()
    stride, warp = layout["tiled_row_stride"], layout["warp_size"]
    assert max(column_read_banks(stride)) == warp, (
        f"the plain tiled kernel should keep its unpadded {stride}-float rows, "
        f"so the lesson can measure the {warp}-way conflict")


# ---------------------------------------------------------------- CPU-side: input checks that need no GPU
@pytest.mark.parametrize("kernel", KERNELS)
@harness.reference_check  # the device check comes before the lab02.1 region
def test_refuses_cpu_tensor(kernel):
    LAB.assert_raises_clearly(lambda: run(kernel, torch.ones(4, 4)), must_mention=("CUDA",),
                              case=f"{kernel}_transpose(x on the CPU)")


# x refused when it is not one (harness.inputs): on fake CUDA tensors (no GPU needed) and on real ones. Any strides are
# taken (the kernels read through them), so a strided x is not refused.
TRANSPOSE_ARGUMENTS = [Arg("x", dtype=torch.float64, shape=lambda t: t[0], strided=False,
                           words={"dtype": ("dtype", "float32"), "shape": ("matrix",)})]


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("kernel", KERNELS)
@harness.reference_check  # the checks come before the lab02.1 region
def test_each_argument_checked(kernel, real):
    inputs.assert_each_argument_checked(f"{kernel}_transpose", lambda x: run(kernel, x),
                                        lambda: {"x": random_tensor((33, 17), FP32)}, TRANSPOSE_ARGUMENTS, real=real)


# ---------------------------------------------------------------- GPU: correctness
@requires_gpu
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("kernel", kernel_params())
def test_transpose(kernel, shape):
    x = random_tensor(shape, FP32)
    case = f"{kernel}_transpose shape {shape_id(shape)}, fp32"
    out = run_guarded(kernel, x, case=case)
    LAB.assert_close(out, transposed(x), case=case, tol=tolerance(FP32), tile=tile_shape(), hint=HINT)


@requires_gpu
@pytest.mark.large
@pytest.mark.parametrize("kernel", kernel_params())
def test_transpose_past_2_31_elements(kernel, gpu_memory):
    """A 65537 x 32769 matrix, 2^31 + 98305 floats: element offsets (row * cols + col) pass 2^31, so the
    kernels must compute them in int64 (tile indices alone fit in int)."""
    gpu_memory(20)
    rows, cols = 2**16 + 1, 2**15 + 1
    x = torch.randn(rows, cols, device="cuda")
    out = run(kernel, x)

    def reference_of(part):  # out[r, c] = x[c, r] at out's flat indices part
        index = torch.arange(part.start, part.stop, device="cuda")
        return x[index % rows, index // rows].double()

    harness.check.assert_ends_close(out, reference_of, tol=tolerance(FP32), tile=tile_shape(), hint=HINT,
                                    case=f"{kernel}_transpose of {rows}x{cols} fp32")


@requires_gpu
@pytest.mark.parametrize("kernel", kernel_params("tiled", "padded"))
def test_transpose_repeatedly(kernel):
    """Races show up now and then: many tiles, several runs, each compared in full, each on a fresh input.
    The same input every run can hide a missing __syncthreads(): a warp that reads the tile before the
    other warps have stored it finds the values an earlier run of the same input left in shared memory."""
    for attempt in range(5):
        x = random_tensor((16, 1000, 1000), FP32)
        want = transposed(x)
        case = f"{kernel}_transpose shape 16x1000x1000, run {attempt + 1} of 5"
        out = run_guarded(kernel, x, case=case)
        LAB.assert_close(out, want, case=case, tol=tolerance(FP32), tile=tile_shape(), hint=HINT)


def strided_views():
    """(name, a non-contiguous input) pairs: each a view torch makes without a copy."""
    wide = random_tensor((70, 200), FP32)
    square = random_tensor((65, 65), FP32)
    batch = random_tensor((33, 5, 47), FP32)
    return [
        ("column slice wide[:, 3:100] (row stride 200)", wide[:, 3:100]),
        ("every other column wide[:, ::2] (column stride 2)", wide[:, ::2]),
        ("transposed view square.t()", square.t()),
        ("batch-second view batch.transpose(0, 1)", batch.transpose(0, 1)),
        ("expanded batch expand(4, 33, 47) (batch stride 0)", batch[:, 0].expand(4, 33, 47)),
        ("row slice with offset wide[5:40]", wide[5:40]),
    ]


@requires_gpu
@pytest.mark.parametrize("kernel", kernel_params())
def test_noncontiguous_input(kernel):
    """Views are handled through their strides, with no copy and no refusal."""
    for name, x in strided_views():
        assert not x.is_contiguous() or x.storage_offset(), name
        case = f"{kernel}_transpose of {name}, shape {shape_id(x.shape)}"
        out = run_guarded(kernel, x, case=case)
        LAB.assert_close(out, transposed(x), case=case, tol=tolerance(FP32), tile=tile_shape(),
                         hint="element (b, r, c) of x is at b * x.stride(0) + r * x.stride(-2) + c * x.stride(-1); "
                              "pass the strides torch reports instead of assuming a contiguous layout")


@requires_gpu
@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (3, 0, 7), (0, 4, 4)], ids=shape_id)
@harness.tasks("lab02.1")  # the output's shape; launch_transpose (given) launches nothing for an empty grid
def test_empty_input(shape):
    x = torch.empty(shape, device="cuda")
    for kernel in KERNELS:
        out = run(kernel, x)
        want = tuple(shape[:-2]) + (shape[-1], shape[-2])
        assert tuple(out.shape) == want, (
            f"{kernel}_transpose of an empty {shape_id(shape)} tensor returned shape {tuple(out.shape)}, "
            f"expected {want}")


@requires_gpu
@pytest.mark.parametrize("kernel", kernel_params())
def test_runs_on_current_stream(kernel):
    """Every kernel must run on PyTorch's current stream: checked by capturing it in a CUDA graph."""
    source = random_tensor((4, 512, 768), FP32)
    out = LAB.capture_on_current_stream(lambda: run(kernel, source), inputs=source, case=f"{kernel}_transpose")
    LAB.assert_close(out, transposed(source), case=f"{kernel}_transpose replayed from a CUDA graph",
                     tol=tolerance(FP32), tile=tile_shape(), hint=harness.STREAM_HINT)


@requires_gpu
@pytest.mark.parametrize("kernel", KERNELS)
@harness.reference_check  # the dtype and dimension checks come before the lab02.1 region
def test_input_errors(kernel):
    x = random_tensor((33, 17), FP32)
    LAB.assert_raises_clearly(lambda: run(kernel, x.double()), must_mention=("dtype", "float"),
                              case=f"{kernel}_transpose(x of dtype float64)")
    LAB.assert_raises_clearly(lambda: run(kernel, x.half()), must_mention=("dtype",),
                              case=f"{kernel}_transpose(x of dtype float16)")
    LAB.assert_raises_clearly(lambda: run(kernel, x[0]), must_mention=("matrix",),
                              case=f"{kernel}_transpose(x of shape [17], a vector)")
    LAB.assert_raises_clearly(lambda: run(kernel, x.reshape(1, 1, 33, 17)), must_mention=("3 dimensions",),
                              case=f"{kernel}_transpose(x of shape [1, 1, 33, 17])")


# ---------------------------------------------------------------- GPU: speed
# Memory-bound: a transpose reads and writes every element once, 2 x 4 bytes per float.
# 4 x 8192 x 8192 floats = 1 GiB per tensor (each matrix the SYLLABUS's 8192^2 case), 20x
# an H100's 50 MiB L2, so this times HBM, and 262144 tiles fill every SM many times over.
PERF_SHAPE = (4, 8192, 8192)
PERF_BYTES = 2 * 4 * math.prod(PERF_SHAPE)


def perf_case(kernel: str, *, against: str, student_bar: float, target: float):
    x = random_tensor(PERF_SHAPE, FP32)
    last = {}

    def ours():
        last["out"] = run(kernel, x)

    if against == "copy":
        # The ceiling: the same bytes read and written by PyTorch's vectorized copy kernel.
        dst = torch.empty_like(x)
        baseline, baseline_name = (lambda: dst.copy_(x)), "torch copy (same bytes)"
    else:
        baseline, baseline_name = (lambda: x.transpose(-2, -1).contiguous()), "x.transpose(-2, -1).contiguous()"

    def verify():
        LAB.assert_close(last["out"], x.transpose(-2, -1), case=f"{kernel}_transpose: the output of the timed calls",
                         tol=tolerance(FP32), tile=tile_shape(), hint=HINT)

    LAB.perf(name=f"{kernel} transpose {shape_id(PERF_SHAPE)} fp32 vs {against}", ours=ours, baseline=baseline,
             baseline_name=baseline_name, bytes_moved=PERF_BYTES, student_bar=student_bar, target=target, verify=verify,
             inputs=(x,))


@requires_gpu
@pytest.mark.perf
@harness.tasks(*KERNELS["naive"])
def test_perf_naive_vs_copy():
    """The given naive kernel: the bottom rung of the ladder, only held to a sanity floor."""
    perf_case("naive", against="copy", student_bar=0.08, target=0.1)  # measured 0.13x on an H200 (2026-11-21)


@requires_gpu
@pytest.mark.perf
@harness.tasks(*KERNELS["tiled"])
def test_perf_tiled_vs_copy():
    """Coalesced on both sides, but every column read of the tile is a 32-way bank conflict, which
    caps it near 2 TB/s on an H100 or H200 (132 SMs x ~1.9 GHz x 8 KiB per 1024 bank passes):
    ~0.6x copy on an H100, ~0.5x on an H200. The bars only say it works at all."""
    perf_case("tiled", against="copy", student_bar=0.3, target=0.35)


@requires_gpu
@pytest.mark.perf
@harness.tasks(*KERNELS["padded"])
def test_perf_padded_vs_copy():
    """The SYLLABUS target: >= 0.85x copy bandwidth. The student bar (0.75) sits above what a
    bank-conflicted tile reaches (~0.6x on an H100, ~0.5x on an H200), so an unpadded tile fails it there.
    Only there: where the conflicted tile's ceiling (SMs x clock x 8 B) is above the DRAM's bandwidth, as
    on a T4 (~0.5 TB/s against 320 GB/s), both tiles pass and test_padded_tile_is_conflict_free decides."""
    perf_case("padded", against="copy", student_bar=0.75, target=0.85)


@requires_gpu
@pytest.mark.perf
@harness.tasks(*KERNELS["padded"])
def test_perf_padded_vs_torch_transpose():
    """PyTorch's own transpose-and-copy, the op this kernel would replace: at least as fast."""
    perf_case("padded", against="torch", student_bar=0.8, target=1.0)


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
MUTANTS = [
    harness.Mutant("no-syncthreads", "transpose.cu", "  __syncthreads();\n", "",
                   tests="test_transpose and (tiled or padded)", expect="__syncthreads"),
    harness.Mutant("swapped-tile-read", "transpose.cu", "= tile[lane][threadIdx.y + j * kBlockRows];",
                   "= tile[threadIdx.y + j * kBlockRows][lane];", tests="test_transpose and padded", expect="tile ("),
    harness.Mutant("unguarded-edge-write", "transpose.cu", "if (out_row < shape.cols && out_col < shape.rows) {",
                   "if (out_row < shape.cols) {", tests="test_transpose and padded", expect="edge guard"),
    # Out of bounds (issue 11, class 1): the write-out guards columns but not rows, so the last row of tiles writes
    # output rows past `cols`: past the end of out (zeros from the tile's zero-filled edge), every element of out
    # right for one matrix. Only the check of the allocator's slack after out sees it.
    harness.Mutant("edge-rows-unguarded", "transpose.cu", "if (out_row < shape.cols && out_col < shape.rows) {",
                   "if (out_col < shape.rows) {", tests="test_transpose and padded",
                   expect="wrote past the end of out"),
    harness.Mutant("floor-division-grid", "transpose.cu", "course::ceil_div<int64_t>(rows, kTile)", "rows / kTile",
                   tests="test_transpose_grid", expect="round up", needs_gpu=False),
    harness.Mutant("padding-removed", "transpose.cu",
                   "constexpr int kPaddedRowStride = kTile + 1;\n"
                   "static_assert(column_read_ways(kPaddedRowStride) == 1, "
                   "\"padded tile: a column read touches 32 different banks\");\n",
                   "constexpr int kPaddedRowStride = kTile;\n", tests="test_perf_padded_vs_copy",
                   expect="below the student bar", perf=True),
    # Perf (issue 11, class 6): the tile staged in shared memory but not used to turn the block around: each thread
    # writes back the elements it read, so a warp's 32 stores land in 32 output rows, as in the naive kernel. Correct
    # (the same element goes to the same place), and the tiled rung's technique, coalesced writes, is gone.
    harness.Mutant("tile-written-untransposed", "transpose.cu",
                   "  const int64_t out_col = origin.row + lane;\n"
                   "#pragma unroll\n"
                   "  for (int j = 0; j < kRowsPerThread; ++j) {\n"
                   "    const int64_t out_row = origin.col + threadIdx.y + j * kBlockRows;\n"
                   "    if (out_row < shape.cols && out_col < shape.rows) {\n"
                   "      result[out_row * shape.rows + out_col] = tile[lane][threadIdx.y + j * kBlockRows];\n",
                   "#pragma unroll\n"
                   "  for (int j = 0; j < kRowsPerThread; ++j) {\n"
                   "    const int64_t in_row = origin.row + threadIdx.y + j * kBlockRows;\n"
                   "    if (in_row < shape.rows && in_col < shape.cols) {\n"
                   "      result[in_col * shape.rows + in_row] = tile[threadIdx.y + j * kBlockRows][lane];\n",
                   tests="test_perf_tiled_vs_copy", expect="below the student bar", perf=True),
]

"""Grader for lab 04: the SGEMM ladder, kernel 1 (naive) ... kernel 7 (warp tiling), against cuBLAS fp32."""
from __future__ import annotations

import contextlib

import pytest
import torch

import harness
from harness import notebooks, poison_allocator, random_tensor, requires_gpu, tolerance
from harness.check import pool_bytes, shape_id
from harness.inputs import Arg

LAB = harness.lab("04")
FP32 = torch.float32


class Rung:
    def __init__(self, number, name, tasks, hint):
        self.number, self.name, self.tasks, self.hint = number, name, tasks, hint

    @property
    def tile(self) -> tuple[int, int]:
        """The tile of C one block computes (rows, cols), for locating wrong elements: from the lab itself,
        read when a test needs it, so a lab that does not build fails each test rather than the import."""
        return tuple(LAB.module.tiles()[self.number])

    def __repr__(self):
        return f"k{self.number}-{self.name.replace(' ', '-')}"


_GUARDS = "loads outside A or B must read 0 (zero-fill), and stores outside C must be skipped"
SPILL_HINT = ("an edge tile's stores need both guards, row < M and col < N: without the row guard the last row of "
              "tiles writes rows past M, past the end of C")
# The ladder: number, name (as the perf cases and the lesson call it), the tasks each kernel needs,
# and a hint for when it is wrong.
LADDER = [
    Rung(1, "naive", (), "one thread per C[row, col]; rows past M or columns past N return"),
    Rung(2, "coalesced", (), "threadIdx.x walks along a row of C"),
    Rung(3, "smem tiles", ("lab04.1",),
         "each step k0: a_tile[ty][tx] = A[row, k0 + tx], b_tile[ty][tx] = B[k0 + ty, col], a __syncthreads() after "
         "the loads and another after the products; " + _GUARDS),
    Rung(4, "1D register blocking", (), _GUARDS),
    Rung(5, "2D register blocking", ("lab04.2",),
         "pass p loads tile rows a_row + p * kRowsPerPassA and b_row + p * kRowsPerPassB; acc[i][j] is "
         "C[row0 + thread_row + i, col0 + thread_col + j]; " + _GUARDS),
    # Kernels 6 and 7 run kernel 5 when can_vectorize() says no (and its stub always says no).
    Rung(6, "vectorized", ("lab04.2", "lab04.3"),
         "float4 loads and stores need K and N multiples of 4 and 16-byte-aligned A, B and C: otherwise kernel 5 runs"),
    Rung(7, "warp tiling", ("lab04.2", "lab04.3"),
         "float4 loads and stores need K and N multiples of 4 and 16-byte-aligned A, B and C: otherwise kernel 5 runs"),
]
RUNG = {r.number: r for r in LADDER}
# Points per task (of 100), by the work each is: the shared-memory tile loop; the 2D register-blocked
# kernel, the lab's main work; can_vectorize, a few lines of alignment arithmetic.
POINTS = {"lab04.1": 35, "lab04.2": 50, "lab04.3": 15}


# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck,
# synccheck) by default: regular expressions over test names (conftest marks them `sanitize`).
SANITIZE_CASES = [r"test_matmul\[.*-17x33x65\]"]


def rung_marks(rung):
    """A rung's parameter marks: the tasks its kernel needs, or reference_check for a given kernel (1, 2, 4)."""
    return harness.tasks(*rung.tasks) if rung.tasks else harness.reference_check


RUNGS = [pytest.param(rung, id=repr(rung), marks=rung_marks(rung)) for rung in LADDER]
# (M, N, K): tiny, odd, not multiples of any tile, square and very rectangular. 1000 and 36 are
# multiples of 4 (kernels 6 and 7 take their float4 path with partial tiles); 33, 4097 and 65 are not.
SHAPES = [
    (1, 1, 1), (1, 4096, 4), (17, 33, 65), (64, 64, 64), (129, 260, 36), (31, 4097, 33),
    pytest.param((1000, 1000, 1000), marks=pytest.mark.large), pytest.param((4097, 31, 129), marks=pytest.mark.large),
    pytest.param((128, 4097, 64), marks=pytest.mark.large), pytest.param((4096, 12, 520), marks=pytest.mark.large),
]


@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports: checked on every machine, GPU or not."""
    for name in ("matmul", "kernels", "tiles", "can_vectorize"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"
    names = LAB.module.kernels()
    assert sorted(names) == [r.number for r in LADDER], f"kernels() lists {names}, expected kernels 1 ... 7"


# ---------------------------------------------------------------- CPU-side: when float4s are safe
BASE = 0x7F00_0000_0000  # 512-byte aligned, like the caching allocator's blocks
VECTOR_SHAPES = [(1, 4, 4), (17, 33, 65), (128, 128, 128), (1000, 1000, 1000), (4097, 31, 129), (5, 8, 6), (5, 6, 8),
                 (3, 4096, 4097)]
OFFSETS = [(0, 0, 0), (4, 0, 0), (0, 8, 0), (0, 0, 12), (16, 32, 48), (2, 0, 0)]


@pytest.mark.parametrize("offsets", OFFSETS, ids=lambda o: "a+{}-b+{}-c+{}".format(*o))
@pytest.mark.parametrize("shape", VECTOR_SHAPES, ids=shape_id)
@harness.tasks("lab04.3")
def test_can_vectorize(shape, offsets):
    M, N, K = shape
    a, b, c = (BASE + i * 2**30 + off for i, off in enumerate(offsets))
    got = LAB.module.can_vectorize(M, N, K, a, b, c)
    case = f"can_vectorize(M={M}, N={N}, K={K}, A, B, C at 16k + {offsets} bytes) gave {got}"
    reasons = []
    if K % 4:
        reasons.append(f"K = {K} is not a multiple of 4: row 1 of A starts 4 * K bytes after row 0, "
                       "off the 16-byte grid, and the last float4 of a row would run into the next row")
    if N % 4:
        reasons.append(f"N = {N} is not a multiple of 4: the rows of B and C do not all start on a 16-byte boundary")
    for name, off in zip("ABC", offsets):
        if off % 16:
            reasons.append(f"{name} starts {off % 16} bytes past a 16-byte boundary: a float4 access there fails "
                           "with 'misaligned address'")
    want = not reasons
    if got != want:
        why = ("\n  " + "\n  ".join(reasons)) if reasons else (
            "\n  every float4 is whole and 16-byte aligned here (K and N multiples of 4, A, B and C aligned): "
            "saying no runs the slower kernel 5")
        raise harness.GradeFailure(f"{case}, expected {want}:{why}")


# ---------------------------------------------------------------- CPU-side: input checks that need no GPU
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensors():
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(torch.ones(4, 4), torch.ones(4, 4), 3), must_mention=("CUDA",),
                              case="matmul(a, b on the CPU)")


@requires_gpu
@harness.reference_check  # the wrapper's size check is given
def test_refuses_2_31_elements():
    """The ladder's kernels index with int: C of 46341 x 46341 (2^31 + 4633 elements) must be refused
    before anything is allocated (A and B here are 46341 x 1 and 1 x 46341: 362 KiB)."""
    n = 46341
    a, b = torch.ones(n, 1, device="cuda"), torch.ones(1, n, device="cuda")
    before = torch.cuda.memory_allocated()
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(a, b, 7), must_mention=("2^31",),
                              case=f"matmul of {n}x1 by 1x{n} (C past 2^31 elements)")
    assert torch.cuda.memory_allocated() == before, "matmul allocated memory before refusing the size"


# a and b each refused on their own, the other valid (harness.inputs): on fake CUDA tensors (no GPU needed) and on real
# ones. A wrong shape is one whose inner dimension does not match the other's.
MATMUL_ARGUMENTS = [Arg("a", dtype=torch.float64, shape=lambda t: t[:, :-1], words={"shape": ("inner",)}),
                    Arg("b", dtype=torch.float64, shape=lambda t: t[:-1], words={"shape": ("inner",)})]


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(real):
    def make_args():
        return {"a": random_tensor((64, 48), FP32), "b": random_tensor((48, 32), FP32), "kernel": 5}

    harness.inputs.assert_each_argument_checked("matmul", LAB.module.matmul, make_args, MATMUL_ARGUMENTS, real=real)


@pytest.mark.parametrize("kernel", [0, 8, -1])
@harness.reference_check
def test_refuses_unknown_kernel(kernel):
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(torch.ones(4, 4), torch.ones(4, 4), kernel),
                              must_mention=("kernel",), case=f"matmul(a, b, kernel={kernel})")


# ---------------------------------------------------------------- GPU: correctness
def _run_and_check(rung, a, b, inputs="", hint=None, expected=None):
    """Run the rung's kernel on a @ b and compare C with the float64 product (or `expected`).

    `inputs` is appended to the case line ("kernel 5 (...), M=.. N=.. K=..") to say what is special about a and b;
    `hint` replaces the rung's own hint."""
    (M, K), N = a.shape, b.shape[1]
    case = f"kernel {rung.number} ({rung.name}), M={M} N={N} K={K}{inputs}"
    # C from a poisoned pool (harness.check.PoisonedPool): an element never written reads NaN, and a store past C's
    # end (an edge tile's rows past M) changes the allocator's slack after it.
    with harness.check.PoisonedPool(large_bytes=pool_bytes(4 * M * N)) as pool:
        c = LAB.module.matmul(a, b, rung.number)
    pool.assert_no_spill(c, name="c", case=case, hint=SPILL_HINT)
    LAB.assert_close(c, a.double() @ b.double() if expected is None else expected, case=case, tol=tolerance(FP32, K),
                     tile=rung.tile, hint=rung.hint if hint is None else hint)


@requires_gpu
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("rung", RUNGS)
def test_matmul(rung, shape):
    M, N, K = shape
    a, b = random_tensor((M, K), FP32), random_tensor((K, N), FP32)
    _run_and_check(rung, a, b)


@requires_gpu
@pytest.mark.parametrize("rung", RUNGS)
def test_matmul_many_tiles_of_k(rung):
    """A long K: hundreds of tile loads per block, each a chance for a missing __syncthreads to race."""
    M, N, K = 512, 512, 4096
    a, b = random_tensor((M, K), FP32), random_tensor((K, N), FP32)
    expected = a.double() @ b.double()
    for attempt in range(3):
        _run_and_check(rung, a, b, f", call {attempt + 1}", expected=expected,
                       hint="right on some calls and wrong on others, or wrong in scattered tiles, is a race: every "
                            "tile load needs a __syncthreads() before the products read it, and another after them "
                            "before the next load overwrites it")


def _in_nan_band(rows, cols, band):
    """A [rows, cols] matrix stored `band` floats into a buffer of NaNs, with `band` NaNs after it too.

    band is a multiple of 4 floats, so the matrix keeps the buffer's 16-byte alignment."""
    buffer = torch.full((band + rows * cols + band,), float("nan"), device="cuda")
    matrix = buffer[band:band + rows * cols].view(rows, cols)
    matrix.copy_(random_tensor((rows, cols), FP32))
    return matrix


@requires_gpu
@pytest.mark.parametrize("shape", [(17, 33, 65), (129, 260, 36), (33, 100, 131)], ids=shape_id)
@pytest.mark.parametrize("rung", RUNGS)
def test_matmul_guard_bands(rung, shape):
    """A and B sit between NaNs: a kernel that reads outside them multiplies a NaN into C."""
    M, N, K = shape
    band = max(max(r.tile) for r in LADDER) * max(M, N, K)  # past the largest tile's overhang
    a, b = _in_nan_band(M, K, band), _in_nan_band(K, N, band)
    _run_and_check(rung, a, b, ", A and B surrounded by NaN",
                   hint="NaN in C here means the kernel read outside A or B: an edge tile's loads must be guarded "
                        "(rows past M, columns past N and k past K read as 0, never from memory); zero-filling A "
                        "alone is not enough, since 0 * NaN = NaN")


@requires_gpu
@pytest.mark.parametrize("rung", RUNGS)
def test_matmul_misaligned(rung):
    """Contiguous views that start 4 bytes past a 16-byte boundary (x[1:]): kernels 6 and 7 must fall back."""
    M, N, K = 64, 128, 96
    a = random_tensor((M * K + 1,), FP32)[1:].view(M, K)
    b = random_tensor((K * N + 3,), FP32)[3:].view(K, N)
    _run_and_check(rung, a, b, ", a = x[1:].view(...), b = y[3:].view(...)")


@requires_gpu
@pytest.mark.parametrize("rung", LADDER, ids=repr)
@harness.reference_check  # the wrapper (given) returns before any kernel when M, N or K is 0
def test_empty(rung):
    a, b = random_tensor((5, 0), FP32), random_tensor((0, 7), FP32)
    poison_allocator(35, FP32)
    c = LAB.module.matmul(a, b, rung.number)
    assert torch.equal(c, torch.zeros(5, 7, device="cuda")), f"kernel {rung.number}: [5, 0] @ [0, 7] must be zeros"
    assert LAB.module.matmul(random_tensor((0, 3), FP32), random_tensor((3, 4), FP32), rung.number).shape == (0, 4)


@requires_gpu
@harness.tasks(harness.ALL)
def test_runs_on_current_stream():
    """The kernels must run on PyTorch's current stream: checked by capturing them in a CUDA graph."""
    a = random_tensor((256, 256), FP32)
    outs = LAB.capture_on_current_stream(lambda: {rung.number: LAB.module.matmul(a, a, rung.number) for rung in LADDER},
                                         inputs=a, case="every kernel of the ladder")
    for rung in LADDER:
        LAB.assert_close(outs[rung.number], a.double() @ a.double(),
                         case=f"kernel {rung.number} replayed from a CUDA graph",
                         tol=tolerance(FP32, 256), hint=harness.STREAM_HINT)


# ---------------------------------------------------------------- GPU: bad input gets a clear error
@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_refuses_non_contiguous():
    """Only row-major, gap-free matrices: a transposed or sliced view is refused, never read in the wrong order."""
    a, b = random_tensor((64, 48), FP32), random_tensor((48, 32), FP32)
    views = {"a = x.t() of a [48, 64] tensor": (random_tensor((48, 64), FP32).t(), b),
             "b.t() of a [32, 48] tensor": (a, random_tensor((32, 48), FP32).t()),
             "a[:, ::2] (every other column)": (random_tensor((64, 96), FP32)[:, ::2], b),
             "b[:, :32] of a [48, 40] tensor (gaps between rows)": (a, random_tensor((48, 40), FP32)[:, :32])}
    for what, (x, y) in views.items():
        LAB.assert_raises_clearly(lambda: LAB.module.matmul(x, y, 5), must_mention=("contiguous",),
                                  case=f"matmul with {what}")


@requires_gpu
@harness.reference_check
def test_input_errors():
    a, b = random_tensor((33, 17), FP32), random_tensor((17, 9), FP32)
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(a.double(), b, 5), must_mention=("dtype", "float"),
                              case="matmul(a float64, b)")
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(a, b[:16].contiguous(), 5), must_mention=("inner",),
                              case="matmul(a [33, 17], b [16, 9])")
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(a.flatten(), b, 5), must_mention=("2-D",),
                              case="matmul(a 1-D, b)")
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(a.unsqueeze(0), b, 5), must_mention=("2-D",),
                              case="matmul(a [1, 33, 17] batched, b)")
    LAB.assert_raises_clearly(lambda: LAB.module.matmul(a, b.cpu(), 5), must_mention=("CUDA",),
                              case="matmul(a on the GPU, b on the CPU)")


# ---------------------------------------------------------------- GPU: speed, the ladder against cuBLAS
PERF = 4096  # 4096^3: 137 GFLOP, 1024 blocks of 128 x 128: several waves on every GPU
_operands: dict = {}


@contextlib.contextmanager
def cublas_fp32():
    """cuBLAS in true fp32: TF32 would round the inputs to 10 mantissa bits and run on tensor cores."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _perf_operands():
    if not _operands:
        _operands.update(a=random_tensor((PERF, PERF), FP32), b=random_tensor((PERF, PERF), FP32))
    return _operands["a"], _operands["b"]


# (kernel, student bar, reference target): ratios to cuBLAS fp32 with TF32 off. The reference
# measured on an H200 (2026-11-21): k1 0.01, k2 0.12, k3 0.17, k4 0.34, k5 0.64, k6 0.67, k7 0.89;
# the targets keep a margin below those. Kernel 7's is SYLLABUS's 0.70x (stretch 0.85x). The
# student bars are what a first correct version reaches: kernels 3 and 5 are the student's, and
# kernels 6 and 7 run the student's kernel 5 when can_vectorize (lab04.3) says no.
# Student bars (issue 11, class 6), from an H100 run of tools/gpu/probe/perf_mutants.py (2026-11-22): k3 0.167x, and
# 0.072x with its products read from global memory (no shared-memory reuse): bar 0.12; k5 0.633x, and 0.133x with
# 1D instead of 2D register reuse: bar 0.45; k7 0.883x, and 0.633x when can_vectorize (lab04.3) always says no
# (k6 and k7 then run k5): bar 0.75. k6 stays at 0.40: k5 and k6 differ by 4%, no bar tells them apart.
# Reference targets: k3's and k7's raised with their bars (the reference reaches 0.17x and 0.88x; k7's is the
# syllabus's stretch, 0.85x).
PERF_BARS = [(1, 0.004, 0.005), (2, 0.05, 0.08), (3, 0.12, 0.15), (4, 0.15, 0.25), (5, 0.45, 0.5), (6, 0.4, 0.55),
             (7, 0.75, 0.85)]


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("number, student_bar, target", [
    pytest.param(number, bar, target, id=f"k{number}", marks=rung_marks(RUNG[number]))
    for number, bar, target in PERF_BARS])
def test_perf(number, student_bar, target):
    rung = RUNG[number]
    a, b = _perf_operands()
    last = {}

    def ours():
        last["c"] = LAB.module.matmul(a, b, number)

    def verify():  # a and b as the last timed call saw them (the timing gives them new values before each call)
        LAB.assert_close(last["c"], (a.double() @ b.double()).float(), case=f"kernel {number}: the output of the "
                         "timed calls", tol=tolerance(FP32, PERF), tile=rung.tile)

    with cublas_fp32():
        try:
            LAB.perf(name=f"k{number} {rung.name}", ours=ours, baseline=lambda: torch.matmul(a, b),
                     baseline_name="torch.matmul fp32 (TF32 off)", flops=2 * PERF**3, student_bar=student_bar,
                     target=target, verify=verify, inputs=(a, b), reps=5 if number <= 2 else 25)
        except harness.GradeFailure as failure:
            raise harness.GradeFailure(f"{failure}\n  hint: {rung.hint}") from None


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
MUTANTS = [
    harness.Mutant("no-sync-after-products", "03_smem_tiles.cu",
                   "    __syncthreads();  // everyone is done reading before the next iteration overwrites them\n", "",
                   tests="test_matmul_many_tiles_of_k and k3", expect="race"),
    harness.Mutant("a-tile-column-offset", "03_smem_tiles.cu", "A[row * K + k0 + tx]", "A[row * K + tx]",
                   tests="test_matmul and k3", expect="elements wrong"),
    harness.Mutant("edge-tiles-unguarded", "05_blocktiling_2d.cu", "(k0 + k < K && col0 + b_col < N) ?",
                   "(col0 + b_col < N) ?", tests="test_matmul_guard_bands and k5", expect="read outside A or B"),
    # Out of bounds (issue 11, class 1): kernel 3's store guards columns but not rows, so the last row of tiles
    # stores rows past M (zeros: their loads of A are zero-filled) past the end of C, every element of C right.
    harness.Mutant("k3-store-rows-unguarded", "03_smem_tiles.cu", "if (row < M && col < N) C[row * N + col] = acc;",
                   "if (col < N) C[row * N + col] = acc;", tests="test_matmul and k3",
                   expect="wrote past the end of c"),
    harness.Mutant("misalignment-ignored", "06_vectorized.cu", "return rows_aligned && bases_aligned;",
                   "return rows_aligned;", tests="test_can_vectorize", expect="16-byte boundary", needs_gpu=False),
    # Perf (issue 11, class 6): each student rung without its technique, correct and slower.
    # Kernel 3 without shared-memory reuse: the tiles are still loaded, but the products read A and B from global
    # memory (through L1/L2), as kernel 2 does.
    harness.Mutant("k3-products-from-global", "03_smem_tiles.cu",
                   "    for (int k = 0; k < kTile; ++k) acc += a_tile[ty][k] * b_tile[k][tx];\n",
                   "    for (int k = 0; k < kTile; ++k) {\n"
                   "      if (row < M && col < N && k0 + k < K) acc += A[row * K + k0 + k] * B[(k0 + k) * N + col];\n"
                   "    }\n",
                   tests="test_perf and k3", expect="below the student bar", perf=True),
    # Kernel 5 with 1D instead of 2D register blocking: the B fragment stays in registers, but every product reads
    # its A value from shared memory again (volatile: no reuse from registers), 72 shared loads per 64 FMAs, as in
    # kernel 4 (9 per 8), instead of 16.
    harness.Mutant("k5-1d-register-reuse", "05_blocktiling_2d.cu",
                   "        for (int j = 0; j < kThreadN; ++j) acc[i][j] += a_frag[i] * b_frag[j];\n",
                   "        for (int j = 0; j < kThreadN; ++j)\n"
                   "          acc[i][j] += *static_cast<volatile float*>(&a_tile[thread_row + i][k]) * b_frag[j];\n",
                   tests="test_perf and k5", expect="below the student bar", perf=True),
    # can_vectorize (lab04.3) always no, the task's stub: kernels 6 and 7 then run the student's kernel 5, correct on
    # every shape and as fast as kernel 5. Only the kernel 7 bar can tell (kernel 6 is within a few % of kernel 5).
    harness.Mutant("never-vectorize", "06_vectorized.cu", "return rows_aligned && bases_aligned;",
                   "return false && rows_aligned && bases_aligned;", tests="test_perf and k7",
                   expect="below the student bar", perf=True),
]

"""Grader for lab 03: warp all-reduce, block all-reduce, the two-pass sum (bitwise
deterministic) and its atomic variant, and the row statistics softmax needs."""
from __future__ import annotations

import pytest
import torch

import harness
from harness import inputs, notebooks, random_tensor, requires_gpu, special_rows, tolerance
from harness.check import dtype_name, pool_bytes, shape_id
from harness.inputs import Arg

LAB = harness.lab("03")
FP32, BF16 = torch.float32, torch.bfloat16
DTYPES = [FP32, BF16]
# (name, multiprocessors, resident 256-thread blocks per multiprocessor) of GPUs students use.
GPUS = [("T4", 40, 4), ("A100", 108, 8), ("H100", 132, 8)]

WARP_HINT = ("every lane must end with the reduction of all 32 lanes: five butterfly steps, "
             "value = op(value, __shfl_xor_sync(0xffffffff, value, offset)) for offset = 16, 8, 4, 2, 1; "
             "__shfl_down_sync leaves the total in lane 0 only, and a mask or offset that skips lanes "
             "loses their values")
SUM_HINT = ("a result off by a little: elements lost (the tail of fewer than a vector's elements after the last whole "
            "16-byte vector, or the head before the first aligned one); off by a lot or varying: a race in the block "
            "reduce (__syncthreads() between the per-warp writes to shared memory and the reads that combine them), "
            "or a warp reduce that loses lanes")
ROW_HINT = ("every thread of a row (its warp, or its block for rows longer than 1024) must take part in both "
            "all-reduces, see the same m before the second sweep, and cover the row's elements exactly once")

# Points per task (of 100), by the work each is: the warp all-reduce is five shuffles; the block
# all-reduce adds shared memory and two barriers; the sum is the vectorized grid-stride loop with
# its head and tail, and its grid; the row statistics, two sweeps and two all-reduces per row.
POINTS = {"lab03.1": 15, "lab03.2": 25, "lab03.3": 35, "lab03.4": 25}
SUM_TASKS = ("lab03.1", "lab03.2", "lab03.3")  # the sum's kernels use the warp and block all-reduce


# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck,
# synccheck) by default: regular expressions over test names (conftest marks them `sanitize`).
SANITIZE_CASES = [
    r"test_warp_reduce\[33-.*\]",
    r"test_sum(_atomic)?\[(33|4097\+off1)-.*\]",
    r"test_row_stats\[(7x33|33x4097)-float32\]",
]


def row_tasks(cols: int) -> tuple[str, ...]:
    """The tasks row_stats needs for rows of `cols`: a warp per row, or a block (lab03.2) past 1024."""
    return ("lab03.1", "lab03.4") if cols <= 1024 else ("lab03.1", "lab03.2", "lab03.4")


def constants() -> dict:
    """The numbers the kernels are built with ({warp_size, threads_per_block, vector_bytes, longest_warp_row}),
    from the lab itself: read inside the tests, so a lab that does not build fails each test rather than the import."""
    return LAB.module.constants()


def vector_elems(dtype) -> int:
    return constants()["vector_bytes"] // torch.empty((), dtype=dtype).element_size()


def warp_sum_floor(segments64: torch.Tensor) -> torch.Tensor:
    """Each warp sum's error scale, sum_tolerance's rule per segment: the norm of its 32 terms. A segment whose terms
    cancel has a sum far below them, and float32's rounding of those terms is not: seed 20261280 drew a 31-element
    sum of 0.0066569 that the reference kernel returned 1.5e-7 off (2.4e-5 relative, 2.7e-6 allowed without this
    floor; H100, 2026-11-27). A lost lane is still caught: it moves its sum by a term's size, over ten thousand times
    what the floor allows (tolerance(float32, 32) x the norm of 32 terms)."""
    return segments64.norm(dim=1)


def sum_tolerance(x64: torch.Tensor) -> float:
    """harness.tolerance(float32, n), the house rule for a length-n float32 reduction: the input
    is exactly representable (bf16 widens to float32 exactly), so only the float32 adds round.

    Rounding errors scale with the terms' size, ||x||_2, not with |sum x|, which can be far smaller when
    terms cancel (a random sum near zero). The tolerance is widened by ||x||_2 / |sum x| for that case; a
    lost element is still caught, because its size is that of a term and the tolerance is a small
    multiple of u * sqrt(n) * ||x||_2."""
    n = x64.numel()
    total, norm = x64.sum().abs().item(), x64.norm().item()
    return tolerance(FP32, n) * (1.0 + norm / max(total, 1e-30))


# ---------------------------------------------------------------- calling the ops, outputs guarded
# Each op's outputs come from a poisoned pool (harness.check.PoisonedPool): an element never written reads NaN, and
# a write past an output's end (its last element's neighbour in the allocator's slack) fails the test.
SPILL_HINT = ("a loop bound that lets one more index through (s <= segments or row <= rows instead of <) writes the "
              "element after the last one")


def reduce_op(op: str, x: torch.Tensor, *args, case: str) -> torch.Tensor:
    """sum, sum_atomic, warp_sums or warp_maxes, its output from a poisoned pool (with sum's partials, small)."""
    out_bytes = 4 * -(-x.numel() // constants()["warp_size"]) if op.startswith("warp") else 4
    with harness.check.PoisonedPool(large_bytes=pool_bytes(out_bytes)) as pool:
        out = getattr(LAB.module, op)(x, *args)
    pool.assert_no_spill(out, name="out", case=case, hint=SPILL_HINT)
    return out


def row_stats(x: torch.Tensor, *, case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """row_stats with m and s from a poisoned pool. In the given wrapper they are the two rows of one [2, rows]
    allocation, so s is checked first: the slack after s is the allocation's (one check covers both)."""
    rows = x.numel() // x.shape[-1]
    with harness.check.PoisonedPool(large_bytes=pool_bytes(8 * rows)) as pool:
        m, s = LAB.module.row_stats(x)
    checked = set()
    for name, out in (("s", s), ("m", m)):
        if out.untyped_storage().data_ptr() not in checked:
            checked.add(out.untyped_storage().data_ptr())
            pool.assert_no_spill(out, name=name, case=case, hint=SPILL_HINT)
    return m, s


# ---------------------------------------------------------------- builds
@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports: checked on every machine, GPU or not."""
    for name in ("sum", "sum_atomic", "warp_sums", "warp_maxes", "row_stats", "sum_grid", "row_stats_threads_per_row",
                 "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"


# ---------------------------------------------------------------- CPU-side: the sum's grid
@pytest.mark.parametrize("gpu, sm_count, blocks_per_sm", GPUS, ids=[g[0] for g in GPUS])
@pytest.mark.parametrize("n", [1, 31, 4097, 2**28 + 5, 2**40])
@harness.tasks("lab03.3")
def test_sum_grid(gpu, sm_count, blocks_per_sm, n):
    blocks, threads = LAB.module.sum_grid(n, sm_count, blocks_per_sm)
    one_wave = sm_count * blocks_per_sm
    block_size = constants()["threads_per_block"]
    case = (f"sum_grid(n={n}) on a {gpu} ({sm_count} SMs x {blocks_per_sm} resident blocks of {block_size} threads) "
            f"gave {blocks} blocks x {threads} threads")
    problems = []
    if threads != block_size:
        problems.append(f"use kThreadsPerBlock = {block_size} threads: the occupancy figure resident_blocks_per_sm "
                        "was computed for blocks of that size")
    if not 1 <= blocks <= one_wave:
        problems.append(f"blocks must be between 1 and one wave, {sm_count} x {blocks_per_sm} = {one_wave}: "
                        "more blocks than fit on the GPU at once run as a late second wave, "
                        "and each adds a partial to the second pass")
    if (blocks - 1) * threads >= n:
        problems.append("at least one whole block has no element to work on: use at most ceil(n / threads) blocks")
    if blocks * threads < min(n, one_wave * threads):
        problems.append(f"too few threads to fill the GPU: one wave is {one_wave} blocks")
    if problems:
        raise harness.GradeFailure(f"{case}:\n  " + "\n  ".join(problems))


@pytest.mark.parametrize("length", ["1", "longest", "longest+1", "8x-longest"])
@harness.reference_check  # row_stats_threads_per_row is given
def test_row_stats_threads_per_row(length):
    c = constants()
    longest = c["longest_warp_row"]  # the longest row a warp takes
    cols = {"1": 1, "longest": longest, "longest+1": longest + 1, "8x-longest": 8 * longest}[length]
    threads = c["warp_size"] if cols <= longest else c["threads_per_block"]
    got = LAB.module.row_stats_threads_per_row(cols)
    assert got == threads, (f"row_stats_threads_per_row({cols}) = {got}, expected {threads} "
                            f"(a warp up to {longest} columns)")


# ---------------------------------------------------------------- CPU-side: input checks that need no GPU
@pytest.mark.parametrize("name", ["sum", "sum_atomic", "warp_sums", "row_stats"])
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensor(name):
    LAB.assert_raises_clearly(lambda: getattr(LAB.module, name)(torch.ones(4, 4)), must_mention=("CUDA",),
                              case=f"{name}(x on the CPU)")


# x refused when it is not one (harness.inputs), for every op: on fake CUDA tensors (no GPU needed) and on real ones.
_X_WORDS = {"dtype": ("dtype", "float32", "bfloat16")}
REDUCE_ARGUMENTS = [Arg("x", dtype=torch.float16, words=_X_WORDS)]
ROW_STATS_ARGUMENTS = [Arg("x", dtype=torch.float16, shape=lambda t: t[0, 0],
                           words={**_X_WORDS, "shape": ("dimension",)})]


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("name", ["sum", "sum_atomic", "warp_sums", "warp_maxes", "row_stats"])
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(name, real):
    specs = ROW_STATS_ARGUMENTS if name == "row_stats" else REDUCE_ARGUMENTS
    inputs.assert_each_argument_checked(name, getattr(LAB.module, name), lambda: {"x": random_tensor((33, 17), FP32)},
                                        specs, real=real)


# ---------------------------------------------------------------- GPU: the warp all-reduce
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 4097, 2**20 + 7])
@harness.tasks("lab03.1")
def test_warp_reduce(n, op, dtype):
    x = random_tensor((n,), dtype)
    warp = constants()["warp_size"]
    segments = -(-n // warp)
    identity = 0.0 if op == "sum" else float("-inf")
    padded = torch.full((segments * warp,), identity, dtype=torch.float64, device="cuda")
    padded[:n] = x.double()
    ref = padded.view(segments, warp).sum(1) if op == "sum" else padded.view(segments, warp).amax(1)
    case = f"warp_{op} of n={n} ({segments} segments of {warp}, the last lane writes), {dtype_name(dtype)}"
    out = reduce_op("warp_sums" if op == "sum" else "warp_maxes", x, case=case)
    LAB.assert_close(out, ref, case=case, tol=tolerance(FP32, warp), hint=WARP_HINT,
                     floor=warp_sum_floor(padded.view(segments, warp)) if op == "sum" else None)


# ---------------------------------------------------------------- GPU: the full sum
# (n, offset): offset > 0 starts x that many elements into its allocation, so its first
# element is not 16-byte aligned and the kernel must sum a head before its first vector.
# Sizes from 2^24 on fill every GPU's wave many times over (and are too big for compute-sanitizer).
LARGE = pytest.mark.large
SUM_CASES = [(1, 0), (31, 0), (33, 0), (4097, 0), (4097, 1), (2**20 + 3, 3), (2**24 + 1, 0), (2**28 + 5, 0)]


def check_sum(out, x, case):
    x64 = x.double()
    LAB.assert_close(out, x64.sum(), case=case, tol=sum_tolerance(x64), hint=SUM_HINT)


def sum_case(name, x, offset, dtype, blocks=0):
    n, vec = x.numel(), vector_elems(dtype)
    grid = f"{blocks} blocks" if blocks else "derived grid"
    return (f"{name} of n={n} {dtype_name(dtype)} ({n // vec} whole {vec}-element vectors + {n % vec} tail elements"
            f"{f', starting {offset} elements past an aligned address' if offset else ''}), {grid}")


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n, offset", [pytest.param(n, o, id=f"{n}{f'+off{o}' if o else ''}",
                                                    marks=[LARGE] if n >= 2**24 else [])
                                       for n, o in SUM_CASES])
@harness.tasks(*SUM_TASKS)
def test_sum(n, offset, dtype):
    x = random_tensor((n + offset,), dtype)[offset:]
    case = sum_case("sum", x, offset, dtype)
    check_sum(reduce_op("sum", x, case=case), x, case)


@requires_gpu
@pytest.mark.parametrize("blocks", [1, 7])
@pytest.mark.parametrize("n", [33, 4097, 2**20 + 3])
@harness.tasks(*SUM_TASKS)
def test_sum_any_grid(n, blocks):
    """A grid-stride loop must cover every element whatever the grid."""
    x = random_tensor((n,), FP32)
    case = sum_case("sum", x, 0, FP32, blocks)
    check_sum(reduce_op("sum", x, blocks, case=case), x, case)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [pytest.param(2**24 + 3, marks=LARGE), pytest.param(2**28 + 5, marks=LARGE)])
@harness.tasks(*SUM_TASKS)
def test_sum_is_bitwise_deterministic(n, dtype):
    """The same input gives the same bits on every run: the guarantee of the two-pass sum."""
    runs = 8
    x = random_tensor((n,), dtype)
    first = reduce_op("sum", x, case=f"sum of {n} {dtype_name(dtype)} elements, run 1")  # x checked unchanged too
    for run in range(2, runs + 1):
        # The repeats skip the per-call input snapshot: at 2^28 elements it copies 1 GiB to the host twice
        # a call (16 s of this lab's 60 on an H100), and the first call already checked it.
        with harness.calls.unchecked():
            again = LAB.module.sum(x)
        if not torch.equal(first, again):
            raise harness.GradeFailure(
                f"sum of the same {n} {dtype_name(dtype)} elements gave {first.item()!r} on run 1 and {again.item()!r} "
                f"on run {run}: not bitwise identical\n  hint: a deterministic sum fixes the order of every add: "
                "per-block partials stored to memory, then ONE block that sums them in a fixed order; atomicAdd on "
                "floats adds in whatever order the blocks finish, and float addition is not associative")
    check_sum(first, x, sum_case("sum (the repeated runs)", x, 0, dtype))


@requires_gpu
@pytest.mark.large
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@harness.tasks(*SUM_TASKS)
def test_sum_past_2_31_elements(dtype, gpu_memory):
    """2^31 + 33 elements: the grid-stride loop's index and step, and the tail's start, must be int64."""
    gpu_memory(32)
    x = random_tensor((harness.PAST_INT32,), dtype)
    for name in ("sum", "sum_atomic"):
        out = getattr(LAB.module, name)(x)
        check_sum(out, x, sum_case(name, x, 0, dtype) + "; index with int64_t")


@requires_gpu
@pytest.mark.large
@harness.tasks("lab03.1", "lab03.4")
def test_row_stats_past_2_31_elements(gpu_memory):
    """(2^21 + 1) rows of 1024 floats: row * cols passes 2^31 in the last rows."""
    gpu_memory(20)
    rows, cols = 2**21 + 1, 1024
    x = random_tensor((rows, cols), FP32) * 3
    m, s = LAB.module.row_stats(x)
    for where, part in (("first", slice(0, 64)), ("last", slice(rows - 64, rows))):
        check_row_stats(m[part], s[part], x[part], f"row_stats of {rows}x{cols} fp32, its {where} 64 rows")


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [1, 33, 4097, pytest.param(2**24 + 3, marks=LARGE)])
@harness.tasks(*SUM_TASKS)
def test_sum_atomic(n, dtype):
    """Correct to rounding; its low bits may vary from run to run (the lesson shows it), so no bitwise check."""
    x = random_tensor((n,), dtype)
    case = sum_case("sum_atomic", x, 0, dtype)
    check_sum(reduce_op("sum_atomic", x, case=case), x, case)


@requires_gpu
@harness.reference_check  # empty inputs return before any kernel, in given code
def test_empty_input():
    for name in ("sum", "sum_atomic"):
        out = getattr(LAB.module, name)(torch.empty(0, device="cuda"))
        assert out.shape == () and out.item() == 0.0, f"{name} of an empty tensor must be a 0-dim tensor holding 0"
    assert LAB.module.warp_sums(torch.empty(0, device="cuda")).shape == (0,), "warp_sums of nothing is empty"
    m, s = LAB.module.row_stats(torch.empty(0, 5, device="cuda"))
    assert m.shape == s.shape == (0,), "row_stats of zero rows must return two empty tensors"


@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_sum_input_errors():
    x = random_tensor((33, 17), FP32)
    for name in ("sum", "sum_atomic"):
        fn = getattr(LAB.module, name)
        LAB.assert_raises_clearly(lambda: fn(x.double()), must_mention=("dtype", "float32", "bfloat16"),
                                  case=f"{name}(x of dtype float64)")
        LAB.assert_raises_clearly(lambda: fn(x.half()), must_mention=("dtype",), case=f"{name}(x of dtype float16)")
        LAB.assert_raises_clearly(lambda: fn(x.t()), must_mention=("contiguous",),
                                  case=f"{name}(x.t(), a non-contiguous view)")
        LAB.assert_raises_clearly(lambda: fn(x, -1), must_mention=("blocks",), case=f"{name}(x, blocks=-1)")


# ---------------------------------------------------------------- GPU: the row statistics
ROW_SHAPES = [(1, 1), (7, 33), (33, 4097), (4096, 1000), (3, 5, 128)]


def check_row_stats(m, s, x, case):
    x64 = x.double()
    ref_m = x64.amax(-1)
    ref_s = torch.exp(x64 - ref_m.unsqueeze(-1)).sum(-1)
    cols = x.shape[-1]
    # max is exact in any order; the sum of exp's positive terms has no cancellation.
    LAB.assert_close(m, ref_m, case=f"{case}: row max", tol=tolerance(FP32, cols), hint=ROW_HINT)
    LAB.assert_close(s, ref_s, case=f"{case}: row sum of exp(x - max)", tol=tolerance(FP32, cols), hint=ROW_HINT)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape", [pytest.param(s, id=shape_id(s), marks=harness.tasks(*row_tasks(s[-1])))
                                   for s in ROW_SHAPES])
def test_row_stats(shape, dtype):
    x = random_tensor(shape, dtype) * 3  # a spread of a few units: exp(x - m) spans many orders of magnitude
    cols = shape[-1]
    per_row = "one warp" if cols <= constants()["longest_warp_row"] else "one block"
    case = f"row_stats of {shape_id(shape)} {dtype_name(dtype)} ({per_row} per row)"
    m, s = row_stats(x, case=case)
    check_row_stats(m, s, x, case)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@harness.tasks(*row_tasks(1000))
def test_row_stats_unaligned_rows(dtype):
    """A contiguous view that starts one element into its storage: rows are not 16-byte aligned,
    so the vector loads must not be used (the solution falls back to one element per load)."""
    rows, cols = 65, 1000
    x = random_tensor((rows * cols + 1,), dtype)[1:].view(rows, cols)
    case = f"row_stats of a {rows}x{cols} {dtype_name(dtype)} view starting 1 element into its storage"
    m, s = row_stats(x, case=case)
    check_row_stats(m, s, x, case)


# Rows of large values, of -inf, of one value (harness.special_rows): s = sum(exp(x - m)) is in [1, n] whatever the row
# holds, while exp(x) alone overflows (x ~ 1e4) or underflows to 0 (a row of -1e4). A row of -inf only has m = -inf,
# the max of its elements; its s is exp(-inf - (-inf)) summed, NaN by the formula, and not graded.
ROW_PATTERN_SHAPE = (6, 1000)  # a warp per row; 4097 columns below: a block per row


def check_special_row_stats(m, s, x, pattern, case):
    if pattern == "all -inf row":
        row = special_rows.ALL_INF_ROW
        if m[row].item() != float("-inf"):
            raise harness.GradeFailure(f"{case}: row {row} is all -inf, so its max is -inf; got m = {m[row].item()!r}"
                                       f"\n  hint: start each thread's max at -inf (reduce::Max::identity())")
        keep = torch.arange(x.shape[0], device=x.device) != row
        m, s, x = m[keep], s[keep], x[keep]
        case += f" (row {row} left out below: row numbers count the others)"
    check_row_stats(m, s, x, case)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("cols", [pytest.param(n, id=f"{ROW_PATTERN_SHAPE[0]}x{n}", marks=harness.tasks(*row_tasks(n)))
                                  for n in (ROW_PATTERN_SHAPE[1], 4097)])
@pytest.mark.parametrize("pattern", special_rows.PATTERNS)
def test_row_stats_special_values(pattern, cols, dtype):
    x = special_rows.special_rows(pattern, (ROW_PATTERN_SHAPE[0], cols), dtype)
    per_row = "one warp" if cols <= constants()["longest_warp_row"] else "one block"
    case = f"row_stats of {ROW_PATTERN_SHAPE[0]}x{cols} {dtype_name(dtype)} ({per_row} per row), rows '{pattern}'"
    m, s = row_stats(x, case=case)
    check_special_row_stats(m, s, x, pattern, case)


@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_row_stats_input_errors():
    x = random_tensor((33, 17), FP32)
    rs = LAB.module.row_stats
    LAB.assert_raises_clearly(lambda: rs(x.t()), must_mention=("contiguous",),
                              case="row_stats(x.t(), a non-contiguous view)")
    LAB.assert_raises_clearly(lambda: rs(x[:, ::2]), must_mention=("contiguous",), case="row_stats(x[:, ::2])")
    LAB.assert_raises_clearly(lambda: rs(x.half()), must_mention=("dtype",), case="row_stats(x of dtype float16)")
    LAB.assert_raises_clearly(lambda: rs(x[:, :0]), must_mention=("empty",), case="row_stats(x of shape [33, 0])")
    LAB.assert_raises_clearly(lambda: rs(x[0, 0]), must_mention=("dimension",), case="row_stats(a 0-dim tensor)")


@requires_gpu
@harness.tasks(harness.ALL)  # the sum, and row_stats with a warp per row
def test_runs_on_current_stream():
    """Every op must run on PyTorch's current stream (its kernels, and sum_atomic's memset of the output):
    checked by capturing them all in one CUDA graph and replaying it on fresh inputs."""
    source = random_tensor((1024, 1000), FP32)
    wide = random_tensor((64, 4097), FP32)  # a block per row

    def run_all():
        flat = source.view(-1)
        return {"sum": LAB.module.sum(source), "sum_atomic": LAB.module.sum_atomic(source),
                "warp_sums": LAB.module.warp_sums(flat), "warp_maxes": LAB.module.warp_maxes(flat),
                "row_stats": LAB.module.row_stats(source), "row_stats (a block per row)": LAB.module.row_stats(wide)}

    outs = LAB.capture_on_current_stream(run_all, inputs=(source, wide), case="every op of the lab")
    replayed = " replayed from a CUDA graph (" + harness.STREAM_HINT + ")"
    check_sum(outs["sum"], source, "sum" + replayed)
    check_sum(outs["sum_atomic"], source, "sum_atomic" + replayed)
    segments = source.double().view(-1, constants()["warp_size"])
    for name, ref, floor in (("warp_sums", segments.sum(1), warp_sum_floor(segments)),
                             ("warp_maxes", segments.amax(1), None)):
        LAB.assert_close(outs[name], ref, case=name + replayed, tol=tolerance(FP32, constants()["warp_size"]),
                         hint=WARP_HINT, floor=floor)
    check_row_stats(*outs["row_stats"], source, "row_stats" + replayed)
    check_row_stats(*outs["row_stats (a block per row)"], wide, "row_stats of 4097 columns" + replayed)


# ---------------------------------------------------------------- GPU: speed
# Both are memory-bound: they read each element once and write almost nothing.
SUM_PERF_N = 2**28  # 1 GiB of float32, far past the L2
ROWS_PERF = (8192, 8192)  # 256 MiB of float32


@requires_gpu
@pytest.mark.perf
@harness.tasks(*SUM_TASKS)
def test_perf_sum():
    x = random_tensor((SUM_PERF_N,), FP32)
    last = {}

    def ours():
        last["out"] = LAB.module.sum(x)

    def verify():
        check_sum(last["out"], x, "sum: the output of the timed calls")

    LAB.perf(name="sum 2^28 fp32", ours=ours, baseline=lambda: torch.sum(x), baseline_name="torch.sum",
             bytes_moved=4 * SUM_PERF_N, student_bar=0.7, target=0.95, verify=verify,
             refresh=x.normal_)  # new standard normal values each call: a rotation would leave the sum as it was


@requires_gpu
@pytest.mark.perf
@harness.tasks(*row_tasks(ROWS_PERF[1]))
def test_perf_row_stats():
    """Ours reads x once (the second sweep hits the cache); PyTorch's amax, subtract, exp and sum
    each make a pass over memory, and two of them write a full-size temporary."""
    x = random_tensor(ROWS_PERF, FP32)
    last = {}

    def ours():
        last["stats"] = LAB.module.row_stats(x)

    def baseline():
        m = torch.amax(x, -1, keepdim=True)
        return m, torch.sum(torch.exp(x - m), -1)

    def verify():
        check_row_stats(*last["stats"], x, f"row_stats {shape_id(ROWS_PERF)}: the output of the timed calls")

    LAB.perf(name=f"row_stats {shape_id(ROWS_PERF)} fp32", ours=ours, baseline=baseline,
             baseline_name="torch.amax + sum(exp(x - m))", bytes_moved=4 * x.numel() + 2 * 4 * ROWS_PERF[0],
             student_bar=1.0, target=1.5, verify=verify, inputs=(x,))


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
MUTANTS = [
    # Butterfly steps 8, 4, 2, 1 only: each half-warp reduces on its own and lanes 0-15 never meet 16-31.
    harness.Mutant("lost-lanes-in-shuffle", "reduce.cuh", "for (int offset = kWarpSize / 2; offset > 0;",
                   "for (int offset = kWarpSize / 4; offset > 0;", tests="test_warp_reduce", expect="all 32 lanes"),
    # Every warp combines the per-warp results itself; without the barrier after lane 0 of each warp stores its
    # warp's result, a fast warp reads warp_results before the slower warps have written theirs (stale or unset
    # slots), so a block's sum misses some warps' partials.
    harness.Mutant("race-on-shared-partials", "reduce.cuh",
                   "  __syncthreads();  // every warp's result is in shared memory before any warp reads them\n", "",
                   tests="test_sum and not atomic and not grid", expect="__syncthreads"),
    # Out of bounds (issue 11, class 1): one segment too many, so a warp reduces only identities and its last lane
    # writes out[ceil(n / 32)], one float past the end, every element of out right. The reads stay guarded (i < n).
    harness.Mutant("segment-bound-off-by-one", "sum.cu", "s < segments;\n       s += warps)",
                   "s <= segments;\n       s += warps)", tests="test_warp_reduce", expect="wrote past the end of out"),
    harness.Mutant("lost-tail", "sum.cu",
                   "  if (thread < n - tail_start) acc[0] += reduce::to_float(x[tail_start + thread]);\n",
                   "", tests="test_sum and not atomic and not grid", expect="tail elements"),
    harness.Mutant("grid-not-one-wave", "sum.cu", "std::min(needed_blocks, one_wave))), kThreadsPerBlock}",
                   "needed_blocks)), kThreadsPerBlock}",
                   tests="test_sum_grid", expect="more blocks than fit on the GPU at once", needs_gpu=False),
    # The atomic path under the deterministic name: results are right to rounding, but their low bits vary
    # with the order in which ~1000 blocks finish (caught whenever two of the 8 runs differ).
    harness.Mutant("atomics-in-deterministic-sum", "wrapper.cpp", "/*deterministic=*/true", "/*deterministic=*/false",
                   tests="bitwise", expect="not bitwise identical"),
    # exp(v - m) computed as exp(v) * exp(-m) (issue 34, class b): the same numbers for rows of a few units, inf * 0 =
    # NaN once exp overflows (x ~ 1e4) or underflows (a row of -1e4). Only the special rows show it.
    harness.Mutant("row-stats-exp-unshifted", "row_stats.cu", "s += expf(v[e] - m);", "s += expf(v[e]) * expf(-m);",
                   tests="test_row_stats_special_values and (large or constant)", expect="elements wrong"),
    # Perf (issue 11, class 6). No mutant: the two candidates for "the lesson's technique removed" ran as fast as
    # the reference on an H100 (tools/gpu/probe/perf_mutants.py, 2026-11-22): a plain grid-stride loop of 4-byte
    # loads with one accumulator 0.982x torch.sum, 16-byte loads one per trip (`#pragma unroll 1`) 0.998x, the
    # reference 0.992x. On a full one-wave grid each thread's single load already puts 32 KB per SM in flight;
    # the sum's speed comes from the grid, which test_sum_grid grades on the CPU.
]

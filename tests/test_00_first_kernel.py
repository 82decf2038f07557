"""Grader for lab 00: scale and axpy, their launch configuration and input checks."""
from __future__ import annotations

import random

import pytest
import torch

import harness
from harness import inputs, notebooks, random_tensor, requires_gpu, tolerance
from harness.check import nbytes, pool_bytes, shape_id
from harness.inputs import Arg

LAB = harness.lab("00")
FP32 = torch.float32
# 2^24 + 3 elements: past one wave of any GPU's threads, so the grid-stride loop must loop.
SHAPES = [(1,), (31,), (4097,), pytest.param((2**24 + 3,), marks=pytest.mark.large), (3, 5, 7), (64, 1000)]
# (name, multiprocessors, max resident threads per multiprocessor) of GPUs students use.
GPUS = [("T4", 40, 1024), ("A100", 108, 2048), ("H100", 132, 2048)]
SPILL_HINT = "the grid-stride loop must stop before n (i < n, not i <= n): index n is one past the last element"
GRID_HINT = ("a grid-stride loop starts at blockIdx.x * blockDim.x + threadIdx.x and steps by "
             "gridDim.x * blockDim.x until n, so every element is covered whatever the grid size")

# Points per task (of 100): the grid-stride loop and the launch are the lesson's two ideas; axpy's
# kernel repeats scale's loop; its wrapper is every check, the allocation and the launch.
POINTS = {"lab00.1": 25, "lab00.2": 25, "lab00.3": 15, "lab00.4": 35}


# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck,
# synccheck) by default: regular expressions over test names (conftest marks them `sanitize`).
SANITIZE_CASES = [r"test_(scale|axpy)\[(31|4097)-(derived-grid|7-blocks)\]"]


def constants() -> dict:
    """The numbers the kernels are built with ({threads_per_block, warp_size}), from the lab itself:
    read inside the tests, so a lab that does not build fails each test rather than the import."""
    return LAB.module.constants()


@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports: checked on every machine, GPU or not."""
    for name in ("scale", "axpy", "launch_config", "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"


# ---------------------------------------------------------------- CPU-side: the launch configuration
@pytest.mark.parametrize("gpu, sm_count, max_threads", GPUS, ids=[g[0] for g in GPUS])
@pytest.mark.parametrize("n", [1, 31, 4097, 2**24 + 3, 2**40])
@harness.tasks("lab00.2")
def test_launch_config(gpu, sm_count, max_threads, n):
    blocks, threads = LAB.module.launch_config(n, sm_count, max_threads)
    case = (f"launch_config(n={n}) on a {gpu} ({sm_count} SMs, {max_threads} threads/SM) "
            f"gave {blocks} blocks x {threads} threads")
    problems = []
    warp = constants()["warp_size"]
    if threads % warp or not warp <= threads <= 1024:
        problems.append(f"threads per block must be a multiple of the {warp}-thread warp, between {warp} and 1024")
    if not 1 <= blocks <= 2**31 - 1:
        problems.append("blocks must be between 1 and gridDim.x's limit of 2^31 - 1")
    if (blocks - 1) * threads >= n:
        problems.append("at least one whole block has no element to work on: use at most ceil(n / threads) blocks")
    if blocks * threads < min(n, sm_count * max_threads):
        problems.append(f"too few threads to fill the GPU: {sm_count} SMs hold "
                        f"{sm_count * max_threads} threads at once")
    if problems:
        raise harness.GradeFailure(f"{case}:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- CPU-side: input checks that need no GPU
@harness.reference_check  # scale's wrapper is given
def test_scale_refuses_cpu_tensor():
    LAB.assert_raises_clearly(lambda: LAB.module.scale(torch.ones(4), 2.0), must_mention=("CUDA",),
                              case="scale(x on the CPU)")


@harness.tasks("lab00.4")
def test_axpy_refuses_cpu_tensors():
    LAB.assert_raises_clearly(lambda: LAB.module.axpy(2.0, torch.ones(4), torch.ones(4)), must_mention=("CUDA",),
                              case="axpy(x, y on the CPU)")


# Each tensor argument refused on its own, the others valid (harness.inputs): on fake CUDA tensors (no GPU needed)
# and on real ones. axpy's checks are the student's (lab00.4), and a check of y alone passes a test that only ever
# hands it a bad y: x gets its own.
def _axpy_arg(name):
    return Arg(name, dtype=torch.float16, shape=lambda t: t[:, :16])


ARGUMENTS = {
    "scale": (lambda: {"x": random_tensor((33, 17), FP32), "alpha": 2.0},
              [Arg("x", dtype=torch.float64, words={"dtype": ("dtype", "float32")})]),
    "axpy": (lambda: {"alpha": 2.0, "x": random_tensor((33, 17), FP32), "y": random_tensor((33, 17), FP32)},
             [_axpy_arg("x"), _axpy_arg("y")]),
}


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("op", [pytest.param("scale", marks=harness.reference_check),
                                pytest.param("axpy", marks=harness.tasks("lab00.4"))])
def test_each_argument_checked(op, real):
    make_args, specs = ARGUMENTS[op]
    inputs.assert_each_argument_checked(op, getattr(LAB.module, op), make_args, specs, real=real)


# ---------------------------------------------------------------- GPU: correctness, outputs guarded
# The output comes from a poisoned pool (harness.check.PoisonedPool): an element never written reads NaN,
# and a write past its end (y[n], from a loop bound of i <= n) changes the allocator's slack after it.
def scale(x, alpha, blocks, *, case):
    with harness.check.PoisonedPool(large_bytes=pool_bytes(nbytes(x))) as pool:
        y = LAB.module.scale(x, alpha, blocks)
    pool.assert_no_spill(y, name="y", case=case, hint=SPILL_HINT)
    return y


def axpy(alpha, x, y, blocks, *, case):
    with harness.check.PoisonedPool(large_bytes=pool_bytes(nbytes(x))) as pool:
        out = LAB.module.axpy(alpha, x, y, blocks)
    pool.assert_no_spill(out, name="out", case=case, hint=SPILL_HINT)
    return out


@requires_gpu
@pytest.mark.parametrize("blocks", [0, 1, 7], ids=["derived-grid", "1-block", "7-blocks"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@harness.tasks("lab00.1", "lab00.2")  # launch_config picks the threads per block even when blocks is forced
def test_scale(shape, blocks):
    x = random_tensor(shape, FP32)
    alpha = random.uniform(-3, 3)
    case = f"scale shape {shape_id(shape)}, fp32, blocks={blocks or 'derived'}"
    y = scale(x, alpha, blocks, case=case)
    LAB.assert_close(y, x.double() * alpha, case=case, tol=tolerance(FP32), block=constants()["threads_per_block"],
                     hint=GRID_HINT)


@requires_gpu
@pytest.mark.parametrize("blocks", [0, 7], ids=["derived-grid", "7-blocks"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@harness.tasks("lab00.2", "lab00.3", "lab00.4")
def test_axpy(shape, blocks):
    x, y = random_tensor(shape, FP32), random_tensor(shape, FP32)
    alpha = random.uniform(-3, 3)
    case = f"axpy shape {shape_id(shape)}, fp32, blocks={blocks or 'derived'}"
    out = axpy(alpha, x, y, blocks, case=case)
    # floor: alpha * x + y cancels where y is near -alpha * x; its rounding error then scales with the terms, not the
    # sum, and a one-element tensor has no rms to absorb it (a right kernel failed at 1.3e-6 off 0.0157, H100)
    LAB.assert_close(out, alpha * x.double() + y.double(), case=case, tol=tolerance(FP32),
                     block=constants()["threads_per_block"], hint=GRID_HINT, floor=(alpha * x.double()).abs() + y.abs())


@requires_gpu
@harness.tasks("lab00.4")  # scale's guard is given; axpy's wrapper is the student's
def test_inputs_on_another_gpu():
    """Inputs on cuda:1 while cuda:0 is current: without a device guard the wrapper allocates out on
    cuda:0 and launches there, on pointers of another GPU. Needs two GPUs; with one it says so."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: a missing device guard (c10::cuda::CUDAGuard) only shows when the inputs live "
                    "on a GPU other than the current one")
    torch.cuda.set_device(0)
    x, y = random_tensor((4097,), FP32, device="cuda:1"), random_tensor((4097,), FP32, device="cuda:1")
    for name, call, want in (("scale", lambda: LAB.module.scale(x, 2.0), 2.0 * x.double()),
                             ("axpy", lambda: LAB.module.axpy(2.0, x, y), 2.0 * x.double() + y.double())):
        out = call()
        torch.cuda.synchronize(1)
        assert out.device == x.device, f"{name} of inputs on cuda:1 returned its output on {out.device}"
        LAB.assert_close(out, want, case=f"{name} of inputs on cuda:1 with cuda:0 current", tol=tolerance(FP32),
                         hint="const c10::cuda::CUDAGuard device_guard(x.device()); before allocating and launching")


@requires_gpu
@pytest.mark.large
@harness.tasks("lab00.1", "lab00.2", "lab00.3", "lab00.4")
def test_past_2_31_elements(gpu_memory):
    """2^31 + 33 floats: an int index wraps at 2^31, so the kernels' index and the grid-stride step must be int64."""
    # x, y and the two outputs, 8.6 GB each: 34.4 GB (28 let a run start with 34 GB free and run out of memory on
    # axpy's output, H100, beside another process's memory)
    gpu_memory(35)
    n = harness.PAST_INT32
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    alpha = random.uniform(-3, 3)
    out = LAB.module.scale(x, alpha)
    harness.check.assert_ends_close(out, lambda part: x[part].double() * alpha, tol=tolerance(FP32),
                                    case=f"scale of {n} floats", hint=GRID_HINT + "; index with int64_t")
    out = LAB.module.axpy(alpha, x, y)
    harness.check.assert_ends_close(out, lambda part: alpha * x[part].double() + y[part].double(), tol=tolerance(FP32),
                                    case=f"axpy of {n} floats", hint=GRID_HINT + "; index with int64_t")


@requires_gpu
@harness.tasks("lab00.4")  # the empty scale is given; axpy's wrapper must allow it too
def test_empty_input():
    x = torch.empty(0, device="cuda")
    assert LAB.module.scale(x, 2.0).shape == (0,), "scale of an empty tensor must return an empty tensor"
    assert LAB.module.axpy(2.0, x, x).shape == (0,), "axpy of empty tensors must return an empty tensor"


@requires_gpu
@harness.tasks(harness.ALL)
def test_runs_on_current_stream():
    """The kernels must run on PyTorch's current stream: checked by capturing them in a CUDA graph."""
    x = random_tensor((2**20,), FP32)
    y, out = LAB.capture_on_current_stream(lambda: (LAB.module.scale(x, 2.0), LAB.module.axpy(2.0, x, x)),
                                           inputs=x, case="scale and axpy")
    LAB.assert_close(y, x.double() * 2, case="scale replayed from a CUDA graph", tol=tolerance(FP32),
                     hint=harness.STREAM_HINT)
    LAB.assert_close(out, x.double() * 3, case="axpy replayed from a CUDA graph", tol=tolerance(FP32),
                     hint=harness.STREAM_HINT)


# ---------------------------------------------------------------- GPU: bad input gets a clear error
@requires_gpu
@harness.reference_check  # scale's checks are given
def test_scale_input_errors():
    x = random_tensor((33, 17), FP32)
    LAB.assert_raises_clearly(lambda: LAB.module.scale(x.double(), 2.0), must_mention=("dtype", "float"),
                              case="scale(x of dtype float64)")
    LAB.assert_raises_clearly(lambda: LAB.module.scale(x.t(), 2.0), must_mention=("contiguous",),
                              case="scale(x.t(), a non-contiguous view)")
    LAB.assert_raises_clearly(lambda: LAB.module.scale(x, 2.0, -1), must_mention=("blocks", "-1"),
                              case="scale(x, blocks=-1)")


@requires_gpu
@harness.tasks("lab00.4")
def test_axpy_input_errors():
    x, y = random_tensor((33, 17), FP32), random_tensor((33, 17), FP32)
    LAB.assert_raises_clearly(lambda: LAB.module.axpy(2.0, x, y[:, :16].contiguous()), must_mention=("shape",),
                              case="axpy(x [33, 17], y [33, 16])")
    LAB.assert_raises_clearly(lambda: LAB.module.axpy(2.0, x, y.half()), must_mention=("dtype",),
                              case="axpy(x float32, y float16)")
    LAB.assert_raises_clearly(lambda: LAB.module.axpy(2.0, x.t(), y.t()), must_mention=("contiguous",),
                              case="axpy(x.t(), y.t())")
    LAB.assert_raises_clearly(lambda: LAB.module.axpy(2.0, x, y.cpu()), must_mention=("CUDA",),
                              case="axpy(x on the GPU, y on the CPU)")


# ---------------------------------------------------------------- GPU: speed
# Memory-bound: scale reads and writes 4 bytes per element, axpy reads 8 and writes 4.
# 2^28 floats = 1 GiB per tensor, far past the L2, so this times HBM.
PERF_N = 2**28


# The student bar (issue 11, class 6), set from an H100 run of tools/gpu/probe/perf_mutants.py (2026-11-22):
# the reference reaches 0.90x (scale) and 0.89x (axpy); the same kernels on a grid of one block per SM (1/8 of
# the resident threads: the lesson's 'fill the GPU' removed) 0.52x and 0.65x; each thread walking its own
# contiguous chunk (coalescing removed) 0.07x. 0.75 fails both and leaves the reference 15% of room.
STUDENT_BAR = 0.75


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab00.1", "lab00.2")
def test_perf_scale():
    x = random_tensor((PERF_N,), FP32)
    last = {}

    def ours():
        last["y"] = LAB.module.scale(x, 1.5)

    def verify():
        LAB.assert_close(last["y"], x * 1.5, case="scale: the output of the timed calls", tol=tolerance(FP32))

    LAB.perf(name="scale 2^28 fp32", ours=ours, baseline=lambda: torch.mul(x, 1.5), baseline_name="torch.mul",
             bytes_moved=2 * 4 * PERF_N, student_bar=STUDENT_BAR, target=0.8, verify=verify, inputs=(x,))


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab00.2", "lab00.3", "lab00.4")
def test_perf_axpy():
    x, y = random_tensor((PERF_N,), FP32), random_tensor((PERF_N,), FP32)
    last = {}

    def ours():
        last["out"] = LAB.module.axpy(1.5, x, y)

    def verify():
        LAB.assert_close(last["out"], torch.add(y, x, alpha=1.5), case="axpy: the output of the timed calls",
                         tol=tolerance(FP32))

    LAB.perf(name="axpy 2^28 fp32", ours=ours, baseline=lambda: torch.add(y, x, alpha=1.5),
             baseline_name="torch.add(alpha=)", bytes_moved=3 * 4 * PERF_N, student_bar=STUDENT_BAR, target=0.8,
             verify=verify, inputs=(x, y))


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
MUTANTS = [
    # Out of bounds (issue 11, class 1): y[n] written, one float past y's end, every element of y right. It lands in
    # the allocator's slack after y, which the poisoned pool checks (x[n] is read too: x's own slack, for these n).
    harness.Mutant("loop-bound-off-by-one", "scale.cu", "i < n; i += stride) {\n    y[i]",
                   "i <= n; i += stride) {\n    y[i]", tests="test_scale and (31- or 4097-)",
                   expect="wrote past the end of y"),
    harness.Mutant("no-grid-stride", "scale.cu", "i < n; i += stride) {\n    y[i]", "i < n; i += n) {\n    y[i]",
                   tests="test_scale and block", expect="never written"),
    harness.Mutant("grid-too-small", "scale.cu", "std::min(needed_blocks, resident_blocks)",
                   "std::min<int64_t>(needed_blocks, 1)", tests="test_launch_config",
                   expect="too few threads to fill the GPU", needs_gpu=False),
    harness.Mutant("legacy-default-stream", "scale.cu", "axpy_kernel<<<config.blocks, config.threads, 0, stream>>>",
                   "axpy_kernel<<<config.blocks, config.threads>>>", tests="current_stream",
                   expect="legacy default stream"),
    # Integrity: a kernel that skips work, or an op that returns an earlier result, must not pass.
    harness.Mutant("half-written", "wrapper.cpp", "out.mutable_data_ptr<float>(), x.numel(),",
                   "out.mutable_data_ptr<float>(), x.numel() / 2,", tests="test_axpy and block",
                   expect="never written"),
    harness.Mutant("cached-result", "wrapper.cpp", "  at::Tensor y = at::empty_like(x);\n",
                   "  static std::map<int64_t, at::Tensor> cache;\n"
                   "  if (cache.count(x.numel())) return cache[x.numel()];\n"
                   "  at::Tensor y = at::empty_like(x);\n  cache[x.numel()] = y;\n",
                   tests="test_scale and block", expect="elements wrong"),
    # Timings that cannot be gamed: a result kept from the first call on the same x and replayed (the timed calls'
    # inputs get new values before each call, and the last call's output is checked), and the kernel left on a
    # stream of its own, forked from the current one but never joined (the events on the current stream then time
    # nothing: a time under the physical floor).
    harness.Mutant("replays-the-timed-result", "wrapper.cpp", "  at::Tensor y = at::empty_like(x);\n",
                   "  static const void* last_x = nullptr;\n  static at::Tensor last_y;\n"
                   "  if (x.const_data_ptr() == last_x) return last_y;\n"
                   "  at::Tensor y = at::empty_like(x);\n  last_x = x.const_data_ptr();\n  last_y = y;\n",
                   tests="test_perf_scale", expect="the output of the timed calls", perf=True),
    harness.Mutant("work-left-on-a-side-stream", "scale.cu",
                   "  scale_kernel<<<config.blocks, config.threads, 0, stream>>>(x, y, alpha, n);\n",
                   "  static cudaStream_t side = [] { cudaStream_t s; cudaStreamCreateWithFlags(&s, "
                   "cudaStreamNonBlocking); return s; }();\n"
                   "  static cudaEvent_t ready = [] { cudaEvent_t e; cudaEventCreateWithFlags(&e, "
                   "cudaEventDisableTiming); return e; }();\n"
                   "  cudaEventRecord(ready, stream);\n  cudaStreamWaitEvent(side, ready, 0);\n"
                   "  scale_kernel<<<config.blocks, config.threads, 0, side>>>(x, y, alpha, n);\n",
                   tests="test_perf_scale", expect="impossibly fast", perf=True),
    # Output placement (issue 11, class 1): axpy accumulates into y's memory and returns y. Its values are
    # right; the reference, computed from y after the call, is not, so only the input check names the bug.
    harness.Mutant("writes-into-input", "wrapper.cpp", "  at::Tensor out = at::empty_like(x);\n",
                   "  at::Tensor out = y;  // reuse y's memory\n", tests="test_axpy and block",
                   expect="wrote into its input `y`"),
    # Device guard (issue 11, class 8): with x and y on cuda:1 and cuda:0 current, axpy launches on
    # cuda:0's stream with cuda:1's pointers. On two H200s (2026-11-22) that ran without an error and
    # wrote garbage: a silent wrong answer. One GPU cannot show it, so the case needs two.
    harness.Mutant("no-device-guard", "wrapper.cpp",
                   "  const c10::cuda::CUDAGuard device_guard(x.device());\n  at::Tensor out = at::empty_like(x);\n",
                   "  at::Tensor out = at::empty_like(x);\n", tests="another_gpu", expect="device_guard", gpus=2),
    harness.Mutant("no-shape-check", "wrapper.cpp", '  course::check_same_shape(x, y, "axpy", "x", "y");\n', "",
                   tests="axpy_input_errors", expect="expected a clear error"),
    # An input check for one argument only (issue 34, class a): axpy checks y's device, dtype and contiguity but
    # not x's. The same-device and same-shape checks still compare them; a float16 or strided x goes through. Caught
    # on fake tensors, without a GPU.
    harness.Mutant("axpy-checks-y-only", "wrapper.cpp", '{std::pair{&x, "x"}, std::pair{&y, "y"}}',
                   '{std::pair{&y, "y"}}', tests="test_each_argument_checked and axpy and fake",
                   expect="axpy(x on the CPU", needs_gpu=False),
    # Perf (issue 11, class 6): correct, slower kernels without the lesson's technique, which the student bar must
    # fail. The lesson's two ideas: the grid-stride loop, where a warp's 32 accesses fall on 32 neighbouring floats on
    # every trip, and a grid of one full wave. tools/gpu/probe/perf_mutants.py measures them against the bars.
    # The classic grid-stride slip: each thread a contiguous run of n / threads elements, so a warp's 32 loads and
    # 32 stores land in 32 different lines on every trip.
    harness.Mutant("chunk-per-thread", "scale.cu",
                   "  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; "
                   "i += stride) {\n    y[i] = alpha * x[i];\n",
                   "  const int64_t chunk = (n + stride - 1) / stride;  // stride = the grid's thread count\n"
                   "  const int64_t begin = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;\n"
                   "  for (int64_t i = begin; i < n && i < begin + chunk; ++i) {\n"
                   "    y[i] = alpha * x[i];\n",
                   tests="test_perf_scale", expect="below the student bar", perf=True),
    # One block per SM instead of a full wave: 256 of the 2048 threads an SM holds, an eighth of the loads in flight
    # (test_launch_config fails it too, without a GPU; this is the speed it costs).
    harness.Mutant("one-block-per-sm", "scale.cu",
                   "const int64_t resident_blocks = static_cast<int64_t>(sm_count) * (max_threads_per_sm / "
                   "kThreadsPerBlock);", "const int64_t resident_blocks = static_cast<int64_t>(sm_count);",
                   tests="test_perf", expect="below the student bar", perf=True),
]

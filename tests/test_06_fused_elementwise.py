"""Grader for lab 06: y = GELU(x + bias) forward (a scalar and a 16-byte vectorized kernel), its fused,
bitwise-deterministic backward (grad_x and grad_bias in one pass over grad_y and x), four dtypes, both
GELU forms, and the torch.autograd.Function (autograd.py) that runs them under loss.backward().

This file is the table of contents: what ./course and the tooling read from it (LAB, POINTS, SANITIZE_CASES,
MUTANTS), the notebook's tests, and the tests of tests/grader06/, collected here in this order:
  - without_gpu.py: the build, constants(), the wrapper's argument checks, autograd.py on stand-in CPU ops;
  - forward.py: bias_gelu, 16-byte and scalar kernels, every dtype and form, 3-d, unaligned and empty inputs;
  - backward.py: bias_gelu_backward likewise; both ops at magnitudes of 1e4; grad_bias bitwise deterministic;
  - past_2_31.py: both ops on 2^31 + 2^15 elements (int64_t indices);
  - autograd.py: the kernels through autograd.py: against float64 autograd, gradcheck, a non-contiguous grad_y,
    loss.backward() through a small MLP;
  - errors.py: bad input gets a clear error (on the GPU), inputs on another GPU;
  - stream.py: every kernel and memset on the current stream (a CUDA graph replayed);
  - perf.py: the timed cases, their bars and targets.
What they share (inputs, float64 references, the tolerances and their derivation, the checks, the ops called with
outputs from a poisoned pool) is in common.py.
"""
from __future__ import annotations

import pytest

import harness
from harness import notebooks

# The parts' asserts rewritten as this file's are (pytest's detailed failure messages): registered before the
# package is first imported.
pytest.register_assert_rewrite("grader06")

from grader06.common import LAB  # noqa: E402

# Points per task (of 100), by the work each is: GELU and its derivative are two short formulas, but every
# output of the lab goes through them; the scalar forward is lesson 00's grid-stride loop plus the column
# arithmetic; the vectorized forward adds 16-byte packs, the bias pack per vector and loads in flight; the
# backward is the lab's largest piece (a tiled column reduction through shared memory, the fixed-order
# second kernel, vectors or not); the autograd.Function is a dozen lines, with the contiguity and
# once_differentiable details.
POINTS = {"lab06.1": 15, "lab06.2": 15, "lab06.3": 20, "lab06.4": 35, "lab06.5": 15}

# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck,
# synccheck) by default: regular expressions over test names (conftest marks them `sanitize`).
# 8192x8 backward: 64 row chunks of 8 row lanes each, so the shared-memory reduction and the second
# kernel both run with real work; 7x8 bfloat16: the 16-byte kernels on a partial chunk.
SANITIZE_CASES = [
    r"test_forward\[7x3-float32-none\]",
    r"test_forward\[7x8-bfloat16-tanh\]",
    r"test_forward_unaligned\[x\+1-7x8-float32\]",
    r"test_backward\[(7x3|8192x8)-float32-none\]",
    r"test_backward\[7x8-bfloat16-tanh\]",
]

# The parts' tests (each part's __all__), brought into this module's namespace: pytest collects them here, under
# this file's node ids, in this order.
# isort: off
from grader06.without_gpu import *  # noqa: E402, F403
from grader06.forward import *  # noqa: E402, F403
from grader06.backward import *  # noqa: E402, F403
from grader06.past_2_31 import *  # noqa: E402, F403
from grader06.autograd import *  # noqa: E402, F403
from grader06.errors import *  # noqa: E402, F403
from grader06.stream import *  # noqa: E402, F403
from grader06.perf import *  # noqa: E402, F403
# isort: on


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
_SCALAR_LOOP = ("for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; "
                "i += grid_threads) {")
_BLOCK_REDUCE = """\
#pragma unroll
    for (int e = 0; e < kElems; ++e) lane_sums[row_lane][e][lane] = sums[e];
    __syncthreads();  // every row lane's sums are in shared memory before row lane 0 reads them
    if (row_lane == 0 && in_matrix) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        C total = lane_sums[0][e][lane];
#pragma unroll
        for (int r = 1; r < kRowLanes; ++r) total += lane_sums[r][e][lane];
"""
# The block's row lanes combined with atomicAdd on one shared slot per column: right to rounding, but the adds
# happen in the order the 8 warps arrive, which varies from run to run.
_ATOMIC_BLOCK_REDUCE = """\
    if (row_lane == 0) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) lane_sums[0][e][lane] = C(0);
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < kElems; ++e) atomicAdd(&lane_sums[0][e][lane], sums[e]);
    __syncthreads();
    if (row_lane == 0 && in_matrix) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        C total = lane_sums[0][e][lane];
"""
MUTANTS = [
    # Out-of-bounds write (issue 11, class 1): one index past the end, y[n], lands in the allocator's slack after y,
    # where no comparison of y sees it; the poisoned pool's guard does.
    harness.Mutant("scalar-bound-off-by-one", "forward.cu", _SCALAR_LOOP, _SCALAR_LOOP.replace("i < n;", "i <= n;"),
                   tests="test_forward and 7x3", expect="wrote past the end of y"),
    harness.Mutant("vector-bound-off-by-one", "forward.cu", "v < n_vectors; v += grid_threads) {",
                   "v <= n_vectors; v += grid_threads) {", tests="test_forward and 7x8",
                   expect="wrote past the end of y"),
    # The backward's last chunk: rows past the end computed and stored from registers never loaded.
    harness.Mutant("backward-rows-unguarded", "backward.cu",
                   "        if (in_matrix && row < rows) {\n          Vector gx;",
                   "        if (in_matrix) {\n          Vector gx;", tests="test_backward and 7x3",
                   expect="wrote past the end of grad_x"),
    harness.Mutant("bias-indexed-by-row", "forward.cu", "u = to_compute(x[i]) + to_compute(bias[i % cols]);",
                   "u = to_compute(x[i]) + to_compute(bias[i / cols]);",
                   tests="test_forward and 7x3", expect="elements wrong"),
    # The erf form's formula under approximate='tanh' and the other way round (they differ by up to ~2e-4); float32,
    # whose erf form is the erff one (the 16-bit types' exp2 branch comes first and stays the erf form's).
    harness.Mutant("gelu-forms-swapped", "gelu.cuh",
                   "  } else if constexpr (kForm == GeluForm::kErf) {\n    return F(0.5) * u * (F(1) + erf_of(",
                   "  } else if constexpr (kForm == GeluForm::kTanh) {\n    return F(0.5) * u * (F(1) + erf_of(",
                   tests="test_forward and float32", expect="elements wrong"),
    # float64 run through float's erf: right to 1e-7, which float64's tolerance (and gradcheck) must not accept.
    harness.Mutant("erff-in-the-double-path", "gelu.cuh", "double erf_of(double v) { return erf(v); }",
                   "double erf_of(double v) { return erff(v); }", tests="test_forward and float64 and none",
                   expect="elements wrong"),
    # GELU'(u) = Phi(u) + u phi(u): the product rule's second term forgotten.
    # tanh by its definition, (e^2k - 1) / (e^2k + 1) (issue 34, class b): the same numbers for |u| up to ~10,
    # inf / inf = NaN past it (e^2k overflows float32 for u > ~11).
    harness.Mutant("tanh-by-its-definition", "gelu.cuh", "return u * sigmoid_2k(k).value;",
                   "return F(0.5) * u * (F(1) + (exp_of(F(2) * k) - F(1)) / (exp_of(F(2) * k) + F(1)));",
                   tests="test_large_magnitudes and forward and tanh", expect="elements wrong"),
    harness.Mutant("derivative-missing-u-phi", "gelu.cuh", "    return cdf + u * pdf;", "    return cdf;",
                   tests="test_backward and float32 and none", expect="elements wrong"),
    harness.Mutant("grad-bias-from-one-chunk", "backward.cu", "for (int64_t k = row_lane; k < chunks; k += kRowLanes)",
                   "for (int64_t k = row_lane; k < 1; k += kRowLanes)", tests="test_backward and 8192x3",
                   expect="grad_bias"),
    # 32-bit count (issue 11, class 4): rows * cols = 2^31 + 2^15 wraps negative in an int: the 16-byte kernel's
    # launch fails, the scalar kernel writes nothing. (A wrapped int loop index would more likely hang.)
    harness.Mutant("int32-element-count", "forward.cu", "  const int64_t n = rows * cols;\n  if (vectorized",
                   "  const int n = rows * cols;\n  if (vectorized", tests="test_forward_past_2_31", expect="int64_t"),
    # Stream misuse (issue 11, class 3): the backward's second kernel on the legacy default stream.
    harness.Mutant("finalize-on-legacy-stream", "backward.cu",
                   "grad_bias_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock, 0, stream>>>",
                   "grad_bias_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock>>>",
                   tests="test_runs_on_current_stream", expect="legacy default stream"),
    harness.Mutant("atomic-block-reduce", "backward.cu", _BLOCK_REDUCE, _ATOMIC_BLOCK_REDUCE,
                   tests="bitwise", expect="not bitwise identical"),
    # The alignment test dropped from vectorizable(): x[1:] then takes 16-byte loads at a 4-byte offset.
    harness.Mutant("alignment-ignored", "forward.cu",
                   "if (vectorized && vectorizable(cols, kElemsPerVector<T>, {x, bias, y})) {",
                   "if (vectorized && cols % kElemsPerVector<T> == 0) {",
                   tests="test_forward_unaligned", expect="misaligned address"),
    # Perf (issue 11, class 6): the lesson's technique removed: the launcher never takes the 16-byte kernel.
    harness.Mutant("no-vectorization", "forward.cu",
                   "if (vectorized && vectorizable(cols, kElemsPerVector<T>, {x, bias, y}))",
                   "if (false && vectorizable(cols, kElemsPerVector<T>, {x, bias, y}))",
                   tests="test_perf_vectorized_vs_scalar", expect="below the student bar", perf=True),
    # autograd.py (lab06.5), caught without a GPU: y.sum()'s grad_y (a stride-0 expanded 1) passed on as it is.
    harness.Mutant("grad-y-not-made-contiguous", "autograd.py", "bias_gelu_backward(grad_y.contiguous(), x,",
                   "bias_gelu_backward(grad_y, x,", tests="test_autograd_on_cpu", expect="contiguous",
                   needs_gpu=False),
    harness.Mutant("approximate-not-passed", "autograd.py", "y = ops.bias_gelu(x, bias, approximate)",
                   "y = ops.bias_gelu(x, bias)", tests="test_autograd_on_cpu and tanh", expect="elements wrong",
                   needs_gpu=False),
]
